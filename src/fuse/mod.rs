//! FUSE frontend: serves a [`Volume`](crate::Volume) to the kernel, speaking the kernel's
//! FUSE protocol itself (classic `/dev/fuse` or FUSE over io_uring).
//!
//! This layer only translates: FUSE inode numbers to volume inode numbers (FUSE's root is
//! always 1, the volume's root is not), requests to [`Volume`](crate::Volume) calls, [`Error`](crate::Error)s to
//! errnos and attributes to `fuse_attr`s. Every filesystem rule lives in the volume; the
//! kernel enforces permissions (`default_permissions`) and keeps the page, entry and
//! attribute caches.
//!
//! [`mount`] mounts and returns once the kernel has finished INIT, so callers can report
//! a live mount; [`Mounted::run`] serves until the file system is unmounted, committing
//! the volume every few seconds and once more at the end; a [`Stopper`] unmounts from
//! another thread.
//!
//! Files: `wire` (the kernel's wire format), `server` (the request handler over the
//! volume: translation only), `transport` (the classic and io_uring request loops),
//! `uring` (one io_uring queue: the buffers the kernel writes into), `session` (mounting,
//! INIT, starting the transport), `dirty_bound` (the kernel's dirty bound for a mount
//! with the writeback cache, and the room kept for it), `lookups` (the kernel's inode references), `stats`
//! (requests per opcode), `devfd` (cloned descriptors), `fusermount` (mounts by users
//! other than root), `mountinfo`.

use std::time::Duration;

mod blockers;
pub mod control;
mod devfd;
mod dirty_bound;
mod fusermount;
mod keep_awake;
mod lookups;
mod mountinfo;
mod server;
mod session;
mod stats;
// The kernel's wire format, the transports and one io_uring queue: public for the
// transport probe (examples/fuse_transport_probe.rs), not part of the stable API.
#[doc(hidden)]
pub mod transport;
#[doc(hidden)]
pub mod uring;
#[doc(hidden)]
pub mod wire;

pub use mountinfo::{dxfs_mounts, image_is_mounted};
pub use server::STATS_XATTR;
pub use session::{mount, Mounted, Stopper};
pub use transport::TransportChoice;

/// How a volume is served.
#[derive(Clone, Debug)]
pub struct FuseOptions {
    /// How long the kernel may cache attributes. Every change to a volume goes through
    /// its one mount, and the kernel invalidates what each change touches (the parent on
    /// create/unlink/rename, the inode on link/unlink/setattr/setxattr/write), so long
    /// timeouts stay coherent; they matter for scans longer than the timeout, such as an
    /// `rm -rf` of a big directory, which would otherwise LOOKUP again every name it
    /// read with READDIRPLUS.
    pub attr_timeout: Duration,
    /// How long the kernel may cache names (positive lookups).
    pub entry_timeout: Duration,
    /// How long the kernel may cache a name's absence (a lookup that missed); zero to
    /// ask every time.
    pub negative_timeout: Duration,
    /// Let the kernel cache writes and send them in big batches (FUSE_WRITEBACK_CACHE).
    /// On by default. Its costs: opens of files take an OPEN round trip (its reply steers
    /// the cache: docs/DESIGN.md, "The writeback cache"), a close of a written file
    /// sends its dirty pages and times, and the kernel drops the cached st_blocks at
    /// every close (the next `stat` costs a GETATTR).
    pub writeback_cache: bool,
    /// Let the kernel check permissions against mode, owner and POSIX ACLs.
    pub default_permissions: bool,
    /// Let users other than the one who mounted use the mount.
    pub allow_other: bool,
    /// Mount read-only (the volume should be opened read-only too).
    pub read_only: bool,
    /// Request-serving threads of the classic transport, each with its own /dev/fuse
    /// descriptor (default: one per CPU).
    pub threads: usize,
    /// Which transport serves requests (`-o transport=auto|uring|classic`).
    pub transport: TransportChoice,
    /// Classic transport: how long a serving thread polls for the next request before
    /// it sleeps (`-o spin_us=N`; zero: it sleeps at once). Threads beyond the first.
    pub spin: Duration,
    /// io_uring transport: how long after the last request a thread per CPU at nice 19
    /// keeps idle CPUs from halting, so that callers do not hop to a halted CPU and wait
    /// for it to wake (`-o keep_awake_us=N`; zero, the default: never). `None`
    /// (`keep_awake_us=auto`): the mount decides by measuring how fast this host wakes an
    /// idle CPU (docs/DESIGN.md, "Keepers").
    pub keep_awake: Option<Duration>,
    /// The kernel's readahead for files of this mount, in KiB (`-o readahead_kb=N`; 0
    /// leaves the kernel's default of 128). Set through the mount's bdi in sysfs, which
    /// only root may write.
    pub readahead_kb: u32,
    /// When the kernel asks for READDIRPLUS instead of READDIR.
    pub readdirplus: ReaddirPlus,
    /// Source shown in the mount table (the image or device).
    pub fsname: String,
    /// A block device holding the volume (a loop device over its image) to mount as
    /// `fuseblk` (root only): the kernel then sends `sync` and `syncfs` on (FUSE_SYNCFS),
    /// and `umount` waits for the DESTROY, which the server answers once the volume is
    /// committed. `None`: a plain `fuse` mount, where `sync` reaches no daemon.
    pub block_device: Option<std::path::PathBuf>,
    /// How often the volume is committed while mounted.
    pub sync_interval: Duration,
    /// Kernel mount flags: device nodes usable (`dev`), setuid/setgid honoured (`suid`),
    /// programs executable (`exec`), and the atime flags shown in the mount table (the
    /// volume applies its atime policy itself: FUSE inodes are S_NOATIME).
    pub flags: MountFlags,
}

/// The per-mount kernel flags `-o` can set, as mount(8) names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountFlags {
    /// `dev` (off: `nodev`, the default, as for every FUSE mount).
    pub dev: bool,
    /// `suid` (off: `nosuid`, the default).
    pub suid: bool,
    /// `exec` (the default; off: `noexec`).
    pub exec: bool,
    /// `noatime`, `strictatime` or `relatime` (the default).
    pub atime: crate::AtimePolicy,
    /// `nodiratime`.
    pub nodiratime: bool,
}

impl Default for MountFlags {
    fn default() -> Self {
        MountFlags { dev: false, suid: false, exec: true, atime: crate::AtimePolicy::Relative, nodiratime: false }
    }
}

impl MountFlags {
    /// Apply one mount(8) option; false if it is not one of these.
    pub fn set(&mut self, opt: &str) -> bool {
        match opt {
            "dev" => self.dev = true,
            "nodev" => self.dev = false,
            "suid" => self.suid = true,
            "nosuid" => self.suid = false,
            "exec" => self.exec = true,
            "noexec" => self.exec = false,
            "noatime" => self.atime = crate::AtimePolicy::Never,
            "strictatime" => self.atime = crate::AtimePolicy::Strict,
            "relatime" | "atime" => self.atime = crate::AtimePolicy::Relative,
            "nodiratime" => self.nodiratime = true,
            "diratime" => self.nodiratime = false,
            _ => return false,
        }
        true
    }

    /// The mount(2) flags (without MS_RDONLY or MS_REMOUNT).
    pub fn ms_flags(&self) -> nix::mount::MsFlags {
        use nix::mount::MsFlags;
        let mut f = MsFlags::empty();
        f.set(MsFlags::MS_NODEV, !self.dev);
        f.set(MsFlags::MS_NOSUID, !self.suid);
        f.set(MsFlags::MS_NOEXEC, !self.exec);
        f.set(MsFlags::MS_NODIRATIME, self.nodiratime);
        match self.atime {
            crate::AtimePolicy::Never => f |= MsFlags::MS_NOATIME,
            crate::AtimePolicy::Strict => f |= MsFlags::MS_STRICTATIME,
            crate::AtimePolicy::Relative => f |= MsFlags::MS_RELATIME,
        }
        f
    }
}

/// When the kernel reads a directory with READDIRPLUS (names with attributes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReaddirPlus {
    /// The kernel decides: the first batch, and later ones once a child was looked up.
    Auto,
    /// Every batch: `rm -rf` and `find` then need no LOOKUP per entry, but a plain `ls`
    /// of a cold directory reads every inode block.
    Always,
    /// Never: names only.
    Never,
}

impl Default for FuseOptions {
    fn default() -> Self {
        FuseOptions {
            attr_timeout: Duration::from_secs(60),
            entry_timeout: Duration::from_secs(60),
            negative_timeout: Duration::from_secs(60),
            writeback_cache: true,
            default_permissions: true,
            allow_other: false,
            read_only: false,
            // One per CPU: with a thread already awake on the other CPU a request waits
            // less for a wake-up, and requests of different processes run side by side
            // (measured in docs/BENCHMARKS.md, "Daemon threads").
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            transport: TransportChoice::Auto,
            spin: Duration::ZERO,
            // Off: keepers hide idle CPUs from the scheduler for every task, which costs
            // mixed loads more than round trips gain (docs/BENCHMARKS.md, "Keepers").
            keep_awake: Some(Duration::ZERO),
            // One 1 MiB READ (the largest request, 256 pages) instead of eight 128 KiB
            // ones: a cold sequential read went from 0.34 to 1.3 GB/s on this host.
            readahead_kb: 1024,
            readdirplus: ReaddirPlus::Always,
            fsname: "dxfs".into(),
            block_device: None,
            sync_interval: Duration::from_secs(5),
            flags: MountFlags::default(),
        }
    }
}
