//! Copying entries into a directory for `dxfs cp -a` and `dxfs import`: on a dxfs mount
//! they go to the daemon in batches of many (`dxfs::fuse::control::import`), one
//! directory at a time, and the daemon makes each whole as the caller. An entry the
//! daemon cannot take is made with ordinary system calls, as `cp -a` makes it: when the
//! directory is not on a dxfs mount, when its contents do not fit in a batch, when its
//! name is taken (the old entry is replaced, as `tar -x` replaces it; a directory is kept).

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

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

pub(crate) struct Sender {
    /// `cp` or `import`, for messages.
    pub prog: &'static str,
    /// The directory the batch is for.
    dir: Option<(PathBuf, File)>,
    batch: ImportBatch,
    pending: Vec<Item>,
    /// The daemon takes batches: false once a directory answers ENOTTY (not a dxfs mount).
    pub daemon: bool,
    /// Entries made, and those made by the daemon.
    pub made: u64,
    pub by_daemon: u64,
    /// Requests sent.
    pub batches: u64,
    pub ok: bool,
    pub bar: indicatif::ProgressBar,
    /// The current directory has a default ACL, which new entries inherit.
    pub inherits_acl: bool,
}

impl Sender {
    pub fn new(prog: &'static str) -> Sender {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(4));
        Sender {
            prog,
            dir: None,
            batch: ImportBatch::default(),
            pending: Vec::new(),
            daemon: true,
            made: 0,
            by_daemon: 0,
            batches: 0,
            ok: true,
            bar,
            inherits_acl: false,
        }
    }

    /// Report a failure at `path`, as cp does, and go on.
    pub fn failed(&mut self, msg: String) {
        self.bar.suspend(|| eprintln!("dxfs {}: {msg}", self.prog));
        self.ok = false;
    }

    fn cannot_create(&mut self, item: &Item, path: &Path, e: &io::Error) {
        self.failed(format!("cannot create {} '{}': {}", item.what(), path.display(), errno_text(e)));
    }

    /// Send what is pending, then make entries in directory `dir` from now on. False
    /// (reported) when it cannot be opened.
    pub fn enter(&mut self, dir: &Path) -> bool {
        if self.dir.as_ref().is_some_and(|(d, _)| d == dir) {
            return true;
        }
        self.flush();
        self.dir = None;
        match open_dir(dir) {
            Ok(f) => {
                self.inherits_acl = matches!(xattr::get(dir, DEFAULT_ACL), Ok(Some(_)));
                self.dir = Some((dir.to_path_buf(), f));
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
        if !self.daemon || !item.fits_with(0) {
            let path = self.dir_path().join(OsStr::from_bytes(&item.name));
            let data = item.data.clone();
            return self.by_syscalls(&path, &item, &mut data.as_slice());
        }
        if !item.with_entry(|e| self.batch.push(e)) {
            self.flush();
            let pushed = item.with_entry(|e| self.batch.push(e));
            assert!(pushed, "an entry that fits alone fits an empty batch");
        }
        self.pending.push(item);
    }

    /// Make a regular file whose contents `src` gives (too large for a batch), at once.
    pub fn add_large(&mut self, item: Item, src: &mut dyn Read) {
        let path = self.dir_path().join(OsStr::from_bytes(&item.name));
        self.by_syscalls(&path, &item, src);
    }

    /// Send the pending batch and wait for its answer.
    pub fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.batch);
        let items = std::mem::take(&mut self.pending);
        let (dir, fd) = self.dir.as_ref().expect("a batch belongs to a directory");
        let dir = dir.clone();
        self.batches += 1;
        let answers = match control::import(fd.as_fd(), &batch) {
            Ok(a) => a,
            Err(e) => {
                // Not a dxfs mount, or an older daemon: entry by entry from here on. Any
                // other refusal of the whole batch: this batch entry by entry.
                if e.raw_os_error() == Some(libc::ENOTTY) {
                    self.daemon = false;
                }
                for item in &items {
                    let path = dir.join(OsStr::from_bytes(&item.name));
                    self.by_syscalls(&path, item, &mut item.data.as_slice());
                }
                return;
            }
        };
        for (item, errno) in items.iter().zip(answers) {
            let path = dir.join(OsStr::from_bytes(&item.name));
            match errno {
                0 => {
                    self.made += 1;
                    self.by_daemon += 1;
                }
                // The name is taken: replaced (a directory kept), as tar and cp do.
                libc::EEXIST => self.by_syscalls(&path, item, &mut item.data.as_slice()),
                e => self.cannot_create(item, &path, &io::Error::from_raw_os_error(e)),
            }
        }
        self.bar.set_message(format!("{} copied", self.made));
    }

    /// Make `item` at `path` with system calls, as `cp -a` does: create, write, then
    /// xattrs, owner, mode and times. A directory is only made (its attributes come
    /// after its contents: [`Sender::finish`]).
    fn by_syscalls(&mut self, path: &Path, item: &Item, src: &mut dyn Read) {
        let made = match self.create(path, item, src) {
            Ok(m) => m,
            Err(e) => return self.cannot_create(item, path, &e),
        };
        self.made += u64::from(made);
        if item.kind() != libc::S_IFDIR {
            self.finish(path, item);
        }
    }

    /// Create `path`; an entry already there is replaced unless both are directories.
    /// Whether a new entry was made.
    fn create(&mut self, path: &Path, item: &Item, src: &mut dyn Read) -> io::Result<bool> {
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
                    if old.is_dir() {
                        if item.kind() == libc::S_IFDIR {
                            return Ok(false);
                        }
                        return Err(io::Error::from_raw_os_error(libc::EISDIR));
                    }
                    std::fs::remove_file(path)?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::from_raw_os_error(libc::EEXIST))
    }

    /// Give `path` `item`'s xattrs, owner, mode and times, as far as the caller may
    /// (what it may not is skipped quietly, as `cp -a` skips it).
    pub fn finish(&mut self, path: &Path, item: &Item) {
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
        if item.kind() != libc::S_IFLNK {
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
