//! File data: the extent map (inline in the inode, or a B+tree when it outgrows the
//! inode), reads, and write-back of delayed-allocation pages.
//!
//! Writes land in memory as dirty pages; blocks are chosen only when the pages are
//! written back (at commit, or ahead of it by the flusher), so a file written in any
//! order comes out contiguous. Every write-back goes to fresh blocks (redirect on write)
//! and the old blocks are freed with the delta: committed data is never overwritten.
//!
//! This module is the extent map and preallocation; `read` plans and carries out reads,
//! `writeback` maps dirty pages to blocks and writes them.

use std::collections::BTreeMap;

use crate::disk::codec::*;
use crate::disk::format::*;
use crate::disk::valid::guard_data_write;
use crate::engine::btree;
use crate::engine::store::{MetaRead, Tx};
use crate::error::{Error, Result};

mod read;
mod writeback;

// The page pool, for the submodules (`super::pages`, as this module used it).
use super::pages;

pub(crate) use read::{dirty_in, plan_read, read, read_page, ReadPlan};
pub(crate) use writeback::{write_runs, writeback, DataWrite, InPlace};

/// Dirty pages of one file, by page index.
pub(crate) type Pages = BTreeMap<u64, Box<Block>>;

/// Decode an extent record of inode `ino`'s tree and check it (`disk::valid`): every
/// extent the file code uses has passed the rules.
pub(crate) fn extent_record(layout: &Layout, ino: u64, key: u64, value: &[u8]) -> Result<Extent> {
    Extent::decode_value(key, value)?.checked(layout, ino)
}

/// Extents overlapping logical blocks `[start, end)`, in order.
pub(crate) fn extents_in(
    st: &mut (impl MetaRead + ?Sized),
    inode: &Inode,
    start: u64,
    end: u64,
) -> Result<Vec<Extent>> {
    let mut out = Vec::new();
    let layout = st.store().sb.layout;
    match &inode.data {
        InodeData::Extents { ext, n } => {
            // read_inode checked these (Inode::check); the raw path of fsck did not.
            for e in &ext[..*n as usize] {
                e.check(&layout, inode.ino)?;
                if e.end() > start && e.logical < end {
                    out.push(*e);
                }
            }
        }
        InodeData::ExtentTree { tree, .. } => {
            let from = match btree::floor(st, tree, inode.ino, start)? {
                Some((k, v)) if extent_record(&layout, inode.ino, k, &v)?.end() > start => k,
                _ => start,
            };
            let mut err = None;
            btree::scan(st, tree, inode.ino, from, |k, v| {
                if k >= end {
                    return false;
                }
                // Checked before the overlap filter: an empty or wild extent is an error
                // wherever it lies, never a hole.
                match extent_record(&layout, inode.ino, k, v) {
                    Ok(e) => {
                        if e.end() > start {
                            out.push(e)
                        }
                        true
                    }
                    Err(e) => {
                        err = Some(e);
                        false
                    }
                }
            })?;
            if let Some(e) = err {
                return Err(e);
            }
        }
        InodeData::InlineSymlink(_) | InodeData::Dir(_) => {}
    }
    // Sorted by key; a record that overlaps the one before is as wrong as a wild one.
    for w in out.windows(2) {
        if w[1].logical < w[0].end() {
            return Err(Error::corrupt(format!(
                "inode {}: extents overlap at logical block {}",
                inode.ino, w[1].logical
            )));
        }
    }
    Ok(out)
}

/// Every extent record of the file as stored, without the validity rules (fsck, which
/// checks them itself so that it can drop the bad ones).
pub(crate) fn raw_extents(st: &mut (impl MetaRead + ?Sized), inode: &Inode) -> Result<Vec<Extent>> {
    match &inode.data {
        InodeData::Extents { ext, n } => Ok(ext[..usize::from(*n)].to_vec()),
        InodeData::ExtentTree { tree, .. } => {
            let mut out = Vec::new();
            let mut err = None;
            btree::scan(st, tree, inode.ino, 0, |k, v| match Extent::decode_value(k, v) {
                Ok(e) => {
                    out.push(e);
                    true
                }
                Err(e) => {
                    err = Some(e);
                    false
                }
            })?;
            err.map_or(Ok(out), Err)
        }
        InodeData::InlineSymlink(_) | InodeData::Dir(_) => Ok(Vec::new()),
    }
}

/// Remove extent records `bad` (as `raw_extents` gave them) from the map, freeing
/// nothing: their blocks were never the file's (fsck's repair of a bad extent: the range
/// becomes a hole).
pub(crate) fn drop_extent_records(st: &mut Tx, inode: &mut Inode, bad: &[Extent]) -> Result<()> {
    let mark = st.usage_mark();
    let ino = inode.ino;
    match &mut inode.data {
        InodeData::Extents { ext, n } => {
            let list: Vec<Extent> = ext[..usize::from(*n)].iter().filter(|e| !bad.contains(e)).copied().collect();
            set_inline(inode, &list);
        }
        InodeData::ExtentTree { tree, count } => {
            for e in bad {
                if btree::remove(st, tree, ino, e.logical)?.is_some() {
                    *count = count.saturating_sub(1);
                }
            }
        }
        _ => return Err(Error::Invalid("not a file".into())),
    }
    st.account(&mut inode.blocks, mark);
    Ok(())
}

/// Give extent `e` (as `raw_extents` gave it) its own copies of the blocks `shared`,
/// which another extent claims too (fsck's repair of a block owned twice as data). The
/// other blocks stay mapped where they are; a shared block the volume has no room to copy
/// becomes a hole. The file's block count does not change: it maps as many blocks.
pub(crate) fn clone_shared(st: &mut Tx, inode: &mut Inode, e: Extent, shared: &[u64]) -> Result<()> {
    let shared: std::collections::HashSet<u64> = shared.iter().copied().collect();
    let is_shared = |b: u64| shared.contains(&b);
    drop_extent_records(st, inode, &[e])?;
    let mark = st.usage_mark();
    let layout = st.store().sb.layout;
    let dev = st.store().dev().clone();
    let (mut copied, mut holed) = (0u64, 0u64);
    let mut at = 0u64;
    while at < e.len {
        let run_shared = is_shared(e.phys + at);
        let len = (at..e.len).take_while(|&k| is_shared(e.phys + k) == run_shared).count() as u64;
        if !run_shared {
            map(st, inode, Extent { logical: e.logical + at, len, phys: e.phys + at, ..e })?;
            at += len;
            continue;
        }
        let mut done = 0;
        while done < len {
            let goal = goal_for(st, inode, e.logical + at + done)?;
            let Some((phys, n)) = st.alloc(goal, len - done, 1) else {
                tracing::warn!(
                    ino = inode.ino,
                    logical = e.logical + at + done,
                    "no room to copy shared blocks: a hole"
                );
                holed += len - done;
                break;
            };
            if !e.unwritten {
                guard_data_write(&layout, phys, n)?;
                let mut buf = vec![0u8; BLOCK_SIZE];
                for k in 0..n {
                    dev.read(e.phys + at + done + k, &mut buf)?;
                    dev.write_data(phys + k, &buf)?;
                }
            }
            map(st, inode, Extent { logical: e.logical + at + done, len: n, phys, ..e })?;
            copied += n;
            done += n;
        }
        at += len;
    }
    st.account(&mut inode.blocks, mark);
    inode.blocks = inode.blocks.saturating_sub(copied + holed);
    Ok(())
}

/// Every extent of the file (fsck, truncate of the whole file).
pub(crate) fn all_extents(st: &mut Tx, inode: &Inode) -> Result<Vec<Extent>> {
    extents_in(st, inode, 0, 1 << 32)
}

fn set_inline(inode: &mut Inode, list: &[Extent]) {
    let mut ext = [Extent::default(); INLINE_EXTENTS];
    ext[..list.len()].copy_from_slice(list);
    inode.data = InodeData::Extents { ext, n: list.len() as u8 };
}

/// Replace the extents overlapping `[start,end)` (`old`, as returned by `extents_in`)
/// with `new` (sorted, inside the same span or its remainders).
fn replace(st: &mut Tx, inode: &mut Inode, old: &[Extent], new: &[Extent]) -> Result<()> {
    let ino = inode.ino;
    match &mut inode.data {
        InodeData::Extents { ext, n } => {
            let mut list: Vec<Extent> = ext[..*n as usize].iter().filter(|e| !old.contains(e)).copied().collect();
            list.extend_from_slice(new);
            list.sort_by_key(|e| e.logical);
            if list.len() <= INLINE_EXTENTS {
                set_inline(inode, &list);
            } else {
                let mut tree = TreeRoot::default();
                for e in &list {
                    btree::insert(st, &mut tree, ino, e.logical, &e.encode_value(), false)?;
                }
                inode.data = InodeData::ExtentTree { tree, count: list.len() as u32 };
            }
        }
        InodeData::ExtentTree { tree, count } => {
            for e in old {
                btree::remove(st, tree, ino, e.logical)?;
            }
            for e in new {
                btree::insert(st, tree, ino, e.logical, &e.encode_value(), false)?;
            }
            // The stored count is only what the tree says it holds: a wrong one must not wrap.
            *count = u32::try_from((*count as usize + new.len()).saturating_sub(old.len())).unwrap_or(u32::MAX);
            if (*count as usize) <= INLINE_EXTENTS / 2 {
                // Shrink back into the inode, if the tree agrees: a damaged count may
                // say few where there are many, and then the tree's own number is kept.
                let t = *tree;
                let list = all_extents(st, inode)?;
                if list.len() <= INLINE_EXTENTS {
                    let mut t2 = t;
                    btree::destroy(st, &mut t2, ino)?;
                    set_inline(inode, &list);
                } else if let InodeData::ExtentTree { count, .. } = &mut inode.data {
                    *count = u32::try_from(list.len()).unwrap_or(u32::MAX);
                }
            }
        }
        _ => return Err(Error::Invalid("not a file".into())),
    }
    Ok(())
}

/// Unmap logical blocks `[start, end)`, freeing their blocks with the delta.
pub(crate) fn punch(st: &mut Tx, inode: &mut Inode, start: u64, end: u64) -> Result<()> {
    let mark = st.usage_mark();
    unmap(st, inode, start, end)?;
    st.account(&mut inode.blocks, mark);
    Ok(())
}

/// `punch` without the block accounting (for callers that account themselves).
fn unmap(st: &mut Tx, inode: &mut Inode, start: u64, end: u64) -> Result<()> {
    if start >= end {
        return Ok(());
    }
    let old = extents_in(st, inode, start, end)?;
    if old.is_empty() {
        return Ok(());
    }
    let mut new = Vec::new();
    for e in &old {
        let cut_s = e.logical.max(start);
        let cut_e = e.end().min(end);
        free_data(st, inode.ino, e.phys + (cut_s - e.logical), cut_e - cut_s, !e.unwritten);
        if e.logical < start {
            new.push(Extent { len: start - e.logical, ..*e });
        }
        if e.end() > end {
            new.push(Extent {
                logical: end,
                len: e.end() - end,
                phys: e.phys + (end - e.logical),
                unwritten: e.unwritten,
            });
        }
    }
    replace(st, inode, &old, &new)
}

/// Map a new extent over a hole, merging with the extent that ends where it starts.
fn map(st: &mut Tx, inode: &mut Inode, e: Extent) -> Result<()> {
    // The extent just before, if it ends where this one starts: one descent.
    if let Some(l) = extent_before(st, inode, e.logical)? {
        if l.end() == e.logical && l.phys + l.len == e.phys && l.unwritten == e.unwritten && l.len + e.len < 1 << 31 {
            let merged = Extent { len: l.len + e.len, ..l };
            return replace(st, inode, &[l], &[merged]);
        }
    }
    replace(st, inode, &[], &[e])
}

/// Move every extent at or after logical block `from` by `delta` blocks (collapse and
/// insert range); an extent that straddles `from` is split there first. The caller makes
/// sure the blocks the extents move onto are a hole.
pub(crate) fn shift(st: &mut Tx, inode: &mut Inode, from: u64, delta: i64) -> Result<()> {
    let mark = st.usage_mark();
    if let Some(e) = extents_in(st, inode, from, from + 1)?.first().copied() {
        if e.logical < from {
            let left = Extent { len: from - e.logical, ..e };
            let right = Extent { logical: from, len: e.end() - from, phys: e.phys + (from - e.logical), ..e };
            replace(st, inode, &[e], &[left, right])?;
        }
    }
    let old = extents_in(st, inode, from, MAX_FILE_SIZE / BLOCK_SIZE as u64 + 1)?;
    let mut new = Vec::with_capacity(old.len());
    for e in &old {
        let logical = e.logical.checked_add_signed(delta).ok_or(Error::FileTooBig)?;
        new.push(Extent { logical, ..*e });
    }
    replace(st, inode, &old, &new)?;
    st.account(&mut inode.blocks, mark);
    Ok(())
}

/// Number of extents that end after logical block `from` (what a shift moves).
pub(crate) fn extents_after(st: &mut Tx, inode: &Inode, from: u64) -> Result<u64> {
    Ok(extents_in(st, inode, from, MAX_FILE_SIZE / BLOCK_SIZE as u64 + 1)?.len() as u64)
}

/// Where the data of logical block `lblk` should go: right after the block mapped
/// just before it, or near the inode.
fn goal_for(st: &mut Tx, inode: &Inode, lblk: u64) -> Result<u64> {
    if let Some(e) = extent_before(st, inode, lblk)? {
        return Ok(e.phys + e.len + lblk.saturating_sub(e.end()).min(64));
    }
    Ok(ino_loc(inode.ino).0 + 1)
}

/// Whether logical block `p` is mapped (written or preallocated): one tree descent.
pub(crate) fn is_mapped(st: &mut Tx, inode: &Inode, p: u64) -> Result<bool> {
    Ok(extent_before(st, inode, p + 1)?.is_some_and(|e| e.end() > p))
}

/// The block holding logical block `p`, when a written extent maps it (an overwrite of
/// it may go in place: `writeback::InPlace`). Never a block that holds metadata, in
/// memory or on the device (`Store::overwritable_data`): the extent is wild, and the page
/// goes to a fresh block instead ([`free_data`] leaves the metadata alone).
pub(crate) fn written_block(st: &mut Tx, inode: &Inode, p: u64) -> Result<Option<u64>> {
    let b = extent_before(st, inode, p + 1)?.filter(|e| e.end() > p && !e.unwritten).map(|e| e.phys + (p - e.logical));
    st.let_go();
    match b {
        Some(b) if st.store().overwritable_data(b)? => Ok(Some(b)),
        _ => Ok(None),
    }
}

/// Longest run of an orphan's file data [`free_data`] reads before freeing (16 MiB).
const VERIFY_FREE_MAX: u64 = 4096;

/// Free file data blocks `[phys, phys + len)` with the delta, but none that memory holds
/// as metadata: the allocator never gave such a block to a file, so a wild extent
/// mapped it, and freeing it would hand live metadata out again. fsck finds the rest.
pub(super) fn free_data(st: &mut Tx, ino: u64, phys: u64, len: u64, written: bool) {
    let end = phys + len;
    let mut at = phys;
    st.let_go();
    st.store().forget_checked_data(phys, len);
    // An orphan freed at open: its extents came from disk unchecked, and metadata memory
    // does not hold yet is found only by reading (runs ≤ 16 MiB, ≤ 256 MiB an open: past
    // that blocks are trusted, as every other deletion's are). Written extents only: an
    // unwritten one's blocks keep whatever they held before, stale metadata included.
    if written && len <= VERIFY_FREE_MAX && st.store().take_verify_budget(len) {
        if let Err(e) = st.store().find_wild(phys, len) {
            tracing::error!(
                "inode {ino}: cannot read blocks {phys}..{end} to check them ({e}): not freed (run dxfs fsck)"
            );
            return;
        }
    }
    while at < end {
        let Some(b) = st.store().holds_metadata(at, end - at) else {
            st.free_deferred(at, end - at);
            return;
        };
        if b > at {
            st.free_deferred(at, b - at);
        }
        tracing::error!("inode {ino}: an extent maps block {b}, which holds metadata: not freed (run dxfs fsck)");
        at = b + 1;
    }
}

/// The last extent that starts before logical block `lblk`: one tree descent, not a scan
/// from the start of the file (write-back asks this once per run of pages).
fn extent_before(st: &mut Tx, inode: &Inode, lblk: u64) -> Result<Option<Extent>> {
    if lblk == 0 {
        return Ok(None);
    }
    match &inode.data {
        InodeData::Extents { ext, n } => Ok(ext[..*n as usize].iter().rev().find(|e| e.logical < lblk).copied()),
        InodeData::ExtentTree { tree, .. } => match btree::floor(st, tree, inode.ino, lblk - 1)? {
            Some((k, v)) => Ok(Some(extent_record(&st.store().sb.layout, inode.ino, k, &v)?)),
            None => Ok(None),
        },
        _ => Ok(None),
    }
}

/// Allocate unwritten extents over the holes of `[start, end)` (fallocate), at most
/// `max_blocks` blocks, stopping early once the delta's dirty metadata reaches
/// `meta_limit` blocks. Returns the logical block reached: `end` when done.
pub(crate) fn preallocate(
    st: &mut Tx,
    inode: &mut Inode,
    start: u64,
    end: u64,
    max_blocks: u64,
    meta_limit: usize,
) -> Result<u64> {
    let mark = st.usage_mark();
    let mut at = start;
    let mut budget = max_blocks;
    let existing = extents_in(st, inode, start, end)?;
    let mut holes = Vec::new();
    for e in &existing {
        if e.logical > at {
            holes.push((at, e.logical));
        }
        at = at.max(e.end());
    }
    if at < end {
        holes.push((at, end));
    }
    let mut reached = end;
    'holes: for (s, e) in holes {
        let mut done = s;
        while done < e {
            if budget == 0 || st.store().dirty_count() + st.space().dirty_blocks() >= meta_limit {
                reached = done;
                break 'holes;
            }
            let goal = goal_for(st, inode, done)?;
            let (phys, len) = st.alloc(goal, (e - done).min(budget), 1).ok_or(Error::NoSpace)?;
            map(st, inode, Extent { logical: done, len, phys, unwritten: true })?;
            done += len;
            budget -= len;
        }
    }
    st.account(&mut inode.blocks, mark);
    Ok(reached)
}

/// Free every block of a file (its last link and last open handle are gone).
pub(crate) fn free_all(st: &mut Tx, inode: &mut Inode) -> Result<()> {
    punch(st, inode, 0, 1 << 32)
}
