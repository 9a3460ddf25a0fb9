//! The NBD wire format (NetworkBlockDevice/nbd `doc/proto.md`): magics, flags, command
//! and reply codes, big-endian fields, the request header.

use std::io::{self, Write};

use super::stream::Stream;

// Handshake magics and values (proto.md, "Handshake phase").
pub(super) const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub(super) const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub(super) const CLISERV_MAGIC: u64 = 0x0000_4202_8186_1253;
pub(super) const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub(super) const FLAG_FIXED_NEWSTYLE: u16 = 1;
pub(super) const FLAG_NO_ZEROES: u16 = 2;
pub(super) const OPT_EXPORT_NAME: u32 = 1;
pub(super) const OPT_ABORT: u32 = 2;
pub(super) const OPT_GO: u32 = 7;
pub(super) const OPT_STRUCTURED_REPLY: u32 = 8;
pub(super) const REP_ACK: u32 = 1;
pub(super) const REP_INFO: u32 = 3;
pub(super) const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub(super) const INFO_EXPORT: u16 = 0;
pub(super) const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub(super) const TFLAG_READ_ONLY: u16 = 1 << 1;
pub(super) const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub(super) const TFLAG_SEND_FUA: u16 = 1 << 3;
pub(super) const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub(super) const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;

// Requests and replies.
const REQUEST_MAGIC: u32 = 0x2560_9513;
pub(super) const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub(super) const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
pub(super) const REPLY_FLAG_DONE: u16 = 1;
pub(super) const REPLY_TYPE_NONE: u16 = 0;
pub(super) const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub(super) const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// Chunk types with this bit set are errors (NBD_REPLY_TYPE_ERROR, _ERROR_OFFSET, ...).
pub(super) const REPLY_TYPE_ERROR_BIT: u16 = 1 << 15;
/// Largest error chunk accepted (a 4-byte error, a message of at most 4096 bytes, ...).
pub(super) const MAX_ERROR_CHUNK: u32 = 64 << 10;
pub(super) const CMD_READ: u16 = 0;
pub(super) const CMD_WRITE: u16 = 1;
pub(super) const CMD_DISC: u16 = 2;
pub(super) const CMD_FLUSH: u16 = 3;
pub(super) const CMD_TRIM: u16 = 4;
/// Command flag: the reply comes once the write is durable.
pub(super) const CMD_FLAG_FUA: u16 = 1;
/// Error reply `NBD_ESHUTDOWN`: the server is shutting down (nbdkit answers it to the
/// requests it had read but not done when `NBD_CMD_DISC` came): sent again on the next
/// connection rather than failed.
pub(super) const ESHUTDOWN: u32 = 108;

pub(super) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
pub(super) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub(super) fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
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

pub(super) fn send_request(
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

#[cfg(test)]
mod tests {
    use super::*;

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
