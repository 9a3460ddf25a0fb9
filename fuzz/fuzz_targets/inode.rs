//! The inode record decoder (FORMAT.md §7), directly: any 256 bytes give an inode, a free
//! slot or an error, never a panic, and an inode that decodes encodes to a slot that
//! decodes to the same inode.
#![no_main]

use dxfs::internals::Inode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut slot = [0u8; 256];
    let n = data.len().min(256);
    slot[..n].copy_from_slice(&data[..n]);
    let ino = 200 * 16 + 3;
    if let Ok(Some(inode)) = Inode::decode(ino, &slot) {
        let mut again = [0u8; 256];
        inode.encode(&mut again);
        let back = Inode::decode(ino, &again).expect("an encoded inode decodes");
        assert_eq!(back, Some(inode), "an inode does not survive encode and decode");
    }
});
