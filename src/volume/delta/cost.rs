//! What a change costs and whether it fits: an operation charges its worst case before
//! it changes anything (log room, dirty-data limits, blocks of the space budget, Tux3's
//! rule), and settles it when it ends.

use super::{Delta, RUN_LIMIT};
use crate::disk::format::Inode;
use crate::engine::space::Claim;
use crate::engine::store::Store;
use crate::volume::{Inner, OP_LOG_BLOCKS};

/// What an operation may need, charged before it changes anything.
#[derive(Clone, Copy, Debug)]
pub(in crate::volume) struct Cost {
    /// Worst-case new metadata blocks.
    pub(in crate::volume) meta: u64,
    /// New data pages (delayed allocation: blocks promised until write-back).
    pub(in crate::volume) pages: u64,
    /// The kept room it may use: deletions the reserve, write-back the room kept for it.
    pub(in crate::volume) claim: Claim,
}

impl Cost {
    pub(in crate::volume) fn new(meta: u64, pages: u64, deletion: bool) -> Cost {
        Cost { meta, pages, claim: if deletion { Claim::Deletion } else { Claim::Change } }
    }

    /// The same cost, for a cache's write-back of data it accepted (not for a deletion,
    /// which may use more).
    pub(in crate::volume) fn as_write_back(self) -> Cost {
        let claim = if self.claim == Claim::Change { Claim::WriteBack } else { self.claim };
        Cost { claim, ..self }
    }
}

/// Why a charge does not fit in the current delta.
#[derive(PartialEq, Eq)]
pub(in crate::volume) enum Short {
    /// The log is near full: commit, then it fits.
    Delta,
    /// The dirty-data limit (pages, or runs of pages) is reached: commit, then it fits;
    /// while a commit is already writing, up to twice the limit may wait for the next.
    Dirty,
    /// Not enough space, perhaps until the delta's frees are released.
    Space,
    /// Not even an empty delta with no other operation beside it has room for it: the
    /// log is smaller than one operation's room.
    Never,
}

impl Delta {
    /// Whether a change of cost `c` fits in the current delta beside the operations
    /// already running: room in the log for this one and each of them, the dirty-data
    /// limit, and the space budget. Checks only; [`Delta::reserve`] takes the room.
    pub(in crate::volume) fn fits(&self, st: &Store, c: Cost, dirty_factor: u64) -> std::result::Result<(), Short> {
        self.check(st, c, dirty_factor, self.log_reserved(), |n, claim| {
            st.space().available(claim) + st.leased_idle() >= n
        })
    }

    /// Reserve what an operation of cost `c` may need, if it fits (as [`Delta::fits`]
    /// checks, with the dirty limits times `dirty_factor`): its log room and its worst
    /// case of blocks, both given back by [`Delta::release`] when it ends. Taking the
    /// room and checking it are one step, so operations running at once cannot all take
    /// the last of it; a change that needs no block takes no lock.
    pub(in crate::volume) fn reserve(&self, st: &Store, c: Cost, dirty_factor: u64) -> std::result::Result<(), Short> {
        self.log_reserved.add(OP_LOG_BLOCKS as i64);
        let others = self.log_reserved().saturating_sub(OP_LOG_BLOCKS);
        let r = self.check(st, c, dirty_factor, others, |n, claim| st.reserve_blocks(n, claim));
        if r.is_err() {
            self.log_reserved.add(-(OP_LOG_BLOCKS as i64));
        }
        r
    }

    /// The checks of [`Delta::fits`] and [`Delta::reserve`]: log room beside `others`
    /// blocks of it held by running operations, the dirty limits times `dirty_factor`,
    /// then `blocks(n, claim)` for the worst case of blocks.
    fn check(
        &self,
        st: &Store,
        c: Cost,
        dirty_factor: u64,
        others: u64,
        blocks: impl FnOnce(u64, Claim) -> bool,
    ) -> std::result::Result<(), Short> {
        // The write-back's worst case counts as already logged: a delta commits before
        // its write-back could overflow the log (see `Delta::writeback_log`).
        // So do the rstat leaves its snapshot will rewrite (`Store::mark_rstats`).
        let used = (st.dirty_count() + st.pending_bitmap_blocks()) as u64 + self.writeback_log() + st.rstat_leaves();
        if used + others + OP_LOG_BLOCKS > self.log_capacity {
            return Err(if OP_LOG_BLOCKS > self.log_capacity { Short::Never } else { Short::Delta });
        }
        // Only changes that dirty pages are held back by the dirty-data limits (a delta
        // may be past them while a commit is writing: see `charged_with`).
        let pages = self.dirty_pages();
        if c.pages > 0
            && ((pages > 0 && pages + c.pages > self.dirty_limit * dirty_factor)
                || self.dirty_runs() >= RUN_LIMIT * dirty_factor)
        {
            return Err(Short::Dirty);
        }
        if self.accounting && !blocks(c.meta + c.pages, c.claim) {
            return Err(Short::Space);
        }
        Ok(())
    }

    /// An operation that reserved for cost `c` has ended, having used `used` blocks of the
    /// budget.
    pub(in crate::volume) fn release(&self, st: &Store, c: Cost, used: u64) {
        self.log_reserved.add(-(OP_LOG_BLOCKS as i64));
        if self.accounting {
            st.release_blocks(c.meta + c.pages, used);
        }
    }

    /// Log room reserved by operations now running.
    pub(in crate::volume) fn log_reserved(&self) -> u64 {
        self.log_reserved.sum().max(0) as u64
    }

    /// Whether a change of cost `c` fits in twice the dirty-data limits, counting the
    /// `pages` and `runs` a running commit has not written yet: how far a writer may run
    /// ahead of that commit.
    pub(in crate::volume) fn room_beside(&self, c: Cost, pages: u64, runs: u64) -> bool {
        self.dirty_pages() + pages + c.pages <= 2 * self.dirty_limit && self.dirty_runs() + runs < 2 * RUN_LIMIT
    }

    /// Metadata the write-back of a file's dirty pages may need, growing from `before` to
    /// `after` pages: the first page of a file in a delta charges an extent-map change (a
    /// removal and an insert, each splitting at most every level, plus the inline-to-tree
    /// move), and every 64 pages one more block (at least 64 extent records fit in the
    /// half-full leaf a split leaves).
    pub(in crate::volume) fn writeback_meta(before: u64, after: u64, depth: u64) -> u64 {
        let first = if before == 0 && after > 0 { 2 * depth + 4 } else { 0 };
        first + after.div_ceil(64) - before.div_ceil(64)
    }
}

impl Inner {
    /// Worst-case new blocks of one directory-index insert: a split at every level plus
    /// a new root.
    pub(in crate::volume) fn dir_cost(d: &Inode) -> u64 {
        d.dir().map_or(2, |d| d.tree.depth as u64 + 2)
    }

    /// Blocks charged to take an inode slot: one inode block (a new region is sized to
    /// what the budget allows, and is at least that one block).
    /// A new directory's rstat record may split the rstat tree (`rstat_cost`): charged
    /// for every create, which is simpler than telling them apart and costs nothing kept.
    pub(in crate::volume) fn inode_cost(&self) -> u64 {
        1 + self.rstat_cost()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{file, page, store};
    use super::*;
    use crate::volume::OpenOptions;

    #[test]
    fn fits_tells_a_full_delta_from_a_full_volume() {
        let mut st = store();
        let opts = OpenOptions { dirty_limit: 4, ..OpenOptions::default() };
        let d = Delta::new(0, 256, &opts);
        assert!(d.fits(&st, Cost::new(3, 2, false), 1).is_ok());
        let a = file(33);
        for p in 0..3 {
            d.add_page(&st, &a, p, page());
        }
        assert!(d.fits(&st, Cost::new(0, 1, false), 1).is_ok());
        assert!(d.fits(&st, Cost::new(0, 2, false), 1) == Err(Short::Dirty), "past the dirty limit: commit first");
        let avail = st.space_mut().available(Claim::Change);
        assert!(d.fits(&st, Cost::new(avail + 1, 0, false), 1) == Err(Short::Space));
        assert!(d.fits(&st, Cost::new(avail + 1, 0, true), 1).is_ok(), "deletions may use the reserve");
        let small_log = Delta::new(0, OP_LOG_BLOCKS, &opts);
        assert!(small_log.fits(&st, Cost::new(0, 0, true), 1) == Err(Short::Delta), "no log room for one operation");
        let off = Delta::new(0, 256, &OpenOptions { space_accounting: false, ..opts });
        assert!(off.fits(&st, Cost::new(avail + 1000, 0, false), 1).is_ok(), "accounting off never says Space");
    }

    /// Dirty pages count against the log's room by what their write-back may log, so a
    /// delta commits before its write-back could overflow the log (which would split it).
    #[test]
    fn the_write_backs_worst_case_takes_log_room() {
        let st = store();
        let opts = OpenOptions { dirty_limit: 1 << 20, ..OpenOptions::default() };
        let capacity = OP_LOG_BLOCKS + 30;
        let d = Delta::new(0, capacity, &opts);
        assert!(d.fits(&st, Cost::new(1, 1, false), 1).is_ok());
        // Scattered pages of a few files: no dirty metadata yet, but their write-back
        // would change an extent leaf per run.
        for ino in 33..36 {
            for p in 0..4 {
                d.add_page(&st, &file(ino), 2 * p, page());
            }
        }
        assert_eq!(st.dirty_count(), 0);
        assert!(d.writeback_log() >= 2 * 12, "two blocks a run at least: {}", d.writeback_log());
        assert!(d.writeback_log() + OP_LOG_BLOCKS > capacity);
        assert!(d.fits(&st, Cost::new(1, 0, false), 1) == Err(Short::Delta), "commit first");
        let roomy = Delta::new(0, capacity + d.writeback_log(), &opts);
        assert!(roomy.fits(&st, Cost::new(1, 0, false), 1).is_ok());
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
