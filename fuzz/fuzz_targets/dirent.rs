//! The directory entry decoder (FORMAT.md §8.2), directly: any value gives an entry or
//! an error, never a panic, and an entry's parts are the value's bytes.
#![no_main]

use dxfs::internals::decode_dirent;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((ino, ft, name)) = decode_dirent(data) {
        assert_eq!(ino, u64::from_le_bytes(data[..8].try_into().unwrap()));
        assert_eq!(ft as u8, data[8]);
        assert_eq!(name, &data[9..]);
        assert!(!name.is_empty() && name.len() <= 255, "a name of {} bytes", name.len());
    }
});
