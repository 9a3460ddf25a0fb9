//! Block devices: the 4 KiB-block interface the filesystem is built on, and three
//! implementations of it.
//!
//! - [`FileDevice`]: a regular image file or a real block device, through pread/pwrite.
//! - [`MemDevice`]: blocks in memory, for tests and benchmarks.
//! - [`FaultDevice`]: an in-memory device that records every block write and flush, can
//!   stop accepting writes after a given count (a simulated power cut), and rebuilds the
//!   images a crash could have left on disk ([`CrashMode`]).
//!
//! Every implementation checks requests the same way: a buffer whose length is not a
//! non-zero multiple of [`BLOCK_SIZE`], or a range reaching past the last block, is
//! refused with [`Error::Invalid`] and never touches the device or panics.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::disk::codec::{Block, BLOCK_SIZE};
use crate::error::{Error, Result};

/// Block size as a u64, for byte offsets.
const BS: u64 = BLOCK_SIZE as u64;

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
    /// The I/O counted so far.
    fn stats(&self) -> IoStats;
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
    fn stats(&self) -> IoStats {
        (**self).stats()
    }
}

/// Check a request against the device size; returns the number of blocks it covers.
fn check_request(op: &str, block: u64, len: usize, count: u64) -> Result<u64> {
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
fn mem_range(block: u64, len: usize) -> std::ops::Range<usize> {
    // The image is a Vec, so any in-range offset fits in usize.
    let start = block as usize * BLOCK_SIZE;
    start..start + len
}

/// Lock-free request counters shared by all implementations.
#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    blocks_read: AtomicU64,
    blocks_written: AtomicU64,
}

impl Counters {
    fn read(&self, blocks: u64) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.blocks_read.fetch_add(blocks, Ordering::Relaxed);
    }
    fn write(&self, blocks: u64) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.blocks_written.fetch_add(blocks, Ordering::Relaxed);
    }
    fn flush(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }
    fn snapshot(&self) -> IoStats {
        IoStats {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            blocks_read: self.blocks_read.load(Ordering::Relaxed),
            blocks_written: self.blocks_written.load(Ordering::Relaxed),
        }
    }
}

/// An I/O error that names the path it happened on.
fn path_error(path: &Path, e: io::Error) -> Error {
    Error::Io(io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Pad an image with zeros up to a whole number of blocks.
fn pad_to_blocks(mut bytes: Vec<u8>) -> Vec<u8> {
    let rem = bytes.len() % BLOCK_SIZE;
    if rem != 0 {
        bytes.resize(bytes.len() + BLOCK_SIZE - rem, 0);
    }
    bytes
}

// ---------------------------------------------------------------------------------------
// FileDevice

/// A device over a regular image file or a block device (e.g. `/dev/loop0`).
///
/// Uses positioned reads and writes (pread/pwrite), which are thread-safe without a lock.
pub struct FileDevice {
    file: File,
    path: PathBuf,
    blocks: u64,
    read_only: bool,
    counters: Counters,
}

impl FileDevice {
    /// Open an existing image file or block device. Its size (found by seeking to the
    /// end, which works for block devices too) is rounded down to whole blocks; less
    /// than one block is an error. A read-only device refuses writes with
    /// [`Error::ReadOnly`].
    pub fn open(path: impl AsRef<Path>, read_only: bool) -> Result<FileDevice> {
        let path = path.as_ref();
        let mut file = OpenOptions::new().read(true).write(!read_only).open(path).map_err(|e| path_error(path, e))?;
        let size = file.seek(SeekFrom::End(0)).map_err(|e| path_error(path, e))?;
        Self::with_size(file, path, size, read_only)
    }

    /// Create a sparse image file of `bytes` bytes (a non-zero multiple of BLOCK_SIZE),
    /// or extend an existing smaller one with `set_len`. Existing contents are kept and a
    /// larger file is not shrunk: the device covers the whole file. On a block device
    /// nothing is resized; it must already hold `bytes`.
    pub fn create(path: impl AsRef<Path>, bytes: u64) -> Result<FileDevice> {
        let path = path.as_ref();
        if bytes == 0 || bytes % BS != 0 {
            return Err(Error::Invalid(format!(
                "{}: image size {bytes} is not a non-zero multiple of {BLOCK_SIZE}",
                path.display()
            )));
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| path_error(path, e))?;
        let is_file = file.metadata().map_err(|e| path_error(path, e))?.is_file();
        let mut size = file.seek(SeekFrom::End(0)).map_err(|e| path_error(path, e))?;
        if size < bytes {
            if !is_file {
                return Err(Error::Invalid(format!("{}: device holds {size} bytes, {bytes} wanted", path.display())));
            }
            // set_len extends without writing data, so the file stays sparse.
            file.set_len(bytes).map_err(|e| path_error(path, e))?;
            size = bytes;
        }
        Self::with_size(file, path, size, false)
    }

    fn with_size(file: File, path: &Path, size: u64, read_only: bool) -> Result<FileDevice> {
        let blocks = size / BS;
        if blocks == 0 {
            return Err(Error::Invalid(format!(
                "{}: {size} bytes is smaller than one {BLOCK_SIZE}-byte block",
                path.display()
            )));
        }
        // dxfs asks for exactly the blocks it wants (sorted, coalesced batches); kernel
        // readahead on the image or device would fetch neighbours it did not ask for and
        // make "cold" reads warm. Advisory: failure changes nothing but speed.
        let _ = nix::fcntl::posix_fadvise(&file, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM);
        Ok(FileDevice { file, path: path.to_path_buf(), blocks, read_only, counters: Counters::default() })
    }

    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the device was opened read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }
}

impl fmt::Debug for FileDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileDevice")
            .field("path", &self.path)
            .field("blocks", &self.blocks)
            .field("read_only", &self.read_only)
            .finish()
    }
}

impl BlockDevice for FileDevice {
    fn block_count(&self) -> u64 {
        self.blocks
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        let n = check_request("read", block, buf.len(), self.blocks)?;
        self.file.read_exact_at(buf, block * BS)?;
        self.counters.read(n);
        Ok(())
    }

    fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let n = check_request("write", block, buf.len(), self.blocks)?;
        self.file.write_all_at(buf, block * BS)?;
        self.counters.write(n);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        // A read-only descriptor has no writes of ours to make durable.
        if !self.read_only {
            self.file.sync_data()?;
        }
        self.counters.flush();
        Ok(())
    }

    fn stats(&self) -> IoStats {
        self.counters.snapshot()
    }
}

// ---------------------------------------------------------------------------------------
// MemDevice

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

// ---------------------------------------------------------------------------------------
// FaultDevice

/// Which of the recorded writes a crash image keeps. See [`FaultDevice::crash_image`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    /// Every write issued before the crash reached the disk.
    All,
    /// Only the durable prefix: writes before the last flush that completed.
    DropUnflushed,
    /// Every write but the last reached the disk; of the last, only its first half.
    Torn,
    /// The durable prefix plus a pseudo-random subset (deterministic for the seed) of
    /// the later writes, applied in order.
    DropRandomUnflushed(u64),
}

/// One recorded block write.
type Record = (u64, Arc<Block>);

/// Bytes of a torn write that reach the disk.
const TORN_BYTES: usize = BLOCK_SIZE / 2;

/// The mutable part of a [`FaultDevice`], under one lock so writes and flushes are
/// recorded in a single global order.
struct FaultState {
    /// The image with every recorded write applied; what reads see.
    current: Vec<u8>,
    /// Every block write since creation, in order.
    writes: Vec<Record>,
    /// Number of writes recorded before each flush.
    flushes: Vec<usize>,
    /// Writes and flushes fail once this many writes are recorded.
    cut_after: Option<usize>,
}

impl FaultState {
    fn cut(&self) -> bool {
        self.cut_after.is_some_and(|n| self.writes.len() >= n)
    }
}

/// An in-memory device for crash tests: records every block write and flush in order,
/// can simulate the machine stopping after a number of writes, and rebuilds the images
/// a power failure could have left.
///
/// A multi-block write is recorded as one event per block, so crashes and tears happen
/// at 4 KiB granularity. Reads see every write applied so far, like a device with a
/// volatile cache.
pub struct FaultDevice {
    base: Vec<u8>,
    blocks: u64,
    state: Mutex<FaultState>,
    counters: Counters,
}

fn crashed() -> Error {
    Error::Io(io::Error::other("injected crash"))
}

/// Whether write `index` survives in [`CrashMode::DropRandomUnflushed`] with `seed`.
/// Depends only on (seed, index), so the choice is stable whatever crash point is asked.
fn survives(seed: u64, index: usize) -> bool {
    splitmix64(seed ^ splitmix64(index as u64)) & 1 == 1
}

/// SplitMix64 finalizer: a fixed, dependency-free hash, so seeds mean the same forever.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Number of writes durable at crash point `at`: the count recorded at the last flush
/// with count < `at`. A crash at `at` strikes after write `at - 1` was issued and before
/// anything issued after it completed, so a flush recorded right after that write has
/// not completed yet: the crash between the last write of an epoch and its flush is the
/// one that matters most, and it must be representable.
fn durable_prefix(flushes: &[usize], at: usize) -> usize {
    let i = flushes.partition_point(|&f| f < at);
    if i == 0 {
        0
    } else {
        flushes[i - 1]
    }
}

fn apply(img: &mut [u8], (block, data): &Record) {
    img[mem_range(*block, BLOCK_SIZE)].copy_from_slice(&data[..]);
}

fn apply_torn(img: &mut [u8], (block, data): &Record) {
    let start = *block as usize * BLOCK_SIZE;
    img[start..start + TORN_BYTES].copy_from_slice(&data[..TORN_BYTES]);
}

/// `base` with the writes of `writes` for which `keep(index)` holds applied in order.
/// Copies each touched block once (its last kept write), so cost is one image copy plus
/// a scan of the indices, not one block copy per write.
fn build_image(base: &[u8], writes: &[Record], keep: impl Fn(usize) -> bool) -> Vec<u8> {
    let mut last = vec![usize::MAX; base.len() / BLOCK_SIZE];
    for (i, (block, _)) in writes.iter().enumerate() {
        if keep(i) {
            last[*block as usize] = i;
        }
    }
    let mut img = base.to_vec();
    for &i in last.iter().filter(|&&i| i != usize::MAX) {
        apply(&mut img, &writes[i]);
    }
    img
}

impl FaultDevice {
    /// A device whose image starts as `base_image` (a partial last block is padded with
    /// zeros). Recording starts empty, with no cut.
    pub fn new(base_image: Vec<u8>) -> FaultDevice {
        let base = pad_to_blocks(base_image);
        FaultDevice {
            blocks: (base.len() / BLOCK_SIZE) as u64,
            state: Mutex::new(FaultState {
                current: base.clone(),
                writes: Vec::new(),
                flushes: Vec::new(),
                cut_after: None,
            }),
            base,
            counters: Counters::default(),
        }
    }

    /// Number of recorded block writes (a write of several blocks counts once per block).
    pub fn events(&self) -> usize {
        self.state.lock().writes.len()
    }

    /// After `n` recorded block writes, every further write and flush fails with
    /// `Error::Io("injected crash")` and is not recorded. A write that crosses the cut
    /// records its blocks up to the cut, then fails. `None` lifts the cut.
    pub fn set_cut_after(&self, n: Option<usize>) {
        self.state.lock().cut_after = n;
    }

    /// The write indices at which flushes happened: the number of writes recorded
    /// before each flush, in order.
    pub fn flush_points(&self) -> Vec<usize> {
        self.state.lock().flushes.clone()
    }

    /// The current image, with every recorded write applied (what reads see).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.state.lock().current.clone()
    }

    /// The image as it could be on disk if power failed after the first `at` block
    /// writes were issued:
    /// - [`CrashMode::All`]: all `at` writes applied;
    /// - [`CrashMode::DropUnflushed`]: only writes before the last flush recorded at or
    ///   before `at` (the durable prefix);
    /// - [`CrashMode::Torn`]: all writes before `at - 1`, and only the first 2048 bytes
    ///   of write `at - 1` (the base image when `at` is 0);
    /// - [`CrashMode::DropRandomUnflushed`]: the durable prefix plus a seeded
    ///   pseudo-random subset of writes `durable..at`, applied in order.
    ///
    /// # Panics
    /// If `at` exceeds [`events`](Self::events): no such crash point exists.
    pub fn crash_image(&self, at: usize, mode: CrashMode) -> Vec<u8> {
        let st = self.state.lock();
        assert!(at <= st.writes.len(), "crash point {at} beyond the {} recorded writes", st.writes.len());
        let writes = &st.writes[..at];
        match mode {
            CrashMode::All => build_image(&self.base, writes, |_| true),
            CrashMode::DropUnflushed => {
                let d = durable_prefix(&st.flushes, at);
                build_image(&self.base, &writes[..d], |_| true)
            }
            CrashMode::Torn => match writes.split_last() {
                None => self.base.clone(),
                Some((last, before)) => {
                    let mut img = build_image(&self.base, before, |_| true);
                    apply_torn(&mut img, last);
                    img
                }
            },
            CrashMode::DropRandomUnflushed(seed) => {
                let d = durable_prefix(&st.flushes, at);
                build_image(&self.base, writes, |i| i < d || survives(seed, i))
            }
        }
    }

    /// Every crash image of the writes recorded so far, `(at, image)` for `at` in
    /// `0..=events()`, each equal to `crash_image(at, mode)`. Built incrementally (about
    /// one block of work plus one image copy per step), so enumerating thousands of
    /// crash points is cheap. Later writes to the device are not seen.
    pub fn crash_images(&self, mode: CrashMode) -> CrashImages {
        let st = self.state.lock();
        CrashImages {
            writes: st.writes.clone(),
            flushes: st.flushes.clone(),
            mode,
            next_at: 0,
            cur: self.base.clone(),
            durable: match mode {
                CrashMode::DropRandomUnflushed(_) => self.base.clone(),
                _ => Vec::new(),
            },
            durable_len: 0,
            applied: 0,
        }
    }
}

impl fmt::Debug for FaultDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state.lock();
        f.debug_struct("FaultDevice")
            .field("blocks", &self.blocks)
            .field("events", &st.writes.len())
            .field("flushes", &st.flushes.len())
            .field("cut_after", &st.cut_after)
            .finish()
    }
}

impl BlockDevice for FaultDevice {
    fn block_count(&self) -> u64 {
        self.blocks
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        let n = check_request("read", block, buf.len(), self.blocks)?;
        buf.copy_from_slice(&self.state.lock().current[mem_range(block, buf.len())]);
        self.counters.read(n);
        Ok(())
    }

    fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        let n = check_request("write", block, buf.len(), self.blocks)?;
        let mut st = self.state.lock();
        for (blk, chunk) in (block..).zip(buf.chunks_exact(BLOCK_SIZE)) {
            // The machine stops mid-request: blocks before the cut are on record.
            if st.cut() {
                return Err(crashed());
            }
            let mut data: Block = [0; BLOCK_SIZE];
            data.copy_from_slice(chunk);
            let record = (blk, Arc::new(data));
            apply(&mut st.current, &record);
            st.writes.push(record);
        }
        self.counters.write(n);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let mut st = self.state.lock();
        if st.cut() {
            return Err(crashed());
        }
        let n = st.writes.len();
        st.flushes.push(n);
        self.counters.flush();
        Ok(())
    }

    fn stats(&self) -> IoStats {
        self.counters.snapshot()
    }
}

/// Iterator over the crash images of a [`FaultDevice`]; see
/// [`FaultDevice::crash_images`].
pub struct CrashImages {
    writes: Vec<Record>,
    flushes: Vec<usize>,
    mode: CrashMode,
    /// The crash point the next item is for.
    next_at: usize,
    /// Working image; what it holds depends on the mode (see `next`).
    cur: Vec<u8>,
    /// DropRandomUnflushed only: base plus writes `..durable_len`.
    durable: Vec<u8>,
    /// Writes applied to the durable image (DropUnflushed: to `cur`).
    durable_len: usize,
    /// Writes considered in `cur` (All, Torn, DropRandomUnflushed).
    applied: usize,
}

impl Iterator for CrashImages {
    type Item = (usize, Vec<u8>);

    fn next(&mut self) -> Option<(usize, Vec<u8>)> {
        let at = self.next_at;
        if at > self.writes.len() {
            return None;
        }
        self.next_at += 1;
        let img = match self.mode {
            // cur = writes ..at.
            CrashMode::All => {
                while self.applied < at {
                    apply(&mut self.cur, &self.writes[self.applied]);
                    self.applied += 1;
                }
                self.cur.clone()
            }
            // cur = writes ..at-1, then the torn one on a copy.
            CrashMode::Torn => {
                if at == 0 {
                    self.cur.clone()
                } else {
                    while self.applied < at - 1 {
                        apply(&mut self.cur, &self.writes[self.applied]);
                        self.applied += 1;
                    }
                    let mut img = self.cur.clone();
                    apply_torn(&mut img, &self.writes[at - 1]);
                    img
                }
            }
            // cur = writes ..durable.
            CrashMode::DropUnflushed => {
                let d = durable_prefix(&self.flushes, at);
                while self.durable_len < d {
                    apply(&mut self.cur, &self.writes[self.durable_len]);
                    self.durable_len += 1;
                }
                self.cur.clone()
            }
            // cur = durable image + surviving writes durable..at.
            CrashMode::DropRandomUnflushed(seed) => {
                let d = durable_prefix(&self.flushes, at);
                if d > self.durable_len {
                    while self.durable_len < d {
                        apply(&mut self.durable, &self.writes[self.durable_len]);
                        self.durable_len += 1;
                    }
                    // A new flush: dropped writes before it are now on disk after all.
                    self.cur.copy_from_slice(&self.durable);
                    self.applied = d;
                }
                while self.applied < at {
                    if survives(seed, self.applied) {
                        apply(&mut self.cur, &self.writes[self.applied]);
                    }
                    self.applied += 1;
                }
                self.cur.clone()
            }
        };
        Some((at, img))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.writes.len() + 1).saturating_sub(self.next_at);
        (left, Some(left))
    }
}

impl ExactSizeIterator for CrashImages {}

impl fmt::Debug for CrashImages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrashImages")
            .field("mode", &self.mode)
            .field("next_at", &self.next_at)
            .field("events", &self.writes.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// `n` blocks where block i is filled with byte `seed + i`.
    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).flat_map(|i| [seed.wrapping_add(i as u8); BLOCK_SIZE]).collect()
    }

    fn blk(img: &[u8], b: usize) -> &[u8] {
        &img[b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE]
    }

    /// Multi-block round trip, exact counters, and the request checks, on any device
    /// of at least 8 blocks.
    fn exercise(dev: &dyn BlockDevice) {
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

    #[test]
    fn file_device_round_trip_on_tempfile() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        let dev = FileDevice::create(&path, 16 * BS).unwrap();
        assert_eq!(dev.block_count(), 16);
        assert!(!dev.is_read_only());
        assert_eq!(dev.path(), path.as_path());
        exercise(&dev);
        drop(dev);

        // The bytes are really in the file, at the right offsets.
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(raw.len(), 16 * BLOCK_SIZE);
        assert_eq!(&raw[2 * BLOCK_SIZE..5 * BLOCK_SIZE], &pattern(3, 10)[..]);
        assert_eq!(blk(&raw, 15), &[99u8; BLOCK_SIZE][..]);
        assert!(blk(&raw, 1).iter().all(|&b| b == 0));

        let dev = FileDevice::open(&path, false).unwrap();
        let mut buf = vec![0u8; BLOCK_SIZE];
        dev.read(4, &mut buf).unwrap();
        assert_eq!(buf, vec![12u8; BLOCK_SIZE]);
    }

    #[test]
    fn file_device_read_only_refuses_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        std::fs::write(&path, pattern(4, 50)).unwrap();
        let dev = FileDevice::open(&path, true).unwrap();
        assert!(dev.is_read_only());
        assert_eq!(dev.block_count(), 4);
        assert!(matches!(dev.write(0, &[0u8; BLOCK_SIZE]), Err(Error::ReadOnly)));
        let mut buf = vec![0u8; 4 * BLOCK_SIZE];
        dev.read(0, &mut buf).unwrap();
        assert_eq!(buf, pattern(4, 50));
        dev.flush().unwrap();
        assert_eq!(dev.stats(), IoStats { reads: 1, writes: 0, flushes: 1, blocks_read: 4, blocks_written: 0 });
        assert_eq!(std::fs::read(&path).unwrap(), pattern(4, 50));
    }

    #[test]
    fn file_device_create_is_sparse_and_extends_without_truncating() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        let size = 64 * 1024 * 1024;
        let dev = FileDevice::create(&path, size).unwrap();
        assert_eq!(dev.block_count(), size / BS);
        dev.write(1, &pattern(1, 42)).unwrap();
        dev.flush().unwrap();
        drop(dev);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), size);
        assert!(meta.blocks() * 512 < size / 4, "image not sparse: {} bytes allocated", meta.blocks() * 512);

        // Extending keeps the data.
        let dev = FileDevice::create(&path, 2 * size).unwrap();
        assert_eq!(dev.block_count(), 2 * size / BS);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * size);
        let mut buf = vec![0u8; BLOCK_SIZE];
        dev.read(1, &mut buf).unwrap();
        assert_eq!(buf, vec![42u8; BLOCK_SIZE]);
        drop(dev);

        // Asking for less neither truncates nor shrinks.
        let dev = FileDevice::create(&path, BS).unwrap();
        assert_eq!(dev.block_count(), 2 * size / BS);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * size);

        assert!(matches!(FileDevice::create(dir.path().join("odd"), BS + 1), Err(Error::Invalid(_))));
        assert!(matches!(FileDevice::create(dir.path().join("zero"), 0), Err(Error::Invalid(_))));
    }

    #[test]
    fn file_device_open_rounds_down_and_rejects_tiny_or_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        let mut bytes = pattern(3, 1);
        bytes.extend_from_slice(&[9u8; 100]);
        std::fs::write(&path, &bytes).unwrap();
        let dev = FileDevice::open(&path, false).unwrap();
        assert_eq!(dev.block_count(), 3);
        // The partial tail is outside the device.
        assert!(matches!(dev.write(3, &[0u8; BLOCK_SIZE]), Err(Error::Invalid(_))));
        assert_eq!(std::fs::read(&path).unwrap(), bytes);

        let tiny = dir.path().join("tiny");
        std::fs::write(&tiny, [0u8; BLOCK_SIZE - 1]).unwrap();
        let err = FileDevice::open(&tiny, true).unwrap_err();
        assert!(matches!(err, Error::Invalid(ref m) if m.contains("smaller than one")));

        let missing = dir.path().join("missing");
        let err = FileDevice::open(&missing, true).unwrap_err();
        assert!(
            matches!(err, Error::Io(ref e) if e.kind() == io::ErrorKind::NotFound
                && e.to_string().contains("missing")),
            "{err}"
        );
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

    #[test]
    fn fault_device_round_trip_and_per_block_events() {
        let dev = FaultDevice::new(vec![0; 8 * BLOCK_SIZE]);
        assert_eq!(dev.events(), 0);
        exercise(&dev);
        // exercise: one 3-block write and one 1-block write, then a flush.
        assert_eq!(dev.events(), 4);
        assert_eq!(dev.flush_points(), vec![4]);
        assert_eq!(dev.stats().writes, 2);
        assert_eq!(dev.to_bytes(), dev.crash_image(4, CrashMode::All));
        // Crash point 1: only the first block of the 3-block write.
        let img = dev.crash_image(1, CrashMode::All);
        assert_eq!(blk(&img, 2), &[10u8; BLOCK_SIZE][..]);
        assert!(img[3 * BLOCK_SIZE..].iter().all(|&b| b == 0));
    }

    #[test]
    fn fault_cut_after_stops_writes_and_flushes() {
        let dev = FaultDevice::new(vec![0; 8 * BLOCK_SIZE]);
        dev.set_cut_after(Some(2));
        dev.write(0, &pattern(1, 1)).unwrap();
        // Crosses the cut: block 1 is recorded, blocks 2 and 3 are not.
        let err = dev.write(1, &pattern(3, 5)).unwrap_err();
        assert!(matches!(err, Error::Io(ref e) if e.to_string() == "injected crash"));
        assert_eq!(dev.events(), 2);
        let err = dev.flush().unwrap_err();
        assert!(matches!(err, Error::Io(ref e) if e.to_string() == "injected crash"));
        assert!(dev.write(7, &pattern(1, 9)).is_err());
        assert_eq!(dev.events(), 2);
        assert!(dev.flush_points().is_empty());
        // Reads still work and see exactly what was recorded.
        let mut buf = vec![0u8; 4 * BLOCK_SIZE];
        dev.read(0, &mut buf).unwrap();
        let mut want = pattern(2, 0);
        want[..BLOCK_SIZE].fill(1);
        want[BLOCK_SIZE..].fill(5);
        want.extend_from_slice(&[0u8; 2 * BLOCK_SIZE]);
        assert_eq!(buf, want);
        assert_eq!(dev.stats().writes, 1, "failed requests are not counted");
        assert_eq!(dev.stats().flushes, 0);

        // Lifting the cut lets I/O resume.
        dev.set_cut_after(None);
        dev.write(7, &pattern(1, 9)).unwrap();
        dev.flush().unwrap();
        assert_eq!(dev.events(), 3);
        assert_eq!(dev.flush_points(), vec![3]);

        // A cut at or below the current count stops everything at once.
        dev.set_cut_after(Some(0));
        assert!(dev.write(0, &pattern(1, 1)).is_err());
        assert!(dev.flush().is_err());
        assert_eq!(dev.events(), 3);
    }

    const A: u8 = 0xA1;
    const B: u8 = 0xB2;
    const C: u8 = 0xC3;
    const D: u8 = 0xD4;
    const E: u8 = 0xEE;

    /// write A@1, write B@2, flush, write C@1, write D@3 on a 4-block image of 0xEE.
    fn traced() -> FaultDevice {
        let dev = FaultDevice::new(vec![E; 4 * BLOCK_SIZE]);
        dev.write(1, &[A; BLOCK_SIZE]).unwrap();
        dev.write(2, &[B; BLOCK_SIZE]).unwrap();
        dev.flush().unwrap();
        dev.write(1, &[C; BLOCK_SIZE]).unwrap();
        dev.write(3, &[D; BLOCK_SIZE]).unwrap();
        assert_eq!(dev.events(), 4);
        assert_eq!(dev.flush_points(), vec![2]);
        dev
    }

    /// An image from per-block contents: each block is `(bytes 0..2048, bytes 2048..4096)`
    /// (literal sizes, independent of the code under test).
    fn image(blocks: [(u8, u8); 4]) -> Vec<u8> {
        let mut img = Vec::new();
        for (lo, hi) in blocks {
            img.extend_from_slice(&[lo; 2048]);
            img.extend_from_slice(&[hi; 4096 - 2048]);
        }
        img
    }

    fn full(b: u8) -> (u8, u8) {
        (b, b)
    }

    fn check_all_points(dev: &FaultDevice, mode: CrashMode, want: &[Vec<u8>]) {
        assert_eq!(want.len(), dev.events() + 1);
        for (at, w) in want.iter().enumerate() {
            assert!(dev.crash_image(at, mode) == *w, "{mode:?} crash_image at {at} differs");
        }
        let got: Vec<(usize, Vec<u8>)> = dev.crash_images(mode).collect();
        assert_eq!(got.len(), want.len());
        for ((at, img), (i, w)) in got.iter().zip(want.iter().enumerate()) {
            assert_eq!(*at, i);
            assert!(img == w, "{mode:?} crash_images at {at} differs");
        }
    }

    #[test]
    fn fault_crash_mode_all_hand_traced() {
        let e = full(E);
        check_all_points(
            &traced(),
            CrashMode::All,
            &[
                image([e, e, e, e]),
                image([e, full(A), e, e]),
                image([e, full(A), full(B), e]),
                image([e, full(C), full(B), e]),
                image([e, full(C), full(B), full(D)]),
            ],
        );
    }

    #[test]
    fn fault_crash_mode_drop_unflushed_hand_traced() {
        let e = full(E);
        let flushed = image([e, full(A), full(B), e]);
        check_all_points(
            &traced(),
            CrashMode::DropUnflushed,
            &[image([e, e, e, e]), image([e, e, e, e]), image([e, e, e, e]), flushed.clone(), flushed],
        );
    }

    #[test]
    fn fault_crash_mode_torn_hand_traced() {
        let e = full(E);
        check_all_points(
            &traced(),
            CrashMode::Torn,
            &[
                image([e, e, e, e]),
                image([e, (A, E), e, e]),
                image([e, full(A), (B, E), e]),
                image([e, (C, A), full(B), e]),
                image([e, full(C), full(B), (D, E)]),
            ],
        );
    }

    #[test]
    fn fault_crash_mode_drop_random_hand_traced() {
        let e = full(E);
        let mut seen = std::collections::HashSet::new();
        for seed in 0..64u64 {
            // Before the flush completes, A and B (writes 0, 1) are themselves unflushed.
            let a1 = if survives(seed, 0) { full(A) } else { e };
            let b2 = if survives(seed, 1) { full(B) } else { e };
            let keep_c = survives(seed, 2);
            let keep_d = survives(seed, 3);
            seen.insert((keep_c, keep_d));
            let b1 = if keep_c { full(C) } else { full(A) };
            let b3 = if keep_d { full(D) } else { e };
            check_all_points(
                &traced(),
                CrashMode::DropRandomUnflushed(seed),
                &[
                    image([e, e, e, e]),
                    image([e, a1, e, e]),
                    image([e, a1, b2, e]),
                    image([e, b1, full(B), e]),
                    image([e, b1, full(B), b3]),
                ],
            );
        }
        assert_eq!(seen.len(), 4, "seeds never produced some subset of {{C, D}}");
    }

    #[test]
    fn fault_drop_random_applies_unflushed_writes_in_order() {
        // Two unflushed writes to the same block: when both survive, the later wins.
        let seed = (0..1000u64).find(|&s| survives(s, 0) && survives(s, 1)).unwrap();
        let dev = FaultDevice::new(vec![0; BLOCK_SIZE]);
        dev.write(0, &[1; BLOCK_SIZE]).unwrap();
        dev.write(0, &[2; BLOCK_SIZE]).unwrap();
        let mode = CrashMode::DropRandomUnflushed(seed);
        assert_eq!(dev.crash_image(2, mode), vec![2; BLOCK_SIZE]);
        assert_eq!(dev.crash_images(mode).last().unwrap().1, vec![2; BLOCK_SIZE]);
        // And a seed that drops the later one keeps the earlier.
        let seed = (0..1000u64).find(|&s| survives(s, 0) && !survives(s, 1)).unwrap();
        let mode = CrashMode::DropRandomUnflushed(seed);
        assert_eq!(dev.crash_image(2, mode), vec![1; BLOCK_SIZE]);
        assert_eq!(dev.crash_images(mode).last().unwrap().1, vec![1; BLOCK_SIZE]);
    }

    /// A workload where every block write carries its own index, with flushes now and
    /// then, so an image tells exactly which writes it holds.
    fn stamped_workload(blocks: u64, writes: usize) -> FaultDevice {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let dev = FaultDevice::new(vec![0; blocks as usize * BLOCK_SIZE]);
        let mut i = 0usize;
        while i < writes {
            let n = rng.gen_range(1..=3usize).min(writes - i);
            let start = rng.gen_range(0..=blocks - n as u64);
            let mut buf = vec![0u8; n * BLOCK_SIZE];
            for (k, chunk) in buf.chunks_exact_mut(BLOCK_SIZE).enumerate() {
                // Stamp = index + 1, so a zero block means "never written".
                chunk[..8].copy_from_slice(&((i + k + 1) as u64).to_le_bytes());
            }
            dev.write(start, &buf).unwrap();
            i += n;
            if rng.gen_ratio(1, 10) {
                dev.flush().unwrap();
            }
        }
        assert_eq!(dev.events(), writes);
        dev
    }

    fn stamps(img: &[u8]) -> impl Iterator<Item = u64> + '_ {
        img.chunks_exact(BLOCK_SIZE).map(|b| u64::from_le_bytes(b[..8].try_into().unwrap()))
    }

    #[test]
    fn fault_drop_unflushed_never_contains_unflushed_write() {
        let dev = stamped_workload(32, 400);
        let flushes = dev.flush_points();
        assert!(flushes.len() > 5);
        for (at, img) in dev.crash_images(CrashMode::DropUnflushed) {
            let d = flushes.iter().copied().filter(|&f| f < at).max().unwrap_or(0);
            for s in stamps(&img) {
                assert!(s as usize <= d, "crash at {at}: write {} after last flush ({d}) survived", s - 1);
            }
            assert_eq!(img, dev.crash_image(d, CrashMode::All));
        }
    }

    #[test]
    fn fault_crash_images_iterator_matches_crash_image() {
        let dev = stamped_workload(24, 300);
        for mode in [
            CrashMode::All,
            CrashMode::DropUnflushed,
            CrashMode::Torn,
            CrashMode::DropRandomUnflushed(1),
            CrashMode::DropRandomUnflushed(0xDEAD_BEEF),
        ] {
            let iter = dev.crash_images(mode);
            assert_eq!(iter.len(), 301);
            let mut n = 0;
            for (at, img) in iter {
                assert_eq!(at, n);
                assert!(img == dev.crash_image(at, mode), "{mode:?} at {at}");
                n += 1;
            }
            assert_eq!(n, 301);
        }
        // Random mode never loses a flushed write and is deterministic per seed.
        let flushes = dev.flush_points();
        for at in [0, 50, 150, 300] {
            let d = flushes.iter().copied().filter(|&f| f < at).max().unwrap_or(0);
            let durable = dev.crash_image(at, CrashMode::DropUnflushed);
            let rnd = dev.crash_image(at, CrashMode::DropRandomUnflushed(9));
            assert_eq!(rnd, dev.crash_image(at, CrashMode::DropRandomUnflushed(9)));
            for (b, (s_rnd, s_dur)) in stamps(&rnd).zip(stamps(&durable)).enumerate() {
                assert!(s_rnd as usize <= at, "block {b}: write from the future");
                // Either the durable content or a later (unflushed) write to that block.
                assert!(s_rnd == s_dur || s_rnd as usize > d, "block {b} at {at}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "crash point 5 beyond the 4 recorded writes")]
    fn fault_crash_image_past_the_end_panics() {
        traced().crash_image(5, CrashMode::All);
    }

    /// Not run by default: `cargo test --release -- --ignored --nocapture` prints timings.
    #[test]
    #[ignore]
    fn fault_crash_images_3000_writes_timing() {
        let dev = stamped_workload(512, 3000);
        let t = std::time::Instant::now();
        let n = dev.crash_images(CrashMode::All).count();
        eprintln!("crash_images(All): {n} images in {:?}", t.elapsed());
        let t = std::time::Instant::now();
        for at in 0..=dev.events() {
            std::hint::black_box(dev.crash_image(at, CrashMode::DropRandomUnflushed(3)));
        }
        eprintln!("crash_image loop (random): {:?}", t.elapsed());
    }
}
