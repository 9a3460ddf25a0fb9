//! Operations on ranges of a file beyond plain write: zeroing a range, collapsing one
//! out of a file and inserting a hole (fallocate's ZERO_RANGE, COLLAPSE_RANGE and
//! INSERT_RANGE, as ext4 has them), and copying a range between files inside the volume
//! (copy_file_range, so the data does not cross into the kernel and back).

use crate::disk::codec::*;
use crate::disk::format::*;
use crate::error::{Error, Result};
use crate::fs::file;

use super::*;

/// Largest piece of a copy read and written at once (bytes).
const COPY_CHUNK: usize = 1 << 20;

impl Volume {
    /// Zero `[offset, offset + len)`, keeping blocks allocated for it (unwritten), and
    /// extend the file unless `keep_size` (fallocate ZERO_RANGE).
    pub fn zero_range(&self, ino: u64, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        // Zero what holds data (punch keeps the size and stops at the end of the file),
        // then allocate the range, which also extends the file if asked.
        self.fallocate(ino, offset, len, true, true)?;
        self.fallocate(ino, offset, len, keep_size, false)
    }

    /// Remove `[offset, offset + len)` from the file, moving what follows down and
    /// shortening the file by `len` (fallocate COLLAPSE_RANGE). Both must be multiples
    /// of the block size, and the range must end before the end of the file.
    pub fn collapse_range(&self, ino: u64, offset: u64, len: u64) -> Result<()> {
        self.shift_range(ino, offset, len, false)
    }

    /// Insert a hole of `len` bytes at `offset`, moving what follows up and growing the
    /// file by `len` (fallocate INSERT_RANGE). Both must be multiples of the block size,
    /// and `offset` must lie inside the file.
    pub fn insert_range(&self, ino: u64, offset: u64, len: u64) -> Result<()> {
        self.shift_range(ino, offset, len, true)
    }

    fn shift_range(&self, ino: u64, offset: u64, len: u64, insert: bool) -> Result<()> {
        let bs = BLOCK_SIZE as u64;
        if len == 0 || offset % bs != 0 || len % bs != 0 {
            return Err(Error::Invalid("range not block-aligned".into()));
        }
        let end = offset.checked_add(len).ok_or(Error::FileTooBig)?;
        let (s, n) = (offset / bs, len / bs);
        let g = self.charged_on(ino, &[(ino, Mode::Write)], |g| {
            let i = g.st.inode(ino)?;
            if i.file_type() != Some(FileType::RegularFile) {
                return Err(if i.is_dir() { Error::IsDir } else { Error::Invalid("not a file".into()) });
            }
            if insert && (offset >= i.size || i.size + len > MAX_FILE_SIZE) {
                return Err(if offset >= i.size {
                    Error::Invalid("insert at or past the end".into())
                } else {
                    Error::FileTooBig
                });
            }
            if !insert && end >= i.size {
                return Err(Error::Invalid("collapse reaching the end of the file".into()));
            }
            // Every moved extent is removed and inserted again: the leaves holding them
            // (at least 32 records each, a half-full leaf holds more) are rewritten and
            // as many new ones may be split off, each with its path; plus the punch of the
            // collapsed range and the split of one extent.
            let depth = extent_depth(&i);
            let moved = file::extents_after(&mut g.st.tx(), &i, s)?;
            let meta = 2 * (moved / 32 + 1) * (depth + 1) + 2 * (2 * depth + 2) + 4;
            if meta + OP_LOG_BLOCKS > g.delta.log_capacity() / 2 {
                return Err(Error::NotSupported);
            }
            Ok(Cost::new(meta, 0, !insert))
        })?;
        let mut i = g.st.inode(ino)?;
        if insert {
            g.delta.shift_pages(ino, s, n as i64);
            file::shift(&mut g.st.tx(), &mut i, s, n as i64)?;
            i.size += len;
        } else {
            g.delta.drop_pages(&g.st, ino, |p| (s..s + n).contains(&p));
            file::punch(&mut g.st.tx(), &mut i, s, s + n)?;
            g.delta.shift_pages(ino, s + n, -(n as i64));
            file::shift(&mut g.st.tx(), &mut i, s + n, -(n as i64))?;
            i.size -= len;
        }
        let t = now();
        i.mtime = t;
        i.ctime = t;
        g.st.put_inode(&i)
    }

    /// Copy `len` bytes from `src` at `off_in` to `dst` at `off_out` inside the volume;
    /// returns the bytes copied (fewer at the end of `src`). Overlapping ranges of one file
    /// are refused, as copy_file_range(2) does.
    pub fn copy_range(&self, src: u64, off_in: u64, dst: u64, off_out: u64, len: u64) -> Result<u64> {
        if src == dst && off_in < off_out.saturating_add(len) && off_out < off_in.saturating_add(len) {
            return Err(Error::Invalid("overlapping copy within one file".into()));
        }
        for ino in [src, dst] {
            match self.getattr(ino)?.kind {
                FileType::RegularFile => {}
                FileType::Directory => return Err(Error::IsDir),
                _ => return Err(Error::Invalid("copy of a special file".into())),
            }
        }
        let mut done = 0u64;
        while done < len {
            let want = (len - done).min(COPY_CHUNK as u64) as usize;
            let data = self.read(src, off_in + done, want)?;
            if data.is_empty() {
                break;
            }
            let n = self.write(dst, off_out + done, &data)?;
            done += n as u64;
            if n < data.len() {
                break;
            }
        }
        Ok(done)
    }
}
