//! The log (FORMAT.md §12): commit blocks and log bodies. The base volume left by a crash
//! has a delta to replay; its newest commit block takes fuzz bytes as its fields (seq, n,
//! body_crc, flags) and its first descriptor block takes the rest, the commit block is
//! resealed (and its body crc recomputed, if byte 0 says so). Then recovery directly (every
//! block it would replay must be one a commit may target), fsck -n, a read-only open (which
//! overlays the log), a read-write session (which replays it), a repair, fsck -n again,
//! and a session on the repaired volume.
//!
//! Input: byte 0 = recompute the body crc (bit 0), fuzz the older area instead (bit 1);
//! bytes 1..25 = the commit fields; the rest = descriptor entries.
#![no_main]

use dxfs::block::MemDevice;
use dxfs::internals::Journal;
use dxfs_fuzz::fuzz_case::{run_steps, Steps};
use dxfs_fuzz::{assert_none, get_u64, mutate, shared};
use libfuzzer_sys::fuzz_target;

const BS: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let s = shared();
    let g = s.log.geo;
    let mut img = s.bases.live_log.clone();
    let seq = |img: &[u8], at: u64| get_u64(img, at as usize * BS + 16);
    let (a0, a1) = (g.log_area(0), g.log_area(1));
    let newest = if seq(&img, a0) >= seq(&img, a1) { a0 } else { a1 };
    let at = if flags & 2 == 0 {
        newest
    } else if newest == a0 {
        a1
    } else {
        a0
    };
    let n = rest.len().min(24);
    img[at as usize * BS + 16..at as usize * BS + 16 + n].copy_from_slice(&rest[..n]);
    let desc = &rest[n..];
    let d = desc.len().min(BS);
    img[(at as usize + 1) * BS..(at as usize + 1) * BS + d].copy_from_slice(&desc[..d]);
    if flags & 1 == 1 {
        let count =
            u64::from(u32::from_le_bytes(img[at as usize * BS + 24..at as usize * BS + 28].try_into().unwrap()));
        let blocks = count.div_ceil(512) + count;
        if blocks < g.log_blocks {
            let start = (at as usize + 1) * BS;
            let crc = crc32c::crc32c(&img[start..start + blocks as usize * BS]);
            img[at as usize * BS + 28..at as usize * BS + 32].copy_from_slice(&crc.to_le_bytes());
        }
    }
    mutate::reseal(&mut img[at as usize * BS..(at as usize + 1) * BS], at);

    // Recovery directly: what it would write home.
    let dev = MemDevice::from_bytes(img.clone());
    let layout = dxfs::read_superblock(&dev).expect("the superblock is intact").layout;
    if let Ok((_, replay)) = Journal::recover_from(&dev, layout, false, false) {
        for (t, _) in replay.meta.iter().chain(&replay.data) {
            let t = *t;
            let ok = t != 0
                && !(g.log_area(0)..g.bitmap_start).contains(&t)
                && t < layout.backup_superblock()
                && (layout.mark_block == 0 || t != layout.mark_block);
            assert!(ok, "recovery would write block {t}, which no commit may target");
        }
    }

    let steps = Steps { export: false, damaged_writes: true, repair: true };
    let found = run_steps(&img, &s.log, steps, &mut |_| {});
    assert_none(
        &found,
        &format_args!("commit block {at}: fields {:02x?}, descriptors {:02x?}", &rest[..n], &desc[..d]),
    );
});
