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

use nix::fcntl::{Flock, FlockArg};
use parking_lot::RwLock;

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
    /// `O_DIRECT`). A buffer aligned to [`BLOCK_SIZE`] in memory (see [`AlignedBuf`])
    /// spares a copy.
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
}

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
pub struct BufferPool {
    kept: parking_lot::Mutex<Vec<AlignedBuf>>,
    max: usize,
}

impl BufferPool {
    pub const fn new(max: usize) -> BufferPool {
        BufferPool { kept: parking_lot::const_mutex(Vec::new()), max }
    }

    /// A buffer of `len` bytes: a kept one that can hold them (its bytes are whatever it
    /// last held), else a new zeroed one.
    pub fn take(&self, len: usize) -> AlignedBuf {
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
    pub fn give(&self, buf: AlignedBuf) {
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
fn is_aligned(buf: &[u8]) -> bool {
    buf.as_ptr().align_offset(BLOCK_SIZE) == 0
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

/// An I/O error that names the path it happened on.
fn path_error(path: &Path, e: io::Error) -> Error {
    Error::Io(io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Pad an image with zeros up to a whole number of blocks.
pub(super) fn pad_to_blocks(mut bytes: Vec<u8>) -> Vec<u8> {
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
    /// The same file opened `O_DIRECT`, for file data (`read_data`, `write_data`): data
    /// then goes straight between the device and dxfs's buffers instead of through the
    /// host's page cache, which for a loop device or an image file is a second cache and
    /// a third of the speed. None where the file system of an image refuses `O_DIRECT`
    /// (or `DXFS_DIRECT_IO=0`). The kernel keeps the two descriptors coherent: a direct
    /// write drops cached pages of its range, a direct read writes dirty ones back first.
    direct: Option<File>,
    path: PathBuf,
    blocks: u64,
    read_only: bool,
    counters: Counters,
    /// A read-write device holds an exclusive lock on the image or device (on a second
    /// descriptor of the same open file) for as long as it is open: one writer per volume.
    _lock: Option<Flock<File>>,
}

impl FileDevice {
    /// Open an existing image file or block device. Its size (found by seeking to the
    /// end, which works for block devices too) is rounded down to whole blocks; less
    /// than one block is an error. A read-only device refuses writes with
    /// [`Error::ReadOnly`].
    pub fn open(path: impl AsRef<Path>, read_only: bool) -> Result<FileDevice> {
        let path = path.as_ref();
        let mut file = OpenOptions::new().read(true).write(!read_only).open(path).map_err(|e| {
            // Readable but not writable by this user: say how to use it anyway.
            if !read_only
                && e.kind() == io::ErrorKind::PermissionDenied
                && OpenOptions::new().read(true).open(path).is_ok()
            {
                return Error::Io(io::Error::new(
                    e.kind(),
                    format!(
                        "{}: {e}: it is not writable by you; open it read-only (mount -o ro, fsck -n)",
                        path.display()
                    ),
                ));
            }
            path_error(path, e)
        })?;
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
        // Locked before it is extended: a file in use (a mounted volume) is left as it is.
        let lock = Self::lock(&file, path)?;
        let mut size = file.seek(SeekFrom::End(0)).map_err(|e| path_error(path, e))?;
        if size < bytes {
            if !is_file {
                return Err(Error::Invalid(format!("{}: device holds {size} bytes, {bytes} wanted", path.display())));
            }
            // set_len extends without writing data, so the file stays sparse.
            file.set_len(bytes).map_err(|e| path_error(path, e))?;
            size = bytes;
        }
        Self::with_lock(file, path, size, false, Some(lock))
    }

    fn with_size(file: File, path: &Path, size: u64, read_only: bool) -> Result<FileDevice> {
        let lock = if read_only { None } else { Some(Self::lock(&file, path)?) };
        Self::with_lock(file, path, size, read_only, lock)
    }

    fn with_lock(file: File, path: &Path, size: u64, read_only: bool, lock: Option<Flock<File>>) -> Result<FileDevice> {
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
        let direct = Self::open_direct(path, read_only);
        Ok(FileDevice {
            file,
            direct,
            path: path.to_path_buf(),
            blocks,
            read_only,
            counters: Counters::default(),
            _lock: lock,
        })
    }

    /// The `O_DIRECT` descriptor for file data, where the file allows one.
    fn open_direct(path: &Path, read_only: bool) -> Option<File> {
        use std::os::unix::fs::OpenOptionsExt;
        if std::env::var_os("DXFS_DIRECT_IO").is_some_and(|v| v == "0") {
            return None;
        }
        OpenOptions::new().read(true).write(!read_only).custom_flags(libc::O_DIRECT).open(path).ok()
    }

    /// Whether file data bypasses the host's page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Take the exclusive lock of a read-write open, or say who is in the way. The lock
    /// is advisory (flock): it keeps dxfs from opening one volume twice for writing (two
    /// mounts, a mount and mkfs or a repairing fsck), which would silently lose one
    /// side's deltas.
    fn lock(file: &File, path: &Path) -> Result<Flock<File>> {
        let dup = file.try_clone().map_err(|e| path_error(path, e))?;
        match Flock::lock(dup, FlockArg::LockExclusiveNonblock) {
            Ok(l) => Ok(l),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(Error::Busy(format!(
                "{} is in use by another process (mounted, or open read-write elsewhere)",
                path.display()
            ))),
            Err((_, e)) => Err(path_error(path, e.into())),
        }
    }

    /// Whether another process holds `path` open read-write through dxfs (a mount, mkfs or
    /// a repairing fsck): what a read-only look such as `fsck -n` should warn about.
    pub fn in_use(path: impl AsRef<Path>) -> bool {
        let Ok(file) = File::open(path.as_ref()) else { return false };
        matches!(Flock::lock(file, FlockArg::LockSharedNonblock), Err((_, nix::errno::Errno::EWOULDBLOCK)))
    }

    /// A failed write, said plainly when the file system holding a sparse image is full
    /// (the volume cannot go on: the delta being written is lost, the last committed one
    /// is intact).
    fn write_error(&self, e: io::Error) -> Error {
        if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
            return Error::Io(io::Error::new(
                e.kind(),
                format!(
                    "{}: the file system holding the image is full ({e}); free space there, then remount",
                    self.path.display()
                ),
            ));
        }
        path_error(&self.path, e)
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
        self.file.write_all_at(buf, block * BS).map_err(|e| self.write_error(e))?;
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

    fn read_data(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        let Some(direct) = &self.direct else { return self.read(block, buf) };
        let n = check_request("read", block, buf.len(), self.blocks)?;
        let r = if is_aligned(buf) {
            direct.read_exact_at(buf, block * BS)
        } else {
            let mut b = AlignedBuf::new(buf.len());
            direct.read_exact_at(&mut b, block * BS).map(|()| buf.copy_from_slice(&b))
        };
        match r {
            Ok(()) => {
                self.counters.read(n);
                Ok(())
            }
            // A file system that accepted the open but not this request: the cache path.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.read(block, buf),
            Err(e) => Err(e.into()),
        }
    }

    fn write_data(&self, block: u64, buf: &[u8]) -> Result<()> {
        // Small writes (the scattered pages of random overwrites) go through the host's
        // cache, which turns a commit's many of them into one batch at its flush; a
        // direct write each would be a synchronous device request each.
        let Some(direct) = self.direct.as_ref().filter(|_| buf.len() >= DIRECT_WRITE_MIN) else {
            return self.write(block, buf);
        };
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let n = check_request("write", block, buf.len(), self.blocks)?;
        let r = if is_aligned(buf) {
            direct.write_all_at(buf, block * BS)
        } else {
            let mut b = AlignedBuf::new(buf.len());
            b.copy_from_slice(buf);
            direct.write_all_at(&b, block * BS)
        };
        match r {
            Ok(()) => {
                self.counters.write(n);
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.write(block, buf),
            Err(e) => Err(self.write_error(e)),
        }
    }

    /// Drops the range from this host's page cache first (`POSIX_FADV_DONTNEED`), so a
    /// block device shared with another host is read from the device itself.
    fn read_fresh(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        let _ = nix::fcntl::posix_fadvise(
            &self.file,
            (block * BS) as i64,
            buf.len() as i64,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        );
        self.read(block, buf)
    }

    /// Punches a hole (`fallocate(PUNCH_HOLE | KEEP_SIZE)`): an image file gives the
    /// blocks back to its filesystem; on a block device the kernel zeroes the range with
    /// unmap (a discard on devices that guarantee zeros after one, e.g. loop and thin
    /// devices). A file system or device that cannot punch makes this a no-op.
    fn trim(&self, block: u64, count: u64) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        check_trim(block, count, self.blocks)?;
        if count == 0 {
            return Ok(());
        }
        let mode = nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
        match nix::fcntl::fallocate(&self.file, mode, (block * BS) as i64, (count * BS) as i64) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::EOPNOTSUPP | nix::errno::Errno::ENOTTY | nix::errno::Errno::ENODEV) => Ok(()),
            Err(e) => Err(path_error(&self.path, io::Error::from(e))),
        }
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::disk::fault::FaultDevice;
    use std::os::unix::fs::MetadataExt;

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

    /// `n` blocks where block i is filled with byte `seed + i`.
    pub(crate) fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).flat_map(|i| [seed.wrapping_add(i as u8); BLOCK_SIZE]).collect()
    }

    /// File data through the O_DIRECT descriptor and metadata through the cached one see
    /// each other's writes, aligned buffers or not, and both are counted.
    #[test]
    fn direct_data_and_cached_metadata_agree() {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::create(dir.path().join("img"), 64 * BS).unwrap();
        let a = pattern(4, 1);
        dev.write(8, &a).unwrap();
        // Cached write, direct read (the kernel writes the cached pages back first).
        let mut got = AlignedBuf::new(a.len());
        dev.read_data(8, &mut got).unwrap();
        assert_eq!(&got[..], &a[..]);
        // Direct write from an unaligned buffer, cached read (its cached pages dropped).
        let b = pattern(DIRECT_WRITE_MIN / BLOCK_SIZE, 50);
        let mut unaligned = vec![0u8; b.len() + 1];
        unaligned[1..].copy_from_slice(&b);
        dev.write_data(9, &unaligned[1..]).unwrap();
        let mut back = vec![0u8; BLOCK_SIZE + b.len()];
        dev.read(8, &mut back).unwrap();
        assert_eq!(blk(&back, 0), blk(&a, 0));
        assert_eq!(&back[BLOCK_SIZE..], &b[..]);
        // Direct read into an unaligned buffer.
        let mut odd = vec![0u8; b.len() + 1];
        dev.read_data(9, &mut odd[1..]).unwrap();
        assert_eq!(&odd[1..], &b[..]);
        // Requests are checked as the cached ones are.
        assert!(matches!(dev.read_data(63, &mut vec![0u8; 2 * BLOCK_SIZE]), Err(Error::Invalid(_))));
        assert!(matches!(dev.write_data(0, &[0u8; 100]), Err(Error::Invalid(_))));
        let s = dev.stats();
        assert_eq!((s.reads, s.writes, s.blocks_read, s.blocks_written), (3, 2, 4 + 17 + 16, 4 + 16));
        assert!(AlignedBuf::new(3 * BLOCK_SIZE).as_ptr().align_offset(BLOCK_SIZE) == 0);
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
}
