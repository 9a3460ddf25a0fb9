//! A pool of page buffers for file data. Writers allocate a dirty page per 4 KiB written
//! and the commit frees them once written, at up to a few GB/s; a general-purpose heap
//! hands such memory back to the kernel between the two and takes a page fault (and, with
//! transparent huge pages, the zeroing of 2 MiB) to get it again: a third of the daemon's
//! time in a sequential write was `clear_page_erms` under `Inner::write`. Pages the
//! commit has written come back here instead, up to [`POOL_PAGES`], and the next writes
//! take them.

use parking_lot::Mutex;

use crate::disk::codec::{Block, BLOCK_SIZE};

/// Most pages kept for reuse (64 MiB): a writer faster than the device reuses them at
/// once; memory beyond a burst goes back to the heap.
pub const POOL_PAGES: usize = 16_384;

static POOL: Mutex<Vec<Box<Block>>> = Mutex::new(Vec::new());

/// A page holding a copy of `bytes` (one block's worth).
pub fn copy_of(bytes: &[u8]) -> Box<Block> {
    match POOL.lock().pop() {
        Some(mut p) => {
            p.copy_from_slice(bytes);
            p
        }
        None => Box::<[u8]>::from(bytes).try_into().expect("a page is one block"),
    }
}

/// A page of zeros.
pub fn zeroed() -> Box<Block> {
    match POOL.lock().pop() {
        Some(mut p) => {
            p.fill(0);
            p
        }
        None => Box::new([0u8; BLOCK_SIZE]),
    }
}

/// Give pages back for reuse (those past the pool's size go back to the heap).
pub fn recycle(pages: impl IntoIterator<Item = Box<Block>>) {
    let mut pool = POOL.lock();
    for p in pages {
        if pool.len() >= POOL_PAGES {
            break;
        }
        pool.push(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recycled page comes back with the new contents only, never the old ones.
    #[test]
    fn recycled_pages_hold_only_what_they_are_given() {
        recycle([Box::new([0xAB; BLOCK_SIZE]), Box::new([0xCD; BLOCK_SIZE])]);
        let z = zeroed();
        assert!(z.iter().all(|&b| b == 0));
        let c = copy_of(&[7u8; BLOCK_SIZE]);
        assert!(c.iter().all(|&b| b == 7));
        // More than the pool keeps: the rest is dropped, the pool stays bounded.
        recycle((0..POOL_PAGES + 10).map(|_| Box::new([1u8; BLOCK_SIZE])));
        assert!(POOL.lock().len() <= POOL_PAGES);
    }
}
