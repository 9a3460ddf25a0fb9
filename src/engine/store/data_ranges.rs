//! Runs of blocks known to hold file data, so that an overwrite in place checks its
//! block on the device once (`Store::overwritable_data`) and not at all for blocks this
//! mount wrote itself. Adjacent runs merge: a file written sequentially is one entry.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

/// Most runs kept; past it the set starts again empty (blocks are then read once more).
const MAX_RUNS: usize = 16_384;

/// Disjoint, non-adjacent half-open runs `[start, end)`, keyed by start.
#[derive(Default)]
pub(super) struct DataRanges {
    runs: BTreeMap<u64, u64>,
}

impl DataRanges {
    pub(super) fn contains(&self, b: u64) -> bool {
        self.runs.range(..=b).next_back().is_some_and(|(_, &e)| b < e)
    }

    /// Add `[start, end)`, merged with the runs it overlaps or touches.
    pub(super) fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        if let Some((&ps, &pe)) = self.runs.range(..=start).next_back() {
            if pe >= start {
                s = ps;
                e = e.max(pe);
            }
        }
        let absorbed: Vec<(u64, u64)> = self.runs.range(s..=e).map(|(&a, &b)| (a, b)).collect();
        for (a, b) in absorbed {
            self.runs.remove(&a);
            e = e.max(b);
        }
        if self.runs.len() >= MAX_RUNS {
            self.runs.clear();
        }
        self.runs.insert(s, e);
    }

    /// Take `[start, end)` out, splitting the runs it cuts.
    pub(super) fn remove(&mut self, start: u64, end: u64) {
        if start >= end || self.runs.is_empty() {
            return;
        }
        let first = self.runs.range(..start).next_back().map_or(start, |(&s, _)| s);
        let hit: Vec<(u64, u64)> =
            self.runs.range(first..end).map(|(&a, &b)| (a, b)).filter(|&(_, b)| b > start).collect();
        for (a, b) in hit {
            self.runs.remove(&a);
            if a < start {
                self.runs.insert(a, start);
            }
            if b > end {
                self.runs.insert(end, b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a model (a set of blocks): inserts and removes of random runs.
        #[test]
        fn ranges_match_a_set_of_blocks(ops in proptest::collection::vec((any::<bool>(), 0u64..200, 0u64..40), 1..60)) {
            let mut r = DataRanges::default();
            let mut model = std::collections::BTreeSet::new();
            for (add, start, len) in ops {
                if add {
                    r.insert(start, start + len);
                    model.extend(start..start + len);
                } else {
                    r.remove(start, start + len);
                    for b in start..start + len {
                        model.remove(&b);
                    }
                }
                for b in 0..260 {
                    prop_assert_eq!(r.contains(b), model.contains(&b), "block {}", b);
                }
                // Disjoint and never adjacent: merged as they should be.
                let runs: Vec<(u64, u64)> = r.runs.iter().map(|(&a, &b)| (a, b)).collect();
                for w in runs.windows(2) {
                    prop_assert!(w[0].1 < w[1].0, "{:?}", runs);
                }
            }
        }
    }
}
