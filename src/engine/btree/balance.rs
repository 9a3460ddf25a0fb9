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

/// Below this many live bytes a leaf tries to spread the leaves around it over one fewer.
pub(super) const SPREAD_BELOW: usize = USABLE * 17 / 20;

/// A stretch of k leaves spreads into k − 1 only if they fit at this fill.
pub(super) const SPREAD_MAX: usize = USABLE * 39 / 40;

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

/// How far along its parent a full leaf looks for a leaf with room before it splits.
pub(super) const SHIFT_REACH: usize = 4;

/// Apply `put` to the full leaf `leaf` by sharing its records with the leaves between it
/// and the nearest leaf under the same parent, at most `SHIFT_REACH` away, that has room
/// (a B*-tree's overflow, carried along a few neighbours as btrfs pushes items left and
/// right). Leaves then stay well over half full under random inserts and under churn:
/// a split happens only when a whole stretch of leaves is nearly full, so churn, which
/// empties leaves here and fills them there, settles no larger than the tree was built.
/// The separators in the parent move; no block is allocated, so a shift needs none of the
/// split's budget. Returns false when no leaf in reach has room.
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
    let n = {
        let b = s.node(parent)?;
        hdr(b, parent, owner, 1)?.n
    };
    let sibling = |s: &mut _, j: usize| -> Result<(u64, usize)> {
        let b = NodeRead::node(s, parent)?;
        let h = hdr(b, parent, owner, 1)?;
        let c = child(b, &h, parent, j)?;
        let space = hdr(NodeRead::node(s, c)?, c, owner, 0)?.space();
        Ok((c, space))
    };
    // The nearest child with room; at equal distance the one with more room.
    let mut target: Option<usize> = None;
    for d in 1..=SHIFT_REACH {
        let mut best: Option<(usize, usize)> = None;
        for j in [idx.checked_sub(d), Some(idx + d).filter(|&j| j < n)].into_iter().flatten() {
            let (_, space) = sibling(s, j)?;
            if space >= SHIFT_MIN_FREE && best.is_none_or(|(_, b)| space > b) {
                best = Some((j, space));
            }
        }
        if let Some((j, _)) = best {
            target = Some(j);
            break;
        }
    }
    let Some(j) = target else {
        return Ok(false);
    };
    let (lo, hi) = (idx.min(j), idx.max(j));
    let mut blocks = Vec::with_capacity(hi - lo + 1);
    for k in lo..=hi {
        blocks.push(if k == idx { leaf } else { sibling(s, k)?.0 });
    }
    let copies: Vec<Block> = blocks.iter().map(|&b| Ok(*s.node(b)?)).collect::<Result<_>>()?;
    let mut recs = Vec::new();
    for (c, &b) in copies.iter().zip(&blocks) {
        let h = hdr(c, b, owner, 0)?;
        if b == leaf {
            recs.extend(with_put(c, &h, b, put)?);
        } else {
            recs.extend(collect(c, &h, b)?);
        }
    }
    let Some(cuts) = even_cuts(&recs, blocks.len()) else {
        return Ok(false);
    };
    for (k, &b) in blocks.iter().enumerate() {
        build(s.node_mut(b)?, owner, 0, b, &recs[cuts[k]..cuts[k + 1]])?;
        if k > 0 {
            // Each later leaf's separator becomes its new first key; it still lies
            // between the neighbouring separators, since the records came from their range.
            rekey(s, owner, parent, lo + k, recs[cuts[k]].0)?;
        }
    }
    Ok(true)
}

/// Cut `recs` into `m` non-empty runs of about equal bytes: returns the m + 1 run
/// boundaries, or None if a run would not fit in a node.
pub(super) fn even_cuts(recs: &[(u64, &[u8])], m: usize) -> Option<Vec<usize>> {
    if m == 2 {
        return balanced_cut(recs).map(|c| vec![0, c, recs.len()]);
    }
    let total: usize = recs.iter().map(rec_size).sum();
    let mut cuts = vec![0];
    let mut acc = 0;
    for (i, r) in recs.iter().enumerate() {
        let k = cuts.len();
        // Close run k-1 before record i once the bytes so far reach k/m of the total,
        // leaving at least one record for each run still to come.
        if k < m && i > cuts[k - 1] && acc * m >= total * k && recs.len() - i >= m - k {
            cuts.push(i);
        }
        acc += rec_size(r);
    }
    cuts.push(recs.len());
    let fits = cuts.len() == m + 1
        && cuts.windows(2).all(|w| w[0] < w[1] && recs[w[0]..w[1]].iter().map(rec_size).sum::<usize>() <= USABLE);
    fits.then_some(cuts)
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
                // `merged` may already be set by a merge in an earlier pass.
                merged |= spread_out(s, owner, parent, idx)?;
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
            if level == 0 && spread_out(s, owner, parent, idx)? {
                merged = true;
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
/// with, and the mirror of `shift_to_sibling`: if the k leaves within `SHIFT_REACH` of
/// child `idx` of `parent` fit in k − 1 at MERGE_MAX, spread their records over k − 1 of
/// them and free one. Without it, churn leaves many leaves between UNDERFULL and full
/// whose neighbours are too full to merge, and the tree settles larger than it was built.
pub(super) fn spread_out(s: &mut impl NodeStore, owner: u64, parent: u64, idx: usize) -> Result<bool> {
    let kids: Vec<u64> = {
        let b = s.node(parent)?;
        let h = hdr(b, parent, owner, 1)?;
        let (lo, hi) = (idx.saturating_sub(SHIFT_REACH), (idx + SHIFT_REACH).min(h.n.saturating_sub(1)));
        (lo..=hi).map(|j| child(b, &h, parent, j)).collect::<Result<_>>()?
    };
    let lo = idx.saturating_sub(SHIFT_REACH);
    let k = kids.len();
    if k < 3 {
        return Ok(false);
    }
    let mut total = 0;
    for &c in &kids {
        total += live_of(s, c, owner, 0)?;
    }
    if total > (k - 1) * SPREAD_MAX {
        return Ok(false);
    }
    let copies: Vec<Block> = kids.iter().map(|&c| Ok(*s.node(c)?)).collect::<Result<_>>()?;
    let mut recs = Vec::new();
    for (b, &blk) in copies.iter().zip(&kids) {
        let h = hdr(b, blk, owner, 0)?;
        recs.extend(collect(b, &h, blk)?);
    }
    let Some(cuts) = even_cuts(&recs, k - 1) else {
        return Ok(false);
    };
    // Child 0 of the parent keeps its place: its separator is the parent's own bound.
    let gone = if idx > 0 { idx } else { 1 };
    let keep: Vec<u64> = kids.iter().enumerate().filter(|&(j, _)| lo + j != gone).map(|(_, &c)| c).collect();
    for (r, &c) in keep.iter().enumerate() {
        build(s.node_mut(c)?, owner, 0, c, &recs[cuts[r]..cuts[r + 1]])?;
    }
    let b = s.node_mut(parent)?;
    let mut h = hdr(b, parent, owner, 1)?;
    remove_at(b, &mut h, parent, gone)?;
    // The first kept leaf's records start with the window's smallest key, which its
    // separator already bounds; each later one's separator becomes its new first key.
    for r in 1..keep.len() {
        rekey(s, owner, parent, lo + r, recs[cuts[r]].0)?;
    }
    s.free_node(kids[gone - lo])?;
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
