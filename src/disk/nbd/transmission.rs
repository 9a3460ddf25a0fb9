//! Requests in flight: one table of pending requests over all connections, each sent
//! under its connection's send lock and completed by cookie when its reply comes.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::eio;
use super::handshake::ExportInfo;
use super::proto::*;
use super::stream::Stream;
use super::uri::NbdTarget;
use crate::error::{Error, Result};

/// Writes acknowledged since the last flush kept for replay after a reconnection.
const REPLAY_LIMIT: usize = 256 << 20;
/// With several connections, requests are routed by the region of the export they
/// touch (and split at region boundaries), so every request for a block goes over the
/// same connection: a read sees a completed write without waiting for a flush.
const REGION: u64 = 1 << 20;

/// A request waiting for its reply (kept until then, so it can be sent again).
pub(super) struct Pending {
    pub(super) cmd: u16,
    /// Command flags (`CMD_FLAG_FUA`), kept so a re-sent request keeps them.
    pub(super) flags: u16,
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) data: Option<Arc<Vec<u8>>>,
    pub(super) sent: Instant,
    /// When it was first sent: a request still unanswered `timeout` after this, over
    /// however many connections, fails (a server that takes connections and then
    /// answers nothing usable must not hold a caller forever).
    pub(super) first: Instant,
    pub(super) done: mpsc::Sender<Result<Vec<u8>>>,
}

/// An acknowledged write not yet covered by a flush.
pub(super) struct Acked {
    pub(super) cookie: u64,
    pub(super) offset: u64,
    pub(super) data: Arc<Vec<u8>>,
}

pub(super) struct State {
    /// Connection generation (bumped at each reconnection).
    pub(super) gen: u64,
    pub(super) connected: bool,
    /// Gave up reconnecting: new requests fail at once.
    pub(super) failed: bool,
    pub(super) next_cookie: u64,
    pub(super) pending: HashMap<u64, Pending>,
    /// Cookies of writes and trims not yet acknowledged (cookies grow with issue order).
    pub(super) writes_in_flight: BTreeSet<u64>,
    /// Acknowledged writes since the last flush, in acknowledgement order.
    pub(super) replay: Vec<Acked>,
    pub(super) replay_bytes: usize,
    /// Cookie of the first acknowledged write since the last flush that was not kept.
    pub(super) overflow: Option<u64>,
    /// A reconnection happened while `overflow` was set: acknowledged data may be lost.
    pub(super) lost: bool,
}

pub(super) struct Sender {
    pub(super) gen: u64,
    pub(super) stream: Option<Stream>,
}

pub(super) struct Shared {
    pub(super) target: NbdTarget,
    pub(super) info: ExportInfo,
    pub(super) state: Mutex<State>,
    pub(super) drained: Condvar,
    /// Signalled when a request completes (room under `max_in_flight`).
    pub(super) room: Condvar,
    /// One per connection.
    pub(super) send: Vec<Mutex<Sender>>,
    pub(super) closing: AtomicBool,
}

impl Shared {
    /// The connection a request at `offset` goes over (flushes: the first).
    pub(super) fn route(&self, offset: u64) -> usize {
        (offset / REGION) as usize % self.send.len()
    }

    /// Where a request of `len` bytes at `offset` must be cut: at `max` bytes, and at
    /// region boundaries when there are several connections.
    pub(super) fn pieces(&self, offset: u64, len: u64, max: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(1);
        let (mut at, end) = (offset, offset + len);
        while at < end {
            let mut n = (end - at).min(max);
            if self.send.len() > 1 {
                n = n.min(REGION - at % REGION);
            }
            out.push((at, n));
            at += n;
        }
        out
    }

    /// Queue one request; the receiver gets its result.
    pub(super) fn submit(
        &self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        data: Option<Arc<Vec<u8>>>,
    ) -> Result<mpsc::Receiver<Result<Vec<u8>>>> {
        let sh = self;
        let (tx, rx) = mpsc::channel();
        let mut st = sh.state.lock();
        while st.pending.len() >= sh.target.max_in_flight && !st.failed {
            sh.room.wait(&mut st);
        }
        if st.failed {
            return Err(eio(format!("{}: server unreachable", sh.target)));
        }
        let cookie = st.next_cookie;
        st.next_cookie += 1;
        if cmd == CMD_WRITE || cmd == CMD_TRIM {
            st.writes_in_flight.insert(cookie);
        }
        let now = Instant::now();
        st.pending
            .insert(cookie, Pending { cmd, flags, offset, len, data: data.clone(), sent: now, first: now, done: tx });
        let (connected, gen) = (st.connected, st.gen);
        drop(st);
        if connected {
            let mut s = sh.send[if cmd == CMD_FLUSH { 0 } else { sh.route(offset) }].lock();
            // A different generation means a reconnection has already sent it again.
            if s.gen == gen {
                if let Some(stream) = s.stream.as_mut() {
                    if send_request(stream, cmd, flags, cookie, offset, len, data.as_deref().map(|v| &v[..])).is_err() {
                        // The reader sees the shutdown and reconnects; the request stays
                        // pending and goes out again then.
                        stream.shutdown();
                    }
                }
            }
        }
        Ok(rx)
    }
}

pub(super) fn wait(rx: mpsc::Receiver<Result<Vec<u8>>>) -> Result<Vec<u8>> {
    rx.recv().unwrap_or_else(|_| Err(eio("nbd: request abandoned")))
}

/// A request's whole reply is in: hand the result to its caller.
pub(super) fn complete(sh: &Shared, cookie: u64, error: u32, data: Vec<u8>, msg: String) {
    if error == ESHUTDOWN {
        // The server is shutting down (after our NBD_CMD_DISC, or its own) and did not
        // do this request: it stays pending and goes out again on the next connection.
        tracing::debug!("{}: request {cookie} refused as the server shuts down; kept for re-sending", sh.target);
        return;
    }
    let mut st = sh.state.lock();
    let Some(p) = st.pending.remove(&cookie) else { return };
    sh.room.notify_one();
    if st.writes_in_flight.remove(&cookie) {
        if error == 0 && p.cmd == CMD_WRITE {
            let d = p.data.clone().expect("writes carry data");
            if st.overflow.is_none() && st.replay_bytes + d.len() <= REPLAY_LIMIT {
                st.replay_bytes += d.len();
                st.replay.push(Acked { cookie, offset: p.offset, data: d });
            } else if st.overflow.is_none() {
                st.overflow = Some(cookie);
            }
        }
        sh.drained.notify_all();
    }
    drop(st);
    let result = if error == 0 {
        Ok(data)
    } else {
        let what = ["read", "write", "disc", "flush", "trim"].get(p.cmd as usize).copied().unwrap_or("request");
        let detail = if msg.is_empty() { String::new() } else { format!(" ({msg})") };
        tracing::warn!("{}: the server failed a {what} at byte {} with error {error}{detail}", sh.target, p.offset);
        // NBD's error codes are Linux errnos: the kind says what happened (NBD_ENOSPC
        // is a full server disk, which `HeldWrites` waits out).
        let os = io::Error::from_raw_os_error(error as i32);
        Err(Error::Io(io::Error::new(
            os.kind(),
            format!("{}: the server failed a {what} of {} bytes at byte {}: {os}{detail}", sh.target, p.len, p.offset),
        )))
    };
    let _ = p.done.send(result);
}
