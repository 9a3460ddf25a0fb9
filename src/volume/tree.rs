//! Whole-tree jobs done in process, as a caller with the kernel's permission rules:
//! removing a directory's contents and summing them in bounded steps, and making entries
//! whole (contents, xattrs, owner, mode, times) as a copy into the volume does. The mount
//! serves them to `dxfs rm -r`, `dxfs du` and `dxfs cp -a` through ioctls (one request
//! per step or batch, not round trips per file); a program that embeds the library calls
//! them directly.

use crate::error::{Error, Result};
use crate::fs::dir::DirEntry;

use super::{type_of, Caller, FileType, NewNode, SetAttr, SetTime, Volume, XattrMode};

/// What one step of emptying a directory did ([`Volume::empty_step`]).
#[derive(Debug, Default)]
pub struct EmptyStep {
    /// The listing position the next step starts from.
    pub next: u64,
    /// The listing reached the directory's end.
    pub done: bool,
    /// Entries removed: name, inode (whose caches a frontend may have to drop) and the
    /// links the inode has left.
    pub removed: Vec<(Vec<u8>, u64, u32)>,
    /// Subdirectories met, left in place for the caller to empty and remove: name and
    /// inode.
    pub subdirs: Vec<(Vec<u8>, u64)>,
    /// Entries that could not be removed, and why (as unlink(2) would have failed).
    pub failed: Vec<(Vec<u8>, Error)>,
}

/// What [`Volume::remove_tree`] removed, and what it could not.
#[derive(Debug, Default)]
pub struct TreeRemoval {
    /// Entries removed, directories included.
    pub removed: u64,
    /// Paths (relative to the directory the removal started in) that stayed, and why.
    pub failed: Vec<(Vec<u8>, Error)>,
}

impl Volume {
    /// One step of emptying directory `dir` as `caller`: list at most `max` entries from
    /// position `from` and unlink every one that is not a directory, each with the
    /// rules of [`Volume::unlink_as`]; subdirectories are reported, not entered. Every
    /// unlink is its own operation, so a crash leaves a consistent, partly emptied
    /// directory, as `rm -r` would. Positions stay valid while entries go, so the next
    /// step starts at `next` and meets each remaining entry once. The step also ends
    /// before an entry when the names reported so far, at `name.len() + 8` bytes each,
    /// could pass `room` with it (a reply of bounded size).
    pub fn empty_step(&self, dir: u64, caller: &Caller, from: u64, max: usize, room: usize) -> Result<EmptyStep> {
        // A plain listing: readdirplus's sweep over the inode blocks saved little on slow
        // storage and cost more than it saved in memory, for its locks and attributes.
        let entries = self.readdir(dir, from, max.max(1))?;
        let mut step = EmptyStep { next: from, done: entries.len() < max.max(1), ..EmptyStep::default() };
        let mut left = room;
        for DirEntry { ino, ft, name, next } in entries {
            // Stop while a report of this entry would still fit.
            let cost = name.len() + 8;
            if cost > left {
                step.done = false;
                break;
            }
            step.next = next;
            if name == b"." || name == b".." {
                continue;
            }
            if ft == FileType::Directory {
                step.subdirs.push((name, ino));
                left -= cost;
                continue;
            }
            match self.remove_entry(dir, &name, false, Some(caller)) {
                Ok(left) => step.removed.push((name, ino, left)),
                // Gone meanwhile: what rm -rf would make of it too.
                Err(Error::NotFound) => {}
                Err(e) => {
                    step.failed.push((name, e));
                    left -= cost;
                }
            }
        }
        Ok(step)
    }

    /// Remove `name` in directory `parent` and, if it is a directory, everything under
    /// it, as `caller` (see [`Volume::empty_step`]); `progress` hears the count of
    /// entries removed so far after each step. What cannot be removed stays, with its
    /// ancestors, and is listed; the rest goes, as with `rm -rf`.
    pub fn remove_tree(
        &self,
        parent: u64,
        name: &[u8],
        caller: &Caller,
        progress: &mut dyn FnMut(u64),
    ) -> Result<TreeRemoval> {
        let top = self.lookup(parent, name)?;
        let mut out = TreeRemoval::default();
        if top.kind != FileType::Directory {
            self.unlink_as(parent, name, caller)?;
            out.removed = 1;
            return Ok(out);
        }
        // Depth first, without recursion: each frame is a directory being emptied.
        struct Frame {
            parent: u64,
            name: Vec<u8>,
            ino: u64,
            path: Vec<u8>,
            pos: u64,
            subdirs: Vec<(Vec<u8>, u64)>,
            listed: bool,
        }
        let mut stack = vec![Frame {
            parent,
            name: name.to_vec(),
            ino: top.ino,
            path: name.to_vec(),
            pos: 0,
            subdirs: Vec::new(),
            listed: false,
        }];
        while let Some(f) = stack.last_mut() {
            if !f.listed {
                let step = match self.empty_step(f.ino, caller, f.pos, 1024, usize::MAX) {
                    Ok(s) => s,
                    Err(e) => {
                        let f = stack.pop().expect("a frame");
                        out.failed.push((f.path, e));
                        continue;
                    }
                };
                out.removed += step.removed.len() as u64;
                for (n, e) in step.failed {
                    out.failed.push((join(&f.path, &n), e));
                }
                f.subdirs.extend(step.subdirs);
                f.pos = step.next;
                f.listed = step.done;
                progress(out.removed);
                continue;
            }
            if let Some((n, ino)) = f.subdirs.pop() {
                let path = join(&f.path, &n);
                let child = Frame { parent: f.ino, name: n, ino, path, pos: 0, subdirs: Vec::new(), listed: false };
                stack.push(child);
                continue;
            }
            let f = stack.pop().expect("a frame");
            match self.rmdir_as(f.parent, &f.name, caller) {
                Ok(()) => out.removed += 1,
                Err(Error::NotFound) => {}
                // Something inside stayed and is listed already.
                Err(Error::NotEmpty) if !out.failed.is_empty() => {}
                Err(e) => out.failed.push((f.path, e)),
            }
        }
        progress(out.removed);
        Ok(out)
    }
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = dir.to_vec();
    p.push(b'/');
    p.extend_from_slice(name);
    p
}

/// What one step of summing a directory found ([`Volume::sum_step`]).
#[derive(Debug, Default)]
pub struct SumStep {
    /// The listing position the next step starts from.
    pub next: u64,
    /// The listing reached the directory's end.
    pub done: bool,
    /// Entries that are not directories and have one link.
    pub files: u64,
    /// Their allocated size, in 512-byte units (st_blocks).
    pub blocks: u64,
    /// Their apparent size in bytes (st_size).
    pub bytes: u64,
    /// Entries with more than one link, which a sum counts once: inode, st_blocks,
    /// st_size, and how many of `subdirs` came before it in the listing (du counts a
    /// file under the first of its names it meets, walking in listing order).
    pub linked: Vec<(u64, u64, u64, u32)>,
    /// Subdirectories met, for the caller to sum: name and inode.
    pub subdirs: Vec<(Vec<u8>, u64)>,
    /// Entries whose inode could not be read.
    pub unreadable: Vec<Vec<u8>>,
}

impl Volume {
    /// One step of summing directory `dir`'s entries as `caller` may (`du`): search
    /// permission on it is needed (`AccessDenied`), as for stat(2) of its entries. Lists
    /// at most `max` entries from position `from` with their attributes (read in disk
    /// order, as readdirplus), and ends early as [`Volume::empty_step`] does when its
    /// report would pass `room` bytes (a subdirectory or unreadable entry costs its name
    /// and 8, a linked one 32).
    pub fn sum_step(&self, dir: u64, caller: &Caller, from: u64, max: usize, room: usize) -> Result<SumStep> {
        self.access(dir, caller, 1)?;
        let entries = self.readdir_plus(dir, from, max.max(1))?;
        let mut step = SumStep { next: from, done: entries.len() < max.max(1), ..SumStep::default() };
        let mut left = room;
        for (DirEntry { ino, ft, name, next }, attr) in entries {
            let cost = name.len().max(24) + 8;
            if cost > left {
                step.done = false;
                break;
            }
            step.next = next;
            if name == b"." || name == b".." {
                continue;
            }
            let Some(a) = attr else {
                step.unreadable.push(name);
                left -= cost;
                continue;
            };
            if ft == FileType::Directory {
                step.subdirs.push((name, ino));
                left -= cost;
            } else if a.nlink > 1 {
                step.linked.push((ino, a.blocks, a.size, step.subdirs.len() as u32));
                left -= cost;
            } else {
                step.files += 1;
                step.blocks += a.blocks;
                step.bytes += a.size;
            }
        }
        Ok(step)
    }
}

/// An entry for [`Volume::import_entry`]: what a copy of one host file carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NewEntry<'a> {
    pub name: &'a [u8],
    /// File type and permission bits, as `st_mode`.
    pub mode: u32,
    /// The owner and group wanted (set as far as the caller may, see
    /// [`Volume::import_entry`]; `u32::MAX` keeps what the creation gave, as chown's -1).
    pub uid: u32,
    pub gid: u32,
    /// A device node's number.
    pub rdev: u64,
    /// Seconds and nanoseconds.
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    /// A regular file's contents, or a symlink's target.
    pub data: &'a [u8],
    /// Extended attributes, full names (`user.x`, `system.posix_acl_access`).
    pub xattrs: &'a [(&'a [u8], &'a [u8])],
}

impl Volume {
    /// Make entry `e` in directory `dir` as `caller` would with `cp -a`: create it (as
    /// open(O_CREAT | O_EXCL), mknod or symlink: write and search permission on `dir`;
    /// device nodes need root), write its contents, set its xattrs, then its owner, mode
    /// and times. What the caller may not set is left as the kernel would leave it, with
    /// no error, as `cp -a` ignores those failures: another owner needs root; another
    /// group, root or membership; `trusted.` and `security.` xattrs, root; `user.` ones
    /// exist on files and directories only; the setgid bit stays only for a member of
    /// the group. A directory is only made, with its owner's read, write and search bits
    /// added, and the caller sets its attributes after its contents. Each step is its own
    /// operation, so a crash or a full volume leaves a partly made entry, as it would
    /// leave `cp`'s. Returns the new inode.
    pub fn import_entry(&self, dir: u64, e: &NewEntry<'_>, caller: &Caller) -> Result<u64> {
        let kind = type_of(e.mode)?;
        let root = caller.uid == 0;
        let perm = e.mode & 0o7777;
        let node = |mode| NewNode { mode, uid: caller.uid, gid: caller.gid, rdev: e.rdev, umask: 0 };
        let made = match kind {
            FileType::Directory => {
                let n = node(libc::S_IFDIR | (perm & 0o777) | 0o700);
                return Ok(self.make_node(dir, e.name, n, false, Some(caller))?.ino);
            }
            FileType::Symlink => self.symlink_by(dir, e.name, e.data, (caller.uid, caller.gid), Some(caller))?,
            FileType::CharDevice | FileType::BlockDevice if !root => return Err(Error::NotPermitted),
            _ => self.make_node(dir, e.name, node((e.mode & libc::S_IFMT) | (perm & 0o777)), false, Some(caller))?,
        };
        let ino = made.ino;
        if kind == FileType::RegularFile && !e.data.is_empty() {
            let mut at = 0;
            while at < e.data.len() {
                at += self.write(ino, at as u64, &e.data[at..])?;
            }
        }
        for (name, value) in e.xattrs {
            if !may_set_xattr(name, kind, root) {
                continue;
            }
            match self.setxattr_as(ino, name, value, XattrMode::Any, caller) {
                Ok(()) => {}
                Err(err @ (Error::NoSpace | Error::Io(_) | Error::Corrupt(_) | Error::ReadOnly)) => return Err(err),
                // A value the volume refuses (a bad ACL, too large) is skipped, as cp
                // skips what the target refuses.
                Err(_) => {}
            }
        }
        let uid = if root && e.uid != u32::MAX { e.uid } else { made.uid };
        let gid = if e.gid != u32::MAX && (root || caller.in_group(e.gid)) { e.gid } else { made.gid };
        let mut mode = perm;
        if !root && !caller.in_group(gid) {
            mode &= !libc::S_ISGID;
        }
        let s = SetAttr {
            mode: (kind != FileType::Symlink).then_some(mode),
            uid: Some(uid),
            gid: Some(gid),
            atime: Some(SetTime::At(e.atime)),
            mtime: Some(SetTime::At(e.mtime)),
            ..SetAttr::default()
        };
        self.setattr(ino, &s)?;
        Ok(ino)
    }
}

/// Whether a copy as a caller (root or not) sets xattr `name` on an inode of `kind`, as
/// the kernel's `xattr_permission` and the capability rules would let it.
fn may_set_xattr(name: &[u8], kind: FileType, root: bool) -> bool {
    if name.starts_with(b"user.") {
        matches!(kind, FileType::RegularFile | FileType::Directory)
    } else if name.starts_with(b"system.posix_acl_") {
        kind != FileType::Symlink
    } else {
        root && (name.starts_with(b"trusted.") || name.starts_with(b"security."))
    }
}
