//! Buffers for `O_DIRECT`: aligned to a block in memory, and a pool that keeps them.

use super::BLOCK_SIZE;

/// A zeroed byte buffer whose start is aligned to [`BLOCK_SIZE`] in memory, as
/// `O_DIRECT` requires: file data read or written through one needs no bounce copy.
pub struct AlignedBuf {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes.
    pub fn new(len: usize) -> AlignedBuf {
        // Over-allocate by one block and start at the first aligned byte: no unsafe code.
        let v = vec![0u8; len + BLOCK_SIZE];
        let off = v.as_ptr().align_offset(BLOCK_SIZE);
        AlignedBuf { v, off, len }
    }

    /// Keep the first `len` bytes (no more than it has).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// The most bytes it can hold without a new allocation.
    pub fn capacity(&self) -> usize {
        self.v.len() - self.off
    }

    /// Hold `len` bytes (at most [`AlignedBuf::capacity`]); bytes it held before keep
    /// their contents.
    fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity(), "AlignedBuf of {} bytes cannot hold {len}", self.capacity());
        self.len = len;
    }
}

/// Aligned buffers kept for reuse, at most `max` of them: a fresh buffer costs zeroing and
/// a page fault per page, as much CPU as filling it (`perf`: the 1 MiB pieces read ahead,
/// the 4 MiB requests of a commit's data).
pub(crate) struct BufferPool {
    kept: parking_lot::Mutex<Vec<AlignedBuf>>,
    max: usize,
}

impl BufferPool {
    pub(crate) const fn new(max: usize) -> BufferPool {
        BufferPool { kept: parking_lot::const_mutex(Vec::new()), max }
    }

    /// A buffer of `len` bytes: a kept one that can hold them (its bytes are whatever it
    /// last held), else a new zeroed one.
    pub(crate) fn take(&self, len: usize) -> AlignedBuf {
        let kept = {
            let mut k = self.kept.lock();
            k.iter().position(|b| b.capacity() >= len).map(|i| k.swap_remove(i))
        };
        match kept {
            Some(mut b) => {
                b.set_len(len);
                b
            }
            None => AlignedBuf::new(len),
        }
    }

    /// Keep `buf` for a later [`BufferPool::take`], unless enough are kept already.
    pub(crate) fn give(&self, buf: AlignedBuf) {
        let mut k = self.kept.lock();
        if k.len() < self.max {
            k.push(buf);
        }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> AlignedBuf {
        let mut b = AlignedBuf::new(self.len);
        b.copy_from_slice(self);
        b
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &AlignedBuf) -> bool {
        **self == **other
    }
}

impl Eq for AlignedBuf {}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

/// Whether `buf` starts on a block boundary in memory (what `O_DIRECT` needs).
pub(super) fn is_aligned(buf: &[u8]) -> bool {
    buf.as_ptr().align_offset(BLOCK_SIZE) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool hands back a kept buffer that can hold the length asked for (the same
    /// memory, its old bytes kept, still aligned), a new zeroed one when none can, and
    /// keeps no more than its maximum.
    #[test]
    fn a_buffer_pool_reuses_what_it_keeps() {
        let pool = BufferPool::new(1);
        let mut a = pool.take(3 * BLOCK_SIZE);
        assert!(a.iter().all(|&b| b == 0) && is_aligned(&a));
        a.fill(7);
        let at = a.as_ptr();
        pool.give(a);
        pool.give(AlignedBuf::new(BLOCK_SIZE)); // beyond the maximum: dropped
        let b = pool.take(2 * BLOCK_SIZE);
        assert_eq!((b.as_ptr(), b.len()), (at, 2 * BLOCK_SIZE), "the kept buffer, shortened");
        assert!(b.iter().all(|&x| x == 7), "a kept buffer's bytes are not cleared");
        pool.give(b);
        // Five blocks: more than three asked for plus the alignment's spare block.
        let c = pool.take(5 * BLOCK_SIZE);
        assert!(c.as_ptr() != at && c.len() == 5 * BLOCK_SIZE && c.iter().all(|&x| x == 0) && is_aligned(&c));
        // The kept one is still there for a length it can hold.
        assert_eq!(pool.take(BLOCK_SIZE).as_ptr(), at);
    }
}
