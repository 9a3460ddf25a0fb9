//! fsck's walk: every inode reachable from the root (and the orphan list), each checked
//! on its own (its index, extent map, xattrs and fields), with what it owns and how many
//! entries name it recorded for the comparisons that follow (`tally.rs`). Also finds the
//! live inodes no directory names, for /lost+found.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::disk::codec::*;
use crate::disk::format::*;
use crate::engine::btree;
use crate::engine::store::Store;
use crate::error::Result;
use crate::fs::dir;
use crate::fs::file;
use crate::fs::xattr;

use super::Report;

/// What the namespace walk found: the inodes reached, each directory's subdirectories,
/// entries a repair drops, and whether the root itself was unreadable.
pub(super) struct Tree {
    pub(super) inodes: HashMap<u64, Reached>,
    pub(super) subdirs: HashMap<u64, u32>,
    pub(super) drops: Vec<Drop>,
    pub(super) root_lost: bool,
}

/// What the comparisons after the walk need of a reached inode. The whole record is
/// checked where it is read and not kept: at 350 bytes an inode, a walk of a million
/// inodes held over a gigabyte, and `dxfs mount` walks every volume from elsewhere.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reached {
    pub(super) mode: u32,
    pub(super) nlink: u32,
    pub(super) generation: u32,
    pub(super) size: u64,
    pub(super) blocks: u64,
    pub(super) parent: u64,
    pub(super) ctime: (i64, u32),
}

impl Reached {
    fn of(i: &Inode) -> Reached {
        Reached {
            mode: i.mode,
            nlink: i.nlink,
            generation: i.generation,
            size: i.size,
            blocks: i.blocks,
            parent: i.parent,
            ctime: i.ctime,
        }
    }

    pub(super) fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
}

pub(super) struct Walk<'a> {
    pub(super) st: Store,
    pub(super) r: Report,
    /// Block owners, for "owned twice" reports.
    pub(super) owner: HashMap<u64, u64>,
    /// Blocks owned as metadata (not file data), and the file data extents seen: an
    /// extent over metadata is dropped (`data_over_metadata`).
    pub(super) meta: HashSet<u64>,
    data_runs: Vec<(u64, Extent)>,
    /// File data blocks another extent claimed first, as data: (inode, its extent, block,
    /// the first owner). A repair gives the later extent its own copies (`shared_data`).
    shared: Vec<(u64, Extent, u64, u64)>,
    /// Extents `data_over_metadata` dropped, by (inode, logical block).
    dropped_runs: HashSet<(u64, u64)>,
    pub(super) links: HashMap<u64, u32>,
    /// (non-directory, a directory naming it), once per name (its rstat counting
    /// directory must be one of them); sorted once the namespace walk ends (`names_of`).
    /// Pairs, not a map of lists: most files have one name.
    names: Vec<(u64, u64)>,
    pub(super) seen: HashSet<u64>,
    /// References to each xattr head block.
    pub(super) xattr_refs: HashMap<u64, u32>,
    /// Inodes that cannot be used: unreadable, or with a broken index, extent map or
    /// xattr list. A repair drops the entries that name them (`Drop`).
    pub(super) bad: HashSet<u64>,
    /// Entries (directory, key) dropped as a name's second entry.
    pub(super) second_names: HashSet<(u64, u64)>,
    /// Inode fields that disagree with what the walk found, and the fix for each.
    pub(super) inode_fixes: Vec<(u64, InodeFix, String)>,
    /// Directories whose index is damaged: a repair rebuilds it from its readable leaves.
    pub(super) salvage: HashSet<u64>,
    /// Whether the walk saw everything: no error left any part of the volume unread.
    pub(super) complete: bool,
    /// Entries outside their probe range: (directory, key, name, inode, type), which a
    /// repair moves to the key their name gives.
    pub(super) rekey: Vec<(u64, u64, Vec<u8>, u64, FileType)>,
    /// Where a repair ends the orphan list: after this inode, or at the head (`None`).
    pub(super) orphan_cut: Option<Option<u64>>,
    /// Each reached directory's inode region, claimed once every other owner is known
    /// (`regions`); after that, only the regions that keep the rules.
    pub(super) regions: Vec<(u64, DirInfo)>,
    pub(super) progress: &'a mut dyn FnMut(u64),
}

/// A field of an inode record that the walk can recompute.
#[derive(Clone, Debug)]
pub(super) enum InodeFix {
    /// A size past what the inode can hold: clamped to what its extents map.
    Size(u64),
    /// Nanosecond fields of a second or more: clamped below one second.
    Times,
    /// An xattr block pointer out of range: cleared (what it named is lost).
    NoXattrBlock,
    /// Extent records that break the rules: removed, their range a hole.
    DropExtents(Vec<Extent>),
    /// An extent whose blocks `shared` another file's data (or another extent of the
    /// same file) claimed first: those blocks are copied to new ones for this extent, so
    /// that a write to one file never changes the other (e2fsck's cloning of duplicate
    /// blocks). Without room for a copy, the block becomes a hole.
    CloneShared { extent: Extent, shared: Vec<u64> },
    /// An xattr list with entries that break the rules: stored again with only the rest.
    Xattrs(Vec<xattr::Xattr>),
    /// A directory's entry count.
    Entries(u64),
    /// Blocks the inode owns.
    Blocks(u64),
    /// The bloom filter of the inode's xattr names.
    XattrFilter(u32),
    /// A directory's parent: the directory that names it.
    Parent(u64),
    /// A directory's inode region that overlaps what others own: cleared (its children
    /// stay where they are; the next child reserves a new region).
    NoRegion,
    /// A quota where the volume has none (the field is reserved): cleared.
    NoQuota,
}

/// A live inode that no directory names, which a repair links into /lost+found as `#INO`.
#[derive(Clone, Copy, Debug)]
pub(super) struct LostInode {
    pub(super) ino: u64,
    pub(super) kind: FileType,
    pub(super) size: u64,
}

impl LostInode {
    pub(super) fn what(&self) -> String {
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
pub(super) type Drop = (u64, u64, Vec<u8>, u64);

impl<'a> Walk<'a> {
    /// A walk of the volume `st`, into report `r`.
    pub(super) fn new(st: Store, r: Report, progress: &'a mut dyn FnMut(u64)) -> Walk<'a> {
        Walk {
            st,
            r,
            owner: HashMap::new(),
            meta: HashSet::new(),
            data_runs: Vec::new(),
            shared: Vec::new(),
            dropped_runs: HashSet::new(),
            links: HashMap::new(),
            names: Vec::new(),
            seen: HashSet::new(),
            xattr_refs: HashMap::new(),
            bad: HashSet::new(),
            second_names: HashSet::new(),
            inode_fixes: Vec::new(),
            salvage: HashSet::new(),
            complete: true,
            rekey: Vec::new(),
            orphan_cut: None,
            regions: Vec::new(),
            progress,
        }
    }
}

impl Walk<'_> {
    /// Live inodes the walk did not reach, in the inode blocks it knows whose slot mask
    /// does not match what it found (`mismatched`) and in
    /// leaked blocks that are inode blocks, that can be put back as they are: readable,
    /// linked at least once, with a sound index or extent map and xattrs, owning no block
    /// anything else owns. Returns the ones to link into /lost+found (those no other lost
    /// directory names: the rest come back with it), every block they and their subtrees
    /// own (their inode blocks too), every live inode among them, and how many of them use
    /// each xattr head block.
    pub(super) fn find_lost(
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
    pub(super) fn sound(&mut self, i: &Inode, claimed: &HashSet<u64>) -> Option<(Vec<u64>, Option<u64>)> {
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
    pub(super) fn fix(&mut self, ino: u64, f: InodeFix, m: String) {
        self.inode_fixes.push((ino, f, m));
    }

    /// An error that leaves part of the volume unseen (something unreadable): whatever
    /// depends on a complete walk (leaks, link counts, slot masks, the rebuilt map) must
    /// then not be repaired.
    pub(super) fn blind(&mut self, m: String) {
        self.complete = false;
        self.err(m);
    }

    pub(super) fn err(&mut self, m: String) {
        if self.r.errors.len() < 1000 {
            self.r.errors.push(m);
        }
    }

    pub(super) fn own(&mut self, b: u64, ino: u64, what: &str) {
        self.claim(b, ino, what);
    }

    /// [`Walk::own`], returning the first owner when both claims are file data: the
    /// caller records that for a copy (`shared_data`) instead of an error.
    fn claim(&mut self, b: u64, ino: u64, what: &str) -> Option<u64> {
        // Inodes own only data-area blocks; the fixed structures there (ino 0) are the
        // blocks the data area leaves out.
        let layout = self.st.sb.layout;
        let placed =
            if ino == 0 { b >= layout.first_free() && b < layout.block_count } else { layout.meta_block_ok(b) };
        if !placed {
            self.err(format!("inode {ino}: {what} block {b} outside the data area"));
            return None;
        }
        // A region is a range an inode names, not a block read and verified: its inode
        // blocks count as metadata where the slot check reads them.
        if what != "data" && what != "reserved region" {
            self.meta.insert(b);
        }
        let o = self.owner.insert(b, ino)?;
        if what == "data" && !self.meta.contains(&b) {
            return Some(o);
        }
        self.err(format!("block {b} owned twice: by inode {o} and by inode {ino} ({what})"));
        None
    }

    /// Whether block `b` is file data of a usable inode the walk reached, and not
    /// metadata too. (Before `data_over_metadata`, which takes the extents.)
    pub(super) fn file_data(&self, b: u64) -> bool {
        !self.meta.contains(&b)
            && self.data_runs.iter().any(|(ino, e)| !self.bad.contains(ino) && b >= e.phys && b - e.phys < e.len)
    }

    /// File data extents over blocks that hold metadata (a wild or stretched extent):
    /// the metadata is checksummed and the extent is not, so a repair drops the extent
    /// (its range becomes a hole). Called once every owner is known. Returns how many.
    pub(super) fn data_over_metadata(&mut self) -> usize {
        let mut n = 0;
        for (ino, e) in std::mem::take(&mut self.data_runs) {
            if self.bad.contains(&ino) {
                continue;
            }
            if let Some(b) = (e.phys..e.phys + e.len).find(|b| self.meta.contains(b)) {
                let m = format!(
                    "inode {ino}: extent of {} blocks at logical {} -> block {} covers block {b}, which holds \
                     metadata (a repair drops it: its range becomes a hole)",
                    e.len, e.logical, e.phys
                );
                self.fix(ino, InodeFix::DropExtents(vec![e]), m);
                self.dropped_runs.insert((ino, e.logical));
                n += 1;
            }
        }
        n
    }

    /// File data blocks two extents claim (a bent extent over another file's data): the
    /// later extent gets its own copies, unless it or the inode goes anyway. After
    /// `data_over_metadata`. Returns how many extents.
    pub(super) fn shared_data(&mut self) -> usize {
        let mut by_extent: Vec<(u64, Extent, Vec<u64>, u64)> = Vec::new();
        for (ino, e, b, first) in std::mem::take(&mut self.shared) {
            if self.bad.contains(&ino) || self.dropped_runs.contains(&(ino, e.logical)) {
                continue;
            }
            match by_extent.last_mut() {
                Some((i, x, blocks, _)) if *i == ino && *x == e => blocks.push(b),
                _ => by_extent.push((ino, e, vec![b], first)),
            }
        }
        let n = by_extent.len();
        for (ino, extent, shared, first) in by_extent {
            let m = format!(
                "inode {ino}: extent of {} blocks at logical {} -> block {} shares {} with the data of inode \
                 {first} (a repair gives it its own copies)",
                extent.len,
                extent.logical,
                extent.phys,
                match shared.len() {
                    1 => format!("block {}", shared[0]),
                    n => format!("{n} blocks from block {}", shared[0]),
                }
            );
            self.fix(ino, InodeFix::CloneShared { extent, shared }, m);
        }
        n
    }

    pub(super) fn check_inode(&mut self, i: &Inode) -> Result<()> {
        let ino = i.ino;
        let mut owned = 0u64;
        let layout = self.st.sb.layout;
        // The validity rules (disk::valid) that a repair can make hold; what is left
        // of them makes the inode unusable, as an unreadable one.
        if !i.nsec_ok() {
            self.fix(ino, InodeFix::Times, format!("inode {ino}: a nanosecond field is a second or more"));
        }
        if i.xattr_block != 0 && !layout.meta_block_ok(i.xattr_block) {
            let m = format!("inode {ino}: xattr block {} is out of range (its xattrs are lost)", i.xattr_block);
            self.fix(ino, InodeFix::NoXattrBlock, m);
            let mut copy = *i;
            copy.xattr_block = 0;
            return self.check_inode(&copy);
        }
        let mut sound = *i;
        sound.size = sound.size.min(MAX_FILE_SIZE);
        if i.file_type() == Some(FileType::Symlink) {
            sound.size = sound.size.min(MAX_SYMLINK);
        }
        sound.blocks = sound.blocks.min(layout.block_count);
        if let InodeData::Extents { n, .. } = &mut sound.data {
            *n = 0; // checked one by one below
        }
        if let Err(e) = sound.check(&layout) {
            self.bad.insert(ino);
            self.blind(format!("{e}"));
            return Ok(());
        }
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
                if d.region_len > 0 {
                    self.regions.push((ino, *d));
                }
                if d.quota != 0 && !self.st.sb.dir_quota() {
                    let m = format!("directory {ino}: a quota on a volume without DIR_QUOTA (a reserved field)");
                    self.fix(ino, InodeFix::NoQuota, m);
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
                let found = file::raw_extents(&mut self.st.tx(), i);
                match found {
                    Ok(list) => {
                        let mut last_end = 0;
                        let mut dropped = Vec::new();
                        let mut mapped_end = 0;
                        for e in list {
                            if let Err(why) = e.check(&layout, ino) {
                                self.err(format!("{why} (a repair drops it: its range becomes a hole)"));
                                dropped.push(e);
                                continue;
                            }
                            if e.logical < last_end {
                                self.err(format!(
                                    "inode {ino}: extents overlap at {} (a repair drops the later one)",
                                    e.logical
                                ));
                                dropped.push(e);
                                continue;
                            }
                            last_end = e.end();
                            mapped_end = e.end();
                            for b in e.phys..e.phys + e.len {
                                if let Some(first) = self.claim(b, ino, "data") {
                                    self.shared.push((ino, e, b, first));
                                }
                            }
                            self.data_runs.push((ino, e));
                            owned += e.len;
                        }
                        if !dropped.is_empty() {
                            let m = format!("inode {ino}: {} bad extent records dropped", dropped.len());
                            self.fix(ino, InodeFix::DropExtents(dropped), m);
                        }
                        let symlink = i.file_type() == Some(FileType::Symlink);
                        if symlink && i.size > MAX_SYMLINK {
                            let want = (mapped_end * BLOCK_SIZE as u64).min(MAX_SYMLINK);
                            let m = format!(
                                "inode {ino}: symlink target of {} bytes is longer than {MAX_SYMLINK}: cut to {want}",
                                i.size
                            );
                            self.fix(ino, InodeFix::Size(want), m);
                        } else if i.size > MAX_FILE_SIZE {
                            let want = (mapped_end * BLOCK_SIZE as u64).min(MAX_FILE_SIZE);
                            let m = format!(
                                "inode {ino}: size {} is beyond the largest file ({MAX_FILE_SIZE}): set to {want}",
                                i.size
                            );
                            self.fix(ino, InodeFix::Size(want), m);
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
            }
            // The blocks are readable (or the list is inline), but entries are not: a
            // repair keeps what can be read and stores it again.
            Err(e) if !self.bad.contains(&ino) => {
                let kept = xattr::salvage(&mut self.st.tx(), i);
                let m = format!("{e} (a repair keeps the {} entries that can be read)", kept.len());
                self.fix(ino, InodeFix::Xattrs(kept), m);
            }
            Err(e) => self.blind(format!("inode {ino}: xattrs unreadable: {e}")),
        }
        if i.is_dir() && i.size > MAX_FILE_SIZE {
            let m = format!("directory {ino}: size {} is impossible", i.size);
            self.fix(ino, InodeFix::Size(owned * BLOCK_SIZE as u64), m);
        }
        if owned != i.blocks {
            let m = format!("inode {ino}: owns {owned} blocks, inode says {}", i.blocks);
            self.fix(ino, InodeFix::Blocks(owned), m);
        }
        if i.file_type() == Some(FileType::Symlink) && (i.size == 0 || i.size > 4095) {
            self.err(format!("symlink {ino}: bad target length {}", i.size));
        }
        Ok(())
    }

    /// Walk the namespace breadth first from `root`: every inode reached is checked, each
    /// directory's entries against its index, and what each owns is recorded.
    pub(super) fn namespace(&mut self, root: u64) -> Result<Tree> {
        // Each queued inode comes with the entry it was found through: (key, name).
        let mut queue = VecDeque::from([(root, root, 0u64, Vec::new())]);
        let mut inodes: HashMap<u64, Reached> = HashMap::new();
        let mut subdirs: HashMap<u64, u32> = HashMap::new();
        let mut drops: Vec<Drop> = Vec::new();
        let mut root_lost = false;
        while let Some((ino, parent, key, name)) = queue.pop_front() {
            // Unchecked: check_inode applies the rules, and repairs what it can.
            let i = match self.st.inode_unchecked(ino) {
                Ok(i) => i,
                Err(e) => {
                    self.blind(format!("inode {ino} (in directory {parent}) unreadable: {e}"));
                    if ino != root {
                        drops.push((parent, key, name, ino));
                    } else {
                        root_lost = true;
                    }
                    continue;
                }
            };
            if !self.seen.insert(ino) {
                continue;
            }
            self.r.inodes += 1;
            if self.r.inodes % 4096 == 0 {
                (self.progress)(self.r.inodes);
            }
            self.check_inode(&i)?;
            if self.bad.contains(&ino) && ino != root {
                drops.push((parent, key, name.clone(), ino));
            }
            if i.is_dir() {
                self.r.directories += 1;
                if i.parent != parent {
                    let m = format!("directory {ino}: parent field {} but found in {parent}", i.parent);
                    self.fix(ino, InodeFix::Parent(parent), m);
                }
                let d = *i.dir()?;
                let mut ents = Vec::new();
                let mut bad = None;
                let r = btree::scan(&mut self.st.tx(), &d.tree, ino, 0, |k, v| {
                    match decode_dirent(v) {
                        Ok((c, ft, name)) => ents.push((k, c, ft, name.to_vec())),
                        Err(e) => bad = Some(e),
                    }
                    bad.is_none()
                });
                // A damaged index is rebuilt from what can still be read of it (`salvage`).
                if let Err(e) = r {
                    self.blind(format!("directory {ino}: unreadable index: {e}"));
                    self.salvage.insert(ino);
                }
                if let Some(e) = bad {
                    self.blind(format!("directory {ino}: {e}"));
                    self.salvage.insert(ino);
                }
                let mut names = HashSet::new();
                for (k, c, ft, name) in ents {
                    if dir::check_name(&name).is_err() {
                        // No path can reach it: a repair drops the entry, and its inode,
                        // named by nothing, goes to /lost+found.
                        self.err(format!(
                            "directory {ino}: invalid name {:?} (a repair drops the entry)",
                            String::from_utf8_lossy(&name)
                        ));
                        drops.push((ino, k, name, c));
                        continue;
                    }
                    if names.contains(&name) {
                        // A second entry of a name (a damaged leaf): a repair drops it, as
                        // an invalid name, and the first is moved to its key if need be;
                        // its inode, if named by nothing else, goes to /lost+found.
                        self.err(format!(
                            "directory {ino}: name {:?} appears twice (a repair drops the second entry)",
                            String::from_utf8_lossy(&name)
                        ));
                        self.second_names.insert((ino, k));
                        drops.push((ino, k, name, c));
                        continue;
                    }
                    let h = dir::name_key(&self.st, &name);
                    if k < h || k > h + d.max_disp as u64 {
                        self.err(format!(
                            "directory {ino}: entry {:?} at key {k:#x}, outside its probe range from {h:#x} (a repair moves it)",
                            String::from_utf8_lossy(&name)
                        ));
                        self.rekey.push((ino, k, name.clone(), c, ft));
                    }
                    names.insert(name.clone());
                    *self.links.entry(c).or_insert(0) += 1;
                    if ft != FileType::Directory {
                        self.names.push((c, ino));
                    }
                    if ft == FileType::Directory {
                        *subdirs.entry(ino).or_insert(0) += 1;
                        if self.seen.contains(&c) {
                            self.blind(format!("directory {c} is linked more than once"));
                            continue;
                        }
                    }
                    match self.st.inode_unchecked(c) {
                        Ok(ci) => {
                            if ci.file_type() != Some(ft) {
                                self.err(format!("directory {ino}: entry type of {c} does not match the inode"));
                            }
                            if self.bad.contains(&c) {
                                // Another link to an inode already found unusable.
                                drops.push((ino, k, name.clone(), c));
                            } else if !self.seen.contains(&c) {
                                queue.push_back((c, ino, k, name));
                            }
                        }
                        Err(e) => {
                            self.blind(format!(
                                "directory {ino}: entry {:?} points to inode {c}: {e}",
                                String::from_utf8_lossy(&name)
                            ));
                            self.bad.insert(c);
                            drops.push((ino, k, name, c));
                        }
                    }
                }
            } else {
                self.r.files += 1;
            }
            inodes.insert(ino, Reached::of(&i));
        }
        self.names.sort_unstable();
        Ok(Tree { inodes, subdirs, drops, root_lost })
    }

    /// The directories naming non-directory `ino`, once per name (after `namespace`).
    pub(super) fn names_of(&self, ino: u64) -> impl Iterator<Item = u64> + Clone + '_ {
        let from = self.names.partition_point(|&(c, _)| c < ino);
        self.names[from..].iter().take_while(move |&&(c, _)| c == ino).map(|&(_, d)| d)
    }

    /// Orphans: unlinked, still allocated until the next read-write open. The list from
    /// `head` is checked like the namespace and its inodes join `inodes`.
    pub(super) fn orphans(&mut self, head: u64, inodes: &mut HashMap<u64, Reached>) -> Result<HashSet<u64>> {
        let mut orphans = HashSet::new();
        let mut cur = head;
        let mut last = None;
        while cur != 0 {
            // The list may only name unlinked inodes, each once: anything else is cut
            // off there by a repair (a read-write open frees nothing past it either).
            let found = if self.seen.contains(&cur) || cur == self.st.sb.root_ino {
                Err(format!("inode {cur} is in the namespace or earlier in the list"))
            } else {
                match self.st.inode_unchecked(cur) {
                    Ok(i) if i.nlink != 0 => Err(format!("inode {cur} has {} links", i.nlink)),
                    Ok(i) => Ok(i),
                    Err(e) => Err(format!("inode {cur}: {e}")),
                }
            };
            let i = match found {
                Ok(i) => i,
                Err(why) => {
                    self.err(format!("orphan list: {why} (a repair ends the list before it)"));
                    self.orphan_cut = Some(last);
                    break;
                }
            };
            last = Some(cur);
            self.seen.insert(cur);
            orphans.insert(cur);
            self.r.inodes += 1;
            self.check_inode(&i)?;
            cur = i.next_orphan;
            inodes.insert(i.ino, Reached::of(&i));
        }
        Ok(orphans)
    }
}
