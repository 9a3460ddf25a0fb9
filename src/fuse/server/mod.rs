//! The request handler over a [`Volume`]: parsed FUSE requests ([`wire::Request`]) to
//! volume calls (`ops.rs`), results to replies (`reply.rs`). The transports
//! (`transport.rs`) carry the requests and replies. No filesystem rule lives here: only
//! what a FUSE mount alone needs (the writeback cache's room, `near_full.rs`; the
//! control path, `control_path.rs`). This file holds the server's state, its calls into the
//! volume (a serving thread's request put off rather than wait) and the lookup counts.

mod control_path;
mod near_full;
mod ops;
mod reply;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

// The frontend sees only the library's public API.
use crate::{Caller, Error, Result, Volume};

use super::dirty_bound::DirtyBound;
use super::lookups::LookupCounts;
use super::stats::RequestStats;
use super::transport::{Handler, Reply};
use super::wire::{self, InHeader, Request};
use super::FuseOptions;
use crate::engine::leaf::Sharded;
use control_path::RecentCallers;
use reply::errno_of;

/// The root directory's virtual xattr that holds the mount's request counters as JSON
/// (`dxfs stats MOUNTPOINT` reads it). Not stored, not listed; setting it is refused.
pub const STATS_XATTR: &str = "user.dxfs.stats";

/// The file handle of an open the volume counted (OPEN, OPENDIR, CREATE, TMPFILE); its
/// RELEASE gives the count back. Zero-message opens have handle 0.
const COUNTED: u64 = 1;

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
    /// Files open for writing whose directory quota is within two cushions of its limit
    /// (see `quota_near_check`): sharded as `writers`, since attribute replies look here.
    quota_near: Sharded<rustc_hash::FxHashSet<u64>>,
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
            quota_near: Sharded::new(10),
            kept: AtomicU64::new(0),
            kernel_keeps_times: AtomicBool::new(false),
            writers: Sharded::new(10),
            callers: Default::default(),
            negatives: Sharded::new(10),
            negatives_lost: parking_lot::Mutex::new(None),
            imports_begun: Default::default(),
        }
    }

    /// Where direct writes send the ranges to drop from the kernel's page cache.
    pub(super) fn set_invalidations(&self, tx: Invalidations, dev: Arc<std::fs::File>) {
        *self.invalidate.lock() = Some(tx);
        let _ = self.notify.set(dev);
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
                Error::would_wait()
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
            || matches!(req, Request::Ioctl { cmd, .. } if *cmd != crate::fuse::control::IOC_IMPORT)
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

/// Hand the request being served to a kept thread (see `handle_unless_it_waits`); the
/// reply returned with it is dropped.
fn put_off() -> Reply {
    PUT_OFF.set(true);
    Reply::Error(libc::EAGAIN)
}

/// The identity of a request's caller: its user and group from the request, its
/// supplementary groups from /proc (the protocol does not carry them).
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
