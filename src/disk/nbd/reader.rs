//! One connection's reader thread: replies, simple or structured chunk by chunk, matched
//! to their requests; a stall or a lost connection ends it.

use std::collections::HashMap;
use std::io::{self, BufReader, Read};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::proto::*;
use super::stream::Stream;
use super::transmission::{complete, Shared};

/// How often the reader wakes up to look for a stalled connection.
pub(super) const POLL: Duration = Duration::from_millis(500);

/// Why the reply loop stopped.
pub(super) enum Stop {
    Closing,
    Lost(io::Error),
}

/// Read exactly `buf`, waking every [`POLL`] to check for shutdown or a stall.
fn read_watch(sh: &Shared, r: &mut impl Read, buf: &mut [u8]) -> std::result::Result<(), Stop> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => {
                if sh.closing.load(Ordering::SeqCst) {
                    return Err(Stop::Closing);
                }
                return Err(Stop::Lost(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                )));
            }
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if sh.closing.load(Ordering::SeqCst) {
                    return Err(Stop::Closing);
                }
                let st = sh.state.lock();
                let stalled = st.pending.values().any(|p| p.sent.elapsed() > sh.target.timeout);
                if stalled {
                    return Err(Stop::Lost(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no reply within {:?}", sh.target.timeout),
                    )));
                }
            }
            Err(e) => {
                if sh.closing.load(Ordering::SeqCst) {
                    return Err(Stop::Closing);
                }
                return Err(Stop::Lost(e));
            }
        }
    }
    Ok(())
}

/// A structured reply being put together from its chunks.
struct Partial {
    data: Vec<u8>,
    /// The first error chunk: error number and the server's message.
    error: Option<(u32, String)>,
}

fn protocol_error(msg: String) -> Stop {
    Stop::Lost(io::Error::new(io::ErrorKind::InvalidData, msg))
}

/// Read replies (simple, or structured chunk by chunk) and complete their requests until
/// the connection ends.
pub(super) fn reply_loop(sh: &Shared, stream: Stream) -> Stop {
    let mut r = BufReader::with_capacity(256 << 10, stream);
    let mut partial: HashMap<u64, Partial> = HashMap::new();
    let lookup = |cookie: u64| -> std::result::Result<(u16, u64, u32), Stop> {
        match sh.state.lock().pending.get(&cookie) {
            Some(p) => Ok((p.cmd, p.offset, p.len)),
            None => Err(protocol_error(format!("reply to unknown cookie {cookie}"))),
        }
    };
    loop {
        let mut m = [0u8; 4];
        if let Err(s) = read_watch(sh, &mut r, &mut m) {
            return s;
        }
        match get_u32(&m, 0) {
            SIMPLE_REPLY_MAGIC => {
                let mut h = [0u8; 12];
                if let Err(s) = read_watch(sh, &mut r, &mut h) {
                    return s;
                }
                let (error, cookie) = (get_u32(&h, 0), get_u64(&h, 4));
                let (cmd, _, len) = match lookup(cookie) {
                    Ok(x) => x,
                    Err(s) => return s,
                };
                let mut data = Vec::new();
                if cmd == CMD_READ && error == 0 {
                    data = vec![0u8; len as usize];
                    if let Err(s) = read_watch(sh, &mut r, &mut data) {
                        return s;
                    }
                }
                complete(sh, cookie, error, data, String::new());
            }
            STRUCTURED_REPLY_MAGIC => {
                let mut h = [0u8; 16];
                if let Err(s) = read_watch(sh, &mut r, &mut h) {
                    return s;
                }
                let (flags, kind, cookie, length) = (get_u16(&h, 0), get_u16(&h, 2), get_u64(&h, 4), get_u32(&h, 12));
                let (cmd, req_off, req_len) = match lookup(cookie) {
                    Ok(x) => x,
                    Err(s) => return s,
                };
                let part = partial.entry(cookie).or_insert_with(|| Partial {
                    data: if cmd == CMD_READ { vec![0u8; req_len as usize] } else { Vec::new() },
                    error: None,
                });
                // The byte range [at, at + n) of the request a data or hole chunk covers.
                let range = |at: u64, n: u64| -> std::result::Result<std::ops::Range<usize>, Stop> {
                    if cmd != CMD_READ || at < req_off || at + n > req_off + u64::from(req_len) {
                        return Err(protocol_error(format!(
                            "chunk of {n} bytes at byte {at} outside request {cookie} ({req_len} bytes at {req_off})"
                        )));
                    }
                    Ok((at - req_off) as usize..(at - req_off + n) as usize)
                };
                match kind {
                    REPLY_TYPE_NONE if length == 0 => {}
                    REPLY_TYPE_OFFSET_DATA if length >= 8 => {
                        let mut o = [0u8; 8];
                        if let Err(s) = read_watch(sh, &mut r, &mut o) {
                            return s;
                        }
                        let span = match range(get_u64(&o, 0), u64::from(length - 8)) {
                            Ok(x) => x,
                            Err(s) => return s,
                        };
                        if let Err(s) = read_watch(sh, &mut r, &mut part.data[span]) {
                            return s;
                        }
                    }
                    REPLY_TYPE_OFFSET_HOLE if length == 12 => {
                        let mut o = [0u8; 12];
                        if let Err(s) = read_watch(sh, &mut r, &mut o) {
                            return s;
                        }
                        match range(get_u64(&o, 0), u64::from(get_u32(&o, 8))) {
                            Ok(span) => part.data[span].fill(0),
                            Err(s) => return s,
                        }
                    }
                    k if k & REPLY_TYPE_ERROR_BIT != 0 && (6..=MAX_ERROR_CHUNK).contains(&length) => {
                        let mut body = vec![0u8; length as usize];
                        if let Err(s) = read_watch(sh, &mut r, &mut body) {
                            return s;
                        }
                        let mlen = usize::from(get_u16(&body, 4)).min(body.len() - 6);
                        let msg = String::from_utf8_lossy(&body[6..6 + mlen]).into_owned();
                        // An error chunk that names no error is still an error.
                        let error = match get_u32(&body, 0) {
                            0 => 5,
                            e => e,
                        };
                        part.error.get_or_insert((error, msg));
                    }
                    k => return protocol_error(format!("bad structured reply chunk (type {k}, {length} bytes)")),
                }
                if flags & REPLY_FLAG_DONE != 0 {
                    let part = partial.remove(&cookie).expect("inserted above");
                    let (error, msg) = part.error.unwrap_or((0, String::new()));
                    complete(sh, cookie, error, part.data, msg);
                }
            }
            magic => return protocol_error(format!("bad reply magic {magic:#x}")),
        }
    }
}
