//! Writes the storage refused for want of room, held in memory until it has room again.
//!
//! A sparse image's host file system (or an NBD server's disk) can fill under a volume
//! that has plenty of free blocks. A write refused so ([`storage_full`]) is kept here,
//! read back from here, and written again by the next flush before the flush itself. A
//! flush succeeds only once every held write is on the storage, so "a write is durable
//! after the next successful flush" stays true and the commit protocol needs no change:
//! a commit whose flush fails for want of room has written nothing it depends on, and
//! can be tried again (`volume/commit.rs`, "stalled").
//!
//! What this costs when nothing is held: one atomic load per request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;

use super::{BlockDevice, IoStats};
use crate::disk::codec::BLOCK_SIZE;
use crate::error::{Error, Result};

/// Whether `e` says the storage has no room for a write (ENOSPC or EDQUOT from the host
/// file system, `NBD_ENOSPC` from a server). Nothing was lost: the write can be made again.
pub(crate) fn storage_full(e: &Error) -> bool {
    matches!(e, Error::Io(io) if matches!(io.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded))
}

/// The longest run one drain request writes (1 MiB).
const DRAIN_RUN: usize = 256;

/// A device that holds the writes its storage refused for want of room (see the module
/// documentation).
pub(crate) struct HeldWrites<D> {
    inner: D,
    /// Block → contents of every refused write not yet written again.
    held: RwLock<BTreeMap<u64, Box<[u8]>>>,
    /// `held` is not empty: the one thing a request looks at when nothing is held.
    any: AtomicBool,
}

impl<D: BlockDevice> HeldWrites<D> {
    /// Wrap `inner`.
    pub(crate) fn new(inner: D) -> HeldWrites<D> {
        HeldWrites { inner, held: RwLock::new(BTreeMap::new()), any: AtomicBool::new(false) }
    }

    /// How many blocks are held now.
    #[cfg(test)]
    fn held_blocks(&self) -> usize {
        if !self.any.load(Ordering::Acquire) {
            return 0;
        }
        self.held.read().len()
    }

    /// Make a write through `write`, holding `buf` from `block` if the storage is full.
    fn write_with(&self, block: u64, buf: &[u8], write: impl FnOnce(&D) -> Result<()>) -> Result<()> {
        self.forget(block, buf.len());
        match write(&self.inner) {
            Err(e) if storage_full(&e) => {
                self.hold(block, buf, &e);
                Ok(())
            }
            r => r,
        }
    }

    /// Keep `buf`'s blocks from `block`: the storage refused them (`e`).
    fn hold(&self, block: u64, buf: &[u8], e: &Error) {
        let mut held = self.held.write();
        if held.is_empty() {
            tracing::warn!("the storage has no room for a write ({e}); writes are held in memory until it has");
        }
        for (i, b) in buf.chunks_exact(BLOCK_SIZE).enumerate() {
            held.insert(block + i as u64, b.into());
        }
        self.any.store(true, Ordering::Release);
    }

    /// A newer write of `len` bytes from `block` supersedes what is held there.
    fn forget(&self, block: u64, len: usize) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let end = block.saturating_add((len / BLOCK_SIZE) as u64);
        let mut held = self.held.write();
        let gone: Vec<u64> = held.range(block..end).map(|(b, _)| *b).collect();
        for b in gone {
            held.remove(&b);
        }
        if held.is_empty() {
            self.any.store(false, Ordering::Release);
        }
    }

    /// Write every held block again, in runs; on an error (the storage still full) keep
    /// what is not written yet and return it.
    fn drain(&self) -> Result<()> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut held = self.held.write();
        let mut written = 0usize;
        while let Some(first) = held.keys().next().copied() {
            let mut run = Vec::new();
            let mut next = first;
            while run.len() < DRAIN_RUN * BLOCK_SIZE {
                match held.get(&next) {
                    Some(b) => run.extend_from_slice(b),
                    None => break,
                }
                next += 1;
            }
            self.inner.write(first, &run)?;
            for b in first..next {
                held.remove(&b);
            }
            written += (next - first) as usize;
        }
        self.any.store(false, Ordering::Release);
        tracing::info!("the storage has room again: {written} held blocks written");
        Ok(())
    }

    /// Read through `read`, then lay what is held over the blocks from `block`. Held
    /// blocks are looked at under the lock a drain takes, so a read never sees a block
    /// between its drain's write and its leaving the map.
    fn read_with(&self, block: u64, buf: &mut [u8], read: impl FnOnce(&D, &mut [u8]) -> Result<()>) -> Result<()> {
        if !self.any.load(Ordering::Acquire) {
            return read(&self.inner, buf);
        }
        let held = self.held.read();
        read(&self.inner, buf)?;
        overlay(&held, block, buf);
        Ok(())
    }
}

/// Copy the held blocks that fall in `buf` (blocks from `block`) over it.
fn overlay(held: &BTreeMap<u64, Box<[u8]>>, block: u64, buf: &mut [u8]) {
    let end = block.saturating_add((buf.len() / BLOCK_SIZE) as u64);
    for (b, data) in held.range(block..end) {
        let at = (b - block) as usize * BLOCK_SIZE;
        buf[at..at + BLOCK_SIZE].copy_from_slice(data);
    }
}

impl<D: BlockDevice> BlockDevice for HeldWrites<D> {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.read_with(block, buf, |d, b| d.read(block, b))
    }
    fn read_data(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.read_with(block, buf, |d, b| d.read_data(block, b))
    }
    fn read_fresh(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.read_with(block, buf, |d, b| d.read_fresh(block, b))
    }
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
        if !self.any.load(Ordering::Acquire) {
            return self.inner.read_many(reqs);
        }
        let held = self.held.read();
        self.inner.read_many(reqs)?;
        for (block, buf) in reqs.iter_mut() {
            overlay(&held, *block, buf);
        }
        Ok(())
    }
    fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        self.write_with(block, buf, |d| d.write(block, buf))
    }
    fn write_data(&self, block: u64, buf: &[u8]) -> Result<()> {
        self.write_with(block, buf, |d| d.write_data(block, buf))
    }
    fn write_many(&self, reqs: &[(u64, &[u8])]) -> Result<()> {
        for (block, buf) in reqs {
            self.forget(*block, buf.len());
        }
        match self.inner.write_many(reqs) {
            // Some may have been written: writing those again later does no harm.
            Err(e) if storage_full(&e) => {
                for (block, buf) in reqs {
                    self.hold(*block, buf, &e);
                }
                Ok(())
            }
            r => r,
        }
    }
    /// Durable means on the storage: a refused write is held, and the error returned.
    fn write_durable(&self, block: u64, buf: &[u8]) -> Result<()> {
        self.forget(block, buf.len());
        self.inner.write_durable(block, buf).inspect_err(|e| {
            if storage_full(e) {
                self.hold(block, buf, e);
            }
        })
    }
    /// Held writes stay held: a volume is released only once a flush has drained them.
    fn release(&self) {
        self.inner.release()
    }
    /// The held writes first: the flush makes them durable too, or fails.
    fn flush(&self) -> Result<()> {
        self.drain()?;
        // A host file system that fails an fsync for want of room may have dropped the
        // writes it had taken (its pages are marked clean): that is a lost write, never
        // a refused one, so it does not read as "full" to the caller.
        self.inner.flush().map_err(|e| {
            if storage_full(&e) {
                Error::Io(std::io::Error::other(format!("flush failed: {e}")))
            } else {
                e
            }
        })
    }
    fn trim(&self, block: u64, count: u64) -> Result<()> {
        self.forget(block, usize::try_from(count).unwrap_or(usize::MAX).saturating_mul(BLOCK_SIZE));
        self.inner.trim(block, count)
    }
    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::disk::device::MemDevice;

    /// A memory device whose storage is "full" while `full` is set: every write of a
    /// block never written before is refused, as a sparse file's host refuses them.
    struct Sparse {
        mem: MemDevice,
        written: parking_lot::Mutex<std::collections::HashSet<u64>>,
        full: AtomicBool,
    }

    impl Sparse {
        fn new(blocks: u64) -> Sparse {
            Sparse { mem: MemDevice::new(blocks), written: Default::default(), full: AtomicBool::new(false) }
        }
    }

    impl BlockDevice for Sparse {
        fn block_count(&self) -> u64 {
            self.mem.block_count()
        }
        fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
            self.mem.read(block, buf)
        }
        fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
            let n = (buf.len() / BLOCK_SIZE) as u64;
            let mut w = self.written.lock();
            if self.full.load(Ordering::Acquire) && (block..block + n).any(|b| !w.contains(&b)) {
                return Err(Error::Io(std::io::ErrorKind::StorageFull.into()));
            }
            w.extend(block..block + n);
            self.mem.write(block, buf)
        }
        fn flush(&self) -> Result<()> {
            self.mem.flush()
        }
        fn stats(&self) -> IoStats {
            self.mem.stats()
        }
    }

    fn block(v: u8) -> Vec<u8> {
        vec![v; BLOCK_SIZE]
    }

    fn read(d: &dyn BlockDevice, b: u64) -> u8 {
        let mut buf = block(0);
        d.read(b, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == buf[0]));
        buf[0]
    }

    /// A refused write is read back, held across later writes of other blocks, replaced
    /// by a newer write of its block, and written at the flush once there is room; the
    /// flush fails while there is none.
    #[test]
    fn refused_writes_are_held_until_a_flush_can_write_them() {
        let d = HeldWrites::new(Sparse::new(64));
        d.write(1, &block(1)).unwrap();
        d.inner.full.store(true, Ordering::Release);
        d.write(1, &block(2)).unwrap(); // written before: the host has its room
        d.write(5, &[block(5), block(6)].concat()).unwrap();
        d.write(9, &block(9)).unwrap();
        assert_eq!(d.held_blocks(), 3);
        assert_eq!((read(&d, 1), read(&d, 5), read(&d, 6), read(&d, 9)), (2, 5, 6, 9));
        assert_eq!(read(&d.inner, 5), 0, "not on the storage yet");
        d.write(9, &block(19)).unwrap();
        assert_eq!(read(&d, 9), 19);
        let err = d.flush().unwrap_err();
        assert!(storage_full(&err), "{err}");
        assert!(d.write_durable(12, &block(12)).is_err());
        assert_eq!(read(&d, 12), 12);
        d.inner.full.store(false, Ordering::Release);
        d.flush().unwrap();
        assert_eq!(d.held_blocks(), 0);
        for (b, v) in [(1, 2), (5, 5), (6, 6), (9, 19), (12, 12)] {
            assert_eq!(read(&d.inner, b), v, "block {b}");
        }
        let mut many = [block(0), block(0)];
        let [a, b] = &mut many;
        d.read_many(&mut [(5, &mut a[..]), (9, &mut b[..])]).unwrap();
        assert_eq!((a[0], b[0]), (5, 19));
    }

    /// A trim forgets what is held in its range; other errors pass through untouched.
    #[test]
    fn trims_forget_and_other_errors_pass() {
        let d = HeldWrites::new(Sparse::new(8));
        d.inner.full.store(true, Ordering::Release);
        d.write(3, &block(3)).unwrap();
        d.trim(3, 1).unwrap();
        assert_eq!(d.held_blocks(), 0);
        d.flush().unwrap();
        d.inner.full.store(false, Ordering::Release);
        assert!(matches!(d.write(8, &block(1)), Err(Error::Invalid(_))));
        assert_eq!(d.held_blocks(), 0);
    }
}
