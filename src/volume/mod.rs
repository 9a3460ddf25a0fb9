//! The volume: the public, thread-safe API by inode number, and the delta machinery
//! that ties the layers together (charging costs, write-back, commit, recovery).
//!
//! Every change happens inside the current delta (`delta/`); `sync` (and `fsync`)
//! commit it and make it durable. A delta also commits by itself when its dirty metadata
//! comes within `OP_LOG_BLOCKS` of a log area's capacity, when its dirty data passes the
//! dirty limit, and when the space budget runs short.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::disk::codec::*;
use crate::disk::device::{BlockDevice, IoStats};
use crate::disk::format::*;
#[cfg(feature = "testing")]
use crate::engine::btree;
use crate::engine::leaf::{Leaf, LeafKind, Padded, Sharded, SlotCounter, SLOTS};
use crate::engine::log::Journal;
use crate::engine::space::Claim;
use crate::engine::store::{Store, Tx};
use crate::error::{Error, Result};

mod ahead;
mod attrs;
mod charge;
mod commit;
mod contention;
mod data;
mod delta;
mod known;
mod locks;
pub(crate) mod mark;
mod mkfs;
mod namespace;
mod quota;
mod ranges;
mod readdir;
mod resize;
mod rstats;
pub use quota::{Quota, QUOTA_USED_XATTR, QUOTA_XATTR};
pub use rstats::{RSTAT_XATTRS, RSTAT_XATTR_PREFIX};
mod tree;
mod trim;
mod types;

use contention::LockCounters;
pub use contention::{LockStats, ReadStats, LEAF_LOCK_NAMES};
use delta::{Cost, Delta, Flight};
pub use known::{KnownEntry, KnownVolumes, Standing};
use locks::{InodeLocks, Mode};
pub use mark::holder_on_this_host as mount_mark_holder_on_this_host;
pub use mark::status as mount_mark_status;
pub use mkfs::{mkfs, read_superblock, MkfsOptions};
pub(crate) use mkfs::{read_usable_superblock, root_is_wrong};
pub use resize::{grow, Grown};
pub use tree::{EmptyStep, NewEntry, SumStep, TreeRemoval};
pub use types::*;

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
/// Most hard links to one inode (and subdirectories of one directory).
pub(crate) const LINK_MAX: u32 = 65_000;
/// Longest symlink target.
pub(crate) const SYMLINK_MAX: usize = MAX_SYMLINK as usize;
/// Largest piece of a write charged at once (bytes).
const WRITE_CHUNK: usize = 4 << 20;
/// Largest piece of a preallocation charged at once (blocks).
const FALLOC_STEP: u64 = 32_768;
/// Directory readahead: leaves and entries read ahead of a sequential readdirplus.
const READAHEAD_LEAVES: usize = 16;
const READAHEAD_ENTRIES: usize = 2048;
/// At most this many blocks (32 MiB) per readahead of inode windows: the memory bound.
const READAHEAD_INODE_BLOCKS: usize = 8192;
/// File data a commit writes per device request at most (4 MiB): the pace at which a
/// writer held back by the dirty limit goes on.
const DATA_PIECE: usize = 1024;
/// Log blocks kept free for one write-back fragment: two bitmap blocks, an extent-tree
/// removal and insert (each a split per level of a tree of depth up to 6), the inode and
/// state blocks.
const WRITEBACK_HEADROOM: usize = 2 + 2 * 8 + 2;
/// Log blocks kept free for any single front-end operation (rename: two index inserts with
/// splits at every level, four inode blocks, bitmap and state blocks).
const OP_LOG_BLOCKS: u64 = 32;

/// The volume's state behind its lock. Front-end operations share the lock (each with
/// the inode locks of what it touches, see `locks.rs`), so every field they change has a
/// lock of its own or is atomic; the commit's snapshot holds it exclusively.
struct Inner {
    st: Store,
    /// The delta being built.
    delta: Delta,
    /// The state block's contents and the inodes' lives (unlinked inodes still held, the
    /// orphan list): one leaf lock.
    life: Leaf<Life>,
    /// Open handles by inode (an unlinked inode lives until its last release), in shards:
    /// opens and releases of different files take no volume-wide lock. A count changes
    /// only under its inode's lock (read: opens may run side by side; write: release),
    /// and what is decided from it (free the inode, or keep it on the orphan list) is
    /// decided under the inode's write lock, which keeps every open out meanwhile.
    open: Sharded<rustc_hash::FxHashMap<u64, u32>>,
    /// The state block's inode count and next generation number, kept here (every create
    /// and free changes them, from any thread) and copied into `life.state` at each
    /// commit: the count in per-thread slots, the numbers handed out in batches.
    inodes: SlotCounter,
    generations: Generations,
    opts: OpenOptions,
    /// Set when a commit failed half way: memory no longer matches any disk state.
    failed: AtomicBool,
    /// Per directory, the readdir position up to which readahead was issued.
    readahead: Leaf<HashMap<u64, u64>>,
    /// The mount mark this read-write open holds (ro_compat MOUNT_MARK), kept fresh by
    /// its own thread until the volume is dropped.
    mark: Option<Arc<mark::Holder>>,
    /// Who else may still use an inode that loses its last link (the FUSE kernel's
    /// references): see [`Volume::set_holder`].
    holder: Option<Holder>,
    /// `(sequence number, linearization stamp)` of every delta sealed, once a test asked
    /// for them ([`Volume::record_commit_stamps`]).
    commit_stamps: Mutex<Option<Vec<(u64, u64)>>>,
    /// Directory quotas met so far, and their use (`quota.rs`).
    quotas: quota::Quotas,
}

/// What lives behind `Inner::life`.
struct Life {
    /// The state block's contents (counters, orphan list), written with every commit.
    state: State,
    /// Inodes with no link and no open handle that the holder still holds: alive, not yet
    /// on the orphan list (the next commit puts them there), freed by
    /// [`Volume::forgotten`].
    held: rustc_hash::FxHashSet<u64>,
    /// Inodes with no link still used by the holder that are already on the orphan list
    /// (held at a commit, or open handles released while held): `forgotten` frees them.
    listed_held: rustc_hash::FxHashSet<u64>,
    /// The orphan list's links backwards (inode → the one before it, 0 for the head), so
    /// taking an inode off the list reads no other inode.
    orphan_prev: rustc_hash::FxHashMap<u64, u64>,
    /// Inodes still held or open after losing their last link: what a write short of
    /// space waits for (`settle_unlinked`) and `statfs` counts as free.
    unlinked_at: rustc_hash::FxHashMap<u64, Unlinked>,
}

/// An inode that lost its last link while held or open (`Life::unlinked_at`).
#[derive(Debug, Clone, Copy)]
struct Unlinked {
    /// When it lost the link.
    at: std::time::Instant,
    /// Whether it was open then (else only held).
    open: bool,
    /// Its blocks then: what its FORGET will give back.
    blocks: u64,
}

/// Inode generation numbers, handed out by each thread slot from batches of its own, so
/// creates in different threads do not all write one counter.
struct Generations {
    /// The first number no batch has taken (what the state block records).
    next: std::sync::atomic::AtomicU32,
    /// Per slot, the numbers left in its batch.
    batches: Box<[Padded<parking_lot::Mutex<Batch>>]>,
}

/// Generation numbers `next..end` a slot may still hand out.
type Batch = (u32, u32);

/// Generation numbers a slot takes at once.
const GENERATION_BATCH: u32 = 256;

impl Generations {
    fn new(next: u32) -> Generations {
        Generations {
            next: std::sync::atomic::AtomicU32::new(next),
            batches: (0..SLOTS).map(|_| Padded(parking_lot::Mutex::new((0, 0)))).collect(),
        }
    }

    /// A generation number for a new inode.
    fn take(&self) -> u32 {
        let mut b = self.batches[crate::engine::leaf::slot()].lock();
        if b.0 == b.1 {
            let start = self.next.fetch_add(GENERATION_BATCH, Ordering::Relaxed);
            *b = (start, start.wrapping_add(GENERATION_BATCH));
        }
        let g = b.0;
        b.0 = b.0.wrapping_add(1);
        g
    }

    /// What the state block records: past every number handed out.
    fn next(&self) -> u32 {
        self.next.load(Ordering::Relaxed)
    }
}

/// The volume lock (see `Shared::inner`).
///
/// A task-fair reader-writer lock, alone on its cache lines. (A lock sharded by thread,
/// `crossbeam_utils`' `ShardedLock`, was tried: no clear gain in two threads' scaling on
/// this host, and a commit taking its eight shards one after another behind operations
/// left creates waiting 120–180 ms, docs/BENCHMARKS.md.)
struct VolumeLock(Padded<RwLock<Inner>>);

impl VolumeLock {
    /// Share it.
    fn read_inner(&self) -> RwLockReadGuard<'_, Inner> {
        self.0.read()
    }

    /// Take it alone.
    fn write_inner(&self) -> RwLockWriteGuard<'_, Inner> {
        self.0.write()
    }
}

/// See [`Volume::set_holder`].
pub(crate) type Holder = Arc<dyn Fn(u64) -> bool + Send + Sync>;

/// A mounted volume. All methods take `&self` and may be called from many threads.
///
/// Lock order: `rename` (taken first, by a rename between directories), `journal`,
/// `inner`, the inode locks, then leaf locks
/// (docs/DESIGN.md, "Concurrency"). Front-end operations share `inner` and hold the
/// inode locks of what they touch; a commit takes `journal` for its whole length and
/// `inner` exclusively only to snapshot the delta and to finish, so the front end goes
/// on with the next delta while the log is written.
pub struct Volume {
    s: Arc<Shared>,
}

/// The volume's state, shared with the thread that commits a full delta in the
/// background (`commit_soon`).
struct Shared {
    /// Whether a directory quota was met (`quota.rs`; the same flag as the volume's):
    /// read on every WRITE through the mount, without the volume lock.
    quotas_met: Arc<AtomicBool>,
    /// The device (also in the store): file data is read and written without the lock.
    dev: Arc<dyn BlockDevice>,
    /// File data read ahead for sequential readers (`ahead.rs`).
    ahead: ahead::ReadAhead,
    /// Every operation shares it, the commit's snapshot takes it alone.
    inner: VolumeLock,
    /// The inode locks (see `locks.rs`).
    locks: InodeLocks,
    /// Held by a rename between two directories, before its inode locks, as the kernel's
    /// `s_vfs_rename_mutex`: no directory moves while it checks that a directory does not
    /// move below itself (walking parents it has not locked).
    rename: Leaf<()>,
    /// How long the volume lock is waited for and held (issue 14's serial share).
    lock_stats: LockCounters,
    /// Notified when a commit's file data has reached the device (see `wait_landed`).
    landed: contention::Signal,
    journal: Mutex<Journal>,
    /// Background commits asked for and snapshotted (see `commit_soon`).
    background: Mutex<Background>,
    /// Notified when a background commit has taken its snapshot or stopped.
    background_cv: Condvar,
    /// The thread that writes dirty pages back ahead of the commit (`flush_ahead`).
    flusher: Mutex<Flusher>,
    /// Set by a writer that finds the delta wants a flush; the flusher clears it.
    flush_wanted: std::sync::atomic::AtomicBool,
    /// A flush is writing back or writing its data (the flusher is making progress).
    flushing: std::sync::atomic::AtomicBool,
    /// Pages of file data a commit has snapshotted and not yet written (and freed).
    in_flight_pages: std::sync::atomic::AtomicU64,
    /// Runs of file data (one device request or more each) a commit has snapshotted and
    /// not yet written: scattered pages are held back by runs, not by pages.
    in_flight_runs: std::sync::atomic::AtomicU64,
    /// A flight whose commit found the storage full (`disk::device::HeldWrites`): kept
    /// whole and committed again before anything else (`Shared::resume_stalled`).
    stalled: Mutex<Option<Flight>>,
    /// `stalled` holds a flight: every change looks at this, and fails with ENOSPC.
    storage_full: std::sync::atomic::AtomicBool,
    /// When the stalled commit was last tried.
    stall_tried: Mutex<std::time::Instant>,
    read_only: bool,
    discard: bool,
    atime: AtimePolicy,
}

/// The flusher thread: whether it runs, and the last one started (joined before another
/// starts and when the volume is dropped).
#[derive(Default)]
struct Flusher {
    running: bool,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The state of background commits: request `n` is served once `snapshotted >= n`.
#[derive(Default)]
struct Background {
    requested: u64,
    snapshotted: u64,
    /// A background committer thread exists (it serves requests until none is left).
    running: bool,
    /// The last committer thread started: joined before another starts and when the
    /// volume is dropped, so that its share of the volume is gone by then.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Inner {
    /// Whether the volume must not change any more: a commit failed half way, or another
    /// host took over its mount mark.
    fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire) || self.mark.as_ref().is_some_and(|m| m.lost())
    }

    /// Inodes in use (exact when no create or free runs meanwhile).
    fn inode_count(&self) -> u64 {
        self.inodes.sum().max(0) as u64
    }

    /// Copy the counters kept as atomics into the state block's contents (at a commit's
    /// snapshot, with the volume lock held exclusively).
    fn sync_counters(&mut self) {
        let (inodes, next_generation) = (self.inode_count(), self.generations.next());
        let state = &mut self.life.get_mut().state;
        state.inodes = inodes;
        state.next_generation = next_generation;
    }

    /// Fail the volume: memory no longer matches any disk state.
    fn fail(&self) {
        self.failed.store(true, Ordering::Release);
    }

    fn check_writable(&self) -> Result<()> {
        if self.is_failed() {
            return Err(Error::Failed);
        }
        if self.opts.read_only {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// Whether something besides open handles still uses `ino` (the holder says so).
    /// Whether `ino` has an open handle.
    fn is_open(&self, ino: u64) -> bool {
        self.open.shard(ino).contains_key(&ino)
    }

    /// Count one more open handle of `ino`.
    fn note_open(&self, ino: u64) {
        *self.open.shard(ino).entry(ino).or_insert(0) += 1;
    }

    fn is_held(&self, ino: u64) -> bool {
        self.holder.as_ref().is_some_and(|h| h(ino))
    }

    fn dir_inode(&self, ino: u64) -> Result<Inode> {
        let i = self.st.inode(ino)?;
        if !i.is_dir() {
            return Err(Error::NotDir);
        }
        Ok(i)
    }
}

impl Volume {
    /// Open a volume: check the superblock, replay the log, load free space, and free
    /// inodes left on the orphan list by an unclean stop.
    pub fn open(dev: Arc<dyn BlockDevice>, opts: OpenOptions) -> Result<Volume> {
        Self::open_checked(dev, opts, false)
    }

    /// Open read-write for fsck's repairs: without requiring a readable root directory
    /// (a repair may write a new one), leaving the orphan list alone, so that what the
    /// check counted (live inodes, owned blocks) is what the repair finds, and past
    /// bitmap counts that disagree with their bits (the repair checked the bits against
    /// the tree and rewrites the counts). The next ordinary open frees the orphans.
    /// `allow_rollback` as in [`OpenOptions`].
    pub(crate) fn open_for_repair(dev: Arc<dyn BlockDevice>, allow_rollback: bool) -> Result<Volume> {
        Self::open_checked(dev, OpenOptions { allow_rollback, ..Default::default() }, true)
    }

    fn open_checked(dev: Arc<dyn BlockDevice>, opts: OpenOptions, repair: bool) -> Result<Volume> {
        let sb = read_usable_superblock(&*dev)?;
        let mut opts = opts;
        if sb.ro_compat & !KNOWN_RO_COMPAT != 0 {
            opts.read_only = true;
        }
        // A read-write open takes the mount mark before it writes anything (the log
        // replay): another host's fresh mark refuses it.
        let mark =
            if opts.read_only { None } else { mark::acquire(&dev, &sb, opts.mark_interval_ms, opts.known.as_ref())? };
        // A write the storage refuses for want of room is held until it has room again,
        // so a full host file system stalls a commit instead of failing the volume. (The
        // mark goes by the caller's device: opens of one handle share one holder.)
        let dev: Arc<dyn BlockDevice> =
            if opts.read_only { dev } else { Arc::new(crate::disk::device::HeldWrites::new(dev)) };
        let opened = if opts.read_only {
            // A damaged free-space map or state block does not keep a read-only open from
            // reading the namespace (fsck rebuilds both from the tree).
            let o = crate::engine::store::open_lenient(
                dev,
                sb,
                false,
                opts.cache_blocks,
                opts.reserve_regions,
                opts.allow_rollback,
            )?;
            o.refuse_held()?;
            for e in o.damage() {
                tracing::warn!("{e}; read-only, without it (dxfs fsck rebuilds it)");
            }
            let mut opened = o.opened;
            for (i, m) in std::mem::take(&mut opened.miscounted) {
                tracing::warn!("free-space map: {m}; read-only, taking its blocks as in use (dxfs fsck checks it)");
                opened.store.space().distrust(i);
            }
            opened
        } else {
            let o = crate::engine::store::open(
                dev,
                sb,
                true,
                opts.cache_blocks,
                opts.reserve_regions,
                opts.allow_rollback,
            )?;
            // A map whose counts disagree with its bits may mark live metadata free: no
            // allocation from it until fsck has checked it against the tree.
            if let Some((_, m)) = o.miscounted.first().filter(|_| !repair) {
                return Err(Error::corrupt(format!("free-space map: {m} (dxfs fsck checks it against the tree)")));
            }
            o
        };
        let (journal, mut st, state) = (opened.journal, opened.store, opened.state);
        st.inode_readahead = opts.sorted_prefetch;
        st.serial().enabled.store(opts.measure_lock, Ordering::Relaxed);
        let read_only = opts.read_only;
        let measure_lock = opts.measure_lock;
        let stamping = opts.linearization_stamps;
        let discard = opts.discard && !read_only;
        let atime = if read_only { AtimePolicy::Never } else { opts.atime };
        let data_readahead = opts.data_readahead;
        let serial = st.serial().clone();
        let inner = Inner {
            st,
            delta: Delta::new(journal.seq, journal.capacity() as u64, &opts),
            inodes: SlotCounter::new(state.inodes as i64),
            generations: Generations::new(state.next_generation),
            life: Leaf::new(
                LeafKind::Life,
                Life {
                    state,
                    held: Default::default(),
                    listed_held: Default::default(),
                    orphan_prev: Default::default(),
                    unlinked_at: Default::default(),
                },
                serial.clone(),
            ),
            opts,
            failed: AtomicBool::new(false),
            readahead: Leaf::new(LeafKind::Readahead, HashMap::new(), serial.clone()),
            // Inodes in runs of 1,024, as the store's table of changed inodes.
            open: Sharded::new(10),
            mark,
            holder: None,
            commit_stamps: Mutex::new(None),
            quotas: if repair { quota::Quotas::off() } else { quota::Quotas::default() },
        };
        // The root must be a directory.
        let root = inner.st.sb.root_ino;
        if !repair {
            inner.dir_inode(root)?;
        }
        let orphans = inner.life.lock().state.orphan_head != 0;
        let dev = inner.st.dev().clone();
        let vol = Volume {
            s: Arc::new(Shared {
                quotas_met: inner.quotas.met.clone(),
                ahead: ahead::ReadAhead::new(dev.clone(), data_readahead),
                dev,
                inner: VolumeLock(Padded(RwLock::new(inner))),
                locks: InodeLocks::new(),
                rename: Leaf::new(LeafKind::Rename, (), serial),
                lock_stats: LockCounters::new(measure_lock, stamping),
                landed: Default::default(),
                journal: Mutex::new(journal),
                background: Mutex::new(Background::default()),
                background_cv: Condvar::new(),
                flusher: Mutex::new(Flusher::default()),
                flush_wanted: Default::default(),
                flushing: Default::default(),
                in_flight_pages: Default::default(),
                in_flight_runs: Default::default(),
                stalled: Mutex::new(None),
                storage_full: Default::default(),
                stall_tried: Mutex::new(std::time::Instant::now()),
                read_only,
                discard,
                atime,
            }),
        };
        // A grow cut short after its switch to the new size is finished before anything
        // can allocate (resize.rs).
        if !read_only && vol.lock().st.sb.grow_from != 0 {
            resize::finish_pending_grow(&vol)?;
        }
        if !read_only && orphans && !repair {
            // Unlinked files that were open at the crash: free them, one delta each if
            // need be (deletions never run out of space).
            let mut guard = 0u64;
            // Their extents come from disk unchecked: their frees read the blocks first.
            vol.lock().st.set_verify_frees(true);
            let freed = (|| -> Result<()> {
                loop {
                    let g = vol.charged(&[], |_| Ok(Cost::new(0, 0, true)))?;
                    let ino = g.life.lock().state.orphan_head;
                    if ino == 0 {
                        break;
                    }
                    // The list is read from disk: it frees only what is truly unlinked.
                    // Anything else stops the freeing, and the list is left for fsck.
                    if let Err(why) = g.orphan_ok(ino) {
                        tracing::error!("orphan list: {why}; left as it is (run dxfs fsck)");
                        break;
                    }
                    g.remove_orphan(ino)?;
                    guard += 1;
                    if guard > 100_000_000 {
                        return Err(Error::corrupt("orphan list loops"));
                    }
                }
                Ok(())
            })();
            vol.lock().st.set_verify_frees(false);
            freed?;
            vol.commit()?;
        }
        Ok(vol)
    }

    /// The superblock.
    pub fn superblock(&self) -> Superblock {
        self.s.inner.read_inner().st.sb.clone()
    }

    /// Whether the volume was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.s.read_only
    }

    /// The root directory's inode number.
    pub fn root(&self) -> u64 {
        self.s.inner.read_inner().st.sb.root_ino
    }

    /// I/O counters of the device.
    pub fn io_stats(&self) -> IoStats {
        self.s.dev.stats()
    }

    /// Space and inode numbers. Blocks freed by the current delta count as free and
    /// available at once: an operation that needs them commits first. (`sync(1)` never
    /// reaches a FUSE daemon, so `df` right after `rm` must be true without a commit.)
    pub fn statfs(&self) -> StatFs {
        let g = self.s.inner.read_inner();
        let inodes = g.inode_count();
        let s = g.st.space();
        // What the leases hold for operations to come is free, and so is what files
        // removed moments ago give back when the kernel lets them go.
        let settling = g.settling_blocks();
        let bavail = s.available_after_commit(Claim::Change) + g.st.leased_idle() + settling;
        // Of the room kept for write-back, what is free.
        let kept = s.available_after_commit(Claim::WriteBack) - s.available_after_commit(Claim::Change);
        let per_block = INODES_PER_BLOCK - 1;
        StatFs {
            blocks: g.st.sb.layout.block_count,
            bfree: (s.free() + s.deferred()).saturating_sub(s.promised()) + settling,
            bavail,
            settling,
            kept,
            files: inodes + bavail * per_block,
            ffree: bavail * per_block,
            bsize: BLOCK_SIZE as u32,
            namelen: NAME_MAX as u32,
        }
    }

    /// Keep `bytes` free for a cache's write-back (rounded up to blocks; 0 keeps none):
    /// the FUSE server keeps what the kernel's writeback cache may hold dirty, so that
    /// everything its write() accepted can land. Only writes made as
    /// [`WriteAs::write_back`] and deletions may use that room; `statfs` does not count
    /// it as available (`StatFs::kept`).
    pub fn keep_for_write_back(&self, bytes: u64) {
        let g = self.s.inner.read_inner();
        g.st.space().keep_for_write_back(bytes.div_ceil(BLOCK_SIZE as u64));
    }

    #[cfg(feature = "testing")]
    /// Number of entries in a directory (without . and ..), and its index depth.
    pub fn dir_stats(&self, ino: u64) -> Result<(u64, u16)> {
        let d = self.op(&[(ino, Mode::Read)]).dir_inode(ino)?;
        let di = d.dir()?;
        Ok((di.entries, di.tree.depth))
    }

    #[cfg(feature = "testing")]
    /// Blocks of a file's extent tree (none while its map is inline; tests and tools).
    pub fn extent_tree_blocks(&self, ino: u64) -> Result<Vec<u64>> {
        let g = self.op(&[(ino, Mode::Read)]);
        let i = g.st.inode(ino)?;
        match i.data {
            InodeData::ExtentTree { tree, .. } => btree::blocks(&mut g.st.tx(), &tree, ino),
            _ => Ok(Vec::new()),
        }
    }

    #[cfg(feature = "testing")]
    /// Blocks of a directory's index (for readahead experiments and tests).
    pub fn dir_blocks(&self, ino: u64) -> Result<Vec<u64>> {
        let g = self.op(&[(ino, Mode::Read)]);
        let d = g.dir_inode(ino)?;
        let t = d.dir()?.tree;
        let r = btree::blocks(&mut g.st.tx(), &t, ino);
        r
    }

    /// Run a repair on the lower layers and the state block inside the current delta
    /// (fsck, resize).
    pub(crate) fn repair(&self, f: impl FnOnce(&mut Tx, &mut State) -> Result<()>) -> Result<()> {
        let mut g = self.lock();
        g.check_writable()?;
        let g = &mut *g;
        g.sync_counters();
        let r = f(&mut g.st.tx(), &mut g.life.get_mut().state);
        // A repair may change only the state (an inode count, the orphan list's head):
        // the state block joins the delta, so the next commit writes it (the commit
        // encodes it anew).
        g.st.tx().fresh_block(STATE_BLOCK);
        let state = &g.life.get_mut().state;
        let (inodes, generation) = (state.inodes, state.next_generation);
        g.inodes = SlotCounter::new(inodes as i64);
        g.generations = Generations::new(generation);
        r
    }

    #[cfg(feature = "testing")]
    /// How many xattr lists were read from xattr blocks so far (the storage reads the
    /// bloom filter exists to avoid).
    pub fn xattr_block_reads(&self) -> u64 {
        self.s.inner.read_inner().st.xattr_block_reads.load(Ordering::Relaxed)
    }

    #[cfg(feature = "testing")]
    /// Drop clean cached metadata (a cold-cache start without remounting).
    pub fn drop_caches(&self) -> Result<()> {
        // Holding the journal lock keeps any commit from being in flight while the cache
        // forgets (an in-flight block's device copy may be stale).
        self.commit()?;
        let _j = self.s.journal.lock();
        let mut g = self.lock();
        if g.st.dirty_count() == 0 {
            g.st.clear_cache();
        } else {
            // Others dirtied blocks since the commit: keep those.
            g.st.drop_clean();
        }
        Ok(())
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        // Background commits and flushes finish first: nothing of ours writes after the
        // drop, and their threads' share of the volume (the mount mark with it) is gone.
        self.s.wait_flusher();
        self.s.wait_background();
        let (ro, failed) = {
            let g = self.lock();
            (g.opts.read_only, g.is_failed())
        };
        if !ro && !failed {
            if let Err(e) = self.commit().and_then(|_| self.checkpoint()) {
                if self.s.storage_full.load(Ordering::Acquire) {
                    tracing::error!(
                        "closed while the storage is full: the changes since the last commit are lost \
                         (what was committed is intact)"
                    );
                } else {
                    tracing::error!("commit at close failed: {e}");
                }
            }
        }
    }
}

impl Volume {
    /// Refuse all further changes and commits (closing does not commit either), for
    /// a frontend that caught a panic inside the volume: memory may be half-changed,
    /// while the disk still holds the last committed delta.
    pub fn poison(&self) {
        self.lock().fail();
    }
}
