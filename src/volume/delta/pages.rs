//! The delta's dirty file pages: a table of files, sharded, each with its pages (delayed
//! allocation: each promised one block), the overwrites among them and the extent-map
//! blocks promised for their write-back; and the runs of consecutive pages, which bound a
//! delta (`RUN_LIMIT`).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use super::Delta;
use crate::disk::codec::BLOCK_SIZE;
use crate::disk::format::Inode;
use crate::engine::store::Store;
use crate::fs::file::Pages;
use crate::volume::extent_depth;

/// One file's part of the delta.
#[derive(Default)]
pub(super) struct FileDelta {
    pub(super) pages: Pages,
    /// Dirty pages over blocks the file already has (overwrites, or writes into a
    /// preallocated range): their write-back swaps a block for a block, so they add
    /// nothing to the file's block count.
    pub(super) overwrites: BTreeSet<u64>,
    /// Extent-map blocks promised for the write-back of its dirty pages (the
    /// `writeback_meta` of each page made dirty): settled when a flush ahead of the commit
    /// writes back all of the file's pages, so flushing does not promise them twice.
    pub(super) meta_promised: u64,
}

impl FileDelta {
    pub(super) fn is_empty(&self) -> bool {
        self.pages.is_empty() && self.overwrites.is_empty() && self.meta_promised == 0
    }
}

/// Runs of consecutive pages in `pages`.
pub(super) fn runs(pages: &Pages) -> u64 {
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
    /// Run `f` over a file's dirty pages, if it has any, with its table shard locked: `f`
    /// takes no lock (the table's shards are leaves; a cache block is below them only for a
    /// `Tx`, which may hold one while it looks a file up here).
    pub(in crate::volume) fn with_pages<R>(&self, ino: u64, f: impl FnOnce(Option<&Pages>) -> R) -> R {
        let m = self.files.shard(ino);
        f(m.get(&ino).map(|d| &d.pages).filter(|p| !p.is_empty()))
    }

    /// Number of dirty pages of a file.
    pub(in crate::volume) fn page_count(&self, ino: u64) -> u64 {
        self.files.shard(ino).get(&ino).map_or(0, |d| d.pages.len() as u64)
    }

    /// Dirty pages of a file among pages `first..=last`.
    pub(in crate::volume) fn pages_in(&self, ino: u64, first: u64, last: u64) -> u64 {
        self.files.shard(ino).get(&ino).map_or(0, |d| d.pages.range(first..=last).count() as u64)
    }

    /// Copy `bytes` into dirty page `p` of `ino` at `at`, if that page is dirty; whether
    /// it was.
    pub(in crate::volume) fn write_page(&self, ino: u64, p: u64, at: usize, bytes: &[u8]) -> bool {
        let mut m = self.files.shard(ino);
        match m.get_mut(&ino).and_then(|d| d.pages.get_mut(&p)) {
            Some(page) => {
                page[at..at + bytes.len()].copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }

    /// Whether page `p` of `ino` is dirty.
    pub(in crate::volume) fn has_page(&self, ino: u64, p: u64) -> bool {
        self.files.shard(ino).get(&ino).is_some_and(|d| d.pages.contains_key(&p))
    }

    /// Dirty pages of a file that will need blocks it does not have yet (what `stat`
    /// counts beyond the blocks already mapped).
    pub(in crate::volume) fn new_page_count(&self, ino: u64) -> u64 {
        self.files.shard(ino).get(&ino).map_or(0, |d| d.pages.len() as u64 - d.overwrites.len() as u64)
    }

    /// Page `p` of `ino`, just made dirty, lies over a block the file already has.
    pub(in crate::volume) fn mark_overwrite(&self, ino: u64, p: u64) {
        self.files.shard(ino).entry(ino).or_default().overwrites.insert(p);
    }

    /// Make page `p` of inode `i` dirty with contents `page`, promising its block and its
    /// share of the write-back's extent-map changes.
    pub(in crate::volume) fn add_page(&self, st: &Store, i: &Inode, p: u64, page: Box<[u8; BLOCK_SIZE]>) {
        let meta = {
            let mut m = self.files.shard(i.ino);
            let d = m.entry(i.ino).or_default();
            let before = d.pages.len() as u64;
            let (left, right) = (p > 0 && d.pages.contains_key(&(p - 1)), d.pages.contains_key(&(p + 1)));
            if d.pages.insert(p, page).is_none() {
                // A page alone starts a run; one between two runs joins them.
                match (left, right) {
                    (false, false) => {
                        self.dirty_runs.fetch_add(1, Ordering::Relaxed);
                    }
                    (true, true) => {
                        self.dirty_runs.fetch_sub(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
            let meta = Self::writeback_meta(before, before + 1, extent_depth(i));
            d.meta_promised += meta;
            self.meta_promised.fetch_add(meta, Ordering::Relaxed);
            meta
        };
        self.dirty_pages.fetch_add(1, Ordering::Relaxed);
        st.promise(1, meta);
    }

    /// Drop the dirty pages of `ino` that `which` selects (truncate, punch, delete); their
    /// promised blocks go back to the budget.
    pub(in crate::volume) fn drop_pages(&self, st: &Store, ino: u64, which: impl Fn(u64) -> bool) {
        let n = {
            let mut m = self.files.shard(ino);
            let Some(d) = m.get_mut(&ino) else { return };
            d.overwrites.retain(|p| !which(*p));
            let before = d.pages.len();
            let runs_before = runs(&d.pages);
            d.pages.retain(|p, _| !which(*p));
            let n = (before - d.pages.len()) as u64;
            let runs_after = runs(&d.pages);
            self.dirty_runs.fetch_add(runs_after, Ordering::Relaxed);
            self.dirty_runs.fetch_sub(runs_before, Ordering::Relaxed);
            if d.is_empty() {
                m.remove(&ino);
            }
            n
        };
        self.dirty_pages.fetch_sub(n, Ordering::Relaxed);
        if n > 0 {
            st.space().settle_pages(n);
        }
    }

    /// Move the dirty pages of `ino` at or after page `from` by `delta` pages (collapse
    /// and insert range); the pages they move onto are not dirty.
    pub(in crate::volume) fn shift_pages(&self, ino: u64, from: u64, delta: i64) {
        let mut m = self.files.shard(ino);
        let Some(d) = m.get_mut(&ino) else { return };
        let moved = d.overwrites.split_off(&from);
        d.overwrites.extend(moved.into_iter().map(|p| p.saturating_add_signed(delta)));
        let runs_before = runs(&d.pages);
        let moved = d.pages.split_off(&from);
        for (p, page) in moved {
            d.pages.insert(p.saturating_add_signed(delta), page);
        }
        let runs_after = runs(&d.pages);
        self.dirty_runs.fetch_add(runs_after, Ordering::Relaxed);
        self.dirty_runs.fetch_sub(runs_before, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{file, page, store};
    use super::super::RUN_LIMIT;
    use super::*;
    use crate::engine::space::Claim;
    use crate::volume::delta::{Cost, Short};
    use crate::volume::OpenOptions;

    #[test]
    fn pages_promise_blocks_and_give_them_back() {
        let mut st = store();
        let opts = OpenOptions::default();
        let d = Delta::new(7, 256, &opts);
        let free = st.space_mut().available(Claim::Change);
        let (a, b) = (file(33), file(34));
        for p in 0..3 {
            d.add_page(&st, &a, p, page());
        }
        d.add_page(&st, &b, 9, page());
        // Three pages of one file and one of another: a data block each, plus the first
        // page's extent-map change and one block per 64 pages, for each file.
        let meta = Delta::writeback_meta(0, 3, 0) + Delta::writeback_meta(0, 1, 0);
        assert_eq!(st.space_mut().promised(), 4 + meta);
        assert_eq!(free - st.space_mut().available(Claim::Change), st.space_mut().promised());
        assert_eq!((d.page_count(33), d.pages_in(33, 1, 5), d.page_count(34)), (3, 2, 1));
        d.drop_pages(&st, 33, |p| p >= 1);
        assert_eq!(d.page_count(33), 1);
        d.drop_pages(&st, 34, |_| true);
        assert!(d.with_pages(34, |p| p.is_none()), "a file with no dirty page leaves the delta");
        assert_eq!(d.dirty_pages(), 1);
        st.space_mut().clear_promises();
        assert_eq!(st.space_mut().available(Claim::Change), free);
    }

    #[test]
    fn runs_of_dirty_pages_are_counted_and_limit_the_delta() {
        let mut st = store();
        let opts = OpenOptions { dirty_limit: 1 << 20, ..OpenOptions::default() };
        let d = Delta::new(0, 1 << 20, &opts);
        let (a, b) = (file(33), file(34));
        for p in [1, 3, 5] {
            d.add_page(&st, &a, p, page());
        }
        assert_eq!(d.dirty_runs(), 3);
        d.add_page(&st, &a, 2, page()); // joins 1 and 3
        d.add_page(&st, &a, 6, page()); // extends 5
        d.add_page(&st, &b, 1, page()); // another file: a run of its own
        assert_eq!(d.dirty_runs(), 3);
        d.drop_pages(&st, 33, |p| p == 2); // splits 1..=3 again
        assert_eq!(d.dirty_runs(), 4);
        d.shift_pages(33, 5, -1); // 5, 6 move onto 4, 5, next to 3
        assert_eq!(d.dirty_runs(), 3);
        let mut total = 0;
        let mut d = d;
        d.files.for_each(|m| total += m.values().map(|f| runs(&f.pages)).sum::<u64>());
        assert_eq!(d.dirty_runs(), total);
        // Scattered pages up to the run limit: the next page needs a commit first.
        let c = file(35);
        for k in 0..RUN_LIMIT - 3 {
            d.add_page(&st, &c, 2 * k, page());
        }
        assert_eq!(d.dirty_runs(), RUN_LIMIT);
        assert!(matches!(d.fits(&st, Cost::new(1, 1, false), 1), Err(Short::Dirty)));
        assert!(
            !matches!(d.fits(&st, Cost::new(1, 0, false), 1), Err(Short::Dirty)),
            "an operation with no page still fits"
        );
        st.space_mut().clear_promises();
    }
}
