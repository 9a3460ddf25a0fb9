//! The `fuser::Filesystem` over a [`Volume`]: FUSE requests to volume calls, errors to
//! errnos, attributes to `FileAttr`s. No filesystem rule lives here.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};

// The frontend sees only the library's public API.
use crate::{Attr, Caller, Error, FileType, NewNode, Result, SetAttr, SetTime, Time, Volume, XattrMode};

use super::lookups::LookupCounts;
use super::stats::{Op, RequestStats};
use super::{FuseOptions, ReaddirPlus};

/// The `fuser::Filesystem` over a volume.
pub struct DxFuse {
    vol: Arc<Volume>,
    /// The volume's root inode, which FUSE calls 1.
    root: u64,
    opts: FuseOptions,
    /// Lookup counts handed to the kernel and not yet forgotten.
    lookups: LookupCounts,
    /// Requests served, per opcode.
    stats: RequestStats,
    /// Ranges of files written with O_DIRECT, whose pages the kernel may still cache:
    /// sent to a thread that tells the kernel to drop them (see `write`).
    invalidate: Invalidations,
}

/// Where `write` sends (node id, offset, length) of a direct write once the session
/// exists; empty until then.
pub type Invalidations = Arc<std::sync::OnceLock<std::sync::mpsc::Sender<(u64, i64, i64)>>>;

/// The root directory's virtual xattr that holds the mount's request counters as JSON
/// (`dxfs stats MOUNTPOINT` reads it). Not stored, not listed; setting it is refused.
pub const STATS_XATTR: &str = "user.dxfs.stats";

impl Drop for DxFuse {
    fn drop(&mut self) {
        match self.lookups.outstanding() {
            (0, _) => tracing::info!("lookup counts balanced: the kernel forgot every inode it was given"),
            // The kernel drops its references without FORGETs at unmount: not a fault.
            (n, refs) => tracing::debug!("lookup counts unbalanced: {n} inodes ({refs} references) never forgotten"),
        }
        tracing::info!("requests served: {}", self.stats.summary());
    }
}

const FUSE_ROOT: u64 = 1;
/// Entries fetched from the volume per batch while filling a readdir reply.
const READDIR_BATCH: usize = 256;
/// readdirplus entries are about five times bigger, so fetch fewer to waste less.
const READDIRPLUS_BATCH: usize = 64;

fn errno_of(op: &str, e: &Error) -> Errno {
    if matches!(e, Error::Io(_) | Error::Corrupt(_)) {
        tracing::error!("{op}: {e}");
    }
    Errno::from_i32(e.errno())
}

fn system_time(t: Time) -> SystemTime {
    let (secs, nanos) = t;
    let d = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::new(secs as u64, 0))
    } else {
        UNIX_EPOCH.checked_sub(Duration::new(secs.unsigned_abs(), 0))
    };
    d.and_then(|d| d.checked_add(Duration::from_nanos(u64::from(nanos)))).unwrap_or(UNIX_EPOCH)
}

/// A time from a request. fuser 0.18 turns the kernel's (-s, ns) into the epoch minus
/// (s + ns) rather than minus (s - ns), so undo exactly that for times before 1970.
fn vol_time(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => (-(e.duration().as_secs() as i64), e.duration().subsec_nanos()),
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(vol_time(t)),
    }
}

fn kind(ft: FileType) -> fuser::FileType {
    match ft {
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::CharDevice => fuser::FileType::CharDevice,
        FileType::Directory => fuser::FileType::Directory,
        FileType::BlockDevice => fuser::FileType::BlockDevice,
        FileType::RegularFile => fuser::FileType::RegularFile,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::Socket => fuser::FileType::Socket,
    }
}

impl DxFuse {
    /// An adapter serving `vol`.
    pub fn new(vol: Arc<Volume>, opts: FuseOptions, invalidate: Invalidations) -> DxFuse {
        let root = vol.root();
        DxFuse { vol, root, opts, lookups: LookupCounts::default(), stats: RequestStats::default(), invalidate }
    }

    fn vol_ino(&self, ino: INodeNo) -> u64 {
        if ino.0 == FUSE_ROOT {
            self.root
        } else {
            ino.0
        }
    }

    fn fuse_ino(&self, ino: u64) -> INodeNo {
        INodeNo(if ino == self.root { FUSE_ROOT } else { ino })
    }

    /// Run a volume call. A panic in the volume is caught so the request still gets
    /// an answer (EIO); the volume is then poisoned so that nothing half-done reaches
    /// the disk.
    fn call<T>(&self, op: &str, f: impl FnOnce(&Volume) -> Result<T>) -> std::result::Result<T, Errno> {
        match catch_unwind(AssertUnwindSafe(|| f(&self.vol))) {
            Ok(r) => r.map_err(|e| errno_of(op, &e)),
            Err(_) => {
                tracing::error!("{op}: panic in the volume layer; no further changes will be committed");
                self.vol.poison();
                Err(Errno::EIO)
            }
        }
    }

    fn attr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: self.fuse_ino(a.ino),
            size: a.size,
            blocks: a.blocks,
            atime: system_time(a.atime),
            mtime: system_time(a.mtime),
            ctime: system_time(a.ctime),
            crtime: system_time(a.crtime),
            kind: kind(a.kind),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Attributes for an entry whose inode cannot be read: its number and type only.
    fn placeholder_attr(&self, ino: u64, ft: FileType) -> FileAttr {
        FileAttr { ino: self.fuse_ino(ino), kind: kind(ft), nlink: 1, ..negative_attr() }
    }

    fn reply_entry(&self, reply: ReplyEntry, r: std::result::Result<Attr, Errno>) {
        match r {
            Ok(a) => {
                self.lookups.add(a.ino);
                reply.entry_with_ttls(
                    &self.opts.attr_timeout,
                    &self.opts.entry_timeout,
                    &self.attr(&a),
                    Generation(u64::from(a.generation)),
                )
            }
            Err(e) => reply.error(e),
        }
    }

    fn reply_empty(reply: ReplyEmpty, r: std::result::Result<(), Errno>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// Open flags for files: no FLUSH on close (flush has nothing to do), and keep the
    /// page cache across opens (every change goes through this mount).
    fn open_flags() -> FopenFlags {
        FopenFlags::FOPEN_NOFLUSH | FopenFlags::FOPEN_KEEP_CACHE
    }
}

fn xattr_reply(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if data.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

impl Filesystem for DxFuse {
    fn init(&mut self, _req: &Request, cfg: &mut KernelConfig) -> io::Result<()> {
        let mut want = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_MAX_PAGES
            // Symlinks never change, so the kernel may keep their targets.
            | InitFlags::FUSE_CACHE_SYMLINKS

            // The daemon drops setuid/setgid bits and file capabilities on write,
            // truncate and chown itself: the kernel then marks inodes S_NOSEC and stops
            // asking for security.capability (one GETXATTR) before every write.
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            // File handles (name_to_handle_at, open_by_handle_at, NFS export): node ids
            // are inode numbers and carry their generation, so a handle stays valid across
            // remounts and turns stale (ESTALE) once its inode slot is reused.
            | InitFlags::FUSE_EXPORT_SUPPORT;
        match self.opts.readdirplus {
            ReaddirPlus::Auto => want |= InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO,
            ReaddirPlus::Always => want |= InitFlags::FUSE_DO_READDIRPLUS,
            ReaddirPlus::Never => {}
        }
        if self.opts.writeback_cache {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        // POSIX_ACL makes the kernel enforce ACLs, and it turns default_permissions on,
        // so it is only asked for when permissions are the kernel's job anyway.
        // DONT_MASK hands the umask to the volume, which ignores it when a default ACL
        // is inherited, as POSIX says.
        if self.opts.default_permissions {
            want |= InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
        }
        // One at a time, so one missing capability does not cost the others.
        for f in want.iter() {
            if cfg.add_capabilities(f).is_err() {
                tracing::info!("kernel lacks FUSE capability {f:?}");
            }
        }
        // max_write stays at fuser's 16 MiB: the kernel clamps requests to
        // fs.fuse.max_pages_limit pages (256, 1 MiB, by default). More background
        // requests keep readahead and async writes flowing.
        let _ = cfg.set_max_background(64);
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.call("sync", |v| v.shutdown()) {
            tracing::error!("commit at unmount failed: {e:?}");
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _t = self.stats.timer(Op::Forget);
        self.lookups.forget(self.vol_ino(ino), nlookup);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.stats.timer(Op::Lookup);
        let p = self.vol_ino(parent);
        if name.as_bytes() == b"." {
            // Only sent to decode a file handle (fs/fuse/inode.c, fuse_get_dentry): the
            // node itself, whatever its type; a freed one is ENOENT, which the kernel
            // turns into ESTALE.
            let r = self.call("lookup", |v| v.getattr(p));
            return self.reply_entry(reply, r);
        }
        match self.call("lookup", |v| v.lookup(p, name.as_bytes())) {
            // A miss answered as node 0 with a timeout is a negative entry the kernel
            // caches: the next lookup of the name (every create's O_EXCL check, a PATH
            // search) costs no request. Coherent because every change comes through this
            // mount, and the kernel drops the negative entry when it creates the name.
            Err(Errno::ENOENT) if !self.opts.negative_timeout.is_zero() => {
                reply.entry_with_ttls(&Duration::ZERO, &self.opts.negative_timeout, &negative_attr(), Generation(0))
            }
            r => self.reply_entry(reply, r),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.stats.timer(Op::Getattr);
        let ino = self.vol_ino(ino);
        match self.call("getattr", |v| v.getattr(ino)) {
            Ok(a) => reply.attr(&self.opts.attr_timeout, &self.attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _t = self.stats.timer(Op::Setattr);
        // The kernel applies the setuid/setgid clearing rules of chown to `mode`; with
        // HANDLE_KILLPRIV_V2 a truncate's are the volume's (fuser does not pass the
        // kernel's FATTR_KILL_SUIDGID, so CAP_FSETID is taken to mean root). An
        // ftruncate's handle names the same inode, which stays alive while open.
        let ino = self.vol_ino(ino);
        let s = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime: ctime.map(vol_time),
            drop_privileges: req.uid() != 0,
        };
        match self.call("setattr", |v| v.setattr(ino, &s)) {
            Ok(a) => reply.attr(&self.opts.attr_timeout, &self.attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _t = self.stats.timer(Op::Readlink);
        let ino = self.vol_ino(ino);
        match self.call("readlink", |v| v.readlink(ino)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let _t = self.stats.timer(Op::Mknod);
        let p = self.vol_ino(parent);
        let (uid, gid) = (req.uid(), req.gid());
        let r = self
            .call("mknod", |v| v.make(p, name.as_bytes(), NewNode { mode, uid, gid, rdev: u64::from(rdev), umask }));
        self.reply_entry(reply, r);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let _t = self.stats.timer(Op::Mkdir);
        let p = self.vol_ino(parent);
        let (uid, gid) = (req.uid(), req.gid());
        let mode = libc::S_IFDIR | (mode & 0o7777);
        let r = self.call("mkdir", |v| v.make(p, name.as_bytes(), NewNode { mode, uid, gid, rdev: 0, umask }));
        self.reply_entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.stats.timer(Op::Unlink);
        let p = self.vol_ino(parent);
        Self::reply_empty(reply, self.call("unlink", |v| v.unlink(p, name.as_bytes())));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.stats.timer(Op::Rmdir);
        let p = self.vol_ino(parent);
        Self::reply_empty(reply, self.call("rmdir", |v| v.rmdir(p, name.as_bytes())));
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let _t = self.stats.timer(Op::Symlink);
        let p = self.vol_ino(parent);
        let (uid, gid) = (req.uid(), req.gid());
        let r = self.call("symlink", |v| v.symlink(p, link_name.as_bytes(), target.as_os_str().as_bytes(), uid, gid));
        self.reply_entry(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.timer(Op::Rename);
        let f = crate::RenameFlags {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
            whiteout: flags.contains(RenameFlags::RENAME_WHITEOUT),
        };
        let (p, np) = (self.vol_ino(parent), self.vol_ino(newparent));
        let r = self.call("rename", |v| v.rename(p, name.as_bytes(), np, newname.as_bytes(), f));
        Self::reply_empty(reply, r);
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let _t = self.stats.timer(Op::Link);
        let (ino, np) = (self.vol_ino(ino), self.vol_ino(newparent));
        self.reply_entry(reply, self.call("link", |v| v.link(ino, np, newname.as_bytes())));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.stats.timer(Op::Open);
        // Counting the handle keeps an unlinked file alive until its release.
        let ino = self.vol_ino(ino);
        match self.call("open", |v| v.open_file(ino)) {
            Ok(_) => reply.opened(FileHandle(0), Self::open_flags()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _t = self.stats.timer(Op::Read);
        let ino = self.vol_ino(ino);
        match self.call("read", |v| v.read(ino, offset, size as usize)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _t = self.stats.timer(Op::Write);
        let fuse_ino = ino;
        let ino = self.vol_ino(ino);
        // With HANDLE_KILLPRIV_V2 the kernel says when the writer lacks CAP_FSETID.
        let r = if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            self.call("write", |v| v.write_unprivileged(ino, offset, data))
        } else {
            self.call("write", |v| v.write(ino, offset, data))
        };
        match r {
            Ok(n) => {
                reply.written(n as u32);
                // The kernel's asynchronous direct-I/O path (AIO with O_DIRECT) does not
                // drop the pages other descriptors cached for the range, so buffered
                // reads would see the old data. Drop them, from another thread: the
                // kernel may wait for a page lock held by a reader this thread serves.
                if flags.0 & libc::O_DIRECT != 0 {
                    if let Some(tx) = self.invalidate.get() {
                        let _ = tx.send((fuse_ino.0, offset as i64, n as i64));
                    }
                }
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        let _t = self.stats.timer(Op::Flush);
        // Writes are never deferred past the volume, so there is nothing to flush.
        // ENOSYS tells the kernel to stop sending FLUSH at all (with the writeback cache
        // it ignores FOPEN_NOFLUSH), saving a round trip per close.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.timer(Op::Release);
        let ino = self.vol_ino(ino);
        Self::reply_empty(reply, self.call("release", |v| v.release(ino)));
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let _t = self.stats.timer(Op::Fsync);
        let ino = self.vol_ino(ino);
        Self::reply_empty(reply, self.call("fsync", |v| v.fsync(ino)));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.stats.timer(Op::Opendir);
        // Directory handles carry no state (readdir positions are stable cookies), but an
        // open directory must outlive its last link, as a file does: fstat on a directory
        // removed or renamed over while open still works. So OPENDIR and RELEASEDIR are
        // not switched off (FUSE_NO_OPENDIR_SUPPORT would save their round trips).
        let ino = self.vol_ino(ino);
        match self.call("opendir", |v| v.open_file(ino)) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        let _t = self.stats.timer(Op::Releasedir);
        let ino = self.vol_ino(ino);
        Self::reply_empty(reply, self.call("releasedir", |v| v.release(ino)));
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let _t = self.stats.timer(Op::Readdir);
        let ino = self.vol_ino(ino);
        let mut pos = offset;
        loop {
            let batch = match self.call("readdir", |v| v.readdir(ino, pos, READDIR_BATCH)) {
                Ok(b) => b,
                Err(e) => return reply.error(e),
            };
            for e in &batch {
                let name = OsStr::from_bytes(&e.name);
                if reply.add(self.fuse_ino(e.ino), e.next, kind(e.ft), name) {
                    return reply.ok();
                }
                pos = e.next;
            }
            if batch.len() < READDIR_BATCH {
                return reply.ok();
            }
        }
    }

    fn readdirplus(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let _t = self.stats.timer(Op::Readdirplus);
        // Every entry but . and .. counts as a lookup.
        let ino = self.vol_ino(ino);
        let mut pos = offset;
        loop {
            let batch = match self.call("readdirplus", |v| v.readdir_plus(ino, pos, READDIRPLUS_BATCH)) {
                Ok(b) => b,
                Err(e) => return reply.error(e),
            };
            for (e, a) in &batch {
                // An entry whose inode could not be read goes out with placeholder
                // attributes valid for no time: the name lists, and any access asks again
                // (LOOKUP, GETATTR), which fails with EIO. (Node 0 would be the protocol's
                // "no attributes", but fuser sends it as d_ino 0 too, which readdir(3)
                // skips as a deleted entry.)
                let (attr, generation, ttl) = match a {
                    Some(a) => (self.attr(a), a.generation, self.opts.entry_timeout),
                    None => (self.placeholder_attr(e.ino, e.ft), 0, Duration::ZERO),
                };
                let full = reply.add(
                    attr.ino,
                    e.next,
                    OsStr::from_bytes(&e.name),
                    &ttl,
                    &attr,
                    Generation(u64::from(generation)),
                );
                if full {
                    return reply.ok();
                }
                if e.name != b"." && e.name != b".." {
                    self.lookups.add(e.ino);
                }
                pos = e.next;
            }
            if batch.len() < READDIRPLUS_BATCH {
                return reply.ok();
            }
        }
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let _t = self.stats.timer(Op::Fsyncdir);
        let ino = self.vol_ino(ino);
        Self::reply_empty(reply, self.call("fsyncdir", |v| v.fsync(ino)));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _t = self.stats.timer(Op::Statfs);
        match self.call("statfs", |v| Ok(v.statfs())) {
            Ok(s) => reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.timer(Op::Setxattr);
        if self.vol_ino(ino) == self.root && name.as_bytes() == STATS_XATTR.as_bytes() {
            return reply.error(Errno::EPERM);
        }
        let mode = match flags & (libc::XATTR_CREATE | libc::XATTR_REPLACE) {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        let ino = self.vol_ino(ino);
        // Who sets an access ACL decides whether the setgid bit stays (the only rule
        // that needs the caller; the groups come from /proc, so only then).
        let r = if name.as_bytes() == b"system.posix_acl_access" {
            let caller = caller_of(req);
            self.call("setxattr", |v| v.setxattr_as(ino, name.as_bytes(), value, mode, &caller))
        } else {
            self.call("setxattr", |v| v.setxattr(ino, name.as_bytes(), value, mode))
        };
        Self::reply_empty(reply, r);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = self.stats.timer(Op::Getxattr);
        let ino = self.vol_ino(ino);
        if ino == self.root && name.as_bytes() == STATS_XATTR.as_bytes() {
            return xattr_reply(reply, size, self.stats.json().as_bytes());
        }
        match self.call("getxattr", |v| v.getxattr(ino, name.as_bytes())) {
            Ok(val) => xattr_reply(reply, size, &val),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = self.stats.timer(Op::Listxattr);
        let ino = self.vol_ino(ino);
        match self.call("listxattr", |v| v.listxattr(ino)) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                xattr_reply(reply, size, &buf);
            }
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.stats.timer(Op::Removexattr);
        let ino = self.vol_ino(ino);
        Self::reply_empty(reply, self.call("removexattr", |v| v.removexattr(ino, name.as_bytes())));
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _t = self.stats.timer(Op::Access);
        // Only called without default_permissions; the volume decides.
        let ino = self.vol_ino(ino);
        let caller = caller_of(req);
        let want = (mask.bits() & 7) as u32;
        Self::reply_empty(reply, self.call("access", |v| v.access(ino, &caller, want)));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let _t = self.stats.timer(Op::Create);
        // O_EXCL and O_TRUNC are the kernel's: it looks the name up first and sends
        // CREATE only for a missing name, then a SETATTR for a truncate.
        let p = self.vol_ino(parent);
        let (uid, gid) = (req.uid(), req.gid());
        let mode = libc::S_IFREG | (mode & 0o7777);
        let r = self.call("create", |v| v.make_open(p, name.as_bytes(), NewNode { mode, uid, gid, rdev: 0, umask }));
        match r {
            Ok(a) => {
                self.lookups.add(a.ino);
                reply.created(
                    &self.opts.entry_timeout,
                    &self.attr(&a),
                    Generation(u64::from(a.generation)),
                    FileHandle(0),
                    Self::open_flags(),
                )
            }
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _t = self.stats.timer(Op::Fallocate);
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        const ZERO_KEEP: i32 = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        const COLLAPSE: i32 = libc::FALLOC_FL_COLLAPSE_RANGE;
        const INSERT: i32 = libc::FALLOC_FL_INSERT_RANGE;
        let ino = self.vol_ino(ino);
        let (o, n) = (offset, length);
        let r = match mode {
            0 => self.call("fallocate", |v| v.fallocate(ino, o, n, false, false)),
            KEEP => self.call("fallocate", |v| v.fallocate(ino, o, n, true, false)),
            PUNCH => self.call("fallocate", |v| v.fallocate(ino, o, n, true, true)),
            ZERO => self.call("fallocate", |v| v.zero_range(ino, o, n, false)),
            ZERO_KEEP => self.call("fallocate", |v| v.zero_range(ino, o, n, true)),
            COLLAPSE => self.call("fallocate", |v| v.collapse_range(ino, o, n)),
            INSERT => self.call("fallocate", |v| v.insert_range(ino, o, n)),
            _ => Err(Errno::EOPNOTSUPP),
        };
        Self::reply_empty(reply, r);
    }

    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _t = self.stats.timer(Op::CopyFileRange);
        let (src, dst) = (self.vol_ino(ino_in), self.vol_ino(ino_out));
        // The reply counts bytes in 32 bits.
        let len = len.min(u64::from(u32::MAX) & !0xfff);
        match self.call("copy_file_range", |v| v.copy_range(src, offset_in, dst, offset_out, len)) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }
}

/// The identity of a request's caller: its user and group from the request, its
/// supplementary groups from /proc (the protocol does not carry them).
fn caller_of(req: &Request) -> Caller {
    let groups = std::fs::read_to_string(format!("/proc/{}/status", req.pid()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Groups:"))
                .map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        })
        .unwrap_or_default();
    Caller { uid: req.uid(), gid: req.gid(), groups }
}

/// The attributes sent with a negative entry (node 0): the kernel looks at none of them.
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}
