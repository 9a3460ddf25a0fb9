//! `dxfs export IMAGE DIR`: copy a volume's tree out to a host directory, read-only (the
//! inverse of [`import`](super::import)), for getting data out of a volume that will not
//! mount. Names, contents, hard links (one inode, several names), symlinks, device nodes,
//! fifos, sockets, modes, owners, times and xattrs (POSIX ACLs included) are kept.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

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
    stats: ExportStats,
    progress: &'a mut dyn FnMut(&ExportStats),
}

/// Copy the volume's root directory's contents into `dst` (an existing, empty directory,
/// or one to create); `dst` takes the root's mode, owner, times and xattrs.
pub fn export(vol: &Volume, dst: &Path, progress: &mut dyn FnMut(&ExportStats)) -> Result<()> {
    if !dst.exists() {
        fs::create_dir(dst).map_err(|e| io(dst, e))?;
    } else if fs::read_dir(dst).map_err(|e| io(dst, e))?.next().is_some() {
        return Err(vol_err(dst, Error::NotEmpty));
    }
    let mut ex = Exporter { vol, seen: HashMap::new(), stats: ExportStats::default(), progress };
    let root = vol.getattr(vol.root()).map_err(|e| vol_err(dst, e))?;
    ex.copy_dir(root.ino, dst)?;
    ex.finish(dst, &root)
}

impl Exporter<'_> {
    fn copy_dir(&mut self, dir: u64, dst: &Path) -> Result<()> {
        let mut pos = 0;
        loop {
            let batch = self.vol.readdir(dir, pos, 256).map_err(|e| vol_err(dst, e))?;
            let Some(last) = batch.last() else { break };
            pos = last.next;
            for e in batch {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let path = dst.join(OsStr::from_bytes(&e.name));
                let a = self.vol.getattr(e.ino).map_err(|e| vol_err(&path, e))?;
                if a.kind != FileType::Directory && a.nlink > 1 {
                    if let Some(first) = self.seen.get(&a.ino) {
                        fs::hard_link(first, &path).map_err(|e| io(&path, e))?;
                        self.stats.hard_links += 1;
                        continue;
                    }
                    self.seen.insert(a.ino, path.clone());
                }
                match a.kind {
                    FileType::Directory => {
                        fs::create_dir(&path).map_err(|e| io(&path, e))?;
                        self.copy_dir(a.ino, &path)?;
                    }
                    FileType::RegularFile => self.copy_data(&a, &path)?,
                    FileType::Symlink => {
                        let t = self.vol.readlink(a.ino).map_err(|e| vol_err(&path, e))?;
                        std::os::unix::fs::symlink(OsStr::from_bytes(&t), &path).map_err(|e| io(&path, e))?;
                    }
                    _ => {
                        let kind = SFlag::from_bits_truncate(a.mode & libc::S_IFMT);
                        mknod(&path, kind, Mode::from_bits_truncate(a.mode & 0o7777), a.rdev as libc::dev_t)
                            .map_err(|e| io(&path, e))?;
                    }
                }
                self.finish(&path, &a)?;
            }
        }
        Ok(())
    }

    fn copy_data(&mut self, a: &Attr, path: &Path) -> Result<()> {
        let mut f = fs::File::create(path).map_err(|e| io(path, e))?;
        let mut off = 0u64;
        while off < a.size {
            let n = (a.size - off).min(256 * BLOCK_SIZE as u64) as usize;
            let data = self.vol.read(a.ino, off, n).map_err(|e| vol_err(path, e))?;
            if data.is_empty() {
                break;
            }
            f.write_all(&data).map_err(|e| io(path, e))?;
            off += data.len() as u64;
        }
        f.set_len(a.size).map_err(|e| io(path, e))?;
        self.stats.bytes += a.size;
        Ok(())
    }

    fn finish(&mut self, path: &Path, a: &Attr) -> Result<()> {
        for name in self.vol.listxattr(a.ino).map_err(|e| vol_err(path, e))? {
            let value = self.vol.getxattr(a.ino, &name).map_err(|e| vol_err(path, e))?;
            xattr::set(path, OsStr::from_bytes(&name), &value).map_err(|e| io(path, e))?;
            self.stats.xattrs += 1;
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
