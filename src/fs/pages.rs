//! A pool of page buffers for file data. Writers allocate a dirty page per 4 KiB written
//! and the commit frees them once written, at up to a few GB/s; a general-purpose heap
//! hands such memory back to the kernel between the two and takes a page fault (and, with
//! transparent huge pages, the zeroing of 2 MiB) to get it again: a third of the daemon's
//! time in a sequential write was `clear_page_erms` under `Inner::write`. Pages the
//! commit has written come back here instead, up to [`POOL_PAGES`], and the next writes
//! take them; an idle pool gives them back to the heap ([`release_idle`]).

use parking_lot::Mutex;

use crate::disk::codec::{Block, BLOCK_SIZE};

/// Most pages kept for reuse (256 MiB): as many as a delta holds dirty at most (twice
/// the default dirty limit, while a commit is writing), so that a writer faster than the
/// device always finds the pages of the last commit here.
pub(crate) const POOL_PAGES: usize = 65_536;

/// Free pages, and whether one was taken since [`Pool::release_idle`] last looked.
struct Pool(Mutex<(Vec<Box<Block>>, bool)>);

/// The process's pool (file data of every volume).
static POOL: Pool = Pool::new();

impl Pool {
    const fn new() -> Pool {
        Pool(Mutex::new((Vec::new(), false)))
    }

    fn take(&self) -> Option<Box<Block>> {
        let mut pool = self.0.lock();
        pool.1 = true;
        pool.0.pop()
    }

    fn copy_of(&self, bytes: &[u8]) -> Box<Block> {
        match self.take() {
            Some(mut p) => {
                p.copy_from_slice(bytes);
                p
            }
            None => Box::<[u8]>::from(bytes).try_into().expect("a page is one block"),
        }
    }

    fn zeroed(&self) -> Box<Block> {
        match self.take() {
            Some(mut p) => {
                p.fill(0);
                p
            }
            None => Box::new([0u8; BLOCK_SIZE]),
        }
    }

    fn recycle(&self, pages: impl IntoIterator<Item = Box<Block>>) {
        let mut pool = self.0.lock();
        for p in pages {
            if pool.0.len() >= POOL_PAGES {
                break;
            }
            pool.0.push(p);
        }
    }

    fn release_idle(&self) {
        let idle = {
            let mut pool = self.0.lock();
            if std::mem::replace(&mut pool.1, false) {
                return;
            }
            std::mem::take(&mut pool.0)
        };
        // Freed outside the lock.
        drop(idle);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().0.len()
    }
}

/// A page holding a copy of `bytes` (one block's worth).
pub(crate) fn copy_of(bytes: &[u8]) -> Box<Block> {
    POOL.copy_of(bytes)
}

/// A page of zeros.
pub(crate) fn zeroed() -> Box<Block> {
    POOL.zeroed()
}

/// Give pages back for reuse (those past the pool's size go back to the heap).
pub(crate) fn recycle(pages: impl IntoIterator<Item = Box<Block>>) {
    POOL.recycle(pages)
}

/// Give the pool's pages back to the heap if none was taken since the last call: called
/// at every commit asked for from outside (the mount's periodic one among them), so a
/// burst of writes leaves no memory behind once writing stops.
pub(crate) fn release_idle() {
    POOL.release_idle()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recycled page comes back with the new contents only, never the old ones; the
    /// pool stays bounded; an idle pool empties at the second look, one in use is kept.
    #[test]
    fn recycled_pages_hold_only_what_they_are_given() {
        let pool = Pool::new();
        pool.recycle([Box::new([0xAB; BLOCK_SIZE]), Box::new([0xCD; BLOCK_SIZE])]);
        let z = pool.zeroed();
        assert!(z.iter().all(|&b| b == 0));
        let c = pool.copy_of(&[7u8; BLOCK_SIZE]);
        assert!(c.iter().all(|&b| b == 7));
        assert_eq!(pool.len(), 0);
        pool.recycle((0..POOL_PAGES + 10).map(|_| Box::new([1u8; BLOCK_SIZE])));
        assert_eq!(pool.len(), POOL_PAGES);
        pool.release_idle(); // pages were taken since the last look: kept
        assert_eq!(pool.len(), POOL_PAGES);
        pool.release_idle(); // nothing taken since: given back
        assert_eq!(pool.len(), 0);
    }
}
