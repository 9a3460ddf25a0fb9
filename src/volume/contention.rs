//! The volume lock, measured: how often it is taken, how long callers wait for it and
//! how long they hold it. The share of an operation's time spent holding the one
//! volume-wide lock is the serial part that bounds how far operations scale across cores
//! (Amdahl); `examples/engine_bench.rs --threads T` reports it.

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
}

/// The volume lock, held; the hold time is recorded when it drops.
pub(super) struct Held<'a> {
    guard: MutexGuard<'a, Inner>,
    /// When the lock was taken, if it is being measured.
    since: Option<Instant>,
    counters: &'a LockCounters,
}

impl LockCounters {
    pub(super) fn new(enabled: bool) -> LockCounters {
        LockCounters { enabled, ..Default::default() }
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
}

impl Shared {
    /// Take the volume lock (the only way the volume's state is reached).
    pub(super) fn lock(&self) -> Held<'_> {
        let c = &self.lock_stats;
        if !c.enabled {
            return Held { guard: self.inner.lock(), since: None, counters: c };
        }
        let t = Instant::now();
        let guard = self.inner.lock();
        let since = Instant::now();
        c.acquisitions.fetch_add(1, Ordering::Relaxed);
        c.waited_ns.fetch_add((since - t).as_nanos() as u64, Ordering::Relaxed);
        Held { guard, since: Some(since), counters: c }
    }
}
