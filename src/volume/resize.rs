//! Growing a volume offline (`dxfs resize`). The layout is a function of the block count,
//! the log size and the number of bitmap blocks mkfs laid out; growing keeps the last two
//! and puts any bitmap block the new size needs beyond them at the first block it covers
//! (incompat SPILLED_BITMAP, FORMAT.md §2), which lies in the new space.
//!
//! Order, so that a crash at any point leaves a volume that opens (docs/DESIGN.md,
//! "Growing a volume"):
//! 1. the new bitmap blocks (all in the new space, so nothing references them yet) and
//!    the new backup superblock, written in place, flushed;
//! 2. the primary superblock with the new size, flushed: from here the volume has the
//!    new size, with the old tail (the old backup superblock, and the bits past the old
//!    end in the old last bitmap block) still marked used: leaked blocks, no more;
//! 3. one ordinary delta that frees that tail, through the log (the old last bitmap
//!    block may be in the log, and is only ever written through it).
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
}

/// Grow the volume on `dev` to `blocks` blocks (the device must already hold them; an
/// image file is extended by the caller). The volume must not be open anywhere else:
/// the device's read-write open is what guarantees it. Growing to the current size
/// changes nothing. A size whose last bitmap block would fall on the backup superblock
/// is taken one block smaller (`Grown::new_blocks` says what was done).
pub fn grow(dev: Arc<dyn BlockDevice>, blocks: u64) -> Result<Grown> {
    let sb = read_usable_superblock(&*dev)?;
    if sb.ro_compat & !KNOWN_RO_COMPAT != 0 {
        return Err(Error::ReadOnly);
    }
    let old = sb.layout;
    if blocks < old.block_count {
        return Err(Error::Invalid(format!(
            "shrinking is not supported: the volume has {} blocks ({} MiB), {blocks} blocks ({} MiB) were asked for",
            old.block_count,
            old.block_count / 256,
            blocks / 256
        )));
    }
    if blocks > dev.block_count() {
        return Err(Error::Invalid(format!(
            "the device holds {} blocks, fewer than the {blocks} asked for",
            dev.block_count()
        )));
    }
    if blocks == old.block_count {
        return Ok(Grown { old_blocks: blocks, new_blocks: blocks, new_bitmap_blocks: 0 });
    }
    let layout = Layout::grown(blocks, old.log_blocks, old.bitmap_blocks)
        .or_else(|_| Layout::grown(blocks - 1, old.log_blocks, old.bitmap_blocks))?;
    let n = layout.block_count;
    if n <= old.block_count {
        return Ok(Grown { old_blocks: old.block_count, new_blocks: old.block_count, new_bitmap_blocks: 0 });
    }
    let spilled = layout.bitmap_count() > layout.bitmap_blocks;
    let new_sb = Superblock { layout, incompat: sb.incompat | if spilled { INCOMPAT_SPILLED_BITMAP } else { 0 }, ..sb };

    // 1. New bitmap blocks: their range is free but for themselves, the new backup
    // superblock and what lies past the end.
    let added = old.bitmap_count()..layout.bitmap_count();
    for i in added.clone() {
        let at = layout.bitmap_block(i);
        let mut b = [0u8; BLOCK_SIZE];
        put_u32(&mut b, 0, BITMAP_MAGIC);
        let first = i * BITS_PER_BITMAP_BLOCK;
        for j in 0..BITS_PER_BITMAP_BLOCK {
            let blk = first + j;
            if blk == at || blk >= layout.backup_superblock() {
                b[BITMAP_HEADER + (j / 8) as usize] |= 1 << (j % 8);
            }
        }
        seal(&mut b, at);
        dev.write(at, &b)?;
    }
    dev.write(layout.backup_superblock(), &new_sb.encode(layout.backup_superblock())[..])?;
    dev.flush()?;
    // 2. The switch.
    dev.write(SUPERBLOCK, &new_sb.encode(SUPERBLOCK)[..])?;
    dev.flush()?;
    // 3. Free the old tail covered by the old bitmap blocks: the old backup superblock
    // and the blocks that were past the old end (up to the new backup, which stays).
    let vol = Volume::open(dev, OpenOptions::default())?;
    let start = old.backup_superblock();
    let end = (old.bitmap_count() * BITS_PER_BITMAP_BLOCK).min(layout.backup_superblock());
    vol.repair(|st, _| {
        st.space.free_deferred(start, end - start);
        Ok(())
    })?;
    vol.close()?;
    Ok(Grown { old_blocks: old.block_count, new_blocks: n, new_bitmap_blocks: added.end - added.start })
}
