//! What FUSE over io_uring buys on this machine: an in-memory file system served through
//! the classic `/dev/fuse` read/write loop or through io_uring queues, timed from a
//! client thread. Needs root (it mounts with mount(2)) and /dev/fuse.
//!
//! cargo run --release --example fuse_transport_probe -- [--files N] [--runs R] [--repeat K]
//!     [--modes classic1,classic2,pinned,cross,uring,uring-defer] [--depth D] [--payload BYTES]
//!
//! Each mode mounts a fresh file system (type `fuse.probe`, `default_permissions`, all
//! entry and attribute timeouts zero) on a directory under /tmp, and runs R rounds of,
//! on N files in its root: create (open O_CREAT|O_EXCL + close), stat, lgetxattr of a
//! missing `user.missing`, unlink; `--repeat K` does it all K times on fresh mounts. It
//! prints µs per operation (median over mounts of the median of rounds, with the range) and
//! the FUSE requests each operation cost, with how many came through the ring.
//!
//! Modes: `classic1` / `classic2`: 1 or 2 threads reading /dev/fuse; `pinned`: one
//! thread on /dev/fuse pinned to CPU 0 and the client pinned to CPU 0 too (the
//! reference: no cross-CPU wake-up); `cross`: the same thread on CPU 0 and the client on
//! CPU 1 (every request wakes the other CPU); `uring`: one io_uring queue per possible CPU, each
//! served by a thread pinned to that CPU (plus the /dev/fuse thread the kernel still
//! needs for FORGET and INTERRUPT); `uring-defer`: the same with
//! IORING_SETUP_DEFER_TASKRUN. When the kernel does not offer FUSE_OVER_IO_URING
//! (`/sys/module/fuse/parameters/enable_uring` is N) or registration fails, the uring
//! modes say so and measure the classic fallback instead.
//!
//! Every exit path unmounts: errors and panics through a guard, SIGINT/SIGTERM through a
//! signal thread that detaches the mount.
#![deny(unsafe_code)]

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dxfs::fuse::transport::{self, Handler, Reply, TransportChoice};
use dxfs::fuse::uring::{Queue, QueueConfig};
use dxfs::fuse::wire::{
    self, init, opcode, split_classic, Attr, AttrOut, EntryOut, InHeader, InitIn, OpenOut, Request, StatfsOut, Valid,
};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{sched_setaffinity, CpuSet};
use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;

const MAX_WRITE: u32 = 128 * 1024;
const MAX_PAGES: u16 = 32;

/// The one unsafe call: lgetxattr(2), which neither std nor nix wraps.
mod sys {
    #![allow(unsafe_code)]
    use std::ffi::CString;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    /// lgetxattr(path, name, NULL, 0): the value's size, or the error.
    pub fn lgetxattr_size(path: &Path, name: &str) -> io::Result<usize> {
        let p = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
        let n = CString::new(name).map_err(io::Error::other)?;
        // SAFETY: both pointers are NUL-terminated strings that outlive the call; a null
        // value buffer of size 0 asks only for the size, so the kernel writes nothing.
        let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }
}

// ---------------------------------------------------------------------------------------
// The in-memory file system, shared by both transports.

struct Node {
    attr: Attr,
    lookups: u64,
    data: Vec<u8>,
}

struct Inner {
    names: HashMap<Vec<u8>, u64>,
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    next_fh: u64,
}

struct Fs {
    inner: Mutex<Inner>,
    /// Requests per opcode, and how many of them came through a ring.
    by_op: Vec<AtomicU64>,
    via_ring: AtomicU64,
    forgets: AtomicU64,
}

fn now() -> (u64, u32) {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (d.as_secs(), d.subsec_nanos())
}

const ZERO: Valid = Valid { secs: 0, nsecs: 0 };

impl Fs {
    fn new() -> Fs {
        let (s, ns) = now();
        let root = Attr {
            ino: 1,
            mode: libc::S_IFDIR | 0o755,
            nlink: 2,
            blksize: 4096,
            atime: s,
            mtime: s,
            ctime: s,
            atimensec: ns,
            mtimensec: ns,
            ctimensec: ns,
            ..Attr::default()
        };
        let mut nodes = HashMap::new();
        nodes.insert(1, Node { attr: root, lookups: 1, data: Vec::new() });
        Fs {
            inner: Mutex::new(Inner { names: HashMap::new(), nodes, next_ino: 2, next_fh: 1 }),
            by_op: (0..64).map(|_| AtomicU64::new(0)).collect(),
            via_ring: AtomicU64::new(0),
            forgets: AtomicU64::new(0),
        }
    }

    fn requests(&self) -> (u64, u64) {
        (self.by_op.iter().map(|c| c.load(Ordering::Relaxed)).sum(), self.via_ring.load(Ordering::Relaxed))
    }

    fn live_inodes(&self) -> usize {
        self.inner.lock().unwrap().nodes.len() - 1
    }

    fn forget(inner: &mut Inner, ino: u64, n: u64) {
        if ino == wire::ROOT_ID {
            return;
        }
        if let Some(node) = inner.nodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(n);
            if node.lookups == 0 && node.attr.nlink == 0 {
                inner.nodes.remove(&ino);
            }
        }
    }

    /// Serve one request: Ok(body) or Err(errno). Requests without a reply return
    /// Ok(None).
    fn handle(&self, h: &InHeader, req: &Request<'_>, ring: bool) -> Result<Option<Vec<u8>>, i32> {
        if let Some(c) = self.by_op.get(h.opcode as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if ring {
            self.via_ring.fetch_add(1, Ordering::Relaxed);
        }
        let mut out = Vec::new();
        let mut g = self.inner.lock().unwrap();
        let inner = &mut *g;
        match *req {
            Request::Lookup { name } => {
                if h.nodeid != wire::ROOT_ID {
                    return Err(libc::ENOENT);
                }
                let ino = *inner.names.get(name).ok_or(libc::ENOENT)?;
                let node = inner.nodes.get_mut(&ino).ok_or(libc::ENOENT)?;
                node.lookups += 1;
                EntryOut { nodeid: ino, generation: 1, entry_valid: ZERO, attr_valid: ZERO, attr: node.attr }
                    .encode(&mut out);
            }
            Request::Getattr { .. } => {
                let node = inner.nodes.get(&h.nodeid).ok_or(libc::ENOENT)?;
                AttrOut { attr_valid: ZERO, attr: node.attr }.encode(&mut out);
            }
            Request::Create { mode, umask, name, .. } => {
                if h.nodeid != wire::ROOT_ID {
                    return Err(libc::ENOENT);
                }
                if inner.names.contains_key(name) {
                    return Err(libc::EEXIST);
                }
                let ino = inner.next_ino;
                inner.next_ino += 1;
                let (s, ns) = now();
                let attr = Attr {
                    ino,
                    mode: libc::S_IFREG | (mode & 0o7777 & !umask),
                    nlink: 1,
                    uid: h.uid,
                    gid: h.gid,
                    blksize: 4096,
                    atime: s,
                    mtime: s,
                    ctime: s,
                    atimensec: ns,
                    mtimensec: ns,
                    ctimensec: ns,
                    ..Attr::default()
                };
                inner.names.insert(name.to_vec(), ino);
                inner.nodes.insert(ino, Node { attr, lookups: 1, data: Vec::new() });
                let fh = inner.next_fh;
                inner.next_fh += 1;
                EntryOut { nodeid: ino, generation: 1, entry_valid: ZERO, attr_valid: ZERO, attr }.encode(&mut out);
                OpenOut { fh, open_flags: 0 }.encode(&mut out);
            }
            Request::Open { .. } => {
                let fh = inner.next_fh;
                inner.next_fh += 1;
                OpenOut { fh, open_flags: 0 }.encode(&mut out);
            }
            Request::Write { offset, data, .. } => {
                let node = inner.nodes.get_mut(&h.nodeid).ok_or(libc::ENOENT)?;
                let end = offset as usize + data.len();
                if node.data.len() < end {
                    node.data.resize(end, 0);
                }
                node.data[offset as usize..end].copy_from_slice(data);
                node.attr.size = node.data.len() as u64;
                wire::encode_size_out(data.len() as u32, &mut out);
            }
            Request::Read { offset, size, .. } => {
                let node = inner.nodes.get(&h.nodeid).ok_or(libc::ENOENT)?;
                let start = (offset as usize).min(node.data.len());
                let end = (start + size as usize).min(node.data.len());
                out.extend_from_slice(&node.data[start..end]);
            }
            Request::Flush { .. } | Request::Release { .. } | Request::Destroy => {}
            Request::Unlink { name } => {
                let ino = inner.names.remove(name).ok_or(libc::ENOENT)?;
                if let Some(node) = inner.nodes.get_mut(&ino) {
                    node.attr.nlink = 0;
                }
                Fs::forget(inner, ino, 0);
            }
            Request::Getxattr { .. } => return Err(libc::ENODATA),
            Request::Forget { nlookup } => {
                self.forgets.fetch_add(1, Ordering::Relaxed);
                Fs::forget(inner, h.nodeid, nlookup);
                return Ok(None);
            }
            Request::BatchForget(ref list) => {
                for &(ino, n) in list {
                    self.forgets.fetch_add(1, Ordering::Relaxed);
                    Fs::forget(inner, ino, n);
                }
                return Ok(None);
            }
            Request::Interrupt { .. } => return Ok(None),
            Request::Statfs => StatfsOut {
                blocks: 1 << 20,
                bfree: 1 << 19,
                bavail: 1 << 19,
                files: 1 << 20,
                ffree: 1 << 19,
                bsize: 4096,
                namelen: 255,
                frsize: 4096,
            }
            .encode(&mut out),
            Request::Opendir { .. } => OpenOut { fh: 0, open_flags: 0 }.encode(&mut out),
            Request::Releasedir { .. } | Request::Access { .. } => {}
            _ => return Err(libc::ENOSYS),
        }
        Ok(Some(out))
    }
}

impl Handler for Fs {
    fn handle(&self, h: &InHeader, req: &Request<'_>, via_ring: bool) -> Reply {
        match Fs::handle(self, h, req, via_ring) {
            Ok(Some(body)) => Reply::Data(body),
            Ok(None) => Reply::None,
            Err(errno) => Reply::Error(errno),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Mounting, INIT, the transports.

/// The mount and its directory; unmounted and removed on drop.
struct MountGuard {
    dir: PathBuf,
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        match umount2(&self.dir, MntFlags::empty()) {
            Ok(()) | Err(nix::errno::Errno::EINVAL) => {}
            Err(e) => {
                eprintln!("umount {}: {e}; detaching", self.dir.display());
                let _ = umount2(&self.dir, MntFlags::MNT_DETACH);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

static STOPPING: AtomicBool = AtomicBool::new(false);
static CURRENT: Mutex<Option<PathBuf>> = Mutex::new(None);

fn mount_probe(dev: &File) -> io::Result<MountGuard> {
    let dir = std::env::temp_dir().join(format!("fuse-probe-{}-{}", std::process::id(), now().1));
    std::fs::create_dir(&dir)?;
    let opts = format!("fd={},rootmode=40000,user_id=0,group_id=0,default_permissions", dev.as_raw_fd());
    if let Err(e) =
        mount(Some("probe"), &dir, Some("fuse.probe"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some(opts.as_str()))
    {
        let _ = std::fs::remove_dir(&dir);
        return Err(io::Error::other(format!("mount(2) of fuse.probe on {}: {e}", dir.display())));
    }
    *CURRENT.lock().unwrap() = Some(dir.clone());
    Ok(MountGuard { dir })
}

/// Read INIT from /dev/fuse and answer it ([`transport::negotiate`]). Returns whether
/// to start io_uring queues, and why (or why not).
fn do_init(dev: &File, want_uring: bool) -> io::Result<(bool, String)> {
    let mut buf = vec![0u8; MAX_WRITE as usize + 4096];
    let n = (&*dev).read(&mut buf)?;
    let (h, arg, _) = split_classic(&buf[..n]).map_err(io::Error::other)?;
    if h.opcode != opcode::INIT {
        return Err(io::Error::other(format!("first request is opcode {}, not INIT", h.opcode)));
    }
    let i = InitIn::parse(arg).map_err(io::Error::other)?;
    let choice = if want_uring { TransportChoice::Uring } else { TransportChoice::Classic };
    let wanted = init::ASYNC_READ | init::BIG_WRITES | init::PARALLEL_DIROPS;
    let n = transport::negotiate(&i, choice, wanted, MAX_WRITE, MAX_PAGES).map_err(io::Error::other)?;
    let mut body = Vec::new();
    n.out.encode(&mut body);
    (&*dev).write_all(&wire::reply(h.unique, 0, &body))?;
    Ok((n.uring, n.why))
}

/// The classic loop on this thread.
fn serve_classic(dev: Arc<File>, fs: Arc<Fs>) {
    if let Err(e) = transport::serve_classic(&*dev, &*fs, MAX_WRITE as usize + 4096) {
        eprintln!("/dev/fuse: {e}");
    }
}

fn pin_to(cpu: usize) -> io::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu).map_err(io::Error::other)?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(io::Error::other)
}

/// One io_uring queue: register, then answer requests until the connection ends.
/// Reports registration's outcome on `registered`.
fn serve_queue(dev: Arc<File>, fs: Arc<Fs>, qid: u16, cfg: QueueConfig, registered: mpsc::Sender<io::Result<()>>) {
    if let Err(e) = pin_to(qid as usize) {
        let _ = registered.send(Err(io::Error::other(format!("pinning queue {qid}: {e}"))));
        return;
    }
    let mut q = match Queue::new(dev, qid, cfg) {
        Ok(q) => q,
        Err(e) => {
            let _ = registered.send(Err(io::Error::other(format!("io_uring setup for queue {qid}: {e}"))));
            return;
        }
    };
    if let Err(e) = q.register() {
        let _ = registered.send(Err(io::Error::other(format!("FUSE_IO_URING_CMD_REGISTER on queue {qid}: {e}"))));
        return;
    }
    let _ = registered.send(Ok(()));
    drop(registered);
    if let Err(e) = transport::serve_queue(&mut q, &*fs, &|_| {}) {
        eprintln!("queue {qid}: {e}");
    }
}

/// Queues the kernel expects: one per possible CPU.
fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| transport::parse_possible_cpus(&s))
        .unwrap_or_else(|| thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Classic1,
    Classic2,
    Pinned,
    Cross,
    Uring,
    UringDefer,
}

impl Mode {
    fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "classic1" => Mode::Classic1,
            "classic2" => Mode::Classic2,
            "pinned" => Mode::Pinned,
            "cross" => Mode::Cross,
            "uring" => Mode::Uring,
            "uring-defer" => Mode::UringDefer,
            _ => return None,
        })
    }

    fn label(self) -> &'static str {
        match self {
            Mode::Classic1 => "classic, 1 thread",
            Mode::Classic2 => "classic, 2 threads",
            Mode::Pinned => "classic, 1 thread, caller on its CPU",
            Mode::Cross => "classic, 1 thread, caller on the other CPU",
            Mode::Uring => "io_uring, 1 queue/CPU, pinned",
            Mode::UringDefer => "io_uring + DEFER_TASKRUN",
        }
    }
}

struct Row {
    label: String,
    /// Printed µs: the median over mounts, with the range when there were several.
    cells: [String; 4],
    mix: [String; 4],
    us: [f64; 4],
    reqs: [f64; 4],
    ring_share: f64,
    note: String,
}

const OPS: [&str; 4] = ["create", "stat", "getxattr-miss", "unlink"];

/// Mount, serve in `mode`, run the client, unmount.
fn run_mode(mode: Mode, files: usize, runs: usize, depth: usize, payload: Option<usize>) -> io::Result<Row> {
    let dev = Arc::new(OpenOptions::new().read(true).write(true).open("/dev/fuse")?);
    let guard = mount_probe(&dev)?;
    let want_uring = matches!(mode, Mode::Uring | Mode::UringDefer);
    let (uring, why) = do_init(&dev, want_uring)?;
    let fs = Arc::new(Fs::new());
    let mut note = String::new();
    let mut servers = Vec::new();
    let classic_threads = if mode == Mode::Classic2 { 2 } else { 1 };
    for _ in 0..classic_threads {
        let (d, f) = (dev.clone(), fs.clone());
        let pinned = matches!(mode, Mode::Pinned | Mode::Cross);
        servers.push(thread::spawn(move || {
            if pinned {
                if let Err(e) = pin_to(0) {
                    eprintln!("pinning the /dev/fuse thread: {e}");
                }
            }
            serve_classic(d, f)
        }));
    }
    if want_uring && !uring {
        note = why;
        eprintln!("{}: {note}", mode.label());
    } else if uring {
        let payload_size = payload.unwrap_or_else(|| wire::uring::payload_size(MAX_WRITE, MAX_PAGES, 4096));
        let cfg = QueueConfig { depth, payload_size, defer_taskrun: mode == Mode::UringDefer };
        let (tx, rx) = mpsc::channel();
        for qid in 0..possible_cpus() {
            let (d, f, tx) = (dev.clone(), fs.clone(), tx.clone());
            servers.push(thread::spawn(move || serve_queue(d, f, qid as u16, cfg, tx)));
        }
        drop(tx);
        // One message per queue; a queue thread that died without one ends the iteration.
        let failures: Vec<String> =
            rx.iter().take(possible_cpus()).filter_map(|r| r.err().map(|e| e.to_string())).collect();
        if !failures.is_empty() {
            note = format!("uring registration failed ({}): classic fallback", failures.join("; "));
            eprintln!("{}: {note}", mode.label());
        }
    }
    let dir = guard.dir.clone();
    let client_cpu = match mode {
        Mode::Pinned => Some(0),
        Mode::Cross => Some(1.min(possible_cpus() - 1)),
        _ => None,
    };
    let fs2 = fs.clone();
    let client = thread::spawn(move || -> io::Result<Vec<Round>> {
        if let Some(cpu) = client_cpu {
            pin_to(cpu)?;
        }
        let mut rounds = Vec::new();
        for _ in 0..runs {
            rounds.push(client_round(&dir, files, &fs2)?);
        }
        Ok(rounds)
    });
    let result = client.join().map_err(|_| io::Error::other("client thread panicked"))?;
    let (total, ring) = fs.requests();
    // Give the kernel's FORGETs of the unlinked files a moment (they are batched).
    thread::sleep(Duration::from_millis(200));
    let live = fs.live_inodes();
    let forgets = fs.forgets.load(Ordering::Relaxed);
    STOPPING.store(true, Ordering::Relaxed);
    drop(guard);
    for s in servers {
        let _ = s.join();
    }
    STOPPING.store(false, Ordering::Relaxed);
    *CURRENT.lock().unwrap() = None;
    let rounds = result?;
    let mix = rounds.last().map(|r| r.2.clone()).unwrap_or_default();
    let mut us = [0.0; 4];
    let mut reqs = [0.0; 4];
    for k in 0..4 {
        us[k] = median(rounds.iter().map(|r| r.0[k]).collect());
        reqs[k] = median(rounds.iter().map(|r| r.1[k]).collect());
    }
    if !note.is_empty() {
        note.push_str("; ");
    }
    note.push_str(&format!("forgets {forgets}, inodes left {live}"));
    Ok(Row {
        cells: us.map(|u| format!("{u:.1}")),
        label: mode.label().into(),
        mix,
        us,
        reqs,
        ring_share: if total == 0 { 0.0 } else { ring as f64 / total as f64 },
        note,
    })
}

/// One row from the same mode's rows of several mounts: median µs (min–max).
fn summarize(mut rows: Vec<Row>) -> Row {
    let n = rows.len();
    let mut us = [0.0; 4];
    let mut cells: [String; 4] = Default::default();
    for k in 0..4 {
        let v: Vec<f64> = rows.iter().map(|r| r.us[k]).collect();
        us[k] = median(v.clone());
        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = v.iter().cloned().fold(0.0, f64::max);
        cells[k] = if n > 1 { format!("{:.1} ({lo:.0}–{hi:.0})", us[k]) } else { format!("{:.1}", us[k]) };
    }
    let notes: Vec<String> = rows.iter().map(|r| r.note.clone()).collect();
    let mut r = rows.pop().expect("at least one mount");
    r.us = us;
    r.cells = cells;
    r.note = if notes.iter().all(|x| *x == notes[0]) { notes[0].clone() } else { notes.join(" / ") };
    r
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

/// One round on `files` files: µs per op and requests per op, for each of [`OPS`].
/// One round's µs per op, requests per op, and the opcodes behind them.
type Round = ([f64; 4], [f64; 4], [String; 4]);

fn client_round(dir: &Path, files: usize, fs: &Fs) -> io::Result<Round> {
    let paths: Vec<PathBuf> = (0..files).map(|i| dir.join(format!("f{i}"))).collect();
    let mut us = [0.0; 4];
    let mut reqs = [0.0; 4];
    let mut mix: [String; 4] = Default::default();
    for (k, us_k) in us.iter_mut().enumerate() {
        let before = fs.requests().0;
        let ops_before: Vec<u64> = fs.by_op.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let t = Instant::now();
        for p in &paths {
            if STOPPING.load(Ordering::Relaxed) {
                return Err(io::Error::other("interrupted"));
            }
            match k {
                0 => drop(OpenOptions::new().write(true).create_new(true).open(p)?),
                1 => {
                    std::fs::metadata(p)?;
                }
                2 => match sys::lgetxattr_size(p, "user.missing") {
                    Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                    Ok(_) => return Err(io::Error::other("user.missing exists")),
                    Err(e) => return Err(e),
                },
                _ => std::fs::remove_file(p)?,
            }
        }
        *us_k = t.elapsed().as_secs_f64() * 1e6 / files as f64;
        reqs[k] = (fs.requests().0 - before) as f64 / files as f64;
        mix[k] = fs
            .by_op
            .iter()
            .enumerate()
            .filter_map(|(op, c)| {
                let n = c.load(Ordering::Relaxed) - ops_before[op];
                (n > 0).then(|| format!("{} {:.2}", opcode_name(op), n as f64 / files as f64))
            })
            .collect::<Vec<_>>()
            .join(" + ");
    }
    Ok((us, reqs, mix))
}

fn opcode_name(op: usize) -> String {
    match op as u32 {
        opcode::LOOKUP => "LOOKUP".into(),
        opcode::GETATTR => "GETATTR".into(),
        opcode::CREATE => "CREATE".into(),
        opcode::FLUSH => "FLUSH".into(),
        opcode::RELEASE => "RELEASE".into(),
        opcode::UNLINK => "UNLINK".into(),
        opcode::GETXATTR => "GETXATTR".into(),
        opcode::FORGET => "FORGET".into(),
        opcode::BATCH_FORGET => "BATCH_FORGET".into(),
        opcode::OPEN => "OPEN".into(),
        opcode::ACCESS => "ACCESS".into(),
        52 => "STATX (ENOSYS)".into(),
        other => format!("op{other}"),
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let mut files = 2000usize;
    let mut runs = 5usize;
    let mut depth = 4usize;
    let mut payload = None;
    let mut repeat = 1usize;
    let mut modes = vec![Mode::Classic1, Mode::Classic2, Mode::Pinned, Mode::Cross, Mode::Uring, Mode::UringDefer];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage(&format!("{a} needs a value")));
        match a.as_str() {
            "--files" => files = val().parse().unwrap_or_else(|_| usage("--files N")),
            "--runs" => runs = val().parse().unwrap_or_else(|_| usage("--runs R")),
            "--repeat" => repeat = val().parse().unwrap_or_else(|_| usage("--repeat K")),
            "--depth" => depth = val().parse().unwrap_or_else(|_| usage("--depth D")),
            // Payload buffer size per entry; a size below the kernel's minimum shows the
            // fallback when registration fails.
            "--payload" => payload = Some(val().parse().unwrap_or_else(|_| usage("--payload BYTES"))),
            "--modes" => {
                modes = val().split(',').map(|m| Mode::parse(m).unwrap_or_else(|| usage(m))).collect();
            }
            _ => usage(&a),
        }
    }
    if files == 0 || runs == 0 || repeat == 0 {
        usage("--files, --runs and --repeat must be at least 1");
    }

    // SIGINT/SIGTERM: detach the current mount so the client stops, then exit.
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    if let Err(e) = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None) {
        eprintln!("blocking signals: {e}");
    }
    thread::spawn(move || {
        if let Ok(sig) = set.wait() {
            eprintln!("{sig}: unmounting");
            STOPPING.store(true, Ordering::Relaxed);
            if let Some(dir) = CURRENT.lock().unwrap().take() {
                let _ = umount2(&dir, MntFlags::MNT_DETACH);
                let _ = std::fs::remove_dir(&dir);
            }
            std::process::exit(130);
        }
    });

    let enable = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("unreadable ({e})"));
    println!(
        "fuse_transport_probe: {files} files x {runs} rounds, queue depth {depth}, {} possible CPUs, enable_uring={enable}, load {}",
        possible_cpus(),
        loadavg()
    );
    // Each repeat mounts every mode afresh, in turn: where the scheduler puts an unpinned
    // daemon thread relative to the caller is decided per mount and sticks, so the spread
    // between mounts is the number to look at, not just the rounds within one.
    let mut by_mode: Vec<Vec<Row>> = modes.iter().map(|_| Vec::new()).collect();
    for _ in 0..repeat {
        for (i, &m) in modes.iter().enumerate() {
            match run_mode(m, files, runs, depth, payload) {
                Ok(r) => by_mode[i].push(r),
                Err(e) => {
                    eprintln!("{}: {e}", m.label());
                    std::process::exit(1);
                }
            }
        }
    }
    let rows: Vec<Row> = by_mode.into_iter().map(summarize).collect();
    println!();
    println!(
        "| transport | create µs | stat µs | getxattr miss µs | unlink µs | requests/op (c/s/g/u) | via ring | notes |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {:.1}/{:.1}/{:.1}/{:.1} | {:.0}% | {} |",
            r.label,
            r.cells[0],
            r.cells[1],
            r.cells[2],
            r.cells[3],
            r.reqs[0],
            r.reqs[1],
            r.reqs[2],
            r.reqs[3],
            r.ring_share * 100.0,
            r.note
        );
    }
    println!();
    if let Some(r) = rows.first() {
        println!("Requests per operation ({}, last round):", r.label);
        for (k, op) in OPS.iter().enumerate() {
            println!("  {op}: {}", r.mix[k]);
        }
    }
    println!();
    println!("(µs: median over {repeat} mounts (min–max), each the median of {runs} rounds of {files} ops; {}; load after: {})", OPS.join(", "), loadavg());
}

fn usage(msg: &str) -> ! {
    eprintln!("fuse_transport_probe: {msg}");
    eprintln!(
        "usage: fuse_transport_probe [--files N] [--runs R] [--repeat K] [--depth D] [--payload BYTES] [--modes classic1,classic2,pinned,cross,uring,uring-defer]"
    );
    std::process::exit(2)
}
