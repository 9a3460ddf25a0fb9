//! `dxfs mkfs -d ARCHIVE` (as `mke2fs -d` takes a tarball) and `dxfs import --image`:
//! unpack a tar archive (ustar, GNU or PAX) into a volume through the [`Volume`] API,
//! without mounting, as `tar -x --xattrs --same-owner --preserve-permissions` would.
//!
//! Every entry kind tar records is made (files, directories, symlinks, hard links,
//! device nodes, fifos) with its mode, owner, times and the xattrs of PAX
//! `SCHILY.xattr.*` records (GNU tar's `--xattrs`, POSIX ACLs included when stored as
//! their xattrs). A directory the archive names only as a parent is made 0755, owned by
//! root. An entry whose name is already taken replaces it (a directory is kept and
//! takes the new one's attributes), as tar does. Names are taken relative to the
//! directory unpacked into: a leading `/` is dropped, and a name with a `..` component
//! is refused. Directory times are set at the end, after their contents.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use tar::EntryType;

use super::{ImportStats, PathError};
use crate::disk::format::FileType;
use crate::error::Error;
use crate::volume::{SetAttr, SetTime, Volume, XattrMode};

type Result<T> = std::result::Result<T, PathError>;

fn err(path: &[u8], error: Error) -> PathError {
    PathError { path: PathBuf::from(String::from_utf8_lossy(path).into_owned()), error }
}

/// Unpack the archive `src` reads into the volume's root directory. `progress` is called
/// after each entry.
/// Stops at the first error (as `mke2fs -d`).
pub fn import_tar(vol: &Volume, src: impl Read, progress: &mut dyn FnMut(&ImportStats)) -> Result<ImportStats> {
    unpack(vol, src, vol.root(), progress, None)
}

/// Unpack the archive `src` reads into directory `top` (`tar -x -C`), which takes the
/// attributes of the archive's root entry (`./`) if it has one. As `tar -x`, an entry
/// that cannot be made is given to `failed` and the next one is unpacked; an archive
/// that cannot be read, or a volume that has stopped taking changes
/// (`Error::Failed`), ends it as an error.
pub fn import_tar_into(
    vol: &Volume,
    src: impl Read,
    top: u64,
    progress: &mut dyn FnMut(&ImportStats),
    failed: &mut dyn FnMut(PathError),
) -> Result<ImportStats> {
    unpack(vol, src, top, progress, Some(failed))
}

fn unpack(
    vol: &Volume,
    src: impl Read,
    top: u64,
    progress: &mut dyn FnMut(&ImportStats),
    mut going_on: Option<&mut dyn FnMut(PathError)>,
) -> Result<ImportStats> {
    let mut went_wrong = |r: Result<()>| super::go_on(r, &mut going_on);
    let mut archive = tar::Archive::new(src);
    let mut un = Unpacker {
        vol,
        dir_inos: HashMap::new(),
        dirs: Vec::new(),
        stats: ImportStats::default(),
        buf: super::copy_buffer(),
        top,
    };
    un.dir_inos.insert(Vec::new(), top);
    let entries = archive.entries().map_err(|e| err(b"(archive)", Error::Io(e)))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| err(b"(archive)", Error::Io(e)))?;
        went_wrong(un.entry(&mut entry))?;
        progress(&un.stats);
    }
    // Directory times last, deepest first, so that nothing made in them moves them.
    for (path, ino, attr) in un.dirs.iter().rev() {
        went_wrong(vol.setattr(*ino, attr).map(drop).map_err(|e| err(path, e)))?;
    }
    Ok(un.stats)
}

struct Unpacker<'a> {
    vol: &'a Volume,
    /// The directories made, by their path in the archive (components joined with `/`):
    /// memory grows with the directories, not with the files.
    dir_inos: HashMap<Vec<u8>, u64>,
    /// Directories named in the archive, with the attributes to give them at the end.
    dirs: Vec<(Vec<u8>, u64, SetAttr)>,
    stats: ImportStats,
    buf: Vec<u8>,
    /// The directory unpacked into.
    top: u64,
}

/// An archive entry's name as components: `.` and empty ones dropped, `..` refused (a
/// name must not leave the directory it is unpacked into).
pub fn components(raw: &[u8]) -> std::result::Result<Vec<&[u8]>, Error> {
    let mut out = Vec::new();
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(Error::Invalid("a name with a `..` component".into())),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// What an entry's PAX records add to its header: xattrs (`SCHILY.xattr.*`, GNU tar's
/// `--xattrs`) and times with nanoseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PaxRecords {
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The header's mtime, unless a record gives a finer one.
    pub mtime: (i64, u32),
    pub atime: Option<(i64, u32)>,
}

/// The PAX records of `entry`, whose header says `mtime`.
pub fn pax_records<R: Read>(entry: &mut tar::Entry<'_, R>, mtime: (i64, u32)) -> std::io::Result<PaxRecords> {
    let mut out = PaxRecords { mtime, ..PaxRecords::default() };
    if let Some(pax) = entry.pax_extensions()? {
        for ext in pax {
            let ext = ext?;
            let key = ext.key_bytes();
            if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                out.xattrs.push((name.to_vec(), ext.value_bytes().to_vec()));
            } else if key == b"mtime" {
                out.mtime = pax_time(ext.value_bytes()).unwrap_or(out.mtime);
            } else if key == b"atime" {
                out.atime = pax_time(ext.value_bytes());
            }
        }
    }
    Ok(out)
}

/// A PAX time (`1700000000.123456789`, perhaps negative) as seconds and nanoseconds.
fn pax_time(v: &[u8]) -> Option<(i64, u32)> {
    let s = std::str::from_utf8(v).ok()?;
    let (sec, frac) = s.split_once('.').unwrap_or((s, ""));
    let sec: i64 = sec.parse().ok()?;
    let digits: String = frac.chars().take(9).collect();
    let mut nsec: u32 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
    for _ in digits.len()..9 {
        nsec *= 10;
    }
    Some((sec, nsec))
}

impl Unpacker<'_> {
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<()> {
        let raw = entry.path_bytes().into_owned();
        let parts = components(&raw).map_err(|e| err(&raw, e))?;
        let path = parts.join(&b'/');
        let h = entry.header().clone();
        let kind = h.entry_type();
        let io = |e: std::io::Error| err(&raw, Error::Io(e));
        let mode = h.mode().map_err(io)? & 0o7777;
        // Numbers past what a volume stores are refused, not cut short.
        let range = |what: &str| err(&raw, Error::Invalid(format!("{what} out of range")));
        let uid = u32::try_from(h.uid().map_err(io)?).map_err(|_| range("uid"))?;
        let gid = u32::try_from(h.gid().map_err(io)?).map_err(|_| range("gid"))?;
        let mtime = (i64::try_from(h.mtime().map_err(io)?).map_err(|_| range("mtime"))?, 0);
        let PaxRecords { xattrs, mtime, atime } = pax_records(entry, mtime).map_err(io)?;
        let attr = SetAttr {
            mode: (kind != EntryType::Symlink).then_some(mode),
            uid: Some(uid),
            gid: Some(gid),
            atime: Some(SetTime::At(atime.unwrap_or(mtime))),
            mtime: Some(SetTime::At(mtime)),
            ..Default::default()
        };
        let vol = self.vol;
        let ve = |e: Error| err(&raw, e);
        let Some((&name, parents)) = parts.split_last() else {
            // The archive's root (`./`): the directory unpacked into takes its attributes.
            self.set_xattrs(&raw, self.top, &xattrs)?;
            self.dirs.push((raw.clone(), self.top, attr));
            return Ok(());
        };
        let dir = self.parent(parents)?;
        let ino = match kind {
            EntryType::Directory => {
                let ino = match vol.lookup(dir, name) {
                    Ok(a) if a.kind == FileType::Directory => a.ino,
                    Ok(_) => {
                        vol.unlink(dir, name).map_err(ve)?;
                        vol.mkdir(dir, name, mode, uid, gid).map_err(ve)?.ino
                    }
                    Err(Error::NotFound) => vol.mkdir(dir, name, mode, uid, gid).map_err(ve)?.ino,
                    Err(e) => return Err(ve(e)),
                };
                self.dir_inos.insert(path, ino);
                self.set_xattrs(&raw, ino, &xattrs)?;
                self.dirs.push((raw.clone(), ino, attr));
                self.stats.inodes += 1;
                return Ok(());
            }
            EntryType::Link => {
                let target =
                    entry.link_name_bytes().ok_or_else(|| ve(Error::Invalid("a hard link without a target".into())))?;
                let tparts = components(&target).map_err(ve)?;
                let target_ino = self.resolve(&tparts).map_err(ve)?;
                self.make_room(dir, name, &path, &raw)?;
                vol.link(target_ino, dir, name).map_err(ve)?;
                self.stats.hard_links += 1;
                return Ok(());
            }
            EntryType::Symlink => {
                let target =
                    entry.link_name_bytes().ok_or_else(|| ve(Error::Invalid("a symlink without a target".into())))?;
                self.make_room(dir, name, &path, &raw)?;
                vol.symlink(dir, name, &target, uid, gid).map_err(ve)?.ino
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.make_room(dir, name, &path, &raw)?;
                let ino = vol.create(dir, name, mode, uid, gid).map_err(ve)?.ino;
                self.stats.bytes += super::copy_contents(vol, ino, entry, &mut self.buf).map_err(ve)?;
                ino
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let (ft, rdev) = match kind {
                    EntryType::Char | EntryType::Block => {
                        let major = h.device_major().map_err(io)?.unwrap_or(0);
                        let minor = h.device_minor().map_err(io)?.unwrap_or(0);
                        let ft = if kind == EntryType::Char { libc::S_IFCHR } else { libc::S_IFBLK };
                        (ft, libc::makedev(major, minor))
                    }
                    _ => (libc::S_IFIFO, 0),
                };
                self.make_room(dir, name, &path, &raw)?;
                vol.mknod(dir, name, ft | mode, rdev, uid, gid).map_err(ve)?.ino
            }
            // Records that carry no node of their own (GNU volume labels and the like).
            _ => return Ok(()),
        };
        self.set_xattrs(&raw, ino, &xattrs)?;
        vol.setattr(ino, &attr).map_err(ve)?;
        self.stats.inodes += 1;
        Ok(())
    }

    /// The directory `parents` name, made (0755, root's) where the archive did not.
    fn parent(&mut self, parents: &[&[u8]]) -> Result<u64> {
        let mut dir = self.top;
        for k in 0..parents.len() {
            let path = parents[..=k].join(&b'/');
            if let Some(&ino) = self.dir_inos.get(&path) {
                dir = ino;
                continue;
            }
            let name = parents[k];
            dir = match self.vol.lookup(dir, name) {
                Ok(a) if a.kind == FileType::Directory => a.ino,
                Ok(_) => return Err(err(&path, Error::NotDir)),
                Err(Error::NotFound) => self.vol.mkdir(dir, name, 0o755, 0, 0).map_err(|e| err(&path, e))?.ino,
                Err(e) => return Err(err(&path, e)),
            };
            self.dir_inos.insert(path, dir);
        }
        Ok(dir)
    }

    /// The inode an earlier entry's name `parts` names now (a hard link's target).
    fn resolve(&self, parts: &[&[u8]]) -> std::result::Result<u64, Error> {
        let (last, parents) = parts.split_last().ok_or(Error::NotFound)?;
        let mut dir = self.top;
        for k in 0..parents.len() {
            dir = match self.dir_inos.get(&parents[..=k].join(&b'/')) {
                Some(&ino) => ino,
                None => match self.vol.lookup(dir, parents[k])? {
                    a if a.kind == FileType::Directory => a.ino,
                    _ => return Err(Error::NotDir),
                },
            };
        }
        Ok(self.vol.lookup(dir, last)?.ino)
    }

    /// A later entry of the same name replaces an earlier one (not a directory with
    /// contents, which tar cannot replace either).
    fn make_room(&mut self, dir: u64, name: &[u8], path: &[u8], raw: &[u8]) -> Result<()> {
        match self.vol.lookup(dir, name) {
            Ok(a) if a.kind == FileType::Directory => {
                // Its attributes are not to be set at the end (its number may be reused).
                self.dir_inos.remove(path);
                self.dirs.retain(|(_, ino, _)| *ino != a.ino);
                self.vol.rmdir(dir, name)
            }
            Ok(_) => self.vol.unlink(dir, name),
            Err(Error::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
        .map_err(|e| err(raw, e))
    }

    fn set_xattrs(&mut self, raw: &[u8], ino: u64, xattrs: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        for (name, value) in xattrs {
            self.vol.setxattr(ino, name, value, XattrMode::Any).map_err(|e| err(raw, e))?;
            self.stats.xattrs += 1;
        }
        Ok(())
    }
}

/// Whether `path` looks like a tar archive rather than a directory to copy.
pub fn is_archive(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}
