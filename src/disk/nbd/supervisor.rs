//! The thread behind the reader threads: when a connection is lost, all are taken down,
//! reconnected with back-off, the acknowledged-unflushed writes replayed and the pending
//! requests sent again; requests fail with EIO after the timeout.

use std::io::{self, Read};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::eio;
use super::handshake::connect_all;
use super::proto::*;
use super::reader::{reply_loop, Stop, POLL};
use super::stream::Stream;
use super::transmission::Shared;
use crate::error::Result;

/// Connect again and bring the new connection up to date: the acknowledged-unflushed
/// writes one at a time, then every pending request. Returns the new reader half.
fn reconnect(sh: &Shared) -> Result<Vec<Stream>> {
    let (mut streams, info) = connect_all(&sh.target, Some(sh.send.len()))?;
    if info.size != sh.info.size {
        return Err(eio(format!("{}: the export changed size ({} → {} bytes)", sh.target, sh.info.size, info.size)));
    }
    // Replay synchronously (this thread is the only reader), in acknowledgement order,
    // each write over the connection its region goes by.
    let replay: Vec<(u64, Arc<Vec<u8>>)> = sh.state.lock().replay.iter().map(|a| (a.offset, a.data.clone())).collect();
    for (offset, data) in replay {
        let stream = &mut streams[sh.route(offset)];
        send_request(stream, CMD_WRITE, 0, 0, offset, data.len() as u32, Some(&data))?;
        if !write_succeeded(stream)? {
            return Err(eio(format!("{}: replaying an acknowledged write failed", sh.target)));
        }
    }
    let mut readers = Vec::with_capacity(streams.len());
    for stream in &streams {
        readers.push(stream.try_clone()?);
        stream.set_timeouts(Some(POLL), Some(sh.target.timeout))?;
    }
    // Every sender lock, in order, then the state: no request goes out on the new
    // connections before the pending ones are sent again.
    let mut senders: Vec<_> = sh.send.iter().map(|m| m.lock()).collect();
    let mut st = sh.state.lock();
    st.gen += 1;
    st.connected = true;
    st.failed = false;
    if st.overflow.is_some() {
        st.lost = true;
    }
    let mut cookies: Vec<u64> = st.pending.keys().copied().collect();
    cookies.sort_unstable();
    let now = Instant::now();
    let mut resend = Vec::with_capacity(cookies.len());
    for c in cookies {
        let p = st.pending.get_mut(&c).expect("listed");
        p.sent = now;
        resend.push((c, p.cmd, p.flags, p.offset, p.len, p.data.clone()));
    }
    for s in senders.iter_mut() {
        s.gen = st.gen;
    }
    drop(st);
    let mut failed = None;
    for (c, cmd, flags, offset, len, data) in resend {
        let i = if cmd == CMD_FLUSH { 0 } else { sh.route(offset) };
        if let Err(e) = send_request(&mut streams[i], cmd, flags, c, offset, len, data.as_deref().map(|v| &v[..])) {
            failed = Some(e);
            break;
        }
    }
    for (s, stream) in senders.iter_mut().zip(streams) {
        if failed.is_some() {
            // The readers see the shutdown and the supervisor starts over.
            stream.shutdown();
        }
        s.stream = Some(stream);
    }
    Ok(readers)
}

/// Fail every request first sent more than `timeout` ago: connections keep coming back
/// (the server takes them) but nothing usable comes over them.
fn expire(sh: &Shared, why: &io::Error) {
    let mut st = sh.state.lock();
    let old: Vec<u64> =
        st.pending.iter().filter(|(_, p)| p.first.elapsed() >= sh.target.timeout).map(|(c, _)| *c).collect();
    if old.is_empty() {
        return;
    }
    for c in &old {
        let p = st.pending.remove(c).expect("listed");
        st.writes_in_flight.remove(c);
        let _ = p.done.send(Err(eio(format!("{}: no reply within {:?} ({why})", sh.target, sh.target.timeout))));
    }
    sh.drained.notify_all();
    sh.room.notify_all();
    drop(st);
    tracing::error!(
        "{}: {} request(s) unanswered for {:?} over reconnections ({why}); failed with EIO",
        sh.target,
        old.len(),
        sh.target.timeout
    );
}

/// Read the reply to the one write in flight (cookie 0): simple, or structured chunks up
/// to the last; whether it succeeded.
fn write_succeeded(s: &mut Stream) -> Result<bool> {
    let mut m = [0u8; 4];
    s.read_exact(&mut m)?;
    match get_u32(&m, 0) {
        SIMPLE_REPLY_MAGIC => {
            let mut h = [0u8; 12];
            s.read_exact(&mut h)?;
            Ok(get_u32(&h, 0) == 0 && get_u64(&h, 4) == 0)
        }
        STRUCTURED_REPLY_MAGIC => {
            let mut ok = true;
            loop {
                let mut h = [0u8; 16];
                s.read_exact(&mut h)?;
                let (flags, kind, length) = (get_u16(&h, 0), get_u16(&h, 2), get_u32(&h, 12));
                if length > MAX_ERROR_CHUNK {
                    return Ok(false);
                }
                let mut body = vec![0u8; length as usize];
                s.read_exact(&mut body)?;
                ok &= kind == REPLY_TYPE_NONE && get_u64(&h, 4) == 0;
                if flags & REPLY_FLAG_DONE != 0 {
                    return Ok(ok);
                }
                s.read_exact(&mut m)?;
                if get_u32(&m, 0) != STRUCTURED_REPLY_MAGIC {
                    return Ok(false);
                }
            }
        }
        _ => Ok(false),
    }
}

/// Run one reader thread per connection; when any connection is lost, take them all
/// down (each request is re-sent over the connection its region goes by, so they come
/// back together), reconnect with back-off, and start again.
pub(super) fn supervise(sh: Arc<Shared>, first: Vec<Stream>) {
    let mut readers = first;
    loop {
        let (tx, rx) = mpsc::channel();
        let mut handles = Vec::with_capacity(readers.len());
        for (i, r) in readers.into_iter().enumerate() {
            let (sh, tx2) = (sh.clone(), tx.clone());
            let spawned = std::thread::Builder::new().name(format!("dxfs-nbd-{i}")).spawn(move || {
                let _ = tx2.send(reply_loop(&sh, r));
            });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    let _ = tx.send(Stop::Lost(e));
                }
            }
        }
        drop(tx);
        let first_stop = rx.recv();
        // Take every connection down: new requests stay pending; the others are told to
        // disconnect, so their readers still take the replies already on the way and
        // end when the server closes (nbdkit 1.32 was seen to die when a client left
        // with requests out) or when a request goes unanswered for `timeout`.
        for send in &sh.send {
            if let Some(mut s) = send.lock().stream.take() {
                s.disconnect();
            }
        }
        sh.state.lock().connected = false;
        for h in handles {
            let _ = h.join();
        }
        let why = match first_stop {
            Ok(Stop::Lost(e)) => e,
            Ok(Stop::Closing) | Err(_) => return,
        };
        if sh.closing.load(Ordering::SeqCst) {
            return;
        }
        expire(&sh, &why);
        tracing::warn!("{}: connection lost ({why}); reconnecting", sh.target);
        let deadline = Instant::now() + sh.target.timeout;
        let mut delay = Duration::from_millis(20);
        let mut gave_up = false;
        readers = loop {
            if sh.closing.load(Ordering::SeqCst) {
                return;
            }
            match reconnect(&sh) {
                Ok(r) => {
                    tracing::warn!("{}: reconnected", sh.target);
                    break r;
                }
                Err(e) => {
                    if !gave_up && Instant::now() >= deadline {
                        gave_up = true;
                        let mut st = sh.state.lock();
                        st.failed = true;
                        let n = st.pending.len();
                        for (_, p) in st.pending.drain() {
                            let _ = p.done.send(Err(eio(format!("{}: server unreachable: {e}", sh.target))));
                        }
                        st.writes_in_flight.clear();
                        // What was acknowledged but never flushed may be gone.
                        if !st.replay.is_empty() || st.overflow.is_some() {
                            st.lost = true;
                        }
                        sh.drained.notify_all();
                        sh.room.notify_all();
                        drop(st);
                        tracing::error!(
                            "{}: no connection for {:?} ({e}); {n} request(s) failed with EIO, new ones fail until the server is back",
                            sh.target,
                            sh.target.timeout
                        );
                    }
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
            }
        };
    }
}
