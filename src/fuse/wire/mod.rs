//! The FUSE kernel ABI, parsed and encoded in safe Rust.
//!
//! The layouts are the kernel's `include/uapi/linux/fuse.h` (protocol 7.x): every struct is
//! read and written field by field at explicit byte offsets, in the host's byte order (the
//! kernel and the daemon share a machine, so the ABI is native-endian; on x86-64 and arm64
//! that is little-endian). Nothing here is `repr(C)`: a struct the kernel grows in a later
//! minor version is read up to the length the request carries, and a short one is a
//! [`WireError`], never a panic.
//!
//! A request is a [`InHeader`] (40 bytes) followed by its arguments. The classic transport
//! reads all of it from `/dev/fuse` in one buffer; FUSE over io_uring hands the same
//! request split in three: the in-header, the opcode's fixed argument (`op_in`) and the
//! rest (names, write data) in the payload buffer. [`Request::parse`] takes the pieces
//! either way: [`split_classic`] cuts a `/dev/fuse` buffer at [`op_in_size`].
//!
//! A reply is an [`OutHeader`] (16 bytes) and the opcode's reply struct; the encoders
//! here append to a `Vec<u8>`.
#![forbid(unsafe_code)]

use std::fmt;

mod request;
pub use request::*;

/// The protocol's major version.
pub const KERNEL_VERSION: u32 = 7;
/// The minor version this code speaks; the connection uses the smaller of this and the
/// kernel's. 42 is the first with FUSE over io_uring.
pub const KERNEL_MINOR_VERSION: u32 = 42;
/// The root directory's node id.
pub const ROOT_ID: u64 = 1;
/// The smallest read buffer the kernel accepts for `/dev/fuse` (`FUSE_MIN_READ_BUFFER`).
pub const MIN_READ_BUFFER: usize = 8192;

/// Opcodes (`enum fuse_opcode`).
pub mod opcode {
    #![allow(missing_docs)]
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
    pub const STATX: u32 = 52;
}

/// INIT flags, as one 64-bit set: bits 32..63 travel in `flags2` when both sides set
/// [`init::INIT_EXT`].
pub mod init {
    #![allow(missing_docs)]
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    /// `flags2` is valid (in both directions).
    pub const INIT_EXT: u64 = 1 << 30;
    pub const SECURITY_CTX: u64 = 1 << 32;
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    /// The daemon will serve requests through io_uring queues (7.42).
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_getattr_in.getattr_flags`: `fh` is valid.
pub const GETATTR_FH: u32 = 1 << 0;
/// `fuse_release_in.release_flags`: flush before release.
pub const RELEASE_FLUSH: u32 = 1 << 0;

/// A request or reply too short for what it must hold, or otherwise malformed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// `what` needs `need` bytes; only `have` came.
    Short {
        /// The struct or field.
        what: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// A name without its terminating NUL.
    NoNul(&'static str),
    /// The in-header's length disagrees with the bytes read.
    BadLength {
        /// `fuse_in_header.len`.
        header: u32,
        /// Bytes actually read.
        read: usize,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Short { what, need, have } => write!(f, "{what}: need {need} bytes, have {have}"),
            WireError::NoNul(what) => write!(f, "{what}: name not NUL-terminated"),
            WireError::BadLength { header, read } => write!(f, "in-header says {header} bytes, read {read}"),
        }
    }
}

impl std::error::Error for WireError {}

/// Result of parsing.
pub type Result<T> = std::result::Result<T, WireError>;

fn need(what: &'static str, b: &[u8], n: usize) -> Result<()> {
    if b.len() < n {
        Err(WireError::Short { what, need: n, have: b.len() })
    } else {
        Ok(())
    }
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_ne_bytes([b[off], b[off + 1]])
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_ne_bytes());
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_ne_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_ne_bytes());
}

/// A NUL-terminated name: the bytes before the first NUL.
fn cstr<'a>(what: &'static str, b: &'a [u8]) -> Result<&'a [u8]> {
    match b.iter().position(|&c| c == 0) {
        Some(n) => Ok(&b[..n]),
        None => Err(WireError::NoNul(what)),
    }
}

/// `struct fuse_in_header` (40 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InHeader {
    /// Length of the whole request, this header included.
    pub len: u32,
    /// The opcode.
    pub opcode: u32,
    /// The request's id, echoed in the reply.
    pub unique: u64,
    /// The node the request is about.
    pub nodeid: u64,
    /// Caller's fsuid.
    pub uid: u32,
    /// Caller's fsgid.
    pub gid: u32,
    /// Caller's thread group id.
    pub pid: u32,
    /// Length of the extension headers at the end of the request, in 8-byte units.
    pub total_extlen: u16,
}

impl InHeader {
    /// Size on the wire.
    pub const SIZE: usize = 40;

    /// Parse the first 40 bytes of `b`.
    pub fn parse(b: &[u8]) -> Result<InHeader> {
        need("fuse_in_header", b, Self::SIZE)?;
        Ok(InHeader {
            len: u32_at(b, 0),
            opcode: u32_at(b, 4),
            unique: u64_at(b, 8),
            nodeid: u64_at(b, 16),
            uid: u32_at(b, 24),
            gid: u32_at(b, 28),
            pid: u32_at(b, 32),
            total_extlen: u16_at(b, 36),
        })
    }

    /// Append the 40 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.len);
        put_u32(out, self.opcode);
        put_u64(out, self.unique);
        put_u64(out, self.nodeid);
        put_u32(out, self.uid);
        put_u32(out, self.gid);
        put_u32(out, self.pid);
        put_u16(out, self.total_extlen);
        put_u16(out, 0);
    }
}

/// `struct fuse_out_header` (16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutHeader {
    /// Length of the whole reply, this header included.
    pub len: u32,
    /// 0 or a negative errno.
    pub error: i32,
    /// The request's `unique`.
    pub unique: u64,
}

impl OutHeader {
    /// Size on the wire.
    pub const SIZE: usize = 16;

    /// Append the 16 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.len);
        out.extend_from_slice(&self.error.to_ne_bytes());
        put_u64(out, self.unique);
    }

    /// Parse the first 16 bytes of `b`.
    pub fn parse(b: &[u8]) -> Result<OutHeader> {
        need("fuse_out_header", b, Self::SIZE)?;
        Ok(OutHeader { len: u32_at(b, 0), error: u32_at(b, 4) as i32, unique: u64_at(b, 8) })
    }
}

/// A whole reply for the classic transport: header then `body`. `errno` > 0 sends an
/// error (and no body).
pub fn reply(unique: u64, errno: i32, body: &[u8]) -> Vec<u8> {
    let body = if errno != 0 { &[][..] } else { body };
    let mut out = Vec::with_capacity(OutHeader::SIZE + body.len());
    OutHeader { len: (OutHeader::SIZE + body.len()) as u32, error: -errno, unique }.encode(&mut out);
    out.extend_from_slice(body);
    out
}

/// The size of an opcode's fixed argument: the part FUSE over io_uring puts in `op_in`
/// (the kernel's `in_args[0]`; zero for the requests whose first argument is a name).
pub fn op_in_size(opcode: u32) -> usize {
    match opcode {
        opcode::INIT => InitIn::SIZE,
        opcode::FORGET => 8,
        opcode::GETATTR => 16,
        opcode::SETATTR => 88,
        opcode::MKNOD => 16,
        opcode::MKDIR => 8,
        opcode::RENAME => 8,
        opcode::RENAME2 => 16,
        opcode::LINK => 8,
        opcode::OPEN | opcode::OPENDIR => 8,
        opcode::CREATE | opcode::TMPFILE => 16,
        opcode::READ | opcode::WRITE => 40,
        opcode::RELEASE | opcode::RELEASEDIR | opcode::FLUSH => 24,
        opcode::FSYNC | opcode::FSYNCDIR => 16,
        // Without FUSE_SETXATTR_EXT (never asked for) SETXATTR's is the 8-byte old one.
        opcode::GETXATTR | opcode::SETXATTR | opcode::LISTXATTR => 8,
        opcode::ACCESS => 8,
        opcode::INTERRUPT => 8,
        opcode::BATCH_FORGET => 8,
        opcode::READDIR | opcode::READDIRPLUS => 40,
        opcode::FALLOCATE => 32,
        opcode::LSEEK => 24,
        opcode::COPY_FILE_RANGE => 56,
        opcode::STATX => 24,
        opcode::IOCTL => 32,
        _ => 0,
    }
}

/// Split a request read from `/dev/fuse` into its header, fixed argument and the rest,
/// dropping extension headers (`total_extlen`) from the end.
pub fn split_classic(buf: &[u8]) -> Result<(InHeader, &[u8], &[u8])> {
    let h = InHeader::parse(buf)?;
    if h.len as usize != buf.len() {
        return Err(WireError::BadLength { header: h.len, read: buf.len() });
    }
    let ext = h.total_extlen as usize * 8;
    let body = &buf[InHeader::SIZE..];
    need("request arguments", body, ext)?;
    let body = &body[..body.len() - ext];
    let n = op_in_size(h.opcode).min(body.len());
    let (arg, rest) = body.split_at(n);
    Ok((h, arg, rest))
}

/// `struct fuse_init_in`: what the kernel offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitIn {
    /// Kernel's major version.
    pub major: u32,
    /// Kernel's minor version.
    pub minor: u32,
    /// Readahead the kernel proposes.
    pub max_readahead: u32,
    /// All offered flags, `flags2` shifted in when [`init::INIT_EXT`] is set.
    pub flags: u64,
}

impl InitIn {
    /// Size of the full struct (7.36+); older kernels send 16 bytes.
    pub const SIZE: usize = 64;

    /// Parse; accepts the 16-byte struct of old kernels.
    pub fn parse(b: &[u8]) -> Result<InitIn> {
        need("fuse_init_in", b, 16)?;
        let mut flags = u32_at(b, 12) as u64;
        if flags & init::INIT_EXT != 0 && b.len() >= 20 {
            flags |= (u32_at(b, 16) as u64) << 32;
        }
        Ok(InitIn { major: u32_at(b, 0), minor: u32_at(b, 4), max_readahead: u32_at(b, 8), flags })
    }
}

/// `struct fuse_init_out`: what the daemon accepts (64 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InitOut {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Readahead.
    pub max_readahead: u32,
    /// Accepted flags, all 64 bits (split into `flags`/`flags2` on the wire).
    pub flags: u64,
    /// Background requests in flight at most.
    pub max_background: u16,
    /// Background requests before the kernel reports congestion.
    pub congestion_threshold: u16,
    /// Largest WRITE payload.
    pub max_write: u32,
    /// Timestamp granularity in ns.
    pub time_gran: u32,
    /// Largest request in pages (with [`init::MAX_PAGES`]).
    pub max_pages: u16,
}

impl InitOut {
    /// Size on the wire.
    pub const SIZE: usize = 64;

    /// Append the 64 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        put_u32(out, self.major);
        put_u32(out, self.minor);
        put_u32(out, self.max_readahead);
        put_u32(out, self.flags as u32);
        put_u16(out, self.max_background);
        put_u16(out, self.congestion_threshold);
        put_u32(out, self.max_write);
        put_u32(out, self.time_gran);
        put_u16(out, self.max_pages);
        put_u16(out, 0); // map_alignment
        put_u32(out, (self.flags >> 32) as u32); // flags2
        put_u32(out, 0); // max_stack_depth
        put_u16(out, 0); // request_timeout
        out.resize(start + Self::SIZE, 0); // unused[11]
    }
}

/// `struct fuse_attr` (88 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    pub flags: u32,
}

impl Attr {
    /// Size on the wire.
    pub const SIZE: usize = 88;

    /// Append the 88 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        for v in [self.ino, self.size, self.blocks, self.atime, self.mtime, self.ctime] {
            put_u64(out, v);
        }
        for v in [
            self.atimensec,
            self.mtimensec,
            self.ctimensec,
            self.mode,
            self.nlink,
            self.uid,
            self.gid,
            self.rdev,
            self.blksize,
            self.flags,
        ] {
            put_u32(out, v);
        }
    }
}

/// A cache timeout as the kernel takes it: seconds and nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Valid {
    /// Seconds.
    pub secs: u64,
    /// Nanoseconds.
    pub nsecs: u32,
}

impl From<std::time::Duration> for Valid {
    fn from(d: std::time::Duration) -> Valid {
        Valid { secs: d.as_secs(), nsecs: d.subsec_nanos() }
    }
}

/// `struct fuse_entry_out` (128 bytes): LOOKUP's reply and the first half of CREATE's.
/// A node id of 0 is a negative entry the kernel caches for `entry_valid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EntryOut {
    /// Node id (0: negative entry).
    pub nodeid: u64,
    /// Generation: node id and generation are unique for the file system's lifetime.
    pub generation: u64,
    /// How long the name may be cached.
    pub entry_valid: Valid,
    /// How long the attributes may be cached.
    pub attr_valid: Valid,
    /// The attributes.
    pub attr: Attr,
}

impl EntryOut {
    /// Size on the wire.
    pub const SIZE: usize = 40 + Attr::SIZE;

    /// Append the 128 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.nodeid);
        put_u64(out, self.generation);
        put_u64(out, self.entry_valid.secs);
        put_u64(out, self.attr_valid.secs);
        put_u32(out, self.entry_valid.nsecs);
        put_u32(out, self.attr_valid.nsecs);
        self.attr.encode(out);
    }
}

/// `struct fuse_attr_out` (104 bytes): GETATTR's and SETATTR's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttrOut {
    /// How long the attributes may be cached.
    pub attr_valid: Valid,
    /// The attributes.
    pub attr: Attr,
}

impl AttrOut {
    /// Size on the wire.
    pub const SIZE: usize = 16 + Attr::SIZE;

    /// Append the 104 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.attr_valid.secs);
        put_u32(out, self.attr_valid.nsecs);
        put_u32(out, 0);
        self.attr.encode(out);
    }
}

/// `STATX_BASIC_STATS | STATX_BTIME`: the fields a STATX reply gives.
pub const STATX_GIVEN: u32 = 0x0fff;

/// `struct fuse_statx_out` (288 bytes): STATX's reply, `struct fuse_statx` inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatxOut {
    /// How long the attributes may be cached.
    pub attr_valid: Valid,
    /// What GETATTR would answer.
    pub attr: Attr,
    /// Birth time: seconds (signed, as the kernel reads them) and nanoseconds.
    pub btime: (u64, u32),
    /// The device number of a device node, split.
    pub rdev_major: u32,
    /// See `rdev_major`.
    pub rdev_minor: u32,
}

impl StatxOut {
    /// Size on the wire.
    pub const SIZE: usize = 288;

    /// Append the 288 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let a = &self.attr;
        put_u64(out, self.attr_valid.secs);
        put_u32(out, self.attr_valid.nsecs);
        put_u32(out, 0); // flags
        out.resize(start + 32, 0); // spare[2]
        put_u32(out, STATX_GIVEN);
        put_u32(out, a.blksize);
        put_u64(out, 0); // attributes
        put_u32(out, a.nlink);
        put_u32(out, a.uid);
        put_u32(out, a.gid);
        put_u16(out, a.mode as u16); // type and permission bits fit 16
        put_u16(out, 0);
        put_u64(out, a.ino);
        put_u64(out, a.size);
        put_u64(out, a.blocks);
        put_u64(out, 0); // attributes_mask

        // Each a struct fuse_sx_time: seconds, nanoseconds, reserved.
        for (secs, nsecs) in [(a.atime, a.atimensec), self.btime, (a.ctime, a.ctimensec), (a.mtime, a.mtimensec)] {
            put_u64(out, secs);
            put_u32(out, nsecs);
            put_u32(out, 0);
        }
        put_u32(out, self.rdev_major);
        put_u32(out, self.rdev_minor);
        // dev_major, dev_minor (the kernel gives its own), __spare2[14].
        out.resize(start + Self::SIZE, 0);
    }
}

/// `struct fuse_open_out` (16 bytes): OPEN's reply and the second half of CREATE's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenOut {
    /// File handle, echoed in READ/WRITE/FLUSH/RELEASE.
    pub fh: u64,
    /// `FOPEN_*` flags.
    pub open_flags: u32,
}

impl OpenOut {
    /// Size on the wire.
    pub const SIZE: usize = 16;

    /// Append the 16 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.fh);
        put_u32(out, self.open_flags);
        put_u32(out, 0); // backing_id
    }
}

/// `struct fuse_write_out` / `fuse_getxattr_out` (8 bytes): a size.
pub fn encode_size_out(size: u32, out: &mut Vec<u8>) {
    put_u32(out, size);
    put_u32(out, 0);
}

/// `struct fuse_kstatfs` (80 bytes): STATFS's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct StatfsOut {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

impl StatfsOut {
    /// Size on the wire.
    pub const SIZE: usize = 80;

    /// Append the 80 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        for v in [self.blocks, self.bfree, self.bavail, self.files, self.ffree] {
            put_u64(out, v);
        }
        put_u32(out, self.bsize);
        put_u32(out, self.namelen);
        put_u32(out, self.frsize);
        out.resize(start + Self::SIZE, 0); // padding, spare[6]
    }
}

/// `FUSE_NAME_OFFSET`: where a `fuse_dirent`'s name starts.
const DIRENT_NAME_OFFSET: usize = 24;

/// The bytes one `fuse_dirent` takes (8-byte aligned), `plus` with its `fuse_entry_out`.
pub fn dirent_size(name_len: usize, plus: bool) -> usize {
    let base = (DIRENT_NAME_OFFSET + name_len + 7) & !7;
    if plus {
        EntryOut::SIZE + base
    } else {
        base
    }
}

/// Append a `fuse_dirent`: inode number, the cookie of the next entry, the `DT_*` type and
/// the name, padded to 8 bytes.
pub fn encode_dirent(out: &mut Vec<u8>, ino: u64, next: u64, dtype: u32, name: &[u8]) {
    let start = out.len();
    put_u64(out, ino);
    put_u64(out, next);
    put_u32(out, name.len() as u32);
    put_u32(out, dtype);
    out.extend_from_slice(name);
    out.resize(start + dirent_size(name.len(), false), 0);
}

/// A notification: a message with unique 0 whose code travels in the header's error
/// field, positive, then `body`.
fn notification(code: i32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OutHeader::SIZE + body.len());
    OutHeader { len: (OutHeader::SIZE + body.len()) as u32, error: code, unique: 0 }.encode(&mut out);
    out.extend_from_slice(body);
    out
}

/// `FUSE_NOTIFY_INVAL_INODE`: tell the kernel to drop node `ino`'s cached attributes and
/// the pages of `[offset, offset + len)` (len 0: to the end).
pub fn notify_inval_inode(ino: u64, offset: i64, len: i64) -> Vec<u8> {
    let mut body = Vec::with_capacity(24);
    put_u64(&mut body, ino);
    put_u64(&mut body, offset as u64);
    put_u64(&mut body, len as u64);
    notification(2, &body)
}

/// `FUSE_NOTIFY_INVAL_ENTRY`: tell the kernel to drop its dentry for `name` in directory
/// node `parent` (the name is gone, or leads elsewhere now).
pub fn notify_inval_entry(parent: u64, name: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(16 + name.len() + 1);
    put_u64(&mut body, parent);
    put_name(&mut body, name);
    notification(3, &body)
}

/// `FUSE_NOTIFY_DELETE`: tell the kernel that `name` in directory node `parent`, which led
/// to node `child`, is gone: it drops the dentry and sets the inode's link count to 0
/// (so only for a last link).
pub fn notify_delete(parent: u64, child: u64, name: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(24 + name.len() + 1);
    put_u64(&mut body, parent);
    put_u64(&mut body, child);
    put_name(&mut body, name);
    notification(6, &body)
}

/// A notification's name: its length, padding, the bytes and a NUL.
fn put_name(body: &mut Vec<u8>, name: &[u8]) {
    put_u32(body, name.len() as u32);
    put_u32(body, 0);
    body.extend_from_slice(name);
    body.push(0);
}

/// `FUSE_IOCTL_DIR`: the ioctl was made on a directory.
pub const IOCTL_DIR: u32 = 1 << 4;

/// `struct fuse_ioctl_out` for a plain answer (no retry, no iovecs), then `data`.
pub fn encode_ioctl_out(result: i32, data: &[u8], out: &mut Vec<u8>) {
    put_u32(out, result as u32);
    put_u32(out, 0);
    put_u32(out, 0);
    put_u32(out, 0);
    out.extend_from_slice(data);
}

/// `struct fuse_lseek_out`.
pub fn encode_lseek_out(offset: u64, out: &mut Vec<u8>) {
    put_u64(out, offset);
}

/// FUSE over io_uring: the buffers and commands of `fs/fuse/dev_uring.c` (7.42).
pub mod uring;

#[cfg(all(test, target_endian = "little"))]
mod tests;
