//! Extents (FORMAT.md §7.1, §8.3): the value decoder directly, then its consumers on a
//! real file: the inline extent map of `/small` (two extents) replaced by fuzz bytes,
//! then fsck -n, a read-only walk that reads every file, and a read-write session that
//! writes into every block of it (a bent extent must not read or write a superblock, the
//! log or any other metadata).
//!
//! Input: bytes 0..8 = size, byte 8 = n_extents, bytes 9..73 = the four inline extents
//! (logical u32, len_flags u32, phys u64 each).
#![no_main]

use dxfs::internals::Extent;
use dxfs_fuzz::fuzz_case::{run_steps, Steps};
use dxfs_fuzz::{assert_none, mutate, shared};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() >= 16 {
        let logical = u64::from(u32::from_le_bytes(data[..4].try_into().unwrap()));
        let _ = Extent::decode_value(logical, &data[4..16]);
    }
    let s = shared();
    let ino = s.ino("/small");
    let (b, slot) = (ino / 16, (ino % 16) as usize);
    let mut img = s.bases.quiet.clone();
    let mut fields = [0u8; 73];
    fields[..data.len().min(73)].copy_from_slice(&data[..data.len().min(73)]);
    let base = b as usize * 4096 + 256 * slot;
    img[base + 16..base + 24].copy_from_slice(&fields[..8]);
    img[base + 126] = 0; // inline extents
    img[base + 127] = fields[8];
    img[base + 128..base + 192].copy_from_slice(&fields[9..73]);
    mutate::reseal(&mut img[b as usize * 4096..(b as usize + 1) * 4096], b);
    let steps = Steps { export: false, damaged_writes: true, repair: false };
    let found = run_steps(&img, &s.home, steps, &mut |_| {});
    assert_none(&found, &format_args!("inline extents of /small (inode {ino}): {:02x?}", &fields[..]));
});
