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

use crate::engine::leaf::{shard_index, Padded};

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

/// One stripe: a reader-writer lock of nothing (`parking_lot`'s; the tests' model
/// checker brings its own).
pub(super) trait Stripe: Send + Sync {
    type Read<'a>
    where
        Self: 'a;
    type Write<'a>
    where
        Self: 'a;
    fn unlocked() -> Self;
    fn read(&self) -> Self::Read<'_>;
    fn write(&self) -> Self::Write<'_>;
    fn try_read(&self) -> Option<Self::Read<'_>>;
    fn try_write(&self) -> Option<Self::Write<'_>>;
}

impl Stripe for RwLock<()> {
    type Read<'a> = RwLockReadGuard<'a, ()>;
    type Write<'a> = RwLockWriteGuard<'a, ()>;
    fn unlocked() -> Self {
        RwLock::new(())
    }
    fn read(&self) -> Self::Read<'_> {
        RwLock::read(self)
    }
    fn write(&self) -> Self::Write<'_> {
        RwLock::write(self)
    }
    fn try_read(&self) -> Option<Self::Read<'_>> {
        RwLock::try_read(self)
    }
    fn try_write(&self) -> Option<Self::Write<'_>> {
        RwLock::try_write(self)
    }
}

/// The table of inode locks.
pub(super) struct InodeLocks<S: Stripe = RwLock<()>> {
    stripes: Box<[Padded<S>]>,
}

enum Guard<'a, S: Stripe + 'a> {
    Read(#[allow(dead_code)] S::Read<'a>),
    Write(#[allow(dead_code)] S::Write<'a>),
}

impl<S: Stripe> Guard<'_, S> {
    fn mode(&self) -> Mode {
        match self {
            Guard::Read(_) => Mode::Read,
            Guard::Write(_) => Mode::Write,
        }
    }
}

/// The inode locks one operation holds, by stripe, ascending.
pub(super) struct Locked<'a, S: Stripe = RwLock<()>> {
    table: &'a InodeLocks<S>,
    held: Vec<(usize, Guard<'a, S>)>,
}

impl InodeLocks {
    pub(super) fn new() -> InodeLocks {
        InodeLocks::with_stripes(STRIPES)
    }
}

impl<S: Stripe> InodeLocks<S> {
    /// A table of `n` stripes.
    fn with_stripes(n: usize) -> InodeLocks<S> {
        InodeLocks { stripes: (0..n).map(|_| Padded(S::unlocked())).collect() }
    }

    fn stripe(&self, ino: u64) -> usize {
        shard_index(ino, self.stripes.len())
    }

    /// Lock every inode of `want` (a stripe wanted both ways is written), waiting as
    /// needed, in stripe order.
    pub(super) fn lock(&self, want: &[(u64, Mode)]) -> Locked<'_, S> {
        let mut s: Vec<(usize, Mode)> = want.iter().map(|&(ino, m)| (self.stripe(ino), m)).collect();
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

impl<S: Stripe> Locked<'_, S> {
    /// Lock `ino` too: at once if this already holds its stripe well enough, or if the
    /// stripe comes after every stripe held (waiting then keeps the order) or is free now.
    /// `false` when it could only be had by waiting out of order: the caller lets
    /// everything go and locks the whole set again, with `ino` in it.
    #[must_use]
    pub(super) fn add(&mut self, ino: u64, mode: Mode) -> bool {
        let k = self.table.stripe(ino);
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
        assert!(t.stripes[t.stripe(5)].try_read().is_none(), "5 is held for writing");
        assert!(t.stripes[t.stripe(9)].try_read().is_some(), "9 is only read");
    }

    /// Three inodes on three stripes, in ascending stripe order.
    fn ordered<S: Stripe>(t: &InodeLocks<S>) -> [u64; 3] {
        let mut inos: Vec<u64> = (1..1000).collect();
        inos.sort_by_key(|&i| t.stripe(i));
        inos.dedup_by_key(|i| t.stripe(*i));
        [inos[0], inos[1], inos[2]]
    }

    #[test]
    fn add_takes_free_stripes_and_refuses_to_wait_out_of_order() {
        let t = InodeLocks::new();
        let [lo, _, hi] = ordered(&t);
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

    /// The stripe the model checker drives: a writer-preferring reader-writer lock made of
    /// loom's mutex and condition variable (loom's own reader-writer lock blocks a thread
    /// that only *tries* to take it when another takes it meanwhile, which no real lock
    /// does), so loom explores every order in which threads take, wait for and give back
    /// stripes.
    struct LoomStripe {
        /// (readers inside, a writer inside, writers waiting)
        state: loom::sync::Mutex<(u32, bool, u32)>,
        cv: loom::sync::Condvar,
    }

    struct LoomRead<'a>(&'a LoomStripe);
    struct LoomWrite<'a>(&'a LoomStripe);

    impl Drop for LoomRead<'_> {
        fn drop(&mut self) {
            self.0.state.lock().unwrap().0 -= 1;
            self.0.cv.notify_all();
        }
    }

    impl Drop for LoomWrite<'_> {
        fn drop(&mut self) {
            self.0.state.lock().unwrap().1 = false;
            self.0.cv.notify_all();
        }
    }

    impl Stripe for LoomStripe {
        type Read<'a> = LoomRead<'a>;
        type Write<'a> = LoomWrite<'a>;
        fn unlocked() -> Self {
            LoomStripe { state: loom::sync::Mutex::new((0, false, 0)), cv: loom::sync::Condvar::new() }
        }
        fn read(&self) -> Self::Read<'_> {
            let mut s = self.state.lock().unwrap();
            // Writer-preferring, as parking_lot's: a waiting writer holds new readers back.
            while s.1 || s.2 > 0 {
                s = self.cv.wait(s).unwrap();
            }
            s.0 += 1;
            LoomRead(self)
        }
        fn write(&self) -> Self::Write<'_> {
            let mut s = self.state.lock().unwrap();
            s.2 += 1;
            while s.1 || s.0 > 0 {
                s = self.cv.wait(s).unwrap();
            }
            s.2 -= 1;
            s.1 = true;
            LoomWrite(self)
        }
        fn try_read(&self) -> Option<Self::Read<'_>> {
            let mut s = self.state.lock().unwrap();
            if s.1 || s.2 > 0 {
                return None;
            }
            s.0 += 1;
            Some(LoomRead(self))
        }
        fn try_write(&self) -> Option<Self::Write<'_>> {
            let mut s = self.state.lock().unwrap();
            if s.1 || s.0 > 0 {
                return None;
            }
            s.1 = true;
            Some(LoomWrite(self))
        }
    }

    /// One operation as the volume runs them: lock `first` up front, then add `then` one
    /// by one (the inodes it finds on the way), starting again with everything up front
    /// whenever an add refuses; inside, check that no one else writes what it reads or
    /// writes (`inside[i]`: writers × 1000 + readers of inode `i`).
    fn operation(
        t: &InodeLocks<LoomStripe>,
        inos: [u64; 3],
        inside: &[loom::sync::atomic::AtomicUsize; 3],
        first: &[(usize, Mode)],
        then: &[(usize, Mode)],
    ) {
        use loom::sync::atomic::Ordering::SeqCst;
        let mut want: Vec<(u64, Mode)> = first.iter().map(|&(i, m)| (inos[i], m)).collect();
        loop {
            let mut held = t.lock(&want);
            let mut refused = None;
            for &(i, m) in then {
                if !held.add(inos[i], m) {
                    refused = Some((inos[i], m));
                    break;
                }
            }
            if let Some(w) = refused {
                want.push(w);
                continue;
            }
            let mine: Vec<(usize, Mode)> = first.iter().chain(then).copied().collect();
            for &(i, m) in &mine {
                let before = inside[i].fetch_add(if m == Mode::Write { 1000 } else { 1 }, SeqCst);
                let alone = if m == Mode::Write { before == 0 } else { before < 1000 };
                assert!(alone, "inode {i} locked for {m:?} while others were inside ({before})");
            }
            loom::thread::yield_now();
            for &(i, m) in &mine {
                inside[i].fetch_sub(if m == Mode::Write { 1000 } else { 1 }, SeqCst);
            }
            return;
        }
    }

    /// Every schedule loom can find of three operations that overlap (an unlink that finds
    /// its child below its directory's stripe, a rename that adds an inode above and one
    /// below, a readdirplus that reads all three) ends: no deadlock, no livelock within
    /// loom's bound, and no two of them inside one inode unless both only read it.
    #[test]
    fn no_schedule_deadlocks_or_lets_a_writer_in_beside_another() {
        use loom::sync::atomic::AtomicUsize;
        use loom::sync::Arc;
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let t = Arc::new(InodeLocks::<LoomStripe>::with_stripes(4));
            let inos = ordered(&t);
            let inside = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)]);
            let spawn = |first: &'static [(usize, Mode)], then: &'static [(usize, Mode)]| {
                let (t, inside) = (t.clone(), inside.clone());
                loom::thread::spawn(move || operation(&t, inos, &inside, first, then))
            };
            let unlink = spawn(&[(1, Mode::Write)], &[(0, Mode::Write)]);
            let rename = spawn(&[(0, Mode::Write)], &[(2, Mode::Write), (1, Mode::Write)]);
            operation(&t, inos, &inside, &[(1, Mode::Read)], &[(0, Mode::Read), (2, Mode::Read)]);
            unlink.join().unwrap();
            rename.join().unwrap();
        });
    }
}
