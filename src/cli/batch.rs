//! Copying entries into a directory for `dxfs cp -a` and `dxfs import`: on a dxfs mount
//! they go to the daemon in batches of many (`dxfs::fuse::control::import`), one
//! directory at a time, and the daemon makes each whole as the caller. An entry the
//! daemon cannot take is made with ordinary system calls, as `cp -a` makes it: when the
//! directory is not on a dxfs mount, when its contents do not fit in a batch, when its
//! name is taken (the old entry is replaced, as `tar -x` replaces it; a directory is kept).
//!
//! Two threads send the batches while this one reads the next files: the host's reads,
//! the round trips and the daemon's work overlap instead of taking turns. Batches in
//! flight together never name the same entry (a name met again waits for them: a later
//! entry replaces an earlier one). [`Sender::sync`] waits for every batch sent; the walk
//! calls it where an entry must exist before it goes on (a directory to fill, a hard
//! link's target, attributes set after a directory's contents).

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;

use dxfs::fuse::control::{self, ImportBatch};
use dxfs::NewEntry;

use super::{errno_text, open_dir};

pub(crate) const ACCESS_ACL: &str = "system.posix_acl_access";
pub(crate) const DEFAULT_ACL: &str = "system.posix_acl_default";

/// One entry to make, owning its bytes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Item {
    pub name: Vec<u8>,
    /// File type and permission bits.
    pub mode: u32,
    /// Owner and group wanted; `u32::MAX` keeps the caller's (chown's -1).
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    /// A small file's contents or a symlink's target.
    pub data: Vec<u8>,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Item {
    fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    fn with_entry<T>(&self, f: impl FnOnce(&NewEntry<'_>) -> T) -> T {
        let xattrs: Vec<(&[u8], &[u8])> = self.xattrs.iter().map(|(n, v)| (n.as_slice(), v.as_slice())).collect();
        f(&NewEntry {
            name: &self.name,
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            atime: self.atime,
            mtime: self.mtime,
            data: &self.data,
            xattrs: &xattrs,
        })
    }

    pub fn has_xattr(&self, name: &str) -> bool {
        self.xattrs.iter().any(|(n, _)| n == name.as_bytes())
    }

    /// Whether a regular file with `len` bytes of contents travels in a batch.
    pub fn fits_with(&self, len: u64) -> bool {
        let cost = self.with_entry(ImportBatch::cost) as u64 + len;
        ImportBatch::fits_alone(cost.try_into().unwrap_or(usize::MAX))
    }

    /// How `cp` names the kind of an entry it could not create.
    fn what(&self) -> &'static str {
        match self.kind() {
            libc::S_IFDIR => "directory",
            libc::S_IFLNK => "symbolic link",
            libc::S_IFREG => "regular file",
            libc::S_IFIFO => "fifo",
            _ => "special file",
        }
    }
}

/// What the walk and the sending thread share.
pub(crate) struct Shared {
    /// `cp` or `import`, for messages.
    prog: &'static str,
    /// The daemon takes batches: false once a directory answers ENOTTY (not a dxfs mount).
    daemon: AtomicBool,
    /// Entries made, and those made by the daemon; requests sent.
    made: AtomicU64,
    by_daemon: AtomicU64,
    batches: AtomicU64,
    ok: AtomicBool,
    pub bar: indicatif::ProgressBar,
}

struct Msg {
    dir: PathBuf,
    fd: Arc<File>,
    batch: ImportBatch,
    items: Vec<Item>,
}

/// Threads sending batches at once.
const SENDERS: usize = 2;

pub(crate) struct Sender {
    shared: Arc<Shared>,
    /// The directory the batch is for.
    dir: Option<(PathBuf, Arc<File>)>,
    batch: ImportBatch,
    pending: Vec<Item>,
    tx: Option<mpsc::SyncSender<Msg>>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// Batches handed over and not yet answered, and its signal.
    in_flight: Arc<(parking_lot::Mutex<usize>, parking_lot::Condvar)>,
    /// Names sent in the current directory since the last [`Sender::sync`].
    sent: std::collections::HashSet<Vec<u8>>,
    /// The current directory has a default ACL, which new entries inherit.
    pub inherits_acl: bool,
}

impl Sender {
    pub fn new(prog: &'static str) -> Sender {
        let bar = super::spinner();
        let shared = Arc::new(Shared {
            prog,
            daemon: AtomicBool::new(true),
            made: AtomicU64::new(0),
            by_daemon: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            ok: AtomicBool::new(true),
            bar,
        });
        // One batch queued beside those in flight: the reader stays just ahead.
        let (tx, rx) = mpsc::sync_channel::<Msg>(1);
        let rx = Arc::new(parking_lot::Mutex::new(rx));
        let in_flight = Arc::new((parking_lot::Mutex::new(0usize), parking_lot::Condvar::new()));
        let workers = (0..SENDERS)
            .map(|_| {
                let (sh, rx, flight) = (shared.clone(), rx.clone(), in_flight.clone());
                std::thread::Builder::new()
                    .name("dxfs-sender".into())
                    .spawn(move || loop {
                        let Ok(m) = rx.lock().recv() else { return };
                        sh.send(&m.dir, &m.fd, &m.batch, &m.items);
                        let mut n = flight.0.lock();
                        *n -= 1;
                        flight.1.notify_all();
                    })
                    .expect("a thread")
            })
            .collect();
        Sender {
            shared,
            dir: None,
            batch: ImportBatch::default(),
            pending: Vec::new(),
            tx: Some(tx),
            workers,
            in_flight,
            sent: Default::default(),
            inherits_acl: false,
        }
    }

    pub fn bar(&self) -> &indicatif::ProgressBar {
        &self.shared.bar
    }

    pub fn made(&self) -> u64 {
        self.shared.made.load(Relaxed)
    }

    pub fn count_made(&self) {
        self.shared.made.fetch_add(1, Relaxed);
    }

    pub fn ok(&self) -> bool {
        self.shared.ok.load(Relaxed)
    }

    /// Entries made by the daemon and requests sent, for the log.
    pub fn counts(&self) -> (u64, u64) {
        (self.shared.by_daemon.load(Relaxed), self.shared.batches.load(Relaxed))
    }

    /// Report a failure, as cp does, and go on.
    pub fn failed(&self, msg: String) {
        self.shared.failed(msg);
    }

    /// Send what is pending, then make entries in directory `dir` from now on. False
    /// (reported) when it cannot be opened.
    pub fn enter(&mut self, dir: &Path) -> bool {
        if self.dir.as_ref().is_some_and(|(d, _)| d == dir) {
            return true;
        }
        self.flush();
        self.dir = None;
        self.sent.clear();
        match open_dir(dir) {
            Ok(f) => {
                self.inherits_acl = matches!(xattr::get(dir, DEFAULT_ACL), Ok(Some(_)));
                self.dir = Some((dir.to_path_buf(), Arc::new(f)));
                true
            }
            Err(e) => {
                self.failed(format!("cannot open directory '{}': {}", dir.display(), errno_text(&e)));
                false
            }
        }
    }

    fn dir_path(&self) -> PathBuf {
        self.dir.as_ref().map(|(d, _)| d.clone()).expect("enter() first")
    }

    /// Make `item` in the current directory: in the next batch, or at once by system
    /// calls when the daemon cannot take it.
    pub fn add(&mut self, item: Item) {
        self.after_same_name(&item.name);
        if !self.shared.daemon.load(Relaxed) || !item.fits_with(0) {
            let path = self.dir_path().join(OsStr::from_bytes(&item.name));
            let data = item.data.clone();
            return self.shared.by_syscalls(&path, &item, &mut data.as_slice());
        }
        if !item.with_entry(|e| self.batch.push(e)) {
            self.flush();
            let pushed = item.with_entry(|e| self.batch.push(e));
            assert!(pushed, "an entry that fits alone fits an empty batch");
        }
        self.pending.push(item);
    }

    /// Make a regular file whose contents `src` gives (too large for a batch), at once.
    /// Batches in flight may still be making other names.
    pub fn add_large(&mut self, item: Item, src: &mut dyn Read) {
        self.after_same_name(&item.name);
        let path = self.dir_path().join(OsStr::from_bytes(&item.name));
        self.shared.by_syscalls(&path, &item, src);
    }

    /// A name met again in this directory waits for what is in flight, which may be
    /// making it (the later entry replaces the earlier).
    fn after_same_name(&mut self, name: &[u8]) {
        if self.sent.contains(name) {
            self.sync();
        }
        self.sent.insert(name.to_vec());
    }

    /// Hand the pending batch to the sending threads.
    pub fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let (dir, fd) = self.dir.clone().expect("a batch belongs to a directory");
        let msg = Msg { dir, fd, batch: std::mem::take(&mut self.batch), items: std::mem::take(&mut self.pending) };
        *self.in_flight.0.lock() += 1;
        self.tx.as_ref().expect("sending").send(msg).expect("the sending threads live as long as the sender");
    }

    /// Send what is pending and wait until every batch is done.
    pub fn sync(&mut self) {
        self.flush();
        let mut n = self.in_flight.0.lock();
        while *n > 0 {
            self.in_flight.1.wait(&mut n);
        }
        drop(n);
        self.sent.clear();
        self.shared.bar.set_message(format!("{} copied", self.made()));
    }

    /// Give `path` `item`'s xattrs, owner, mode and times ([`Shared::finish`]).
    pub fn finish(&self, path: &Path, item: &Item) {
        self.shared.finish(path, item);
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.flush();
        drop(self.tx.take());
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Shared {
    fn failed(&self, msg: String) {
        self.bar.suspend(|| eprintln!("dxfs {}: {msg}", self.prog));
        self.ok.store(false, Relaxed);
    }

    fn cannot_create(&self, item: &Item, path: &Path, e: &io::Error) {
        self.failed(format!("cannot create {} '{}': {}", item.what(), path.display(), errno_text(e)));
    }

    /// Send one batch and act on its answers.
    fn send(&self, dir: &Path, fd: &File, batch: &ImportBatch, items: &[Item]) {
        if !self.daemon.load(Relaxed) {
            return self.each_by_syscalls(dir, items);
        }
        self.batches.fetch_add(1, Relaxed);
        let answers = match control::import(fd.as_fd(), batch) {
            Ok(a) => a,
            Err(e) => {
                // Not a dxfs mount, or an older daemon: entry by entry from here on. Any
                // other refusal of the whole batch: this batch entry by entry.
                if e.raw_os_error() == Some(libc::ENOTTY) {
                    self.daemon.store(false, Relaxed);
                }
                return self.each_by_syscalls(dir, items);
            }
        };
        for (item, errno) in items.iter().zip(answers) {
            let path = dir.join(OsStr::from_bytes(&item.name));
            match errno {
                0 => {
                    self.made.fetch_add(1, Relaxed);
                    self.by_daemon.fetch_add(1, Relaxed);
                }
                // The name is taken: replaced (a directory kept), as tar and cp do.
                libc::EEXIST => self.by_syscalls(&path, item, &mut item.data.as_slice()),
                e => self.cannot_create(item, &path, &io::Error::from_raw_os_error(e)),
            }
        }
    }

    fn each_by_syscalls(&self, dir: &Path, items: &[Item]) {
        for item in items {
            self.by_syscalls(&dir.join(OsStr::from_bytes(&item.name)), item, &mut item.data.as_slice());
        }
    }

    /// Make `item` at `path` with system calls, as `cp -a` does: create, write, then
    /// xattrs, owner, mode and times. A directory is only made (its attributes come
    /// after its contents: [`Shared::finish`]).
    fn by_syscalls(&self, path: &Path, item: &Item, src: &mut dyn Read) {
        let made = match create(path, item, src) {
            Ok(m) => m,
            Err(e) => return self.cannot_create(item, path, &e),
        };
        self.made.fetch_add(u64::from(made), Relaxed);
        if item.kind() != libc::S_IFDIR {
            self.finish(path, item);
        }
    }

    /// Give `path` `item`'s xattrs, owner, mode and times, as far as the caller may
    /// (what it may not is skipped quietly, as `cp -a` skips it).
    pub fn finish(&self, path: &Path, item: &Item) {
        let Ok(c) = CString::new(path.as_os_str().as_bytes()) else { return };
        for (n, v) in &item.xattrs {
            // Refusals (EPERM for trusted.* as a user, ENOTSUP) are skipped as cp skips them.
            let _ = xattr::set(path, OsStr::from_bytes(n), v);
        }
        let uid = if item.uid == u32::MAX { None } else { Some(nix::unistd::Uid::from_raw(item.uid)) };
        let gid = if item.gid == u32::MAX { None } else { Some(nix::unistd::Gid::from_raw(item.gid)) };
        let nofollow = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
        let cwd = nix::fcntl::AT_FDCWD;
        if nix::unistd::fchownat(cwd, c.as_c_str(), uid, gid, nofollow).is_err() && gid.is_some() {
            let _ = nix::unistd::fchownat(cwd, c.as_c_str(), None, gid, nofollow);
        }
        // A mode already right is left alone (cp -a sets none on a directory it merged
        // into, so a directory of another owner gives no error).
        let same = std::fs::symlink_metadata(path).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.mode() & 0o7777 == item.mode & 0o7777
        });
        if item.kind() != libc::S_IFLNK && !same {
            let mode = nix::sys::stat::Mode::from_bits_truncate(item.mode & 0o7777);
            if let Err(e) =
                nix::sys::stat::fchmodat(cwd, c.as_c_str(), mode, nix::sys::stat::FchmodatFlags::FollowSymlink)
            {
                self.failed(format!("preserving permissions for '{}': {}", path.display(), e.desc()));
            }
        }
        let ts = |(s, ns): (i64, u32)| nix::sys::time::TimeSpec::new(s, i64::from(ns));
        let utime = nix::sys::stat::UtimensatFlags::NoFollowSymlink;
        if let Err(e) = nix::sys::stat::utimensat(cwd, c.as_c_str(), &ts(item.atime), &ts(item.mtime), utime) {
            self.failed(format!("preserving times for '{}': {}", path.display(), e.desc()));
        }
    }
}

/// Create `path`; an entry already there is replaced unless both are directories.
/// Whether a new entry was made.
fn create(path: &Path, item: &Item, src: &mut dyn Read) -> io::Result<bool> {
    let perm = item.mode & 0o7777;
    for attempt in 0..2 {
        let r = match item.kind() {
            libc::S_IFDIR => std::fs::DirBuilder::new().mode(perm | 0o700).create(path),
            libc::S_IFLNK => std::os::unix::fs::symlink(OsStr::from_bytes(&item.data), path),
            libc::S_IFREG => std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(perm & 0o777 | 0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)
                .and_then(|mut f| {
                    io::copy(src, &mut f)?;
                    f.flush()
                }),
            kind => {
                let dev = nix::sys::stat::SFlag::from_bits_truncate(kind);
                let mode = nix::sys::stat::Mode::from_bits_truncate(perm & 0o777);
                nix::sys::stat::mknod(path, dev, mode, item.rdev).map_err(io::Error::from)
            }
        };
        match r {
            Ok(()) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt == 0 => {
                let old = std::fs::symlink_metadata(path)?;
                match (old.is_dir(), item.kind() == libc::S_IFDIR) {
                    (true, true) => return Ok(false),
                    // An empty directory gives way, as tar replaces it; a full one stays.
                    (true, false) => std::fs::remove_dir(path)?,
                    (false, _) => std::fs::remove_file(path)?,
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::EEXIST))
}
