//! Inode locks: what keeps two operations on one inode apart while operations on
//! different inodes run at once (issue 14).
//!
//! A table of reader-writer locks, *stripes*, an inode mapping to one by a hash of its
//! number (two inodes may share a stripe; then they exclude each other, which costs
//! time, never correctness). An operation locks every inode it reads or changes: the ones
//! it names up front all at once, in stripe order; one it finds on the way (the child a
//! name leads to) at once if its stripe comes after every stripe held or can be had
//! without waiting, else it lets everything go and starts again with the whole set
//! ([`Locked::add`]). Every wait is for a stripe above all those held, so no cycle of
//! waits can form (docs/DESIGN.md, "Concurrency").

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::engine::leaf::Padded;

/// Stripes in the table: enough that unrelated inodes seldom share one. Each is alone on
/// its cache lines, or two threads locking neighbouring stripes would move one line back
/// and forth between their CPUs.
const STRIPES: usize = 1024;

/// How an inode is locked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Mode {
    /// Read it: others may read it too.
    Read,
    /// Change it: alone.
    Write,
}

/// The table of inode locks.
pub(super) struct InodeLocks {
    stripes: Box<[Padded<RwLock<()>>]>,
}

enum Guard<'a> {
    Read(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Write(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

impl Guard<'_> {
    fn mode(&self) -> Mode {
        match self {
            Guard::Read(_) => Mode::Read,
            Guard::Write(_) => Mode::Write,
        }
    }
}

/// The inode locks one operation holds, by stripe, ascending.
pub(super) struct Locked<'a> {
    table: &'a InodeLocks,
    held: Vec<(usize, Guard<'a>)>,
}

fn stripe(ino: u64) -> usize {
    (ino.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % STRIPES
}

impl InodeLocks {
    pub(super) fn new() -> InodeLocks {
        InodeLocks { stripes: (0..STRIPES).map(|_| Padded(RwLock::new(()))).collect() }
    }

    /// Lock every inode of `want` (a stripe wanted both ways is written), waiting as
    /// needed, in stripe order.
    pub(super) fn lock(&self, want: &[(u64, Mode)]) -> Locked<'_> {
        let mut s: Vec<(usize, Mode)> = want.iter().map(|&(ino, m)| (stripe(ino), m)).collect();
        // Ascending stripes, Write before Read of the same stripe, then one per stripe.
        s.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        s.dedup_by_key(|x| x.0);
        let held = s
            .into_iter()
            .map(|(k, m)| {
                let l = &self.stripes[k];
                (k, if m == Mode::Write { Guard::Write(l.write()) } else { Guard::Read(l.read()) })
            })
            .collect();
        Locked { table: self, held }
    }
}

impl Locked<'_> {
    /// Lock `ino` too: at once if this already holds its stripe well enough, or if the
    /// stripe comes after every stripe held (waiting then keeps the order) or is free now.
    /// `false` when it could only be had by waiting out of order: the caller lets
    /// everything go and locks the whole set again, with `ino` in it.
    #[must_use]
    pub(super) fn add(&mut self, ino: u64, mode: Mode) -> bool {
        let k = stripe(ino);
        let l = &self.table.stripes[k];
        let at = self.held.partition_point(|(s, _)| *s < k);
        if let Some((s, g)) = self.held.get(at) {
            if *s == k {
                // A stripe held for reading cannot become a write lock without letting it
                // go, which would open a gap: start again.
                return g.mode() >= mode;
            }
        }
        let last = at == self.held.len();
        let g = match (mode, last) {
            (Mode::Write, true) => Guard::Write(l.write()),
            (Mode::Read, true) => Guard::Read(l.read()),
            (Mode::Write, false) => match l.try_write() {
                Some(g) => Guard::Write(g),
                None => return false,
            },
            (Mode::Read, false) => match l.try_read() {
                Some(g) => Guard::Read(g),
                None => return false,
            },
        };
        self.held.insert(at, (k, g));
        true
    }

    /// Number of stripes held (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_dedupe_and_write_wins() {
        let t = InodeLocks::new();
        let l = t.lock(&[(5, Mode::Read), (5, Mode::Write), (9, Mode::Read)]);
        assert_eq!(l.len(), 2);
        assert!(t.stripes[stripe(5)].try_read().is_none(), "5 is held for writing");
        assert!(t.stripes[stripe(9)].try_read().is_some(), "9 is only read");
    }

    #[test]
    fn add_takes_free_stripes_and_refuses_to_wait_out_of_order() {
        let t = InodeLocks::new();
        // Two inodes in ascending stripe order.
        let mut inos: Vec<u64> = (1..100).collect();
        inos.sort_by_key(|&i| stripe(i));
        let (lo, hi) = (inos[0], inos[98]);
        assert!(stripe(lo) < stripe(hi));
        let mut a = t.lock(&[(hi, Mode::Write)]);
        assert!(a.add(lo, Mode::Write), "a free lower stripe is taken at once");
        drop(a);
        let other = t.lock(&[(lo, Mode::Write)]);
        let mut b = t.lock(&[(hi, Mode::Write)]);
        assert!(!b.add(lo, Mode::Write), "a held lower stripe is not waited for");
        assert!(b.add(hi, Mode::Read), "a stripe held for writing serves a read");
        drop(other);
        let mut c = t.lock(&[(lo, Mode::Read)]);
        assert!(!c.add(lo, Mode::Write), "a read stripe does not become a write one in place");
    }
}
