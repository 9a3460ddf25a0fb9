//! Little-endian field access and the common header every metadata block carries.
//!
//! Every metadata block starts with 16 bytes: `magic: u32`, `crc: u32` (crc32c of the
//! whole block with this field read as zero), `blockno: u64` (the block's own address,
//! which catches misdirected writes). [`seal`] fills crc and blockno just before a block
//! goes to the device; [`verify`] checks them when it comes back.

use crate::error::{Error, Result};

/// Size of a block in bytes.
pub const BLOCK_SIZE: usize = 4096;

/// One block of bytes.
pub type Block = [u8; BLOCK_SIZE];

#[inline]
pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
#[inline]
pub fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
#[inline]
pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}
#[inline]
pub(crate) fn get_i64(b: &[u8], off: usize) -> i64 {
    i64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}
#[inline]
pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
#[inline]
pub(crate) fn put_i64(b: &mut [u8], off: usize, v: i64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// crc32c of `block` with bytes 4..8 (the crc field) taken as zero.
pub(crate) fn block_crc(block: &Block) -> u32 {
    let c = crc32c::crc32c(&block[..4]);
    let c = crc32c::crc32c_append(c, &[0u8; 4]);
    crc32c::crc32c_append(c, &block[8..])
}

/// Write the block's own address and checksum into its header.
pub fn seal(block: &mut Block, blockno: u64) {
    put_u64(block, 8, blockno);
    let crc = block_crc(block);
    put_u32(block, 4, crc);
}

/// The magic number of a metadata block.
pub(crate) fn magic(block: &Block) -> u32 {
    get_u32(block, 0)
}

/// Check a metadata block's checksum, address and (when `want` is given) magic.
pub(crate) fn verify(block: &Block, blockno: u64, want: Option<u32>) -> Result<()> {
    let crc = get_u32(block, 4);
    if crc != block_crc(block) {
        return Err(Error::corrupt(format!("checksum mismatch in block {blockno}")));
    }
    if get_u64(block, 8) != blockno {
        return Err(Error::corrupt(format!("block {blockno} claims to be block {}", get_u64(block, 8))));
    }
    if let Some(m) = want {
        if magic(block) != m {
            return Err(Error::corrupt(format!("block {blockno}: magic {:#010x}, expected {m:#010x}", magic(block))));
        }
    }
    Ok(())
}

/// Whether `data`, read as file data from block `blockno`, is a metadata block sealed
/// at that very address: a wild extent over metadata, or a block a repair left mapped
/// with stale metadata in it. A partial write must not merge it and write it back in
/// place. (All magics begin `DX`: one compare per block, a checksum only on a match.)
pub(crate) fn sealed_metadata(data: &[u8], blockno: u64) -> bool {
    data.len() == BLOCK_SIZE
        && data.starts_with(b"DX")
        && <&Block>::try_from(data).is_ok_and(|b| verify(b, blockno, None).is_ok())
}

/// The first block of `data` (whole blocks read from block `first` on) that
/// [`sealed_metadata`] finds, as an error naming it.
pub(crate) fn refuse_sealed_metadata(data: &[u8], first: u64) -> Result<()> {
    for (k, blk) in data.chunks(BLOCK_SIZE).enumerate() {
        let b = first + k as u64;
        if sealed_metadata(blk, b) {
            return Err(Error::corrupt(format!(
                "block {b}, mapped as file data, holds a metadata block (a wild extent): not used"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_then_verify_and_detect_flip() {
        let mut b = [0u8; BLOCK_SIZE];
        put_u32(&mut b, 0, 0x1234_5678);
        b[100] = 7;
        seal(&mut b, 42);
        verify(&b, 42, Some(0x1234_5678)).unwrap();
        assert!(verify(&b, 43, None).is_err(), "wrong address must fail");
        assert!(verify(&b, 42, Some(1)).is_err(), "wrong magic must fail");
        for bit in [0usize, 37, 8 * 100 + 3, 8 * 4095 + 7] {
            let mut c = b;
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(verify(&c, 42, None).is_err(), "flip of bit {bit} undetected");
        }
    }

    /// Only a block sealed at the address it was read from counts as metadata read as
    /// file data: the same bytes elsewhere, a flipped bit or a foreign magic do not.
    #[test]
    fn sealed_metadata_is_told_from_data() {
        let mut b = [0u8; BLOCK_SIZE];
        b[..4].copy_from_slice(b"DXIN");
        seal(&mut b, 42);
        assert!(sealed_metadata(&b, 42));
        assert!(!sealed_metadata(&b, 43));
        let mut run = vec![7u8; 2 * BLOCK_SIZE];
        run.extend_from_slice(&b);
        assert!(refuse_sealed_metadata(&run, 40).is_err());
        assert!(refuse_sealed_metadata(&run, 41).is_ok());
        let mut c = b;
        c[100] ^= 1;
        assert!(!sealed_metadata(&c, 42));
        let mut d = b;
        d[..4].copy_from_slice(b"ABCD");
        seal(&mut d, 42);
        assert!(!sealed_metadata(&d, 42));
    }
}
