//! Recursive statistics at the volume's level (ro_compat RSTATS; the counters themselves
//! live in `engine::store::rstats`): where a file with several links is counted, what an
//! operation marks for the snapshot's log room, and reading the counters.

use crate::disk::rstat::{LinkDirs, Rstat};

use super::*;

impl Inner {
    /// Blocks a change of the rstat tree's shape may take (an insert that splits every
    /// level and adds a root); 0 on a volume without statistics.
    pub(super) fn rstat_cost(&self) -> u64 {
        self.st.rstat_tree().map_or(0, |t| u64::from(t.depth) + 2)
    }

    /// Mark for the snapshot the records that changes to the inodes `want` locks for
    /// writing may rewrite: a directory's own and its ancestors', a file's counting
    /// directory's and its ancestors' (and those of every directory holding one of its
    /// links). Returns the rstat leaves newly counted against the log's room.
    pub(super) fn mark_rstats(&self, want: &[(u64, Mode)]) -> Result<u64> {
        if !self.st.has_rstats() {
            return Ok(0);
        }
        let mut from = Vec::with_capacity(want.len());
        for &(ino, mode) in want {
            if mode != Mode::Write {
                continue;
            }
            self.st.read_counted(ino)?;
            // Marked already: a directory whose chain is marked (files are never marked).
            if self.st.rstat_pending(ino) {
                continue;
            }
            let i = match self.st.inode(ino) {
                Ok(i) => i,
                Err(Error::NotFound) => continue,
                Err(e) => return Err(e),
            };
            if i.is_dir() {
                from.push(ino);
                continue;
            }
            from.push(i.parent);
            if i.nlink >= 2 {
                if let Some(l) = self.st.link_dirs(ino)? {
                    from.extend(l.0.iter().map(|&(d, _)| d));
                }
            }
        }
        self.st.mark_rstats(&from)
    }

    /// The link record file `i` needs to gain a link in `dir`, to be written once the
    /// name is in (`None`: it has no other link, and is counted in `dir` from now on).
    /// `TooManyLinks` when the links would lie in more directories than a record holds.
    pub(super) fn link_added(&self, i: &mut Inode, dir: u64) -> Result<Option<LinkDirs>> {
        if !self.st.has_rstats() || i.is_dir() {
            return Ok(None);
        }
        if i.nlink == 0 {
            i.parent = dir;
            return Ok(None);
        }
        let mut l = self.links_of(i)?;
        if !l.add(dir) {
            return Err(Error::TooManyLinks);
        }
        Ok(Some(l))
    }

    /// File `i` loses its link in `dir` (its `nlink` not yet lowered): its link record
    /// loses it, and when `dir` held its last link there, it is counted in a directory
    /// that still holds one.
    pub(super) fn link_dropped(&self, i: &mut Inode, dir: u64) -> Result<()> {
        if !self.st.has_rstats() || i.is_dir() || i.nlink < 2 {
            return Ok(());
        }
        let mut l = self.links_of(i)?;
        l.remove(dir);
        let record = (i.nlink > 2).then_some(&l);
        self.st.tx().set_link_dirs(i.ino, record.filter(|l| !l.0.is_empty()))?;
        if !l.holds(i.parent) {
            i.parent = l.first().unwrap_or(i.parent);
        }
        Ok(())
    }

    /// The record file `i` needs when one of its names moves from directory `from` to
    /// `to` (`None`: it has one link, and is counted in `to` from now on). Its counting
    /// directory follows the name when `from` held its last link there.
    pub(super) fn link_moved(&self, i: &mut Inode, from: u64, to: u64) -> Result<Option<LinkDirs>> {
        if !self.st.has_rstats() || i.is_dir() || from == to || i.nlink == 0 {
            return Ok(None);
        }
        if i.nlink == 1 {
            i.parent = to;
            return Ok(None);
        }
        let mut l = self.links_of(i)?;
        l.remove(from);
        if !l.add(to) {
            return Err(Error::TooManyLinks);
        }
        if !l.holds(i.parent) {
            i.parent = to;
        }
        Ok(Some(l))
    }

    /// File `i`'s link record; without one (a file of one link, or a record lost to
    /// damage), all its links as if in its counting directory.
    fn links_of(&self, i: &Inode) -> Result<LinkDirs> {
        if i.nlink >= 2 {
            if let Some(l) = self.st.link_dirs(i.ino)? {
                return Ok(l);
            }
        }
        Ok(LinkDirs(vec![(i.parent, i.nlink.max(1))]))
    }
}

impl Volume {
    /// Directory `ino`'s recursive statistics, as of the last commit (`None` on a volume
    /// without them): the inodes counted below it and their sizes, and the newest ctime
    /// in its subtree (FORMAT.md §6.2).
    ///
    /// Exact: when a change below it is not committed yet, the delta commits first.
    pub fn rstat(&self, ino: u64) -> Result<Option<Rstat>> {
        for _ in 0..3 {
            let g = self.op(&[(ino, Mode::Read)]);
            let i = g.st.inode(ino)?;
            if !i.is_dir() {
                return Err(Error::NotDir);
            }
            if !g.st.rstat_pending(ino) {
                return g.st.rstat(ino);
            }
            drop(g);
            self.commit()?;
        }
        // Changed again under it after each commit: the last committed value.
        let g = self.op(&[(ino, Mode::Read)]);
        g.st.rstat(ino)
    }

    /// The value of virtual xattr `name` of directory `ino` (FORMAT.md §6.2; `None`: not
    /// such a name). Decimal text, as CephFS gives its `ceph.dir.r*`.
    pub(super) fn rstat_xattr(&self, ino: u64, name: &[u8]) -> Result<Option<Vec<u8>>> {
        let Some(field) = name.strip_prefix(RSTAT_XATTR_PREFIX.as_bytes()) else { return Ok(None) };
        if !RSTAT_XATTRS.iter().any(|n| n.as_bytes() == field) {
            return Ok(None);
        }
        let r = match self.rstat(ino) {
            Ok(Some(r)) => r,
            // A file, or a volume without the counters: no such attribute.
            Ok(None) | Err(Error::NotDir) => return Err(Error::NoData),
            Err(e) => return Err(e),
        };
        let v = match field {
            b"rfiles" => r.files.to_string(),
            b"rsubdirs" => r.dirs.to_string(),
            b"rentries" => r.files.saturating_add(r.dirs).to_string(),
            b"rbytes" => r.bytes.to_string(),
            b"rallocated" => r.blocks.saturating_mul(BLOCK_SIZE as u64).to_string(),
            b"rhardlinks" => r.hardlinks.to_string(),
            _ => format!("{}.{:09}", r.rctime.0, r.rctime.1),
        };
        Ok(Some(v.into_bytes()))
    }
}

/// Prefix of the recursive statistics' virtual xattrs.
pub const RSTAT_XATTR_PREFIX: &str = "dxfs.dir.";
/// Their names after the prefix (FORMAT.md §6.2 says what each sums).
pub const RSTAT_XATTRS: [&str; 7] = ["rfiles", "rsubdirs", "rentries", "rbytes", "rallocated", "rhardlinks", "rctime"];
