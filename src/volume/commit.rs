//! Committing: the commit itself (write-back and snapshot under `inner`, then data, log
//! and home writes without it), the background committer that takes a full delta off
//! the front end's hands, the flusher that writes back ahead of the commit, and sync,
//! fsync and shutdown. Charging an operation (and committing when it does not fit) is
//! `charge.rs`.

use std::sync::atomic::Ordering;

use crate::disk::device::storage_full;
use crate::error::{Error, Result};
use crate::fs::file;

use super::delta::{late_refs, Flight};
use super::*;

impl Volume {
    /// Commit the current delta and wait until it is durable.
    pub(super) fn commit(&self) -> Result<()> {
        self.s.commit(|| {})
    }

    /// Start committing the current delta in the background and wait only until it is
    /// snapshotted: the caller goes on with a fresh delta while the data, the log and the
    /// home writes of the full one reach the device (what a writer that fills the delta
    /// needs; it waited for the whole commit before). A commit still running when the
    /// next one is asked for makes this wait for it first, which throttles a writer to the
    /// device's speed. Falls back to a plain commit if no thread can be started.
    pub(super) fn commit_soon(&self) -> Result<()> {
        let mut b = self.s.background.lock();
        b.requested += 1;
        let want = b.requested;
        if !b.running {
            // The previous committer has stopped serving; it is only leaving.
            if let Some(t) = b.thread.take() {
                let _ = t.join();
            }
            let s = self.s.clone();
            match std::thread::Builder::new().name("dxfs-commit".into()).spawn(move || {
                unpin();
                s.serve_background()
            }) {
                Ok(t) => b.thread = Some(t),
                Err(_) => {
                    b.requested -= 1;
                    drop(b);
                    return self.commit();
                }
            }
            b.running = true;
        }
        while b.snapshotted < want {
            self.s.background_cv.wait(&mut b);
        }
        drop(b);
        if self.s.inner.read_inner().failed.load(Ordering::Acquire) {
            return Err(Error::Failed);
        }
        Ok(())
    }

    /// Whether a background commit is under way (its thread has not stopped yet).
    pub(super) fn committing(&self) -> bool {
        self.s.background.lock().running
    }
}

impl Shared {
    /// The background committer: commit until no request is left unserved, marking each
    /// request served once its delta is snapshotted (or the commit failed).
    fn serve_background(&self) {
        loop {
            let want = {
                let mut b = self.background.lock();
                if b.snapshotted >= b.requested {
                    b.running = false;
                    self.background_cv.notify_all();
                    return;
                }
                b.requested
            };
            let served = || {
                let mut b = self.background.lock();
                b.snapshotted = b.snapshotted.max(want);
                self.background_cv.notify_all();
            };
            // A panic here (a bug, or damage the rules missed) must not leave the writers
            // and readers that wait for this commit waiting for ever: the volume fails,
            // as after a failed write, and they are woken to find it so.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.commit(served))) {
                Ok(Ok(())) => {}
                // A commit stalled for want of room said so once (`stall`).
                Ok(Err(Error::NoSpace)) if self.storage_full.load(Ordering::Acquire) => {}
                Ok(Err(e)) => tracing::error!("background commit failed: {e}"),
                Err(_) => {
                    tracing::error!("background commit panicked; no further changes will be committed");
                    self.data_done(&self.inner.read_inner(), false);
                }
            }
            // Served whether it snapshotted or failed before (a failure is in `failed`).
            served();
        }
    }

    /// Ask for a background commit without waiting for it: it starts when the one
    /// running now ends. Only called while one is running (see `committing`).
    pub(super) fn ask_background(&self) {
        let mut b = self.background.lock();
        // The running thread serves every request made before it looks again.
        if b.running {
            b.requested = b.requested.max(b.snapshotted + 1);
        }
    }

    /// Have the flusher write dirty pages back ahead of the commit, starting it if it is
    /// not running. Returns whether a flusher is (or will be) at work.
    pub(super) fn ask_flush(self: &Arc<Self>) -> bool {
        if self.flush_wanted.swap(true, Ordering::AcqRel) {
            return true;
        }
        let mut f = self.flusher.lock();
        if f.running {
            return true;
        }
        if let Some(t) = f.thread.take() {
            let _ = t.join();
        }
        let s = self.clone();
        match std::thread::Builder::new().name("dxfs-flush".into()).spawn(move || {
            unpin();
            s.serve_flush()
        }) {
            Ok(t) => {
                f.thread = Some(t);
                f.running = true;
                true
            }
            Err(_) => {
                self.flush_wanted.store(false, Ordering::Release);
                false
            }
        }
    }

    /// The flusher: flush while the delta wants it, then stop unless asked again. A
    /// writer that asks while it runs only sets `flush_wanted`; it is looked at once more,
    /// under the flusher's lock, before the thread stops.
    fn serve_flush(&self) {
        loop {
            if !self.flush_wanted.swap(false, Ordering::AcqRel) {
                let mut f = self.flusher.lock();
                if !self.flush_wanted.load(Ordering::Acquire) {
                    f.running = false;
                    return;
                }
                continue;
            }
            loop {
                match self.flush_ahead() {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        tracing::error!("write-back ahead of the commit failed: {e}");
                        break;
                    }
                }
            }
        }
    }

    /// One flush: write back some dirty pages under the volume lock (`Delta::flush_some`),
    /// then write their data without it. It holds `journal` throughout, as a commit does,
    /// so flushes and commits write to the device one at a time: a block a flush writes
    /// is never freed and written again by someone else before the flush's write is done.
    /// Returns whether the flusher should go on (see `Delta::wants_more_flushing`).
    fn flush_ahead(&self) -> Result<bool> {
        let _journal = self.journal.lock();
        let _flushing = Flushing::start(&self.flushing);
        let data = {
            let mut g = self.lock();
            // While a commit waits for the storage's room, nothing more is written ahead.
            if g.is_failed()
                || g.opts.read_only
                || self.storage_full.load(Ordering::Acquire)
                || !g.delta.wants_more_flushing(&g.st)
            {
                return Ok(false);
            }
            // As a commit: a volume left clean by `shutdown` takes its mount mark back
            // before it writes.
            if let Some(Err(e)) = g.mark.as_ref().map(|m| m.unpark()) {
                g.fail();
                return Err(e);
            }
            let g = &mut *g;
            match g.delta.flush_some(&g.st) {
                Ok(d) => d,
                Err(e) => {
                    // Readers waiting for files this flush marked in flight must not wait
                    // for a write that will not come: they find the volume failed.
                    self.data_done(g, false);
                    return Err(e);
                }
            }
        };
        if data.is_empty() {
            return Ok(false);
        }
        let wrote = file::write_runs(&*self.dev, &_journal.layout(), data, DATA_PIECE, |_, _| {});
        let g = self.inner.read_inner();
        self.data_done(&g, wrote.is_ok());
        wrote?;
        Ok(g.delta.wants_more_flushing(&g.st))
    }

    /// The data a commit or flush wrote back is on the device, or its write failed (which
    /// fails the volume): its files are no longer in flight, and their waiting readers
    /// are woken.
    fn data_done(&self, g: &Inner, written: bool) {
        g.delta.landed();
        if !written {
            g.fail();
        }
        self.landed.notify_all();
    }

    /// Wait until the flusher has stopped and its thread has exited.
    pub(super) fn wait_flusher(&self) {
        self.flush_wanted.store(false, Ordering::Release);
        let thread = self.flusher.lock().thread.take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// Wait until no background commit is running and its thread has exited: a thread
    /// that served its last request still holds the shared state, with the mount mark,
    /// until it exits (a drop that returned before could leave the device "already open
    /// in this process" for a moment, and the mark's release written after the drop).
    pub(super) fn wait_background(&self) {
        let thread = {
            let mut b = self.background.lock();
            while b.running {
                self.background_cv.wait(&mut b);
            }
            b.thread.take()
        };
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// Commit the current delta and wait until it is durable; `snapshotted` runs once the
    /// delta is snapshotted (the front end is free to go on), before the writes.
    fn commit(&self, snapshotted: impl Fn()) -> Result<()> {
        let mut journal = self.journal.lock();
        self.resume_stalled(&mut journal)?;
        let mut flight = {
            let mut g = self.lock();
            if g.is_failed() {
                return Err(Error::Failed);
            }
            if g.opts.read_only {
                return Ok(());
            }
            // A volume left clean by `shutdown` takes its mount mark back before it writes.
            if !g.delta.is_empty(&g.st) {
                if let Some(Err(e)) = g.mark.as_ref().map(|m| m.unpark()) {
                    g.fail();
                    return Err(e);
                }
            }
            let stamp = g.stamp();
            match g.prepare_commit(&mut journal, stamp) {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(()),
                Err(e) => {
                    // As a failed flush: no reader waits for data that will not be written.
                    self.data_done(&g, false);
                    return Err(e);
                }
            }
        };
        // File data, then the log and home writes, all without the volume lock: the front
        // end goes on with the next delta meanwhile. Only reads of the files being written
        // back wait, and only for their data (`wait_landed`). The data goes in pieces, each
        // freed once written, so a writer held back by the dirty limit goes on as soon as
        // a piece is on the device (`in_flight_pages`).
        let data = std::mem::take(&mut flight.data);
        let late = std::mem::take(&mut flight.late);
        let dev = self.dev.clone();
        if flight.one_flush {
            // Small data goes into the log with the metadata and home beside it, under
            // one flush; readers of those files wait until it is home.
            snapshotted();
            let logged: Vec<(u64, &[u8])> = data
                .iter()
                .flat_map(|w| w.pages.iter().enumerate().map(move |(i, p)| (w.phys + i as u64, &p[..])))
                .collect();
            let home = std::cell::Cell::new(false);
            let r = journal.commit_one_flush(&*dev, &flight.blocks, &logged, &late_refs(&late), || {
                home.set(true);
                // Overwrites in place go home only after the flush: their readers wait
                // for that (below).
                if late.is_empty() {
                    self.data_done(&self.inner.read_inner(), true);
                }
            });
            drop(logged);
            drop(data);
            if !home.get() {
                // As a failed data write: no reader waits for data that will not come.
                self.data_done(&self.inner.read_inner(), false);
            } else if !late.is_empty() && !stalls(&r) {
                self.data_done(&self.inner.read_inner(), r.is_ok());
            }
            flight.late = late;
            return self.committed(flight, r);
        }
        let pages: u64 = data.iter().map(|w| w.pages.len() as u64).sum();
        self.in_flight_pages.store(pages, Ordering::Release);
        self.in_flight_runs.store(data.len() as u64, Ordering::Release);
        snapshotted();
        let wrote = file::write_runs(&*dev, &journal.layout(), data, DATA_PIECE, |pages, runs| {
            self.in_flight_pages.fetch_sub(pages, Ordering::AcqRel);
            self.in_flight_runs.fetch_sub(runs, Ordering::AcqRel);
            self.landed.notify_all();
        });
        self.in_flight_pages.store(0, Ordering::Release);
        self.in_flight_runs.store(0, Ordering::Release);
        if late.is_empty() || wrote.is_err() {
            self.data_done(&self.inner.read_inner(), wrote.is_ok());
        }
        wrote?;
        let r = journal.commit(&*dev, &flight.blocks, &late_refs(&late));
        if !late.is_empty() && !stalls(&r) {
            // Overwrites in place are home only now.
            self.data_done(&self.inner.read_inner(), r.is_ok());
        }
        flight.late = late;
        self.committed(flight, r)
    }

    /// Commit the flight that stalled for want of room, if there is one, before anything
    /// else: it is the delta after the last committed one, and every later one builds on
    /// it. Its data is written or held (`HeldWrites`), so only the log and home writes are
    /// made again, with the same sequence number (nothing of its first try is committed:
    /// its flush or commit block failed). `Error::NoSpace` while the storage is still full.
    fn resume_stalled(&self, journal: &mut Journal) -> Result<()> {
        let Some(mut flight) = self.stalled.lock().take() else { return Ok(()) };
        *self.stall_tried.lock() = std::time::Instant::now();
        let late = std::mem::take(&mut flight.late);
        // The held writes first (a flush drains them): while the storage is still full
        // that fails at once, before the log body is written again for nothing.
        let r = self.dev.flush().and_then(|()| journal.commit(&*self.dev, &flight.blocks, &late_refs(&late)));
        if !late.is_empty() && !stalls(&r) {
            self.data_done(&self.inner.read_inner(), r.is_ok());
        }
        flight.late = late;
        if r.is_ok() && self.storage_full.swap(false, Ordering::AcqRel) {
            tracing::info!("the storage has room again: the stalled commit {} is done", journal.seq);
        }
        self.committed(flight, r)
    }

    /// A commit found the storage full: keep its flight whole for `resume_stalled`, and
    /// have changes fail with ENOSPC until then. The volume does not fail: the disk holds
    /// the last committed delta, and memory this one and what follows it.
    fn stall(&self, flight: Flight, e: &Error) -> Result<()> {
        *self.stalled.lock() = Some(flight);
        *self.stall_tried.lock() = std::time::Instant::now();
        if !self.storage_full.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                "a commit waits for room on the storage ({e}): until there is room, changes fail with \
                 ENOSPC, and each sync tries the commit again; nothing committed is lost"
            );
        }
        // Readers of files whose data waits with it stop waiting (`Volume::op_landed`).
        self.landed.notify_all();
        Err(Error::NoSpace)
    }

    /// A flight's log and home writes are done (`r`): trim its frees and release what
    /// it held.
    fn committed(&self, flight: Flight, r: Result<()>) -> Result<()> {
        if let Err(e) = &r {
            if storage_full(e) {
                return self.stall(flight, e);
            }
        }
        if r.is_ok() && self.discard {
            // Durable: the freed runs are unreferenced, and still held, so nothing can
            // reuse them before the trim is done.
            Volume::discard(&*self.dev, &flight.held);
        }
        let mut g = self.lock();
        match r {
            Ok(()) => {
                g.finish_commit(&flight);
                Ok(())
            }
            Err(e) => {
                g.fail();
                Err(e)
            }
        }
    }
}

impl Volume {
    #[cfg(feature = "testing")]
    /// Test hook (issue 14's concurrency harness): from now on, remember for every delta
    /// sealed for the log its sequence number and the linearization stamp (see
    /// [`Volume::last_stamp`]) of the lock hold that sealed it, so a test can tell which
    /// operations each committed state holds: exactly those with smaller stamps.
    #[doc(hidden)]
    pub fn record_commit_stamps(&self) {
        self.lock().commit_stamps.lock().get_or_insert_with(Vec::new);
    }

    #[cfg(feature = "testing")]
    /// Test hook: the `(sequence number, stamp)` of every delta sealed since
    /// [`Volume::record_commit_stamps`], in order.
    #[doc(hidden)]
    pub fn commit_stamps(&self) -> Vec<(u64, u64)> {
        let g = self.s.inner.read_inner();
        let stamps = g.commit_stamps.lock().clone().unwrap_or_default();
        stamps
    }

    #[cfg(feature = "testing")]
    /// Test hook: deltas committed part way through a commit's write-back because the
    /// log filled (docs/DESIGN.md, "Deltas and the crash model").
    #[doc(hidden)]
    pub fn split_commits(&self) -> u64 {
        self.s.inner.read_inner().delta.split_commits()
    }

    /// Test hook: flushes ahead of the commit done so far (see
    /// [`OpenOptions::flush_from`]).
    #[doc(hidden)]
    pub fn flushes(&self) -> u64 {
        self.s.inner.read_inner().delta.flushes()
    }

    /// Test hook: wait (up to `within`) until the flusher has nothing left to do, so a
    /// test can have flushes happen at points of its choosing.
    #[doc(hidden)]
    pub fn wait_flushed(&self, within: std::time::Duration) {
        let t = std::time::Instant::now();
        while t.elapsed() < within && (self.s.flush_wanted.load(Ordering::Acquire) || self.s.flusher.lock().running) {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// Commit the current delta and make it durable.
    pub fn sync(&self) -> Result<()> {
        crate::fs::pages::release_idle();
        self.commit()
    }

    /// Make one file (or directory) durable. Deltas are atomic, so this commits the whole
    /// delta, unless nothing of `ino` is in it: then the last commit already holds all of
    /// it, and once no commit is in flight (`journal` is free) there is nothing to do. An
    /// fsync of the root directory always commits: it is how a mount is synced (`dxfs
    /// sync`), since sync(2) never reaches a FUSE daemon.
    pub fn fsync(&self, ino: u64) -> Result<()> {
        {
            let _journal = self.s.journal.lock();
            let g = self.s.inner.read_inner();
            if g.is_failed() {
                return Err(Error::Failed);
            }
            if ino != g.st.sb.root_ino
                && g.delta.page_count(ino) == 0
                && !g.st.inode_changed(ino)
                && !self.s.storage_full.load(Ordering::Acquire)
            {
                return Ok(());
            }
        }
        self.sync()
    }

    /// Commit and close.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    /// Commit, and leave the volume clean: the next open has nothing to replay. The
    /// volume stays usable (a later change simply starts a new delta).
    pub fn shutdown(&self) -> Result<()> {
        self.sync()?;
        self.checkpoint()?;
        // A last flush even when nothing was written: the device is left with nothing of
        // ours in flight (an NBD device's readahead), whatever holds the volume after.
        let dev = self.s.dev.clone();
        dev.flush()?;
        // Clean: so is the mount mark, if this volume alone holds it (fsck and resize hold
        // theirs for longer), even if the volume is never dropped (a daemon that exits).
        let g = self.lock();
        if let Some(m) = g.mark.as_ref().filter(|m| Arc::strong_count(m) == 1) {
            m.park();
        }
        Ok(())
    }

    /// Close the volume where it stands, for an unmount that waits for the answer (a
    /// fuseblk mount's DESTROY): commit, leave it clean, write the mount mark clean and
    /// let go of the device's lock, so that whoever opens the volume the moment `umount`
    /// returns (fsck, the next mount) finds it free and whole. Nothing changes it
    /// afterwards: later changes get [`Error::ReadOnly`], and the drop writes nothing.
    pub fn unmount(&self) -> Result<()> {
        // A change that slipped in between the commit and the fence (a FORGET served
        // beside the DESTROY) is committed by the next round.
        for _ in 0..3 {
            self.shutdown()?;
            if self.s.stalled.lock().is_some() {
                return Err(Error::NoSpace);
            }
            let mut g = self.lock();
            if g.delta.is_empty(&g.st) {
                g.opts.read_only = true;
                drop(g);
                self.s.wait_flusher();
                self.s.wait_background();
                self.s.dev.release();
                return Ok(());
            }
        }
        Err(Error::Busy("the volume kept changing while it was being closed".into()))
    }

    /// After the last commit: make its home writes durable and commit an empty delta, so
    /// the next open has nothing to replay (a clean unmount; replaying would read and
    /// rewrite the whole last delta).
    pub(super) fn checkpoint(&self) -> Result<()> {
        let mut journal = self.s.journal.lock();
        // The stalled delta, not an empty one, must take the next sequence number.
        if self.s.stalled.lock().is_some() {
            return Err(Error::NoSpace);
        }
        let mut g = self.lock();
        if g.is_failed() || g.opts.read_only || journal.last_blocks == 0 || g.st.dirty_count() > 0 {
            return Ok(());
        }
        let dev = g.st.dev().clone();
        dev.flush()?;
        journal.commit(&*dev, &[], &[])?;
        g.delta.checkpointed(journal.seq);
        Ok(())
    }
}

/// Whether a commit's result says the storage was full (the commit stalls).
fn stalls(r: &Result<()>) -> bool {
    matches!(r, Err(e) if storage_full(e))
}

/// Marks a flush under way (see `Shared::flushing`) until dropped.
struct Flushing<'a>(&'a std::sync::atomic::AtomicBool);

impl<'a> Flushing<'a> {
    fn start(flag: &'a std::sync::atomic::AtomicBool) -> Flushing<'a> {
        flag.store(true, Ordering::Release);
        Flushing(flag)
    }
}

impl Drop for Flushing<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Let the calling thread run on every CPU the process may use. A thread inherits the
/// CPUs of the thread that started it, and the flusher and the background committer are
/// started by whichever thread asked first: under FUSE over io_uring, a queue thread
/// pinned to the CPU of the process whose requests it answers. Pinned there too, they
/// took turns with that thread and that process while the other CPUs idled.
pub(super) fn unpin() {
    use nix::sched::{sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    let process = Pid::from_raw(std::process::id() as i32);
    if let Ok(set) = sched_getaffinity(process) {
        let _ = sched_setaffinity(Pid::from_raw(0), &set);
    }
}

#[cfg(test)]
mod tests {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;

    /// A thread pinned to one CPU (as a queue thread is) gets back every CPU the process
    /// may use.
    #[test]
    fn unpin_gives_back_the_process_cpus() {
        let process = sched_getaffinity(Pid::from_raw(std::process::id() as i32)).unwrap();
        let first = (0..CpuSet::count()).find(|&c| process.is_set(c).unwrap_or(false)).unwrap();
        std::thread::spawn(move || {
            let mut one = CpuSet::new();
            one.set(first).unwrap();
            sched_setaffinity(Pid::from_raw(0), &one).unwrap();
            super::unpin();
            let now = sched_getaffinity(Pid::from_raw(0)).unwrap();
            for c in 0..CpuSet::count() {
                assert_eq!(now.is_set(c).unwrap(), process.is_set(c).unwrap(), "CPU {c}");
            }
        })
        .join()
        .unwrap();
    }
}
