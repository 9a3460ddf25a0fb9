//! The metadata block cache: verified blocks in memory, dirty tracking for the current
//! delta, bounded memory for clean blocks, and sorted, coalesced batch reads.
//!
//! Only metadata passes through here; file data goes straight to the device. Every block
//! read from the device is checked (crc32c and self address) before it is cached.
//!
//! The cache is shared by every thread of the volume: it is split into shards by block
//! number, each a map behind its own reader-writer lock, so threads working on different
//! blocks rarely meet. A block is handed out as a guard of its shard's lock
//! ([`BlockRef`] to read, [`BlockMut`] to change): callers hold it only while they look
//! at the block and take no other lock meanwhile (the store's `Tx` keeps at most one),
//! so shard locks are leaves of the lock order. Which thread may *change* a block is not
//! the cache's business: the owner's inode lock decides that (docs/DESIGN.md,
//! "Concurrency"). A block missing from the cache is read from the device with no lock
//! held and inserted unless another thread inserted it first.
//!
//! Blocks freed by the delta being built or by the one being committed stay *tombstoned*
//! here until that delta is durable: their device copies still verify, but whatever they
//! held is gone, so a stale reference to one (an old inode number) reads as gone
//! ([`MetaCache::get_live`]) instead of being cached again.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{MappedRwLockReadGuard, MappedRwLockWriteGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use rustc_hash::FxHashMap;

use crate::disk::codec::*;
use crate::disk::device::BlockDevice;
use crate::engine::deferred::{self, Wanted};
use crate::engine::leaf::{shard_index, Padded};

mod reads;
use crate::error::{Error, Result};
pub(crate) use reads::{Filled, Reads, Windows};

/// Largest number of blocks one coalesced read fetches.
const MAX_BATCH: usize = 64;
/// Widest gap of unwanted blocks a coalesced read bridges.
const MAX_GAP: u64 = 8;
/// Bytes of coalesced reads handed to the device as one batch ([`BlockDevice::read_many`]:
/// concurrent on a device that can have many requests in flight).
const BATCH_BYTES: usize = 8 << 20;
/// Shards of the cache: enough that two threads seldom want the same one at once.
const SHARDS: usize = 64;

thread_local! {
    /// Log blocks this thread has added to deltas (see [`dirtied_here`]).
    static DIRTIED: Cell<u64> = const { Cell::new(0) };
}

/// Log blocks this thread has added to deltas so far: metadata blocks it made dirty, and
/// bitmap blocks its allocations and frees will have the commit rewrite. The difference
/// across one operation is what that operation added (what `OP_LOG_BLOCKS` must bound),
/// whatever other threads added meanwhile.
pub(crate) fn dirtied_here() -> u64 {
    DIRTIED.with(|d| d.get())
}

/// Count one more log block added by this thread.
pub(crate) fn note_dirtied() {
    DIRTIED.with(|d| d.set(d.get() + 1));
}

/// A cached block, borrowed for reading: its shard stays read-locked while this lives.
pub(crate) type BlockRef<'a> = MappedRwLockReadGuard<'a, Block>;
/// A cached block, borrowed for changing: its shard stays write-locked while this lives.
pub(crate) type BlockMut<'a> = MappedRwLockWriteGuard<'a, Block>;

struct Cached {
    data: Box<Block>,
    dirty: bool,
    /// Part of a committed delta whose home write may not have happened yet: the device
    /// copy is stale, so the block must stay in memory until `landed`.
    in_flight: bool,
}

impl Cached {
    /// `data`, clean: its device copy is current.
    fn clean(data: Box<Block>) -> Cached {
        Cached { data, dirty: false, in_flight: false }
    }

    /// A zeroed, clean block.
    fn blank() -> Cached {
        Cached::clean(Box::new([0u8; BLOCK_SIZE]))
    }
}

/// Which delta freed a tombstoned block.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Freed {
    /// The delta being built.
    Current,
    /// The delta being committed.
    InFlight,
}

#[derive(Default)]
struct Shard {
    // Fx: block numbers need no DoS-resistant hashing, and this is the hottest map: every
    // access costs exactly one probe (the dirty flag lives beside the block).
    blocks: FxHashMap<u64, Cached>,
    /// Blocks made dirty in this delta, in first-dirtied order (may name blocks that were
    /// forgotten since; `take_dirty` skips those).
    dirty_list: Vec<u64>,
    /// Dirty blocks in `blocks`.
    dirty: usize,
    /// Metadata blocks freed and not yet durable as free (see the module doc).
    freed: FxHashMap<u64, Freed>,
}

/// Cached metadata blocks.
pub struct MetaCache {
    shards: Box<[Padded<RwLock<Shard>>]>,
    /// Dirty blocks over all shards.
    dirty_count: AtomicUsize,
    /// Clean blocks each shard keeps before eviction starts.
    shard_capacity: usize,
    /// Per shard, bumped whenever device copies of its blocks may have changed under the
    /// cache (a delta landed home, frees became real, the cache was reset): a block read
    /// with no lock held is kept only if its shard's did not move meanwhile (see
    /// [`MetaCache::fill`]).
    gens: Box<[AtomicU64]>,
    /// Blocks read from the device while the reading thread held an operation's locks
    /// (see [`deferred::in_op`]): what a commit may have had to wait for.
    reads_under_locks: AtomicU64,
}

/// Blocks in a row that share a shard.
const SHARD_RUN: u32 = 6;

/// The shard of block `b`: runs of 64 neighbouring blocks share one, runs spread by a
/// hash. A directory's inode region and index blocks lie close together, so an operation
/// works mostly in one or two shards and threads in different directories mostly in
/// different ones: a shard's lock word then stays in one CPU's cache instead of moving
/// between CPUs at every block (spreading single blocks made two threads creating in
/// directories of their own 1.2–1.7× one instead of 1.6–2×).
fn shard_of(b: u64) -> usize {
    shard_index(b >> SHARD_RUN, SHARDS)
}

fn check_magic(b: &Block, blockno: u64, want: Option<u32>) -> Result<()> {
    match want {
        Some(m) if magic(b) != m => {
            Err(Error::corrupt(format!("block {blockno}: magic {:#010x}, expected {m:#010x}", magic(b))))
        }
        _ => Ok(()),
    }
}

fn read_verified(dev: &dyn BlockDevice, blockno: u64) -> Result<Box<Block>> {
    if blockno >= dev.block_count() {
        return Err(Error::corrupt(format!("reference to block {blockno} beyond the volume")));
    }
    let mut b = Box::new([0u8; BLOCK_SIZE]);
    dev.read(blockno, &mut b[..])?;
    verify(&b, blockno, None)?;
    Ok(b)
}

/// A block the lock guarantees is there has gone: cannot happen, reported rather than
/// panicking.
fn vanished(blockno: u64) -> Error {
    Error::corrupt(format!("block {blockno} left the cache while locked"))
}

impl Shard {
    /// Cache `data` as block `b` unless the block is already there (another thread read
    /// it first, or changed it since): evicts clean blocks first when the shard is full.
    fn insert_clean(&mut self, b: u64, data: Box<Block>, capacity: usize) {
        if self.blocks.contains_key(&b) {
            return;
        }
        let keep = capacity + self.dirty;
        if self.blocks.len() >= keep {
            self.evict(keep);
        }
        self.blocks.insert(b, Cached::clean(data));
    }

    /// Make block `b` (cached) dirty in the current delta.
    fn mark_dirty(&mut self, b: u64, count: &AtomicUsize) {
        if let Some(c) = self.blocks.get_mut(&b) {
            if !c.dirty {
                c.dirty = true;
                self.dirty += 1;
                self.dirty_list.push(b);
                count.fetch_add(1, Ordering::Relaxed);
                note_dirtied();
            }
        }
    }

    /// Drop clean blocks until the shard holds a quarter less than `keep`; which ones is
    /// left to the hash order, which is as good as random for a metadata cache.
    fn evict(&mut self, keep: usize) {
        let mut excess = self.blocks.len().saturating_sub(keep * 3 / 4);
        self.blocks.retain(|_, c| {
            if excess == 0 || c.dirty || c.in_flight {
                true
            } else {
                excess -= 1;
                false
            }
        });
    }
}

impl MetaCache {
    pub fn new(capacity: usize) -> MetaCache {
        MetaCache {
            shards: (0..SHARDS).map(|_| Padded(RwLock::new(Shard::default()))).collect(),
            dirty_count: AtomicUsize::new(0),
            shard_capacity: capacity.max(64).div_ceil(SHARDS),
            gens: (0..SHARDS).map(|_| AtomicU64::new(0)).collect(),
            reads_under_locks: AtomicU64::new(0),
        }
    }

    fn shard(&self, b: u64) -> &RwLock<Shard> {
        &self.shards[shard_of(b)]
    }

    /// A verified block, with its magic checked when `want` is given; read from the
    /// device (with no lock held) on a miss. A tombstoned block is `NotFound`.
    pub fn get(&self, dev: &dyn BlockDevice, blockno: u64, want: Option<u32>) -> Result<BlockRef<'_>> {
        // A block freed by a delta that is not yet durable holds nothing any more.
        self.get_live(dev, blockno, want)?.ok_or(Error::NotFound)
    }

    /// [`MetaCache::get`], or `None` for a block freed in a delta that is not yet durable
    /// (see the module doc): its device copy is stale.
    pub fn get_live(&self, dev: &dyn BlockDevice, blockno: u64, want: Option<u32>) -> Result<Option<BlockRef<'_>>> {
        {
            let s = self.shard(blockno).read();
            if s.freed.contains_key(&blockno) {
                return Ok(None);
            }
            if let Ok(r) = RwLockReadGuard::try_map(s, |s| s.blocks.get(&blockno).map(|c| &*c.data)) {
                check_magic(&r, blockno, want)?;
                return Ok(Some(r));
            }
        }
        if deferred::deferring() {
            return Err(deferred::missed(blockno));
        }
        self.count_read(1);
        let data = read_verified(dev, blockno)?;
        let mut s = self.shard(blockno).write();
        if s.freed.contains_key(&blockno) {
            return Ok(None);
        }
        s.insert_clean(blockno, data, self.shard_capacity);
        let s = RwLockWriteGuard::downgrade(s);
        let r =
            RwLockReadGuard::try_map(s, |s| s.blocks.get(&blockno).map(|c| &*c.data)).map_err(|_| vanished(blockno))?;
        check_magic(&r, blockno, want)?;
        Ok(Some(r))
    }

    /// A block if it is cached (with its magic checked when `want` is given); never
    /// reads. `Some(Ok(None))` for a tombstoned block. (An inode read looks here first:
    /// on a miss it reads the block's whole window.)
    pub fn peek(&self, blockno: u64, want: Option<u32>) -> Option<Result<Option<BlockRef<'_>>>> {
        let s = self.shard(blockno).read();
        if s.freed.contains_key(&blockno) {
            return Some(Ok(None));
        }
        let r = RwLockReadGuard::try_map(s, |s| s.blocks.get(&blockno).map(|c| &*c.data)).ok()?;
        Some(check_magic(&r, blockno, want).map(|()| Some(r)))
    }

    /// A verified block for modification; it joins the current delta's dirty set.
    pub fn get_mut(&self, dev: &dyn BlockDevice, blockno: u64, want: Option<u32>) -> Result<BlockMut<'_>> {
        let mut s = self.shard(blockno).write();
        if !s.blocks.contains_key(&blockno) {
            drop(s);
            if deferred::deferring() {
                return Err(deferred::missed(blockno));
            }
            self.count_read(1);
            let data = read_verified(dev, blockno)?;
            s = self.shard(blockno).write();
            if s.freed.contains_key(&blockno) {
                return Err(Error::NotFound);
            }
            s.insert_clean(blockno, data, self.shard_capacity);
        }
        match s.blocks.get(&blockno) {
            Some(c) => check_magic(&c.data, blockno, want)?,
            None => return Err(vanished(blockno)),
        }
        s.mark_dirty(blockno, &self.dirty_count);
        RwLockWriteGuard::try_map(s, |s| s.blocks.get_mut(&blockno).map(|c| &mut *c.data))
            .map_err(|_| vanished(blockno))
    }

    /// A block that is being (re)initialised: zeroed and dirty, no read.
    pub fn fresh(&self, blockno: u64) -> BlockMut<'_> {
        let count = &self.dirty_count;
        RwLockWriteGuard::map(self.shard(blockno).write(), |s| {
            s.freed.remove(&blockno);
            s.blocks.entry(blockno).or_insert_with(Cached::blank);
            s.mark_dirty(blockno, count);
            let c = s.blocks.entry(blockno).or_insert_with(Cached::blank);
            c.data.fill(0);
            &mut *c.data
        })
    }

    /// Hold a block image that is newer than the device's copy (read-only log
    /// overlay); it is verified and never evicted.
    pub fn pin(&self, blockno: u64, img: Box<Block>) -> Result<()> {
        verify(&img, blockno, None)?;
        let mut s = self.shard(blockno).write();
        self.bump_gen(shard_of(blockno));
        if !s.blocks.get(&blockno).is_some_and(|c| c.dirty) {
            s.dirty += 1;
            s.dirty_list.push(blockno);
            self.dirty_count.fetch_add(1, Ordering::Relaxed);
        }
        s.blocks.insert(blockno, Cached { data: img, dirty: true, in_flight: false });
        Ok(())
    }

    /// Drop a block: it must not be written back.
    pub fn forget(&self, blockno: u64) {
        let mut s = self.shard(blockno).write();
        if let Some(c) = s.blocks.remove(&blockno) {
            if c.dirty {
                s.dirty -= 1;
                self.dirty_count.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Drop a block freed by the current delta and tombstone it until the delta is
    /// durable ([`MetaCache::freed_to_flight`], [`MetaCache::flight_landed`]).
    pub fn free(&self, blockno: u64) {
        self.forget(blockno);
        self.shard(blockno).write().freed.insert(blockno, Freed::Current);
    }

    /// Whether a block is tombstoned (freed, not yet durably).
    pub fn is_freed(&self, blockno: u64) -> bool {
        self.shard(blockno).read().freed.contains_key(&blockno)
    }

    /// The delta being built goes in flight: its tombstones go with it.
    pub fn freed_to_flight(&mut self) {
        for s in self.shards.iter_mut() {
            for f in s.0.get_mut().freed.values_mut() {
                *f = Freed::InFlight;
            }
        }
    }

    /// The delta in flight is durable: its freed blocks are free, tombstones gone.
    pub fn flight_landed(&self) {
        for (k, s) in self.shards.iter().enumerate() {
            let mut s = s.write();
            if s.freed.values().any(|f| *f == Freed::InFlight) {
                self.bump_gen(k);
                s.freed.retain(|_, f| *f != Freed::InFlight);
            }
        }
    }

    /// The delta being built was committed with its frees released at once (mid
    /// write-back): its tombstones go.
    pub fn forget_freed(&self) {
        for (k, s) in self.shards.iter().enumerate() {
            let mut s = s.write();
            if s.freed.values().any(|f| *f == Freed::Current) {
                self.bump_gen(k);
                s.freed.retain(|_, f| *f != Freed::Current);
            }
        }
    }

    /// Whether the block is dirty in the current delta.
    pub fn is_dirty(&self, blockno: u64) -> bool {
        self.shard(blockno).read().blocks.get(&blockno).is_some_and(|c| c.dirty)
    }

    /// Whether the block is in memory.
    pub fn contains(&self, blockno: u64) -> bool {
        self.shard(blockno).read().blocks.contains_key(&blockno)
    }

    /// The first of `len` blocks from `start` held in memory as live metadata (read or
    /// written, not freed), looking at each shard once.
    pub fn first_held(&self, start: u64, len: u64) -> Option<u64> {
        let end = start.saturating_add(len);
        let mut b = start;
        while b < end {
            // Shards hold runs of neighbouring blocks: one lock per run.
            let run_end = ((b >> SHARD_RUN) + 1).saturating_mul(1 << SHARD_RUN).min(end);
            let s = self.shard(b).read();
            if let Some(x) = (b..run_end).find(|x| s.blocks.contains_key(x)) {
                return Some(x);
            }
            b = run_end;
        }
        None
    }

    /// Whether the block is in memory or tombstoned: either way not to be read again.
    fn known(&self, blockno: u64) -> bool {
        let s = self.shard(blockno).read();
        s.blocks.contains_key(&blockno) || s.freed.contains_key(&blockno)
    }

    /// Device copies of shard `k`'s blocks may change now (see the field `gens`): done
    /// with the shard write-locked, before the change is visible.
    fn bump_gen(&self, k: usize) {
        self.gens[k].fetch_add(1, Ordering::SeqCst);
    }

    /// Device copies of any block may have changed (the cache is reset).
    fn bump_all_gens(&self) {
        for k in 0..SHARDS {
            self.bump_gen(k);
        }
    }

    /// Where device copies stand now, per shard (see [`MetaCache::fill`]).
    fn gens_now(&self) -> Vec<u64> {
        self.gens.iter().map(|g| g.load(Ordering::SeqCst)).collect()
    }

    /// Number of dirty blocks in the current delta.
    pub fn dirty_count(&self) -> usize {
        self.dirty_count.load(Ordering::Relaxed)
    }

    /// Seal every dirty block (address + crc) and hand the set over, ascending. The
    /// blocks stay cached, now clean.
    pub fn take_dirty(&mut self) -> Vec<(u64, Box<Block>)> {
        let mut out = Vec::with_capacity(self.dirty_count());
        for s in self.shards.iter_mut() {
            let s = s.0.get_mut();
            for b in std::mem::take(&mut s.dirty_list) {
                if let Some(c) = s.blocks.get_mut(&b) {
                    if c.dirty {
                        c.dirty = false;
                        c.in_flight = true;
                        seal(&mut c.data, b);
                        out.push((b, c.data.clone()));
                    }
                }
            }
            s.dirty = 0;
        }
        out.sort_unstable_by_key(|(b, _)| *b);
        *self.dirty_count.get_mut() = 0;
        out
    }

    /// The blocks of a commit are home on the device: they may be evicted again.
    pub fn landed(&self, blocks: &[(u64, Box<Block>)]) {
        for (b, _) in blocks {
            let k = shard_of(*b);
            let mut s = self.shards[k].write();
            if let Some(c) = s.blocks.get_mut(b) {
                self.bump_gen(k);
                c.in_flight = false;
            }
        }
    }

    /// Forget every block (e.g. after a failed commit, to reload the committed state).
    pub fn clear(&mut self) {
        self.bump_all_gens();
        for s in self.shards.iter_mut() {
            let s = s.0.get_mut();
            s.blocks.clear();
            s.dirty_list.clear();
            s.dirty = 0;
        }
        *self.dirty_count.get_mut() = 0;
    }

    /// Drop every clean block that is not in flight (what eviction may drop): their
    /// device copies are current.
    pub fn drop_clean(&self) {
        for s in self.shards.iter() {
            s.write().blocks.retain(|_, c| c.dirty || c.in_flight);
        }
    }

    /// Blocks in memory (tests of the bound).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().blocks.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::device::MemDevice;

    /// A device of `n` blocks whose first `sealed` blocks hold valid metadata with magic
    /// `m` (the rest are zeros, which fail verification).
    fn device(n: u64, sealed: u64, m: u32) -> MemDevice {
        let dev = MemDevice::new(n);
        for b in 0..sealed {
            let mut blk = [0u8; BLOCK_SIZE];
            put_u32(&mut blk, 0, m);
            seal(&mut blk, b);
            dev.write(b, &blk).unwrap();
        }
        dev
    }

    #[test]
    fn verifies_dirty_tracks_and_evicts_only_clean() {
        let dev = device(4096, 4000, 0xABCD);
        let mut c = MetaCache::new(640);
        assert!(c.get(&dev, 3, Some(0xABCD)).is_ok());
        assert!(c.get(&dev, 3, Some(0x1111)).is_err(), "wrong magic must be refused");
        c.get_mut(&dev, 5, Some(0xABCD)).unwrap()[100] = 9;
        for b in 0..4000 {
            drop(c.get(&dev, b, None).unwrap());
        }
        // Each shard keeps its share of the capacity (10 blocks) plus its dirty ones.
        assert!(c.len() <= 640 + SHARDS, "cache exceeded its bound: {}", c.len());
        assert_eq!(c.get(&dev, 5, None).unwrap()[100], 9, "dirty block was evicted");
        let d = c.take_dirty();
        assert_eq!(d.len(), 1);
        verify(&d[0].1, 5, Some(0xABCD)).unwrap();
        // Unwritten block 4050 is zeros: fails verification.
        assert!(c.get(&dev, 4050, None).is_err());
        assert!(c.get(&dev, 10_000, None).is_err());
    }

    #[test]
    fn prefetch_coalesces_adjacent_blocks() {
        let dev = device(64, 64, 1);
        let c = MetaCache::new(1000);
        let before = dev.stats().reads;
        c.prefetch(&dev, &[12, 10, 11, 30, 31, 50]).unwrap();
        assert_eq!(dev.stats().reads - before, 3, "three runs, three requests");
        let before = dev.stats().reads;
        drop(c.get(&dev, 31, None).unwrap());
        assert_eq!(dev.stats().reads, before, "prefetched block read again");
    }

    #[test]
    fn freed_blocks_read_as_gone_until_durable() {
        let dev = device(64, 64, 1);
        let mut c = MetaCache::new(1000);
        drop(c.get(&dev, 7, None).unwrap());
        c.free(7);
        assert!(c.get_live(&dev, 7, None).unwrap().is_none(), "freed in the delta being built");
        c.prefetch(&dev, &[7]).unwrap();
        assert!(!c.contains(7), "a prefetch does not bring a freed block back");
        c.freed_to_flight();
        assert!(c.get_live(&dev, 7, None).unwrap().is_none(), "freed by the delta in flight");
        c.forget_freed();
        assert!(c.is_freed(7), "only the current delta's tombstones went");
        c.flight_landed();
        assert!(c.get_live(&dev, 7, None).unwrap().is_some(), "durable: the block is an ordinary one again");
    }

    #[test]
    fn a_read_done_unlocked_is_dropped_if_its_block_changed_home_meanwhile() {
        let dev = device(256, 256, 1);
        let mut c = MetaCache::new(64 * SHARDS);
        // A reader plans and reads block 9 with nothing held...
        let stale = c.plan_blocks(dev.block_count(), &[9]).read(&dev).unwrap();
        // ...while another thread changes it, a commit writes it home, and it is evicted.
        c.get_mut(&dev, 9, None).unwrap()[100] = 7;
        let home = c.take_dirty();
        for (b, blk) in &home {
            dev.write(*b, &blk[..]).unwrap();
        }
        c.landed(&home);
        c.drop_clean();
        c.fill(stale, true, |_| true, |_| 0);
        assert_eq!(c.get(&dev, 9, None).unwrap()[100], 7, "a stale copy was cached");
        // Unchecked (a read under the operation's locks), or with nothing landed
        // meanwhile, the read is kept.
        c.drop_clean();
        let fresh = c.plan_blocks(dev.block_count(), &[9, 10]).read(&dev).unwrap();
        c.fill(fresh, true, |_| true, |_| 0);
        assert!(c.contains(9) && c.contains(10));
        // In a deferring scope a miss is noted, not read.
        c.drop_clean();
        let before = dev.stats().reads;
        let r = deferred::defer_misses(|| c.get(&dev, 11, None).map(|_| ()));
        assert!(matches!(r, Err(ref e) if e.is_missed()));
        assert_eq!(dev.stats().reads, before, "read under a deferring scope");
        assert_eq!(deferred::take_wanted(), vec![Wanted::Blocks(vec![11])]);
    }
}
