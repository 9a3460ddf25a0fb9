//! With the writeback cache: the room kept for the kernel's dirty pages (the cushion),
//! the near-full mode that sends writers past the page cache, and the count of files
//! open for writing it needs (docs/DESIGN.md, "The writeback cache").

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::fuse::dirty_bound::DirtyBound;
use crate::fuse::wire::{self, fopen, Valid};

use super::{Server, COUNTED, FIRST_CALL_SERVING, PUT_OFF, SERVING};

/// [`COUNTED`], for a file open for writing (the writeback cache's near-full checks).
pub(super) const COUNTED_WRITE: u64 = 3;

/// Room kept beyond the kernel's dirty limit near full: a write() admitted by one check
/// may dirty this much before the kernel throttles it (dd's 1 MiB, with margin).
pub(super) const NEAR_FULL_SLACK: u64 = 4 << 20;

impl Server {
    /// The writeback cache is on, and `bound` says how much of this mount's file data
    /// the kernel may hold dirty.
    pub(in crate::fuse) fn set_dirty_bound(&self, bound: Arc<DirtyBound>) {
        let _ = self.bound.set(bound);
        self.keep_cushion();
    }

    /// Keep the cushion and the slack free for the kernel's write-back: no other change
    /// may take them (`Volume::keep_for_write_back`), so whatever a write() was let into
    /// the page cache can land, and ENOSPC comes to every writer at one point, which is
    /// also where `df` shows no room. Follows the cushion as the bound changes level.
    pub(super) fn keep_cushion(&self) {
        let want = self.cushion() + NEAR_FULL_SLACK;
        if self.kept.load(Ordering::Relaxed) != want && self.kept.swap(want, Ordering::SeqCst) != want {
            self.vol.keep_for_write_back(want);
        }
    }

    /// Bytes kept free for the kernel's dirty pages (0 without the writeback cache).
    pub(super) fn cushion(&self) -> u64 {
        self.bound.get().map_or(0, |b| b.cushion())
    }

    /// Space the volume can still take, in bytes.
    /// Bytes that can be written now: not counting what files removed moments ago will
    /// give back (a file still open through a zero-message open may hold it for long,
    /// and the kernel's cache must never take more than can land).
    pub(super) fn available(&self) -> u64 {
        let s = self.vol.statfs();
        (s.bavail + s.kept).saturating_sub(s.settling) * u64::from(s.bsize)
    }

    /// With the writeback cache, the kernel takes a write() into its page cache without
    /// asking, so ENOSPC could only come at write-back, after write() succeeded. So the
    /// volume keeps room for everything the kernel may hold dirty (the cushion), and
    /// once free space comes within two cushions of the end ("near full"): new opens
    /// for writing bypass the cache (FOPEN_DIRECT_IO: their writes are exact), the
    /// kernel's attributes of files already open for writing are dropped and given out
    /// with no validity, so each write() into them asks first (GETATTR with their
    /// handle), and that GETATTR fails with ENOSPC once less than a cushion is left.
    /// Called after writes and at opens; returns whether the volume is near full.
    pub(super) fn near_full_check(&self) -> bool {
        let Some(bound) = self.bound.get() else { return false };
        let available = self.available();
        // The kernel's bound shrinks as the volume fills (and grows as it empties).
        bound.adjust(available, NEAR_FULL_SLACK);
        self.keep_cushion();
        let near = available < 2 * bound.cushion() + NEAR_FULL_SLACK;
        if near && !self.near_full.swap(true, Ordering::SeqCst) {
            tracing::info!("volume near full: writes through the page cache now ask first");
            let mut writers: Vec<u64> = Vec::new();
            self.writers.each_locked(|w| writers.extend(w.keys().copied()));
            if let Some(tx) = &*self.invalidate.lock() {
                for ino in writers {
                    // Offset -1: the attributes only, not the cached pages.
                    self.lookups.touched(ino);
                    let _ = tx.send(wire::notify_inval_inode(self.fuse_ino(ino), -1, 0));
                }
            }
        } else if !near && self.near_full.load(Ordering::Relaxed) {
            // Written only when it changes: every WRITE comes here, from every CPU.
            self.near_full.store(false, Ordering::SeqCst);
        }
        near
    }

    /// A directory quota is a limit the page cache knows nothing of either: the same
    /// near-full rule, per file, with the room its quotas leave (`Volume::quota_room`).
    /// Once a file open for writing comes within two cushions of a limit, its attributes
    /// are dropped and given out with no validity, so each write() into it asks first;
    /// new opens bypass the cache. Returns the room, when the file is that near.
    pub(super) fn quota_near_check(&self, ino: u64) -> Option<u64> {
        let bound = self.bound.get()?;
        if !self.vol.has_quotas() {
            return None;
        }
        let room = self.vol.quota_room(ino).ok()??;
        let near = room < 2 * bound.cushion() + NEAR_FULL_SLACK;
        if !near {
            if self.quota_near.shard(ino).remove(&ino) {
                tracing::debug!("file {ino}: away from its quota's limit again");
            }
            return None;
        }
        let writer = self.writers.shard(ino).contains_key(&ino);
        if writer && self.quota_near.shard(ino).insert(ino) {
            if let Some(tx) = &*self.invalidate.lock() {
                self.lookups.touched(ino);
                let _ = tx.send(wire::notify_inval_inode(self.fuse_ino(ino), -1, 0));
            }
        }
        Some(room)
    }

    /// A quota was set: files already open for writing below it may now be near its
    /// limit, with pages in the cache the volume has not seen.
    pub(super) fn quota_set(&self) {
        let mut writers: Vec<u64> = Vec::new();
        self.writers.each_locked(|w| writers.extend(w.keys().copied()));
        for ino in writers {
            self.quota_near_check(ino);
        }
    }

    /// Whether a write() into the cache of `ino` (open for writing) is to be refused,
    /// and with which error: ENOSPC when the volume is near full and less than a cushion
    /// is left, EDQUOT when a quota above it is that near.
    pub(super) fn cached_write_refused(&self, ino: u64) -> Option<i32> {
        if self.near_full_check() && self.available() < self.cushion() + NEAR_FULL_SLACK {
            return Some(libc::ENOSPC);
        }
        match self.quota_near_check(ino) {
            Some(room) if room < self.cushion() + NEAR_FULL_SLACK => Some(libc::EDQUOT),
            _ => None,
        }
    }

    /// How long the kernel may keep a file's attributes: not at all for a file open for
    /// writing while the volume, or a quota above it, is near full (see
    /// `near_full_check`, `quota_near_check`).
    pub(super) fn attr_valid(&self, ino: u64) -> Valid {
        let writer = || self.writers.shard(ino).contains_key(&ino);
        let quota_near = || self.vol.has_quotas() && self.quota_near.shard(ino).contains(&ino);
        if (self.near_full.load(Ordering::Relaxed) || quota_near()) && writer() {
            return Valid::from(Duration::ZERO);
        }
        Valid::from(self.opts.attr_timeout)
    }

    /// Open flags and handle of a file open: the kernel's pages are kept (every change
    /// goes through this mount), and a writer near full bypasses the cache; the writer
    /// is noted.
    pub(super) fn file_open(&self, ino: u64, flags: u32) -> (u64, u32) {
        let write = flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32;
        let mut open_flags = fopen::NOFLUSH | fopen::KEEP_CACHE;
        if !write {
            return (COUNTED, open_flags);
        }
        *self.writers.shard(ino).entry(ino).or_insert(0) += 1;
        if self.bound.get().is_some_and(|b| b.cushion() > 0) {
            // Files removed moments before may be about to give their space back: when
            // the volume looks near full only without it, wait for them once before
            // judging, which also raises the kernel's bound again. Never on a serving
            // thread (the FORGETs come through them): the request was put off to a kept
            // thread (see `serve`), or, if files were removed since, the open judges
            // without them and bypasses the cache, which is only slower.
            if !SERVING.get() && self.open_waits_for_settling(flags) {
                self.vol.settle_unlinked();
            }
            if self.near_full_check() || self.quota_near_check(ino).is_some() {
                open_flags |= fopen::DIRECT_IO;
            }
        }
        (COUNTED_WRITE, open_flags)
    }

    /// Whether an open with `flags` would wait for files removed moments ago (see
    /// `file_open`): for writing, with the writeback cache, on a volume that looks near
    /// full only until their space comes back.
    pub(super) fn open_waits_for_settling(&self, flags: u32) -> bool {
        if flags & libc::O_ACCMODE as u32 == libc::O_RDONLY as u32 {
            return false;
        }
        let Some(bound) = self.bound.get().filter(|b| b.cushion() > 0) else { return false };
        let s = self.vol.statfs();
        let near = |avail: u64| avail * u64::from(s.bsize) < 2 * bound.cushion() + NEAR_FULL_SLACK;
        let room = s.bavail + s.kept;
        s.settling > 0 && near(room.saturating_sub(s.settling)) && !near(room)
    }

    /// Whether a request about to open a file with `flags` is to be put off to a kept
    /// thread, which may wait for files removed moments ago (see `file_open`): on a
    /// serving thread, before anything was done.
    pub(super) fn put_off_open(&self, flags: u32) -> bool {
        let put_off = SERVING.get() && FIRST_CALL_SERVING.get() && self.open_waits_for_settling(flags);
        if put_off {
            PUT_OFF.set(true);
        }
        put_off
    }

    /// A file handle from `file_open` is released.
    pub(super) fn file_closed(&self, ino: u64, fh: u64) {
        if fh == COUNTED_WRITE {
            let mut w = self.writers.shard(ino);
            if let Some(n) = w.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    w.remove(&ino);
                    self.quota_near.shard(ino).remove(&ino);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::sync::atomic::Ordering;

    use super::super::{Reply, Server};
    use crate::block::MemDevice;
    use crate::fuse::dirty_bound::DirtyBound;
    use crate::fuse::transport::Handler;
    use crate::fuse::wire::opcode;
    use crate::fuse::wire::{fopen, InHeader, Request};
    use crate::fuse::FuseOptions;
    use crate::volume::{mkfs, MkfsOptions};
    use crate::Volume;

    fn header(opcode: u32, nodeid: u64) -> InHeader {
        InHeader { opcode, unique: 1, nodeid, ..InHeader::default() }
    }

    /// A write-open on a volume that looks near full only until a file removed moments
    /// ago is let go would wait for that file's FORGET (at most 200 ms), which only the
    /// serving threads deliver: a serving thread puts it off to a kept thread instead,
    /// and goes on answering; the kept thread's answer comes after the wait.
    #[test]
    fn a_write_open_waiting_for_a_removed_file_is_put_off() {
        let dev = Arc::new(MemDevice::new(16384));
        mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        let vol = Arc::new(Volume::open(dev, crate::OpenOptions::default()).unwrap());
        let server = Server::new(vol.clone(), FuseOptions::default());
        // Near full below 2 × 8 MiB + 4 MiB; 12 MiB kept for write-back.
        server.set_dirty_bound(DirtyBound::fixed(8 << 20));
        let root = vol.root();
        let big = vol.create(root, b"big", 0o644, 0, 0).unwrap().ino;
        vol.write(big, 0, &vec![1u8; 20 << 20]).unwrap();
        let w = vol.create(root, b"w", 0o644, 0, 0).unwrap().ino;
        vol.sync().unwrap();
        let s = vol.statfs();
        let room = (s.bavail + s.kept) * 4096;
        let filler = vol.create(root, b"filler", 0o644, 0, 0).unwrap().ino;
        vol.write(filler, 0, &vec![2u8; (room - (14 << 20)) as usize]).unwrap();
        vol.sync().unwrap();
        // The kernel looks `big` up (a reference it holds), then it is removed.
        let lookup = |name: &[u8]| {
            let r = server.handle_unless_it_waits(&header(opcode::LOOKUP, 1), &Request::Lookup { name }, false);
            assert!(matches!(r, Some(Reply::Data(_))), "LOOKUP answered at once");
        };
        lookup(b"big");
        let r = server.handle_unless_it_waits(&header(opcode::UNLINK, 1), &Request::Unlink { name: b"big" }, false);
        assert!(matches!(r, Some(Reply::Data(_)) | Some(Reply::None)), "UNLINK answered");
        assert!(vol.statfs().settling > 0, "big is settling");
        assert!(server.open_waits_for_settling(libc::O_WRONLY as u32));
        assert!(!server.open_waits_for_settling(libc::O_RDONLY as u32), "a reader never waits");
        let open = Request::Open { flags: libc::O_WRONLY as u32 };
        let oh = header(opcode::OPEN, server.fuse_ino(w));
        // A serving thread puts the open off, having done nothing, and answers the next
        // request at once.
        assert!(server.handle_unless_it_waits(&oh, &open, false).is_none(), "open put off");
        assert_eq!(server.stats.writes_waited.load(Ordering::Relaxed), 1);
        lookup(b"w");
        // The kept thread answers it, after the wait: near full without big's blocks, so
        // the open bypasses the kernel's cache.
        match server.handle(&oh, &open, false) {
            Reply::Data(d) => {
                let flags = u32::from_le_bytes(d[8..12].try_into().unwrap());
                assert!(flags & fopen::DIRECT_IO != 0, "open flags {flags:#x}");
            }
            _ => panic!("open refused"),
        }
    }
}
