//! Keeping nodes full and the tree short: splits (with B*-style shifts into a sibling
//! first), merges and spreads after removals, and the collapse of a shrinking root.

use crate::disk::codec::{put_u64, Block};
use crate::disk::format::TreeRoot;
use crate::error::{Error, Result};

use super::node::*;
use super::*;

/// Below this many live bytes a node tries to merge. At most half of MERGE_MAX, so two
/// underfull siblings side by side always merge.
pub(super) const UNDERFULL: usize = MERGE_MAX / 2;

/// Below this many live bytes a leaf tries to spread its records over its two siblings.
pub(super) const SPREAD_BELOW: usize = USABLE * 2 / 3;

/// Two nodes merge only if their live bytes together fit in this.
pub(super) const MERGE_MAX: usize = USABLE * 9 / 10;

/// Space a separator takes in an internal node: slot, record header, child number.
pub(super) const CHILD_REC: usize = 2 + REC_HDR + 8;

/// Free bytes a sibling needs before a full leaf shifts records into it rather than
/// splitting: after the shift both have at least half of this free, so the next shift
/// between the same two leaves is several inserts away.
pub(super) const SHIFT_MIN_FREE: usize = USABLE / 8;

/// A record to place at slot `pos`, over the record there when `replace`.
pub(super) struct Put<'a> {
    pub(super) pos: usize,
    pub(super) key: u64,
    pub(super) val: &'a [u8],
    pub(super) replace: bool,
}

/// Apply `put` to a node known to have room for it.
pub(super) fn put_in_place(b: &mut Block, h: &mut Hdr, blk: u64, owner: u64, put: &Put) -> Result<()> {
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
pub(super) fn split(s: &mut impl NodeStore, owner: u64, blk: u64, level: u16, put: &Put, right: u64) -> Result<u64> {
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
pub(super) fn with_put<'a>(b: &'a Block, h: &Hdr, blk: u64, put: &Put<'a>) -> Result<Vec<(u64, &'a [u8])>> {
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
pub(super) fn balanced_cut(recs: &[(u64, &[u8])]) -> Option<usize> {
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
pub(super) fn rekey(s: &mut impl NodeStore, owner: u64, parent: u64, i: usize, key: u64) -> Result<()> {
    let b = s.node_mut(parent)?;
    let h = hdr(b, parent, owner, 1)?;
    let off = rec_off(b, &h, parent, i)?;
    put_u64(b, off, key);
    Ok(())
}

/// Apply `put` to the full leaf `leaf` by sharing its records with a sibling under the
/// same parent that has room (a B*-tree's overflow), instead of splitting. Leaves then
/// stay well over half full under random inserts and under churn, where splits alone
/// settle near 50-69%. The separator in the parent moves; no block is allocated, so a
/// shift needs none of the split's budget. Returns false when neither sibling has room.
pub(super) fn shift_to_sibling(
    s: &mut impl NodeStore,
    owner: u64,
    path: &[(u64, usize)],
    leaf: u64,
    put: &Put,
) -> Result<bool> {
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

/// Free blocks allocated for a split that will not happen. Errors are ignored:
/// the caller is already returning the error that matters, and a leak is safe.
pub(super) fn release(s: &mut impl NodeStore, blocks: &[u64]) {
    for &b in blocks {
        let _ = s.free_node(b);
    }
}

/// Carry out the planned split chain, taking new blocks from the end of `fresh`.
pub(super) fn split_up(
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

pub(super) fn live_of(s: &mut impl NodeStore, blk: u64, owner: u64, level: u16) -> Result<usize> {
    Ok(hdr(s.node(blk)?, blk, owner, level)?.live())
}

/// Whether two siblings with these live bytes may become one node.
pub(super) fn mergeable(a: usize, b: usize) -> bool {
    // Merging an empty node moves nothing, so it never needs the MERGE_MAX margin.
    a + b <= MERGE_MAX || a == 0 || b == 0
}

/// After leaf `blk` (reached through `path`) lost bytes: merge underfull nodes
/// upward as long as merges happen, then collapse the root.
pub(super) fn rebalance(
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
pub(super) fn spread_out(
    s: &mut impl NodeStore,
    owner: u64,
    parent: u64,
    idx: usize,
    (l, m, r): (u64, u64, u64),
) -> Result<bool> {
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
pub(super) fn merge(s: &mut impl NodeStore, owner: u64, parent: u64, i: usize, level: u16) -> Result<()> {
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
pub(super) fn fix_seam(s: &mut impl NodeStore, owner: u64, node: u64, i: usize, level: u16) -> Result<()> {
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
pub(super) fn collapse(s: &mut impl NodeStore, t: &mut TreeRoot, owner: u64) -> Result<()> {
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
