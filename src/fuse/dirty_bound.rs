//! With the writeback cache: how much file data the kernel may hold dirty for the mount
//! (its bdi's `max_bytes`; FUSE bdis have a strict limit), and the room the volume keeps
//! free for it, the *cushion*, so that ENOSPC comes at write() (see `Server`'s
//! `near_full_check`).
//!
//! The bound is also the page cache a writer gets: four random writers over 1 GiB with a
//! 256 MiB bound made the kernel write scattered pages back all the time, one WRITE each,
//! at 0.4–0.6× ext4's speed, and at 1.4–1.5× with a 1 GiB bound. But the cushion is kept
//! free, and "near full" (every write asks first) starts at two cushions. So the bound
//! has two levels: *large* (a quarter of the volume, at most 1 GiB) while at least two
//! of its cushions and the slack are free, and *small* (a sixteenth, at most 1 GiB)
//! below: the bound drops where near full would begin with the large one.
//!
//! Lowering is the delicate direction: pages dirtied under the large bound stay dirty
//! after the kernel's limit drops. So the kernel's limit drops first, then a thread of
//! its own `syncfs`es the mount (the kernel writes everything dirty back to us, and from
//! then on holds at most the small bound), and only then does the cushion shrink. Until
//! that is done the volume keeps the large cushion (and is near full, which is safe).
//! Raising sets the cushion first, then the kernel's limit.

#![forbid(unsafe_code)]

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Without sysfs (not root) the bound cannot be set or read: assume this much.
const UNKNOWN: u64 = 256 << 20;

/// The kernel's dirty bound for one mount, and the cushion kept for it.
pub(super) struct DirtyBound {
    /// The bdi's `max_bytes`, when it could be set (else the bound is fixed).
    sysfs: Option<PathBuf>,
    mountpoint: PathBuf,
    large: u64,
    small: u64,
    /// Bytes kept free for the kernel's dirty pages now.
    cushion: AtomicU64,
    /// The small bound is in force, or being put in force.
    lowered: AtomicBool,
    /// A change of level is under way (one at a time).
    busy: AtomicBool,
}

impl DirtyBound {
    /// Set the mount's bound (connection `conn`, a volume of `volume_bytes`) to its large
    /// level, as far as the kernel allows, and keep that much free. A bound that cannot be
    /// set stays fixed at what the kernel reports (or 256 MiB).
    pub(super) fn new(conn: Option<super::mountinfo::Conn>, volume_bytes: u64, mountpoint: PathBuf) -> Arc<DirtyBound> {
        let large = (volume_bytes / 4).clamp(1 << 20, 1 << 30);
        let small = (volume_bytes / 16).clamp(1 << 20, 1 << 30);
        let path = conn.map(|c| PathBuf::from(format!("{}/max_bytes", c.bdi())));
        let (sysfs, cushion) = match &path {
            Some(p) => match set(p, large) {
                Ok(c) => (Some(p.clone()), c),
                Err(c) => (None, c),
            },
            None => (None, UNKNOWN),
        };
        tracing::info!("the kernel may hold {cushion} bytes of file data dirty: kept free for it");
        Arc::new(DirtyBound {
            sysfs,
            mountpoint,
            large,
            small,
            cushion: AtomicU64::new(cushion),
            lowered: AtomicBool::new(false),
            busy: AtomicBool::new(false),
        })
    }

    /// A bound fixed at `cushion` bytes, set nowhere (for tests of the server).
    #[cfg(test)]
    pub(super) fn fixed(cushion: u64) -> Arc<DirtyBound> {
        Arc::new(DirtyBound {
            sysfs: None,
            mountpoint: PathBuf::new(),
            large: cushion,
            small: cushion,
            cushion: AtomicU64::new(cushion),
            lowered: AtomicBool::new(false),
            busy: AtomicBool::new(false),
        })
    }

    /// Bytes to keep free for what the kernel may hold dirty.
    pub(super) fn cushion(&self) -> u64 {
        self.cushion.load(Ordering::Acquire)
    }

    /// Change level if `available` bytes (and `slack` for what the kernel's accounting
    /// lets through) call for it: below two large bounds lower it (in a thread, which
    /// waits for the kernel's write-back), from three large bounds on raise it again.
    pub(super) fn adjust(self: &Arc<Self>, available: u64, slack: u64) {
        let Some(sysfs) = &self.sysfs else { return };
        let lowered = self.lowered.load(Ordering::Acquire);
        // Lowered where near full would begin with the large bound's room (so it never
        // begins while the bound could still shrink), raised with room to spare.
        let lower = !lowered && available < 2 * self.cushion() + slack;
        let raise = lowered && available >= 3 * (self.large + self.large / 16) + slack;
        if !(lower || raise) || self.busy.swap(true, Ordering::AcqRel) {
            return;
        }
        if raise {
            // Room first, then the kernel may use it.
            self.cushion.fetch_max(self.large, Ordering::AcqRel);
            match set(sysfs, self.large) {
                Ok(c) | Err(c) => self.cushion.store(c.max(self.cushion()), Ordering::Release),
            }
            self.lowered.store(false, Ordering::Release);
            self.busy.store(false, Ordering::Release);
            tracing::info!("room again: the kernel may hold {} bytes dirty", self.cushion());
            return;
        }
        self.lowered.store(true, Ordering::Release);
        let me = self.clone();
        let spawned = std::thread::Builder::new().name("dxfs-bound".into()).spawn(move || {
            me.lower();
            me.busy.store(false, Ordering::Release);
        });
        if spawned.is_err() {
            // The large cushion stays: safe, only earlier near full.
            self.busy.store(false, Ordering::Release);
        }
    }

    /// Lower the kernel's bound, have it write back what it holds dirty, then shrink the
    /// cushion to the new bound. On any failure the cushion stays as it was.
    fn lower(&self) {
        let Some(sysfs) = &self.sysfs else { return };
        let bound = match set(sysfs, self.small) {
            Ok(b) => b,
            Err(_) => return,
        };
        let synced = std::fs::File::open(&self.mountpoint)
            .map_err(|e| e.to_string())
            .and_then(|f| nix::unistd::syncfs(f.as_fd()).map_err(|e| e.to_string()));
        match synced {
            Ok(()) => {
                self.cushion.store(bound, Ordering::Release);
                tracing::info!("free space below two dirty bounds: the kernel may now hold {bound} bytes dirty");
            }
            Err(e) => tracing::warn!("cannot write the mount's dirty pages back ({e}): the cushion stays"),
        }
    }
}

/// Set `max_bytes` to `want` and return the room to keep for the bound in force: what
/// the kernel reads back (it caps the bound by its own dirty limit) and a sixteenth more,
/// since the kernel keeps the bound as a share of a dirty limit that follows the
/// machine's free memory, and the bytes it stands for drift (by 1% within one test run
/// here). `Err` with that room (or `UNKNOWN`) if it could not be set.
fn set(path: &PathBuf, want: u64) -> Result<u64, u64> {
    let wrote = std::fs::write(path, want.to_string());
    let now = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|&c| c > 0)
        .map(|c| c + c / 16);
    match (wrote, now) {
        (Ok(()), Some(c)) => Ok(c),
        (Err(e), now) => {
            tracing::info!("cannot set the kernel's dirty limit for this mount to {want} bytes: {e}");
            Err(now.unwrap_or(UNKNOWN))
        }
        (Ok(()), None) => Err(UNKNOWN),
    }
}
