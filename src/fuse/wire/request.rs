//! Requests: every opcode dxfs serves, parsed from its fixed argument and the rest.

use super::{cstr, need, opcode, u32_at, u64_at, InitIn, Result};

/// `fuse_setattr_in`: which attributes to change (`valid`, `FATTR_*`) and their values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct SetattrIn {
    pub valid: u32,
    pub fh: u64,
    pub size: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub atimensec: u32,
    pub mtimensec: u32,
    pub ctimensec: u32,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    #![allow(missing_docs)]
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    /// The caller lacks CAP_FSETID: drop setuid/setgid (HANDLE_KILLPRIV_V2).
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_write_in.write_flags`: the kernel's write-back of its page cache.
pub const WRITE_CACHE: u32 = 1 << 0;
/// `fuse_write_in.write_flags`: the caller lacks CAP_FSETID (HANDLE_KILLPRIV_V2).
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_fsync_in.fsync_flags`: data only (fdatasync).
pub const FSYNC_FDATASYNC: u32 = 1 << 0;

/// `FOPEN_*` flags of an open reply.
pub mod fopen {
    #![allow(missing_docs)]
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const CACHE_DIR: u32 = 1 << 3;
    pub const NOFLUSH: u32 = 1 << 5;
}

/// A parsed request: the opcodes this module knows, the rest as [`Request::Other`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// Version and flag negotiation.
    Init(InitIn),
    /// Look `name` up in the node.
    Lookup {
        /// The name.
        name: &'a [u8],
    },
    /// Drop `nlookup` references to the node (no reply).
    Forget {
        /// References to drop.
        nlookup: u64,
    },
    /// Drop references to many nodes (no reply): (node id, count) pairs.
    BatchForget(Vec<(u64, u64)>),
    /// Attributes of the node (`fh` when `GETATTR_FH` is set).
    Getattr {
        /// `getattr_flags`.
        flags: u32,
        /// File handle.
        fh: u64,
    },
    /// Attributes with the birth time: a `statx` that asks for more than `stat` gives.
    Statx {
        /// `getattr_flags`.
        flags: u32,
        /// File handle.
        fh: u64,
        /// The `STATX_*` fields asked for (all of them are always given).
        mask: u32,
    },
    /// Change attributes.
    Setattr(SetattrIn),
    /// A symlink's target.
    Readlink,
    /// Make symlink `name` pointing at `target` in the node.
    Symlink {
        /// The new name.
        name: &'a [u8],
        /// Its target.
        target: &'a [u8],
    },
    /// Make a special or regular file `name` in the node.
    Mknod {
        /// Type and permissions.
        mode: u32,
        /// Device number.
        rdev: u32,
        /// Caller's umask.
        umask: u32,
        /// The name.
        name: &'a [u8],
    },
    /// Make directory `name` in the node.
    Mkdir {
        /// Permissions.
        mode: u32,
        /// Caller's umask.
        umask: u32,
        /// The name.
        name: &'a [u8],
    },
    /// Remove directory `name` from the node.
    Rmdir {
        /// The name.
        name: &'a [u8],
    },
    /// Rename `name` in the node to `newname` in `newdir` (RENAME and RENAME2).
    Rename {
        /// The target directory's node id.
        newdir: u64,
        /// `RENAME_*` flags (0 for RENAME).
        flags: u32,
        /// The old name.
        name: &'a [u8],
        /// The new name.
        newname: &'a [u8],
    },
    /// Link node `oldnodeid` as `name` in the node.
    Link {
        /// The inode to link.
        oldnodeid: u64,
        /// The new name.
        name: &'a [u8],
    },
    /// Open the node.
    Open {
        /// `open(2)` flags.
        flags: u32,
    },
    /// Create and open `name` in the node.
    Create {
        /// `open(2)` flags.
        flags: u32,
        /// Mode of the new file.
        mode: u32,
        /// Caller's umask.
        umask: u32,
        /// The name.
        name: &'a [u8],
    },
    /// Create an unnamed file in the node's directory (`O_TMPFILE`).
    Tmpfile {
        /// `open(2)` flags.
        flags: u32,
        /// Mode of the new file.
        mode: u32,
        /// Caller's umask.
        umask: u32,
    },
    /// Read.
    Read {
        /// File handle.
        fh: u64,
        /// Offset.
        offset: u64,
        /// Bytes wanted.
        size: u32,
        /// The reader's open flags (`O_DIRECT` set: the kernel reads nothing ahead).
        flags: u32,
    },
    /// Write `data` at `offset`.
    Write {
        /// File handle.
        fh: u64,
        /// Offset.
        offset: u64,
        /// `write_flags`.
        write_flags: u32,
        /// The descriptor's `open(2)` flags (0 before 7.9).
        flags: u32,
        /// The data.
        data: &'a [u8],
    },
    /// A `close` of one descriptor of the file.
    Flush {
        /// File handle.
        fh: u64,
        /// Lock owner.
        lock_owner: u64,
    },
    /// The last reference to the open file is gone.
    Release {
        /// File handle.
        fh: u64,
        /// `open(2)` flags.
        flags: u32,
        /// `release_flags`.
        release_flags: u32,
    },
    /// Make the file (`dir` false) or directory durable.
    Fsync {
        /// File handle.
        fh: u64,
        /// `fsync_flags`.
        fsync_flags: u32,
        /// FSYNCDIR rather than FSYNC.
        dir: bool,
    },
    /// Remove `name` from the node.
    Unlink {
        /// The name.
        name: &'a [u8],
    },
    /// Set an xattr.
    Setxattr {
        /// `XATTR_CREATE` / `XATTR_REPLACE`.
        flags: u32,
        /// The xattr's name.
        name: &'a [u8],
        /// Its value.
        value: &'a [u8],
    },
    /// Read an xattr (`size` 0: its size only).
    Getxattr {
        /// Buffer size.
        size: u32,
        /// The xattr's name.
        name: &'a [u8],
    },
    /// List xattr names (`size` 0: the list's size only).
    Listxattr {
        /// Buffer size.
        size: u32,
    },
    /// Remove an xattr.
    Removexattr {
        /// The xattr's name.
        name: &'a [u8],
    },
    /// Open the node as a directory.
    Opendir {
        /// `open(2)` flags.
        flags: u32,
    },
    /// Directory entries from cookie `offset` on, at most `size` bytes of them (with
    /// attributes when `plus`: READDIRPLUS).
    Readdir {
        /// File handle.
        fh: u64,
        /// Cookie of the last entry returned (0: from the start).
        offset: u64,
        /// Reply buffer size.
        size: u32,
        /// READDIRPLUS rather than READDIR.
        plus: bool,
    },
    /// The last reference to the open directory is gone.
    Releasedir {
        /// File handle.
        fh: u64,
    },
    /// May the caller access the node (`R_OK|W_OK|X_OK`, or `F_OK`)?
    Access {
        /// The mask.
        mask: u32,
    },
    /// Preallocate, punch, zero, collapse or insert a range.
    Fallocate {
        /// File handle.
        fh: u64,
        /// Offset.
        offset: u64,
        /// Length.
        length: u64,
        /// `FALLOC_FL_*`.
        mode: u32,
    },
    /// `SEEK_DATA` / `SEEK_HOLE` (the kernel does the others).
    Lseek {
        /// File handle.
        fh: u64,
        /// Offset.
        offset: u64,
        /// `SEEK_*`.
        whence: u32,
    },
    /// Copy `len` bytes from this node to `nodeid_out` inside the file system.
    CopyFileRange {
        /// Source offset.
        off_in: u64,
        /// Destination node id.
        nodeid_out: u64,
        /// Destination offset.
        off_out: u64,
        /// Bytes.
        len: u64,
    },
    /// An ioctl on an open file or directory (restricted: its data sizes come from the
    /// command's encoding).
    Ioctl {
        /// File handle.
        fh: u64,
        /// `FUSE_IOCTL_*` (`FUSE_IOCTL_DIR` for a directory).
        flags: u32,
        /// The command.
        cmd: u32,
        /// The most bytes the reply may carry back.
        out_size: u32,
        /// The bytes the caller passed in.
        data: &'a [u8],
    },
    /// File system statistics.
    Statfs,
    /// The connection is going away (fuseblk and virtiofs only).
    Destroy,
    /// `sync(2)` or `syncfs(2)` on the mount (sent to fuseblk and virtiofs servers only).
    Syncfs,
    /// Interrupt request `unique` (no reply needed).
    Interrupt {
        /// The interrupted request.
        unique: u64,
    },
    /// An opcode this module does not parse.
    Other(u32),
}

/// Two NUL-terminated names, one after the other.
fn two_names<'a>(what: &'static str, b: &'a [u8]) -> Result<(&'a [u8], &'a [u8])> {
    let first = cstr(what, b)?;
    let second = cstr(what, &b[first.len() + 1..])?;
    Ok((first, second))
}

impl<'a> Request<'a> {
    /// Parse request `opcode` from its fixed argument `arg` and the `rest`.
    pub fn parse(opcode: u32, arg: &'a [u8], rest: &'a [u8]) -> Result<Request<'a>> {
        Ok(match opcode {
            opcode::INIT => Request::Init(InitIn::parse(arg)?),
            opcode::LOOKUP => Request::Lookup { name: cstr("LOOKUP", rest)? },
            opcode::FORGET => {
                need("fuse_forget_in", arg, 8)?;
                Request::Forget { nlookup: u64_at(arg, 0) }
            }
            opcode::BATCH_FORGET => {
                need("fuse_batch_forget_in", arg, 8)?;
                let count = u32_at(arg, 0) as usize;
                need("fuse_forget_one[]", rest, count.saturating_mul(16))?;
                Request::BatchForget((0..count).map(|i| (u64_at(rest, i * 16), u64_at(rest, i * 16 + 8))).collect())
            }
            opcode::GETATTR => {
                need("fuse_getattr_in", arg, 16)?;
                Request::Getattr { flags: u32_at(arg, 0), fh: u64_at(arg, 8) }
            }
            opcode::STATX => {
                need("fuse_statx_in", arg, 24)?;
                Request::Statx { flags: u32_at(arg, 0), fh: u64_at(arg, 8), mask: u32_at(arg, 20) }
            }
            opcode::SETATTR => {
                need("fuse_setattr_in", arg, 88)?;
                Request::Setattr(SetattrIn {
                    valid: u32_at(arg, 0),
                    fh: u64_at(arg, 8),
                    size: u64_at(arg, 16),
                    atime: u64_at(arg, 32) as i64,
                    mtime: u64_at(arg, 40) as i64,
                    ctime: u64_at(arg, 48) as i64,
                    atimensec: u32_at(arg, 56),
                    mtimensec: u32_at(arg, 60),
                    ctimensec: u32_at(arg, 64),
                    mode: u32_at(arg, 68),
                    uid: u32_at(arg, 76),
                    gid: u32_at(arg, 80),
                })
            }
            opcode::READLINK => Request::Readlink,
            opcode::SYMLINK => {
                let (name, target) = two_names("SYMLINK", rest)?;
                Request::Symlink { name, target }
            }
            opcode::MKNOD => {
                need("fuse_mknod_in", arg, 16)?;
                Request::Mknod {
                    mode: u32_at(arg, 0),
                    rdev: u32_at(arg, 4),
                    umask: u32_at(arg, 8),
                    name: cstr("MKNOD", rest)?,
                }
            }
            opcode::MKDIR => {
                need("fuse_mkdir_in", arg, 8)?;
                Request::Mkdir { mode: u32_at(arg, 0), umask: u32_at(arg, 4), name: cstr("MKDIR", rest)? }
            }
            opcode::RMDIR => Request::Rmdir { name: cstr("RMDIR", rest)? },
            opcode::RENAME => {
                need("fuse_rename_in", arg, 8)?;
                let (name, newname) = two_names("RENAME", rest)?;
                Request::Rename { newdir: u64_at(arg, 0), flags: 0, name, newname }
            }
            opcode::RENAME2 => {
                need("fuse_rename2_in", arg, 16)?;
                let (name, newname) = two_names("RENAME2", rest)?;
                Request::Rename { newdir: u64_at(arg, 0), flags: u32_at(arg, 8), name, newname }
            }
            opcode::LINK => {
                need("fuse_link_in", arg, 8)?;
                Request::Link { oldnodeid: u64_at(arg, 0), name: cstr("LINK", rest)? }
            }
            opcode::OPEN => {
                need("fuse_open_in", arg, 8)?;
                Request::Open { flags: u32_at(arg, 0) }
            }
            opcode::CREATE => {
                need("fuse_create_in", arg, 16)?;
                Request::Create {
                    flags: u32_at(arg, 0),
                    mode: u32_at(arg, 4),
                    umask: u32_at(arg, 8),
                    name: cstr("CREATE", rest)?,
                }
            }
            opcode::TMPFILE => {
                need("fuse_create_in", arg, 16)?;
                Request::Tmpfile { flags: u32_at(arg, 0), mode: u32_at(arg, 4), umask: u32_at(arg, 8) }
            }
            opcode::READ => {
                need("fuse_read_in", arg, 24)?;
                // The file's open flags follow (offset 32) from protocol 7.9 on.
                let flags = if arg.len() >= 36 { u32_at(arg, 32) } else { 0 };
                Request::Read { fh: u64_at(arg, 0), offset: u64_at(arg, 8), size: u32_at(arg, 16), flags }
            }
            opcode::WRITE => {
                need("fuse_write_in", arg, 24)?;
                let size = u32_at(arg, 16) as usize;
                need("WRITE data", rest, size)?;
                Request::Write {
                    fh: u64_at(arg, 0),
                    offset: u64_at(arg, 8),
                    write_flags: u32_at(arg, 20),
                    flags: if arg.len() >= 40 { u32_at(arg, 32) } else { 0 },
                    data: &rest[..size],
                }
            }
            opcode::FLUSH => {
                need("fuse_flush_in", arg, 24)?;
                Request::Flush { fh: u64_at(arg, 0), lock_owner: u64_at(arg, 16) }
            }
            opcode::RELEASE => {
                need("fuse_release_in", arg, 16)?;
                Request::Release { fh: u64_at(arg, 0), flags: u32_at(arg, 8), release_flags: u32_at(arg, 12) }
            }
            opcode::FSYNC | opcode::FSYNCDIR => {
                need("fuse_fsync_in", arg, 16)?;
                Request::Fsync { fh: u64_at(arg, 0), fsync_flags: u32_at(arg, 8), dir: opcode == opcode::FSYNCDIR }
            }
            opcode::UNLINK => Request::Unlink { name: cstr("UNLINK", rest)? },
            opcode::SETXATTR => {
                need("fuse_setxattr_in", arg, 8)?;
                let size = u32_at(arg, 0) as usize;
                let name = cstr("SETXATTR", rest)?;
                let value = &rest[name.len() + 1..];
                need("SETXATTR value", value, size)?;
                Request::Setxattr { flags: u32_at(arg, 4), name, value: &value[..size] }
            }
            opcode::GETXATTR => {
                need("fuse_getxattr_in", arg, 8)?;
                Request::Getxattr { size: u32_at(arg, 0), name: cstr("GETXATTR", rest)? }
            }
            opcode::LISTXATTR => {
                need("fuse_getxattr_in", arg, 8)?;
                Request::Listxattr { size: u32_at(arg, 0) }
            }
            opcode::REMOVEXATTR => Request::Removexattr { name: cstr("REMOVEXATTR", rest)? },
            opcode::OPENDIR => {
                need("fuse_open_in", arg, 8)?;
                Request::Opendir { flags: u32_at(arg, 0) }
            }
            opcode::READDIR | opcode::READDIRPLUS => {
                need("fuse_read_in", arg, 24)?;
                Request::Readdir {
                    fh: u64_at(arg, 0),
                    offset: u64_at(arg, 8),
                    size: u32_at(arg, 16),
                    plus: opcode == opcode::READDIRPLUS,
                }
            }
            opcode::RELEASEDIR => {
                need("fuse_release_in", arg, 8)?;
                Request::Releasedir { fh: u64_at(arg, 0) }
            }
            opcode::ACCESS => {
                need("fuse_access_in", arg, 8)?;
                Request::Access { mask: u32_at(arg, 0) }
            }
            opcode::FALLOCATE => {
                need("fuse_fallocate_in", arg, 28)?;
                Request::Fallocate {
                    fh: u64_at(arg, 0),
                    offset: u64_at(arg, 8),
                    length: u64_at(arg, 16),
                    mode: u32_at(arg, 24),
                }
            }
            opcode::LSEEK => {
                need("fuse_lseek_in", arg, 20)?;
                Request::Lseek { fh: u64_at(arg, 0), offset: u64_at(arg, 8), whence: u32_at(arg, 16) }
            }
            opcode::COPY_FILE_RANGE => {
                need("fuse_copy_file_range_in", arg, 48)?;
                Request::CopyFileRange {
                    off_in: u64_at(arg, 8),
                    nodeid_out: u64_at(arg, 16),
                    off_out: u64_at(arg, 32),
                    len: u64_at(arg, 40),
                }
            }
            opcode::IOCTL => {
                need("fuse_ioctl_in", arg, 32)?;
                let in_size = u32_at(arg, 24) as usize;
                need("IOCTL data", rest, in_size)?;
                Request::Ioctl {
                    fh: u64_at(arg, 0),
                    flags: u32_at(arg, 8),
                    cmd: u32_at(arg, 12),
                    out_size: u32_at(arg, 28),
                    data: &rest[..in_size],
                }
            }
            opcode::STATFS => Request::Statfs,
            opcode::DESTROY => Request::Destroy,
            // fuse_syncfs_in is one u64 of padding, which 6.18 does not always send.
            opcode::SYNCFS => Request::Syncfs,
            opcode::INTERRUPT => {
                need("fuse_interrupt_in", arg, 8)?;
                Request::Interrupt { unique: u64_at(arg, 0) }
            }
            other => Request::Other(other),
        })
    }

    /// Whether the kernel waits for no reply to this request.
    pub fn no_reply(&self) -> bool {
        matches!(self, Request::Forget { .. } | Request::BatchForget(_) | Request::Interrupt { .. })
    }
}
