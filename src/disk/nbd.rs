//! An NBD client as a [`BlockDevice`]: the volume on any server that speaks the Network
//! Block Device protocol (nbdkit, qemu-nbd, rbd-nbd, nbd-server), with no kernel module.
//!
//! Written to the protocol document (NetworkBlockDevice/nbd, `doc/proto.md`):
//!
//! - **Handshake**: fixed newstyle only; `NBD_OPT_GO` with the export name asking for
//!   `NBD_INFO_BLOCK_SIZE` (the reply's `NBD_INFO_EXPORT` gives size and transmission
//!   flags); a server that answers `NBD_REP_ERR_UNSUP` gets `NBD_OPT_EXPORT_NAME`
//!   instead. Every option error becomes a sentence naming the server and export.
//! - **Transmission**: READ, WRITE (with FUA for [`BlockDevice::write_durable`] if
//!   offered), FLUSH (if offered), TRIM (if offered), DISC on drop; simple replies, and
//!   structured ones (data, hole and error chunks) when the server agrees to them.
//!   Several connections when the server allows multi-conn, requests routed by 1 MiB
//!   region, a reader thread each. Any number of requests are in flight on the one connection: callers
//!   write requests under a send lock, one reader thread reads the replies and hands each
//!   to its caller by cookie. [`BlockDevice::read_many`] puts a whole batch in flight
//!   before waiting for the first reply.
//! - **Flush**: waits until every write and trim issued before it has been acknowledged,
//!   then sends `NBD_CMD_FLUSH` (the protocol only covers writes already replied to).
//! - **Faults**: a dropped or stalled connection (no reply for `timeout` while requests
//!   wait) is reconnected with back-off; writes acknowledged since the last flush are
//!   written again, one at a time and in order, then every request still waiting is sent
//!   again (block writes are idempotent). If no connection comes back within `timeout`,
//!   every waiting request fails with EIO and one `error!` line says why; new requests
//!   fail at once until a later reconnection succeeds. A server's error reply fails that
//!   request only. If more acknowledged-unflushed data was lost with a connection than
//!   the client kept for replay, the next flush fails, so no commit can claim it durable.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::disk::codec::BLOCK_SIZE;
use crate::disk::device::{check_request, check_trim, BlockDevice, Counters, IoStats};
use crate::error::{Error, Result};

const BS: u64 = BLOCK_SIZE as u64;

// Handshake magics and values (proto.md, "Handshake phase").
const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const CLISERV_MAGIC: u64 = 0x0000_4202_8186_1253;
const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const FLAG_FIXED_NEWSTYLE: u16 = 1;
const FLAG_NO_ZEROES: u16 = 2;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_GO: u32 = 7;
const OPT_STRUCTURED_REPLY: u32 = 8;
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
const TFLAG_READ_ONLY: u16 = 1 << 1;
const TFLAG_SEND_FLUSH: u16 = 1 << 2;
const TFLAG_SEND_FUA: u16 = 1 << 3;
const TFLAG_SEND_TRIM: u16 = 1 << 5;
const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

// Requests and replies.
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
const REPLY_FLAG_DONE: u16 = 1;
const REPLY_TYPE_NONE: u16 = 0;
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// Chunk types with this bit set are errors (NBD_REPLY_TYPE_ERROR, _ERROR_OFFSET, ...).
const REPLY_TYPE_ERROR_BIT: u16 = 1 << 15;
/// Largest error chunk accepted (a 4-byte error, a message of at most 4096 bytes, ...).
const MAX_ERROR_CHUNK: u32 = 64 << 10;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_TRIM: u16 = 4;
/// Command flag: the reply comes once the write is durable.
const CMD_FLAG_FUA: u16 = 1;
/// Error reply `NBD_ESHUTDOWN`: the server is shutting down (nbdkit answers it to the
/// requests it had read but not done when `NBD_CMD_DISC` came): sent again on the next
/// connection rather than failed.
const ESHUTDOWN: u32 = 108;

/// The protocol's default largest payload when the server names none (32 MiB).
const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;
/// Largest trim sent as one request.
const MAX_TRIM: u64 = 1 << 30;
/// Largest option reply accepted during the handshake.
const MAX_OPTION_REPLY: u32 = 64 << 10;
/// Writes acknowledged since the last flush kept for replay after a reconnection.
const REPLAY_LIMIT: usize = 256 << 20;
/// Requests in flight at once unless the address says otherwise.
const DEFAULT_IN_FLIGHT: usize = 128;
/// Connections opened to a multi-conn server unless the address says otherwise.
const DEFAULT_CONNECTIONS: usize = 4;
/// Most connections an address may ask for.
const MAX_CONNECTIONS: usize = 16;
/// With several connections, requests are routed by the region of the export they
/// touch (and split at region boundaries), so every request for a block goes over the
/// same connection: a read sees a completed write without waiting for a flush.
const REGION: u64 = 1 << 20;
/// How often the reader wakes up to look for a stalled connection.
const POLL: Duration = Duration::from_millis(500);

/// Where an NBD server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NbdEndpoint {
    /// A TCP host (name, IPv4 or IPv6 address) and port.
    Tcp { host: String, port: u16 },
    /// A Unix domain socket.
    Unix(PathBuf),
}

/// An NBD export and how to talk to it: parsed from `nbd://HOST[:PORT]/EXPORT` or
/// `nbd+unix:///EXPORT?socket=PATH` (the forms qemu and nbdkit use); both take the
/// optional query parameters `timeout=SECONDS` (default 30), `inflight=N` (most
/// requests in flight at once, default 128; 1 makes every request a round trip),
/// `conns=N` (connections to a server that allows several, default 4, 1 to 16) and
/// `structured=1|0` (ask for structured replies, default 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdTarget {
    /// The server's address.
    pub endpoint: NbdEndpoint,
    /// The export name ("" is the server's default export).
    pub export: String,
    /// How long a lost connection is retried, and how long a request may go unanswered,
    /// before requests fail with EIO.
    pub timeout: Duration,
    /// Most requests in flight at once (over all connections).
    pub max_in_flight: usize,
    /// Connections to open when the server allows several (`NBD_FLAG_CAN_MULTI_CONN`);
    /// one otherwise.
    pub connections: usize,
    /// Ask for structured replies (`NBD_OPT_STRUCTURED_REPLY`): holes in a read come back
    /// as a length instead of zeros, errors with the server's message.
    pub structured_replies: bool,
}

/// Whether `spec` is an NBD address rather than a path.
pub fn is_nbd_uri(spec: &str) -> bool {
    spec.starts_with("nbd://") || spec.starts_with("nbd+unix://")
}

fn bad_uri(uri: &str, why: &str) -> Error {
    Error::Invalid(format!("{uri}: {why} (want nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH)"))
}

/// Undo %XX escapes.
fn percent_decode(uri: &str, s: &str) -> Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(v) = hex else { return Err(bad_uri(uri, "bad %-escape")) };
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad_uri(uri, "not UTF-8 after %-decoding"))
}

impl NbdTarget {
    /// Parse an NBD URI.
    pub fn parse(uri: &str) -> Result<NbdTarget> {
        let (unix, rest) = if let Some(r) = uri.strip_prefix("nbd+unix://") {
            (true, r)
        } else if let Some(r) = uri.strip_prefix("nbd://") {
            (false, r)
        } else {
            return Err(bad_uri(uri, "not an NBD address"));
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(uri, path)?;
        let mut socket = None;
        let mut timeout = Duration::from_secs(30);
        let mut max_in_flight = DEFAULT_IN_FLIGHT;
        let mut connections = DEFAULT_CONNECTIONS;
        let mut structured_replies = true;
        for kv in query.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match k {
                "socket" if unix => socket = Some(PathBuf::from(percent_decode(uri, v)?)),
                "timeout" => {
                    let secs: f64 = v.parse().map_err(|_| bad_uri(uri, "timeout must be a number of seconds"))?;
                    if !(secs.is_finite() && secs > 0.0 && secs < 1e6) {
                        return Err(bad_uri(uri, "timeout must be a positive number of seconds"));
                    }
                    timeout = Duration::from_secs_f64(secs);
                }
                "inflight" => {
                    max_in_flight = match v.parse::<usize>() {
                        Ok(n) if (1..=65_536).contains(&n) => n,
                        _ => return Err(bad_uri(uri, "inflight must be a number from 1 to 65536")),
                    }
                }
                "structured" => {
                    structured_replies = match v {
                        "1" | "yes" | "on" => true,
                        "0" | "no" | "off" => false,
                        _ => return Err(bad_uri(uri, "structured must be 1 or 0")),
                    }
                }
                "conns" => {
                    connections = match v.parse::<usize>() {
                        Ok(n) if (1..=MAX_CONNECTIONS).contains(&n) => n,
                        _ => return Err(bad_uri(uri, "conns must be a number from 1 to 16")),
                    }
                }
                _ => return Err(bad_uri(uri, &format!("unknown parameter {k:?}"))),
            }
        }
        let endpoint = if unix {
            if !authority.is_empty() {
                return Err(bad_uri(uri, "nbd+unix:// takes no host"));
            }
            NbdEndpoint::Unix(socket.ok_or_else(|| bad_uri(uri, "nbd+unix:// needs ?socket=PATH"))?)
        } else {
            let (host, port) = if let Some(r) = authority.strip_prefix('[') {
                let (h, p) = r.split_once(']').ok_or_else(|| bad_uri(uri, "unclosed [ in host"))?;
                (h, p.strip_prefix(':'))
            } else {
                match authority.rsplit_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (authority, None),
                }
            };
            if host.is_empty() {
                return Err(bad_uri(uri, "no host"));
            }
            let port = match port {
                Some(p) => p.parse::<u16>().map_err(|_| bad_uri(uri, "bad port"))?,
                None => 10809,
            };
            NbdEndpoint::Tcp { host: host.to_string(), port }
        };
        Ok(NbdTarget { endpoint, export, timeout, max_in_flight, connections, structured_replies })
    }
}

impl fmt::Display for NbdTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.endpoint {
            NbdEndpoint::Tcp { host, port } if host.contains(':') => write!(f, "nbd://[{host}]:{port}/{}", self.export),
            NbdEndpoint::Tcp { host, port } => write!(f, "nbd://{host}:{port}/{}", self.export),
            NbdEndpoint::Unix(p) => write!(f, "nbd+unix:///{}?socket={}", self.export, p.display()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Connections

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
    /// Soft disconnect (`NBD_CMD_DISC`, then our half closed): the server answers what
    /// it has, then closes, which ends the reader.
    fn disconnect(&mut self) {
        let _ = send_request(self, CMD_DISC, 0, 0, 0, 0, None);
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Write),
            Stream::Unix(s) => s.shutdown(Shutdown::Write),
        };
    }
    fn set_timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(read).and_then(|_| s.set_write_timeout(write)),
            Stream::Unix(s) => s.set_read_timeout(read).and_then(|_| s.set_write_timeout(write)),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What the handshake learnt about the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ExportInfo {
    size: u64,
    flags: u16,
    /// Largest payload of one request.
    max_payload: u32,
    /// The server agreed to structured replies.
    structured: bool,
}

fn hs_err(t: &NbdTarget, kind: io::ErrorKind, msg: impl fmt::Display) -> Error {
    Error::Io(io::Error::new(kind, format!("{t}: {msg}")))
}

/// An I/O error during the handshake, with EOF told as the server hanging up.
fn hs_io(t: &NbdTarget, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            hs_err(t, io::ErrorKind::ConnectionAborted, "the server closed the connection during the handshake")
        }
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            hs_err(t, io::ErrorKind::TimedOut, "the server stopped answering during the handshake")
        }
        _ => hs_err(t, e.kind(), format!("handshake failed: {e}")),
    }
}

fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn rep_error_name(t: u32) -> &'static str {
    match t - (1 << 31) {
        1 => "option not supported (NBD_REP_ERR_UNSUP)",
        2 => "refused by the server's policy (NBD_REP_ERR_POLICY)",
        3 => "invalid request (NBD_REP_ERR_INVALID)",
        4 => "not supported on the server's platform (NBD_REP_ERR_PLATFORM)",
        5 => "the server requires TLS, which dxfs does not speak (NBD_REP_ERR_TLS_REQD)",
        6 => "no such export (NBD_REP_ERR_UNKNOWN)",
        7 => "the server is shutting down (NBD_REP_ERR_SHUTDOWN)",
        8 => "the server requires block size negotiation (NBD_REP_ERR_BLOCK_SIZE_REQD)",
        9 => "request too big (NBD_REP_ERR_TOO_BIG)",
        _ => "unknown error",
    }
}

/// Open a connection and run the handshake; returns the stream in transmission phase.
fn connect(t: &NbdTarget) -> Result<(Stream, ExportInfo)> {
    let hs_limit = t.timeout.min(Duration::from_secs(10));
    let hs_timeout = Some(hs_limit);
    let mut s = match &t.endpoint {
        NbdEndpoint::Unix(p) => Stream::Unix(UnixStream::connect(p).map_err(|e| hs_err(t, e.kind(), e))?),
        NbdEndpoint::Tcp { host, port } => {
            let addrs: Vec<_> = (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(|e| hs_err(t, e.kind(), format!("cannot resolve {host}: {e}")))?
                .collect();
            let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
            let mut got = None;
            for a in addrs {
                match TcpStream::connect_timeout(&a, hs_limit) {
                    Ok(c) => {
                        got = Some(c);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            let c = got.ok_or_else(|| hs_err(t, last.kind(), &last))?;
            let _ = c.set_nodelay(true);
            Stream::Tcp(c)
        }
    };
    s.set_timeouts(hs_timeout, hs_timeout).map_err(|e| hs_io(t, e))?;
    let info = handshake(t, &mut s)?;
    Ok((s, info))
}

/// Open the connections of one device: the first says whether the server allows
/// several; then `want` (at open: the address's `conns`, or 1 without multi-conn, fewer
/// if the server refuses some; at a reconnection: exactly as many as before) are opened,
/// all to the same export.
fn connect_all(t: &NbdTarget, want: Option<usize>) -> Result<(Vec<Stream>, ExportInfo)> {
    let (first, info) = connect(t)?;
    let multi = info.flags & TFLAG_CAN_MULTI_CONN != 0;
    let n = match want {
        Some(n) if n > 1 && !multi => {
            return Err(eio(format!("{t}: the server no longer allows several connections")));
        }
        Some(n) => n,
        None if multi => t.connections,
        None => 1,
    };
    let mut streams = vec![first];
    // At open, a server that allows multi-conn but refuses more clients (nbdkit's limit
    // filter, a qemu-nbd with --shared=1) gets as many as it took; extra connections
    // wait at most 2 s for the greeting.
    let extra = NbdTarget { timeout: t.timeout.min(Duration::from_secs(2)), ..t.clone() };
    while streams.len() < n {
        let got = connect(if want.is_some() { t } else { &extra }).and_then(|(s, i)| {
            if i.size != info.size || i.flags != info.flags {
                return Err(eio(format!("{t}: another connection to the export saw a different size or flags")));
            }
            Ok(s)
        });
        match got {
            Ok(s) => streams.push(s),
            Err(e) if want.is_none() => {
                tracing::warn!(
                    "{t}: connection {} of {n} refused ({e}); going on with {}",
                    streams.len() + 1,
                    streams.len()
                );
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok((streams, info))
}

fn handshake(t: &NbdTarget, s: &mut Stream) -> Result<ExportInfo> {
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello[..16]).map_err(|e| hs_io(t, e))?;
    if get_u64(&hello, 0) != NBDMAGIC {
        return Err(hs_err(t, io::ErrorKind::InvalidData, "not an NBD server (no NBDMAGIC)"));
    }
    match get_u64(&hello, 8) {
        IHAVEOPT => {}
        CLISERV_MAGIC => {
            return Err(hs_err(
                t,
                io::ErrorKind::Unsupported,
                "the server uses oldstyle negotiation, which dxfs does not speak",
            ))
        }
        m => return Err(hs_err(t, io::ErrorKind::InvalidData, format!("unknown handshake magic {m:#x}"))),
    }
    s.read_exact(&mut hello[16..18]).map_err(|e| hs_io(t, e))?;
    let hflags = get_u16(&hello, 16);
    if hflags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(hs_err(t, io::ErrorKind::Unsupported, "the server does not support fixed newstyle negotiation"));
    }
    let no_zeroes = hflags & FLAG_NO_ZEROES != 0;
    let cflags = u32::from(FLAG_FIXED_NEWSTYLE) | if no_zeroes { u32::from(FLAG_NO_ZEROES) } else { 0 };
    s.write_all(&cflags.to_be_bytes()).map_err(|e| hs_io(t, e))?;

    // Structured replies, if wanted: an ACK turns them on, any error leaves them off.
    let mut structured = false;
    if t.structured_replies {
        send_option(s, OPT_STRUCTURED_REPLY, &[]).map_err(|e| hs_io(t, e))?;
        let (rtype, _) = read_option_reply(t, s, OPT_STRUCTURED_REPLY)?;
        match rtype {
            REP_ACK => structured = true,
            e if e & (1 << 31) != 0 => {}
            e => {
                return Err(hs_err(
                    t,
                    io::ErrorKind::InvalidData,
                    format!("unexpected reply {e} to NBD_OPT_STRUCTURED_REPLY"),
                ))
            }
        }
    }

    // NBD_OPT_GO: name length, name, number of info requests, the requests.
    let name = t.export.as_bytes();
    let mut data = Vec::with_capacity(name.len() + 8);
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name);
    data.extend_from_slice(&1u16.to_be_bytes());
    data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(s, OPT_GO, &data).map_err(|e| hs_io(t, e))?;

    let mut export: Option<(u64, u16)> = None;
    let mut sizes: Option<(u32, u32, u32)> = None;
    loop {
        let (rtype, body) = read_option_reply(t, s, OPT_GO)?;
        match rtype {
            REP_ACK => break,
            REP_INFO if body.len() >= 2 => match get_u16(&body, 0) {
                INFO_EXPORT if body.len() >= 12 => export = Some((get_u64(&body, 2), get_u16(&body, 10))),
                INFO_BLOCK_SIZE if body.len() >= 14 => {
                    sizes = Some((get_u32(&body, 2), get_u32(&body, 6), get_u32(&body, 10)))
                }
                _ => {}
            },
            REP_INFO => {}
            REP_ERR_UNSUP => {
                // An old server: NBD_OPT_EXPORT_NAME, which cannot report errors.
                send_option(s, OPT_EXPORT_NAME, name).map_err(|e| hs_io(t, e))?;
                let mut r = [0u8; 10];
                s.read_exact(&mut r).map_err(|e| match e.kind() {
                    io::ErrorKind::UnexpectedEof => hs_err(
                        t,
                        io::ErrorKind::NotFound,
                        "the server closed the connection: no such export, or access refused",
                    ),
                    _ => hs_io(t, e),
                })?;
                if !no_zeroes {
                    let mut z = [0u8; 124];
                    s.read_exact(&mut z).map_err(|e| hs_io(t, e))?;
                }
                export = Some((get_u64(&r, 0), get_u16(&r, 8)));
                break;
            }
            e if e & (1 << 31) != 0 => {
                let msg = String::from_utf8_lossy(&body);
                let kind = if e == (1 << 31) + 6 { io::ErrorKind::NotFound } else { io::ErrorKind::Other };
                // A soft disconnect, as the protocol asks after a failed option.
                let _ = send_option(s, OPT_ABORT, &[]);
                let detail = if msg.is_empty() { String::new() } else { format!(": {msg}") };
                return Err(hs_err(t, kind, format!("export {:?}: {}{detail}", t.export, rep_error_name(e))));
            }
            _ => {}
        }
    }
    let Some((size, flags)) = export else {
        return Err(hs_err(t, io::ErrorKind::InvalidData, "the server accepted the export but did not give its size"));
    };
    if size % BS != 0 || size == 0 {
        return Err(Error::Invalid(format!(
            "{t}: the export holds {size} bytes, not a non-zero multiple of the {BLOCK_SIZE}-byte block"
        )));
    }
    let mut max_payload = DEFAULT_MAX_PAYLOAD;
    if let Some((min, _pref, max)) = sizes {
        if min == 0 || min > BLOCK_SIZE as u32 || BLOCK_SIZE as u32 % min != 0 || max < BLOCK_SIZE as u32 {
            return Err(Error::Invalid(format!(
                "{t}: the server's block sizes (minimum {min}, maximum {max}) do not allow {BLOCK_SIZE}-byte requests"
            )));
        }
        max_payload = max.min(DEFAULT_MAX_PAYLOAD) / BLOCK_SIZE as u32 * BLOCK_SIZE as u32;
    }
    Ok(ExportInfo { size, flags, max_payload, structured })
}

/// Read one reply to option `opt`: its type and body.
fn read_option_reply(t: &NbdTarget, s: &mut Stream, opt: u32) -> Result<(u32, Vec<u8>)> {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).map_err(|e| hs_io(t, e))?;
    if get_u64(&h, 0) != REPLY_MAGIC || get_u32(&h, 8) != opt {
        return Err(hs_err(t, io::ErrorKind::InvalidData, "malformed option reply"));
    }
    let (rtype, len) = (get_u32(&h, 12), get_u32(&h, 16));
    if len > MAX_OPTION_REPLY {
        return Err(hs_err(t, io::ErrorKind::InvalidData, format!("option reply of {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).map_err(|e| hs_io(t, e))?;
    Ok((rtype, body))
}

fn send_option(s: &mut Stream, opt: u32, data: &[u8]) -> io::Result<()> {
    let mut m = Vec::with_capacity(16 + data.len());
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m)
}

fn request_header(cmd: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> [u8; 28] {
    let mut h = [0u8; 28];
    h[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&flags.to_be_bytes());
    h[6..8].copy_from_slice(&cmd.to_be_bytes());
    h[8..16].copy_from_slice(&cookie.to_be_bytes());
    h[16..24].copy_from_slice(&offset.to_be_bytes());
    h[24..28].copy_from_slice(&len.to_be_bytes());
    h
}

// ---------------------------------------------------------------------------------------
// The device

/// A request waiting for its reply (kept until then, so it can be sent again).
struct Pending {
    cmd: u16,
    /// Command flags (`CMD_FLAG_FUA`), kept so a re-sent request keeps them.
    flags: u16,
    offset: u64,
    len: u32,
    data: Option<Arc<Vec<u8>>>,
    sent: Instant,
    /// When it was first sent: a request still unanswered `timeout` after this, over
    /// however many connections, fails (a server that takes connections and then
    /// answers nothing usable must not hold a caller forever).
    first: Instant,
    done: mpsc::Sender<Result<Vec<u8>>>,
}

/// An acknowledged write not yet covered by a flush.
struct Acked {
    cookie: u64,
    offset: u64,
    data: Arc<Vec<u8>>,
}

struct State {
    /// Connection generation (bumped at each reconnection).
    gen: u64,
    connected: bool,
    /// Gave up reconnecting: new requests fail at once.
    failed: bool,
    next_cookie: u64,
    pending: HashMap<u64, Pending>,
    /// Cookies of writes and trims not yet acknowledged (cookies grow with issue order).
    writes_in_flight: BTreeSet<u64>,
    /// Acknowledged writes since the last flush, in acknowledgement order.
    replay: Vec<Acked>,
    replay_bytes: usize,
    /// Cookie of the first acknowledged write since the last flush that was not kept.
    overflow: Option<u64>,
    /// A reconnection happened while `overflow` was set: acknowledged data may be lost.
    lost: bool,
}

struct Sender {
    gen: u64,
    stream: Option<Stream>,
}

struct Shared {
    target: NbdTarget,
    info: ExportInfo,
    state: Mutex<State>,
    drained: Condvar,
    /// Signalled when a request completes (room under `max_in_flight`).
    room: Condvar,
    /// One per connection.
    send: Vec<Mutex<Sender>>,
    closing: AtomicBool,
}

impl Shared {
    /// The connection a request at `offset` goes over (flushes: the first).
    fn route(&self, offset: u64) -> usize {
        (offset / REGION) as usize % self.send.len()
    }

    /// Where a request of `len` bytes at `offset` must be cut: at `max` bytes, and at
    /// region boundaries when there are several connections.
    fn pieces(&self, offset: u64, len: u64, max: u64) -> Vec<(u64, u64)> {
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
}

/// A block device served by an NBD server. See the module documentation.
pub struct NbdDevice {
    shared: Arc<Shared>,
    blocks: u64,
    read_only: bool,
    counters: Counters,
    reader: Option<JoinHandle<()>>,
    ahead: Mutex<Ahead>,
}

/// Reads of at least this many bytes are candidates for sequential readahead (file data
/// comes through FUSE in 128 KiB reads; metadata in single blocks and prefetch batches).
const RA_MIN_READ: usize = 64 << 10;
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
struct Ahead {
    /// Where the next read of a sequential stream would start.
    next: u64,
    /// Contiguous, ascending chunks.
    chunks: std::collections::VecDeque<Chunk>,
}

struct Chunk {
    start: u64,
    blocks: u64,
    rx: Option<mpsc::Receiver<Result<Vec<u8>>>>,
    data: Option<Vec<u8>>,
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

fn eio(msg: impl fmt::Display) -> Error {
    Error::Io(io::Error::other(msg.to_string()))
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

    /// Queue one request; the receiver gets its result.
    fn submit(
        &self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        data: Option<Arc<Vec<u8>>>,
    ) -> Result<mpsc::Receiver<Result<Vec<u8>>>> {
        let sh = &*self.shared;
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

    fn wait(rx: mpsc::Receiver<Result<Vec<u8>>>) -> Result<Vec<u8>> {
        rx.recv().unwrap_or_else(|_| Err(eio("nbd: request abandoned")))
    }

    /// Queue the reads of one run, split at the server's largest payload.
    fn submit_read(&self, block: u64, len: usize) -> Result<Vec<mpsc::Receiver<Result<Vec<u8>>>>> {
        let sh = &*self.shared;
        let pieces = sh.pieces(block * BS, len as u64, u64::from(sh.info.max_payload));
        let mut out = Vec::with_capacity(pieces.len());
        for (off, n) in pieces {
            out.push(self.submit(CMD_READ, 0, off, n as u32, None)?);
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
            rxs.push(self.submit(CMD_WRITE, flags, off, len as u32, Some(Arc::new(chunk.to_vec())))?);
        }
        let mut first_err = None;
        for rx in rxs {
            if let Err(e) = Self::wait(rx) {
                first_err = first_err.or(Some(e));
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        self.counters.write(n);
        Ok(())
    }

    fn finish_read(rxs: Vec<mpsc::Receiver<Result<Vec<u8>>>>, buf: &mut [u8]) -> Result<()> {
        let mut at = 0;
        let mut first_err = None;
        for rx in rxs {
            match Self::wait(rx) {
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

/// Drops readahead chunks over a range being written, now and again when dropped (once
/// the write completed).
struct Fresh<'a> {
    ahead: &'a Mutex<Ahead>,
    block: u64,
    count: u64,
}

impl<'a> Fresh<'a> {
    fn new(ahead: &'a Mutex<Ahead>, block: u64, count: u64) -> Fresh<'a> {
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
    fn read_ahead(&self, block: u64, n: u64, buf: &mut [u8]) -> Result<()> {
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
                    match c.rx.take().map(Self::wait) {
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
                match self.submit(CMD_READ, 0, at * BS, (k * BS) as u32, None) {
                    Ok(rx) => ra.chunks.push_back(Chunk { start: at, blocks: k, rx: Some(rx), data: None }),
                    Err(_) => break,
                }
                at += k;
            }
        }
        Ok(())
    }
}

fn send_request(
    s: &mut Stream,
    cmd: u16,
    flags: u16,
    cookie: u64,
    offset: u64,
    len: u32,
    data: Option<&[u8]>,
) -> io::Result<()> {
    s.write_all(&request_header(cmd, flags, cookie, offset, len))?;
    if let Some(d) = data {
        s.write_all(d)?;
    }
    Ok(())
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
        self.ahead.lock().chunks.clear();
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
                match self.submit(CMD_WRITE, 0, off, len as u32, Some(Arc::new(chunk.to_vec()))) {
                    Ok(rx) => rxs.push(rx),
                    Err(e) => {
                        first_err = Some(e);
                        break 'submit;
                    }
                }
            }
        }
        for rx in rxs {
            if let Err(e) = Self::wait(rx) {
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
        let chunks = std::mem::take(&mut self.ahead.lock().chunks);
        for c in chunks {
            if let Some(rx) = c.rx {
                let _ = rx.recv();
            }
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
            Self::wait(self.submit(CMD_FLUSH, 0, 0, 0, None)?)?;
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
            rxs.push(self.submit(CMD_TRIM, 0, off, n as u32, None)?);
        }
        let mut first_err = None;
        for rx in rxs {
            if let Err(e) = Self::wait(rx) {
                first_err = first_err.or(Some(e));
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn stats(&self) -> IoStats {
        self.counters.snapshot()
    }
}

// ---------------------------------------------------------------------------------------
// The reader thread: replies, stalls, reconnection

/// Why the reply loop stopped.
enum Stop {
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
fn reply_loop(sh: &Shared, stream: Stream) -> Stop {
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

/// A request's whole reply is in: hand the result to its caller.
fn complete(sh: &Shared, cookie: u64, error: u32, data: Vec<u8>, msg: String) {
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
        Err(Error::Io(io::Error::other(format!(
            "{}: the server failed a {what} of {} bytes at byte {}: {}{detail}",
            sh.target,
            p.len,
            p.offset,
            io::Error::from_raw_os_error(error as i32)
        ))))
    };
    let _ = p.done.send(result);
}

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
fn supervise(sh: Arc<Shared>, first: Vec<Stream>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_uri_forms() {
        let t = NbdTarget::parse("nbd://example.org/disk").unwrap();
        assert_eq!(t.endpoint, NbdEndpoint::Tcp { host: "example.org".into(), port: 10809 });
        assert_eq!(t.export, "disk");
        assert_eq!(t.timeout, Duration::from_secs(30));
        assert_eq!(t.max_in_flight, 128);
        let t = NbdTarget::parse("nbd://127.0.0.1:1234").unwrap();
        assert_eq!(t.endpoint, NbdEndpoint::Tcp { host: "127.0.0.1".into(), port: 1234 });
        assert_eq!(t.export, "");
        let t = NbdTarget::parse("nbd://[::1]:99/a%20b?timeout=2.5").unwrap();
        assert_eq!(t.endpoint, NbdEndpoint::Tcp { host: "::1".into(), port: 99 });
        assert_eq!(t.export, "a b");
        assert_eq!(t.timeout, Duration::from_millis(2500));
        assert_eq!(t.to_string(), "nbd://[::1]:99/a b");
        let t = NbdTarget::parse("nbd://h/x?inflight=1&timeout=5").unwrap();
        assert_eq!((t.max_in_flight, t.timeout, t.connections), (1, Duration::from_secs(5), 4));
        assert_eq!(NbdTarget::parse("nbd://h/x?conns=1").unwrap().connections, 1);
        assert_eq!(NbdTarget::parse("nbd://h/x?conns=16").unwrap().connections, 16);
        assert!(NbdTarget::parse("nbd://h/x").unwrap().structured_replies);
        assert!(!NbdTarget::parse("nbd://h/x?structured=0").unwrap().structured_replies);
        let t = NbdTarget::parse("nbd+unix:///vol?socket=/tmp/s.sock").unwrap();
        assert_eq!(t.endpoint, NbdEndpoint::Unix("/tmp/s.sock".into()));
        assert_eq!(t.export, "vol");
        assert_eq!(t.to_string(), "nbd+unix:///vol?socket=/tmp/s.sock");
        let t = NbdTarget::parse("nbd+unix://?socket=/s").unwrap();
        assert_eq!(t.export, "");

        for bad in [
            "nbd+unix:///x",
            "nbd+unix://host/x?socket=/s",
            "nbd:///x",
            "nbd://h:port/x",
            "nbd://h:70000/x",
            "nbd://h/x?foo=1",
            "nbd://h/x?timeout=0",
            "nbd://h/x?timeout=-3",
            "nbd://h/x?inflight=0",
            "nbd://h/x?inflight=x",
            "nbd://h/x?conns=0",
            "nbd://h/x?conns=17",
            "nbd://h/x?conns=",
            "nbd://h/x?structured=2",
            "nbd://h/%zz",
            "nbd://[::1/x",
            "http://h/x",
        ] {
            let e = NbdTarget::parse(bad).unwrap_err();
            assert!(matches!(e, Error::Invalid(ref m) if m.contains("nbd://HOST")), "{bad}: {e}");
        }
        assert!(is_nbd_uri("nbd://h/x") && is_nbd_uri("nbd+unix:///x?socket=/s") && !is_nbd_uri("/tmp/img"));
    }

    #[test]
    fn request_header_layout() {
        let h = request_header(CMD_WRITE, 0, 0x0102030405060708, 4096, 8192);
        assert_eq!(&h[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(&h[4..6], &[0, 0], "no command flags");
        assert_eq!(&request_header(CMD_WRITE, CMD_FLAG_FUA, 1, 0, 4096)[4..6], &[0, 1], "FUA");
        assert_eq!(&h[6..8], &[0, 1]);
        assert_eq!(get_u64(&h, 8), 0x0102030405060708);
        assert_eq!(get_u64(&h, 16), 4096);
        assert_eq!(get_u32(&h, 24), 8192);
    }
}
