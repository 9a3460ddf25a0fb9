//! The volume lock, measured: how often it is taken, how long callers wait for it and
//! how long they hold it. The share of an operation's time spent holding the one
//! volume-wide lock is the serial part that bounds how far operations scale across cores
//! (Amdahl); `examples/engine_bench.rs --threads T` reports it.
//!
//! Every acquisition also takes a *linearization stamp*: the next number of a per-volume
//! counter, taken while the lock is held, so the stamps of operations that exclude each
//! other come in the order they ran. `tests/concurrent_model.rs` replays operations run
//! from many threads in stamp order against a model (docs/DESIGN.md, "Concurrency").

use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, MutexGuard};

use super::{Inner, Shared, Volume};

/// Totals of the volume lock since the volume was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockStats {
    /// Times the lock was taken.
    pub acquisitions: u64,
    /// Time spent waiting for it, summed over all callers.
    pub waited: Duration,
    /// Time it was held, summed.
    pub held: Duration,
}

impl LockStats {
    /// The difference from an earlier reading.
    pub fn since(&self, earlier: LockStats) -> LockStats {
        LockStats {
            acquisitions: self.acquisitions - earlier.acquisitions,
            waited: self.waited.saturating_sub(earlier.waited),
            held: self.held.saturating_sub(earlier.held),
        }
    }
}

#[derive(Default)]
pub(super) struct LockCounters {
    /// Whether to time at all (`OpenOptions::measure_lock`).
    pub(super) enabled: bool,
    acquisitions: AtomicU64,
    waited_ns: AtomicU64,
    held_ns: AtomicU64,
    /// The last linearization stamp handed out (0: none yet).
    stamps: AtomicU64,
    /// The most log blocks (dirty metadata and bitmap blocks) one charged operation added
    /// to its delta: `OP_LOG_BLOCKS` is kept free for any one operation, so this must not
    /// pass it (a test hook: [`Volume::op_log_blocks`]).
    op_log_max: AtomicU64,
}

thread_local! {
    /// The linearization stamp of this thread's last operation (on any volume).
    static LAST_STAMP: Cell<u64> = const { Cell::new(0) };
}

/// Record `stamp` as the linearization point of this thread's current operation.
pub(super) fn set_stamp(stamp: u64) {
    LAST_STAMP.with(|c| c.set(stamp));
}

/// The stamp last recorded on this thread (see [`Volume::last_stamp`]).
pub(super) fn current_stamp() -> u64 {
    LAST_STAMP.with(|c| c.get())
}

/// The volume lock, held; the hold time is recorded when it drops.
pub(super) struct Held<'a> {
    guard: MutexGuard<'a, Inner>,
    /// The linearization stamp of this hold (retaken after a condition-variable wait).
    stamp: u64,
    /// For a hold that an operation was charged in: the delta's log blocks then.
    charged_at: Option<usize>,
    /// When the lock was taken, if it is being measured.
    since: Option<Instant>,
    counters: &'a LockCounters,
}

impl LockCounters {
    pub(super) fn new(enabled: bool) -> LockCounters {
        LockCounters { enabled, ..Default::default() }
    }

    /// The next linearization stamp, for a caller that holds the volume lock; it also
    /// becomes the calling thread's last stamp. Relaxed is enough: the lock orders the
    /// holders, and the counter's own modification order follows it.
    fn next_stamp(&self) -> u64 {
        let s = self.stamps.fetch_add(1, Ordering::Relaxed) + 1;
        set_stamp(s);
        s
    }
}

impl Deref for Held<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.guard
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.guard
    }
}

impl Held<'_> {
    /// Release the lock until `cv` is notified (the wait is not counted as held).
    pub(super) fn wait(&mut self, cv: &Condvar) {
        self.record();
        cv.wait(&mut self.guard);
        self.since = self.since.map(|_| Instant::now());
        // Others changed the delta meanwhile: what this hold adds is no longer known.
        self.charged_at = None;
        // Others may have changed the state meanwhile: what is read from here on belongs
        // at a new point of the serial order.
        self.stamp = self.counters.next_stamp();
    }

    /// The linearization stamp of this hold.
    pub(super) fn stamp(&self) -> u64 {
        self.stamp
    }

    /// An operation was charged in this hold: from here on, what it adds to the delta's
    /// log blocks is measured (when the hold ends).
    pub(super) fn charged(&mut self) {
        self.charged_at = Some(self.log_blocks());
    }

    fn log_blocks(&self) -> usize {
        self.guard.st.dirty_count() + self.guard.st.space.pending_bitmap_blocks()
    }

    /// [`Held::wait`], for at most `timeout`.
    pub(super) fn wait_for(&mut self, cv: &Condvar, timeout: Duration) {
        self.record();
        cv.wait_for(&mut self.guard, timeout);
        self.since = self.since.map(|_| Instant::now());
    }

    fn record(&self) {
        if let Some(since) = self.since {
            self.counters.held_ns.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.record();
        if let Some(at) = self.charged_at {
            let added = self.log_blocks().saturating_sub(at) as u64;
            self.counters.op_log_max.fetch_max(added, Ordering::Relaxed);
        }
    }
}

impl Volume {
    /// Take the volume lock (the only way the volume's state is reached).
    pub(super) fn lock(&self) -> Held<'_> {
        self.s.lock()
    }

    /// How the volume lock has been used since the volume was opened (all zero unless
    /// opened with `OpenOptions::measure_lock`).
    pub fn lock_stats(&self) -> LockStats {
        let c = &self.s.lock_stats;
        LockStats {
            acquisitions: c.acquisitions.load(Ordering::Relaxed),
            waited: Duration::from_nanos(c.waited_ns.load(Ordering::Relaxed)),
            held: Duration::from_nanos(c.held_ns.load(Ordering::Relaxed)),
        }
    }

    /// Test hook (issue 14's concurrency harness, `tests/concurrent_model.rs`): the
    /// linearization stamp of the calling thread's last operation — a number taken from
    /// a per-volume counter while the operation held the volume's locks, at the point
    /// where it read or changed the state it returns or changes. Operations of several
    /// threads replayed one after another in stamp order must give the same results.
    /// Meaningless across volumes; 0 before the thread's first operation.
    #[doc(hidden)]
    pub fn last_stamp() -> u64 {
        current_stamp()
    }

    /// Test hook: the most log blocks one charged operation has added to its delta since
    /// the volume was opened, and the room kept free for one operation (`OP_LOG_BLOCKS`),
    /// which the first must not pass: past it, a delta near its commit point overruns
    /// the log and the volume fails.
    #[doc(hidden)]
    pub fn op_log_blocks(&self) -> (u64, u64) {
        (self.s.lock_stats.op_log_max.load(Ordering::Relaxed), super::OP_LOG_BLOCKS)
    }
}

impl Shared {
    /// Take the volume lock (the only way the volume's state is reached).
    pub(super) fn lock(&self) -> Held<'_> {
        let c = &self.lock_stats;
        if !c.enabled {
            let guard = self.inner.lock();
            return Held { guard, stamp: c.next_stamp(), charged_at: None, since: None, counters: c };
        }
        let t = Instant::now();
        let guard = self.inner.lock();
        let since = Instant::now();
        c.acquisitions.fetch_add(1, Ordering::Relaxed);
        c.waited_ns.fetch_add((since - t).as_nanos() as u64, Ordering::Relaxed);
        Held { guard, stamp: c.next_stamp(), charged_at: None, since: Some(since), counters: c }
    }
}
