//! [`MemDevice`]: a volume's blocks in memory, for tests and benchmarks.

use std::fmt;

use parking_lot::RwLock;

use super::{check_request, mem_range, pad_to_blocks, BlockDevice, Counters, IoStats};
use crate::disk::codec::BLOCK_SIZE;
use crate::error::Result;

/// A device whose blocks live in memory. Used by tests and benchmarks.
pub struct MemDevice {
    data: RwLock<Vec<u8>>,
    blocks: u64,
    counters: Counters,
}

impl MemDevice {
    /// A zero-filled device of `blocks` blocks.
    ///
    /// # Panics
    /// If `blocks * BLOCK_SIZE` does not fit in memory's address range.
    pub fn new(blocks: u64) -> MemDevice {
        let bytes = usize::try_from(blocks)
            .ok()
            .and_then(|b| b.checked_mul(BLOCK_SIZE))
            .expect("MemDevice size overflows usize");
        Self::from_bytes(vec![0; bytes])
    }

    /// A device holding `bytes` as its image; a partial last block is padded with zeros.
    pub fn from_bytes(bytes: Vec<u8>) -> MemDevice {
        let bytes = pad_to_blocks(bytes);
        MemDevice { blocks: (bytes.len() / BLOCK_SIZE) as u64, data: RwLock::new(bytes), counters: Counters::default() }
    }

    /// A snapshot of the whole image.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.data.read().clone()
    }
}

impl fmt::Debug for MemDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemDevice").field("blocks", &self.blocks).finish()
    }
}

impl BlockDevice for MemDevice {
    fn block_count(&self) -> u64 {
        self.blocks
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        let n = check_request("read", block, buf.len(), self.blocks)?;
        buf.copy_from_slice(&self.data.read()[mem_range(block, buf.len())]);
        self.counters.read(n);
        Ok(())
    }

    fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        let n = check_request("write", block, buf.len(), self.blocks)?;
        self.data.write()[mem_range(block, buf.len())].copy_from_slice(buf);
        self.counters.write(n);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.counters.flush();
        Ok(())
    }

    fn stats(&self) -> IoStats {
        self.counters.snapshot()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{blk, exercise, pattern};
    use super::*;

    #[test]
    fn mem_device_round_trip_counters_and_bounds() {
        let dev = MemDevice::new(8);
        assert_eq!(dev.block_count(), 8);
        assert_eq!(dev.stats(), IoStats::default());
        exercise(&dev);
        let img = dev.to_bytes();
        assert_eq!(img.len(), 8 * BLOCK_SIZE);
        assert_eq!(&img[..2 * BLOCK_SIZE], &vec![0u8; 2 * BLOCK_SIZE][..]);
        assert_eq!(&img[2 * BLOCK_SIZE..5 * BLOCK_SIZE], &pattern(3, 10)[..]);
        assert_eq!(blk(&img, 7), &[99u8; BLOCK_SIZE][..]);
    }

    #[test]
    fn mem_device_from_bytes_pads_partial_block() {
        let mut bytes = pattern(2, 1);
        bytes.extend_from_slice(&[7u8; 10]);
        let dev = MemDevice::from_bytes(bytes);
        assert_eq!(dev.block_count(), 3);
        let img = dev.to_bytes();
        assert_eq!(&img[..2 * BLOCK_SIZE], &pattern(2, 1)[..]);
        assert_eq!(&img[2 * BLOCK_SIZE..2 * BLOCK_SIZE + 10], &[7u8; 10]);
        assert!(img[2 * BLOCK_SIZE + 10..].iter().all(|&b| b == 0));
        assert_eq!(MemDevice::new(0).block_count(), 0);
        assert!(MemDevice::new(0).read(0, &mut [0u8; BLOCK_SIZE]).is_err());
    }
}
