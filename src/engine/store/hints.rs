//! The xattr sharing hints: which block holds a given xattr list, so that an inode
//! storing a list another inode stored already shares that block.

/// Xattr blocks remembered for sharing: enough for the distinct lists of a working set
/// (ACL-heavy trees have a handful), few enough that the index stays small.
pub(crate) const XATTR_SHARE_HINTS: usize = 4096;

/// A bounded map of hints from a content hash to the block holding that content, kept
/// both ways so a freed block's hint goes in O(1). Hints are checked on use, so one that
/// is evicted (oldest first) or stale costs only a missed chance to share.
pub struct BlockHints {
    by_hash: rustc_hash::FxHashMap<u64, u64>,
    by_block: rustc_hash::FxHashMap<u64, u64>,
    /// Hashes in insertion order, for eviction; may hold hashes already gone.
    order: std::collections::VecDeque<u64>,
    cap: usize,
}

impl BlockHints {
    pub fn new(cap: usize) -> BlockHints {
        BlockHints {
            by_hash: Default::default(),
            by_block: Default::default(),
            order: Default::default(),
            cap: cap.max(1),
        }
    }

    /// The block last recorded for `hash`.
    pub fn get(&self, hash: u64) -> Option<u64> {
        self.by_hash.get(&hash).copied()
    }

    /// Number of hints held (at most the capacity).
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether no hint is held.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// Remember that `block` holds the content of `hash`, evicting the oldest hint past
    /// the capacity.
    pub fn insert(&mut self, hash: u64, block: u64) {
        self.forget_hash(hash);
        self.forget_block(block);
        self.by_hash.insert(hash, block);
        self.by_block.insert(block, hash);
        self.order.push_back(hash);
        while self.by_hash.len() > self.cap {
            match self.order.pop_front() {
                Some(h) => self.forget_hash(h),
                None => break,
            }
        }
        if self.order.len() > 2 * self.cap {
            // Drop the queue's entries for hints already gone (amortised O(1)).
            let live = &self.by_hash;
            self.order.retain(|h| live.contains_key(h));
        }
    }

    pub fn forget_hash(&mut self, hash: u64) {
        if let Some(b) = self.by_hash.remove(&hash) {
            self.by_block.remove(&b);
        }
    }

    pub fn forget_block(&mut self, block: u64) {
        if let Some(h) = self.by_block.remove(&block) {
            self.by_hash.remove(&h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_hints_are_bounded_and_found_both_ways() {
        let mut h = BlockHints::new(100);
        for i in 0..10_000u64 {
            h.insert(i * 7, 1_000_000 + i);
        }
        assert_eq!(h.len(), 100, "bounded");
        assert!(h.order.len() <= 200, "the eviction queue stays bounded too");
        assert_eq!(h.get(9_999 * 7), Some(1_000_000 + 9_999), "the newest is kept");
        assert_eq!(h.get(0), None, "the oldest went");
        h.forget_block(1_000_000 + 9_999);
        assert_eq!(h.get(9_999 * 7), None, "forgotten by block");
        h.insert(5, 42);
        h.insert(6, 42);
        assert_eq!((h.get(5), h.get(6)), (None, Some(42)), "a block holds one content");
    }
}
