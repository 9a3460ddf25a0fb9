//! The superblock (FORMAT.md §3): its decoder directly on a block of fuzz bytes (magic
//! and seal forced, so that the fields are what is fuzzed), then its consumers: the base
//! volume's block 0 (and, if byte 0 says so, the backup too) takes those fields; then
//! fsck -n, a read-only walk, a repair (which must use the backup when block 0 is bad),
//! fsck -n again, and a session on the repaired volume.
//!
//! Input: byte 0 = whether the backup gets the same fields; the rest = bytes 16..176.
#![no_main]

use dxfs::internals::seal;
use dxfs::Superblock;
use dxfs_fuzz::fuzz_case::{run_steps, Steps};
use dxfs_fuzz::{assert_none, overwrite, shared};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&both, rest)) = data.split_first() else { return };
    let mut blk = [0u8; 4096];
    blk[..4].copy_from_slice(b"DXSB");
    let n = rest.len().min(160);
    blk[16..16 + n].copy_from_slice(&rest[..n]);
    seal(&mut blk, 0);
    let _ = Superblock::decode(&blk, 0);

    let s = shared();
    let mut img = s.bases.quiet.clone();
    // Start from the real fields: the fuzz bytes replace a prefix of bytes 16..176.
    let mut fields = img[16..176].to_vec();
    fields[..n].copy_from_slice(&rest[..n]);
    overwrite(&mut img, 0, 16, &fields);
    if both & 1 == 1 {
        overwrite(&mut img, s.home.geo.backup(), 16, &fields);
    }
    let steps = Steps { export: false, damaged_writes: false, repair: true };
    let found = run_steps(&img, &s.home, steps, &mut |_| {});
    assert_none(&found, &format_args!("superblock fields (both copies: {}): {:02x?}", both & 1 == 1, &fields[..]));
});
