//! Listing directories: readdir, readdirplus with its disk-order sweep, readahead.

use crate::disk::format::*;
use crate::engine::btree;
use crate::error::Result;
use crate::fs::dir::{self, DirEntry};

use super::attrs::attr_of;
use super::*;
use crate::engine::store::{read_inode, MetaRead};

/// Entries with their attributes (`None` for an inode that cannot be read).
type Listing = Vec<(DirEntry, Option<Attr>)>;

impl Inner {
    /// Directory readahead (seed 004's dirreadahead): from position `next`, read the next
    /// leaves of the index in one sorted sweep, then the inode blocks of their entries in
    /// another; at most `READAHEAD_ENTRIES` entries ahead, and only once per window.
    pub(super) fn read_ahead(&self, d: &Inode, next: u64) -> Result<()> {
        // Keys (positions) say nothing about counts, so the window remembers the key of
        // its middle entry: the next readahead starts when the reader gets there.
        if self.readahead.lock().get(&d.ino).is_some_and(|&mid| next < mid) {
            return Ok(());
        }
        let t = d.dir()?.tree;
        let leaves = btree::leaves_from(&mut self.st.tx(), &t, d.ino, next.saturating_sub(2), READAHEAD_LEAVES)?;
        self.st.prefetch(&leaves)?;
        let mut inode_blocks = Vec::new();
        let mut mid = u64::MAX;
        dir::read(&mut self.st.tx(), d, next, |e| {
            inode_blocks.push(ino_loc(e.ino).0);
            if inode_blocks.len() == READAHEAD_ENTRIES / 2 {
                mid = e.next;
            }
            inode_blocks.len() < READAHEAD_ENTRIES
        })?;
        self.st.prefetch_inodes(&inode_blocks, READAHEAD_INODE_BLOCKS)?;
        let mut ahead = self.readahead.lock();
        if ahead.len() > 1024 {
            ahead.clear();
        }
        ahead.insert(d.ino, mid);
        Ok(())
    }
}

impl Volume {
    /// List a directory from position `pos` (0 = start), at most `max` entries. Each
    /// entry's `next` is the position to continue after it; positions stay valid while
    /// entries come and go.
    pub fn readdir(&self, ino: u64, pos: u64, max: usize) -> Result<Vec<DirEntry>> {
        let (d, out) = self.reading(&[(ino, Mode::Read)], |r, _| {
            let d = read_dir_inode(r, ino)?;
            let out = list(r, &d, pos, max)?;
            Ok((d, out))
        })?;
        // A listing is one access, counted when it starts.
        let touch = pos == 0 && self.s.atime.wants_update(d.atime, d.mtime, d.ctime, now());
        self.touch_atime(ino, touch);
        Ok(out)
    }

    /// readdir with attributes (seed 004): the batch's inode blocks are read in one
    /// sorted sweep before the attributes are filled in, and a directory read in order
    /// has its next leaves and their inode blocks read ahead, also in disk order.
    ///
    /// An entry whose inode cannot be read (a damaged inode block) comes without
    /// attributes (`None`) rather than failing the batch: one bad block costs only its
    /// own entries, which then fail on access, and the rest of the directory lists.
    pub fn readdir_plus(&self, ino: u64, pos: u64, max: usize) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        self.readdir_plus_where(ino, pos, max, &|_| true)
    }

    /// [`Volume::readdir_plus`] with the attributes of only the entries whose inode
    /// `wanted` names: the others come without them (`None`), and their inodes are
    /// neither locked nor read (the FUSE layer leaves out inodes the kernel holds fresh).
    pub fn readdir_plus_where(
        &self,
        ino: u64,
        pos: u64,
        max: usize,
        wanted: &dyn Fn(u64) -> bool,
    ) -> Result<Vec<(DirEntry, Option<Attr>)>> {
        // The directory is read locked, and so are the inodes of the batch, so that each
        // entry's attributes are as of one moment with the listing.
        let mut want = vec![(ino, Mode::Read)];
        // Misses are read with nothing held, the readahead's after the reply's batch.
        let (d, out) = self.unlocked_reads(|| 'again: loop {
            let mut g = self.op(&want);
            let (d, ents) = {
                let mut tx = g.st.tx();
                let d = read_dir_inode(&mut tx, ino)?;
                let ents = list(&mut tx, &d, pos, max)?;
                (d, ents)
            };
            // Asked once per entry: the answer may change between calls.
            let with: Vec<bool> = ents.iter().map(|e| wanted(e.ino)).collect();
            let inos: Vec<u64> = ents.iter().zip(&with).filter(|(_, w)| **w).map(|(e, _)| e.ino).collect();
            for &i in &inos {
                if !g.add(i, Mode::Read) {
                    want.extend(inos.iter().map(|&i| (i, Mode::Read)));
                    continue 'again;
                }
            }
            if g.opts.sorted_prefetch {
                if ents.len() == max {
                    // A directory read in batches: read ahead from this batch on, so the
                    // batch and the next ones come in one sorted sweep.
                    g.read_ahead(&d, pos)?;
                } else {
                    g.readahead.lock().remove(&ino);
                }
                let blocks: Vec<u64> = inos.iter().map(|&i| ino_loc(i).0).collect();
                // Only a speed-up: a block the sweep cannot read is tried again one by one.
                if let Err(e) = g.st.prefetch_inodes(&blocks, READAHEAD_INODE_BLOCKS) {
                    tracing::debug!("readdirplus sweep of directory {ino}: {e}");
                }
            }
            let out = with_attrs(&mut g.st.tx(), &g.delta, ino, ents, &with)?;
            break Ok((d, out));
        })?;
        let touch = pos == 0 && self.s.atime.wants_update(d.atime, d.mtime, d.ctime, now());
        self.touch_atime(ino, touch);
        Ok(out)
    }
}

/// Directory `ino`'s inode (`NotDir` if it is not one).
fn read_dir_inode(r: &mut (impl MetaRead + ?Sized), ino: u64) -> Result<Inode> {
    let d = read_inode(r, ino)?;
    if !d.is_dir() {
        return Err(Error::NotDir);
    }
    Ok(d)
}

/// At most `max` entries of directory `d` from position `pos`.
fn list(r: &mut (impl MetaRead + ?Sized), d: &Inode, pos: u64, max: usize) -> Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    dir::read(r, d, pos, |e| {
        out.push(e);
        out.len() < max
    })?;
    Ok(out)
}

/// Directory `ino`'s entries `ents` with their attributes where `with` says so. An entry
/// whose inode cannot be read (a damaged block) comes without them.
fn with_attrs(
    r: &mut (impl MetaRead + ?Sized),
    delta: &Delta,
    ino: u64,
    ents: Vec<DirEntry>,
    with: &[bool],
) -> Result<Listing> {
    let mut out = Vec::with_capacity(ents.len());
    for (e, &w) in ents.into_iter().zip(with) {
        if !w {
            out.push((e, None));
            continue;
        }
        let a = match read_inode(r, e.ino).and_then(|i| attr_of(delta, &i)) {
            Ok(a) => Some(a),
            Err(err @ (Error::Corrupt(_) | Error::Io(_))) => {
                tracing::error!("directory {ino}: entry {:?}: {err}", String::from_utf8_lossy(&e.name));
                None
            }
            Err(err) => return Err(err),
        };
        out.push((e, a));
    }
    Ok(out)
}
