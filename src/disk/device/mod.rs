//! Block devices: the 4 KiB-block interface the filesystem is built on, and three
//! implementations of it.
//!
//! - [`FileDevice`] (`file.rs`): a regular image file or a real block device, through
//!   pread/pwrite.
//! - [`MemDevice`] (`mem.rs`): blocks in memory, for tests and benchmarks.
//! - [`FaultDevice`]: an in-memory device that records every block write and flush, can
//!   stop accepting writes after a given count (a simulated power cut), and rebuilds the
//!   images a crash could have left on disk ([`CrashMode`]).
//!
//! Buffers aligned for `O_DIRECT`, and a pool of them, are in `aligned.rs`. Every
//! implementation checks requests the same way: a buffer whose length is not a non-zero
//! multiple of [`BLOCK_SIZE`], or a range reaching past the last block, is refused with
//! [`Error::Invalid`] and never touches the device or panics.

mod aligned;
mod file;
mod held;
mod mem;

pub use aligned::AlignedBuf;
pub(crate) use aligned::BufferPool;
pub use file::FileDevice;
pub(crate) use held::{storage_full, HeldWrites};
pub use mem::MemDevice;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::disk::codec::BLOCK_SIZE;
use crate::error::{Error, Result};

/// Block size as a u64, for byte offsets.
const BS: u64 = BLOCK_SIZE as u64;
/// The smallest file-data write a `FileDevice` sends `O_DIRECT` (64 KiB).
const DIRECT_WRITE_MIN: usize = 16 * BLOCK_SIZE;

/// I/O counters. `reads`/`writes` count requests (one call = one request, however many
/// blocks); `blocks_read`/`blocks_written` count the blocks those requests moved. Only
/// requests that succeed are counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Read requests.
    pub reads: u64,
    /// Write requests.
    pub writes: u64,
    /// Flush requests.
    pub flushes: u64,
    /// Blocks moved by read requests.
    pub blocks_read: u64,
    /// Blocks moved by write requests.
    pub blocks_written: u64,
}

impl IoStats {
    /// The I/O done between `earlier` and `self` (field-wise difference, saturating).
    pub fn since(&self, earlier: IoStats) -> IoStats {
        IoStats {
            reads: self.reads.saturating_sub(earlier.reads),
            writes: self.writes.saturating_sub(earlier.writes),
            flushes: self.flushes.saturating_sub(earlier.flushes),
            blocks_read: self.blocks_read.saturating_sub(earlier.blocks_read),
            blocks_written: self.blocks_written.saturating_sub(earlier.blocks_written),
        }
    }
}

/// A device of 4 KiB blocks. Thread-safe (`&self`); implementations count I/O.
pub trait BlockDevice: Send + Sync {
    /// Number of blocks on the device.
    fn block_count(&self) -> u64;
    /// Read consecutive blocks starting at `block` into `buf` (len a non-zero multiple
    /// of BLOCK_SIZE). One request.
    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()>;
    /// Write consecutive blocks starting at `block`. One request.
    fn write(&self, block: u64, buf: &[u8]) -> Result<()>;
    /// Make every completed write durable.
    fn flush(&self) -> Result<()>;
    /// Write consecutive blocks and return only once they are durable (a forced unit
    /// access: these blocks, not necessarily the writes before them). The default writes
    /// and then flushes, which makes everything durable; an NBD server that offers
    /// `NBD_FLAG_SEND_FUA` gets one write with `NBD_CMD_FLAG_FUA`, a round trip less.
    fn write_durable(&self, block: u64, buf: &[u8]) -> Result<()> {
        self.write(block, buf)?;
        self.flush()
    }
    /// Read file data: as [`BlockDevice::read`], but for blocks the metadata cache never
    /// holds, so a device may move them past any cache of its own (a `FileDevice` uses
    /// `O_DIRECT`). A buffer aligned to [`BLOCK_SIZE`] in memory (as the crate's own
    /// aligned buffers are) spares a copy.
    fn read_data(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.read(block, buf)
    }
    /// Write blocks the metadata cache never holds (file data, a commit's log body): as
    /// [`BlockDevice::write`], past any cache, as `read_data`.
    fn write_data(&self, block: u64, buf: &[u8]) -> Result<()> {
        self.write(block, buf)
    }
    /// The I/O counted so far.
    fn stats(&self) -> IoStats;
    /// Read several runs, each as [`BlockDevice::read`] would (one request per run). A
    /// device that can have many requests in flight (NBD) sends them all before waiting;
    /// the default reads them one after another. On error the buffers' contents are
    /// unspecified.
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
        for (block, buf) in reqs.iter_mut() {
            self.read(*block, buf)?;
        }
        Ok(())
    }
    /// Write several runs, each as [`BlockDevice::write`] would (one request per run), in
    /// no particular order: the caller must not need one to land before another. A
    /// device that can have many requests in flight sends them all before waiting; the
    /// default writes them one after another.
    fn write_many(&self, reqs: &[(u64, &[u8])]) -> Result<()> {
        for (block, buf) in reqs {
            self.write(*block, buf)?;
        }
        Ok(())
    }
    /// Tell the device that `count` blocks from `block` hold nothing worth keeping, so
    /// thin storage can take them back; afterwards they read as zeros or as anything.
    /// The default does nothing.
    fn trim(&self, block: u64, count: u64) -> Result<()> {
        let _ = (block, count);
        Ok(())
    }
    /// Read as [`BlockDevice::read`] does, but what the storage holds now, past any cache
    /// of this host that another host's writes would not reach (the mount mark). The
    /// default is a plain read.
    fn read_fresh(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        self.read(block, buf)
    }
    /// This open is done writing (its volume is closed and clean): let the next opener
    /// have the device now, not when the process lets go of it. Later writes are refused
    /// with [`Error::ReadOnly`] where the device can tell. The default does nothing.
    fn release(&self) {}
}

/// Lets `Arc<dyn BlockDevice>` (or `Arc<FileDevice>`, ...) go wherever a device is expected.
impl<T: BlockDevice + ?Sized> BlockDevice for Arc<T> {
    fn block_count(&self) -> u64 {
        (**self).block_count()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        (**self).read(block, buf)
    }
    fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        (**self).write(block, buf)
    }
    fn flush(&self) -> Result<()> {
        (**self).flush()
    }
    fn write_durable(&self, block: u64, buf: &[u8]) -> Result<()> {
        (**self).write_durable(block, buf)
    }
    fn stats(&self) -> IoStats {
        (**self).stats()
    }
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
        (**self).read_many(reqs)
    }
    fn trim(&self, block: u64, count: u64) -> Result<()> {
        (**self).trim(block, count)
    }
    fn write_many(&self, reqs: &[(u64, &[u8])]) -> Result<()> {
        (**self).write_many(reqs)
    }
    fn read_fresh(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        (**self).read_fresh(block, buf)
    }
    fn read_data(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        (**self).read_data(block, buf)
    }
    fn write_data(&self, block: u64, buf: &[u8]) -> Result<()> {
        (**self).write_data(block, buf)
    }
    fn release(&self) {
        (**self).release()
    }
}

/// Check a trim against the device size.
pub(super) fn check_trim(block: u64, count: u64, blocks: u64) -> Result<()> {
    match block.checked_add(count) {
        Some(end) if end <= blocks => Ok(()),
        _ => Err(Error::Invalid(format!(
            "trim of {count} block(s) at block {block} is beyond the end of the device ({blocks} blocks)"
        ))),
    }
}

/// Check a request against the device size; returns the number of blocks it covers.
pub(super) fn check_request(op: &str, block: u64, len: usize, count: u64) -> Result<u64> {
    if len == 0 || len % BLOCK_SIZE != 0 {
        return Err(Error::Invalid(format!(
            "{op} of {len} bytes at block {block}: length must be a non-zero multiple of {BLOCK_SIZE}"
        )));
    }
    let n = (len / BLOCK_SIZE) as u64;
    match block.checked_add(n) {
        Some(end) if end <= count => Ok(n),
        _ => Err(Error::Invalid(format!(
            "{op} of {n} block(s) at block {block} is beyond the end of the device ({count} blocks)"
        ))),
    }
}

/// Byte range in an in-memory image of a request already passed by [`check_request`].
pub(super) fn mem_range(block: u64, len: usize) -> std::ops::Range<usize> {
    // The image is a Vec, so any in-range offset fits in usize.
    let start = block as usize * BLOCK_SIZE;
    start..start + len
}

/// Lock-free request counters shared by all implementations.
#[derive(Default)]
pub(super) struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    blocks_read: AtomicU64,
    blocks_written: AtomicU64,
}

impl Counters {
    pub(super) fn read(&self, blocks: u64) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.blocks_read.fetch_add(blocks, Ordering::Relaxed);
    }
    pub(super) fn write(&self, blocks: u64) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.blocks_written.fetch_add(blocks, Ordering::Relaxed);
    }
    pub(super) fn flush(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }
    pub(super) fn snapshot(&self) -> IoStats {
        IoStats {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            blocks_read: self.blocks_read.load(Ordering::Relaxed),
            blocks_written: self.blocks_written.load(Ordering::Relaxed),
        }
    }
}

/// Pad an image with zeros up to a whole number of blocks.
pub(super) fn pad_to_blocks(mut bytes: Vec<u8>) -> Vec<u8> {
    let rem = bytes.len() % BLOCK_SIZE;
    if rem != 0 {
        bytes.resize(bytes.len() + BLOCK_SIZE - rem, 0);
    }
    bytes
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::disk::fault::FaultDevice;

    /// `n` blocks where block i is filled with byte `seed + i`.
    pub(crate) fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).flat_map(|i| [seed.wrapping_add(i as u8); BLOCK_SIZE]).collect()
    }

    pub(crate) fn blk(img: &[u8], b: usize) -> &[u8] {
        &img[b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE]
    }

    /// Multi-block round trip, exact counters, and the request checks, on any device
    /// of at least 8 blocks.
    pub(crate) fn exercise(dev: &dyn BlockDevice) {
        let count = dev.block_count();
        assert!(count >= 8);
        let before = dev.stats();

        let data = pattern(3, 10);
        dev.write(2, &data).unwrap();
        dev.write(count - 1, &pattern(1, 99)).unwrap();
        let mut back = vec![0u8; 3 * BLOCK_SIZE];
        dev.read(2, &mut back).unwrap();
        assert_eq!(back, data);
        let mut one = vec![0u8; BLOCK_SIZE];
        dev.read(3, &mut one).unwrap();
        assert_eq!(one, vec![11u8; BLOCK_SIZE]);
        dev.read(count - 1, &mut one).unwrap();
        assert_eq!(one, vec![99u8; BLOCK_SIZE]);
        dev.flush().unwrap();

        assert_eq!(
            dev.stats().since(before),
            IoStats { reads: 3, writes: 2, flushes: 1, blocks_read: 5, blocks_written: 4 }
        );

        // Refused requests: nothing moves, nothing is counted.
        let mid = dev.stats();
        let mut two = vec![0u8; 2 * BLOCK_SIZE];
        let err = dev.read(count - 1, &mut two).unwrap_err();
        assert!(matches!(err, Error::Invalid(ref m) if m.contains("beyond the end")));
        assert!(matches!(dev.read(count, &mut one), Err(Error::Invalid(_))));
        assert!(matches!(dev.read(u64::MAX, &mut one), Err(Error::Invalid(_))));
        assert!(matches!(dev.write(count, &one), Err(Error::Invalid(_))));
        assert!(matches!(dev.write(u64::MAX, &one), Err(Error::Invalid(_))));
        let err = dev.write(0, &one[..100]).unwrap_err();
        assert!(matches!(err, Error::Invalid(ref m) if m.contains("multiple of 4096")));
        assert!(matches!(dev.read(0, &mut []), Err(Error::Invalid(_))));
        assert!(matches!(dev.write(0, &[]), Err(Error::Invalid(_))));
        assert!(matches!(dev.read(0, &mut vec![0u8; BLOCK_SIZE + 1]), Err(Error::Invalid(_))));
        assert_eq!(dev.stats(), mid);
        dev.read(count - 1, &mut one).unwrap();
        assert_eq!(one, vec![99u8; BLOCK_SIZE], "refused write changed data");
    }

    #[test]
    fn arc_dyn_device_delegates() {
        let mem = Arc::new(MemDevice::new(8));
        let dev: Arc<dyn BlockDevice> = mem.clone();
        fn takes_device<D: BlockDevice>(d: D) -> D {
            d
        }
        let dev = takes_device(dev);
        exercise(&dev);
        assert_eq!(dev.stats(), mem.stats());
        assert_eq!(mem.stats().writes, 2);
        assert_eq!(blk(&mem.to_bytes(), 4), &[12u8; BLOCK_SIZE][..]);
    }

    #[test]
    fn concurrent_writers_on_distinct_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let devs: Vec<Arc<dyn BlockDevice>> = vec![
            Arc::new(MemDevice::new(64)),
            Arc::new(FileDevice::create(dir.path().join("img"), 64 * BS).unwrap()),
            Arc::new(FaultDevice::new(vec![0; 64 * BLOCK_SIZE])),
        ];
        for dev in devs {
            std::thread::scope(|s| {
                for t in 0..4u64 {
                    let dev = &dev;
                    s.spawn(move || {
                        for i in 0..16u64 {
                            let b = t * 16 + i;
                            dev.write(b, &[b as u8; BLOCK_SIZE]).unwrap();
                        }
                    });
                }
            });
            let mut all = vec![0u8; 64 * BLOCK_SIZE];
            dev.read(0, &mut all).unwrap();
            for b in 0..64 {
                assert_eq!(blk(&all, b), &[b as u8; BLOCK_SIZE][..]);
            }
            assert_eq!(dev.stats().writes, 64);
            assert_eq!(dev.stats().blocks_written, 64);
        }
    }
}
