//! FUSE over io_uring: the buffers and commands of `fs/fuse/dev_uring.c` (7.42).

use super::{need, put_u16, put_u32, put_u64, u32_at, u64_at, Result};

/// `FUSE_IO_URING_CMD_REGISTER`: hand the kernel one entry's buffers; its completion
/// carries the entry's first request.
pub const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: the reply is in the entry's buffers; its
/// completion carries the entry's next request.
pub const CMD_COMMIT_AND_FETCH: u32 = 2;

/// Size of `struct fuse_uring_req_header`, the first of an entry's two buffers.
pub const HEADER_SIZE: usize = 288;
/// Offset of `in_out`: the `fuse_in_header` of a request, the `fuse_out_header` of a
/// reply (128 bytes reserved).
pub const IN_OUT_OFFSET: usize = 0;
/// Offset of `op_in`: the opcode's fixed argument (128 bytes reserved).
pub const OP_IN_OFFSET: usize = 128;
/// Size reserved for `op_in`.
pub const OP_IN_SIZE: usize = 128;
/// Offset of `struct fuse_uring_ent_in_out`.
pub const ENT_IN_OUT_OFFSET: usize = 256;

/// The payload buffer must hold this much: the kernel's `max_payload_sz` is the
/// largest of 8 KiB, `max_write` and `max_pages` pages; REGISTER fails with EINVAL
/// for a smaller one.
pub fn payload_size(max_write: u32, max_pages: u16, page_size: usize) -> usize {
    let pages = if max_pages == 0 { 32 } else { max_pages as usize };
    super::MIN_READ_BUFFER.max(max_write as usize).max(pages * page_size)
}

/// `struct fuse_uring_ent_in_out` (32 bytes at [`ENT_IN_OUT_OFFSET`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EntInOut {
    /// Flags (none defined yet).
    pub flags: u64,
    /// The request's id, to echo in the commit (equals the in-header's `unique`).
    pub commit_id: u64,
    /// Bytes of the payload buffer in use, in either direction.
    pub payload_sz: u32,
}

impl EntInOut {
    /// Size on the wire.
    pub const SIZE: usize = 32;

    /// Parse the 32 bytes.
    pub fn parse(b: &[u8]) -> Result<EntInOut> {
        need("fuse_uring_ent_in_out", b, Self::SIZE)?;
        Ok(EntInOut { flags: u64_at(b, 0), commit_id: u64_at(b, 8), payload_sz: u32_at(b, 16) })
    }

    /// Append the 32 bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.flags);
        put_u64(out, self.commit_id);
        put_u32(out, self.payload_sz);
        put_u32(out, 0);
        put_u64(out, 0);
    }
}

/// `struct fuse_uring_cmd_req`, in the 80-byte command area of a 128-byte SQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmdReq {
    /// Flags (none defined in 7.42).
    pub flags: u64,
    /// For COMMIT_AND_FETCH: the `commit_id` of the request answered.
    pub commit_id: u64,
    /// The queue: the CPU whose requests it serves.
    pub qid: u16,
}

impl CmdReq {
    /// The whole 80-byte command area (unused bytes zero).
    pub fn encode(&self) -> [u8; 80] {
        let mut v = Vec::with_capacity(80);
        put_u64(&mut v, self.flags);
        put_u64(&mut v, self.commit_id);
        put_u16(&mut v, self.qid);
        v.resize(80, 0);
        v.try_into().expect("80 bytes")
    }
}
