//! Charging an operation to the delta: before it changes anything, an operation reserves
//! its worst case (`delta::cost`); when that does not fit it waits for a flush, a commit's
//! snapshot or the operations beside it to settle, or commits, or fails with ENOSPC. And
//! readers of a file's data wait until its written-back pages have landed.

use crate::error::{Error, Result};

use super::contention::{Op, RetriedCost};
use super::delta::{Cost, Short};
use super::*;
use crate::engine::deferred;
use crate::engine::space::Claim;

thread_local! {
    /// Set while a [`Volume::try_write`] runs: a charge that would wait for room in the
    /// delta (a flush's progress, a commit's snapshot or a landing) fails with
    /// an internal error (`Error::would_wait`) instead, before anything is changed.
    static NO_WAIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set while [`Volume::unless_it_waits_for_requests`] runs: the thread serves requests,
    /// so it must not wait for files unlinked moments ago to be let go (their FORGET or
    /// RELEASE is a request that only the serving threads deliver).
    static SERVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `SERVING` set for this thread until dropped (the previous value is restored).
struct Serving(bool);

impl Serving {
    fn set() -> Serving {
        Serving(SERVING.with(|c| c.replace(true)))
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        SERVING.with(|c| c.set(self.0));
    }
}

/// Before a wait for room: fails with an internal error (`Error::would_wait`) when this thread's operation
/// must not wait (see `NO_WAIT`).
fn may_wait() -> Result<()> {
    if NO_WAIT.with(|c| c.get()) {
        return Err(Error::would_wait());
    }
    Ok(())
}

/// `NO_WAIT` set for this thread until dropped.
pub(super) struct NoWait(());

impl NoWait {
    pub(super) fn set() -> NoWait {
        NO_WAIT.with(|c| c.set(true));
        NoWait(())
    }
}

impl Drop for NoWait {
    fn drop(&mut self) {
        NO_WAIT.with(|c| c.set(false));
    }
}

/// How many times an operation short of space waits for the operations beside it to give
/// back what they reserved (20 µs each) before it commits or fails.
const SETTLE_WAITS: u32 = 500;

/// How often a change tries a commit stalled for want of room again.
const STALL_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

impl Volume {
    /// Begin an operation on `want` that reads file `ino`'s data: as [`Volume::op`], but
    /// first waiting (with nothing held) until no commit or flush is writing that file's
    /// data back (its extent map may point at blocks not written yet).
    pub(super) fn op_landed(&self, want: &[(u64, Mode)], ino: u64) -> Result<Op<'_>> {
        loop {
            // Read before looking: a landing after the look is a notification after it.
            let seen = self.s.landed.generation();
            let op = self.op(want);
            if !op.delta.in_flight(ino) {
                return Ok(op);
            }
            self.stalled_data()?;
            op.wait_past(&self.s.landed, seen, None);
            if self.s.inner.read_inner().is_failed() {
                return Err(Error::Failed);
            }
        }
    }

    /// Begin a change of the inodes `want` whose cost `cost` computes: reserve it in the
    /// current delta; if the delta cannot take it, commit and try again; fail with ENOSPC
    /// only when a fresh delta still cannot.
    pub(super) fn charged(&self, want: &[(u64, Mode)], cost: impl Fn(&Inner) -> Result<Cost>) -> Result<Op<'_>> {
        self.charged_with(want, |g| Ok((cost(g)?, ()))).map(|(g, ())| g)
    }

    /// [`Volume::charged`] for a change that reads file `ino`'s data (a partial page, a
    /// truncated tail): it also waits until a commit's write-back of that file has landed.
    pub(super) fn charged_on(
        &self,
        ino: u64,
        want: &[(u64, Mode)],
        cost: impl Fn(&Inner) -> Result<Cost>,
    ) -> Result<Op<'_>> {
        self.charged_on_with(ino, want, |g| Ok((cost(g)?, ()))).map(|(g, ())| g)
    }

    /// [`Volume::charged_on`], also handing back what the cost function read.
    pub(super) fn charged_on_with<T>(
        &self,
        ino: u64,
        want: &[(u64, Mode)],
        cost: impl RetriedCost<T>,
    ) -> Result<(Op<'_>, T)> {
        loop {
            let seen = self.s.landed.generation();
            let (op, read) = self.charged_with(want, &cost)?;
            if !op.delta.in_flight(ino) {
                return Ok((op, read));
            }
            self.stalled_data()?;
            may_wait()?;
            // Everything is let go while waiting, so the charge is made again.
            op.wait_past(&self.s.landed, seen, None);
        }
    }

    /// [`Volume::charged`], also handing back what the cost function read (typically the
    /// decoded inodes), so the operation does not read them again.
    pub(super) fn charged_with<T>(&self, want: &[(u64, Mode)], cost: impl RetriedCost<T>) -> Result<(Op<'_>, T)> {
        // The cost's reads are put off when they miss (`engine::deferred`); commits and
        // waits here never run twice. Inside a caller's `Volume::unlocked_reads` the
        // caller reads what was missed; otherwise this does.
        deferred::read_at_once(|outer| {
            let r = self.charge(want, cost, outer);
            if !outer {
                deferred::rounds_done();
                deferred::take_wanted();
            }
            r
        })
    }

    /// While a commit waits for the storage's room (`Shared::stall`), changes fail with
    /// ENOSPC at once; every `STALL_RETRY` one of them first has the background
    /// committer try that commit again, so the volume goes on by itself once the storage
    /// has room.
    fn storage_room(&self) -> Result<()> {
        if !self.s.storage_full.load(Ordering::Acquire) {
            return Ok(());
        }
        let due = {
            let mut t = self.s.stall_tried.lock();
            let due = t.elapsed() >= STALL_RETRY;
            if due {
                *t = std::time::Instant::now();
            }
            due
        };
        if due {
            may_wait()?;
            self.commit_soon()?;
        }
        if self.s.storage_full.load(Ordering::Acquire) {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// A file's data that waits with a stalled commit (its overwrites in place, written
    /// only after the commit) cannot be read until the storage has room: ENOSPC rather
    /// than a wait of unknown length.
    fn stalled_data(&self) -> Result<()> {
        if self.s.storage_full.load(Ordering::Acquire) {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// ENOSPC for the operation `op` — unless files lost their last link moments ago
    /// while their holder held them or they were open: their blocks come back when the
    /// holder's FORGET or the last RELEASE arrives, right behind the unlink. Then, once
    /// per operation (`settled`), everything is let go, those are waited for, and the
    /// caller tries again.
    fn out_of_space(&self, op: Op<'_>, settled: &mut bool) -> Result<()> {
        let recent = !*settled && !op.life.lock().unlinked_at.is_empty();
        drop(op);
        if !recent {
            return Err(Error::NoSpace);
        }
        may_wait()?;
        if SERVING.with(|c| c.get()) {
            return Err(Error::would_wait());
        }
        *settled = true;
        self.settle_unlinked();
        Ok(())
    }

    /// Run `f` as a thread that serves requests must: an operation that would wait for
    /// files unlinked moments ago to be let go (for the FORGET or RELEASE that only such
    /// threads deliver) stops before it changes anything, and the answer is `None`: run it
    /// again where waiting is allowed. An operation that runs in steps (a large write, a
    /// preallocation) may have done some of them; running it again does them again, to
    /// the same effect.
    pub fn unless_it_waits_for_requests<T>(&self, f: impl FnOnce(&Volume) -> Result<T>) -> Result<Option<T>> {
        let _serving = Serving::set();
        match f(self) {
            Err(e) if e.is_would_wait() => Ok(None),
            r => r.map(Some),
        }
    }

    fn charge<T>(&self, want: &[(u64, Mode)], cost: impl RetriedCost<T>, outer: bool) -> Result<(Op<'_>, T)> {
        let mut commits = 0;
        let mut waits = 0;
        let mut settled = false;
        let mut quota_committed = false;
        loop {
            self.storage_room()?;
            let mut op = self.op(want);
            op.check_writable()?;
            // The rstat records the change may rewrite are marked before its room is
            // checked: their leaves count against the log's room (`Inner::mark_rstats`).
            let (c, read, quota) = match deferred::defer_misses(|| {
                let (c, r) = cost(&op)?;
                op.mark_rstats(want)?;
                // A change that may allocate is charged to the quotas above it.
                let quota = match c.claim {
                    Claim::Deletion => Vec::new(),
                    _ if c.meta + c.pages == 0 => Vec::new(),
                    _ => op.quota_roots(want)?,
                };
                Ok::<_, Error>((c, r, quota))
            }) {
                Err(e) if e.is_missed() && !outer => {
                    drop(op);
                    self.read_put_off()?;
                    continue;
                }
                r => r?,
            };
            let blocks = c.meta + c.pages;
            // A cache's write-back carries data its writer was told is written: counted,
            // never refused (the FUSE server sends writers past the cache near a limit).
            if !quota.is_empty() && !op.quota_charge(&quota, blocks, c.claim == Claim::WriteBack) {
                let changed = !op.delta.is_empty(&op.st);
                drop(op);
                // What the quota counts may have been freed since the last snapshot, or
                // over-counted: commit once, and judge by the exact use.
                if quota_committed || !changed {
                    return Err(Error::QuotaExceeded);
                }
                may_wait()?;
                self.commit()?;
                quota_committed = true;
                continue;
            }
            let r = op.delta.reserve(&op.st, c, 1);
            if r.is_err() && !quota.is_empty() {
                op.quota_uncharge(&quota, blocks);
            }
            match r {
                Ok(()) => {
                    op.charged(c);
                    return Ok((op, read));
                }
                Err(Short::Space) if !op.st.space().could_fit_after_commit(c.meta + c.pages, c.claim) => {
                    self.out_of_space(op, &mut settled)?
                }
                // Operations running beside this one reserved their worst cases and give
                // back what they do not use: when that could make room, wait for them
                // rather than commit or fail (a serial order would have seen it free).
                Err(Short::Space) if waits < SETTLE_WAITS && op.st.space().reserved() > 0 => {
                    drop(op);
                    may_wait()?;
                    waits += 1;
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
                Err(Short::Space) if commits > 0 && op.st.space().deferred() == 0 => {
                    self.out_of_space(op, &mut settled)?
                }
                Err(Short::Space) if commits >= 3 => self.out_of_space(op, &mut settled)?,
                // Other threads may fill the delta again between our commit and our retry,
                // so a full delta proves nothing: only a log smaller than one operation's
                // room does. (Each retry follows a commit of their changes, so they make
                // progress.)
                Err(Short::Never) => return Err(Error::corrupt("an operation does not fit in an empty delta")),
                // Dirty data past the limit while a commit is writing: take up to twice
                // the limit rather than wait for that commit, and have the next one
                // start as soon as it ends.
                Err(Short::Dirty) if commits == 0 && self.committing() && op.delta.fits(&op.st, c, 2).is_ok() => {
                    let pages = self.s.in_flight_pages.load(Ordering::Acquire);
                    let runs = self.s.in_flight_runs.load(Ordering::Acquire);
                    if op.delta.room_beside(c, pages, runs) {
                        if op.delta.reserve(&op.st, c, 2).is_ok() {
                            // Charged again: the quota's charge went back with the
                            // first try (nothing was snapshotted since, under `op`).
                            op.quota_charge(&quota, blocks, true);
                            self.s.ask_background();
                            op.charged(c);
                            return Ok((op, read));
                        }
                        continue;
                    }
                    may_wait()?;
                    // Wait for a piece of the commit's data to reach the device (its
                    // pages are then freed), and try again.
                    op.wait(&self.s.landed, Some(std::time::Duration::from_millis(10)));
                }
                // Dirty data past the limit: a flush ahead of the commit makes room as
                // soon as it has written back (at most 32 MiB in 512 runs), sooner than a
                // commit would. Wait for it, while it makes progress.
                Err(Short::Dirty) if commits == 0 && op.delta.wants_flush(&op.st) && self.s.ask_flush() => {
                    may_wait()?;
                    let flushes = op.delta.flushes();
                    let notified = op.wait(&self.s.landed, Some(std::time::Duration::from_millis(10)));
                    // A flush still writing its data is progress: committing instead
                    // would make this writer wait for a snapshot of every dirty page,
                    // hundreds of milliseconds behind a full delta.
                    let busy = notified || self.s.flushing.load(Ordering::Acquire);
                    let stuck = !busy && {
                        let g = self.s.inner.read_inner();
                        g.delta.flushes() == flushes && g.delta.fits(&g.st, c, 1).is_err()
                    };
                    if stuck {
                        self.commit_soon()?;
                        commits += 1;
                    }
                }
                // A full delta only needs to be snapshotted to make room; the space
                // budget needs the commit's frees, which come at its end.
                Err(Short::Delta | Short::Dirty) if commits == 0 => {
                    drop(op);
                    may_wait()?;
                    self.commit_soon()?;
                    commits += 1;
                }
                Err(_) => {
                    drop(op);
                    may_wait()?;
                    self.commit()?;
                    commits += 1;
                }
            }
        }
    }
}
