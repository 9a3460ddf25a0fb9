//! Growing a volume (`dxfs::grow`, `dxfs resize`): small and large growths keep every
//! file, the new space is usable to the last block, shrinking and a volume in use are
//! refused, and a crash at any write of a grow leaves a volume that opens with nothing
//! worse than leaked blocks, which fsck reclaims.

mod common;

use std::sync::Arc;

use common::*;
use dxfs::block::{BlockDevice, CrashMode, FaultDevice, FileDevice, MemDevice};
use dxfs::internals::{INCOMPAT_SPILLED_BITMAP, KNOWN_INCOMPAT, RO_COMPAT_GROW_PENDING};
use dxfs::{grow, mkfs, MkfsOptions, OpenOptions, Superblock, Volume};

/// A volume of `blocks` blocks at the start of a device of `device_blocks`, with a few
/// files written; returns the device and (name, contents) of the files.
fn populated(blocks: u64, device_blocks: u64) -> (Arc<MemDevice>, Vec<(String, Vec<u8>)>) {
    let small = Arc::new(MemDevice::new(blocks));
    mkfs(small.clone(), &MkfsOptions::default()).unwrap();
    let vol = Volume::open(small.clone(), OpenOptions::default()).unwrap();
    let d = vol.mkdir(vol.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let mut files = Vec::new();
    for i in 0..40u32 {
        let name = format!("f{i}");
        let data: Vec<u8> = (0..(i as usize * 997 + 10)).map(|k| (k as u32 ^ i) as u8).collect();
        let f = vol.create(d, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        vol.write(f, 0, &data).unwrap();
        files.push((name, data));
    }
    vol.close().unwrap();
    let mut bytes = small.to_bytes();
    bytes.resize((device_blocks * 4096) as usize, 0);
    (Arc::new(MemDevice::from_bytes(bytes)), files)
}

fn check_files(vol: &Volume, files: &[(String, Vec<u8>)]) {
    let d = vol.lookup(vol.root(), b"d").unwrap().ino;
    for (name, data) in files {
        let f = vol.lookup(d, name.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&vol.read(f.ino, 0, data.len() + 10).unwrap(), data, "{name}");
    }
}

/// Grow from `from` to `to` blocks and check everything the module doc promises.
fn grow_and_check(from: u64, to: u64) {
    let (dev, files) = populated(from, to);
    let before = {
        let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
        let s = vol.statfs();
        vol.close().unwrap();
        s
    };
    let g = grow(dev.clone(), to).unwrap();
    assert_eq!((g.old_blocks, g.new_blocks), (from, to), "{g:?}");
    assert_clean(dev.clone());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let s = vol.statfs();
    assert_eq!(s.blocks, to);
    // Every added block is free but the new bitmap blocks (the backup superblock moved).
    assert_eq!(s.bfree, before.bfree + (to - from) - g.new_bitmap_blocks, "{from} -> {to}: {before:?} then {s:?}");
    check_files(&vol, &files);
    // The new space is usable to the last block: a file fills the volume down to the
    // reserve kept for deletions and commits (FORMAT.md §5).
    let big = vol.create(vol.root(), b"big", 0o644, 0, 0).unwrap().ino;
    let (_, e) = write_until_error(&vol, big, 0, &vec![0x5a; 64 << 10]);
    assert!(matches!(e, dxfs::Error::NoSpace), "{e}");
    vol.sync().unwrap();
    let reserve = (to / 128).clamp(32, 128).min(to / 16);
    let left = vol.statfs().bfree;
    assert!(left <= reserve + 32, "{from} -> {to}: {left} blocks still free after filling (reserve {reserve})");
    check_files(&vol, &files);
    close_and_check(dev, vol);
}

#[test]
fn grow_a_little_within_the_bitmap() {
    grow_and_check(2048, 2049);
    grow_and_check(2048, 3000);
}

#[test]
fn grow_past_the_bitmap_many_times_over() {
    // 8 MiB to 600 MiB: four bitmap blocks in the new space (incompat SPILLED_BITMAP).
    grow_and_check(2048, 153_600);
}

#[test]
fn grow_twice_and_to_a_size_that_would_hit_the_backup() {
    let (dev, files) = populated(2048, 32_512 * 3 + 1);
    let g = grow(dev.clone(), 40_000).unwrap();
    assert_eq!(g.new_bitmap_blocks, 1);
    // 32512·3 + 1 blocks would put bitmap block 3 on the backup superblock: one less.
    let g = grow(dev.clone(), 32_512 * 3 + 1).unwrap();
    assert_eq!((g.new_blocks, g.new_bitmap_blocks), (32_512 * 3, 1), "{g:?}");
    assert_clean(dev.clone());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    check_files(&vol, &files);
    close_and_check(dev, vol);
}

#[test]
fn shrinking_is_refused_and_changes_nothing() {
    let (dev, _) = populated(4096, 4096);
    let image = dev.to_bytes();
    let e = grow(dev.clone(), 3000).unwrap_err();
    assert!(e.to_string().contains("shrinking is not supported"), "{e}");
    assert!(dev.to_bytes() == image, "a refused shrink wrote to the device");
    assert_eq!(grow(dev.clone(), 4096).unwrap().new_blocks, 4096, "same size: nothing to do");
    let e = grow(dev.clone(), 10_000).unwrap_err();
    assert!(e.to_string().contains("device holds"), "{e}");
    assert_clean(dev);
}

/// The free blocks an uncut grow of `base` to `to` leaves.
fn free_after_grow(base: &MemDevice, to: u64) -> u64 {
    let d = Arc::new(MemDevice::from_bytes(base.to_bytes()));
    grow(d.clone(), to).unwrap();
    let vol = Volume::open(d, OpenOptions::default()).unwrap();
    let free = vol.statfs().bfree;
    vol.close().unwrap();
    free
}

/// Cut the write stream of a grow at every point: each image checks clean (a grow cut
/// after its switch to the new size is marked GROW_PENDING, whose old tail is no leak),
/// every file reads back, and running the resize again completes it: the volume is
/// clean with exactly the free space of a grow that was never cut.
#[test]
fn crash_at_every_write_of_a_grow() {
    for to in [3000u64, 70_000] {
        let (base, files) = populated(2048, to);
        let reference = free_after_grow(&base, to);
        let dev = Arc::new(FaultDevice::new(base.to_bytes()));
        grow(dev.clone(), to).unwrap();
        let n = dev.events();
        assert!(n >= 4, "a grow with only {n} writes");
        let mut pending_seen = 0;
        for mode in [CrashMode::All, CrashMode::DropUnflushed, CrashMode::Torn, CrashMode::DropRandomUnflushed(7)] {
            for at in 0..=n {
                let img = Arc::new(MemDevice::from_bytes(dev.crash_image(at, mode)));
                let sb = dxfs::read_superblock(&*img).unwrap();
                let pending = sb.ro_compat & RO_COMPAT_GROW_PENDING != 0;
                pending_seen += pending as u32;
                assert!(
                    [2048, to].contains(&sb.layout.block_count),
                    "{mode:?} at {at}/{n}: {} blocks",
                    sb.layout.block_count
                );
                let r = dxfs::fsck::check(img.clone(), false, &mut |_| {}).unwrap();
                assert!(r.errors.is_empty(), "{mode:?} at {at}/{n} (to {to}, pending {pending}): {:?}", r.errors);
                let vol = Volume::open(img.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
                check_files(&vol, &files);
                drop(vol);
                let g = grow(img.clone(), to).unwrap_or_else(|e| panic!("{mode:?} at {at}/{n}: rerun: {e}"));
                assert_eq!(g.new_blocks, to);
                assert_eq!(g.finished_earlier, pending, "{mode:?} at {at}/{n}: {g:?}");
                let sb = dxfs::read_superblock(&*img).unwrap();
                assert_eq!((sb.ro_compat & RO_COMPAT_GROW_PENDING, sb.grow_from), (0, 0));
                assert_clean(img.clone());
                let vol = Volume::open(img.clone(), OpenOptions::default()).unwrap();
                assert_eq!(vol.statfs().bfree, reference, "{mode:?} at {at}/{n} (to {to}): blocks leaked or lost");
                check_files(&vol, &files);
                close_and_check(img, vol);
            }
        }
        assert!(pending_seen > 0, "no cut fell between the switch and the end of the grow");
    }
}

/// A grow cut short after its switch is finished by the next read-write open (a mount),
/// not only by `dxfs resize`; a read-only open and fsck accept it as it is.
#[test]
fn a_read_write_open_finishes_a_grow_cut_short() {
    let to = 40_000;
    let (base, files) = populated(2048, to);
    let reference = free_after_grow(&base, to);
    let dev = Arc::new(FaultDevice::new(base.to_bytes()));
    grow(dev.clone(), to).unwrap();
    // The first durable state with the new size.
    let img = (0..=dev.events())
        .map(|at| dev.crash_image(at, CrashMode::DropUnflushed))
        .find(|img| dxfs::read_superblock(&MemDevice::from_bytes(img.clone())).unwrap().grow_from != 0)
        .expect("a state with GROW_PENDING");
    let img = Arc::new(MemDevice::from_bytes(img));
    let sb = dxfs::read_superblock(&*img).unwrap();
    assert_eq!((sb.layout.block_count, sb.grow_from), (to, 2048));
    assert_ne!(sb.incompat & INCOMPAT_SPILLED_BITMAP, 0);
    assert_clean(img.clone());
    let ro = Volume::open(img.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
    assert!(ro.statfs().bfree < reference, "the old tail is still marked used");
    check_files(&ro, &files);
    drop(ro);
    let vol = Volume::open(img.clone(), OpenOptions::default()).unwrap();
    assert_eq!(vol.statfs().bfree, reference);
    assert_eq!(vol.superblock().grow_from, 0);
    check_files(&vol, &files);
    close_and_check(img.clone(), vol);
    let sb = dxfs::read_superblock(&*img).unwrap();
    assert_eq!(sb.ro_compat & RO_COMPAT_GROW_PENDING, 0);
}

/// The flag a large grow sets is one this code knows, a small grow sets none, and a
/// volume with an incompat bit this code does not know (as the flag is to older dxfs) is
/// refused.
#[test]
fn spilled_bitmap_flag_is_known_and_unknown_incompat_is_refused() {
    assert_ne!(KNOWN_INCOMPAT & INCOMPAT_SPILLED_BITMAP, 0);
    let (small, _) = populated(2048, 3000);
    grow(small.clone(), 3000).unwrap();
    assert_eq!(
        dxfs::read_superblock(&*small).unwrap().incompat & INCOMPAT_SPILLED_BITMAP,
        0,
        "a grow within the bitmap needs no flag"
    );
    let (dev, files) = populated(2048, 40_000);
    grow(dev.clone(), 40_000).unwrap();
    let sb = dxfs::read_superblock(&*dev).unwrap();
    assert_ne!(sb.incompat & INCOMPAT_SPILLED_BITMAP, 0);
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    check_files(&vol, &files);
    vol.close().unwrap();
    assert_eq!(sb.incompat & !KNOWN_INCOMPAT, 0);
    let unknown = Superblock { incompat: sb.incompat | 1 << 31, ..sb.clone() };
    let n = sb.layout.block_count;
    dev.write(0, &unknown.encode(0)[..]).unwrap();
    dev.write(n - 1, &unknown.encode(n - 1)[..]).unwrap();
    let e = Volume::open(dev.clone(), OpenOptions::default()).err().expect("unknown incompat bit accepted");
    assert!(e.to_string().contains("unknown incompatible features"), "{e}");
    assert!(Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).is_err());
    assert!(grow(dev, 50_000).is_err());
}

/// A device held open read-write (a mount) cannot be opened for a resize: the library's
/// device lock refuses it.
#[test]
fn a_volume_in_use_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("vol.img");
    let dev = Arc::new(FileDevice::create(&img, 8 << 20).unwrap());
    mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let Err(e) = FileDevice::create(&img, 16 << 20) else { panic!("a volume in use opened for a resize") };
    assert!(matches!(e, dxfs::Error::Busy(_)), "{e}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 8 << 20, "the image of a volume in use was extended");
    vol.close().unwrap();
    assert_clean(dev);
}

#[test]
fn resize_command_grows_an_image_file_and_refuses_a_volume_in_use() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("vol.img");
    let p = img.to_str().unwrap();
    assert_eq!(dxfs(&["mkfs", "--size", "16M", p]).0, 0);
    let (code, out, err) = dxfs(&["resize", p, "+48M"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20, "the image was extended");
    let (_, info, _) = dxfs(&["info", "--json", p]);
    let j: serde_json::Value = serde_json::from_str(&info).unwrap();
    assert_eq!(j["block_count"], 16384, "{info}");
    let (code, _, err) = dxfs(&["resize", p, "32M"]);
    assert_eq!(code, 8);
    assert!(err.contains("shrinking is not supported"), "{err}");
    {
        let _held = FileDevice::open(&img, false).unwrap();
        let (code, _, err) = dxfs(&["resize", p, "128M"]);
        assert_eq!(code, 8, "a volume in use was resized");
        assert!(err.contains("in use") || err.contains("locked") || err.contains("busy"), "{err}");
    }
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20, "a refused resize extended the image");
    let (code, out, err) = dxfs(&["fsck", "-n", p]);
    assert_eq!(code, 0, "{out}{err}");
    // A grow refused after the image was extended (here: a feature this dxfs does not
    // know) cuts the image back, so its last block is the backup superblock again.
    {
        let dev = FileDevice::open(&img, false).unwrap();
        let sb = dxfs::read_superblock(&dev).unwrap();
        let odd = Superblock { ro_compat: sb.ro_compat | 0x100, ..sb.clone() };
        let n = sb.layout.block_count;
        dev.write(0, &odd.encode(0)[..]).unwrap();
        dev.write(n - 1, &odd.encode(n - 1)[..]).unwrap();
        dev.flush().unwrap();
    }
    let (code, _, err) = dxfs(&["resize", p, "128M"]);
    assert_eq!(code, 8);
    assert!(err.contains("does not know"), "{err}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20, "a refused grow left the image extended");
}
