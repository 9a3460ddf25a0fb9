//! NBD addresses: `nbd://HOST[:PORT]/EXPORT` and `nbd+unix:///EXPORT?socket=PATH`, with
//! their query parameters.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};

/// Requests in flight at once unless the address says otherwise.
const DEFAULT_IN_FLIGHT: usize = 128;
/// Connections opened to a multi-conn server unless the address says otherwise.
const DEFAULT_CONNECTIONS: usize = 4;
/// Most connections an address may ask for.
const MAX_CONNECTIONS: usize = 16;

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
}
