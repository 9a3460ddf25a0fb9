//! Sequential readahead of large reads (file data), and keeping its chunks fresh against
//! writes.

use std::sync::mpsc;

use parking_lot::Mutex;

use super::device::NbdDevice;
use super::proto::CMD_READ;
use super::transmission::wait;
use super::{eio, BS};
use crate::error::Result;

/// Reads of at least this many bytes are candidates for sequential readahead (file data
/// comes through FUSE in 128 KiB reads; metadata in single blocks and prefetch batches).
pub(super) const RA_MIN_READ: usize = 64 << 10;
/// How far ahead of a sequential reader the readahead keeps requests in flight.
const RA_WINDOW: u64 = (16 << 20) / BS;
/// Size of one readahead request (servers serve a bounded number of requests at once,
/// nbdkit 16 per connection: large pieces keep their bandwidth up).
const RA_PIECE: u64 = (1 << 20) / BS;

/// Sequential readahead of large reads: once a large read starts where the previous one
/// ended, the next [`RA_WINDOW`] blocks are requested ahead, in pieces of [`RA_PIECE`]
/// blocks, so a single-threaded sequential reader has many requests in flight instead of
/// one. Chunks overlapping a write or trim are dropped (when it is issued and when it
/// completes), so a chunk never holds data older than a completed write.
#[derive(Default)]
pub(super) struct Ahead {
    /// Where the next read of a sequential stream would start.
    pub(super) next: u64,
    /// Contiguous, ascending chunks.
    pub(super) chunks: std::collections::VecDeque<Chunk>,
}

pub(super) struct Chunk {
    pub(super) start: u64,
    pub(super) blocks: u64,
    pub(super) rx: Option<mpsc::Receiver<Result<Vec<u8>>>>,
    pub(super) data: Option<Vec<u8>>,
}

impl Ahead {
    fn invalidate(&mut self, block: u64, count: u64) {
        self.chunks.retain(|c| c.start + c.blocks <= block || block + count <= c.start);
        // What is left may no longer be contiguous: keep only the leading run.
        let mut keep = 0;
        for i in 0..self.chunks.len() {
            if i > 0 && self.chunks[i - 1].start + self.chunks[i - 1].blocks != self.chunks[i].start {
                break;
            }
            keep = i + 1;
        }
        self.chunks.truncate(keep);
    }
}

/// Drops readahead chunks over a range being written, now and again when dropped (once
/// the write completed).
pub(super) struct Fresh<'a> {
    ahead: &'a Mutex<Ahead>,
    block: u64,
    count: u64,
}

impl<'a> Fresh<'a> {
    pub(super) fn new(ahead: &'a Mutex<Ahead>, block: u64, count: u64) -> Fresh<'a> {
        ahead.lock().invalidate(block, count);
        Fresh { ahead, block, count }
    }
}

impl Drop for Fresh<'_> {
    fn drop(&mut self) {
        self.ahead.lock().invalidate(self.block, self.count);
    }
}

impl NbdDevice {
    /// A large read, served from readahead chunks when a sequential stream has them in
    /// flight; keeps the window ahead of a sequential reader full.
    pub(super) fn read_ahead(&self, block: u64, n: u64, buf: &mut [u8]) -> Result<()> {
        let mut ra = self.ahead.lock();
        let covered = ra.chunks.front().is_some_and(|c| c.start <= block)
            && ra.chunks.back().is_some_and(|c| c.start + c.blocks >= block + n);
        let sequential = block == ra.next;
        if covered {
            let mut failed = None;
            for c in ra.chunks.iter_mut() {
                if c.start + c.blocks <= block || c.start >= block + n {
                    continue;
                }
                if c.data.is_none() {
                    match c.rx.take().map(wait) {
                        Some(Ok(d)) if d.len() as u64 == c.blocks * BS => c.data = Some(d),
                        Some(Err(e)) => {
                            failed = Some(e);
                            break;
                        }
                        _ => {
                            failed = Some(eio("nbd: readahead reply of the wrong length"));
                            break;
                        }
                    }
                }
                let d = c.data.as_ref().expect("filled above");
                let from = block.max(c.start);
                let to = (block + n).min(c.start + c.blocks);
                buf[((from - block) * BS) as usize..((to - block) * BS) as usize]
                    .copy_from_slice(&d[((from - c.start) * BS) as usize..((to - c.start) * BS) as usize]);
            }
            if let Some(e) = failed {
                // Readahead is a guess: forget it and read directly, which reports a
                // real error if there is one.
                ra.chunks.clear();
                drop(ra);
                tracing::debug!("readahead failed ({e}); reading directly");
                let rxs = self.submit_read(block, buf.len())?;
                return Self::finish_read(rxs, buf);
            }
            while ra.chunks.front().is_some_and(|c| c.start + c.blocks <= block + n) {
                ra.chunks.pop_front();
            }
        } else {
            ra.chunks.clear();
            let rxs = self.submit_read(block, buf.len())?;
            Self::finish_read(rxs, buf)?;
        }
        ra.next = block + n;
        if covered || sequential {
            // Top the window up.
            let piece = RA_PIECE.min(u64::from(self.shared.info.max_payload) / BS).max(1);
            let mut at = ra.chunks.back().map_or(block + n, |c| c.start + c.blocks);
            while at < (block + n + RA_WINDOW).min(self.blocks) {
                // Aligned pieces: with several connections each is one region.
                let k = (piece - at % piece).min(self.blocks - at);
                match self.shared.submit(CMD_READ, 0, at * BS, (k * BS) as u32, None) {
                    Ok(rx) => ra.chunks.push_back(Chunk { start: at, blocks: k, rx: Some(rx), data: None }),
                    Err(_) => break,
                }
                at += k;
            }
        }
        Ok(())
    }
}
