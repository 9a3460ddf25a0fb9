//! Mounting and serving: the session that carries requests between the kernel and the
//! adapter. This is the transport seam: the classic `/dev/fuse` loop of `fuser` today.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};

use crate::Volume;

use super::adapter::DxFuse;
use super::FuseOptions;

/// A live mount: the kernel has completed INIT, so the file system is usable.
pub struct Mounted {
    session: Session<DxFuse>,
    vol: Arc<Volume>,
    mountpoint: PathBuf,
    sync_interval: Duration,
}

/// Mount `vol` on `mountpoint` and return once the mount is live.
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
    let fs = DxFuse::new(vol.clone(), opts.clone());
    let session = Session::new(fs, mountpoint, &cfg)?;
    Ok(Mounted { session, vol, mountpoint: mountpoint.to_path_buf(), sync_interval: opts.sync_interval })
}

impl Mounted {
    /// A handle that ends this mount from another thread (a signal thread, say).
    pub fn stopper(&mut self) -> Stopper {
        Stopper {
            unmounter: self.session.unmount_callable(),
            mountpoint: self.mountpoint.clone(),
            vol: self.vol.clone(),
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
}

impl Stopper {
    /// Commit, then unmount. A busy mount is detached lazily instead: it leaves the
    /// namespace now, and the session ends when its last user lets go.
    pub fn stop(&mut self) -> io::Result<()> {
        if let Err(e) = self.vol.sync() {
            tracing::error!("commit failed: {e}");
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
