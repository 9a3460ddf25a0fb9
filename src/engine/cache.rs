//! The metadata block cache: verified blocks in memory, dirty tracking for the current
//! delta, bounded memory for clean blocks, and sorted, coalesced batch reads.
//!
//! Only metadata passes through here; file data goes straight to the device. Every block
//! read from the device is checked (crc32c and self address) before it is cached.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

use crate::disk::codec::*;
use crate::disk::device::BlockDevice;
use crate::error::{Error, Result};

/// Largest number of blocks one coalesced read fetches.
const MAX_BATCH: usize = 64;
/// Widest gap of unwanted blocks a coalesced read bridges.
const MAX_GAP: u64 = 8;
/// Bytes of coalesced reads handed to the device as one batch ([`BlockDevice::read_many`]:
/// concurrent on a device that can have many requests in flight).
const BATCH_BYTES: usize = 8 << 20;

struct Cached {
    data: Box<Block>,
    dirty: bool,
    /// Part of a committed delta whose home write may not have happened yet: the device
    /// copy is stale, so the block must stay in memory until `landed`.
    in_flight: bool,
}

/// Cached metadata blocks.
pub struct MetaCache {
    // Fx: block numbers need no DoS-resistant hashing, and this is the hottest map: every
    // access costs exactly one probe (the dirty flag lives beside the block).
    blocks: FxHashMap<u64, Cached>,
    /// Blocks made dirty in this delta, in first-dirtied order (may name blocks that were
    /// forgotten since; `take_dirty` skips those).
    dirty_list: Vec<u64>,
    dirty_count: usize,
    /// Clean blocks kept before eviction starts.
    capacity: usize,
}

/// How [`MetaCache::prefetch_windows`] reads: aligned windows of `blocks` blocks, keeping
/// the blocks that verify as `magic`, at most `limit` blocks per call.
#[derive(Clone, Copy, Debug)]
pub struct Windows {
    pub blocks: u64,
    pub magic: u32,
    pub limit: usize,
}

impl MetaCache {
    pub fn new(capacity: usize) -> MetaCache {
        MetaCache { blocks: FxHashMap::default(), dirty_list: Vec::new(), dirty_count: 0, capacity: capacity.max(64) }
    }

    fn check_magic(b: &Block, blockno: u64, want: Option<u32>) -> Result<()> {
        match want {
            Some(m) if magic(b) != m => {
                Err(Error::corrupt(format!("block {blockno}: magic {:#010x}, expected {m:#010x}", magic(b))))
            }
            _ => Ok(()),
        }
    }

    fn read_verified(dev: &dyn BlockDevice, blockno: u64) -> Result<Box<Block>> {
        if blockno >= dev.block_count() {
            return Err(Error::corrupt(format!("reference to block {blockno} beyond the volume")));
        }
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        dev.read(blockno, &mut b[..])?;
        verify(&b, blockno, None)?;
        Ok(b)
    }

    /// The cache slot of a block, reading it on a miss. An associated function over the
    /// map alone, so callers can update the dirty bookkeeping while holding the slot.
    fn slot<'a>(
        blocks: &'a mut FxHashMap<u64, Cached>,
        keep: usize,
        dev: &dyn BlockDevice,
        blockno: u64,
    ) -> Result<&'a mut Cached> {
        if blocks.len() > keep && !blocks.contains_key(&blockno) {
            Self::evict(blocks, keep);
        }
        match blocks.entry(blockno) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(v) => {
                let data = Self::read_verified(dev, blockno)?;
                Ok(v.insert(Cached { data, dirty: false, in_flight: false }))
            }
        }
    }

    /// A verified block, with its magic checked when `want` is given.
    pub fn get(&mut self, dev: &dyn BlockDevice, blockno: u64, want: Option<u32>) -> Result<&Block> {
        let c = Self::slot(&mut self.blocks, self.capacity + self.dirty_count, dev, blockno)?;
        Self::check_magic(&c.data, blockno, want)?;
        Ok(&c.data)
    }

    /// A block if it is cached (with its magic checked when `want` is given); never
    /// reads. What threads sharing the volume lock read through ([`crate::engine::store::CacheView`]).
    pub fn peek(&self, blockno: u64, want: Option<u32>) -> Option<Result<&Block>> {
        let c = self.blocks.get(&blockno)?;
        Some(Self::check_magic(&c.data, blockno, want).map(|()| &*c.data))
    }

    /// A verified block for modification; it joins the current delta's dirty set.
    pub fn get_mut(&mut self, dev: &dyn BlockDevice, blockno: u64, want: Option<u32>) -> Result<&mut Block> {
        let c = Self::slot(&mut self.blocks, self.capacity + self.dirty_count, dev, blockno)?;
        Self::check_magic(&c.data, blockno, want)?;
        if !c.dirty {
            c.dirty = true;
            self.dirty_count += 1;
            self.dirty_list.push(blockno);
        }
        Ok(&mut c.data)
    }

    /// A block that is being (re)initialised: zeroed and dirty, no read.
    pub fn fresh(&mut self, blockno: u64) -> &mut Block {
        let c = self.blocks.entry(blockno).or_insert_with(|| Cached {
            data: Box::new([0u8; BLOCK_SIZE]),
            dirty: false,
            in_flight: false,
        });
        if !c.dirty {
            c.dirty = true;
            self.dirty_count += 1;
            self.dirty_list.push(blockno);
        }
        c.data.fill(0);
        &mut c.data
    }

    /// Hold a block image that is newer than the device's copy (read-only log
    /// overlay); it is verified and never evicted.
    pub fn pin(&mut self, blockno: u64, img: Box<Block>) -> Result<()> {
        verify(&img, blockno, None)?;
        if !self.blocks.get(&blockno).is_some_and(|c| c.dirty) {
            self.dirty_count += 1;
            self.dirty_list.push(blockno);
        }
        self.blocks.insert(blockno, Cached { data: img, dirty: true, in_flight: false });
        Ok(())
    }

    /// Drop a freed block: it must not be written back.
    pub fn forget(&mut self, blockno: u64) {
        if let Some(c) = self.blocks.remove(&blockno) {
            if c.dirty {
                self.dirty_count -= 1;
            }
        }
    }

    /// Whether the block is dirty in the current delta.
    pub fn is_dirty(&self, blockno: u64) -> bool {
        self.blocks.get(&blockno).is_some_and(|c| c.dirty)
    }

    /// Whether the block is in memory.
    pub fn contains(&self, blockno: u64) -> bool {
        self.blocks.contains_key(&blockno)
    }

    /// Read the blocks that are not yet cached in ascending order, coalescing runs of
    /// adjacent blocks into single requests (the sorted sweep of readdirplus and readahead).
    /// Blocks that fail verification are skipped here and reported by the later `get`.
    pub fn prefetch(&mut self, dev: &dyn BlockDevice, wanted: &[u64]) -> Result<()> {
        let mut want: Vec<u64> =
            wanted.iter().copied().filter(|b| *b < dev.block_count() && !self.blocks.contains_key(b)).collect();
        want.sort_unstable();
        want.dedup();
        // Runs (first index, end index into `want`): a run ends at a gap wider than
        // MAX_GAP blocks, since reading a few blocks that are not wanted (or already
        // cached) costs less than another request.
        let mut runs = Vec::new();
        let mut i = 0;
        while i < want.len() {
            let start = want[i];
            let mut j = i + 1;
            while j < want.len() && want[j] - want[j - 1] <= MAX_GAP && want[j] - start < MAX_BATCH as u64 {
                j += 1;
            }
            runs.push((i, j));
            i = j;
        }
        // Up to BATCH_BYTES of runs go to the device at once (concurrently where it can).
        let mut r = 0;
        while r < runs.len() {
            let mut end = r;
            let mut bytes = 0;
            while end < runs.len() && (end == r || bytes < BATCH_BYTES) {
                let (a, b) = runs[end];
                bytes += (want[b - 1] - want[a] + 1) as usize * BLOCK_SIZE;
                end += 1;
            }
            let mut bufs: Vec<Vec<u8>> = runs[r..end]
                .iter()
                .map(|&(a, b)| vec![0u8; (want[b - 1] - want[a] + 1) as usize * BLOCK_SIZE])
                .collect();
            let mut reqs: Vec<(u64, &mut [u8])> =
                runs[r..end].iter().zip(bufs.iter_mut()).map(|(&(a, _), buf)| (want[a], &mut buf[..])).collect();
            dev.read_many(&mut reqs)?;
            for (&(a, b), buf) in runs[r..end].iter().zip(&bufs) {
                let start = want[a];
                for &blockno in &want[a..b] {
                    let k = (blockno - start) as usize;
                    let mut blk = Box::new([0u8; BLOCK_SIZE]);
                    blk.copy_from_slice(&buf[k * BLOCK_SIZE..(k + 1) * BLOCK_SIZE]);
                    if verify(&blk, blockno, None).is_ok() {
                        self.blocks.insert(blockno, Cached { data: blk, dirty: false, in_flight: false });
                    }
                }
            }
            r = end;
        }
        self.trim();
        Ok(())
    }

    /// Inode-block readahead (ext4 reads 32 inode-table blocks at a time): for each
    /// wanted block not yet cached, read the aligned window of `window` blocks holding
    /// it, one request per window, in ascending order, at most `limit` blocks in all.
    /// Every block of a window that verifies and carries `magic` is kept (the wanted
    /// ones are `magic` blocks too; others that fail are reported by the later `get`):
    /// with inode regions, a directory's children fill whole windows.
    /// Only blocks `allocated` says are in use are kept, so a freed (stale) inode block
    /// is never cached; and every newly allocated metadata block is written with
    /// [`MetaCache::fresh`] before use, whatever the cache held for it.
    ///
    /// Blocks for which `allocated` is false are not kept (a freed inode block still
    /// looks valid on the device). Returns the blocks read and the sum of `live` over
    /// the blocks kept, so that the caller can tell whether windows pay.
    pub fn prefetch_windows(
        &mut self,
        dev: &dyn BlockDevice,
        wanted: &[u64],
        w: Windows,
        allocated: impl Fn(u64) -> bool,
        live: impl Fn(&Block) -> u32,
    ) -> Result<(u64, u64)> {
        let Windows { blocks: window, magic, limit } = w;
        let window = window.clamp(1, MAX_BATCH as u64);
        let mut starts: Vec<u64> = wanted
            .iter()
            .copied()
            .filter(|b| *b < dev.block_count() && !self.blocks.contains_key(b))
            .map(|b| b - b % window)
            .collect();
        starts.sort_unstable();
        starts.dedup();
        starts.truncate(limit.div_ceil(window as usize).max(1));
        let (mut read, mut alive) = (0u64, 0u64);
        let per_batch = (BATCH_BYTES / (BLOCK_SIZE * window as usize)).max(1);
        for batch in starts.chunks(per_batch) {
            let mut bufs: Vec<Vec<u8>> =
                batch.iter().map(|&s| vec![0u8; window.min(dev.block_count() - s) as usize * BLOCK_SIZE]).collect();
            let mut reqs: Vec<(u64, &mut [u8])> =
                batch.iter().zip(bufs.iter_mut()).map(|(&s, b)| (s, &mut b[..])).collect();
            dev.read_many(&mut reqs)?;
            for (&start, buf) in batch.iter().zip(&bufs) {
                let n = buf.len() / BLOCK_SIZE;
                read += n as u64;
                for k in 0..n {
                    let b = start + k as u64;
                    if self.blocks.contains_key(&b) || !allocated(b) {
                        continue;
                    }
                    let mut blk = Box::new([0u8; BLOCK_SIZE]);
                    blk.copy_from_slice(&buf[k * BLOCK_SIZE..(k + 1) * BLOCK_SIZE]);
                    if verify(&blk, b, Some(magic)).is_ok() {
                        alive += u64::from(live(&blk));
                        self.blocks.insert(b, Cached { data: blk, dirty: false, in_flight: false });
                    }
                }
            }
        }
        self.trim();
        Ok((read, alive))
    }

    /// Number of dirty blocks in the current delta.
    pub fn dirty_count(&self) -> usize {
        self.dirty_count
    }

    /// Seal every dirty block (address + crc) and hand the set over, ascending. The
    /// blocks stay cached, now clean.
    pub fn take_dirty(&mut self) -> Vec<(u64, Box<Block>)> {
        let mut list = std::mem::take(&mut self.dirty_list);
        list.sort_unstable();
        list.dedup();
        let mut out = Vec::with_capacity(self.dirty_count);
        for b in list {
            if let Some(c) = self.blocks.get_mut(&b) {
                if c.dirty {
                    c.dirty = false;
                    c.in_flight = true;
                    seal(&mut c.data, b);
                    out.push((b, c.data.clone()));
                }
            }
        }
        self.dirty_count = 0;
        out
    }

    /// The blocks of a commit are home on the device: they may be evicted again.
    pub fn landed(&mut self, blocks: &[(u64, Box<Block>)]) {
        for (b, _) in blocks {
            if let Some(c) = self.blocks.get_mut(b) {
                c.in_flight = false;
            }
        }
    }

    /// Forget every block (e.g. after a failed commit, to reload the committed state).
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.dirty_list.clear();
        self.dirty_count = 0;
    }

    /// Drop every clean block that is not in flight (what eviction may drop): their
    /// device copies are current.
    pub fn drop_clean(&mut self) {
        self.blocks.retain(|_, c| c.dirty || c.in_flight);
    }

    /// Drop clean blocks until the map holds a quarter less than `keep`; which ones is
    /// left to the hash order, which is as good as random for a metadata cache.
    /// Back under capacity after a prefetch (dirty blocks do not count).
    fn trim(&mut self) {
        if self.blocks.len() > self.capacity + self.dirty_count {
            Self::evict(&mut self.blocks, self.capacity + self.dirty_count);
        }
    }

    fn evict(blocks: &mut FxHashMap<u64, Cached>, keep: usize) {
        let mut excess = blocks.len().saturating_sub(keep * 3 / 4);
        blocks.retain(|_, c| {
            if excess == 0 || c.dirty || c.in_flight {
                true
            } else {
                excess -= 1;
                false
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::device::MemDevice;

    fn sealed(dev: &MemDevice, b: u64, m: u32) {
        let mut blk = [0u8; BLOCK_SIZE];
        put_u32(&mut blk, 0, m);
        seal(&mut blk, b);
        dev.write(b, &blk).unwrap();
    }

    #[test]
    fn verifies_dirty_tracks_and_evicts_only_clean() {
        let dev = MemDevice::new(256);
        for b in 0..200 {
            sealed(&dev, b, 0xABCD);
        }
        let mut c = MetaCache::new(64);
        assert!(c.get(&dev, 3, Some(0xABCD)).is_ok());
        assert!(c.get(&dev, 3, Some(0x1111)).is_err(), "wrong magic must be refused");
        c.get_mut(&dev, 5, Some(0xABCD)).unwrap()[100] = 9;
        for b in 0..200 {
            c.get(&dev, b, None).unwrap();
        }
        assert!(c.blocks.len() <= 64 + 1 + 1, "cache exceeded its bound: {}", c.blocks.len());
        assert_eq!(c.get(&dev, 5, None).unwrap()[100], 9, "dirty block was evicted");
        let d = c.take_dirty();
        assert_eq!(d.len(), 1);
        verify(&d[0].1, 5, Some(0xABCD)).unwrap();
        // Unwritten block 250 is zeros: fails verification.
        assert!(c.get(&dev, 250, None).is_err());
        assert!(c.get(&dev, 10_000, None).is_err());
    }

    #[test]
    fn prefetch_coalesces_adjacent_blocks() {
        let dev = MemDevice::new(64);
        for b in 0..64 {
            sealed(&dev, b, 1);
        }
        let mut c = MetaCache::new(1000);
        let before = dev.stats().reads;
        c.prefetch(&dev, &[12, 10, 11, 30, 31, 50]).unwrap();
        assert_eq!(dev.stats().reads - before, 3, "three runs, three requests");
        let before = dev.stats().reads;
        c.get(&dev, 31, None).unwrap();
        assert_eq!(dev.stats().reads, before, "prefetched block read again");
    }
}
