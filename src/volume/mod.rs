//! The volume: the public, thread-safe API by inode number, and the delta machinery
//! that ties the layers together (charging costs, write-back, commit, recovery).
//!
//! Every change happens inside the current delta; `sync` (and `fsync`) commit it and
//! make it durable. A delta also commits by itself when its metadata nears half the log
//! or its dirty data passes the dirty limit, and when the space budget runs short.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, MutexGuard};

use crate::disk::codec::Block;
use crate::disk::codec::*;
use crate::disk::device::{BlockDevice, IoStats};
use crate::disk::format::*;
use crate::disk::hash::HashVersion;
use crate::engine::btree;
use crate::engine::cache::MetaCache;
use crate::engine::log::Journal;
use crate::engine::space::Space;
use crate::engine::store::Store;
use crate::error::{Error, Result};
use crate::fs::acl;
use crate::fs::dir::{self, DirEntry};
use crate::fs::file::{self, Pages};
use crate::fs::xattr;

/// Most hard links to one inode (and subdirectories of one directory).
pub const LINK_MAX: u32 = 65_000;
/// Longest symlink target.
pub const SYMLINK_MAX: usize = 4095;
/// Largest piece of a write charged at once (bytes).
const WRITE_CHUNK: usize = 4 << 20;
/// Largest piece of a preallocation charged at once (blocks).
const FALLOC_STEP: u64 = 32_768;
/// Directory readahead: leaves and entries read ahead of a sequential readdirplus.
const READAHEAD_LEAVES: usize = 16;
const READAHEAD_ENTRIES: usize = 2048;
/// At most this many blocks (32 MiB) per readahead of inode windows: the memory bound.
const READAHEAD_INODE_BLOCKS: usize = 8192;
/// Log blocks kept free for one write-back fragment: two bitmap blocks, an extent-tree
/// removal and insert (each a split per level of a tree of depth up to 6), the inode and
/// state blocks.
const WRITEBACK_HEADROOM: usize = 2 + 2 * 8 + 2;
/// Log blocks kept free for any single front-end operation (rename: two index inserts with
/// splits at every level, four inode blocks, bitmap and state blocks).
const OP_LOG_BLOCKS: u64 = 32;

/// A time: seconds and nanoseconds since the epoch.
pub type Time = (i64, u32);

/// The current time.
pub fn now() -> Time {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos())
}

/// Attributes of an inode, as stat reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// 512-byte units, as st_blocks.
    pub blocks: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub crtime: Time,
    pub kind: FileType,
    /// Full mode, type bits included.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub generation: u32,
}

/// A time to set: a given time or "now".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(Time),
}

/// Changes for `setattr`; `None` leaves a field alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (the file type is kept).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<Time>,
}

/// What `Volume::make` creates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NewNode {
    /// File type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Device number of a device node.
    pub rdev: u64,
    /// The creator's umask, applied unless a default ACL is inherited.
    pub umask: u32,
}

/// Flags of `rename`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with `Exists` if the target exists (RENAME_NOREPLACE).
    pub noreplace: bool,
    /// Swap the two entries, both of which must exist (RENAME_EXCHANGE).
    pub exchange: bool,
}

/// `setxattr` modes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrMode {
    /// Create or replace.
    #[default]
    Any,
    /// Fail with `Exists` if present (XATTR_CREATE).
    Create,
    /// Fail with `NoData` if absent (XATTR_REPLACE).
    Replace,
}

/// Volume-wide numbers, as statfs reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    /// What can really still be written (the budget, less the reserve).
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}

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
    /// Blocks in each of the two log areas (default: 1/64 of the volume, 64..=8192).
    pub log_blocks: Option<u32>,
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
        }
    }
}

/// Options of `Volume::open`.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub read_only: bool,
    /// Clean metadata blocks kept in memory.
    pub cache_blocks: usize,
    /// Dirty data pages (4 KiB) held before the delta commits by itself.
    pub dirty_limit: u64,
    /// Place children in their directory's reserved inode region (A/B switch).
    pub reserve_regions: bool,
    /// Answer getxattr from the bloom filter when it rules the name out (A/B switch).
    pub use_xattr_filter: bool,
    /// readdirplus reads a batch's inode blocks in one sorted sweep, and reads ahead
    /// the next leaves and their inodes of a directory read in order (A/B switch).
    pub sorted_prefetch: bool,
    /// Check each operation's worst-case cost against free space before accepting it
    /// (A/B switch, for measuring what the check costs: without it a full volume fails
    /// in the commit instead of with ENOSPC up front, so keep it on for real use).
    pub space_accounting: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read_only: false,
            cache_blocks: 262_144,
            dirty_limit: 32_768,
            reserve_regions: true,
            use_xattr_filter: true,
            sorted_prefetch: true,
            space_accounting: true,
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
    let blocks = dev.block_count();
    let layout = Layout::new(blocks, o.log_blocks.unwrap_or_else(|| Layout::default_log_blocks(blocks)))?;
    let seed = o.seed.unwrap_or_else(|| {
        let u = uuid::Uuid::new_v4();
        crate::disk::hash::parse_seed(&u.to_string()).expect("uuid formats as a seed")
    });
    let uuid = o.uuid.unwrap_or_else(|| *uuid::Uuid::new_v4().as_bytes());
    let mut sb = Superblock {
        version: VERSION,
        compat: COMPAT_DIR_RESERVATION,
        incompat: 0,
        ro_compat: if o.xattr_filter { RO_COMPAT_XATTR_FILTER_K } else { 0 },
        uuid,
        label: o.label.clone(),
        layout,
        root_ino: 0,
        hash: o.hash,
        region_blocks: o.region_blocks,
        hash_seed: seed,
        mkfs_time: now().0,
        filter_hashes: if o.xattr_filter { o.filter_hashes } else { 0 },
    };
    let mut st = Store::new(dev.clone(), MetaCache::new(1024), Space::fresh(layout), sb.clone(), true);
    let root = st.alloc_root()?;
    sb.root_ino = root;
    st.sb.root_ino = root;
    let t = now();
    let mut ri = Inode::new(root, libc::S_IFDIR | 0o755);
    ri.nlink = 2;
    ri.parent = root;
    ri.atime = t;
    ri.mtime = t;
    ri.ctime = t;
    ri.crtime = t;
    st.put_inode(&ri)?;
    let state = State { orphan_head: 0, next_generation: 1, commit_seq: 0, inodes: 1 };
    state.encode_into(st.cache.fresh(STATE_BLOCK));
    st.space.write_out(&*dev, &mut st.cache)?;
    // Empty log areas: no commit block is valid.
    let zero = vec![0u8; BLOCK_SIZE];
    dev.write(layout.log_area(0), &zero)?;
    dev.write(layout.log_area(1), &zero)?;
    for (b, img) in st.cache.take_dirty() {
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
        Ok(sb) => Ok(sb),
        Err(e) => {
            let last = dev.block_count() - 1;
            dev.read(last, &mut b)?;
            Superblock::decode(&b, last).map_err(|_| e)
        }
    }
}

/// The superblock of a volume this code may open: it fits the device and has no unknown
/// incompatible feature.
pub fn read_usable_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    let sb = read_superblock(dev)?;
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
    Ok(sb)
}

struct Inner {
    st: Store,
    /// Blocks one delta may log (the journal's capacity).
    log_capacity: u64,
    /// Sequence number of the last delta handed to the journal.
    seq: u64,
    state: State,
    dirty: HashMap<u64, Pages>,
    dirty_pages: u64,
    open: HashMap<u64, u32>,
    opts: OpenOptions,
    /// Set when a commit failed half way: memory no longer matches any disk state.
    failed: bool,
    /// Per directory, the readdir position up to which readahead was issued.
    readahead: HashMap<u64, u64>,
    /// Counts the events that may rewrite a block on the device (write-backs and commit
    /// snapshots, each counted before its writes): a read planned under the lock and done
    /// without it is redone if this changed meanwhile.
    epoch: u64,
}

/// A mounted volume. All methods take `&self` and may be called from many threads.
///
/// Lock order: `journal`, then `inner`. Front-end operations take only `inner`; a commit
/// takes `journal` for its whole length and `inner` only to snapshot the delta and to
/// finish, so the front end goes on with the next delta while the log is written.
pub struct Volume {
    inner: Mutex<Inner>,
    journal: Mutex<Journal>,
    read_only: bool,
}

/// A delta on its way to the device: its metadata blocks and the frees held back until
/// it is durable.
struct Flight {
    blocks: Vec<(u64, Box<Block>)>,
    held: Vec<(u64, u64)>,
}

/// What an operation may need, charged before it changes anything.
#[derive(Clone, Copy, Debug)]
struct Cost {
    /// Worst-case new metadata blocks.
    meta: u64,
    /// New data pages (delayed allocation: blocks promised until write-back).
    pages: u64,
    /// Deletions may use the reserve.
    deletion: bool,
}

impl Cost {
    fn new(meta: u64, pages: u64, deletion: bool) -> Cost {
        Cost { meta, pages, deletion }
    }
}

/// Why a charge does not fit in the current delta.
#[derive(PartialEq, Eq)]
enum Short {
    /// The log or the dirty-data limit is near: commit, then it fits.
    Delta,
    /// Not enough space, perhaps until the delta's frees are released.
    Space,
}

/// Depth of a file's extent tree (0 while the map is inline).
fn extent_depth(i: &Inode) -> u64 {
    match i.data {
        InodeData::ExtentTree { tree, .. } => tree.depth as u64,
        _ => 0,
    }
}

fn type_of(mode: u32) -> Result<FileType> {
    FileType::from_mode(mode).ok_or_else(|| Error::Invalid(format!("bad file mode {mode:o}")))
}

impl Inner {
    fn check_writable(&self) -> Result<()> {
        if self.failed {
            return Err(Error::Io(std::io::Error::other("volume failed; remount to recover")));
        }
        if self.opts.read_only {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    fn attr(&self, i: &Inode) -> Result<Attr> {
        let pending = self.dirty.get(&i.ino).map_or(0, |p| p.len() as u64);
        Ok(Attr {
            ino: i.ino,
            size: i.size,
            blocks: (i.blocks + pending) * 8,
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            crtime: i.crtime,
            kind: type_of(i.mode)?,
            mode: i.mode,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev,
            generation: i.generation,
        })
    }

    fn dir_inode(&mut self, ino: u64) -> Result<Inode> {
        let i = self.st.inode(ino)?;
        if !i.is_dir() {
            return Err(Error::NotDir);
        }
        Ok(i)
    }

    /// Directory readahead (seed 004's dirreadahead): from position `next`, read the next
    /// leaves of the index in one sorted sweep, then the inode blocks of their entries in
    /// another; at most `READAHEAD_ENTRIES` entries ahead, and only once per window.
    fn read_ahead(&mut self, d: &Inode, next: u64) -> Result<()> {
        // Keys (positions) say nothing about counts, so the window remembers the key of
        // its middle entry: the next readahead starts when the reader gets there.
        if self.readahead.get(&d.ino).is_some_and(|&mid| next < mid) {
            return Ok(());
        }
        let t = d.dir()?.tree;
        let leaves = btree::leaves_from(&mut self.st, &t, d.ino, next.saturating_sub(2), READAHEAD_LEAVES)?;
        let dev = self.st.dev.clone();
        self.st.cache.prefetch(&*dev, &leaves)?;
        let mut inode_blocks = Vec::new();
        let mut mid = u64::MAX;
        dir::read(&mut self.st, d, next, |e| {
            inode_blocks.push(ino_loc(e.ino).0);
            if inode_blocks.len() == READAHEAD_ENTRIES / 2 {
                mid = e.next;
            }
            inode_blocks.len() < READAHEAD_ENTRIES
        })?;
        self.st.prefetch_inodes(&inode_blocks, READAHEAD_INODE_BLOCKS)?;
        if self.readahead.len() > 1024 {
            self.readahead.clear();
        }
        self.readahead.insert(d.ino, mid);
        Ok(())
    }

    /// Whether a change of cost `c` fits in the current delta: room in the log for any
    /// one operation, the dirty-data limit, and the space budget.
    fn fits(&self, c: Cost) -> std::result::Result<(), Short> {
        let used = (self.st.cache.dirty_count() + self.st.space.pending_bitmap_blocks()) as u64;
        if used + OP_LOG_BLOCKS > self.log_capacity
            || (self.dirty_pages > 0 && self.dirty_pages + c.pages > self.opts.dirty_limit)
        {
            return Err(Short::Delta);
        }
        if self.opts.space_accounting && self.st.space.available(c.deletion) < c.meta + c.pages {
            return Err(Short::Space);
        }
        Ok(())
    }

    /// Worst-case new blocks of one directory-index insert: a split at every level plus
    /// a new root.
    fn dir_cost(d: &Inode) -> u64 {
        d.dir().map_or(2, |d| d.tree.depth as u64 + 2)
    }

    /// Blocks charged to take an inode slot: one inode block (a new region is sized to
    /// what the budget allows, and is at least that one block).
    fn inode_cost(&self) -> u64 {
        1
    }

    /// Metadata the write-back of a file's dirty pages may need, growing from `before` to
    /// `after` pages: the first page of a file in a delta charges an extent-map change (a
    /// removal and an insert, each splitting at most every level, plus the inline-to-tree
    /// move), and every 64 pages one more block (at least 64 extent records fit in the
    /// half-full leaf a split leaves).
    fn writeback_meta(before: u64, after: u64, depth: u64) -> u64 {
        let first = if before == 0 && after > 0 { 2 * depth + 4 } else { 0 };
        first + after.div_ceil(64) - before.div_ceil(64)
    }

    /// Add `n` new dirty pages of inode `i` to the delta's promises.
    fn promise_pages(&mut self, i: &Inode, before: u64, n: u64) {
        self.dirty_pages += n;
        self.st.space.promised += n;
        self.st.space.promised_meta += Self::writeback_meta(before, before + n, extent_depth(i));
    }

    /// The cost of creating an entry in `parent`.
    fn create_cost(&mut self, parent: u64) -> Result<Cost> {
        let p = self.dir_inode(parent)?;
        Ok(Cost::new(Self::dir_cost(&p) + self.inode_cost(), 0, false))
    }

    /// Write back all dirty data and snapshot the delta for the journal. When the log
    /// fills during write-back, the delta so far is committed synchronously (it is a
    /// consistent state) and write-back goes on in a new one. Returns None when there is
    /// nothing to commit.
    fn prepare_commit(&mut self, journal: &mut Journal) -> Result<Option<Flight>> {
        let mut inos: Vec<u64> = self.dirty.keys().copied().collect();
        inos.sort_unstable();
        if !inos.is_empty() {
            self.epoch += 1;
        }
        let limit = (self.log_capacity as usize).saturating_sub(WRITEBACK_HEADROOM);
        for ino in inos {
            let mut pages = self.dirty.remove(&ino).unwrap_or_default();
            let mut inode = self.st.inode(ino)?;
            loop {
                let n = file::writeback(&mut self.st, &mut inode, &mut pages, limit)?;
                self.st.put_inode(&inode)?;
                self.dirty_pages -= n;
                self.st.space.promised = self.st.space.promised.saturating_sub(n);
                if pages.is_empty() {
                    break;
                }
                self.st.space.release_deferred();
                self.st.freed_meta.clear();
                let blocks = self.snapshot();
                journal.commit(&*self.st.dev, &blocks)?;
                self.st.cache.landed(&blocks);
            }
        }
        self.st.space.promised = 0;
        self.st.space.promised_meta = 0;
        if self.st.cache.dirty_count() == 0 && self.st.space.pending_bitmap_blocks() == 0 {
            return Ok(None);
        }
        let held = self.st.space.begin_hold();
        self.st.freed_in_flight = std::mem::take(&mut self.st.freed_meta);
        let blocks = self.snapshot();
        self.st.space.keep_held(&held);
        Ok(Some(Flight { blocks, held }))
    }

    /// Seal the delta's metadata (bitmap and state block included) for the journal.
    fn snapshot(&mut self) -> Vec<(u64, Box<Block>)> {
        self.epoch += 1;
        self.seq += 1;
        self.state.commit_seq = self.seq;
        let st = self.state;
        st.encode_into(self.st.cache.fresh(STATE_BLOCK));
        let dev = self.st.dev.clone();
        // write_out cannot fail: it only copies words into cached blocks.
        let _ = self.st.space.write_out(&*dev, &mut self.st.cache);
        self.st.cache.take_dirty()
    }

    /// A flight is durable and home: release what it held.
    fn finish_commit(&mut self, f: &Flight) {
        self.st.space.end_hold(&f.held);
        self.st.freed_in_flight.clear();
        self.st.cache.landed(&f.blocks);
    }

    fn new_inode(&mut self, parent: &mut Inode, mode: u32, uid: u32, gid: u32, rdev: u64) -> Result<Inode> {
        let ino = self.st.alloc_inode(parent)?;
        let t = now();
        let mut i = Inode::new(ino, mode);
        i.uid = uid;
        i.gid = gid;
        i.nlink = 1;
        i.rdev = rdev;
        i.atime = t;
        i.mtime = t;
        i.ctime = t;
        i.crtime = t;
        i.generation = self.state.next_generation;
        self.state.next_generation = self.state.next_generation.wrapping_add(1);
        self.state.inodes += 1;
        Ok(i)
    }

    /// Common part of every create: check, charge, allocate, link in.
    fn create_node(
        &mut self,
        parent: u64,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
    ) -> Result<(Inode, Inode)> {
        dir::check_name(name)?;
        let ft = type_of(mode)?;
        let mut p = self.dir_inode(parent)?;
        if p.nlink == 0 {
            return Err(Error::NotFound);
        }
        if ft == FileType::Directory && p.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        // The inode number is needed for the entry, but the name may exist: take the
        // number, and give it back if the insert refuses.
        let saved = p;
        let mut i = self.new_inode(&mut p, mode, uid, gid, rdev)?;
        if let Err(e) = dir::insert(&mut self.st, &mut p, name, i.ino, ft) {
            if saved != p {
                // The allocation moved the region: record that before the slot is given
                // back, so the slot's block is known to be in the current region.
                self.st.put_inode(&p)?;
            }
            self.st.free_inode(i.ino)?;
            self.state.inodes -= 1;
            return Err(e);
        }
        if ft == FileType::Directory {
            i.nlink = 2;
            i.parent = parent;
            p.nlink += 1;
        }
        let t = now();
        p.mtime = t;
        p.ctime = t;
        self.st.put_inode(&p)?;
        self.st.put_inode(&i)?;
        Ok((p, i))
    }

    /// The default ACL of a directory, if it has one (the xattr filter usually answers
    /// without reading anything).
    fn default_acl(&mut self, dir: &Inode) -> Result<Option<Vec<acl::Entry>>> {
        if self.st.sb.xattr_filter() && xattr::ruled_out(dir, 3, b"", self.st.sb.filter_hashes()) {
            return Ok(None);
        }
        match xattr::load(&mut self.st, dir)?.into_iter().find(|x| x.idx == 3) {
            Some(x) => Ok(Some(
                acl::decode(&x.value).map_err(|_| Error::corrupt(format!("directory {}: bad default ACL", dir.ino)))?,
            )),
            None => Ok(None),
        }
    }

    /// The mode a new child of `parent` gets, and the ACL xattrs it inherits: with a
    /// default ACL in the parent, POSIX's inheritance rules (the umask does not apply);
    /// otherwise the umask.
    fn inherited(&mut self, parent: u64, mode: u32, umask: u32) -> Result<(u32, Vec<xattr::Xattr>)> {
        let p = self.dir_inode(parent)?;
        let Some(def) = self.default_acl(&p)? else {
            return Ok((mode & !(umask & 0o777), Vec::new()));
        };
        let (mode, access) = acl::inherit(&def, mode);
        let mut list = Vec::new();
        if let Some(a) = access {
            list.push(xattr::Xattr { idx: 2, name: Vec::new(), value: acl::encode(&a) });
        }
        if mode & libc::S_IFMT == libc::S_IFDIR {
            list.push(xattr::Xattr { idx: 3, name: Vec::new(), value: acl::encode(&def) });
        }
        Ok((mode, list))
    }

    /// Keep an inode's access ACL in step with a new mode (chmod).
    fn chmod_acl(&mut self, i: &mut Inode) -> Result<()> {
        if self.st.sb.xattr_filter() && xattr::ruled_out(i, 2, b"", self.st.sb.filter_hashes()) {
            return Ok(());
        }
        let mut list = xattr::load(&mut self.st, i)?;
        let Some(x) = list.iter_mut().find(|x| x.idx == 2) else { return Ok(()) };
        let mut a = acl::decode(&x.value).map_err(|_| Error::corrupt(format!("inode {}: bad ACL", i.ino)))?;
        acl::chmod(&mut a, i.mode);
        x.value = acl::encode(&a);
        xattr::store(&mut self.st, i, &list)
    }

    /// Drop one link of `i`; free it when no link and no open handle remain.
    fn drop_link(&mut self, mut i: Inode) -> Result<()> {
        i.nlink = i.nlink.saturating_sub(if i.is_dir() { 2 } else { 1 });
        i.ctime = now();
        if i.nlink > 0 {
            return self.st.put_inode(&i);
        }
        if self.open.get(&i.ino).copied().unwrap_or(0) > 0 {
            // Unlinked but open: keep it on the orphan list until the last release.
            i.next_orphan = self.state.orphan_head;
            self.state.orphan_head = i.ino;
            return self.st.put_inode(&i);
        }
        self.free_inode(i)
    }

    fn free_inode(&mut self, mut i: Inode) -> Result<()> {
        if let Some(p) = self.dirty.remove(&i.ino) {
            self.dirty_pages -= p.len() as u64;
            self.st.space.promised = self.st.space.promised.saturating_sub(p.len() as u64);
        }
        match i.data {
            InodeData::Dir(d) => {
                dir::destroy(&mut self.st, &mut i)?;
                self.st.release_region(&d)?;
            }
            InodeData::InlineSymlink(_) => {}
            _ => file::free_all(&mut self.st, &mut i)?,
        }
        xattr::release(&mut self.st, &mut i)?;
        self.st.free_inode(i.ino)?;
        self.state.inodes = self.state.inodes.saturating_sub(1);
        Ok(())
    }

    fn remove_orphan(&mut self, ino: u64) -> Result<()> {
        let target = self.st.inode(ino)?;
        if self.state.orphan_head == ino {
            self.state.orphan_head = target.next_orphan;
        } else {
            let mut cur = self.state.orphan_head;
            let mut guard = 0u64;
            while cur != 0 {
                let mut c = self.st.inode(cur)?;
                if c.next_orphan == ino {
                    c.next_orphan = target.next_orphan;
                    self.st.put_inode(&c)?;
                    break;
                }
                cur = c.next_orphan;
                guard += 1;
                if guard > self.state.inodes + 1 {
                    return Err(Error::corrupt("orphan list loops"));
                }
            }
        }
        self.free_inode(target)
    }

    fn truncate(&mut self, i: &mut Inode, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        if size < i.size {
            let bs = BLOCK_SIZE as u64;
            let keep = size.div_ceil(bs);
            if let Some(pages) = self.dirty.get_mut(&i.ino) {
                let dropped = pages.split_off(&keep);
                self.dirty_pages -= dropped.len() as u64;
                self.st.space.promised = self.st.space.promised.saturating_sub(dropped.len() as u64);
            }
            if size % bs != 0 {
                let p = size / bs;
                let tail = (size % bs) as usize;
                let has_dirty = self.dirty.get(&i.ino).is_some_and(|m| m.contains_key(&p));
                if !has_dirty {
                    let page = file::read_page(&mut self.st, i, p)?;
                    let before = self.dirty.get(&i.ino).map_or(0, |m| m.len() as u64);
                    self.dirty.entry(i.ino).or_default().insert(p, page);
                    self.promise_pages(i, before, 1);
                }
                let page = self.dirty.get_mut(&i.ino).unwrap().get_mut(&p).unwrap();
                page[tail..].fill(0);
            }
            file::punch(&mut self.st, i, keep, 1 << 32)?;
        }
        i.size = size;
        Ok(())
    }

    /// The cost of writing `len` bytes at `offset`: one block per page not yet dirty, and
    /// the extent-map changes of its write-back.
    fn write_cost(&mut self, ino: u64, offset: u64, len: u64) -> Result<Cost> {
        let end = offset.checked_add(len).ok_or(Error::FileTooBig)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        let i = self.st.inode(ino)?;
        if len == 0 {
            return Ok(Cost::new(0, 0, false));
        }
        let bs = BLOCK_SIZE as u64;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let have = self.dirty.get(&ino).map_or(0, |m| m.range(first..=last).count() as u64);
        let before = self.dirty.get(&ino).map_or(0, |m| m.len() as u64);
        let new = (last - first + 1) - have;
        Ok(Cost::new(Self::writeback_meta(before, before + new, extent_depth(&i)), new, false))
    }

    /// Write into dirty pages (charged by the caller).
    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<usize> {
        let end = offset.checked_add(data.len() as u64).ok_or(Error::FileTooBig)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        let mut i = self.st.inode(ino)?;
        // Regular files, and long symlink targets (written once at creation).
        match i.file_type() {
            Some(FileType::RegularFile) | Some(FileType::Symlink) => {}
            Some(FileType::Directory) => return Err(Error::IsDir),
            _ => return Err(Error::Invalid("write to a special file".into())),
        }
        if data.is_empty() {
            return Ok(0);
        }
        let bs = BLOCK_SIZE as u64;
        let (first, last) = (offset / bs, (end - 1) / bs);
        for p in first..=last {
            let ps = p * bs;
            let from = offset.max(ps);
            let to = end.min(ps + bs);
            let full = from == ps && to == ps + bs;
            if !self.dirty.get(&ino).is_some_and(|m| m.contains_key(&p)) {
                let page = if full || ps >= i.size {
                    Box::new([0u8; BLOCK_SIZE])
                } else {
                    file::read_page(&mut self.st, &i, p)?
                };
                let before = self.dirty.get(&ino).map_or(0, |m| m.len() as u64);
                self.dirty.entry(ino).or_default().insert(p, page);
                self.promise_pages(&i, before, 1);
            }
            let page = self.dirty.get_mut(&ino).unwrap().get_mut(&p).unwrap();
            page[(from - ps) as usize..(to - ps) as usize]
                .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
        }
        i.size = i.size.max(end);
        let t = now();
        i.mtime = t;
        i.ctime = t;
        self.st.put_inode(&i)?;
        Ok(data.len())
    }
}

impl Volume {
    /// Open a volume: check the superblock, replay the log, load free space, and free
    /// inodes left on the orphan list by an unclean stop.
    pub fn open(dev: Arc<dyn BlockDevice>, opts: OpenOptions) -> Result<Volume> {
        let sb = read_usable_superblock(&*dev)?;
        let mut opts = opts;
        if sb.ro_compat & !KNOWN_RO_COMPAT != 0 {
            opts.read_only = true;
        }
        // Read-only opens do not replay the log on the device: the newest delta's blocks
        // are overlaid in the cache instead (pinned, as they are never written).
        let (journal, replay) = Journal::recover(&*dev, sb.layout, !opts.read_only)?;
        let mut cache = MetaCache::new(opts.cache_blocks);
        if opts.read_only {
            for (b, img) in replay {
                cache.pin(b, img)?;
            }
        }
        let space = Space::load(&*dev, &mut cache, sb.layout)?;
        let state_blk = cache.get(&*dev, STATE_BLOCK, Some(STATE_MAGIC))?;
        let state = State::decode(state_blk);
        if state.orphan_head != 0 && ino_loc(state.orphan_head).0 >= sb.layout.block_count {
            return Err(Error::corrupt(format!("orphan list head {} out of range", state.orphan_head)));
        }
        let mut st = Store::new(dev, cache, space, sb, opts.reserve_regions);
        st.inode_readahead = opts.sorted_prefetch;
        let read_only = opts.read_only;
        let mut inner = Inner {
            st,
            log_capacity: journal.capacity() as u64,
            seq: journal.seq,
            state,
            dirty: HashMap::new(),
            dirty_pages: 0,
            open: HashMap::new(),
            opts,
            failed: false,
            readahead: HashMap::new(),
            epoch: 0,
        };
        // The root must be a directory.
        let root = inner.st.sb.root_ino;
        inner.dir_inode(root)?;
        let orphans = inner.state.orphan_head != 0;
        let vol = Volume { inner: Mutex::new(inner), journal: Mutex::new(journal), read_only };
        if !read_only && orphans {
            // Unlinked files that were open at the crash: free them, one delta each if
            // need be (deletions never run out of space).
            let mut guard = 0u64;
            loop {
                let mut g = vol.charged(|_| Ok(Cost::new(0, 0, true)))?;
                let ino = g.state.orphan_head;
                if ino == 0 {
                    break;
                }
                g.remove_orphan(ino)?;
                guard += 1;
                if guard > 100_000_000 {
                    return Err(Error::corrupt("orphan list loops"));
                }
            }
            vol.commit()?;
        }
        Ok(vol)
    }

    /// Commit the current delta and wait until it is durable.
    fn commit(&self) -> Result<()> {
        let mut journal = self.journal.lock();
        let flight = {
            let mut g = self.inner.lock();
            if g.failed {
                return Err(Error::Io(std::io::Error::other("volume failed; remount to recover")));
            }
            if g.opts.read_only {
                return Ok(());
            }
            match g.prepare_commit(&mut journal) {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(()),
                Err(e) => {
                    g.failed = true;
                    return Err(e);
                }
            }
        };
        // The log and home writes run without the volume lock: the front end goes on
        // with the next delta meanwhile.
        let dev = self.inner.lock().st.dev.clone();
        let r = journal.commit(&*dev, &flight.blocks);
        let mut g = self.inner.lock();
        match r {
            Ok(()) => {
                g.finish_commit(&flight);
                Ok(())
            }
            Err(e) => {
                g.failed = true;
                Err(e)
            }
        }
    }

    /// Lock the volume for a change whose cost `cost` computes; if the current delta
    /// cannot take it, commit and try again; fail with ENOSPC only when a fresh delta
    /// still cannot.
    fn charged(&self, cost: impl Fn(&mut Inner) -> Result<Cost>) -> Result<MutexGuard<'_, Inner>> {
        let mut commits = 0;
        loop {
            let mut g = self.inner.lock();
            g.check_writable()?;
            let c = cost(&mut g)?;
            match g.fits(c) {
                Ok(()) => return Ok(g),
                Err(Short::Space) if !g.st.space.could_fit_after_commit(c.meta + c.pages, c.deletion) => {
                    return Err(Error::NoSpace)
                }
                Err(Short::Space) if commits > 0 && g.st.space.deferred() == 0 => return Err(Error::NoSpace),
                Err(_) if commits >= 2 => {
                    return Err(if g.fits(c) == Err(Short::Space) {
                        Error::NoSpace
                    } else {
                        Error::corrupt("an operation does not fit in an empty delta")
                    })
                }
                Err(_) => {
                    drop(g);
                    self.commit()?;
                    commits += 1;
                }
            }
        }
    }

    /// The superblock.
    pub fn superblock(&self) -> Superblock {
        self.inner.lock().st.sb.clone()
    }

    /// Whether the volume was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The root directory's inode number.
    pub fn root(&self) -> u64 {
        self.inner.lock().st.sb.root_ino
    }

    /// I/O counters of the device.
    pub fn io_stats(&self) -> IoStats {
        self.inner.lock().st.dev.stats()
    }

    /// Look a name up in a directory.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let mut g = self.inner.lock();
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        let p = g.dir_inode(parent)?;
        if name == b"." {
            return g.attr(&p);
        }
        if name == b".." {
            let pp = g.st.inode(p.parent)?;
            return g.attr(&pp);
        }
        let f = dir::lookup(&mut g.st, &p, name)?.ok_or(Error::NotFound)?;
        let i = g.st.inode(f.ino)?;
        g.attr(&i)
    }

    /// Attributes of an inode.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let mut g = self.inner.lock();
        let i = g.st.inode(ino)?;
        g.attr(&i)
    }

    /// Change attributes (chmod, chown, truncate, utimens).
    pub fn setattr(&self, ino: u64, s: &SetAttr) -> Result<Attr> {
        let mut g = self.charged(|g| {
            let i = g.st.inode(ino)?;
            if s.size.is_none() {
                return Ok(Cost::new(0, 0, true));
            }
            match i.file_type() {
                Some(FileType::RegularFile) => {}
                Some(FileType::Directory) => return Err(Error::IsDir),
                _ => return Err(Error::Invalid("truncate of a special file".into())),
            }
            // Shrinking may split an extent, and rewrites the partial tail page.
            Ok(Cost::new(2 * extent_depth(&i) + 3 + Inner::writeback_meta(0, 1, extent_depth(&i)), 1, true))
        })?;
        let mut i = g.st.inode(ino)?;
        let t = now();
        if let Some(m) = s.mode {
            i.mode = (i.mode & libc::S_IFMT) | (m & 0o7777);
            g.chmod_acl(&mut i)?;
        }
        if let Some(u) = s.uid {
            i.uid = u;
        }
        if let Some(gid) = s.gid {
            i.gid = gid;
        }
        if let Some(size) = s.size {
            if size != i.size {
                g.truncate(&mut i, size)?;
                i.mtime = t;
            }
        }
        let pick = |st: SetTime| match st {
            SetTime::Now => t,
            SetTime::At(x) => x,
        };
        if let Some(a) = s.atime {
            i.atime = pick(a);
        }
        if let Some(m) = s.mtime {
            i.mtime = pick(m);
        }
        i.ctime = s.ctime.unwrap_or(t);
        g.st.put_inode(&i)?;
        g.attr(&i)
    }

    /// Create a regular file, device node, fifo or socket (`mode` includes the type).
    pub fn mknod(&self, parent: u64, name: &[u8], mode: u32, rdev: u64, uid: u32, gid: u32) -> Result<Attr> {
        self.make(parent, name, NewNode { mode, uid, gid, rdev, umask: 0 })
    }

    /// Create any inode but a symlink, as FUSE's create, mknod and mkdir do: the parent's
    /// default ACL, if any, is inherited (and the umask ignored), else the umask applies.
    pub fn make(&self, parent: u64, name: &[u8], n: NewNode) -> Result<Attr> {
        if type_of(n.mode)? == FileType::Symlink {
            return Err(Error::Invalid("make of a symlink".into()));
        }
        // One block more for inherited ACLs (identical lists share it).
        let mut g = self.charged(|g| Ok(Cost { meta: g.create_cost(parent)?.meta + 1, ..g.create_cost(parent)? }))?;
        let (mode, acls) = g.inherited(parent, n.mode, n.umask)?;
        let (_, mut i) = g.create_node(parent, name, mode, n.uid, n.gid, n.rdev)?;
        if !acls.is_empty() {
            xattr::store(&mut g.st, &mut i, &acls)?;
            g.st.put_inode(&i)?;
        }
        g.attr(&i)
    }

    /// Create a regular file with permission bits `perm`.
    pub fn create(&self, parent: u64, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.mknod(parent, name, libc::S_IFREG | (perm & 0o7777), 0, uid, gid)
    }

    /// Create a directory.
    pub fn mkdir(&self, parent: u64, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.make(parent, name, NewNode { mode: libc::S_IFDIR | (perm & 0o7777), uid, gid, rdev: 0, umask: 0 })
    }

    /// Create a symbolic link.
    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr> {
        if target.is_empty() || target.contains(&0) {
            return Err(Error::Invalid("empty symlink target".into()));
        }
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong);
        }
        let pages = if target.len() <= INLINE_DATA { 0 } else { target.len().div_ceil(BLOCK_SIZE) as u64 };
        let mut g = self.charged(|g| {
            let c = g.create_cost(parent)?;
            Ok(Cost::new(c.meta + Inner::writeback_meta(0, pages, 0), pages, false))
        })?;
        let (_, mut i) = g.create_node(parent, name, libc::S_IFLNK | 0o777, uid, gid, 0)?;
        if target.len() <= INLINE_DATA {
            let mut t = [0u8; INLINE_DATA];
            t[..target.len()].copy_from_slice(target);
            i.data = InodeData::InlineSymlink(t);
            i.size = target.len() as u64;
            g.st.put_inode(&i)?;
        } else {
            g.write(i.ino, 0, target)?;
            i = g.st.inode(i.ino)?;
        }
        g.attr(&i)
    }

    /// The target of a symbolic link.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let mut g = self.inner.lock();
        let i = g.st.inode(ino)?;
        if i.file_type() != Some(FileType::Symlink) {
            return Err(Error::Invalid("not a symlink".into()));
        }
        if let InodeData::InlineSymlink(t) = &i.data {
            return Ok(t[..i.size as usize].to_vec());
        }
        let g = &mut *g;
        file::read(&mut g.st, &i, g.dirty.get(&ino), 0, i.size as usize)
    }

    /// Add a hard link.
    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        dir::check_name(newname)?;
        let mut g = self.charged(|g| {
            let p = g.dir_inode(newparent)?;
            Ok(Cost::new(Inner::dir_cost(&p), 0, false))
        })?;
        let mut i = g.st.inode(ino)?;
        if i.is_dir() {
            return Err(Error::NotPermitted);
        }
        if i.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        let mut p = g.dir_inode(newparent)?;
        dir::insert(&mut g.st, &mut p, newname, ino, type_of(i.mode)?)?;
        let t = now();
        i.nlink += 1;
        i.ctime = t;
        p.mtime = t;
        p.ctime = t;
        g.st.put_inode(&p)?;
        g.st.put_inode(&i)?;
        g.attr(&i)
    }

    fn remove_entry(&self, parent: u64, name: &[u8], want_dir: bool) -> Result<()> {
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        let mut g = self.charged(|_| Ok(Cost::new(0, 0, true)))?;
        let mut p = g.dir_inode(parent)?;
        let f = dir::lookup(&mut g.st, &p, name)?.ok_or(Error::NotFound)?;
        let i = g.st.inode(f.ino)?;
        if want_dir {
            if !i.is_dir() {
                return Err(Error::NotDir);
            }
            if i.dir()?.entries > 0 {
                return Err(Error::NotEmpty);
            }
        } else if i.is_dir() {
            return Err(Error::IsDir);
        }
        dir::remove(&mut g.st, &mut p, f.key)?;
        let t = now();
        p.mtime = t;
        p.ctime = t;
        if want_dir {
            p.nlink -= 1;
        }
        g.st.put_inode(&p)?;
        g.drop_link(i)
    }

    /// Remove a non-directory entry.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove_entry(parent, name, false)
    }

    /// Remove an empty directory.
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        if name == b"." {
            return Err(Error::Invalid("rmdir of .".into()));
        }
        if name == b".." {
            return Err(Error::NotEmpty);
        }
        self.remove_entry(parent, name, true)
    }

    /// Rename, with RENAME_NOREPLACE and RENAME_EXCHANGE.
    pub fn rename(&self, parent: u64, name: &[u8], newparent: u64, newname: &[u8], flags: RenameFlags) -> Result<()> {
        dir::check_name(name).map_err(|e| {
            if matches!(e, Error::NameTooLong) {
                e
            } else {
                Error::Invalid("bad name".into())
            }
        })?;
        dir::check_name(newname)?;
        if flags.noreplace && flags.exchange {
            return Err(Error::Invalid("RENAME_NOREPLACE with RENAME_EXCHANGE".into()));
        }
        let mut g = self.charged(|g| {
            let p = g.dir_inode(parent)?;
            let np = g.dir_inode(newparent)?;
            Ok(Cost::new(Inner::dir_cost(&p) + Inner::dir_cost(&np), 0, true))
        })?;
        let g = &mut *g;
        let mut p = g.dir_inode(parent)?;
        let src = dir::lookup(&mut g.st, &p, name)?.ok_or(Error::NotFound)?;
        let np0 = g.dir_inode(newparent)?;
        let dst = dir::lookup(&mut g.st, &np0, newname)?;
        if flags.noreplace && dst.is_some() {
            return Err(Error::Exists);
        }
        if flags.exchange && dst.is_none() {
            return Err(Error::NotFound);
        }
        if let Some(d) = dst {
            if d.ino == src.ino {
                return Ok(()); // same inode: POSIX says do nothing
            }
        }
        let mut si = g.st.inode(src.ino)?;
        // A directory may not move below itself.
        if si.is_dir() && parent != newparent {
            let mut cur = newparent;
            let root = g.st.sb.root_ino;
            let mut guard = 0u64;
            while cur != root {
                if cur == src.ino {
                    return Err(Error::Invalid("cannot move a directory into itself".into()));
                }
                cur = g.st.inode(cur)?.parent;
                guard += 1;
                if guard > 1 << 20 {
                    return Err(Error::corrupt("directory parent chain loops"));
                }
            }
        }
        let t = now();
        if flags.exchange {
            let d = dst.unwrap();
            let mut di = g.st.inode(d.ino)?;
            if di.is_dir() && parent != newparent {
                let mut cur = parent;
                let root = g.st.sb.root_ino;
                while cur != root {
                    if cur == d.ino {
                        return Err(Error::Invalid("cannot move a directory into itself".into()));
                    }
                    cur = g.st.inode(cur)?.parent;
                }
            }
            dir::replace(&mut g.st, &mut p, src.key, name, d.ino, d.ft)?;
            g.st.put_inode(&p)?;
            let mut np = g.dir_inode(newparent)?;
            dir::replace(&mut g.st, &mut np, d.key, newname, src.ino, src.ft)?;
            g.st.put_inode(&np)?;
            if parent != newparent {
                if si.is_dir() != di.is_dir() {
                    let (mut a, mut b) = (g.dir_inode(parent)?, g.dir_inode(newparent)?);
                    if si.is_dir() {
                        a.nlink -= 1;
                        b.nlink += 1;
                    } else {
                        a.nlink += 1;
                        b.nlink -= 1;
                    }
                    g.st.put_inode(&a)?;
                    g.st.put_inode(&b)?;
                }
                if si.is_dir() {
                    si.parent = newparent;
                }
                if di.is_dir() {
                    di.parent = parent;
                }
            }
            si.ctime = t;
            di.ctime = t;
            g.st.put_inode(&si)?;
            g.st.put_inode(&di)?;
        } else {
            let mut replaced = None;
            if let Some(d) = dst {
                let di = g.st.inode(d.ino)?;
                if si.is_dir() && !di.is_dir() {
                    return Err(Error::NotDir);
                }
                if !si.is_dir() && di.is_dir() {
                    return Err(Error::IsDir);
                }
                if di.is_dir() && di.dir()?.entries > 0 {
                    return Err(Error::NotEmpty);
                }
                let mut np = g.dir_inode(newparent)?;
                dir::replace(&mut g.st, &mut np, d.key, newname, src.ino, src.ft)?;
                g.st.put_inode(&np)?;
                replaced = Some(di);
            } else {
                let mut np = g.dir_inode(newparent)?;
                dir::insert(&mut g.st, &mut np, newname, src.ino, src.ft)?;
                g.st.put_inode(&np)?;
            }
            let mut p = g.dir_inode(parent)?;
            // The entry's key may have moved if the insert above displaced it: look again.
            let s2 = dir::lookup(&mut g.st, &p, name)?.ok_or_else(|| Error::corrupt("rename source vanished"))?;
            dir::remove(&mut g.st, &mut p, s2.key)?;
            g.st.put_inode(&p)?;
            if si.is_dir() {
                if parent != newparent {
                    let mut a = g.dir_inode(parent)?;
                    a.nlink -= 1;
                    g.st.put_inode(&a)?;
                    let mut b = g.dir_inode(newparent)?;
                    b.nlink += 1;
                    g.st.put_inode(&b)?;
                }
                si.parent = newparent;
            }
            si.ctime = t;
            g.st.put_inode(&si)?;
            if let Some(di) = replaced {
                if di.is_dir() {
                    let mut b = g.dir_inode(newparent)?;
                    b.nlink -= 1;
                    g.st.put_inode(&b)?;
                }
                let di = g.st.inode(di.ino)?;
                g.drop_link(di)?;
            }
        }
        for d in [parent, newparent] {
            let mut x = g.dir_inode(d)?;
            x.mtime = t;
            x.ctime = t;
            g.st.put_inode(&x)?;
        }
        Ok(())
    }

    /// Note an open handle: an unlinked inode lives until its last release.
    pub fn open_file(&self, ino: u64) -> Result<Attr> {
        let mut g = self.inner.lock();
        let i = g.st.inode(ino)?;
        *g.open.entry(ino).or_insert(0) += 1;
        g.attr(&i)
    }

    /// Release an open handle; frees the inode if it was the last reference.
    pub fn release(&self, ino: u64) -> Result<()> {
        {
            let mut g = self.inner.lock();
            let n = match g.open.get_mut(&ino) {
                Some(n) => {
                    *n -= 1;
                    *n
                }
                None => return Ok(()),
            };
            if n > 0 {
                return Ok(());
            }
            g.open.remove(&ino);
            if g.opts.read_only || g.failed || !g.st.inode(ino).is_ok_and(|i| i.nlink == 0) {
                return Ok(());
            }
        }
        // The last handle of an unlinked inode: free it (a deletion, so it may use the
        // reserve), unless it was opened again meanwhile.
        let mut g = self.charged(|_| Ok(Cost::new(0, 0, true)))?;
        if !g.open.contains_key(&ino) && g.st.inode(ino).is_ok_and(|i| i.nlink == 0) {
            g.remove_orphan(ino)?;
        }
        Ok(())
    }

    /// Read up to `size` bytes at `offset`. The device reads run without the volume
    /// lock; if a write-back or commit ran meanwhile (either may rewrite a block that the
    /// plan named and that was freed and reused since), the read is done again under it.
    pub fn read(&self, ino: u64, offset: u64, size: usize) -> Result<Vec<u8>> {
        let (plan, epoch, dev) = {
            let mut g = self.inner.lock();
            let i = g.st.inode(ino)?;
            match i.file_type() {
                Some(FileType::RegularFile) | Some(FileType::Symlink) => {}
                Some(FileType::Directory) => return Err(Error::IsDir),
                _ => return Err(Error::Invalid("read of a special file".into())),
            }
            if offset >= i.size {
                return Ok(Vec::new());
            }
            let len = (size as u64).min(i.size - offset) as usize;
            let g = &mut *g;
            (file::plan_read(&mut g.st, &i, g.dirty.get(&ino), offset, len)?, g.epoch, g.st.dev.clone())
        };
        let out = plan.execute(&*dev)?;
        let mut g = self.inner.lock();
        if g.epoch == epoch {
            return Ok(out);
        }
        let i = g.st.inode(ino)?;
        let len = (size as u64).min(i.size.saturating_sub(offset)) as usize;
        let g = &mut *g;
        file::read(&mut g.st, &i, g.dirty.get(&ino), offset, len)
    }

    /// Write `data` at `offset`; returns the bytes written.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<usize> {
        // Large writes go in chunks, each charged on its own; when one fails after others
        // succeeded, the write is short, as POSIX allows.
        let mut done = 0;
        for chunk in data.chunks(WRITE_CHUNK) {
            let off = offset + done as u64;
            let r = self
                .charged(|g| {
                    if g.st.inode(ino)?.file_type() == Some(FileType::Symlink) {
                        return Err(Error::Invalid("write to a symlink".into()));
                    }
                    g.write_cost(ino, off, chunk.len() as u64)
                })
                .and_then(|mut g| g.write(ino, off, chunk));
            match r {
                Ok(n) => done += n,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }

    /// fallocate: mode 0 allocates (and may extend), `keep_size` does not change the
    /// size, `punch` (which requires keep_size) frees the range.
    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, keep_size: bool, punch: bool) -> Result<()> {
        if len == 0 {
            return Err(Error::Invalid("zero length".into()));
        }
        let end = offset.checked_add(len).ok_or(Error::FileTooBig)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        if punch && !keep_size {
            return Err(Error::Invalid("punch hole needs keep size".into()));
        }
        let bs = BLOCK_SIZE as u64;
        let (s, e) = (offset / bs, end.div_ceil(bs));
        let mut g = self.charged(|g| {
            let i = g.st.inode(ino)?;
            if i.file_type() != Some(FileType::RegularFile) {
                return Err(if i.is_dir() { Error::IsDir } else { Error::Invalid("not a file".into()) });
            }
            let depth = extent_depth(&i);
            let n = (e - s).min(FALLOC_STEP);
            Ok(if punch {
                // Zeroing the two partial end pages; unmapping may split one extent.
                Cost::new(2 * depth + 3 + Inner::writeback_meta(0, 2, depth), 2, true)
            } else {
                // Blocks are allocated at once, so they are metadata-like: not promised.
                Cost::new(2 * depth + 3 + n / 64 + n, 0, false)
            })
        })?;
        if punch {
            let mut i = g.st.inode(ino)?;
            let end = end.min(i.size);
            if offset >= end {
                return Ok(());
            }
            // Zero the partial pages at both ends, unmap the whole pages between.
            let first_full = offset.div_ceil(bs);
            let last_full = end / bs;
            let zero_ranges = if first_full > last_full {
                vec![(offset, end)]
            } else {
                vec![(offset, first_full * bs), (last_full * bs, end)]
            };
            for (s, e) in zero_ranges {
                if e > s {
                    let zeros = vec![0u8; (e - s) as usize];
                    g.write(ino, s, &zeros)?;
                }
            }
            i = g.st.inode(ino)?;
            if first_full < last_full {
                if let Some(pages) = g.dirty.get_mut(&ino) {
                    let tail = pages.split_off(&first_full);
                    let (drop, keep): (Pages, Pages) = tail.into_iter().partition(|(p, _)| *p < last_full);
                    pages.extend(keep);
                    let n = drop.len() as u64;
                    g.dirty_pages -= n;
                    g.st.space.promised = g.st.space.promised.saturating_sub(n);
                }
                file::punch(&mut g.st, &mut i, first_full, last_full)?;
            }
            i.ctime = now();
            i.mtime = i.ctime;
            g.st.put_inode(&i)?;
            return Ok(());
        }
        // Preallocation maps blocks at once: in steps, each charged on its own and
        // stopping when the delta's log fills, so any size fits.
        let limit = (g.log_capacity as usize).saturating_sub(WRITEBACK_HEADROOM);
        let mut at = s;
        loop {
            let mut i = g.st.inode(ino)?;
            at = file::preallocate(&mut g.st, &mut i, at, e, FALLOC_STEP, limit)?;
            if at >= e && !keep_size && end > i.size {
                i.size = end;
            }
            i.ctime = now();
            g.st.put_inode(&i)?;
            if at >= e {
                return Ok(());
            }
            drop(g);
            g = self.charged(|g| {
                let i = g.st.inode(ino)?;
                let n = (e - at).min(FALLOC_STEP);
                Ok(Cost::new(2 * extent_depth(&i) + 3 + n / 64 + n, 0, false))
            })?;
        }
    }

    /// List a directory from position `pos` (0 = start), at most `max` entries. Each
    /// entry's `next` is the position to continue after it; positions stay valid while
    /// entries come and go.
    pub fn readdir(&self, ino: u64, pos: u64, max: usize) -> Result<Vec<DirEntry>> {
        let mut g = self.inner.lock();
        let d = g.dir_inode(ino)?;
        let mut out = Vec::new();
        dir::read(&mut g.st, &d, pos, |e| {
            out.push(e);
            out.len() < max
        })?;
        Ok(out)
    }

    /// readdir with attributes (seed 004): the batch's inode blocks are read in one
    /// sorted sweep before the attributes are filled in, and a directory read in order
    /// has its next leaves and their inode blocks read ahead, also in disk order.
    pub fn readdir_plus(&self, ino: u64, pos: u64, max: usize) -> Result<Vec<(DirEntry, Attr)>> {
        let mut g = self.inner.lock();
        let d = g.dir_inode(ino)?;
        let mut ents = Vec::new();
        dir::read(&mut g.st, &d, pos, |e| {
            ents.push(e);
            ents.len() < max
        })?;
        if g.opts.sorted_prefetch {
            if ents.len() == max {
                // A directory read in batches: read ahead from this batch on, so the batch
                // and the next ones come in one sorted sweep.
                g.read_ahead(&d, pos)?;
            } else {
                g.readahead.remove(&ino);
            }
            let blocks: Vec<u64> = ents.iter().map(|e| ino_loc(e.ino).0).collect();
            g.st.prefetch_inodes(&blocks, READAHEAD_INODE_BLOCKS)?;
        }
        let mut out = Vec::with_capacity(ents.len());
        for e in ents {
            let i = g.st.inode(e.ino)?;
            let a = g.attr(&i)?;
            out.push((e, a));
        }
        Ok(out)
    }

    /// Value of an xattr.
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let mut g = self.inner.lock();
        let (idx, suffix) = xattr::split_name(name)?;
        let i = g.st.inode(ino)?;
        if g.opts.use_xattr_filter
            && g.st.sb.xattr_filter()
            && xattr::ruled_out(&i, idx, suffix, g.st.sb.filter_hashes())
        {
            return Err(Error::NoData);
        }
        let list = xattr::load(&mut g.st, &i)?;
        list.into_iter().find(|x| x.idx == idx && x.name == suffix).map(|x| x.value).ok_or(Error::NoData)
    }

    /// Names of all xattrs.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let mut g = self.inner.lock();
        let i = g.st.inode(ino)?;
        Ok(xattr::load(&mut g.st, &i)?.iter().map(|x| xattr::full_name(x.idx, &x.name)).collect())
    }

    /// Set an xattr.
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        let (idx, suffix) = xattr::split_name(name)?;
        if value.len() > xattr::VALUE_MAX {
            return Err(Error::TooBig);
        }
        let mut g = self.charged(|g| {
            // The new list may need every block of a maximal chain; the old ones are
            // released only with the delta.
            let i = g.st.inode(ino)?;
            let now = xattr::encoded_len(&xattr::load(&mut g.st, &i)?);
            Ok(Cost::new(xattr::blocks_for(now + 6 + suffix.len() + value.len()), 0, false))
        })?;
        let mut i = g.st.inode(ino)?;
        let mut list = xattr::load(&mut g.st, &i)?;
        let pos = list.iter().position(|x| x.idx == idx && x.name == suffix);
        match (pos, mode) {
            (Some(_), XattrMode::Create) => return Err(Error::Exists),
            (None, XattrMode::Replace) => return Err(Error::NoData),
            _ => {}
        }
        let x = xattr::Xattr { idx, name: suffix.to_vec(), value: value.to_vec() };
        // POSIX ACLs: validated; an access ACL sets the mode's permission bits, and one
        // the mode says all of is not stored at all; default ACLs only on directories.
        let mut keep = true;
        if idx == 2 || idx == 3 {
            let a = acl::decode(value)?;
            if idx == 3 && !i.is_dir() {
                return Err(Error::Invalid("default ACL on a non-directory".into()));
            }
            if idx == 2 {
                i.mode = (i.mode & !0o777) | acl::mode_bits(&a);
                keep = !acl::is_minimal(&a);
            }
        }
        match (pos, keep) {
            (Some(p), true) => list[p] = x,
            (None, true) => list.push(x),
            (Some(p), false) => {
                list.remove(p);
            }
            (None, false) => {}
        }
        xattr::store(&mut g.st, &mut i, &list)?;
        i.ctime = now();
        g.st.put_inode(&i)
    }

    /// Remove an xattr.
    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        let (idx, suffix) = xattr::split_name(name)?;
        let mut g = self.charged(|_| Ok(Cost::new(0, 0, true)))?;
        let mut i = g.st.inode(ino)?;
        let mut list = xattr::load(&mut g.st, &i)?;
        let pos = list.iter().position(|x| x.idx == idx && x.name == suffix).ok_or(Error::NoData)?;
        list.remove(pos);
        xattr::store(&mut g.st, &mut i, &list)?;
        i.ctime = now();
        g.st.put_inode(&i)
    }

    /// Space and inode numbers.
    pub fn statfs(&self) -> StatFs {
        let g = self.inner.lock();
        let s = &g.st.space;
        let bavail = s.available(false);
        let per_block = INODES_PER_BLOCK - 1;
        StatFs {
            blocks: g.st.sb.layout.block_count,
            bfree: (s.free() + s.deferred()).saturating_sub(s.promised + s.promised_meta),
            bavail,
            files: g.state.inodes + bavail * per_block,
            ffree: bavail * per_block,
            bsize: BLOCK_SIZE as u32,
            namelen: NAME_MAX as u32,
        }
    }

    /// Commit the current delta and make it durable.
    pub fn sync(&self) -> Result<()> {
        self.commit()
    }

    /// Make one file durable (commits the whole delta: deltas are atomic).
    pub fn fsync(&self, _ino: u64) -> Result<()> {
        self.sync()
    }

    /// Commit and close.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    /// Commit, and leave the volume clean: the next open has nothing to replay. The
    /// volume stays usable (a later change simply starts a new delta).
    pub fn shutdown(&self) -> Result<()> {
        self.sync()?;
        self.checkpoint()
    }

    /// After the last commit: make its home writes durable and commit an empty delta, so
    /// the next open has nothing to replay (a clean unmount; replaying would read and
    /// rewrite the whole last delta).
    fn checkpoint(&self) -> Result<()> {
        let mut journal = self.journal.lock();
        let mut g = self.inner.lock();
        if g.failed || g.opts.read_only || journal.last_blocks == 0 || g.st.cache.dirty_count() > 0 {
            return Ok(());
        }
        let dev = g.st.dev.clone();
        dev.flush()?;
        journal.commit(&*dev, &[])?;
        g.seq = journal.seq;
        Ok(())
    }

    /// Number of entries in a directory (without . and ..), and its index depth.
    pub fn dir_stats(&self, ino: u64) -> Result<(u64, u16)> {
        let mut g = self.inner.lock();
        let d = g.dir_inode(ino)?;
        let di = d.dir()?;
        Ok((di.entries, di.tree.depth))
    }

    /// Blocks of a directory's index (for readahead experiments and tests).
    pub fn dir_blocks(&self, ino: u64) -> Result<Vec<u64>> {
        let mut g = self.inner.lock();
        let d = g.dir_inode(ino)?;
        let t = d.dir()?.tree;
        btree::blocks(&mut g.st, &t, ino)
    }

    /// Run a repair on the lower layers inside the current delta (fsck).
    pub(crate) fn repair(&self, f: impl FnOnce(&mut Store) -> Result<()>) -> Result<()> {
        let mut g = self.inner.lock();
        g.check_writable()?;
        f(&mut g.st)
    }

    /// How many xattr lists were read from xattr blocks so far (the storage reads the
    /// bloom filter exists to avoid).
    pub fn xattr_block_reads(&self) -> u64 {
        self.inner.lock().st.xattr_block_reads
    }

    /// Drop clean cached metadata (a cold-cache start without remounting).
    pub fn drop_caches(&self) -> Result<()> {
        // Holding the journal lock keeps any commit from being in flight while the cache
        // forgets (an in-flight block's device copy may be stale).
        self.commit()?;
        let _j = self.journal.lock();
        let mut g = self.inner.lock();
        if g.st.cache.dirty_count() == 0 {
            g.st.cache.clear();
        }
        Ok(())
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let (ro, failed) = {
            let g = self.inner.lock();
            (g.opts.read_only, g.failed)
        };
        if !ro && !failed {
            if let Err(e) = self.commit().and_then(|_| self.checkpoint()) {
                tracing::error!("commit at close failed: {e}");
            }
        }
    }
}

impl Volume {
    /// Refuse all further changes and commits (closing does not commit either), for
    /// a frontend that caught a panic inside the volume: memory may be half-changed,
    /// while the disk still holds the last committed delta.
    pub fn poison(&self) {
        self.inner.lock().failed = true;
    }
}
