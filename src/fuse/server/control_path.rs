//! The control path's requests (`fuse::control`), served as the caller: a step of a
//! whole-tree job (`dxfs rm -r`, `dxfs du`) and an import batch (`dxfs cp -a`, `dxfs
//! import`); and the record of names a LOOKUP missed, which an import must drop from
//! the kernel's cache.

use crate::fuse::transport::Reply;
use crate::fuse::wire::{self, InHeader};
use crate::Caller;

use super::{caller_of, put_off, Res, Server, FIRST_CALL_SERVING, SERVING};

/// Callers of the control path by thread, user and group, with when their groups were
/// read.
pub(super) type RecentCallers = rustc_hash::FxHashMap<(u32, u32, u32), (Caller, std::time::Instant)>;

/// Entries of an import batch a serving thread makes before it hands the rest to a kept
/// thread, so that other requests on its queue wait ~0.3 ms at most.
pub(super) const IMPORT_INLINE: usize = 32;

/// Most misses one shard of `Server::negatives` remembers.
pub(super) const NEGATIVES_PER_SHARD: usize = 4096;

/// A name's hash for `Server::negatives` (a collision only drops a cached entry more).
pub(super) fn name_hash(name: &[u8]) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(name)
}

impl Server {
    /// A LOOKUP of `name` in directory `dir` missed, and the kernel caches the miss.
    pub(super) fn note_negative(&self, dir: u64, name: &[u8]) {
        let now = std::time::Instant::now();
        let key = (dir, name_hash(name));
        let mut m = self.negatives.shard(dir);
        if m.len() >= NEGATIVES_PER_SHARD && !m.contains_key(&key) {
            let ttl = self.opts.negative_timeout;
            m.retain(|_, at| now.duration_since(*at) < ttl);
            if m.len() >= NEGATIVES_PER_SHARD {
                m.clear();
                *self.negatives_lost.lock() = Some(now);
            }
        }
        m.insert(key, now);
    }

    /// Whether the kernel may hold `name` in directory `dir` as missing: a LOOKUP of it
    /// missed within `negative_timeout` (or that record was lost). A name made behind the
    /// kernel's back (an import) must then be dropped from its cache.
    pub(super) fn may_hold_negative(&self, dir: u64, name: &[u8]) -> bool {
        let ttl = self.opts.negative_timeout;
        !ttl.is_zero() && self.missed_since(dir, name, std::time::Instant::now().checked_sub(ttl))
    }

    /// Whether a LOOKUP of `name` in `dir` missed at or after `since` (None: ever), as
    /// far as `negatives` remembers.
    pub(super) fn missed_since(&self, dir: u64, name: &[u8], since: Option<std::time::Instant>) -> bool {
        let after = |at: &std::time::Instant| since.is_none_or(|t| *at >= t);
        self.negatives.shard(dir).get(&(dir, name_hash(name))).is_some_and(after)
            || self.negatives_lost.lock().as_ref().is_some_and(after)
    }

    /// The caller of a control ioctl. Its supplementary groups come from
    /// `/proc/PID/status`, whose rendering costs ~25 µs, as much as the rest of an
    /// import batch's overhead; a command sends thousands of requests a second, so the
    /// groups read for the same thread, user and group are kept for `CALLER_FOR` (at
    /// most 64 callers). A thread that drops a group with setgroups(2) and keeps its ids
    /// may be judged with it that long.
    pub(super) fn control_caller(&self, h: &InHeader) -> Caller {
        const CALLER_FOR: std::time::Duration = std::time::Duration::from_millis(100);
        let now = std::time::Instant::now();
        let key = (h.pid, h.uid, h.gid);
        if let Some((c, at)) = self.callers.lock().get(&key) {
            if now.duration_since(*at) < CALLER_FOR {
                return c.clone();
            }
        }
        let c = caller_of(h);
        let mut callers = self.callers.lock();
        if callers.len() >= 64 {
            callers.retain(|_, (_, at)| now.duration_since(*at) < CALLER_FOR);
            if callers.len() >= 64 {
                callers.clear();
            }
        }
        callers.insert(key, (c.clone(), now));
        c
    }

    /// The control path (`control.rs`): one step of a whole-tree job on directory `ino`,
    /// as the caller: emptying it (`dxfs rm -r`) or summing it (`dxfs du`).
    pub(super) fn ioctl(
        &self,
        op: u32,
        h: &InHeader,
        ino: u64,
        (flags, cmd, out_size): (u32, u32, u32),
        data: &[u8],
    ) -> Reply {
        use crate::fuse::control::{StepRequest, CONTROL_SIZE, IOC_EMPTY_STEP, IOC_IMPORT, IOC_SUM_STEP};
        if !(cmd == IOC_EMPTY_STEP || cmd == IOC_SUM_STEP || cmd == IOC_IMPORT) || flags & wire::IOCTL_DIR == 0 {
            return Reply::Error(libc::ENOTTY);
        }
        if cmd == IOC_IMPORT {
            return self.import(op, h, ino, out_size, data);
        }
        let Some(req) = StepRequest::decode(data) else { return Reply::Error(libc::EINVAL) };
        if (out_size as usize) < CONTROL_SIZE {
            return Reply::Error(libc::EINVAL);
        }
        let caller = self.control_caller(h);
        // A summing step read-locks the inodes it lists: a few thousand at most.
        let max = req.max.clamp(1, 4096) as usize;
        let body = if cmd == IOC_EMPTY_STEP {
            self.empty_step(op, h, ino, &caller, req.from, max)
        } else {
            self.sum_step(op, ino, &caller, req.from, max)
        };
        match body {
            Ok(body) => {
                let mut out = Vec::with_capacity(16 + body.len());
                wire::encode_ioctl_out(0, &body, &mut out);
                Reply::Data(out)
            }
            Err(e) => Reply::Error(e),
        }
    }

    /// One step of emptying a directory. The kernel is told to drop every removed name
    /// it may hold (it holds a dentry only for an inode it has looked up) and the
    /// attributes of the removed inodes and of the directory, before the reply, so the
    /// caller's next look sees what `rm` would have left.
    pub(super) fn empty_step(
        &self,
        op: u32,
        h: &InHeader,
        ino: u64,
        caller: &Caller,
        from: u64,
        max: usize,
    ) -> Res<Vec<u8>> {
        use crate::fuse::control::EmptyReply;
        let step = self.call(op, |v| v.empty_step(ino, caller, from, max, EmptyReply::ROOM))?;
        for (name, child, links) in &step.removed {
            if !self.lookups.holds(*child) {
                continue;
            }
            if *links == 0 {
                // One message: the kernel drops the name and sets the inode's links to 0.
                self.send_notification(&wire::notify_delete(h.nodeid, self.node_id(*child), name));
            } else {
                self.send_notification(&wire::notify_inval_entry(h.nodeid, name));
                self.send_notification(&wire::notify_inval_inode(self.node_id(*child), -1, 0));
            }
        }
        if !step.removed.is_empty() {
            self.send_notification(&wire::notify_inval_inode(h.nodeid, -1, 0));
        }
        let reply = EmptyReply {
            next: step.next,
            done: step.done,
            removed: step.removed.len() as u32,
            subdirs: step.subdirs.into_iter().map(|(n, _)| n).collect(),
            failed: step.failed.iter().map(|(n, e)| (e.errno(), n.clone())).collect(),
        };
        Ok(reply.encode())
    }

    /// A batch of entries made in directory `ino` as the caller (`dxfs cp -a`, `dxfs
    /// import`). Served where it arrives, each entry without waiting for room; the rest
    /// of the batch goes to a kept thread at the first entry that would wait, or at once
    /// when the kernel may hold one of its names as missing: that name is then dropped
    /// from its cache, which takes the directory's lock in the kernel. The directory's
    /// attributes are dropped before the reply (no lock for that).
    pub(super) fn import(&self, op: u32, h: &InHeader, ino: u64, out_size: u32, data: &[u8]) -> Reply {
        use crate::fuse::control::{encode_import_reply, ImportBatch};
        let Some(entries) = ImportBatch::decode(data) else { return Reply::Error(libc::EINVAL) };
        if (out_size as usize) < 4 + 4 * entries.len() {
            return Reply::Error(libc::EINVAL);
        }
        let serving = SERVING.get();
        let cached_missing: Vec<bool> = entries.iter().map(|e| self.may_hold_negative(ino, e.name)).collect();
        if serving && cached_missing.contains(&true) {
            return put_off();
        }
        let caller = self.control_caller(h);
        let begun = if serving { None } else { self.imports_begun.lock().remove(&h.unique) };
        let (began, mut errnos) = begun.unwrap_or_else(|| (std::time::Instant::now(), Vec::new()));
        FIRST_CALL_SERVING.with(|c| c.set(false));
        for (e, missing) in entries.iter().zip(&cached_missing).skip(errnos.len()) {
            let r = if serving {
                if errnos.len() == IMPORT_INLINE {
                    self.imports_begun.lock().insert(h.unique, (began, errnos));
                    return put_off();
                }
                match self.call(op, |v| v.try_import_entry(ino, &e.entry(), &caller)) {
                    Ok(None) => {
                        self.imports_begun.lock().insert(h.unique, (began, errnos));
                        return put_off();
                    }
                    r => r.map(drop),
                }
            } else {
                self.call(op, |v| v.import_entry(ino, &e.entry(), &caller)).map(drop)
            };
            match r {
                Ok(()) => {
                    errnos.push(0);
                    if *missing {
                        self.send_notification(&wire::notify_inval_entry(h.nodeid, e.name));
                    }
                }
                Err(errno) => errnos.push(errno),
            }
        }
        if errnos.contains(&0) {
            self.drop_attrs_now(h.nodeid);
        }
        // A LOOKUP that missed meanwhile may have left a name made here cached as missing:
        // dropped by the invalidator thread, which may wait for the directory's lock.
        if !self.opts.negative_timeout.is_zero() {
            if let Some(tx) = &*self.invalidate.lock() {
                for ((e, errno), missing) in entries.iter().zip(&errnos).zip(&cached_missing) {
                    if *errno == 0 && !missing && self.missed_since(ino, e.name, Some(began)) {
                        let _ = tx.send(wire::notify_inval_entry(h.nodeid, e.name));
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(16 + 4 + 4 * errnos.len());
        wire::encode_ioctl_out(0, &encode_import_reply(&errnos), &mut out);
        Reply::Data(out)
    }

    /// One step of summing a directory (`du`).
    pub(super) fn sum_step(&self, op: u32, ino: u64, caller: &Caller, from: u64, max: usize) -> Res<Vec<u8>> {
        use crate::fuse::control::SumReply;
        let s = self.call(op, |v| v.sum_step(ino, caller, from, max, SumReply::ROOM))?;
        let reply = SumReply {
            next: s.next,
            done: s.done,
            files: s.files,
            blocks: s.blocks,
            bytes: s.bytes,
            linked: s.linked,
            subdirs: s.subdirs.into_iter().map(|(n, _)| n).collect(),
            unreadable: s.unreadable,
        };
        Ok(reply.encode())
    }
}
