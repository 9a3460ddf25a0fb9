//! The delta log: how a delta's metadata becomes durable atomically, and recovery.
//!
//! Two log areas are used alternately. Committing delta `n` takes one of two shapes.
//!
//! With two flushes (any delta):
//! 1. the caller has already written the delta's data blocks (to blocks free in the last
//!    committed state, so nothing committed is overwritten);
//! 2. write the target list and the block images into area `n % 2`, behind its first block;
//! 3. flush — data, log body and the previous delta's home writes are now durable;
//! 4. write the commit block (seq, count, crc32c of the body) into the area's first block;
//! 5. make it durable — delta `n` is committed (`write_durable`: a FUA write on an NBD
//!    server that offers it, else a write and a flush);
//! 6. write the blocks to their home locations (made durable by the next commit's step 3).
//!
//! With one flush (`commit_one_flush`: a delta whose file data, if any, is small and
//! goes into the log with its metadata, and which wrote no data elsewhere):
//! 1. write the commit block, marked `ONE_FLUSH`, and the body as one request, and the
//!    data to its own blocks beside it;
//! 2. flush — delta `n` is committed, and the previous delta's home writes are durable;
//! 3. write the metadata blocks to their home locations.
//!
//! Either shape may also log *late* data: file data overwriting blocks that the last
//! committed state maps (an overwrite in place). It is logged as data images and goes
//! home only with the metadata, after the commit: before it, those blocks must keep
//! their committed contents. Recovery replays it like any logged data.
//!
//! A one-flush commit cut short can leave a valid commit block over a body that never
//! fully arrived; its checksum tells, and recovery then takes the other area's delta,
//! the one before. A two-flush commit's body was durable before its commit block was
//! written, so there a mismatch is corruption.
//!
//! Recovery reads both commit blocks and replays the newest valid one. Only that one can
//! be missing from home locations, with one exception: the flush of delta `n` made delta
//! `n-1`'s homes durable, but a one-flush commit block may reach the device before that
//! flush, so before a one-flush commit recovery also replays delta `n-1`, while its area
//! holds it whole (delta `n+1` writes there only after `n`'s flush). Replay is
//! idempotent.

use crate::disk::codec::*;
use crate::disk::device::{AlignedBuf, BlockDevice};
use crate::disk::format::{Layout, BITMAP_MAGIC, COMMIT_MAGIC, STATE_BLOCK, STATE_MAGIC};
use crate::disk::valid::guard_data_write;
use crate::error::{Error, Result};

/// Block images with their home addresses.
pub(crate) type BlockImages = Vec<(u64, Box<Block>)>;

/// What recovery found to replay, in order: the newest committed delta's metadata images
/// and the file data it logged (one-flush commits), each with its home address; before a
/// one-flush commit, the images of the delta before it come first.
#[derive(Default)]
pub struct Replay {
    pub meta: BlockImages,
    pub data: BlockImages,
}

/// Descriptor flag: the image is file data (a one-flush commit logs small data), not
/// metadata: it has no header, and a read-only recovery must not take it for metadata.
const DATA_TARGET: u64 = 1 << 63;

/// Commit sequence numbers at or past this are not valid (FORMAT.md §12).
const MAX_SEQ: u64 = 1 << 62;

/// Targets listed per descriptor block.
const TARGETS_PER_DESC: usize = BLOCK_SIZE / 8;

/// Commit block flag: the body was written with the commit block under one flush, so a
/// body that fails its checksum means the commit never completed (FORMAT.md §12).
const ONE_FLUSH: u32 = 1;

/// Largest number of blocks one delta can log in areas of `log_blocks` blocks.
pub(crate) fn capacity(log_blocks: u32) -> usize {
    // n images + ceil(n / 512) descriptors + 1 commit block <= log_blocks
    let avail = log_blocks as usize - 1;
    avail - avail.div_ceil(TARGETS_PER_DESC + 1)
}

/// The commit sequence and layout.
pub struct Journal {
    layout: Layout,
    /// Sequence number of the last committed delta.
    pub seq: u64,
    /// Blocks the last committed delta logged (0: nothing to replay).
    pub last_blocks: usize,
}

fn body_crc(body: &[u8]) -> u32 {
    crc32c::crc32c(body)
}

/// A commit block's sequence, count and flags, when valid.
fn read_commit_flags(dev: &dyn BlockDevice, at: u64) -> Result<Option<(u64, usize, u32)>> {
    let mut b = [0u8; BLOCK_SIZE];
    dev.read(at, &mut b)?;
    if magic(&b) != COMMIT_MAGIC || verify(&b, at, Some(COMMIT_MAGIC)).is_err() {
        return Ok(None);
    }
    // A sequence no volume reaches (one commit a microsecond for 146,000 years) is
    // damage: taken as no commit, so the next one cannot overflow it.
    if get_u64(&b, 16) >= MAX_SEQ {
        return Ok(None);
    }
    Ok(Some((get_u64(&b, 16), get_u32(&b, 24) as usize, get_u32(&b, 32))))
}

/// A commit block's sequence and count, when valid.
fn read_commit(dev: &dyn BlockDevice, at: u64) -> Result<Option<(u64, usize)>> {
    Ok(read_commit_flags(dev, at)?.map(|(s, n, _)| (s, n)))
}

/// A log area's first block, and (sequence, blocks logged) when its commit block is valid.
pub(crate) type AreaCommit = (u64, Option<(u64, usize)>);

/// Each log area's commit block (inspector).
pub(crate) fn commit_blocks(dev: &dyn BlockDevice, layout: Layout) -> Result<[AreaCommit; 2]> {
    let (a, b) = (layout.log_area(0), layout.log_area(1));
    Ok([(a, read_commit(dev, a)?), (b, read_commit(dev, b)?)])
}

/// The target blocks a valid commit in the area at `at` lists, and whether its body
/// matches the commit's checksum (inspector). None when the commit block is invalid or
/// lists more blocks than the log holds.
pub(crate) fn commit_targets(dev: &dyn BlockDevice, layout: Layout, at: u64) -> Result<Option<(Vec<u64>, bool)>> {
    let Some((_, n)) = read_commit(dev, at)? else {
        return Ok(None);
    };
    if n > capacity(layout.log_blocks) {
        return Ok(None);
    }
    let (body, ok) = read_body(dev, at, n)?;
    let targets = (0..n).map(|i| get_u64(&body, i * 8) & !DATA_TARGET).collect();
    Ok(Some((targets, ok)))
}

/// The body (descriptors, then images) of the commit at `at` that logs `n` blocks, and
/// whether it matches the commit block's checksum.
fn read_body(dev: &dyn BlockDevice, at: u64, n: usize) -> Result<(Vec<u8>, bool)> {
    let ndesc = n.div_ceil(TARGETS_PER_DESC);
    let mut body = vec![0u8; (ndesc + n) * BLOCK_SIZE];
    if !body.is_empty() {
        dev.read(at + 1, &mut body)?;
    }
    let mut cb = [0u8; BLOCK_SIZE];
    dev.read(at, &mut cb)?;
    let ok = get_u32(&cb, 28) == body_crc(&body);
    Ok((body, ok))
}

impl Journal {
    /// The volume's layout, which commits check their targets against.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// [`Journal::recover_from`] without passing over damaged commits (the tests).
    #[cfg(test)]
    pub fn recover(dev: &dyn BlockDevice, layout: Layout, apply: bool) -> Result<(Journal, Replay)> {
        Self::recover_from(dev, layout, apply, false)
    }

    /// Find the newest committed delta. With `apply`, write its blocks home (and
    /// flush); either way return them, so a read-only open can overlay them in memory.
    /// With `skip_damaged`, a commit that cannot be used (more blocks than the log
    /// holds, a body that fails its checksum, a target it may not have) is passed over
    /// for the one before it instead of failing: the rollback that
    /// `-o recovery=rollback` and `fsck --rollback` accept.
    pub fn recover_from(
        dev: &dyn BlockDevice,
        layout: Layout,
        apply: bool,
        skip_damaged: bool,
    ) -> Result<(Journal, Replay)> {
        let mut valid: Vec<(u64, u64, usize, u32)> = Vec::new(); // (seq, area start, count, flags)
        for area in 0..2 {
            let at = layout.log_area(area);
            if let Some((seq, n, flags)) = read_commit_flags(dev, at)? {
                valid.push((seq, at, n, flags));
            }
        }
        // Newest first; on a tie, area 0.
        valid.sort_by_key(|v| std::cmp::Reverse(v.0));
        let mut chosen = None;
        for (i, &(seq, at, n, flags)) in valid.iter().enumerate() {
            if n > capacity(layout.log_blocks) {
                if skip_damaged {
                    tracing::warn!("commit {seq} lists {n} blocks, more than the log holds: passed over");
                    continue;
                }
                return Err(Error::corrupt(format!("commit {seq} lists {n} blocks, more than the log holds")));
            }
            let (body, ok) = read_body(dev, at, n)?;
            if ok && skip_damaged && images(layout, seq, n, &body, &mut Replay::default()).is_err() {
                tracing::warn!("commit {seq} targets blocks it may not: passed over");
                continue;
            }
            if ok {
                chosen = Some((i, seq, n, flags, body));
                break;
            }
            if skip_damaged {
                tracing::warn!("log body of commit {seq} fails its checksum: passed over");
                continue;
            }
            if flags & ONE_FLUSH != 0 && i == 0 {
                // Written with its body under one flush that never completed: this delta
                // was not committed, and the other area holds the one before it.
                tracing::info!("commit {seq} was cut short before its flush; recovering the delta before it");
                continue;
            }
            // A two-flush commit's body was flushed before its commit block was written
            // (and an older area is consulted only after a cut one-flush commit, whose
            // predecessor had completed), so a body that does not match means the
            // device broke its promise.
            return Err(Error::corrupt(format!("log body of commit {seq} fails its checksum")));
        }
        let Some((i, seq, n, flags, body)) = chosen else {
            return Ok((Journal { layout, seq: 0, last_blocks: 0 }, Replay::default()));
        };
        let mut prev = Replay::default();
        // A one-flush commit block went out before the flush that makes the previous
        // delta's home writes durable, so the device may have kept it and lost some of
        // those: replay the previous delta first, from the other area, while that still
        // holds it whole. (Once the next delta has written over that area, this delta's
        // flush had completed, and the previous delta's home writes are durable.)
        if flags & ONE_FLUSH != 0 {
            if let Some(&(pseq, pat, pn, _)) = valid.get(i + 1).filter(|v| v.0 + 1 == seq) {
                if pn <= capacity(layout.log_blocks) {
                    let (pbody, pok) = read_body(dev, pat, pn)?;
                    if pok {
                        images(layout, pseq, pn, &pbody, &mut prev)?;
                    }
                }
            }
        }
        let mut out = Replay::default();
        images(layout, seq, n, &body, &mut out)?;
        // A block both deltas log takes the newer image only, whichever list each is in:
        // a block may change kind between them (file data freed, then metadata), and a
        // read-only recovery's pinned metadata would hide a newer data image.
        let newer: std::collections::HashSet<u64> = out.meta.iter().chain(&out.data).map(|(t, _)| *t).collect();
        let older = |list: BlockImages| list.into_iter().filter(|(t, _)| !newer.contains(t));
        out.meta = older(prev.meta).chain(out.meta).collect();
        out.data = older(prev.data).chain(out.data).collect();
        if apply {
            Self::apply(dev, &out)?;
        }
        Ok((Journal { layout, seq, last_blocks: n }, out))
    }

    /// Write recovered blocks home in order, and make them durable.
    pub fn apply(dev: &dyn BlockDevice, replay: &Replay) -> Result<()> {
        for (t, img) in replay.meta.iter().chain(&replay.data) {
            dev.write(*t, &img[..])?;
        }
        dev.flush()
    }

    /// Blocks one delta may log.
    pub fn capacity(&self) -> usize {
        capacity(self.layout.log_blocks)
    }

    /// Commit one delta whose metadata blocks (sealed, ascending) are `blocks`, with two
    /// flushes. Data blocks must already have been written, except the `late` data,
    /// which is logged and goes home with the metadata, after the commit.
    pub fn commit(&mut self, dev: &dyn BlockDevice, blocks: &[(u64, Box<Block>)], late: &[(u64, &[u8])]) -> Result<()> {
        let meta: Vec<(u64, &[u8])> = blocks.iter().map(|(t, img)| (*t, &img[..])).collect();
        let mut late: Vec<(u64, &[u8])> = late.to_vec();
        late.sort_unstable_by_key(|(t, _)| *t);
        for (t, _) in &late {
            guard_data_write(&self.layout, *t, 1)?;
        }
        let targets: Vec<(u64, &[u8])> = meta.iter().chain(&late).copied().collect();
        let n = targets.len();
        if n > self.capacity() {
            return Err(Error::corrupt(format!("delta of {n} blocks exceeds the log capacity {}", self.capacity())));
        }
        let seq = self.seq + 1;
        let at = self.layout.log_area(seq % 2);
        let buf = body_buf(&targets, 0, meta.len());
        if !buf.is_empty() {
            // Past the host's cache when the device has a way (as file data): nothing
            // reads the log but recovery, and a large body is one request, not a copy into
            // the cache that the flush below then writes out.
            dev.write_data(at + 1, &buf)?;
        }
        dev.flush()?;
        let cb = commit_block(at, seq, n, body_crc(&buf), 0);
        // Durable on its own (FUA where the device has it): the flush above already made
        // everything this delta depends on durable, and nothing else is written between.
        dev.write_durable(at, &cb)?;
        self.seq = seq;
        self.last_blocks = n;
        // The images go home from the body, where they lie in target order (metadata,
        // then late data).
        let images = &buf[n.div_ceil(TARGETS_PER_DESC) * BLOCK_SIZE..];
        let (meta_images, late_images) = images.split_at(meta.len() * BLOCK_SIZE);
        let mut reqs = home_runs(&meta, meta_images);
        reqs.extend(home_runs(&late, late_images));
        dev.write_many(&reqs)
    }

    /// Commit one delta with a single flush: its metadata `blocks` (sealed, ascending)
    /// and the file data it maps, `data` (block, contents; written nowhere yet), go into
    /// the log together, the commit block in the same request; the data also goes home in
    /// the same batch, and `data_home` is called once all of it is written; then one
    /// flush, and the metadata and the `late` data (logged after `data`) go home. The
    /// delta must have written no data outside the log before (a crash before the flush
    /// could keep its commit and lose that data).
    pub fn commit_one_flush(
        &mut self,
        dev: &dyn BlockDevice,
        blocks: &[(u64, Box<Block>)],
        data: &[(u64, &[u8])],
        late: &[(u64, &[u8])],
        data_home: impl FnOnce(),
    ) -> Result<()> {
        // Metadata first, then the data, then the late data, each ascending; data entries
        // carry their flag.
        let meta: Vec<(u64, &[u8])> = blocks.iter().map(|(t, img)| (*t, &img[..])).collect();
        let mut logged: Vec<(u64, &[u8])> = data.to_vec();
        logged.sort_unstable_by_key(|(t, _)| *t);
        let mut late: Vec<(u64, &[u8])> = late.to_vec();
        late.sort_unstable_by_key(|(t, _)| *t);
        for (t, _) in logged.iter().chain(&late) {
            guard_data_write(&self.layout, *t, 1)?;
        }
        let targets: Vec<(u64, &[u8])> = meta.iter().chain(&logged).chain(&late).copied().collect();
        let n = targets.len();
        if n > self.capacity() {
            return Err(Error::corrupt(format!("delta of {n} blocks exceeds the log capacity {}", self.capacity())));
        }
        let seq = self.seq + 1;
        let at = self.layout.log_area(seq % 2);
        // The commit block goes first, in the same request as the body it vouches for.
        let mut buf = body_buf(&targets, 1, meta.len());
        let crc = body_crc(&buf[BLOCK_SIZE..]);
        buf[..BLOCK_SIZE].copy_from_slice(&commit_block(at, seq, n, crc, ONE_FLUSH));
        // The data goes home now too, from the body, so readers wait for it, not for the
        // flush (if the commit is cut, those blocks are free in the delta recovery takes).
        let images = &buf[(1 + n.div_ceil(TARGETS_PER_DESC)) * BLOCK_SIZE..];
        let (meta_images, rest) = images.split_at(meta.len() * BLOCK_SIZE);
        let (data_images, late_images) = rest.split_at(logged.len() * BLOCK_SIZE);
        let mut reqs: Vec<(u64, &[u8])> = vec![(at, &buf[..])];
        reqs.extend(home_runs(&logged, data_images));
        dev.write_many(&reqs)?;
        data_home();
        dev.flush()?;
        self.seq = seq;
        self.last_blocks = n;
        let mut homes = home_runs(&meta, meta_images);
        homes.extend(home_runs(&late, late_images));
        dev.write_many(&homes)
    }
}

/// Append the images of commit `seq`'s body (`n` of them) to `out`, checking each target.
fn images(layout: Layout, seq: u64, n: usize, body: &[u8], out: &mut Replay) -> Result<()> {
    let ndesc = n.div_ceil(TARGETS_PER_DESC);
    let log_end = layout.log_area(1) + layout.log_blocks as u64;
    for i in 0..n {
        let entry = get_u64(body, i * 8);
        let t = entry & !DATA_TARGET;
        if t == 0
            || (t >= layout.log_area(0) && t < log_end)
            || t >= layout.backup_superblock()
            || (layout.mark_block != 0 && t == layout.mark_block)
            || (entry & DATA_TARGET != 0 && !layout.data_run_ok(t, 1))
        {
            return Err(Error::corrupt(format!("commit {seq} targets block {t}, which it may not")));
        }
        let mut img = Box::new([0u8; BLOCK_SIZE]);
        img.copy_from_slice(&body[(ndesc + i) * BLOCK_SIZE..(ndesc + i + 1) * BLOCK_SIZE]);
        // A metadata image is a sealed block for its target, of the kind that lives
        // there: replaying anything else would write a block no reader accepts.
        if entry & DATA_TARGET == 0 {
            let kind = if t == STATE_BLOCK {
                Some(STATE_MAGIC)
            } else if t < layout.first_free() || layout.is_spilled_bitmap(t) {
                Some(BITMAP_MAGIC)
            } else {
                None
            };
            verify(&img, t, kind)
                .map_err(|e| Error::corrupt(format!("commit {seq}: the image it logs for block {t}: {e}")))?;
            // The state block a delta logs names that delta (FORMAT §4): replayed home with
            // another number, it would make the next open see a damaged newer commit.
            if t == STATE_BLOCK && get_u64(&img[..], 32) != seq {
                return Err(Error::corrupt(format!(
                    "commit {seq}: the state block it logs names delta {}",
                    get_u64(&img[..], 32)
                )));
            }
        }
        if entry & DATA_TARGET != 0 {
            out.data.push((t, img));
        } else {
            out.meta.push((t, img));
        }
    }
    Ok(())
}

/// A log body for `targets` (descriptors, then images), behind `lead` blocks left for
/// the caller; the targets from `data_from` on are file data.
fn body_buf(targets: &[(u64, &[u8])], lead: usize, data_from: usize) -> AlignedBuf {
    let n = targets.len();
    let ndesc = n.div_ceil(TARGETS_PER_DESC);
    if n == 0 && lead == 0 {
        return AlignedBuf::new(0);
    }
    let mut buf = AlignedBuf::new((lead + ndesc + n) * BLOCK_SIZE);
    let body = &mut buf[lead * BLOCK_SIZE..];
    for (i, (t, img)) in targets.iter().enumerate() {
        put_u64(body, i * 8, if i >= data_from { t | DATA_TARGET } else { *t });
        body[(ndesc + i) * BLOCK_SIZE..(ndesc + i + 1) * BLOCK_SIZE].copy_from_slice(img);
    }
    buf
}

/// A sealed commit block.
fn commit_block(at: u64, seq: u64, n: usize, crc: u32, flags: u32) -> [u8; BLOCK_SIZE] {
    let mut cb = [0u8; BLOCK_SIZE];
    put_u32(&mut cb, 0, COMMIT_MAGIC);
    put_u64(&mut cb, 16, seq);
    put_u32(&mut cb, 24, n as u32);
    put_u32(&mut cb, 28, crc);
    put_u32(&mut cb, 32, flags);
    seal(&mut cb, at);
    cb
}

/// Home writes of `targets` (ascending) whose images lie one after another in
/// `images`: runs of adjacent blocks, at most 256 each, as slices of `images`, for one
/// `write_many` batch (no order among them is needed: the next flush covers them all).
fn home_runs<'a>(targets: &[(u64, &[u8])], images: &'a [u8]) -> Vec<(u64, &'a [u8])> {
    let n = targets.len();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < n {
        let mut j = i + 1;
        while j < n && targets[j].0 == targets[j - 1].0 + 1 && j - i < 256 {
            j += 1;
        }
        runs.push((targets[i].0, &images[i * BLOCK_SIZE..j * BLOCK_SIZE]));
        i = j;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::device::MemDevice;

    fn setup() -> (MemDevice, Layout, Journal) {
        let layout = Layout::new(4096, 64).unwrap();
        let dev = MemDevice::new(4096);
        let (j, replay) = Journal::recover(&dev, layout, true).unwrap();
        assert!(replay.meta.is_empty() && j.seq == 0, "a blank device has nothing to replay");
        (dev, layout, j)
    }

    /// A sealed metadata-like block for home `at`, filled with `fill`.
    fn image(at: u64, fill: u8) -> (u64, Box<Block>) {
        let mut b = Box::new([fill; BLOCK_SIZE]);
        put_u32(&mut b[..], 0, 0x1234_5678);
        seal(&mut b, at);
        (at, b)
    }

    fn read(dev: &MemDevice, at: u64) -> Box<Block> {
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        dev.read(at, &mut b[..]).unwrap();
        b
    }

    #[test]
    fn the_newest_valid_commit_is_replayed() {
        let (dev, layout, mut j) = setup();
        let home = layout.first_free() + 10;
        j.commit(&dev, &[image(home, 1)], &[]).unwrap();
        j.commit(&dev, &[image(home, 2), image(home + 1, 2)], &[]).unwrap();
        assert_eq!(j.seq, 2);
        // Home writes lost (no flush after them): recovery puts the newest delta back.
        dev.write(home, &[0u8; BLOCK_SIZE]).unwrap();
        dev.write(home + 1, &[0u8; BLOCK_SIZE]).unwrap();
        let (j2, replay) = Journal::recover(&dev, layout, false).unwrap();
        assert_eq!(
            (j2.seq, j2.last_blocks, replay.meta.len() + replay.data.len()),
            (2, 2, 2),
            "both areas valid: the higher sequence wins"
        );
        assert_eq!(read(&dev, home)[100], 0, "a read-only recovery writes nothing home");
        Journal::recover(&dev, layout, true).unwrap();
        assert_eq!(read(&dev, home)[100], 2);
        assert_eq!(read(&dev, home + 1)[100], 2);
    }

    #[test]
    fn a_torn_commit_block_falls_back_to_the_older_delta() {
        let (dev, layout, mut j) = setup();
        let home = layout.first_free() + 10;
        j.commit(&dev, &[image(home, 1)], &[]).unwrap();
        j.commit(&dev, &[image(home, 2)], &[]).unwrap();
        // Delta 2's commit block never fully reached the device (torn): not committed.
        let at = layout.log_area(0);
        let mut cb = read(&dev, at);
        cb[2000..].fill(0xFF);
        dev.write(at, &cb[..]).unwrap();
        let (j2, replay) = Journal::recover(&dev, layout, true).unwrap();
        assert_eq!((j2.seq, replay.meta.len() + replay.data.len()), (1, 1));
        assert_eq!(read(&dev, home)[100], 1, "delta 1's image is home");
    }

    #[test]
    fn a_body_that_fails_its_checksum_is_corruption() {
        let (dev, layout, mut j) = setup();
        let home = layout.first_free() + 10;
        j.commit(&dev, &[image(home, 1)], &[]).unwrap();
        // The commit block is valid but the body it vouches for is not what was flushed.
        let body = layout.log_area(1) + 1;
        let mut b = read(&dev, body);
        b[0] ^= 1;
        dev.write(body, &b[..]).unwrap();
        assert!(matches!(Journal::recover(&dev, layout, true), Err(Error::Corrupt(_))));
    }

    #[test]
    fn a_one_flush_commit_logs_its_data_and_writes_it_home() {
        let (dev, layout, mut j) = setup();
        let home = layout.first_free() + 10;
        let data = [7u8; BLOCK_SIZE];
        let flushes = dev.stats().flushes;
        j.commit_one_flush(&dev, &[image(home, 1)], &[(home + 5, &data[..])], &[], || {}).unwrap();
        assert_eq!(dev.stats().flushes - flushes, 1, "one flush");
        assert_eq!(read(&dev, home + 5)[..], data[..], "the data is home");
        dev.write(home, &[0u8; BLOCK_SIZE]).unwrap();
        dev.write(home + 5, &[0u8; BLOCK_SIZE]).unwrap();
        let (j2, replay) = Journal::recover(&dev, layout, true).unwrap();
        assert_eq!((j2.seq, replay.meta.len() + replay.data.len()), (1, 2));
        assert_eq!(read(&dev, home)[100], 1);
        assert_eq!(read(&dev, home + 5)[..], data[..], "the logged data is replayed");
    }

    #[test]
    fn a_one_flush_commit_cut_short_falls_back_to_the_delta_before() {
        let (dev, layout, mut j) = setup();
        let home = layout.first_free() + 10;
        j.commit(&dev, &[image(home, 1)], &[]).unwrap();
        let data = [7u8; BLOCK_SIZE];
        j.commit_one_flush(&dev, &[image(home, 2)], &[(home + 5, &data[..])], &[], || {}).unwrap();
        // Delta 2's commit block arrived, one block of its body did not.
        let body = layout.log_area(0) + 2;
        dev.write(body, &[0u8; BLOCK_SIZE]).unwrap();
        let (j2, replay) = Journal::recover(&dev, layout, true).unwrap();
        assert_eq!((j2.seq, replay.meta.len() + replay.data.len()), (1, 1), "delta 2 never committed");
        assert_eq!(read(&dev, home)[100], 1, "delta 1's image is home");
        // The same cut in a two-flush commit is the device breaking its promise.
        let mut j = Journal { layout, seq: 1, last_blocks: 1 };
        j.commit(&dev, &[image(home, 3)], &[]).unwrap();
        let mut b = read(&dev, layout.log_area(0) + 2);
        b[0] ^= 1;
        dev.write(layout.log_area(0) + 2, &b[..]).unwrap();
        assert!(matches!(Journal::recover(&dev, layout, true), Err(Error::Corrupt(_))));
    }

    #[test]
    fn a_one_flush_commit_replays_the_delta_before_it_too() {
        let (dev, layout, mut j) = setup();
        let home = layout.first_free() + 10;
        j.commit(&dev, &[image(home, 1), image(home + 1, 1)], &[]).unwrap();
        j.commit_one_flush(&dev, &[image(home, 2)], &[], &[], || {}).unwrap();
        // Delta 1's home write of `home + 1` was still unflushed when delta 2's commit
        // block went out, and the device kept the one and lost the other.
        dev.write(home + 1, &[0u8; BLOCK_SIZE]).unwrap();
        let (j2, replay) = Journal::recover(&dev, layout, true).unwrap();
        assert_eq!((j2.seq, replay.meta.len()), (2, 2), "delta 1's image of home + 1, then delta 2's");
        assert_eq!(read(&dev, home)[100], 2, "the newest image wins");
        assert_eq!(read(&dev, home + 1)[100], 1, "delta 1's lost home write is replayed");
    }

    /// A block logged as file data by one delta and as metadata by the next (freed, then
    /// taken for metadata) replays as the newer image only: a read-only recovery's pinned
    /// metadata and the data laid over the device must not disagree, and writing home
    /// must not put the older data over the newer metadata.
    #[test]
    fn a_block_both_deltas_log_replays_as_the_newer_image() {
        let (dev, layout, mut j) = setup();
        let home = layout.first_free() + 10;
        let data = [5u8; BLOCK_SIZE];
        j.commit_one_flush(&dev, &[image(home, 1)], &[], &[(home + 1, &data[..])], || {}).unwrap();
        j.commit_one_flush(&dev, &[image(home + 1, 2)], &[], &[], || {}).unwrap();
        let (_, replay) = Journal::recover(&dev, layout, false).unwrap();
        assert!(replay.data.is_empty(), "delta 1's data image of a block delta 2 logs as metadata is replayed");
        let newest: Vec<(u64, u8)> = replay.meta.iter().map(|(t, img)| (*t, img[100])).collect();
        assert_eq!(newest, [(home, 1), (home + 1, 2)]);
        dev.write(home + 1, &[0u8; BLOCK_SIZE]).unwrap();
        Journal::recover(&dev, layout, true).unwrap();
        assert_eq!(read(&dev, home + 1)[100], 2, "the older data was written over the newer metadata");
    }

    /// A sealed state block naming delta `seq`.
    fn state_image(seq: u64) -> (u64, Box<Block>) {
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        let st = crate::disk::format::State {
            orphan_head: 0,
            next_generation: 1,
            commit_seq: seq,
            inodes: 1,
            lazy_frees: Default::default(),
            rstats: Default::default(),
        };
        st.encode_into(&mut b);
        seal(&mut b, STATE_BLOCK);
        (STATE_BLOCK, b)
    }

    /// A delta's logged state block names that delta; one naming another number (a
    /// hostile log: replayed home, the next open would see a damaged newer commit) makes
    /// the commit unusable, and a rollback passes over it.
    #[test]
    fn a_logged_state_block_names_its_own_delta() {
        let (dev, layout, mut j) = setup();
        let home = layout.first_free() + 10;
        j.commit(&dev, &[state_image(1), image(home, 1)], &[]).unwrap();
        j.commit(&dev, &[state_image(2048), image(home, 2)], &[]).unwrap();
        let r = Journal::recover(&dev, layout, false);
        assert!(matches!(&r, Err(Error::Corrupt(m)) if m.contains("names delta 2048")), "{:?}", r.map(|(j, _)| j.seq));
        let (j2, replay) = Journal::recover_from(&dev, layout, false, true).unwrap();
        assert_eq!((j2.seq, replay.meta.len()), (1, 2), "the rollback takes delta 1");
    }

    #[test]
    fn bad_target_lists_are_corruption() {
        let (dev, layout, _) = setup();
        // Targets a commit may never name: block 0, the log itself, the backup superblock.
        for bad in [0, layout.log_area(0) + 3, layout.backup_superblock()] {
            let mut j = Journal { layout, seq: 0, last_blocks: 0 };
            j.commit(&dev, &[image(bad, 9)], &[]).unwrap();
            let r = Journal::recover(&dev, layout, false);
            assert!(matches!(r, Err(Error::Corrupt(_))), "target {bad}: {:?}", r.map(|(j, _)| j.seq));
        }
        // A count beyond what the area holds.
        let at = layout.log_area(1);
        let mut cb = read(&dev, at);
        put_u64(&mut cb[..], 16, 7);
        put_u32(&mut cb[..], 24, 10_000);
        seal(&mut cb, at);
        dev.write(at, &cb[..]).unwrap();
        assert!(matches!(Journal::recover(&dev, layout, false), Err(Error::Corrupt(_))));
    }
}
