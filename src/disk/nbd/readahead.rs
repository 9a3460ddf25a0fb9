//! Sequential readahead of large reads (file data), and keeping its chunks fresh against
//! writes.

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc};

use parking_lot::Mutex;

use super::device::NbdDevice;
use super::proto::CMD_READ;
use super::transmission::wait;
use super::{eio, BS};
use crate::error::Result;

/// Reads of at least this many bytes are candidates for sequential readahead (file data
/// comes through FUSE in reads of up to 1 MiB; metadata in single blocks and prefetch
/// batches).
pub(super) const RA_MIN_READ: usize = 64 << 10;
/// How far ahead of a sequential reader the readahead keeps requests in flight.
const RA_WINDOW: u64 = (16 << 20) / BS;
/// Size of one readahead request (servers serve a bounded number of requests at once,
/// nbdkit 16 per connection: large pieces keep their bandwidth up).
const RA_PIECE: u64 = (1 << 20) / BS;

/// Sequential readahead of large reads: once a large read starts where the previous one
/// ended, the blocks up to [`RA_WINDOW`] past the furthest read are requested ahead, in
/// pieces of [`RA_PIECE`] blocks, so a single-threaded sequential reader has many requests
/// in flight instead of one. The kernel sends a window of readahead as several READs at
/// once and the FUSE threads serve them in any order, so a chunk leaves the window once
/// all its blocks were read (or when it falls a window behind the furthest read), never
/// because a read beyond it came; and a read waits for and copies its chunks without the
/// lock, so reads of different chunks proceed side by side. Chunks overlapping a write or
/// trim are dropped (when it is issued and when it completes), so a read that starts
/// after a write completed never sees older data.
#[derive(Default)]
pub(super) struct Ahead {
    /// Where the next read of a sequential stream would start (the end of the furthest).
    next: u64,
    /// The end of what was requested ahead.
    end: u64,
    /// Chunks requested and not yet all read, by first block.
    chunks: BTreeMap<u64, Entry>,
}

struct Entry {
    chunk: Arc<Chunk>,
    /// Blocks of it read so far.
    used: u64,
}

pub(super) struct Chunk {
    start: u64,
    blocks: u64,
    reply: Mutex<Reply>,
}

enum Reply {
    Waiting(mpsc::Receiver<Result<Vec<u8>>>),
    Ready(Vec<u8>),
    Failed,
}

impl Chunk {
    /// Copy the part of `[block, block + buf blocks)` this chunk holds into `buf`,
    /// waiting for its reply first if it has not come.
    fn copy_into(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        let mut reply = self.reply.lock();
        if let Reply::Waiting(_) = &*reply {
            let Reply::Waiting(rx) = std::mem::replace(&mut *reply, Reply::Failed) else { unreachable!() };
            match wait(rx) {
                Ok(d) if d.len() as u64 == self.blocks * BS => *reply = Reply::Ready(d),
                Ok(_) => return Err(eio("nbd: readahead reply of the wrong length")),
                Err(e) => return Err(e),
            }
        }
        let Reply::Ready(d) = &*reply else { return Err(eio("nbd: readahead failed earlier")) };
        let n = buf.len() as u64 / BS;
        let from = block.max(self.start);
        let to = (block + n).min(self.start + self.blocks);
        buf[((from - block) * BS) as usize..((to - block) * BS) as usize]
            .copy_from_slice(&d[((from - self.start) * BS) as usize..((to - self.start) * BS) as usize]);
        Ok(())
    }

    /// Wait for the reply if it is still out (a flush leaves nothing in flight).
    pub(super) fn settle(&self) {
        let mut reply = self.reply.lock();
        if let Reply::Waiting(rx) = std::mem::replace(&mut *reply, Reply::Failed) {
            let _ = rx.recv();
        }
    }
}

impl Ahead {
    fn invalidate(&mut self, block: u64, count: u64) {
        self.chunks.retain(|_, e| e.chunk.start + e.chunk.blocks <= block || block + count <= e.chunk.start);
    }

    /// The chunks that together hold `[block, block + n)`, if they do.
    fn covering(&self, block: u64, n: u64) -> Option<Vec<Arc<Chunk>>> {
        let mut out = Vec::new();
        let mut at = block;
        let (&first, _) = self.chunks.range(..=block).next_back()?;
        for (_, e) in self.chunks.range(first..) {
            if e.chunk.start > at || at >= block + n {
                break;
            }
            out.push(e.chunk.clone());
            at = e.chunk.start + e.chunk.blocks;
        }
        (at >= block + n).then_some(out)
    }

    /// `[block, block + n)` was read from the chunks: drop those now read in full, and
    /// those a window behind the furthest read (a read that never came).
    fn consumed(&mut self, block: u64, n: u64) {
        let starts: Vec<u64> = self.chunks.range(..block + n).map(|(s, _)| *s).collect();
        for s in starts {
            let e = self.chunks.get_mut(&s).expect("listed");
            let (cs, ce) = (e.chunk.start, e.chunk.start + e.chunk.blocks);
            if ce > block {
                e.used += (block + n).min(ce) - block.max(cs);
            }
            if e.used >= e.chunk.blocks || ce + RA_WINDOW <= self.next {
                self.chunks.remove(&s);
            }
        }
    }

    /// Every chunk, for waiting on before a flush or a disconnect.
    pub(super) fn take_all(&mut self) -> Vec<Arc<Chunk>> {
        self.end = self.next;
        std::mem::take(&mut self.chunks).into_values().map(|e| e.chunk).collect()
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
        let covering = ra.covering(block, n);
        // Where the stream goes on, or inside its window (the kernel's READs of one window
        // come in any order); a read near one that started over does not open a window.
        let near = block == ra.next || (ra.end > ra.next && block + RA_WINDOW >= ra.next && block < ra.end);
        if covering.is_none() && !near {
            // Another stream, or none: start over from here.
            ra.take_all();
            ra.next = block + n;
            ra.end = ra.next;
        } else {
            ra.next = ra.next.max(block + n);
            self.top_up(&mut ra);
        }
        drop(ra);
        let Some(chunks) = covering else {
            let rxs = self.submit_read(block, buf.len())?;
            return Self::finish_read(rxs, buf);
        };
        for c in &chunks {
            if let Err(e) = c.copy_into(block, buf) {
                // Readahead is a guess: forget it and read directly, which reports a real
                // error if there is one.
                self.ahead.lock().take_all();
                tracing::debug!("readahead failed ({e}); reading directly");
                let rxs = self.submit_read(block, buf.len())?;
                return Self::finish_read(rxs, buf);
            }
        }
        self.ahead.lock().consumed(block, n);
        Ok(())
    }

    /// Request what is missing up to a window past the furthest read.
    fn top_up(&self, ra: &mut Ahead) {
        let piece = RA_PIECE.min(u64::from(self.shared.info.max_payload) / BS).max(1);
        let mut at = ra.end.max(ra.next);
        while at < (ra.next + RA_WINDOW).min(self.blocks) {
            // Aligned pieces: with several connections each is one region.
            let k = (piece - at % piece).min(self.blocks - at);
            match self.shared.submit(CMD_READ, 0, at * BS, (k * BS) as u32, None) {
                Ok(rx) => {
                    let chunk = Arc::new(Chunk { start: at, blocks: k, reply: Mutex::new(Reply::Waiting(rx)) });
                    ra.chunks.insert(at, Entry { chunk, used: 0 });
                }
                Err(_) => break,
            }
            at += k;
        }
        ra.end = at;
    }
}
