//! The free-space bitmap (FORMAT.md §5) through its consumers: the base volume's bitmap
//! block takes the fuzz bytes from byte 16 on (reserved bytes and the bits) and is
//! resealed; then fsck -n, a read-only walk, a read-write session on it (the allocator
//! hands out what it says is free: never a superblock or fixed block), a repair, fsck -n
//! again, and a session on the repaired volume.
#![no_main]

use dxfs_fuzz::fuzz_case::{run_steps, Steps};
use dxfs_fuzz::{assert_none, overwrite, shared};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = shared();
    let mut img = s.bases.quiet.clone();
    // Start from the real bitmap: the fuzz bytes replace a prefix of it.
    let b = s.home.geo.bitmap_start;
    let mut bits = img[b as usize * 4096 + 16..(b as usize + 1) * 4096].to_vec();
    let n = data.len().min(bits.len());
    bits[..n].copy_from_slice(&data[..n]);
    overwrite(&mut img, b, 16, &bits);
    let steps = Steps { export: false, damaged_writes: true, repair: true };
    let found = run_steps(&img, &s.home, steps, &mut |_| {});
    assert_none(&found, &format_args!("bitmap block {b} from byte 16: {:02x?}", &data[..n]));
});
