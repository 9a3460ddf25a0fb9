//! The delta log: how a delta's metadata becomes durable atomically, and recovery.
//!
//! Two log areas are used alternately. Committing delta `n`:
//! 1. the caller has already written the delta's data blocks (to blocks free in the last
//!    committed state, so nothing committed is overwritten);
//! 2. write the target list and the block images into area `n % 2`, behind its first block;
//! 3. flush — data, log body and the previous delta's home writes are now durable;
//! 4. write the commit block (seq, count, crc32c of the body) into the area's first block;
//! 5. make it durable — delta `n` is committed (`write_durable`: a FUA write on an NBD
//!    server that offers it, else a write and a flush);
//! 6. write the blocks to their home locations (made durable by the next commit's step 3).
//!
//! Recovery reads both commit blocks and replays the newest valid one. Only that one can
//! be missing from home locations: step 3 of delta `n` made delta `n-1`'s homes durable,
//! and delta `n+1` never touches area `n % 2`. Replay is idempotent.

use crate::disk::codec::*;
use crate::disk::device::{AlignedBuf, BlockDevice};
use crate::disk::format::{Layout, COMMIT_MAGIC};
use crate::error::{Error, Result};

/// Block images with their home addresses.
pub type BlockImages = Vec<(u64, Box<Block>)>;

/// Targets listed per descriptor block.
const TARGETS_PER_DESC: usize = BLOCK_SIZE / 8;

/// Largest number of blocks one delta can log in areas of `log_blocks` blocks.
pub fn capacity(log_blocks: u32) -> usize {
    // n images + ceil(n / 512) descriptors + 1 commit block <= log_blocks
    let avail = log_blocks as usize - 1;
    avail - avail.div_ceil(TARGETS_PER_DESC + 1)
}

/// The commit sequence and layout.
pub struct Journal {
    layout: Layout,
    /// Sequence number of the last committed delta.
    pub seq: u64,
    /// Blocks the last committed delta logged (0: nothing to replay).
    pub last_blocks: usize,
}

fn body_crc(body: &[u8]) -> u32 {
    crc32c::crc32c(body)
}

/// A commit block's fields, when valid.
fn read_commit(dev: &dyn BlockDevice, at: u64) -> Result<Option<(u64, usize)>> {
    let mut b = [0u8; BLOCK_SIZE];
    dev.read(at, &mut b)?;
    if magic(&b) != COMMIT_MAGIC || verify(&b, at, Some(COMMIT_MAGIC)).is_err() {
        return Ok(None);
    }
    Ok(Some((get_u64(&b, 16), get_u32(&b, 24) as usize)))
}

/// A log area's first block, and (sequence, blocks logged) when its commit block is valid.
pub type AreaCommit = (u64, Option<(u64, usize)>);

/// Each log area's commit block (inspector).
pub fn commit_blocks(dev: &dyn BlockDevice, layout: Layout) -> Result<[AreaCommit; 2]> {
    let (a, b) = (layout.log_area(0), layout.log_area(1));
    Ok([(a, read_commit(dev, a)?), (b, read_commit(dev, b)?)])
}

/// The target blocks a valid commit in the area at `at` lists, and whether its body
/// matches the commit's checksum (inspector). None when the commit block is invalid or
/// lists more blocks than the log holds.
pub fn commit_targets(dev: &dyn BlockDevice, layout: Layout, at: u64) -> Result<Option<(Vec<u64>, bool)>> {
    let Some((_, n)) = read_commit(dev, at)? else {
        return Ok(None);
    };
    if n > capacity(layout.log_blocks) {
        return Ok(None);
    }
    let (body, ok) = read_body(dev, at, n)?;
    let targets = (0..n).map(|i| get_u64(&body, i * 8)).collect();
    Ok(Some((targets, ok)))
}

/// The body (descriptors, then images) of the commit at `at` that logs `n` blocks, and
/// whether it matches the commit block's checksum.
fn read_body(dev: &dyn BlockDevice, at: u64, n: usize) -> Result<(Vec<u8>, bool)> {
    let ndesc = n.div_ceil(TARGETS_PER_DESC);
    let mut body = vec![0u8; (ndesc + n) * BLOCK_SIZE];
    if !body.is_empty() {
        dev.read(at + 1, &mut body)?;
    }
    let mut cb = [0u8; BLOCK_SIZE];
    dev.read(at, &mut cb)?;
    let ok = get_u32(&cb, 28) == body_crc(&body);
    Ok((body, ok))
}

impl Journal {
    /// Find the newest committed delta. With `apply`, write its blocks home (and
    /// flush); either way return them, so a read-only open can overlay them in memory.
    pub fn recover(dev: &dyn BlockDevice, layout: Layout, apply: bool) -> Result<(Journal, BlockImages)> {
        let mut best: Option<(u64, u64, usize)> = None; // (seq, area start, count)
        for area in 0..2 {
            let at = layout.log_area(area);
            if let Some((seq, n)) = read_commit(dev, at)? {
                if best.is_none_or(|(s, _, _)| seq > s) {
                    best = Some((seq, at, n));
                }
            }
        }
        let Some((seq, at, n)) = best else {
            return Ok((Journal { layout, seq: 0, last_blocks: 0 }, Vec::new()));
        };
        if n > capacity(layout.log_blocks) {
            return Err(Error::corrupt(format!("commit {seq} lists {n} blocks, more than the log holds")));
        }
        let ndesc = n.div_ceil(TARGETS_PER_DESC);
        let (body, ok) = read_body(dev, at, n)?;
        if !ok {
            // Step 3 flushed the body before the commit block was written, so a body
            // that does not match means the device broke its promise.
            return Err(Error::corrupt(format!("log body of commit {seq} fails its checksum")));
        }
        let log_end = layout.log_area(1) + layout.log_blocks as u64;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let t = get_u64(&body, i * 8);
            if t == 0
                || (t >= layout.log_area(0) && t < log_end)
                || t >= layout.backup_superblock()
                || (layout.mark_block != 0 && t == layout.mark_block)
            {
                return Err(Error::corrupt(format!("commit {seq} targets block {t}, which it may not")));
            }
            let mut img = Box::new([0u8; BLOCK_SIZE]);
            img.copy_from_slice(&body[(ndesc + i) * BLOCK_SIZE..(ndesc + i + 1) * BLOCK_SIZE]);
            out.push((t, img));
        }
        if apply {
            Self::apply(dev, &out)?;
        }
        let last_blocks = out.len();
        Ok((Journal { layout, seq, last_blocks }, out))
    }

    /// Write a recovered delta's blocks home, and make them durable.
    pub fn apply(dev: &dyn BlockDevice, blocks: &BlockImages) -> Result<()> {
        for (t, img) in blocks {
            dev.write(*t, &img[..])?;
        }
        dev.flush()
    }

    /// Blocks one delta may log.
    pub fn capacity(&self) -> usize {
        capacity(self.layout.log_blocks)
    }

    /// Commit one delta whose metadata blocks (sealed, ascending) are `blocks`. Data
    /// blocks must already have been written.
    pub fn commit(&mut self, dev: &dyn BlockDevice, blocks: &[(u64, Box<Block>)]) -> Result<()> {
        let n = blocks.len();
        if n > self.capacity() {
            return Err(Error::corrupt(format!("delta of {n} blocks exceeds the log capacity {}", self.capacity())));
        }
        let seq = self.seq + 1;
        let at = self.layout.log_area(seq % 2);
        let ndesc = n.div_ceil(TARGETS_PER_DESC);
        let mut body = AlignedBuf::new((ndesc + n) * BLOCK_SIZE);
        for (i, (t, img)) in blocks.iter().enumerate() {
            put_u64(&mut body, i * 8, *t);
            body[(ndesc + i) * BLOCK_SIZE..(ndesc + i + 1) * BLOCK_SIZE].copy_from_slice(&img[..]);
        }
        if !body.is_empty() {
            // Past the host's cache when the device has a way (as file data): nothing
            // reads the log but recovery, and a large body is one request, not a copy into
            // the cache that the flush below then writes out.
            dev.write_data(at + 1, &body)?;
        }
        dev.flush()?;
        let mut cb = [0u8; BLOCK_SIZE];
        put_u32(&mut cb, 0, COMMIT_MAGIC);
        put_u64(&mut cb, 16, seq);
        put_u32(&mut cb, 24, n as u32);
        put_u32(&mut cb, 28, body_crc(&body));
        seal(&mut cb, at);
        // Durable on its own (FUA where the device has it): step 3's flush already made
        // everything this delta depends on durable, and nothing else is written between.
        dev.write_durable(at, &cb)?;
        self.seq = seq;
        self.last_blocks = n;
        // Home writes, coalesced into runs of adjacent blocks, handed to the device as
        // one batch (no order among them is needed: the next flush covers them all).
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut i = 0;
        while i < n {
            let mut j = i + 1;
            while j < n && blocks[j].0 == blocks[j - 1].0 + 1 && j - i < 256 {
                j += 1;
            }
            let mut run = Vec::with_capacity((j - i) * BLOCK_SIZE);
            for (_, img) in &blocks[i..j] {
                run.extend_from_slice(&img[..]);
            }
            runs.push((blocks[i].0, run));
            i = j;
        }
        let reqs: Vec<(u64, &[u8])> = runs.iter().map(|(b, r)| (*b, &r[..])).collect();
        dev.write_many(&reqs)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::device::MemDevice;

    fn setup() -> (MemDevice, Layout, Journal) {
        let layout = Layout::new(4096, 64).unwrap();
        let dev = MemDevice::new(4096);
        let (j, replay) = Journal::recover(&dev, layout, true).unwrap();
        assert!(replay.is_empty() && j.seq == 0, "a blank device has nothing to replay");
        (dev, layout, j)
    }

    /// A sealed metadata-like block for home `at`, filled with `fill`.
    fn image(at: u64, fill: u8) -> (u64, Box<Block>) {
        let mut b = Box::new([fill; BLOCK_SIZE]);
        put_u32(&mut b[..], 0, 0x1234_5678);
        seal(&mut b, at);
        (at, b)
    }

    fn read(dev: &MemDevice, at: u64) -> Box<Block> {
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        dev.read(at, &mut b[..]).unwrap();
        b
    }

    #[test]
    fn the_newest_valid_commit_is_replayed() {
        let (dev, layout, mut j) = setup();
        let home = layout.first_free() + 10;
        j.commit(&dev, &[image(home, 1)]).unwrap();
        j.commit(&dev, &[image(home, 2), image(home + 1, 2)]).unwrap();
        assert_eq!(j.seq, 2);
        // Home writes lost (no flush after them): recovery puts the newest delta back.
        dev.write(home, &[0u8; BLOCK_SIZE]).unwrap();
        dev.write(home + 1, &[0u8; BLOCK_SIZE]).unwrap();
        let (j2, replay) = Journal::recover(&dev, layout, false).unwrap();
        assert_eq!((j2.seq, j2.last_blocks, replay.len()), (2, 2, 2), "both areas valid: the higher sequence wins");
        assert_eq!(read(&dev, home)[100], 0, "a read-only recovery writes nothing home");
        Journal::recover(&dev, layout, true).unwrap();
        assert_eq!(read(&dev, home)[100], 2);
        assert_eq!(read(&dev, home + 1)[100], 2);
    }

    #[test]
    fn a_torn_commit_block_falls_back_to_the_older_delta() {
        let (dev, layout, mut j) = setup();
        let home = layout.first_free() + 10;
        j.commit(&dev, &[image(home, 1)]).unwrap();
        j.commit(&dev, &[image(home, 2)]).unwrap();
        // Delta 2's commit block never fully reached the device (torn): not committed.
        let at = layout.log_area(0);
        let mut cb = read(&dev, at);
        cb[2000..].fill(0xFF);
        dev.write(at, &cb[..]).unwrap();
        let (j2, replay) = Journal::recover(&dev, layout, true).unwrap();
        assert_eq!((j2.seq, replay.len()), (1, 1));
        assert_eq!(read(&dev, home)[100], 1, "delta 1's image is home");
    }

    #[test]
    fn a_body_that_fails_its_checksum_is_corruption() {
        let (dev, layout, mut j) = setup();
        let home = layout.first_free() + 10;
        j.commit(&dev, &[image(home, 1)]).unwrap();
        // The commit block is valid but the body it vouches for is not what was flushed.
        let body = layout.log_area(1) + 1;
        let mut b = read(&dev, body);
        b[0] ^= 1;
        dev.write(body, &b[..]).unwrap();
        assert!(matches!(Journal::recover(&dev, layout, true), Err(Error::Corrupt(_))));
    }

    #[test]
    fn bad_target_lists_are_corruption() {
        let (dev, layout, _) = setup();
        // Targets a commit may never name: block 0, the log itself, the backup superblock.
        for bad in [0, layout.log_area(0) + 3, layout.backup_superblock()] {
            let mut j = Journal { layout, seq: 0, last_blocks: 0 };
            j.commit(&dev, &[image(bad, 9)]).unwrap();
            let r = Journal::recover(&dev, layout, false);
            assert!(matches!(r, Err(Error::Corrupt(_))), "target {bad}: {:?}", r.map(|(j, _)| j.seq));
        }
        // A count beyond what the area holds.
        let at = layout.log_area(1);
        let mut cb = read(&dev, at);
        put_u64(&mut cb[..], 16, 7);
        put_u32(&mut cb[..], 24, 10_000);
        seal(&mut cb, at);
        dev.write(at, &cb[..]).unwrap();
        assert!(matches!(Journal::recover(&dev, layout, false), Err(Error::Corrupt(_))));
    }
}
