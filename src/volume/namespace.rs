//! Names: lookup, create, link, unlink, rename; inode life and death.

use crate::disk::codec::*;
use crate::disk::format::*;
use crate::error::{Error, Result};
use crate::fs::dir::{self};
use crate::fs::file;
use crate::fs::xattr;

use super::attrs::{attr_of, may_change_entries, sticky_allows};
use super::*;
use crate::engine::store::read_inode;

impl Inner {
    /// A new inode for a child of `parent` (whose region may move: the caller stores
    /// `parent`), its record written as its slot is taken.
    pub(super) fn new_inode(&self, parent: &mut Inode, mode: u32, uid: u32, gid: u32, rdev: u64) -> Result<Inode> {
        let t = now();
        let generation = self.generations.take();
        self.inodes.add(1);
        // With recursive statistics every inode names the directory it is counted in.
        let counted_in = if self.st.has_rstats() || mode & libc::S_IFMT == libc::S_IFDIR { parent.ino } else { 0 };
        let make = |ino| {
            let mut i = Inode::new(ino, mode);
            i.parent = counted_in;
            i.uid = uid;
            i.gid = gid;
            i.nlink = 1;
            i.rdev = rdev;
            i.atime = t;
            i.mtime = t;
            i.ctime = t;
            i.crtime = t;
            i.generation = generation;
            i
        };
        let r = self.st.tx().alloc_inode(parent, &make);
        if r.is_err() {
            self.inodes.add(-1);
        }
        r
    }

    /// Common part of every create: check, charge, allocate, link in.
    pub(super) fn create_node(
        &self,
        mut p: Inode,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
        rdev: u64,
    ) -> Result<(Inode, Inode)> {
        dir::check_name(name)?;
        let ft = type_of(mode)?;
        let parent = p.ino;
        if p.nlink == 0 {
            return Err(Error::NotFound);
        }
        if ft == FileType::Directory && p.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        // The inode number is needed for the entry, but the name may exist: take the
        // number, and give it back if the insert refuses.
        let mut i = self.new_inode(&mut p, mode, uid, gid, rdev)?;
        let inserted = dir::insert(&mut self.st.tx(), &mut p, name, i.ino, ft);
        if let Err(e) = inserted {
            self.st.tx().free_inode(i.ino)?;
            self.inodes.add(-1);
            return Err(e);
        }
        if ft == FileType::Directory {
            i.nlink = 2;
            i.parent = parent;
            p.nlink += 1;
        }
        let t = now();
        p.mtime = t;
        p.ctime = t;
        self.st.put_inode(&p)?;
        self.st.put_inode(&i)?;
        if ft == FileType::Directory && self.st.has_rstats() {
            self.st.tx().rstat_insert(i.ino, i.ctime)?;
        }
        Ok((p, i))
    }

    /// Drop the link of `i` (locked for writing by the caller) in directory `dir`; free
    /// it when no link and no open handle remain.
    pub(super) fn drop_link(&self, mut i: Inode, dir: u64) -> Result<()> {
        self.link_dropped(&mut i, dir)?;
        if i.is_dir() && self.st.has_rstats() {
            // What it counted was noted before this change; it counts nothing from now.
            self.st.note_change_of(i.ino);
            self.st.tx().rstat_remove(i.ino)?;
        }
        if i.is_dir() {
            self.quota_dir_removed(i.ino);
        }
        i.nlink = i.nlink.saturating_sub(if i.is_dir() { 2 } else { 1 });
        i.ctime = now();
        if i.nlink > 0 {
            return self.st.put_inode(&i);
        }
        let open = self.is_open(i.ino);
        if !open && !self.is_held(i.ino) {
            // The common case, freed at once with no volume-wide lock: the inode's write
            // lock keeps every open out, and the holder's answer is the same one the
            // lives' lock would have seen (it guards only what is decided when it is held).
            return self.free_inode(i);
        }
        // It lives on with its blocks: they stay charged to the quotas it was below.
        self.quota_file_unlinked(&i, dir)?;
        {
            // Its blocks, and those its dirty pages would take: what letting it go frees.
            let blocks = i.blocks.saturating_add(self.delta.new_page_count(i.ino));
            let mut life = self.life.lock();
            if open {
                // Unlinked but open: keep it on the orphan list until the last release.
                // That release may be on its way (the kernel sends a close's RELEASE on
                // its own, behind what the process does next: `cat f; rm f`), so it
                // counts as unlinked moments ago too.
                push_orphan(&self.st, &mut life, i.ino)?;
                life.unlinked_at.insert(i.ino, Unlinked { at: std::time::Instant::now(), open: true, blocks });
                drop(life);
                return self.st.put_inode(&i);
            }
            if self.is_held(i.ino) {
                // Unlinked, not open, but still referenced by the holder (the kernel, which
                // may still have it open): alive until `forgotten`. Usually that comes
                // before the next commit and the inode is freed as if now; if not, the
                // commit puts it on the orphan list, so a crash frees it.
                life.held.insert(i.ino);
                life.unlinked_at.insert(i.ino, Unlinked { at: std::time::Instant::now(), open: false, blocks });
                drop(life);
                return self.st.put_inode(&i);
            }
        }
        self.free_inode(i)
    }

    /// Put the held unlinked inodes on the orphan list (before a commit, so every inode
    /// with no link on disk is on it).
    pub(super) fn list_held(&mut self) -> Result<()> {
        let Inner { st, life, .. } = self;
        let life = life.get_mut();
        let mut held: Vec<u64> = life.held.drain().collect();
        held.sort_unstable();
        for ino in held {
            let i = st.inode(ino)?;
            if i.nlink == 0 {
                push_orphan(st, life, ino)?;
                life.listed_held.insert(ino);
            }
        }
        Ok(())
    }

    pub(super) fn free_inode(&self, mut i: Inode) -> Result<()> {
        self.delta.drop_pages(&self.st, i.ino, |_| true);
        let mut tx = self.st.tx();
        match i.data {
            InodeData::Dir(d) => {
                dir::destroy(&mut tx, &mut i)?;
                tx.release_region(i.ino, &d)?;
            }
            InodeData::InlineSymlink(_) => {}
            _ => file::free_all(&mut tx, &mut i)?,
        }
        xattr::release(&mut tx, &mut i)?;
        tx.free_inode(i.ino)?;
        drop(tx);
        self.inodes.add(-1);
        Ok(())
    }

    /// Whether `ino`, found on the orphan list as read from disk, may be freed: not the
    /// root, no links, and for a directory no entries. (Files are not looked for in
    /// the namespace here; fsck checks that the list and the namespace are disjoint.)
    pub(super) fn orphan_ok(&self, ino: u64) -> std::result::Result<(), String> {
        if ino == self.st.sb.root_ino {
            return Err("it names the root directory".into());
        }
        let i = self.st.inode(ino).map_err(|e| format!("inode {ino}: {e}"))?;
        let empty_dir = i.dir().map_or(true, |d| d.entries == 0 && d.tree.root == 0);
        if i.nlink != 0 || !empty_dir {
            return Err(format!("inode {ino} has {} links or entries, so it is not unlinked", i.nlink));
        }
        Ok(())
    }

    /// Free orphan `ino`: off the orphan list, then its inode and blocks.
    pub(super) fn remove_orphan(&self, ino: u64) -> Result<()> {
        let target = self.unlist_orphan(ino)?;
        self.free_inode(target)
    }

    /// Take `ino` off the orphan list; returns its inode, no longer pointing into it.
    pub(super) fn unlist_orphan(&self, ino: u64) -> Result<Inode> {
        let mut life = self.life.lock();
        let mut target = self.st.inode(ino)?;
        let next = target.next_orphan;
        let prev = life.orphan_prev.remove(&ino);
        if next != 0 {
            match prev {
                Some(p) => life.orphan_prev.insert(next, p),
                None => life.orphan_prev.remove(&next),
            };
        }
        if life.state.orphan_head == ino {
            life.state.orphan_head = next;
        } else if let Some(p) = prev.filter(|&p| p != 0) {
            self.st.tx().set_next_orphan(p, next)?;
        } else {
            // Not known here (listed before this open, e.g. by a crash): walk the list.
            let mut cur = life.state.orphan_head;
            let mut guard = 0u64;
            while cur != 0 {
                let c = self.st.inode(cur)?;
                if c.next_orphan == ino {
                    self.st.tx().set_next_orphan(cur, next)?;
                    break;
                }
                cur = c.next_orphan;
                guard += 1;
                if guard > self.inode_count() + 1 {
                    return Err(Error::corrupt("orphan list loops"));
                }
            }
        }
        self.st.tx().set_next_orphan(ino, 0)?;
        target.next_orphan = 0;
        Ok(target)
    }
}

/// Put inode `ino` at the head of the orphan list (`life` is the list's lock, held).
fn push_orphan(st: &Store, life: &mut Life, ino: u64) -> Result<()> {
    let head = life.state.orphan_head;
    st.tx().set_next_orphan(ino, head)?;
    if head != 0 {
        life.orphan_prev.insert(head, ino);
    }
    life.orphan_prev.insert(ino, 0);
    life.state.orphan_head = ino;
    Ok(())
}

impl Inner {
    /// Whether directory `dir` is `ancestor` or lies below it, walking `parent` fields up
    /// to the root (under the rename lock, so no directory on the way moves). A chain
    /// cannot be longer than the number of inodes: a longer walk is a loop in corrupt
    /// metadata, reported instead of followed forever.
    pub(super) fn is_within(&self, dir: u64, ancestor: u64) -> Result<bool> {
        let root = self.st.sb.root_ino;
        let inodes = self.inode_count();
        let mut cur = dir;
        for _ in 0..=inodes + 1 {
            if cur == ancestor {
                return Ok(true);
            }
            if cur == root {
                return Ok(false);
            }
            cur = self.st.inode(cur)?.parent;
        }
        Err(Error::corrupt(format!("directory {dir}: parent chain loops")))
    }
}

impl Volume {
    /// Look a name up in a directory.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        // The directory is read locked, then the inode the name leads to.
        let mut want = vec![(parent, Mode::Read)];
        self.unlocked_reads(|| loop {
            let mut op = self.op(&want);
            let found = {
                let mut tx = op.st.tx();
                let p = read_inode(&mut tx, parent)?;
                if !p.is_dir() {
                    return Err(Error::NotDir);
                }
                match name {
                    b"." => parent,
                    b".." => p.parent,
                    _ => dir::lookup(&mut tx, &p, name)?.ok_or(Error::NotFound)?.ino,
                }
            };
            if !op.add(found, Mode::Read) {
                want.push((found, Mode::Read));
                continue;
            }
            let i = op.st.inode(found)?;
            return attr_of(&op.delta, &i);
        })
    }

    /// Create a regular file, device node, fifo or socket (`mode` includes the type).
    pub fn mknod(&self, parent: u64, name: &[u8], mode: u32, rdev: u64, uid: u32, gid: u32) -> Result<Attr> {
        self.make(parent, name, NewNode { mode, uid, gid, rdev, umask: 0 })
    }

    /// Create any inode but a symlink, as FUSE's create, mknod and mkdir do: the parent's
    /// default ACL, if any, is inherited (and the umask ignored), else the umask applies;
    /// a setgid parent gives the new inode its group (and a new directory its setgid bit).
    pub fn make(&self, parent: u64, name: &[u8], n: NewNode) -> Result<Attr> {
        self.make_node(parent, name, n, false, None)
    }

    /// [`Volume::make`], and an open handle on the new inode in the same step (FUSE's
    /// CREATE: the file is created open).
    pub fn make_open(&self, parent: u64, name: &[u8], n: NewNode) -> Result<Attr> {
        self.make_node(parent, name, n, true, None)
    }

    /// Make a node; with a `caller`, only if it may add names to `parent` (write and
    /// search permission, checked under the directory's lock, as the kernel's
    /// `may_create`).
    pub(super) fn make_node(
        &self,
        parent: u64,
        name: &[u8],
        n: NewNode,
        open: bool,
        caller: Option<&Caller>,
    ) -> Result<Attr> {
        if type_of(n.mode)? == FileType::Symlink {
            return Err(Error::Invalid("make of a symlink".into()));
        }
        // One block more for inherited ACLs (identical lists share it).
        let (g, p) = self.charged_with(&[(parent, Mode::Write)], |g| {
            let p = g.dir_inode(parent)?;
            Ok((Cost::new(Inner::dir_cost(&p) + g.inode_cost() + 1, 0, false), p))
        })?;
        if let Some(c) = caller {
            may_change_entries(&mut g.st.tx(), &p, c)?;
        }
        let (mode, gid) = new_owner(&p, n.mode, n.gid);
        let (mode, acls) = g.inherited(&p, mode, n.umask)?;
        let (_, mut i) = g.create_node(p, name, mode, n.uid, gid, n.rdev)?;
        if !acls.is_empty() {
            xattr::store(&mut g.st.tx(), &mut i, &acls)?;
            g.st.put_inode(&i)?;
        }
        if open {
            g.note_open(i.ino);
        }
        g.attr(&i)
    }

    /// An unnamed regular file in directory `parent`, open (`O_TMPFILE`): no link, on
    /// the orphan list until [`Volume::link`] gives it a name or its last release frees
    /// it (a crash before either frees it at the next open). Owner, group and ACLs are
    /// decided as for [`Volume::make`].
    pub fn make_tmpfile(&self, parent: u64, n: NewNode) -> Result<Attr> {
        self.make_unnamed(parent, n, true)
    }

    /// [`Volume::make_tmpfile`] with no open handle counted: the holder keeps the file
    /// (see [`Volume::set_holder`]), which goes at [`Volume::forgotten`] unless it was
    /// named. For a FUSE kernel with zero-message opens, which may never send the
    /// RELEASE of the handle it was created with.
    pub fn make_tmpfile_held(&self, parent: u64, n: NewNode) -> Result<Attr> {
        self.make_unnamed(parent, n, false)
    }

    fn make_unnamed(&self, parent: u64, n: NewNode, open: bool) -> Result<Attr> {
        if type_of(n.mode)? != FileType::RegularFile {
            return Err(Error::Invalid("O_TMPFILE makes regular files only".into()));
        }
        let (g, mut p) = self.charged_with(&[(parent, Mode::Write)], |g| {
            let p = g.dir_inode(parent)?;
            Ok((Cost::new(g.inode_cost() + 1, 0, false), p))
        })?;
        if p.nlink == 0 {
            return Err(Error::NotFound);
        }
        let (mode, gid) = new_owner(&p, n.mode, n.gid);
        let (mode, acls) = g.inherited(&p, mode, n.umask)?;
        let mut i = g.new_inode(&mut p, mode, n.uid, gid, 0)?;
        i.nlink = 0;
        g.quota_file_unlinked(&i, parent)?;
        {
            let mut life = g.life.lock();
            push_orphan(&g.st, &mut life, i.ino)?;
            if !open {
                // On the orphan list already: freed from there when the holder lets go.
                life.listed_held.insert(i.ino);
            }
        }
        if open {
            g.note_open(i.ino);
        }
        if !acls.is_empty() {
            xattr::store(&mut g.st.tx(), &mut i, &acls)?;
        }
        g.st.put_inode(&i)?;
        g.attr(&i)
    }

    /// Create a regular file with permission bits `perm`.
    pub fn create(&self, parent: u64, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.mknod(parent, name, libc::S_IFREG | (perm & 0o7777), 0, uid, gid)
    }

    /// Create a directory.
    pub fn mkdir(&self, parent: u64, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.make(parent, name, NewNode { mode: libc::S_IFDIR | (perm & 0o7777), uid, gid, rdev: 0, umask: 0 })
    }

    /// Create a symbolic link.
    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr> {
        self.symlink_by(parent, name, target, (uid, gid), None)
    }

    /// [`Volume::symlink`]; with a `caller`, as [`Volume::make_node`] checks it.
    pub(super) fn symlink_by(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        (uid, gid): (u32, u32),
        caller: Option<&Caller>,
    ) -> Result<Attr> {
        check_target(target)?;
        let pages = if target.len() <= INLINE_DATA { 0 } else { target.len().div_ceil(BLOCK_SIZE) as u64 };
        let (g, p) = self.charged_with(&[(parent, Mode::Write)], |g| {
            let p = g.dir_inode(parent)?;
            Ok((Cost::new(Inner::dir_cost(&p) + g.inode_cost() + Delta::writeback_meta(0, pages, 0), pages, false), p))
        })?;
        if let Some(c) = caller {
            may_change_entries(&mut g.st.tx(), &p, c)?;
        }
        let (_, gid) = new_owner(&p, libc::S_IFLNK, gid);
        let (_, mut i) = g.create_node(p, name, libc::S_IFLNK | 0o777, uid, gid, 0)?;
        if target.len() <= INLINE_DATA {
            let mut t = [0u8; INLINE_DATA];
            t[..target.len()].copy_from_slice(target);
            i.data = InodeData::InlineSymlink(t);
            i.size = target.len() as u64;
            g.st.put_inode(&i)?;
        } else {
            g.write(&mut i, 0, target, WriteAs::default())?;
        }
        g.attr(&i)
    }

    /// The target of a symbolic link.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        // A target kept in a data block is read with the link locked (a short one lives
        // in the inode).
        self.unlocked_reads(|| {
            let g = self.op_landed(&[(ino, Mode::Read)], ino)?;
            let i = g.st.inode(ino)?;
            if i.file_type() != Some(FileType::Symlink) {
                return Err(Error::Invalid("not a symlink".into()));
            }
            if let InodeData::InlineSymlink(t) = &i.data {
                return Ok(t[..i.size as usize].to_vec());
            }
            if g.is_failed() {
                return Err(Error::Failed);
            }
            let dirty = g.delta.with_pages(ino, |pages| file::dirty_in(pages, 0, i.size as usize));
            let r = file::read(&mut g.st.tx(), &i, dirty, 0, i.size as usize);
            r
        })
    }

    /// Add a hard link.
    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        dir::check_name(newname)?;
        let (g, (mut p, mut i)) = self.charged_with(&[(newparent, Mode::Write), (ino, Mode::Write)], |g| {
            let p = g.dir_inode(newparent)?;
            let i = g.st.inode(ino)?;
            Ok((Cost::new(Inner::dir_cost(&p) + g.rstat_cost(), 0, false), (p, i)))
        })?;
        if p.nlink == 0 {
            // A removed directory (still alive for its holder) takes no new names.
            return Err(Error::NotFound);
        }
        if i.is_dir() {
            return Err(Error::NotPermitted);
        }
        if i.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        let open = g.is_open(ino);
        let held = {
            let life = g.life.lock();
            let held = life.held.contains(&ino);
            if i.nlink == 0 && !open && !held && !g.is_held(ino) {
                // Unlinked and unused: it is about to be freed (or already was).
                return Err(Error::NotFound);
            }
            held
        };
        if i.nlink > 0 {
            g.quota_same_roots(i.parent, newparent)?;
        } else {
            g.quota_link_unlinked(&i, newparent)?;
        }
        let links = g.link_added(&mut i, newparent)?;
        dir::insert(&mut g.st.tx(), &mut p, newname, ino, type_of(i.mode)?)?;
        if let Some(l) = &links {
            g.st.tx().set_link_dirs(ino, Some(l))?;
        }
        {
            let mut life = g.life.lock();
            life.unlinked_at.remove(&ino);
            life.listed_held.remove(&ino);
            if held {
                life.held.remove(&ino);
            }
        }
        if !held && i.nlink == 0 {
            // An O_TMPFILE file (or one unlinked while open) gets a name: off the orphan
            // list, or a crash would free a linked inode.
            let counted_in = i.parent;
            i = g.unlist_orphan(ino)?;
            i.parent = counted_in;
        }
        let t = now();
        i.nlink += 1;
        i.ctime = t;
        p.mtime = t;
        p.ctime = t;
        g.st.put_inode(&p)?;
        g.st.put_inode(&i)?;
        g.attr(&i)
    }

    /// Remove `name` from `parent`; with `caller`, only as unlink(2) and rmdir(2) would let
    /// that caller (write and search on the directory, and its sticky bit), checked under
    /// the directory's lock. Returns the links the inode has left.
    pub(super) fn remove_entry(
        &self,
        parent: u64,
        name: &[u8],
        want_dir: bool,
        caller: Option<&Caller>,
    ) -> Result<u32> {
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        // The directory is write locked, then the inode the name leads to.
        let mut want = vec![(parent, Mode::Write)];
        let (g, mut p, f, i) = self.unlocked_reads(|| loop {
            let mut g = self.charged(&want, |_| Ok(Cost::new(0, 0, true)))?;
            let p = g.dir_inode(parent)?;
            if let Some(c) = caller {
                may_change_entries(&mut g.st.tx(), &p, c)?;
            }
            let f = dir::lookup(&mut g.st.tx(), &p, name)?.ok_or(Error::NotFound)?;
            if g.add(f.ino, Mode::Write) {
                let i = g.st.inode(f.ino)?;
                if caller.is_some_and(|c| !sticky_allows(&p, &i, c)) {
                    return Err(Error::NotPermitted);
                }
                dir::read_for_remove(&mut g.st.tx(), &p, f.key)?;
                break Ok((g, p, f, i));
            }
            want.push((f.ino, Mode::Write));
        })?;
        if want_dir {
            if !i.is_dir() {
                return Err(Error::NotDir);
            }
            if i.dir()?.entries > 0 {
                return Err(Error::NotEmpty);
            }
        } else if i.is_dir() {
            return Err(Error::IsDir);
        }
        dir::remove(&mut g.st.tx(), &mut p, f.key)?;
        let t = now();
        p.mtime = t;
        p.ctime = t;
        if want_dir {
            p.nlink -= 1;
        }
        g.st.put_inode(&p)?;
        let left = i.nlink.saturating_sub(if want_dir { 2 } else { 1 });
        g.drop_link(i, parent)?;
        Ok(left)
    }

    /// Remove a non-directory entry.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove_entry(parent, name, false, None).map(drop)
    }

    /// [`Volume::unlink`] as `caller`, with the kernel's rules: write and search
    /// permission on `parent` (`AccessDenied`), and in a sticky directory only the
    /// owner of the entry or of the directory (`NotPermitted`). Root may.
    pub fn unlink_as(&self, parent: u64, name: &[u8], caller: &Caller) -> Result<()> {
        self.remove_entry(parent, name, false, Some(caller)).map(drop)
    }

    /// Remove an empty directory.
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        if name == b"." {
            return Err(Error::Invalid("rmdir of .".into()));
        }
        if name == b".." {
            return Err(Error::NotEmpty);
        }
        self.remove_entry(parent, name, true, None).map(drop)
    }

    /// [`Volume::rmdir`] as `caller`, with the rules of [`Volume::unlink_as`].
    pub fn rmdir_as(&self, parent: u64, name: &[u8], caller: &Caller) -> Result<()> {
        if name == b"." || name == b".." {
            return self.rmdir(parent, name);
        }
        self.remove_entry(parent, name, true, Some(caller)).map(drop)
    }

    /// Rename, with RENAME_NOREPLACE and RENAME_EXCHANGE.
    pub fn rename(&self, parent: u64, name: &[u8], newparent: u64, newname: &[u8], flags: RenameFlags) -> Result<()> {
        dir::check_name(name).map_err(|e| {
            if matches!(e, Error::NameTooLong) {
                e
            } else {
                Error::Invalid("bad name".into())
            }
        })?;
        dir::check_name(newname)?;
        if flags.exchange && (flags.noreplace || flags.whiteout) {
            return Err(Error::Invalid("RENAME_EXCHANGE with RENAME_NOREPLACE or RENAME_WHITEOUT".into()));
        }
        // Between two directories, the rename lock first (see `Shared::rename`); then both
        // directories, and the inodes the two names lead to.
        let _moving = (parent != newparent).then(|| self.s.rename.lock());
        let mut want = vec![(parent, Mode::Write), (newparent, Mode::Write)];
        let (g, mut p, src, dst) = loop {
            let (mut g, (p, np0)) = self.charged_with(&want, |g| {
                let p = g.dir_inode(parent)?;
                let np = g.dir_inode(newparent)?;
                // A whiteout is a new entry and inode where the old name was.
                let whiteout = if flags.whiteout { Inner::dir_cost(&p) + g.inode_cost() } else { 0 };
                let links = 2 * g.rstat_cost();
                Ok((
                    Cost::new(Inner::dir_cost(&p) + Inner::dir_cost(&np) + whiteout + links, 0, !flags.whiteout),
                    (p, np),
                ))
            })?;
            if p.nlink == 0 || np0.nlink == 0 {
                // A removed directory (still alive for its holder) has no names to move and
                // takes no new ones.
                return Err(Error::NotFound);
            }
            let src = dir::lookup(&mut g.st.tx(), &p, name)?.ok_or(Error::NotFound)?;
            let dst = dir::lookup(&mut g.st.tx(), &np0, newname)?;
            if !g.add(src.ino, Mode::Write) {
                want.push((src.ino, Mode::Write));
                continue;
            }
            if let Some(d) = &dst {
                if !g.add(d.ino, Mode::Write) {
                    want.push((d.ino, Mode::Write));
                    continue;
                }
            }
            break (g, p, src, dst);
        };
        if flags.noreplace && dst.is_some() {
            return Err(Error::Exists);
        }
        if flags.exchange && dst.is_none() {
            return Err(Error::NotFound);
        }
        if let Some(d) = dst {
            if d.ino == src.ino {
                return Ok(()); // same inode: POSIX says do nothing
            }
        }
        let mut si = g.st.inode(src.ino)?;
        // A directory may not move below itself.
        if si.is_dir() && parent != newparent && g.is_within(newparent, src.ino)? {
            return Err(Error::Invalid("cannot move a directory into itself".into()));
        }
        g.quota_same_roots(parent, newparent)?;
        let si_links = g.link_moved(&mut si, parent, newparent)?;
        let t = now();
        if flags.exchange {
            let d = dst.unwrap();
            let mut di = g.st.inode(d.ino)?;
            if di.is_dir() && parent != newparent && g.is_within(parent, d.ino)? {
                return Err(Error::Invalid("cannot move a directory into itself".into()));
            }
            if let Some(l) = g.link_moved(&mut di, newparent, parent)? {
                g.st.tx().set_link_dirs(di.ino, Some(&l))?;
            }
            dir::replace(&mut g.st.tx(), &mut p, src.key, name, d.ino, d.ft)?;
            g.st.put_inode(&p)?;
            let mut np = g.dir_inode(newparent)?;
            dir::replace(&mut g.st.tx(), &mut np, d.key, newname, src.ino, src.ft)?;
            g.st.put_inode(&np)?;
            if parent != newparent {
                if si.is_dir() != di.is_dir() {
                    let (mut a, mut b) = (g.dir_inode(parent)?, g.dir_inode(newparent)?);
                    if si.is_dir() {
                        a.nlink -= 1;
                        b.nlink += 1;
                    } else {
                        a.nlink += 1;
                        b.nlink -= 1;
                    }
                    g.st.put_inode(&a)?;
                    g.st.put_inode(&b)?;
                }
                if si.is_dir() {
                    si.parent = newparent;
                }
                if di.is_dir() {
                    di.parent = parent;
                }
            }
            si.ctime = t;
            di.ctime = t;
            g.st.put_inode(&si)?;
            g.st.put_inode(&di)?;
        } else {
            let mut replaced = None;
            if let Some(d) = dst {
                let di = g.st.inode(d.ino)?;
                if si.is_dir() && !di.is_dir() {
                    return Err(Error::NotDir);
                }
                if !si.is_dir() && di.is_dir() {
                    return Err(Error::IsDir);
                }
                if di.is_dir() && di.dir()?.entries > 0 {
                    return Err(Error::NotEmpty);
                }
                let mut np = g.dir_inode(newparent)?;
                dir::replace(&mut g.st.tx(), &mut np, d.key, newname, src.ino, src.ft)?;
                g.st.put_inode(&np)?;
                replaced = Some(di);
            } else {
                let mut np = g.dir_inode(newparent)?;
                dir::insert(&mut g.st.tx(), &mut np, newname, src.ino, src.ft)?;
                g.st.put_inode(&np)?;
            }
            let mut p = g.dir_inode(parent)?;
            // The entry's key may have moved if the insert above displaced it: look again.
            let s2 = dir::lookup(&mut g.st.tx(), &p, name)?.ok_or_else(|| Error::corrupt("rename source vanished"))?;
            dir::remove(&mut g.st.tx(), &mut p, s2.key)?;
            g.st.put_inode(&p)?;
            if si.is_dir() {
                if parent != newparent {
                    let mut a = g.dir_inode(parent)?;
                    a.nlink -= 1;
                    g.st.put_inode(&a)?;
                    let mut b = g.dir_inode(newparent)?;
                    b.nlink += 1;
                    g.st.put_inode(&b)?;
                }
                si.parent = newparent;
            }
            si.ctime = t;
            g.st.put_inode(&si)?;
            if let Some(di) = replaced {
                if di.is_dir() {
                    let mut b = g.dir_inode(newparent)?;
                    b.nlink -= 1;
                    g.st.put_inode(&b)?;
                }
                let di = g.st.inode(di.ino)?;
                g.drop_link(di, newparent)?;
            }
        }
        if let Some(l) = si_links {
            g.st.tx().set_link_dirs(src.ino, Some(&l))?;
        }
        if flags.whiteout {
            let p = g.dir_inode(parent)?;
            let owner = g.st.inode(src.ino)?;
            g.create_node(p, name, libc::S_IFCHR, owner.uid, owner.gid, 0)?;
        }
        for d in [parent, newparent] {
            let mut x = g.dir_inode(d)?;
            x.mtime = t;
            x.ctime = t;
            g.st.put_inode(&x)?;
        }
        Ok(())
    }
}

/// A symlink target the volume stores: not empty, no NUL, at most `SYMLINK_MAX` bytes.
pub(super) fn check_target(target: &[u8]) -> Result<()> {
    if target.is_empty() {
        return Err(Error::Invalid("empty symlink target".into()));
    }
    if target.contains(&0) {
        return Err(Error::Invalid("symlink target contains a NUL byte".into()));
    }
    if target.len() > SYMLINK_MAX {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

/// Mode and group of a new inode created in `parent` by a caller of group `gid`, as the
/// kernel's `inode_init_owner` does for local filesystems: a setgid directory gives new
/// inodes its group, and new subdirectories its setgid bit.
pub(super) fn new_owner(parent: &Inode, mode: u32, gid: u32) -> (u32, u32) {
    if parent.mode & libc::S_ISGID == 0 {
        return (mode, gid);
    }
    let dir = mode & libc::S_IFMT == libc::S_IFDIR;
    (if dir { mode | libc::S_ISGID } else { mode }, parent.gid)
}

#[cfg(test)]
mod tests {
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use super::*;
    use crate::disk::device::MemDevice;

    /// A corrupt parent cycle under RENAME_EXCHANGE is reported as corruption, not walked
    /// forever with the volume lock held (the exchange's walk once had no bound).
    #[test]
    fn exchange_over_a_parent_cycle_is_corruption() {
        let dev = Arc::new(MemDevice::new(4096));
        mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        let vol = Arc::new(Volume::open(dev, OpenOptions::default()).unwrap());
        let root = vol.root();
        let a = vol.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino;
        let b = vol.mkdir(a, b"b", 0o755, 0, 0).unwrap().ino;
        vol.create(b, b"f", 0o644, 0, 0).unwrap();
        let x = vol.mkdir(root, b"x", 0o755, 0, 0).unwrap().ino;
        vol.mkdir(x, b"d", 0o755, 0, 0).unwrap();
        {
            // Damage: a's parent becomes b, so walking up from b never reaches the root.
            let g = vol.lock();
            let mut ai = g.st.inode(a).unwrap();
            ai.parent = b;
            g.st.put_inode(&ai).unwrap();
        }
        let (tx, rx) = mpsc::channel();
        let v = vol.clone();
        std::thread::spawn(move || {
            let exchange = RenameFlags { exchange: true, ..Default::default() };
            let _ = tx.send(v.rename(b, b"f", x, b"d", exchange));
        });
        let r = rx.recv_timeout(Duration::from_secs(20)).expect("RENAME_EXCHANGE over a parent cycle never returned");
        assert!(matches!(r, Err(Error::Corrupt(_))), "{r:?}");
        // The plain rename's check reports it the same way.
        let r = vol.rename(x, b"d", b, b"d2", RenameFlags::default());
        assert!(matches!(r, Err(Error::Corrupt(_))), "{r:?}");
        vol.poison();
    }
}
