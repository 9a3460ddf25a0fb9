//! One B+tree for every keyed dxfs structure: the hashed index of a directory
//! (key = 63-bit cookie), a file's extent map once it no longer fits inline
//! (key = logical block) and, later, xattrs. Keys are `u64` and unique within a
//! tree; values are byte strings of 0..=[`MAX_VALUE`] bytes.
//!
//! # Node format
//!
//! Every node is one 4096-byte metadata block, little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic [`BTREE_MAGIC`] `0x4E54_5844`, on disk the bytes `44 58 54 4E` = "DXTN" |
//! | 4 | 4 | crc32c of the block (filled in by the cache when the block is written) |
//! | 8 | 8 | the block's own number (likewise) |
//! | 16 | 8 | owner: inode number of the tree's owner, checked on every visit |
//! | 24 | 2 | level: 0 for a leaf, a parent is one above its children |
//! | 26 | 2 | nslots: number of records |
//! | 28 | 2 | heap_start: lowest byte used by record bodies (4096 when empty) |
//! | 30 | 2 | frag: bytes of dead record bodies between heap_start and 4096 |
//! | 32 | 2 × nslots | slot array: the byte offset of each record body, in key order |
//! | … | | free space, zero |
//! | heap_start | 4096 − heap_start | record bodies, allocated downward from 4096 |
//!
//! A record body is `key: u64, vlen: u16, value: [u8; vlen]`. Leaf values are
//! 0..=1024 bytes. Internal records have an 8-byte value, the child's block
//! number; every key in child `i` is `>= key i` and `< key i+1` (or below the
//! node's own upper bound for the last child). Separators are lower bounds, not
//! necessarily keys still present: a removal never rewrites ancestors. The key of
//! record 0 of an internal node is the node's lower bound: 0 in the root, else the
//! separator the parent holds for it.
//!
//! Invariants that [`check`] verifies: keys strictly increase along the slots and
//! stay inside the range the parent gives; record bodies lie inside the heap and
//! do not overlap; live body bytes + frag = 4096 − heap_start; levels step down by
//! one; every node carries the tree's owner; no node other than an internal root
//! is empty, and a tree without records owns no blocks (root 0, depth 0). Dead
//! record bodies are zeroed when removed, so deleted names do not linger on disk;
//! the heap is compacted only when an insert needs the dead space.
//!
//! # Balancing
//!
//! A node that cannot take a record splits at the byte midpoint into two halves
//! of about 50%; the parent gains a separator, which may split it in turn, and a
//! root split adds a level. All blocks a split chain needs are allocated before
//! anything changes, so an insert that fails with `NoSpace` leaves the tree as it
//! was. After a removal a node whose live bytes (slots + bodies) fall below 25% of
//! the 4064 usable bytes merges with its left sibling, else its right one, under
//! the same parent when the two fit in 75% of a node (an empty node always goes);
//! the parent loses a separator and may merge in turn. The gap between splitting
//! at 100% and merging at 25%/75% keeps churn at a boundary from splitting and
//! merging the same nodes again and again. When two internal nodes merge, the two
//! children that meet in the middle are merged too if one of them is underfull;
//! so no two underfull siblings ever sit side by side, which is what lets a tree
//! that empties shrink all the way: an internal root with one child is replaced
//! by that child, and a leaf root without records is freed.

use std::collections::HashSet;

use crate::disk::codec::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64, Block, BLOCK_SIZE};
use crate::disk::format::TreeRoot;
use crate::error::{Error, Result};

/// Magic number of a B+tree node: the bytes "DXTN" on disk.
pub const BTREE_MAGIC: u32 = 0x4E54_5844;
/// Largest value a record may hold, in bytes.
pub const MAX_VALUE: usize = 1024;

const OFF_OWNER: usize = 16;
const OFF_LEVEL: usize = 24;
const OFF_NSLOTS: usize = 26;
const OFF_HEAP: usize = 28;
const OFF_FRAG: usize = 30;
/// Start of the slot array, i.e. the size of the node header.
const SLOTS: usize = 32;
/// Key and value length in front of every value.
const REC_HDR: usize = 10;
/// Bytes available to slots and record bodies.
const USABLE: usize = BLOCK_SIZE - SLOTS;
/// Below this many live bytes a node tries to merge. At most half of MERGE_MAX, so two
/// underfull siblings side by side always merge.
const UNDERFULL: usize = MERGE_MAX / 2;
/// Below this many live bytes a leaf tries to spread its records over its two siblings.
const SPREAD_BELOW: usize = USABLE * 2 / 3;
/// Two nodes merge only if their live bytes together fit in this.
const MERGE_MAX: usize = USABLE * 9 / 10;
/// Space a separator takes in an internal node: slot, record header, child number.
const CHILD_REC: usize = 2 + REC_HDR + 8;

/// Where the tree keeps its nodes: the block cache, or a test double.
pub trait NodeStore {
    /// A verified node block (the store checks crc/magic on load).
    fn node(&mut self, block: u64) -> Result<&Block>;
    /// The same block for modification; the store marks it dirty.
    fn node_mut(&mut self, block: u64) -> Result<&mut Block>;
    /// Allocate a fresh zeroed block for a node, preferably near `near`; it is dirty. May fail with NoSpace.
    ///
    /// The tree initialises the block through `node_mut`, which must therefore
    /// hand it out before it carries a magic number.
    fn alloc_node(&mut self, near: u64) -> Result<u64>;
    /// Give a node block back.
    fn free_node(&mut self, block: u64) -> Result<()>;
}

/// What [`check`] found in a sound tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Every block of the tree, each node before its children, in key order.
    pub blocks: Vec<u64>,
    /// Number of records in the leaves.
    pub records: u64,
    /// Number of leaves.
    pub leaves: u64,
    /// Bytes the leaves use for slots and record bodies, summed over all leaves.
    pub leaf_bytes_used: u64,
    /// Number of levels.
    pub depth: u16,
}

/// The decoded header of a node that passed the structural checks.
#[derive(Clone, Copy)]
struct Hdr {
    level: u16,
    n: usize,
    heap: usize,
    frag: usize,
}

impl Hdr {
    /// Contiguous free bytes between the slot array and the heap.
    fn free(&self) -> usize {
        self.heap - SLOTS - 2 * self.n
    }
    /// Free bytes once the heap is compacted.
    fn space(&self) -> usize {
        self.free() + self.frag
    }
    /// Bytes used by slots and live record bodies.
    fn live(&self) -> usize {
        USABLE.saturating_sub(self.space())
    }
}

/// A record to place at slot `pos`, over the record there when `replace`.
struct Put<'a> {
    pos: usize,
    key: u64,
    val: &'a [u8],
    replace: bool,
}

/// The key range a subtree may hold: `lo..hi`, unbounded above when `hi` is None.
#[derive(Clone, Copy)]
struct Range {
    lo: u64,
    hi: Option<u64>,
}

fn bad(blk: u64, msg: impl std::fmt::Display) -> Error {
    Error::corrupt(format!("btree block {blk}: {msg}"))
}

/// Decode and check a node's header; everything later relies on these bounds.
fn hdr(b: &Block, blk: u64, owner: u64, level: u16) -> Result<Hdr> {
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

fn write_hdr(b: &mut Block, h: &Hdr) {
    // The casts cannot truncate: hdr() and the callers keep all three within 4096.
    put_u16(b, OFF_NSLOTS, h.n as u16);
    put_u16(b, OFF_HEAP, h.heap as u16);
    put_u16(b, OFF_FRAG, h.frag as u16);
}

fn slot(b: &Block, i: usize) -> usize {
    usize::from(get_u16(b, SLOTS + 2 * i))
}

/// Offset of record `i` (`i < h.n`), checked to lie in the heap with room for its header.
fn rec_off(b: &Block, h: &Hdr, blk: u64, i: usize) -> Result<usize> {
    let off = slot(b, i);
    if off < h.heap || off + REC_HDR > BLOCK_SIZE {
        return Err(bad(blk, format_args!("slot {i} points at {off}, outside the heap from {}", h.heap)));
    }
    Ok(off)
}

fn key_at(b: &Block, h: &Hdr, blk: u64, i: usize) -> Result<u64> {
    Ok(get_u64(b, rec_off(b, h, blk, i)?))
}

/// Key and value of record `i` (`i < h.n`).
fn record<'b>(b: &'b Block, h: &Hdr, blk: u64, i: usize) -> Result<(u64, &'b [u8])> {
    let off = rec_off(b, h, blk, i)?;
    let vlen = usize::from(get_u16(b, off + 8));
    let ok = if h.level == 0 { vlen <= MAX_VALUE } else { vlen == 8 };
    if !ok || off + REC_HDR + vlen > BLOCK_SIZE {
        return Err(bad(blk, format_args!("record {i} at {off} has a bad value length {vlen}")));
    }
    Ok((get_u64(b, off), &b[off + REC_HDR..off + REC_HDR + vlen]))
}

/// Child block of internal record `i`.
fn child(b: &Block, h: &Hdr, blk: u64, i: usize) -> Result<u64> {
    let (_, v) = record(b, h, blk, i)?;
    match get_u64(v, 0) {
        0 => Err(bad(blk, format_args!("record {i} points at block 0"))),
        c => Ok(c),
    }
}

/// Binary search of the slot array in place: `Ok(i)` if record `i` has `key`,
/// else `Err(i)` with `i` the slot where it would go.
fn search(b: &Block, h: &Hdr, blk: u64, key: u64) -> Result<std::result::Result<usize, usize>> {
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
fn route(b: &Block, h: &Hdr, blk: u64, key: u64) -> Result<usize> {
    Ok(match search(b, h, blk, key)? {
        Ok(i) => i,
        // Record 0 bounds the whole node, so a key below it can only be hostile data.
        Err(i) => i.saturating_sub(1),
    })
}

/// All records of a node, borrowing from `b`.
fn collect<'b>(b: &'b Block, h: &Hdr, blk: u64) -> Result<Vec<(u64, &'b [u8])>> {
    (0..h.n).map(|i| record(b, h, blk, i)).collect()
}

fn rec_size(r: &(u64, &[u8])) -> usize {
    2 + REC_HDR + r.1.len()
}

fn put_rec(b: &mut Block, off: usize, key: u64, val: &[u8]) {
    put_u64(b, off, key);
    put_u16(b, off + 8, val.len() as u16);
    b[off + REC_HDR..off + REC_HDR + val.len()].copy_from_slice(val);
}

/// Rewrite `b` as a compact node holding `recs`, keeping bytes 4..16 (crc and
/// block number belong to the cache). Checks the fit before writing anything.
fn build(b: &mut Block, owner: u64, level: u16, blk: u64, recs: &[(u64, &[u8])]) -> Result<Hdr> {
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
fn compact(b: &mut Block, h: &mut Hdr, blk: u64, owner: u64) -> Result<()> {
    let old = *b;
    let recs = collect(&old, h, blk)?;
    *h = build(b, owner, h.level, blk, &recs)?;
    Ok(())
}

/// Put a record at slot `pos`, which the caller knows fits after compaction.
fn insert_at(b: &mut Block, h: &mut Hdr, blk: u64, owner: u64, pos: usize, key: u64, val: &[u8]) -> Result<()> {
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
fn remove_at(b: &mut Block, h: &mut Hdr, blk: u64, i: usize) -> Result<()> {
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

/// Apply `put` to a node known to have room for it.
fn put_in_place(b: &mut Block, h: &mut Hdr, blk: u64, owner: u64, put: &Put) -> Result<()> {
    if put.replace {
        let old = record(b, h, blk, put.pos)?.1.len();
        if old == put.val.len() {
            let off = slot(b, put.pos) + REC_HDR;
            b[off..off + old].copy_from_slice(put.val);
            return Ok(());
        }
        remove_at(b, h, blk, put.pos)?;
    }
    insert_at(b, h, blk, owner, put.pos, put.key, put.val)
}

/// Apply `put` to node `blk` by splitting it at the byte midpoint: the lower half
/// stays, the upper half goes to the fresh block `right`. Returns the separator,
/// the upper half's first key. Nothing is written unless both halves fit.
fn split(s: &mut impl NodeStore, owner: u64, blk: u64, level: u16, put: &Put, right: u64) -> Result<u64> {
    let old: Block = *s.node(blk)?;
    let h = hdr(&old, blk, owner, level)?;
    let recs = with_put(&old, &h, blk, put)?;
    let Some(cut) = balanced_cut(&recs) else {
        return Err(bad(blk, "records overlap: they do not fit in two nodes"));
    };
    build(s.node_mut(right)?, owner, level, right, &recs[cut..])?;
    build(s.node_mut(blk)?, owner, level, blk, &recs[..cut])?;
    Ok(recs[cut].0)
}

/// The records of a node with `put` applied, in key order.
fn with_put<'a>(b: &'a Block, h: &Hdr, blk: u64, put: &Put<'a>) -> Result<Vec<(u64, &'a [u8])>> {
    let mut recs = Vec::with_capacity(h.n + 1);
    for i in 0..h.n {
        if i == put.pos {
            recs.push((put.key, put.val));
            if put.replace {
                continue;
            }
        }
        recs.push(record(b, h, blk, i)?);
    }
    if put.pos >= h.n {
        recs.push((put.key, put.val));
    }
    Ok(recs)
}

/// Where to cut `recs` into two nodes so that the fuller one is as empty as possible;
/// None if even that one would not fit in a node.
fn balanced_cut(recs: &[(u64, &[u8])]) -> Option<usize> {
    let total: usize = recs.iter().map(rec_size).sum();
    let (mut acc, mut best, mut cut) = (0, usize::MAX, 0);
    for (k, r) in recs.iter().enumerate().take(recs.len().saturating_sub(1)) {
        acc += rec_size(r);
        if acc.max(total - acc) < best {
            (best, cut) = (acc.max(total - acc), k + 1);
        }
    }
    (cut > 0 && best <= USABLE).then_some(cut)
}

/// Give child `i` of internal node `parent` (at level 1) the separator `key`, in place
/// (separators have a fixed size). The caller keeps the keys in order.
fn rekey(s: &mut impl NodeStore, owner: u64, parent: u64, i: usize, key: u64) -> Result<()> {
    let b = s.node_mut(parent)?;
    let h = hdr(b, parent, owner, 1)?;
    let off = rec_off(b, &h, parent, i)?;
    put_u64(b, off, key);
    Ok(())
}

/// Free bytes a sibling needs before a full leaf shifts records into it rather than
/// splitting: after the shift both have at least half of this free, so the next shift
/// between the same two leaves is several inserts away.
const SHIFT_MIN_FREE: usize = USABLE / 8;

/// Apply `put` to the full leaf `leaf` by sharing its records with a sibling under the
/// same parent that has room (a B*-tree's overflow), instead of splitting. Leaves then
/// stay well over half full under random inserts and under churn, where splits alone
/// settle near 50-69%. The separator in the parent moves; no block is allocated, so a
/// shift needs none of the split's budget. Returns false when neither sibling has room.
fn shift_to_sibling(s: &mut impl NodeStore, owner: u64, path: &[(u64, usize)], leaf: u64, put: &Put) -> Result<bool> {
    let Some(&(parent, idx)) = path.last() else {
        return Ok(false);
    };
    let (left, right) = {
        let b = s.node(parent)?;
        let h = hdr(b, parent, owner, 1)?;
        let left = if idx > 0 { Some(child(b, &h, parent, idx - 1)?) } else { None };
        let right = if idx + 1 < h.n { Some(child(b, &h, parent, idx + 1)?) } else { None };
        (left, right)
    };
    // The sibling with more room; (block, is it the left one).
    let mut best: Option<(u64, bool, usize)> = None;
    for (sib, is_left) in [(left, true), (right, false)] {
        let Some(sib) = sib else { continue };
        let space = hdr(s.node(sib)?, sib, owner, 0)?.space();
        if space >= SHIFT_MIN_FREE && best.is_none_or(|(_, _, b)| space > b) {
            best = Some((sib, is_left, space));
        }
    }
    let Some((sib, sib_is_left)) = best.map(|(b, l, _)| (b, l)) else {
        return Ok(false);
    };
    let lcopy: Block = *s.node(leaf)?;
    let lh = hdr(&lcopy, leaf, owner, 0)?;
    let scopy: Block = *s.node(sib)?;
    let sh = hdr(&scopy, sib, owner, 0)?;
    let mine = with_put(&lcopy, &lh, leaf, put)?;
    let theirs = collect(&scopy, &sh, sib)?;
    let (lo_blk, hi_blk, recs) =
        if sib_is_left { (sib, leaf, [theirs, mine].concat()) } else { (leaf, sib, [mine, theirs].concat()) };
    let Some(cut) = balanced_cut(&recs) else {
        return Ok(false);
    };
    build(s.node_mut(lo_blk)?, owner, 0, lo_blk, &recs[..cut])?;
    build(s.node_mut(hi_blk)?, owner, 0, hi_blk, &recs[cut..])?;
    // The upper node's separator becomes its new first key; it still lies between the
    // neighbouring separators, since both nodes' records came from their two ranges.
    rekey(s, owner, parent, if sib_is_left { idx } else { idx + 1 }, recs[cut].0)?;
    Ok(true)
}

/// `Ok(true)` for an empty tree, `Ok(false)` for one with a root.
fn is_empty(t: &TreeRoot) -> Result<bool> {
    match (t.root, t.depth) {
        (0, 0) => Ok(true),
        (0, _) | (_, 0) => Err(Error::corrupt(format!("btree root {} with depth {}", t.root, t.depth))),
        _ => Ok(false),
    }
}

/// Level of the node at `path[j]`.
fn level_at(t: &TreeRoot, j: usize) -> u16 {
    // j < depth, so this neither underflows nor truncates.
    t.depth - 1 - j as u16
}

/// Walk from the root of a non-empty tree to the leaf whose range holds `key`,
/// pushing (node, child index) for each internal node onto `path` if given.
fn descend(
    s: &mut impl NodeStore,
    t: &TreeRoot,
    owner: u64,
    key: u64,
    mut path: Option<&mut Vec<(u64, usize)>>,
) -> Result<u64> {
    let mut blk = t.root;
    for level in (1..t.depth).rev() {
        let b = s.node(blk)?;
        let h = hdr(b, blk, owner, level)?;
        let i = route(b, &h, blk, key)?;
        let c = child(b, &h, blk, i)?;
        if let Some(p) = path.as_deref_mut() {
            p.push((blk, i));
        }
        blk = c;
    }
    Ok(blk)
}

/// Move `path` (a full root-to-leaf path) to the next leaf, or the previous one
/// when not `forward`; returns that leaf, or None at the end of the tree.
fn step(
    s: &mut impl NodeStore,
    t: &TreeRoot,
    owner: u64,
    path: &mut Vec<(u64, usize)>,
    forward: bool,
) -> Result<Option<u64>> {
    let mut blk = loop {
        let Some((pb, pi)) = path.pop() else {
            return Ok(None);
        };
        let b = s.node(pb)?;
        let h = hdr(b, pb, owner, level_at(t, path.len()))?;
        let next = if forward { Some(pi + 1) } else { pi.checked_sub(1) };
        if let Some(i) = next.filter(|&i| i < h.n) {
            path.push((pb, i));
            break child(b, &h, pb, i)?;
        }
    };
    while path.len() + 1 < usize::from(t.depth) {
        let b = s.node(blk)?;
        let h = hdr(b, blk, owner, level_at(t, path.len()))?;
        let i = if forward { 0 } else { h.n - 1 };
        let c = child(b, &h, blk, i)?;
        path.push((blk, i));
        blk = c;
    }
    Ok(Some(blk))
}

/// Look up `key`.
#[cfg(test)]
pub fn get(s: &mut impl NodeStore, t: &TreeRoot, owner: u64, key: u64) -> Result<Option<Vec<u8>>> {
    if is_empty(t)? {
        return Ok(None);
    }
    let leaf = descend(s, t, owner, key, None)?;
    let b = s.node(leaf)?;
    let h = hdr(b, leaf, owner, 0)?;
    match search(b, &h, leaf, key)? {
        Ok(i) => Ok(Some(record(b, &h, leaf, i)?.1.to_vec())),
        Err(_) => Ok(None),
    }
}

/// Insert a new key (Error::Exists if present) or, with `replace`, overwrite. Splits as needed; root split adds a level.
///
/// Values longer than [`MAX_VALUE`] are `Error::Invalid`. On `NoSpace` the tree is unchanged.
pub fn insert(
    s: &mut impl NodeStore,
    t: &mut TreeRoot,
    owner: u64,
    key: u64,
    value: &[u8],
    replace: bool,
) -> Result<()> {
    if value.len() > MAX_VALUE {
        return Err(Error::Invalid(format!("btree value of {} bytes, at most {MAX_VALUE} allowed", value.len())));
    }
    if is_empty(t)? {
        let blk = s.alloc_node(0)?;
        build(s.node_mut(blk)?, owner, 0, blk, &[(key, value)])?;
        *t = TreeRoot { root: blk, depth: 1 };
        return Ok(());
    }
    let mut path = Vec::with_capacity(usize::from(t.depth));
    let leaf = descend(s, t, owner, key, Some(&mut path))?;
    let (put, fits) = {
        let b = s.node(leaf)?;
        let h = hdr(b, leaf, owner, 0)?;
        let need = 2 + REC_HDR + value.len();
        match search(b, &h, leaf, key)? {
            Ok(_) if !replace => return Err(Error::Exists),
            Ok(i) => {
                let freed = 2 + REC_HDR + record(b, &h, leaf, i)?.1.len();
                (Put { pos: i, key, val: value, replace: true }, need <= h.space() + freed)
            }
            Err(i) => (Put { pos: i, key, val: value, replace: false }, need <= h.space()),
        }
    };
    if fits {
        let b = s.node_mut(leaf)?;
        let mut h = hdr(b, leaf, owner, 0)?;
        put_in_place(b, &mut h, leaf, owner, &put)?;
        if put.replace {
            // A shorter value may have left the leaf underfull.
            rebalance(s, t, owner, path, leaf)?;
        }
        return Ok(());
    }
    if shift_to_sibling(s, owner, &path, leaf, &put)? {
        return Ok(());
    }
    // Plan the split chain: the leaf splits, and so does every ancestor without
    // room for one more separator, up to a new root if even the root is full.
    let mut nears = vec![leaf];
    let mut grows = true;
    for (j, &(pb, _)) in path.iter().enumerate().rev() {
        let b = s.node(pb)?;
        let h = hdr(b, pb, owner, level_at(t, j))?;
        if h.space() >= CHILD_REC {
            grows = false;
            break;
        }
        // Make sure the split below cannot find this node corrupt halfway up the chain.
        if collect(b, &h, pb)?.iter().map(rec_size).sum::<usize>() > USABLE {
            return Err(bad(pb, "records overlap: they do not fit in one node"));
        }
        nears.push(pb);
    }
    if grows {
        if t.depth == u16::MAX {
            return Err(Error::corrupt("btree depth overflows"));
        }
        nears.push(t.root);
    }
    let mut fresh = Vec::with_capacity(nears.len());
    for &near in &nears {
        match s.alloc_node(near) {
            Ok(b) => fresh.push(b),
            Err(e) => {
                release(s, &fresh);
                return Err(e);
            }
        }
    }
    fresh.reverse();
    let r = split_up(s, t, owner, &path, leaf, &put, &mut fresh);
    if r.is_err() {
        release(s, &fresh);
    }
    r
}

/// Free blocks allocated for a split that will not happen. Errors are ignored:
/// the caller is already returning the error that matters, and a leak is safe.
fn release(s: &mut impl NodeStore, blocks: &[u64]) {
    for &b in blocks {
        let _ = s.free_node(b);
    }
}

/// Carry out the planned split chain, taking new blocks from the end of `fresh`.
fn split_up(
    s: &mut impl NodeStore,
    t: &mut TreeRoot,
    owner: u64,
    path: &[(u64, usize)],
    leaf: u64,
    put: &Put,
    fresh: &mut Vec<u64>,
) -> Result<()> {
    let mut take = || fresh.pop().ok_or_else(|| Error::corrupt("btree split plan changed while splitting"));
    let mut right = take()?;
    let mut sep = split(s, owner, leaf, 0, put, right)?;
    for (j, &(pb, pi)) in path.iter().enumerate().rev() {
        let level = level_at(t, j);
        let cb = right.to_le_bytes();
        let up = Put { pos: pi + 1, key: sep, val: &cb, replace: false };
        let b = s.node_mut(pb)?;
        let mut h = hdr(b, pb, owner, level)?;
        if h.space() >= CHILD_REC {
            return put_in_place(b, &mut h, pb, owner, &up);
        }
        right = take()?;
        sep = split(s, owner, pb, level, &up, right)?;
    }
    let root = take()?;
    let (old, cb) = (t.root.to_le_bytes(), right.to_le_bytes());
    build(s.node_mut(root)?, owner, t.depth, root, &[(0, &old), (sep, &cb)])?;
    *t = TreeRoot { root, depth: t.depth + 1 };
    Ok(())
}

/// Remove a key, returning its value. Merges and collapses as below.
///
/// See the module documentation: underfull nodes merge with a sibling, and a
/// tree whose last record goes owns no blocks afterwards.
pub fn remove(s: &mut impl NodeStore, t: &mut TreeRoot, owner: u64, key: u64) -> Result<Option<Vec<u8>>> {
    if is_empty(t)? {
        return Ok(None);
    }
    let mut path = Vec::with_capacity(usize::from(t.depth));
    let leaf = descend(s, t, owner, key, Some(&mut path))?;
    let i = {
        let b = s.node(leaf)?;
        let h = hdr(b, leaf, owner, 0)?;
        match search(b, &h, leaf, key)? {
            Ok(i) => i,
            Err(_) => return Ok(None),
        }
    };
    let b = s.node_mut(leaf)?;
    let mut h = hdr(b, leaf, owner, 0)?;
    let value = record(b, &h, leaf, i)?.1.to_vec();
    remove_at(b, &mut h, leaf, i)?;
    rebalance(s, t, owner, path, leaf)?;
    Ok(Some(value))
}

fn live_of(s: &mut impl NodeStore, blk: u64, owner: u64, level: u16) -> Result<usize> {
    Ok(hdr(s.node(blk)?, blk, owner, level)?.live())
}

/// Whether two siblings with these live bytes may become one node.
fn mergeable(a: usize, b: usize) -> bool {
    // Merging an empty node moves nothing, so it never needs the 75% margin.
    a + b <= MERGE_MAX || a == 0 || b == 0
}

/// After leaf `blk` (reached through `path`) lost bytes: merge underfull nodes
/// upward as long as merges happen, then collapse the root.
fn rebalance(
    s: &mut impl NodeStore,
    t: &mut TreeRoot,
    owner: u64,
    mut path: Vec<(u64, usize)>,
    mut blk: u64,
) -> Result<()> {
    let mut level = 0;
    while let Some((parent, mut idx)) = path.pop() {
        let mut merged = false;
        loop {
            let live = live_of(s, blk, owner, level)?;
            if live >= SPREAD_BELOW || (live >= UNDERFULL && level > 0) {
                break;
            }
            let (left, right) = {
                let b = s.node(parent)?;
                let h = hdr(b, parent, owner, level + 1)?;
                let left = if idx > 0 { Some(child(b, &h, parent, idx - 1)?) } else { None };
                let right = if idx + 1 < h.n { Some(child(b, &h, parent, idx + 1)?) } else { None };
                (left, right)
            };
            if live >= UNDERFULL {
                // A leaf between UNDERFULL and SPREAD_BELOW only spreads out.
                if let (Some(l), Some(r)) = (left, right) {
                    merged = spread_out(s, owner, parent, idx, (l, blk, r))?;
                }
                break;
            }
            if let Some(l) = left {
                if mergeable(live_of(s, l, owner, level)?, live) {
                    merge(s, owner, parent, idx - 1, level)?;
                    (blk, idx, merged) = (l, idx - 1, true);
                    continue;
                }
            }
            if let Some(r) = right {
                if mergeable(live, live_of(s, r, owner, level)?) {
                    merge(s, owner, parent, idx, level)?;
                    merged = true;
                    continue;
                }
            }
            if let (0, Some(l), Some(r)) = (level, left, right) {
                if spread_out(s, owner, parent, idx, (l, blk, r))? {
                    merged = true;
                }
            }
            break;
        }
        if !merged {
            // The parent did not change, so nothing above can need work.
            return Ok(());
        }
        blk = parent;
        level += 1;
    }
    collapse(s, t, owner)
}

/// The B\* counterpart of a merge for a leaf neither of whose siblings it can merge
/// with: if the three leaves `l`, `m` (child `idx` of `parent`) and `r` fit in two at
/// MERGE_MAX, spread `m`'s records over `l` and `r` and free `m`. Without it, churn
/// leaves many leaves between UNDERFULL and full whose neighbours are too full to
/// merge, and the tree settles larger than it was built.
fn spread_out(s: &mut impl NodeStore, owner: u64, parent: u64, idx: usize, (l, m, r): (u64, u64, u64)) -> Result<bool> {
    let total = live_of(s, l, owner, 0)? + live_of(s, m, owner, 0)? + live_of(s, r, owner, 0)?;
    if total > 2 * MERGE_MAX {
        return Ok(false);
    }
    let copies: [Block; 3] = [*s.node(l)?, *s.node(m)?, *s.node(r)?];
    let mut recs = Vec::new();
    for (b, blk) in copies.iter().zip([l, m, r]) {
        let h = hdr(b, blk, owner, 0)?;
        recs.extend(collect(b, &h, blk)?);
    }
    let Some(cut) = balanced_cut(&recs) else {
        return Ok(false);
    };
    build(s.node_mut(l)?, owner, 0, l, &recs[..cut])?;
    build(s.node_mut(r)?, owner, 0, r, &recs[cut..])?;
    let b = s.node_mut(parent)?;
    let mut h = hdr(b, parent, owner, 1)?;
    remove_at(b, &mut h, parent, idx)?;
    // `r` is now child `idx`; its separator becomes its new first key.
    rekey(s, owner, parent, idx, recs[cut].0)?;
    s.free_node(m)?;
    Ok(true)
}

/// Move every record of child `i + 1` of `parent` (at `level`) into child `i`,
/// free the emptied block and drop its separator from the parent.
fn merge(s: &mut impl NodeStore, owner: u64, parent: u64, i: usize, level: u16) -> Result<()> {
    let (lb, rb, sep) = {
        let b = s.node(parent)?;
        let h = hdr(b, parent, owner, level + 1)?;
        (child(b, &h, parent, i)?, child(b, &h, parent, i + 1)?, key_at(b, &h, parent, i + 1)?)
    };
    if lb == rb {
        return Err(bad(parent, format_args!("children {i} and {} are both block {lb}", i + 1)));
    }
    let lcopy: Block = *s.node(lb)?;
    let lh = hdr(&lcopy, lb, owner, level)?;
    let rcopy: Block = *s.node(rb)?;
    let rh = hdr(&rcopy, rb, owner, level)?;
    let mut recs = collect(&lcopy, &lh, lb)?;
    recs.extend(collect(&rcopy, &rh, rb)?);
    if level > 0 {
        // Record 0 of the right node becomes an inner separator: it must be
        // exactly the bound the parent routed by.
        recs[lh.n].0 = sep;
    }
    build(s.node_mut(lb)?, owner, level, lb, &recs)?;
    let b = s.node_mut(parent)?;
    let mut h = hdr(b, parent, owner, level + 1)?;
    remove_at(b, &mut h, parent, i + 1)?;
    s.free_node(rb)?;
    if level > 0 {
        fix_seam(s, owner, lb, lh.n - 1, level - 1)?;
    }
    Ok(())
}

/// Children `i` and `i + 1` of `node` came from two nodes that just merged and
/// were never compared: merge them if one is underfull, recursing down the seam.
fn fix_seam(s: &mut impl NodeStore, owner: u64, node: u64, i: usize, level: u16) -> Result<()> {
    let (a, b) = {
        let n = s.node(node)?;
        let h = hdr(n, node, owner, level + 1)?;
        (child(n, &h, node, i)?, child(n, &h, node, i + 1)?)
    };
    let (la, lb) = (live_of(s, a, owner, level)?, live_of(s, b, owner, level)?);
    if (la < UNDERFULL || lb < UNDERFULL) && mergeable(la, lb) {
        merge(s, owner, node, i, level)?;
    }
    Ok(())
}

/// Replace an internal root with a single child by that child, repeatedly, and
/// free a leaf root without records.
fn collapse(s: &mut impl NodeStore, t: &mut TreeRoot, owner: u64) -> Result<()> {
    while t.root != 0 {
        let level = t.depth - 1;
        let next = {
            let b = s.node(t.root)?;
            let h = hdr(b, t.root, owner, level)?;
            match (level, h.n) {
                (0, 0) => None,
                (l, 1) if l > 0 => Some(child(b, &h, t.root, 0)?),
                _ => return Ok(()),
            }
        };
        s.free_node(t.root)?;
        *t = match next {
            Some(root) => TreeRoot { root, depth: level },
            None => TreeRoot::default(),
        };
    }
    Ok(())
}

/// Visit records with key >= from in key order; the callback returns false to stop. No allocation per record.
pub fn scan(
    s: &mut impl NodeStore,
    t: &TreeRoot,
    owner: u64,
    from: u64,
    mut f: impl FnMut(u64, &[u8]) -> bool,
) -> Result<()> {
    if is_empty(t)? {
        return Ok(());
    }
    let mut path = Vec::with_capacity(usize::from(t.depth));
    let mut leaf = descend(s, t, owner, from, Some(&mut path))?;
    loop {
        let b = s.node(leaf)?;
        let h = hdr(b, leaf, owner, 0)?;
        let (Ok(first) | Err(first)) = search(b, &h, leaf, from)?;
        for i in first..h.n {
            let (k, v) = record(b, &h, leaf, i)?;
            if !f(k, v) {
                return Ok(());
            }
        }
        match step(s, t, owner, &mut path, true)? {
            Some(next) => leaf = next,
            None => return Ok(()),
        }
    }
}

/// The leaf that would hold `key` and up to `n - 1` leaves after it, in key order,
/// found through their parents without reading the leaves themselves (readahead).
pub fn leaves_from(s: &mut impl NodeStore, t: &TreeRoot, owner: u64, key: u64, n: usize) -> Result<Vec<u64>> {
    if is_empty(t)? || n == 0 {
        return Ok(Vec::new());
    }
    let mut path = Vec::with_capacity(usize::from(t.depth));
    let mut out = vec![descend(s, t, owner, key, Some(&mut path))?];
    while out.len() < n {
        match step(s, t, owner, &mut path, true)? {
            Some(leaf) => out.push(leaf),
            None => break,
        }
    }
    Ok(out)
}

/// The record with the greatest key <= key (for extent maps).
pub fn floor(s: &mut impl NodeStore, t: &TreeRoot, owner: u64, key: u64) -> Result<Option<(u64, Vec<u8>)>> {
    if is_empty(t)? {
        return Ok(None);
    }
    let mut path = Vec::with_capacity(usize::from(t.depth));
    let mut leaf = descend(s, t, owner, key, Some(&mut path))?;
    loop {
        let b = s.node(leaf)?;
        let h = hdr(b, leaf, owner, 0)?;
        // Number of records in this leaf with keys <= key.
        let end = match search(b, &h, leaf, key)? {
            Ok(i) => i + 1,
            Err(i) => i,
        };
        if end > 0 {
            let (k, v) = record(b, &h, leaf, end - 1)?;
            return Ok(Some((k, v.to_vec())));
        }
        // Separators are only lower bounds: the floor may sit in the previous leaf.
        match step(s, t, owner, &mut path, false)? {
            Some(prev) => leaf = prev,
            None => return Ok(None),
        }
    }
}

/// Depth-first walk, each node before its children in key order, refusing a
/// block reached twice. `visit` sees every node with the key range it may hold.
fn walk(
    s: &mut impl NodeStore,
    t: &TreeRoot,
    owner: u64,
    mut visit: impl FnMut(u64, &Block, &Hdr, Range) -> Result<()>,
) -> Result<Vec<u64>> {
    let mut order = Vec::new();
    if is_empty(t)? {
        return Ok(order);
    }
    let mut seen = HashSet::new();
    let mut stack = vec![(t.root, t.depth - 1, Range { lo: 0, hi: None })];
    while let Some((blk, level, range)) = stack.pop() {
        if !seen.insert(blk) {
            return Err(bad(blk, "reached twice in one tree"));
        }
        order.push(blk);
        let b = s.node(blk)?;
        let h = hdr(b, blk, owner, level)?;
        visit(blk, b, &h, range)?;
        if level > 0 {
            let mut hi = range.hi;
            for i in (0..h.n).rev() {
                let lo = key_at(b, &h, blk, i)?;
                stack.push((child(b, &h, blk, i)?, level - 1, Range { lo, hi }));
                hi = Some(lo);
            }
        }
    }
    Ok(order)
}

/// Blocks of the tree in a leaf-order walk (readahead and fsck).
///
/// Each node comes before its children, children in key order. This walk checks
/// only headers and child pointers; [`check`] also counts the records.
pub fn blocks(s: &mut impl NodeStore, t: &TreeRoot, owner: u64) -> Result<Vec<u64>> {
    walk(s, t, owner, |_, _, _, _| Ok(()))
}

/// Free every block of the tree and reset it to empty.
pub fn destroy(s: &mut impl NodeStore, t: &mut TreeRoot, owner: u64) -> Result<()> {
    let all = blocks(s, t, owner)?;
    // Reset first: if a free fails, blocks leak instead of the tree pointing at freed ones.
    *t = TreeRoot::default();
    for b in all {
        s.free_node(b)?;
    }
    Ok(())
}

/// fsck: check key order within and across nodes, separator keys bound their subtrees, levels consistent, every node's owner, leaf fill; returns a report (blocks, records, per-leaf used bytes) or the first problem found as Error::Corrupt with a precise message.
pub fn check(s: &mut impl NodeStore, t: &TreeRoot, owner: u64) -> Result<TreeStats> {
    let (mut records, mut leaves, mut leaf_bytes_used) = (0, 0, 0);
    let mut spans = Vec::new();
    let blocks = walk(s, t, owner, |blk, b, h, range| {
        spans.clear();
        let mut prev = None;
        for i in 0..h.n {
            let (k, v) = record(b, h, blk, i)?;
            if let Some(p) = prev.filter(|&p| k <= p) {
                return Err(bad(blk, format_args!("key {k:#x} in slot {i} does not follow {p:#x}")));
            }
            if k < range.lo || range.hi.is_some_and(|hi| k >= hi) {
                let hi = range.hi.map_or("end".into(), |hi| format!("{hi:#x}"));
                return Err(bad(
                    blk,
                    format_args!("key {k:#x} outside the range {:#x}..{hi} its parent gives", range.lo),
                ));
            }
            prev = Some(k);
            let off = slot(b, i);
            spans.push((off, off + REC_HDR + v.len()));
        }
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[0].1 > w[1].0) {
            return Err(bad(blk, format_args!("records at {} and {} overlap", w[0].0, w[1].0)));
        }
        let bodies: usize = spans.iter().map(|&(a, z)| z - a).sum();
        if bodies + h.frag != BLOCK_SIZE - h.heap {
            return Err(bad(
                blk,
                format_args!(
                    "heap from {} holds {} bytes, but records use {bodies} and frag is {}",
                    h.heap,
                    BLOCK_SIZE - h.heap,
                    h.frag
                ),
            ));
        }
        if h.level > 0 {
            let first = key_at(b, h, blk, 0)?;
            if first != range.lo {
                return Err(bad(
                    blk,
                    format_args!("first separator {first:#x}, expected the lower bound {:#x}", range.lo),
                ));
            }
        } else {
            if h.n == 0 {
                return Err(bad(blk, if blk == t.root { "empty root leaf" } else { "empty leaf" }));
            }
            records += h.n as u64;
            leaves += 1;
            leaf_bytes_used += h.live() as u64;
        }
        Ok(())
    })?;
    Ok(TreeStats { blocks, records, leaves, leaf_bytes_used, depth: t.depth })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    use std::collections::btree_map::Entry;
    use std::collections::{BTreeMap, HashMap};

    const OWNER: u64 = 77;

    /// In-memory store. Block numbers are never reused, so a read or free of a
    /// number below `next` that is not allocated is a use after free: it fails
    /// and is counted in `misuse`, which the tests assert stays 0.
    struct Mem {
        blocks: HashMap<u64, Box<Block>>,
        next: u64,
        frees: u64,
        misuse: u64,
        /// Allocation fails with NoSpace once this many blocks are in use.
        limit: usize,
    }

    impl Mem {
        fn new() -> Mem {
            Mem { blocks: HashMap::new(), next: 1, frees: 0, misuse: 0, limit: usize::MAX }
        }
        fn present(&mut self, block: u64) -> Result<()> {
            if self.blocks.contains_key(&block) {
                return Ok(());
            }
            self.misuse += 1;
            Err(Error::corrupt(format!("block {block} is not allocated")))
        }
    }

    impl NodeStore for Mem {
        fn node(&mut self, block: u64) -> Result<&Block> {
            self.present(block)?;
            let b = &self.blocks[&block];
            if magic_of(b) != BTREE_MAGIC {
                return Err(Error::corrupt(format!("block {block}: bad magic")));
            }
            Ok(b)
        }
        fn node_mut(&mut self, block: u64) -> Result<&mut Block> {
            self.present(block)?;
            Ok(self.blocks.get_mut(&block).unwrap())
        }
        fn alloc_node(&mut self, _near: u64) -> Result<u64> {
            if self.blocks.len() >= self.limit {
                return Err(Error::NoSpace);
            }
            let b = self.next;
            self.next += 1;
            self.blocks.insert(b, Box::new([0; BLOCK_SIZE]));
            Ok(b)
        }
        fn free_node(&mut self, block: u64) -> Result<()> {
            self.present(block)?;
            self.blocks.remove(&block);
            self.frees += 1;
            Ok(())
        }
    }

    fn magic_of(b: &Block) -> u32 {
        get_u32(b, 0)
    }

    fn val(key: u64, len: usize, salt: u8) -> Vec<u8> {
        (0..len).map(|i| (key as u8).wrapping_mul(31) ^ (i as u8) ^ salt).collect()
    }

    fn all(m: &mut Mem, t: &TreeRoot) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        scan(m, t, OWNER, 0, |k, v| {
            out.push((k, v.to_vec()));
            true
        })
        .unwrap();
        out
    }

    /// Full check, plus: the store holds exactly the tree's blocks,
    /// and no two siblings side by side are both underfull, the property that
    /// lets a shrinking tree collapse.
    fn sound(m: &mut Mem, t: &TreeRoot) -> TreeStats {
        let st = check(m, t, OWNER).unwrap();
        assert_eq!(st.blocks.len(), m.blocks.len(), "blocks leaked or lost");
        assert_eq!(m.misuse, 0, "freed block touched");
        for &blk in &st.blocks {
            let b = *m.node(blk).unwrap();
            let level = get_u16(&b, OFF_LEVEL);
            if level == 0 {
                continue;
            }
            let h = hdr(&b, blk, OWNER, level).unwrap();
            let lives: Vec<usize> =
                (0..h.n).map(|i| live_of(m, child(&b, &h, blk, i).unwrap(), OWNER, level - 1).unwrap()).collect();
            assert!(
                !lives.windows(2).any(|w| w[0] < UNDERFULL && w[1] < UNDERFULL),
                "block {blk}: underfull neighbours {lives:?}"
            );
        }
        st
    }

    fn is_corrupt<T: std::fmt::Debug>(r: Result<T>) -> bool {
        matches!(r, Err(Error::Corrupt(_)))
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, usize),
        Replace(u64, usize),
        Remove(u64),
        Get(u64),
        Scan(u64, usize),
        Floor(u64),
    }

    fn key() -> impl Strategy<Value = u64> {
        prop_oneof![8 => 0u64..300, 1 => Just(0), 1 => Just(u64::MAX), 1 => any::<u64>()]
    }

    fn vlen() -> impl Strategy<Value = usize> {
        prop_oneof![0usize..40, 500usize..=MAX_VALUE]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (key(), vlen()).prop_map(|(k, l)| Op::Insert(k, l)),
            2 => (key(), vlen()).prop_map(|(k, l)| Op::Replace(k, l)),
            3 => key().prop_map(Op::Remove),
            1 => key().prop_map(Op::Get),
            1 => (key(), 0usize..50).prop_map(|(k, n)| Op::Scan(k, n)),
            1 => key().prop_map(Op::Floor),
        ]
    }

    proptest! {
        #[test]
        fn matches_model(ops in proptest::collection::vec(op(), 1..400)) {
            let (mut m, mut t, mut model) = (Mem::new(), TreeRoot::default(), BTreeMap::new());
            for (step, op) in ops.iter().enumerate() {
                let salt = step as u8;
                match *op {
                    Op::Insert(k, l) => {
                        let v = val(k, l, salt);
                        let r = insert(&mut m, &mut t, OWNER, k, &v, false);
                        match model.entry(k) {
                            Entry::Occupied(_) => prop_assert!(matches!(r, Err(Error::Exists))),
                            Entry::Vacant(e) => {
                                r.unwrap();
                                e.insert(v);
                            }
                        }
                    }
                    Op::Replace(k, l) => {
                        let v = val(k, l, salt);
                        insert(&mut m, &mut t, OWNER, k, &v, true).unwrap();
                        model.insert(k, v);
                    }
                    Op::Remove(k) => prop_assert_eq!(remove(&mut m, &mut t, OWNER, k).unwrap(), model.remove(&k)),
                    Op::Get(k) => prop_assert_eq!(get(&mut m, &t, OWNER, k).unwrap(), model.get(&k).cloned()),
                    Op::Floor(k) => {
                        let want = model.range(..=k).next_back().map(|(&k, v)| (k, v.clone()));
                        prop_assert_eq!(floor(&mut m, &t, OWNER, k).unwrap(), want);
                    }
                    Op::Scan(from, n) => {
                        let mut got = Vec::new();
                        scan(&mut m, &t, OWNER, from, |k, v| {
                            got.push((k, v.to_vec()));
                            got.len() < n
                        }).unwrap();
                        let want: Vec<_> = model.range(from..).take(n.max(1)).map(|(&k, v)| (k, v.clone())).collect();
                        prop_assert_eq!(got, want);
                    }
                }
                let want: Vec<_> = model.iter().map(|(&k, v)| (k, v.clone())).collect();
                prop_assert_eq!(all(&mut m, &t), want);
                if step % 20 == 0 {
                    sound(&mut m, &t);
                }
            }
            let st = sound(&mut m, &t);
            prop_assert_eq!(st.records, model.len() as u64);
            for k in model.keys().copied().collect::<Vec<_>>() {
                prop_assert_eq!(remove(&mut m, &mut t, OWNER, k).unwrap(), model.remove(&k));
            }
            prop_assert_eq!(t, TreeRoot::default());
            prop_assert!(m.blocks.is_empty());
            prop_assert_eq!(m.misuse, 0);
        }
    }

    /// Long random workloads on trees three levels deep, where internal nodes
    /// split and merge too, against a model: grow, churn, then shrink to nothing.
    #[test]
    fn deep_workload_matches_model() {
        for seed in 0..3 {
            let mut rng = StdRng::seed_from_u64(seed);
            let (mut m, mut t, mut model) = (Mem::new(), TreeRoot::default(), BTreeMap::new());
            let span = 40_000u64;
            // Chance in percent that an operation inserts or replaces rather than removes.
            for (phase, (ops, grow)) in [(120_000, 85), (60_000, 50), (200_000, 5)].into_iter().enumerate() {
                for step in 0..ops {
                    let k = rng.gen_range(0..span) * 1_000_003;
                    if rng.gen_range(0..100) < grow {
                        let len =
                            if rng.gen_bool(0.8) { rng.gen_range(0..200) } else { rng.gen_range(200..=MAX_VALUE) };
                        let v = val(k, len, step as u8);
                        let replace = rng.gen_bool(0.3);
                        match insert(&mut m, &mut t, OWNER, k, &v, replace) {
                            Err(Error::Exists) => assert!(!replace && model.contains_key(&k)),
                            r => {
                                r.unwrap();
                                assert!(model.insert(k, v).is_none() || replace);
                            }
                        }
                    } else {
                        assert_eq!(remove(&mut m, &mut t, OWNER, k).unwrap(), model.remove(&k));
                    }
                    if step % 1000 == 0 {
                        let q = rng.gen_range(0..span * 1_000_003);
                        let want = model.range(..=q).next_back().map(|(&k, v)| (k, v.clone()));
                        assert_eq!(floor(&mut m, &t, OWNER, q).unwrap(), want);
                        assert_eq!(get(&mut m, &t, OWNER, q).unwrap(), model.get(&q).cloned());
                    }
                    if step % 20_000 == 0 {
                        assert_eq!(sound(&mut m, &t).records, model.len() as u64);
                    }
                }
                if phase == 0 {
                    assert!(t.depth >= 3, "depth {}", t.depth);
                }
                let want: Vec<_> = model.iter().map(|(&k, v)| (k, v.clone())).collect();
                assert_eq!(all(&mut m, &t), want);
                sound(&mut m, &t);
            }
            for k in model.keys().copied().collect::<Vec<_>>() {
                assert_eq!(remove(&mut m, &mut t, OWNER, k).unwrap(), model.remove(&k));
            }
            assert_eq!(t, TreeRoot::default());
            assert!(m.blocks.is_empty());
        }
    }

    #[test]
    fn deep_tree_grows_and_collapses() {
        let mut rng = StdRng::seed_from_u64(1);
        let (mut m, mut t) = (Mem::new(), TreeRoot::default());
        let mut keys: Vec<u64> = (0..200_000).map(|_| rng.gen()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys.shuffle(&mut rng);
        for &k in &keys {
            insert(&mut m, &mut t, OWNER, k, &val(k, 190 + (k % 21) as usize, 1), false).unwrap();
        }
        assert!(t.depth >= 3, "depth {}", t.depth);
        let st = sound(&mut m, &t);
        assert_eq!(st.records, keys.len() as u64);
        for &k in &keys {
            assert_eq!(get(&mut m, &t, OWNER, k).unwrap().unwrap(), val(k, 190 + (k % 21) as usize, 1));
        }
        keys.shuffle(&mut rng);
        let (gone, kept) = keys.split_at(keys.len() - 5);
        for &k in gone {
            assert!(remove(&mut m, &mut t, OWNER, k).unwrap().is_some());
        }
        assert_eq!(t.depth, 1, "tree did not collapse");
        assert_eq!(sound(&mut m, &t).blocks.len(), 1);
        for &k in kept {
            assert!(get(&mut m, &t, OWNER, k).unwrap().is_some());
            assert!(remove(&mut m, &mut t, OWNER, k).unwrap().is_some());
        }
        assert_eq!(t, TreeRoot::default());
        assert!(m.blocks.is_empty());
        assert_eq!(m.misuse, 0);
    }

    #[test]
    fn churn_keeps_size_bounded() {
        let mut rng = StdRng::seed_from_u64(2);
        let (mut m, mut t) = (Mem::new(), TreeRoot::default());
        let mut live: Vec<u64> = Vec::new();
        while live.len() < 10_000 {
            let k = rng.gen::<u64>() >> 1;
            if insert(&mut m, &mut t, OWNER, k, &val(k, rng.gen_range(20..60), 0), false).is_ok() {
                live.push(k);
            }
        }
        // A tree built by random inserts is ~70% full; churn settles it near 55%
        // within the first 100k cycles, and from then on it must not drift.
        let start = m.blocks.len();
        let mut most = [start; 2];
        for cycle in 0..200_000 {
            let i = rng.gen_range(0..live.len());
            assert!(remove(&mut m, &mut t, OWNER, live.swap_remove(i)).unwrap().is_some());
            let k = rng.gen::<u64>() >> 1;
            if insert(&mut m, &mut t, OWNER, k, &val(k, rng.gen_range(20..60), 0), false).is_ok() {
                live.push(k);
            }
            let half = &mut most[cycle / 100_000];
            *half = (*half).max(m.blocks.len());
        }
        assert!(most[0] <= start + start / 2, "grew from {start} to {} blocks", most[0]);
        assert!(most[1] <= most[0] + start / 10, "drifted from {} to {} blocks", most[0], most[1]);
        let st = sound(&mut m, &t);
        assert_eq!(st.records, live.len() as u64);
        destroy(&mut m, &mut t, OWNER).unwrap();
        assert_eq!(t, TreeRoot::default());
        assert!(m.blocks.is_empty());
    }

    #[test]
    fn extreme_keys() {
        let (mut m, mut t) = (Mem::new(), TreeRoot::default());
        for k in [u64::MAX, 0, 1, u64::MAX - 1] {
            insert(&mut m, &mut t, OWNER, k, &val(k, 8, 0), false).unwrap();
        }
        assert!(matches!(insert(&mut m, &mut t, OWNER, 0, b"x", false), Err(Error::Exists)));
        for k in 2..2000u64 {
            insert(&mut m, &mut t, OWNER, k << 40, &val(k, 100, 0), false).unwrap();
        }
        assert!(t.depth >= 2);
        sound(&mut m, &t);
        assert_eq!(get(&mut m, &t, OWNER, 0).unwrap(), Some(val(0, 8, 0)));
        assert_eq!(get(&mut m, &t, OWNER, u64::MAX).unwrap(), Some(val(u64::MAX, 8, 0)));
        assert_eq!(floor(&mut m, &t, OWNER, 0).unwrap().unwrap().0, 0);
        assert_eq!(floor(&mut m, &t, OWNER, u64::MAX).unwrap().unwrap().0, u64::MAX);
        assert_eq!(floor(&mut m, &t, OWNER, u64::MAX - 2).unwrap().unwrap().0, 1999 << 40);
        let mut first = None;
        scan(&mut m, &t, OWNER, u64::MAX, |k, _| {
            first = Some(k);
            false
        })
        .unwrap();
        assert_eq!(first, Some(u64::MAX));
        assert_eq!(remove(&mut m, &mut t, OWNER, u64::MAX).unwrap(), Some(val(u64::MAX, 8, 0)));
        assert_eq!(remove(&mut m, &mut t, OWNER, 0).unwrap(), Some(val(0, 8, 0)));
        assert_eq!(floor(&mut m, &t, OWNER, 0).unwrap(), None);
        assert_eq!(get(&mut m, &t, OWNER, 0).unwrap(), None);
        sound(&mut m, &t);
    }

    #[test]
    fn rejects_oversized_values() {
        let (mut m, mut t) = (Mem::new(), TreeRoot::default());
        let big = vec![0; MAX_VALUE + 1];
        assert!(matches!(insert(&mut m, &mut t, OWNER, 1, &big, false), Err(Error::Invalid(_))));
        insert(&mut m, &mut t, OWNER, 1, &big[..MAX_VALUE], false).unwrap();
        insert(&mut m, &mut t, OWNER, 2, &[], false).unwrap();
        assert_eq!(get(&mut m, &t, OWNER, 2).unwrap(), Some(vec![]));
        sound(&mut m, &t);
    }

    #[test]
    fn no_space_leaves_tree_unchanged() {
        let (mut m, mut t) = (Mem::new(), TreeRoot::default());
        for k in 0..3000u64 {
            insert(&mut m, &mut t, OWNER, k * 2, &val(k, 60, 0), false).unwrap();
        }
        m.limit = m.blocks.len();
        let before = all(&mut m, &t);
        let mut failed = 0;
        for k in 0..3000u64 {
            let key = k * 2 + 1;
            match insert(&mut m, &mut t, OWNER, key, &val(k, 300, 0), false) {
                Ok(()) => {}
                Err(Error::NoSpace) => {
                    failed += 1;
                    assert_eq!(get(&mut m, &t, OWNER, key).unwrap(), None);
                }
                Err(e) => panic!("{e}"),
            }
            assert!(m.blocks.len() <= m.limit);
        }
        assert!(failed > 0);
        sound(&mut m, &t);
        // Every old record survived.
        for (k, v) in before {
            assert_eq!(get(&mut m, &t, OWNER, k).unwrap(), Some(v));
        }
    }

    /// A depth-2 tree and one of its leaves.
    fn two_levels() -> (Mem, TreeRoot, u64) {
        let (mut m, mut t) = (Mem::new(), TreeRoot::default());
        for k in 0..600u64 {
            insert(&mut m, &mut t, OWNER, k, &val(k, 80, 0), false).unwrap();
        }
        assert_eq!(t.depth, 2);
        let leaf = blocks(&mut m, &t, OWNER).unwrap()[1];
        (m, t, leaf)
    }

    /// Every operation on a damaged tree returns an error or a plain answer, never panics.
    fn exercise(m: &mut Mem, t: &mut TreeRoot) -> Vec<bool> {
        let mut corrupt = vec![is_corrupt(check(m, t, OWNER)), is_corrupt(blocks(m, t, OWNER))];
        corrupt.push(is_corrupt(scan(m, t, OWNER, 0, |_, _| true)));
        for k in [0, 5, 17, 300, 599, 1000] {
            corrupt.push(is_corrupt(get(m, t, OWNER, k)));
            corrupt.push(is_corrupt(floor(m, t, OWNER, k)));
        }
        for k in [3, 250, 598] {
            corrupt.push(is_corrupt(remove(m, t, OWNER, k)));
            corrupt.push(is_corrupt(insert(m, t, OWNER, k + 10_000, &[7; 900], false)));
            corrupt.push(is_corrupt(insert(m, t, OWNER, k + 1, &[7; 700], true)));
        }
        corrupt
    }

    #[test]
    fn corrupt_nodes_are_reported() {
        type Damage = fn(&mut Block);
        let cases: [(&str, Damage); 6] = [
            ("nslots too big", |b| put_u16(b, OFF_NSLOTS, 2000)),
            ("slot outside block", |b| put_u16(b, SLOTS, 4090)),
            ("slot below heap", |b| put_u16(b, SLOTS + 2, 40)),
            ("wrong owner", |b| put_u64(b, OFF_OWNER, OWNER + 1)),
            ("wrong level", |b| put_u16(b, OFF_LEVEL, 1)),
            ("value length too big", |b| {
                let off = slot(b, 0);
                put_u16(b, off + 8, 2000);
            }),
        ];
        for (what, damage) in cases {
            let (mut m, mut t, leaf) = two_levels();
            damage(m.node_mut(leaf).unwrap());
            let got = exercise(&mut m, &mut t);
            assert!(got[0], "{what}: check missed it");
            assert!(got[2], "{what}: scan missed it");
            assert!(got.iter().filter(|&&c| c).count() > 3, "{what}: {got:?}");
        }
        let (mut m, mut t, _) = two_levels();
        let root = t.root;
        put_u64(m.node_mut(root).unwrap(), OFF_OWNER, 1);
        assert!(exercise(&mut m, &mut t).iter().all(|&c| c), "wrong owner at the root");
        let (mut m, mut t, _) = two_levels();
        t.depth = 3;
        assert!(exercise(&mut m, &mut t).iter().all(|&c| c), "wrong depth");
        assert!(is_corrupt(get(&mut Mem::new(), &TreeRoot { root: 5, depth: 0 }, OWNER, 1)));
    }

    #[test]
    fn check_catches_subtle_damage() {
        // Swapped slots: out of order keys.
        let (mut m, t, leaf) = two_levels();
        let b = m.node_mut(leaf).unwrap();
        let (a, z) = (slot(b, 0), slot(b, 1));
        put_u16(b, SLOTS, z as u16);
        put_u16(b, SLOTS + 2, a as u16);
        assert!(is_corrupt(check(&mut m, &t, OWNER)));
        // A separator that no longer bounds its subtree.
        let (mut m, t, _) = two_levels();
        let root = t.root;
        let b = m.node_mut(root).unwrap();
        let off = slot(b, 1);
        let k = get_u64(b, off);
        put_u64(b, off, k + 1);
        assert!(is_corrupt(check(&mut m, &t, OWNER)));
        // frag that disagrees with the heap.
        let (mut m, t, leaf) = two_levels();
        put_u16(m.node_mut(leaf).unwrap(), OFF_FRAG, 10);
        assert!(is_corrupt(check(&mut m, &t, OWNER)));
        // Two separators pointing at the same child.
        let (mut m, t, _) = two_levels();
        let root = t.root;
        let b = m.node_mut(root).unwrap();
        let first = get_u64(b, slot(b, 0) + REC_HDR);
        let off = slot(b, 1) + REC_HDR;
        put_u64(b, off, first);
        assert!(is_corrupt(check(&mut m, &t, OWNER)));
    }

    #[test]
    fn random_damage_never_panics() {
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..3000 {
            let (mut m, mut t, _) = two_levels();
            let all_blocks = blocks(&mut m, &t, OWNER).unwrap();
            for _ in 0..rng.gen_range(1..4) {
                let b = m.node_mut(*all_blocks.choose(&mut rng).unwrap()).unwrap();
                // Mostly header and slot bytes, where damage is most interesting.
                let at = if rng.gen_bool(0.7) { rng.gen_range(16..200) } else { rng.gen_range(0..BLOCK_SIZE) };
                b[at] = rng.gen();
            }
            exercise(&mut m, &mut t);
        }
    }
}
