//! The delta: what the front end changed since the last commit, its budget, and its
//! commit (write-back, snapshot, log, release).

use crate::disk::codec::*;
use crate::disk::device::BlockDevice;
use crate::disk::format::*;
use crate::engine::log::Journal;
use crate::engine::space::Space;
use crate::engine::store::Store;
use crate::error::{Error, Result};
use crate::fs::file::{self, DataWrite, Pages};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use super::*;

/// A delta on its way to the device: its metadata blocks and the frees held back until
/// it is durable.
pub(super) struct Flight {
    pub(super) blocks: Vec<(u64, Box<Block>)>,
    pub(super) held: Vec<(u64, u64)>,
    /// File data the delta's extent maps point at, written before its log.
    pub(super) data: Vec<DataWrite>,
}

/// What an operation may need, charged before it changes anything.
#[derive(Clone, Copy, Debug)]
pub(super) struct Cost {
    /// Worst-case new metadata blocks.
    pub(super) meta: u64,
    /// New data pages (delayed allocation: blocks promised until write-back).
    pub(super) pages: u64,
    /// Deletions may use the reserve.
    pub(super) deletion: bool,
}

impl Cost {
    pub(super) fn new(meta: u64, pages: u64, deletion: bool) -> Cost {
        Cost { meta, pages, deletion }
    }
}

/// Why a charge does not fit in the current delta.
#[derive(PartialEq, Eq)]
pub(super) enum Short {
    /// The log is near full: commit, then it fits.
    Delta,
    /// The dirty-data limit (pages, or runs of pages) is reached: commit, then it fits;
    /// while a commit is already writing, up to twice the limit may wait for the next.
    Dirty,
    /// Not enough space, perhaps until the delta's frees are released.
    Space,
}

/// The delta being built: the dirty file pages it carries (delayed allocation), its
/// promises against the space budget, and the counters of the commits that end it.
/// Dirty metadata lives in the store's cache and the delta's frees in the space map and
/// the store; the delta drives them through their own methods.
pub(super) struct Delta {
    /// Dirty pages by inode.
    dirty: HashMap<u64, Pages>,
    /// Pages in `dirty`: each was promised one data block.
    dirty_pages: u64,
    /// Dirty-data limit in pages: past it the delta commits.
    dirty_limit: u64,
    /// Runs of consecutive dirty pages (over all files): each costs its write-back an
    /// extent-map update under the volume lock, so past `RUN_LIMIT` of them the delta
    /// commits even below the dirty limit (random writes would otherwise make one commit
    /// hold the lock for a long time).
    dirty_runs: u64,
    /// Blocks one delta may log (the log's capacity).
    log_capacity: u64,
    /// Sequence number of the last delta handed to the log.
    seq: u64,
    /// Counts the events that may rewrite a block on the device (write-backs and commit
    /// snapshots, each counted before its writes): a read planned under the lock and done
    /// without it is redone if this changed meanwhile.
    epoch: u64,
    /// Charge against the space budget (off only for A/B measurements).
    accounting: bool,
    /// Dirty pages over blocks the file already has (overwrites, or writes into a
    /// preallocated range): their write-back swaps a block for a block, so they add
    /// nothing to the file's block count.
    overwrites: HashMap<u64, std::collections::BTreeSet<u64>>,
    /// Files whose written-back pages are being written to the device without the volume
    /// lock: their extent maps point at blocks not written yet, so reading their data
    /// waits until the pages have landed.
    in_flight: HashSet<u64>,
}

/// Runs of dirty pages past which a delta commits: about 3.5 µs of extent-map work each
/// at write-back (examples/random_overwrite.rs), and a writer may go to twice this while a
/// commit is writing, so a snapshot holds the volume lock for some 15 ms at most however
/// scattered the writes. (8192 let four random writers through the mount wait up to
/// 240–440 ms; 2048 brought that to 23–90 ms with more IOPS, docs/BENCHMARKS.md.)
const RUN_LIMIT: u64 = 2048;

/// Runs of consecutive pages in `pages`.
fn runs(pages: &Pages) -> u64 {
    let mut n = 0;
    let mut prev = None;
    for &p in pages.keys() {
        if prev.is_none_or(|q: u64| q + 1 != p) {
            n += 1;
        }
        prev = Some(p);
    }
    n
}

impl Delta {
    pub(super) fn new(seq: u64, log_capacity: u64, opts: &OpenOptions) -> Delta {
        Delta {
            dirty: HashMap::new(),
            dirty_pages: 0,
            dirty_limit: opts.dirty_limit,
            dirty_runs: 0,
            log_capacity,
            seq,
            epoch: 0,
            accounting: opts.space_accounting,
            in_flight: HashSet::new(),
            overwrites: HashMap::new(),
        }
    }

    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }

    pub(super) fn log_capacity(&self) -> u64 {
        self.log_capacity
    }

    /// Whether some of a file's written-back pages have not reached the device yet.
    pub(super) fn in_flight(&self, ino: u64) -> bool {
        self.in_flight.contains(&ino)
    }

    /// The data of the flight has been written: every file's blocks hold their data.
    pub(super) fn landed(&mut self) {
        self.in_flight.clear();
    }

    /// The dirty pages of a file, if it has any.
    pub(super) fn pages(&self, ino: u64) -> Option<&Pages> {
        self.dirty.get(&ino)
    }

    /// Number of dirty pages of a file.
    pub(super) fn page_count(&self, ino: u64) -> u64 {
        self.dirty.get(&ino).map_or(0, |m| m.len() as u64)
    }

    /// Dirty pages of a file among pages `first..=last`.
    pub(super) fn pages_in(&self, ino: u64, first: u64, last: u64) -> u64 {
        self.dirty.get(&ino).map_or(0, |m| m.range(first..=last).count() as u64)
    }

    pub(super) fn page_mut(&mut self, ino: u64, p: u64) -> Option<&mut Box<[u8; BLOCK_SIZE]>> {
        self.dirty.get_mut(&ino).and_then(|m| m.get_mut(&p))
    }

    /// Dirty pages of a file that will need blocks it does not have yet (what `stat`
    /// counts beyond the blocks already mapped).
    pub(super) fn new_page_count(&self, ino: u64) -> u64 {
        self.page_count(ino) - self.overwrites.get(&ino).map_or(0, |s| s.len() as u64)
    }

    /// Page `p` of `ino`, just made dirty, lies over a block the file already has.
    pub(super) fn mark_overwrite(&mut self, ino: u64, p: u64) {
        self.overwrites.entry(ino).or_default().insert(p);
    }

    /// Make page `p` of inode `i` dirty with contents `page`, promising its block and its
    /// share of the write-back's extent-map changes.
    pub(super) fn add_page(&mut self, space: &mut Space, i: &Inode, p: u64, page: Box<[u8; BLOCK_SIZE]>) {
        let before = self.page_count(i.ino);
        let pages = self.dirty.entry(i.ino).or_default();
        let (left, right) = (p > 0 && pages.contains_key(&(p - 1)), pages.contains_key(&(p + 1)));
        if pages.insert(p, page).is_none() {
            // A page alone starts a run; one between two runs joins them.
            match (left, right) {
                (false, false) => self.dirty_runs += 1,
                (true, true) => self.dirty_runs -= 1,
                _ => {}
            }
        }
        self.dirty_pages += 1;
        space.promise(1, Self::writeback_meta(before, before + 1, extent_depth(i)));
    }

    /// Drop the dirty pages of `ino` that `which` selects (truncate, punch, delete); their
    /// promised blocks go back to the budget.
    pub(super) fn drop_pages(&mut self, space: &mut Space, ino: u64, which: impl Fn(u64) -> bool) {
        if let Some(o) = self.overwrites.get_mut(&ino) {
            o.retain(|p| !which(*p));
        }
        let Some(pages) = self.dirty.get_mut(&ino) else { return };
        let before = pages.len();
        let runs_before = runs(pages);
        pages.retain(|p, _| !which(*p));
        let n = (before - pages.len()) as u64;
        self.dirty_runs = self.dirty_runs - runs_before + runs(pages);
        if pages.is_empty() {
            self.dirty.remove(&ino);
        }
        self.dirty_pages -= n;
        space.settle_pages(n);
    }

    /// Move the dirty pages of `ino` at or after page `from` by `delta` pages (collapse
    /// and insert range); the pages they move onto are not dirty.
    pub(super) fn shift_pages(&mut self, ino: u64, from: u64, delta: i64) {
        if let Some(o) = self.overwrites.get_mut(&ino) {
            let moved = o.split_off(&from);
            o.extend(moved.into_iter().map(|p| p.saturating_add_signed(delta)));
        }
        let Some(pages) = self.dirty.get_mut(&ino) else { return };
        let runs_before = runs(pages);
        let moved = pages.split_off(&from);
        for (p, page) in moved {
            pages.insert(p.saturating_add_signed(delta), page);
        }
        self.dirty_runs = self.dirty_runs - runs_before + runs(pages);
    }

    /// Whether the delta holds no change at all (no dirty metadata or data).
    pub(super) fn is_empty(&self, st: &Store) -> bool {
        st.dirty_count() == 0 && st.space.pending_bitmap_blocks() == 0 && self.dirty_pages == 0
    }

    /// Whether a change of cost `c` fits in the current delta: room in the log for any
    /// one operation, the dirty-data limit, and the space budget.
    pub(super) fn fits(&self, st: &Store, c: Cost, dirty_factor: u64) -> std::result::Result<(), Short> {
        let used = (st.dirty_count() + st.space.pending_bitmap_blocks()) as u64;
        if used + OP_LOG_BLOCKS > self.log_capacity {
            return Err(Short::Delta);
        }
        // Only changes that dirty pages are held back by the dirty-data limits (a delta
        // may be past them while a commit is writing: see `charged_with`).
        if c.pages > 0
            && ((self.dirty_pages > 0 && self.dirty_pages + c.pages > self.dirty_limit * dirty_factor)
                || self.dirty_runs >= RUN_LIMIT * dirty_factor)
        {
            return Err(Short::Dirty);
        }
        if self.accounting && st.space.available(c.deletion) < c.meta + c.pages {
            return Err(Short::Space);
        }
        Ok(())
    }

    /// Metadata the write-back of a file's dirty pages may need, growing from `before` to
    /// `after` pages: the first page of a file in a delta charges an extent-map change (a
    /// removal and an insert, each splitting at most every level, plus the inline-to-tree
    /// move), and every 64 pages one more block (at least 64 extent records fit in the
    /// half-full leaf a split leaves).
    pub(super) fn writeback_meta(before: u64, after: u64, depth: u64) -> u64 {
        let first = if before == 0 && after > 0 { 2 * depth + 4 } else { 0 };
        first + after.div_ceil(64) - before.div_ceil(64)
    }

    /// Write back all dirty data and snapshot the delta for the log. When the log fills
    /// during write-back, the delta so far is committed synchronously (it is a consistent
    /// state) and write-back goes on in a new one. Returns None when there is nothing to
    /// commit.
    pub(super) fn prepare_commit(
        &mut self,
        st: &mut Store,
        state: &mut State,
        journal: &mut Journal,
    ) -> Result<Option<Flight>> {
        let mut inos: Vec<u64> = self.dirty.keys().copied().collect();
        inos.sort_unstable();
        if !inos.is_empty() {
            self.epoch += 1;
        }
        let limit = (self.log_capacity as usize).saturating_sub(WRITEBACK_HEADROOM);
        let mut data = Vec::new();
        for ino in inos {
            let mut pages = self.dirty.remove(&ino).unwrap_or_default();
            self.dirty_runs -= runs(&pages);
            self.overwrites.remove(&ino);
            let mut inode = st.inode(ino)?;
            self.in_flight.insert(ino);
            loop {
                let n = file::writeback(st, &mut inode, &mut pages, limit, &mut data)?;
                st.put_inode(&inode)?;
                self.dirty_pages -= n;
                st.space.settle_pages(n);
                if pages.is_empty() {
                    break;
                }
                // The log is full: commit what is mapped so far, its data first (under
                // the lock: only write-backs larger than a log area come here).
                for w in data.drain(..) {
                    w.write(&**st.dev())?;
                }
                st.space.release_deferred();
                st.forget_freed();
                let blocks = self.snapshot(st, state);
                journal.commit(&**st.dev(), &blocks)?;
                st.landed(&blocks);
            }
        }
        st.space.clear_promises();
        if data.is_empty() && st.dirty_count() == 0 && st.space.pending_bitmap_blocks() == 0 {
            self.in_flight.clear();
            return Ok(None);
        }
        let held = st.space.begin_hold();
        st.freed_to_flight();
        let blocks = self.snapshot(st, state);
        st.space.keep_held(&held);
        Ok(Some(Flight { blocks, held, data }))
    }

    /// Seal the delta's metadata (bitmap and state block included) for the log.
    fn snapshot(&mut self, st: &mut Store, state: &mut State) -> Vec<(u64, Box<Block>)> {
        self.epoch += 1;
        self.seq += 1;
        state.commit_seq = self.seq;
        if let Some(t) = st.lazy_frees {
            state.lazy_frees = t;
        }
        state.encode_into(st.fresh_block(STATE_BLOCK));
        st.take_dirty()
    }

    /// A flight is durable and home: release what it held.
    pub(super) fn finish_commit(&mut self, st: &mut Store, f: &Flight) {
        st.space.end_hold(&f.held);
        st.flight_landed();
        st.landed(&f.blocks);
    }

    /// The log committed an empty delta of its own (a checkpoint).
    pub(super) fn checkpointed(&mut self, seq: u64) {
        self.seq = seq;
    }
}

impl Inner {
    /// Whether a change of cost `c` fits in the current delta.
    pub(super) fn fits(&self, c: Cost) -> std::result::Result<(), Short> {
        self.delta.fits(&self.st, c, 1)
    }

    /// Worst-case new blocks of one directory-index insert: a split at every level plus
    /// a new root.
    pub(super) fn dir_cost(d: &Inode) -> u64 {
        d.dir().map_or(2, |d| d.tree.depth as u64 + 2)
    }

    /// Blocks charged to take an inode slot: one inode block (a new region is sized to
    /// what the budget allows, and is at least that one block).
    pub(super) fn inode_cost(&self) -> u64 {
        1
    }

    /// Write back and snapshot the delta (see [`Delta::prepare_commit`]); `stamp` is the
    /// linearization stamp of the lock hold doing it, recorded with the sequence number of
    /// every delta it seals when [`Volume::record_commit_stamps`] asked for it.
    fn prepare_commit(&mut self, journal: &mut Journal, stamp: u64) -> Result<Option<Flight>> {
        self.list_held()?;
        let before = self.delta.seq;
        let r = self.delta.prepare_commit(&mut self.st, &mut self.state, journal);
        if let Some(log) = &mut self.commit_stamps {
            log.extend((before + 1..=self.delta.seq).map(|seq| (seq, stamp)));
        }
        r
    }

    fn finish_commit(&mut self, f: &Flight) {
        self.delta.finish_commit(&mut self.st, f)
    }
}

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
            match std::thread::Builder::new().name("dxfs-commit".into()).spawn(move || s.serve_background()) {
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
        if self.lock().failed {
            return Err(Error::Failed);
        }
        Ok(())
    }
}

impl Volume {
    /// Whether a background commit is under way (its thread has not stopped yet).
    fn committing(&self) -> bool {
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
            if let Err(e) = self.commit(served) {
                tracing::error!("background commit failed: {e}");
            }
            // Served whether it snapshotted or failed before (a failure is in `failed`).
            served();
        }
    }

    /// Ask for a background commit without waiting for it: it starts when the one
    /// running now ends. Only called while one is running (see `committing`).
    fn ask_background(&self) {
        let mut b = self.background.lock();
        // The running thread serves every request made before it looks again.
        if b.running {
            b.requested = b.requested.max(b.snapshotted + 1);
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
        let mut flight = {
            let mut g = self.lock();
            if g.is_failed() {
                return Err(Error::Failed);
            }
            if g.opts.read_only {
                return Ok(());
            }
            // A volume left clean by `shutdown` takes its mount mark back before it writes.
            let pending = !g.delta.dirty.is_empty() || g.st.dirty_count() > 0 || g.st.space.pending_bitmap_blocks() > 0;
            if pending {
                if let Some(Err(e)) = g.mark.as_ref().map(|m| m.unpark()) {
                    g.failed = true;
                    return Err(e);
                }
            }
            let stamp = g.stamp();
            match g.prepare_commit(&mut journal, stamp) {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(()),
                Err(e) => {
                    g.failed = true;
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
        let pages: u64 = data.iter().map(|w| w.pages.len() as u64).sum();
        self.in_flight_pages.store(pages, Ordering::Release);
        self.in_flight_runs.store(data.len() as u64, Ordering::Release);
        snapshotted();
        let dev = self.lock().st.dev().clone();
        let wrote = file::write_runs(&*dev, data, DATA_PIECE, |pages, runs| {
            self.in_flight_pages.fetch_sub(pages, Ordering::AcqRel);
            self.in_flight_runs.fetch_sub(runs, Ordering::AcqRel);
            self.landed.notify_all();
        });
        self.in_flight_pages.store(0, Ordering::Release);
        self.in_flight_runs.store(0, Ordering::Release);
        {
            let mut g = self.lock();
            g.delta.landed();
            if wrote.is_err() {
                g.failed = true;
            }
            self.landed.notify_all();
        }
        wrote?;
        let r = journal.commit(&*dev, &flight.blocks);
        if r.is_ok() && self.discard {
            // Durable: the freed runs are unreferenced, and still held, so nothing can
            // reuse them before the trim is done.
            Volume::discard(&*dev, &flight.held);
        }
        let mut g = self.lock();
        match r {
            Ok(()) => {
                g.finish_commit(&flight);
                Ok(())
            }
            Err(e) => {
                g.failed = true;
                Err(e)
            }
        }
    }
}

impl Volume {
    /// Wait until the data of file `ino` written back by a commit in flight is on the
    /// device (its extent map may point at blocks not written yet). The lock is released
    /// while waiting.
    pub(super) fn wait_landed(&self, g: &mut Held<'_>, ino: u64) -> Result<()> {
        while g.delta.in_flight(ino) {
            g.wait(&self.s.landed);
        }
        if g.failed {
            return Err(Error::Failed);
        }
        Ok(())
    }

    /// Lock the volume for a change whose cost `cost` computes; if the current delta
    /// cannot take it, commit and try again; fail with ENOSPC only when a fresh delta
    /// still cannot.
    pub(super) fn charged(&self, cost: impl Fn(&mut Inner) -> Result<Cost>) -> Result<Held<'_>> {
        self.charged_with(|g| Ok((cost(g)?, ()))).map(|(g, ())| g)
    }

    /// [`Volume::charged`] for a change that reads file `ino`'s data (a partial page, a
    /// truncated tail): it also waits until a commit's write-back of that file has landed.
    pub(super) fn charged_on(&self, ino: u64, cost: impl Fn(&mut Inner) -> Result<Cost>) -> Result<Held<'_>> {
        self.charged_on_with(ino, |g| Ok((cost(g)?, ()))).map(|(g, ())| g)
    }

    /// [`Volume::charged_on`], also handing back what the cost function read.
    pub(super) fn charged_on_with<T>(
        &self,
        ino: u64,
        cost: impl Fn(&mut Inner) -> Result<(Cost, T)>,
    ) -> Result<(Held<'_>, T)> {
        loop {
            let (mut g, read) = self.charged_with(&cost)?;
            if !g.delta.in_flight(ino) {
                return Ok((g, read));
            }
            // The lock is released while waiting, so the charge is made again.
            self.wait_landed(&mut g, ino)?;
        }
    }

    /// [`Volume::charged`], also handing back what the cost function read (typically the
    /// decoded inodes), so the operation does not read them again under the same lock.
    pub(super) fn charged_with<T>(&self, cost: impl Fn(&mut Inner) -> Result<(Cost, T)>) -> Result<(Held<'_>, T)> {
        let mut commits = 0;
        loop {
            let mut g = self.lock();
            g.check_writable()?;
            let (c, read) = cost(&mut g)?;
            match g.fits(c) {
                Ok(()) => {
                    g.charged();
                    return Ok((g, read));
                }
                Err(Short::Space) if !g.st.space.could_fit_after_commit(c.meta + c.pages, c.deletion) => {
                    return Err(Error::NoSpace)
                }
                Err(Short::Space) if commits > 0 && g.st.space.deferred() == 0 => return Err(Error::NoSpace),
                Err(Short::Space) if commits >= 3 => return Err(Error::NoSpace),
                // Other threads may fill the delta again between our commit and our retry:
                // only a delta left empty proves the operation can never fit. (Each such
                // retry follows a commit of their changes, so they make progress.)
                Err(Short::Delta) if commits >= 3 && g.delta.is_empty(&g.st) => {
                    return Err(Error::corrupt("an operation does not fit in an empty delta"))
                }
                // Dirty data past the limit while a commit is writing: take up to twice
                // the limit rather than wait for that commit, and have the next one
                // start as soon as it ends.
                Err(Short::Dirty) if commits == 0 && self.committing() && g.delta.fits(&g.st, c, 2).is_ok() => {
                    let pages = self.s.in_flight_pages.load(Ordering::Acquire);
                    let runs = self.s.in_flight_runs.load(Ordering::Acquire);
                    if g.delta.dirty_pages + pages + c.pages <= 2 * g.delta.dirty_limit
                        && g.delta.dirty_runs + runs < 2 * RUN_LIMIT
                    {
                        self.s.ask_background();
                        g.charged();
                        return Ok((g, read));
                    }
                    // Wait for a piece of the commit's data to reach the device (its
                    // pages are then freed), and try again.
                    g.wait_for(&self.s.landed, std::time::Duration::from_millis(10));
                }
                // A full delta only needs to be snapshotted to make room; the space
                // budget needs the commit's frees, which come at its end.
                Err(Short::Delta | Short::Dirty) if commits == 0 => {
                    drop(g);
                    self.commit_soon()?;
                    commits += 1;
                }
                Err(_) => {
                    drop(g);
                    self.commit()?;
                    commits += 1;
                }
            }
        }
    }

    /// Test hook (issue 14's concurrency harness): from now on, remember for every delta
    /// sealed for the log its sequence number and the linearization stamp (see
    /// [`Volume::last_stamp`]) of the lock hold that sealed it, so a test can tell which
    /// operations each committed state holds: exactly those with smaller stamps.
    #[doc(hidden)]
    pub fn record_commit_stamps(&self) {
        self.lock().commit_stamps.get_or_insert_with(Vec::new);
    }

    /// Test hook: the `(sequence number, stamp)` of every delta sealed since
    /// [`Volume::record_commit_stamps`], in order.
    #[doc(hidden)]
    pub fn commit_stamps(&self) -> Vec<(u64, u64)> {
        self.lock().commit_stamps.clone().unwrap_or_default()
    }

    /// Commit the current delta and make it durable.
    pub fn sync(&self) -> Result<()> {
        self.commit()
    }

    /// Make one file durable (commits the whole delta: deltas are atomic).
    pub fn fsync(&self, _ino: u64) -> Result<()> {
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
        let dev = self.lock().st.dev().clone();
        dev.flush()?;
        // Clean: so is the mount mark, if this volume alone holds it (fsck and resize hold
        // theirs for longer), even if the volume is never dropped (a daemon that exits).
        let g = self.lock();
        if let Some(m) = g.mark.as_ref().filter(|m| Arc::strong_count(m) == 1) {
            m.park();
        }
        Ok(())
    }

    /// After the last commit: make its home writes durable and commit an empty delta, so
    /// the next open has nothing to replay (a clean unmount; replaying would read and
    /// rewrite the whole last delta).
    pub(super) fn checkpoint(&self) -> Result<()> {
        let mut journal = self.s.journal.lock();
        let mut g = self.lock();
        if g.is_failed() || g.opts.read_only || journal.last_blocks == 0 || g.st.dirty_count() > 0 {
            return Ok(());
        }
        let dev = g.st.dev().clone();
        dev.flush()?;
        journal.commit(&*dev, &[])?;
        g.delta.checkpointed(journal.seq);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::disk::device::MemDevice;
    use crate::engine::cache::MetaCache;

    /// A store over a blank 4096-block memory device (nothing on it is read here).
    fn store() -> Store {
        let layout = Layout::for_blocks(4096).unwrap();
        let sb = Superblock {
            version: VERSION,
            compat: 0,
            incompat: 0,
            ro_compat: 0,
            uuid: [0; 16],
            label: String::new(),
            layout,
            root_ino: 0,
            hash: crate::disk::hash::HashVersion::HalfMd4,
            region_blocks: 4,
            hash_seed: [1, 2, 3, 4],
            mkfs_time: 0,
            filter_hashes: 0,
            grow_from: 0,
        };
        Store::new(Arc::new(MemDevice::new(4096)), MetaCache::new(64), Space::fresh(layout), sb, true)
    }

    fn file(ino: u64) -> Inode {
        Inode::new(ino, libc::S_IFREG | 0o644)
    }

    fn page() -> Box<[u8; BLOCK_SIZE]> {
        Box::new([0u8; BLOCK_SIZE])
    }

    #[test]
    fn pages_promise_blocks_and_give_them_back() {
        let mut st = store();
        let opts = OpenOptions::default();
        let mut d = Delta::new(7, 256, &opts);
        let free = st.space.available(false);
        let (a, b) = (file(33), file(34));
        for p in 0..3 {
            d.add_page(&mut st.space, &a, p, page());
        }
        d.add_page(&mut st.space, &b, 9, page());
        // Three pages of one file and one of another: a data block each, plus the first
        // page's extent-map change and one block per 64 pages, for each file.
        let meta = Delta::writeback_meta(0, 3, 0) + Delta::writeback_meta(0, 1, 0);
        assert_eq!(st.space.promised(), 4 + meta);
        assert_eq!(free - st.space.available(false), st.space.promised());
        assert_eq!((d.page_count(33), d.pages_in(33, 1, 5), d.page_count(34)), (3, 2, 1));
        d.drop_pages(&mut st.space, 33, |p| p >= 1);
        assert_eq!(d.page_count(33), 1);
        d.drop_pages(&mut st.space, 34, |_| true);
        assert!(d.pages(34).is_none(), "a file with no dirty page leaves the delta");
        assert_eq!(d.dirty_pages, 1);
        st.space.clear_promises();
        assert_eq!(st.space.available(false), free);
    }

    #[test]
    fn runs_of_dirty_pages_are_counted_and_limit_the_delta() {
        let mut st = store();
        let opts = OpenOptions { dirty_limit: 1 << 20, ..OpenOptions::default() };
        let mut d = Delta::new(0, 1 << 20, &opts);
        let (a, b) = (file(33), file(34));
        for p in [1, 3, 5] {
            d.add_page(&mut st.space, &a, p, page());
        }
        assert_eq!(d.dirty_runs, 3);
        d.add_page(&mut st.space, &a, 2, page()); // joins 1 and 3
        d.add_page(&mut st.space, &a, 6, page()); // extends 5
        d.add_page(&mut st.space, &b, 1, page()); // another file: a run of its own
        assert_eq!(d.dirty_runs, 3);
        d.drop_pages(&mut st.space, 33, |p| p == 2); // splits 1..=3 again
        assert_eq!(d.dirty_runs, 4);
        d.shift_pages(33, 5, -1); // 5, 6 move onto 4, 5, next to 3
        assert_eq!(d.dirty_runs, 3);
        assert_eq!(d.dirty_runs, d.dirty.values().map(runs).sum::<u64>());
        // Scattered pages up to the run limit: the next page needs a commit first.
        let c = file(35);
        for k in 0..RUN_LIMIT - 3 {
            d.add_page(&mut st.space, &c, 2 * k, page());
        }
        assert_eq!(d.dirty_runs, RUN_LIMIT);
        assert!(matches!(d.fits(&st, Cost::new(1, 1, false), 1), Err(Short::Dirty)));
        assert!(
            !matches!(d.fits(&st, Cost::new(1, 0, false), 1), Err(Short::Dirty)),
            "an operation with no page still fits"
        );
        st.space.clear_promises();
    }

    #[test]
    fn fits_tells_a_full_delta_from_a_full_volume() {
        let mut st = store();
        let opts = OpenOptions { dirty_limit: 4, ..OpenOptions::default() };
        let mut d = Delta::new(0, 256, &opts);
        assert!(d.fits(&st, Cost::new(3, 2, false), 1).is_ok());
        let a = file(33);
        for p in 0..3 {
            d.add_page(&mut st.space, &a, p, page());
        }
        assert!(d.fits(&st, Cost::new(0, 1, false), 1).is_ok());
        assert!(d.fits(&st, Cost::new(0, 2, false), 1) == Err(Short::Dirty), "past the dirty limit: commit first");
        let avail = st.space.available(false);
        assert!(d.fits(&st, Cost::new(avail + 1, 0, false), 1) == Err(Short::Space));
        assert!(d.fits(&st, Cost::new(avail + 1, 0, true), 1).is_ok(), "deletions may use the reserve");
        let small_log = Delta::new(0, OP_LOG_BLOCKS, &opts);
        assert!(small_log.fits(&st, Cost::new(0, 0, true), 1) == Err(Short::Delta), "no log room for one operation");
        let off = Delta::new(0, 256, &OpenOptions { space_accounting: false, ..opts });
        assert!(off.fits(&st, Cost::new(avail + 1000, 0, false), 1).is_ok(), "accounting off never says Space");
    }

    #[test]
    fn writeback_meta_charges_the_first_page_and_every_64th() {
        assert_eq!(Delta::writeback_meta(0, 0, 2), 0);
        assert_eq!(Delta::writeback_meta(0, 1, 2), 2 * 2 + 4 + 1);
        assert_eq!(Delta::writeback_meta(1, 64, 2), 0);
        assert_eq!(Delta::writeback_meta(64, 65, 2), 1);
        // Growing in steps charges what growing at once does.
        let steps: u64 = (0..200).map(|n| Delta::writeback_meta(n, n + 1, 1)).sum();
        assert_eq!(steps, Delta::writeback_meta(0, 200, 1));
    }
}
