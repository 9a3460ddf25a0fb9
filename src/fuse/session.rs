//! Mounting and serving: the FUSE session dxfs owns. It mounts (mount(2) as root,
//! fusermount3 otherwise), answers INIT, and starts the transport `negotiate` chose:
//! io_uring queues, one per CPU on a thread pinned there (plus one `/dev/fuse` reader for
//! what the kernel still sends there), or classic `/dev/fuse` reader threads.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use super::dirty_bound::DirtyBound;
use super::keep_awake::Keepers;
use crate::Volume;

use super::mountinfo::{connection_of, mount_id_of, Conn};
use super::server::Server;
use super::transport::{self, Device, TransportChoice};
use super::uring::{Queue, QueueConfig};
use super::wire::{self, init, opcode, InitIn};
use super::{FuseOptions, ReaddirPlus};

/// Largest WRITE (and READ) the kernel sends: 1 MiB, the kernel's default
/// `max_pages_limit` of 256 pages. Each io_uring entry holds a payload buffer this big.
const MAX_WRITE: u32 = 1 << 20;
const MAX_PAGES: u16 = 256;
/// A `/dev/fuse` read must hold the largest request: a WRITE's data and its headers.
const CLASSIC_BUFFER: usize = MAX_WRITE as usize + 4096;
/// Entries per io_uring queue: requests one CPU can have in flight (its serving thread
/// answers them one after another; the rest wait in the kernel's queue).
const QUEUE_DEPTH: usize = 8;

/// A live mount: the kernel has completed INIT, so the file system is usable.
pub struct Mounted {
    server: Arc<Server>,
    vol: Arc<Volume>,
    mountpoint: PathBuf,
    sync_interval: Duration,
    /// Our mount's id in /proc/self/mountinfo, when dxfs mounted it itself (as root):
    /// only that mount is ever unmounted, never a later one on the same path.
    mount_id: Option<u64>,
    /// The serving threads; they end when the kernel ends the session.
    threads: Vec<JoinHandle<()>>,
    /// Which transport serves, and why (for the log and `dxfs stats`).
    pub transport: String,
}

/// Mount `vol` on `mountpoint` and return once the mount is live.
///
/// As root dxfs mounts the kernel side itself (mount(2) on a /dev/fuse descriptor), so
/// it knows its mount's id and unmounts nothing else: after `umount` and a quick
/// remount on the same directory, the exiting daemon leaves the new mount alone.
/// Other users mount through fusermount3, which hands the descriptor back.
pub fn mount(vol: Arc<Volume>, mountpoint: &Path, opts: &FuseOptions) -> io::Result<Mounted> {
    if opts.block_device.is_some() && !nix::unistd::geteuid().is_root() {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, "a fuseblk mount (blkdev) needs root"));
    }
    if opts.transport != TransportChoice::Classic {
        offer_uring(Path::new(ENABLE_URING));
    }
    let (fd, mount_id) = if nix::unistd::geteuid().is_root() {
        let fd = kernel_mount(mountpoint, opts)?;
        // The kernel answers nothing on the mount until INIT: find our mount's id in the
        // mount table (which does not ask the file system) before the handshake.
        (fd, mount_id_of(mountpoint))
    } else {
        (super::fusermount::mount(mountpoint, &fusermount_options(opts))?, None)
    };
    let dev = Arc::new(File::from(fd));
    let server = Arc::new(Server::new(vol.clone(), opts.clone()));
    let conn = connection_of(mountpoint);
    let started = handshake(&dev, opts, &server).and_then(|uring| {
        if opts.writeback_cache {
            let fs = vol.statfs();
            server.set_dirty_bound(DirtyBound::new(conn, fs.blocks * u64::from(fs.bsize), mountpoint.to_path_buf()));
        }
        serve(&dev, &server, opts, uring, conn)
    });
    let (threads, transport) = match started {
        Ok(t) => t,
        Err(e) => {
            // Never leave a mount nobody serves.
            detach(mountpoint, mount_id);
            return Err(e);
        }
    };
    if opts.readahead_kb > 0 && mount_id.is_some() {
        set_readahead(conn, opts.readahead_kb);
    }
    tracing::info!("serving {} with {transport}", mountpoint.display());
    let _ = server.transport.set(transport.clone());
    Ok(Mounted {
        server,
        vol,
        mountpoint: mountpoint.to_path_buf(),
        sync_interval: opts.sync_interval,
        mount_id,
        threads,
        transport,
    })
}

/// The fuse module's switch for FUSE over io_uring: while it is N (its default) the
/// kernel offers no rings to any FUSE server.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turn FUSE over io_uring on for this host when it is off and we may (root), so a plain
/// mount gets the faster transport. It changes nothing for FUSE servers that do not ask
/// for rings; `-o transport=classic` leaves it alone. Without the switch (a kernel built
/// without it) or without the right, negotiation says why the mount is classic.
fn offer_uring(switch: &Path) {
    let Ok(was) = std::fs::read_to_string(switch) else { return };
    if was.trim() != "N" || !nix::unistd::geteuid().is_root() {
        return;
    }
    match std::fs::write(switch, "Y") {
        Ok(()) => tracing::info!(
            "turned FUSE over io_uring on for this host ({} = Y; FUSE servers that ask for no rings are \
             unchanged; -o transport=classic does not turn it on)",
            switch.display()
        ),
        Err(e) => tracing::info!("cannot turn FUSE over io_uring on ({}: {e})", switch.display()),
    }
}

/// The INIT flags dxfs asks for.
fn wanted_flags(opts: &FuseOptions) -> u64 {
    let mut want = init::PARALLEL_DIROPS
        | init::ASYNC_READ
        | init::BIG_WRITES
        | init::ASYNC_DIO
        | init::MAX_PAGES
        // Symlinks never change, so the kernel may keep their targets.
        | init::CACHE_SYMLINKS
        // The daemon drops setuid/setgid bits and file capabilities on write, truncate
        // and chown itself: the kernel then marks inodes S_NOSEC and stops asking for
        // security.capability (one GETXATTR) before every write.
        | init::HANDLE_KILLPRIV_V2
        // File handles (name_to_handle_at, open_by_handle_at, NFS export): node ids are
        // inode numbers and carry their generation, so a handle stays valid across
        // remounts and turns stale (ESTALE) once its inode slot is reused.
        | init::EXPORT_SUPPORT
        // Zero-message opens: OPENDIR/RELEASEDIR (and, without the writeback cache,
        // OPEN/RELEASE) round trips go away; inodes the kernel references live on after
        // their last link instead.
        | init::NO_OPENDIR_SUPPORT;
    // The writeback cache needs OPEN: its reply is where a writer is told to bypass the
    // cache near full, and an open for reading is where atime moves.
    if !opts.writeback_cache {
        want |= init::NO_OPEN_SUPPORT;
    }
    match opts.readdirplus {
        ReaddirPlus::Auto => want |= init::DO_READDIRPLUS | init::READDIRPLUS_AUTO,
        ReaddirPlus::Always => want |= init::DO_READDIRPLUS,
        ReaddirPlus::Never => {}
    }
    if opts.writeback_cache {
        want |= init::WRITEBACK_CACHE;
    }
    // POSIX_ACL makes the kernel enforce ACLs, and it turns default_permissions on, so
    // it is only asked for when permissions are the kernel's job anyway. DONT_MASK hands
    // the umask to the volume, which ignores it when a default ACL is inherited.
    if opts.default_permissions {
        want |= init::POSIX_ACL | init::DONT_MASK;
    }
    want
}

/// Read INIT from `/dev/fuse` and answer it. Returns whether to start io_uring queues.
fn handshake(dev: &File, opts: &FuseOptions, server: &Server) -> io::Result<bool> {
    let mut buf = vec![0u8; CLASSIC_BUFFER];
    let n = (&*dev).read(&mut buf)?;
    let (h, arg, _) = wire::split_classic(&buf[..n]).map_err(io::Error::other)?;
    if h.opcode != opcode::INIT {
        return Err(io::Error::other(format!("first request is opcode {}, not INIT", h.opcode)));
    }
    let i = InitIn::parse(arg).map_err(io::Error::other)?;
    let mut n = match transport::negotiate(&i, opts.transport, wanted_flags(opts), MAX_WRITE, MAX_PAGES) {
        Ok(n) => n,
        Err(e) => {
            let _ = (&*dev).write_all(&wire::reply(h.unique, libc::EPROTO, &[]));
            return Err(io::Error::other(e));
        }
    };
    // More background requests keep readahead and asynchronous writes flowing.
    n.out.max_background = 64;
    n.out.congestion_threshold = 48;
    let missing = wanted_flags(opts) & !n.out.flags;
    if missing != 0 {
        tracing::info!("kernel lacks FUSE capabilities {missing:#x}");
    }
    let mut body = Vec::with_capacity(wire::InitOut::SIZE);
    n.out.encode(&mut body);
    server.set_zero_message_open(n.out.flags & init::NO_OPEN_SUPPORT != 0, n.out.flags & init::NO_OPENDIR_SUPPORT != 0);
    server.set_writeback_cache(n.out.flags & init::WRITEBACK_CACHE != 0);
    (&*dev).write_all(&wire::reply(h.unique, 0, &body))?;
    // The one case a user can act on gets a line at the default log level: the kernel
    // has FUSE over io_uring, switched off, and this mount could not switch it on.
    let switched_off = std::fs::read_to_string(ENABLE_URING).is_ok_and(|v| v.trim() == "N");
    if opts.transport == TransportChoice::Auto && !n.uring && switched_off {
        tracing::warn!("{}", n.why);
    } else if opts.transport == TransportChoice::Uring && !n.uring {
        tracing::warn!("-o transport=uring: {}", n.why);
    } else {
        tracing::info!("{}", n.why);
    }
    Ok(n.uring)
}

/// Start the serving threads: io_uring queues when `uring`, falling back to classic
/// threads when they cannot be registered. Returns the threads and a description.
fn serve(
    dev: &Arc<File>,
    server: &Arc<Server>,
    opts: &FuseOptions,
    uring: bool,
    conn: Option<Conn>,
) -> io::Result<(Vec<JoinHandle<()>>, String)> {
    start_invalidator(dev, server)?;
    let mut threads = Vec::new();
    let mut first = 0;
    if uring {
        // One reader of /dev/fuse always: FORGETs, INTERRUPTs and, until every queue has
        // registered, everything else come that way.
        threads.push(spawn_device(dev.clone(), server.clone(), "dxfs-fuse-0")?);
        first = 1;
        let (linger, why) = super::keep_awake::decide(opts.keep_awake);
        tracing::info!("{why}");
        let keepers = match linger.map(|l| Keepers::start(&super::keep_awake::allowed_cpus(), l)) {
            Some(Ok(k)) => Some(Arc::new(k)),
            Some(Err(e)) => {
                tracing::warn!("keepers not started: {e}");
                None
            }
            None => None,
        };
        let kept = if keepers.is_some() { ", idle CPUs kept awake" } else { "" };
        match start_queues(dev, server, conn, keepers) {
            Ok(mut queues) => {
                let n = queues.len();
                threads.append(&mut queues);
                return Ok((threads, format!("io_uring ({n} queues, one per CPU, threads pinned{kept})")));
            }
            Err(e) => tracing::warn!("{e}; serving through /dev/fuse instead"),
        }
    }
    for i in first..opts.threads.max(1) {
        let name = format!("dxfs-fuse-{i}");
        // The first thread reads the descriptor itself; the others, and every polling
        // one (O_NONBLOCK belongs to the open file), read clones of it.
        if i == 0 && opts.spin.is_zero() {
            threads.push(spawn_device(dev.clone(), server.clone(), &name)?);
            continue;
        }
        let d: Arc<dyn Device> = match super::devfd::clone(dev) {
            Ok(d) if !opts.spin.is_zero() => Arc::new(transport::Spinning::new(d, opts.spin)?),
            Ok(d) => Arc::new(d),
            Err(e) => {
                tracing::info!("cannot clone /dev/fuse ({e}); threads share one descriptor");
                dev.clone()
            }
        };
        threads.push(spawn_device(d, server.clone(), &name)?);
    }
    let spin = if opts.spin.is_zero() { String::new() } else { format!(", polling {:?} before sleeping", opts.spin) };
    Ok((threads, format!("/dev/fuse ({} threads{spin})", opts.threads.max(1))))
}

fn spawn_device(dev: Arc<dyn Device>, server: Arc<Server>, name: &str) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.into()).spawn(move || {
        if let Err(e) = transport::serve_classic(&*dev, &*server, CLASSIC_BUFFER) {
            tracing::error!("/dev/fuse: {e}");
        }
    })
}

/// The queues the kernel waits for before it uses the ring: one per possible CPU.
fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| transport::parse_possible_cpus(&s))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// One thread per possible CPU, pinned there, each registering its queue. Returns once
/// every queue has registered, or the first failure. A failed REGISTER leaves the kernel
/// on `/dev/fuse` (it switches to the ring only when every queue has an entry), so the
/// caller may fall back to classic threads; queue threads that did register then idle
/// until the session ends.
/// The queue threads share `keepers`, which stop when the last queue ends.
fn start_queues(
    dev: &Arc<File>,
    server: &Arc<Server>,
    conn: Option<Conn>,
    keepers: Option<Arc<Keepers>>,
) -> io::Result<Vec<JoinHandle<()>>> {
    let cpus = possible_cpus();
    let cfg = QueueConfig {
        depth: QUEUE_DEPTH,
        payload_size: wire::uring::payload_size(MAX_WRITE, MAX_PAGES, 4096),
        defer_taskrun: true,
    };
    let (tx, rx) = mpsc::channel::<io::Result<()>>();
    let mut threads = Vec::new();
    // Fault injection for the tests: queue N gets a payload buffer the kernel refuses,
    // so registration fails half way (the other queues registered).
    let broken: Option<usize> = std::env::var("DXFS_TEST_BREAK_URING_QUEUE").ok().and_then(|v| v.parse().ok());
    for qid in 0..cpus {
        let (dev, server, tx, keepers) = (dev.clone(), server.clone(), tx.clone(), keepers.clone());
        let cfg = if broken == Some(qid) { QueueConfig { payload_size: 4096, ..cfg } } else { cfg };
        threads.push(
            std::thread::Builder::new()
                .name(format!("dxfs-queue-{qid}"))
                .spawn(move || serve_queue(dev, server, qid as u16, cfg, conn, tx, keepers))?,
        );
    }
    drop(tx);
    // One message per queue; a thread that died without one ends the iteration early.
    let results: Vec<io::Result<()>> = rx.iter().take(cpus).collect();
    let failures: Vec<String> = results.iter().filter_map(|r| r.as_ref().err().map(|e| e.to_string())).collect();
    if !failures.is_empty() || results.len() < cpus {
        return Err(io::Error::other(format!("io_uring queues not registered ({})", failures.join("; "))));
    }
    Ok(threads)
}

/// One io_uring queue: pin, register, then answer requests until the connection ends.
fn serve_queue(
    dev: Arc<File>,
    server: Arc<Server>,
    qid: u16,
    cfg: QueueConfig,
    conn: Option<Conn>,
    registered: mpsc::Sender<io::Result<()>>,
    keepers: Option<Arc<Keepers>>,
) {
    let setup = || -> io::Result<Queue> {
        let mut set = nix::sched::CpuSet::new();
        set.set(qid as usize).map_err(io::Error::other)?;
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
            .map_err(|e| io::Error::other(format!("pinning queue {qid} to its CPU: {e}")))?;
        let mut q = Queue::new(dev.clone(), qid, cfg)
            .map_err(|e| io::Error::other(format!("io_uring setup for queue {qid}: {e}")))?;
        q.register().map_err(|e| io::Error::other(format!("FUSE_IO_URING_CMD_REGISTER on queue {qid}: {e}")))?;
        Ok(q)
    };
    let mut q = match setup() {
        Ok(q) => q,
        Err(e) => {
            let _ = registered.send(Err(e));
            return;
        }
    };
    let _ = registered.send(Ok(()));
    drop(registered);
    let arrived = |opcode: u32| {
        if let Some(k) = &keepers {
            k.arrived(opcode);
        }
    };
    if let Err(e) = transport::serve_queue(&mut q, &*server, &arrived) {
        // Once the ring is in use, this CPU's requests would hang: end the connection.
        tracing::error!("queue {qid}: {e}; aborting the FUSE connection");
        abort_connection(conn);
    }
}

/// Abort FUSE connection `conn` (`echo 1 > /sys/fs/fuse/connections/N/abort`): every
/// waiting request fails with ENOTCONN and the mount answers nothing more.
fn abort_connection(conn: Option<Conn>) {
    let r = match conn {
        Some(c) => std::fs::write(format!("{}/abort", c.dir()), "1"),
        None => Err(io::Error::other("connection number unknown")),
    };
    if let Err(e) = r {
        tracing::error!("cannot abort the FUSE connection ({e}); unmount it by hand");
    }
}

/// Set the kernel's readahead for the mount's files: the bdi of a FUSE connection is
/// named after its device number, 0:N. (The INIT reply can only lower it.)
fn set_readahead(conn: Option<Conn>, kb: u32) {
    let Some(c) = conn else { return };
    if let Err(e) = std::fs::write(format!("{}/read_ahead_kb", c.bdi()), kb.to_string()) {
        tracing::info!("cannot set readahead to {kb} KiB: {e}");
    }
}

/// The thread that tells the kernel what to drop when the sender must not wait for it:
/// attributes of open writers near full, names an import made while a LOOKUP missed
/// (see the server's `import`). It ends when the server, and with it the
/// channel's sender, goes away.
fn start_invalidator(dev: &Arc<File>, server: &Server) -> io::Result<()> {
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let thread_dev = dev.clone();
    std::thread::Builder::new().name("dxfs-inval".into()).spawn(move || {
        for msg in rx {
            if let Err(e) = (&*thread_dev).write_all(&msg) {
                // ENOENT: the kernel holds no such inode or name, so nothing is cached.
                tracing::debug!("invalidation: {e}");
            }
        }
    })?;
    server.set_invalidations(tx, dev.clone());
    Ok(())
}

/// fusermount3's `-o` for a mount by a user other than root: what `kernel_mount` gives
/// mount(2) as root (fusermount3 refuses `dev` and `suid` to users, with its own message).
fn fusermount_options(opts: &FuseOptions) -> String {
    let f = opts.flags;
    let mut o = vec![
        format!("fsname={}", opts.fsname.replace(',', "\\,")),
        "subtype=dxfs".to_string(),
        (if opts.read_only { "ro" } else { "rw" }).into(),
        (if f.dev { "dev" } else { "nodev" }).into(),
        (if f.suid { "suid" } else { "nosuid" }).into(),
        (if f.exec { "exec" } else { "noexec" }).into(),
    ];
    // fusermount3 knows noatime but not relatime or strictatime; the volume applies its
    // policy either way.
    if f.atime == crate::AtimePolicy::Never {
        o.push("noatime".into());
    }
    if opts.default_permissions {
        o.push("default_permissions".into());
    }
    if opts.allow_other {
        o.push("allow_other".into());
    }
    o.join(",")
}

/// mount(2) a FUSE file system of type fuse.dxfs on `mountpoint`, served through a new
/// /dev/fuse descriptor, which is returned.
fn kernel_mount(mountpoint: &Path, opts: &FuseOptions) -> io::Result<OwnedFd> {
    use nix::mount::MsFlags;
    let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
    let fd = OwnedFd::from(dev);
    let root_mode = std::fs::metadata(mountpoint)?.permissions().mode() & libc::S_IFMT;
    let mut data = format!(
        "fd={},rootmode={:o},user_id={},group_id={}",
        fd.as_raw_fd(),
        root_mode,
        nix::unistd::geteuid(),
        nix::unistd::getegid()
    );
    if opts.default_permissions {
        data.push_str(",default_permissions");
    }
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    let mut flags = opts.flags.ms_flags();
    if opts.read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    match &opts.block_device {
        // The kernel opens the device (exclusively, for the superblock) and names the
        // mount by it; it reads nothing from it: every request still comes here.
        Some(bdev) => {
            data.push_str(",blksize=4096"); // the volume's block size
            nix::mount::mount(Some(bdev.as_path()), mountpoint, Some("fuseblk.dxfs"), flags, Some(data.as_str()))
        }
        None => {
            nix::mount::mount(Some(opts.fsname.as_str()), mountpoint, Some("fuse.dxfs"), flags, Some(data.as_str()))
        }
    }
    .map_err(io::Error::from)?;
    Ok(fd)
}

/// Take a mount that failed to start off its directory: ours by id as root, else through
/// fusermount3.
fn detach(mountpoint: &Path, mount_id: Option<u64>) {
    if mount_id.is_some() {
        if mount_id_of(mountpoint) == mount_id {
            let _ = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH);
        }
    } else {
        let _ = std::process::Command::new("fusermount3").arg("-u").arg("-z").arg(mountpoint).status();
    }
}

impl Mounted {
    /// A handle that ends this mount from another thread (a signal thread, say).
    pub fn stopper(&mut self) -> Stopper {
        Stopper { mountpoint: self.mountpoint.clone(), vol: self.vol.clone(), mount_id: self.mount_id }
    }

    /// Serve requests until the file system is unmounted (`umount`, `fusermount3 -u`,
    /// or a [`Stopper`]), committing the volume every `sync_interval` and at the end.
    pub fn run(self) -> io::Result<()> {
        let (stop, stopped) = mpsc::channel::<()>();
        let vol = self.vol.clone();
        let interval = self.sync_interval;
        let syncer = std::thread::Builder::new().name("dxfs-sync".into()).spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                match vol.sync() {
                    Ok(()) => {}
                    // Only a commit waiting for the storage's room fails so; it said so.
                    Err(e @ crate::Error::NoSpace) => tracing::debug!("periodic commit: {e}"),
                    Err(e) => tracing::error!("periodic commit failed: {e}"),
                }
            }
        })?;
        for t in self.threads {
            let _ = t.join();
        }
        drop(stop);
        let _ = syncer.join();
        self.server.end();
        self.vol.shutdown().map_err(|e| io::Error::other(format!("final commit failed: {e}")))
    }
}

/// Ends a mount: see [`Mounted::stopper`].
pub struct Stopper {
    mountpoint: PathBuf,
    vol: Arc<Volume>,
    mount_id: Option<u64>,
}

impl Stopper {
    /// Commit, then unmount. A busy mount is detached lazily instead: it leaves the
    /// namespace now, and the session ends when its last user lets go.
    pub fn stop(&mut self) -> io::Result<()> {
        if let Err(e) = self.vol.sync() {
            tracing::error!("commit failed: {e}");
        }
        let Some(id) = self.mount_id else {
            // Mounted by fusermount3: unmount through it too (lazily if busy).
            let st = std::process::Command::new("fusermount3").arg("-u").arg("-z").arg(&self.mountpoint).status()?;
            return if st.success() {
                Ok(())
            } else {
                Err(io::Error::other(format!("fusermount3 -u -z failed: {st}")))
            };
        };
        // Our own mount: unmount it only if it is still the one on the path.
        if mount_id_of(&self.mountpoint) != Some(id) {
            tracing::info!("{} no longer holds this mount; nothing to unmount", self.mountpoint.display());
            return Ok(());
        }
        match nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::empty()) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::EBUSY) => {
                tracing::info!("{} is busy; detaching it", self.mountpoint.display());
                nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH).map_err(io::Error::from)
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The switch is turned on only when it is off and we are root; anything else in it
    /// is left as it is.
    #[test]
    fn offer_uring_turns_the_switch_on_as_root() {
        let dir = tempfile::tempdir().unwrap();
        let switch = dir.path().join("enable_uring");
        let root = nix::unistd::geteuid().is_root();
        for (was, want) in [("N\n", if root { "Y" } else { "N\n" }), ("Y\n", "Y\n"), ("x", "x")] {
            std::fs::write(&switch, was).unwrap();
            offer_uring(&switch);
            assert_eq!(std::fs::read_to_string(&switch).unwrap(), want, "switch was {was:?}");
        }
        offer_uring(&dir.path().join("missing"));
        assert!(!dir.path().join("missing").exists(), "a missing switch was created");
    }
}
