//! The control path from the `dxfs` command to the daemon serving a mount: ioctls on a
//! directory the caller has opened. The kernel resolved the path and checked that the
//! caller may open it, and each request carries the caller's uid, gid and pid; the
//! daemon never opens a host path for anyone. Both ends are here: the message layouts,
//! the daemon's decoding and the client's call. The one unsafe line is the ioctl.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::volume::NewEntry;

/// Bytes an ioctl carries each way: the size encoded in the command, which is all a
/// FUSE server may use (restricted ioctls).
pub const CONTROL_SIZE: usize = 12 * 1024;
/// The ioctl type byte of dxfs's commands.
const IOC_TYPE: u8 = 0xDF;
/// Empty a directory one step: remove its entries that are not directories, as the
/// caller, and name its subdirectories. `_IOWR(0xDF, 1, [u8; CONTROL_SIZE])`.
pub const IOC_EMPTY_STEP: u32 = ioc_readwrite(IOC_TYPE, 1, CONTROL_SIZE);
/// Sum a directory one step: its files' sizes, those with several links by inode, and
/// its subdirectories' names. `_IOWR(0xDF, 2, [u8; CONTROL_SIZE])`.
pub const IOC_SUM_STEP: u32 = ioc_readwrite(IOC_TYPE, 2, CONTROL_SIZE);
/// Bytes an import batch carries in (and its reply out): the largest size a command can
/// encode (14 bits), so that a file of up to ~16 KiB travels with its batch.
pub const IMPORT_SIZE: usize = (1 << 14) - 1;
/// Make a batch of entries in a directory, each whole, as the caller
/// (`Volume::import_entry`). `_IOWR(0xDF, 3, [u8; IMPORT_SIZE])`.
pub const IOC_IMPORT: u32 = ioc_readwrite(IOC_TYPE, 3, IMPORT_SIZE);
/// The reply's fixed part: next (8), flags (4), removed, subdirs, failed (4 each).
const REPLY_HEAD: usize = 24;
/// The request's layout version (its first u32).
const VERSION: u32 = 1;

const fn ioc_readwrite(ty: u8, nr: u8, size: usize) -> u32 {
    // Linux's generic encoding: direction (read | write = 3) << 30, size << 16, type, nr.
    (3 << 30) | ((size as u32) << 16) | ((ty as u32) << 8) | nr as u32
}

/// Ask for one step of a job on a directory (emptying it, summing it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRequest {
    /// The listing position to start from (0, then the previous reply's `next`).
    pub from: u64,
    /// Most entries to look at in this step.
    pub max: u32,
}

impl StepRequest {
    pub fn encode(&self, buf: &mut [u8]) {
        buf[..4].copy_from_slice(&VERSION.to_le_bytes());
        buf[4..8].copy_from_slice(&0u32.to_le_bytes());
        buf[8..16].copy_from_slice(&self.from.to_le_bytes());
        buf[16..20].copy_from_slice(&self.max.to_le_bytes());
    }

    /// `None` for a request of another layout or too short.
    pub fn decode(buf: &[u8]) -> Option<StepRequest> {
        if buf.len() < 20 || u32_at(buf, 0) != VERSION {
            return None;
        }
        Some(StepRequest { from: u64::from_le_bytes(buf[8..16].try_into().ok()?), max: u32_at(buf, 16) })
    }
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EmptyReply {
    /// Where the next step starts.
    pub next: u64,
    /// The listing reached the end of the directory.
    pub done: bool,
    /// Entries removed in this step.
    pub removed: u32,
    /// Subdirectories met (left for the caller to empty and remove).
    pub subdirs: Vec<Vec<u8>>,
    /// Entries that stayed, with the errno unlink(2) would have given.
    pub failed: Vec<(i32, Vec<u8>)>,
}

impl EmptyReply {
    /// Bytes a reported name takes in a reply (the most, a failure's).
    pub fn cost(name: &[u8]) -> usize {
        6 + name.len()
    }

    /// Bytes the names of a reply may take in all.
    pub const ROOM: usize = CONTROL_SIZE - REPLY_HEAD;

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(CONTROL_SIZE);
        b.extend_from_slice(&self.next.to_le_bytes());
        b.extend_from_slice(&u32::from(self.done).to_le_bytes());
        b.extend_from_slice(&self.removed.to_le_bytes());
        b.extend_from_slice(&(self.subdirs.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.failed.len() as u32).to_le_bytes());
        for n in &self.subdirs {
            b.extend_from_slice(&(n.len() as u16).to_le_bytes());
            b.extend_from_slice(n);
        }
        for (errno, n) in &self.failed {
            b.extend_from_slice(&errno.to_le_bytes());
            b.extend_from_slice(&(n.len() as u16).to_le_bytes());
            b.extend_from_slice(n);
        }
        b
    }

    /// `None` for a reply that does not parse (a daemon of another version).
    pub fn decode(b: &[u8]) -> Option<EmptyReply> {
        let mut r = Reader { b, at: 0 };
        let next = r.u64()?;
        let done = r.u32()? != 0;
        let removed = r.u32()?;
        let (nsub, nfail) = (r.u32()?, r.u32()?);
        let mut out = EmptyReply { next, done, removed, ..EmptyReply::default() };
        for _ in 0..nsub {
            out.subdirs.push(r.name()?);
        }
        for _ in 0..nfail {
            let errno = r.u32()? as i32;
            out.failed.push((errno, r.name()?));
        }
        Some(out)
    }
}

/// What one step of summing found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SumReply {
    /// Where the next step starts.
    pub next: u64,
    /// The listing reached the end of the directory.
    pub done: bool,
    /// Entries that are not directories and have one link: how many, their st_blocks
    /// and st_size summed.
    pub files: u64,
    pub blocks: u64,
    pub bytes: u64,
    /// Entries with several links: inode, st_blocks, st_size (counted once by the
    /// caller), and how many of this reply's `subdirs` came before it in the listing.
    pub linked: Vec<(u64, u64, u64, u32)>,
    /// Subdirectories met.
    pub subdirs: Vec<Vec<u8>>,
    /// Entries whose inode could not be read.
    pub unreadable: Vec<Vec<u8>>,
}

impl SumReply {
    /// Bytes the names and records of a reply may take in all.
    pub const ROOM: usize = CONTROL_SIZE - 48;

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(CONTROL_SIZE);
        for v in [self.next, u64::from(self.done), self.files, self.blocks, self.bytes] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for n in [self.linked.len(), self.subdirs.len(), self.unreadable.len()] {
            b.extend_from_slice(&(n as u16).to_le_bytes());
        }
        b.extend_from_slice(&[0; 2]);
        for (i, k, s, at) in &self.linked {
            for v in [i, k, s] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(&at.to_le_bytes());
        }
        for n in self.subdirs.iter().chain(&self.unreadable) {
            b.extend_from_slice(&(n.len() as u16).to_le_bytes());
            b.extend_from_slice(n);
        }
        b
    }

    /// `None` for a reply that does not parse.
    pub fn decode(b: &[u8]) -> Option<SumReply> {
        let mut r = Reader { b, at: 0 };
        let (next, done, files, blocks, bytes) = (r.u64()?, r.u64()? != 0, r.u64()?, r.u64()?, r.u64()?);
        let mut out = SumReply { next, done, files, blocks, bytes, ..SumReply::default() };
        let (nl, ns, nu) = (r.u16()?, r.u16()?, r.u16()?);
        r.take(2)?;
        for _ in 0..nl {
            out.linked.push((r.u64()?, r.u64()?, r.u64()?, r.u32()?));
        }
        for _ in 0..ns {
            out.subdirs.push(r.name()?);
        }
        for _ in 0..nu {
            out.unreadable.push(r.name()?);
        }
        Some(out)
    }
}

/// A batch of entries to make in one directory ([`IOC_IMPORT`]): version (4), count (4),
/// then per entry a fixed head ([`ImportBatch::HEAD`] bytes: mode, uid, gid, atime and
/// mtime as seconds and nanoseconds, rdev, data length, name length, xattr count), the
/// name, the data, and each xattr as name length (2), value length (4), name, value.
#[derive(Debug, Clone)]
pub struct ImportBatch {
    buf: Vec<u8>,
    count: u32,
}

impl Default for ImportBatch {
    fn default() -> Self {
        let mut buf = Vec::with_capacity(IMPORT_SIZE);
        buf.extend_from_slice(&VERSION.to_le_bytes());
        buf.extend_from_slice(&0u32.to_le_bytes());
        ImportBatch { buf, count: 0 }
    }
}

impl ImportBatch {
    /// Bytes of an entry's fixed head.
    pub const HEAD: usize = 4 * 3 + 12 * 2 + 8 + 4 + 2 + 2;

    /// Bytes entry `e` takes in a batch.
    pub fn cost(e: &NewEntry<'_>) -> usize {
        Self::HEAD + e.name.len() + e.data.len() + e.xattrs.iter().map(|(n, v)| 6 + n.len() + v.len()).sum::<usize>()
    }

    /// Whether an entry of `cost` bytes can ever travel in a batch.
    pub fn fits_alone(cost: usize) -> bool {
        8 + cost <= IMPORT_SIZE
    }

    pub fn len(&self) -> u32 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Add `e` if it fits (false, and nothing added, if not).
    pub fn push(&mut self, e: &NewEntry<'_>) -> bool {
        if self.buf.len() + Self::cost(e) > IMPORT_SIZE
            || e.name.len() > u16::MAX as usize
            || e.xattrs.len() > u16::MAX as usize
        {
            return false;
        }
        let b = &mut self.buf;
        for v in [e.mode, e.uid, e.gid] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for (s, ns) in [e.atime, e.mtime] {
            b.extend_from_slice(&s.to_le_bytes());
            b.extend_from_slice(&ns.to_le_bytes());
        }
        b.extend_from_slice(&e.rdev.to_le_bytes());
        b.extend_from_slice(&(e.data.len() as u32).to_le_bytes());
        b.extend_from_slice(&(e.name.len() as u16).to_le_bytes());
        b.extend_from_slice(&(e.xattrs.len() as u16).to_le_bytes());
        b.extend_from_slice(e.name);
        b.extend_from_slice(e.data);
        for (n, v) in e.xattrs {
            b.extend_from_slice(&(n.len() as u16).to_le_bytes());
            b.extend_from_slice(&(v.len() as u32).to_le_bytes());
            b.extend_from_slice(n);
            b.extend_from_slice(v);
        }
        self.count += 1;
        self.buf[4..8].copy_from_slice(&self.count.to_le_bytes());
        true
    }

    /// The entries of a batch (names, data and xattrs borrowed from `b`); `None` for one
    /// that does not parse (another layout, a length past the end).
    pub fn decode(b: &[u8]) -> Option<Vec<DecodedEntry<'_>>> {
        let mut r = Reader { b, at: 0 };
        if r.u32()? != VERSION {
            return None;
        }
        let count = r.u32()?;
        let mut out = Vec::with_capacity((count as usize).min(IMPORT_SIZE / Self::HEAD));
        for _ in 0..count {
            let (mode, uid, gid) = (r.u32()?, r.u32()?, r.u32()?);
            let atime = (r.u64()? as i64, r.u32()?);
            let mtime = (r.u64()? as i64, r.u32()?);
            let rdev = r.u64()?;
            let dlen = r.u32()? as usize;
            let (nlen, nx) = (r.u16()? as usize, r.u16()?);
            let name = r.take(nlen)?;
            let data = r.take(dlen)?;
            let mut xattrs = Vec::with_capacity(usize::from(nx).min(64));
            for _ in 0..nx {
                let (n, v) = (r.u16()? as usize, r.u32()? as usize);
                xattrs.push((r.take(n)?, r.take(v)?));
            }
            out.push(DecodedEntry { name, mode, uid, gid, rdev, atime, mtime, data, xattrs });
        }
        Some(out)
    }

    /// The request's bytes, padded to [`IMPORT_SIZE`].
    fn bytes(&self) -> Vec<u8> {
        let mut b = self.buf.clone();
        b.resize(IMPORT_SIZE, 0);
        b
    }
}

/// An entry of a decoded batch, owning its list of xattrs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedEntry<'a> {
    pub name: &'a [u8],
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub data: &'a [u8],
    pub xattrs: Vec<(&'a [u8], &'a [u8])>,
}

impl DecodedEntry<'_> {
    /// The entry as the volume takes it.
    pub fn entry(&self) -> NewEntry<'_> {
        NewEntry {
            name: self.name,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            atime: self.atime,
            mtime: self.mtime,
            data: self.data,
            xattrs: &self.xattrs,
        }
    }
}

/// An import batch's reply: per entry, in order, 0 (made) or the errno it failed with.
pub fn encode_import_reply(errnos: &[i32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + 4 * errnos.len());
    b.extend_from_slice(&(errnos.len() as u32).to_le_bytes());
    for e in errnos {
        b.extend_from_slice(&e.to_le_bytes());
    }
    b
}

fn decode_import_reply(b: &[u8]) -> Option<Vec<i32>> {
    let mut r = Reader { b, at: 0 };
    let n = r.u32()?;
    (0..n).map(|_| r.u32().map(|e| e as i32)).collect()
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let b: &'a [u8] = self.b;
        let s = b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn name(&mut self) -> Option<Vec<u8>> {
        let n = u16::from_le_bytes(self.take(2)?.try_into().ok()?) as usize;
        Some(self.take(n)?.to_vec())
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

nix::ioctl_readwrite_buf!(ioc_empty_step, IOC_TYPE, 1, u8);
nix::ioctl_readwrite_buf!(ioc_sum_step, IOC_TYPE, 2, u8);
nix::ioctl_readwrite_buf!(ioc_import, IOC_TYPE, 3, u8);

/// Send control command `nr` (1 empty, 2 sum) with `req` on directory `dir`; the reply's
/// bytes. ENOTTY (the raw errno kept) when the directory is not on a dxfs mount.
fn call(dir: BorrowedFd<'_>, nr: u8, req: StepRequest) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; CONTROL_SIZE];
    req.encode(&mut buf);
    // SAFETY: each command's encoded size is `buf.len()` (CONTROL_SIZE), and the kernel
    // reads and writes at most that many bytes through the pointer, into `buf`, which
    // lives for the whole call; `dir` is an open descriptor the caller lends.
    let r = unsafe {
        match nr {
            1 => ioc_empty_step(dir.as_raw_fd(), &mut buf),
            _ => ioc_sum_step(dir.as_raw_fd(), &mut buf),
        }
    };
    r.map_err(io::Error::from)?;
    Ok(buf)
}

/// Make `batch`'s entries in the directory open as `dir`, done by the daemon serving its
/// mount as the caller: per entry, 0 or the errno it failed with. ENOTTY when the
/// directory is not on a dxfs mount.
pub fn import(dir: BorrowedFd<'_>, batch: &ImportBatch) -> io::Result<Vec<i32>> {
    let mut buf = batch.bytes();
    // SAFETY: the command's encoded size is `buf.len()` (IMPORT_SIZE), and the kernel
    // reads and writes at most that many bytes through the pointer, into `buf`, which
    // lives for the whole call; `dir` is an open descriptor the caller lends.
    unsafe { ioc_import(dir.as_raw_fd(), &mut buf) }.map_err(io::Error::from)?;
    match decode_import_reply(&buf) {
        Some(r) if r.len() == batch.len() as usize => Ok(r),
        _ => Err(unparsable()),
    }
}

fn unparsable() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "a control reply that does not parse")
}

/// One step of emptying the directory open as `dir`, done by the daemon serving its
/// mount.
pub fn empty_step(dir: BorrowedFd<'_>, req: StepRequest) -> io::Result<EmptyReply> {
    EmptyReply::decode(&call(dir, 1, req)?).ok_or_else(unparsable)
}

/// One step of summing the directory open as `dir`, done by the daemon serving its
/// mount.
pub fn sum_step(dir: BorrowedFd<'_>, req: StepRequest) -> io::Result<SumReply> {
    SumReply::decode(&call(dir, 2, req)?).ok_or_else(unparsable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_number_is_the_generic_iowr_encoding() {
        // _IOWR(0xDF, 1, 12288) as the kernel's macros compute it.
        assert_eq!(IOC_EMPTY_STEP, 0xC000_0000 | (12288 << 16) | (0xDF << 8) | 1);
        assert_eq!(u64::from(IOC_EMPTY_STEP), nix::request_code_readwrite!(IOC_TYPE, 1, CONTROL_SIZE));
    }

    #[test]
    fn messages_round_trip() {
        let req = StepRequest { from: 0x1234_5678_9abc, max: 4096 };
        let mut buf = vec![0u8; CONTROL_SIZE];
        req.encode(&mut buf);
        assert_eq!(StepRequest::decode(&buf), Some(req));
        buf[0] = 9;
        assert_eq!(StepRequest::decode(&buf), None);
        let rep = EmptyReply {
            next: 77,
            done: true,
            removed: 5,
            subdirs: vec![b"a".to_vec(), vec![b'x'; 255]],
            failed: vec![(13, b"secret".to_vec())],
        };
        let b = rep.encode();
        assert!(b.len() <= CONTROL_SIZE);
        assert_eq!(EmptyReply::decode(&b), Some(rep));
        assert_eq!(EmptyReply::decode(&b[..b.len() - 1]), None);
        let sum = SumReply {
            next: 9,
            done: false,
            files: 3,
            blocks: 24,
            bytes: 12_000,
            linked: vec![(42, 8, 4096, 1)],
            subdirs: vec![b"d".to_vec()],
            unreadable: vec![b"bad".to_vec()],
        };
        let b = sum.encode();
        assert_eq!(SumReply::decode(&b), Some(sum));
        assert_eq!(SumReply::decode(&b[..b.len() - 1]), None);
    }

    #[test]
    fn import_batches_round_trip_and_stop_at_their_size() {
        assert_eq!(u64::from(IOC_IMPORT), nix::request_code_readwrite!(IOC_TYPE, 3, IMPORT_SIZE));
        let xattrs: Vec<(&[u8], &[u8])> = vec![(b"user.a", b"1"), (b"system.posix_acl_access", &[2; 28])];
        let data = vec![7u8; 5000];
        let e = NewEntry {
            name: b"file",
            mode: libc::S_IFREG | 0o640,
            uid: 1000,
            gid: 100,
            rdev: 0,
            atime: (-5, 999_999_999),
            mtime: (1_700_000_000, 1),
            data: &data,
            xattrs: &xattrs,
        };
        let mut b = ImportBatch::default();
        assert!(b.push(&e));
        assert!(b.push(&NewEntry { name: b"l", mode: libc::S_IFLNK | 0o777, data: b"file", ..NewEntry::default() }));
        // Three such files fit in one batch; a fourth would pass IMPORT_SIZE.
        assert!(b.push(&e));
        assert!(b.push(&e));
        assert!(!b.push(&e), "a batch never grows past IMPORT_SIZE");
        assert_eq!(b.len(), 4);
        let bytes = b.bytes();
        assert_eq!(bytes.len(), IMPORT_SIZE);
        let d = ImportBatch::decode(&bytes).expect("decodes");
        assert_eq!(d.len(), 4);
        assert_eq!(d[0].entry(), e);
        assert_eq!(d[1].name, b"l");
        assert_eq!(d[1].data, b"file");
        // A length past the end, or another version, does not decode.
        let mut bad = bytes.clone();
        let at = 8 + ImportBatch::HEAD - 8;
        bad[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(ImportBatch::decode(&bad), None);
        bad = bytes;
        bad[0] = 2;
        assert_eq!(ImportBatch::decode(&bad), None);
        assert!(!ImportBatch::fits_alone(IMPORT_SIZE));
        assert_eq!(decode_import_reply(&encode_import_reply(&[0, 13, 17])), Some(vec![0, 13, 17]));
    }
}
