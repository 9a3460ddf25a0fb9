//! Whole-tree jobs done in process, as a caller with the kernel's permission rules:
//! removing a directory's contents and summing them in bounded steps, and making entries
//! whole (contents, xattrs, owner, mode, times) as a copy into the volume does. The mount
//! serves them to `dxfs rm -r`, `dxfs du` and `dxfs cp -a` through ioctls (one request
//! per step or batch, not round trips per file); a program that embeds the library calls
//! them directly.

use crate::disk::codec::BLOCK_SIZE;
use crate::disk::format::{Inode, InodeData, INLINE_DATA};
use crate::error::{Error, Result};
use crate::fs::acl;
use crate::fs::dir::DirEntry;
use crate::fs::xattr::{self, Xattr};

use super::attrs::may_change_entries;
use super::delta::{Cost, Delta};
use super::locks::Mode;
use super::namespace::{check_target, new_owner};
use super::{type_of, Caller, FileType, Inner, NewNode, Volume, WriteAs, WRITE_CHUNK};

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
    /// Make entry `e` in directory `dir` as `caller` would with `cp -a`, in one
    /// operation (a crash leaves it whole or absent): create it (as open(O_CREAT |
    /// O_EXCL), mknod or symlink: write and search permission on `dir`; device nodes
    /// need root), with its contents, its xattrs, then its owner, mode and times. What
    /// the caller may not set is left as the kernel would leave it, with no error, as
    /// `cp -a` ignores those failures: another owner needs root; another group, root or
    /// membership; `trusted.` and `security.` xattrs, root; `user.` ones exist on files
    /// and directories only; the setgid bit stays only for a member of the group; values
    /// the volume refuses (a bad ACL, a list past its room) are left out. A parent's
    /// default ACL is inherited unless `e` brings its own access ACL. A directory is only
    /// made, with its owner's read, write and search bits added; the caller sets its
    /// attributes after its contents. Contents past 4 MiB are refused (`TooBig`): make
    /// the file, then write them. Returns the new inode.
    pub fn import_entry(&self, dir: u64, e: &NewEntry<'_>, caller: &Caller) -> Result<u64> {
        self.import_entry_by(dir, e, caller)
    }

    /// [`Volume::import_entry`] unless it would wait for room in the delta (for a
    /// commit, or for operations beside it to end): then `None`, and nothing changed.
    /// A frontend's serving thread tries this, and hands what waits to another thread.
    pub fn try_import_entry(&self, dir: u64, e: &NewEntry<'_>, caller: &Caller) -> Result<Option<u64>> {
        let _no_wait = super::charge::NoWait::set();
        match self.import_entry_by(dir, e, caller) {
            Err(e) if e.is_would_wait() => Ok(None),
            r => r.map(Some),
        }
    }

    fn import_entry_by(&self, dir: u64, e: &NewEntry<'_>, caller: &Caller) -> Result<u64> {
        let kind = type_of(e.mode)?;
        let root = caller.uid == 0;
        let perm = e.mode & 0o7777;
        let node = |mode| NewNode { mode, uid: caller.uid, gid: caller.gid, rdev: e.rdev, umask: 0 };
        match kind {
            FileType::Directory => {
                let n = node(libc::S_IFDIR | (perm & 0o777) | 0o700);
                return Ok(self.make_node(dir, e.name, n, false, Some(caller))?.ino);
            }
            FileType::CharDevice | FileType::BlockDevice if !root => return Err(Error::NotPermitted),
            FileType::Symlink => check_target(e.data)?,
            _ => {}
        }
        let data: &[u8] = match kind {
            FileType::RegularFile | FileType::Symlink => e.data,
            _ => &[],
        };
        // One operation charges all of it: larger contents are written after, in pieces.
        if data.len() > WRITE_CHUNK {
            return Err(Error::TooBig);
        }
        let given = settable_xattrs(e.xattrs, kind, root);
        let listed: usize = given.iter().map(|x| 6 + x.name.len() + x.value.len()).sum();
        let inline_link = kind == FileType::Symlink && data.len() <= INLINE_DATA;
        let pages = if inline_link { 0 } else { data.len().div_ceil(BLOCK_SIZE) as u64 };
        // The list given and an inherited pair of ACLs (an entry's header and at most a
        // block of ACL each); the new file's extent map.
        let meta_for = |p: &Inode| {
            Inner::dir_cost(p)
                + 1
                + xattr::blocks_for(listed + 2 * (6 + BLOCK_SIZE))
                + Delta::writeback_meta(0, pages, 1)
        };
        let (g, p) = self.charged_with(&[(dir, Mode::Write)], |g| {
            let p = g.dir_inode(dir)?;
            Ok((Cost::new(meta_for(&p) + g.inode_cost(), pages, false), p))
        })?;
        may_change_entries(&mut g.st.tx(), &p, caller)?;
        let type_bits = e.mode & libc::S_IFMT;
        // A symlink's permission bits are always all set (they mean nothing).
        let bits = if kind == FileType::Symlink { 0o777 } else { perm & 0o777 };
        let (mode, gid) = new_owner(&p, type_bits | bits, caller.gid);
        let (mode, inherited) = g.inherited(&p, mode, 0)?;
        let (_, mut i) = g.create_node(p, e.name, mode, caller.uid, gid, e.rdev)?;
        if inline_link {
            let mut t = [0u8; INLINE_DATA];
            t[..data.len()].copy_from_slice(data);
            i.data = InodeData::InlineSymlink(t);
            i.size = data.len() as u64;
        } else if !data.is_empty() {
            g.write(&mut i, 0, data, WriteAs::default())?;
        }
        // The ACLs given replace the inherited ones; a minimal access ACL is the mode.
        let mut list: Vec<Xattr> = inherited.into_iter().filter(|x| !given.iter().any(|y| y.idx == x.idx)).collect();
        for x in given {
            if x.idx == 2 && acl::decode(&x.value).is_ok_and(|a| acl::is_minimal(&a)) {
                continue;
            }
            if list.iter().map(|x| 6 + x.name.len() + x.value.len()).sum::<usize>() + 6 + x.name.len() + x.value.len()
                <= xattr::LIST_MAX
            {
                list.push(x);
            }
        }
        if !list.is_empty() {
            xattr::store(&mut g.st.tx(), &mut i, &list)?;
        }
        // Owner and group as far as the caller may give them, then the mode, which
        // keeps the setgid bit for a member of the file's group only (chmod's rule).
        if root && e.uid != u32::MAX {
            i.uid = e.uid;
        }
        if e.gid != u32::MAX && (root || caller.in_group(e.gid)) {
            i.gid = e.gid;
        }
        if kind != FileType::Symlink {
            let mut mode = perm;
            if !root && !caller.in_group(i.gid) {
                mode &= !libc::S_ISGID;
            }
            i.mode = (i.mode & libc::S_IFMT) | mode;
            g.chmod_acl(&mut i)?;
        }
        i.atime = e.atime;
        i.mtime = e.mtime;
        g.st.put_inode(&i)?;
        if g.delta.wants_flush(&g.st) {
            drop(g);
            self.s.ask_flush();
        }
        Ok(i.ino)
    }
}

/// The xattrs of `given` a caller (root or not) sets on a new inode of `kind`, decoded;
/// the last of a name wins, and values the volume refuses are left out.
fn settable_xattrs(given: &[(&[u8], &[u8])], kind: FileType, root: bool) -> Vec<Xattr> {
    let mut out: Vec<Xattr> = Vec::new();
    for (name, value) in given {
        if !may_set_xattr(name, kind, root) || value.len() > xattr::VALUE_MAX {
            continue;
        }
        let Ok((idx, suffix)) = xattr::split_name(name) else { continue };
        if (idx == 2 || idx == 3) && (acl::decode(value).is_err() || (idx == 3 && kind != FileType::Directory)) {
            continue;
        }
        out.retain(|x| !(x.idx == idx && x.name == suffix));
        out.push(Xattr { idx, name: suffix.to_vec(), value: value.to_vec() });
    }
    out
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
