//! fsck's repairs: each runs in one delta of an opened volume (or, for the free-space map
//! and the state block, in place), and the check runs again after the ones that cut
//! damage out.

use super::*;

/// Passes of dropping entries before fsck gives up (each pass drops every entry found
/// unusable; a later one only finds entries under what an earlier drop exposed).
pub(super) const MAX_DROP_PASSES: u32 = 4;

/// Remove the entries `drops` from their directories and rebuild the indexes of the
/// directories `salvage` from what can be read of them, in one delta, after marking in
/// use the blocks `marked_free` (owned, the walk found). Returns a line per rebuilt
/// directory and per block marked.
pub(super) fn drop_entries(
    dev: Arc<dyn BlockDevice>,
    drops: &[Drop],
    salvage: &[u64],
    marked_free: &[u64],
) -> Result<Vec<String>> {
    let vol = Volume::open_for_repair(dev, false)?;
    let mut told = Vec::new();
    vol.repair(|st, _| {
        // A rebuilt index takes new blocks: never one the walk found owned but marked
        // free (it was the root's inode block once, fuzzer seed 2415936894).
        for &b in marked_free {
            st.space().mark_used(b);
        }
        told.extend(marked_free.iter().take(20).map(|b| format!("block {b} is in use but marked free")));
        for (d, key, _, _) in drops {
            let mut p = st.inode_unchecked(*d)?;
            dir::remove(st, &mut p, *key)?;
            st.put_inode(&p)?;
        }
        for &d in salvage {
            let (had, kept) = rebuild_index(st, d)?;
            told.push(format!(
                "directory {d}: index rebuilt from its readable blocks: {kept} of {had} entries kept (the others are lost)"
            ));
        }
        Ok(())
    })?;
    vol.close()?;
    Ok(told)
}

/// Link each of `lost` into /lost+found (made, mode 0700, owned by root, when missing)
/// as `#INO`, in one delta. A lost directory's parent and lost+found's link count follow
/// at once; the files' link counts are left to the next pass. Returns a line per inode.
pub(super) fn reattach(dev: Arc<dyn BlockDevice>, lost: &[LostInode]) -> Result<Vec<String>> {
    let vol = Volume::open_for_repair(dev, false)?;
    let root = vol.root();
    let mut told = Vec::new();
    let lf = match vol.lookup(root, b"lost+found") {
        Ok(a) if a.kind == FileType::Directory => a.ino,
        Ok(_) => {
            return Err(crate::error::Error::Invalid(
                "/lost+found is not a directory: rename it, then run fsck again".into(),
            ))
        }
        Err(crate::error::Error::NotFound) => {
            let a = vol.mkdir(root, b"lost+found", 0o700, 0, 0)?;
            told.push(format!("created /lost+found (directory {})", a.ino));
            a.ino
        }
        Err(e) => return Err(e),
    };
    vol.repair(|st, _| {
        let mut p = st.inode_unchecked(lf)?;
        for l in lost {
            let name = format!("#{}", l.ino);
            if dir::lookup(st, &p, name.as_bytes())?.is_some() {
                continue;
            }
            dir::insert(st, &mut p, name.as_bytes(), l.ino, l.kind)?;
            if l.kind == FileType::Directory {
                p.nlink += 1;
                let mut i = st.inode_unchecked(l.ino)?;
                i.parent = lf;
                st.put_inode(&i)?;
            }
            told.push(format!("inode {} ({}) was in no directory: reattached as /lost+found/{name}", l.ino, l.what()));
        }
        let t = crate::volume::now();
        (p.mtime, p.ctime) = (t, t);
        st.put_inode(&p)
    })?;
    vol.close()?;
    Ok(told)
}

/// The root's inode cannot be read: write a new one (a directory, mode 0755, owned by
/// root, times now, no xattrs) whose index holds the records of every readable leaf that
/// names the root as its owner, found by scanning the blocks in use. The root's own block
/// holds nothing else (mkfs gives it its own block; children live in its region).
pub(super) fn recreate_root(dev: Arc<dyn BlockDevice>) -> Result<String> {
    let sb = read_usable_superblock(&*dev)?;
    let root = sb.root_ino;
    let (rb, slot) = ino_loc(root);
    let o = crate::engine::store::open_lenient(dev.clone(), sb.clone(), true, 1 << 12, true, false)?;
    let state = o.opened.state;
    let store = o.opened.store;
    let mut st = store.tx();
    // A B+tree node at the root's block is live only if its owner's tree reaches it.
    let mut raw = [0u8; BLOCK_SIZE];
    dev.read(rb, &mut raw)?;
    let node_reached = get_u32(&raw, 0) == crate::engine::btree::BTREE_MAGIC
        && node_is_reached(&mut st, &state, sb.layout, get_u64(&raw, 16), rb);
    // An xattr head there is live only if a readable inode names it (heads name no owner).
    let head_named =
        get_u32(&raw, 0) == XATTR_MAGIC && xattr_head_is_named(&*dev, &sb, &|b| b != rb && store.is_used(b), rb)?;
    let mut recs = std::collections::BTreeMap::new();
    let mut nodes = Vec::new();
    let mut read = 0;
    // A root's leaf written over its own inode block (a log delta sent to the wrong block,
    // fuzzer seed 1074577788) is read first: it may be the newest copy of its entries.
    let blocks =
        std::iter::once(rb).chain((sb.layout.first_free()..sb.layout.backup_superblock()).filter(|&b| b != rb));
    for b in blocks {
        if !store.is_used(b) || !btree::owned_node(&mut st, b, root) {
            continue;
        }
        if b != rb {
            nodes.push(b);
        }
        read += 1;
        if let Ok(list) = btree::leaf_records(&mut st, b, root) {
            for (k, v) in list {
                if decode_dirent(&v).is_ok() {
                    recs.entry(k).or_insert(v);
                }
            }
        }
    }
    drop(st);
    drop(store);
    let found = recs.len();
    // The root's block is written only where it holds no other live record: a readable
    // block of another kind stops the repair, a readable inode block keeps its other
    // inodes, and an unreadable one (the damaged root block) is written anew.
    let readable = verify(&raw, rb, None).is_ok();
    let magic = get_u32(&raw, 0);
    if readable && magic != INODE_MAGIC && foreign_may_be_live(&*dev, &sb, &raw, rb, node_reached || head_named)? {
        return Err(crate::error::Error::corrupt(format!(
            "the root inode {root} is unreadable and its block {rb} holds another structure (magic {magic:#010x}): \
             the root cannot be recreated there"
        )));
    }
    let intact = readable && magic == INODE_MAGIC;
    let vol = Volume::open_for_repair(dev, false)?;
    vol.repair(|st, _| {
        for &b in &nodes {
            st.free_meta(b);
        }
        if !intact {
            st.blank_inode_block(rb, 0);
        }
        let blk = st.block_mut(rb, Some(INODE_MAGIC))?;
        let used = get_u16(blk, IB_USED);
        put_u16(blk, IB_USED, used | 1 << slot);
        let t = crate::volume::now();
        let mut i = Inode::new(root, libc::S_IFDIR | 0o755);
        (i.nlink, i.parent, i.atime, i.mtime, i.ctime, i.crtime) = (2, root, t, t, t, t);
        let mut tree = TreeRoot::default();
        for (k, v) in &recs {
            btree::insert(st, &mut tree, root, *k, v, false)?;
        }
        let blocks = btree::blocks(st, &tree, root)?.len() as u64;
        let d = i.dir_mut()?;
        d.tree = tree;
        d.entries = found as u64;
        i.size = blocks * BLOCK_SIZE as u64;
        st.put_inode(&i)
    })?;
    vol.close()?;
    Ok(format!(
        "root directory {root} was unreadable: recreated (mode 0755, owner root, no xattrs) with the {found} entries of {} readable index blocks",
        read
    ))
}

/// Both superblock copies name as the root an inode that is plainly none (a file, a free
/// slot, a block of another kind): the root is the one directory that is its own parent,
/// found by reading every intact inode block. Returns it when there is exactly one.
pub(super) fn find_root(dev: &dyn BlockDevice, sb: &Superblock) -> Result<Option<u64>> {
    if crate::volume::root_is_wrong(dev, sb)? != Some(true) {
        return Ok(None);
    }
    let mut found = Vec::new();
    let mut b = [0u8; BLOCK_SIZE];
    for blk in sb.layout.first_free()..sb.layout.backup_superblock() {
        dev.read(blk, &mut b)?;
        if verify(&b, blk, Some(INODE_MAGIC)).is_err() {
            continue;
        }
        for slot in 1..BLOCK_SIZE / 256 {
            let ino = blk * (BLOCK_SIZE / 256) as u64 + slot as u64;
            if let Ok(Some(i)) = Inode::decode(ino, &b[slot * 256..(slot + 1) * 256]) {
                if i.is_dir() && i.parent == ino {
                    found.push(ino);
                }
            }
        }
        if found.len() > 1 {
            return Ok(None);
        }
    }
    Ok(found.first().copied())
}

/// Whether `raw`, a readable block of another kind found at the root's inode block `rb`,
/// may be a live structure that recreating the root would write over. Both superblock
/// copies must name this root (else the root's place itself is in doubt). Structures with
/// fixed places elsewhere (superblock, state, log, bitmap; the mount mark is never the
/// root's block, FORMAT §3) cannot be live here. An xattr continuation is live only if
/// its owner's list names it; a B+tree node only if its owner's tree reaches it, and an
/// xattr head only if a readable inode names it (`live`, which the caller found); a
/// block whose magic no structure has, never.
fn foreign_may_be_live(dev: &dyn BlockDevice, sb: &Superblock, raw: &Block, rb: u64, live: bool) -> Result<bool> {
    let mut b = [0u8; BLOCK_SIZE];
    let last = sb.layout.backup_superblock();
    dev.read(last, &mut b)?;
    if Superblock::decode(&b, last).map_or(true, |bk| bk.root_ino != sb.root_ino) {
        return Ok(true);
    }
    Ok(match get_u32(raw, 0) {
        SB_MAGIC | STATE_MAGIC | COMMIT_MAGIC | BITMAP_MAGIC | MARK_MAGIC => false,
        XATTR_CONT_MAGIC => continuation_is_named(dev, sb, get_u64(raw, 16), rb)?,
        crate::engine::btree::BTREE_MAGIC | XATTR_MAGIC => live,
        INODE_MAGIC => true,
        // No structure of this format has that magic (fuzzer seeds 3758169844,
        // 4026632305: the inode magic plus one): nothing live is there.
        _ => false,
    })
}

/// Whether a readable inode in a block in use names xattr head `head` as its list. An
/// unreadable inode's xattrs are lost with it, so its block names nothing.
fn xattr_head_is_named(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    in_use: &dyn Fn(u64) -> bool,
    head: u64,
) -> Result<bool> {
    let mut b = [0u8; BLOCK_SIZE];
    for blk in sb.layout.first_free()..sb.layout.backup_superblock() {
        if !in_use(blk) {
            continue;
        }
        dev.read(blk, &mut b)?;
        if verify(&b, blk, Some(INODE_MAGIC)).is_err() {
            continue;
        }
        let used = get_u16(&b, IB_USED);
        for slot in (0..16).filter(|s| used & 1 << s != 0) {
            let ino = blk * 16 + slot as u64;
            if let Ok(Some(i)) = Inode::decode(ino, &b[slot * INODE_SIZE..(slot + 1) * INODE_SIZE]) {
                if i.xattr_block == head {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

/// Whether the tree of B+tree node `b`'s owner (an inode, or the lazy-free or rstat
/// tree, FORMAT §6.1–6.2) reaches it. An owner that is no inode, or an inode with no
/// tree, cannot; one that cannot be read, or a tree that cannot be walked, may.
fn node_is_reached(st: &mut Tx, state: &State, layout: Layout, owner: u64, b: u64) -> bool {
    // An owner's inode and a node of its tree never share a block.
    if owner > 2 && ino_loc(owner).0 == b {
        return false;
    }
    let tree = match owner {
        1 => state.lazy_frees,
        2 => state.rstats,
        _ => {
            let (ob, slot) = ino_loc(owner);
            if slot == 0 || !layout.meta_block_ok(ob) {
                return false;
            }
            match st.inode_unchecked(owner) {
                Ok(i) => match i.data {
                    InodeData::Dir(d) => d.tree,
                    InodeData::ExtentTree { tree, .. } => tree,
                    _ => return false,
                },
                Err(_) => return true,
            }
        }
    };
    crate::engine::btree::blocks(st, &tree, owner).map_or(true, |found| found.contains(&b))
}

/// Whether inode `owner`'s xattr list names block `cont` as a continuation.
fn continuation_is_named(dev: &dyn BlockDevice, sb: &Superblock, owner: u64, cont: u64) -> Result<bool> {
    let (ob, slot) = ino_loc(owner);
    if slot == 0 || ob < sb.layout.first_free() || ob >= sb.layout.backup_superblock() {
        return Ok(false);
    }
    let mut b = [0u8; BLOCK_SIZE];
    dev.read(ob, &mut b)?;
    if verify(&b, ob, Some(INODE_MAGIC)).is_err() {
        // Unreadable: its list cannot be followed, so keep what may be part of it.
        return Ok(true);
    }
    let Ok(Some(i)) = Inode::decode(owner, &b[slot * 256..(slot + 1) * 256]) else { return Ok(false) };
    let head = i.xattr_block;
    if head < sb.layout.first_free() || head >= sb.layout.backup_superblock() {
        return Ok(false);
    }
    dev.read(head, &mut b)?;
    if verify(&b, head, Some(XATTR_MAGIC)).is_err() {
        return Ok(true);
    }
    let n = usize::from(get_u16(&b, 24)).min(16);
    Ok((0..n).any(|k| get_u64(&b, 32 + 8 * k) == cont))
}

/// Rebuild directory `d`'s index from the records of its readable leaves (entries that
/// do not decode are left out); the readable old nodes are freed, an unreadable one is
/// left for the next pass to find leaked. Returns (entries the inode claimed, entries kept).
pub(super) fn rebuild_index(st: &mut Tx, d: u64) -> Result<(u64, u64)> {
    let mut i = st.inode_unchecked(d)?;
    let old = i.dir()?.tree;
    let had = i.dir()?.entries;
    let (recs, nodes) = btree::salvage(st, &old, d);
    for b in nodes {
        st.free_meta(b);
    }
    let mut tree = TreeRoot::default();
    let mut kept = 0;
    for (k, v) in recs {
        if decode_dirent(&v).is_ok() {
            btree::insert(st, &mut tree, d, k, &v, false)?;
            kept += 1;
        }
    }
    let blocks = btree::blocks(st, &tree, d)?.len() as u64;
    let di = i.dir_mut()?;
    di.tree = tree;
    di.entries = kept;
    i.size = blocks * BLOCK_SIZE as u64;
    st.put_inode(&i)?;
    Ok((had, kept))
}

/// Write a free-space map rebuilt from `owner` (every block the walk found owned, plus
/// the fixed structures) and a rebuilt state block, in place, then flush.
pub(super) fn rebuild(
    dev: &dyn BlockDevice,
    layout: Layout,
    owner: Option<&HashMap<u64, u64>>,
    state: Option<State>,
) -> Result<()> {
    let mut cache = MetaCache::new(1024);
    if let Some(owner) = owner {
        let mut space = Space::fresh(layout);
        for &b in owner.keys() {
            space.mark_used(b);
        }
        space.write_out(&cache);
    }
    if let Some(state) = state {
        state.encode_into(&mut cache.fresh(STATE_BLOCK));
    }
    for (b, img) in cache.take_dirty() {
        dev.write(b, &img[..])?;
    }
    dev.flush()
}

/// The safe repairs one check found.
pub(super) struct Fixes<'a> {
    pub(super) leaked: &'a [u64],
    pub(super) nlinks: &'a [(u64, u32, u32)],
    pub(super) slots: &'a [(u64, u16, u16)],
    pub(super) lazy_drops: &'a [u64],
    /// Unreadable inode blocks without live inodes, with their region's directory.
    pub(super) reinit: &'a [(u64, u64)],
    /// Blocks something owns that the map marks free.
    pub(super) marked_free: &'a [u64],
    /// Bitmap blocks (by index) whose `used` count disagrees with their bits: written
    /// again, counted from the bits as repaired.
    pub(super) recount: &'a [u64],
    /// Shared xattr blocks whose reference count is wrong: (block, count, users).
    pub(super) xattr_refs: &'a [(u64, u32, u32)],
    pub(super) inode_fixes: &'a [(u64, InodeFix, String)],
    pub(super) inode_count: Option<u64>,
    /// Entries to move to their name's key: (directory, key, name, inode, type).
    pub(super) rekey: &'a [(u64, u64, Vec<u8>, u64, FileType)],
    /// Where to end the orphan list: after an inode, or at the head.
    pub(super) orphan_cut: Option<Option<u64>>,
    /// The rstat tree and files' counting directories, written last.
    pub(super) rstats: Option<&'a super::rstats::RstatCheck>,
    /// Forget the rstat tree (too broken to walk: its blocks go as leaked).
    pub(super) drop_rstats: bool,
}

/// Apply the safe repairs inside one delta of an opened volume.
pub(super) fn repair_volume(dev: Arc<dyn BlockDevice>, f: &Fixes) -> Result<()> {
    // The root may be among the inodes these fixes make readable.
    let vol = Volume::open_for_repair(dev, false)?;
    vol.repair(|st, state| {
        if let Some(n) = f.inode_count {
            state.inodes = n;
        }
        match f.orphan_cut {
            Some(None) => state.orphan_head = 0,
            Some(Some(last)) => st.set_next_orphan(last, 0)?,
            None => {}
        }
        // All out first: an entry moving may need a key another one leaves.
        for (d, key, ..) in f.rekey {
            let mut p = st.inode_unchecked(*d)?;
            dir::remove(st, &mut p, *key)?;
            st.put_inode(&p)?;
        }
        for (d, _, name, ino, ft) in f.rekey {
            let mut p = st.inode_unchecked(*d)?;
            dir::insert(st, &mut p, name, *ino, *ft)?;
            st.put_inode(&p)?;
        }
        for &b in f.leaked {
            st.space().free_deferred(b, 1);
        }
        for &b in f.marked_free {
            st.space().mark_used(b);
        }
        for &i in f.recount {
            st.space().rewrite(i);
        }
        for &(b, _, users) in f.xattr_refs {
            put_u32(st.block_mut(b, Some(XATTR_MAGIC))?, 16, users);
        }
        for &(ino, _, want) in f.nlinks {
            let mut i = st.inode_unchecked(ino)?;
            i.nlink = want;
            st.put_inode(&i)?;
        }
        for &(b, _, want) in f.slots {
            // The block's mask becomes exact, so any lazy-free record for it goes.
            st.drop_lazy_freed(b)?;
            put_u16(st.block_mut(b, Some(INODE_MAGIC))?, IB_USED, want);
        }
        for &b in f.lazy_drops {
            st.drop_lazy_freed(b)?;
        }
        for &(b, owner) in f.reinit {
            st.drop_lazy_freed(b)?;
            st.blank_inode_block(b, owner);
        }
        // Block counts first: the fixes that store anew (an xattr list) count from them.
        let (counts, rest): (Vec<_>, Vec<_>) =
            f.inode_fixes.iter().partition(|(_, fix, _)| matches!(fix, InodeFix::Blocks(_)));
        for (ino, fix, _) in counts.into_iter().chain(rest) {
            // Unchecked: the fixes below are what makes it pass the rules.
            let mut i = st.inode_unchecked(*ino)?;
            match fix {
                InodeFix::Entries(n) => i.dir_mut()?.entries = *n,
                InodeFix::Blocks(n) => i.blocks = *n,
                InodeFix::XattrFilter(m) => i.xattr_filter = *m,
                InodeFix::Parent(p) => i.parent = *p,
                InodeFix::NoRegion => {
                    let d = i.dir_mut()?;
                    (d.region_start, d.region_len, d.region_used) = (0, 0, 0);
                }
                InodeFix::NoQuota => i.dir_mut()?.quota = 0,
                InodeFix::Size(s) => i.size = *s,
                InodeFix::Times => {
                    for t in [&mut i.atime, &mut i.mtime, &mut i.ctime, &mut i.crtime] {
                        *t = normal_time(*t);
                    }
                }
                InodeFix::NoXattrBlock => i.xattr_block = 0,
                InodeFix::Xattrs(kept) => crate::fs::xattr::store(st, &mut i, kept)?,
                // Counts from the walk's (applied above): only tree nodes the removals
                // free change it.
                InodeFix::DropExtents(bad) => file::drop_extent_records(st, &mut i, bad)?,
                InodeFix::CloneShared { extent, shared } => file::clone_shared(st, &mut i, *extent, shared)?,
            }
            st.put_inode(&i)?;
        }
        // The rstat tree's lock is a leaf: no cache block may be held meanwhile.
        st.let_go();
        if f.drop_rstats {
            st.store().drop_rstats();
        }
        if let Some(c) = f.rstats {
            for &(ino, p) in &c.parents {
                let mut i = st.inode_unchecked(ino)?;
                i.parent = p;
                st.put_inode(&i)?;
            }
            st.let_go();
            st.store().rebuild_rstats(&c.records)?;
        }
        Ok(())
    })?;
    vol.sync()
}
