//! Reads of file data: a plan made under the volume lock (device runs, copies of the
//! dirty pages over them), carried out without it.

use crate::disk::codec::*;
use crate::disk::device::AlignedBuf;
use crate::disk::format::*;
use crate::engine::store::{MetaRead, Tx};
use crate::error::{Error, Result};

use super::{extents_in, Pages};

/// A read worked out under the volume lock and carried out without it: the device runs
/// to read and copies of the dirty pages that overlay them.
pub(crate) struct ReadPlan {
    offset: u64,
    len: usize,
    /// (first page, physical block, pages)
    runs: Vec<(u64, u64, u64)>,
    dirty: Vec<(u64, Box<Block>)>,
}

/// The dirty pages of `pages` that a read of `len` bytes at `offset` covers, copied (what
/// [`plan_read`] lays over the device's data): taken with the dirty pages' lock held,
/// which the plan's extent-map reads then need not hold.
pub(crate) fn dirty_in(pages: Option<&Pages>, offset: u64, len: usize) -> Vec<(u64, Box<Block>)> {
    match pages {
        Some(d) if len > 0 => {
            let first = offset / BLOCK_SIZE as u64;
            let last = (offset + len as u64 - 1) / BLOCK_SIZE as u64;
            d.range(first..=last).map(|(p, b)| (*p, b.clone())).collect()
        }
        _ => Vec::new(),
    }
}

/// Plan reading `len` bytes at `offset` (already clipped to the file size), with `dirty`
/// (from [`dirty_in`]) over what the device holds.
pub(crate) fn plan_read(
    st: &mut (impl MetaRead + ?Sized),
    inode: &Inode,
    dirty: Vec<(u64, Box<Block>)>,
    offset: u64,
    len: usize,
) -> Result<ReadPlan> {
    let mut plan = ReadPlan { offset, len, runs: Vec::new(), dirty };
    if len == 0 {
        return Ok(plan);
    }
    let first = offset / BLOCK_SIZE as u64;
    let last = (offset + len as u64 - 1) / BLOCK_SIZE as u64;
    for e in extents_in(st, inode, first, last + 1)? {
        if !e.unwritten {
            let s = e.logical.max(first);
            let t = e.end().min(last + 1);
            let (phys, n) = (e.phys + (s - e.logical), t - s);
            st.let_go();
            if let Some(b) = st.store().holds_metadata(phys, n) {
                return Err(Error::corrupt(format!(
                    "inode {}: the extent at logical block {} maps block {b}, which holds metadata",
                    inode.ino, e.logical
                )));
            }
            plan.runs.push((s, phys, n));
        }
    }
    Ok(plan)
}

impl ReadPlan {
    /// Runs of device blocks (first, count) whose whole contents `out` (what
    /// [`ReadPlan::execute_with`] filled) holds as read from the device and that are not
    /// metadata sealed at their address: file data, which an overwrite in place need not
    /// read again (`Store::note_data`).
    pub(crate) fn data_seen(&self, out: &[u8]) -> Vec<(u64, u64)> {
        let bs = BLOCK_SIZE as u64;
        let (start, end) = (self.offset, self.offset + self.len as u64);
        let mut seen: Vec<(u64, u64)> = Vec::new();
        for &(first, phys, n) in &self.runs {
            for p in first..first + n {
                let b = phys + (p - first);
                let whole = p * bs >= start && (p + 1) * bs <= end;
                let ok = whole && !self.dirty.iter().any(|(d, _)| *d == p) && {
                    let at = (p * bs - start) as usize;
                    !sealed_metadata(&out[at..at + BLOCK_SIZE], b)
                };
                match seen.last_mut() {
                    Some((s, c)) if ok && *s + *c == b => *c += 1,
                    _ if ok => seen.push((b, 1)),
                    _ => {}
                }
            }
        }
        seen
    }

    /// The bytes the plan reads.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Carry the plan out: one device request per mapped run, then the dirty pages.
    pub(crate) fn execute(&self, dev: &dyn crate::disk::device::BlockDevice) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len];
        self.execute_into(dev, &mut out)?;
        Ok(out)
    }

    /// [`ReadPlan::execute`] into `out` (`len` bytes; holes are zeroed, whatever `out`
    /// held). A run of whole pages lands straight in `out` when that part of it is aligned as
    /// `O_DIRECT` wants (an [`AlignedBuf`] and a page-aligned offset); others go through a
    /// bounce buffer.
    pub(crate) fn execute_into(&self, dev: &dyn crate::disk::device::BlockDevice, out: &mut [u8]) -> Result<()> {
        self.execute_with(dev, out, &mut |_, _| false)
    }

    /// The device runs the plan reads: (first page, block, pages).
    pub(crate) fn runs(&self) -> &[(u64, u64, u64)] {
        &self.runs
    }

    /// [`ReadPlan::execute_into`], where `ahead(block, dst)` may fill whole blocks from
    /// `block` on from data read earlier (read-ahead) instead of the device: true if it did.
    pub(crate) fn execute_with(
        &self,
        dev: &dyn crate::disk::device::BlockDevice,
        out: &mut [u8],
        ahead: &mut dyn FnMut(u64, &mut [u8]) -> bool,
    ) -> Result<()> {
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
                if ahead(phys, dst) {
                    continue;
                }
                if dst.as_ptr().align_offset(BLOCK_SIZE) == 0 {
                    dev.read_data(phys, dst)?;
                    continue;
                }
            }
            let most = self.runs.iter().map(|r| r.2 as usize).max().unwrap_or(0);
            let whole = whole.get_or_insert_with(|| AlignedBuf::new(most * BLOCK_SIZE));
            let buf = &mut whole[..n as usize * BLOCK_SIZE];
            if !ahead(phys, buf) {
                dev.read_data(phys, buf)?;
            }
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

/// Read `len` bytes at `offset` (already clipped to the file size), `dirty` (from
/// [`dirty_in`]) over what the device holds.
pub(crate) fn read(
    st: &mut Tx,
    inode: &Inode,
    dirty: Vec<(u64, Box<Block>)>,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>> {
    plan_read(st, inode, dirty, offset, len)?.execute(&**st.store().dev())
}

/// The current content of page `p` (for read-modify-write of a partial page).
pub(crate) fn read_page(st: &mut Tx, inode: &Inode, p: u64) -> Result<Box<Block>> {
    let mut b = super::pages::zeroed();
    if let Some(e) = extents_in(st, inode, p, p + 1)?.first() {
        if !e.unwritten {
            let phys = e.phys + (p - e.logical);
            st.store().dev().read_data(phys, &mut b[..])?;
            // Merged with new bytes and written back in place, it would overwrite metadata.
            // (Only here, not on reads: a repaired volume may map a block holding stale
            // metadata to a file, which must stay readable.)
            refuse_sealed_metadata(&b[..], phys)?;
        }
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::device::{BlockDevice, MemDevice};

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
