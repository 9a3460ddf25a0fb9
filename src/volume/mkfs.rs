//! Making a volume, and reading its superblock.

use std::sync::Arc;

use crate::disk::codec::*;
use crate::disk::device::BlockDevice;
use crate::disk::format::*;
use crate::disk::hash::HashVersion;
use crate::engine::cache::MetaCache;
use crate::engine::space::Space;
use crate::engine::store::Store;
use crate::error::{Error, Result};

use super::*;

/// Options of `mkfs`.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    pub label: String,
    pub hash: HashVersion,
    /// The 128-bit hash seed; random when `None`.
    pub seed: Option<[u32; 4]>,
    pub uuid: Option<[u8; 16]>,
    /// Inode blocks in a directory's first reserved region.
    pub region_blocks: u16,
    /// Keep a per-inode xattr-name bloom filter.
    pub xattr_filter: bool,
    /// Bits each xattr name sets in the filter, 1..=32.
    pub filter_hashes: u8,
    /// Blocks in each of the two log areas, 64..=65536 (default: 1/64 of the volume,
    /// within that range).
    pub log_blocks: Option<u32>,
    /// Owner (uid, gid) of the root directory (mke2fs's `-E root_owner`).
    pub root_owner: (u32, u32),
    /// Free inode slots lazily, through the lazy-free tree (ro_compat LAZY_INODE_FREE).
    pub lazy_inode_free: bool,
    /// Give the volume a mount mark (ro_compat MOUNT_MARK), so a read-write open from
    /// another host, which the image's lock cannot see, is refused.
    pub mount_mark: bool,
    /// Let small deltas commit with one device flush, their file data logged (incompat
    /// ONE_FLUSH_COMMIT); without it every commit takes two flushes.
    pub one_flush_commit: bool,
    /// Keep recursive statistics on every directory (ro_compat RSTATS), and with them
    /// allow directory quotas (ro_compat DIR_QUOTA).
    pub rstats: bool,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            label: String::new(),
            hash: HashVersion::HalfMd4,
            seed: None,
            uuid: None,
            region_blocks: 4,
            xattr_filter: true,
            filter_hashes: DEFAULT_FILTER_HASHES,
            log_blocks: None,
            root_owner: (0, 0),
            lazy_inode_free: true,
            mount_mark: true,
            one_flush_commit: true,
            rstats: true,
        }
    }
}

/// Make a new volume on `dev`.
pub fn mkfs(dev: Arc<dyn BlockDevice>, o: &MkfsOptions) -> Result<Superblock> {
    if o.label.len() > 32 {
        return Err(Error::Invalid("label longer than 32 bytes".into()));
    }
    if o.region_blocks == 0 || o.region_blocks as u32 > MAX_REGION_BLOCKS {
        return Err(Error::Invalid(format!("region size must be 1..={MAX_REGION_BLOCKS} blocks")));
    }
    if o.xattr_filter && !(1..=MAX_FILTER_HASHES).contains(&o.filter_hashes) {
        return Err(Error::Invalid(format!("xattr filter hashes must be 1..={MAX_FILTER_HASHES}")));
    }
    // A volume another host (or process) holds is not overwritten, even when asked to.
    if let Ok(old) = read_superblock(&*dev) {
        if let Ok(Some(Ok(m))) = mark::inspect(&*dev, &old) {
            if mark::looks_held(&m) {
                return Err(Error::Busy(format!(
                    "the volume on it is in use by {}: unmount it there first",
                    mark::describe(&m)
                )));
            }
        }
    }
    let blocks = dev.block_count();
    let mut layout = Layout::new(blocks, o.log_blocks.unwrap_or_else(|| Layout::default_log_blocks(blocks)))?;
    if o.mount_mark {
        // The block after the root's (which is the first free one).
        layout.mark_block = layout.first_free() + 1;
    }
    let seed = o.seed.unwrap_or_else(|| {
        let u = uuid::Uuid::new_v4();
        crate::disk::hash::parse_seed(&u.to_string()).expect("uuid formats as a seed")
    });
    let uuid = o.uuid.unwrap_or_else(|| *uuid::Uuid::new_v4().as_bytes());
    let mut sb = Superblock {
        version: VERSION,
        compat: COMPAT_DIR_RESERVATION,
        incompat: if o.one_flush_commit { INCOMPAT_ONE_FLUSH_COMMIT } else { 0 },
        ro_compat: if o.xattr_filter { RO_COMPAT_XATTR_FILTER_K } else { 0 }
            | if o.lazy_inode_free { RO_COMPAT_LAZY_INODE_FREE } else { 0 }
            | if o.mount_mark { RO_COMPAT_MOUNT_MARK } else { 0 }
            | if o.rstats { RO_COMPAT_RSTATS | RO_COMPAT_DIR_QUOTA } else { 0 }
            | RO_COMPAT_BITMAP_COUNTS,
        uuid,
        label: o.label.clone(),
        layout,
        root_ino: 0,
        hash: o.hash,
        region_blocks: o.region_blocks,
        hash_seed: seed,
        mkfs_time: now().0,
        filter_hashes: if o.xattr_filter { o.filter_hashes } else { 0 },
        grow_from: 0,
    };
    let mut st = Store::new(dev.clone(), MetaCache::new(1024), Space::fresh(layout), sb.clone(), true);
    let root = st.tx().alloc_root()?;
    sb.root_ino = root;
    st.sb.root_ino = root;
    let t = now();
    let mut ri = Inode::new(root, libc::S_IFDIR | 0o755);
    (ri.uid, ri.gid) = o.root_owner;
    ri.nlink = 2;
    ri.parent = root;
    ri.atime = t;
    ri.mtime = t;
    ri.ctime = t;
    ri.crtime = t;
    st.put_inode(&ri)?;
    if o.rstats {
        st.enable_rstats();
        st.tx().rstat_insert(root, t)?;
    }
    let state = State {
        orphan_head: 0,
        next_generation: 1,
        commit_seq: 0,
        inodes: 1,
        lazy_frees: TreeRoot::default(),
        rstats: st.rstat_tree().unwrap_or_default(),
    };
    state.encode_into(st.tx().fresh_block(STATE_BLOCK));
    // Empty log areas: no commit block is valid.
    let zero = vec![0u8; BLOCK_SIZE];
    dev.write(layout.log_area(0), &zero)?;
    dev.write(layout.log_area(1), &zero)?;
    if o.mount_mark {
        let clean = MountMark { seq: 1, interval_ms: mark::DEFAULT_INTERVAL_MS, ..Default::default() };
        dev.write(layout.mark_block, &clean.encode(layout.mark_block)[..])?;
    }
    for (b, img) in st.take_dirty() {
        dev.write(b, &img[..])?;
    }
    dev.write(SUPERBLOCK, &sb.encode(SUPERBLOCK)[..])?;
    dev.write(layout.backup_superblock(), &sb.encode(layout.backup_superblock())[..])?;
    dev.flush()?;
    Ok(sb)
}

/// Read and check the superblock (falling back to the backup copy).
pub fn read_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    let mut b = [0u8; BLOCK_SIZE];
    if dev.block_count() < 2 {
        return Err(Error::corrupt("device too small to hold a dxfs volume"));
    }
    dev.read(SUPERBLOCK, &mut b)?;
    match Superblock::decode(&b, SUPERBLOCK) {
        Ok(sb) => {
            // A block 0 whose root is plainly no root gives way to a backup whose root
            // is one (a damaged root block proves nothing: fsck recreates the root).
            if root_is_wrong(dev, &sb)? == Some(true) {
                let last = dev.block_count() - 1;
                dev.read(last, &mut b)?;
                if let Ok(backup) = Superblock::decode(&b, last) {
                    if backup.root_ino != sb.root_ino
                        && usable(dev, &backup).is_ok()
                        && root_is_wrong(dev, &backup)? == Some(false)
                    {
                        tracing::warn!(
                            "block 0 names inode {} as the root, which is not the root directory: \
                             using the backup superblock in block {last}",
                            sb.root_ino
                        );
                        return Ok(backup);
                    }
                }
            }
            if let Some(backup) = backup_with_the_right_hash(dev, &sb)? {
                tracing::warn!(
                    "block 0's directory hash differs from the backup superblock's, which is the one that \
                     places the root directory's entries at their keys: using the backup in block {}",
                    sb.layout.backup_superblock()
                );
                return Ok(backup);
            }
            if let Some(backup) = backup_with_its_mount_mark(dev, &sb)? {
                tracing::warn!(
                    "block 0 lacks the MOUNT_MARK feature, which the backup superblock has, and the mark is in \
                     block {}: using the backup in block {}",
                    backup.layout.mark_block,
                    sb.layout.backup_superblock()
                );
                return Ok(backup);
            }
            if let Some(counted) = count_from_last_copy(dev, &sb)? {
                tracing::warn!(
                    "block 0 says the volume has {} blocks, but no copy lies in its last block and the device's \
                     last block holds one of this volume: using {} blocks, the count that copy's place gives",
                    sb.layout.block_count,
                    counted.layout.block_count
                );
                return Ok(counted);
            }
            Ok(sb)
        }
        Err(e) => {
            let last = dev.block_count() - 1;
            dev.read(last, &mut b)?;
            Superblock::decode(&b, last).map_err(|backup| match (&e, backup) {
                // Not a dxfs volume at all: say that, not two errors.
                (Error::Corrupt(m), Error::Corrupt(_)) if m.contains("no superblock magic") => e,
                (_, backup) => Error::corrupt(format!(
                    "no usable superblock copy: block 0: {}; the backup in block {last}: {}",
                    strip(&e),
                    strip(&backup)
                )),
            })
        }
    }
}

/// A superblock whose block count is smaller than the device's, with no superblock in the
/// volume's last block (where its backup belongs), while the device's last block holds a
/// copy of this volume (same uuid): backups are only written in a volume's last block, so
/// when that copy was written the volume had the device's count. Returns that copy with
/// the count its place gives (the count field of both copies may be the damage), if that
/// superblock is valid. `None` in every other case, a smaller volume on a larger device
/// among them.
fn count_from_last_copy(dev: &dyn BlockDevice, sb: &Superblock) -> Result<Option<Superblock>> {
    let (n, d) = (sb.layout.block_count, dev.block_count());
    if n >= d || n == 0 {
        return Ok(None);
    }
    let mut b = [0u8; BLOCK_SIZE];
    dev.read(n - 1, &mut b)?;
    if Superblock::decode(&b, n - 1).is_ok_and(|c| c.uuid == sb.uuid) {
        return Ok(None);
    }
    dev.read(d - 1, &mut b)?;
    let Ok(last) = Superblock::decode(&b, d - 1) else { return Ok(None) };
    if last.uuid != sb.uuid {
        return Ok(None);
    }
    let counted = Superblock { layout: Layout { block_count: d, ..last.layout }, ..last };
    // The rules a decoded superblock keeps (the layout fits the new count), and a root.
    let valid = Superblock::decode(&counted.encode(SUPERBLOCK), SUPERBLOCK).is_ok_and(|c| c == counted)
        && usable(dev, &counted).is_ok()
        && root_is_wrong(dev, &counted)? != Some(true);
    Ok(valid.then_some(counted))
}

/// Whether the root inode `sb` names is plainly not a root: its block is sealed for its
/// place but of another kind, or, in an intact inode block, a free slot or an inode that
/// is not a directory that is its own parent, or its block does not verify and an intact
/// bitmap marks it free. `None` when its block does not verify otherwise (nothing can be
/// told).
pub(crate) fn root_is_wrong(dev: &dyn BlockDevice, sb: &Superblock) -> Result<Option<bool>> {
    let (rb, slot) = ino_loc(sb.root_ino);
    if rb >= dev.block_count() {
        return Ok(None);
    }
    let mut b = [0u8; BLOCK_SIZE];
    dev.read(rb, &mut b)?;
    if verify(&b, rb, None).is_err() {
        // An unreadable block proves nothing, unless an intact bitmap marks it free: the
        // root's block is marked used from mkfs on and never freed (fuzzer seed
        // 4026532023: both copies name a slot in a free block).
        return Ok(marked_free(dev, &sb.layout, rb)?.then_some(true));
    }
    // Sealed for its place, but another kind of block: no inode lives there.
    if get_u32(&b, 0) != INODE_MAGIC {
        return Ok(Some(true));
    }
    let at = slot * INODE_SIZE;
    Ok(Some(match Inode::decode(sb.root_ino, &b[at..at + INODE_SIZE]) {
        Ok(Some(i)) => i.file_type() != Some(FileType::Directory) || i.parent != sb.root_ino,
        Ok(None) => true,
        Err(_) => false,
    }))
}

/// The backup superblock, when it differs from block 0 in the directory hash (version or
/// seed: no rule checks them alone) and its hash places more of the root directory's
/// first entries at their keys (FORMAT §11) than block 0's does. Such a block 0 would
/// fail every lookup; fsck then writes the backup over it. `None` otherwise.
fn backup_with_the_right_hash(dev: &dyn BlockDevice, sb: &Superblock) -> Result<Option<Superblock>> {
    let at = sb.layout.backup_superblock();
    if at >= dev.block_count() {
        return Ok(None);
    }
    let mut b = [0u8; BLOCK_SIZE];
    dev.read(at, &mut b)?;
    let Ok(backup) = Superblock::decode(&b, at) else { return Ok(None) };
    // A copy this code cannot open is no way out (fuzzer seed 2684791178: its unknown
    // incompat bit made the hash's fallback refuse a volume block 0 opens).
    if usable(dev, &backup).is_err()
        || backup.uuid != sb.uuid
        || backup.root_ino != sb.root_ino
        || (backup.hash, backup.hash_seed) == (sb.hash, sb.hash_seed)
    {
        return Ok(None);
    }
    let ours = placed_entries(dev, sb, sb.hash, sb.hash_seed)?;
    let theirs = placed_entries(dev, sb, backup.hash, backup.hash_seed)?;
    Ok((theirs > ours).then_some(backup))
}

/// The backup superblock, when it differs from block 0 only in having MOUNT_MARK (and so
/// a mark block), and that block holds a mount mark sealed for its place: block 0 lost
/// the bit, and a volume trusting it would take the mark for a free block (fsck would
/// free it, and the next allocation write over it). `None` otherwise.
fn backup_with_its_mount_mark(dev: &dyn BlockDevice, sb: &Superblock) -> Result<Option<Superblock>> {
    let at = sb.layout.backup_superblock();
    if sb.mount_mark() || at >= dev.block_count() {
        return Ok(None);
    }
    let mut b = [0u8; BLOCK_SIZE];
    dev.read(at, &mut b)?;
    let Ok(backup) = Superblock::decode(&b, at) else { return Ok(None) };
    let m = backup.layout.mark_block;
    let same_but_the_mark = Superblock {
        ro_compat: sb.ro_compat | RO_COMPAT_MOUNT_MARK,
        layout: Layout { mark_block: m, ..sb.layout },
        ..sb.clone()
    };
    if !backup.mount_mark() || backup != same_but_the_mark || m >= dev.block_count() || usable(dev, &backup).is_err() {
        return Ok(None);
    }
    dev.read(m, &mut b)?;
    Ok(MountMark::decode(&b, m).is_ok().then_some(backup))
}

/// Of the root directory's first entries (up to 16), how many lie in their name's probe
/// range `[h, h + max_disp]` under `hash` and `seed`; 0 when the root cannot be read.
fn placed_entries(dev: &dyn BlockDevice, sb: &Superblock, hash: HashVersion, seed: [u32; 4]) -> Result<usize> {
    let (rb, slot) = ino_loc(sb.root_ino);
    if rb >= dev.block_count() {
        return Ok(0);
    }
    let mut b = [0u8; BLOCK_SIZE];
    dev.read(rb, &mut b)?;
    if verify(&b, rb, Some(INODE_MAGIC)).is_err() {
        return Ok(0);
    }
    let at = slot * INODE_SIZE;
    let Ok(Some(Inode { data: InodeData::Dir(d), .. })) = Inode::decode(sb.root_ino, &b[at..at + INODE_SIZE]) else {
        return Ok(0);
    };
    let mut nodes = RawNodes { dev, layout: sb.layout, block: Box::new([0u8; BLOCK_SIZE]) };
    let (mut seen, mut placed) = (0, 0);
    let _ = crate::engine::btree::scan(&mut nodes, &d.tree, sb.root_ino, 0, |key, v| {
        if let Some(name) = v.get(9..) {
            let h = crate::disk::hash::name_base_key(hash, seed, name);
            placed += usize::from(key.checked_sub(h).is_some_and(|disp| disp <= u64::from(d.max_disp)));
        }
        seen += 1;
        seen < 16
    });
    Ok(placed)
}

/// B+tree nodes read straight from the device, each checked against its seal.
struct RawNodes<'a> {
    dev: &'a dyn BlockDevice,
    layout: Layout,
    block: Box<Block>,
}

impl crate::engine::btree::NodeRead for RawNodes<'_> {
    fn node(&mut self, block: u64) -> Result<&Block> {
        if !self.layout.meta_block_ok(block) || block >= self.dev.block_count() {
            return Err(Error::corrupt(format!("tree node {block} out of range")));
        }
        self.dev.read(block, &mut self.block[..])?;
        verify(&self.block, block, Some(crate::engine::btree::BTREE_MAGIC))?;
        Ok(&self.block)
    }
}

/// Whether the bitmap block covering `b` is intact (sealed for its place) and marks `b`
/// free. A bitmap block that does not verify marks nothing.
fn marked_free(dev: &dyn BlockDevice, layout: &Layout, b: u64) -> Result<bool> {
    let i = b / BITS_PER_BITMAP_BLOCK;
    let at = layout.bitmap_block(i);
    if i >= layout.bitmap_count() || at >= dev.block_count() {
        return Ok(false);
    }
    let mut m = [0u8; BLOCK_SIZE];
    dev.read(at, &mut m)?;
    if verify(&m, at, Some(BITMAP_MAGIC)).is_err() {
        return Ok(false);
    }
    let j = b % BITS_PER_BITMAP_BLOCK;
    Ok(m[BITMAP_HEADER + (j / 8) as usize] & (1 << (j % 8)) == 0)
}

/// An error's message without the "corrupt volume: " its display adds.
fn strip(e: &Error) -> String {
    match e {
        Error::Corrupt(m) => m.clone(),
        e => e.to_string(),
    }
}

/// The superblock of a volume this code may open: it fits the device and has no unknown
/// incompatible feature. A block 0 that decodes but fails these gives way to a backup in
/// the device's last block that passes them: the two copies must be equal (FORMAT §3),
/// so the one that differs is the damaged one (fsck then rewrites block 0).
pub(crate) fn read_usable_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    let sb = read_superblock(dev)?;
    let Err(e) = usable(dev, &sb) else { return Ok(sb) };
    let last = dev.block_count() - 1;
    let mut b = [0u8; BLOCK_SIZE];
    dev.read(last, &mut b)?;
    match Superblock::decode(&b, last) {
        Ok(backup) if backup != sb && usable(dev, &backup).is_ok() => {
            tracing::warn!("block 0 cannot be used ({}): using the backup superblock in block {last}", strip(&e));
            Ok(backup)
        }
        _ => Err(e),
    }
}

/// Whether this code may open a volume with superblock `sb` on `dev`.
fn usable(dev: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
    if sb.layout.block_count > dev.block_count() {
        return Err(Error::corrupt(format!(
            "volume has {} blocks but the device only {} (truncated image?)",
            sb.layout.block_count,
            dev.block_count()
        )));
    }
    if sb.incompat & !KNOWN_INCOMPAT != 0 {
        return Err(Error::corrupt(format!("unknown incompatible features {:#x}", sb.incompat)));
    }
    Ok(())
}
