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
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLockReadGuard, RwLockWriteGuard};

use super::delta::Cost;
use super::locks::{Locked, Mode};
use super::{Delta, Inner, OpenOptions, Shared, Volume};
use crate::engine::deferred;

/// Marks what a closure's callers may do to it: **run it again**, up to
/// `deferred::MAX_ROUNDS` + 1 times. A run that meets a block the cache lacks fails with
/// a miss (`Error::missed`), having let go of every lock; the block is read with nothing held, and the
/// closure runs from the start (docs/DESIGN.md, "No lock across a metadata read"). So it
/// must change nothing before its last read, and compute the same thing from the same
/// state each time. Every closure handed to [`Volume::unlocked_reads`],
/// [`Volume::reading`] or a `Volume::charged*` cost function has one of these types.
pub(super) trait Retried<T>: FnMut() -> Result<T> {}
impl<T, F: FnMut() -> Result<T>> Retried<T> for F {}

/// A read-only operation over locked inodes that may run again (see [`Retried`]).
pub(super) trait RetriedRead<T>: Fn(&mut dyn MetaRead, &Seen) -> Result<T> {}
impl<T, F: Fn(&mut dyn MetaRead, &Seen) -> Result<T>> RetriedRead<T> for F {}

/// An operation's cost function, which may run again (see [`Retried`]): the worst case
/// it reserves, and what it read to compute it.
pub(super) trait RetriedCost<T>: Fn(&Inner) -> Result<(Cost, T)> {}
impl<T, F: Fn(&Inner) -> Result<(Cost, T)>> RetriedCost<T> for F {}
use crate::engine::leaf::LEAF_KINDS;
pub use crate::engine::leaf::LEAF_NAMES as LEAF_LOCK_NAMES;
use crate::engine::store::MetaRead;
use crate::error::Result;

/// Totals of the volume's volume-wide locks since the volume was opened: the volume lock
/// (held exclusively by commits' snapshots, flushes and what must see the volume at rest;
/// shared by every front-end operation) and the leaf locks (the space map, the inodes'
/// lives, the lazy-free tree, ...). An operation's *serial* time, what bounds how far it
/// scales across cores, is its waits for the volume lock and its time on leaf locks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockStats {
    /// Times the volume lock was taken exclusively.
    pub acquisitions: u64,
    /// Time spent waiting to take it exclusively, summed over all callers.
    pub waited: Duration,
    /// Time it was held exclusively, summed.
    pub held: Duration,
    /// The longest it was held exclusively at once (what every operation may have to
    /// wait behind: a commit's snapshot at worst).
    pub held_longest: Duration,
    /// The longest an operation waited to share it (and for its inode locks).
    pub shared_waited_longest: Duration,
    /// The longest an operation held it shared.
    pub shared_held_longest: Duration,
    /// Operations run (each shares the volume lock with the others).
    pub shared_acquisitions: u64,
    /// Time operations spent waiting to share it (for a snapshot to finish), summed.
    pub shared_waited: Duration,
    /// Time operations held it shared, summed (they do not exclude each other).
    pub shared_held: Duration,
    /// Times a volume-wide leaf lock was taken.
    pub leaf_acquisitions: u64,
    /// Time spent waiting for leaf locks, summed.
    pub leaf_waited: Duration,
    /// Time leaf locks were held, summed.
    pub leaf_held: Duration,
    /// `leaf_held` split by lock, in the order of [`LEAF_LOCK_NAMES`].
    pub leaf_held_by: [Duration; LEAF_KINDS],
}

/// Where an operation's metadata reads went, since the volume was opened: a block missing
/// from the cache is read with nothing held and the operation started again, or, where
/// it has already changed something (or missed three times), read under its locks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Blocks read from the device while an operation held its locks (a commit about to
    /// seal its delta waits for such a read).
    pub under_locks: u64,
    /// Times an operation let go of its locks to read what it missed, and started again.
    pub put_off_rounds: u64,
    /// Blocks those rounds read (with nothing held).
    pub put_off_blocks: u64,
}

impl LockStats {
    /// The difference from an earlier reading.
    pub fn since(&self, earlier: LockStats) -> LockStats {
        LockStats {
            acquisitions: self.acquisitions - earlier.acquisitions,
            waited: self.waited.saturating_sub(earlier.waited),
            held: self.held.saturating_sub(earlier.held),
            held_longest: self.held_longest,
            shared_waited_longest: self.shared_waited_longest,
            shared_held_longest: self.shared_held_longest,
            shared_acquisitions: self.shared_acquisitions - earlier.shared_acquisitions,
            shared_waited: self.shared_waited.saturating_sub(earlier.shared_waited),
            shared_held: self.shared_held.saturating_sub(earlier.shared_held),
            leaf_acquisitions: self.leaf_acquisitions - earlier.leaf_acquisitions,
            leaf_waited: self.leaf_waited.saturating_sub(earlier.leaf_waited),
            leaf_held: self.leaf_held.saturating_sub(earlier.leaf_held),
            leaf_held_by: std::array::from_fn(|k| self.leaf_held_by[k].saturating_sub(earlier.leaf_held_by[k])),
        }
    }
}

#[derive(Default)]
pub(super) struct LockCounters {
    /// Whether to time at all (`OpenOptions::measure_lock`).
    pub(super) enabled: bool,
    /// Whether to take linearization stamps (`OpenOptions::linearization_stamps`).
    stamping: bool,
    acquisitions: AtomicU64,
    waited_ns: AtomicU64,
    held_ns: AtomicU64,
    held_max_ns: AtomicU64,
    shared_waited_max_ns: AtomicU64,
    shared_held_max_ns: AtomicU64,
    shared_acquisitions: AtomicU64,
    shared_waited_ns: AtomicU64,
    shared_held_ns: AtomicU64,
    /// The last linearization stamp handed out (0: none yet), alone on its line.
    stamps: crate::engine::leaf::Padded<AtomicU64>,
    /// The most log blocks (dirty metadata and bitmap blocks) one charged operation added
    /// to its delta: `OP_LOG_BLOCKS` is kept free for any one operation, so this must not
    /// pass it (a test hook: [`Volume::op_log_blocks`]).
    op_log_max: AtomicU64,
    /// Rounds of reads operations put off until they had let go (`engine::deferred`),
    /// and the blocks those rounds read.
    put_off_rounds: AtomicU64,
    put_off_blocks: AtomicU64,
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
    /// The linearization stamp of this hold.
    stamp: u64,
    /// When the lock was taken, if it is being measured.
    since: Option<Instant>,
    counters: &'a LockCounters,
}

impl LockCounters {
    pub(super) fn new(enabled: bool, stamping: bool) -> LockCounters {
        LockCounters { enabled, stamping, ..Default::default() }
    }

    /// The next linearization stamp, for a caller that holds the volume lock; it also
    /// becomes the calling thread's last stamp. Relaxed is enough: the lock orders the
    /// holders, and the counter's own modification order follows it.
    fn next_stamp(&self) -> u64 {
        if !self.stamping {
            return 0;
        }
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
    /// The linearization stamp of this hold.
    pub(super) fn stamp(&self) -> u64 {
        self.stamp
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(since) = self.since {
            let ns = since.elapsed().as_nanos() as u64;
            self.counters.held_ns.fetch_add(ns, Ordering::Relaxed);
            self.counters.held_max_ns.fetch_max(ns, Ordering::Relaxed);
        }
    }
}

/// One front-end operation's hold: the volume lock shared with the other operations, the
/// inode locks of what it reads or changes, its linearization stamp (taken while it holds
/// them all), and what it charged against the delta, given back when it ends.
pub(super) struct Op<'a> {
    guard: RwLockReadGuard<'a, Inner>,
    locks: Locked<'a>,
    stamp: u64,
    /// The cost reserved for it (see `Delta::reserve`), released at the end.
    cost: Option<Cost>,
    /// Log blocks this thread had dirtied when the operation was charged (the
    /// per-operation measure behind [`Volume::op_log_blocks`]).
    dirtied_at: Option<u64>,
    /// Blocks of the budget this thread had used up when the operation was charged.
    consumed_at: u64,
    /// When the lock was taken, if it is being measured.
    since: Option<Instant>,
    counters: &'a LockCounters,
}

impl Deref for Op<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.guard
    }
}

impl Op<'_> {
    /// Lock `ino` too (see `Locked::add`); `false` when the operation must let go of
    /// everything and start again with `ino` among the inodes it locks up front.
    #[must_use]
    pub(super) fn add(&mut self, ino: u64, mode: Mode) -> bool {
        if !self.locks.add(ino, mode) {
            return false;
        }
        // Rstat leaves its change may rewrite that no charge counted yet: start again, so
        // that the charge checks the log's room with them (seldom: a file's records are
        // its directory's, marked by the charge already).
        if self.mark_rstats(&[(ino, mode)]).unwrap_or(0) > 0 {
            return false;
        }
        // The operation now also orders against what `ino`'s lock orders.
        self.stamp = self.counters.next_stamp();
        true
    }

    /// The operation was charged `c` (reserved by the caller): it is given back, and what
    /// the operation added to the delta's log is measured, when it ends.
    pub(super) fn charged(&mut self, c: Cost) {
        self.cost = Some(c);
        self.dirtied_at = Some(crate::engine::cache::dirtied_here());
        self.consumed_at = crate::engine::space::consumed_here();
    }

    /// Let go of everything and wait until `signal` is notified (or for at most
    /// `timeout`): the operation then starts again. Whether it was notified.
    pub(super) fn wait(self, signal: &Signal, timeout: Option<Duration>) -> bool {
        let seen = signal.generation();
        self.wait_past(signal, seen, timeout)
    }

    /// As [`Op::wait`], for a notification after generation `seen`, read before the
    /// caller looked at what it waits for: a notification between that look and the wait
    /// (it can come while this operation holds its locks, as a landing's does) is not
    /// missed. An unbounded wait must use this.
    pub(super) fn wait_past(self, signal: &Signal, seen: u64, timeout: Option<Duration>) -> bool {
        drop(self);
        signal.wait_past(seen, timeout)
    }
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        deferred::leave_op();
        if let Some(c) = self.cost.take() {
            let used = crate::engine::space::consumed_here() - self.consumed_at;
            self.guard.delta.release(&self.guard.st, c, used);
        }
        if let Some(at) = self.dirtied_at {
            // Written only when it grows: a line every operation wrote would move
            // between CPUs at every operation.
            let added = crate::engine::cache::dirtied_here() - at;
            if added > self.counters.op_log_max.load(Ordering::Relaxed) {
                self.counters.op_log_max.fetch_max(added, Ordering::Relaxed);
            }
        }
        if let Some(since) = self.since {
            let ns = since.elapsed().as_nanos() as u64;
            self.counters.shared_held_ns.fetch_add(ns, Ordering::Relaxed);
            self.counters.shared_held_max_ns.fetch_max(ns, Ordering::Relaxed);
        }
    }
}

impl Volume {
    /// Take the volume lock exclusively: the commit's snapshot and what must see the whole
    /// volume at rest.
    pub(super) fn lock(&self) -> Held<'_> {
        self.s.lock()
    }

    /// Begin a front-end operation on the inodes `want`: the volume lock shared, then
    /// their inode locks (see [`Op`]).
    pub(super) fn op(&self, want: &[(u64, Mode)]) -> Op<'_> {
        let c = &self.s.lock_stats;
        let t = c.enabled.then(Instant::now);
        let guard = self.s.inner.read_inner();
        let locks = self.s.locks.lock(want);
        deferred::enter_op();
        let since = t.map(|t| {
            let now = Instant::now();
            c.shared_acquisitions.fetch_add(1, Ordering::Relaxed);
            let ns = (now - t).as_nanos() as u64;
            c.shared_waited_ns.fetch_add(ns, Ordering::Relaxed);
            c.shared_waited_max_ns.fetch_max(ns, Ordering::Relaxed);
            now
        });
        Op { guard, locks, stamp: c.next_stamp(), cost: None, dirtied_at: None, consumed_at: 0, since, counters: c }
    }

    /// How the volume lock has been used since the volume was opened (all zero unless
    /// opened with `OpenOptions::measure_lock`).
    pub fn lock_stats(&self) -> LockStats {
        let c = &self.s.lock_stats;
        let leaf = self.s.inner.read_inner().st.serial().clone();
        LockStats {
            acquisitions: c.acquisitions.load(Ordering::Relaxed),
            waited: Duration::from_nanos(c.waited_ns.load(Ordering::Relaxed)),
            held: Duration::from_nanos(c.held_ns.load(Ordering::Relaxed)),
            held_longest: Duration::from_nanos(c.held_max_ns.load(Ordering::Relaxed)),
            shared_waited_longest: Duration::from_nanos(c.shared_waited_max_ns.load(Ordering::Relaxed)),
            shared_held_longest: Duration::from_nanos(c.shared_held_max_ns.load(Ordering::Relaxed)),
            shared_acquisitions: c.shared_acquisitions.load(Ordering::Relaxed),
            shared_waited: Duration::from_nanos(c.shared_waited_ns.load(Ordering::Relaxed)),
            shared_held: Duration::from_nanos(c.shared_held_ns.load(Ordering::Relaxed)),
            leaf_acquisitions: leaf.acquisitions.load(Ordering::Relaxed),
            leaf_waited: Duration::from_nanos(leaf.waited_ns.load(Ordering::Relaxed)),
            leaf_held: Duration::from_nanos(leaf.held_ns.load(Ordering::Relaxed)),
            leaf_held_by: std::array::from_fn(|k| Duration::from_nanos(leaf.held_ns_by[k].load(Ordering::Relaxed))),
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
            let guard = self.inner.write_inner();
            return Held { guard, stamp: c.next_stamp(), since: None, counters: c };
        }
        let t = Instant::now();
        let guard = self.inner.write_inner();
        let since = Instant::now();
        c.acquisitions.fetch_add(1, Ordering::Relaxed);
        c.waited_ns.fetch_add((since - t).as_nanos() as u64, Ordering::Relaxed);
        Held { guard, stamp: c.next_stamp(), since: Some(since), counters: c }
    }
}

/// What a read-only operation sees besides the metadata it reads.
pub(super) struct Seen<'a> {
    pub(super) delta: &'a Delta,
    pub(super) opts: &'a OpenOptions,
}

impl Volume {
    /// Run an operation that only reads the volume, with the inodes `want` locked for
    /// reading (and the volume lock shared): readers of different inodes, or of one, do
    /// not wait for each other, only for writers of what they read. `f` must not change
    /// anything but what it returns: a block the cache lacks is read with nothing held,
    /// and `f` runs again (see [`Volume::unlocked_reads`]).
    pub(super) fn reading<T>(&self, want: &[(u64, Mode)], f: impl RetriedRead<T>) -> Result<T> {
        self.unlocked_reads(|| {
            let op = self.op(want);
            let r = f(&mut op.st.tx(), &op.seen());
            r
        })
    }

    /// Run `f`, an operation that only reads (or the part of one before it changes
    /// anything), with its cache misses put off (`engine::deferred`): each time it fails
    /// with a miss (`Error::missed`) it has let go of all it held; what it missed is read, with nothing
    /// held, and it runs again. Reads it noted but did not wait for (readahead) are done
    /// after it, also with nothing held.
    pub(super) fn unlocked_reads<T>(&self, mut f: impl Retried<T>) -> Result<T> {
        let r = loop {
            match deferred::defer_misses(&mut f) {
                Err(e) if e.is_missed() => {
                    if let Err(e) = self.read_put_off() {
                        break Err(e);
                    }
                }
                r => break r,
            }
        };
        deferred::rounds_done();
        // Readahead noted and not waited for is read now, unless `f` handed its hold
        // back to the caller (taking the volume lock again while holding it could wait
        // behind a queued commit that waits for us): then it is dropped.
        if r.is_ok() && !deferred::in_op() {
            // Only a speed-up: a block it cannot read fails its own later access.
            if let Err(e) = self.read_wanted() {
                tracing::debug!("readahead: {e}");
            }
        } else {
            deferred::take_wanted();
        }
        r
    }

    /// What this thread's operation missed, read with nothing held before it starts
    /// again (one round: see `engine::deferred`). The caller has let go of everything.
    pub(super) fn read_put_off(&self) -> Result<()> {
        deferred::next_round();
        self.s.lock_stats.put_off_rounds.fetch_add(1, Ordering::Relaxed);
        self.read_wanted()
    }

    /// Read the blocks this thread noted as wanted (the volume lock is shared only to
    /// plan the reads and to cache what they brought, not during them).
    fn read_wanted(&self) -> Result<()> {
        debug_assert!(!deferred::in_op(), "put-off reads done while an operation holds its locks");
        let wanted = deferred::take_wanted();
        if wanted.is_empty() {
            return Ok(());
        }
        let reads = self.s.inner.read_inner().st.plan_put_off(&wanted);
        if reads.is_empty() {
            return Ok(());
        }
        self.s.lock_stats.put_off_blocks.fetch_add(reads.blocks(), Ordering::Relaxed);
        let filled = reads.read(&*self.s.dev)?;
        self.s.inner.read_inner().st.fill_put_off(filled);
        Ok(())
    }

    /// Where operations' metadata reads went (see [`ReadStats`]).
    pub fn read_stats(&self) -> ReadStats {
        let c = &self.s.lock_stats;
        ReadStats {
            under_locks: self.s.inner.read_inner().st.reads_under_locks(),
            put_off_rounds: c.put_off_rounds.load(Ordering::Relaxed),
            put_off_blocks: c.put_off_blocks.load(Ordering::Relaxed),
        }
    }
}

impl Inner {
    /// What a reader sees besides the metadata it reads.
    pub(super) fn seen(&self) -> Seen<'_> {
        Seen { delta: &self.delta, opts: &self.opts }
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
    /// The notifications so far (see [`Op::wait_past`]).
    pub(super) fn generation(&self) -> u64 {
        *self.generation.lock()
    }

    /// Wait until a notification after generation `seen`, or for at most `timeout`;
    /// whether one came.
    fn wait_past(&self, seen: u64, timeout: Option<Duration>) -> bool {
        let mut g = self.generation.lock();
        let deadline = timeout.map(|t| Instant::now() + t);
        while *g == seen {
            match deadline {
                Some(d) => {
                    if self.cv.wait_until(&mut g, d).timed_out() {
                        return *g != seen;
                    }
                }
                None => self.cv.wait(&mut g),
            }
        }
        true
    }

    /// Wake every waiter.
    pub(super) fn notify_all(&self) {
        *self.generation.lock() += 1;
        self.cv.notify_all();
    }
}
