//! File data: open handles, read, write, truncate, fallocate.

use crate::disk::codec::*;
use crate::disk::format::*;
use crate::error::{Error, Result};
use crate::fs::file::{self};
use crate::fs::pages;

use super::*;
use crate::disk::device::AlignedBuf;
use crate::engine::store::{read_inode, MetaRead, Tx};

/// Zeros, to blank the tail of a page.
static ZEROS: [u8; BLOCK_SIZE] = [0; BLOCK_SIZE];

impl Inner {
    pub(super) fn truncate(&self, i: &mut Inode, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        if size < i.size {
            let bs = BLOCK_SIZE as u64;
            let keep = size.div_ceil(bs);
            self.delta.drop_pages(&self.st, i.ino, |p| p >= keep);
            if size % bs != 0 {
                let p = size / bs;
                let tail = (size % bs) as usize;
                // The new last page's tail must read as zeros if the file grows again. A
                // hole already does: only a page with a block is read and rewritten.
                if !self.delta.has_page(i.ino, p) && file::is_mapped(&mut self.st.tx(), i, p)? {
                    let page = file::read_page(&mut self.st.tx(), i, p)?;
                    self.delta.mark_overwrite(i.ino, p);
                    self.delta.add_page(&self.st, i, p, page);
                }
                self.delta.write_page(i.ino, p, tail, &ZEROS[..BLOCK_SIZE - tail]);
            }
            file::punch(&mut self.st.tx(), i, keep, 1 << 32)?;
        }
        i.size = size;
        Ok(())
    }

    /// The cost of writing `len` bytes at `offset`: one block per page not yet dirty, and
    /// the extent-map changes of its write-back.
    pub(super) fn write_cost(&self, i: &Inode, offset: u64, len: u64) -> Result<Cost> {
        let end = offset.checked_add(len).ok_or(Error::FileTooBig)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        let ino = i.ino;
        if len == 0 {
            return Ok(Cost::new(0, 0, false));
        }
        let bs = BLOCK_SIZE as u64;
        let (first, last) = (offset / bs, (end - 1) / bs);
        let have = self.delta.pages_in(ino, first, last);
        let before = self.delta.page_count(ino);
        let new = (last - first + 1) - have;
        Ok(Cost::new(Delta::writeback_meta(before, before + new, extent_depth(i)), new, false))
    }

    /// Write into dirty pages (charged by the caller); `i` is the file's inode, decoded
    /// under the same lock, and is stored with its new size and, unless `how` keeps them,
    /// times.
    pub(super) fn write(&self, i: &mut Inode, offset: u64, data: &[u8], how: WriteAs) -> Result<usize> {
        let end = offset.checked_add(data.len() as u64).ok_or(Error::FileTooBig)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        let ino = i.ino;
        // Regular files, and long symlink targets (written once at creation).
        match i.file_type() {
            Some(FileType::RegularFile) | Some(FileType::Symlink) => {}
            Some(FileType::Directory) => return Err(Error::IsDir),
            _ => return Err(Error::Invalid("write to a special file".into())),
        }
        if data.is_empty() {
            return Ok(0);
        }
        let bs = BLOCK_SIZE as u64;
        let (first, last) = (offset / bs, (end - 1) / bs);
        // Which pages lie over blocks the file has: a one-page write asks about its page
        // (one descent); a longer one reads the extents of its range once (one descent and
        // a scan), not one descent per page.
        let extents = if first == last { Vec::new() } else { file::extents_in(&mut self.st.tx(), i, first, last + 1)? };
        let mut next = extents.iter().peekable();
        let mut mapped = |st: &mut Tx, p: u64| -> Result<bool> {
            if first == last {
                return file::is_mapped(st, i, p);
            }
            while next.next_if(|e| e.end() <= p).is_some() {}
            Ok(next.peek().is_some_and(|e| e.logical <= p))
        };
        for p in first..=last {
            let ps = p * bs;
            let from = offset.max(ps);
            let to = end.min(ps + bs);
            let full = from == ps && to == ps + bs;
            let bytes = &data[(from - offset) as usize..(to - offset) as usize];
            if self.delta.write_page(ino, p, (from - ps) as usize, bytes) {
                continue;
            }
            if mapped(&mut self.st.tx(), p)? {
                self.delta.mark_overwrite(ino, p);
            }
            let page = if full {
                // Copied straight into a new page: no zeroing first, one copy.
                pages::copy_of(bytes)
            } else {
                let mut page = if ps >= i.size { pages::zeroed() } else { file::read_page(&mut self.st.tx(), i, p)? };
                page[(from - ps) as usize..(to - ps) as usize].copy_from_slice(bytes);
                page
            };
            self.delta.add_page(&self.st, i, p, page);
        }
        let dropped = how.unprivileged && self.drop_privileges(i, None)?;
        i.size = i.size.max(end);
        let t = now();
        if !how.keep_times {
            i.mtime = t;
            i.ctime = t;
        } else if dropped {
            i.ctime = t;
        }
        self.st.put_inode(i)?;
        Ok(data.len())
    }
}

/// Where a read puts its bytes: `buf(n)` gives room for exactly `n` of them (asked again
/// when a read is done over, with the new length).
trait ReadSink {
    fn buf(&mut self, n: usize) -> &mut [u8];
}

impl ReadSink for Vec<u8> {
    fn buf(&mut self, n: usize) -> &mut [u8] {
        self.clear();
        self.resize(n, 0);
        self
    }
}

impl ReadSink for AlignedBuf {
    fn buf(&mut self, n: usize) -> &mut [u8] {
        if self.len() != n {
            *self = AlignedBuf::new(n);
        }
        self
    }
}

impl ReadSink for [u8] {
    fn buf(&mut self, n: usize) -> &mut [u8] {
        &mut self[..n]
    }
}

/// A read worked out under the volume lock: done already (a read at or past the end, or
/// of a symlink kept in the inode), or a plan of device reads; and whether the read
/// should update the file's atime.
enum Planned {
    Done(Vec<u8>, bool),
    Read { plan: file::ReadPlan, epoch: u64, touch: bool },
}

/// Plan reading up to `size` bytes at `offset` of file `ino` (its data not in flight).
fn plan_read_of(
    r: &mut (impl MetaRead + ?Sized),
    delta: &Delta,
    atime: &AtimePolicy,
    ino: u64,
    offset: u64,
    size: usize,
) -> Result<Planned> {
    let i = read_inode(r, ino)?;
    match i.file_type() {
        Some(FileType::RegularFile) | Some(FileType::Symlink) => {}
        Some(FileType::Directory) => return Err(Error::IsDir),
        _ => return Err(Error::Invalid("read of a special file".into())),
    }
    let touch = atime.wants_update(i.atime, i.mtime, i.ctime, now());
    if offset >= i.size {
        return Ok(Planned::Done(Vec::new(), touch));
    }
    let len = (size as u64).min(i.size - offset) as usize;
    if let InodeData::InlineSymlink(t) = &i.data {
        // A short target lives in the inode: there are no blocks to read.
        return Ok(Planned::Done(t[offset as usize..offset as usize + len].to_vec(), touch));
    }
    let dirty = delta.with_pages(ino, |pages| file::dirty_in(pages, offset, len));
    let plan = file::plan_read(r, &i, dirty, offset, len)?;
    Ok(Planned::Read { plan, epoch: delta.epoch(), touch })
}

/// Times a read plans and reads with nothing held while write-backs move its file's
/// extents, before it reads under the file's lock.
const READ_TRIES: u32 = 3;

/// How long a wait for files unlinked moments before lasts (`Volume::settle_unlinked`).
/// The kernel sends a FORGET when it evicts the inode, and evicting one whose dirty pages
/// are being written back waits for that write-back: with the writeback cache, `rm` of a
/// file just written can take the FORGET tens of milliseconds (5 ms let `df` right after
/// such an `rm` miss the space now and then).
pub(super) const UNLINK_SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

impl Volume {
    /// Note an open handle: an unlinked inode lives until its last release.
    pub fn open_file(&self, ino: u64) -> Result<Attr> {
        let g = self.op(&[(ino, Mode::Read)]);
        let i = g.st.inode(ino)?;
        g.note_open(ino);
        g.attr(&i)
    }

    /// Release an open handle; frees the inode if it was the last reference.
    pub fn release(&self, ino: u64) -> Result<()> {
        {
            let g = self.op(&[(ino, Mode::Write)]);
            {
                let mut open = g.open.shard(ino);
                let n = match open.get_mut(&ino) {
                    Some(n) => {
                        *n -= 1;
                        *n
                    }
                    None => return Ok(()),
                };
                if n > 0 {
                    return Ok(());
                }
                open.remove(&ino);
            }
            if g.opts.read_only || g.is_failed() || !g.st.inode(ino).is_ok_and(|i| i.nlink == 0) {
                return Ok(());
            }
        }
        self.free_if_unused(ino)
    }

    /// Let a holder (see [`Volume::set_holder`]) say which inodes it still uses: an inode
    /// that loses its last link while `holder(ino)` is true and no handle is open stays
    /// alive, with no link, until [`Volume::forgotten`]. The FUSE frontend holds every
    /// inode the kernel has a reference to, so a file the kernel has open without telling
    /// the daemon (FUSE's zero-message opens) outlives its name. `holder` is called with
    /// the volume locked and must not call the volume.
    pub fn set_holder(&self, holder: Holder) {
        self.lock().holder = Some(holder);
    }

    /// Wait up to `UNLINK_SETTLE` (200 ms) for inodes that lost their last link less than that
    /// ago, while their holder held them or they were open, to be let go: a FUSE kernel
    /// sends the FORGET of a file it drops at unlink right after the UNLINK, and the
    /// RELEASE of a close in the background, and a write short of space must count their
    /// blocks (once). One still held or open after that stays counted as used. Only a
    /// thread that serves no requests should wait here (see
    /// [`Volume::unless_it_waits_for_requests`]); `statfs` counts them instead
    /// (`StatFs::settling`).
    pub fn settle_unlinked(&self) {
        let within = UNLINK_SETTLE;
        let deadline = std::time::Instant::now() + within;
        loop {
            {
                let g = self.s.inner.read_inner();
                let mut life = g.life.lock();
                let now = std::time::Instant::now();
                life.unlinked_at.retain(|_, u| now.duration_since(u.at) < within);
                if life.unlinked_at.is_empty() || now >= deadline {
                    return;
                }
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// The holder no longer uses `ino`: free it if it has no link and no open handle.
    pub fn forgotten(&self, ino: u64) -> Result<()> {
        {
            let g = self.s.inner.read_inner();
            let kept = {
                let life = g.life.lock();
                life.held.contains(&ino) || life.listed_held.contains(&ino)
            };
            if g.opts.read_only || g.is_failed() || !kept {
                // Not an unlinked inode kept for the holder: nothing to free (the common
                // case: no inode is read).
                return Ok(());
            }
        }
        self.free_if_unused(ino)
    }

    /// Free `ino` if it has no link, no open handle and no holder (a deletion, so it may
    /// use the reserve).
    fn free_if_unused(&self, ino: u64) -> Result<()> {
        let g = self.charged(&[(ino, Mode::Write)], |_| Ok(Cost::new(0, 0, true)))?;
        if g.is_open(ino) {
            return Ok(());
        }
        let was_held = {
            let mut life = g.life.lock();
            if g.is_held(ino) {
                // Released while the holder still uses it: `forgotten` frees it (it is on
                // the orphan list already, as every unlinked open inode is).
                if !life.held.contains(&ino) && g.st.inode(ino).is_ok_and(|i| i.nlink == 0) {
                    life.listed_held.insert(ino);
                }
                return Ok(());
            }
            life.listed_held.remove(&ino);
            life.held.remove(&ino)
        };
        let r = if was_held {
            g.st.inode(ino).and_then(|i| g.free_inode(i))
        } else if g.st.inode(ino).is_ok_and(|i| i.nlink == 0) {
            g.remove_orphan(ino)
        } else {
            Ok(())
        };
        // Only now are its blocks free: a `statfs` waiting for this inode to go
        // (`settle_unlinked`, in another thread) must not look at the space before.
        g.life.lock().unlinked_at.remove(&ino);
        r
    }

    /// Read up to `size` bytes at `offset`. The device reads run without the volume
    /// lock; if a write-back or commit ran meanwhile (either may rewrite a block that the
    /// plan named and that was freed and reused since), the read is done again under it.
    pub fn read(&self, ino: u64, offset: u64, size: usize) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_to(ino, offset, size, &mut out, true)?;
        Ok(out)
    }

    /// [`Volume::read`] into a buffer aligned as `O_DIRECT` wants, so that page-aligned
    /// reads go from the device straight into it (the FUSE layer replies from it).
    /// `kernel_reads_ahead`: the caller is the kernel filling its page cache, which reads
    /// ahead for sequential readers itself; the volume then does not (see `ahead.rs`).
    pub fn read_aligned(&self, ino: u64, offset: u64, size: usize, kernel_reads_ahead: bool) -> Result<AlignedBuf> {
        let mut out = AlignedBuf::new(0);
        self.read_to(ino, offset, size, &mut out, !kernel_reads_ahead)?;
        Ok(out)
    }

    /// [`Volume::read`] into `out` (up to its length): the number of bytes read. Whole
    /// pages of a page-aligned read go from the device straight into `out` when it is
    /// page-aligned (the FUSE layer passes its ring buffer). `kernel_reads_ahead` as for
    /// [`Volume::read_aligned`].
    pub fn read_into(&self, ino: u64, offset: u64, out: &mut [u8], kernel_reads_ahead: bool) -> Result<usize> {
        self.read_to(ino, offset, out.len(), out, !kernel_reads_ahead)
    }

    /// [`Volume::read`] into `sink`; returns the number of bytes read. `follow`: read
    /// ahead after it if it continues a sequential stream.
    fn read_to(
        &self,
        ino: u64,
        offset: u64,
        size: usize,
        sink: &mut (impl ReadSink + ?Sized),
        follow: bool,
    ) -> Result<usize> {
        // Planned with the file read locked, once no commit or flush is writing its data
        // back; the device reads run with nothing held. A write-back or commit meanwhile
        // (the extents may have moved) has it planned again, and, after a few such
        // races, done under the file's lock.
        for _ in 0..READ_TRIES {
            let planned = self.plan_read(ino, offset, size)?;
            let (plan, epoch, touch) = match planned {
                Planned::Done(bytes, touch) => {
                    sink.buf(bytes.len()).copy_from_slice(&bytes);
                    self.touch_atime(ino, touch);
                    return Ok(bytes.len());
                }
                Planned::Read { plan, epoch, touch } => (plan, epoch, touch),
            };
            let planned_at = contention::current_stamp();
            let piece = self.s.ahead.take(ino, offset, plan.len(), epoch);
            let ahead = &self.s.ahead;
            let out = sink.buf(plan.len());
            plan.execute_with(&*self.s.dev, out, &mut |block, dst| {
                let hit = piece.as_ref().is_some_and(|p| p.fill(block, dst));
                if hit {
                    ahead.hit();
                }
                hit
            })?;
            let seen = plan.data_seen(out);
            // Whether a write-back or commit ran meanwhile.
            let inner = self.s.inner.read_inner();
            if inner.delta.epoch() == epoch {
                // The blocks read were the file's all along: file data, which an overwrite
                // in place need not read again.
                for (b, n) in seen {
                    inner.st.note_data(b, n);
                }
                drop(inner);
                // What was read is the state the plan saw.
                contention::set_stamp(planned_at);
                self.touch_atime(ino, touch);
                if follow {
                    self.read_ahead(ino, offset, plan.len());
                }
                return Ok(plan.len());
            }
        }
        let (n, touch) = {
            let g = self.op_landed(&[(ino, Mode::Read)], ino)?;
            if g.is_failed() {
                return Err(Error::Failed);
            }
            let i = g.st.inode(ino)?;
            let touch = self.s.atime.wants_update(i.atime, i.mtime, i.ctime, now());
            let len = (size as u64).min(i.size.saturating_sub(offset)) as usize;
            let dirty = g.delta.with_pages(ino, |pages| file::dirty_in(pages, offset, len));
            let bytes = file::read(&mut g.st.tx(), &i, dirty, offset, len)?;
            sink.buf(bytes.len()).copy_from_slice(&bytes);
            (bytes.len(), touch)
        };
        self.touch_atime(ino, touch);
        Ok(n)
    }

    /// The byte ranges of regular file `ino` that hold data, in order and merged: written
    /// extents and pages not yet written back, clipped to the size. What lies between
    /// reads as zeros (SEEK_DATA and SEEK_HOLE; export keeps holes as holes).
    pub fn data_ranges(&self, ino: u64) -> Result<Vec<(u64, u64)>> {
        let g = self.op_landed(&[(ino, Mode::Read)], ino)?;
        let i = g.st.inode(ino)?;
        match i.file_type() {
            Some(FileType::RegularFile) => {}
            Some(FileType::Directory) => return Err(Error::IsDir),
            _ => return Err(Error::Invalid("data ranges of a file that is not regular".into())),
        }
        let bs = BLOCK_SIZE as u64;
        let mut blocks: Vec<(u64, u64)> = file::all_extents(&mut g.st.tx(), &i)?
            .iter()
            .filter(|e| !e.unwritten)
            .map(|e| (e.logical, e.end()))
            .collect();
        g.delta.with_pages(ino, |pages| blocks.extend(pages.into_iter().flatten().map(|(p, _)| (*p, p + 1))));
        blocks.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (s, e) in blocks {
            // Within MAX_FILE_SIZE (the rules), so these products do not wrap.
            let (s, e) = (s * bs, (e * bs).min(i.size));
            if s >= e {
                continue;
            }
            match out.last_mut() {
                Some(l) if l.1 >= s => l.1 = l.1.max(e),
                _ => out.push((s, e)),
            }
        }
        Ok(out)
    }

    /// Plan a read of `ino` with the file read locked, once no commit or flush is writing
    /// its data back, its metadata read with nothing held (`unlocked_reads`).
    fn plan_read(&self, ino: u64, offset: u64, size: usize) -> Result<Planned> {
        self.unlocked_reads(|| {
            let g = self.op_landed(&[(ino, Mode::Read)], ino)?;
            if g.is_failed() {
                return Err(Error::Failed);
            }
            let planned = plan_read_of(&mut g.st.tx(), &g.delta, &self.s.atime, ino, offset, size);
            planned
        })
    }

    /// After a read of `len` bytes at `offset` of `ino`: if it continues a sequential
    /// reader's stream, plan the next piece and have it read ahead (`ahead.rs`).
    fn read_ahead(&self, ino: u64, offset: u64, len: usize) {
        let Some((next, len)) = self.s.ahead.note(ino, offset, len) else { return };
        // Planning takes the file's lock again: that must not move the caller's
        // linearization stamp (the read happened where it was planned).
        let stamp = contention::current_stamp();
        let planned = self.plan_read(ino, next, len);
        contention::set_stamp(stamp);
        if let Ok(Planned::Read { plan, epoch, .. }) = planned {
            self.s.ahead.start(ino, next, epoch, plan.runs().to_vec());
        }
    }

    #[cfg(feature = "testing")]
    /// Device runs served from data read ahead (`ahead.rs`) since the volume was opened.
    pub fn read_ahead_hits(&self) -> u64 {
        self.s.ahead.hits()
    }

    #[cfg(feature = "testing")]
    /// Wait until the data being read ahead has been read (for tests that change a file
    /// behind a piece read ahead).
    pub fn settle_read_ahead(&self) {
        self.s.ahead.settle()
    }

    /// An access to file `ino` that the caller cannot see the reads of: an open for
    /// reading through a page cache that serves them (FUSE's). Updates atime now if the
    /// policy asks, as the first read would; returns whether it moved. `later_mtime`: the
    /// caller may hold a later mtime than the volume's (see
    /// [`Volume::read_touches_atime`]).
    pub fn note_access(&self, ino: u64, later_mtime: bool) -> bool {
        self.update_atime(ino, true, later_mtime)
    }

    /// Record an access to `ino` if the atime policy asked for it (`wanted`): a read
    /// succeeds even when this cannot be done (a failed volume, say). Returns whether
    /// atime moved.
    pub(super) fn touch_atime(&self, ino: u64, wanted: bool) -> bool {
        self.update_atime(ino, wanted, false)
    }

    fn update_atime(&self, ino: u64, wanted: bool, later_mtime: bool) -> bool {
        if !wanted {
            return false;
        }
        // The access belongs where the caller read: the atime update (not part of any
        // result) does not move the caller's linearization stamp.
        let stamp = contention::current_stamp();
        // No blocks needed: the inode block is rewritten in place.
        let r = self.charged_with(&[(ino, Mode::Write)], |g| Ok((Cost::new(0, 0, true), g.st.inode(ino)?))).and_then(
            |(g, mut i)| {
                let t = now();
                let mtime = if later_mtime { i.mtime.max(i.atime) } else { i.mtime };
                if !self.s.atime.wants_update(i.atime, mtime, i.ctime, t) {
                    return Ok(false);
                }
                i.atime = t;
                g.st.put_inode(&i)?;
                Ok(true)
            },
        );
        contention::set_stamp(stamp);
        r.unwrap_or_else(|e| {
            tracing::debug!("atime of inode {ino} not updated: {e}");
            false
        })
    }

    /// Write `data` at `offset`; returns the bytes written. The file keeps its setuid
    /// and setgid bits, as a write by a caller with CAP_FSETID does.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_with(ino, offset, data, WriteAs::default())
    }

    /// [`Volume::write`] by a caller without CAP_FSETID: the setuid bit, the setgid bit
    /// of a group-executable file and a file capability (`security.capability`) are
    /// dropped, as the kernel does for local filesystems.
    pub fn write_unprivileged(&self, ino: u64, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_with(ino, offset, data, WriteAs { unprivileged: true, ..WriteAs::default() })
    }

    /// [`Volume::write_with`] unless it would have to wait for room in the delta — for a
    /// flush or a commit to make it, or for the file's data in flight to land — and then
    /// `None`: the write is not done (a part may have been; the whole write is to be done
    /// again, with [`Volume::write_with`]). The FUSE layer answers the kernel's write-back
    /// this way on the thread that received it, and hands only the writes that must wait
    /// to a thread of their own, so that the other requests made on that CPU do not wait
    /// behind them.
    pub fn try_write(&self, ino: u64, offset: u64, data: &[u8], how: WriteAs) -> Result<Option<usize>> {
        let _no_wait = super::charge::NoWait::set();
        match self.write_with(ino, offset, data, how) {
            Err(e) if e.is_would_wait() => Ok(None),
            r => r.map(Some),
        }
    }

    /// [`Volume::write`] made as `how` says: by a caller without CAP_FSETID, or as a
    /// cache's write-back that leaves the file's times to the cache.
    pub fn write_with(&self, ino: u64, offset: u64, data: &[u8], how: WriteAs) -> Result<usize> {
        // Large writes go in chunks, each charged on its own; when one fails after others
        // succeeded, the write is short, as POSIX allows.
        let mut done = 0;
        let bs = BLOCK_SIZE as u64;
        for chunk in data.chunks(WRITE_CHUNK) {
            let off = offset + done as u64;
            let cost = |g: &Inner| {
                let i = g.st.inode(ino)?;
                if i.file_type() == Some(FileType::Symlink) {
                    return Err(Error::Invalid("write to a symlink".into()));
                }
                let c = g.write_cost(&i, off, chunk.len() as u64)?;
                Ok((if how.write_back { c.as_write_back() } else { c }, i))
            };
            // A partial page is read, modified and written: it must have landed.
            let partial = off % bs != 0 || (off + chunk.len() as u64) % bs != 0;
            let want = [(ino, Mode::Write)];
            let g = if partial { self.charged_on_with(ino, &want, cost) } else { self.charged_with(&want, cost) };
            let r = g.and_then(|(g, mut i)| {
                let n = g.write(&mut i, off, chunk, how)?;
                // Past a quarter of the dirty limits, write back in the background.
                if g.delta.wants_flush(&g.st) {
                    drop(g);
                    self.s.ask_flush();
                }
                Ok(n)
            });
            match r {
                Ok(n) => done += n,
                // Not a short write: the whole write is done again by a caller that waits.
                Err(e) if e.is_would_wait() => return Err(e),
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }

    /// fallocate: mode 0 allocates (and may extend), `keep_size` does not change the
    /// size, `punch` (which requires keep_size) frees the range.
    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, keep_size: bool, punch: bool) -> Result<()> {
        if len == 0 {
            return Err(Error::Invalid("zero length".into()));
        }
        let end = offset.checked_add(len).ok_or(Error::FileTooBig)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        if punch && !keep_size {
            return Err(Error::Invalid("punch hole needs keep size".into()));
        }
        let bs = BLOCK_SIZE as u64;
        let (s, e) = (offset / bs, end.div_ceil(bs));
        let mut g = self.charged_on(ino, &[(ino, Mode::Write)], |g| {
            let i = g.st.inode(ino)?;
            if i.file_type() != Some(FileType::RegularFile) {
                return Err(if i.is_dir() { Error::IsDir } else { Error::Invalid("not a file".into()) });
            }
            let depth = extent_depth(&i);
            let n = (e - s).min(FALLOC_STEP);
            Ok(if punch {
                // Zeroing the two partial end pages; unmapping may split one extent.
                Cost::new(2 * depth + 3 + Delta::writeback_meta(0, 2, depth), 2, true)
            } else {
                // Blocks are allocated at once, so they are metadata-like: not promised.
                Cost::new(g.prealloc_meta(&i, n) + n, 0, false)
            })
        })?;
        if punch {
            let mut i = g.st.inode(ino)?;
            let end = end.min(i.size);
            if offset >= end {
                return Ok(());
            }
            // Zero the partial pages at both ends, unmap the whole pages between.
            let first_full = offset.div_ceil(bs);
            let last_full = end / bs;
            let zero_ranges = if first_full > last_full {
                vec![(offset, end)]
            } else {
                vec![(offset, first_full * bs), (last_full * bs, end)]
            };
            for (s, e) in zero_ranges {
                if e > s {
                    let zeros = vec![0u8; (e - s) as usize];
                    g.write(&mut i, s, &zeros, WriteAs::default())?;
                }
            }
            if first_full < last_full {
                g.delta.drop_pages(&g.st, ino, |p| (first_full..last_full).contains(&p));
                file::punch(&mut g.st.tx(), &mut i, first_full, last_full)?;
            }
            i.ctime = now();
            i.mtime = i.ctime;
            g.st.put_inode(&i)?;
            return Ok(());
        }
        // Preallocation maps blocks at once: in steps, each charged on its own and
        // stopping when the delta's log fills, so any size fits.
        let limit = (g.delta.log_capacity() as usize).saturating_sub(WRITEBACK_HEADROOM);
        let mut at = s;
        loop {
            let mut i = g.st.inode(ino)?;
            at = file::preallocate(&mut g.st.tx(), &mut i, at, e, FALLOC_STEP, limit)?;
            if at >= e && !keep_size && end > i.size {
                i.size = end;
            }
            i.ctime = now();
            g.st.put_inode(&i)?;
            if at >= e {
                return Ok(());
            }
            drop(g);
            g = self.charged(&[(ino, Mode::Write)], |g| {
                let i = g.st.inode(ino)?;
                let n = (e - at).min(FALLOC_STEP);
                Ok(Cost::new(g.prealloc_meta(&i, n) + n, 0, false))
            })?;
        }
    }
}

impl Inner {
    /// Blocks of files that lost their last link less than `UNLINK_SETTLE` ago while the
    /// holder (the kernel) held them, not open: their FORGET is on its way and frees them,
    /// so `statfs` counts them as free rather than wait for it. One removed while open
    /// may stay open for long (a temporary file's usual life) and counts as used.
    pub(super) fn settling_blocks(&self) -> u64 {
        let life = self.life.lock();
        let now = std::time::Instant::now();
        life.unlinked_at
            .values()
            .filter(|u| !u.open && now.duration_since(u.at) < UNLINK_SETTLE)
            .map(|u| u.blocks)
            .sum()
    }

    /// Extent-map blocks a preallocation of `n` blocks into file `i` may need: a split at
    /// every level, plus a leaf per 64 new extents (a split leaves at least that many in
    /// a leaf). The new extents are at most `n`, and at most one per piece of a free run
    /// that lands in one hole of the file: the runs of free space plus the file's holes
    /// (at most its extents + 1). On a volume with little fragmentation, preallocating all
    /// that statfs reports free then costs a handful of blocks, not a 64th of it.
    fn prealloc_meta(&self, i: &Inode, n: u64) -> u64 {
        let holes = match i.data {
            InodeData::Extents { n, .. } => u64::from(n) + 1,
            InodeData::ExtentTree { count, .. } => u64::from(count) + 1,
            _ => 1,
        };
        let extents = n.min(self.st.space().free_runs() + holes);
        2 * extent_depth(i) + 3 + extents.div_ceil(64)
    }
}
