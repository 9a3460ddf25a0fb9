//! [`FileDevice`]: a volume in an image file or on a block device, metadata through the
//! host's cache and file data past it (`O_DIRECT`).

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use nix::fcntl::{Flock, FlockArg};
use parking_lot::Mutex;

use super::aligned::is_aligned;
use super::{check_request, check_trim, AlignedBuf, BlockDevice, Counters, IoStats, BS, DIRECT_WRITE_MIN};
use crate::disk::codec::BLOCK_SIZE;
use crate::error::{Error, Result};

/// An I/O error that names the path it happened on.
fn path_error(path: &Path, e: io::Error) -> Error {
    Error::Io(io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

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
    /// descriptor of the same open file) until it is dropped or released: one writer per
    /// volume.
    lock: Mutex<Option<Flock<File>>>,
    /// Released (`BlockDevice::release`): the lock is gone, so writes are refused.
    released: AtomicBool,
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
            lock: Mutex::new(lock),
            released: AtomicBool::new(false),
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
    /// (a volume holds such writes until there is room: `HeldWrites`).
    fn write_error(&self, e: io::Error) -> Error {
        if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
            return Error::Io(io::Error::new(
                e.kind(),
                format!("{}: the file system holding the image is full ({e})", self.path.display()),
            ));
        }
        path_error(&self.path, e)
    }

    /// Writes are refused on a read-only open, and once released: another process may
    /// hold the lock by then.
    fn check_writable(&self) -> Result<()> {
        if self.read_only || self.released.load(Ordering::Acquire) {
            return Err(Error::ReadOnly);
        }
        Ok(())
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
        self.check_writable()?;
        let n = check_request("write", block, buf.len(), self.blocks)?;
        self.file.write_all_at(buf, block * BS).map_err(|e| self.write_error(e))?;
        self.counters.write(n);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        // A read-only descriptor has no writes of ours to make durable.
        if self.check_writable().is_ok() {
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
        self.check_writable()?;
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
        self.check_writable()?;
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

    /// Writes what this open wrote durable, then drops the lock: the next opener reads
    /// all of it.
    fn release(&self) {
        if self.check_writable().is_err() {
            return;
        }
        if let Err(e) = self.file.sync_data() {
            tracing::warn!("{}: flush before release: {e}", self.path.display());
        }
        self.released.store(true, Ordering::Release);
        drop(self.lock.lock().take());
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{blk, exercise, pattern};
    use super::*;
    use std::os::unix::fs::MetadataExt;

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

    /// A released device lets the next writer in while it is still open, and writes
    /// nothing more itself.
    #[test]
    fn a_released_device_is_free_for_the_next_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img");
        let dev = FileDevice::create(&path, 4 * BS).unwrap();
        dev.write(1, &pattern(1, 7)).unwrap();
        assert!(matches!(FileDevice::open(&path, false), Err(Error::Busy(_))));
        dev.release();
        let next = FileDevice::open(&path, false).unwrap();
        assert!(matches!(dev.write(2, &[1u8; BLOCK_SIZE]), Err(Error::ReadOnly)));
        assert!(matches!(dev.write_data(2, &[1u8; BLOCK_SIZE]), Err(Error::ReadOnly)));
        assert!(matches!(dev.trim(2, 1), Err(Error::ReadOnly)));
        dev.flush().unwrap();
        let mut buf = vec![0u8; BLOCK_SIZE];
        next.read(1, &mut buf).unwrap();
        assert_eq!(buf, pattern(1, 7));
        drop(dev);
        next.write(3, &pattern(1, 8)).unwrap();
        assert!(
            matches!(FileDevice::open(&path, false), Err(Error::Busy(_))),
            "dropping the released open unlocked the next"
        );
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
}
