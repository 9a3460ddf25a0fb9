//! File data: the extent map (inline in the inode, or a B+tree when it outgrows the
//! inode), reads, and write-back of delayed-allocation pages.
//!
//! Writes land in memory as dirty pages; blocks are chosen only when the pages are
//! written back (at commit, or earlier under memory pressure), so a file written in any
//! order comes out contiguous. Every write-back goes to fresh blocks (redirect on write)
//! and the old blocks are freed with the delta: committed data is never overwritten.

use std::collections::BTreeMap;

use crate::disk::codec::*;
use crate::disk::device::AlignedBuf;
use crate::disk::format::*;
use crate::engine::btree;
use crate::engine::store::{MetaRead, Store};
use crate::error::{Error, Result};

/// Dirty pages of one file, by page index.
pub type Pages = BTreeMap<u64, Box<Block>>;

/// Extents overlapping logical blocks `[start, end)`, in order.
pub fn extents_in(st: &mut (impl MetaRead + ?Sized), inode: &Inode, start: u64, end: u64) -> Result<Vec<Extent>> {
    let mut out = Vec::new();
    match &inode.data {
        InodeData::Extents { ext, n } => {
            for e in &ext[..*n as usize] {
                if e.end() > start && e.logical < end {
                    out.push(*e);
                }
            }
        }
        InodeData::ExtentTree { tree, .. } => {
            let from = match btree::floor(st, tree, inode.ino, start)? {
                Some((k, v)) if Extent::decode_value(k, &v)?.end() > start => k,
                _ => start,
            };
            let mut err = None;
            btree::scan(st, tree, inode.ino, from, |k, v| {
                if k >= end {
                    return false;
                }
                match Extent::decode_value(k, v) {
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
    for e in &out {
        if e.len == 0
            || e.end() > 1 << 32
            || e.phys < st.store().sb.layout.first_free()
            || e.phys + e.len > st.store().sb.layout.block_count
        {
            return Err(Error::corrupt(format!("inode {}: extent {e:?} out of range", inode.ino)));
        }
    }
    Ok(out)
}

/// Every extent of the file (fsck, truncate of the whole file).
pub fn all_extents(st: &mut Store, inode: &Inode) -> Result<Vec<Extent>> {
    extents_in(st, inode, 0, 1 << 32)
}

fn set_inline(inode: &mut Inode, list: &[Extent]) {
    let mut ext = [Extent::default(); INLINE_EXTENTS];
    ext[..list.len()].copy_from_slice(list);
    inode.data = InodeData::Extents { ext, n: list.len() as u8 };
}

/// Replace the extents overlapping `[start,end)` (`old`, as returned by `extents_in`)
/// with `new` (sorted, inside the same span or its remainders).
fn replace(st: &mut Store, inode: &mut Inode, old: &[Extent], new: &[Extent]) -> Result<()> {
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
            *count = (*count as usize + new.len() - old.len()) as u32;
            if (*count as usize) <= INLINE_EXTENTS / 2 {
                // Shrink back into the inode.
                let t = *tree;
                let list = all_extents(st, inode)?;
                let mut t2 = t;
                btree::destroy(st, &mut t2, ino)?;
                set_inline(inode, &list);
            }
        }
        _ => return Err(Error::Invalid("not a file".into())),
    }
    Ok(())
}

/// Unmap logical blocks `[start, end)`, freeing their blocks with the delta.
pub fn punch(st: &mut Store, inode: &mut Inode, start: u64, end: u64) -> Result<()> {
    let mark = st.usage_mark();
    unmap(st, inode, start, end)?;
    st.account(&mut inode.blocks, mark);
    Ok(())
}

/// `punch` without the block accounting (for callers that account themselves).
fn unmap(st: &mut Store, inode: &mut Inode, start: u64, end: u64) -> Result<()> {
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
        st.space.free_deferred(e.phys + (cut_s - e.logical), cut_e - cut_s);
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
fn map(st: &mut Store, inode: &mut Inode, e: Extent) -> Result<()> {
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
pub fn shift(st: &mut Store, inode: &mut Inode, from: u64, delta: i64) -> Result<()> {
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
pub fn extents_after(st: &mut Store, inode: &Inode, from: u64) -> Result<u64> {
    Ok(extents_in(st, inode, from, MAX_FILE_SIZE / BLOCK_SIZE as u64 + 1)?.len() as u64)
}

/// Where the data of logical block `lblk` should go: right after the block mapped
/// just before it, or near the inode.
fn goal_for(st: &mut Store, inode: &Inode, lblk: u64) -> Result<u64> {
    if let Some(e) = extent_before(st, inode, lblk)? {
        return Ok(e.phys + e.len + lblk.saturating_sub(e.end()).min(64));
    }
    Ok(ino_loc(inode.ino).0 + 1)
}

/// Whether logical block `p` is mapped (written or preallocated): one tree descent.
pub fn is_mapped(st: &mut Store, inode: &Inode, p: u64) -> Result<bool> {
    Ok(extent_before(st, inode, p + 1)?.is_some_and(|e| e.end() > p))
}

/// The last extent that starts before logical block `lblk`: one tree descent, not a scan
/// from the start of the file (write-back asks this once per run of pages).
fn extent_before(st: &mut Store, inode: &Inode, lblk: u64) -> Result<Option<Extent>> {
    if lblk == 0 {
        return Ok(None);
    }
    match &inode.data {
        InodeData::Extents { ext, n } => Ok(ext[..*n as usize].iter().rev().find(|e| e.logical < lblk).copied()),
        InodeData::ExtentTree { tree, .. } => match btree::floor(st, tree, inode.ino, lblk - 1)? {
            Some((k, v)) => Ok(Some(Extent::decode_value(k, &v)?)),
            None => Ok(None),
        },
        _ => Ok(None),
    }
}

/// File data on its way to the device: `pages` go to consecutive blocks from `phys`.
/// Write-back maps the blocks at once and leaves the writing to its caller, which does
/// it without the volume lock and before the delta that maps them can commit.
pub struct DataWrite {
    pub phys: u64,
    /// The run's dirty pages, by page number (consecutive): split off the file's dirty
    /// pages whole, so taking a run under the volume lock does not touch each page.
    pub pages: Pages,
}

/// Write runs of file data, those that lie side by side on the device together, in
/// requests of at most `piece` pages; each run is freed once written, and `written` is
/// told the pages and the runs done after each request.
pub fn write_runs(
    dev: &dyn crate::disk::device::BlockDevice,
    runs: Vec<DataWrite>,
    piece: usize,
    mut written: impl FnMut(u64, u64),
) -> Result<()> {
    // A buffer as large as the largest request, not the largest possible one: a commit of
    // one page should not clear 4 MiB.
    let piece = piece.max(1);
    let (mut largest, mut group, mut end) = (0usize, 0usize, None);
    for r in &runs {
        group = if end == Some(r.phys) { group + r.pages.len() } else { r.pages.len() };
        end = Some(r.phys + r.pages.len() as u64);
        largest = largest.max(group.min(piece));
    }
    let mut buf = AlignedBuf::new(largest * BLOCK_SIZE);
    let mut runs = runs.into_iter().peekable();
    // The request being filled: its first block and its pages so far.
    let (mut start, mut n) = (0u64, 0usize);
    let mut pages_in = 0u64;
    let mut runs_in = 0u64;
    while let Some(run) = runs.next() {
        let mut pages = run.pages.values();
        let mut at = run.phys;
        loop {
            if n > 0 && (at != start + n as u64 || n == piece) {
                dev.write_data(start, &buf[..n * BLOCK_SIZE])?;
                written(pages_in, std::mem::take(&mut runs_in));
                (n, pages_in) = (0, 0);
            }
            let Some(p) = pages.next() else { break };
            if n == 0 {
                start = at;
            }
            buf[n * BLOCK_SIZE..(n + 1) * BLOCK_SIZE].copy_from_slice(&p[..]);
            n += 1;
            pages_in += 1;
            at += 1;
        }
        runs_in += 1;
        // Written (or copied into the request being filled): the pages can be reused.
        super::pages::recycle(run.pages.into_values());
        // The next run continues this request only if it starts where this one ended.
        if runs.peek().is_none_or(|r| r.phys != at) && n > 0 {
            dev.write_data(start, &buf[..n * BLOCK_SIZE])?;
            written(pages_in, std::mem::take(&mut runs_in));
            (n, pages_in) = (0, 0);
        }
    }
    Ok(())
}

/// Write back dirty pages: allocate fresh blocks for each run of consecutive pages and
/// remap; the data itself goes to `out`, for the caller to write before the delta commits.
/// The blocks were charged to the delta when the pages were dirtied. Works one allocated
/// fragment at a time and stops early, leaving the rest in `pages`, once the delta's dirty
/// metadata reaches `meta_limit` blocks, so the caller can commit and go on: every
/// intermediate state maps each page either to its old block or to its new one, whose
/// data is in `out`. Returns the number of pages written back.
pub fn writeback(
    st: &mut Store,
    inode: &mut Inode,
    pages: &mut Pages,
    meta_limit: usize,
    out: &mut Vec<DataWrite>,
) -> Result<u64> {
    let mark = st.usage_mark();
    let mut written = 0u64;
    // Runs take their blocks one after another from a *pool*: a free extent of at least
    // `POOL_MIN` blocks (when there is one) sized for all the pages left. The scattered
    // pages of random overwrites then land side by side and go out as a few large device
    // requests (`write_runs`), instead of filling the one-block holes their own earlier
    // overwrites left behind, one small request each.
    let mut pool: Option<(u64, u64)> = None;
    let mut next_goal = None;
    let r = loop {
        let Some((&p0, _)) = pages.first_key_value() else { break Ok(()) };
        if st.dirty_count() + st.space.dirty_blocks() >= meta_limit {
            break Ok(());
        }
        // The run of consecutive pages from p0 (at most 8192), walked in key order.
        let mut n = 1u64;
        for &p in pages.keys().skip(1) {
            if n == 8192 || p != p0 + n {
                break;
            }
            n += 1;
        }
        if pool.is_none() {
            let goal = match next_goal {
                Some(g) => g,
                None => match goal_for(st, inode, p0) {
                    Ok(g) => g,
                    Err(e) => break Err(e),
                },
            };
            let want = pages.len() as u64;
            let got = st.space.alloc(goal, want, want.min(POOL_MIN)).or_else(|| st.space.alloc(goal, n, 1));
            let Some(got) = got else { break Err(Error::NoSpace) };
            pool = Some(got);
        }
        let (phys, left) = pool.expect("a pool was just taken");
        let len = n.min(left);
        pool = (left > len).then_some((phys + len, left - len));
        next_goal = Some(phys + len);
        // Split the run off whole: what is left starts after it.
        let rest = pages.split_off(&(p0 + len));
        let run = std::mem::replace(pages, rest);
        out.push(DataWrite { phys, pages: run });
        let mut remap = || {
            if len == 1 && remap_one(st, inode, p0, phys)? {
                return Ok(());
            }
            unmap(st, inode, p0, p0 + len)?;
            map(st, inode, Extent { logical: p0, len, phys, unwritten: false })
        };
        let mapped = remap();
        if let Err(e) = mapped {
            break Err(e);
        }
        written += len;
    };
    // What the pool has left was never referenced: free again at once.
    if let Some((phys, left)) = pool {
        st.space.free_now(phys, left);
    }
    st.account(&mut inode.blocks, mark);
    r.map(|()| written)
}

/// Write-back of one page over a written page of a file whose extents are in a tree:
/// the extent holding it gives up that block with its records changed in place where the
/// key stays (`insert` with replace), not removed and inserted again. One to three tree
/// descents instead of about seven (the scattered pages of random overwrites are nearly
/// all such runs). Returns false, having changed nothing, when the general path must do
/// it: no tree, a hole, an unwritten extent, or a tree about to shrink into the inode.
fn remap_one(st: &mut Store, inode: &mut Inode, p: u64, phys: u64) -> Result<bool> {
    let ino = inode.ino;
    let InodeData::ExtentTree { tree, count } = &inode.data else { return Ok(false) };
    // Far from the size at which `replace` moves the extents back into the inode.
    if (*count as usize) <= INLINE_EXTENTS / 2 + 2 {
        return Ok(false);
    }
    let Some((k, v)) = btree::floor(st, tree, ino, p)? else { return Ok(false) };
    let e = Extent::decode_value(k, &v)?;
    if e.end() <= p || e.unwritten {
        return Ok(false);
    }
    // The page just before, when this one starts the extent: the new block may follow
    // its block on the device (write-back's goal is right after it), and then they merge.
    let left = match e.logical == p {
        true => extent_before(st, inode, p)?
            .filter(|l| l.end() == p && l.phys + l.len == phys && !l.unwritten && l.len + 1 < 1 << 31),
        false => None,
    };
    let InodeData::ExtentTree { tree, count } = &mut inode.data else { return Ok(false) };
    let put = |st: &mut Store, tree: &mut TreeRoot, x: Extent, replace: bool| {
        btree::insert(st, tree, ino, x.logical, &x.encode_value(), replace)
    };
    match left {
        Some(l) => {
            btree::remove(st, tree, ino, p)?;
            *count -= 1;
            put(st, tree, Extent { len: l.len + 1, ..l }, true)?;
        }
        None if e.logical == p => put(st, tree, Extent { logical: p, len: 1, phys, unwritten: false }, true)?,
        None => {
            put(st, tree, Extent { len: p - e.logical, ..e }, true)?;
            put(st, tree, Extent { logical: p, len: 1, phys, unwritten: false }, false)?;
            *count += 1;
        }
    }
    if e.end() > p + 1 {
        let rest = p + 1 - e.logical;
        put(st, tree, Extent { logical: p + 1, len: e.len - rest, phys: e.phys + rest, unwritten: false }, false)?;
        *count += 1;
    }
    st.space.free_deferred(e.phys + (p - e.logical), 1);
    Ok(true)
}

/// Smallest free extent write-back takes blocks from while one exists (64 KiB).
const POOL_MIN: u64 = 16;

/// Allocate unwritten extents over the holes of `[start, end)` (fallocate), at most
/// `max_blocks` blocks, stopping early once the delta's dirty metadata reaches
/// `meta_limit` blocks. Returns the logical block reached: `end` when done.
pub fn preallocate(
    st: &mut Store,
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
            if budget == 0 || st.dirty_count() + st.space.dirty_blocks() >= meta_limit {
                reached = done;
                break 'holes;
            }
            let goal = goal_for(st, inode, done)?;
            let (phys, len) = st.space.alloc(goal, (e - done).min(budget), 1).ok_or(Error::NoSpace)?;
            map(st, inode, Extent { logical: done, len, phys, unwritten: true })?;
            done += len;
            budget -= len;
        }
    }
    st.account(&mut inode.blocks, mark);
    Ok(reached)
}

/// A read worked out under the volume lock and carried out without it: the device runs
/// to read and copies of the dirty pages that overlay them.
pub struct ReadPlan {
    offset: u64,
    len: usize,
    /// (first page, physical block, pages)
    runs: Vec<(u64, u64, u64)>,
    dirty: Vec<(u64, Box<Block>)>,
}

/// Plan reading `len` bytes at `offset` (already clipped to the file size).
pub fn plan_read(
    st: &mut (impl MetaRead + ?Sized),
    inode: &Inode,
    dirty: Option<&Pages>,
    offset: u64,
    len: usize,
) -> Result<ReadPlan> {
    let mut plan = ReadPlan { offset, len, runs: Vec::new(), dirty: Vec::new() };
    if len == 0 {
        return Ok(plan);
    }
    let first = offset / BLOCK_SIZE as u64;
    let last = (offset + len as u64 - 1) / BLOCK_SIZE as u64;
    for e in extents_in(st, inode, first, last + 1)? {
        if !e.unwritten {
            let s = e.logical.max(first);
            let t = e.end().min(last + 1);
            plan.runs.push((s, e.phys + (s - e.logical), t - s));
        }
    }
    if let Some(d) = dirty {
        plan.dirty = d.range(first..=last).map(|(p, b)| (*p, b.clone())).collect();
    }
    Ok(plan)
}

impl ReadPlan {
    /// The bytes the plan reads.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Carry the plan out: one device request per mapped run, then the dirty pages.
    pub fn execute(&self, dev: &dyn crate::disk::device::BlockDevice) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len];
        self.execute_into(dev, &mut out)?;
        Ok(out)
    }

    /// [`ReadPlan::execute`] into `out` (`len` bytes; holes are zeroed, whatever `out`
    /// held). A run of whole pages lands straight in `out` when that part of it is aligned as
    /// `O_DIRECT` wants (an [`AlignedBuf`] and a page-aligned offset); others go through a
    /// bounce buffer.
    pub fn execute_into(&self, dev: &dyn crate::disk::device::BlockDevice, out: &mut [u8]) -> Result<()> {
        let (offset, len) = (self.offset, self.len);
        assert_eq!(out.len(), len, "a plan fills exactly its length");
        // Copy page `p`'s bytes (given as a full block) into the output.
        let place = |out: &mut [u8], p: u64, data: &[u8]| {
            let page_start = p * BLOCK_SIZE as u64;
            let from = offset.max(page_start);
            let to = (offset + len as u64).min(page_start + BLOCK_SIZE as u64);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - page_start) as usize..(to - page_start) as usize]);
        };
        let bs = BLOCK_SIZE as u64;
        let mut whole: Option<AlignedBuf> = None;
        // Bytes of `out` before this are written or zeroed: holes read as zeros.
        let mut covered = 0usize;
        for &(first, phys, n) in &self.runs {
            let from = ((first * bs).max(offset) - offset) as usize;
            if from > covered {
                out[covered..from].fill(0);
            }
            covered = covered.max((((first + n) * bs).min(offset + len as u64) - offset) as usize);
            // Whole pages inside the request, at an aligned place in `out`: no bounce.
            if offset % bs == 0 && (first + n) * bs <= offset + len as u64 {
                let at = (first * bs - offset) as usize;
                let dst = &mut out[at..at + n as usize * BLOCK_SIZE];
                if dst.as_ptr().align_offset(BLOCK_SIZE) == 0 {
                    dev.read_data(phys, dst)?;
                    continue;
                }
            }
            let most = self.runs.iter().map(|r| r.2 as usize).max().unwrap_or(0);
            let whole = whole.get_or_insert_with(|| AlignedBuf::new(most * BLOCK_SIZE));
            let buf = &mut whole[..n as usize * BLOCK_SIZE];
            dev.read_data(phys, buf)?;
            for p in first..first + n {
                let k = (p - first) as usize * BLOCK_SIZE;
                place(out, p, &buf[k..k + BLOCK_SIZE]);
            }
        }
        out[covered..].fill(0);
        for (p, data) in &self.dirty {
            place(out, *p, &data[..]);
        }
        Ok(())
    }
}

/// Read `len` bytes at `offset` (already clipped to the file size), dirty pages first.
pub fn read(st: &mut Store, inode: &Inode, dirty: Option<&Pages>, offset: u64, len: usize) -> Result<Vec<u8>> {
    plan_read(st, inode, dirty, offset, len)?.execute(&**st.dev())
}

/// The current content of page `p` (for read-modify-write of a partial page).
pub fn read_page(st: &mut Store, inode: &Inode, p: u64) -> Result<Box<Block>> {
    let mut b = super::pages::zeroed();
    if let Some(e) = extents_in(st, inode, p, p + 1)?.first() {
        if !e.unwritten {
            st.dev().read_data(e.phys + (p - e.logical), &mut b[..])?;
        }
    }
    Ok(b)
}

/// Free every block of a file (its last link and last open handle are gone).
pub fn free_all(st: &mut Store, inode: &mut Inode) -> Result<()> {
    punch(st, inode, 0, 1 << 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::device::{BlockDevice, MemDevice};

    /// A run of `n` pages from logical page `lp`, at block `phys`, page k filled with
    /// byte `tag + k`.
    fn run(phys: u64, lp: u64, n: u64, tag: u8) -> DataWrite {
        let pages = (0..n).map(|k| (lp + k, Box::new([tag.wrapping_add(k as u8); BLOCK_SIZE]))).collect();
        DataWrite { phys, pages }
    }

    /// Runs side by side on the device go out as one request, up to the piece size;
    /// every page lands where its run says, and the callback counts pages and runs.
    #[test]
    fn write_runs_joins_neighbours_and_splits_pieces() {
        let dev = MemDevice::new(64);
        // 10..12 and 12..13 touch, 20..25 stands alone, 25..26 touches it.
        let runs = vec![run(10, 0, 2, 1), run(12, 7, 1, 50), run(20, 3, 5, 100), run(25, 40, 1, 200)];
        let (mut pages, mut done) = (0, 0);
        let mut calls = 0;
        write_runs(&dev, runs, 4, |p, r| {
            pages += p;
            done += r;
            calls += 1;
        })
        .unwrap();
        assert_eq!((pages, done), (9, 4));
        // [10, 11, 12] in one request; [20..24] split at 4 pages: [20..23], [24, 25].
        assert_eq!((dev.stats().writes, calls), (3, 3));
        let mut b = [0u8; BLOCK_SIZE];
        for (block, byte) in [(10, 1), (11, 2), (12, 50), (20, 100), (24, 104), (25, 200)] {
            dev.read(block, &mut b).unwrap();
            assert!(b.iter().all(|&x| x == byte), "block {block}");
        }
    }

    /// A plan gives the same bytes however it is carried out: into an aligned buffer
    /// (whole pages straight from the device), an unaligned one (every run bounced), or
    /// a fresh vector; with partial pages at both ends, a hole, an unwritten extent and
    /// a dirty page over a mapped one; one device request per run either way.
    #[test]
    fn a_plan_reads_the_same_bytes_into_any_buffer() {
        let dev = MemDevice::new(64);
        for b in 0..64u64 {
            dev.write_data(b, &[b as u8; BLOCK_SIZE]).unwrap();
        }
        let dirty = (3u64, Box::new([0xEE; BLOCK_SIZE]));
        // Pages 0..2 at blocks 10..12, page 2 a hole, 3..6 at 20..23, 6 unwritten.
        let plan = |offset: u64, len: usize| ReadPlan {
            offset,
            len,
            runs: [(0u64, 10u64, 2u64), (3, 20, 3)]
                .into_iter()
                .filter_map(|(p, b, n)| {
                    let first = offset / BLOCK_SIZE as u64;
                    let last = (offset + len as u64 - 1) / BLOCK_SIZE as u64;
                    let (s, t) = (p.max(first), (p + n).min(last + 1));
                    (s < t).then_some((s, b + (s - p), t - s))
                })
                .collect(),
            dirty: vec![dirty.clone()],
        };
        let expected = |offset: u64, len: usize| -> Vec<u8> {
            (offset..offset + len as u64)
                .map(|x| match x / BLOCK_SIZE as u64 {
                    0 | 1 => (10 + x / BLOCK_SIZE as u64) as u8,
                    3 => 0xEE,
                    4 | 5 => (20 + x / BLOCK_SIZE as u64 - 3) as u8,
                    _ => 0,
                })
                .collect()
        };
        for (offset, len) in [(0, 7 * BLOCK_SIZE), (100, 6 * BLOCK_SIZE), (BLOCK_SIZE as u64, 3 * BLOCK_SIZE + 5)] {
            let p = plan(offset, len);
            assert_eq!(p.execute(&dev).unwrap(), expected(offset, len), "vector, at {offset}");
            // Garbage first: the holes must come out zero whatever the buffer held.
            let mut aligned = AlignedBuf::new(len);
            aligned.fill(0xAB);
            let before = dev.stats().reads;
            p.execute_into(&dev, &mut aligned).unwrap();
            assert_eq!(&aligned[..], &expected(offset, len)[..], "aligned, at {offset}");
            assert_eq!(dev.stats().reads - before, p.runs.len() as u64, "one request per run");
            let mut unaligned = AlignedBuf::new(len + 1);
            unaligned.fill(0xAB);
            p.execute_into(&dev, &mut unaligned[1..]).unwrap();
            assert_eq!(&unaligned[1..], &expected(offset, len)[..], "unaligned, at {offset}");
        }
    }
}
