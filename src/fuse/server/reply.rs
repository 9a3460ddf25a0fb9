//! Volume results to replies: errnos (a damaged record logged once), `fuse_attr`s, and
//! the entry, attribute, statx, open, create and xattr-size replies.

use crate::fuse::transport::Reply;
use crate::fuse::wire::{self, fopen, EntryOut, OpenOut, Valid};
use crate::{Attr, Error, FileType, SetTime, Time};

use super::{Res, Server};

pub(super) fn errno_of(op: u32, e: &Error) -> i32 {
    if matches!(e, Error::Io(_) | Error::Corrupt(_)) && first_time(e) {
        tracing::error!("request {op}: {e}");
    }
    e.errno()
}

/// Whether error `e` is logged for the first time: a damaged record is named once, not
/// at every request that meets it (a listing of a damaged directory would repeat it at
/// every READDIR). At most `LOGGED_KEPT` are remembered, then everything is logged.
pub(super) fn first_time(e: &Error) -> bool {
    const LOGGED_KEPT: usize = 4096;
    static LOGGED: std::sync::Mutex<Option<std::collections::HashSet<String>>> = std::sync::Mutex::new(None);
    let mut g = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    let set = g.get_or_insert_with(Default::default);
    set.len() >= LOGGED_KEPT || set.insert(e.to_string())
}

pub(super) fn fuse_attr(ino: u64, a: &Attr) -> wire::Attr {
    // Times before 1970 go out as the kernel reads them: seconds as a signed number.
    let t = |t: Time| (t.0 as u64, t.1);
    let ((atime, atimensec), (mtime, mtimensec), (ctime, ctimensec)) = (t(a.atime), t(a.mtime), t(a.ctime));
    wire::Attr {
        ino,
        size: a.size,
        blocks: a.blocks,
        atime,
        mtime,
        ctime,
        atimensec,
        mtimensec,
        ctimensec,
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

/// The `DT_*` type of a directory entry.
pub(super) fn dtype(ft: FileType) -> u32 {
    (match ft {
        FileType::Fifo => libc::DT_FIFO,
        FileType::CharDevice => libc::DT_CHR,
        FileType::Directory => libc::DT_DIR,
        FileType::BlockDevice => libc::DT_BLK,
        FileType::RegularFile => libc::DT_REG,
        FileType::Symlink => libc::DT_LNK,
        FileType::Socket => libc::DT_SOCK,
    }) as u32
}

pub(super) fn set_time(now: bool, secs: i64, nsecs: u32) -> SetTime {
    if now {
        SetTime::Now
    } else {
        SetTime::At((secs, nsecs))
    }
}

pub(super) fn xattr_reply(size: u32, data: &[u8]) -> Reply {
    if size == 0 {
        let mut out = Vec::with_capacity(8);
        wire::encode_size_out(data.len() as u32, &mut out);
        Reply::Data(out)
    } else if data.len() > size as usize {
        Reply::Error(libc::ERANGE)
    } else {
        Reply::Data(data.to_vec())
    }
}

pub(super) fn done(r: Res<()>) -> Reply {
    match r {
        Ok(()) => Reply::Data(Vec::new()),
        Err(e) => Reply::Error(e),
    }
}

impl Server {
    pub(super) fn entry_out(&self, a: &Attr) -> EntryOut {
        let ino = self.fuse_ino(a.ino);
        EntryOut {
            nodeid: ino,
            generation: u64::from(a.generation),
            entry_valid: Valid::from(self.opts.entry_timeout),
            attr_valid: self.attr_valid(a.ino),
            attr: fuse_attr(ino, a),
        }
    }

    /// An entry reply, counted as a lookup the kernel will FORGET.
    pub(super) fn entry(&self, r: Res<Attr>) -> Reply {
        match r {
            Ok(a) => {
                self.lookups.add(a.ino);
                let mut out = Vec::with_capacity(EntryOut::SIZE);
                self.entry_out(&a).encode(&mut out);
                Reply::Data(out)
            }
            Err(e) => Reply::Error(e),
        }
    }

    pub(super) fn attr(&self, r: Res<Attr>) -> Reply {
        match r {
            Ok(a) => {
                let mut out = Vec::with_capacity(wire::AttrOut::SIZE);
                let ino = self.fuse_ino(a.ino);
                wire::AttrOut { attr_valid: self.attr_valid(a.ino), attr: fuse_attr(ino, &a) }.encode(&mut out);
                Reply::Data(out)
            }
            Err(e) => Reply::Error(e),
        }
    }

    /// GETATTR's answer and the birth time (STATX).
    pub(super) fn statx(&self, r: Res<Attr>) -> Reply {
        match r {
            Ok(a) => {
                let mut out = Vec::with_capacity(wire::StatxOut::SIZE);
                // Device numbers come as MKNOD gave them (the kernel's 32-bit encoding).
                let rdev = a.rdev as libc::dev_t;
                wire::StatxOut {
                    attr_valid: self.attr_valid(a.ino),
                    attr: fuse_attr(self.fuse_ino(a.ino), &a),
                    btime: (a.crtime.0 as u64, a.crtime.1),
                    rdev_major: libc::major(rdev),
                    rdev_minor: libc::minor(rdev),
                }
                .encode(&mut out);
                Reply::Data(out)
            }
            Err(e) => Reply::Error(e),
        }
    }

    /// Open flags for files: no FLUSH on close (flush has nothing to do), and keep the
    /// page cache across opens (every change goes through this mount; see `file_open`).
    pub(super) fn open_reply(fh: u64, open_flags: u32) -> Reply {
        let mut out = Vec::with_capacity(OpenOut::SIZE);
        OpenOut { fh, open_flags }.encode(&mut out);
        Reply::Data(out)
    }

    /// The reply to CREATE and TMPFILE: the entry (a lookup reference) and the open file.
    pub(super) fn created(&self, r: Res<Attr>, flags: u32) -> Reply {
        match r {
            Ok(a) => {
                self.lookups.add(a.ino);
                // With zero-message opens the kernel sends no RELEASE once an OPEN was
                // refused, also for handles made by CREATE before: the file lives by the
                // kernel's reference instead, as one opened without a message does.
                let (fh, open_flags) = if self.zero_message_open(false) {
                    (0, fopen::NOFLUSH | fopen::KEEP_CACHE)
                } else {
                    self.file_open(a.ino, flags)
                };
                let mut out = Vec::with_capacity(EntryOut::SIZE + OpenOut::SIZE);
                self.entry_out(&a).encode(&mut out);
                OpenOut { fh, open_flags }.encode(&mut out);
                Reply::Data(out)
            }
            Err(e) => Reply::Error(e),
        }
    }
}
