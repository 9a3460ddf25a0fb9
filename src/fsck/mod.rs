//! fsck: check every invariant of a volume, and repair what can be repaired safely.
//!
//! Walks the tree from the root and rebuilds, independently of the allocator, which
//! blocks and inode slots are in use, how many links each inode has and how many blocks
//! each owns; then compares with what the volume says. Exit codes follow e2fsck.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::disk::codec::*;
use crate::disk::device::BlockDevice;
use crate::disk::format::*;
use crate::engine::btree;
use crate::engine::cache::MetaCache;
use crate::engine::space::Space;
use crate::engine::store::{Store, Tx};
use crate::error::Result;
use crate::fs::dir;
use crate::fs::file;
use crate::fs::xattr;
use crate::volume::{mark, read_usable_superblock, OpenOptions, Volume};

mod repair;
use repair::*;

/// What fsck found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Problems still present.
    pub errors: Vec<String>,
    /// Problems repaired.
    pub fixed: Vec<String>,
    /// Worth saying, but not wrong with the volume (it is in use elsewhere, say).
    pub warnings: Vec<String>,
    pub inodes: u64,
    pub directories: u64,
    pub files: u64,
    pub blocks_used: u64,
    pub blocks_total: u64,
    /// Directory index statistics: leaves and bytes used in them.
    pub dir_leaves: u64,
    pub dir_leaf_bytes: u64,
    /// Damaged structures that follow from the tree (free-space map, state block), found
    /// while opening: rebuilt by a repair (and listed in `fixed`), else errors.
    pub rebuilt: Vec<String>,
}

impl Report {
    /// e2fsck's exit code: 0 clean, 1 errors fixed, 4 errors left.
    pub fn exit_code(&self) -> i32 {
        if !self.errors.is_empty() {
            4
        } else if !self.fixed.is_empty() {
            1
        } else {
            0
        }
    }
}

struct Walk<'a> {
    st: Store,
    r: Report,
    /// Block owners, for "owned twice" reports.
    owner: HashMap<u64, u64>,
    links: HashMap<u64, u32>,
    seen: HashSet<u64>,
    /// References to each xattr head block.
    xattr_refs: HashMap<u64, u32>,
    /// Inodes that cannot be used: unreadable, or with a broken index, extent map or
    /// xattr list. A repair drops the entries that name them (`Drop`).
    bad: HashSet<u64>,
    /// Inode fields that disagree with what the walk found, and the fix for each.
    inode_fixes: Vec<(u64, InodeFix, String)>,
    /// Directories whose index is damaged: a repair rebuilds it from its readable leaves.
    salvage: HashSet<u64>,
    /// Whether the walk saw everything: no error left any part of the volume unread.
    complete: bool,
    progress: &'a mut dyn FnMut(u64),
}

/// A field of an inode record that the walk can recompute.
#[derive(Clone, Copy, Debug)]
enum InodeFix {
    /// A directory's entry count.
    Entries(u64),
    /// Blocks the inode owns.
    Blocks(u64),
    /// The bloom filter of the inode's xattr names.
    XattrFilter(u32),
    /// A directory's parent: the directory that names it.
    Parent(u64),
}

/// A live inode that no directory names, which a repair links into /lost+found as `#INO`.
#[derive(Clone, Copy, Debug)]
struct LostInode {
    ino: u64,
    kind: FileType,
    size: u64,
}

impl LostInode {
    fn what(&self) -> String {
        match self.kind {
            FileType::Directory => "directory".into(),
            FileType::RegularFile => format!("file of {} bytes", self.size),
            FileType::Symlink => "symlink".into(),
            _ => "special file".into(),
        }
    }
}

/// A directory entry a repair removes because the inode it names cannot be used:
/// (directory, key, name, inode).
type Drop = (u64, u64, Vec<u8>, u64);

impl Walk<'_> {
    /// Live inodes the walk did not reach, in the inode blocks it knows whose slot mask
    /// does not match what it found (`mismatched`) and in
    /// leaked blocks that are inode blocks, that can be put back as they are: readable,
    /// linked at least once, with a sound index or extent map and xattrs, owning no block
    /// anything else owns. Returns the ones to link into /lost+found (those no other lost
    /// directory names: the rest come back with it), every block they and their subtrees
    /// own (their inode blocks too), every live inode among them, and how many of them use
    /// each xattr head block.
    fn find_lost(
        &mut self,
        mismatched: &[u64],
        lazy: &HashMap<u64, u16>,
        leaked: &[u64],
    ) -> (Vec<LostInode>, HashSet<u64>, Vec<u64>, HashMap<u64, u32>) {
        let mut blocks: Vec<u64> = mismatched.to_vec();
        for &b in leaked {
            if self.st.tx().block(b, Some(INODE_MAGIC)).is_ok() {
                blocks.push(b);
            }
        }
        blocks.sort_unstable();
        blocks.dedup();
        let mut claimed = HashSet::new();
        let mut heads: HashMap<u64, u32> = HashMap::new();
        let mut found: Vec<Inode> = Vec::new();
        for b in blocks {
            let used = match self.st.tx().block(b, Some(INODE_MAGIC)) {
                Ok(blk) => get_u16(blk, IB_USED) & !lazy.get(&b).copied().unwrap_or(0),
                Err(_) => continue,
            };
            for s in 1..INODES_PER_BLOCK {
                let ino = ino_of(b, s);
                if used & (1 << s) == 0 || self.seen.contains(&ino) || self.bad.contains(&ino) {
                    continue;
                }
                let Ok(i) = self.st.inode(ino) else { continue };
                if i.nlink == 0 || i.file_type().is_none() {
                    continue;
                }
                if let Some((own, head)) = self.sound(&i, &claimed) {
                    claimed.extend(own);
                    if let Some(h) = head {
                        *heads.entry(h).or_insert(0) += 1;
                    }
                    claimed.insert(b);
                    // Its initialised region blocks are inode blocks (shared: not checked).
                    if let InodeData::Dir(d) = &i.data {
                        claimed.extend((0..d.region_used as u64).map(|k| d.region_start + k));
                    }
                    found.push(i);
                }
            }
        }
        let mut named = HashSet::new();
        for i in found.iter().filter(|i| i.is_dir()) {
            if let Ok(d) = i.dir() {
                let _ = btree::scan(&mut self.st.tx(), &d.tree, i.ino, 0, |_, v| {
                    if let Ok((c, _, _)) = decode_dirent(v) {
                        if c != i.ino {
                            named.insert(c);
                        }
                    }
                    true
                });
            }
        }
        let all = found.iter().map(|i| i.ino).collect();
        let roots = found
            .iter()
            .filter(|i| !named.contains(&i.ino))
            .filter_map(|i| Some(LostInode { ino: i.ino, kind: i.file_type()?, size: i.size }))
            .collect();
        (roots, claimed, all, heads)
    }

    /// The blocks inode `i` owns if it can be put back as it is, and its xattr head block,
    /// or `None`: its index, extent map and xattrs read, and it owns nothing the walk or
    /// `claimed` already has.
    fn sound(&mut self, i: &Inode, claimed: &HashSet<u64>) -> Option<(Vec<u64>, Option<u64>)> {
        let ino = i.ino;
        let mut own = Vec::new();
        match &i.data {
            InodeData::Dir(d) => {
                own.extend(btree::check(&mut self.st.tx(), &d.tree, ino).ok()?.blocks);
                own.extend((d.region_used as u64..d.region_len as u64).map(|k| d.region_start + k));
            }
            InodeData::Extents { .. } | InodeData::ExtentTree { .. } => {
                if let InodeData::ExtentTree { tree, .. } = &i.data {
                    own.extend(btree::check(&mut self.st.tx(), tree, ino).ok()?.blocks);
                }
                for e in file::all_extents(&mut self.st.tx(), i).ok()? {
                    own.extend(e.phys..e.phys + e.len);
                }
            }
            InodeData::InlineSymlink(_) => {}
        }
        let xblocks = xattr::blocks_of(&mut self.st.tx(), i).ok()?;
        xattr::load(&mut self.st.tx(), i).ok()?;
        // The head may be shared, with the walk's inodes or other lost ones: not checked
        // against them, only claimed when nothing seen owns it yet.
        let head = xblocks.first().copied();
        own.extend(xblocks.iter().skip(1));
        let layout = self.st.sb.layout;
        let ok = own
            .iter()
            .chain(head.as_ref())
            .all(|b| *b >= layout.first_free() && *b < layout.backup_superblock() && self.st.is_used(*b))
            && own.iter().all(|b| !self.owner.contains_key(b) && !claimed.contains(b));
        if let Some(h) = head.filter(|h| !self.owner.contains_key(h)) {
            own.push(h);
        }
        ok.then_some((own, head))
    }

    /// A finding the repair fixes by setting one inode field.
    fn fix(&mut self, ino: u64, f: InodeFix, m: String) {
        self.inode_fixes.push((ino, f, m));
    }

    /// An error that leaves part of the volume unseen (something unreadable): whatever
    /// depends on a complete walk (leaks, link counts, slot masks, the rebuilt map) must
    /// then not be repaired.
    fn blind(&mut self, m: String) {
        self.complete = false;
        self.err(m);
    }

    fn err(&mut self, m: String) {
        if self.r.errors.len() < 1000 {
            self.r.errors.push(m);
        }
    }

    fn own(&mut self, b: u64, ino: u64, what: &str) {
        if b < self.st.sb.layout.first_free() || b >= self.st.sb.layout.block_count {
            self.err(format!("inode {ino}: {what} block {b} outside the data area"));
            return;
        }
        if let Some(o) = self.owner.insert(b, ino) {
            self.err(format!("block {b} owned twice: by inode {o} and by inode {ino} ({what})"));
        }
    }

    fn check_inode(&mut self, i: &Inode) -> Result<()> {
        let ino = i.ino;
        let mut owned = 0u64;
        match &i.data {
            InodeData::Dir(d) => {
                let found = btree::check(&mut self.st.tx(), &d.tree, ino);
                let stats = match found {
                    Ok(s) => s,
                    Err(e) => {
                        self.salvage.insert(ino);
                        self.blind(format!("directory {ino}: index broken: {e}"));
                        return Ok(());
                    }
                };
                for b in &stats.blocks {
                    self.own(*b, ino, "directory index");
                }
                owned += stats.blocks.len() as u64;
                self.r.dir_leaves += stats.leaves;
                self.r.dir_leaf_bytes += stats.leaf_bytes_used;
                if stats.records != d.entries {
                    let m = format!("directory {ino}: {} entries counted, inode says {}", stats.records, d.entries);
                    self.fix(ino, InodeFix::Entries(stats.records), m);
                }
                for k in 0..d.region_len as u64 {
                    let b = d.region_start + k;
                    if k >= d.region_used as u64 {
                        self.own(b, ino, "reserved region");
                    } else {
                        self.owner.entry(b).or_insert(u64::MAX); // inode block, shared
                    }
                }
            }
            InodeData::Extents { .. } | InodeData::ExtentTree { .. } => {
                if let InodeData::ExtentTree { tree, count } = &i.data {
                    let found = btree::check(&mut self.st.tx(), tree, ino);
                    match found {
                        Ok(s) => {
                            for b in &s.blocks {
                                self.own(*b, ino, "extent tree");
                            }
                            owned += s.blocks.len() as u64;
                            if s.records != *count as u64 {
                                self.err(format!("inode {ino}: extent count {} but tree holds {}", count, s.records));
                            }
                        }
                        Err(e) => {
                            self.bad.insert(ino);
                            self.blind(format!("inode {ino}: extent tree broken: {e}"));
                            return Ok(());
                        }
                    }
                }
                let found = file::all_extents(&mut self.st.tx(), i);
                match found {
                    Ok(list) => {
                        let mut last_end = 0;
                        for e in list {
                            if e.logical < last_end {
                                self.err(format!("inode {ino}: extents overlap at {}", e.logical));
                            }
                            last_end = e.end();
                            for b in e.phys..e.phys + e.len {
                                self.own(b, ino, "data");
                            }
                            owned += e.len;
                        }
                    }
                    Err(e) => {
                        self.bad.insert(ino);
                        self.blind(format!("inode {ino}: extent map unreadable: {e}"))
                    }
                }
            }
            InodeData::InlineSymlink(_) => {}
        }
        let found = xattr::blocks_of(&mut self.st.tx(), i);
        match found {
            Ok(bs) => {
                // The head may be shared: counted here, owned once after the walk.
                if let Some((head, conts)) = bs.split_first() {
                    *self.xattr_refs.entry(*head).or_insert(0) += 1;
                    for c in conts {
                        self.own(*c, ino, "xattr continuation");
                    }
                }
                owned += bs.len() as u64;
            }
            Err(e) => {
                self.bad.insert(ino);
                self.blind(format!("inode {ino}: xattr block unreadable: {e}"))
            }
        }
        let found = xattr::load(&mut self.st.tx(), i);
        match found {
            Ok(list) => {
                if self.st.sb.xattr_filter() && xattr::filter_of(&list, self.st.sb.filter_hashes()) != i.xattr_filter {
                    let want = xattr::filter_of(&list, self.st.sb.filter_hashes());
                    let m =
                        format!("inode {ino}: xattr filter {:#x} does not match its names ({want:#x})", i.xattr_filter);
                    self.fix(ino, InodeFix::XattrFilter(want), m);
                }
                for x in list.iter().filter(|x| x.name.contains(&0)) {
                    let name = xattr::full_name(x.idx, &x.name);
                    self.err(format!(
                        "inode {ino}: xattr name {:?} contains a NUL byte",
                        String::from_utf8_lossy(&name)
                    ));
                }
            }
            Err(e) => {
                self.bad.insert(ino);
                self.blind(format!("inode {ino}: xattrs unreadable: {e}"))
            }
        }
        if owned != i.blocks {
            let m = format!("inode {ino}: owns {owned} blocks, inode says {}", i.blocks);
            self.fix(ino, InodeFix::Blocks(owned), m);
        }
        if i.size > MAX_FILE_SIZE {
            self.err(format!("inode {ino}: size {} is beyond the largest file ({MAX_FILE_SIZE})", i.size));
        }
        if i.file_type() == Some(FileType::Symlink) && (i.size == 0 || i.size > 4095) {
            self.err(format!("symlink {ino}: bad target length {}", i.size));
        }
        Ok(())
    }
}

/// Check (and with `repair`, fix) the volume on `dev`. `progress` gets the number of
/// inodes checked so far.
///
/// A volume with a mount mark (ro_compat MOUNT_MARK): a repair takes the mark for its
/// whole length, so it is refused ([`Error::Busy`](crate::Error::Busy)) while another host
/// or process holds the volume; a check without repair says in `warnings` that the volume
/// is in use (what it reads may lag behind the holder's memory).
pub fn check(dev: Arc<dyn BlockDevice>, repair: bool, progress: &mut dyn FnMut(u64)) -> Result<Report> {
    let sb = read_usable_superblock(&*dev)?;
    let repair_ok = repair && sb.ro_compat & !KNOWN_RO_COMPAT == 0;
    let (mut warnings, mut errors, mut fixed) = (Vec::new(), Vec::new(), Vec::new());
    match mark::inspect(&*dev, &sb)? {
        Some(Ok(m)) if m.in_use && !repair_ok => {
            if mark::looks_held(&m) {
                warnings.push(format!(
                    "the volume is in use by {}: checking what is on disk, which may lag behind",
                    mark::describe(&m)
                ));
            } else {
                warnings.push(format!(
                    "the volume was not closed cleanly by {} (a read-write open takes it over once it is sure the mark is stale)",
                    mark::describe(&m)
                ));
            }
        }
        Some(Err(e)) if repair_ok => fixed.push(format!("mount mark unreadable ({e}): written again")),
        Some(Err(e)) => errors.push(format!("mount mark unreadable ({e}); a repair writes it again")),
        _ => {}
    }
    let _held = if repair_ok { mark::acquire(&dev, &sb, mark::DEFAULT_INTERVAL_MS)? } else { None };
    let mut r = check_pass(dev, repair, progress, 0)?;
    r.warnings.splice(0..0, warnings);
    r.errors.splice(0..0, errors);
    r.fixed.splice(0..0, fixed);
    Ok(r)
}

fn check_pass(dev: Arc<dyn BlockDevice>, repair: bool, progress: &mut dyn FnMut(u64), pass: u32) -> Result<Report> {
    let sb = read_usable_superblock(&*dev)?;
    // A volume with features this fsck does not know may be checked but not changed.
    let repair = repair && sb.ro_compat & !KNOWN_RO_COMPAT == 0;
    let mut r = Report { blocks_total: sb.layout.block_count, ..Default::default() };
    // Both superblock copies must be intact and agree.
    let mut sb_fixes = Vec::new();
    for at in [SUPERBLOCK, sb.layout.backup_superblock()] {
        let mut b = [0u8; BLOCK_SIZE];
        dev.read(at, &mut b)?;
        match Superblock::decode(&b, at) {
            Ok(copy) if copy == sb => {}
            // A grow being finished clears GROW_PENDING in the backup first; the next
            // read-write open finishes it again and rewrites both (volume/resize.rs).
            Ok(copy)
                if at != SUPERBLOCK
                    && sb.grow_from != 0
                    && copy
                        == Superblock {
                            ro_compat: sb.ro_compat & !RO_COMPAT_GROW_PENDING,
                            grow_from: 0,
                            ..sb.clone()
                        } => {}
            Ok(_) => sb_fixes.push((at, format!("superblock copy in block {at} differs from the one in use"))),
            Err(e) => sb_fixes.push((at, format!("superblock copy in block {at} is damaged: {e}"))),
        }
    }
    // A damaged free-space map or state block does not stop the check: both follow from
    // the tree, and are rebuilt from what the walk finds.
    let (st, state, rebuild_bitmap, rebuild_state, journal_seq) =
        match crate::engine::store::open_lenient(dev.clone(), sb.clone(), repair, 1 << 16, true, false) {
            Ok(o) => {
                let damage: Vec<String> = o.damage.iter().map(|e| e.to_string()).collect();
                let seq = o.opened.journal.seq;
                let (b, s) = (o.bitmap_damaged, o.state_damaged);
                for d in damage {
                    r.rebuilt.push(d);
                }
                (o.opened.store, o.opened.state, b, s, seq)
            }
            Err(crate::error::Error::Corrupt(m)) => {
                r.errors.push(format!("cannot open the volume: {m}"));
                return Ok(r);
            }
            Err(e) => return Err(e),
        };
    let root = sb.root_ino;
    let w_sb = sb.clone();
    let mut w = Walk {
        st,
        r,
        owner: HashMap::new(),
        links: HashMap::new(),
        seen: HashSet::new(),
        xattr_refs: HashMap::new(),
        bad: HashSet::new(),
        inode_fixes: Vec::new(),
        salvage: HashSet::new(),
        complete: true,
        progress,
    };
    // A grown volume's bitmap blocks beyond the contiguous ones, and the mount mark, lie
    // in the data area.
    for b in w_sb.layout.spilled_bitmap_blocks() {
        w.own(b, 0, "free-space bitmap");
    }
    if w_sb.layout.mark_block != 0 {
        w.own(w_sb.layout.mark_block, 0, "mount mark");
    }
    // Walk the namespace breadth first.
    // Each queued inode comes with the entry it was found through: (key, name).
    let mut queue = VecDeque::from([(root, root, 0u64, Vec::new())]);
    let mut inodes: HashMap<u64, Inode> = HashMap::new();
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    let mut drops: Vec<Drop> = Vec::new();
    let mut root_lost = false;
    while let Some((ino, parent, key, name)) = queue.pop_front() {
        let i = match w.st.inode(ino) {
            Ok(i) => i,
            Err(e) => {
                w.blind(format!("inode {ino} (in directory {parent}) unreadable: {e}"));
                if ino != root {
                    drops.push((parent, key, name, ino));
                } else {
                    root_lost = true;
                }
                continue;
            }
        };
        if !w.seen.insert(ino) {
            continue;
        }
        w.r.inodes += 1;
        if w.r.inodes % 4096 == 0 {
            (w.progress)(w.r.inodes);
        }
        w.check_inode(&i)?;
        if w.bad.contains(&ino) && ino != root {
            drops.push((parent, key, name.clone(), ino));
        }
        if i.is_dir() {
            w.r.directories += 1;
            if i.parent != parent {
                let m = format!("directory {ino}: parent field {} but found in {parent}", i.parent);
                w.fix(ino, InodeFix::Parent(parent), m);
            }
            let d = *i.dir()?;
            let mut ents = Vec::new();
            let mut bad = None;
            let r = btree::scan(&mut w.st.tx(), &d.tree, ino, 0, |k, v| {
                match decode_dirent(v) {
                    Ok((c, ft, name)) => ents.push((k, c, ft, name.to_vec())),
                    Err(e) => bad = Some(e),
                }
                bad.is_none()
            });
            // A damaged index is rebuilt from what can still be read of it (`salvage`).
            if let Err(e) = r {
                w.blind(format!("directory {ino}: unreadable index: {e}"));
                w.salvage.insert(ino);
            }
            if let Some(e) = bad {
                w.blind(format!("directory {ino}: {e}"));
                w.salvage.insert(ino);
            }
            let mut names = HashSet::new();
            for (k, c, ft, name) in ents {
                if dir::check_name(&name).is_err() {
                    w.err(format!("directory {ino}: invalid name {:?}", String::from_utf8_lossy(&name)));
                }
                let h = dir::name_key(&w.st, &name);
                if k < h || k > h + d.max_disp as u64 {
                    w.err(format!(
                        "directory {ino}: entry {:?} at key {k:#x}, outside its probe range from {h:#x}",
                        String::from_utf8_lossy(&name)
                    ));
                }
                if !names.insert(name.clone()) {
                    w.err(format!("directory {ino}: name {:?} appears twice", String::from_utf8_lossy(&name)));
                }
                *w.links.entry(c).or_insert(0) += 1;
                if ft == FileType::Directory {
                    *subdirs.entry(ino).or_insert(0) += 1;
                    if w.seen.contains(&c) {
                        w.blind(format!("directory {c} is linked more than once"));
                        continue;
                    }
                }
                match w.st.inode(c) {
                    Ok(ci) => {
                        if ci.file_type() != Some(ft) {
                            w.err(format!("directory {ino}: entry type of {c} does not match the inode"));
                        }
                        if w.bad.contains(&c) {
                            // Another link to an inode already found unusable.
                            drops.push((ino, k, name.clone(), c));
                        } else if !w.seen.contains(&c) {
                            queue.push_back((c, ino, k, name));
                        }
                    }
                    Err(e) => {
                        w.blind(format!(
                            "directory {ino}: entry {:?} points to inode {c}: {e}",
                            String::from_utf8_lossy(&name)
                        ));
                        w.bad.insert(c);
                        drops.push((ino, k, name, c));
                    }
                }
            }
        } else {
            w.r.files += 1;
        }
        inodes.insert(ino, i);
    }
    // Orphans: unlinked, still allocated until the next read-write open.
    let mut orphans = HashSet::new();
    let mut cur = state.orphan_head;
    while cur != 0 && !w.seen.contains(&cur) {
        match w.st.inode(cur) {
            Ok(i) => {
                w.seen.insert(cur);
                orphans.insert(cur);
                w.r.inodes += 1;
                w.check_inode(&i)?;
                cur = i.next_orphan;
                inodes.insert(i.ino, i);
            }
            Err(e) => {
                w.blind(format!("orphan list: inode {cur}: {e}"));
                break;
            }
        }
    }
    // Shared xattr blocks: owned once, reference count equal to the inodes using them
    // (compared once the lost inodes, which may use them too, are known).
    let mut xattr_counts: Vec<(u64, u32, u32)> = Vec::new();
    let refs: Vec<(u64, u32)> = w.xattr_refs.iter().map(|(b, n)| (*b, *n)).collect();
    for (b, n) in refs {
        w.own(b, 0, "xattr");
        let found = xattr::refcount(&mut w.st.tx(), b);
        match found {
            Ok(c) => xattr_counts.push((b, c, n)),
            Err(e) => w.err(format!("xattr block {b}: {e}")),
        }
    }
    // Link counts.
    let mut nlink_fixes = Vec::new();
    for (ino, i) in &inodes {
        let want = if i.is_dir() && orphans.contains(ino) {
            // A removed directory kept alive by its holder (a process's working
            // directory, say) over a commit: no name, no `.`, no subdirectory.
            0
        } else if i.is_dir() {
            2 + subdirs.get(ino).copied().unwrap_or(0)
        } else {
            w.links.get(ino).copied().unwrap_or(0)
        };
        if i.nlink != want {
            nlink_fixes.push((*ino, i.nlink, want));
        }
    }
    // Inode blocks: used slots must be exactly the live inodes.
    let mut ib: HashMap<u64, u16> = HashMap::new();
    for ino in inodes.keys() {
        let (b, s) = ino_loc(*ino);
        *ib.entry(b).or_insert(0) |= 1 << s;
    }
    // Which directory's region each initialised region block belongs to.
    let mut region_of: HashMap<u64, u64> = HashMap::new();
    for (ino, i) in &inodes {
        if let InodeData::Dir(d) = &i.data {
            for k in 0..d.region_used as u64 {
                ib.entry(d.region_start + k).or_insert(0);
                region_of.insert(d.region_start + k, *ino);
            }
        }
    }
    // The lazy-free tree: slots freed without rewriting their inode block.
    let mut lazy: HashMap<u64, u16> = HashMap::new();
    // Every record, also those for blocks no reached inode lives in (to tell the live
    // slots of a block only lost inodes live in).
    let mut lazy_all: HashMap<u64, u16> = HashMap::new();
    let mut lazy_drops = Vec::new();
    if let Some(t) = w.st.lazy_frees().filter(|t| t.root != 0) {
        let found = btree::check(&mut w.st.tx(), &t, LAZY_FREE_OWNER);
        match found {
            Ok(stats) => {
                for b in &stats.blocks {
                    w.own(*b, 0, "lazy-free tree");
                }
                let mut recs = Vec::new();
                let r = btree::scan(&mut w.st.tx(), &t, LAZY_FREE_OWNER, 0, |k, v| {
                    recs.push((k, v.to_vec()));
                    true
                });
                if let Err(e) = r {
                    w.blind(format!("lazy-free tree: {e}"));
                }
                for (b, v) in recs {
                    let mask = if v.len() == 2 { u16::from_le_bytes([v[0], v[1]]) } else { 0 };
                    lazy_all.insert(b, mask);
                    if mask & !1 == 0 || mask & 1 != 0 || !ib.contains_key(&b) {
                        // Malformed, or for a block with no live inode (which should
                        // have been freed with its record): the record goes.
                        lazy_drops.push(b);
                    } else {
                        lazy.insert(b, mask);
                    }
                }
            }
            Err(e) => w.blind(format!("lazy-free tree broken: {e}")),
        }
    }
    let mut slot_fixes = Vec::new();
    let mut reinit: Vec<(u64, u64)> = Vec::new();
    for (&b, &mask) in &ib {
        let found = w.st.tx().block(b, Some(INODE_MAGIC)).map(|blk| get_u16(blk, IB_USED));
        match found {
            Ok(used) => {
                let freed = lazy.get(&b).copied().unwrap_or(0);
                // A record may only free slots the block marks used.
                if freed & !used != 0 || used & !freed != mask {
                    slot_fixes.push((b, used, mask));
                }
            }
            // An unreadable block that should hold no live inode (a region block whose
            // inodes were all dropped) is written again as an empty one.
            Err(crate::error::Error::Corrupt(_)) if mask == 0 => {
                reinit.push((b, region_of.get(&b).copied().unwrap_or(0)))
            }
            Err(e) => w.blind(format!("inode block {b}: {e}")),
        }
        match w.owner.get(&b) {
            Some(&o) if o != u64::MAX => w.err(format!("inode block {b} is also owned by inode {o}")),
            _ => {
                w.owner.insert(b, u64::MAX);
            }
        }
    }
    // Free-space map against use.
    let layout = w.st.sb.layout;
    let mut leaked = Vec::new();
    let mut marked_free = Vec::new();
    let mut used = layout.first_free() + 1;
    // The old tail of a grow cut short is marked used and owned by nothing until the next
    // read-write open frees it (ro_compat GROW_PENDING): not a leak.
    let pending_tail = w.st.sb.pending_grow_tail();
    for b in layout.first_free()..layout.backup_superblock() {
        let owned = w.owner.contains_key(&b);
        let marked = w.st.is_used(b);
        let in_tail = pending_tail.contains(&b);
        if owned {
            used += 1;
        }
        if owned && in_tail {
            w.blind(format!("block {b} is in use but lies in the old tail a pending grow is to free"));
        }
        if rebuild_bitmap {
            continue; // the map is rebuilt from `owner` below
        }
        if owned && !marked {
            marked_free.push(b);
        } else if marked && !owned && !in_tail {
            leaked.push(b);
        }
    }
    w.r.blocks_used = used;
    // Live inodes that no directory names (their entry went with a directory leaf, or was
    // dropped): a repair puts the sound ones into /lost+found. What they own is theirs,
    // not leaked, and their slots are live.
    // (A known inode block holding such an inode is one whose slot mask is off.)
    let mismatched: Vec<u64> = slot_fixes.iter().map(|f| f.0).collect();
    let (lost, claimed, lost_all, lost_heads) = w.find_lost(&mismatched, &lazy_all, &leaked);
    let xattr_fixes: Vec<(u64, u32, u32)> = xattr_counts
        .iter()
        .map(|&(b, c, n)| (b, c, n + lost_heads.get(&b).copied().unwrap_or(0)))
        .filter(|&(_, c, n)| c != n)
        .collect();
    if !lost.is_empty() {
        leaked.retain(|b| !claimed.contains(b));
        for &b in &claimed {
            w.owner.entry(b).or_insert(u64::MAX);
        }
        let mut lost_slots: HashMap<u64, u16> = HashMap::new();
        for &ino in &lost_all {
            let (b, s) = ino_loc(ino);
            *lost_slots.entry(b).or_insert(0) |= 1 << s;
        }
        slot_fixes.retain_mut(|(b, used, want)| {
            *want |= lost_slots.get(b).copied().unwrap_or(0);
            let freed = lazy.get(b).copied().unwrap_or(0);
            freed & !*used != 0 || *used & !freed != *want
        });
    }
    // A wrong inode count is repaired with the rest (dropped entries leave one).
    let live = w.r.inodes + lost_all.len() as u64;
    let inode_count_fix = (state.inodes != live && !rebuild_state).then_some((state.inodes, live));
    let mut r = w.r;
    // Repairs in two kinds. Global ones follow from the whole walk (a leak is a block
    // nothing seen owns; a link count counts the entries seen), so they are made only when
    // the walk saw everything: no error at all, or only errors that hid nothing (a bad
    // name, a size out of range). Local ones follow from one inode or block and are made
    // whatever else is wrong.
    let global_ok = r.errors.is_empty() || w.complete;
    let mut global: Vec<String> = leaked
        .iter()
        .take(20)
        .map(|b| format!("block {b} is marked in use but owned by nothing"))
        .chain(nlink_fixes.iter().map(|(i, have, want)| format!("inode {i}: link count {have}, should be {want}")))
        .chain(
            slot_fixes
                .iter()
                .map(|(b, have, want)| format!("inode block {b}: used slots {have:#06x}, should be {want:#06x}")),
        )
        .chain(
            lazy_drops
                .iter()
                .map(|b| format!("lazy-free record of block {b} is malformed or for a block with no live inode")),
        )
        .chain(inode_count_fix.map(|(have, want)| format!("state block counts {have} inodes, found {want}")))
        .chain(xattr_fixes.iter().map(|(b, c, n)| format!("xattr block {b}: reference count {c}, used by {n} inodes")))
        .chain(
            reinit.iter().map(|(b, _)| format!("inode block {b} is unreadable and holds no live inode: written empty")),
        )
        .collect();
    if leaked.len() > 20 {
        // A repairable finding like the rest: it must not block the repair itself.
        global.insert(20, format!("... and {} more leaked blocks", leaked.len() - 20));
    }
    // Inode fields of an inode that is itself unusable are not worth setting.
    let inode_fixes: Vec<(u64, InodeFix, String)> =
        w.inode_fixes.iter().filter(|(ino, ..)| !w.bad.contains(ino)).cloned().collect();
    let local: Vec<String> = marked_free
        .iter()
        .take(20)
        .map(|b| format!("block {b} is in use but marked free"))
        .chain(
            (marked_free.len() > 20)
                .then(|| format!("... and {} more blocks in use but marked free", marked_free.len() - 20)),
        )
        .chain(inode_fixes.iter().map(|(_, _, m)| m.clone()))
        .collect();
    let lost_msgs: Vec<String> = lost
        .iter()
        .map(|l| format!("inode {} ({}) is in no directory: a repair puts it into /lost+found", l.ino, l.what()))
        .collect();
    // The superblock copies: rewritten from the one in use, whatever else is wrong.
    if repair {
        for (at, msg) in sb_fixes {
            dev.write(at, &w_sb.encode(at)[..])?;
            dev.flush()?;
            r.fixed.push(msg);
        }
    } else {
        r.errors.extend(sb_fixes.into_iter().map(|(_, m)| m));
    }
    if !r.rebuilt.is_empty() {
        if repair && global_ok {
            // Written in place, outside any delta: a crash half way leaves them damaged
            // again, and the next fsck rebuilds them again.
            let next_generation = inodes.values().map(|i| i.generation).max().unwrap_or(0).wrapping_add(1);
            let state = State {
                orphan_head: 0,
                next_generation,
                commit_seq: journal_seq,
                inodes: r.inodes,
                lazy_frees: TreeRoot::default(),
            };
            rebuild(&*dev, layout, rebuild_bitmap.then_some(&w.owner), rebuild_state.then_some(state))?;
            r.fixed.extend(r.rebuilt.iter().map(|d| format!("{d}: rebuilt from the tree")));
        } else {
            r.errors.extend(r.rebuilt.iter().map(|d| format!("{d} (a repair rebuilds it from the tree)")));
        }
    }
    // Errors that block the repairs above, but some of them only because an entry names
    // an inode that cannot be used: drop those entries (their inodes' blocks and slots
    // are then leaked, and the next pass reclaims them) and check again.
    // Entries in a directory about to be rebuilt wait for the next pass.
    let drops: Vec<Drop> = drops.into_iter().filter(|(d, ..)| !w.bad.contains(d) && !w.salvage.contains(d)).collect();
    let salvage: Vec<u64> = w.salvage.iter().copied().collect();
    if repair && root_lost && pass < MAX_DROP_PASSES {
        // Nothing else can be checked without the root: recreate it first.
        drop(w.st);
        let told = recreate_root(dev.clone())?;
        let mut next = check_pass(dev, repair, progress, pass + 1)?;
        next.fixed.insert(0, told);
        return Ok(next);
    }
    if repair && !r.errors.is_empty() && (!drops.is_empty() || !salvage.is_empty()) && pass < MAX_DROP_PASSES {
        drop(w.st);
        let mut told: Vec<String> = drops
            .iter()
            .map(|(d, _, name, c)| {
                format!(
                    "directory {d}: dropped entry {:?}, which names unusable inode {c} (its contents are lost)",
                    String::from_utf8_lossy(name)
                )
            })
            .collect();
        told.extend(drop_entries(dev.clone(), &drops, &salvage)?);
        let mut next = check_pass(dev, repair, progress, pass + 1)?;
        next.fixed.splice(0..0, told);
        return Ok(next);
    }
    let do_global = repair && global_ok && (!global.is_empty() || !lost.is_empty());
    let do_local = repair && !local.is_empty();
    if do_global || do_local {
        drop(w.st);
        // A lazy-free record of a block lost inodes live in stays: it frees other slots.
        lazy_drops.retain(|b| !claimed.contains(b));
        let none: &[u64] = &[];
        let fixes = Fixes {
            leaked: if do_global { &leaked } else { none },
            nlinks: if do_global { &nlink_fixes } else { &[] },
            slots: if do_global { &slot_fixes } else { &[] },
            lazy_drops: if do_global { &lazy_drops } else { none },
            reinit: if do_global { &reinit } else { &[] },
            marked_free: &marked_free,
            xattr_refs: if do_global { &xattr_fixes } else { &[] },
            inode_fixes: &inode_fixes,
            inode_count: inode_count_fix.filter(|_| do_global).map(|f| f.1),
        };
        repair_volume(dev.clone(), &fixes)?;
        r.fixed.extend(local);
        if do_global {
            r.fixed.extend(global);
        } else {
            r.errors.extend(global);
        }
        if do_global && !lost.is_empty() && pass < MAX_DROP_PASSES {
            // Back into the namespace, then checked again like any other inode (their
            // link counts, a directory's parent).
            let mut told = std::mem::take(&mut r.fixed);
            told.extend(reattach(dev.clone(), &lost)?);
            let mut next = check_pass(dev, repair, progress, pass + 1)?;
            next.fixed.splice(0..0, told);
            return Ok(next);
        }
        r.errors.extend(lost_msgs);
    } else {
        r.errors.extend(local);
        r.errors.extend(global);
        r.errors.extend(lost_msgs);
    }
    Ok(r)
}
