//! Growing a volume offline (`dxfs resize`). The layout is a function of the block count,
//! the log size and the number of bitmap blocks mkfs laid out; growing keeps the last two
//! and puts any bitmap block the new size needs beyond them at the first block it covers
//! (incompat SPILLED_BITMAP, FORMAT.md §2), which lies in the new space.
//!
//! Order, so that a crash at any point leaves a volume that opens (docs/DESIGN.md,
//! "Growing a volume"):
//! 1. open the volume and close it cleanly: the log is replayed and checkpointed, the
//!    orphans freed, an earlier unfinished grow finished;
//! 2. the new bitmap blocks (all in the new space, so nothing references them yet) and
//!    the new backup superblock, written in place, flushed;
//! 3. the primary superblock with the new size and ro_compat GROW_PENDING (which records
//!    the old size), flushed: from here the volume has the new size, with the old tail
//!    (the old backup superblock, and the bits past the old end in the old last bitmap
//!    block) still marked used;
//! 4. open the volume: a read-write open of a volume with GROW_PENDING frees that tail in
//!    one ordinary delta (the old last bitmap block may be in the log, and is only ever
//!    written through it), commits it, and then clears the flag in both superblocks.
//!
//! Step 4 runs at every read-write open (a mount, a repairing fsck, a rerun of resize)
//! until it has completed, before anything can allocate: so it frees exactly the blocks
//! that were past the old end, however often it is cut short.
//!
//! Shrinking is refused: it would mean moving whatever lives in the tail.

use std::sync::Arc;

use crate::disk::codec::*;
use crate::disk::device::BlockDevice;
use crate::disk::format::*;
use crate::error::{Error, Result};

use super::{read_usable_superblock, OpenOptions, Volume};

/// What a grow did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grown {
    pub old_blocks: u64,
    pub new_blocks: u64,
    /// Bitmap blocks added in the new space.
    pub new_bitmap_blocks: u64,
    /// An earlier grow had been cut short after its switch to the new size, and this call
    /// finished it (freed the old tail).
    pub finished_earlier: bool,
}

/// Grow the volume on `dev` to `blocks` blocks (the device must already hold them; an
/// image file is extended by the caller). The volume must not be open anywhere else:
/// the device's read-write open is what guarantees it. Growing to the current size
/// changes nothing, but finishes a grow that was cut short. A size whose last bitmap
/// block would fall on the backup superblock is taken one block smaller
/// (`Grown::new_blocks` says what was done).
pub fn grow(dev: Arc<dyn BlockDevice>, blocks: u64) -> Result<Grown> {
    let sb = read_usable_superblock(&*dev)?;
    if sb.ro_compat & !KNOWN_RO_COMPAT != 0 {
        return Err(Error::Invalid(format!(
            "the volume has read-only-compatible features {:#x} this dxfs does not know: it may not change it",
            sb.ro_compat & !KNOWN_RO_COMPAT
        )));
    }
    let finished_earlier = sb.ro_compat & RO_COMPAT_GROW_PENDING != 0;
    let n0 = sb.layout.block_count;
    if blocks < n0 {
        return Err(Error::Invalid(format!(
            "shrinking is not supported: the volume has {n0} blocks ({} MiB), {blocks} blocks ({} MiB) were asked for",
            n0 / 256,
            blocks / 256
        )));
    }
    if blocks > dev.block_count() {
        return Err(Error::Invalid(format!(
            "the device holds {} blocks, fewer than the {blocks} asked for",
            dev.block_count()
        )));
    }
    let unchanged = Grown { old_blocks: n0, new_blocks: n0, new_bitmap_blocks: 0, finished_earlier };
    // The mount mark is held for the whole grow, the opens below share it.
    let _mark = super::mark::acquire(&dev, &sb, super::mark::DEFAULT_INTERVAL_MS, None)?;
    // 1. A clean start (and the end of any grow cut short).
    Volume::open(dev.clone(), OpenOptions::default())?.close()?;
    if blocks == n0 {
        return Ok(unchanged);
    }
    let sb = read_usable_superblock(&*dev)?;
    let old = sb.layout;
    let layout = Layout::grown(blocks, old.log_blocks, old.bitmap_blocks)
        .or_else(|_| Layout::grown(blocks - 1, old.log_blocks, old.bitmap_blocks))?;
    let layout = Layout { mark_block: old.mark_block, ..layout };
    let n = layout.block_count;
    if n <= n0 {
        return Ok(unchanged);
    }
    let spilled = layout.bitmap_count() > layout.bitmap_blocks;
    let new_sb = Superblock {
        layout,
        incompat: sb.incompat | if spilled { INCOMPAT_SPILLED_BITMAP } else { 0 },
        ro_compat: sb.ro_compat | RO_COMPAT_GROW_PENDING,
        grow_from: n0,
        ..sb
    };

    // 2. New bitmap blocks: their range is free but for themselves, the new backup
    // superblock and what lies past the end.
    let added = old.bitmap_count()..layout.bitmap_count();
    for i in added.clone() {
        let at = layout.bitmap_block(i);
        dev.write(at, &new_bitmap_block(&layout, i)[..])?;
    }
    dev.write(layout.backup_superblock(), &new_sb.encode(layout.backup_superblock())[..])?;
    dev.flush()?;
    // 3. The switch.
    dev.write(SUPERBLOCK, &new_sb.encode(SUPERBLOCK)[..])?;
    dev.flush()?;
    // 4. The open frees the old tail and clears GROW_PENDING.
    Volume::open(dev, OpenOptions::default())?.close()?;
    Ok(Grown { old_blocks: n0, new_blocks: n, new_bitmap_blocks: added.end - added.start, finished_earlier })
}

/// Bitmap block `i` of a grown volume, as the grow writes it: every block of its range
/// free but itself, the backup superblock, and what lies past the end.
fn new_bitmap_block(layout: &Layout, i: u64) -> Box<Block> {
    let at = layout.bitmap_block(i);
    let mut b = Box::new([0u8; BLOCK_SIZE]);
    put_u32(&mut b[..], 0, BITMAP_MAGIC);
    let first = i * BITS_PER_BITMAP_BLOCK;
    for j in 0..BITS_PER_BITMAP_BLOCK {
        let blk = first + j;
        if blk == at || blk >= layout.backup_superblock() {
            b[BITMAP_HEADER + (j / 8) as usize] |= 1 << (j % 8);
        }
    }
    count_bitmap_bits(&mut b[..]);
    seal(&mut b, at);
    b
}

/// Finish a grow that switched to the new size (ro_compat GROW_PENDING), at a read-write
/// open before anything can allocate: free whatever of the old tail is still marked used
/// (nothing can have been allocated there while the flag was set, so this frees exactly
/// the blocks past the old end, and again nothing when it runs a second time), commit,
/// and then clear the flag, in the backup superblock first: while the primary still has
/// it, a crash only means the next open does this again.
pub(super) fn finish_pending_grow(vol: &Volume) -> Result<()> {
    let (dev, sb) = {
        let g = vol.lock();
        (g.st.dev().clone(), g.st.sb.clone())
    };
    let tail = sb.pending_grow_tail();
    vol.repair(|st, _| {
        st.space().free_now(tail.start, tail.end - tail.start);
        Ok(())
    })?;
    vol.commit()?;
    let done = Superblock { ro_compat: sb.ro_compat & !RO_COMPAT_GROW_PENDING, grow_from: 0, ..sb };
    let backup = done.layout.backup_superblock();
    dev.write(backup, &done.encode(backup)[..])?;
    dev.flush()?;
    dev.write(SUPERBLOCK, &done.encode(SUPERBLOCK)[..])?;
    dev.flush()?;
    vol.lock().st.sb = done;
    Ok(())
}
