//! The whole image: the mutator of the seeded slice (tests/common/mutate.rs) takes its
//! choices from the fuzz bytes (which base, which blocks, which fields, which hostile
//! values), and the slice's whole pipeline runs on the result (fsck -n, a read-only walk,
//! export, a read-write session, a repair, fsck -n, a walk and a session after it), every
//! block write watched. Damage to the mount mark costs each input 44 s of designed waits:
//! it is left out unless `DXFS_FUZZ_MARK=1`.
#![no_main]

use dxfs_fuzz::fuzz_case::{make_case, run};
use dxfs_fuzz::mutate::ByteChoices;
use dxfs_fuzz::{assert_none, shared};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = shared();
    let mark = std::env::var("DXFS_FUZZ_MARK").is_ok_and(|v| v == "1");
    let mut ch = ByteChoices::new(data);
    let (img, muts, log) = make_case(&s.bases, &mut ch, mark);
    let ctx = if log { &s.log } else { &s.home };
    let found = run(&img, ctx, &mut |_| {});
    let what: Vec<String> = muts.iter().map(|m| m.to_string()).collect();
    assert_none(&found, &what.join(" + "));
});
