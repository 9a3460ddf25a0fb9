//! Write-back of delayed-allocation pages: blocks from a pool near the file's previous
//! extent, the extent map changed (in place for a page over a written one), and the data
//! handed to the caller to write without the volume lock (`write_runs`).

use crate::disk::codec::*;
use crate::disk::device::BufferPool;
use crate::disk::format::*;
use crate::disk::valid::guard_data_write;
use crate::engine::store::Tx;
use crate::error::{Error, Result};

use super::{extent_record, free_data, goal_for, map, unmap, written_block, Pages};
use crate::engine::btree;

/// File data on its way to the device: `pages` go to consecutive blocks from `phys`.
/// Write-back maps the blocks at once and leaves the writing to its caller, which does
/// it without the volume lock and before the delta that maps them can commit.
pub(crate) struct DataWrite {
    pub phys: u64,
    /// The run's dirty pages, in order (their page numbers are consecutive): moved out
    /// of the file's dirty pages, so taking a run copies no data under the volume lock.
    pub pages: Vec<Box<Block>>,
}

/// Overwrites in place: pages that write-back leaves at the block the file already maps
/// (a written extent), for the commit to log and then write home *after* it is durable
/// (`Journal::commit`'s late data), so the committed state keeps its contents until
/// then. The extent map does not change and nothing is allocated: random overwrites
/// leave a file's extents as they were, and a commit logs the pages instead of every
/// extent leaf they would have touched. Only short runs (at most `INPLACE_RUN` pages)
/// go in place, since their data is written twice; a long run is cheaper redirected.
pub(crate) struct InPlace {
    /// Pages that may still go in place (room left in the log for them).
    pub room: usize,
    /// (block, contents) of the pages taken so far.
    pub pages: Vec<(u64, Box<Block>)>,
}

/// Longest run of dirty pages written in place rather than to fresh blocks.
pub(super) const INPLACE_RUN: u64 = 16;

impl InPlace {
    /// Room for `room` pages.
    pub(crate) fn new(room: usize) -> InPlace {
        InPlace { room, pages: Vec::new() }
    }

    /// No page goes in place (a flush ahead of the commit: its data is written before
    /// the commit, so it must go to fresh blocks).
    pub(crate) fn none() -> InPlace {
        InPlace::new(0)
    }
}

/// Write runs of file data, those that lie side by side on the device together, in
/// requests of at most `piece` pages; each run is freed once written, and `written` is
/// told the pages and the runs done after each request.
pub(crate) fn write_runs(
    dev: &dyn crate::disk::device::BlockDevice,
    layout: &Layout,
    runs: Vec<DataWrite>,
    piece: usize,
    mut written: impl FnMut(u64, u64),
) -> Result<()> {
    // A buffer as large as the largest request, not the largest possible one: a commit of
    // one page should not clear 4 MiB.
    let piece = piece.max(1);
    for r in &runs {
        guard_data_write(layout, r.phys, r.pages.len() as u64)?;
    }
    let (mut largest, mut group, mut end) = (0usize, 0usize, None);
    for r in &runs {
        group = if end == Some(r.phys) { group + r.pages.len() } else { r.pages.len() };
        end = Some(r.phys + r.pages.len() as u64);
        largest = largest.max(group.min(piece));
    }
    let mut buf = DATA_BUFFERS.take(largest * BLOCK_SIZE);
    let mut runs = runs.into_iter().peekable();
    // The request being filled: its first block and its pages so far.
    let (mut start, mut n) = (0u64, 0usize);
    let mut pages_in = 0u64;
    let mut runs_in = 0u64;
    while let Some(run) = runs.next() {
        let mut pages = run.pages.iter();
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
        super::pages::recycle(run.pages);
        // The next run continues this request only if it starts where this one ended.
        if runs.peek().is_none_or(|r| r.phys != at) && n > 0 {
            dev.write_data(start, &buf[..n * BLOCK_SIZE])?;
            written(pages_in, std::mem::take(&mut runs_in));
            (n, pages_in) = (0, 0);
        }
    }
    DATA_BUFFERS.give(buf);
    Ok(())
}

/// Request buffers of `write_runs`, kept between commits and flushes: a commit after
/// 1,000 scattered writes zeroed a fresh 4 MiB one, about a tenth of its fsync's time.
/// Only whole pages copied in are ever written out of one.
static DATA_BUFFERS: BufferPool = BufferPool::new(2);

/// Write back dirty pages: allocate fresh blocks for each run of consecutive pages and
/// remap; the data itself goes to `out`, for the caller to write before the delta commits.
/// The blocks were charged to the delta when the pages were dirtied. Works one allocated
/// fragment at a time and stops early, leaving the rest in `pages`, once the delta's dirty
/// metadata reaches `meta_limit` blocks, so the caller can commit and go on: every
/// intermediate state maps each page either to its old block or to its new one, whose
/// data is in `out`. Pages of short runs over written extents go to `inplace` instead,
/// while it has room (they count against `meta_limit` too: they are logged). Returns the
/// number of pages written back.
pub(crate) fn writeback(
    st: &mut Tx,
    inode: &mut Inode,
    pages: &mut Pages,
    meta_limit: usize,
    out: &mut Vec<DataWrite>,
    inplace: &mut InPlace,
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
    // Once no free extent of `POOL_MIN` blocks is left, runs take blocks where they fit
    // without looking again: on a fragmented volume each look scans the whole map, and
    // random overwrites would pay one such scan per page.
    let mut pools_left = true;
    let r = loop {
        let Some((&p0, _)) = pages.first_key_value() else { break Ok(()) };
        if st.store().dirty_count() + st.space().dirty_blocks() + inplace.pages.len() >= meta_limit {
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
        if n <= INPLACE_RUN && inplace.room > 0 {
            match written_block(st, inode, p0) {
                Ok(Some(b)) => {
                    let (_, page) = pages.pop_first().expect("p0 is the first dirty page");
                    inplace.pages.push((b, page));
                    inplace.room -= 1;
                    written += 1;
                    continue;
                }
                Ok(None) => {}
                Err(e) => break Err(e),
            }
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
            let pooled = if pools_left { st.alloc(goal, want, want.min(POOL_MIN)) } else { None };
            pools_left &= pooled.is_some();
            let got = pooled.or_else(|| st.alloc(goal, n, 1));
            let Some(got) = got else { break Err(Error::NoSpace) };
            pool = Some(got);
        }
        let (phys, left) = pool.expect("a pool was just taken");
        let len = n.min(left);
        pool = (left > len).then_some((phys + len, left - len));
        next_goal = Some(phys + len);
        // Take the run off the front: page by page when short (a split of the map costs
        // more than a few pops), else split off whole.
        let run: Vec<Box<Block>> = if len <= 16 {
            std::iter::from_fn(|| pages.pop_first()).take(len as usize).map(|(_, page)| page).collect()
        } else {
            let rest = pages.split_off(&(p0 + len));
            std::mem::replace(pages, rest).into_values().collect()
        };
        st.store().note_data(phys, len);
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
        st.free_now(phys, left);
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
fn remap_one(st: &mut Tx, inode: &mut Inode, p: u64, phys: u64) -> Result<bool> {
    let ino = inode.ino;
    let layout = st.store().sb.layout;
    let InodeData::ExtentTree { tree, count } = &inode.data else { return Ok(false) };
    // Far from the size at which `replace` moves the extents back into the inode.
    if (*count as usize) <= INLINE_EXTENTS / 2 + 2 {
        return Ok(false);
    }
    // Most often p is an extent of one page of its own, not right after its left
    // neighbour on the device: only the record's block changes, in one descent.
    let mut old = None;
    let changed = btree::change_floor(st, tree, ino, p, |(k, v), before| {
        let e = extent_record(&layout, ino, k, v)?;
        if e.logical != p || e.len != 1 || e.unwritten {
            return Ok(None);
        }
        // A left neighbour that would merge with the new block (as below), or none in
        // this leaf (it may be in the leaf before): the general path.
        match before.map(|(k, v)| extent_record(&layout, ino, k, v)).transpose()? {
            Some(l) if !(l.end() == p && l.phys + l.len == phys && !l.unwritten && l.len + 1 < 1 << 31) => {}
            _ => return Ok(None),
        }
        old = Some(e.phys);
        Ok(Some(Extent { phys, ..e }.encode_value()))
    })?;
    if let (true, Some(old)) = (changed, old) {
        free_data(st, ino, old, 1, true);
        return Ok(true);
    }
    // Otherwise: the extent holding p and the one before it, in one descent.
    let (Some((k, v)), before) = btree::floor_and_before(st, tree, ino, p)? else { return Ok(false) };
    let e = extent_record(&layout, ino, k, &v)?;
    if e.end() <= p || e.unwritten {
        return Ok(false);
    }
    // The page just before, when this one starts the extent: the new block may follow
    // its block on the device (write-back's goal is right after it), and then they merge.
    let left = match (e.logical == p, before) {
        (true, Some((k, v))) => Some(extent_record(&layout, ino, k, &v)?)
            .filter(|l| l.end() == p && l.phys + l.len == phys && !l.unwritten && l.len + 1 < 1 << 31),
        _ => None,
    };
    let InodeData::ExtentTree { tree, count } = &mut inode.data else { return Ok(false) };
    let put = |st: &mut Tx, tree: &mut TreeRoot, x: Extent, replace: bool| {
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
    free_data(st, ino, e.phys + (p - e.logical), 1, !e.unwritten);
    Ok(true)
}

/// Smallest free extent write-back takes blocks from while one exists (64 KiB).
const POOL_MIN: u64 = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::device::{BlockDevice, MemDevice};

    /// A run of `n` pages at block `phys`, page k filled with byte `tag + k`.
    fn run(phys: u64, n: u64, tag: u8) -> DataWrite {
        let pages = (0..n).map(|k| Box::new([tag.wrapping_add(k as u8); BLOCK_SIZE])).collect();
        DataWrite { phys, pages }
    }

    /// Runs side by side on the device go out as one request, up to the piece size;
    /// every page lands where its run says, and the callback counts pages and runs.
    #[test]
    fn write_runs_joins_neighbours_and_splits_pieces() {
        let dev = MemDevice::new(1000);
        let layout = Layout::new(1000, 64).unwrap();
        // 210..212 and 212..213 touch, 220..225 stands alone, 225..226 touches it.
        let runs = vec![run(210, 2, 1), run(212, 1, 50), run(220, 5, 100), run(225, 1, 200)];
        let (mut pages, mut done) = (0, 0);
        let mut calls = 0;
        write_runs(&dev, &layout, runs, 4, |p, r| {
            pages += p;
            done += r;
            calls += 1;
        })
        .unwrap();
        assert_eq!((pages, done), (9, 4));
        // [210, 211, 212] in one request; [220..224] split at 4 pages: [220..223], [224, 225].
        assert_eq!((dev.stats().writes, calls), (3, 3));
        let mut b = [0u8; BLOCK_SIZE];
        for (block, byte) in [(210, 1), (211, 2), (212, 50), (220, 100), (224, 104), (225, 200)] {
            dev.read(block, &mut b).unwrap();
            assert!(b.iter().all(|&x| x == byte), "block {block}");
        }
        // The guard: no data over the fixed part, however the runs were made.
        let writes = dev.stats().writes;
        for wild in [run(0, 1, 9), run(layout.first_free() - 1, 2, 9), run(999, 1, 9), run(u64::MAX, 2, 9)] {
            assert!(write_runs(&dev, &layout, vec![wild], 4, |_, _| {}).is_err());
        }
        assert_eq!(dev.stats().writes, writes, "a refused run was written");
    }
}
