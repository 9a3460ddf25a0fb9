//! The kernel's lookup references, counted to show that FORGETs balance them, and
//! whether the attributes it holds of each are fresh (READDIRPLUS leaves those out).

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::engine::leaf::Sharded;

/// The kernel's references to inodes: every entry reply (LOOKUP, CREATE, MKNOD, MKDIR,
/// SYMLINK, LINK, and each READDIRPLUS entry but `.` and `..`) adds one, FORGET takes
/// them back. An inode the kernel references outlives its last link (the volume asks,
/// see `Volume::set_holder`): the kernel may have it open without having told the daemon
/// (zero-message opens). At the end of the session they show whether FORGETs balanced.
/// Sharded as the volume's open handles are (inodes of one directory region together),
/// so that lookups on different CPUs do not take turns on one lock: a single one cost
/// 4% of the daemon's time in a cold `git status` (14,000 LOOKUPs).
///
/// Each held inode also remembers until when the attributes the kernel was last handed
/// with an entry stay valid there, unless a request about the inode since may have made
/// the kernel drop them (see `Server::touched`): a READDIRPLUS leaves those out. And
/// whether the kernel may hold some of its data in its page cache: only a READ fills
/// the page cache, and only a WRITE from a descriptor without O_DIRECT (a write-back,
/// flagged `FUSE_WRITE_CACHE`, or a write through the cache when it is off) leaves a
/// written page there, so an inode the kernel took and sent neither for holds none; the
/// kernel drops them all when it evicts the inode (the last FORGET).
pub(super) struct LookupCounts {
    held: Sharded<FxHashMap<u64, Held>>,
    /// How long attributes handed out with an entry count as fresh.
    fresh_for: Duration,
}

struct Held {
    refs: u64,
    fresh_until: Option<Instant>,
    /// The kernel may hold some of the inode's data in its page cache.
    cached: bool,
}

impl LookupCounts {
    /// Attributes handed out with an entry count as fresh for `fresh_for` (zero: never).
    pub(super) fn new(fresh_for: Duration) -> LookupCounts {
        LookupCounts { held: Sharded::new(10), fresh_for }
    }

    /// One more reference, handed out with the inode's attributes.
    pub(super) fn add(&self, ino: u64) {
        let fresh_until = (!self.fresh_for.is_zero()).then(|| Instant::now() + self.fresh_for);
        let mut m = self.held.shard(ino);
        let h = m.entry(ino).or_insert(Held { refs: 0, fresh_until: None, cached: false });
        h.refs += 1;
        h.fresh_until = fresh_until;
    }

    /// A request about `ino` may make the kernel drop its attributes.
    pub(super) fn touched(&self, ino: u64) {
        if let Some(h) = self.held.shard(ino).get_mut(&ino) {
            h.fresh_until = None;
        }
    }

    /// Whether the kernel holds `ino` with the attributes it was last handed, still valid.
    pub(super) fn fresh(&self, ino: u64) -> bool {
        self.held.shard(ino).get(&ino).and_then(|h| h.fresh_until).is_some_and(|t| Instant::now() < t)
    }

    /// The kernel read some of `ino`'s data, or wrote some back: it may hold some in its
    /// page cache from now on.
    pub(super) fn note_cached(&self, ino: u64) {
        let mut m = self.held.shard(ino);
        if let Some(h) = m.get_mut(&ino).filter(|h| !h.cached) {
            h.cached = true;
        }
    }

    /// Whether the kernel may hold some of `ino`'s data in its page cache (an inode it
    /// does not hold, as far as these counts know: it may).
    pub(super) fn may_cache(&self, ino: u64) -> bool {
        self.held.shard(ino).get(&ino).is_none_or(|h| h.cached)
    }

    /// Drop `n` references; true when none is left.
    pub(super) fn forget(&self, ino: u64, n: u64) -> bool {
        let mut m = self.held.shard(ino);
        match m.get_mut(&ino).map(|h| &mut h.refs) {
            Some(c) if *c > n => {
                *c -= n;
                false
            }
            Some(c) if *c == n => {
                m.remove(&ino);
                true
            }
            _ => {
                tracing::error!("FORGET of inode {ino} by {n}: more than the kernel was given");
                m.remove(&ino);
                true
            }
        }
    }

    /// Whether the kernel holds a reference to `ino`.
    pub(super) fn holds(&self, ino: u64) -> bool {
        self.held.shard(ino).contains_key(&ino)
    }

    /// Every inode still referenced, forgetting them all (the session is over: the
    /// kernel dropped its references without FORGETs).
    pub(super) fn drain(&self) -> Vec<u64> {
        let mut out = Vec::new();
        self.held.each_locked(|m| out.extend(m.drain().map(|(ino, _)| ino)));
        out
    }

    /// (inodes, references) still held.
    pub(super) fn outstanding(&self) -> (usize, u64) {
        let (mut inodes, mut refs) = (0, 0);
        self.held.each_locked(|m| {
            inodes += m.len();
            refs += m.values().map(|h| h.refs).sum::<u64>();
        });
        (inodes, refs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// References add up and are taken back per inode, across shards; what is left is
    /// counted and drained whole.
    #[test]
    fn references_balance_across_shards() {
        let l = LookupCounts::new(Duration::ZERO);
        // Inodes far apart land in different shards; two references to the first.
        let inos = [5u64, 5, 1 << 20, 3 << 30, 7 << 40];
        for &i in &inos {
            l.add(i);
        }
        assert_eq!(l.outstanding(), (4, 5));
        assert!(!l.forget(5, 1) && l.holds(5), "one of two references taken back");
        assert!(l.forget(5, 1) && !l.holds(5), "the last one");
        assert!(l.forget(1 << 20, 1));
        assert_eq!(l.outstanding(), (2, 2));
        let mut left = l.drain();
        left.sort_unstable();
        assert_eq!(left, vec![3 << 30, 7 << 40]);
        assert_eq!(l.outstanding(), (0, 0));
    }

    /// The kernel caches none of an inode's data until it reads or writes some back; what
    /// it cached goes with its last reference, and an inode it does not hold may have any.
    #[test]
    fn cached_data_is_noted_until_the_last_forget() {
        let l = LookupCounts::new(Duration::ZERO);
        assert!(l.may_cache(4), "not held: unknown");
        l.add(4);
        l.add(4);
        assert!(!l.may_cache(4), "looked up, nothing read");
        l.note_cached(4);
        assert!(l.may_cache(4));
        assert!(!l.forget(4, 1) && l.may_cache(4), "one reference left");
        assert!(l.forget(4, 1));
        l.add(4);
        assert!(!l.may_cache(4), "evicted and looked up again: its pages went with it");
        l.note_cached(8);
        assert!(!l.holds(8), "noting an inode not held adds nothing");
    }

    /// An inode handed out is fresh until its time runs out or a request touches it; a
    /// table made with no time never calls anything fresh.
    #[test]
    fn attributes_handed_out_are_fresh_until_touched_or_old() {
        let l = LookupCounts::new(Duration::from_millis(200));
        assert!(!l.fresh(9), "never handed out");
        l.add(9);
        assert!(l.fresh(9));
        l.touched(9);
        assert!(!l.fresh(9), "touched");
        l.add(9);
        assert!(l.fresh(9), "handed out again");
        std::thread::sleep(Duration::from_millis(250));
        assert!(!l.fresh(9), "too old");
        assert!(!l.forget(9, 1) && l.forget(9, 1), "two references");
        let never = LookupCounts::new(Duration::ZERO);
        never.add(9);
        assert!(!never.fresh(9));
    }
}
