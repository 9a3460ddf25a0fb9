//! A request to volume calls: the dispatch (`serve`), and the requests that take more
//! than one call or a choice (lookup, setattr, write, readdir, setxattr, fallocate).

use std::sync::atomic::Ordering;

use crate::fuse::transport::Reply;
use crate::fuse::wire::{self, fattr, EntryOut, InHeader, Request, StatfsOut, Valid};
use crate::{Attr, NewNode, RenameFlags, SetAttr, WriteAs, XattrMode};

use super::near_full::COUNTED_WRITE;
use super::reply::{done, dtype, set_time, xattr_reply};
use super::{caller_of, kernel_reads_ahead, Server, COUNTED, STATS_XATTR};

/// Entries fetched from the volume per batch while filling a readdir reply.
pub(super) const READDIR_BATCH: usize = 256;

/// readdirplus entries are about five times bigger, so fetch fewer to waste less.
pub(super) const READDIRPLUS_BATCH: usize = 64;

impl Server {
    pub(super) fn lookup(&self, op: u32, parent: u64, name: &[u8]) -> Reply {
        if name == b"." {
            // Only sent to decode a file handle (fs/fuse/inode.c, fuse_get_dentry): the
            // node itself, whatever its type; a freed one is ENOENT, which the kernel
            // turns into ESTALE.
            return self.entry(self.call(op, |v| v.getattr(parent)));
        }
        match self.call(op, |v| v.lookup(parent, name)) {
            // A miss answered as node 0 with a timeout is a negative entry the kernel
            // caches: the next lookup of the name (every create's O_EXCL check, a PATH
            // search) costs no request. Coherent because every change comes through this
            // mount, and the kernel drops the negative entry when it creates the name.
            Err(libc::ENOENT) if !self.opts.negative_timeout.is_zero() => {
                self.note_negative(self.vol_ino(parent), name);
                let mut out = Vec::with_capacity(EntryOut::SIZE);
                EntryOut { entry_valid: Valid::from(self.opts.negative_timeout), ..EntryOut::default() }
                    .encode(&mut out);
                Reply::Data(out)
            }
            r => self.entry(r),
        }
    }

    pub(super) fn setattr(&self, op: u32, ino: u64, s: &wire::SetattrIn) -> Reply {
        let has = |f: u32| s.valid & f != 0;
        // The kernel applies the setuid/setgid clearing rules of chown to `mode`; with
        // HANDLE_KILLPRIV_V2 it says when a truncating caller lacks CAP_FSETID. An
        // ftruncate's handle names the same inode, which stays alive while open.
        let set = SetAttr {
            mode: has(fattr::MODE).then_some(s.mode & 0o7777),
            uid: has(fattr::UID).then_some(s.uid),
            gid: has(fattr::GID).then_some(s.gid),
            size: has(fattr::SIZE).then_some(s.size),
            atime: has(fattr::ATIME).then(|| set_time(has(fattr::ATIME_NOW), s.atime, s.atimensec)),
            mtime: has(fattr::MTIME).then(|| set_time(has(fattr::MTIME_NOW), s.mtime, s.mtimensec)),
            ctime: has(fattr::CTIME).then_some((s.ctime, s.ctimensec)),
            drop_privileges: has(fattr::KILL_SUIDGID),
        };
        self.attr(self.call(op, |v| v.setattr(ino, &set)))
    }

    pub(super) fn new_node(h: &InHeader, mode: u32, rdev: u64, umask: u32) -> NewNode {
        NewNode { mode, uid: h.uid, gid: h.gid, rdev, umask }
    }

    /// A WRITE; with `wait` false, `None` if it would have to wait for room in the delta
    /// (nothing answered: it is to be served again, waiting).
    pub(super) fn write(
        &self,
        h: &InHeader,
        offset: u64,
        write_flags: u32,
        flags: u32,
        data: &[u8],
        wait: bool,
    ) -> Option<Reply> {
        let (op, ino) = (h.opcode, self.vol_ino(h.nodeid));
        // A direct write into a file the kernel may hold pages of: those pages are dropped
        // before the reply (see below), which may wait for a READ the serving threads
        // must answer, so a serving thread hands it to a kept thread.
        let drops_pages =
            flags & libc::O_DIRECT as u32 != 0 && write_flags & wire::WRITE_CACHE == 0 && self.lookups.may_cache(ino);
        if drops_pages && !wait {
            return None;
        }
        if write_flags & wire::WRITE_CACHE != 0 || flags & libc::O_DIRECT as u32 == 0 {
            // Written back, or through without the writeback cache: the page stays in the
            // kernel's cache, clean.
            self.lookups.note_cached(ino);
        }
        let how = WriteAs {
            // With HANDLE_KILLPRIV_V2 the kernel says when the writer lacks CAP_FSETID.
            unprivileged: write_flags & wire::WRITE_KILL_SUIDGID != 0,
            // With the writeback cache the kernel keeps the times of what it caches and
            // sends them itself (SETATTR); the write-back reaching us later is no change
            // of time. (Without it, a shared mmap's write-back is the only news of the
            // stores, and stamps the time.)
            keep_times: write_flags & wire::WRITE_CACHE != 0 && self.kernel_keeps_times.load(Ordering::Relaxed),
            // Pages the kernel accepted into its cache: they may use the room kept for
            // them (see `keep_cushion`).
            write_back: write_flags & wire::WRITE_CACHE != 0,
        };
        let r = if wait {
            self.call(op, |v| v.write_with(ino, offset, data, how).map(Some))
        } else {
            self.call(op, |v| v.try_write(ino, offset, data, how))
        };
        Some(match r {
            Ok(None) => return None,
            Ok(Some(n)) => {
                if how.unprivileged {
                    self.drop_privileges_after(h, ino, false);
                }
                self.near_full_check();
                self.quota_near_check(ino);
                // The kernel's asynchronous direct-I/O path (AIO with O_DIRECT) does not
                // drop the pages other descriptors cached for the range once the write is
                // done, so buffered reads would see the old data. Drop them before the
                // reply, so that no read after the write completes can find them: this
                // runs on a kept thread (see above), and the kernel may wait here for a
                // page lock held by a reader that a serving thread answers meanwhile. Not
                // when the kernel cannot hold any (nothing of the file was read or written
                // back since it took the inode): the notification also drops the file's
                // attributes, and the next write() then asks for them and for
                // `security.capability` again, two more round trips per write.
                if drops_pages {
                    if let Some(dev) = self.notify.get() {
                        let msg = wire::notify_inval_inode(h.nodeid, offset as i64, n as i64);
                        if let Err(e) = std::io::Write::write_all(&mut &**dev, &msg) {
                            // ENOENT: the kernel holds no inode, so no pages either.
                            if e.raw_os_error() != Some(libc::ENOENT) {
                                tracing::debug!("dropping cached pages of node {}: {e}", h.nodeid);
                            }
                        }
                    }
                }
                let mut out = Vec::with_capacity(8);
                wire::encode_size_out(n as u32, &mut out);
                Reply::Data(out)
            }
            Err(e) => Reply::Error(e),
        })
    }

    pub(super) fn readdir(&self, op: u32, ino: u64, offset: u64, size: u32, plus: bool) -> Reply {
        let size = size as usize;
        let mut out = Vec::with_capacity(size.min(1 << 16));
        let mut pos = offset;
        let batch_len = if plus { READDIRPLUS_BATCH } else { READDIR_BATCH };
        loop {
            let batch: Vec<(crate::DirEntry, Option<Attr>)> = if plus {
                // Entries the kernel holds with valid attributes (looked up moments ago,
                // as `git status` does before it lists) need none: their inodes are not
                // read, and the kernel keeps what it has.
                let fresh = |i: u64| !self.near_full.load(Ordering::Relaxed) && self.lookups.fresh(i);
                match self.call(op, |v| v.readdir_plus_where(ino, pos, batch_len, &|i| !fresh(i))) {
                    Ok(b) => b,
                    Err(e) => return Reply::Error(e),
                }
            } else {
                match self.call(op, |v| v.readdir(ino, pos, batch_len)) {
                    Ok(b) => b.into_iter().map(|e| (e, None)).collect(),
                    Err(e) => return Reply::Error(e),
                }
            };
            for (e, a) in &batch {
                if out.len() + wire::dirent_size(e.name.len(), plus) > size {
                    return Reply::Data(out);
                }
                let fino = self.fuse_ino(e.ino);
                if plus {
                    let dots = e.name == b"." || e.name == b"..";
                    match a {
                        // Every entry but . and .. counts as a lookup.
                        Some(a) if !dots => {
                            self.lookups.add(e.ino);
                            self.entry_out(a).encode(&mut out);
                        }
                        // Node 0: no attributes for this entry (the kernel keeps what it
                        // holds; for an inode that cannot be read, any access then asks
                        // again and fails with EIO). The name still lists, with its inode
                        // number.
                        _ => {
                            if !dots {
                                self.stats.entries_without_attrs.fetch_add(1, Ordering::Relaxed);
                            }
                            EntryOut::default().encode(&mut out)
                        }
                    }
                }
                wire::encode_dirent(&mut out, fino, e.next, dtype(e.ft), &e.name);
                pos = e.next;
            }
            if batch.len() < batch_len {
                return Reply::Data(out);
            }
        }
    }

    pub(super) fn setxattr(&self, op: u32, h: &InHeader, ino: u64, flags: u32, name: &[u8], value: &[u8]) -> Reply {
        if ino == self.root && name == STATS_XATTR.as_bytes() {
            return Reply::Error(libc::EPERM);
        }
        // A quota binds the directory's owner too: only root sets or clears one.
        if name == crate::QUOTA_XATTR.as_bytes() && h.uid != 0 {
            return Reply::Error(libc::EPERM);
        }
        let mode = match flags as i32 & (libc::XATTR_CREATE | libc::XATTR_REPLACE) {
            0 => XattrMode::Any,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return Reply::Error(libc::EINVAL),
        };
        // Who sets an access ACL decides whether the setgid bit stays (the only rule
        // that needs the caller; the groups come from /proc, so only then).
        let r = if name == b"system.posix_acl_access" {
            let caller = caller_of(h);
            self.call(op, |v| v.setxattr_as(ino, name, value, mode, &caller))
        } else {
            self.call(op, |v| v.setxattr(ino, name, value, mode))
        };
        if r.is_ok() && name == crate::QUOTA_XATTR.as_bytes() {
            self.quota_set();
        }
        done(r)
    }

    pub(super) fn fallocate(&self, h: &InHeader, ino: u64, o: u64, n: u64, mode: u32) -> Reply {
        let op = h.opcode;
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        const ZERO_KEEP: i32 = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        const COLLAPSE: i32 = libc::FALLOC_FL_COLLAPSE_RANGE;
        const INSERT: i32 = libc::FALLOC_FL_INSERT_RANGE;
        let r = match mode as i32 {
            0 => self.call(op, |v| v.fallocate(ino, o, n, false, false)),
            KEEP => self.call(op, |v| v.fallocate(ino, o, n, true, false)),
            PUNCH => self.call(op, |v| v.fallocate(ino, o, n, true, true)),
            ZERO => self.call(op, |v| v.zero_range(ino, o, n, false)),
            ZERO_KEEP => self.call(op, |v| v.zero_range(ino, o, n, true)),
            COLLAPSE => self.call(op, |v| v.collapse_range(ino, o, n)),
            INSERT => self.call(op, |v| v.insert_range(ino, o, n)),
            _ => Err(libc::EOPNOTSUPP),
        };
        if r.is_ok() && h.uid != 0 {
            self.drop_privileges_after(h, ino, true);
        }
        done(r)
    }

    /// Drop what file `ino` grants after a change by a caller without CAP_FSETID
    /// (`Volume::drop_privileges_of`, which states the rule). After a FALLOCATE the
    /// kernel's `file_modified()` leaves all of it to a HANDLE_KILLPRIV_V2 server and says
    /// nothing of the caller (one other than root is taken as lacking CAP_FSETID; xfstests
    /// generic/683–685); after a WRITE it marks such a caller, and the volume has dropped
    /// all but a setgid the caller's groups decide. The caller's groups are read from /proc
    /// only when a setgid bit asks. Best effort, after the change.
    fn drop_privileges_after(&self, h: &InHeader, ino: u64, capability: bool) {
        let in_group = |gid: u32| gid == h.gid || super::caller_of(h).in_group(gid);
        if let Ok(true) = self.call(h.opcode, |v| v.drop_privileges_of(ino, &in_group, capability)) {
            // Changed behind the kernel's back: its cached mode must go (attributes
            // only, no pages, so nothing here waits for a page lock).
            self.send_notification(&wire::notify_inval_inode(h.nodeid, -1, 0));
        }
    }

    pub(super) fn serve(&self, h: &InHeader, req: &Request<'_>) -> Reply {
        let op = h.opcode;
        let ino = self.vol_ino(h.nodeid);
        match *req {
            Request::Forget { nlookup } => {
                self.forget(op, ino, nlookup);
                Reply::None
            }
            Request::BatchForget(ref list) => {
                for &(node, n) in list {
                    self.forget(op, self.vol_ino(node), n);
                }
                Reply::None
            }
            // Requests run to completion; an interrupt has nothing to stop.
            Request::Interrupt { .. } => Reply::None,
            Request::Lookup { name } => self.lookup(op, ino, name),
            // A write() into the page cache of a file open for writing asks this first
            // when the volume or a quota above it is near full: no room for the cushion,
            // no write.
            Request::Getattr { flags, fh } if flags & wire::GETATTR_FH != 0 && fh == COUNTED_WRITE => {
                match self.cached_write_refused(ino) {
                    Some(e) => Reply::Error(e),
                    None => self.attr(self.call(op, |v| v.getattr(ino))),
                }
            }
            Request::Getattr { .. } => self.attr(self.call(op, |v| v.getattr(ino))),
            Request::Statx { .. } => self.statx(self.call(op, |v| v.getattr(ino))),
            Request::Setattr(ref s) => self.setattr(op, ino, s),
            Request::Readlink => match self.call(op, |v| v.readlink(ino)) {
                Ok(t) => Reply::Data(t),
                Err(e) => Reply::Error(e),
            },
            Request::Mknod { mode, rdev, umask, name } => {
                let n = Self::new_node(h, mode, u64::from(rdev), umask);
                self.entry(self.call(op, |v| v.make(ino, name, n)))
            }
            Request::Mkdir { mode, umask, name } => {
                let n = Self::new_node(h, libc::S_IFDIR | (mode & 0o7777), 0, umask);
                self.entry(self.call(op, |v| v.make(ino, name, n)))
            }
            Request::Symlink { name, target } => {
                self.entry(self.call(op, |v| v.symlink(ino, name, target, h.uid, h.gid)))
            }
            Request::Unlink { name } => done(self.call(op, |v| v.unlink(ino, name))),
            Request::Rmdir { name } => done(self.call(op, |v| v.rmdir(ino, name))),
            Request::Rename { newdir, flags, name, newname } => {
                let f = RenameFlags {
                    noreplace: flags & libc::RENAME_NOREPLACE != 0,
                    exchange: flags & libc::RENAME_EXCHANGE != 0,
                    whiteout: flags & libc::RENAME_WHITEOUT != 0,
                };
                let np = self.vol_ino(newdir);
                done(self.call(op, |v| v.rename(ino, name, np, newname, f)))
            }
            Request::Link { oldnodeid, name } => {
                let old = self.vol_ino(oldnodeid);
                self.entry(self.call(op, |v| v.link(old, ino, name)))
            }
            // Zero-message opens: ENOSYS once and the kernel opens files by itself (the
            // inode lives by the kernel's lookup reference). Otherwise the handle is
            // counted, which keeps an unlinked file alive until its release.
            Request::Open { .. } if self.zero_message_open(false) => Reply::Error(libc::ENOSYS),
            Request::Open { flags } if self.put_off_open(flags) => Reply::None,
            Request::Open { flags } => match self.call(op, |v| v.open_file(ino)) {
                Ok(a) => {
                    // Reads served from the page cache never reach the volume, so an
                    // open for reading is the access atime records (relatime: once
                    // after each change). Dropping the cache instead made the kernel
                    // write back every dirty page of the file, one WRITE per page.
                    let reads = flags & libc::O_ACCMODE as u32 != libc::O_WRONLY as u32;
                    // While a writer has it open, the kernel keeps its times (writeback
                    // cache) and they may be later than the volume's.
                    let later = reads
                        && self.kernel_keeps_times.load(Ordering::Relaxed)
                        && self.writers.shard(ino).contains_key(&ino);
                    if reads && self.vol.read_touches_atime(&a, later) && self.vol.note_access(ino, later) {
                        self.drop_attrs_now(h.nodeid);
                    }
                    let (fh, open_flags) = self.file_open(ino, flags);
                    Self::open_reply(fh, open_flags)
                }
                Err(e) => Reply::Error(e),
            },
            Request::Create { flags, .. } | Request::Tmpfile { flags, .. } if self.put_off_open(flags) => Reply::None,
            Request::Create { mode, umask, name, flags } => {
                // O_EXCL and O_TRUNC are the kernel's: it looks the name up first and
                // sends CREATE only for a missing name, then a SETATTR for a truncate.
                // Under zero-message opens no handle is counted (see `created`).
                let n = Self::new_node(h, libc::S_IFREG | (mode & 0o7777), 0, umask);
                let held = self.zero_message_open(false);
                self.created(
                    self.call(op, |v| if held { v.make(ino, name, n) } else { v.make_open(ino, name, n) }),
                    flags,
                )
            }
            Request::Tmpfile { mode, umask, flags } => {
                // O_TMPFILE: an unnamed file, open; linkat(AT_EMPTY_PATH) names it (LINK).
                let n = Self::new_node(h, libc::S_IFREG | (mode & 0o7777), 0, umask);
                let held = self.zero_message_open(false);
                self.created(
                    self.call(op, |v| if held { v.make_tmpfile_held(ino, n) } else { v.make_tmpfile(ino, n) }),
                    flags,
                )
            }
            Request::Read { offset, size, flags, .. } => {
                self.lookups.note_cached(ino);
                match self.call(op, |v| v.read_aligned(ino, offset, size as usize, kernel_reads_ahead(flags))) {
                    Ok(d) => Reply::Aligned(d),
                    Err(e) => Reply::Error(e),
                }
            }
            Request::Write { offset, write_flags, flags, data, .. } => {
                self.write(h, offset, write_flags, flags, data, true).unwrap_or(Reply::Error(libc::EIO))
            }
            // Writes are never deferred past the volume, so there is nothing to flush.
            // ENOSYS tells the kernel to stop sending FLUSH at all (with the writeback
            // cache it ignores FOPEN_NOFLUSH), saving a round trip per close.
            Request::Flush { .. } => Reply::Error(libc::ENOSYS),
            // Only handles the volume counted (fh COUNTED) are released: after a zero-message
            // open the kernel may still send a RELEASE for the one open it tried.
            Request::Release { fh, .. } | Request::Releasedir { fh } if fh == COUNTED || fh == COUNTED_WRITE => {
                self.file_closed(ino, fh);
                done(self.call(op, |v| v.release(ino)))
            }
            Request::Release { .. } | Request::Releasedir { .. } => done(Ok(())),
            Request::Fsync { .. } => done(self.call(op, |v| v.fsync(ino))),
            // Directory handles carry no state (readdir positions are stable cookies); an
            // open directory outlives its name like a file, by the kernel's reference or,
            // without zero-message opens, by its counted handle.
            Request::Opendir { .. } if self.zero_message_open(true) => Reply::Error(libc::ENOSYS),
            Request::Opendir { .. } => match self.call(op, |v| v.open_file(ino)) {
                Ok(_) => Self::open_reply(COUNTED, 0),
                Err(e) => Reply::Error(e),
            },
            Request::Readdir { offset, size, plus, .. } => self.readdir(op, ino, offset, size, plus),
            // Files the kernel dropped at an unlink are freed by their FORGET, which may
            // still be on its way: `statfs` counts them as free (`StatFs::settling`) rather
            // than wait for a request that only these threads can serve.
            Request::Ioctl { flags, cmd, out_size, data, .. } => self.ioctl(op, h, ino, (flags, cmd, out_size), data),
            Request::Statfs => match self.call(op, |v| {
                // The cushion may have changed level since the last write: keep it first.
                self.keep_cushion();
                v.statfs_at(ino)
            }) {
                Ok(s) => {
                    let mut out = Vec::with_capacity(StatfsOut::SIZE);
                    StatfsOut {
                        blocks: s.blocks,
                        bfree: s.bfree,
                        bavail: s.bavail,
                        files: s.files,
                        ffree: s.ffree,
                        bsize: s.bsize,
                        namelen: s.namelen,
                        frsize: s.bsize,
                    }
                    .encode(&mut out);
                    Reply::Data(out)
                }
                Err(e) => Reply::Error(e),
            },
            Request::Setxattr { flags, name, value } => self.setxattr(op, h, ino, flags, name, value),
            Request::Getxattr { size, name } => {
                if ino == self.root && name == STATS_XATTR.as_bytes() {
                    let transport = self.transport_name();
                    return xattr_reply(size, self.stats.json(transport).as_bytes());
                }
                match self.call(op, |v| v.getxattr(ino, name)) {
                    Ok(val) => xattr_reply(size, &val),
                    Err(e) => Reply::Error(e),
                }
            }
            Request::Listxattr { size } => match self.call(op, |v| v.listxattr(ino)) {
                Ok(names) => {
                    let mut buf = Vec::new();
                    for n in names {
                        buf.extend_from_slice(&n);
                        buf.push(0);
                    }
                    xattr_reply(size, &buf)
                }
                Err(e) => Reply::Error(e),
            },
            Request::Removexattr { name } if name.eq(crate::QUOTA_XATTR.as_bytes()) && h.uid != 0 => {
                Reply::Error(libc::EPERM)
            }
            Request::Removexattr { name } => done(self.call(op, |v| v.removexattr(ino, name))),
            // Only sent without default_permissions; the volume decides.
            Request::Access { mask } => {
                let caller = caller_of(h);
                done(self.call(op, |v| v.access(ino, &caller, mask & 7)))
            }
            Request::Fallocate { offset, length, mode, .. } => self.fallocate(h, ino, offset, length, mode),
            Request::CopyFileRange { off_in, nodeid_out, off_out, len } => {
                let dst = self.vol_ino(nodeid_out);
                // The reply counts bytes in 32 bits.
                let len = len.min(u64::from(u32::MAX) & !0xfff);
                match self.call(op, |v| v.copy_range(ino, off_in, dst, off_out, len)) {
                    Ok(n) => {
                        let mut out = Vec::with_capacity(8);
                        wire::encode_size_out(n as u32, &mut out);
                        Reply::Data(out)
                    }
                    Err(e) => Reply::Error(e),
                }
            }
            // fuseblk and virtiofs only. A fuseblk mount's `umount` waits for this answer:
            // the volume is committed and let go of first, so when `umount` returns what
            // was written is on the device and the volume is free for fsck or a mount.
            Request::Destroy => match self.call(op, |v| v.unmount()) {
                Ok(()) => Reply::Data(Vec::new()),
                Err(e) => Reply::Error(e),
            },
            // `sync` and `syncfs` (fuseblk mounts only): commit, as `dxfs sync` does.
            Request::Syncfs => match self.call(op, |v| v.sync()) {
                Ok(()) => Reply::Data(Vec::new()),
                Err(e) => Reply::Error(e),
            },
            // INIT is answered by the session before any thread serves; everything else
            // (locks, poll, bmap, lseek) is left to the kernel's defaults or refused, as
            // ENOSYS tells it (an ioctl other than dxfs's own gets ENOTTY).
            Request::Init(_) | Request::Lseek { .. } | Request::Other(_) => Reply::Error(libc::ENOSYS),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::Server;
    use crate::block::MemDevice;
    use crate::fuse::transport::{Handler, Reply};
    use crate::fuse::wire::{opcode, InHeader, Request, ROOT_ID};
    use crate::fuse::FuseOptions;
    use crate::volume::{mkfs, MkfsOptions};
    use crate::Volume;

    fn server(opts: FuseOptions) -> (Arc<Volume>, Server) {
        let dev = Arc::new(MemDevice::new(4096));
        mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        let vol = Arc::new(Volume::open(dev, crate::OpenOptions::default()).unwrap());
        (vol.clone(), Server::new(vol, opts))
    }

    fn ask(s: &Server, opcode: u32, nodeid: u64, req: &Request<'_>) -> Reply {
        let h = InHeader { opcode, unique: 1, nodeid, pid: std::process::id(), ..InHeader::default() };
        s.handle(&h, req, false)
    }

    fn errno(r: Reply) -> i32 {
        match r {
            Reply::Error(e) => e,
            r => panic!("an error was expected, got {} bytes", r.body().len()),
        }
    }

    /// The node id an entry reply names.
    fn node(r: &Reply) -> u64 {
        u64::from_le_bytes(r.body()[..8].try_into().unwrap())
    }

    /// Requests become the volume's calls, node 1 is the volume's root, and the
    /// volume's errors come back as the kernel's errnos.
    #[test]
    fn requests_reach_the_volume_and_errors_come_back_as_errnos() {
        let (vol, s) = server(FuseOptions::default());
        let r = ask(&s, opcode::MKDIR, ROOT_ID, &Request::Mkdir { mode: 0o777, umask: 0o022, name: b"d" });
        let d = vol.lookup(vol.root(), b"d").unwrap();
        assert_eq!((node(&r), d.mode & 0o7777), (d.ino, 0o755), "the umask applies");
        assert_eq!(node(&ask(&s, opcode::LOOKUP, ROOT_ID, &Request::Lookup { name: b"d" })), d.ino);
        // A miss is a negative entry the kernel may cache (node 0), or ENOENT without
        // a negative timeout.
        assert_eq!(node(&ask(&s, opcode::LOOKUP, ROOT_ID, &Request::Lookup { name: b"none" })), 0);
        let (_, plain) = server(FuseOptions { negative_timeout: std::time::Duration::ZERO, ..FuseOptions::default() });
        assert_eq!(errno(ask(&plain, opcode::LOOKUP, ROOT_ID, &Request::Lookup { name: b"none" })), libc::ENOENT);
        let long = [b'x'; 256];
        let r = ask(&s, opcode::MKDIR, ROOT_ID, &Request::Mkdir { mode: 0o755, umask: 0, name: &long });
        assert_eq!(errno(r), libc::ENAMETOOLONG);
        let r = ask(&s, opcode::MKDIR, ROOT_ID, &Request::Mkdir { mode: 0o755, umask: 0, name: b"d" });
        assert_eq!(errno(r), libc::EEXIST);
        assert_eq!(errno(ask(&s, opcode::RMDIR, ROOT_ID, &Request::Rmdir { name: b"none" })), libc::ENOENT);
        assert_eq!(errno(ask(&s, opcode::UNLINK, ROOT_ID, &Request::Unlink { name: b"d" })), libc::EISDIR);
        assert!(matches!(ask(&s, opcode::RMDIR, ROOT_ID, &Request::Rmdir { name: b"d" }), Reply::Data(_)));
        assert!(vol.lookup(vol.root(), b"d").is_err());
    }

    /// xattr requests: a size probe, a short buffer, a missing name, and the mount's
    /// request counters, which are read on the root only and never set.
    #[test]
    fn xattr_requests_follow_the_kernels_size_protocol() {
        let (vol, s) = server(FuseOptions::default());
        let r = ask(&s, opcode::SETXATTR, ROOT_ID, &Request::Setxattr { flags: 0, name: b"user.k", value: b"value" });
        assert!(matches!(r, Reply::Data(_)));
        assert_eq!(vol.getxattr(vol.root(), b"user.k").unwrap(), b"value");
        let size = ask(&s, opcode::GETXATTR, ROOT_ID, &Request::Getxattr { size: 0, name: b"user.k" });
        assert_eq!(&size.body()[..4], &5u32.to_le_bytes(), "size 0 asks for the size");
        assert_eq!(
            errno(ask(&s, opcode::GETXATTR, ROOT_ID, &Request::Getxattr { size: 4, name: b"user.k" })),
            libc::ERANGE
        );
        assert_eq!(
            ask(&s, opcode::GETXATTR, ROOT_ID, &Request::Getxattr { size: 5, name: b"user.k" }).body(),
            b"value"
        );
        let r = ask(&s, opcode::GETXATTR, ROOT_ID, &Request::Getxattr { size: 64, name: b"user.none" });
        assert_eq!(errno(r), libc::ENODATA);
        let create = libc::XATTR_CREATE as u32;
        let r = ask(&s, opcode::SETXATTR, ROOT_ID, &Request::Setxattr { flags: create, name: b"user.k", value: b"v" });
        assert_eq!(errno(r), libc::EEXIST);
        s.transport.set("test".into()).unwrap();
        let stats = super::STATS_XATTR.as_bytes();
        let r = ask(&s, opcode::GETXATTR, ROOT_ID, &Request::Getxattr { size: 1 << 16, name: stats });
        assert!(r.body().starts_with(b"{"), "{:?}", String::from_utf8_lossy(r.body()));
        let r = ask(&s, opcode::SETXATTR, ROOT_ID, &Request::Setxattr { flags: 0, name: stats, value: b"{}" });
        assert_eq!(errno(r), libc::EPERM);
    }
}
