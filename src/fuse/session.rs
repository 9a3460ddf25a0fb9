//! Mounting and serving: the session that carries requests between the kernel and the
//! adapter. This is the transport seam: the classic `/dev/fuse` loop of `fuser` today.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};

use crate::Volume;

use super::adapter::DxFuse;
use super::mountinfo::mount_id_of;
use super::FuseOptions;

/// A live mount: the kernel has completed INIT, so the file system is usable.
pub struct Mounted {
    session: Session<DxFuse>,
    vol: Arc<Volume>,
    mountpoint: PathBuf,
    sync_interval: Duration,
    /// Our mount's id in /proc/self/mountinfo, when dxfs mounted it itself (as root):
    /// only that mount is ever unmounted, never a later one on the same path.
    mount_id: Option<u64>,
}

/// Mount `vol` on `mountpoint` and return once the mount is live.
///
/// As root dxfs mounts the kernel side itself (mount(2) on a /dev/fuse descriptor), so
/// it knows its mount's id and unmounts nothing else: after `umount` and a quick
/// remount on the same directory, the exiting daemon leaves the new mount alone.
/// Other users mount through fusermount3 with auto_unmount (fuser's own mount, which
/// may unmount the path at exit).
pub fn mount(vol: Arc<Volume>, mountpoint: &Path, opts: &FuseOptions) -> io::Result<Mounted> {
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName(opts.fsname.clone()),
        // The kernel's own option: the mount table then shows type fuse.dxfs.
        MountOption::CUSTOM("subtype=dxfs".into()),
        if opts.read_only { MountOption::RO } else { MountOption::RW },
    ];
    if opts.default_permissions {
        cfg.mount_options.push(MountOption::DefaultPermissions);
    }

    if opts.allow_other {
        cfg.acl = SessionACL::All;
    }
    cfg.n_threads = Some(opts.threads.max(1));
    // Each thread gets its own /dev/fuse descriptor, so they do not contend on one.
    cfg.clone_fd = opts.threads > 1;
    let invalidate: super::adapter::Invalidations = Default::default();
    let fs = DxFuse::new(vol.clone(), opts.clone(), invalidate.clone());
    let (session, mount_id) = if nix::unistd::geteuid().is_root() {
        let fd = kernel_mount(mountpoint, opts)?;
        // The kernel answers nothing on the mount until INIT: find our mount's id in the
        // mount table (which does not ask the file system) before the handshake.
        let id = mount_id_of(mountpoint);
        match Session::from_fd(fs, fd, cfg.acl, cfg) {
            Ok(s) => (s, id),
            Err(e) => {
                let _ = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH);
                return Err(e);
            }
        }
    } else {
        // fuser mounts directly when it can open /dev/fuse and gives up when it cannot
        // (mode 0600 on some systems) instead of asking fusermount3: ask it ourselves.
        let fd = super::fusermount::mount(mountpoint, &fusermount_options(opts))?;
        (Session::from_fd(fs, fd, cfg.acl, cfg)?, None)
    };
    start_invalidator(&session, &invalidate)?;
    Ok(Mounted { session, vol, mountpoint: mountpoint.to_path_buf(), sync_interval: opts.sync_interval, mount_id })
}

/// The thread that tells the kernel to drop cached pages of ranges written with
/// O_DIRECT (see the adapter's `write`). It ends when the adapter, and with it the
/// channel's sender, goes away.
fn start_invalidator(session: &Session<DxFuse>, slot: &super::adapter::Invalidations) -> io::Result<()> {
    let notifier = session.notifier();
    let (tx, rx) = mpsc::channel::<(u64, i64, i64)>();
    std::thread::Builder::new().name("dxfs-inval".into()).spawn(move || {
        for (ino, offset, len) in rx {
            if let Err(e) = notifier.inval_inode(fuser::INodeNo(ino), offset, len) {
                // ENOENT: the kernel holds no inode for it, so nothing is cached.
                tracing::debug!("page-cache invalidation of node {ino}: {e}");
            }
        }
    })?;
    let _ = slot.set(tx);
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
    nix::mount::mount(Some(opts.fsname.as_str()), mountpoint, Some("fuse.dxfs"), flags, Some(data.as_str()))
        .map_err(io::Error::from)?;
    Ok(fd)
}

impl Mounted {
    /// A handle that ends this mount from another thread (a signal thread, say).
    pub fn stopper(&mut self) -> Stopper {
        Stopper {
            unmounter: self.session.unmount_callable(),
            mountpoint: self.mountpoint.clone(),
            vol: self.vol.clone(),
            mount_id: self.mount_id,
        }
    }

    /// Serve requests until the file system is unmounted (`umount`, `fusermount3 -u`,
    /// or a [`Stopper`]), committing the volume every `sync_interval` and at the end.
    pub fn run(self) -> io::Result<()> {
        let (stop, stopped) = mpsc::channel::<()>();
        let vol = self.vol.clone();
        let interval = self.sync_interval;
        let syncer = std::thread::Builder::new().name("dxfs-sync".into()).spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                if let Err(e) = vol.sync() {
                    tracing::error!("periodic commit failed: {e}");
                }
            }
        })?;
        let served = self.session.run();
        drop(stop);
        let _ = syncer.join();
        let synced = self.vol.shutdown().map_err(|e| io::Error::other(format!("final commit failed: {e}")));
        served.and(synced)
    }
}

/// Ends a mount: see [`Mounted::stopper`].
pub struct Stopper {
    unmounter: SessionUnmounter,
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
        if let Some(id) = self.mount_id {
            // Our own mount: unmount it only if it is still the one on the path.
            if mount_id_of(&self.mountpoint) != Some(id) {
                tracing::info!("{} no longer holds this mount; nothing to unmount", self.mountpoint.display());
                return Ok(());
            }
            return match nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::empty()) {
                Ok(()) => Ok(()),
                Err(nix::errno::Errno::EBUSY) => {
                    tracing::info!("{} is busy; detaching it", self.mountpoint.display());
                    nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH).map_err(io::Error::from)
                }
                Err(e) => Err(e.into()),
            };
        }
        // fuser's unmount gives up its claim on the mount even when it fails, so it
        // never unmounts the same path again (which might by then be another mount).
        let Err(e) = self.unmounter.unmount() else { return Ok(()) };
        tracing::info!("unmounting {}: {e}; detaching it", self.mountpoint.display());
        match nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) => Ok(()),
            Err(nix::errno::Errno::EPERM) => {
                let st =
                    std::process::Command::new("fusermount3").arg("-u").arg("-z").arg(&self.mountpoint).status()?;
                if st.success() {
                    Ok(())
                } else {
                    Err(io::Error::other(format!("fusermount3 -u -z failed: {st}")))
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}
