//! The [`BlockDevice`]: reads, writes, flushes and trims as NBD requests over the
//! connections of one export.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::handshake::connect_all;
use super::proto::*;
use super::readahead::{Ahead, Fresh, RA_MIN_READ};
use super::reader::POLL;
use super::supervisor::supervise;
use super::transmission::{wait, Sender, Shared, State};
use super::uri::NbdTarget;
use super::{eio, BS};
use crate::disk::device::{check_request, check_trim, BlockDevice, Counters, IoStats};
use crate::error::{Error, Result};

/// Largest trim sent as one request.
const MAX_TRIM: u64 = 1 << 30;

/// A block device served by an NBD server. See the module documentation.
pub struct NbdDevice {
    pub(super) shared: Arc<Shared>,
    pub(super) blocks: u64,
    read_only: bool,
    counters: Counters,
    reader: Option<JoinHandle<()>>,
    pub(super) ahead: Mutex<Ahead>,
}

impl NbdDevice {
    /// Connect to an export given as an NBD URI (see [`NbdTarget::parse`]).
    pub fn open(uri: &str, read_only: bool) -> Result<NbdDevice> {
        Self::connect(NbdTarget::parse(uri)?, read_only)
    }

    /// Connect to an export. Fails with a clear error if the server cannot be reached, has
    /// no such export, hangs up during the handshake, or offers a size that is not a
    /// multiple of 4 KiB; a writable open of a read-only export is refused.
    pub fn connect(target: NbdTarget, read_only: bool) -> Result<NbdDevice> {
        let (streams, info) = connect_all(&target, None)?;
        if !read_only && info.flags & TFLAG_READ_ONLY != 0 {
            return Err(Error::ReadOnly);
        }
        let mut readers = Vec::with_capacity(streams.len());
        let mut send = Vec::with_capacity(streams.len());
        for stream in streams {
            readers.push(stream.try_clone()?);
            stream.set_timeouts(Some(POLL), Some(target.timeout))?;
            send.push(Mutex::new(Sender { gen: 1, stream: Some(stream) }));
        }
        let shared = Arc::new(Shared {
            target,
            info,
            state: Mutex::new(State {
                gen: 1,
                connected: true,
                failed: false,
                next_cookie: 1,
                pending: HashMap::new(),
                writes_in_flight: BTreeSet::new(),
                replay: Vec::new(),
                replay_bytes: 0,
                overflow: None,
                lost: false,
            }),
            drained: Condvar::new(),
            room: Condvar::new(),
            send,
            closing: AtomicBool::new(false),
        });
        let sh = shared.clone();
        let handle = std::thread::Builder::new()
            .name("dxfs-nbd".into())
            .spawn(move || supervise(sh, readers))
            .map_err(Error::Io)?;
        Ok(NbdDevice {
            shared,
            blocks: info.size / BS,
            read_only,
            counters: Counters::default(),
            reader: Some(handle),
            ahead: Mutex::new(Ahead::default()),
        })
    }

    /// The export this device talks to.
    pub fn target(&self) -> &NbdTarget {
        &self.shared.target
    }

    /// Whether the server takes trims (`NBD_FLAG_SEND_TRIM`).
    pub fn can_trim(&self) -> bool {
        self.shared.info.flags & TFLAG_SEND_TRIM != 0
    }

    /// Whether the server takes forced-unit-access writes (`NBD_FLAG_SEND_FUA`).
    pub fn can_fua(&self) -> bool {
        self.shared.info.flags & TFLAG_SEND_FUA != 0
    }

    /// Whether the server agreed to structured replies (`NBD_OPT_STRUCTURED_REPLY`).
    pub fn structured_replies(&self) -> bool {
        self.shared.info.structured
    }

    /// Connections in use (more than one only if the server allows multi-conn).
    pub fn connections(&self) -> usize {
        self.shared.send.len()
    }

    /// Whether the server allows several connections (`NBD_FLAG_CAN_MULTI_CONN`).
    pub fn can_multi_conn(&self) -> bool {
        self.shared.info.flags & TFLAG_CAN_MULTI_CONN != 0
    }

    /// Queue the reads of one run, split at the server's largest payload.
    pub(super) fn submit_read(&self, block: u64, len: usize) -> Result<Vec<mpsc::Receiver<Result<Vec<u8>>>>> {
        let sh = &*self.shared;
        let pieces = sh.pieces(block * BS, len as u64, u64::from(sh.info.max_payload));
        let mut out = Vec::with_capacity(pieces.len());
        for (off, n) in pieces {
            out.push(self.shared.submit(CMD_READ, 0, off, n as u32, None)?);
        }
        Ok(out)
    }

    /// One write (split at the server's largest payload), with command flags.
    fn write_flagged(&self, block: u64, buf: &[u8], flags: u16) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let n = check_request("write", block, buf.len(), self.blocks)?;
        let _fresh = Fresh::new(&self.ahead, block, n);
        let sh = &*self.shared;
        let mut rxs = Vec::new();
        for (off, len) in sh.pieces(block * BS, buf.len() as u64, u64::from(sh.info.max_payload)) {
            let chunk = &buf[(off - block * BS) as usize..(off - block * BS + len) as usize];
            rxs.push(self.shared.submit(CMD_WRITE, flags, off, len as u32, Some(Arc::new(chunk.to_vec())))?);
        }
        let mut first_err = None;
        for rx in rxs {
            if let Err(e) = wait(rx) {
                first_err = first_err.or(Some(e));
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        self.counters.write(n);
        Ok(())
    }

    pub(super) fn finish_read(rxs: Vec<mpsc::Receiver<Result<Vec<u8>>>>, buf: &mut [u8]) -> Result<()> {
        let mut at = 0;
        let mut first_err = None;
        for rx in rxs {
            match wait(rx) {
                Ok(data) if at + data.len() <= buf.len() => {
                    buf[at..at + data.len()].copy_from_slice(&data);
                    at += data.len();
                }
                Ok(_) => first_err = first_err.or(Some(eio("nbd: reply longer than the request"))),
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl fmt::Debug for NbdDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NbdDevice")
            .field("target", &self.shared.target.to_string())
            .field("blocks", &self.blocks)
            .field("flags", &self.shared.info.flags)
            .field("read_only", &self.read_only)
            .finish()
    }
}

impl Drop for NbdDevice {
    fn drop(&mut self) {
        let sh = &*self.shared;
        // The protocol asks a client to let its requests finish before a soft
        // disconnect (readahead may still have some out).
        self.ahead.lock().take_all();
        {
            let deadline = Instant::now() + sh.target.timeout.min(Duration::from_secs(5));
            let mut st = sh.state.lock();
            while !st.pending.is_empty() && !st.failed && Instant::now() < deadline {
                sh.room.wait_for(&mut st, Duration::from_millis(50));
            }
        }
        sh.closing.store(true, Ordering::SeqCst);
        for send in &sh.send {
            let mut s = send.lock();
            if let Some(stream) = s.stream.as_mut() {
                // Soft disconnect; the server closes, which wakes the reader.
                let _ = send_request(stream, CMD_DISC, 0, 0, 0, 0, None);
                stream.shutdown();
            }
            s.stream = None;
        }
        if let Some(h) = self.reader.take() {
            let _ = h.join();
        }
    }
}

impl BlockDevice for NbdDevice {
    fn block_count(&self) -> u64 {
        self.blocks
    }

    fn read(&self, block: u64, buf: &mut [u8]) -> Result<()> {
        let n = check_request("read", block, buf.len(), self.blocks)?;
        if buf.len() >= RA_MIN_READ {
            self.read_ahead(block, n, buf)?;
        } else {
            let rxs = self.submit_read(block, buf.len())?;
            Self::finish_read(rxs, buf)?;
        }
        self.counters.read(n);
        Ok(())
    }

    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> Result<()> {
        let mut counts = Vec::with_capacity(reqs.len());
        for (block, buf) in reqs.iter() {
            counts.push(check_request("read", *block, buf.len(), self.blocks)?);
        }
        // Everything goes out before the first wait: one round trip for the batch.
        let mut waits = Vec::with_capacity(reqs.len());
        let mut first_err = None;
        for (block, buf) in reqs.iter() {
            match self.submit_read(*block, buf.len()) {
                Ok(r) => waits.push(r),
                Err(e) => {
                    first_err = Some(e);
                    break;
                }
            }
        }
        for ((_, buf), rxs) in reqs.iter_mut().zip(waits) {
            if let Err(e) = Self::finish_read(rxs, buf) {
                first_err = first_err.or(Some(e));
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        for n in counts {
            self.counters.read(n);
        }
        Ok(())
    }

    fn write(&self, block: u64, buf: &[u8]) -> Result<()> {
        self.write_flagged(block, buf, 0)
    }

    fn write_durable(&self, block: u64, buf: &[u8]) -> Result<()> {
        if self.can_fua() {
            self.write_flagged(block, buf, CMD_FLAG_FUA)
        } else {
            self.write(block, buf)?;
            self.flush()
        }
    }

    fn write_many(&self, reqs: &[(u64, &[u8])]) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let mut counts = Vec::with_capacity(reqs.len());
        for (block, buf) in reqs {
            counts.push(check_request("write", *block, buf.len(), self.blocks)?);
        }
        let _fresh: Vec<Fresh<'_>> =
            reqs.iter().zip(&counts).map(|((b, _), n)| Fresh::new(&self.ahead, *b, *n)).collect();
        let sh = &*self.shared;
        let mut rxs = Vec::new();
        let mut first_err = None;
        'submit: for (block, buf) in reqs {
            for (off, len) in sh.pieces(block * BS, buf.len() as u64, u64::from(sh.info.max_payload)) {
                let chunk = &buf[(off - block * BS) as usize..(off - block * BS + len) as usize];
                match self.shared.submit(CMD_WRITE, 0, off, len as u32, Some(Arc::new(chunk.to_vec()))) {
                    Ok(rx) => rxs.push(rx),
                    Err(e) => {
                        first_err = Some(e);
                        break 'submit;
                    }
                }
            }
        }
        for rx in rxs {
            if let Err(e) = wait(rx) {
                first_err = first_err.or(Some(e));
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        for n in counts {
            self.counters.write(n);
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        // Readahead still out is waited for, so that a flush leaves nothing in flight
        // (a close follows many flushes; some servers mishandle a client that leaves
        // with requests out).
        let chunks = self.ahead.lock().take_all();
        for c in chunks {
            c.settle();
        }
        if self.read_only {
            self.counters.flush();
            return Ok(());
        }
        let sh = &*self.shared;
        let mark = {
            let mut st = sh.state.lock();
            let mark = st.next_cookie;
            // The protocol's flush covers only writes already replied to.
            while st.writes_in_flight.range(..mark).next().is_some() {
                sh.drained.wait(&mut st);
            }
            if st.lost {
                st.lost = false;
                drop(st);
                tracing::error!(
                    "{}: the connection dropped with more unflushed writes than kept for replay; failing the flush",
                    sh.target
                );
                return Err(eio(format!("{}: acknowledged writes may have been lost with the connection", sh.target)));
            }
            mark
        };
        if sh.info.flags & TFLAG_SEND_FLUSH != 0 {
            wait(self.shared.submit(CMD_FLUSH, 0, 0, 0, None)?)?;
        }
        let mut st = sh.state.lock();
        st.replay.retain(|a| a.cookie >= mark);
        st.replay_bytes = st.replay.iter().map(|a| a.data.len()).sum();
        if st.overflow.is_some_and(|c| c < mark) {
            st.overflow = None;
        }
        drop(st);
        self.counters.flush();
        Ok(())
    }

    fn trim(&self, block: u64, count: u64) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        check_trim(block, count, self.blocks)?;
        let _fresh = Fresh::new(&self.ahead, block, count);
        if count == 0 || !self.can_trim() {
            return Ok(());
        }
        let mut rxs = Vec::new();
        for (off, n) in self.shared.pieces(block * BS, count * BS, MAX_TRIM) {
            rxs.push(self.shared.submit(CMD_TRIM, 0, off, n as u32, None)?);
        }
        let mut first_err = None;
        for rx in rxs {
            if let Err(e) = wait(rx) {
                first_err = first_err.or(Some(e));
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn stats(&self) -> IoStats {
        self.counters.snapshot()
    }
}
