//! The volume lock, measured: how often it is taken, how long callers wait for it and
//! how long they hold it. It is a reader-writer lock: operations that change the volume
//! hold it exclusively ([`Held`]); operations that only read it, and find what they read
//! in the cache, share it ([`Reading`], `Volume::reading`). The share of an operation's
//! time spent holding the lock exclusively or waiting for it is the serial part that
//! bounds how far operations scale across cores (Amdahl);
//! `examples/engine_bench.rs --threads T` reports it.
//!
//! Every acquisition also takes a *linearization stamp*: the next number of a per-volume
//! counter, taken while the lock is held, so the stamps of operations that exclude each
//! other come in the order they ran. `tests/concurrent_model.rs` replays operations run
//! from many threads in stamp order against a model (docs/DESIGN.md, "Concurrency").

use std::cell::Cell;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLockReadGuard, RwLockWriteGuard};

use super::{Delta, Inner, OpenOptions, Shared, Volume};
use crate::engine::store::{MetaRead, Tx};
use crate::error::Result;

/// Totals of the volume lock since the volume was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockStats {
    /// Times the lock was taken.
    pub acquisitions: u64,
    /// Time spent waiting for it, summed over all callers.
    pub waited: Duration,
    /// Time it was held, summed.
    pub held: Duration,
    /// Times it was shared by an operation that only reads (`Volume::reading`).
    pub shared_acquisitions: u64,
    /// Time readers spent waiting to share it (for a writer to finish), summed.
    pub shared_waited: Duration,
    /// Time it was held shared, summed over readers (who do not exclude each other).
    pub shared_held: Duration,
    /// Reads that found a block missing from the cache and were done again with the lock
    /// held exclusively (counted in `acquisitions` too).
    pub shared_missed: u64,
}

impl LockStats {
    /// The difference from an earlier reading.
    pub fn since(&self, earlier: LockStats) -> LockStats {
        LockStats {
            acquisitions: self.acquisitions - earlier.acquisitions,
            waited: self.waited.saturating_sub(earlier.waited),
            held: self.held.saturating_sub(earlier.held),
            shared_acquisitions: self.shared_acquisitions - earlier.shared_acquisitions,
            shared_waited: self.shared_waited.saturating_sub(earlier.shared_waited),
            shared_held: self.shared_held.saturating_sub(earlier.shared_held),
            shared_missed: self.shared_missed - earlier.shared_missed,
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
    shared_acquisitions: AtomicU64,
    shared_waited_ns: AtomicU64,
    shared_held_ns: AtomicU64,
    shared_missed: AtomicU64,
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

/// The volume lock, held exclusively; the hold time is recorded when it drops.
pub(super) struct Held<'a> {
    guard: RwLockWriteGuard<'a, Inner>,
    /// The linearization stamp of this hold (retaken after a wait on a `Signal`).
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
    /// Release the lock until `signal` is notified (the wait is not counted as held).
    pub(super) fn wait(&mut self, signal: &Signal) {
        self.record();
        let seen = signal.generation();
        RwLockWriteGuard::unlocked(&mut self.guard, || signal.wait_past(seen, None));
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
        self.guard.st.dirty_count() + self.guard.st.space().pending_bitmap_blocks()
    }

    /// [`Held::wait`], for at most `timeout`.
    pub(super) fn wait_for(&mut self, signal: &Signal, timeout: Duration) {
        self.record();
        let seen = signal.generation();
        RwLockWriteGuard::unlocked(&mut self.guard, || signal.wait_past(seen, Some(timeout)));
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
            shared_acquisitions: c.shared_acquisitions.load(Ordering::Relaxed),
            shared_waited: Duration::from_nanos(c.shared_waited_ns.load(Ordering::Relaxed)),
            shared_held: Duration::from_nanos(c.shared_held_ns.load(Ordering::Relaxed)),
            shared_missed: c.shared_missed.load(Ordering::Relaxed),
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
    /// Take the volume lock exclusively (the only way the volume's state is changed).
    pub(super) fn lock(&self) -> Held<'_> {
        let c = &self.lock_stats;
        if !c.enabled {
            let guard = self.inner.write();
            return Held { guard, stamp: c.next_stamp(), charged_at: None, since: None, counters: c };
        }
        let t = Instant::now();
        let guard = self.inner.write();
        let since = Instant::now();
        c.acquisitions.fetch_add(1, Ordering::Relaxed);
        c.waited_ns.fetch_add((since - t).as_nanos() as u64, Ordering::Relaxed);
        Held { guard, stamp: c.next_stamp(), charged_at: None, since: Some(since), counters: c }
    }

    /// Share the volume lock with other readers.
    fn read(&self) -> Reading<'_> {
        let c = &self.lock_stats;
        if !c.enabled {
            let guard = self.inner.read();
            c.next_stamp();
            return Reading { guard, since: None, counters: c };
        }
        let t = Instant::now();
        let guard = self.inner.read();
        let since = Instant::now();
        c.next_stamp();
        c.shared_acquisitions.fetch_add(1, Ordering::Relaxed);
        c.shared_waited_ns.fetch_add((since - t).as_nanos() as u64, Ordering::Relaxed);
        Reading { guard, since: Some(since), counters: c }
    }
}

/// The volume lock, shared by a reader; the hold time is recorded when it drops.
struct Reading<'a> {
    guard: RwLockReadGuard<'a, Inner>,
    since: Option<Instant>,
    counters: &'a LockCounters,
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        if let Some(since) = self.since {
            self.counters.shared_held_ns.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
}

/// What a read-only operation sees besides the metadata it reads.
pub(super) struct Seen<'a> {
    /// The volume failed (`Inner::is_failed`): file data it mapped may never have been
    /// written, so reads of file data refuse.
    pub(super) failed: bool,
    pub(super) delta: &'a Delta,
    pub(super) opts: &'a OpenOptions,
    /// Per directory, the readdir position up to which readahead was issued.
    pub(super) readahead: &'a HashMap<u64, u64>,
}

impl Volume {
    /// Run an operation that only reads the volume with the lock shared, through a view
    /// of the cache, so readers do not wait for each other. `None` if it needed a block
    /// the cache lacks, or declined (`CacheView::decline`): it must then be done with
    /// the lock held exclusively.
    pub(super) fn shared<T>(&self, f: impl FnOnce(&mut Tx, &Seen) -> Result<T>) -> Option<Result<T>> {
        let g = self.s.read();
        let inner = &*g.guard;
        let mut view = inner.st.view();
        let r = f(
            &mut view,
            &Seen { failed: inner.is_failed(), delta: &inner.delta, opts: &inner.opts, readahead: &inner.readahead },
        );
        if !view.missed() {
            return Some(r);
        }
        self.s.lock_stats.shared_missed.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Run an operation that only reads the volume: first with the lock shared
    /// ([`Volume::shared`]); if it needed a block the cache lacks, again with the lock
    /// held exclusively, through the store, which reads it (and its neighbours). `f`
    /// must not change anything but what it returns.
    pub(super) fn reading<T>(&self, f: impl Fn(&mut dyn MetaRead, &Seen) -> Result<T>) -> Result<T> {
        if let Some(r) = self.shared(|view, seen| f(view, seen)) {
            return r;
        }
        let mut g = self.lock();
        let inner = &mut *g;
        let failed = inner.is_failed();
        let r = f(
            &mut inner.st.tx(),
            &Seen { failed, delta: &inner.delta, opts: &inner.opts, readahead: &inner.readahead },
        );
        r
    }
}

/// A condition to wait for beside the volume lock (a reader-writer lock has no condition
/// variable of its own): a generation counter, bumped by every notification, so a waiter
/// that read it before releasing the volume lock cannot miss a notification made after.
#[derive(Default)]
pub(super) struct Signal {
    generation: Mutex<u64>,
    cv: Condvar,
}

impl Signal {
    fn generation(&self) -> u64 {
        *self.generation.lock()
    }

    /// Wait until a notification after generation `seen`, or for at most `timeout`.
    fn wait_past(&self, seen: u64, timeout: Option<Duration>) {
        let mut g = self.generation.lock();
        let deadline = timeout.map(|t| Instant::now() + t);
        while *g == seen {
            match deadline {
                Some(d) => {
                    if self.cv.wait_until(&mut g, d).timed_out() {
                        return;
                    }
                }
                None => self.cv.wait(&mut g),
            }
        }
    }

    /// Wake every waiter.
    pub(super) fn notify_all(&self) {
        *self.generation.lock() += 1;
        self.cv.notify_all();
    }
}
