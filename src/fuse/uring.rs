//! FUSE over io_uring: one queue's ring and the buffers the kernel writes requests into.
//!
//! The module has unsafe code (as do `devfd`, `fusermount` and `control`, one call each):
//! the kernel reads and writes the entries' buffers through raw addresses while commands
//! are in flight, and `io-uring`'s `push` is unsafe for that reason. Everything else (the wire format, what to answer)
//! lives in safe code ([`super::wire`]).
//!
//! A queue serves the requests made on one CPU (`qid` = CPU number). It owns an io_uring
//! with 128-byte SQEs and `depth` entries; each entry is two buffers, the 288-byte
//! `fuse_uring_req_header` and a payload of at least the kernel's `max_payload_sz`
//! ([`super::wire::uring::payload_size`]). [`Queue::register`] hands every entry to the
//! kernel (FUSE_IO_URING_CMD_REGISTER, `sqe->addr` = an iovec pair, `sqe->len` = 2);
//! a completion means the entry holds a request ([`Queue::request`]); [`Queue::commit`]
//! writes the reply into the same buffers and queues FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
//! which returns the entry to the kernel for the next request. Commits are submitted in
//! one batch by the next [`Queue::wait`].
//!
//! Ownership rule that makes the buffer access sound: an entry's buffers are touched by
//! this code only while the entry is [`EntState::User`] (after its completion, before its
//! commit); while it is with the kernel nothing here forms a reference to them. At drop,
//! buffers of entries still with the kernel are leaked, not freed: the io_uring's
//! teardown is asynchronous and the kernel may still complete a command into them.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::wire::{self, uring as wu, InHeader, OutHeader};

/// A heap buffer at a fixed address, shared with the kernel.
struct Buf {
    /// The allocation (`Box<[u8]>` of `raw_len` bytes), freed in `Drop`.
    raw: *mut u8,
    raw_len: usize,
    /// The buffer: `len` bytes from the first page-aligned byte of the allocation, so
    /// that file data can be read into it with `O_DIRECT`.
    ptr: *mut u8,
    len: usize,
}

/// Alignment of ring buffers (a page).
const BUF_ALIGN: usize = 4096;

impl Buf {
    fn new(len: usize) -> Buf {
        let b: Box<[u8]> = vec![0u8; len + BUF_ALIGN].into_boxed_slice();
        let raw_len = b.len();
        let raw = Box::into_raw(b).cast::<u8>();
        let off = raw.align_offset(BUF_ALIGN);
        // SAFETY: `off` < BUF_ALIGN, so `off + len` stays inside the `len + BUF_ALIGN`
        // bytes just allocated.
        let ptr = unsafe { raw.add(off) };
        Buf { raw, raw_len, ptr, len }
    }

    /// The bytes. Only called for entries in [`EntState::User`].
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` and `len` lie inside a live `Box<[u8]>` that only `Drop` frees; the
        // caller holds the entry in `User` state, so the kernel has no command in flight
        // that could write these bytes while the shared borrow lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, writable. Only called for entries in [`EntState::User`].
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only borrow on our side, and
        // the kernel does not touch a `User` entry.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: `raw`/`raw_len` are exactly the `Box<[u8]>` leaked in `new`, freed once
        // here; `Queue::drop` forgets (never drops) the buffers the kernel may still write.
        unsafe { drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.raw, self.raw_len))) }
    }
}

// SAFETY: `Buf` is an owned heap allocation like `Box<[u8]>`; the raw pointer is only
// there to keep Rust references away from memory the kernel writes.
unsafe impl Send for Buf {}

/// Where an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntState {
    /// Not registered, or given back by the kernel with an error (teardown).
    Idle,
    /// Registered or committed: the kernel owns the buffers.
    Kernel,
    /// Holds a request: ours until [`Queue::commit`].
    User,
}

struct Ent {
    header: Buf,
    payload: Buf,
    /// The iovec pair REGISTER points at; read by the kernel when it issues the command.
    iov: Box<[libc::iovec; 2]>,
    state: EntState,
}

// SAFETY: the iovecs only hold the addresses of this entry's own buffers.
unsafe impl Send for Ent {}

/// [`Completion::ent`] of a wake-up: the descriptor [`Queue::watch`] polls became readable.
pub const WAKE: usize = usize::MAX;

/// A completion: entry `ent` came back with result `res` (0: it holds a request;
/// negative errno: registration failed, or the connection is going away), or [`WAKE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The entry.
    pub ent: usize,
    /// The command's result.
    pub res: i32,
}

/// A request as an entry holds it.
#[derive(Debug)]
pub struct Incoming<'a> {
    /// The in-header.
    pub header: InHeader,
    /// The opcode's fixed argument.
    pub op_in: &'a [u8],
    /// The rest: names, write data.
    pub payload: &'a [u8],
    /// The id to commit the reply under.
    pub commit_id: u64,
}

/// How a queue's ring is set up.
#[derive(Debug, Clone, Copy)]
pub struct QueueConfig {
    /// Entries (requests in flight on this queue).
    pub depth: usize,
    /// Payload buffer size: at least [`wire::uring::payload_size`] of the INIT reply.
    pub payload_size: usize,
    /// `IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN`: the kernel's task work
    /// for this ring runs only when the serving thread waits in `io_uring_enter`.
    pub defer_taskrun: bool,
}

/// One FUSE io_uring queue. Create and use it on the thread that serves it.
pub struct Queue {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    dev: Arc<File>,
    qid: u16,
    ents: Vec<Ent>,
    ready: VecDeque<Completion>,
    /// The descriptor `watch` polls, and whether its multishot poll is armed.
    watched: Option<(i32, bool)>,
}

/// Set `sqe->len` (offset 24 of `struct io_uring_sqe`), which `io-uring`'s `UringCmd80`
/// builder does not expose; FUSE's REGISTER reads the iovec count from it.
fn with_len(e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `repr(C)`, 128 bytes (the crate tests it), made of
    // `io_uring_sqe` (integers and unions of integers) and a byte array: every bit
    // pattern is valid in both directions of the transmute.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute::<squeue::Entry128, [u8; 128]>(e) };
    bytes[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes) }
}

impl Queue {
    /// A ring with `cfg.depth` entries for queue `qid` on the FUSE device `dev`.
    pub fn new(dev: Arc<File>, qid: u16, cfg: QueueConfig) -> io::Result<Queue> {
        let depth = cfg.depth.max(1);
        let mut b = IoUring::<squeue::Entry128, cqueue::Entry>::builder();
        if cfg.defer_taskrun {
            b.setup_single_issuer().setup_defer_taskrun();
        }
        let ring = b.build((depth as u32).next_power_of_two())?;
        let ents = (0..depth)
            .map(|_| {
                let header = Buf::new(wu::HEADER_SIZE);
                let payload = Buf::new(cfg.payload_size);
                let iov = Box::new([
                    libc::iovec { iov_base: header.ptr.cast(), iov_len: header.len },
                    libc::iovec { iov_base: payload.ptr.cast(), iov_len: payload.len },
                ]);
                Ent { header, payload, iov, state: EntState::Idle }
            })
            .collect();
        Ok(Queue { ring, dev, qid, ents, ready: VecDeque::new(), watched: None })
    }

    /// This queue's id.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Entries.
    pub fn depth(&self) -> usize {
        self.ents.len()
    }

    /// State of entry `ent`.
    pub fn state(&self, ent: usize) -> EntState {
        self.ents[ent].state
    }

    fn push(&mut self, e: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: every SQE this module pushes points only at buffers and iovecs owned by
        // `self.ents`, which live at fixed heap addresses until `Queue::drop`, and that
        // drop leaks (never frees) those of entries still with the kernel; the poll of
        // `watch` points at no memory.
        let pushed = unsafe { self.ring.submission().push(e) };
        if pushed.is_err() {
            self.ring.submit()?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(e) }
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        Ok(())
    }

    /// Give every idle entry to the kernel (FUSE_IO_URING_CMD_REGISTER) and submit.
    /// Registration errors the kernel reports at once (EOPNOTSUPP when
    /// `enable_uring` is off, EINVAL for a short payload buffer, EAGAIN before INIT
    /// completed) are returned; later ones arrive as completions.
    pub fn register(&mut self) -> io::Result<()> {
        let fd = types::Fd(self.dev.as_raw_fd());
        for i in 0..self.ents.len() {
            if self.ents[i].state != EntState::Idle {
                continue;
            }
            let cmd = wu::CmdReq { flags: 0, commit_id: 0, qid: self.qid }.encode();
            let addr = self.ents[i].iov.as_ptr() as u64;
            let e = opcode::UringCmd80::new(fd, wu::CMD_REGISTER).cmd(cmd).addr(Some(addr)).build().user_data(i as u64);
            let e = with_len(e, 2);
            self.push(&e)?;
            self.ents[i].state = EntState::Kernel;
        }
        self.ring.submit()?;
        self.reap();
        if let Some(c) = self.ready.iter().find(|c| c.res < 0) {
            return Err(io::Error::from_raw_os_error(-c.res));
        }
        Ok(())
    }

    /// Also wake [`Queue::wait`] (with a [`WAKE`] completion) whenever `fd` becomes
    /// readable: how replies finished on other threads reach this one, which alone may
    /// submit to the ring. The caller keeps `fd` open while the queue lives.
    pub fn watch(&mut self, fd: i32) -> io::Result<()> {
        self.watched = Some((fd, false));
        self.arm_watch()
    }

    fn arm_watch(&mut self) -> io::Result<()> {
        let Some((fd, false)) = self.watched else { return Ok(()) };
        let e = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).multi(true).build().user_data(WAKE as u64);
        self.push(&e.into())?;
        self.watched = Some((fd, true));
        Ok(())
    }

    fn reap(&mut self) {
        for c in self.ring.completion() {
            let ent = c.user_data() as usize;
            let res = c.result();
            if ent == WAKE {
                // A multishot poll that ends (no F_MORE) is armed again by the next wait.
                if !cqueue::more(c.flags()) {
                    if let Some((fd, _)) = self.watched {
                        self.watched = Some((fd, false));
                    }
                }
                self.ready.push_back(Completion { ent, res });
                continue;
            }
            if let Some(e) = self.ents.get_mut(ent) {
                e.state = if res == 0 { EntState::User } else { EntState::Idle };
                self.ready.push_back(Completion { ent, res });
            }
        }
    }

    /// Submit queued commits and wait for the next completion. Ends (NotConnected) once
    /// every entry is back from the kernel and none holds a request being answered.
    pub fn wait(&mut self) -> io::Result<Completion> {
        loop {
            if let Some(c) = self.ready.pop_front() {
                return Ok(c);
            }
            if self.ents.iter().all(|e| e.state == EntState::Idle) {
                return Err(io::Error::new(io::ErrorKind::NotConnected, "no entry is with the kernel"));
            }
            self.arm_watch()?;
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            self.reap();
        }
    }

    /// The request entry `ent` holds (it must be [`EntState::User`]).
    pub fn request(&self, ent: usize) -> wire::Result<Incoming<'_>> {
        let e = &self.ents[ent];
        assert_eq!(e.state, EntState::User, "entry {ent} holds no request");
        let h = e.header.bytes();
        let header = InHeader::parse(&h[wu::IN_OUT_OFFSET..])?;
        let io = wu::EntInOut::parse(&h[wu::ENT_IN_OUT_OFFSET..])?;
        let n = wire::op_in_size(header.opcode).min(wu::OP_IN_SIZE);
        let op_in = &h[wu::OP_IN_OFFSET..wu::OP_IN_OFFSET + n];
        let p = e.payload.bytes();
        let sz = io.payload_sz as usize;
        if sz > p.len() {
            return Err(wire::WireError::Short { what: "payload buffer", need: sz, have: p.len() });
        }
        Ok(Incoming { header, op_in, payload: &p[..sz], commit_id: io.commit_id })
    }

    /// The commit id of the request entry `ent` holds (it must be [`EntState::User`]),
    /// for answering a request [`Queue::request`] could not parse.
    pub fn commit_id(&self, ent: usize) -> u64 {
        let e = &self.ents[ent];
        assert_eq!(e.state, EntState::User, "entry {ent} holds no request");
        let h = e.header.bytes();
        wu::EntInOut::parse(&h[wu::ENT_IN_OUT_OFFSET..]).map(|io| io.commit_id).unwrap_or(0)
    }

    /// Answer the request in entry `ent` (an error when `errno` > 0, else `body`) and
    /// queue the commit, which also fetches the entry's next request.
    pub fn commit(&mut self, ent: usize, commit_id: u64, errno: i32, body: &[u8]) -> io::Result<()> {
        let e = &mut self.ents[ent];
        assert_eq!(e.state, EntState::User, "entry {ent} holds no request");
        let (errno, body) = if errno == 0 && body.len() > e.payload.len { (libc::EIO, &[][..]) } else { (errno, body) };
        let body = if errno != 0 { &[][..] } else { body };
        e.payload.bytes_mut()[..body.len()].copy_from_slice(body);
        self.commit_in_place(ent, commit_id, errno, body.len())
    }

    /// The payload buffer of entry `ent`, which holds a request (page-aligned): a reply
    /// written here is committed with [`Queue::commit_in_place`], without a copy.
    pub fn payload_mut(&mut self, ent: usize) -> &mut [u8] {
        let e = &mut self.ents[ent];
        assert_eq!(e.state, EntState::User, "entry {ent} holds no request");
        e.payload.bytes_mut()
    }

    /// [`Queue::commit`] of a reply whose body is already the first `len` bytes of the
    /// entry's payload buffer.
    pub fn commit_in_place(&mut self, ent: usize, commit_id: u64, errno: i32, len: usize) -> io::Result<()> {
        let e = &mut self.ents[ent];
        assert_eq!(e.state, EntState::User, "entry {ent} holds no request");
        let (errno, len) =
            if errno != 0 || len > e.payload.len { (if errno != 0 { errno } else { libc::EIO }, 0) } else { (0, len) };
        let mut hdr = Vec::with_capacity(OutHeader::SIZE);
        OutHeader { len: (OutHeader::SIZE + len) as u32, error: -errno, unique: commit_id }.encode(&mut hdr);
        let mut io = Vec::with_capacity(wu::EntInOut::SIZE);
        wu::EntInOut { flags: 0, commit_id, payload_sz: len as u32 }.encode(&mut io);
        let h = e.header.bytes_mut();
        h[wu::IN_OUT_OFFSET..wu::IN_OUT_OFFSET + hdr.len()].copy_from_slice(&hdr);
        h[wu::ENT_IN_OUT_OFFSET..wu::ENT_IN_OUT_OFFSET + io.len()].copy_from_slice(&io);
        let cmd = wu::CmdReq { flags: 0, commit_id, qid: self.qid }.encode();
        let sqe = opcode::UringCmd80::new(types::Fd(self.dev.as_raw_fd()), wu::CMD_COMMIT_AND_FETCH)
            .cmd(cmd)
            .build()
            .user_data(ent as u64);
        self.ents[ent].state = EntState::Kernel;
        self.push(&sqe)
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        for e in self.ents.drain(..) {
            if e.state == EntState::Kernel {
                // The kernel may still complete a command into these buffers after the
                // ring's fd is closed (its teardown is asynchronous): leak them.
                std::mem::forget(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_len_lands_at_offset_24() {
        // The fields `UringCmd80` sets and the one `with_len` adds, at the offsets of
        // `struct io_uring_sqe`.
        let e = opcode::UringCmd80::new(types::Fd(3), 7).addr(Some(0x1000)).build();
        let e = with_len(e, 0x0102_0304);
        // SAFETY: test only; the same layout argument as in `with_len`.
        let b: [u8; 128] = unsafe { std::mem::transmute(e) };
        assert_eq!(b[0], io_uring::opcode::UringCmd80::CODE);
        assert_eq!(&b[4..8], &3i32.to_ne_bytes()); // fd
        assert_eq!(&b[8..12], &7u32.to_ne_bytes()); // cmd_op
        assert_eq!(&b[16..24], &0x1000u64.to_ne_bytes()); // addr
        assert_eq!(&b[24..28], &0x0102_0304u32.to_ne_bytes()); // len
    }
}
