//! `dxfs export IMAGE DIR`: copy a volume's tree out to a host directory, read-only (the
//! inverse of [`import`](super::import)), for getting data out of a volume that will not
//! mount. Names, contents, hard links (one inode, several names), symlinks, device nodes,
//! fifos, sockets, modes, owners, times and xattrs (POSIX ACLs included) are kept, and
//! holes stay holes. An object that cannot be read (a damaged volume) is skipped and
//! named, and the export goes on with the rest, as `debugfs rdump` does.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use nix::sys::stat::{mknod, utimensat, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;

use super::PathError;
use crate::disk::codec::BLOCK_SIZE;
use crate::disk::format::FileType;
use crate::error::Error;
use crate::volume::{Attr, Volume};

/// What an export wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    pub inodes: u64,
    pub hard_links: u64,
    pub bytes: u64,
    pub xattrs: u64,
    /// What could not be copied, each with its host path and why; the rest was copied.
    pub failures: Vec<String>,
}

type Result<T> = std::result::Result<T, PathError>;

fn io(path: &Path, e: impl Into<std::io::Error>) -> PathError {
    PathError { path: path.to_path_buf(), error: Error::Io(e.into()) }
}

fn vol_err(path: &Path, e: Error) -> PathError {
    PathError { path: path.to_path_buf(), error: e }
}

struct Exporter<'a> {
    vol: &'a Volume,
    /// Volume inode with more than one link → the host path it was first written to.
    seen: HashMap<u64, std::path::PathBuf>,
    /// Directories copied so far: a damaged volume may name one twice (a loop).
    dirs: HashSet<u64>,
    stats: ExportStats,
    progress: &'a mut dyn FnMut(&ExportStats),
}

/// Copy the volume's root directory's contents into `dst` (an existing, empty directory,
/// or one to create); `dst` takes the root's mode, owner, times and xattrs. What cannot
/// be read is listed in the returned stats' `failures`, and everything else is copied;
/// an error is returned only when nothing can be (`dst`, or the root, is unusable).
pub fn export(vol: &Volume, dst: &Path, progress: &mut dyn FnMut(&ExportStats)) -> Result<ExportStats> {
    if !dst.exists() {
        fs::create_dir(dst).map_err(|e| io(dst, e))?;
    } else if fs::read_dir(dst).map_err(|e| io(dst, e))?.next().is_some() {
        return Err(vol_err(dst, Error::NotEmpty));
    }
    let mut ex = Exporter { vol, seen: HashMap::new(), dirs: HashSet::new(), stats: ExportStats::default(), progress };
    let root = vol.getattr(vol.root()).map_err(|e| vol_err(dst, e))?;
    ex.dirs.insert(root.ino);
    ex.copy_dir(root.ino, dst);
    let r = ex.finish(dst, &root);
    ex.note(r);
    Ok(ex.stats)
}

/// Largest failure list kept (the count goes on).
const FAILURES_KEPT: usize = 10_000;

impl Exporter<'_> {
    /// Keep a failure and go on.
    fn note(&mut self, r: Result<()>) {
        if let Err(e) = r {
            if self.stats.failures.len() < FAILURES_KEPT {
                self.stats.failures.push(e.to_string());
            }
        }
    }

    /// Copy directory `dir`'s entries into `dst`; what fails is noted, the rest goes on.
    /// A listing that breaks off keeps what came before.
    fn copy_dir(&mut self, dir: u64, dst: &Path) {
        let mut pos = 0;
        loop {
            let batch = match self.vol.readdir(dir, pos, 256) {
                Ok(b) => b,
                Err(e) => return self.note(Err(vol_err(dst, e))),
            };
            let Some(last) = batch.last() else { break };
            pos = last.next;
            for e in batch {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                // Never a path outside `dst`, whatever the volume says (the volume's
                // rules refuse such names; this is the tool's own guard).
                let name = Path::new(OsStr::from_bytes(&e.name));
                let mut parts = name.components();
                let plain = matches!((parts.next(), parts.next()), (Some(Component::Normal(_)), None));
                if !plain {
                    let what = format!("entry {:?} is not a plain file name", String::from_utf8_lossy(&e.name));
                    self.note(Err(vol_err(dst, Error::corrupt(what))));
                    continue;
                }
                let path = dst.join(name);
                let r = self.copy_entry(e.ino, &path);
                self.note(r);
            }
        }
    }

    fn copy_entry(&mut self, ino: u64, path: &Path) -> Result<()> {
        let a = self.vol.getattr(ino).map_err(|e| vol_err(path, e))?;
        if a.kind != FileType::Directory && a.nlink > 1 {
            if let Some(first) = self.seen.get(&a.ino) {
                fs::hard_link(first, path).map_err(|e| io(path, e))?;
                self.stats.hard_links += 1;
                return Ok(());
            }
            self.seen.insert(a.ino, path.to_path_buf());
        }
        match a.kind {
            FileType::Directory => {
                if !self.dirs.insert(a.ino) {
                    return Err(vol_err(path, Error::corrupt(format!("directory {} is named twice (a loop)", a.ino))));
                }
                fs::create_dir(path).map_err(|e| io(path, e))?;
                self.copy_dir(a.ino, path);
            }
            FileType::RegularFile => {
                // A file that reads only in part keeps what did read, and is named.
                let r = self.copy_data(&a, path);
                self.note(r);
            }
            FileType::Symlink => {
                let t = self.vol.readlink(a.ino).map_err(|e| vol_err(path, e))?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&t), path).map_err(|e| io(path, e))?;
            }
            _ => {
                let kind = SFlag::from_bits_truncate(a.mode & libc::S_IFMT);
                mknod(path, kind, Mode::from_bits_truncate(a.mode & 0o7777), a.rdev as libc::dev_t)
                    .map_err(|e| io(path, e))?;
            }
        }
        self.finish(path, &a)
    }

    /// Copy a file's data ranges, leaving its holes as holes.
    fn copy_data(&mut self, a: &Attr, path: &Path) -> Result<()> {
        // A new file only: a damaged volume may name a symlink the same, which create would follow.
        let mut f = fs::OpenOptions::new().write(true).create_new(true).open(path).map_err(|e| io(path, e))?;
        f.set_len(a.size).map_err(|e| io(path, e))?;
        for (start, end) in self.vol.data_ranges(a.ino).map_err(|e| vol_err(path, e))? {
            let mut off = start;
            f.seek(SeekFrom::Start(off)).map_err(|e| io(path, e))?;
            while off < end {
                let n = (end - off).min(256 * BLOCK_SIZE as u64) as usize;
                let data = self.vol.read(a.ino, off, n).map_err(|e| vol_err(path, e))?;
                if data.is_empty() {
                    break;
                }
                f.write_all(&data).map_err(|e| io(path, e))?;
                off += data.len() as u64;
                self.stats.bytes += data.len() as u64;
            }
        }
        Ok(())
    }

    fn finish(&mut self, path: &Path, a: &Attr) -> Result<()> {
        // Unreadable xattrs are named, and the owner, mode and times still set.
        match self.vol.listxattr(a.ino) {
            Ok(names) => {
                for name in names {
                    let r =
                        self.vol.getxattr(a.ino, &name).map_err(|e| vol_err(path, e)).and_then(|value| {
                            xattr::set(path, OsStr::from_bytes(&name), &value).map_err(|e| io(path, e))
                        });
                    if r.is_ok() {
                        self.stats.xattrs += 1;
                    }
                    self.note(r);
                }
            }
            Err(e) => self.note(Err(vol_err(path, e))),
        }
        std::os::unix::fs::lchown(path, Some(a.uid), Some(a.gid)).map_err(|e| io(path, e))?;
        if a.kind != FileType::Symlink {
            fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(a.mode & 0o7777))
                .map_err(|e| io(path, e))?;
        }
        let ts = |t: (i64, u32)| TimeSpec::new(t.0, t.1 as _);
        utimensat(nix::fcntl::AT_FDCWD, path, &ts(a.atime), &ts(a.mtime), UtimensatFlags::NoFollowSymlink)
            .map_err(|e| io(path, e))?;
        self.stats.inodes += 1;
        (self.progress)(&self.stats);
        Ok(())
    }
}
