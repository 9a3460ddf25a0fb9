//! `dxfs mkfs -d DIR` (as `mke2fs -d`) and `dxfs cp -a --image`: copy a directory tree
//! into a volume through the [`Volume`] API, without mounting.
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
use crate::disk::format::FileType;
use crate::error::Error;
use crate::volume::{SetAttr, SetTime, Volume, XattrMode};

const ACCESS_ACL: &[u8] = b"system.posix_acl_access";
const DEFAULT_ACL: &[u8] = b"system.posix_acl_default";

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
    /// Names may be taken already (`import_as`): see `make_room`.
    merge: bool,
    /// Where an entry's error goes when the copy goes on past it (`import_as`, as
    /// `cp -a`); `None`: the first error ends the import (`import`, as `mke2fs -d`).
    going_on: Option<&'a mut dyn FnMut(PathError)>,
}

/// Copy the contents of `src` (a directory) into the volume's root directory; the root
/// takes `src`'s mode, owner, times and xattrs. `progress` is called after each node.
pub fn import(vol: &Volume, src: &Path, progress: &mut dyn FnMut(&ImportStats)) -> Result<ImportStats> {
    let md = fs::symlink_metadata(src).map_err(|e| io(src, e))?;
    if !md.is_dir() {
        return Err(vol_err(src, Error::NotDir));
    }
    let mut im = Importer::new(vol, progress, false, None);
    let root = vol.root();
    im.copy_dir(src, root)?;
    im.finish(src, root, &md)?;
    Ok(im.stats)
}

/// Copy `src` (a node of any kind, a directory with its tree) as `name` in directory
/// `dir` of a volume that may hold that name already, as `cp -a` copies onto a live
/// tree: a directory merges into the directory of its name, and any other entry
/// replaces the entry of its name. A directory and a non-directory never replace each
/// other (`IsDir`, `NotDir`), as `cp` refuses. As `cp -a`, an entry that cannot be
/// copied is given to `failed` and the copy goes on with the next; only a volume that
/// has stopped taking changes (`Error::Failed`) ends it, as an error.
pub fn import_as(
    vol: &Volume,
    src: &Path,
    dir: u64,
    name: &[u8],
    progress: &mut dyn FnMut(&ImportStats),
    failed: &mut dyn FnMut(PathError),
) -> Result<ImportStats> {
    let mut im = Importer::new(vol, progress, true, Some(failed));
    let copied = fs::symlink_metadata(src).map_err(|e| io(src, e)).and_then(|md| im.copy_entry(src, &md, dir, name));
    im.went_wrong(copied)?;
    Ok(im.stats)
}

impl<'a> Importer<'a> {
    fn new(
        vol: &'a Volume,
        progress: &'a mut dyn FnMut(&ImportStats),
        merge: bool,
        going_on: Option<&'a mut dyn FnMut(PathError)>,
    ) -> Self {
        Importer {
            vol,
            seen: HashMap::new(),
            stats: ImportStats::default(),
            progress,
            buf: super::copy_buffer(),
            merge,
            going_on,
        }
    }
}

impl Importer<'_> {
    /// An entry's result (`tools::go_on`).
    fn went_wrong(&mut self, r: Result<()>) -> Result<()> {
        super::go_on(r, &mut self.going_on)
    }

    fn copy_dir(&mut self, src: &Path, dir: u64) -> Result<()> {
        let mut names: Vec<_> = fs::read_dir(src)
            .map_err(|e| io(src, e))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()
            .map_err(|e| io(src, e))?;
        names.sort();
        for name in names {
            let path = src.join(&name);
            let copied = fs::symlink_metadata(&path)
                .map_err(|e| io(&path, e))
                .and_then(|md| self.copy_entry(&path, &md, dir, name.as_bytes()));
            self.went_wrong(copied)?;
        }
        Ok(())
    }

    /// Copy the node at `path` as `n` in `dir`.
    fn copy_entry(&mut self, path: &Path, md: &fs::Metadata, dir: u64, n: &[u8]) -> Result<()> {
        let ft = md.file_type();
        let existing = if self.merge { self.make_room(path, dir, n, ft.is_dir())? } else { None };
        if !ft.is_dir() && md.nlink() > 1 {
            if let Some(&ino) = self.seen.get(&(md.dev(), md.ino())) {
                self.vol.link(ino, dir, n).map_err(|e| vol_err(path, e))?;
                self.stats.hard_links += 1;
                return Ok(());
            }
        }
        let (uid, gid) = (md.uid(), md.gid());
        let perm = md.mode() & 0o7777;
        let ino = if ft.is_dir() {
            let ino = match existing {
                Some(ino) => ino,
                None => self.vol.mkdir(dir, n, perm, uid, gid).map_err(|e| vol_err(path, e))?.ino,
            };
            self.copy_dir(path, ino)?;
            ino
        } else if ft.is_symlink() {
            let target = fs::read_link(path).map_err(|e| io(path, e))?;
            self.vol.symlink(dir, n, target.as_os_str().as_bytes(), uid, gid).map_err(|e| vol_err(path, e))?.ino
        } else if ft.is_file() {
            let ino = self.vol.create(dir, n, perm, uid, gid).map_err(|e| vol_err(path, e))?.ino;
            self.copy_data(path, ino)?;
            ino
        } else if ft.is_fifo() || ft.is_socket() || ft.is_char_device() || ft.is_block_device() {
            self.vol.mknod(dir, n, md.mode(), md.rdev(), uid, gid).map_err(|e| vol_err(path, e))?.ino
        } else {
            return Err(vol_err(path, Error::NotSupported));
        };
        if !ft.is_dir() && md.nlink() > 1 {
            self.seen.insert((md.dev(), md.ino()), ino);
        }
        self.finish(path, ino, md)
    }

    /// What already holds name `n` in `dir` gives way to the copy of `path`: a directory
    /// is returned to merge a directory into, anything else is removed.
    fn make_room(&mut self, path: &Path, dir: u64, n: &[u8], is_dir: bool) -> Result<Option<u64>> {
        let e = |e| vol_err(path, e);
        match self.vol.lookup(dir, n) {
            Ok(a) if a.kind == FileType::Directory => is_dir.then_some(Some(a.ino)).ok_or(e(Error::IsDir)),
            Ok(_) if is_dir => Err(e(Error::NotDir)),
            Ok(_) => self.vol.unlink(dir, n).map(|()| None).map_err(e),
            Err(Error::NotFound) => Ok(None),
            Err(x) => Err(e(x)),
        }
    }

    fn copy_data(&mut self, path: &Path, ino: u64) -> Result<()> {
        let mut f = fs::File::open(path).map_err(|e| io(path, e))?;
        self.stats.bytes += super::copy_contents(self.vol, ino, &mut f, &mut self.buf).map_err(|e| vol_err(path, e))?;
        Ok(())
    }

    /// Xattrs, mode, owner and times: after the contents, so that nothing changes them.
    fn finish(&mut self, path: &Path, ino: u64, md: &fs::Metadata) -> Result<()> {
        let names: Vec<_> = xattr::list(path).map_err(|e| io(path, e))?.collect();
        for name in &names {
            let Some(value) = xattr::get(path, name).map_err(|e| io(path, e))? else { continue };
            self.vol.setxattr(ino, name.as_bytes(), &value, XattrMode::Any).map_err(|e| vol_err(path, e))?;
            self.stats.xattrs += 1;
        }
        let symlink = md.file_type().is_symlink();
        if self.merge && !symlink {
            // An ACL inherited from a directory's default ACL gives way to the source's
            // ACLs, as with `cp -a`: none, where the source has none.
            for acl in [ACCESS_ACL, DEFAULT_ACL] {
                if !names.iter().any(|n| n.as_bytes() == acl) {
                    match self.vol.removexattr(ino, acl) {
                        Ok(()) | Err(Error::NoData) => {}
                        Err(e) => return Err(vol_err(path, e)),
                    }
                }
            }
        }
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
