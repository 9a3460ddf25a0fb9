//! The request handler over a [`Volume`]: parsed FUSE requests ([`wire::Request`]) to
//! volume calls, [`Error`]s to errnos, attributes to `fuse_attr`s. No filesystem rule
//! lives here; the transports (`transport.rs`) carry the requests and replies.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

// The frontend sees only the library's public API.
use crate::{
    Attr, Caller, Error, FileType, NewNode, RenameFlags, Result, SetAttr, SetTime, Time, Volume, WriteAs, XattrMode,
};

use super::dirty_bound::DirtyBound;
use super::lookups::LookupCounts;
use super::stats::RequestStats;
use super::transport::{Handler, Reply};
use super::wire::{self, fattr, fopen, EntryOut, InHeader, OpenOut, Request, StatfsOut, Valid};
use super::FuseOptions;
use crate::engine::leaf::Sharded;

/// The root directory's virtual xattr that holds the mount's request counters as JSON
/// (`dxfs stats MOUNTPOINT` reads it). Not stored, not listed; setting it is refused.
pub const STATS_XATTR: &str = "user.dxfs.stats";

/// The file handle of an open the volume counted (OPEN, OPENDIR, CREATE, TMPFILE); its
/// RELEASE gives the count back. Zero-message opens have handle 0.
const COUNTED: u64 = 1;
/// [`COUNTED`], for a file open for writing (the writeback cache's near-full checks).
const COUNTED_WRITE: u64 = 3;
/// Room kept beyond the kernel's dirty limit near full: a write() admitted by one check
/// may dirty this much before the kernel throttles it (dd's 1 MiB, with margin).
const NEAR_FULL_SLACK: u64 = 4 << 20;

/// Entries fetched from the volume per batch while filling a readdir reply.
const READDIR_BATCH: usize = 256;
/// readdirplus entries are about five times bigger, so fetch fewer to waste less.
const READDIRPLUS_BATCH: usize = 64;

/// Where a direct write's (node id, offset, length) goes: a thread that tells the kernel to
/// drop those cached pages (see `write`).
/// Notifications the invalidator thread writes (encoded): those the kernel may make wait
/// for a lock that a request held up behind the sender holds.
pub(super) type Invalidations = Sender<Vec<u8>>;

/// Serves a volume's requests; shared by every serving thread.
pub(super) struct Server {
    vol: Arc<Volume>,
    /// The volume's root inode, which FUSE calls 1.
    root: u64,
    opts: FuseOptions,
    /// Lookup counts handed to the kernel and not yet forgotten; the volume asks them
    /// whether an inode that lost its last link is still in use.
    lookups: Arc<LookupCounts>,
    /// The kernel opens files without OPEN (NO_OPEN_SUPPORT was offered) and directories
    /// without OPENDIR (NO_OPENDIR_SUPPORT): set once INIT is answered.
    zero_message_open: [std::sync::atomic::AtomicBool; 2],
    /// Requests served, per opcode.
    pub(super) stats: RequestStats,
    invalidate: parking_lot::Mutex<Option<Invalidations>>,
    /// The connection's device, for notifications sent before a reply (see
    /// `drop_attrs_now`).
    notify: std::sync::OnceLock<Arc<std::fs::File>>,
    /// Which transport serves this mount (shown by `dxfs stats`).
    pub(super) transport: std::sync::OnceLock<String>,
    /// With the writeback cache: the most file data the kernel may hold dirty for this
    /// mount (its bdi's `max_bytes`), which the volume must always be able to take.
    /// None without the writeback cache.
    bound: std::sync::OnceLock<Arc<DirtyBound>>,
    /// Free space is within two cushions of the end (see `near_full_check`).
    near_full: AtomicBool,
    /// Bytes the volume keeps for the kernel's write-back (see `keep_cushion`).
    kept: AtomicU64,
    /// The kernel granted the writeback cache: it keeps the times of the files it caches.
    kernel_keeps_times: AtomicBool,
    /// Files open for writing, with their handle counts: sharded, since every write open
    /// and release looks here, and every read open with the writeback cache.
    writers: Sharded<rustc_hash::FxHashMap<u64, u32>>,
    /// The control path's recent callers, by thread and ids (see `control_caller`).
    callers: parking_lot::Mutex<RecentCallers>,
    /// Names a LOOKUP missed (directory, hash of the name), and when: the kernel may
    /// cache the miss for `negative_timeout` (see `may_hold_negative`).
    negatives: Sharded<rustc_hash::FxHashMap<(u64, u64), std::time::Instant>>,
    /// When a shard of `negatives` last overflowed and was cleared: until
    /// `negative_timeout` after, any name may be cached as missing.
    negatives_lost: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Import batches begun on a serving thread and handed to a kept thread: when they
    /// began and the answers so far, by request.
    imports_begun: parking_lot::Mutex<rustc_hash::FxHashMap<u64, (std::time::Instant, Vec<i32>)>>,
}

/// Callers of the control path by thread, user and group, with when their groups were
/// read.
type RecentCallers = rustc_hash::FxHashMap<(u32, u32, u32), (Caller, std::time::Instant)>;

/// Entries of an import batch a serving thread makes before it hands the rest to a kept
/// thread, so that other requests on its queue wait ~0.3 ms at most.
const IMPORT_INLINE: usize = 32;

/// Most misses one shard of `Server::negatives` remembers.
const NEGATIVES_PER_SHARD: usize = 4096;

type Res<T> = std::result::Result<T, i32>;

thread_local! {
    /// Set while a serving thread answers a request (`handle_unless_it_waits`): the
    /// request's first call into the volume must not wait for other requests. Taken by
    /// that call.
    static FIRST_CALL_SERVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// That call would have waited: nothing was done, and the request is answered again
    /// on a thread that may wait.
    static PUT_OFF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set for the whole of a request a serving thread answers and may put off.
    static SERVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn errno_of(op: u32, e: &Error) -> i32 {
    if matches!(e, Error::Io(_) | Error::Corrupt(_)) && first_time(e) {
        tracing::error!("request {op}: {e}");
    }
    e.errno()
}

/// Whether error `e` is logged for the first time: a damaged record is named once, not
/// at every request that meets it (a listing of a damaged directory would repeat it at
/// every READDIR). At most `LOGGED_KEPT` are remembered, then everything is logged.
fn first_time(e: &Error) -> bool {
    const LOGGED_KEPT: usize = 4096;
    static LOGGED: std::sync::Mutex<Option<std::collections::HashSet<String>>> = std::sync::Mutex::new(None);
    let mut g = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    let set = g.get_or_insert_with(Default::default);
    set.len() >= LOGGED_KEPT || set.insert(e.to_string())
}

fn fuse_attr(ino: u64, a: &Attr) -> wire::Attr {
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
fn dtype(ft: FileType) -> u32 {
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

fn set_time(now: bool, secs: i64, nsecs: u32) -> SetTime {
    if now {
        SetTime::Now
    } else {
        SetTime::At((secs, nsecs))
    }
}

fn xattr_reply(size: u32, data: &[u8]) -> Reply {
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

fn done(r: Res<()>) -> Reply {
    match r {
        Ok(()) => Reply::Data(Vec::new()),
        Err(e) => Reply::Error(e),
    }
}

impl Server {
    pub(super) fn new(vol: Arc<Volume>, opts: FuseOptions) -> Server {
        let root = vol.root();
        // Attributes handed out with an entry are left out of a READDIRPLUS for half
        // their validity, and only while nothing touched the inode.
        let lookups = Arc::new(LookupCounts::new(opts.attr_timeout / 2));
        let held = lookups.clone();
        vol.set_holder(Arc::new(move |ino| held.holds(ino)));
        Server {
            vol,
            root,
            opts,
            lookups,
            zero_message_open: Default::default(),
            stats: RequestStats::default(),
            invalidate: parking_lot::Mutex::new(None),
            notify: std::sync::OnceLock::new(),
            transport: std::sync::OnceLock::new(),
            bound: std::sync::OnceLock::new(),
            near_full: AtomicBool::new(false),
            kept: AtomicU64::new(0),
            kernel_keeps_times: AtomicBool::new(false),
            writers: Sharded::new(10),
            callers: Default::default(),
            negatives: Sharded::new(10),
            negatives_lost: parking_lot::Mutex::new(None),
            imports_begun: Default::default(),
        }
    }

    /// A LOOKUP of `name` in directory `dir` missed, and the kernel caches the miss.
    fn note_negative(&self, dir: u64, name: &[u8]) {
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
    fn may_hold_negative(&self, dir: u64, name: &[u8]) -> bool {
        let ttl = self.opts.negative_timeout;
        !ttl.is_zero() && self.missed_since(dir, name, std::time::Instant::now().checked_sub(ttl))
    }

    /// Whether a LOOKUP of `name` in `dir` missed at or after `since` (None: ever), as
    /// far as `negatives` remembers.
    fn missed_since(&self, dir: u64, name: &[u8], since: Option<std::time::Instant>) -> bool {
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
    fn control_caller(&self, h: &InHeader) -> Caller {
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

    /// The writeback cache is on, and `bound` says how much of this mount's file data
    /// the kernel may hold dirty.
    pub(super) fn set_dirty_bound(&self, bound: Arc<DirtyBound>) {
        let _ = self.bound.set(bound);
        self.keep_cushion();
    }

    /// Keep the cushion and the slack free for the kernel's write-back: no other change
    /// may take them (`Volume::keep_for_write_back`), so whatever a write() was let into
    /// the page cache can land, and ENOSPC comes to every writer at one point, which is
    /// also where `df` shows no room. Follows the cushion as the bound changes level.
    fn keep_cushion(&self) {
        let want = self.cushion() + NEAR_FULL_SLACK;
        if self.kept.load(Ordering::Relaxed) != want && self.kept.swap(want, Ordering::SeqCst) != want {
            self.vol.keep_for_write_back(want);
        }
    }

    /// Bytes kept free for the kernel's dirty pages (0 without the writeback cache).
    fn cushion(&self) -> u64 {
        self.bound.get().map_or(0, |b| b.cushion())
    }

    /// Space the volume can still take, in bytes.
    /// Bytes that can be written now: not counting what files removed moments ago will
    /// give back (a file still open through a zero-message open may hold it for long,
    /// and the kernel's cache must never take more than can land).
    fn available(&self) -> u64 {
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
    fn near_full_check(&self) -> bool {
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

    /// How long the kernel may keep a file's attributes: not at all for a file open for
    /// writing while the volume is near full (see `near_full_check`).
    fn attr_valid(&self, ino: u64) -> Valid {
        if self.near_full.load(Ordering::Relaxed) && self.writers.shard(ino).contains_key(&ino) {
            return Valid::from(Duration::ZERO);
        }
        Valid::from(self.opts.attr_timeout)
    }

    /// Open flags and handle of a file open: the kernel's pages are kept (every change
    /// goes through this mount), and a writer near full bypasses the cache; the writer
    /// is noted.
    fn file_open(&self, ino: u64, flags: u32) -> (u64, u32) {
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
            if self.near_full_check() {
                open_flags |= fopen::DIRECT_IO;
            }
        }
        (COUNTED_WRITE, open_flags)
    }

    /// Whether an open with `flags` would wait for files removed moments ago (see
    /// `file_open`): for writing, with the writeback cache, on a volume that looks near
    /// full only until their space comes back.
    fn open_waits_for_settling(&self, flags: u32) -> bool {
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
    fn put_off_open(&self, flags: u32) -> bool {
        let put_off = SERVING.get() && FIRST_CALL_SERVING.get() && self.open_waits_for_settling(flags);
        if put_off {
            PUT_OFF.set(true);
        }
        put_off
    }

    /// A file handle from `file_open` is released.
    fn file_closed(&self, ino: u64, fh: u64) {
        if fh == COUNTED_WRITE {
            let mut w = self.writers.shard(ino);
            if let Some(n) = w.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    w.remove(&ino);
                }
            }
        }
    }

    /// Where direct writes send the ranges to drop from the kernel's page cache.
    pub(super) fn set_invalidations(&self, tx: Invalidations, dev: Arc<std::fs::File>) {
        *self.invalidate.lock() = Some(tx);
        let _ = self.notify.set(dev);
    }

    /// The control path (`control.rs`): one step of a whole-tree job on directory `ino`,
    /// as the caller: emptying it (`dxfs rm -r`) or summing it (`dxfs du`).
    fn ioctl(&self, op: u32, h: &InHeader, ino: u64, (flags, cmd, out_size): (u32, u32, u32), data: &[u8]) -> Reply {
        use super::control::{StepRequest, CONTROL_SIZE, IOC_EMPTY_STEP, IOC_IMPORT, IOC_SUM_STEP};
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
    fn empty_step(&self, op: u32, h: &InHeader, ino: u64, caller: &Caller, from: u64, max: usize) -> Res<Vec<u8>> {
        use super::control::EmptyReply;
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
    fn import(&self, op: u32, h: &InHeader, ino: u64, out_size: u32, data: &[u8]) -> Reply {
        use super::control::{encode_import_reply, ImportBatch};
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
    fn sum_step(&self, op: u32, ino: u64, caller: &Caller, from: u64, max: usize) -> Res<Vec<u8>> {
        use super::control::SumReply;
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

    /// Write a notification to the kernel; one it refuses (a name it no longer holds) is
    /// of no consequence.
    fn send_notification(&self, msg: &[u8]) {
        use std::io::Write;
        if let Some(dev) = self.notify.get() {
            if let Err(e) = (&**dev).write_all(msg) {
                tracing::debug!("notification: {e}");
            }
        }
    }

    /// The FUSE node id of volume inode `ino`.
    fn node_id(&self, ino: u64) -> u64 {
        if ino == self.root {
            wire::ROOT_ID
        } else {
            ino
        }
    }

    /// Have the kernel drop node `nodeid`'s cached attributes before this request is
    /// answered. Attributes only: the kernel takes no page lock for that, so the serving
    /// thread may send it itself (page invalidations go through the invalidator thread).
    fn drop_attrs_now(&self, nodeid: u64) {
        use std::io::Write;
        self.lookups.touched(self.vol_ino(nodeid));
        if let Some(dev) = self.notify.get() {
            if let Err(e) = (&**dev).write_all(&wire::notify_inval_inode(nodeid, -1, 0)) {
                tracing::debug!("attribute invalidation of node {nodeid}: {e}");
            }
        }
    }

    /// The kernel accepted zero-message opens: OPEN and OPENDIR are answered ENOSYS (the
    /// kernel then stops sending them, and their RELEASEs), and inodes live by the
    /// kernel's lookup references instead.
    pub(super) fn set_zero_message_open(&self, files: bool, dirs: bool) {
        self.zero_message_open[0].store(files, std::sync::atomic::Ordering::Relaxed);
        self.zero_message_open[1].store(dirs, std::sync::atomic::Ordering::Relaxed);
    }

    /// The kernel granted the writeback cache (INIT): from then on it owns the times of
    /// the files it caches, and its write-back WRITEs leave them alone.
    pub(super) fn set_writeback_cache(&self, granted: bool) {
        self.kernel_keeps_times.store(granted, Ordering::Relaxed);
    }

    fn zero_message_open(&self, dir: bool) -> bool {
        self.zero_message_open[dir as usize].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The session is over: log the lookup balance and the request counters, and let go
    /// of every inode the kernel still referenced (it dropped them without FORGETs).
    pub(super) fn end(&self) {
        match self.lookups.outstanding() {
            (0, _) => tracing::info!("lookup counts balanced: the kernel forgot every inode it was given"),
            // The kernel drops its references without FORGETs at unmount: not a fault.
            (n, refs) => tracing::debug!("lookup counts unbalanced: {n} inodes ({refs} references) never forgotten"),
        }
        tracing::info!("requests served: {}", self.stats.summary());
        for ino in self.lookups.drain() {
            if let Err(e) = self.vol.forgotten(ino) {
                tracing::error!("freeing unlinked inode {ino} at the end of the session: {e}");
            }
        }
    }

    /// The kernel dropped `n` references to `ino`: with none left, an unlinked inode goes.
    fn forget(&self, op: u32, ino: u64, n: u64) {
        if self.lookups.forget(ino, n) {
            let _ = self.call(op, |v| v.forgotten(ino));
        }
    }

    fn vol_ino(&self, ino: u64) -> u64 {
        if ino == wire::ROOT_ID {
            self.root
        } else {
            ino
        }
    }

    fn fuse_ino(&self, ino: u64) -> u64 {
        if ino == self.root {
            wire::ROOT_ID
        } else {
            ino
        }
    }

    /// Run a volume call. A panic in the volume is caught so the request still gets an
    /// answer (EIO). After a request that may change the volume, the volume is then
    /// poisoned so that nothing half-done reaches the disk; a request that only reads
    /// changed nothing that a commit writes, so it fails alone and the mount goes on.
    fn call<T>(&self, op: u32, f: impl FnOnce(&Volume) -> Result<T>) -> Res<T> {
        // The first call of a request on a serving thread must not wait for requests
        // (see `handle_unless_it_waits`); later ones follow a change and may.
        let serving = FIRST_CALL_SERVING.with(|c| c.replace(false));
        let run = |v: &Volume| {
            if !serving {
                return f(v);
            }
            v.unless_it_waits_for_requests(f)?.ok_or_else(|| {
                PUT_OFF.with(|c| c.set(true));
                Error::WouldWait
            })
        };
        match catch_unwind(AssertUnwindSafe(|| run(&self.vol))) {
            Ok(r) => r.map_err(|e| errno_of(op, &e)),
            Err(_) if reads_only(op) => {
                tracing::error!("request {op}: panic in the volume layer while reading; this request failed (EIO)");
                Err(libc::EIO)
            }
            Err(_) => {
                tracing::error!("request {op}: panic in the volume layer; no further changes will be committed");
                self.vol.poison();
                Err(libc::EIO)
            }
        }
    }

    fn entry_out(&self, a: &Attr) -> EntryOut {
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
    fn entry(&self, r: Res<Attr>) -> Reply {
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

    fn attr(&self, r: Res<Attr>) -> Reply {
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
    fn statx(&self, r: Res<Attr>) -> Reply {
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
    fn open_reply(fh: u64, open_flags: u32) -> Reply {
        let mut out = Vec::with_capacity(OpenOut::SIZE);
        OpenOut { fh, open_flags }.encode(&mut out);
        Reply::Data(out)
    }

    /// The reply to CREATE and TMPFILE: the entry (a lookup reference) and the open file.
    fn created(&self, r: Res<Attr>, flags: u32) -> Reply {
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

    fn lookup(&self, op: u32, parent: u64, name: &[u8]) -> Reply {
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

    fn setattr(&self, op: u32, ino: u64, s: &wire::SetattrIn) -> Reply {
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

    fn new_node(h: &InHeader, mode: u32, rdev: u64, umask: u32) -> NewNode {
        NewNode { mode, uid: h.uid, gid: h.gid, rdev, umask }
    }

    /// A WRITE; with `wait` false, `None` if it would have to wait for room in the delta
    /// (nothing answered: it is to be served again, waiting).
    fn write(&self, h: &InHeader, offset: u64, write_flags: u32, flags: u32, data: &[u8], wait: bool) -> Option<Reply> {
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
                self.near_full_check();
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

    fn readdir(&self, op: u32, ino: u64, offset: u64, size: u32, plus: bool) -> Reply {
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

    fn setxattr(&self, op: u32, h: &InHeader, ino: u64, flags: u32, name: &[u8], value: &[u8]) -> Reply {
        if ino == self.root && name == STATS_XATTR.as_bytes() {
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
        done(if name == b"system.posix_acl_access" {
            let caller = caller_of(h);
            self.call(op, |v| v.setxattr_as(ino, name, value, mode, &caller))
        } else {
            self.call(op, |v| v.setxattr(ino, name, value, mode))
        })
    }

    fn fallocate(&self, op: u32, ino: u64, o: u64, n: u64, mode: u32) -> Reply {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        const ZERO_KEEP: i32 = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        const COLLAPSE: i32 = libc::FALLOC_FL_COLLAPSE_RANGE;
        const INSERT: i32 = libc::FALLOC_FL_INSERT_RANGE;
        done(match mode as i32 {
            0 => self.call(op, |v| v.fallocate(ino, o, n, false, false)),
            KEEP => self.call(op, |v| v.fallocate(ino, o, n, true, false)),
            PUNCH => self.call(op, |v| v.fallocate(ino, o, n, true, true)),
            ZERO => self.call(op, |v| v.zero_range(ino, o, n, false)),
            ZERO_KEEP => self.call(op, |v| v.zero_range(ino, o, n, true)),
            COLLAPSE => self.call(op, |v| v.collapse_range(ino, o, n)),
            INSERT => self.call(op, |v| v.insert_range(ino, o, n)),
            _ => Err(libc::EOPNOTSUPP),
        })
    }

    fn serve(&self, h: &InHeader, req: &Request<'_>) -> Reply {
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
            // when the volume is near full: no room for the cushion, no write.
            Request::Getattr { flags, fh }
                if flags & wire::GETATTR_FH != 0
                    && fh == COUNTED_WRITE
                    && self.near_full_check()
                    && self.available() < self.cushion() + NEAR_FULL_SLACK =>
            {
                Reply::Error(libc::ENOSPC)
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
                Ok(v.statfs())
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
            Request::Removexattr { name } => done(self.call(op, |v| v.removexattr(ino, name))),
            // Only sent without default_permissions; the volume decides.
            Request::Access { mask } => {
                let caller = caller_of(h);
                done(self.call(op, |v| v.access(ino, &caller, mask & 7)))
            }
            Request::Fallocate { offset, length, mode, .. } => self.fallocate(op, ino, offset, length, mode),
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
            // fuseblk and virtiofs only; nothing to do (the session commits at its end).
            // A fuseblk mount's `umount` waits for this answer: the volume is committed
            // first, so what was written before `umount` is on the device when it returns.
            Request::Destroy => match self.call(op, |v| v.sync()) {
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

impl Handler for Server {
    fn handle(&self, h: &InHeader, req: &Request<'_>, via_ring: bool) -> Reply {
        let _t = self.stats.timer(h.opcode, via_ring);
        self.touched(h, req);
        self.serve(h, req)
    }

    fn read_into(&self, h: &InHeader, req: &Request<'_>, out: &mut [u8]) -> Option<Res<usize>> {
        let Request::Read { offset, flags, .. } = *req else { return None };
        let _t = self.stats.timer(h.opcode, true);
        self.touched(h, req);
        let ino = self.vol_ino(h.nodeid);
        self.lookups.note_cached(ino);
        Some(self.call(h.opcode, |v| v.read_into(ino, offset, out, kernel_reads_ahead(flags))))
    }

    /// An fsync commits the volume and waits for the device.
    /// A control ioctl tells the kernel to drop names, for which the kernel takes the
    /// directory's lock, which a request waiting for a serving thread may hold.
    fn blocks(&self, req: &Request<'_>) -> bool {
        // An import batch starts where it arrives (see `import`).
        matches!(req, Request::Fsync { .. } | Request::Syncfs | Request::Destroy)
            || matches!(req, Request::Ioctl { cmd, .. } if *cmd != super::control::IOC_IMPORT)
    }

    /// A serving thread answers every request that need not wait for another request or
    /// for room: waiting for the FORGET of a file removed moments ago, it would wait for
    /// what only the serving threads deliver. A write is also tried without waiting for
    /// room in the delta: the kernel's write-back past the dirty limit waits for flushes
    /// (tens to hundreds of milliseconds with several writers, docs/BENCHMARKS.md), and
    /// every request made on the same CPU would wait behind it on an io_uring queue.
    fn handle_unless_it_waits(&self, h: &InHeader, req: &Request<'_>, via_ring: bool) -> Option<Reply> {
        // These change the volume before their first call can fail, or must never be put
        // off behind the request they may be waited for by.
        let may_put_off = !matches!(
            req,
            Request::Forget { .. }
                | Request::BatchForget { .. }
                | Request::Release { .. }
                | Request::Releasedir { .. }
                | Request::Interrupt { .. }
        );
        FIRST_CALL_SERVING.with(|c| c.set(may_put_off));
        SERVING.set(may_put_off);
        PUT_OFF.with(|c| c.set(false));
        let reply = match *req {
            Request::Write { offset, write_flags, flags, data, .. } => {
                let start = std::time::Instant::now();
                self.touched(h, req);
                let reply = self.write(h, offset, write_flags, flags, data, false);
                if reply.is_some() {
                    drop(self.stats.timer_since(h.opcode, via_ring, start));
                }
                reply
            }
            _ => Some(self.handle(h, req, via_ring)),
        };
        FIRST_CALL_SERVING.with(|c| c.set(false));
        SERVING.set(false);
        let put_off = PUT_OFF.with(|c| c.replace(false));
        match reply {
            Some(r) if !put_off => Some(r),
            _ => {
                self.stats.writes_waited.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

impl Server {
    /// A request that may make the kernel drop the attributes it holds of the inodes it
    /// names (a change; a READ or a listing, after which the kernel drops atime): their
    /// next READDIRPLUS entries carry attributes again (see `readdir`). The inode of a
    /// name that an unlink or rename replaces is not known here; the kernel asks for it
    /// with a GETATTR if it needs it, as for any entry left without attributes.
    fn touched(&self, h: &InHeader, req: &Request<'_>) {
        let keeps = matches!(
            req,
            Request::Lookup { .. }
                | Request::Forget { .. }
                | Request::BatchForget { .. }
                | Request::Getattr { .. }
                | Request::Statx { .. }
                | Request::Getxattr { .. }
                | Request::Listxattr { .. }
                | Request::Readlink { .. }
                | Request::Open { .. }
                | Request::Opendir { .. }
                | Request::Release { .. }
                | Request::Releasedir { .. }
                | Request::Flush { .. }
                | Request::Fsync { .. }
                | Request::Access { .. }
                | Request::Lseek { .. }
                | Request::Statfs { .. }
                | Request::Syncfs
                | Request::Destroy
                | Request::Interrupt { .. }
                // Not served (ENOSYS), so nothing changed.
                | Request::Other { .. }
        );
        if keeps {
            return;
        }
        self.lookups.touched(self.vol_ino(h.nodeid));
        match *req {
            Request::Rename { newdir, .. } => self.lookups.touched(self.vol_ino(newdir)),
            Request::Link { oldnodeid, .. } => self.lookups.touched(self.vol_ino(oldnodeid)),
            Request::CopyFileRange { nodeid_out, .. } => self.lookups.touched(self.vol_ino(nodeid_out)),
            _ => {}
        }
    }

    /// Which transport serves the mount. It is set once the serving threads have started,
    /// which can be just after they served the first requests: a stats request that early
    /// waits for it (a second at most) rather than say nothing.
    fn transport_name(&self) -> &str {
        for _ in 0..1000 {
            if let Some(t) = self.transport.get() {
                return t;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        ""
    }
}

/// Whether a READ fills the kernel's page cache, where the kernel reads ahead for
/// sequential readers itself: a reader that opened the file `O_DIRECT` is served
/// directly, and only such a reader gets the volume's read-ahead. (Both at once cost a
/// copy and a handoff per read and gained nothing: fio, 1 MiB buffered reads, 6–12% less
/// throughput with both.)
fn kernel_reads_ahead(open_flags: u32) -> bool {
    open_flags & libc::O_DIRECT as u32 == 0
}

/// The identity of a request's caller: its user and group from the request, its
/// supplementary groups from /proc (the protocol does not carry them).
/// Hand the request being served to a kept thread (see `handle_unless_it_waits`); the
/// reply returned with it is dropped.
fn put_off() -> Reply {
    PUT_OFF.set(true);
    Reply::Error(libc::EAGAIN)
}

/// A name's hash for `Server::negatives` (a collision only drops a cached entry more).
fn name_hash(name: &[u8]) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(name)
}

fn caller_of(h: &InHeader) -> Caller {
    let groups = std::fs::read_to_string(format!("/proc/{}/status", h.pid))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Groups:"))
                .map(|g| g.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        })
        .unwrap_or_default();
    Caller { uid: h.uid, gid: h.gid, groups }
}

/// Whether request `op` only reads the volume. A READ may also set its file's atime,
/// but only after the data was read, in one inode write that either happened whole or
/// not at all: a panic before it leaves nothing half-changed for a commit to write.
fn reads_only(op: u32) -> bool {
    use super::wire::opcode::*;
    matches!(
        op,
        LOOKUP
            | GETATTR
            | READLINK
            | READ
            | STATFS
            | GETXATTR
            | LISTXATTR
            | OPENDIR
            | READDIR
            | READDIRPLUS
            | ACCESS
            | LSEEK
            | STATX
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::MemDevice;
    use crate::fuse::wire::opcode;
    use crate::volume::{mkfs, MkfsOptions};

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
