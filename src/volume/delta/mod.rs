//! The delta: what the front end changed since the last commit, and the delta's side of a
//! commit (write-back and snapshot, release); `commit.rs` drives commits. Its dirty pages
//! live in `pages.rs`, what a change costs and whether it fits in `cost.rs`.

mod cost;
mod pages;

pub(super) use cost::{Cost, Short};
use pages::{runs, FileDelta};

use crate::disk::codec::*;
use crate::disk::format::*;
use crate::engine::log::Journal;
use crate::engine::store::Store;
use crate::error::Result;
use crate::fs::file::{self, DataWrite, InPlace, Pages};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::engine::leaf::{Sharded, SlotCounter};

use super::*;

/// A delta on its way to the device: its metadata blocks and the frees held back until
/// it is durable.
pub(super) struct Flight {
    pub(super) blocks: Vec<(u64, Box<Block>)>,
    pub(super) held: Vec<(u64, u64)>,
    /// File data the delta's extent maps point at, written before its log.
    pub(super) data: Vec<DataWrite>,
    /// Overwrites in place (block, contents): logged, and written home only after the
    /// commit (`file::InPlace`).
    pub(super) late: Vec<(u64, Box<Block>)>,
    /// Commit with one flush, `data` in the log beside the metadata (small data, none
    /// written elsewhere by the delta, and a volume with the feature).
    pub(super) one_flush: bool,
}

/// Most pages a delta overwrites in place (`file::InPlace`); the rest go to fresh
/// blocks. Each goes home in a write of its own after the commit, where redirected pages
/// go out side by side: for a few pages (an fsync after every write, a database's
/// commit) that beats logging the extent leaves they would change, for hundreds of
/// scattered ones it does not (docs/BENCHMARKS.md).
const INPLACE_PAGES: usize = 64;

/// `(block, contents)` pairs as the journal takes them.
pub(super) fn late_refs(late: &[(u64, Box<Block>)]) -> Vec<(u64, &[u8])> {
    late.iter().map(|(b, p)| (*b, &p[..])).collect()
}

/// Most pages of file data a delta may log with its metadata and commit with one flush
/// (1 MiB): the data is written twice, so this is for the small deltas an fsync makes,
/// where a device flush and two round trips cost more than the copy.
const LOGGED_DATA_PAGES: usize = 256;

/// The delta being built: the dirty file pages it carries (delayed allocation), its
/// promises against the space budget, and the counters of the commits that end it.
/// Dirty metadata lives in the store's cache and the delta's frees in the space map and
/// the store; the delta drives them through their own methods.
///
/// Operations running at once reach it through `&self`: a file's pages are changed only
/// by an operation holding that file's inode lock for writing, under the lock of the
/// table shard the file is in (a leaf lock, held for one page at a time); the totals are
/// atomics. The commit and the flusher, which hold the volume lock exclusively, reach it
/// through `&mut self`.
pub(super) struct Delta {
    /// Dirty pages by inode, and what goes with them.
    files: Sharded<rustc_hash::FxHashMap<u64, FileDelta>>,
    /// Pages in `files`: each was promised one data block.
    dirty_pages: AtomicU64,
    /// Dirty-data limit in pages: past it the delta commits.
    dirty_limit: u64,
    /// Runs of consecutive dirty pages (over all files): each costs its write-back an
    /// extent-map update under the volume lock, so past `RUN_LIMIT` of them the delta
    /// commits even below the dirty limit (random writes would otherwise make one commit
    /// hold the lock for a long time).
    dirty_runs: AtomicU64,
    /// The files' `meta_promised`, summed: with the runs, what bounds the log blocks the
    /// commit's write-back adds (`writeback_log`).
    meta_promised: AtomicU64,
    /// Blocks one delta may log (the log's capacity).
    log_capacity: u64,
    /// Log blocks set aside for the operations now running (`OP_LOG_BLOCKS` each): they
    /// may all add to the delta before it commits.
    log_reserved: SlotCounter,
    /// Sequence number of the last delta handed to the log.
    seq: u64,
    /// Counts the events that may rewrite a block on the device (write-backs and commit
    /// snapshots, each counted before its writes): a read planned under the lock and done
    /// without it is redone if this changed meanwhile.
    epoch: AtomicU64,
    /// Charge against the space budget (off only for A/B measurements).
    accounting: bool,
    /// Files whose written-back pages are being written to the device without the volume
    /// lock: their extent maps point at blocks not written yet, so reading their data
    /// waits until the pages have landed.
    in_flight: Mutex<rustc_hash::FxHashSet<u64>>,
    /// `in_flight` is not empty: what readers look at first (it seldom is).
    any_in_flight: AtomicBool,
    /// Dirty pages past which write-back starts ahead of the commit (0: never): the
    /// option, at most a quarter of the dirty limit.
    flush_from: u64,
    /// Flushes ahead of the commit done so far: a writer held back by the dirty limits
    /// sees progress by it changing.
    flushes: AtomicU64,
    /// A flush wrote file data of this delta to the device: it must commit with two
    /// flushes (that data must be durable before its commit block is written).
    flushed_data: bool,
    /// Deltas committed part way through a commit's write-back because the log filled
    /// (`prepare_commit`): each is a consistent volume, but not the state after a prefix
    /// of the operations (later files' pages are not written back yet).
    split_commits: u64,
}

/// Most pages (32 MiB) and runs of pages one flush ahead of the commit takes: it holds
/// the volume lock for their write-back, an extent-map change per run (some 1.5 µs for a
/// scattered page), so a flush of 512 runs holds it for about a millisecond, and a writer
/// held back by the dirty limits waits for about one flush.
const FLUSH_PAGES: u64 = 8192;
const FLUSH_RUNS: u64 = 512;

/// Runs of dirty pages past which a delta commits: about 3.5 µs of extent-map work each
/// at write-back (examples/random_overwrite.rs), and a writer may go to twice this while a
/// commit is writing, so a snapshot holds the volume lock for some 15 ms at most however
/// scattered the writes. (8192 let four random writers through the mount wait up to
/// 240–440 ms; 2048 brought that to 23–90 ms with more IOPS, docs/BENCHMARKS.md.)
const RUN_LIMIT: u64 = 2048;

impl Delta {
    pub(super) fn new(seq: u64, log_capacity: u64, opts: &OpenOptions) -> Delta {
        Delta {
            files: Sharded::new(10),
            dirty_pages: AtomicU64::new(0),
            dirty_limit: opts.dirty_limit,
            dirty_runs: AtomicU64::new(0),
            meta_promised: AtomicU64::new(0),
            log_capacity,
            log_reserved: SlotCounter::new(0),
            seq,
            epoch: AtomicU64::new(0),
            accounting: opts.space_accounting,
            in_flight: Mutex::new(Default::default()),
            any_in_flight: AtomicBool::new(false),
            flush_from: opts.flush_from.min(opts.dirty_limit / 4),
            flushes: AtomicU64::new(0),
            flushed_data: false,
            split_commits: 0,
        }
    }

    fn dirty_pages(&self) -> u64 {
        self.dirty_pages.load(Ordering::Relaxed)
    }

    fn dirty_runs(&self) -> u64 {
        self.dirty_runs.load(Ordering::Relaxed)
    }

    /// Log blocks the write-back of the dirty pages may add to the delta: the extent-map
    /// blocks promised for them (a change per file, splits included, and a leaf per 64
    /// pages) and, since scattered pages change a leaf per run, two blocks per run (the
    /// leaf and a bitmap block). Charged as the log's room is (`check`), so a delta
    /// commits before its write-back could fill the log: a write-back the log cannot
    /// hold is split into two commits, and a crash between them leaves a volume that is
    /// consistent but no prefix of the operations (some files' new pages not there).
    pub(super) fn writeback_log(&self) -> u64 {
        self.meta_promised.load(Ordering::Relaxed) + 2 * self.dirty_runs()
    }

    /// Whether the dirty pages are many enough, or scattered enough, to write some back
    /// ahead of the commit: `flush_from` pages (a quarter of the dirty limit by
    /// default), or a quarter of the runs limit (or `flush_from` runs if fewer); and
    /// only while the log has room for write-back beside what any operation needs.
    pub(super) fn wants_flush(&self, st: &Store) -> bool {
        self.past_flush_marks(st, 1)
    }

    /// Whether a flusher at work goes on: until the dirty pages are down to half the
    /// marks that start it, so it does not stop and start again at every write.
    pub(super) fn wants_more_flushing(&self, st: &Store) -> bool {
        self.past_flush_marks(st, 2)
    }

    /// Whether the dirty pages or their runs reach the flush marks divided by `div`, with
    /// room in the log for write-back.
    fn past_flush_marks(&self, st: &Store, div: u64) -> bool {
        let runs = (RUN_LIMIT / 4).min(self.flush_from);
        self.flush_from > 0
            && (self.dirty_pages() >= (self.flush_from / div).max(1) || self.dirty_runs() >= (runs / div).max(1))
            && st.dirty_count() + st.space().dirty_blocks() < self.flush_limit()
    }

    /// Dirty metadata blocks up to which a flush may write back: the log's capacity less
    /// the room any front-end operation and one write-back fragment need.
    fn flush_limit(&self) -> usize {
        (self.log_capacity as usize).saturating_sub(OP_LOG_BLOCKS as usize + WRITEBACK_HEADROOM)
    }

    #[cfg(feature = "testing")]
    /// Deltas committed part way through a write-back because the log filled.
    pub(super) fn split_commits(&self) -> u64 {
        self.split_commits
    }

    /// Flushes ahead of the commit done so far.
    pub(super) fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Acquire)
    }

    /// Write back dirty pages ahead of the commit (a *flush*, at most `FLUSH_PAGES` in
    /// `FLUSH_RUNS` runs, fewer with a small `flush_from`): allocate and
    /// map their blocks in this delta, as the commit's write-back would, and hand back
    /// their data for the caller to write without the volume lock. Their files are in
    /// flight until [`Delta::landed`]. The delta stays open: the commit that ends it
    /// writes back what is left. Stops short of the log room any front-end operation
    /// needs, so a flush never makes an operation commit early.
    pub(super) fn flush_some(&mut self, st: &Store) -> Result<Vec<DataWrite>> {
        let limit = self.flush_limit();
        let mut inos: Vec<u64> = Vec::new();
        self.files.for_each(|m| inos.extend(m.iter().filter(|(_, f)| !f.pages.is_empty()).map(|(i, _)| *i)));
        inos.sort_unstable();
        let mut data = Vec::new();
        // A small `flush_from` (tests) makes small flushes, which end inside files.
        let (mut left_pages, mut left_runs) = (FLUSH_PAGES.min(self.flush_from), FLUSH_RUNS.min(self.flush_from));
        for ino in inos {
            if left_pages == 0 || left_runs == 0 || st.dirty_count() + st.space().dirty_blocks() >= limit {
                break;
            }
            let mut fd = self.files.shard(ino).remove(&ino).unwrap_or_default();
            let mut pages = std::mem::take(&mut fd.pages);
            *self.dirty_runs.get_mut() -= runs(&pages);
            // The pages within what is left of this flush's pages and runs go now, the
            // rest stay dirty.
            let (mut np, mut nr, mut prev, mut split) = (0u64, 0u64, None, None);
            for &k in pages.keys() {
                let starts_run = prev.is_none_or(|q: u64| q + 1 != k);
                if np == left_pages || (starts_run && nr == left_runs) {
                    split = Some(k);
                    break;
                }
                nr += u64::from(starts_run);
                np += 1;
                prev = Some(k);
            }
            left_runs -= nr;
            let mut rest = match split {
                Some(k) => pages.split_off(&k),
                None => Pages::new(),
            };
            let taken: Vec<u64> = pages.keys().copied().collect();
            let mut tx = st.tx();
            let mut inode = tx.inode(ino)?;
            // Flushed data is written before the commit: to fresh blocks only.
            let n = file::writeback(&mut tx, &mut inode, &mut pages, limit, &mut data, &mut InPlace::none())?;
            tx.put_inode(&inode)?;
            if n > 0 {
                self.in_flight.get_mut().insert(ino);
                *self.any_in_flight.get_mut() = true;
            }
            *self.dirty_pages.get_mut() -= n;
            tx.space().settle_pages(n);
            drop(tx);
            left_pages -= n;
            // What the log's room left unwritten stays dirty with the rest.
            rest.append(&mut pages);
            for p in taken.iter().filter(|p| !rest.contains_key(p)) {
                fd.overwrites.remove(p);
            }
            if rest.is_empty() {
                fd.overwrites.clear();
                let meta = std::mem::take(&mut fd.meta_promised);
                *self.meta_promised.get_mut() -= meta;
                st.space().settle_meta(meta);
            } else {
                *self.dirty_runs.get_mut() += runs(&rest);
                fd.pages = rest;
            }
            if !fd.is_empty() {
                self.files.shard(ino).insert(ino, fd);
            }
        }
        if !data.is_empty() {
            *self.epoch.get_mut() += 1;
            *self.flushes.get_mut() += 1;
            self.flushed_data = true;
        }
        Ok(data)
    }

    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub(super) fn log_capacity(&self) -> u64 {
        self.log_capacity
    }

    /// Whether some of a file's written-back pages have not reached the device yet.
    pub(super) fn in_flight(&self, ino: u64) -> bool {
        self.any_in_flight.load(Ordering::Acquire) && self.in_flight.lock().contains(&ino)
    }

    /// The data of the flight has been written: every file's blocks hold their data.
    pub(super) fn landed(&self) {
        let mut f = self.in_flight.lock();
        f.clear();
        self.any_in_flight.store(false, Ordering::Release);
    }

    /// Whether the delta holds no change at all (no dirty metadata or data).
    pub(super) fn is_empty(&self, st: &Store) -> bool {
        st.dirty_count() == 0 && st.pending_bitmap_blocks() == 0 && self.dirty_pages() == 0
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
        let mut files = Vec::new();
        self.files.for_each(|m| files.extend(m.drain()));
        files.sort_unstable_by_key(|(ino, _)| *ino);
        if files.iter().any(|(_, f)| !f.pages.is_empty()) {
            *self.epoch.get_mut() += 1;
        }
        let limit = (self.log_capacity as usize).saturating_sub(WRITEBACK_HEADROOM);
        let mut data = Vec::new();
        // Overwrites in place need recovery to know logged data (DATA_TARGET), which the
        // one-flush feature brought: only volumes with it; and only as many as the log
        // has left beside the write-back's own worst case, so pages in place never make
        // the write-back split the delta.
        let need = st.dirty_count() + st.pending_bitmap_blocks() + self.writeback_log() as usize;
        // The files were drained above: their promises leave the total with them.
        *self.meta_promised.get_mut() = 0;
        let room = if st.sb.one_flush_commit() { limit.saturating_sub(need).min(INPLACE_PAGES) } else { 0 };
        let mut inplace = InPlace::new(room);
        for (ino, fd) in files {
            let mut pages = fd.pages;
            if pages.is_empty() {
                continue;
            }
            *self.dirty_runs.get_mut() -= runs(&pages);
            let mut inode = st.inode(ino)?;
            // Its blocks change: so do the rstat records above it (marked by its writes
            // already, unless a commit split off part of this delta meanwhile).
            if let Err(e) = st.mark_rstats(&[inode.parent]) {
                tracing::error!("rstats: file {ino}: {e}");
            }
            self.in_flight.get_mut().insert(ino);
            *self.any_in_flight.get_mut() = true;
            loop {
                let n = {
                    let mut tx = st.tx();
                    let room = limit.saturating_sub(st.rstat_leaves() as usize);
                    let n = file::writeback(&mut tx, &mut inode, &mut pages, room, &mut data, &mut inplace)?;
                    tx.put_inode(&inode)?;
                    n
                };
                *self.dirty_pages.get_mut() -= n;
                st.space_mut().settle_pages(n);
                if pages.is_empty() {
                    break;
                }
                // The log is full: commit what is mapped so far, its data first (under
                // the lock: only write-backs larger than a log area come here).
                self.split_commits += 1;
                file::write_runs(&**st.dev(), &st.sb.layout, std::mem::take(&mut data), DATA_PIECE, |_, _| {})?;
                st.space_mut().release_deferred();
                st.forget_freed();
                let blocks = self.snapshot(st, state);
                let late = std::mem::replace(&mut inplace, InPlace::new(room)).pages;
                journal.commit(&**st.dev(), &blocks, &late_refs(&late))?;
                st.landed(&blocks);
            }
        }
        st.space_mut().clear_promises();
        if data.is_empty()
            && inplace.pages.is_empty()
            && st.dirty_count() == 0
            && st.space_mut().pending_bitmap_blocks() == 0
        {
            self.in_flight.get_mut().clear();
            *self.any_in_flight.get_mut() = false;
            return Ok(None);
        }
        let held = st.space_mut().begin_hold();
        st.freed_to_flight();
        let flushed_data = self.flushed_data;
        let blocks = self.snapshot(st, state);
        st.space_mut().keep_held(&held);
        let pages: usize = data.iter().map(|w| w.pages.len()).sum();
        let late = inplace.pages;
        let one_flush = st.sb.one_flush_commit()
            && !flushed_data
            && pages <= LOGGED_DATA_PAGES
            && blocks.len() + pages + late.len() <= self.log_capacity as usize;
        Ok(Some(Flight { blocks, held, data, late, one_flush }))
    }

    /// Seal the delta's metadata (bitmap and state block included) for the log.
    fn snapshot(&mut self, st: &mut Store, state: &mut State) -> Vec<(u64, Box<Block>)> {
        *self.epoch.get_mut() += 1;
        self.flushed_data = false;
        self.seq += 1;
        state.commit_seq = self.seq;
        if let Err(e) = st.fold_rstats() {
            // The counters are then off until fsck rebuilds them; the delta is sound.
            tracing::error!("rstats: {e}");
        }
        if let Some(t) = st.lazy_frees() {
            state.lazy_frees = t;
        }
        if let Some(t) = st.rstat_tree() {
            state.rstats = t;
        }
        state.encode_into(st.tx().fresh_block(STATE_BLOCK));
        st.take_dirty()
    }

    /// A flight is durable and home: release what it held.
    pub(super) fn finish_commit(&mut self, st: &mut Store, f: &Flight) {
        st.space_mut().end_hold(&f.held);
        st.flight_landed();
        st.landed(&f.blocks);
    }

    /// The log committed an empty delta of its own (a checkpoint).
    pub(super) fn checkpointed(&mut self, seq: u64) {
        self.seq = seq;
    }
}

impl Inner {
    /// Write back and snapshot the delta (see [`Delta::prepare_commit`]); `stamp` is the
    /// linearization stamp of the lock hold doing it, recorded with the sequence number of
    /// every delta it seals when [`Volume::record_commit_stamps`] asked for it.
    pub(super) fn prepare_commit(&mut self, journal: &mut Journal, stamp: u64) -> Result<Option<Flight>> {
        self.list_held()?;
        self.sync_counters();
        let before = self.delta.seq;
        let r = self.delta.prepare_commit(&mut self.st, &mut self.life.get_mut().state, journal);
        if r.is_ok() {
            self.quotas_snapshotted();
        }
        if let Some(log) = self.commit_stamps.get_mut() {
            log.extend((before + 1..=self.delta.seq).map(|seq| (seq, stamp)));
        }
        r
    }

    pub(super) fn finish_commit(&mut self, f: &Flight) {
        self.delta.finish_commit(&mut self.st, f)
    }
}

/// What the tests of the delta's parts share.
#[cfg(test)]
mod testing {

    use super::*;
    use crate::disk::device::MemDevice;
    use crate::engine::cache::MetaCache;
    use crate::engine::space::Space;

    /// A store over a blank 4096-block memory device (nothing on it is read here).
    pub(super) fn store() -> Store {
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

    pub(super) fn file(ino: u64) -> Inode {
        Inode::new(ino, libc::S_IFREG | 0o644)
    }

    pub(super) fn page() -> Box<[u8; BLOCK_SIZE]> {
        Box::new([0u8; BLOCK_SIZE])
    }
}
