//! `dxfs mkfs -d DIR` (as `mke2fs -d`): copy a directory tree into a volume through the
//! [`Volume`] API, without mounting.
//!
//! Every node kind is copied (regular files, directories, symlinks, hard links, device
//! nodes, fifos, sockets) with its mode, owner, times and xattrs, POSIX ACLs included (the
//! `system.posix_acl_access` / `_default` values are copied raw). A source inode met
//! again through another name becomes a hard link (`Volume::link`). Directory times are
//! set after their contents, so adding children does not change them. The volume commits
//! its deltas as they fill; the caller syncs or closes at the end.

use std::collections::HashMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

pub use super::ImportStats;
use super::PathError;
use crate::error::Error;
use crate::volume::{SetAttr, SetTime, Volume, XattrMode};

type Result<T> = std::result::Result<T, PathError>;

fn io(path: &Path, e: std::io::Error) -> PathError {
    PathError { path: path.to_path_buf(), error: Error::Io(e) }
}

fn vol_err(path: &Path, e: Error) -> PathError {
    PathError { path: path.to_path_buf(), error: e }
}

struct Importer<'a> {
    vol: &'a Volume,
    /// (device, inode) of a source with more than one link → its volume inode.
    seen: HashMap<(u64, u64), u64>,
    stats: ImportStats,
    progress: &'a mut dyn FnMut(&ImportStats),
    buf: Vec<u8>,
}

/// Copy the contents of `src` (a directory) into the volume's root directory; the root
/// takes `src`'s mode, owner, times and xattrs. `progress` is called after each node.
pub fn import(vol: &Volume, src: &Path, progress: &mut dyn FnMut(&ImportStats)) -> Result<ImportStats> {
    let md = fs::symlink_metadata(src).map_err(|e| io(src, e))?;
    if !md.is_dir() {
        return Err(vol_err(src, Error::NotDir));
    }
    let mut im =
        Importer { vol, seen: HashMap::new(), stats: ImportStats::default(), progress, buf: super::copy_buffer() };
    let root = vol.root();
    im.copy_dir(src, root)?;
    im.finish(src, root, &md)?;
    Ok(im.stats)
}

impl Importer<'_> {
    fn copy_dir(&mut self, src: &Path, dir: u64) -> Result<()> {
        let mut names: Vec<_> = fs::read_dir(src)
            .map_err(|e| io(src, e))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()
            .map_err(|e| io(src, e))?;
        names.sort();
        for name in names {
            let path = src.join(&name);
            let md = fs::symlink_metadata(&path).map_err(|e| io(&path, e))?;
            let n = name.as_bytes();
            let ft = md.file_type();
            if !ft.is_dir() && md.nlink() > 1 {
                if let Some(&ino) = self.seen.get(&(md.dev(), md.ino())) {
                    self.vol.link(ino, dir, n).map_err(|e| vol_err(&path, e))?;
                    self.stats.hard_links += 1;
                    continue;
                }
            }
            let (uid, gid) = (md.uid(), md.gid());
            let perm = md.mode() & 0o7777;
            let ino = if ft.is_dir() {
                let ino = self.vol.mkdir(dir, n, perm, uid, gid).map_err(|e| vol_err(&path, e))?.ino;
                self.copy_dir(&path, ino)?;
                ino
            } else if ft.is_symlink() {
                let target = fs::read_link(&path).map_err(|e| io(&path, e))?;
                self.vol.symlink(dir, n, target.as_os_str().as_bytes(), uid, gid).map_err(|e| vol_err(&path, e))?.ino
            } else if ft.is_file() {
                let ino = self.vol.create(dir, n, perm, uid, gid).map_err(|e| vol_err(&path, e))?.ino;
                self.copy_data(&path, ino)?;
                ino
            } else if ft.is_fifo() || ft.is_socket() || ft.is_char_device() || ft.is_block_device() {
                self.vol.mknod(dir, n, md.mode(), md.rdev(), uid, gid).map_err(|e| vol_err(&path, e))?.ino
            } else {
                return Err(vol_err(&path, Error::NotSupported));
            };
            if !ft.is_dir() && md.nlink() > 1 {
                self.seen.insert((md.dev(), md.ino()), ino);
            }
            self.finish(&path, ino, &md)?;
        }
        Ok(())
    }

    fn copy_data(&mut self, path: &Path, ino: u64) -> Result<()> {
        let mut f = fs::File::open(path).map_err(|e| io(path, e))?;
        self.stats.bytes += super::copy_contents(self.vol, ino, &mut f, &mut self.buf).map_err(|e| vol_err(path, e))?;
        Ok(())
    }

    /// Xattrs, mode, owner and times: after the contents, so that nothing changes them.
    fn finish(&mut self, path: &Path, ino: u64, md: &fs::Metadata) -> Result<()> {
        let names = xattr::list(path).map_err(|e| io(path, e))?;
        for name in names {
            let Some(value) = xattr::get(path, &name).map_err(|e| io(path, e))? else { continue };
            self.vol.setxattr(ino, name.as_bytes(), &value, XattrMode::Any).map_err(|e| vol_err(path, e))?;
            self.stats.xattrs += 1;
        }
        let symlink = md.file_type().is_symlink();
        let s = SetAttr {
            mode: (!symlink).then_some(md.mode() & 0o7777),
            uid: Some(md.uid()),
            gid: Some(md.gid()),
            atime: Some(SetTime::At((md.atime(), md.atime_nsec() as u32))),
            mtime: Some(SetTime::At((md.mtime(), md.mtime_nsec() as u32))),
            ..Default::default()
        };
        self.vol.setattr(ino, &s).map_err(|e| vol_err(path, e))?;
        self.stats.inodes += 1;
        (self.progress)(&self.stats);
        Ok(())
    }
}
