//! A device seen through blocks held in memory: what a read-only open replays.
//!
//! A read-only open must not write the newest delta's log home, yet must read the volume
//! as that delta left it. Metadata images go into the metadata cache (pinned); file data
//! logged by a one-flush commit is read past that cache, so it is laid over the device
//! here instead: reads of those blocks return the logged images.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use super::codec::{Block, BLOCK_SIZE};
use super::device::{BlockDevice, IoStats};
use crate::error::Result;

/// `dev`, with the blocks in `over` read from memory. A write through it goes to the
/// device and drops the blocks it covers from the overlay.
pub(crate) struct Overlay {
    dev: Arc<dyn BlockDevice>,
    over: RwLock<HashMap<u64, Box<Block>>>,
}

impl Overlay {
    pub(crate) fn new(dev: Arc<dyn BlockDevice>, blocks: Vec<(u64, Box<Block>)>) -> Overlay {
        Overlay { dev, over: RwLock::new(blocks.into_iter().collect()) }
    }

    /// Lay the overlaid blocks within `[block, block + buf.len() / BLOCK_SIZE)` over `buf`.
    fn patch(&self, block: u64, buf: &mut [u8]) {
        let over = self.over.read();
        if over.is_empty() {
            return;
        }
        for (i, chunk) in buf.chunks_exact_mut(BLOCK_SIZE).enumerate() {
            if let Some(img) = over.get(&(block + i as u64)) {
                chunk.copy_from_slice(&img[..]);
            }
        }
    }

    fn forget(&self, block: u64, len: usize) {
        let mut over = self.over.write();
        if !over.is_empty() {
            for b in block..block + (len / BLOCK_SIZE) as u64 {
                over.remove(&b);
            }
        }
    }
}

impl BlockDevice for Overlay {
    fn block_count(&self) -> u64 {
        self.dev.block_count()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.dev.read(block, buf)?;
        self.patch(block, buf);
        Ok(())
    }
    fn read_data(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.dev.read_data(block, buf)?;
        self.patch(block, buf);
        Ok(())
    }
    fn read_fresh(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.dev.read_fresh(block, buf)?;
        self.patch(block, buf);
        Ok(())
    }
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
        self.dev.read_many(reqs)?;
        for (block, buf) in reqs.iter_mut() {
            self.patch(*block, buf);
        }
        Ok(())
    }
    fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        self.forget(block, buf.len());
        self.dev.write(block, buf)
    }
    fn write_data(&self, block: u64, buf: &[u8]) -> Result<()> {
        self.forget(block, buf.len());
        self.dev.write_data(block, buf)
    }
    fn write_durable(&self, block: u64, buf: &[u8]) -> Result<()> {
        self.forget(block, buf.len());
        self.dev.write_durable(block, buf)
    }
    fn write_many(&self, reqs: &[(u64, &[u8])]) -> Result<()> {
        for (block, buf) in reqs {
            self.forget(*block, buf.len());
        }
        self.dev.write_many(reqs)
    }
    fn flush(&self) -> Result<()> {
        self.dev.flush()
    }
    fn trim(&self, block: u64, count: u64) -> Result<()> {
        self.forget(block, count as usize * BLOCK_SIZE);
        self.dev.trim(block, count)
    }
    fn stats(&self) -> IoStats {
        self.dev.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::device::MemDevice;

    #[test]
    fn overlaid_blocks_read_from_memory_until_written() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(16));
        dev.write(3, &[1u8; 3 * BLOCK_SIZE]).unwrap();
        let o = Overlay::new(dev.clone(), vec![(4, Box::new([9u8; BLOCK_SIZE]))]);
        let mut buf = vec![0u8; 3 * BLOCK_SIZE];
        o.read_data(3, &mut buf).unwrap();
        assert_eq!((buf[0], buf[BLOCK_SIZE], buf[2 * BLOCK_SIZE]), (1, 9, 1), "only block 4 is overlaid");
        let mut one = vec![0u8; BLOCK_SIZE];
        dev.read(4, &mut one).unwrap();
        assert_eq!(one[0], 1, "the device is untouched");
        o.write(4, &[5u8; BLOCK_SIZE]).unwrap();
        o.read(4, &mut one).unwrap();
        assert_eq!(one[0], 5, "a write through the overlay wins over the image");
    }
}
