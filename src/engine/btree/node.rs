//! The node layout: header fields, the slot array, record bodies, and the edits of one
//! node (build, compact, insert and remove at a slot). See the format in `mod.rs`.

use crate::disk::codec::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64, Block, BLOCK_SIZE};
use crate::error::{Error, Result};

use super::*;

pub(super) const OFF_OWNER: usize = 16;

pub(super) const OFF_LEVEL: usize = 24;

pub(super) const OFF_NSLOTS: usize = 26;

pub(super) const OFF_HEAP: usize = 28;

pub(super) const OFF_FRAG: usize = 30;

/// Start of the slot array, i.e. the size of the node header.
pub(super) const SLOTS: usize = 32;

/// Key and value length in front of every value.
pub(super) const REC_HDR: usize = 10;

/// Bytes available to slots and record bodies.
pub(super) const USABLE: usize = BLOCK_SIZE - SLOTS;

/// The decoded header of a node that passed the structural checks.
#[derive(Clone, Copy)]
pub(super) struct Hdr {
    pub(super) level: u16,
    pub(super) n: usize,
    pub(super) heap: usize,
    pub(super) frag: usize,
}

impl Hdr {
    /// Contiguous free bytes between the slot array and the heap.
    pub(super) fn free(&self) -> usize {
        self.heap - SLOTS - 2 * self.n
    }
    /// Free bytes once the heap is compacted.
    pub(super) fn space(&self) -> usize {
        self.free() + self.frag
    }
    /// Bytes used by slots and live record bodies.
    pub(super) fn live(&self) -> usize {
        USABLE.saturating_sub(self.space())
    }
}

pub(super) fn bad(blk: u64, msg: impl std::fmt::Display) -> Error {
    Error::corrupt(format!("btree block {blk}: {msg}"))
}

/// Decode and check a node's header; everything later relies on these bounds.
pub(super) fn hdr(b: &Block, blk: u64, owner: u64, level: u16) -> Result<Hdr> {
    let magic = get_u32(b, 0);
    if magic != BTREE_MAGIC {
        return Err(bad(blk, format_args!("magic {magic:#010x}, expected {BTREE_MAGIC:#010x}")));
    }
    let o = get_u64(b, OFF_OWNER);
    if o != owner {
        return Err(bad(blk, format_args!("owned by inode {o}, expected {owner}")));
    }
    let l = get_u16(b, OFF_LEVEL);
    if l != level {
        return Err(bad(blk, format_args!("level {l}, expected {level}")));
    }
    let n = usize::from(get_u16(b, OFF_NSLOTS));
    let heap = usize::from(get_u16(b, OFF_HEAP));
    let frag = usize::from(get_u16(b, OFF_FRAG));
    if heap > BLOCK_SIZE || SLOTS + 2 * n > heap {
        return Err(bad(blk, format_args!("{n} slots do not fit below heap start {heap}")));
    }
    if frag > BLOCK_SIZE - heap {
        return Err(bad(blk, format_args!("frag {frag} exceeds the heap from {heap}")));
    }
    if level > 0 && n == 0 {
        return Err(bad(blk, "internal node without children"));
    }
    Ok(Hdr { level, n, heap, frag })
}

pub(super) fn write_hdr(b: &mut Block, h: &Hdr) {
    // The casts cannot truncate: hdr() and the callers keep all three within 4096.
    put_u16(b, OFF_NSLOTS, h.n as u16);
    put_u16(b, OFF_HEAP, h.heap as u16);
    put_u16(b, OFF_FRAG, h.frag as u16);
}

pub(super) fn slot(b: &Block, i: usize) -> usize {
    usize::from(get_u16(b, SLOTS + 2 * i))
}

/// Offset of record `i` (`i < h.n`), checked to lie in the heap with room for its header.
pub(super) fn rec_off(b: &Block, h: &Hdr, blk: u64, i: usize) -> Result<usize> {
    let off = slot(b, i);
    if off < h.heap || off + REC_HDR > BLOCK_SIZE {
        return Err(bad(blk, format_args!("slot {i} points at {off}, outside the heap from {}", h.heap)));
    }
    Ok(off)
}

pub(super) fn key_at(b: &Block, h: &Hdr, blk: u64, i: usize) -> Result<u64> {
    Ok(get_u64(b, rec_off(b, h, blk, i)?))
}

/// Key and value of record `i` (`i < h.n`).
pub(super) fn record<'b>(b: &'b Block, h: &Hdr, blk: u64, i: usize) -> Result<(u64, &'b [u8])> {
    let off = rec_off(b, h, blk, i)?;
    let vlen = usize::from(get_u16(b, off + 8));
    let ok = if h.level == 0 { vlen <= MAX_VALUE } else { vlen == 8 };
    if !ok || off + REC_HDR + vlen > BLOCK_SIZE {
        return Err(bad(blk, format_args!("record {i} at {off} has a bad value length {vlen}")));
    }
    Ok((get_u64(b, off), &b[off + REC_HDR..off + REC_HDR + vlen]))
}

/// Child block of internal record `i`.
pub(super) fn child(b: &Block, h: &Hdr, blk: u64, i: usize) -> Result<u64> {
    let (_, v) = record(b, h, blk, i)?;
    match get_u64(v, 0) {
        0 => Err(bad(blk, format_args!("record {i} points at block 0"))),
        c => Ok(c),
    }
}

/// Binary search of the slot array in place: `Ok(i)` if record `i` has `key`,
/// else `Err(i)` with `i` the slot where it would go.
pub(super) fn search(b: &Block, h: &Hdr, blk: u64, key: u64) -> Result<std::result::Result<usize, usize>> {
    let (mut lo, mut hi) = (0, h.n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match key_at(b, h, blk, mid)?.cmp(&key) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => return Ok(Ok(mid)),
        }
    }
    Ok(Err(lo))
}

/// The child of an internal node whose range holds `key`.
pub(super) fn route(b: &Block, h: &Hdr, blk: u64, key: u64) -> Result<usize> {
    Ok(match search(b, h, blk, key)? {
        Ok(i) => i,
        // Record 0 bounds the whole node, so a key below it can only be hostile data.
        Err(i) => i.saturating_sub(1),
    })
}

/// All records of a node, borrowing from `b`.
pub(super) fn collect<'b>(b: &'b Block, h: &Hdr, blk: u64) -> Result<Vec<(u64, &'b [u8])>> {
    (0..h.n).map(|i| record(b, h, blk, i)).collect()
}

pub(super) fn rec_size(r: &(u64, &[u8])) -> usize {
    2 + REC_HDR + r.1.len()
}

pub(super) fn put_rec(b: &mut Block, off: usize, key: u64, val: &[u8]) {
    put_u64(b, off, key);
    put_u16(b, off + 8, val.len() as u16);
    b[off + REC_HDR..off + REC_HDR + val.len()].copy_from_slice(val);
}

/// Rewrite `b` as a compact node holding `recs`, keeping bytes 4..16 (crc and
/// block number belong to the cache). Checks the fit before writing anything.
pub(super) fn build(b: &mut Block, owner: u64, level: u16, blk: u64, recs: &[(u64, &[u8])]) -> Result<Hdr> {
    if recs.iter().map(rec_size).sum::<usize>() > USABLE {
        return Err(bad(blk, "records overlap: they do not fit in one node"));
    }
    put_u32(b, 0, BTREE_MAGIC);
    b[OFF_OWNER..].fill(0);
    put_u64(b, OFF_OWNER, owner);
    put_u16(b, OFF_LEVEL, level);
    let mut h = Hdr { level, n: recs.len(), heap: BLOCK_SIZE, frag: 0 };
    for (i, &(key, val)) in recs.iter().enumerate() {
        h.heap -= REC_HDR + val.len();
        put_rec(b, h.heap, key, val);
        put_u16(b, SLOTS + 2 * i, h.heap as u16);
    }
    write_hdr(b, &h);
    Ok(h)
}

/// Squeeze the dead bodies out of the heap.
pub(super) fn compact(b: &mut Block, h: &mut Hdr, blk: u64, owner: u64) -> Result<()> {
    let old = *b;
    let recs = collect(&old, h, blk)?;
    *h = build(b, owner, h.level, blk, &recs)?;
    Ok(())
}

/// Put a record at slot `pos`, which the caller knows fits after compaction.
pub(super) fn insert_at(
    b: &mut Block,
    h: &mut Hdr,
    blk: u64,
    owner: u64,
    pos: usize,
    key: u64,
    val: &[u8],
) -> Result<()> {
    let len = REC_HDR + val.len();
    if h.free() < 2 + len {
        compact(b, h, blk, owner)?;
        if h.free() < 2 + len {
            return Err(bad(blk, "frag claims more dead space than the heap holds"));
        }
    }
    let off = h.heap - len;
    put_rec(b, off, key, val);
    let s = SLOTS + 2 * pos;
    b.copy_within(s..SLOTS + 2 * h.n, s + 2);
    put_u16(b, s, off as u16);
    h.n += 1;
    h.heap = off;
    write_hdr(b, h);
    Ok(())
}

/// Drop record `i`: its slot goes, its body becomes dead space (zeroed).
pub(super) fn remove_at(b: &mut Block, h: &mut Hdr, blk: u64, i: usize) -> Result<()> {
    let off = rec_off(b, h, blk, i)?;
    let len = REC_HDR + record(b, h, blk, i)?.1.len();
    b[off..off + len].fill(0);
    let s = SLOTS + 2 * i;
    b.copy_within(s + 2..SLOTS + 2 * h.n, s);
    h.n -= 1;
    put_u16(b, SLOTS + 2 * h.n, 0);
    if h.n == 0 {
        h.heap = BLOCK_SIZE;
        h.frag = 0;
    } else if off == h.heap {
        h.heap += len;
    } else {
        h.frag += len;
    }
    write_hdr(b, h);
    Ok(())
}
