//! The delta: what the front end changed since the last commit, its budget, and its
//! commit (write-back, snapshot, log, release).

use parking_lot::MutexGuard;

use crate::disk::codec::*;
use crate::disk::device::BlockDevice;
use crate::disk::format::*;
use crate::engine::log::Journal;
use crate::error::{Error, Result};
use crate::fs::file;

use super::*;

/// A delta on its way to the device: its metadata blocks and the frees held back until
/// it is durable.
pub(super) struct Flight {
    pub(super) blocks: Vec<(u64, Box<Block>)>,
    pub(super) held: Vec<(u64, u64)>,
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
    /// The log or the dirty-data limit is near: commit, then it fits.
    Delta,
    /// Not enough space, perhaps until the delta's frees are released.
    Space,
}

impl Inner {
    /// Whether a change of cost `c` fits in the current delta: room in the log for any
    /// one operation, the dirty-data limit, and the space budget.
    pub(super) fn fits(&self, c: Cost) -> std::result::Result<(), Short> {
        let used = (self.st.cache.dirty_count() + self.st.space.pending_bitmap_blocks()) as u64;
        if used + OP_LOG_BLOCKS > self.log_capacity
            || (self.dirty_pages > 0 && self.dirty_pages + c.pages > self.opts.dirty_limit)
        {
            return Err(Short::Delta);
        }
        if self.opts.space_accounting && self.st.space.available(c.deletion) < c.meta + c.pages {
            return Err(Short::Space);
        }
        Ok(())
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

    /// Metadata the write-back of a file's dirty pages may need, growing from `before` to
    /// `after` pages: the first page of a file in a delta charges an extent-map change (a
    /// removal and an insert, each splitting at most every level, plus the inline-to-tree
    /// move), and every 64 pages one more block (at least 64 extent records fit in the
    /// half-full leaf a split leaves).
    pub(super) fn writeback_meta(before: u64, after: u64, depth: u64) -> u64 {
        let first = if before == 0 && after > 0 { 2 * depth + 4 } else { 0 };
        first + after.div_ceil(64) - before.div_ceil(64)
    }

    /// Add `n` new dirty pages of inode `i` to the delta's promises.
    pub(super) fn promise_pages(&mut self, i: &Inode, before: u64, n: u64) {
        self.dirty_pages += n;
        self.st.space.promised += n;
        self.st.space.promised_meta += Self::writeback_meta(before, before + n, extent_depth(i));
    }

    /// The cost of creating an entry in `parent`.
    pub(super) fn create_cost(&mut self, parent: u64) -> Result<Cost> {
        let p = self.dir_inode(parent)?;
        Ok(Cost::new(Self::dir_cost(&p) + self.inode_cost(), 0, false))
    }

    /// Write back all dirty data and snapshot the delta for the journal. When the log
    /// fills during write-back, the delta so far is committed synchronously (it is a
    /// consistent state) and write-back goes on in a new one. Returns None when there is
    /// nothing to commit.
    pub(super) fn prepare_commit(&mut self, journal: &mut Journal) -> Result<Option<Flight>> {
        let mut inos: Vec<u64> = self.dirty.keys().copied().collect();
        inos.sort_unstable();
        if !inos.is_empty() {
            self.epoch += 1;
        }
        let limit = (self.log_capacity as usize).saturating_sub(WRITEBACK_HEADROOM);
        for ino in inos {
            let mut pages = self.dirty.remove(&ino).unwrap_or_default();
            let mut inode = self.st.inode(ino)?;
            loop {
                let n = file::writeback(&mut self.st, &mut inode, &mut pages, limit)?;
                self.st.put_inode(&inode)?;
                self.dirty_pages -= n;
                self.st.space.promised = self.st.space.promised.saturating_sub(n);
                if pages.is_empty() {
                    break;
                }
                self.st.space.release_deferred();
                self.st.freed_meta.clear();
                let blocks = self.snapshot();
                journal.commit(&*self.st.dev, &blocks)?;
                self.st.cache.landed(&blocks);
            }
        }
        self.st.space.promised = 0;
        self.st.space.promised_meta = 0;
        if self.st.cache.dirty_count() == 0 && self.st.space.pending_bitmap_blocks() == 0 {
            return Ok(None);
        }
        let held = self.st.space.begin_hold();
        self.st.freed_in_flight = std::mem::take(&mut self.st.freed_meta);
        let blocks = self.snapshot();
        self.st.space.keep_held(&held);
        Ok(Some(Flight { blocks, held }))
    }

    /// Seal the delta's metadata (bitmap and state block included) for the journal.
    pub(super) fn snapshot(&mut self) -> Vec<(u64, Box<Block>)> {
        self.epoch += 1;
        self.seq += 1;
        self.state.commit_seq = self.seq;
        let st = self.state;
        st.encode_into(self.st.cache.fresh(STATE_BLOCK));
        let dev = self.st.dev.clone();
        // write_out cannot fail: it only copies words into cached blocks.
        let _ = self.st.space.write_out(&*dev, &mut self.st.cache);
        self.st.cache.take_dirty()
    }

    /// A flight is durable and home: release what it held.
    pub(super) fn finish_commit(&mut self, f: &Flight) {
        self.st.space.end_hold(&f.held);
        self.st.freed_in_flight.clear();
        self.st.cache.landed(&f.blocks);
    }
}

impl Volume {
    /// Commit the current delta and wait until it is durable.
    pub(super) fn commit(&self) -> Result<()> {
        let mut journal = self.journal.lock();
        let flight = {
            let mut g = self.inner.lock();
            if g.failed {
                return Err(Error::Io(std::io::Error::other("volume failed; remount to recover")));
            }
            if g.opts.read_only {
                return Ok(());
            }
            match g.prepare_commit(&mut journal) {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(()),
                Err(e) => {
                    g.failed = true;
                    return Err(e);
                }
            }
        };
        // The log and home writes run without the volume lock: the front end goes on
        // with the next delta meanwhile.
        let dev = self.inner.lock().st.dev.clone();
        let r = journal.commit(&*dev, &flight.blocks);
        let mut g = self.inner.lock();
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

    /// Lock the volume for a change whose cost `cost` computes; if the current delta
    /// cannot take it, commit and try again; fail with ENOSPC only when a fresh delta
    /// still cannot.
    pub(super) fn charged(&self, cost: impl Fn(&mut Inner) -> Result<Cost>) -> Result<MutexGuard<'_, Inner>> {
        let mut commits = 0;
        loop {
            let mut g = self.inner.lock();
            g.check_writable()?;
            let c = cost(&mut g)?;
            match g.fits(c) {
                Ok(()) => return Ok(g),
                Err(Short::Space) if !g.st.space.could_fit_after_commit(c.meta + c.pages, c.deletion) => {
                    return Err(Error::NoSpace)
                }
                Err(Short::Space) if commits > 0 && g.st.space.deferred() == 0 => return Err(Error::NoSpace),
                Err(_) if commits >= 2 => {
                    return Err(if g.fits(c) == Err(Short::Space) {
                        Error::NoSpace
                    } else {
                        Error::corrupt("an operation does not fit in an empty delta")
                    })
                }
                Err(_) => {
                    drop(g);
                    self.commit()?;
                    commits += 1;
                }
            }
        }
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
        self.checkpoint()
    }

    /// After the last commit: make its home writes durable and commit an empty delta, so
    /// the next open has nothing to replay (a clean unmount; replaying would read and
    /// rewrite the whole last delta).
    pub(super) fn checkpoint(&self) -> Result<()> {
        let mut journal = self.journal.lock();
        let mut g = self.inner.lock();
        if g.failed || g.opts.read_only || journal.last_blocks == 0 || g.st.cache.dirty_count() > 0 {
            return Ok(());
        }
        let dev = g.st.dev.clone();
        dev.flush()?;
        journal.commit(&*dev, &[])?;
        g.seq = journal.seq;
        Ok(())
    }
}
