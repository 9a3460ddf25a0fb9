//! Walking a whole tree: its blocks, and the structural check fsck relies on.

use crate::disk::codec::{Block, BLOCK_SIZE};
use crate::disk::format::TreeRoot;
use crate::error::Result;

use std::collections::HashSet;

use super::node::*;
use super::*;

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

/// The key range a subtree may hold: `lo..hi`, unbounded above when `hi` is None.
#[derive(Clone, Copy)]
pub(super) struct Range {
    pub(super) lo: u64,
    pub(super) hi: Option<u64>,
}

/// Depth-first walk, each node before its children in key order, refusing a
/// block reached twice. `visit` sees every node with the key range it may hold.
pub(super) fn walk(
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
pub(crate) fn blocks(s: &mut impl NodeStore, t: &TreeRoot, owner: u64) -> Result<Vec<u64>> {
    walk(s, t, owner, |_, _, _, _| Ok(()))
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

/// What can still be read of a damaged tree (fsck's salvage): the records of every leaf
/// that can be reached through readable nodes, in key order without duplicates, and the
/// readable nodes themselves. Unreadable nodes, and everything only they lead to, are
/// left out (their blocks are neither listed nor read).
pub fn salvage(s: &mut impl NodeStore, t: &TreeRoot, owner: u64) -> (Vec<(u64, Vec<u8>)>, Vec<u64>) {
    let mut recs = std::collections::BTreeMap::new();
    let mut nodes = Vec::new();
    if t.root == 0 || t.depth == 0 {
        return (Vec::new(), nodes);
    }
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![(t.root, t.depth - 1)];
    while let Some((blk, level)) = stack.pop() {
        if !seen.insert(blk) {
            continue;
        }
        let Ok(b) = s.node(blk) else { continue };
        let b: Block = *b;
        let Ok(h) = hdr(&b, blk, owner, level) else { continue };
        nodes.push(blk);
        for i in 0..h.n {
            if level == 0 {
                if let Ok((k, v)) = record(&b, &h, blk, i) {
                    recs.entry(k).or_insert_with(|| v.to_vec());
                }
            } else if let Ok(c) = child(&b, &h, blk, i) {
                stack.push((c, level - 1));
            }
        }
    }
    (recs.into_iter().collect(), nodes)
}

/// The records of block `blk` if it is a readable leaf of `owner`'s tree (fsck, when
/// the inode that held the tree's root is lost and its leaves are found by scanning).
pub(crate) fn leaf_records(s: &mut impl NodeStore, blk: u64, owner: u64) -> Result<Vec<(u64, Vec<u8>)>> {
    let b = s.node(blk)?;
    let h = hdr(b, blk, owner, 0)?;
    (0..h.n).map(|i| record(b, &h, blk, i).map(|(k, v)| (k, v.to_vec()))).collect()
}

/// Whether block `blk` is a readable node (any level) of `owner`'s tree.
pub(crate) fn owned_node(s: &mut impl NodeStore, blk: u64, owner: u64) -> bool {
    let Ok(b) = s.node(blk) else { return false };
    let level = crate::disk::codec::get_u16(b, OFF_LEVEL);
    hdr(b, blk, owner, level).is_ok()
}
