//! The transport seam: how requests travel between the kernel and a request handler
//! (`server/` in `dxfs mount`, an in-memory file system in the transport probe).
//!
//! A [`Handler`] answers parsed requests ([`Request`]) with a [`Reply`]; it does not know
//! how they came. Two transports carry them:
//!
//! - classic ([`serve_classic`]): threads that `read(2)` one request at a time from
//!   `/dev/fuse` and `write(2)` the reply. Any thread may get any request, so a request
//!   usually wakes a thread on another CPU.
//! - FUSE over io_uring ([`serve_queue`]): one [`Queue`] per possible CPU, each on a
//!   thread pinned to that CPU; the kernel puts a request on the queue of the CPU that
//!   made it. The classic loop keeps running beside it on one thread: FORGET,
//!   BATCH_FORGET and INTERRUPT still come through `/dev/fuse`, and so does everything
//!   until every queue has registered.
//!
//! [`negotiate`] answers INIT and decides which of the two runs, with the reason to log.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{self, Read, Write};
use std::str::FromStr;

use super::blockers::Blockers;
use super::uring::Queue;
use super::wire::{self, init, split_classic, InHeader, InitIn, InitOut, Request};

/// `-o transport=`: which transport to serve with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportChoice {
    /// io_uring when the kernel offers it, else classic.
    #[default]
    Auto,
    /// io_uring; falls back to classic (with a warning) when it cannot be had.
    Uring,
    /// The `/dev/fuse` read/write loop only.
    Classic,
}

impl FromStr for TransportChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(TransportChoice::Auto),
            "uring" => Ok(TransportChoice::Uring),
            "classic" => Ok(TransportChoice::Classic),
            other => Err(format!("transport={other}: expected auto, uring or classic")),
        }
    }
}

/// A handler's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// No reply (FORGET, BATCH_FORGET, INTERRUPT).
    None,
    /// Success, with the reply struct(s) encoded.
    Data(Vec<u8>),
    /// Success: file data read into an aligned buffer, sent from where it was read.
    Aligned(crate::block::AlignedBuf),
    /// A positive errno.
    Error(i32),
}

impl Reply {
    /// The errno a ring entry carries: no reply is an empty success.
    fn errno(&self) -> i32 {
        match self {
            Reply::Error(errno) => *errno,
            _ => 0,
        }
    }

    /// The body a ring entry carries.
    pub(super) fn body(&self) -> &[u8] {
        match self {
            Reply::Data(b) => b,
            Reply::Aligned(b) => b,
            Reply::None | Reply::Error(_) => &[],
        }
    }
}

/// Send a successful reply with `body`, without copying the body behind its header.
fn send_data(dev: &dyn Device, unique: u64, body: &[u8]) -> io::Result<()> {
    let mut header = Vec::with_capacity(wire::OutHeader::SIZE);
    let len = (wire::OutHeader::SIZE + body.len()) as u32;
    wire::OutHeader { len, error: 0, unique }.encode(&mut header);
    dev.send_parts(&header, body)
}

/// Answers requests; called from every serving thread at once.
pub trait Handler: Send + Sync {
    /// Answer `req`; `via_ring` says which transport brought it (for counters).
    fn handle(&self, header: &InHeader, req: &Request<'_>, via_ring: bool) -> Reply;

    /// Answer a READ (`req`) by writing the data into `out` (page-aligned, as large as
    /// the kernel's payload buffer): the number of bytes, or an errno. `None`: not
    /// supported, answer through [`Handler::handle`]. FUSE over io_uring reads file data
    /// straight into the ring entry's buffer this way.
    fn read_into(&self, _header: &InHeader, _req: &Request<'_>, _out: &mut [u8]) -> Option<Result<usize, i32>> {
        None
    }

    /// Whether answering `req` may block for long (an fsync waits for a commit). An
    /// io_uring queue answers such a request on a thread of its own, so that the other
    /// requests made on its CPU do not wait behind it.
    fn blocks(&self, _req: &Request<'_>) -> bool {
        false
    }

    /// Answer `req` now unless that would mean a long wait (a write that must wait for
    /// room, or anything that would wait for another request); `None`: nothing was
    /// answered, and the caller answers it with [`Handler::handle`] on a thread of its
    /// own, as a request that [`Handler::blocks`]. Every serving thread asks: an io_uring
    /// queue thread serves a whole CPU, and no serving thread may wait for a request
    /// that only the serving threads can answer.
    fn handle_unless_it_waits(&self, header: &InHeader, req: &Request<'_>, via_ring: bool) -> Option<Reply> {
        Some(self.handle(header, req, via_ring))
    }
}

/// A FUSE device as the classic loop uses it: one message per read and per write.
pub trait Device: Send + Sync {
    /// Read one request into `buf` (its length).
    fn receive(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Write one reply.
    fn send(&self, msg: &[u8]) -> io::Result<()>;
    /// Write one reply given as a header and a body, in one write: a large body (a READ's
    /// data) is not copied to sit behind its header.
    fn send_parts(&self, header: &[u8], body: &[u8]) -> io::Result<()> {
        let mut msg = Vec::with_capacity(header.len() + body.len());
        msg.extend_from_slice(header);
        msg.extend_from_slice(body);
        self.send(&msg)
    }
}

impl Device for File {
    fn receive(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }

    fn send(&self, msg: &[u8]) -> io::Result<()> {
        (&*self).write_all(msg)
    }

    fn send_parts(&self, header: &[u8], body: &[u8]) -> io::Result<()> {
        // /dev/fuse takes a reply whole or not at all, so one writev either way.
        let n = (&*self).write_vectored(&[io::IoSlice::new(header), io::IoSlice::new(body)])?;
        if n != header.len() + body.len() {
            return Err(io::Error::other(format!("short write of a reply: {n} bytes")));
        }
        Ok(())
    }
}

/// A `/dev/fuse` descriptor read by polling for a while before sleeping: a thread that
/// answered a request keeps trying to read for `spin` (the descriptor is non-blocking),
/// so a caller's next request, which often follows within microseconds, finds it awake
/// instead of waking it; after that it waits in poll(2). Each serving thread needs its
/// own descriptor (a clone): O_NONBLOCK belongs to the open file.
pub struct Spinning {
    file: File,
    spin: std::time::Duration,
}

impl Spinning {
    /// Make `file` non-blocking and spin up to `spin` before each sleep.
    pub fn new(file: File, spin: std::time::Duration) -> io::Result<Spinning> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        let flags = OFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFL)?);
        fcntl(&file, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
        Ok(Spinning { file, spin })
    }
}

impl Device for Spinning {
    fn receive(&self, buf: &mut [u8]) -> io::Result<usize> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let start = std::time::Instant::now();
        loop {
            match (&self.file).read(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return r,
            }
            if start.elapsed() < self.spin {
                std::hint::spin_loop();
                continue;
            }
            let mut fds = [PollFd::new(self.file.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn send(&self, msg: &[u8]) -> io::Result<()> {
        self.file.send(msg)
    }

    fn send_parts(&self, header: &[u8], body: &[u8]) -> io::Result<()> {
        self.file.send_parts(header, body)
    }
}

/// What [`negotiate`] settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// The INIT reply to send.
    pub out: InitOut,
    /// Whether to start io_uring queues.
    pub uring: bool,
    /// Which transport and why, for the log.
    pub why: String,
}

/// Answer INIT: accept the `wanted` flags the kernel offers, and FUSE over io_uring when
/// `choice` allows it and the kernel offers it (it does only with the `fuse` module's
/// `enable_uring` parameter set). An unsupported major version is an error.
pub fn negotiate(
    i: &InitIn,
    choice: TransportChoice,
    wanted: u64,
    max_write: u32,
    max_pages: u16,
) -> Result<Negotiated, String> {
    if i.major != wire::KERNEL_VERSION {
        return Err(format!("the kernel speaks FUSE {}.{}; this daemon speaks 7.x", i.major, i.minor));
    }
    let offered = i.flags & init::OVER_IO_URING != 0;
    let mut flags = i.flags & (wanted | init::INIT_EXT | init::MAX_PAGES);
    let (uring, why) = match choice {
        TransportChoice::Classic => (false, "classic: transport=classic".to_string()),
        _ if i.minor < 42 => (false, format!("classic: the kernel speaks FUSE 7.{} (io_uring needs 7.42)", i.minor)),
        _ if !offered => (
            false,
            "classic: the kernel does not offer FUSE over io_uring, the faster transport (its switch is \
             /sys/module/fuse/parameters/enable_uring: `echo Y` into it as root, or mount as root, which does)"
                .to_string(),
        ),
        _ => (true, "io_uring: one queue per CPU".to_string()),
    };
    if uring {
        flags |= init::OVER_IO_URING;
    }
    let out = InitOut {
        major: wire::KERNEL_VERSION,
        minor: wire::KERNEL_MINOR_VERSION.min(i.minor),
        max_readahead: i.max_readahead,
        flags,
        max_background: 16,
        congestion_threshold: 12,
        max_write,
        time_gran: 1,
        max_pages,
    };
    Ok(Negotiated { out, uring, why })
}

/// The queues the kernel waits for before it uses the ring: one per possible CPU
/// (`num_possible_cpus()`), read from `/sys/devices/system/cpu/possible` ("0-1", "0",
/// "0-3,8-11").
pub fn parse_possible_cpus(s: &str) -> Option<usize> {
    s.trim().split(',').map(|r| r.rsplit('-').next().and_then(|n| n.trim().parse::<usize>().ok())).max()?.map(|m| m + 1)
}

/// Answer one parsed request through `reply`.
fn dispatch(handler: &dyn Handler, h: &InHeader, arg: &[u8], rest: &[u8], ring: bool) -> Reply {
    match Request::parse(h.opcode, arg, rest) {
        Ok(req) => handler.handle(h, &req, ring),
        Err(e) => {
            tracing::warn!("malformed request (opcode {}): {e}", h.opcode);
            Reply::Error(libc::EIO)
        }
    }
}

/// The classic loop on one thread: read a request, answer it, until the connection ends
/// (ENODEV after unmount: `Ok`). `buf_size` must hold the largest request (`max_write`
/// plus a page for the headers). A request that blocks or would wait is answered by a
/// kept thread of this one (`Blockers`), which writes its reply itself: this thread
/// goes on reading, so the request it may be waiting for (a FORGET) is served.
pub fn serve_classic(dev: &dyn Device, handler: &dyn Handler, buf_size: usize) -> io::Result<()> {
    let blockers = Blockers::<Deferred>::default();
    std::thread::scope(|scope| {
        let served = classic_loop(dev, handler, buf_size, &blockers, || {
            scope.spawn(|| {
                while let Some(d) = blockers.next() {
                    let reply = dispatch(handler, &d.header, &d.op_in, &d.payload, false);
                    if let Err(e) = send_reply(dev, d.header.unique, reply) {
                        if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENODEV)) {
                            tracing::warn!("reply to request {}: {e}", d.header.unique);
                        }
                    }
                }
            });
        });
        blockers.stop();
        served
    })
}

/// Send `reply` to request `unique` (nothing for `Reply::None`).
fn send_reply(dev: &dyn Device, unique: u64, reply: Reply) -> io::Result<()> {
    match reply {
        Reply::None => Ok(()),
        Reply::Data(body) => send_data(dev, unique, &body),
        Reply::Aligned(body) => send_data(dev, unique, &body),
        Reply::Error(errno) => dev.send(&wire::reply(unique, errno, &[])),
    }
}

/// The loop of [`serve_classic`]: `start_blocker` starts one more blocker thread.
fn classic_loop(
    dev: &dyn Device,
    handler: &dyn Handler,
    buf_size: usize,
    blockers: &Blockers<Deferred>,
    mut start_blocker: impl FnMut(),
) -> io::Result<()> {
    let mut buf = vec![0u8; buf_size.max(wire::MIN_READ_BUFFER)];
    loop {
        let n = match dev.receive(&mut buf) {
            Ok(n) => n,
            Err(e) => match e.raw_os_error() {
                // ENOENT: the request was interrupted before we read it.
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOENT) => continue,
                Some(libc::ENODEV) => return Ok(()),
                _ => return Err(e),
            },
        };
        let (h, reply) = match split_classic(&buf[..n]) {
            Ok((h, arg, rest)) => {
                let now = match Request::parse(h.opcode, arg, rest) {
                    Ok(r) if handler.blocks(&r) => None,
                    Ok(r) => handler.handle_unless_it_waits(&h, &r, false),
                    Err(e) => {
                        tracing::warn!("malformed request (opcode {}): {e}", h.opcode);
                        Some(Reply::Error(libc::EIO))
                    }
                };
                let Some(reply) = now else {
                    let d = Deferred { ent: 0, commit_id: 0, header: h, op_in: arg.to_vec(), payload: rest.to_vec() };
                    if blockers.push(d) {
                        start_blocker();
                    }
                    continue;
                };
                (h, reply)
            }
            Err(e) => {
                tracing::warn!("malformed request from /dev/fuse: {e}");
                match InHeader::parse(&buf[..n]) {
                    // The kernel waits for an answer to anything but these: give it EIO.
                    Ok(h)
                        if !matches!(
                            h.opcode,
                            wire::opcode::FORGET | wire::opcode::BATCH_FORGET | wire::opcode::INTERRUPT
                        ) =>
                    {
                        (h, Reply::Error(libc::EIO))
                    }
                    // No readable header: no `unique` to answer.
                    _ => continue,
                }
            }
        };
        if let Err(e) = send_reply(dev, h.unique, reply) {
            match e.raw_os_error() {
                Some(libc::ENOENT) => {} // interrupted meanwhile: the kernel dropped it
                Some(libc::ENODEV) => return Ok(()),
                _ => return Err(e),
            }
        }
    }
}

/// A request copied out of its ring entry (or the classic read buffer), to be answered
/// on another thread.
struct Deferred {
    /// The ring entry and its commit id (0 for the classic transport).
    ent: usize,
    commit_id: u64,
    header: InHeader,
    op_in: Vec<u8>,
    payload: Vec<u8>,
}

/// Serve one registered io_uring queue until the connection ends (every entry given
/// back by the kernel: `Ok`). Requests the handler says may block are answered by the
/// queue's blockers (kept threads); their replies come back through a channel and an eventfd the
/// ring polls, and this thread commits them (only it may submit to the ring).
/// `arrived` is called with each request's opcode as it arrives (the session's keepers
/// watch it).
pub fn serve_queue(q: &mut Queue, handler: &dyn Handler, arrived: &dyn Fn(u32)) -> io::Result<()> {
    use nix::sys::eventfd::{EfdFlags, EventFd};
    use std::os::fd::{AsFd, AsRawFd};
    use std::sync::mpsc;

    let wake = EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
    q.watch(wake.as_fd().as_raw_fd())?;
    let (done_tx, done_rx) = mpsc::channel::<(usize, u64, Reply)>();
    let blockers = Blockers::<Deferred>::default();
    std::thread::scope(|scope| {
        let served = serve_ring(q, handler, arrived, &wake, &done_rx, &blockers, || {
            // A blocker answers until the queue ends (the request that started it is queued).
            let (tx, wake, blockers) = (done_tx.clone(), &wake, &blockers);
            scope.spawn(move || {
                while let Some(d) = blockers.next() {
                    let reply = dispatch(handler, &d.header, &d.op_in, &d.payload, true);
                    let _ = tx.send((d.ent, d.commit_id, reply));
                    let _ = wake.write(1);
                }
            });
        });
        blockers.stop();
        served
    })
}

/// The loop of [`serve_queue`]: `start_blocker` starts one more blocker thread.
fn serve_ring(
    q: &mut Queue,
    handler: &dyn Handler,
    arrived: &dyn Fn(u32),
    wake: &nix::sys::eventfd::EventFd,
    done_rx: &std::sync::mpsc::Receiver<(usize, u64, Reply)>,
    blockers: &Blockers<Deferred>,
    mut start_blocker: impl FnMut(),
) -> io::Result<()> {
    loop {
        let c = match q.wait() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::NotConnected => return Ok(()),
            Err(e) => return Err(e),
        };
        if c.ent == super::uring::WAKE {
            let _ = wake.read();
            for (ent, commit_id, reply) in done_rx.try_iter() {
                q.commit(ent, commit_id, reply.errno(), reply.body())?;
            }
            continue;
        }
        if c.res != 0 {
            // ENOTCONN: teardown; anything else is worth a line, then the entry is idle.
            if c.res != -libc::ENOTCONN {
                tracing::warn!("queue {} entry {}: {}", q.qid(), c.ent, io::Error::from_raw_os_error(-c.res));
            }
            continue;
        }
        if let Ok(inc) = q.request(c.ent) {
            arrived(inc.header.opcode);
        }
        // A READ goes straight into the entry's payload buffer when the handler can.
        let read = match q.request(c.ent) {
            Ok(inc) if inc.header.opcode == wire::opcode::READ => {
                match Request::parse(inc.header.opcode, inc.op_in, inc.payload) {
                    Ok(Request::Read { fh, offset, size, flags }) => {
                        Some((inc.header, inc.commit_id, fh, offset, size, flags))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some((header, commit_id, fh, offset, size, flags)) = read {
            let req = Request::Read { fh, offset, size, flags };
            let out = q.payload_mut(c.ent);
            let n = (size as usize).min(out.len());
            if let Some(r) = handler.read_into(&header, &req, &mut out[..n]) {
                let (errno, len) = match r {
                    Ok(len) => (0, len),
                    Err(errno) => (errno, 0),
                };
                q.commit_in_place(c.ent, commit_id, errno, len)?;
                continue;
            }
        }
        let (commit_id, reply) = match q.request(c.ent) {
            Ok(inc) => {
                // A request that blocks, or turns out to have to wait, is answered by a
                // kept thread; the others here, now.
                let now = match Request::parse(inc.header.opcode, inc.op_in, inc.payload) {
                    Ok(r) if handler.blocks(&r) => None,
                    Ok(r) => handler.handle_unless_it_waits(&inc.header, &r, true),
                    Err(e) => {
                        tracing::warn!("malformed request (opcode {}): {e}", inc.header.opcode);
                        Some(Reply::Error(libc::EIO))
                    }
                };
                let Some(reply) = now else {
                    let d = Deferred {
                        ent: c.ent,
                        commit_id: inc.commit_id,
                        header: inc.header,
                        op_in: inc.op_in.to_vec(),
                        payload: inc.payload.to_vec(),
                    };
                    if blockers.push(d) {
                        start_blocker();
                    }
                    continue;
                };
                (inc.commit_id, reply)
            }
            // Answer what cannot be read with EIO: a request left unanswered would hang
            // its caller, and the entry with it.
            Err(e) => {
                tracing::warn!("queue {}: malformed request: {e}", q.qid());
                (q.commit_id(c.ent), Reply::Error(libc::EIO))
            }
        };
        q.commit(c.ent, commit_id, reply.errno(), reply.body())?;
    }
}

#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// A device that hands out canned requests, then a final error, and keeps replies.
    struct Fake {
        requests: Mutex<VecDeque<io::Result<Vec<u8>>>>,
        replies: Mutex<Vec<Vec<u8>>>,
    }

    impl Device for Fake {
        fn receive(&self, buf: &mut [u8]) -> io::Result<usize> {
            let next = self.requests.lock().unwrap().pop_front();
            let r = next.unwrap_or_else(|| Err(io::Error::from_raw_os_error(libc::ENODEV)))?;
            buf[..r.len()].copy_from_slice(&r);
            Ok(r.len())
        }

        fn send(&self, msg: &[u8]) -> io::Result<()> {
            self.replies.lock().unwrap().push(msg.to_vec());
            Ok(())
        }
    }

    /// Knows one name; everything else is ENOENT.
    struct OneName;

    impl Handler for OneName {
        fn handle(&self, h: &InHeader, req: &Request<'_>, via_ring: bool) -> Reply {
            assert!(!via_ring);
            match req {
                Request::Lookup { name } if *name == b"a" => Reply::Data(vec![h.nodeid as u8; 4]),
                Request::Forget { .. } => Reply::None,
                _ => Reply::Error(libc::ENOENT),
            }
        }
    }

    fn request(opcode: u32, unique: u64, nodeid: u64, body: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        InHeader { len: (40 + body.len()) as u32, opcode, unique, nodeid, ..InHeader::default() }.encode(&mut v);
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn classic_loop_answers_skips_and_ends() {
        let dev = Fake {
            requests: Mutex::new(VecDeque::from(vec![
                Ok(request(wire::opcode::LOOKUP, 10, 1, b"a\0")),
                Err(io::Error::from_raw_os_error(libc::ENOENT)), // interrupted: skipped
                Ok(request(wire::opcode::FORGET, 11, 5, &[1, 0, 0, 0, 0, 0, 0, 0])), // no reply
                Ok(request(wire::opcode::LOOKUP, 12, 1, b"b\0")),
                Ok(request(wire::opcode::LOOKUP, 13, 1, b"no-nul")), // malformed: EIO
                Ok(vec![1, 2, 3]),                                   // no header: dropped
                Ok({
                    let mut r = request(wire::opcode::GETATTR, 14, 1, &[0; 16]);
                    r[0] = 99; // a length that disagrees with the read: EIO
                    r
                }),
                Ok({
                    let mut r = request(wire::opcode::FORGET, 15, 1, &[0; 8]);
                    r[0] = 99; // malformed, but FORGET gets no reply anyway
                    r
                }),
            ])),
            replies: Mutex::new(Vec::new()),
        };
        serve_classic(&dev, &OneName, 0).unwrap();
        let replies = dev.replies.into_inner().unwrap();
        assert_eq!(
            replies,
            vec![
                wire::reply(10, 0, &[1, 1, 1, 1]),
                wire::reply(12, libc::ENOENT, &[]),
                wire::reply(13, libc::EIO, &[]),
                wire::reply(14, libc::EIO, &[]),
            ]
        );
    }

    /// A LOOKUP that cannot be answered until a FORGET has been served (as a write short
    /// of space waits for the FORGET of a file removed moments ago).
    #[derive(Default)]
    struct WaitsForForget {
        forgotten: Mutex<bool>,
        wake: std::sync::Condvar,
    }

    impl Handler for WaitsForForget {
        fn handle(&self, _h: &InHeader, req: &Request<'_>, _via_ring: bool) -> Reply {
            match req {
                Request::Forget { .. } => {
                    *self.forgotten.lock().unwrap() = true;
                    self.wake.notify_all();
                    Reply::None
                }
                _ => {
                    let g = self.forgotten.lock().unwrap();
                    let (g, _) = self.wake.wait_timeout_while(g, std::time::Duration::from_secs(20), |f| !*f).unwrap();
                    Reply::Error(if *g { 0 } else { libc::ETIMEDOUT })
                }
            }
        }

        fn handle_unless_it_waits(&self, h: &InHeader, req: &Request<'_>, via_ring: bool) -> Option<Reply> {
            let waits = !matches!(req, Request::Forget { .. }) && !*self.forgotten.lock().unwrap();
            (!waits).then(|| self.handle(h, req, via_ring))
        }
    }

    /// One classic thread: the request that would wait is answered by a kept thread
    /// while the loop goes on to serve the FORGET it waits for.
    #[test]
    fn classic_loop_never_waits_for_a_request_it_must_serve() {
        let dev = Fake {
            requests: Mutex::new(VecDeque::from(vec![
                Ok(request(wire::opcode::LOOKUP, 20, 1, b"w\0")),
                Ok(request(wire::opcode::FORGET, 21, 5, &[1, 0, 0, 0, 0, 0, 0, 0])),
            ])),
            replies: Mutex::new(Vec::new()),
        };
        serve_classic(&dev, &WaitsForForget::default(), 0).unwrap();
        assert_eq!(dev.replies.into_inner().unwrap(), vec![wire::reply(20, 0, &[])]);
    }

    #[test]
    fn classic_loop_reports_other_errors() {
        let dev = Fake {
            requests: Mutex::new(VecDeque::from(vec![Err(io::Error::from_raw_os_error(libc::EBADF))])),
            replies: Mutex::new(Vec::new()),
        };
        assert_eq!(serve_classic(&dev, &OneName, 0).unwrap_err().raw_os_error(), Some(libc::EBADF));
    }

    fn offer(minor: u32, flags: u64) -> InitIn {
        InitIn { major: 7, minor, max_readahead: 1 << 17, flags }
    }

    #[test]
    fn negotiation_picks_the_transport_and_says_why() {
        let all = init::INIT_EXT | init::OVER_IO_URING | init::ASYNC_READ | init::MAX_PAGES;
        let n = negotiate(&offer(44, all), TransportChoice::Auto, init::ASYNC_READ, 1 << 17, 32).unwrap();
        assert!(n.uring);
        assert_eq!(n.out.flags, all);
        assert_eq!(n.out.minor, 42);

        let n = negotiate(&offer(44, all), TransportChoice::Classic, init::ASYNC_READ, 1 << 17, 32).unwrap();
        assert!(!n.uring);
        assert_eq!(n.out.flags & init::OVER_IO_URING, 0);
        assert!(n.why.contains("transport=classic"));

        // enable_uring=N: the kernel does not offer the flag.
        let n = negotiate(&offer(44, all & !init::OVER_IO_URING), TransportChoice::Uring, 0, 1 << 17, 32).unwrap();
        assert!(!n.uring);
        assert!(n.why.contains("enable_uring"), "{}", n.why);

        // An old kernel: no io_uring, and the reply speaks its minor version.
        let n = negotiate(&offer(38, init::INIT_EXT), TransportChoice::Auto, 0, 1 << 17, 32).unwrap();
        assert!(!n.uring);
        assert_eq!(n.out.minor, 38);

        // Flags the kernel did not offer are not accepted.
        let n = negotiate(&offer(44, init::INIT_EXT), TransportChoice::Auto, init::ASYNC_READ, 1 << 17, 32).unwrap();
        assert_eq!(n.out.flags, init::INIT_EXT);

        let bad = InitIn { major: 8, ..offer(0, 0) };
        assert!(negotiate(&bad, TransportChoice::Auto, 0, 1 << 17, 32).is_err());
    }

    #[test]
    fn transport_option_and_possible_cpus() {
        assert_eq!("auto".parse(), Ok(TransportChoice::Auto));
        assert_eq!("uring".parse(), Ok(TransportChoice::Uring));
        assert_eq!("classic".parse(), Ok(TransportChoice::Classic));
        assert!("fast".parse::<TransportChoice>().is_err());
        assert_eq!(parse_possible_cpus("0-1\n"), Some(2));
        assert_eq!(parse_possible_cpus("0"), Some(1));
        assert_eq!(parse_possible_cpus("0-3,8-11"), Some(12));
        assert_eq!(parse_possible_cpus(""), None);
    }
}
