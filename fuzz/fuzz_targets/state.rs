//! The state block (FORMAT.md §4): its decoder directly, then its consumers: the base
//! volume's state block takes the fuzz bytes as its fields (orphan_head,
//! next_generation, commit_seq, inodes, lazy_root, lazy_depth) and is resealed; then
//! fsck -n, a read-only walk, a read-write session (which frees the orphan list it names),
//! a repair, fsck -n again, and a session on the repaired volume.
#![no_main]

use dxfs::internals::State;
use dxfs_fuzz::fuzz_case::{run_steps, Steps};
use dxfs_fuzz::{assert_none, overwrite, shared};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = shared();
    let mut img = s.bases.quiet.clone();
    // Start from the real fields: the fuzz bytes replace a prefix of bytes 16..58.
    let mut fields = img[4096 + 16..4096 + 58].to_vec();
    let n = data.len().min(fields.len());
    fields[..n].copy_from_slice(&data[..n]);
    overwrite(&mut img, 1, 16, &fields);
    let blk: &[u8; 4096] = img[4096..8192].try_into().unwrap();
    let _ = State::decode(blk);
    let steps = Steps { export: false, damaged_writes: true, repair: true };
    let found = run_steps(&img, &s.home, steps, &mut |_| {});
    assert_none(&found, &format_args!("state block fields: {:02x?}", &fields[..]));
});
