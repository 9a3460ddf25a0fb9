//! What a device already holds, before mkfs overwrites it: the signatures of the common
//! filesystems and containers (offsets as in libblkid), a dxfs volume, or any data.

use super::device::BlockDevice;
use super::format::{Superblock, SUPERBLOCK};
use crate::error::Result;

/// Bytes read from the start of the device (the superblocks below all lie in it, and
/// a data file with anything in its first MiB is not empty).
const PROBED: usize = 1 << 20;

/// (what, byte offset, magic)
const SIGNATURES: &[(&str, usize, &[u8])] = &[
    ("an ext2/ext3/ext4 filesystem", 1080, &[0x53, 0xEF]),
    ("an XFS filesystem", 0, b"XFSB"),
    ("a btrfs filesystem", 65_600, b"_BHRfS_M"),
    ("swap space", 4086, b"SWAPSPACE2"),
    ("swap space", 4086, b"SWAP-SPACE"),
    ("a LUKS container", 0, b"LUKS\xba\xbe"),
    ("an F2FS filesystem", 1024, &[0x10, 0x20, 0xF5, 0xF2]),
    ("a FAT filesystem", 54, b"FAT1"),
    ("a FAT32 filesystem", 82, b"FAT32"),
    ("an ISO 9660 image", 32_769, b"CD001"),
    ("a squashfs image", 0, b"hsqs"),
    ("an erofs image", 1024, &[0xE2, 0xE1, 0xF5, 0xE0]),
];

/// What `dev` holds, if anything: a known filesystem or container, a dxfs volume, or
/// "data" when its first MiB is not all zero. `None` for an empty (all-zero) start.
pub fn probe(dev: &dyn BlockDevice) -> Result<Option<&'static str>> {
    let n = (PROBED as u64 / 4096).min(dev.block_count()) as usize;
    let mut head = vec![0u8; n * 4096];
    dev.read(0, &mut head)?;
    let mut first = [0u8; 4096];
    first.copy_from_slice(&head[..4096]);
    if Superblock::decode(&first, SUPERBLOCK).is_ok() {
        return Ok(Some("a dxfs volume"));
    }
    for (what, at, magic) in SIGNATURES {
        if head.get(*at..at + magic.len()) == Some(magic) {
            return Ok(Some(what));
        }
    }
    Ok(head.iter().any(|&b| b != 0).then_some("data"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::device::MemDevice;

    #[test]
    fn signatures_and_data_are_found() {
        let dev = MemDevice::new(512);
        assert_eq!(probe(&dev).unwrap(), None, "all zero");
        let mut b = [0u8; 4096];
        b[1080] = 0x53;
        b[1081] = 0xEF;
        dev.write(0, &b).unwrap();
        assert_eq!(probe(&dev).unwrap(), Some("an ext2/ext3/ext4 filesystem"));
        let dev = MemDevice::new(512);
        let mut b = [0u8; 4096];
        b[3000] = 1;
        dev.write(200, &b).unwrap();
        assert_eq!(probe(&dev).unwrap(), Some("data"), "a byte in the first MiB");
        let dev = MemDevice::new(512);
        dev.write(300, &b).unwrap();
        assert_eq!(probe(&dev).unwrap(), None, "beyond the first MiB is not looked at");
        let dev = MemDevice::new(8);
        assert_eq!(probe(&dev).unwrap(), None, "a device smaller than the probe");
    }
}
