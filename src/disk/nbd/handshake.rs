//! Opening a connection: the fixed newstyle handshake (structured replies, `NBD_OPT_GO`
//! with `NBD_INFO_BLOCK_SIZE`, `NBD_OPT_EXPORT_NAME` for old servers) and the several
//! connections of a multi-conn device.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::proto::*;
use super::stream::Stream;
use super::uri::{NbdEndpoint, NbdTarget};
use super::{eio, BS};
use crate::disk::codec::BLOCK_SIZE;
use crate::error::{Error, Result};

/// The protocol's default largest payload when the server names none (32 MiB).
const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;
/// Largest option reply accepted during the handshake.
const MAX_OPTION_REPLY: u32 = 64 << 10;

/// What the handshake learnt about the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ExportInfo {
    pub(super) size: u64,
    pub(super) flags: u16,
    /// Largest payload of one request.
    pub(super) max_payload: u32,
    /// The server agreed to structured replies.
    pub(super) structured: bool,
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
pub(super) fn connect_all(t: &NbdTarget, want: Option<usize>) -> Result<(Vec<Stream>, ExportInfo)> {
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
