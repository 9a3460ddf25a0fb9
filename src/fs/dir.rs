//! Hashed directories (seed 000): each directory is a B+tree keyed by a 63-bit value
//! derived from the ext4 hash of the name under the volume's seed.
//!
//! key = ((major >> 1) << 32 | minor) + displacement. The displacement is 0 unless
//! another live entry already holds the key (a full 63-bit collision: routine under the
//! unseeded legacy hash, whose minor is always 0); then the entry takes the next free key.
//! `max_disp` in the directory inode bounds how far a lookup probes. Keys never move
//! once given, so they double as readdir cookies that survive splits and merges: an entry
//! present for a whole scan is returned exactly once.
//!
//! Readdir positions: 0 = start, 1 = after ".", 2 = after "..", key + 3 = after the
//! entry with that key.

use crate::disk::format::*;
use crate::disk::hash::name_base_key;
use crate::disk::valid::check_dir_key;
use crate::engine::btree;
use crate::engine::store::{MetaRead, Store, Tx};
use crate::error::{Error, Result};

/// The hash key of a name before displacement.
pub fn name_key(st: &Store, name: &[u8]) -> u64 {
    name_base_key(st.sb.hash, st.sb.hash_seed, name)
}

/// Reject names that cannot be directory entries.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(Error::Invalid(format!("bad file name {:?}", String::from_utf8_lossy(name))));
    }
    Ok(())
}

/// Visit the decoded entries with key >= `from` in key order until `f` returns false.
fn scan_entries(
    st: &mut (impl MetaRead + ?Sized),
    dir: &Inode,
    from: u64,
    mut f: impl FnMut(u64, u64, FileType, &[u8]) -> bool,
) -> Result<()> {
    let d = dir.dir()?;
    if d.tree.root == 0 {
        return Ok(());
    }
    let mut err = None;
    let layout = st.store().sb.layout;
    btree::scan(st, &d.tree, dir.ino, from, |k, v| match entry(&layout, dir.ino, k, v) {
        Ok((ino, ft, name)) => f(k, ino, ft, name),
        Err(e) => {
            err = Some(e);
            false
        }
    })?;
    err.map_or(Ok(()), Err)
}

/// Decode entry `key` of directory `dir` and check it: its key has a listing position,
/// and the inode it names can exist.
fn entry<'v>(layout: &Layout, dir: u64, key: u64, v: &'v [u8]) -> Result<(u64, FileType, &'v [u8])> {
    check_dir_key(key, dir)?;
    let (ino, ft, name) = decode_dirent(v)?;
    if !layout.ino_ok(ino) {
        return Err(Error::corrupt(format!("directory {dir}: entry names inode {ino}, out of range")));
    }
    // A name with a '/' or a NUL, or "." or "..", would lead whoever uses it as a path
    // (export, a program walking the tree) somewhere else.
    if check_name(name).is_err() {
        return Err(Error::corrupt(format!(
            "directory {dir}: entry {:?} is not a valid name",
            String::from_utf8_lossy(name)
        )));
    }
    Ok((ino, ft, name))
}

/// A found entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    pub key: u64,
    pub ino: u64,
    pub ft: FileType,
}

/// Look a name up.
pub(crate) fn lookup(st: &mut (impl MetaRead + ?Sized), dir: &Inode, name: &[u8]) -> Result<Option<Found>> {
    let h = name_key(st.store(), name);
    let limit = h + dir.dir()?.max_disp as u64;
    let mut found = None;
    scan_entries(st, dir, h, |k, ino, ft, n| {
        if n == name {
            found = Some(Found { key: k, ino, ft });
        }
        found.is_none() && k < limit
    })?;
    Ok(found)
}

/// Insert a new entry, or fail with `Exists`. One probe from the name's hash both looks
/// for the name (within `max_disp`) and finds the first key no entry holds. Returns the key.
pub(crate) fn insert(st: &mut Tx, dir: &mut Inode, name: &[u8], ino: u64, ft: FileType) -> Result<u64> {
    let h = name_key(st.store(), name);
    let dir_ino = dir.ino;
    let mark = st.usage_mark();
    let limit = h + dir.dir()?.max_disp as u64;
    let mut key = h;
    let mut gap = false;
    let mut exists = false;
    scan_entries(st, dir, h, |k, _, _, n| {
        if !gap {
            if k == key {
                key += 1;
            } else {
                gap = true;
            }
        }
        exists = k <= limit && n == name;
        !exists && (!gap || k < limit)
    })?;
    if exists {
        return Err(Error::Exists);
    }
    let d = dir.dir_mut()?;
    let disp = key - h;
    if disp > u32::MAX as u64 {
        return Err(Error::NoSpace);
    }
    btree::insert(st, &mut d.tree, dir_ino, key, &encode_dirent(ino, ft, name), false)?;
    d.max_disp = d.max_disp.max(disp as u32);
    d.entries = d.entries.saturating_add(1);
    st.account(&mut dir.blocks, mark);
    dir.size = dir.blocks.saturating_mul(4096);
    Ok(key)
}

/// Read, changing nothing, the index blocks removing entry `key` is likely to touch
/// (see `btree::read_for_remove`): done in the part of an unlink that may run again, so
/// that a cache miss there is read with the locks let go.
pub(crate) fn read_for_remove(r: &mut (impl MetaRead + ?Sized), dir: &Inode, key: u64) -> Result<()> {
    let d = dir.dir()?;
    btree::read_for_remove(r, &d.tree, dir.ino, key)
}

/// Remove the entry with `key` (found by `lookup`).
pub(crate) fn remove(st: &mut Tx, dir: &mut Inode, key: u64) -> Result<()> {
    let dir_ino = dir.ino;
    let mark = st.usage_mark();
    let d = dir.dir_mut()?;
    btree::remove(st, &mut d.tree, dir_ino, key)?.ok_or_else(|| Error::corrupt("directory entry vanished"))?;
    d.entries = d.entries.saturating_sub(1);
    if d.entries == 0 {
        // An empty directory forgets its collision history too.
        d.max_disp = 0;
    }
    st.account(&mut dir.blocks, mark);
    dir.size = dir.blocks.saturating_mul(4096);
    Ok(())
}

/// Point an existing entry at another inode (rename over an existing name).
pub(crate) fn replace(st: &mut Tx, dir: &mut Inode, key: u64, name: &[u8], ino: u64, ft: FileType) -> Result<()> {
    let dir_ino = dir.ino;
    let mark = st.usage_mark();
    let d = dir.dir_mut()?;
    btree::insert(st, &mut d.tree, dir_ino, key, &encode_dirent(ino, ft, name), true)?;
    st.account(&mut dir.blocks, mark);
    dir.size = dir.blocks.saturating_mul(4096);
    Ok(())
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub ft: FileType,
    pub name: Vec<u8>,
    /// Position to resume after this entry.
    pub next: u64,
}

/// List entries from position `pos`: "." and ".." first, then the index in key order.
/// `f` returns false to stop.
pub(crate) fn read(
    st: &mut (impl MetaRead + ?Sized),
    dir: &Inode,
    pos: u64,
    mut f: impl FnMut(DirEntry) -> bool,
) -> Result<()> {
    dir.dir()?;
    if pos == 0 && !f(DirEntry { ino: dir.ino, ft: FileType::Directory, name: b".".to_vec(), next: 1 }) {
        return Ok(());
    }
    if pos <= 1 && !f(DirEntry { ino: dir.parent, ft: FileType::Directory, name: b"..".to_vec(), next: 2 }) {
        return Ok(());
    }
    let from = if pos >= 3 { pos - 2 } else { 0 };
    scan_entries(st, dir, from, |k, ino, ft, name| f(DirEntry { ino, ft, name: name.to_vec(), next: k + 3 }))
}

/// Free the index of an empty directory (rmdir).
pub(crate) fn destroy(st: &mut Tx, dir: &mut Inode) -> Result<()> {
    let dir_ino = dir.ino;
    let d = dir.dir_mut()?;
    let mut t = d.tree;
    btree::destroy(st, &mut t, dir_ino)?;
    d.tree = t;
    Ok(())
}
