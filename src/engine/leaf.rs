//! Leaf locks: the small locks at the bottom of the lock order, held for a few steps and
//! nested only among themselves, in the order docs/DESIGN.md gives ("Concurrency"). Two
//! kinds:
//!
//! - [`Sharded`]: a table split into shards by key, each behind its own lock, for the
//!   per-block and per-inode tables every operation touches, so two threads seldom meet.
//! - [`Leaf`]: one volume-wide lock (the space map, the inodes' lives, the lazy-free
//!   tree), measured: with [`Serial::enabled`] on, the time spent waiting for it and
//!   holding it is summed, the serial part of an operation that bounds how far it scales
//!   across cores (issue 14's Amdahl projection, `examples/engine_bench.rs`).

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};

/// Shards of a [`Sharded`] table.
const SHARDS: usize = 16;

/// Which of `n` shards (or stripes) `key` belongs to: a multiplicative hash, so keys
/// that come in runs (block and inode numbers) spread evenly.
pub(crate) fn shard_index(key: u64, n: usize) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % n
}

/// `T` (a map or set keyed by `u64`) in [`SHARDS`] shards. Keys that differ only in
/// their low `run` bits share a shard (neighbouring blocks, or inodes of one directory's
/// region), so one thread's work stays in few shards (see the cache's `shard_of`).
pub(crate) struct Sharded<T> {
    shards: Box<[Padded<Mutex<T>>]>,
    run: u32,
}

impl<T: Default> Sharded<T> {
    /// A table whose keys share a shard in runs of `2^run`.
    pub(crate) fn new(run: u32) -> Sharded<T> {
        Sharded { shards: (0..SHARDS).map(|_| Padded(Mutex::new(T::default()))).collect(), run }
    }

    /// The shard of `key`, locked.
    pub(crate) fn shard(&self, key: u64) -> MutexGuard<'_, T> {
        self.shards[shard_index(key >> self.run, SHARDS)].lock()
    }

    /// Every shard in turn, each locked while `f` runs (not one moment of the table).
    pub(crate) fn each_locked(&self, mut f: impl FnMut(&mut T)) {
        for s in self.shards.iter() {
            f(&mut s.0.lock());
        }
    }

    /// Every shard, for a holder of the whole table.
    pub(crate) fn for_each(&mut self, mut f: impl FnMut(&mut T)) {
        for s in self.shards.iter_mut() {
            f(s.0.get_mut());
        }
    }
}

/// The volume-wide leaf locks, each measured on its own as well (which one an operation's
/// serial time goes to is what to make finer next).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafKind {
    /// The space map.
    Space,
    /// The inodes' lives (unlinked inodes still held, the orphan list).
    Life,
    /// The lazy-free tree.
    LazyFree,
    /// The xattr sharing hints.
    XattrHints,
    /// The inode block shared by directories without reservation.
    SharedInodeBlock,
    /// The inode table's density estimate.
    Density,
    /// Directory readahead.
    Readahead,
    /// The cross-directory rename mutex.
    Rename,
    /// The rstat tree.
    Rstats,
}

/// How many [`LeafKind`]s there are.
pub(crate) const LEAF_KINDS: usize = 9;

/// The names of the volume-wide leaf locks, in the order of `LeafKind` (the index of a lock
/// in `LockStats::leaf_held_by`).
pub const LEAF_NAMES: [&str; LEAF_KINDS] = [
    "space map",
    "lives",
    "lazy-free tree",
    "xattr hints",
    "shared inode block",
    "density",
    "readahead",
    "rename",
    "rstat tree",
];

/// Time spent on the volume-wide leaf locks of one volume (all zero unless enabled).
#[derive(Default)]
pub struct Serial {
    /// Measure (a switch for benchmarks: reading the clock twice per lock costs).
    pub enabled: AtomicBool,
    pub acquisitions: AtomicU64,
    pub waited_ns: AtomicU64,
    pub held_ns: AtomicU64,
    /// `held_ns` split by lock ([`LeafKind`] as index).
    pub held_ns_by: [AtomicU64; LEAF_KINDS],
    /// `acquisitions` split by lock.
    pub acquisitions_by: [AtomicU64; LEAF_KINDS],
}

thread_local! {
    /// Cache blocks this thread's store handles hold (see `store::Tx`).
    static GUARDS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A store handle of this thread took a cache block.
pub(crate) fn guard_taken() {
    GUARDS.with(|g| g.set(g.get() + 1));
}

/// A store handle of this thread let a cache block go.
pub(crate) fn guard_dropped() {
    GUARDS.with(|g| g.set(g.get() - 1));
}

/// Cache blocks this thread's store handles hold: must be none whenever the thread takes
/// a lock above the cache's (debug builds check, at every [`Leaf`] and region lock).
pub(crate) fn guards_held() -> usize {
    GUARDS.with(|g| g.get())
}

/// A volume-wide leaf lock, measured (see the module doc); alone on its cache lines.
pub struct Leaf<T> {
    m: Padded<Mutex<T>>,
    kind: LeafKind,
    serial: Arc<Serial>,
}

/// A held [`Leaf`].
pub struct LeafGuard<'a, T> {
    g: MutexGuard<'a, T>,
    since: Option<Instant>,
    kind: LeafKind,
    serial: &'a Serial,
}

impl<T> Leaf<T> {
    pub fn new(kind: LeafKind, value: T, serial: Arc<Serial>) -> Leaf<T> {
        Leaf { m: Padded(Mutex::new(value)), kind, serial }
    }

    pub fn lock(&self) -> LeafGuard<'_, T> {
        debug_assert_eq!(guards_held(), 0, "a leaf lock taken while a cache block is held");
        let s = &*self.serial;
        if !s.enabled.load(Ordering::Relaxed) {
            return LeafGuard { g: self.m.lock(), since: None, kind: self.kind, serial: s };
        }
        let t = Instant::now();
        let g = self.m.lock();
        let since = Instant::now();
        s.acquisitions.fetch_add(1, Ordering::Relaxed);
        s.acquisitions_by[self.kind as usize].fetch_add(1, Ordering::Relaxed);
        s.waited_ns.fetch_add((since - t).as_nanos() as u64, Ordering::Relaxed);
        LeafGuard { g, since: Some(since), kind: self.kind, serial: s }
    }

    /// The value, for a holder of the whole lock's owner.
    pub fn get_mut(&mut self) -> &mut T {
        self.m.0.get_mut()
    }
}

impl<T> Deref for LeafGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.g
    }
}

impl<T> DerefMut for LeafGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.g
    }
}

impl<T> Drop for LeafGuard<'_, T> {
    fn drop(&mut self) {
        if let Some(t) = self.since {
            let ns = t.elapsed().as_nanos() as u64;
            self.serial.held_ns.fetch_add(ns, Ordering::Relaxed);
            self.serial.held_ns_by[self.kind as usize].fetch_add(ns, Ordering::Relaxed);
        }
    }
}

/// Slots of [`SlotCounter`]s: threads spread over them in the order they first use one.
pub(crate) const SLOTS: usize = 16;

static NEXT_SLOT: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static SLOT: usize = (NEXT_SLOT.fetch_add(1, Ordering::Relaxed) as usize) % SLOTS;
}

/// This thread's slot (see [`SlotCounter`]).
pub(crate) fn slot() -> usize {
    SLOT.with(|s| *s)
}

/// A value alone on its cache line(s): what one thread writes often must not share a line
/// with what others read or write, or the line moves between CPUs at every write.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Padded<T>(pub T);

impl<T> Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A counter split into per-thread slots, each on its own cache line: adding touches only
/// the adding thread's line, reading sums them all (for counters read far less often than
/// changed: an inode count read at a commit, the log room of operations in flight).
pub(crate) struct SlotCounter {
    slots: Box<[Padded<std::sync::atomic::AtomicI64>]>,
}

impl SlotCounter {
    /// A counter starting at `start`.
    pub(crate) fn new(start: i64) -> SlotCounter {
        let c = SlotCounter { slots: (0..SLOTS).map(|_| Padded::default()).collect() };
        c.slots[0].store(start, Ordering::Relaxed);
        c
    }

    pub(crate) fn add(&self, n: i64) {
        // SeqCst: a thread that adds, then sums, must see every add that came before the
        // other threads' sums saw its own (operations checking the room they share).
        self.slots[slot()].fetch_add(n, Ordering::SeqCst);
    }

    /// The sum over the slots (exact when nothing changes meanwhile).
    pub(crate) fn sum(&self) -> i64 {
        self.slots.iter().map(|s| s.load(Ordering::SeqCst)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_lock_counts_its_time_under_its_own_name() {
        let serial = Arc::new(Serial::default());
        serial.enabled.store(true, Ordering::Relaxed);
        let lives = Leaf::new(LeafKind::Life, 0u32, serial.clone());
        let space = Leaf::new(LeafKind::Space, 0u32, serial.clone());
        {
            let mut g = lives.lock();
            *g += 1;
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        drop(space.lock());
        let by = |k: LeafKind| serial.held_ns_by[k as usize].load(Ordering::Relaxed);
        assert!(by(LeafKind::Life) >= 2_000_000, "held {} ns", by(LeafKind::Life));
        assert!(by(LeafKind::Space) < by(LeafKind::Life));
        assert_eq!(serial.acquisitions_by[LeafKind::Life as usize].load(Ordering::Relaxed), 1);
        assert_eq!(serial.acquisitions_by[LeafKind::Space as usize].load(Ordering::Relaxed), 1);
        let total: u64 = serial.held_ns_by.iter().map(|n| n.load(Ordering::Relaxed)).sum();
        assert_eq!(total, serial.held_ns.load(Ordering::Relaxed));
        assert_eq!(LEAF_NAMES[LeafKind::Life as usize], "lives");
        assert_eq!(LEAF_NAMES[LeafKind::Rename as usize], "rename");
    }
}
