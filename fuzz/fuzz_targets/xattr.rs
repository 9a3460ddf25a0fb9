//! Xattr blocks (FORMAT.md §9) through their smallest public path: one xattr block of the
//! base volume (the head or a continuation of `/xfile`'s 10 KB list, `/frag`'s one-block
//! list, or the block `/s1` and `/s2` share) takes the fuzz bytes after its magic and is
//! resealed; then fsck -n and a read-only walk (listxattr and getxattr of every name).
//!
//! Input: byte 0 picks the block; the rest fills the block from byte 16 (refcount, total,
//! ncont, continuations and entries; owner and bytes for a continuation).
#![no_main]

use dxfs_fuzz::fuzz_case::{run_steps, Steps};
use dxfs_fuzz::{assert_none, get_u64, overwrite, shared};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let s = shared();
    let img0 = &s.bases.quiet;
    let xattr_block = |path: &str| {
        let ino = s.ino(path);
        get_u64(img0, (ino / 16) as usize * 4096 + 256 * (ino % 16) as usize + 112)
    };
    let (what, b) = match pick % 4 {
        0 => ("the head of /xfile's list", xattr_block("/xfile")),
        1 => {
            let head = xattr_block("/xfile");
            ("the first continuation of /xfile's list", get_u64(img0, head as usize * 4096 + 32))
        }
        2 => ("/frag's xattr block", xattr_block("/frag")),
        _ => ("the xattr block /s1 and /s2 share", xattr_block("/s1")),
    };
    assert!(b != 0, "{what}: the base volume has no such block");
    let mut img = img0.clone();
    overwrite(&mut img, b, 16, rest);
    let found = run_steps(&img, &s.home, Steps::READ_ONLY, &mut |_| {});
    assert_none(&found, &format_args!("{what} (block {b}) from byte 16: {:02x?}", rest));
});
