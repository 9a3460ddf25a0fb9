//! Device reads put off until the operation that needs them has let go of its locks
//! (issue 14: no lock held across device I/O on the request path).
//!
//! Inside [`defer_misses`], a metadata block missing from the cache is not read: the
//! cache notes what is wanted ([`Wanted`]) and fails the access with an internal error (`Error::missed`).
//! The operation's code lets that error pass up like any other, which drops its locks;
//! the volume then reads what was wanted with nothing held
//! ([`crate::engine::store::Store::plan_reads`]) and starts the operation again, which
//! now finds its blocks cached. Only code that has changed nothing yet may run in such
//! a scope, since it may run again: debug builds check that no block is changed,
//! allocated or freed inside one.
//!
//! An operation that still misses after [`MAX_ROUNDS`] rounds of put-off reads (blocks
//! evicted again, or changed by a commit meanwhile) reads under its locks: it never
//! starts again forever.
//!
//! The wanted list, the scope and the round count are per thread: an operation runs on
//! one thread.

use std::cell::{Cell, RefCell};

use crate::error::Error;

/// Rounds of put-off reads one operation may take before it reads under its locks.
pub(crate) const MAX_ROUNDS: u32 = 16;

thread_local! {
    static DEFERRING: Cell<bool> = const { Cell::new(false) };
    static ROUNDS: Cell<u32> = const { Cell::new(0) };
    static IN_OP: Cell<u32> = const { Cell::new(0) };
    static WANTED: RefCell<Vec<Wanted>> = const { RefCell::new(Vec::new()) };
}

/// A read an operation put off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// These blocks (a sorted, coalesced sweep, as [`crate::engine::cache::MetaCache::prefetch`]).
    Blocks(Vec<u64>),
    /// These inode blocks, read in the store's inode windows, at most `limit` blocks
    /// (as [`crate::engine::store::Store::prefetch_inodes`]).
    Inodes(Vec<u64>, usize),
}

/// Restores the previous scope when dropped, panics included.
struct Scope(bool);

impl Drop for Scope {
    fn drop(&mut self) {
        DEFERRING.with(|d| d.set(self.0));
    }
}

/// Run `f` with cache misses put off (see the module doc), unless this operation has
/// had its [`MAX_ROUNDS`]. `f` must change nothing before its last read: it may fail
/// with an internal error (`Error::missed`) and run again.
pub(crate) fn defer_misses<T>(f: impl FnOnce() -> T) -> T {
    let on = ROUNDS.with(|r| r.get()) < MAX_ROUNDS;
    let _scope = Scope(DEFERRING.with(|d| d.replace(on)));
    f()
}

/// Run `f` with misses read at once whatever the caller's scope (work that is not to
/// run again: a commit, a reservation), telling it whether the caller put them off, so
/// that it can put them off again in a part that may run again ([`defer_misses_if`]).
pub(crate) fn read_at_once<T>(f: impl FnOnce(bool) -> T) -> T {
    let outer = DEFERRING.with(|d| d.replace(false));
    let _scope = Scope(outer);
    f(outer)
}

/// The operation is about to read what it put off, and start again.
pub(crate) fn next_round() {
    ROUNDS.with(|r| r.set(r.get() + 1));
}

/// The operation is done putting reads off (it got what it read, or failed otherwise):
/// the next one has its rounds again.
pub(crate) fn rounds_done() {
    ROUNDS.with(|r| r.set(0));
}

/// This thread begins a front-end operation: it holds locks until [`leave_op`] (what
/// the cache counts device reads under).
pub(crate) fn enter_op() {
    IN_OP.with(|c| c.set(c.get() + 1));
}

/// The operation begun by [`enter_op`] has let go.
pub(crate) fn leave_op() {
    IN_OP.with(|c| c.set(c.get().saturating_sub(1)));
}

/// Whether this thread is in a front-end operation, holding its locks.
pub(crate) fn in_op() -> bool {
    IN_OP.with(|c| c.get() > 0)
}

/// Whether this thread is in a [`defer_misses`] scope.
pub(crate) fn deferring() -> bool {
    DEFERRING.with(|d| d.get())
}

/// Note a read to do once the operation has let go (inside a [`defer_misses`] scope).
pub(crate) fn want(w: Wanted) {
    WANTED.with(|l| l.borrow_mut().push(w));
}

/// Note block `b` and fail the access: it is missing from the cache in a
/// [`defer_misses`] scope.
pub(crate) fn missed(b: u64) -> Error {
    want(Wanted::Blocks(vec![b]));
    Error::missed()
}

/// The reads this thread put off since it last asked, in the order noted.
pub(crate) fn take_wanted() -> Vec<Wanted> {
    WANTED.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

/// Debug builds: fail if a change is made inside a [`defer_misses`] scope (it could be
/// made twice).
#[inline]
pub(crate) fn check_change() {
    debug_assert!(!deferring(), "a change inside a scope that puts device reads off");
}
