//! The kernel's lookup references, counted to show that FORGETs balance them.

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
pub(super) struct LookupCounts(Sharded<FxHashMap<u64, u64>>);

impl Default for LookupCounts {
    fn default() -> Self {
        LookupCounts(Sharded::new(10))
    }
}

impl LookupCounts {
    pub(super) fn add(&self, ino: u64) {
        *self.0.shard(ino).entry(ino).or_insert(0) += 1;
    }

    /// Drop `n` references; true when none is left.
    pub(super) fn forget(&self, ino: u64, n: u64) -> bool {
        let mut m = self.0.shard(ino);
        match m.get_mut(&ino) {
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
        self.0.shard(ino).contains_key(&ino)
    }

    /// Every inode still referenced, forgetting them all (the session is over: the
    /// kernel dropped its references without FORGETs).
    pub(super) fn drain(&self) -> Vec<u64> {
        let mut out = Vec::new();
        self.0.each_locked(|m| out.extend(m.drain().map(|(ino, _)| ino)));
        out
    }

    /// (inodes, references) still held.
    pub(super) fn outstanding(&self) -> (usize, u64) {
        let (mut inodes, mut refs) = (0, 0);
        self.0.each_locked(|m| {
            inodes += m.len();
            refs += m.values().sum::<u64>();
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
        let l = LookupCounts::default();
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
}
