//! The metadata store: device, block cache and free space bundled for the layers above,
//! plus the inode table (inode records, their allocation and placement, seed 002).
//!
//! Inode numbers are addresses: `ino = block * 16 + slot`, slot 0 of every inode block
//! being its header. A directory reserves a region of inode blocks next to its own inode;
//! its children take slots from that region in creation order, and when it is full the
//! next region (twice as large, up to 64 blocks) is allocated close by.

use std::sync::Arc;

use crate::disk::codec::*;
use crate::disk::device::BlockDevice;
use crate::disk::format::*;
use crate::engine::btree::{NodeRead, NodeStore};
use crate::engine::cache::{MetaCache, Windows};
use crate::engine::log::Journal;
use crate::engine::space::Space;
use crate::error::{Error, Result};

/// Device + cache + space: everything below the inode layer.
pub struct Store {
    dev: Arc<dyn BlockDevice>,
    cache: MetaCache,
    pub space: Space,
    pub sb: Superblock,
    /// Use directory inode reservation (A/B switch; on by default).
    pub reserve_regions: bool,
    /// Recently stored shareable xattr blocks by content hash (a hint, checked on use).
    pub xattr_shared: BlockHints,
    /// Xattr lists read from xattr blocks (not inline): what the bloom filter saves.
    pub xattr_block_reads: std::sync::atomic::AtomicU64,
    /// Without reservation: the inode block new inodes currently go to.
    pub shared_inode_block: Option<u64>,
    /// Metadata blocks freed in the current delta, and in the delta being committed: a
    /// stale inode number pointing into one is NotFound, not a checksum error.
    freed_meta: rustc_hash::FxHashSet<u64>,
    freed_in_flight: rustc_hash::FxHashSet<u64>,
    /// Inodes stored (`put_inode`) since the last snapshot: every change to a file or
    /// directory stores its inode (times, size, links), so an inode not here has nothing
    /// in the delta being built (an fsync of it need not commit).
    changed_inodes: rustc_hash::FxHashSet<u64>,
    /// Read an uncached inode block together with its aligned window of inode blocks
    /// (off unless the volume's sorted prefetch is on).
    pub inode_readahead: bool,
    /// The lazy-free tree (inode block → slots freed but still marked used there), when
    /// the volume has the LAZY_INODE_FREE feature. The state block carries its root.
    pub lazy_frees: Option<TreeRoot>,
    /// The lazy-free tree's records, in memory: an inode read checks here instead of in
    /// the tree (a tree lookup doubled the cost of a cached getattr). Kept equal to the
    /// tree by every change to it.
    lazy_masks: rustc_hash::FxHashMap<u64, u16>,
    /// Running share of live inode slots in the windows read lately: windows pay only
    /// when most of what they bring in is live (a directory thinned to 1% is not).
    inode_density: f64,
    /// Prefetch sweeps so far (block mode samples windows again now and then).
    inode_sweeps: u64,
}

/// The engine of an opened volume: its log (recovered), the store (cache and free
/// space) and the state block.
pub struct Opened {
    pub journal: Journal,
    pub store: Store,
    pub state: State,
}

/// The engine's one open sequence, shared by `Volume::open` and fsck: recover the log —
/// replaying its newest delta on the device when `apply`, else overlaying it in the cache
/// (pinned: a read-only open never writes) — then load free space and read the state
/// block.
pub fn open(
    dev: Arc<dyn BlockDevice>,
    sb: Superblock,
    apply: bool,
    cache_blocks: usize,
    reserve_regions: bool,
    allow_rollback: bool,
) -> Result<Opened> {
    let o = open_lenient(dev, sb, apply, cache_blocks, reserve_regions, allow_rollback)?;
    if let Some(e) = o.damage.into_iter().next() {
        return Err(e);
    }
    Ok(o.opened)
}

/// What a lenient open found damaged besides what it opened.
pub struct LenientOpen {
    pub opened: Opened,
    /// The free-space map could not be read: `opened.store` holds a map with every block
    /// in use (nothing can be allocated from it). The tree can rebuild it (fsck).
    pub bitmap_damaged: bool,
    /// The state block could not be read: `opened.state` holds a state with no orphans
    /// and no inode count. The tree can rebuild it (fsck).
    pub state_damaged: bool,
    /// The errors behind the damage, in the order found.
    pub damage: Vec<Error>,
}

/// [`open`] that gets past a damaged free-space map or state block, both derivable from
/// the tree: fsck rebuilds them, and a read-only open still reads the namespace.
pub fn open_lenient(
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
    let (journal, replay) = Journal::recover(&*dev, sb.layout, false)?;
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
    let mut cache = MetaCache::new(cache_blocks);
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
    let mut damage = Vec::new();
    let space = match Space::load(&*dev, &mut cache, sb.layout) {
        Ok(s) => s,
        Err(e @ Error::Corrupt(_)) => {
            damage.push(context("free-space map", e));
            Space::all_used(sb.layout)
        }
        Err(e) => return Err(e),
    };
    let bitmap_damaged = !damage.is_empty();
    let state = match cache.get(&*dev, STATE_BLOCK, Some(STATE_MAGIC)) {
        Ok(b) => State::decode(b),
        Err(e @ Error::Corrupt(_)) => {
            damage.push(context("state block", e));
            State {
                orphan_head: 0,
                next_generation: 1,
                commit_seq: journal.seq,
                inodes: 0,
                lazy_frees: TreeRoot::default(),
            }
        }
        Err(e) => return Err(e),
    };
    let state_damaged = damage.len() > usize::from(bitmap_damaged);
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
    let mut store = Store::new(dev, cache, space, sb, reserve_regions);
    store.lazy_frees = lazy.then_some(state.lazy_frees);
    store.load_lazy_masks();
    Ok(LenientOpen { opened: Opened { journal, store, state }, bitmap_damaged, state_damaged, damage })
}

/// Say which structure a corruption was found in.
fn context(what: &str, e: Error) -> Error {
    match e {
        Error::Corrupt(m) => Error::Corrupt(format!("{what}: {m}")),
        e => e,
    }
}

/// Xattr blocks remembered for sharing: enough for the distinct lists of a working set
/// (ACL-heavy trees have a handful), few enough that the index stays small.
pub const XATTR_SHARE_HINTS: usize = 4096;

/// A bounded map of hints from a content hash to the block holding that content, kept
/// both ways so a freed block's hint goes in O(1). Hints are checked on use, so one that
/// is evicted (oldest first) or stale costs only a missed chance to share.
pub struct BlockHints {
    by_hash: rustc_hash::FxHashMap<u64, u64>,
    by_block: rustc_hash::FxHashMap<u64, u64>,
    /// Hashes in insertion order, for eviction; may hold hashes already gone.
    order: std::collections::VecDeque<u64>,
    cap: usize,
}

impl BlockHints {
    pub fn new(cap: usize) -> BlockHints {
        BlockHints {
            by_hash: Default::default(),
            by_block: Default::default(),
            order: Default::default(),
            cap: cap.max(1),
        }
    }

    /// The block last recorded for `hash`.
    pub fn get(&self, hash: u64) -> Option<u64> {
        self.by_hash.get(&hash).copied()
    }

    /// Number of hints held (at most the capacity).
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether no hint is held.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// Remember that `block` holds the content of `hash`, evicting the oldest hint past
    /// the capacity.
    pub fn insert(&mut self, hash: u64, block: u64) {
        self.forget_hash(hash);
        self.forget_block(block);
        self.by_hash.insert(hash, block);
        self.by_block.insert(block, hash);
        self.order.push_back(hash);
        while self.by_hash.len() > self.cap {
            match self.order.pop_front() {
                Some(h) => self.forget_hash(h),
                None => break,
            }
        }
        if self.order.len() > 2 * self.cap {
            // Drop the queue's entries for hints already gone (amortised O(1)).
            let live = &self.by_hash;
            self.order.retain(|h| live.contains_key(h));
        }
    }

    pub fn forget_hash(&mut self, hash: u64) {
        if let Some(b) = self.by_hash.remove(&hash) {
            self.by_block.remove(&b);
        }
    }

    pub fn forget_block(&mut self, block: u64) {
        if let Some(h) = self.by_block.remove(&block) {
            self.by_hash.remove(&h);
        }
    }
}

/// Free blocks (beyond the reserve) below which inode frees are written into their
/// blocks rather than recorded in the lazy-free tree, which may need a new node.
const LAZY_FREE_MIN_AVAILABLE: u64 = 64;

/// Below this share of live slots in recent windows, inode blocks are read one by one.
const WINDOW_MIN_DENSITY: f64 = 0.25;

/// Inode blocks read together on a miss (128 KiB), as ext4 reads its inode tables.
pub const INODE_WINDOW: u64 = 32;

/// Reading metadata: through the [`Store`] itself, which reads what the cache lacks, or
/// through a [`CacheView`], which sees only what is cached and so needs no exclusive
/// access (threads that share the volume lock read through it at the same time).
pub trait MetaRead: NodeRead {
    /// The store: superblock, space map, lazy-free records.
    fn store(&self) -> &Store;
    /// A verified metadata block, its magic checked when `want` is given.
    fn block(&mut self, b: u64, want: Option<u32>) -> Result<&Block>;
    /// Called before inode block `b` is read: the store reads its window ahead.
    fn before_inode_block(&mut self, _b: u64) -> Result<()> {
        Ok(())
    }
    /// Whether a block was not there to read ([`CacheView`]): the error that came of it
    /// is not the block's fault, and the work will be done again.
    fn missed(&self) -> bool {
        false
    }
}

impl MetaRead for Store {
    fn store(&self) -> &Store {
        self
    }
    fn block(&mut self, b: u64, want: Option<u32>) -> Result<&Block> {
        self.cache.get(&*self.dev, b, want)
    }
    fn before_inode_block(&mut self, b: u64) -> Result<()> {
        if self.inode_readahead && !self.cache.contains(b) {
            self.prefetch_inodes(&[b], INODE_WINDOW as usize)?;
        }
        Ok(())
    }
}

/// The store's cache, read only: a block that is not cached is not read but *missed*
/// (an error, and [`CacheView::missed`] says so), and the caller does the work again
/// through the store itself, with the volume lock held exclusively. Whatever an
/// operation computed after a miss is thrown away, so code that swallows errors (`if let
/// Ok(..)`) cannot turn a miss into a wrong answer.
pub struct CacheView<'a> {
    st: &'a Store,
    missed: bool,
}

impl<'a> CacheView<'a> {
    pub fn new(st: &'a Store) -> CacheView<'a> {
        CacheView { st, missed: false }
    }

    /// Give up: the work needs more than the cache holds (it will be done again through
    /// the store), as after a miss.
    pub fn decline(&mut self) {
        self.missed = true;
    }

    fn peek(&mut self, b: u64, want: Option<u32>) -> Result<&'a Block> {
        match self.st.cache.peek(b, want) {
            Some(r) => r,
            None => {
                self.missed = true;
                Err(Error::Io(std::io::ErrorKind::WouldBlock.into()))
            }
        }
    }
}

impl NodeRead for CacheView<'_> {
    fn node(&mut self, block: u64) -> Result<&Block> {
        self.peek(block, Some(crate::engine::btree::BTREE_MAGIC))
    }
}

impl MetaRead for CacheView<'_> {
    fn store(&self) -> &Store {
        self.st
    }
    fn block(&mut self, b: u64, want: Option<u32>) -> Result<&Block> {
        self.peek(b, want)
    }
    fn missed(&self) -> bool {
        self.missed
    }
}

/// Read an inode. A free slot or an out-of-range number is `NotFound` (a stale handle);
/// a damaged block is `Corrupt`.
pub fn read_inode(r: &mut (impl MetaRead + ?Sized), ino: u64) -> Result<Inode> {
    let (b, s) = r.store().check_ino(ino)?;
    if !r.store().space.is_used(b) || r.store().freed_pending(b) {
        return Err(Error::NotFound);
    }
    // A damaged lazy-free tree must not make every inode unreadable: no directory
    // entry names a lazily freed inode, so reading goes on as if it had no record
    // (fsck reports the tree; changes that need it fail).
    let lazy = r.store().lazy_masks.get(&b).copied().unwrap_or(0);
    r.before_inode_block(b)?;
    let blk = r.block(b, Some(INODE_MAGIC))?;
    if get_u16(blk, IB_USED) & (1 << s) == 0 {
        return Err(Error::NotFound);
    }
    let i = Inode::decode(ino, &blk[s * INODE_SIZE..(s + 1) * INODE_SIZE])?
        .ok_or_else(|| Error::corrupt(format!("inode {ino} is marked used but blank")))?;
    if lazy & (1 << s) != 0 {
        return Err(Error::NotFound);
    }
    Ok(i)
}

impl NodeRead for Store {
    fn node(&mut self, block: u64) -> Result<&Block> {
        self.cache.get(&*self.dev, block, Some(crate::engine::btree::BTREE_MAGIC))
    }
}

impl NodeStore for Store {
    fn node_mut(&mut self, block: u64) -> Result<&mut Block> {
        self.cache.get_mut(&*self.dev, block, Some(crate::engine::btree::BTREE_MAGIC))
    }
    fn alloc_node(&mut self, near: u64) -> Result<u64> {
        let b = self.space.alloc_one(near).ok_or(Error::NoSpace)?;
        put_u32(self.cache.fresh(b), 0, crate::engine::btree::BTREE_MAGIC);
        Ok(b)
    }
    fn free_node(&mut self, block: u64) -> Result<()> {
        self.free_meta(block);
        Ok(())
    }
}

impl Store {
    /// The lower layers of an opened (or new) volume.
    pub fn new(
        dev: Arc<dyn BlockDevice>,
        cache: MetaCache,
        space: Space,
        sb: Superblock,
        reserve_regions: bool,
    ) -> Store {
        Store {
            dev,
            cache,
            space,
            sb,
            reserve_regions,
            xattr_shared: BlockHints::new(XATTR_SHARE_HINTS),
            xattr_block_reads: Default::default(),
            shared_inode_block: None,
            freed_meta: Default::default(),
            changed_inodes: Default::default(),
            freed_in_flight: Default::default(),
            inode_readahead: false,
            lazy_frees: None,
            lazy_masks: Default::default(),
            inode_density: 1.0,
            inode_sweeps: 0,
        }
    }

    /// Allocate one metadata block near `goal`, zeroed and dirty.
    pub fn alloc_meta(&mut self, goal: u64) -> Result<u64> {
        let b = self.space.alloc_one(goal).ok_or(Error::NoSpace)?;
        self.cache.fresh(b);
        Ok(b)
    }

    /// A mark for counting the blocks an operation allocates and frees: net blocks in
    /// use (free + deferred frees fall when something is allocated).
    pub fn usage_mark(&self) -> u64 {
        self.space.free() + self.space.deferred()
    }

    /// Adjust an owner's block count (`inode.blocks`) by what was allocated and freed
    /// since `mark`.
    pub fn account(&self, blocks: &mut u64, mark: u64) {
        *blocks = (*blocks + mark).saturating_sub(self.usage_mark());
    }

    /// The device the volume lives on.
    pub fn dev(&self) -> &Arc<dyn BlockDevice> {
        &self.dev
    }

    /// A metadata block, read and verified (magic `want`, checksum, own address) on a miss.
    pub fn block(&mut self, b: u64, want: Option<u32>) -> Result<&Block> {
        self.cache.get(&*self.dev, b, want)
    }

    /// A metadata block to change: it joins the delta's dirty set.
    pub fn block_mut(&mut self, b: u64, want: Option<u32>) -> Result<&mut Block> {
        self.cache.get_mut(&*self.dev, b, want)
    }

    /// A zeroed dirty block for new contents, without reading the device.
    pub fn fresh_block(&mut self, b: u64) -> &mut Block {
        self.cache.fresh(b)
    }

    /// Read the uncached ones of `blocks` in one sorted sweep.
    pub fn prefetch(&mut self, blocks: &[u64]) -> Result<()> {
        self.cache.prefetch(&*self.dev, blocks)
    }

    /// Dirty metadata blocks in the delta.
    pub fn dirty_count(&self) -> usize {
        self.cache.dirty_count()
    }

    /// Seal the delta's metadata: the changed bitmap words go into their blocks, and the
    /// dirty blocks come out for the log (they stay cached, in flight, until `landed`).
    pub fn take_dirty(&mut self) -> Vec<(u64, Box<Block>)> {
        self.changed_inodes.clear();
        self.space.write_out(&mut self.cache);
        self.cache.take_dirty()
    }

    /// Blocks of a commit are durable and home.
    pub fn landed(&mut self, blocks: &[(u64, Box<Block>)]) {
        self.cache.landed(blocks)
    }

    /// Forget every clean cached block (a cold-cache start).
    pub fn clear_cache(&mut self) {
        self.cache.clear()
    }

    /// Drop the cached metadata blocks that are clean and not in flight.
    pub fn drop_clean(&mut self) {
        self.cache.drop_clean()
    }

    /// Free a metadata block at the end of the delta; its cached copy is dropped so it
    /// is never written home (a stale write could land on the block's next owner).
    pub fn free_meta(&mut self, block: u64) {
        self.cache.forget(block);
        self.space.free_deferred(block, 1);
        self.freed_meta.insert(block);
    }

    /// The delta's commit goes in flight: its freed blocks stay pending until it lands.
    pub fn freed_to_flight(&mut self) {
        self.freed_in_flight = std::mem::take(&mut self.freed_meta);
    }

    /// The commit in flight is durable and home.
    pub fn flight_landed(&mut self) {
        self.freed_in_flight.clear();
    }

    /// A delta committed synchronously (mid write-back): its frees are released.
    pub fn forget_freed(&mut self) {
        self.freed_meta.clear();
    }

    /// Whether a metadata block was freed and is waiting for its delta to become durable
    /// (still marked in use, but its contents are gone).
    fn freed_pending(&self, block: u64) -> bool {
        self.freed_meta.contains(&block) || self.freed_in_flight.contains(&block)
    }

    fn check_ino(&self, ino: u64) -> Result<(u64, usize)> {
        let (b, s) = ino_loc(ino);
        if s == 0 || b < self.sb.layout.first_free() || b >= self.sb.layout.block_count {
            return Err(Error::NotFound);
        }
        Ok((b, s))
    }

    /// Read an inode (see [`read_inode`]).
    pub fn inode(&mut self, ino: u64) -> Result<Inode> {
        read_inode(self, ino)
    }

    /// Read the inode blocks `blocks` (sorted prefetch): in aligned windows of
    /// [`INODE_WINDOW`] blocks, at most `limit` blocks, while recent windows were mostly
    /// live inodes; else block by block in one sorted, coalesced sweep, trying windows
    /// again every 16th sweep in case the density came back.
    pub fn prefetch_inodes(&mut self, blocks: &[u64], limit: usize) -> Result<()> {
        let dev = self.dev.clone();
        self.inode_sweeps += 1;
        let mut limit = limit;
        if self.inode_density < WINDOW_MIN_DENSITY {
            if self.inode_sweeps % 16 != 0 {
                return self.cache.prefetch(&*dev, blocks);
            }
            // A sample: a few windows are enough to see whether density came back.
            limit = limit.min(4 * INODE_WINDOW as usize);
        }
        let live = |b: &Block| u32::from(get_u16(b, IB_USED) & !1).count_ones();
        let space = &self.space;
        let allocated = |b: u64| space.is_used(b);
        let w = Windows { blocks: INODE_WINDOW, magic: INODE_MAGIC, limit };
        let (read, alive) = self.cache.prefetch_windows(&*dev, blocks, w, allocated, live)?;
        if read > 0 {
            let d = alive as f64 / (read * (INODES_PER_BLOCK - 1)) as f64;
            self.inode_density = (self.inode_density + d) / 2.0;
        }
        Ok(())
    }

    /// Write an inode back into its block.
    pub fn put_inode(&mut self, inode: &Inode) -> Result<()> {
        let (b, s) = self.check_ino(inode.ino)?;
        let blk = self.cache.get_mut(&*self.dev, b, Some(INODE_MAGIC))?;
        inode.encode(&mut blk[s * INODE_SIZE..(s + 1) * INODE_SIZE]);
        self.changed_inodes.insert(inode.ino);
        Ok(())
    }

    /// Whether inode `ino` was stored since the last snapshot (see `changed_inodes`).
    pub fn inode_changed(&self, ino: u64) -> bool {
        self.changed_inodes.contains(&ino)
    }

    /// Write inode block `b` anew, empty, owned by directory `owner` (fsck, for a damaged
    /// block that holds no live inode).
    pub fn blank_inode_block(&mut self, b: u64, owner: u64) {
        self.init_inode_block(b, owner);
    }

    /// Initialise a blank inode block owned by directory `owner`.
    fn init_inode_block(&mut self, b: u64, owner: u64) {
        let blk = self.cache.fresh(b);
        put_u32(blk, 0, INODE_MAGIC);
        put_u64(blk, IB_OWNER, owner);
    }

    /// mkfs: the root directory's inode, in its own block.
    pub fn alloc_root(&mut self) -> Result<u64> {
        let b = self.alloc_meta(self.sb.layout.first_free())?;
        self.init_inode_block(b, 0);
        let blk = self.cache.get_mut(&*self.dev, b, Some(INODE_MAGIC))?;
        put_u16(blk, IB_USED, 1 << 1);
        Ok(ino_of(b, 1))
    }

    /// Take a free slot in block `b`, if any.
    fn take_slot(&mut self, b: u64) -> Result<Option<u64>> {
        // The block is about to be written anyway: settle its lazy frees into it.
        let lazy = self.lazy_freed(b)?;
        if lazy != 0 {
            self.settle_lazy(b, lazy)?;
        }
        // Looked at before it is dirtied: `alloc_inode` walks a region's full blocks, and
        // dirtying each one it passes rewrote the whole region at every commit and could
        // make one create overrun the log room kept for an operation.
        let used = get_u16(self.cache.get(&*self.dev, b, Some(INODE_MAGIC))?, IB_USED) | 1; // slot 0 is the header
        if used == u16::MAX {
            return Ok(None);
        }
        let blk = self.cache.get_mut(&*self.dev, b, Some(INODE_MAGIC))?;
        let s = (!used).trailing_zeros() as u64;
        put_u16(blk, IB_USED, (used | (1 << s)) & !1);
        Ok(Some(ino_of(b, s)))
    }

    /// Allocate an inode number for a new child of `dir` (whose record the caller
    /// writes back, as its region may change). The slot is marked used; the caller
    /// writes the inode with `put_inode`.
    pub fn alloc_inode(&mut self, dir: &mut Inode) -> Result<u64> {
        let dir_ino = dir.ino;
        let dir_block = ino_loc(dir_ino).0;
        if !self.reserve_regions {
            // A/B baseline: one shared inode block at a time for the whole volume, filled
            // in creation order whatever the directory (no reservation).
            if let Some(b) = self.shared_inode_block {
                if self.space.is_used(b) {
                    if let Ok(Some(ino)) = self.take_slot(b) {
                        return Ok(ino);
                    }
                }
            }
            let b = self.space.alloc_one(0).ok_or(Error::NoSpace)?;
            self.init_inode_block(b, 0);
            self.shared_inode_block = Some(b);
            return Ok(self.take_slot(b)?.expect("fresh block has slots"));
        }
        let region_blocks = self.sb.region_blocks as u32;
        let d = dir.dir_mut()?;
        // Blocks already initialised in the current region, newest first (the oldest
        // are the likeliest to be full).
        for k in (0..d.region_used).rev() {
            let b = d.region_start + k as u64;
            if let Some(ino) = self.take_slot(b)? {
                return Ok(ino);
            }
        }
        if d.region_used == d.region_len {
            // Region full (or none yet): reserve the next one close by.
            let want = if d.region_len == 0 { region_blocks } else { (d.region_len * 2).min(MAX_REGION_BLOCKS) } as u64;
            // Near full, a region takes no more than an eighth of what is left, so
            // reservation never turns into an early ENOSPC (one block is charged).
            let want = want.min((self.space.available(false) / 8).max(1));
            let goal = if d.region_len == 0 { dir_block + 1 } else { d.region_start + d.region_len as u64 };
            let (start, len) = self.space.alloc(goal, want, 1).ok_or(Error::NoSpace)?;
            d.region_start = start;
            d.region_len = len as u32;
            d.region_used = 0;
        }
        let b = d.region_start + d.region_used as u64;
        d.region_used += 1;
        self.init_inode_block(b, dir_ino);
        Ok(self.take_slot(b)?.expect("fresh block has slots"))
    }

    /// Free an inode slot. An inode block left empty is freed unless it belongs to its
    /// owner directory's current region (which keeps its room for future children).
    ///
    /// With the LAZY_INODE_FREE feature, a block that is not already dirty in this delta
    /// is not rewritten: the slot goes into the lazy-free tree, whose leaves hold a few
    /// hundred blocks' masks. A removal that spans many deltas (`rm -rf` of a million
    /// files in hash order) then writes each partly emptied inode block at most once,
    /// when it is reused, instead of at every commit (docs/DESIGN.md, "Lazy inode frees").
    pub fn free_inode(&mut self, ino: u64) -> Result<()> {
        let (b, s) = self.check_ino(ino)?;
        let lazy = self.lazy_freed(b)? | (1 << s);
        let (used, owner) = {
            let blk = self.cache.get(&*self.dev, b, Some(INODE_MAGIC))?;
            (get_u16(blk, IB_USED), get_u64(blk, IB_OWNER))
        };
        if used & !lazy & !1 == 0 && !self.in_current_region(b, owner, ino)? {
            // Nothing live is left: the block goes, with its lazy-free record.
            if lazy != 1 << s {
                self.set_lazy_freed(b, 0)?;
            }
            self.free_meta(b);
            return Ok(());
        }
        // Recording the slot may allocate a tree node: only while space is plentiful
        // (the reserve belongs to deletions and commits), and never when the block is
        // written in this delta anyway.
        let roomy = self.space.available(false) > LAZY_FREE_MIN_AVAILABLE;
        if self.lazy_frees.is_some() && roomy && !self.cache.is_dirty(b) {
            match self.set_lazy_freed(b, lazy) {
                Err(Error::NoSpace) => {}
                r => return r,
            }
        }
        self.settle_lazy(b, lazy)
    }

    /// Whether inode block `b` (owned by directory `owner`) lies in the owner's current
    /// region. `ino` is the inode being freed, which may be the owner itself.
    fn in_current_region(&mut self, b: u64, owner: u64, ino: u64) -> Result<bool> {
        if owner == 0 || owner == ino {
            return Ok(false);
        }
        if let Ok(o) = self.inode(owner) {
            if let Ok(d) = o.dir() {
                return Ok(b >= d.region_start && b < d.region_start + d.region_used as u64);
            }
        }
        Ok(false)
    }

    /// Read the lazy-free records into memory (at open). A tree that cannot be read
    /// leaves records out: they then look absent, which costs slots (marked used, fsck
    /// gives them back), never a live inode.
    fn load_lazy_masks(&mut self) {
        self.lazy_masks.clear();
        let Some(t) = self.lazy_frees.filter(|t| t.root != 0) else { return };
        let mut found = Vec::new();
        let r = crate::engine::btree::scan(self, &t, LAZY_FREE_OWNER, 0, |k, v| {
            if let [a, b] = v {
                found.push((k, u16::from_le_bytes([*a, *b])));
            }
            true
        });
        if let Err(e) = r {
            tracing::error!("lazy-free tree: {e}");
        }
        self.lazy_masks.extend(found);
    }

    /// Slots of inode block `b` that are free although its used mask says otherwise.
    pub fn lazy_freed(&mut self, b: u64) -> Result<u16> {
        Ok(self.lazy_masks.get(&b).copied().unwrap_or(0))
    }

    /// Record `mask` as block `b`'s lazily freed slots (0 removes the record).
    fn set_lazy_freed(&mut self, b: u64, mask: u16) -> Result<()> {
        let Some(mut t) = self.lazy_frees else {
            return Err(Error::corrupt("lazy-free tree used on a volume without it"));
        };
        if mask == 0 {
            crate::engine::btree::remove(self, &mut t, LAZY_FREE_OWNER, b)?;
            self.lazy_masks.remove(&b);
        } else {
            crate::engine::btree::insert(self, &mut t, LAZY_FREE_OWNER, b, &mask.to_le_bytes(), true)?;
            self.lazy_masks.insert(b, mask);
        }
        self.lazy_frees = Some(t);
        Ok(())
    }

    /// Forget block `b`'s lazy-free record, if any (fsck, once the block's own mask is exact).
    pub fn drop_lazy_freed(&mut self, b: u64) -> Result<()> {
        if let Some(mut t) = self.lazy_frees.filter(|t| t.root != 0) {
            crate::engine::btree::remove(self, &mut t, LAZY_FREE_OWNER, b)?;
            self.lazy_frees = Some(t);
        }
        self.lazy_masks.remove(&b);
        Ok(())
    }

    /// Clear the slots `mask` in inode block `b` itself and drop its lazy-free record.
    pub fn settle_lazy(&mut self, b: u64, mask: u16) -> Result<()> {
        let had = self.lazy_freed(b)?;
        let blk = self.cache.get_mut(&*self.dev, b, Some(INODE_MAGIC))?;
        let used = get_u16(blk, IB_USED) & !(mask & !1);
        put_u16(blk, IB_USED, used);
        for s in 1..INODES_PER_BLOCK as usize {
            if mask & (1 << s) != 0 {
                blk[s * INODE_SIZE..(s + 1) * INODE_SIZE].fill(0);
            }
        }
        if had != 0 {
            self.set_lazy_freed(b, 0)?;
        }
        Ok(())
    }

    /// A directory is going away: give back the blank tail of its region and any empty
    /// initialised blocks in it.
    pub fn release_region(&mut self, d: &DirInfo) -> Result<()> {
        let tail = d.region_start + d.region_used as u64;
        if d.region_len > d.region_used {
            // Blank blocks were never written in any committed state... but they may
            // have been reserved by a committed delta, so release them with the delta.
            self.space.free_deferred(tail, (d.region_len - d.region_used) as u64);
        }
        for k in 0..d.region_used as u64 {
            let b = d.region_start + k;
            let lazy = self.lazy_freed(b)?;
            let used = get_u16(self.cache.get(&*self.dev, b, Some(INODE_MAGIC))?, IB_USED);
            if used & !lazy & !1 == 0 {
                if lazy != 0 {
                    self.set_lazy_freed(b, 0)?;
                }
                self.free_meta(b);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_hints_are_bounded_and_found_both_ways() {
        let mut h = BlockHints::new(100);
        for i in 0..10_000u64 {
            h.insert(i * 7, 1_000_000 + i);
        }
        assert_eq!(h.len(), 100, "bounded");
        assert!(h.order.len() <= 200, "the eviction queue stays bounded too");
        assert_eq!(h.get(9_999 * 7), Some(1_000_000 + 9_999), "the newest is kept");
        assert_eq!(h.get(0), None, "the oldest went");
        h.forget_block(1_000_000 + 9_999);
        assert_eq!(h.get(9_999 * 7), None, "forgotten by block");
        h.insert(5, 42);
        h.insert(6, 42);
        assert_eq!((h.get(5), h.get(6)), (None, Some(42)), "a block holds one content");
    }
}
