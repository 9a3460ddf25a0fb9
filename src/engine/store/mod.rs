//! The metadata store: device, block cache and free space bundled for the layers above,
//! plus the inode table (inode records, their allocation and placement, seed 002).
//!
//! Inode numbers are addresses: `ino = block * 16 + slot`, slot 0 of every inode block
//! being its header. A directory reserves a region of inode blocks next to its own inode;
//! its children take slots from that region in creation order, and when it is full the
//! next region (twice as large, up to 64 blocks) is allocated close by.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::disk::codec::*;
use crate::disk::device::BlockDevice;
use crate::disk::format::*;
use crate::engine::btree::BTREE_MAGIC;
use crate::engine::cache::{Filled, MetaCache, Reads, Windows};
use crate::engine::deferred::{self, Wanted};
use crate::engine::leaf::{shard_index, slot, Leaf, LeafGuard, LeafKind, Padded, Serial, Sharded, SLOTS};
use crate::engine::log::{BlockImages, Journal, Replay};
use crate::engine::space::{Bitmap, Claim, Promises, Space};
use crate::error::{Error, Result};

mod data_ranges;
mod hints;
mod inodes;
mod rstats;
mod tx;

pub(crate) use hints::{BlockHints, XATTR_SHARE_HINTS};
pub(crate) use tx::{read_inode, MetaRead, Tx};

/// Device + cache + space: everything below the inode layer, shared by every thread of
/// the volume. Operations reach blocks through a [`Tx`] (one per operation), which holds
/// at most one block of the cache at a time; everything else here is behind short locks
/// of its own, leaves of the lock order (docs/DESIGN.md, "Concurrency"):
/// `lazy` → `space` → a cache shard, and `xattr_shared` → the same.
pub struct Store {
    dev: Arc<dyn BlockDevice>,
    cache: MetaCache,
    space: Leaf<Space>,
    /// The space map's words, read without its lock.
    bitmap: Arc<Bitmap>,
    /// The space map's count of bitmap blocks the delta will write, read without its lock.
    pending_bitmap: Arc<AtomicU64>,
    /// The space map's promises, charged without its lock.
    promises: Arc<Promises>,
    pub sb: Superblock,
    /// Use directory inode reservation (A/B switch; on by default).
    pub reserve_regions: bool,
    /// Recently stored shareable xattr blocks by content hash (a hint, checked on use).
    /// Its lock also makes finding, sharing and releasing a shared xattr block one step.
    pub xattr_shared: Leaf<BlockHints>,
    /// Xattr lists read from xattr blocks (not inline): what the bloom filter saves.
    pub xattr_block_reads: AtomicU64,
    /// Without reservation: the inode block new inodes currently go to.
    shared_inode_block: Leaf<Option<u64>>,
    /// Inodes stored (`put_inode`) since the last snapshot: every change to a file or
    /// directory stores its inode (times, size, links), so an inode not here has nothing
    /// in the delta being built (an fsync of it need not commit).
    /// With recursive statistics, each also with what it counted for before the delta
    /// changed it (`rstats.rs`).
    changed_inodes: Sharded<rustc_hash::FxHashMap<u64, Option<rstats::Counted>>>,
    /// Read an uncached inode block together with its aligned window of inode blocks
    /// (off unless the volume's sorted prefetch is on).
    pub inode_readahead: bool,
    /// The lazy-free tree's root (inode block → slots freed but still marked used there),
    /// when the volume has the LAZY_INODE_FREE feature; the state block carries it. Held
    /// while the tree changes.
    lazy: Leaf<Option<TreeRoot>>,
    /// The volume has a lazy-free tree (`lazy` is `Some`), known without its lock.
    lazy_enabled: bool,
    /// The lazy-free tree's records, in memory: an inode read checks here instead of in
    /// the tree (a tree lookup doubled the cost of a cached getattr). Kept equal to the
    /// tree by every change to it.
    lazy_masks: Sharded<rustc_hash::FxHashMap<u64, u16>>,
    /// The rstat tree's root (ro_compat RSTATS; the state block carries it), held while
    /// the tree changes shape.
    rstats: Leaf<Option<TreeRoot>>,
    /// The volume keeps recursive statistics (`rstats` is `Some`).
    rstats_enabled: bool,
    /// The rstat records the snapshot will rewrite, and their leaves.
    rstat_marks: rstats::Marks,
    /// `rstat_marks`' leaves, counted: log room the snapshot will use.
    rstat_leaves: AtomicU64,
    /// fsck rebuilt the rstat tree in this delta (`rebuild_rstats`).
    rstats_rebuilt: std::sync::atomic::AtomicBool,
    /// Running share of live inode slots in the windows read lately: windows pay only
    /// when most of what they bring in is live (a directory thinned to 1% is not).
    density: Leaf<Density>,
    /// Time spent on the volume-wide leaf locks (these and the volume's own).
    serial: Arc<Serial>,
    /// Region locks, striped by directory: taking a slot from a directory's inode blocks,
    /// freeing one, and moving the directory's region happen under its owner's stripe,
    /// so a block is never freed as empty while a slot in it is being taken, nor judged
    /// outside its region while the region moves (see `inodes.rs`).
    regions: Box<[parking_lot::Mutex<()>]>,
    /// Per thread slot, blocks of the budget taken from the space map ahead of need
    /// (Tux3's per-CPU balance): an operation reserves its worst case from its slot's
    /// lease with one atomic subtraction and gives it back there when it ends; the space
    /// map is locked only to refill a lease, or, when the volume runs short, to take every
    /// lease back, so nothing stays stranded in another slot and ENOSPC stays exact.
    leases: Box<[Padded<Lease>]>,
    /// Blocks a written file extent maps that were found on the device holding metadata
    /// sealed at their own address (wild extents onto blocks memory did not hold): never
    /// overwritten or freed as file data ([`Store::holds_metadata`] names them too).
    wild_targets: parking_lot::Mutex<rustc_hash::FxHashSet<u64>>,
    /// `wild_targets` is not empty.
    any_wild: std::sync::atomic::AtomicBool,
    /// Blocks known to hold file data: written by this mount, or read and found to be
    /// data, so that an overwrite in place reads its block at most once (freed blocks
    /// leave it).
    checked_data: parking_lot::Mutex<data_ranges::DataRanges>,
    /// Blocks frees of file data may still read first ([`Store::find_wild`]): set while an
    /// open frees the orphan list's files, whose extents came from disk unchecked; 0
    /// otherwise.
    verify_budget: AtomicU64,
}

/// One slot's lease (see `Store::leases`).
#[derive(Default)]
struct Lease {
    /// Blocks held for the next reservations.
    idle: AtomicU64,
    /// Blocks reservations from this lease used up (allocated or promised): counted in the
    /// map already, and still in what it handed out, until the lease next goes to the map.
    spent: AtomicU64,
}

/// Most blocks one lease takes at a time (fewer on a small volume, see `lease_size`).
const LEASE: u64 = 64;

/// Blocks a lease takes beyond what its operation needs, with `available` blocks left: at
/// most a 1,024th of them, so that all the leases together hold little of a small volume.
fn lease_size(available: u64) -> u64 {
    (available / 1024).min(LEASE)
}

/// Stripes of the region locks.
const REGION_STRIPES: usize = 64;

/// Most blocks an open reads to check the orphans' data before freeing it (256 MiB).
const VERIFY_BUDGET: u64 = 65_536;

/// How dense in live inodes the inode windows read lately were.
struct Density {
    share: f64,
    /// Prefetch sweeps so far (block mode samples windows again now and then).
    sweeps: u64,
}

/// The engine of an opened volume: its log (recovered), the store (cache and free
/// space) and the state block.
pub(crate) struct Opened {
    pub journal: Journal,
    pub store: Store,
    pub state: State,
    /// Bitmap blocks (by index) whose `used` count disagrees with their bits (ro_compat
    /// BITMAP_COUNTS), with why: the map came from the bits, and only a repair, which
    /// checks them against the tree first, may allocate from it.
    pub miscounted: Vec<(u64, String)>,
}

/// The engine's one open sequence, shared by `Volume::open` and fsck: recover the log —
/// replaying its newest delta on the device when `apply`, else overlaying it in the cache
/// (pinned: a read-only open never writes) — then load free space and read the state
/// block.
pub(crate) fn open(
    dev: Arc<dyn BlockDevice>,
    sb: Superblock,
    apply: bool,
    cache_blocks: usize,
    reserve_regions: bool,
    allow_rollback: bool,
) -> Result<Opened> {
    let o = open_lenient(dev, sb, apply, cache_blocks, reserve_regions, allow_rollback)?;
    o.refuse_held()?;
    if let Some(e) = o.bitmap_damage.or(o.state_damage) {
        return Err(e);
    }
    Ok(o.opened)
}

/// What a lenient open found damaged besides what it opened.
pub(crate) struct LenientOpen {
    pub opened: Opened,
    /// Why the free-space map could not be read: `opened.store` then holds a map with
    /// every block in use (nothing can be allocated from it). The tree can rebuild it
    /// (fsck).
    pub bitmap_damage: Option<Error>,
    /// Why the state block could not be read: `opened.state` then holds a state with no
    /// orphans and no inode count. The tree can rebuild it (fsck).
    pub state_damage: Option<Error>,
    /// Logged file data whose home holds a sealed metadata block that no logged extent
    /// maps (`hold_data_over_metadata`): neither written nor overlaid. Only an owner map
    /// tells whether a file owns the block, so only fsck replays it; other opens refuse.
    pub held_data: BlockImages,
}

impl LenientOpen {
    /// Refuse an open that held logged file data back.
    pub(crate) fn refuse_held(&self) -> Result<()> {
        match self.held_data.first() {
            Some((t, _)) => Err(Error::corrupt(format!(
                "delta {} logs file data for block {t}, which holds a metadata block: not replayed \
                 (dxfs fsck replays it if a file owns the block, and drops it if metadata does)",
                self.opened.journal.seq
            ))),
            None => Ok(()),
        }
    }

    /// Both damages, the map's first.
    pub(crate) fn damage(&self) -> impl Iterator<Item = &Error> {
        self.bitmap_damage.iter().chain(&self.state_damage)
    }
}

/// [`open`] that gets past a damaged free-space map or state block, both derivable from
/// the tree: fsck rebuilds them, and a read-only open still reads the namespace.
pub(crate) fn open_lenient(
    dev: Arc<dyn BlockDevice>,
    sb: Superblock,
    apply: bool,
    cache_blocks: usize,
    reserve_regions: bool,
    allow_rollback: bool,
) -> Result<LenientOpen> {
    // The state block at home names the last delta whose home writes began; those begin
    // only after its commit block is durable. A newest valid commit older than that means
    // a committed commit block was damaged since: recovering would silently roll the
    // volume back past a completed sync (a torn commit block of a delta that never
    // completed cannot look like this). Read before any replay overwrites it.
    let home_seq = {
        let mut b = [0u8; BLOCK_SIZE];
        dev.read(STATE_BLOCK, &mut b)?;
        verify(&b, STATE_BLOCK, Some(STATE_MAGIC)).ok().map(|_| State::decode(&b).commit_seq)
    };
    let (journal, mut replay) = Journal::recover_from(&*dev, sb.layout, false, allow_rollback)?;
    let held_data = hold_data_over_metadata(&*dev, &mut replay)?;
    if let Some(home) = home_seq.filter(|&h| h > journal.seq) {
        if !allow_rollback {
            return Err(Error::corrupt(format!(
                "the commit record of delta {home} is damaged: the newest readable one is delta {}, and \
                 recovering from it would lose what was committed after it (open with rollback \
                 allowed, `-o recovery=rollback`, to accept that)",
                journal.seq
            )));
        }
        tracing::warn!("rolling back from delta {home}, whose commit record is damaged, to delta {}", journal.seq);
    }
    let cache = MetaCache::new(cache_blocks);
    let mut dev = dev;
    if apply {
        Journal::apply(&*dev, &replay)?;
    } else {
        for (b, img) in replay.meta {
            cache.pin(b, img)?;
        }
        // Logged file data is read past the cache: lay it over the device instead.
        if !replay.data.is_empty() {
            dev = Arc::new(crate::disk::overlay::Overlay::new(dev, replay.data));
        }
    }
    let (mut bitmap_damage, mut state_damage) = (None, None);
    let (space, miscounted) = match Space::load(&*dev, &cache, sb.layout, sb.bitmap_counts()) {
        Ok(s) => s,
        Err(e @ Error::Corrupt(_)) => {
            bitmap_damage = Some(context("free-space map", e));
            (Space::all_used(sb.layout), Vec::new())
        }
        Err(e) => return Err(e),
    };
    let state = match cache.get(&*dev, STATE_BLOCK, Some(STATE_MAGIC)) {
        Ok(b) => State::decode(&b),
        Err(e @ Error::Corrupt(_)) => {
            state_damage = Some(context("state block", e));
            State {
                orphan_head: 0,
                next_generation: 1,
                commit_seq: journal.seq,
                inodes: 0,
                lazy_frees: TreeRoot::default(),
                rstats: TreeRoot::default(),
            }
        }
        Err(e) => return Err(e),
    };
    if state.orphan_head != 0 && ino_loc(state.orphan_head).0 >= sb.layout.block_count {
        return Err(Error::corrupt(format!("orphan list head {} out of range", state.orphan_head)));
    }
    let lazy = sb.lazy_inode_free();
    if state.lazy_frees.root >= sb.layout.block_count || (state.lazy_frees.root == 0) != (state.lazy_frees.depth == 0) {
        return Err(Error::corrupt(format!("lazy-free tree root {:?} is invalid", state.lazy_frees)));
    }
    if !lazy && state.lazy_frees.root != 0 {
        return Err(Error::corrupt("a lazy-free tree on a volume without the LAZY_INODE_FREE feature"));
    }
    // The counters are derived data: a root that cannot be one is set aside (nothing is
    // written through it), the counters read as absent and fsck rebuilds them.
    let rstats = sb.rstats();
    let mut rstat_tree = state.rstats;
    if rstat_tree.root >= sb.layout.block_count || (rstat_tree.root == 0) != (rstat_tree.depth == 0) {
        tracing::error!("rstat tree root {rstat_tree:?} is invalid: set aside (dxfs fsck rebuilds the tree)");
        rstat_tree = TreeRoot::default();
    }
    let mut store = Store::new(dev, cache, space, sb, reserve_regions);
    *store.rstats.get_mut() = rstats.then_some(rstat_tree);
    store.rstats_enabled = rstats;
    *store.lazy.get_mut() = lazy.then_some(state.lazy_frees);
    store.lazy_enabled = lazy;
    store.load_lazy_masks();
    Ok(LenientOpen { opened: Opened { journal, store, state, miscounted }, bitmap_damage, state_damage, held_data })
}

/// Take out of `replay` the logged file data whose home holds a sealed metadata block
/// (or that the replay also names as metadata) and that no extent in the replayed
/// metadata maps, and return it. A crash can keep a one-flush commit and lose the home
/// write of its data to a block that was metadata before: stale metadata there, and the
/// delta that took the block for a file logged the extent that maps it (data logged as
/// an overwrite in place went to a block already written as file data). A damaged log
/// may name live metadata instead, which no logged extent maps, and replaying would
/// write file data over it. One read per logged data block, at an open that has them.
fn hold_data_over_metadata(dev: &dyn BlockDevice, replay: &mut Replay) -> Result<BlockImages> {
    let meta: std::collections::HashSet<u64> = replay.meta.iter().map(|(t, _)| *t).collect();
    let mut mapped: Option<Vec<(u64, u64)>> = None;
    let (mut held, mut kept) = (Vec::new(), Vec::new());
    let mut b = [0u8; BLOCK_SIZE];
    for (t, img) in std::mem::take(&mut replay.data) {
        let over_meta = meta.contains(&t) || {
            dev.read(t, &mut b)?;
            sealed_metadata(&b, t)
                && !mapped.get_or_insert_with(|| logged_extents(&replay.meta)).iter().any(|&(p, n)| t >= p && t - p < n)
        };
        if over_meta {
            tracing::warn!("logged file data for block {t}, which holds a metadata block: held back");
            held.push((t, img));
        } else {
            kept.push((t, img));
        }
    }
    replay.data = kept;
    Ok(held)
}

/// The file extents (first block, length) that the metadata images `meta` hold: inline
/// in inode records, and 12-byte records of B+tree leaves (a directory entry of that
/// length passes too, which can only keep more data in the replay, never less).
fn logged_extents(meta: &BlockImages) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for (b, img) in meta {
        match get_u32(&img[..], 0) {
            INODE_MAGIC => {
                let used = get_u16(&img[..], IB_USED);
                for slot in (1..INODES_PER_BLOCK as usize).filter(|s| used & (1 << s) != 0) {
                    let ino = b * INODES_PER_BLOCK + slot as u64;
                    let rec = &img[slot * INODE_SIZE..(slot + 1) * INODE_SIZE];
                    if let Ok(Some(Inode { data: InodeData::Extents { ext, n }, .. })) = Inode::decode(ino, rec) {
                        out.extend(ext.iter().take(usize::from(n)).map(|e| (e.phys, e.len)));
                    }
                }
            }
            BTREE_MAGIC => {
                for (_, v) in crate::engine::btree::image_leaf_records(img, *b) {
                    if let Ok(e) = Extent::decode_value(0, v) {
                        out.push((e.phys, e.len));
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// Say which structure a corruption was found in.
/// Live inodes in inode block `b` (slot 0 is the block's header).
fn live_inodes(b: &Block) -> u32 {
    u32::from(get_u16(b, IB_USED) & !1).count_ones()
}

fn context(what: &str, e: Error) -> Error {
    match e {
        Error::Corrupt(m) => Error::Corrupt(format!("{what}: {m}")),
        e => e,
    }
}

/// Free blocks (beyond the reserve) below which inode frees are written into their
/// blocks rather than recorded in the lazy-free tree, which may need a new node.
const LAZY_FREE_MIN_AVAILABLE: u64 = 64;

/// Below this share of live slots in recent windows, inode blocks are read one by one.
const WINDOW_MIN_DENSITY: f64 = 0.25;

/// Inode blocks read together on a miss (128 KiB), as ext4 reads its inode tables.
pub(crate) const INODE_WINDOW: u64 = 32;

impl Store {
    /// The lower layers of an opened (or new) volume.
    pub fn new(
        dev: Arc<dyn BlockDevice>,
        cache: MetaCache,
        space: Space,
        sb: Superblock,
        reserve_regions: bool,
    ) -> Store {
        let serial = Arc::new(Serial::default());
        Store {
            dev,
            cache,
            bitmap: space.bitmap(),
            pending_bitmap: space.pending_count(),
            promises: space.promises(),
            space: Leaf::new(LeafKind::Space, space, serial.clone()),
            sb,
            reserve_regions,
            xattr_shared: Leaf::new(LeafKind::XattrHints, BlockHints::new(XATTR_SHARE_HINTS), serial.clone()),
            xattr_block_reads: Default::default(),
            shared_inode_block: Leaf::new(LeafKind::SharedInodeBlock, None, serial.clone()),
            // Inodes in runs of 1,024: 64 inode blocks, a directory's region or more.
            changed_inodes: Sharded::new(10),
            inode_readahead: false,
            lazy: Leaf::new(LeafKind::LazyFree, None, serial.clone()),
            lazy_enabled: false,
            lazy_masks: Sharded::new(6),
            rstats: Leaf::new(LeafKind::Rstats, None, serial.clone()),
            rstats_enabled: false,
            rstat_marks: Default::default(),
            rstat_leaves: AtomicU64::new(0),
            rstats_rebuilt: Default::default(),
            density: Leaf::new(LeafKind::Density, Density { share: 1.0, sweeps: 0 }, serial.clone()),
            serial,
            regions: (0..REGION_STRIPES).map(|_| parking_lot::Mutex::new(())).collect(),
            leases: (0..SLOTS).map(|_| Padded::default()).collect(),
            wild_targets: Default::default(),
            any_wild: Default::default(),
            checked_data: Default::default(),
            verify_budget: AtomicU64::new(0),
        }
    }

    /// A handle for one operation: reads and changes blocks, allocates and frees.
    pub fn tx(&self) -> Tx<'_> {
        Tx::new(self)
    }

    /// The first of blocks `[start, start + len)` that memory holds as live metadata, or
    /// that was found holding metadata under a file extent (`note_wild`). The allocator
    /// never hands such a block out, so a file extent over one is a wild pointer (a read
    /// refuses it rather than return metadata as file data).
    /// Takes the shards' locks: the caller holds no cache block (`MetaRead::let_go`).
    pub fn holds_metadata(&self, start: u64, len: u64) -> Option<u64> {
        debug_assert_eq!(crate::engine::leaf::guards_held(), 0, "a shard lock taken while a cache block is held");
        let held = self.cache.first_held(start, len);
        // Nearly always none: no lock taken then (reads ask this too).
        if !self.any_wild.load(Ordering::Acquire) {
            return held;
        }
        let wild = self.wild_targets.lock();
        let end = start.saturating_add(len).min(held.unwrap_or(u64::MAX));
        wild.iter().copied().filter(|&b| b >= start && b < end).min().or(held)
    }

    /// Whether block `b`, which a written file extent maps, may be overwritten in place:
    /// memory does not hold it as metadata, and the device does not hold metadata sealed
    /// at `b` there (read once per block; a wild extent onto metadata memory did not
    /// hold would otherwise have file data written over it). Takes the shards' locks, as
    /// [`Store::holds_metadata`].
    pub fn overwritable_data(&self, b: u64) -> Result<bool> {
        if self.holds_metadata(b, 1).is_some() {
            return Ok(false);
        }
        if self.checked_data.lock().contains(b) {
            return Ok(true);
        }
        let mut buf = [0u8; BLOCK_SIZE];
        self.dev.read(b, &mut buf)?;
        if sealed_metadata(&buf, b) {
            tracing::error!("block {b}, mapped as file data, holds a metadata block (a wild extent): written elsewhere, never freed (run dxfs fsck)");
            self.note_wild(b);
            return Ok(false);
        }
        self.checked_data.lock().insert(b, b + 1);
        Ok(true)
    }

    /// Block `b`, mapped as file data, holds metadata: never written or freed as data.
    fn note_wild(&self, b: u64) {
        self.wild_targets.lock().insert(b);
        self.any_wild.store(true, Ordering::Release);
    }

    /// Blocks `[start, start + len)` were allocated for file data, which is about to be
    /// written there.
    pub fn note_data(&self, start: u64, len: u64) {
        self.checked_data.lock().insert(start, start.saturating_add(len));
    }

    /// Whether a free of `len` blocks of file data reads them first: while the budget
    /// lasts (see the field), which it then spends.
    pub fn take_verify_budget(&self, len: u64) -> bool {
        self.verify_budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(len)).is_ok()
    }

    /// Make frees of file data read their blocks first, up to `VERIFY_BUDGET` blocks in
    /// all (a huge orphan list must not read for minutes at an open), or stop.
    pub fn set_verify_frees(&self, on: bool) {
        self.verify_budget.store(if on { VERIFY_BUDGET } else { 0 }, Ordering::Relaxed);
    }

    /// Read blocks `[start, start + len)`, mapped as file data, and remember each that
    /// holds metadata sealed at its own address as a wild extent's target, so that
    /// [`Store::holds_metadata`] names it and nothing frees it.
    pub fn find_wild(&self, start: u64, len: u64) -> Result<()> {
        const CHUNK: u64 = 64;
        let mut buf = vec![0u8; CHUNK as usize * BLOCK_SIZE];
        let end = start.saturating_add(len);
        let mut at = start;
        while at < end {
            let n = (end - at).min(CHUNK);
            let buf = &mut buf[..n as usize * BLOCK_SIZE];
            self.dev.read(at, buf)?;
            for (k, blk) in buf.chunks(BLOCK_SIZE).enumerate() {
                let b = at + k as u64;
                if sealed_metadata(blk, b) {
                    tracing::error!("block {b}, mapped as file data, holds a metadata block (a wild extent): not freed (run dxfs fsck)");
                    self.note_wild(b);
                }
            }
            at += n;
        }
        Ok(())
    }

    /// Blocks `[start, start + len)` are no longer file data: an overwrite in place of
    /// them (through a map damaged since) must read them again.
    pub fn forget_checked_data(&self, start: u64, len: u64) {
        self.checked_data.lock().remove(start, start.saturating_add(len));
    }

    /// The free-space map and the budget, locked (a leaf lock: take nothing while
    /// holding it, and never hold it across device I/O).
    pub fn space(&self) -> LeafGuard<'_, Space> {
        self.space.lock()
    }

    /// Charge a written page's blocks to the delta (see [`Promises`]), without the space
    /// map's lock: every WRITE makes one.
    pub fn promise(&self, pages: u64, meta: u64) {
        self.promises.promise(pages, meta);
    }

    /// [`Store::space`], for a holder of the whole store.
    pub fn space_mut(&mut self) -> &mut Space {
        self.space.get_mut()
    }

    /// Reserve `n` blocks of the budget for an operation about to run (its worst case,
    /// with the kept room its `claim` may use): from this thread's lease when it holds enough,
    /// else refilling the lease from the space map, else, short of space, after taking
    /// every lease back. `false` when the volume cannot take `n` blocks now.
    pub fn reserve_blocks(&self, n: u64, claim: Claim) -> bool {
        if n == 0 {
            return true;
        }
        let lease = &self.leases[slot()];
        let mut cur = lease.idle.load(Ordering::Acquire);
        while cur >= n {
            match lease.idle.compare_exchange_weak(cur, cur - n, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
        let mut space = self.space();
        space.unlease(lease.spent.swap(0, Ordering::AcqRel));
        // Leases hold blocks beyond all kept room only: a deletion's or a write-back's
        // refill must not hand that room to the operations after it.
        let more = lease_size(space.available(Claim::Change));
        if more > 0 && space.available(Claim::Change) >= n + more {
            space.lease(n + more);
            lease.idle.fetch_add(more, Ordering::AcqRel);
            return true;
        }
        // Short of space: what the leases hold counts again, and exactly `n` is taken.
        self.reclaim_leases(&mut space);
        if space.available(claim) >= n {
            space.lease(n);
            return true;
        }
        false
    }

    /// An operation that reserved `n` blocks has ended, having used `used` of them
    /// (allocated or promised, see `space::consumed_here`): the rest goes back to this
    /// thread's lease (and what the lease holds past twice its size back to the map).
    pub fn release_blocks(&self, n: u64, used: u64) {
        if n == 0 {
            return;
        }
        let used = used.min(n);
        let lease = &self.leases[slot()];
        if used > 0 {
            lease.spent.fetch_add(used, Ordering::AcqRel);
        }
        let held = lease.idle.fetch_add(n - used, Ordering::AcqRel) + n - used;
        if held > 2 * LEASE {
            let mut space = self.space();
            space.unlease(lease.idle.swap(0, Ordering::AcqRel) + lease.spent.swap(0, Ordering::AcqRel));
        }
    }

    /// Take back what every lease holds or spent (with the space map locked).
    fn reclaim_leases(&self, space: &mut Space) {
        for l in self.leases.iter() {
            space.unlease(l.idle.swap(0, Ordering::AcqRel) + l.spent.swap(0, Ordering::AcqRel));
        }
    }

    /// Blocks the leases hold for operations to come, or spent and not yet given back:
    /// counted twice in the map's `available` (`statfs` adds them back).
    pub fn leased_idle(&self) -> u64 {
        self.leases.iter().map(|l| l.idle.load(Ordering::Acquire) + l.spent.load(Ordering::Acquire)).sum()
    }

    /// The measure of the volume-wide leaf locks (shared with the volume's own).
    pub fn serial(&self) -> &Arc<Serial> {
        &self.serial
    }

    /// Whether block `b` is in use, without the space map's lock.
    pub fn is_used(&self, b: u64) -> bool {
        self.bitmap.is_used(b)
    }

    /// The device the volume lives on.
    pub fn dev(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// Read the uncached ones of `blocks` in one sorted sweep.
    pub fn prefetch(&self, blocks: &[u64]) -> Result<()> {
        self.cache.prefetch(&*self.dev, blocks)
    }

    /// Dirty metadata blocks in the delta.
    pub fn dirty_count(&self) -> usize {
        self.cache.dirty_count()
    }

    /// Bitmap blocks the delta will write (see [`Space::pending_bitmap_blocks`]).
    pub fn pending_bitmap_blocks(&self) -> usize {
        self.pending_bitmap.load(Ordering::Relaxed) as usize
    }

    /// Seal the delta's metadata: the changed bitmap words go into their blocks, and the
    /// dirty blocks come out for the log (they stay cached, in flight, until `landed`).
    pub fn take_dirty(&mut self) -> Vec<(u64, Box<Block>)> {
        self.changed_inodes.for_each(|s| s.clear());
        self.space.get_mut().write_out(&self.cache);
        self.cache.take_dirty()
    }

    /// Blocks of a commit are durable and home.
    pub fn landed(&self, blocks: &[(u64, Box<Block>)]) {
        self.cache.landed(blocks)
    }

    /// Forget every clean cached block (a cold-cache start).
    pub fn clear_cache(&mut self) {
        self.cache.clear()
    }

    /// Drop the cached metadata blocks that are clean and not in flight.
    pub fn drop_clean(&self) {
        self.cache.drop_clean()
    }

    /// The delta's commit goes in flight: its freed blocks stay tombstoned until it lands.
    pub fn freed_to_flight(&mut self) {
        self.cache.freed_to_flight();
    }

    /// The commit in flight is durable and home.
    pub fn flight_landed(&self) {
        self.cache.flight_landed();
    }

    /// A delta committed synchronously (mid write-back): its frees are released.
    pub fn forget_freed(&self) {
        self.cache.forget_freed();
    }

    /// The region lock of directory `owner` (see `regions`).
    fn region_lock(&self, owner: u64) -> parking_lot::MutexGuard<'_, ()> {
        debug_assert_eq!(crate::engine::leaf::guards_held(), 0, "a region lock taken while a cache block is held");
        self.regions[shard_index(owner, REGION_STRIPES)].lock()
    }

    /// A block read as an inode block, B+tree node or xattr block must lie where such
    /// blocks may (`Layout::meta_block_ok`): a pointer elsewhere is corrupt metadata,
    /// refused before the block is read or, worse, changed.
    fn check_block_place(&self, b: u64, want: Option<u32>) -> Result<()> {
        let in_data_area = matches!(want, Some(INODE_MAGIC | BTREE_MAGIC | XATTR_MAGIC | XATTR_CONT_MAGIC));
        if in_data_area && !self.sb.layout.meta_block_ok(b) {
            return Err(Error::corrupt(format!("a pointer to block {b}, where no such block may lie")));
        }
        Ok(())
    }

    fn check_ino(&self, ino: u64) -> Result<(u64, usize)> {
        if !self.sb.layout.ino_ok(ino) {
            return Err(Error::NotFound);
        }
        Ok(ino_loc(ino))
    }

    /// Read an inode (see [`read_inode`]).
    pub fn inode(&self, ino: u64) -> Result<Inode> {
        self.tx().inode(ino)
    }

    /// Read an inode without the validity rules (fsck: see [`read_inode_unchecked`]).
    pub fn inode_unchecked(&self, ino: u64) -> Result<Inode> {
        self.tx().inode_unchecked(ino)
    }

    /// Write an inode back into its block.
    pub fn put_inode(&self, inode: &Inode) -> Result<()> {
        self.tx().put_inode(inode)
    }

    /// Whether inode `ino` was stored since the last snapshot (see `changed_inodes`).
    pub fn inode_changed(&self, ino: u64) -> bool {
        self.changed_inodes.shard(ino).contains_key(&ino)
    }

    /// Read the inode blocks `blocks` (sorted prefetch): in aligned windows of
    /// [`INODE_WINDOW`] blocks, at most `limit` blocks, while recent windows were mostly
    /// live inodes; else block by block in one sorted, coalesced sweep, trying windows
    /// again every 16th sweep in case the density came back.
    pub fn prefetch_inodes(&self, blocks: &[u64], limit: usize) -> Result<()> {
        if deferred::deferring() {
            deferred::want(Wanted::Inodes(blocks.to_vec(), limit));
            return Ok(());
        }
        let (reads, windows) = self.plan_inodes(blocks, limit);
        let read = reads.blocks();
        let filled = self.cache.read(reads, &*self.dev)?;
        self.fill_inodes(filled, windows.then_some(read));
        Ok(())
    }

    /// Plan the reads of [`Store::prefetch_inodes`]: windows while they pay, else the
    /// blocks alone (see there); whether they are windows.
    fn plan_inodes(&self, blocks: &[u64], limit: usize) -> (Reads, bool) {
        let mut limit = limit;
        {
            let mut d = self.density.lock();
            d.sweeps += 1;
            if d.share < WINDOW_MIN_DENSITY {
                if d.sweeps % 16 != 0 {
                    drop(d);
                    return (self.cache.plan_blocks(self.dev.block_count(), blocks), false);
                }
                // A sample: a few windows are enough to see whether density came back.
                limit = limit.min(4 * INODE_WINDOW as usize);
            }
        }
        let w = Windows { blocks: INODE_WINDOW, magic: INODE_MAGIC, limit };
        (self.cache.plan_windows(self.dev.block_count(), blocks, w), true)
    }

    /// Cache what the reads of [`Store::plan_inodes`] brought, and learn from windows
    /// (`windows`: the blocks they read) how dense inode blocks are.
    fn fill_inodes(&self, filled: Filled, windows: Option<u64>) {
        let alive = self.cache.fill(filled, false, |b| self.is_used(b), live_inodes);
        if let Some(read) = windows.filter(|&r| r > 0) {
            let d = alive as f64 / (read * (INODES_PER_BLOCK - 1)) as f64;
            let mut g = self.density.lock();
            g.share = (g.share + d) / 2.0;
        }
    }

    /// Plan the reads an operation put off ([`deferred::Wanted`]); done with
    /// [`Reads::read`] while nothing is held, then cached by [`Store::fill_put_off`].
    pub fn plan_put_off(&self, wanted: &[Wanted]) -> Reads {
        let mut reads = Reads::default();
        for w in wanted {
            reads.append(match w {
                Wanted::Blocks(b) => self.cache.plan_blocks(self.dev.block_count(), b),
                Wanted::Inodes(b, limit) if self.inode_readahead => self.plan_inodes(b, *limit).0,
                Wanted::Inodes(b, _) => self.cache.plan_blocks(self.dev.block_count(), b),
            });
        }
        reads
    }

    /// Blocks read from the device under an operation's locks so far (see
    /// [`MetaCache::reads_under_locks`]).
    pub fn reads_under_locks(&self) -> u64 {
        self.cache.reads_under_locks()
    }

    /// Cache what the put-off reads brought, unless device copies may have changed since
    /// they were planned (see [`MetaCache::fill`]).
    pub fn fill_put_off(&self, filled: Filled) {
        self.cache.fill(filled, true, |b| self.is_used(b), live_inodes);
    }

    /// Whether the volume records inode frees in a lazy-free tree.
    pub fn has_lazy_frees(&self) -> bool {
        self.lazy_enabled
    }

    /// The lazy-free tree's root, when the volume has one (the state block's copy).
    pub fn lazy_frees(&self) -> Option<TreeRoot> {
        *self.lazy.lock()
    }

    /// Slots of inode block `b` that are free although its used mask says otherwise.
    pub fn lazy_mask(&self, b: u64) -> u16 {
        self.lazy_masks.shard(b).get(&b).copied().unwrap_or(0)
    }

    /// Read the lazy-free records into memory (at open). A tree that cannot be read
    /// leaves records out: they then look absent, which costs slots (marked used, fsck
    /// gives them back), never a live inode.
    fn load_lazy_masks(&mut self) {
        self.lazy_masks.for_each(|s| s.clear());
        let Some(t) = self.lazy.get_mut().filter(|t| t.root != 0) else { return };
        let mut found = Vec::new();
        let r = crate::engine::btree::scan(&mut self.tx(), &t, LAZY_FREE_OWNER, 0, |k, v| {
            if let [a, b] = v {
                found.push((k, u16::from_le_bytes([*a, *b])));
            }
            true
        });
        if let Err(e) = r {
            tracing::error!("lazy-free tree: {e}");
        }
        for (b, m) in found {
            self.lazy_masks.shard(b).insert(b, m);
        }
    }
}
