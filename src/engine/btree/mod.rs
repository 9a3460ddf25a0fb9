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
//! # Balancing (`balance.rs`)
//!
//! A full leaf first tries to share its records with the leaves between it and the
//! nearest leaf under the same parent, at most `SHIFT_REACH` (4) away, that has at least
//! 1/8 of a node free (a B*-tree's overflow carried along: the parent's separators move,
//! nothing is allocated). Only when no leaf in reach has room does it split, at the byte
//! midpoint of its records into two halves of about 50%; the parent gains a separator,
//! which may split it in turn, and a root split adds a level. All blocks a split chain
//! needs are allocated before anything changes, so an insert that fails with `NoSpace`
//! leaves the tree as it was. After a removal a node whose live bytes (slots + bodies)
//! fall below 45% of the 4064 usable bytes (`UNDERFULL`) merges with its left sibling,
//! else its right one, under the same parent when the two fit in 90% of a node
//! (`MERGE_MAX`; an empty node always goes); the parent loses a separator and may merge
//! in turn. A leaf below 85% (`SPREAD_BELOW`) that cannot merge looks at the k leaves
//! within reach and, when they fit in k − 1 at 97.5% (`SPREAD_MAX`), spreads them over
//! k − 1 and frees one: with the shift, this keeps a churning tree at the size it was
//! built. The gap between splitting at 100% and merging at 45%/90% keeps churn at a
//! boundary from splitting
//! and merging the same nodes again and again. When two internal nodes merge, the two
//! children that meet in the middle are merged too if one of them is underfull; so no
//! two underfull siblings ever sit side by side, which is what lets a tree that empties
//! shrink all the way: an internal root with one child is replaced by that child, and a
//! leaf root without records is freed.

use crate::disk::codec::Block;
use crate::disk::format::TreeRoot;
use crate::error::{Error, Result};

mod balance;
mod check;
mod dump;
mod node;

use balance::*;
pub(crate) use check::{blocks, leaf_records, owned_node};
pub use check::{check, salvage};
pub(crate) use dump::leaves;
use node::*;

/// Magic number of a B+tree node: the bytes "DXTN" on disk.
pub(crate) const BTREE_MAGIC: u32 = 0x4E54_5844;
/// Largest value a record may hold, in bytes.
pub(crate) const MAX_VALUE: usize = 1024;

/// Where the tree reads its nodes: the block cache (through a store handle), or a test
/// double.
pub trait NodeRead {
    /// A verified node block (the store checks crc/magic on load).
    fn node(&mut self, block: u64) -> Result<&Block>;
}

/// Where the tree keeps its nodes, for changes.
pub trait NodeStore: NodeRead {
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
    s: &mut (impl NodeRead + ?Sized),
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
    s: &mut (impl NodeRead + ?Sized),
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

/// The records of `b`, a leaf image for block `blk` under whatever owner it names; none
/// if its header or a slot breaks the rules (recovery reads the log's images with it).
pub(crate) fn image_leaf_records(b: &Block, blk: u64) -> Vec<(u64, &[u8])> {
    let owner = crate::disk::codec::get_u64(b, node::OFF_OWNER);
    hdr(b, blk, owner, 0).and_then(|h| collect(b, &h, blk)).unwrap_or_default()
}

/// Look up `key`.
#[cfg(test)]
pub(crate) fn get(s: &mut (impl NodeRead + ?Sized), t: &TreeRoot, owner: u64, key: u64) -> Result<Option<Vec<u8>>> {
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
/// Values longer than `MAX_VALUE` are `Error::Invalid`. On `NoSpace` the tree is unchanged.
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

/// Read, changing nothing, the nodes a removal of `key` is likely to touch: the path to
/// its leaf and the leaf's neighbours under the same parent, which a leaf left with too
/// few live bytes spreads over or merges with. A caller that puts its cache misses off
/// (`engine::deferred`) calls this before the removal, so that these blocks are read
/// with its locks let go instead of under them. (A rebalance that reaches further, or
/// above the leaves, still reads what it lacks where it stands.)
pub(crate) fn read_for_remove(s: &mut (impl NodeRead + ?Sized), t: &TreeRoot, owner: u64, key: u64) -> Result<()> {
    if is_empty(t)? {
        return Ok(());
    }
    let mut path = Vec::with_capacity(usize::from(t.depth));
    descend(s, t, owner, key, Some(&mut path))?;
    let Some(&(parent, idx)) = path.last() else { return Ok(()) };
    let (left, right) = {
        let b = s.node(parent)?;
        let h = hdr(b, parent, owner, 1)?;
        let left = if idx > 0 { Some(child(b, &h, parent, idx - 1)?) } else { None };
        let right = if idx + 1 < h.n { Some(child(b, &h, parent, idx + 1)?) } else { None };
        (left, right)
    };
    for n in [left, right].into_iter().flatten() {
        s.node(n)?;
    }
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

/// Visit records with key >= from in key order; the callback returns false to stop. No allocation per record.
pub fn scan(
    s: &mut (impl NodeRead + ?Sized),
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
    // Keys come out strictly increasing and from `from` on, or the tree is corrupt: a
    // caller that resumes after the last key it saw (a directory listing) must never be
    // sent back.
    let mut floor = from;
    let mut first_seen = false;
    loop {
        let b = s.node(leaf)?;
        let h = hdr(b, leaf, owner, 0)?;
        let (Ok(first) | Err(first)) = search(b, &h, leaf, from)?;
        for i in first..h.n {
            let (k, v) = record(b, &h, leaf, i)?;
            if k < floor || (first_seen && k == floor) {
                return Err(bad(leaf, format_args!("record {i}: key {k:#x} out of order after {floor:#x}")));
            }
            (floor, first_seen) = (k, true);
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
pub(crate) fn leaves_from(
    s: &mut (impl NodeRead + ?Sized),
    t: &TreeRoot,
    owner: u64,
    key: u64,
    n: usize,
) -> Result<Vec<u64>> {
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

/// A record read out of the tree: its key and a copy of its value.
pub(crate) type Record = (u64, Vec<u8>);

/// The record with the greatest key <= key (for extent maps).
pub(crate) fn floor(s: &mut (impl NodeRead + ?Sized), t: &TreeRoot, owner: u64, key: u64) -> Result<Option<Record>> {
    Ok(floors(s, t, owner, key, 1)?.pop())
}

/// Change in place the value of the record with the greatest key <= `key`, in one
/// descent: `change` is shown that record and the one before it in the same leaf (`None`
/// when the floor is its leaf's first record) and returns a value of the same length, or
/// `None` to change nothing. Returns whether the record changed; false also when there
/// is no floor in the leaf the key leads to (it may lie in the leaf before), so the
/// caller's general path decides. A same-length value leaves the tree's shape alone.
pub(crate) fn change_floor<V: AsRef<[u8]>>(
    s: &mut impl NodeStore,
    t: &TreeRoot,
    owner: u64,
    key: u64,
    change: impl FnOnce((u64, &[u8]), Option<(u64, &[u8])>) -> Result<Option<V>>,
) -> Result<bool> {
    if is_empty(t)? {
        return Ok(false);
    }
    let leaf = descend(s, t, owner, key, None)?;
    let (off, new) = {
        let b = s.node(leaf)?;
        let h = hdr(b, leaf, owner, 0)?;
        let i = match search(b, &h, leaf, key)? {
            Ok(i) => i,
            Err(0) => return Ok(false),
            Err(i) => i - 1,
        };
        let floor = record(b, &h, leaf, i)?;
        let before = match i {
            0 => None,
            _ => Some(record(b, &h, leaf, i - 1)?),
        };
        let Some(new) = change(floor, before)? else { return Ok(false) };
        if new.as_ref().len() != floor.1.len() {
            let n = new.as_ref().len();
            return Err(Error::Invalid(format!("btree value of {n} bytes in place of {}", floor.1.len())));
        }
        (rec_off(b, &h, leaf, i)? + REC_HDR, new)
    };
    let new = new.as_ref();
    s.node_mut(leaf)?[off..off + new.len()].copy_from_slice(new);
    Ok(true)
}

/// The record with the greatest key <= key, and the record before it: one descent where
/// `floor` and a `floor` of the key before would take two (extent maps asking for an
/// extent and its left neighbour).
pub(crate) fn floor_and_before(
    s: &mut (impl NodeRead + ?Sized),
    t: &TreeRoot,
    owner: u64,
    key: u64,
) -> Result<(Option<Record>, Option<Record>)> {
    let mut it = floors(s, t, owner, key, 2)?.into_iter();
    Ok((it.next(), it.next()))
}

/// Up to `n` records with keys <= key, nearest first, from one descent (and a step back
/// to earlier leaves where the leaf the key leads to holds fewer).
fn floors(s: &mut (impl NodeRead + ?Sized), t: &TreeRoot, owner: u64, key: u64, n: usize) -> Result<Vec<Record>> {
    let mut found = Vec::with_capacity(n);
    if is_empty(t)? {
        return Ok(found);
    }
    let mut path = Vec::with_capacity(usize::from(t.depth));
    let mut leaf = descend(s, t, owner, key, Some(&mut path))?;
    loop {
        let b = s.node(leaf)?;
        let h = hdr(b, leaf, owner, 0)?;
        // Records in this leaf with keys <= key (in an earlier leaf, all of them).
        let mut end = match search(b, &h, leaf, key)? {
            Ok(i) => i + 1,
            Err(i) => i,
        };
        while end > 0 && found.len() < n {
            let (k, v) = record(b, &h, leaf, end - 1)?;
            found.push((k, v.to_vec()));
            end -= 1;
        }
        if found.len() == n {
            return Ok(found);
        }
        // Separators are only lower bounds: the floor may sit in the previous leaf.
        match step(s, t, owner, &mut path, false)? {
            Some(prev) => leaf = prev,
            None => return Ok(found),
        }
    }
}

/// Free every block of the tree and reset it to empty.
pub(crate) fn destroy(s: &mut impl NodeStore, t: &mut TreeRoot, owner: u64) -> Result<()> {
    let all = blocks(s, t, owner)?;
    // Reset first: if a free fails, blocks leak instead of the tree pointing at freed ones.
    *t = TreeRoot::default();
    for b in all {
        s.free_node(b)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check::TreeStats;
    use super::*;
    use crate::disk::codec::{get_u16, get_u32, get_u64, put_u16, put_u64, BLOCK_SIZE};
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

    impl NodeRead for Mem {
        fn node(&mut self, block: u64) -> Result<&Block> {
            self.present(block)?;
            let b = &self.blocks[&block];
            if magic_of(b) != BTREE_MAGIC {
                return Err(Error::corrupt(format!("block {block}: bad magic")));
            }
            Ok(b)
        }
    }

    impl NodeStore for Mem {
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
        FloorAndBefore(u64),
        ChangeFloor(u64),
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
            1 => key().prop_map(Op::FloorAndBefore),
            1 => key().prop_map(Op::ChangeFloor),
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
                    Op::FloorAndBefore(k) => {
                        let mut below = model.range(..=k).rev().map(|(&k, v)| (k, v.clone()));
                        let want = (below.next(), below.next());
                        prop_assert_eq!(floor_and_before(&mut m, &t, OWNER, k).unwrap(), want);
                    }
                    Op::ChangeFloor(k) => {
                        // The floor and the record before it in its leaf, as shown.
                        let mut shown = None;
                        let changed = change_floor(&mut m, &t, OWNER, k, |(fk, fv), before| {
                            shown = Some(((fk, fv.to_vec()), before.map(|(bk, bv)| (bk, bv.to_vec()))));
                            Ok(Some(vec![salt; fv.len()]))
                        })
                        .unwrap();
                        let mut below = model.range(..=k).rev().map(|(&k, v)| (k, v.clone()));
                        let (floor, before) = (below.next(), below.next());
                        match shown {
                            Some((f, b)) => {
                                prop_assert!(changed);
                                prop_assert_eq!(Some(&f), floor.as_ref());
                                // None only where the floor opens its leaf.
                                prop_assert!(b.is_none() || b == before);
                                prop_assert!(t.depth > 1 || b == before);
                                model.insert(f.0, vec![salt; f.1.len()]);
                            }
                            None => {
                                prop_assert!(!changed);
                                prop_assert!(floor.is_none() || t.depth > 1);
                            }
                        }
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
