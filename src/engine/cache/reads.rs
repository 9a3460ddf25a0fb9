//! Reads the cache plans, does and caches in three steps, so that the middle one, the
//! device I/O, needs no lock: the sorted, coalesced sweeps of readahead and readdirplus,
//! inode windows, and the reads an operation put off until it had let go of its locks
//! (`engine::deferred`). A block read with no lock held is cached only if its shard's
//! generation did not move meanwhile ([`MetaCache::fill`]).

use std::sync::atomic::Ordering;

use super::*;

/// Device reads the cache planned ([`MetaCache::plan_blocks`],
/// [`MetaCache::plan_windows`]): runs of blocks, each with what to keep of it.
#[derive(Default)]
pub struct Reads {
    runs: Vec<Run>,
    /// [`MetaCache::gens`] when planned (empty only for no runs).
    gens: Vec<u64>,
}

struct Run {
    start: u64,
    len: u64,
    keep: Keep,
}

/// What of a run to keep.
enum Keep {
    /// These blocks (a run bridges small gaps of blocks nobody asked for).
    Listed(Vec<u64>),
    /// Every block carrying this magic (an inode window).
    Magic(u32),
}

/// [`Reads`] done: each run with its bytes.
pub struct Filled {
    runs: Vec<(Run, Vec<u8>)>,
    gens: Vec<u64>,
}

impl Reads {
    /// Whether there is nothing to read.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Blocks the runs cover.
    pub fn blocks(&self) -> u64 {
        self.runs.iter().map(|r| r.len).sum()
    }

    /// Add `other`'s runs (planned no earlier than these: the older generations stand).
    pub fn append(&mut self, other: Reads) {
        if self.gens.is_empty() {
            self.gens = other.gens;
        }
        self.runs.extend(other.runs);
    }

    /// Read the runs, up to `BATCH_BYTES` at a time handed to the device together
    /// (concurrently where it can). Takes no lock.
    pub fn read(self, dev: &dyn BlockDevice) -> Result<Filled> {
        let mut out = Vec::with_capacity(self.runs.len());
        let mut runs = self.runs.into_iter().peekable();
        while runs.peek().is_some() {
            let mut batch = Vec::new();
            let mut bytes = 0;
            while let Some(r) = runs.next_if(|_| batch.is_empty() || bytes < BATCH_BYTES) {
                bytes += r.len as usize * BLOCK_SIZE;
                batch.push(r);
            }
            let mut bufs: Vec<Vec<u8>> = batch.iter().map(|r| vec![0u8; r.len as usize * BLOCK_SIZE]).collect();
            let mut reqs: Vec<(u64, &mut [u8])> =
                batch.iter().zip(bufs.iter_mut()).map(|(r, b)| (r.start, &mut b[..])).collect();
            dev.read_many(&mut reqs)?;
            out.extend(batch.into_iter().zip(bufs));
        }
        Ok(Filled { runs: out, gens: self.gens })
    }
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
    /// Count `n` blocks read from the device, if under an operation's locks.
    pub(super) fn count_read(&self, n: u64) {
        if deferred::in_op() {
            self.reads_under_locks.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Blocks read from the device under an operation's locks so far.
    pub fn reads_under_locks(&self) -> u64 {
        self.reads_under_locks.load(Ordering::Relaxed)
    }

    /// Do `reads` (see [`Reads::read`]), counted if under an operation's locks.
    pub fn read(&self, reads: Reads, dev: &dyn BlockDevice) -> Result<Filled> {
        self.count_read(reads.blocks());
        reads.read(dev)
    }

    /// Read the blocks that are not yet cached in ascending order, coalescing runs of
    /// adjacent blocks into single requests (the sorted sweep of readdirplus and readahead).
    /// Blocks that fail verification are skipped here and reported by the later `get`.
    /// In a [`deferred::defer_misses`] scope the sweep is only noted, for after.
    pub fn prefetch(&self, dev: &dyn BlockDevice, wanted: &[u64]) -> Result<()> {
        if deferred::deferring() {
            let want: Vec<u64> = wanted.iter().copied().filter(|b| !self.known(*b)).collect();
            if !want.is_empty() {
                deferred::want(Wanted::Blocks(want));
            }
            return Ok(());
        }
        let reads = self.plan_blocks(dev.block_count(), wanted);
        self.fill(self.read(reads, dev)?, false, |_| true, |_| 0);
        Ok(())
    }

    /// Plan [`MetaCache::prefetch`]'s reads: the uncached ones of `wanted` (below
    /// `block_count`), in runs that end at a gap wider than `MAX_GAP` blocks, since
    /// reading a few blocks that are not wanted (or already cached) costs less than
    /// another request.
    pub fn plan_blocks(&self, block_count: u64, wanted: &[u64]) -> Reads {
        let mut want: Vec<u64> = wanted.iter().copied().filter(|b| *b < block_count && !self.known(*b)).collect();
        want.sort_unstable();
        want.dedup();
        let mut reads = Reads { runs: Vec::new(), gens: self.gens_now() };
        let mut i = 0;
        while i < want.len() {
            let start = want[i];
            let mut j = i + 1;
            while j < want.len() && want[j] - want[j - 1] <= MAX_GAP && want[j] - start < MAX_BATCH as u64 {
                j += 1;
            }
            let len = want[j - 1] - start + 1;
            reads.runs.push(Run { start, len, keep: Keep::Listed(want[i..j].to_vec()) });
            i = j;
        }
        reads
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
        &self,
        dev: &dyn BlockDevice,
        wanted: &[u64],
        w: Windows,
        allocated: impl Fn(u64) -> bool,
        live: impl Fn(&Block) -> u32,
    ) -> Result<(u64, u64)> {
        let reads = self.plan_windows(dev.block_count(), wanted, w);
        let read = reads.blocks();
        Ok((read, self.fill(self.read(reads, dev)?, false, allocated, live)))
    }

    /// Plan [`MetaCache::prefetch_windows`]'s reads.
    pub fn plan_windows(&self, block_count: u64, wanted: &[u64], w: Windows) -> Reads {
        let Windows { blocks: window, magic, limit } = w;
        let window = window.clamp(1, MAX_BATCH as u64);
        let mut starts: Vec<u64> =
            wanted.iter().copied().filter(|b| *b < block_count && !self.known(*b)).map(|b| b - b % window).collect();
        starts.sort_unstable();
        starts.dedup();
        starts.truncate(limit.div_ceil(window as usize).max(1));
        let runs = starts
            .into_iter()
            .map(|start| Run { start, len: window.min(block_count - start), keep: Keep::Magic(magic) })
            .collect();
        Reads { runs, gens: self.gens_now() }
    }

    /// Cache what `filled` read: the blocks each run keeps that verify, that
    /// `allocated` allows (windows only) and that are not known already. With `checked`
    /// (reads done with no lock held), a block is not kept if device copies of its shard
    /// may have changed since the reads were planned: a block changed, written home and
    /// evicted meanwhile would come back stale. (One that was not cached at some point in
    /// between cannot have changed: changes reach the device through the cache, frees
    /// through its tombstones.) Returns the sum of `live` over the window blocks kept.
    pub fn fill(
        &self,
        filled: Filled,
        checked: bool,
        allocated: impl Fn(u64) -> bool,
        live: impl Fn(&Block) -> u32,
    ) -> u64 {
        let mut alive = 0;
        for (run, buf) in filled.runs {
            for k in 0..run.len {
                let b = run.start + k;
                let want = match &run.keep {
                    Keep::Listed(l) => l.binary_search(&b).is_ok().then_some(None),
                    Keep::Magic(m) => (!self.known(b) && allocated(b)).then_some(Some(*m)),
                };
                let Some(magic) = want else { continue };
                let at = k as usize * BLOCK_SIZE;
                let mut blk = Box::new([0u8; BLOCK_SIZE]);
                blk.copy_from_slice(&buf[at..at + BLOCK_SIZE]);
                if verify(&blk, b, magic).is_err() {
                    continue;
                }
                if magic.is_some() {
                    alive += u64::from(live(&blk));
                }
                let k = shard_of(b);
                let mut s = self.shards[k].write();
                // Under the shard's lock: `landed` bumps the generation before it lets a
                // block of this shard be evicted.
                if s.freed.contains_key(&b)
                    || (checked && filled.gens.get(k) != Some(&self.gens[k].load(Ordering::SeqCst)))
                {
                    continue;
                }
                s.insert_clean(b, blk, self.shard_capacity);
            }
        }
        alive
    }
}
