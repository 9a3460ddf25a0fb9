//! The mount mark (ro_compat MOUNT_MARK, docs/FORMAT.md §15): one block where a
//! read-write open records who holds the volume, rewritten every few seconds by a thread
//! of its own, so that a second host, which the image's flock cannot see, or a mount that
//! crashed, is recognised (ext4's MMP block, made small).
//!
//! A read-write open finds:
//! - a clean mark (the last holder closed): takes it at once;
//! - a mark of this process, or of a process of this host (same boot, same pid namespace)
//!   that no longer exists: a crashed holder; takes it at once;
//! - a mark rewritten by its holder's clock less than `FRESH_INTERVALS` intervals ago:
//!   refuses with [`Error::Busy`] naming host and pid;
//! - any other mark (stale, from the future, or unreadable): waits about two of its
//!   intervals and reads it again; a mark that changed meanwhile has a live holder
//!   (refused), one that did not is taken over, and read once more after another wait so
//!   that two hosts taking over at the same moment do not both win.
//!
//! The holder's thread reads the mark before each rewrite; a mark that is no longer its
//! own means another host took the volume over, and the volume then refuses every
//! further change (`Error::Failed`) rather than write over the other's deltas. Opens of
//! one device handle within a process share one holder (fsck and resize open the volume
//! several times while they hold it).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};

use crate::disk::codec::BLOCK_SIZE;
use crate::disk::device::BlockDevice;
use crate::disk::format::{MountMark, Superblock, MARK_HOST_MAX};
use crate::error::{Error, Result};

use super::known::KnownEntry;

/// How often a holder rewrites its mark, unless the open says otherwise (ext4's default
/// MMP interval).
pub(crate) const DEFAULT_INTERVAL_MS: u32 = 5000;
/// A mark rewritten less than this many of its intervals ago has a live holder.
pub(crate) const FRESH_INTERVALS: u64 = 3;
/// Bounds on the interval a mark states (a damaged or hostile value must not make an
/// open wait for hours, or spin).
const MIN_INTERVAL_MS: u32 = 50;
const MAX_INTERVAL_MS: u32 = 60_000;

/// Who this process is, as a mark records it.
struct Identity {
    host: String,
    boot_id: [u8; 16],
    pid_ns: u64,
}

fn identity() -> &'static Identity {
    static ID: OnceLock<Identity> = OnceLock::new();
    ID.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let host = truncate(host.trim().to_string());
        let mut boot_id = [0u8; 16];
        if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
            if let Ok(u) = uuid::Uuid::parse_str(s.trim()) {
                boot_id = *u.as_bytes();
            }
        }
        let pid_ns =
            std::fs::metadata("/proc/self/ns/pid").map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap_or(0);
        Identity { host, boot_id, pid_ns }
    })
}

/// A host name cut to what a mark keeps, on a character boundary.
fn truncate(mut s: String) -> String {
    while s.len() > MARK_HOST_MAX {
        s.pop();
    }
    s
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// Whether `m` was written by a process of this host's running kernel and pid namespace,
/// where its pid means something.
fn same_host(m: &MountMark) -> bool {
    let me = identity();
    me.boot_id != [0; 16] && me.pid_ns != 0 && m.boot_id == me.boot_id && m.pid_ns == me.pid_ns
}

/// Whether process `pid` of this host exists (EPERM: it does, owned by someone else).
fn pid_alive(pid: u32) -> bool {
    let Ok(p) = i32::try_from(pid) else { return true };
    if p <= 0 {
        return true;
    }
    if matches!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None), Err(nix::errno::Errno::ESRCH)) {
        return false;
    }
    // A process that has exited but is not yet reaped (a zombie) holds nothing any more.
    match std::fs::read_to_string(format!("/proc/{p}/stat")) {
        Ok(stat) => {
            !matches!(stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()), Some('Z' | 'X'))
        }
        Err(_) => true,
    }
}

/// The interval a mark states, within sane bounds.
fn interval_of(m: &MountMark) -> u64 {
    u64::from(m.interval_ms.clamp(MIN_INTERVAL_MS, MAX_INTERVAL_MS))
}

/// How long to watch a mark before calling it stale: ext4's `min(2·i + 1 s, i + 60 s)`.
fn watch_ms(interval: u64) -> u64 {
    (2 * interval + 1000).min(interval + 60_000)
}

fn read_mark(dev: &dyn BlockDevice, block: u64) -> Result<Result<MountMark>> {
    let mut b = [0u8; BLOCK_SIZE];
    dev.read_fresh(block, &mut b)?;
    Ok(MountMark::decode(&b, block))
}

fn write_mark(dev: &dyn BlockDevice, block: u64, m: &MountMark) -> Result<()> {
    dev.write(block, &m.encode(block)[..])?;
    dev.flush()
}

/// What a mark says of its holder, for messages.
pub(crate) fn describe(m: &MountMark) -> String {
    let host = if m.host.is_empty() { "an unnamed host" } else { &m.host };
    let age = now_ms() as i128 - m.time_ms as i128;
    let when = if age >= 0 {
        format!("{:.1} s ago", age as f64 / 1000.0)
    } else {
        format!("{:.1} s in the future by this host's clock", -age as f64 / 1000.0)
    };
    let this = if same_host(m) { " (this host)" } else { "" };
    format!("host {host}{this}, pid {}, mount mark last written {when}", m.pid)
}

/// The mark as a read-only look sees it (fsck -n, info): `Ok(None)` for a volume without
/// one.
pub(crate) fn inspect(dev: &dyn BlockDevice, sb: &Superblock) -> Result<Option<Result<MountMark>>> {
    if !sb.mount_mark() {
        return Ok(None);
    }
    Ok(Some(read_mark(dev, sb.layout.mark_block)?))
}

/// The mount mark of the volume on `dev` in words: `None` for a volume without one, else
/// "clean", "in use by host …, pid …, …" or why it cannot be read (`dxfs info`).
pub fn status(dev: &dyn BlockDevice) -> Result<Option<String>> {
    let sb = crate::volume::read_superblock(dev)?;
    Ok(inspect(dev, &sb)?.map(|m| match m {
        Ok(m) if m.in_use && looks_held(&m) => format!("in use by {}", describe(&m)),
        Ok(m) if m.in_use => format!("left in use by {} (a crash?)", describe(&m)),
        Ok(_) => "clean".to_string(),
        Err(e) => format!("unreadable ({e}); dxfs fsck writes it again"),
    }))
}

/// The process of this host that holds the volume on `dev` by its mount mark, if one
/// does (another process, still running): a daemon still serving, or one finishing after
/// `umount`, which tools wait for (`dxfs fsck` over NBD, where no image lock tells).
pub fn holder_on_this_host(dev: &dyn BlockDevice) -> Result<Option<u32>> {
    let sb = crate::volume::read_superblock(dev)?;
    Ok(match inspect(dev, &sb)? {
        Some(Ok(m)) if m.in_use && same_host(&m) && m.pid != std::process::id() && pid_alive(m.pid) => Some(m.pid),
        _ => None,
    })
}

/// Whether a mark read now has a live holder as far as one read can tell: in use, and
/// either of a live process of this host or rewritten within `FRESH_INTERVALS` intervals.
pub(crate) fn looks_held(m: &MountMark) -> bool {
    if !m.in_use {
        return false;
    }
    if same_host(m) {
        return if m.pid == std::process::id() { held_here(m.seq) } else { pid_alive(m.pid) };
    }
    let age = now_ms() as i128 - m.time_ms as i128;
    age >= 0 && age as u64 <= FRESH_INTERVALS * interval_of(m)
}

/// The mark held by a read-write open, and the thread that keeps it fresh. Dropping the
/// last reference stops the thread and marks the volume clean (unless another host took
/// it over meanwhile).
pub(crate) struct Holder {
    dev: Arc<dyn BlockDevice>,
    block: u64,
    shared: Arc<Shared>,
    /// Where this host's record of the volume goes (`known.rs`), if the open said.
    known: Option<KnownEntry>,
    /// The refresh thread; `None` while parked.
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct Shared {
    stop: Mutex<bool>,
    wake: Condvar,
    /// Another host's mark replaced ours: the volume must not change any more.
    lost: AtomicBool,
    /// The sequence number of the mark we last wrote.
    seq: AtomicU64,
    /// Our mark, as last written.
    mark: Mutex<MountMark>,
    /// The volume was left clean (`Volume::shutdown`): the mark is written clean and the
    /// thread stopped, until the next commit takes the mark again (`Holder::unpark`).
    parked: AtomicBool,
}

impl Holder {
    /// Whether another host has taken the volume over.
    pub(crate) fn lost(&self) -> bool {
        self.shared.lost.load(Ordering::Acquire)
    }

    fn start(&self, thread: &mut Option<JoinHandle<()>>) -> Result<()> {
        *self.shared.stop.lock() = false;
        let (dev, shared, block) = (self.dev.clone(), self.shared.clone(), self.block);
        *thread = Some(
            std::thread::Builder::new()
                .name("dxfs-mark".into())
                .spawn(move || refresh(&*dev, block, &shared))
                .map_err(Error::Io)?,
        );
        Ok(())
    }

    fn stop(&self, thread: &mut Option<JoinHandle<()>>) {
        *self.shared.stop.lock() = true;
        self.shared.wake.notify_all();
        if let Some(t) = thread.take() {
            let _ = t.join();
        }
    }

    /// Write the mark clean, if it is still ours (else it is someone else's to clear).
    fn release(&self) {
        let ours = self.shared.seq.load(Ordering::Acquire);
        match read_mark(&*self.dev, self.block) {
            Ok(Ok(m)) if m.seq == ours => {
                let mut m = self.shared.mark.lock();
                m.in_use = false;
                m.seq = m.seq.wrapping_add(1).max(1);
                m.time_ms = now_ms();
                match write_mark(&*self.dev, self.block, &m) {
                    Ok(()) => {
                        self.shared.seq.store(m.seq, Ordering::Release);
                        drop(m);
                        self.record(false);
                    }
                    Err(e) => tracing::warn!("marking the volume closed failed: {e}"),
                }
            }
            Ok(_) => tracing::warn!("the mount mark is no longer this open's: left as it is"),
            Err(e) => tracing::warn!("reading the mount mark at close failed: {e}"),
        }
    }

    /// The volume was left clean and nothing is changing it: write the mark clean and
    /// stop rewriting it, so that the next open (here or on another host) finds the volume
    /// free even if this process never drops the volume. The next commit takes it again.
    pub(crate) fn park(&self) {
        let mut t = self.thread.lock();
        if self.shared.parked.load(Ordering::Acquire) || self.lost() {
            return;
        }
        self.stop(&mut t);
        self.release();
        self.shared.parked.store(true, Ordering::Release);
    }

    /// Before a parked volume changes again: take the mark back, if nobody else took it
    /// meanwhile (then the volume must not change: `Error::Busy`, and it is lost).
    pub(crate) fn unpark(&self) -> Result<()> {
        if !self.shared.parked.load(Ordering::Acquire) {
            return if self.lost() { Err(Error::Failed) } else { Ok(()) };
        }
        let mut t = self.thread.lock();
        if !self.shared.parked.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Ok(m) = read_mark(&*self.dev, self.block)? {
            if m.in_use {
                self.shared.lost.store(true, Ordering::Release);
                return Err(Error::Busy(format!(
                    "the volume was taken over by {} since it was left clean here",
                    describe(&m)
                )));
            }
        }
        let mut m = self.shared.mark.lock();
        m.in_use = true;
        m.seq = m.seq.wrapping_add(1).max(1);
        m.time_ms = now_ms();
        write_mark(&*self.dev, self.block, &m)?;
        self.shared.seq.store(m.seq, Ordering::Release);
        drop(m);
        self.shared.parked.store(false, Ordering::Release);
        self.record(true);
        self.start(&mut t)
    }

    /// Write this host's record of the volume: open (the mark just taken) or closed (just
    /// written clean). A record that cannot be written costs the next open a walk only.
    fn record(&self, open: bool) {
        let Some(k) = &self.known else { return };
        let r = if open {
            k.volumes.record_open(&k.source, &*self.dev)
        } else {
            k.volumes.record_closed(&k.source, &*self.dev).map(|_| ())
        };
        if let Err(e) = r {
            tracing::warn!("cannot record the volume as this host leaves it ({e}): its next mount checks it first");
        }
    }
}

/// The holders of this process, by device handle: opens of one handle share one.
type Held = Mutex<Vec<(usize, Weak<Holder>)>>;
fn held() -> &'static Held {
    static HELD: OnceLock<Held> = OnceLock::new();
    HELD.get_or_init(|| Mutex::new(Vec::new()))
}

/// Whether an open of this process holds a mark with sequence number `seq`.
fn held_here(seq: u64) -> bool {
    // Upgraded outside the registry's lock: dropping the last reference takes it.
    let live: Vec<Arc<Holder>> = held().lock().iter().filter_map(|(_, w)| w.upgrade()).collect();
    live.iter().any(|h| h.shared.seq.load(Ordering::Acquire) == seq)
}

fn key_of(dev: &Arc<dyn BlockDevice>) -> usize {
    Arc::as_ptr(dev) as *const u8 as usize
}

/// Take the volume's mount mark for a read-write open, or say who holds it. `None` for a
/// volume without one. `interval_ms` is how often the holder rewrites it.
pub(crate) fn acquire(
    dev: &Arc<dyn BlockDevice>,
    sb: &Superblock,
    interval_ms: u32,
    known: Option<&KnownEntry>,
) -> Result<Option<Arc<Holder>>> {
    if !sb.mount_mark() {
        return Ok(None);
    }
    let key = key_of(dev);
    {
        let mut h = held().lock();
        h.retain(|(_, w)| w.strong_count() > 0);
        if let Some(holder) = h.iter().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade()) {
            return Ok(Some(holder));
        }
    }
    let block = sb.layout.mark_block;
    let interval_ms = interval_ms.clamp(MIN_INTERVAL_MS, MAX_INTERVAL_MS);
    let found = read_mark(&**dev, block)?;
    let busy = |m: &MountMark| {
        Error::Busy(format!(
            "the volume is in use by {} (dxfs mount mark): unmount it there first; a mark its holder \
             stopped rewriting is taken over once it is {} s old, after watching it for {} s",
            describe(m),
            FRESH_INTERVALS * interval_of(m) / 1000,
            watch_ms(interval_of(m)) / 1000
        ))
    };
    // How long to watch the mark found before taking it over, if at all.
    let watch = match &found {
        Ok(m) if !m.in_use => None,
        Ok(m) if m.pid == std::process::id() && same_host(m) => {
            // This process: through another device handle that is still open, or left
            // by an open of an earlier process with our pid, or a copy of the image.
            if held_here(m.seq) {
                return Err(Error::Busy(
                    "the volume is already open read-write in this process, through another device handle".into(),
                ));
            }
            None
        }
        Ok(m) if same_host(m) && !pid_alive(m.pid) => {
            tracing::info!("taking over the mount mark of {}, a process that is gone", describe(m));
            None
        }
        Ok(m) if looks_held(m) => return Err(busy(m)),
        Ok(m) => Some(watch_ms(interval_of(m))),
        Err(_) => Some(watch_ms(u64::from(DEFAULT_INTERVAL_MS))),
    };
    if let Some(ms) = watch {
        match &found {
            Ok(m) => tracing::warn!(
                "the volume was not closed cleanly by {}; waiting {:.1} s to be sure it is not in use",
                describe(m),
                ms as f64 / 1000.0
            ),
            Err(e) => tracing::warn!(
                "the mount mark is unreadable ({e}); waiting {:.1} s to be sure the volume is not in use",
                ms as f64 / 1000.0
            ),
        }
        std::thread::sleep(Duration::from_millis(ms));
        match (read_mark(&**dev, block)?, &found) {
            // Closed meanwhile: free.
            (Ok(now), _) if !now.in_use => {}
            (Ok(now), Ok(then)) if now != *then => return Err(busy(&now)),
            (Ok(now), Err(_)) => return Err(busy(&now)),
            _ => {}
        }
    }
    let me = identity();
    let old_seq = found.as_ref().map(|m| m.seq).unwrap_or(0);
    let mut seq = rand_seq();
    while seq == old_seq {
        seq = rand_seq();
    }
    let mark = MountMark {
        seq,
        in_use: true,
        interval_ms,
        time_ms: now_ms(),
        pid: std::process::id(),
        pid_ns: me.pid_ns,
        boot_id: me.boot_id,
        host: me.host.clone(),
    };
    write_mark(&**dev, block, &mark)?;
    if let Some(ms) = watch {
        // Someone else may have been watching the same stale mark: whoever wrote last
        // wins, and the other sees it here.
        std::thread::sleep(Duration::from_millis(ms));
        match read_mark(&**dev, block)? {
            Ok(now) if now.seq == seq => {}
            Ok(now) => return Err(busy(&now)),
            Err(e) => return Err(e),
        }
    }
    let shared = Arc::new(Shared {
        stop: Mutex::new(false),
        wake: Condvar::new(),
        lost: AtomicBool::new(false),
        seq: AtomicU64::new(seq),
        mark: Mutex::new(mark),
        parked: AtomicBool::new(false),
    });
    let holder = Arc::new(Holder { dev: dev.clone(), block, shared, thread: Mutex::new(None), known: known.cloned() });
    holder.record(true);
    {
        let mut t = holder.thread.lock();
        holder.start(&mut t)?;
    }
    held().lock().push((key, Arc::downgrade(&holder)));
    Ok(Some(holder))
}

fn rand_seq() -> u64 {
    let u = uuid::Uuid::new_v4();
    u64::from_le_bytes(u.as_bytes()[..8].try_into().unwrap_or([1; 8])) | 1
}

/// The holder's thread: every interval, check that the mark is still ours and rewrite it.
fn refresh(dev: &dyn BlockDevice, block: u64, shared: &Shared) {
    let interval = Duration::from_millis(u64::from(shared.mark.lock().interval_ms));
    loop {
        {
            let mut stop = shared.stop.lock();
            if !*stop {
                shared.wake.wait_for(&mut stop, interval);
            }
            if *stop {
                return;
            }
        }
        let ours = shared.seq.load(Ordering::Acquire);
        match read_mark(dev, block) {
            Ok(Ok(m)) if m.in_use && m.seq == ours => {}
            Ok(found) => {
                let who = match &found {
                    Ok(m) => describe(m),
                    Err(e) => format!("an unreadable mark ({e})"),
                };
                tracing::error!(
                    "the volume's mount mark was replaced by {who}: another host opened it read-write; \
                     this open makes no further changes"
                );
                shared.lost.store(true, Ordering::Release);
                return;
            }
            Err(e) => {
                tracing::warn!("reading the mount mark failed: {e}; trying again in {interval:?}");
                continue;
            }
        }
        let mut m = shared.mark.lock();
        m.seq = m.seq.wrapping_add(1).max(1);
        m.time_ms = now_ms();
        match write_mark(dev, block, &m) {
            Ok(()) => shared.seq.store(m.seq, Ordering::Release),
            Err(e) => tracing::warn!("rewriting the mount mark failed: {e}"),
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let mut t = self.thread.lock();
        self.stop(&mut t);
        drop(t);
        held().lock().retain(|(_, w)| w.strong_count() > 0);
        if self.lost() || self.shared.parked.load(Ordering::Acquire) {
            return;
        }
        self.release();
    }
}
