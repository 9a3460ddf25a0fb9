//! Attributes, xattrs and the POSIX ACL policy.

use crate::error::{Error, Result};
use crate::fs::acl;
use crate::fs::xattr;

use super::quota::{QUOTA_USED_XATTR, QUOTA_XATTR};
use super::*;
use crate::disk::valid::normal_time;
use crate::engine::store::{read_inode, MetaRead};

/// The attributes of inode `i`, counting the blocks its dirty pages will take.
pub(super) fn attr_of(delta: &Delta, i: &Inode) -> Result<Attr> {
    let pending = delta.new_page_count(i.ino);
    Ok(Attr {
        ino: i.ino,
        size: i.size,
        // Both in range (read_inode's rules), so neither sum nor product wraps.
        blocks: i.blocks.saturating_add(pending).saturating_mul(8),
        atime: normal_time(i.atime),
        mtime: normal_time(i.mtime),
        ctime: normal_time(i.ctime),
        crtime: normal_time(i.crtime),
        kind: type_of(i.mode)?,
        mode: i.mode,
        nlink: i.nlink,
        uid: i.uid,
        gid: i.gid,
        rdev: i.rdev,
        generation: i.generation,
    })
}

/// Inode `i`'s ACL of kind `idx` (2 access, 3 default), if it has one.
fn acl_in(r: &mut (impl MetaRead + ?Sized), i: &Inode, idx: u8) -> Result<Option<Vec<acl::Entry>>> {
    let sb = &r.store().sb;
    if sb.xattr_filter() && xattr::ruled_out(i, idx, b"", sb.filter_hashes()) {
        return Ok(None);
    }
    match xattr::load(r, i)?.into_iter().find(|x| x.idx == idx) {
        Some(x) => Ok(Some(acl::decode(&x.value).map_err(|_| Error::corrupt(format!("inode {}: bad ACL", i.ino)))?)),
        None => Ok(None),
    }
}

/// Whether `caller` may add or remove names in directory `d`: write and search
/// permission by its mode and ACL (`AccessDenied` if not).
pub(super) fn may_change_entries(r: &mut (impl MetaRead + ?Sized), d: &Inode, caller: &Caller) -> Result<()> {
    // Root needs no ACL read: it may write and search every directory.
    let acl = if caller.uid == 0 { None } else { acl_in(r, d, 2)? };
    let in_group = |gid: u32| caller.in_group(gid);
    if acl::permits(d.mode, (d.uid, d.gid), acl.as_deref(), (caller.uid, &in_group), 3) {
        Ok(())
    } else {
        Err(Error::AccessDenied)
    }
}

/// Whether the sticky bit of directory `d` lets `caller` remove or replace its entry
/// `i`: only the owner of either may (and root), as the kernel's `check_sticky`.
pub(super) fn sticky_allows(d: &Inode, i: &Inode, caller: &Caller) -> bool {
    d.mode & libc::S_ISVTX == 0 || caller.uid == 0 || caller.uid == i.uid || caller.uid == d.uid
}

/// Whether a change by a caller without CAP_FSETID drops the setgid bit of a file of
/// `mode` and group `gid` (the kernel's `setattr_should_drop_sgid`): when the group may
/// execute, or when the caller is not in the file's group. Without group execute the bit
/// marks mandatory locking and stays for the group's members. `in_group`: the caller's
/// groups, where known (the FUSE layer knows them; the volume's own paths do not).
fn drops_setgid(mode: u32, gid: u32, in_group: Option<&dyn Fn(u32) -> bool>) -> bool {
    mode & libc::S_ISGID != 0 && (mode & libc::S_IXGRP != 0 || in_group.is_some_and(|f| !f(gid)))
}

impl Inner {
    pub(super) fn attr(&self, i: &Inode) -> Result<Attr> {
        attr_of(&self.delta, i)
    }

    /// Drop the privileges a file grants, as the kernel does when a caller without
    /// CAP_FSETID writes or truncates it, and on any chown of a non-directory: the setuid
    /// bit, a file capability, and the setgid bit where `drops_setgid` says. Removing an
    /// xattr needs no new block, like `removexattr`. Returns whether anything was dropped.
    pub(super) fn drop_privileges(&self, i: &mut Inode, in_group: Option<&dyn Fn(u32) -> bool>) -> Result<bool> {
        let mode = i.mode;
        i.mode &= !libc::S_ISUID;
        if drops_setgid(i.mode, i.gid, in_group) {
            i.mode &= !libc::S_ISGID;
        }
        let bits = i.mode != mode;
        let (idx, suffix) = xattr::split_name(b"security.capability")?;
        if self.st.sb.xattr_filter() && xattr::ruled_out(i, idx, suffix, self.st.sb.filter_hashes()) {
            return Ok(bits);
        }
        let mut list = xattr::load(&mut self.st.tx(), i)?;
        let Some(p) = list.iter().position(|x| x.idx == idx && x.name == suffix) else { return Ok(bits) };
        list.remove(p);
        xattr::store(&mut self.st.tx(), i, &list)?;
        Ok(true)
    }

    /// An inode's POSIX ACL of xattr index `idx` (2 access, 3 default), if it has one.
    /// The xattr filter usually answers without reading anything.
    pub(super) fn acl_of(&self, i: &Inode, idx: u8) -> Result<Option<Vec<acl::Entry>>> {
        acl_in(&mut self.st.tx(), i, idx)
    }

    /// The mode a new child of `parent` gets, and the ACL xattrs it inherits: with a
    /// default ACL in the parent, POSIX's inheritance rules (the umask does not apply);
    /// otherwise the umask.
    pub(super) fn inherited(&self, p: &Inode, mode: u32, umask: u32) -> Result<(u32, Vec<xattr::Xattr>)> {
        let Some(def) = self.acl_of(p, 3)? else {
            return Ok((mode & !(umask & 0o777), Vec::new()));
        };
        let (mode, access) = acl::inherit(&def, mode);
        let mut list = Vec::new();
        if let Some(a) = access {
            list.push(xattr::Xattr { idx: 2, name: Vec::new(), value: acl::encode(&a) });
        }
        if mode & libc::S_IFMT == libc::S_IFDIR {
            list.push(xattr::Xattr { idx: 3, name: Vec::new(), value: acl::encode(&def) });
        }
        Ok((mode, list))
    }

    /// Keep an inode's access ACL in step with a new mode (chmod).
    pub(super) fn chmod_acl(&self, i: &mut Inode) -> Result<()> {
        if self.st.sb.xattr_filter() && xattr::ruled_out(i, 2, b"", self.st.sb.filter_hashes()) {
            return Ok(());
        }
        let mut list = xattr::load(&mut self.st.tx(), i)?;
        let Some(x) = list.iter_mut().find(|x| x.idx == 2) else { return Ok(()) };
        let mut a = acl::decode(&x.value).map_err(|_| Error::corrupt(format!("inode {}: bad ACL", i.ino)))?;
        acl::chmod(&mut a, i.mode);
        x.value = acl::encode(&a);
        xattr::store(&mut self.st.tx(), i, &list)
    }
}

impl Volume {
    /// Whether `caller` may access inode `ino` in the ways `want` asks (4 read, 2 write,
    /// 1 execute/search; 0 only checks that it exists), by its mode and POSIX ACL:
    /// `Error::AccessDenied` if not. The check `access(2)` and a mount without the
    /// kernel's own permission checks rely on.
    pub fn access(&self, ino: u64, caller: &Caller, want: u32) -> Result<()> {
        self.reading(&[(ino, Mode::Read)], |r, _| {
            let i = read_inode(r, ino)?;
            let acl = acl_in(r, &i, 2)?;
            let in_group = |gid: u32| caller.in_group(gid);
            if acl::permits(i.mode, (i.uid, i.gid), acl.as_deref(), (caller.uid, &in_group), want) {
                Ok(())
            } else {
                Err(Error::AccessDenied)
            }
        })
    }

    /// Whether a read of a file with attributes `a` would update its atime now (the
    /// volume's atime policy). `later_mtime`: the caller may hold a later mtime than the
    /// volume's — a kernel's writeback cache with the file open for writing keeps the
    /// times and sends them later, and its clock is coarse (a tick, 4 ms here), so the
    /// mtime the volume has can be older than the file's creation — and relatime then
    /// counts the file as changed since its last access.
    pub fn read_touches_atime(&self, a: &Attr, later_mtime: bool) -> bool {
        let mtime = if later_mtime { a.mtime.max(a.atime) } else { a.mtime };
        self.s.atime.wants_update(a.atime, mtime, a.ctime, now())
    }

    /// Attributes of an inode.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.reading(&[(ino, Mode::Read)], |r, seen| attr_of(seen.delta, &read_inode(r, ino)?))
    }

    /// Drop what file `ino` grants after a change by a caller without CAP_FSETID: the
    /// setuid bit, a file capability, and the setgid bit when the group may execute or
    /// the caller is not in the file's group (`in_group`: the caller's groups). For a
    /// server that learns of such a change only after it (the kernel leaves all of it to
    /// a FUSE server after a FALLOCATE, and the setgid rule after a WRITE, as the volume
    /// knows no caller's groups). ctime moves when anything is dropped. `capability`: look for a file capability too (a mode
    /// with nothing to drop then costs no delta). Returns whether anything was dropped.
    pub fn drop_privileges_of(&self, ino: u64, in_group: &dyn Fn(u32) -> bool, capability: bool) -> Result<bool> {
        if !capability {
            let a = self.getattr(ino)?;
            if a.mode & libc::S_ISUID == 0 && !drops_setgid(a.mode, a.gid, Some(in_group)) {
                return Ok(false);
            }
        }
        let cost = |g: &Inner| Ok((Cost::new(0, 0, true), g.st.inode(ino)?));
        let (g, mut i) = self.charged_with(&[(ino, Mode::Write)], cost)?;
        let dropped = g.drop_privileges(&mut i, Some(in_group))?;
        if dropped {
            i.ctime = now();
            g.st.put_inode(&i)?;
        }
        Ok(dropped)
    }

    /// Change attributes (chmod, chown, truncate, utimens).
    pub fn setattr(&self, ino: u64, s: &SetAttr) -> Result<Attr> {
        let cost = |g: &Inner| {
            let i = g.st.inode(ino)?;
            if s.size.is_none() {
                return Ok((Cost::new(0, 0, true), i));
            }
            match i.file_type() {
                Some(FileType::RegularFile) => {}
                Some(FileType::Directory) => return Err(Error::IsDir),
                _ => return Err(Error::Invalid("truncate of a special file".into())),
            }
            // Shrinking may split an extent, and rewrites the partial tail page.
            let depth = extent_depth(&i);
            Ok((Cost::new(2 * depth + 3 + Delta::writeback_meta(0, 1, depth), 1, true), i))
        };
        // A truncate reads the new last page: its data must have landed.
        let want = [(ino, Mode::Write)];
        let (g, mut i) =
            if s.size.is_some() { self.charged_on_with(ino, &want, cost)? } else { self.charged_with(&want, cost)? };
        let t = now();
        if let Some(m) = s.mode {
            i.mode = (i.mode & libc::S_IFMT) | (m & 0o7777);
            g.chmod_acl(&mut i)?;
        }
        // Any owner or group given, the present one too: the kernel's chown_common kills
        // the bits whatever the new owner is (xfstests generic/193).
        let chown = s.uid.is_some() || s.gid.is_some();
        if let Some(u) = s.uid {
            i.uid = u;
        }
        if let Some(gid) = s.gid {
            i.gid = gid;
        }
        // A chown of a non-directory drops what the file grants, as the kernel's
        // chown_common does; so does a truncate by a caller without CAP_FSETID. A mode
        // given in the same call is applied as given.
        let truncating = s.size.is_some_and(|n| n != i.size);
        if s.mode.is_none() && ((chown && !i.is_dir()) || (truncating && s.drop_privileges)) {
            g.drop_privileges(&mut i, None)?;
        }
        if let Some(size) = s.size {
            if size != i.size {
                g.truncate(&mut i, size)?;
                i.mtime = t;
            }
        }
        let pick = |st: SetTime| match st {
            SetTime::Now => t,
            SetTime::At(x) => x,
        };
        if let Some(a) = s.atime {
            i.atime = pick(a);
        }
        if let Some(m) = s.mtime {
            i.mtime = pick(m);
        }
        i.ctime = s.ctime.unwrap_or(t);
        g.st.put_inode(&i)?;
        g.attr(&i)
    }

    /// Value of an xattr.
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        if let Some(v) = self.rstat_xattr(ino, name)? {
            return Ok(v);
        }
        if name == QUOTA_XATTR.as_bytes() || name == QUOTA_USED_XATTR.as_bytes() {
            let limit = name == QUOTA_XATTR.as_bytes();
            return match self.quota(ino) {
                Ok(Some(q)) => Ok(if limit { q.limit } else { q.used }.to_string().into_bytes()),
                Ok(None) | Err(Error::NotDir) => Err(Error::NoData),
                Err(e) => Err(e),
            };
        }
        let (idx, suffix) = xattr::split_name(name)?;
        self.reading(&[(ino, Mode::Read)], |r, seen| {
            let i = read_inode(r, ino)?;
            let sb = &r.store().sb;
            if seen.opts.use_xattr_filter && sb.xattr_filter() && xattr::ruled_out(&i, idx, suffix, sb.filter_hashes())
            {
                return Err(Error::NoData);
            }
            let (bytes, at) = xattr::find(r, &i, idx, suffix)?;
            at.map(|at| xattr::value_at(&bytes, at).to_vec()).ok_or(Error::NoData)
        })
    }

    /// Names of all xattrs.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        self.reading(&[(ino, Mode::Read)], |r, _| {
            let i = read_inode(r, ino)?;
            Ok(xattr::load(r, &i)?.iter().map(|x| xattr::full_name(x.idx, &x.name)).collect())
        })
    }

    /// Set an xattr.
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        self.setxattr_by(ino, name, value, mode, None)
    }

    /// [`Volume::setxattr`] on behalf of `caller`, which matters for one rule: an access
    /// ACL set by a caller who is neither root nor in the file's group drops the setgid
    /// bit, as the kernel's `posix_acl_update_mode` does (chmod's rule).
    pub fn setxattr_as(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode, caller: &Caller) -> Result<()> {
        self.setxattr_by(ino, name, value, mode, Some(caller))
    }

    fn setxattr_by(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode, caller: Option<&Caller>) -> Result<()> {
        if name == QUOTA_XATTR.as_bytes() {
            let bytes = std::str::from_utf8(value).ok().and_then(|v| v.trim_end_matches('\0').trim().parse().ok());
            let bytes = bytes.ok_or_else(|| Error::Invalid("a quota is a number of bytes".into()))?;
            let has = self.quota(ino)?.is_some();
            match (has, mode) {
                (true, XattrMode::Create) => return Err(Error::Exists),
                (false, XattrMode::Replace) => return Err(Error::NoData),
                _ => {}
            }
            return self.set_quota(ino, Some(bytes));
        }
        let (idx, suffix) = xattr::split_name(name)?;
        if value.len() > xattr::VALUE_MAX {
            return Err(Error::TooBig);
        }
        let g = self.charged(&[(ino, Mode::Write)], |g| {
            // The new list may need every block of a maximal chain; the old ones are
            // released only with the delta.
            let i = g.st.inode(ino)?;
            let now = xattr::stored_len(&mut g.st.tx(), &i)?;
            Ok(Cost::new(xattr::blocks_for(now + 6 + suffix.len() + value.len()), 0, false))
        })?;
        let mut i = g.st.inode(ino)?;
        // The list is changed as bytes: one copy, checked entry by entry, none decoded.
        let (mut bytes, pos) = xattr::find(&mut g.st.tx(), &i, idx, suffix)?;
        match (&pos, mode) {
            (Some(_), XattrMode::Create) => return Err(Error::Exists),
            (None, XattrMode::Replace) => return Err(Error::NoData),
            _ => {}
        }
        // POSIX ACLs: validated; an access ACL sets the mode's permission bits, and one
        // the mode says all of is not stored at all; default ACLs only on directories.
        let mut keep = true;
        if idx == 2 || idx == 3 {
            let a = acl::decode(value)?;
            if idx == 3 && !i.is_dir() {
                return Err(Error::Invalid("default ACL on a non-directory".into()));
            }
            if idx == 2 {
                i.mode = (i.mode & !0o777) | acl::mode_bits(&a);
                keep = !acl::is_minimal(&a);
                if caller.is_some_and(|c| c.uid != 0 && !c.in_group(i.gid)) {
                    i.mode &= !libc::S_ISGID;
                }
            }
        }
        let k = g.st.sb.filter_hashes();
        // The filter is exact: a name added or kept adds its bits, a removed one makes
        // it computed again. A minimal ACL that was not stored leaves the list as it is.
        let filter = match (pos, keep) {
            (Some(at), true) => {
                bytes.splice(at, xattr::entry_bytes(idx, suffix, value));
                Some(i.xattr_filter | xattr::filter_mask(idx, suffix, k))
            }
            (None, true) => {
                bytes.extend_from_slice(&xattr::entry_bytes(idx, suffix, value));
                Some(i.xattr_filter | xattr::filter_mask(idx, suffix, k))
            }
            (Some(at), false) => {
                bytes.drain(at);
                Some(xattr::filter_of_bytes(i.ino, &bytes, k)?)
            }
            (None, false) => None,
        };
        if let Some(filter) = filter {
            xattr::store_bytes(&mut g.st.tx(), &mut i, &bytes, filter)?;
        }
        i.ctime = now();
        g.st.put_inode(&i)
    }

    /// Remove an xattr.
    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        if name == QUOTA_XATTR.as_bytes() {
            self.quota(ino).and_then(|q| q.ok_or(Error::NoData)).map_err(|e| match e {
                Error::NotDir => Error::NoData,
                e => e,
            })?;
            return self.set_quota(ino, None);
        }
        let (idx, suffix) = xattr::split_name(name)?;
        let g = self.charged(&[(ino, Mode::Write)], |_| Ok(Cost::new(0, 0, true)))?;
        let mut i = g.st.inode(ino)?;
        let (mut bytes, pos) = xattr::find(&mut g.st.tx(), &i, idx, suffix)?;
        bytes.drain(pos.ok_or(Error::NoData)?);
        let filter = xattr::filter_of_bytes(i.ino, &bytes, g.st.sb.filter_hashes())?;
        xattr::store_bytes(&mut g.st.tx(), &mut i, &bytes, filter)?;
        i.ctime = now();
        g.st.put_inode(&i)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::disk::device::MemDevice;
    use crate::engine::store::XATTR_SHARE_HINTS;

    /// The index of shareable xattr blocks stays bounded however many distinct lists
    /// there are, and a freed block's hint goes with it (the release once scanned the whole
    /// index: unlink cost grew with the number of files).
    #[test]
    fn shared_xattr_index_is_bounded() {
        let dev = Arc::new(MemDevice::new(32_768));
        mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
        let root = vol.root();
        let n = XATTR_SHARE_HINTS as u64 + 1000;
        for i in 0..n {
            let f = vol.create(root, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            // Too long for the inode: each list gets a block of its own.
            let value = format!("{i:0>100}");
            vol.setxattr(f, b"user.v", value.as_bytes(), XattrMode::Any).unwrap();
        }
        assert_eq!(vol.s.inner.read_inner().st.xattr_shared.lock().len(), XATTR_SHARE_HINTS, "bounded");
        for i in 0..n {
            vol.unlink(root, format!("f{i}").as_bytes()).unwrap();
        }
        assert!(vol.s.inner.read_inner().st.xattr_shared.lock().is_empty(), "freed blocks' hints are gone");
        vol.close().unwrap();
        let r = crate::fsck::check(dev, false, &mut |_| {}).unwrap();
        assert!(r.errors.is_empty(), "{:?}", r.errors);
    }
}
