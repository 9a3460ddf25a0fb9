//! The validity rules: what a value read from disk must satisfy before anything uses it.
//!
//! A decoder (`format.rs`) checks what a record says about itself: magic, checksum,
//! lengths that fit its block. The rules here check a decoded record against the volume
//! it came from: every pointer inside the volume and inside the area its kind may use,
//! sizes and counts inside their limits, times normalised. They are applied where a
//! record is read (`engine::store::read_inode`, the store's block reads, the extent
//! map), so no code above sees a value that breaks them; a record that does is
//! `Error::Corrupt` naming it (EUCLEAN through the mount), and fsck checks the same
//! rules by calling the same functions. FORMAT.md gives each record's rules in its
//! "validity" line.
// The rules run on hostile values: no arithmetic here may wrap or truncate.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use crate::disk::codec::get_u32;
use crate::disk::format::*;
use crate::error::{Error, Result};

/// Deepest B+tree accepted: a tree of 4 KiB nodes holding at least two records each
/// cannot need more than 64 levels for 2^64 keys, and a real one never passes 8.
pub(crate) const MAX_TREE_DEPTH: u16 = 16;

/// Largest directory key: a 63-bit hash plus a displacement below 2^32. Positions in a
/// listing are key + 3, so every valid key has one.
pub(crate) const MAX_DIR_KEY: u64 = (1 << 63) + u32::MAX as u64;

/// Logical blocks a file may map: its size is at most [`MAX_FILE_SIZE`].
pub(crate) const MAX_LOGICAL_BLOCKS: u64 = 1 << 32;

/// Nanoseconds in a second: a stored nanosecond field is below it.
pub(crate) const NSEC_PER_SEC: u32 = 1_000_000_000;

impl Layout {
    /// Whether blocks `[b, b + len)` may hold file data or metadata that lives in the
    /// data area (inode blocks, B+tree nodes, xattr blocks): non-empty, past the fixed
    /// part, before the backup superblock, and over no spilled bitmap block nor the
    /// mount mark.
    pub fn data_run_ok(&self, b: u64, len: u64) -> bool {
        let Some(end) = b.checked_add(len) else { return false };
        if len == 0 || b < self.first_free() || end > self.backup_superblock() {
            return false;
        }
        if self.mark_block != 0 && (b..end).contains(&self.mark_block) {
            return false;
        }
        // Spilled bitmap block i (i >= bitmap_blocks) is block i·BITS: the first
        // multiple of BITS at or after b is the only candidate that can lie in the run.
        let first = b.div_ceil(BITS_PER_BITMAP_BLOCK);
        let i = first.max(self.bitmap_blocks);
        match i.checked_mul(BITS_PER_BITMAP_BLOCK) {
            Some(at) => !(i < self.bitmap_count() && at < end),
            None => true,
        }
    }

    /// Whether block `b` may be a data-area metadata block (see [`Layout::data_run_ok`]).
    pub fn meta_block_ok(&self, b: u64) -> bool {
        self.data_run_ok(b, 1)
    }

    /// Whether `ino` names a slot that can hold an inode: slot 1..=15 of a block that
    /// may be an inode block.
    pub fn ino_ok(&self, ino: u64) -> bool {
        let (b, s) = ino_loc(ino);
        s != 0 && self.meta_block_ok(b)
    }
}

impl Extent {
    /// The rules every extent keeps: `len > 0`, inside the logical range a file may map,
    /// its blocks inside the data area ([`Layout::data_run_ok`]) and off the block that
    /// holds the file's own inode.
    pub fn check(&self, layout: &Layout, ino: u64) -> Result<()> {
        let logical_ok = self.logical.checked_add(self.len).is_some_and(|end| end <= MAX_LOGICAL_BLOCKS);
        let own = ino_loc(ino).0;
        if self.len == 0
            || !logical_ok
            || !layout.data_run_ok(self.phys, self.len)
            || own.checked_sub(self.phys).is_some_and(|d| d < self.len)
        {
            return Err(Error::corrupt(format!(
                "inode {ino}: extent of {} blocks at logical {} -> block {} is out of range",
                self.len, self.logical, self.phys
            )));
        }
        Ok(())
    }

    /// [`Extent::check`], passing the extent on.
    pub fn checked(self, layout: &Layout, ino: u64) -> Result<Extent> {
        self.check(layout, ino)?;
        Ok(self)
    }
}

/// Check a sorted list of extents: each valid, none overlapping the one before.
pub(crate) fn check_extents(list: &[Extent], layout: &Layout, ino: u64) -> Result<()> {
    let mut end = 0;
    for e in list {
        e.check(layout, ino)?;
        if e.logical < end {
            return Err(Error::corrupt(format!("inode {ino}: extents overlap at logical block {}", e.logical)));
        }
        end = e.end();
    }
    Ok(())
}

/// Check a tree root: empty (0, 0), or a root block in the data area (not the block of
/// inode `ino` itself) and a bounded depth.
pub(crate) fn check_tree(t: &TreeRoot, layout: &Layout, what: &str, ino: u64) -> Result<()> {
    let ok = match (t.root, t.depth) {
        (0, 0) => true,
        (0, _) | (_, 0) => false,
        (r, d) => d <= MAX_TREE_DEPTH && layout.meta_block_ok(r) && r != ino_loc(ino).0,
    };
    if !ok {
        return Err(Error::corrupt(format!(
            "inode {ino}: {what} root {} at depth {} is out of range",
            t.root, t.depth
        )));
    }
    Ok(())
}

/// Check bitmap block `at` on a volume with ro_compat BITMAP_COUNTS: its `used` count
/// equals the bits it sets. A bit cleared under live metadata would let the allocator
/// write over it; a count that disagrees shows the map is not to be trusted.
pub(crate) fn check_bitmap_count(b: &[u8], at: u64) -> Result<()> {
    let (said, set) = (get_u32(b, BITMAP_USED), bitmap_bits_set(b));
    if said != set {
        return Err(Error::corrupt(format!("bitmap block {at} counts {said} blocks in use, but its bits mark {set}")));
    }
    Ok(())
}

impl DirInfo {
    /// Whether a directory's inode region keeps the rules: `region_used ≤ region_len ≤
    /// 64`, and a non-empty region is a run of data-area blocks.
    pub fn region_ok(&self, layout: &Layout) -> bool {
        self.region_used <= self.region_len
            && self.region_len <= MAX_REGION_BLOCKS
            && (self.region_len == 0 || layout.data_run_ok(self.region_start, u64::from(self.region_len)))
    }
}

impl Inode {
    /// The rules an inode keeps beyond what its slot says about itself: size, block
    /// count and every pointer in range (a directory's index and region, an extent
    /// tree's root, inline extents, the xattr block, the parent). The orphan link is
    /// checked where the list is followed, which is the only place it is used. Times
    /// are not checked here: [`Inode::nsec_ok`] says whether they are normalised, and
    /// readers clamp them.
    pub fn check(&self, layout: &Layout) -> Result<()> {
        let ino = self.ino;
        let bad = |m: String| Err(Error::corrupt(format!("inode {ino}: {m}")));
        if self.size > MAX_FILE_SIZE {
            return bad(format!("size {} is beyond the largest file ({MAX_FILE_SIZE})", self.size));
        }
        // A target is read whole into memory: a wild size must not become an allocation.
        if self.file_type() == Some(FileType::Symlink) && self.size > MAX_SYMLINK {
            return bad(format!("symlink target of {} bytes is longer than {MAX_SYMLINK}", self.size));
        }
        if self.blocks > layout.block_count {
            return bad(format!("owns {} blocks, more than the volume has", self.blocks));
        }
        if self.xattr_block != 0 && (!layout.meta_block_ok(self.xattr_block) || self.xattr_block == ino_loc(ino).0) {
            return bad(format!("xattr block {} is out of range", self.xattr_block));
        }
        match &self.data {
            InodeData::Extents { ext, n } => check_extents(&ext[..usize::from(*n)], layout, ino)?,
            InodeData::ExtentTree { tree, .. } => check_tree(tree, layout, "extent tree", ino)?,
            InodeData::InlineSymlink(_) => {}
            InodeData::Dir(d) => {
                check_tree(&d.tree, layout, "directory index", ino)?;
                if !layout.ino_ok(self.parent) {
                    return bad(format!("parent {} is out of range", self.parent));
                }
                if !d.region_ok(layout) {
                    return bad(format!(
                        "inode region of {} blocks ({} used) at block {} is out of range",
                        d.region_len, d.region_used, d.region_start
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether every nanosecond field is below one second.
    pub fn nsec_ok(&self) -> bool {
        [self.atime, self.mtime, self.ctime, self.crtime].iter().all(|t| t.1 < NSEC_PER_SEC)
    }
}

/// The guard at the write end: file data goes only to blocks where data may lie. The
/// rules on reads keep wild block numbers out, so a refusal here is a bug (or damage the
/// reads did not catch): logged as an error and refused, never written.
pub(crate) fn guard_data_write(layout: &Layout, b: u64, len: u64) -> Result<()> {
    if layout.data_run_ok(b, len) {
        return Ok(());
    }
    tracing::error!(block = b, len, "refused a file data write outside the data area: please report this");
    Err(Error::corrupt(format!("refused to write {len} blocks of file data at block {b}, outside the data area")))
}

/// A stored time as readers see it: nanoseconds clamped below one second.
pub(crate) fn normal_time(t: (i64, u32)) -> (i64, u32) {
    (t.0, t.1.min(NSEC_PER_SEC - 1))
}

/// Check a directory key: below [`MAX_DIR_KEY`], so that its listing position exists.
pub(crate) fn check_dir_key(key: u64, dir: u64) -> Result<()> {
    if key > MAX_DIR_KEY {
        return Err(Error::corrupt(format!("directory {dir}: entry key {key:#x} is out of range")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_runs_stay_in_the_data_area() {
        let l = Layout::new(100_000, 64).unwrap();
        let ff = l.first_free();
        assert!(l.data_run_ok(ff, 1));
        assert!(!l.data_run_ok(ff - 1, 1), "the bitmap");
        assert!(!l.data_run_ok(0, 1), "the superblock");
        assert!(!l.data_run_ok(ff, 0), "empty");
        assert!(!l.data_run_ok(l.backup_superblock(), 1), "the backup superblock");
        assert!(!l.data_run_ok(u64::MAX - 1, 3), "wraps");
        assert!(!l.data_run_ok(1, u64::MAX), "wraps onto the superblock");
        let g = Layout::grown(100_000, 64, 1).unwrap();
        let spilled: Vec<u64> = g.spilled_bitmap_blocks().collect();
        assert!(!spilled.is_empty());
        for s in spilled {
            assert!(!g.data_run_ok(s, 1));
            assert!(!g.data_run_ok(s - 5, 10));
            assert!(g.data_run_ok(s + 1, 10));
            assert!(g.data_run_ok(s - 10, 10));
        }
        let mut m = l;
        m.mark_block = ff + 10;
        assert!(!m.data_run_ok(ff, 20));
        assert!(m.data_run_ok(ff, 10));
    }

    #[test]
    fn extents_and_keys() {
        let l = Layout::new(100_000, 64).unwrap();
        let ok = Extent { logical: 0, len: 4, phys: l.first_free(), unwritten: false };
        assert!(ok.check(&l, 5).is_ok());
        assert!(Extent { len: 0, ..ok }.check(&l, 5).is_err());
        assert!(Extent { phys: u64::MAX - 1, ..ok }.check(&l, 5).is_err());
        assert!(Extent { logical: MAX_LOGICAL_BLOCKS - 1, ..ok }.check(&l, 5).is_err());
        let second = Extent { logical: 2, phys: l.first_free() + 10, ..ok };
        assert!(check_extents(&[ok, second], &l, 5).is_err());
        assert!(check_dir_key(MAX_DIR_KEY, 1).is_ok());
        assert!(check_dir_key(u64::MAX - 1, 1).is_err());
        assert_eq!(normal_time((5, u32::MAX)), (5, NSEC_PER_SEC - 1));
    }
}
