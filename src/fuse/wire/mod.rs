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

/// `FUSE_NOTIFY_INVAL_INODE`: a message (unique 0) telling the kernel to drop node
/// `ino`'s cached attributes and the pages of `[offset, offset + len)` (len 0: to the end).
pub fn notify_inval_inode(ino: u64, offset: i64, len: i64) -> Vec<u8> {
    const NOTIFY_INVAL_INODE: i32 = 2;
    let mut body = Vec::with_capacity(24);
    put_u64(&mut body, ino);
    put_u64(&mut body, offset as u64);
    put_u64(&mut body, len as u64);
    let mut out = Vec::with_capacity(OutHeader::SIZE + body.len());
    // A notification's code travels in the error field, positive.
    OutHeader { len: (OutHeader::SIZE + body.len()) as u32, error: NOTIFY_INVAL_INODE, unique: 0 }.encode(&mut out);
    out.extend_from_slice(&body);
    out
}

/// `struct fuse_lseek_out`.
pub fn encode_lseek_out(offset: u64, out: &mut Vec<u8>) {
    put_u64(out, offset);
}

/// FUSE over io_uring: the buffers and commands of `fs/fuse/dev_uring.c` (7.42).
pub mod uring {
    use super::{need, put_u16, put_u32, put_u64, u32_at, u64_at, Result};

    /// `FUSE_IO_URING_CMD_REGISTER`: hand the kernel one entry's buffers; its completion
    /// carries the entry's first request.
    pub const CMD_REGISTER: u32 = 1;
    /// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: the reply is in the entry's buffers; its
    /// completion carries the entry's next request.
    pub const CMD_COMMIT_AND_FETCH: u32 = 2;

    /// Size of `struct fuse_uring_req_header`, the first of an entry's two buffers.
    pub const HEADER_SIZE: usize = 288;
    /// Offset of `in_out`: the `fuse_in_header` of a request, the `fuse_out_header` of a
    /// reply (128 bytes reserved).
    pub const IN_OUT_OFFSET: usize = 0;
    /// Offset of `op_in`: the opcode's fixed argument (128 bytes reserved).
    pub const OP_IN_OFFSET: usize = 128;
    /// Size reserved for `op_in`.
    pub const OP_IN_SIZE: usize = 128;
    /// Offset of `struct fuse_uring_ent_in_out`.
    pub const ENT_IN_OUT_OFFSET: usize = 256;

    /// The payload buffer must hold this much: the kernel's `max_payload_sz` is the
    /// largest of 8 KiB, `max_write` and `max_pages` pages; REGISTER fails with EINVAL
    /// for a smaller one.
    pub fn payload_size(max_write: u32, max_pages: u16, page_size: usize) -> usize {
        let pages = if max_pages == 0 { 32 } else { max_pages as usize };
        super::MIN_READ_BUFFER.max(max_write as usize).max(pages * page_size)
    }

    /// `struct fuse_uring_ent_in_out` (32 bytes at [`ENT_IN_OUT_OFFSET`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct EntInOut {
        /// Flags (none defined yet).
        pub flags: u64,
        /// The request's id, to echo in the commit (equals the in-header's `unique`).
        pub commit_id: u64,
        /// Bytes of the payload buffer in use, in either direction.
        pub payload_sz: u32,
    }

    impl EntInOut {
        /// Size on the wire.
        pub const SIZE: usize = 32;

        /// Parse the 32 bytes.
        pub fn parse(b: &[u8]) -> Result<EntInOut> {
            need("fuse_uring_ent_in_out", b, Self::SIZE)?;
            Ok(EntInOut { flags: u64_at(b, 0), commit_id: u64_at(b, 8), payload_sz: u32_at(b, 16) })
        }

        /// Append the 32 bytes.
        pub fn encode(&self, out: &mut Vec<u8>) {
            put_u64(out, self.flags);
            put_u64(out, self.commit_id);
            put_u32(out, self.payload_sz);
            put_u32(out, 0);
            put_u64(out, 0);
        }
    }

    /// `struct fuse_uring_cmd_req`, in the 80-byte command area of a 128-byte SQE.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct CmdReq {
        /// Flags (none defined in 7.42).
        pub flags: u64,
        /// For COMMIT_AND_FETCH: the `commit_id` of the request answered.
        pub commit_id: u64,
        /// The queue: the CPU whose requests it serves.
        pub qid: u16,
    }

    impl CmdReq {
        /// The whole 80-byte command area (unused bytes zero).
        pub fn encode(&self) -> [u8; 80] {
            let mut v = Vec::with_capacity(80);
            put_u64(&mut v, self.flags);
            put_u64(&mut v, self.commit_id);
            put_u16(&mut v, self.qid);
            v.resize(80, 0);
            v.try_into().expect("80 bytes")
        }
    }
}

#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;

    /// A request as the kernel lays it out on `/dev/fuse`, built byte by byte.
    fn classic(opcode: u8, unique: u8, nodeid: u8, body: &[u8]) -> Vec<u8> {
        let len = (40 + body.len()) as u8;
        let mut v = vec![
            len, 0, 0, 0, opcode, 0, 0, 0, // len, opcode
            unique, 0, 0, 0, 0, 0, 0, 0, // unique
            nodeid, 0, 0, 0, 0, 0, 0, 0, // nodeid
            0xe8, 0x03, 0, 0, 0xe9, 0x03, 0, 0, // uid 1000, gid 1001
            0x39, 0x30, 0, 0, 0, 0, 0, 0, // pid 12345, total_extlen 0, padding
        ];
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn in_header_fields_at_their_offsets() {
        let b = classic(1, 7, 1, b"abc\0");
        let h = InHeader::parse(&b).unwrap();
        assert_eq!(
            h,
            InHeader { len: 44, opcode: 1, unique: 7, nodeid: 1, uid: 1000, gid: 1001, pid: 12345, total_extlen: 0 }
        );
        let mut again = Vec::new();
        h.encode(&mut again);
        assert_eq!(again, b[..40]);
        assert!(matches!(InHeader::parse(&b[..39]), Err(WireError::Short { need: 40, have: 39, .. })));
    }

    #[test]
    fn lookup_and_unlink_names() {
        let b = classic(1, 2, 1, b"hello\0");
        let (h, arg, rest) = split_classic(&b).unwrap();
        assert!(arg.is_empty());
        assert_eq!(Request::parse(h.opcode, arg, rest).unwrap(), Request::Lookup { name: b"hello" });
        let b = classic(10, 3, 1, b"x\0");
        let (h, arg, rest) = split_classic(&b).unwrap();
        assert_eq!(Request::parse(h.opcode, arg, rest).unwrap(), Request::Unlink { name: b"x" });
        let b = classic(1, 2, 1, b"nonul");
        let (h, arg, rest) = split_classic(&b).unwrap();
        assert_eq!(Request::parse(h.opcode, arg, rest), Err(WireError::NoNul("LOOKUP")));
    }

    #[test]
    fn length_mismatch_is_an_error() {
        let mut b = classic(1, 2, 1, b"a\0");
        b.push(0);
        assert_eq!(split_classic(&b), Err(WireError::BadLength { header: 42, read: 43 }));
    }

    #[test]
    fn extension_headers_are_cut_off() {
        let mut b = classic(10, 3, 1, b"x\0\0\0\0\0\0\0");
        b.extend_from_slice(&[0xaa; 8]);
        b[0] = 56; // len
        b[36] = 1; // total_extlen: 8 bytes
        let (_, _, rest) = split_classic(&b).unwrap();
        assert_eq!(rest.len(), 8);
        assert!(!rest.contains(&0xaa));
    }

    #[test]
    fn create_splits_fixed_argument_from_name() {
        let body = [
            0xc1, 0x00, 0x00, 0x00, // flags O_CREAT|O_EXCL|O_WRONLY = 0o301
            0xa4, 0x81, 0x00, 0x00, // mode 0o100644
            0x12, 0x00, 0x00, 0x00, // umask 0o22
            0, 0, 0, 0, // open_flags
            b'f', b'0', 0,
        ];
        let b = classic(35, 9, 1, &body);
        let (h, arg, rest) = split_classic(&b).unwrap();
        assert_eq!(arg.len(), 16);
        assert_eq!(
            Request::parse(h.opcode, arg, rest).unwrap(),
            Request::Create { flags: 0o301, mode: 0o100644, umask: 0o22, name: b"f0" }
        );
        // FUSE over io_uring delivers the same request with arg in op_in and the name
        // in the payload: the same parse.
        assert_eq!(
            Request::parse(35, &body[..16], b"f0\0").unwrap(),
            Request::Create { flags: 0o301, mode: 0o100644, umask: 0o22, name: b"f0" }
        );
        assert!(matches!(Request::parse(35, &body[..15], b"f0\0"), Err(WireError::Short { need: 16, .. })));
    }

    #[test]
    fn write_read_flush_release_getattr() {
        let mut w = vec![
            5, 0, 0, 0, 0, 0, 0, 0, // fh 5
            0, 0x10, 0, 0, 0, 0, 0, 0, // offset 4096
            3, 0, 0, 0, 1, 0, 0, 0, // size 3, write_flags 1
        ];
        w.extend_from_slice(&[0; 8]); // lock_owner
        w.extend_from_slice(&[0, 0x40, 0, 0, 0, 0, 0, 0]); // flags O_DIRECT, padding
        w.extend_from_slice(b"xyz");
        let b = classic(16, 1, 2, &w);
        let (h, arg, rest) = split_classic(&b).unwrap();
        assert_eq!(
            Request::parse(h.opcode, arg, rest).unwrap(),
            Request::Write { fh: 5, offset: 4096, write_flags: 1, flags: 0x4000, data: b"xyz" }
        );
        assert!(matches!(Request::parse(16, arg, b"xy"), Err(WireError::Short { what: "WRITE data", .. })));

        let mut r = vec![5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0];
        r.extend_from_slice(&[0; 16]);
        assert_eq!(Request::parse(15, &r, &[]).unwrap(), Request::Read { fh: 5, offset: 0, size: 4096 });

        let f = [6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(Request::parse(25, &f, &[]).unwrap(), Request::Flush { fh: 6, lock_owner: 9 });
        let rel = [6, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(Request::parse(18, &rel, &[]).unwrap(), Request::Release { fh: 6, flags: 2, release_flags: 1 });
        let g = [1, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(Request::parse(3, &g, &[]).unwrap(), Request::Getattr { flags: GETATTR_FH, fh: 6 });
    }

    #[test]
    fn getxattr_forgets_interrupt_statfs_destroy() {
        let b = classic(22, 4, 2, &[0, 0, 0, 0, 0, 0, 0, 0, b'u', b'.', b'f', 0]);
        let (h, arg, rest) = split_classic(&b).unwrap();
        assert_eq!(Request::parse(h.opcode, arg, rest).unwrap(), Request::Getxattr { size: 0, name: b"u.f" });

        let f = Request::parse(2, &[3, 0, 0, 0, 0, 0, 0, 0], &[]).unwrap();
        assert_eq!(f, Request::Forget { nlookup: 3 });
        assert!(f.no_reply());

        let mut rest = vec![7, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
        rest.extend_from_slice(&[8, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        let bf = Request::parse(42, &[2, 0, 0, 0, 0, 0, 0, 0], &rest).unwrap();
        assert_eq!(bf, Request::BatchForget(vec![(7, 1), (8, 2)]));
        assert!(bf.no_reply());
        // A count larger than the entries sent.
        assert!(Request::parse(42, &[3, 0, 0, 0, 0, 0, 0, 0], &rest).is_err());

        assert_eq!(Request::parse(36, &[9, 0, 0, 0, 0, 0, 0, 0], &[]).unwrap(), Request::Interrupt { unique: 9 });
        assert_eq!(Request::parse(17, &[], &[]).unwrap(), Request::Statfs);
        assert_eq!(Request::parse(38, &[], &[]).unwrap(), Request::Destroy);
        assert_eq!(Request::parse(99, &[], &[]).unwrap(), Request::Other(99));
        assert!(!Request::Statfs.no_reply());
    }

    #[test]
    fn init_in_merges_flags2_only_with_init_ext() {
        let mut b = vec![
            7, 0, 0, 0, 44, 0, 0, 0, // 7.44
            0, 0, 2, 0, // max_readahead 128 KiB
            0x01, 0x00, 0x00, 0x40, // flags: ASYNC_READ | INIT_EXT
            0x00, 0x02, 0x00, 0x00, // flags2: bit 9 = OVER_IO_URING (1 << 41)
        ];
        b.resize(64, 0);
        let i = InitIn::parse(&b).unwrap();
        assert_eq!((i.major, i.minor, i.max_readahead), (7, 44, 131072));
        assert_eq!(i.flags, init::ASYNC_READ | init::INIT_EXT | init::OVER_IO_URING);
        b[15] = 0; // no INIT_EXT: flags2 is not read
        assert_eq!(InitIn::parse(&b).unwrap().flags, init::ASYNC_READ);
        assert_eq!(InitIn::parse(&b[..16]).unwrap().flags, init::ASYNC_READ);
        assert!(InitIn::parse(&b[..15]).is_err());
        let req = classic(26, 1, 0, &b);
        let (h, arg, _) = split_classic(&req).unwrap();
        assert_eq!((h.opcode, arg.len()), (26, 64));
    }

    #[test]
    fn init_out_layout() {
        let o = InitOut {
            major: 7,
            minor: 42,
            max_readahead: 0x20000,
            flags: init::INIT_EXT | init::OVER_IO_URING | init::MAX_PAGES,
            max_background: 16,
            congestion_threshold: 12,
            max_write: 0x20000,
            time_gran: 1,
            max_pages: 32,
        };
        let mut v = Vec::new();
        o.encode(&mut v);
        let want: Vec<u8> = [
            &[7, 0, 0, 0, 42, 0, 0, 0][..],
            &[0, 0, 2, 0],
            &[0, 0, 0x40, 0x40], // flags: MAX_PAGES (1 << 22) | INIT_EXT (1 << 30)
            &[16, 0, 12, 0],
            &[0, 0, 2, 0],
            &[1, 0, 0, 0],
            &[32, 0, 0, 0], // max_pages, map_alignment
            &[0, 2, 0, 0],  // flags2: OVER_IO_URING >> 32 = 1 << 9
            &[0; 4],        // max_stack_depth
            &[0; 24],       // request_timeout, unused
        ]
        .concat();
        assert_eq!(v, want);
    }

    #[test]
    fn entry_attr_open_statfs_replies() {
        let attr = Attr { ino: 2, size: 3, mode: 0o100644, nlink: 1, blksize: 4096, ..Attr::default() };
        let mut e = Vec::new();
        EntryOut {
            nodeid: 2,
            generation: 1,
            entry_valid: Valid { secs: 1, nsecs: 5 },
            attr_valid: Valid::from(std::time::Duration::from_millis(1500)),
            attr,
        }
        .encode(&mut e);
        assert_eq!(e.len(), 128);
        assert_eq!(&e[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&e[16..24], &[1, 0, 0, 0, 0, 0, 0, 0]); // entry_valid
        assert_eq!(&e[24..32], &[1, 0, 0, 0, 0, 0, 0, 0]); // attr_valid 1 s
        assert_eq!(&e[32..36], &[5, 0, 0, 0]);
        assert_eq!(&e[36..40], &500_000_000u32.to_le_bytes()); // attr_valid_nsec
        assert_eq!(&e[40..48], &[2, 0, 0, 0, 0, 0, 0, 0]); // attr.ino
        assert_eq!(&e[40 + 60..40 + 64], &[0xa4, 0x81, 0, 0]); // attr.mode at 60
        assert_eq!(&e[40 + 80..40 + 84], &[0, 0x10, 0, 0]); // attr.blksize at 80

        let mut a = Vec::new();
        AttrOut { attr_valid: Valid { secs: 0, nsecs: 0 }, attr }.encode(&mut a);
        assert_eq!(a.len(), 104);
        assert_eq!(&a[16..24], &[2, 0, 0, 0, 0, 0, 0, 0]);

        let mut o = Vec::new();
        OpenOut { fh: 0x0102, open_flags: 4 }.encode(&mut o);
        assert_eq!(o, [2, 1, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0]);

        let mut s = Vec::new();
        StatfsOut { blocks: 1, bfree: 2, bavail: 3, files: 4, ffree: 5, bsize: 6, namelen: 7, frsize: 8 }
            .encode(&mut s);
        assert_eq!(s.len(), 80);
        assert_eq!(s[32], 5);
        assert_eq!(&s[40..52], &[6, 0, 0, 0, 7, 0, 0, 0, 8, 0, 0, 0]);
        assert!(s[52..].iter().all(|&b| b == 0));

        let mut w = Vec::new();
        encode_size_out(3, &mut w);
        assert_eq!(w, [3, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn reply_header() {
        let r = reply(0x0a0b, 0, &[1, 2]);
        assert_eq!(r, [18, 0, 0, 0, 0, 0, 0, 0, 0x0b, 0x0a, 0, 0, 0, 0, 0, 0, 1, 2]);
        // An error carries -errno and no body.
        let r = reply(5, libc::ENODATA, &[1, 2]);
        assert_eq!(&r[..8], &[16, 0, 0, 0, 0xc3, 0xff, 0xff, 0xff]); // -61
        assert_eq!(r.len(), 16);
        assert_eq!(OutHeader::parse(&r).unwrap(), OutHeader { len: 16, error: -61, unique: 5 });
    }

    fn le(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn namespace_requests_with_two_names_or_an_argument() {
        assert_eq!(
            Request::parse(opcode::SYMLINK, &[], b"ln\0target/x\0").unwrap(),
            Request::Symlink { name: b"ln", target: b"target/x" }
        );
        assert_eq!(Request::parse(opcode::SYMLINK, &[], b"ln\0target"), Err(WireError::NoNul("SYMLINK")));
        let r2 = le(&[&9u64.to_ne_bytes(), &1u32.to_ne_bytes(), &[0; 4]]);
        assert_eq!(
            Request::parse(opcode::RENAME2, &r2, b"a\0b\0").unwrap(),
            Request::Rename { newdir: 9, flags: 1, name: b"a", newname: b"b" }
        );
        assert_eq!(
            Request::parse(opcode::RENAME, &9u64.to_ne_bytes(), b"a\0b\0").unwrap(),
            Request::Rename { newdir: 9, flags: 0, name: b"a", newname: b"b" }
        );
        assert_eq!(
            Request::parse(opcode::LINK, &5u64.to_ne_bytes(), b"n\0").unwrap(),
            Request::Link { oldnodeid: 5, name: b"n" }
        );
        let mk = le(&[&0o40755u32.to_ne_bytes(), &0o22u32.to_ne_bytes()]);
        assert_eq!(
            Request::parse(opcode::MKDIR, &mk, b"d\0").unwrap(),
            Request::Mkdir { mode: 0o40755, umask: 0o22, name: b"d" }
        );
        let tmp = le(&[&2u32.to_ne_bytes(), &0o100600u32.to_ne_bytes(), &0o77u32.to_ne_bytes(), &[0; 4]]);
        assert_eq!(
            Request::parse(opcode::TMPFILE, &tmp, b"/\0").unwrap(),
            Request::Tmpfile { flags: 2, mode: 0o100600, umask: 0o77 }
        );
    }

    #[test]
    fn setattr_xattr_readdir_fallocate_copy() {
        let mut sa = vec![0u8; 88];
        sa[0..4].copy_from_slice(&(fattr::MODE | fattr::SIZE | fattr::MTIME).to_ne_bytes());
        sa[16..24].copy_from_slice(&4096u64.to_ne_bytes());
        sa[40..48].copy_from_slice(&(-5i64).to_ne_bytes());
        sa[60..64].copy_from_slice(&7u32.to_ne_bytes());
        sa[68..72].copy_from_slice(&0o100644u32.to_ne_bytes());
        let Request::Setattr(s) = Request::parse(opcode::SETATTR, &sa, &[]).unwrap() else { panic!() };
        assert_eq!((s.size, s.mtime, s.mtimensec, s.mode), (4096, -5, 7, 0o100644));
        assert!(Request::parse(opcode::SETATTR, &sa[..87], &[]).is_err());

        let sx = le(&[&3u32.to_ne_bytes(), &1u32.to_ne_bytes()]);
        assert_eq!(
            Request::parse(opcode::SETXATTR, &sx, b"user.a\0xyzTRAILING").unwrap(),
            Request::Setxattr { flags: 1, name: b"user.a", value: b"xyz" }
        );
        assert!(Request::parse(opcode::SETXATTR, &sx, b"user.a\0xy").is_err(), "value shorter than its size");

        let rd = le(&[&1u64.to_ne_bytes(), &77u64.to_ne_bytes(), &4096u32.to_ne_bytes(), &[0; 12]]);
        assert_eq!(
            Request::parse(opcode::READDIRPLUS, &rd, &[]).unwrap(),
            Request::Readdir { fh: 1, offset: 77, size: 4096, plus: true }
        );
        let fa = le(&[&0u64.to_ne_bytes(), &8u64.to_ne_bytes(), &16u64.to_ne_bytes(), &3u32.to_ne_bytes(), &[0; 4]]);
        assert_eq!(
            Request::parse(opcode::FALLOCATE, &fa, &[]).unwrap(),
            Request::Fallocate { fh: 0, offset: 8, length: 16, mode: 3 }
        );
        let cf: Vec<u8> = [0u64, 10, 42, 0, 20, 30, 0].iter().flat_map(|v| v.to_ne_bytes()).collect();
        assert_eq!(
            Request::parse(opcode::COPY_FILE_RANGE, &cf, &[]).unwrap(),
            Request::CopyFileRange { off_in: 10, nodeid_out: 42, off_out: 20, len: 30 }
        );
    }

    #[test]
    fn dirent_and_notification_layout() {
        let mut out = Vec::new();
        encode_dirent(&mut out, 5, 9, 8, b"abc");
        assert_eq!(out.len(), 32, "24 bytes and the name, padded to 8");
        assert_eq!(out.len(), dirent_size(3, false));
        assert_eq!(dirent_size(3, true), 128 + 32);
        assert_eq!(&out[0..8], &5u64.to_ne_bytes());
        assert_eq!(&out[8..16], &9u64.to_ne_bytes());
        assert_eq!(&out[16..20], &3u32.to_ne_bytes());
        assert_eq!(&out[20..24], &8u32.to_ne_bytes());
        assert_eq!(&out[24..27], b"abc");
        assert_eq!(&out[27..], &[0; 5]);
        let n = notify_inval_inode(7, 4096, -1);
        let h = OutHeader::parse(&n).unwrap();
        assert_eq!((h.len as usize, h.error, h.unique), (n.len(), 2, 0));
        assert_eq!(&n[16..24], &7u64.to_ne_bytes());
        assert_eq!(&n[32..40], &(-1i64).to_ne_bytes());
    }

    #[test]
    fn uring_command_and_entry_header() {
        let c = uring::CmdReq { flags: 0, commit_id: 0x1122, qid: 1 }.encode();
        assert_eq!(&c[..18], &[0, 0, 0, 0, 0, 0, 0, 0, 0x22, 0x11, 0, 0, 0, 0, 0, 0, 1, 0]);
        assert!(c[18..].iter().all(|&b| b == 0));

        let mut e = Vec::new();
        uring::EntInOut { flags: 0, commit_id: 77, payload_sz: 3 }.encode(&mut e);
        assert_eq!(e.len(), uring::EntInOut::SIZE);
        assert_eq!(&e[8..20], &[77, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0]);
        assert_eq!(uring::EntInOut::parse(&e).unwrap().payload_sz, 3);
        assert_eq!(
            uring::ENT_IN_OUT_OFFSET + uring::EntInOut::SIZE,
            uring::HEADER_SIZE,
            "in_out[128] + op_in[128] + ent_in_out"
        );
        assert_eq!(uring::payload_size(0x20000, 32, 4096), 0x20000);
        assert_eq!(uring::payload_size(4096, 0, 4096), 32 * 4096);
        assert_eq!(uring::payload_size(4096, 1, 4096), 8192);
    }
}
