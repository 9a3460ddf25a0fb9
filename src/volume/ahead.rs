//! Read-ahead of file data for sequential readers the kernel does not read ahead for
//! (`O_DIRECT`): once a file has been read twice in a row where the previous read ended,
//! in pieces of at least [`AHEAD_MIN`] bytes, the next piece of the same size is planned
//! at once and read from the device on a thread of its own (`dxfs-ahead`), and the read
//! that asks for it copies those runs instead of waiting for the device.
//!
//! Why what was read ahead is still right when it is used: a read uses it only for the
//! device runs its own plan names, at the same blocks, and only while the delta's epoch
//! is the one the piece was planned in. A block a file references is never written while
//! it is referenced (redirect on write; a delta's frees become allocatable only after its
//! snapshot), and every snapshot and every write-back moves the epoch. What is dirty in
//! the delta comes from the read's own plan, laid over the runs as always.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::disk::codec::BLOCK_SIZE;
use crate::disk::device::{AlignedBuf, BlockDevice, BufferPool};
use crate::error::Result;

/// The smallest read that counts towards a sequential stream: shorter ones gain less than
/// the handoff costs.
const AHEAD_MIN: usize = 64 * 1024;

/// The largest piece read ahead (a longer read is read ahead in part).
const AHEAD_MAX: usize = 4 << 20;

/// Files followed at once (the oldest is forgotten first).
const STREAMS: usize = 8;

/// Buffers of used pieces kept for the next ones (see `BufferPool`).
const KEPT_BUFFERS: usize = 4;

/// Buffers of used pieces, for the next pieces to read into.
type Pool = Arc<BufferPool>;

/// Device runs of one piece of a file, read ahead.
pub(super) struct Piece {
    offset: u64,
    epoch: u64,
    /// (first page, block, pages), as in the plan it was made from.
    runs: Vec<(u64, u64, u64)>,
    /// The runs' blocks one after another, once read (None if the read failed); a kept
    /// buffer may be longer than the runs.
    data: Mutex<Option<Option<AlignedBuf>>>,
    done: Condvar,
    /// Where the buffer goes once the piece is used or forgotten.
    pool: Pool,
}

impl Drop for Piece {
    fn drop(&mut self) {
        if let Some(Some(buf)) = self.data.get_mut().take() {
            self.pool.give(buf);
        }
    }
}

impl Piece {
    /// The data, waiting for the device read to end; None if it failed.
    fn wait(&self) -> parking_lot::MappedMutexGuard<'_, Option<AlignedBuf>> {
        let mut d = self.data.lock();
        while d.is_none() {
            self.done.wait(&mut d);
        }
        parking_lot::MutexGuard::map(d, |d| d.as_mut().expect("just checked"))
    }

    /// Fill `dst` (whole blocks from `block` on) from the piece, if one of its runs holds
    /// all of them.
    pub(super) fn fill(&self, block: u64, dst: &mut [u8]) -> bool {
        let n = (dst.len() / BLOCK_SIZE) as u64;
        let data = self.wait();
        let Some(data) = data.as_ref() else { return false };
        let mut at = 0u64;
        for &(_, phys, len) in &self.runs {
            if phys <= block && block + n <= phys + len {
                let from = ((at + block - phys) as usize) * BLOCK_SIZE;
                dst.copy_from_slice(&data[from..from + dst.len()]);
                return true;
            }
            at += len;
        }
        false
    }
}

/// Where a file's sequential reader is, and the piece read ahead for it.
struct Stream {
    ino: u64,
    /// Where the last read ended.
    next: u64,
    piece: Option<Arc<Piece>>,
}

/// The reading thread and the way to hand it pieces (closed to end it).
type Worker = (mpsc::Sender<Arc<Piece>>, JoinHandle<()>);

/// The read-ahead of one volume: the streams it follows and its reading thread.
pub(super) struct ReadAhead {
    /// Off: nothing is read ahead (`OpenOptions::data_readahead`).
    on: bool,
    dev: Arc<dyn BlockDevice>,
    streams: Mutex<Vec<Stream>>,
    worker: Mutex<Option<Worker>>,
    /// Device runs served from pieces read ahead.
    hits: AtomicU64,
    pool: Pool,
}

impl ReadAhead {
    pub(super) fn new(dev: Arc<dyn BlockDevice>, on: bool) -> ReadAhead {
        ReadAhead {
            on,
            dev,
            streams: Mutex::new(Vec::new()),
            worker: Mutex::new(None),
            hits: AtomicU64::new(0),
            pool: Arc::new(BufferPool::new(KEPT_BUFFERS)),
        }
    }

    /// The piece read ahead for a read of `ino` at `offset` planned in `epoch`, if any
    /// (taken: each piece serves one read).
    pub(super) fn take(&self, ino: u64, offset: u64, len: usize, epoch: u64) -> Option<Arc<Piece>> {
        if len < AHEAD_MIN {
            return None;
        }
        let mut streams = self.streams.lock();
        let s = streams.iter_mut().find(|s| s.ino == ino)?;
        match &s.piece {
            Some(p) if p.offset == offset && p.epoch == epoch => s.piece.take(),
            Some(p) if p.offset == offset => {
                // Planned before a write-back or commit: of no use now.
                s.piece = None;
                None
            }
            _ => None,
        }
    }

    /// Count a run served from a piece.
    pub(super) fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    #[cfg(feature = "testing")]
    /// Device runs served from pieces read ahead, since the volume was opened.
    pub(super) fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Note a read of `len` bytes at `offset` of `ino` that is done; returns the piece to
    /// read ahead (offset and length) when the file is being read sequentially and
    /// nothing is read ahead for it yet.
    pub(super) fn note(&self, ino: u64, offset: u64, len: usize) -> Option<(u64, usize)> {
        if len < AHEAD_MIN || !self.on {
            // Not part of a stream worth following; no lock taken for small reads.
            return None;
        }
        let mut streams = self.streams.lock();
        let next = offset + len as u64;
        let Some(i) = streams.iter().position(|s| s.ino == ino) else {
            if streams.len() == STREAMS {
                streams.remove(0);
            }
            streams.push(Stream { ino, next, piece: None });
            return None;
        };
        let s = &mut streams[i];
        let sequential = s.next == offset;
        s.next = next;
        if !sequential || s.piece.as_ref().is_some_and(|p| p.offset >= next) {
            return None;
        }
        Some((next, len.min(AHEAD_MAX)))
    }

    /// Read `runs` (a plan of `ino` at `offset`, made in `epoch`) ahead, on the thread.
    pub(super) fn start(&self, ino: u64, offset: u64, epoch: u64, runs: Vec<(u64, u64, u64)>) {
        if runs.is_empty() {
            return;
        }
        let piece = Arc::new(Piece {
            offset,
            epoch,
            runs,
            data: Mutex::new(None),
            done: Condvar::new(),
            pool: self.pool.clone(),
        });
        {
            let mut streams = self.streams.lock();
            let Some(s) = streams.iter_mut().find(|s| s.ino == ino) else { return };
            s.piece = Some(piece.clone());
        }
        let mut w = self.worker.lock();
        if w.is_none() {
            let (tx, rx) = mpsc::channel::<Arc<Piece>>();
            let dev = self.dev.clone();
            let pool = self.pool.clone();
            match std::thread::Builder::new().name("dxfs-ahead".into()).spawn(move || {
                super::commit::unpin();
                for p in rx {
                    // A panic must not leave the piece's reader waiting for ever.
                    let read =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_runs(&*dev, &p.runs, &pool)));
                    let data = read.ok().and_then(|r| r.ok());
                    *p.data.lock() = Some(data);
                    p.done.notify_all();
                }
            }) {
                Ok(t) => *w = Some((tx, t)),
                Err(_) => {
                    // No thread: nothing is read ahead; the piece must not be waited for.
                    *piece.data.lock() = Some(None);
                    return;
                }
            }
        }
        let (tx, _) = w.as_ref().expect("just started");
        if tx.send(piece.clone()).is_err() {
            *piece.data.lock() = Some(None);
        }
    }

    #[cfg(feature = "testing")]
    /// Wait until every piece under way has been read.
    pub(super) fn settle(&self) {
        let pieces: Vec<Arc<Piece>> = self.streams.lock().iter().filter_map(|s| s.piece.clone()).collect();
        for p in pieces {
            drop(p.wait());
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        if let Some((tx, t)) = self.worker.get_mut().take() {
            drop(tx);
            let _ = t.join();
        }
    }
}

/// The blocks of `runs`, one run after another, in a kept buffer if one can hold them.
fn read_runs(dev: &dyn BlockDevice, runs: &[(u64, u64, u64)], pool: &Pool) -> Result<AlignedBuf> {
    let total = runs.iter().map(|r| r.2).sum::<u64>() as usize * BLOCK_SIZE;
    let mut buf = pool.take(total);
    let mut at = 0usize;
    for &(_, phys, n) in runs {
        let len = n as usize * BLOCK_SIZE;
        dev.read_data(phys, &mut buf[at..at + len])?;
        at += len;
    }
    Ok(buf)
}
