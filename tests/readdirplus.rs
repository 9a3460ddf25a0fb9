//! readdirplus (seed 004) and inode placement (seed 002): readdirplus returns exactly what
//! readdir + getattr return, and a cold scan costs fewer read requests with sorted
//! prefetch and with directory inode reservation than without.

mod common;

use std::sync::Arc;

use common::*;
use dxfs::block::{BlockDevice, MemDevice};
use dxfs::{MkfsOptions, OpenOptions, Volume};
use dxfs::{SetAttr, XattrMode};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    #[test]
    fn readdirplus_equals_readdir_and_getattr(kinds in proptest::collection::vec(0u8..5, 0..400), batch in 1usize..300, prefetch in any::<bool>()) {
        let (dev, vol) = mem_volume(16_384);
        let root = vol.root();
        let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
        let mut last_file = None;
        for (i, k) in kinds.iter().enumerate() {
            let name = format!("e{i}-{}", "n".repeat(i % 30));
            match k {
                0 => { last_file = Some(vol.create(d, name.as_bytes(), 0o640, i as u32, 7).unwrap().ino); }
                1 => { vol.mkdir(d, name.as_bytes(), 0o700, 0, 0).unwrap(); }
                2 => { vol.symlink(d, name.as_bytes(), name.as_bytes(), 0, 0).unwrap(); }
                3 => if let Some(f) = last_file { vol.link(f, d, name.as_bytes()).unwrap(); },
                _ => if let Some(f) = last_file {
                    vol.write(f, i as u64 * 1000, b"data").unwrap();
                    vol.setattr(f, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
                    vol.setxattr(f, b"user.k", b"v", XattrMode::Any).unwrap();
                },
            }
        }
        vol.close().unwrap();
        // Without atime updates: listing a directory would otherwise move the atime of
        // "." between the listing and the getattr it is compared with.
        let opts = OpenOptions { sorted_prefetch: prefetch, atime: dxfs::AtimePolicy::Never, ..Default::default() };
        let vol = Volume::open(dev.clone(), opts).unwrap();
        let mut plus = Vec::new();
        let mut pos = 0;
        loop {
            let b = vol.readdir_plus(d, pos, batch).unwrap();
            if b.is_empty() { break; }
            pos = b.last().unwrap().0.next;
            plus.extend(b);
        }
        let plain = vol.readdir(d, 0, usize::MAX).unwrap();
        prop_assert_eq!(plus.len(), plain.len());
        for ((e, a), p) in plus.iter().zip(&plain) {
            prop_assert_eq!(e, p);
            prop_assert_eq!(*a, Some(vol.getattr(p.ino).unwrap()));
        }
        // Asked for the attributes of some inodes only, it lists the same entries and
        // leaves the others' out.
        let wanted = |ino: u64| ino % 3 != 0;
        let some = vol.readdir_plus_where(d, 0, usize::MAX, &wanted).unwrap();
        prop_assert_eq!(some.len(), plain.len());
        for ((e, a), p) in some.iter().zip(&plain) {
            prop_assert_eq!(e, p);
            prop_assert_eq!(*a, wanted(p.ino).then(|| vol.getattr(p.ino).unwrap()));
        }
        drop(vol);
        assert_clean(dev);
    }
}

/// Files created alternately in several directories, then one directory scanned from a
/// cold cache: read requests and blocks with each feature on and off.
fn cold_scan(reserve: bool, prefetch: bool) -> (u64, u64) {
    let dev = Arc::new(MemDevice::new(65_536));
    dxfs::mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions { reserve_regions: reserve, ..Default::default() }).unwrap();
    let root = vol.root();
    let dirs: Vec<u64> =
        (0..4).map(|k| vol.mkdir(root, format!("d{k}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    for i in 0..5000 {
        for d in &dirs {
            vol.create(*d, format!("file-{i}").as_bytes(), 0o644, 0, 0).unwrap();
        }
    }
    vol.close().unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions { sorted_prefetch: prefetch, ..Default::default() }).unwrap();
    let before = dev.stats();
    let mut pos = 0;
    let mut n = 0;
    loop {
        let b = vol.readdir_plus(dirs[1], pos, 200).unwrap();
        if b.is_empty() {
            break;
        }
        n += b.len();
        pos = b.last().unwrap().0.next;
    }
    assert_eq!(n, 5002);
    let d = dev.stats().since(before);
    drop(vol);
    assert_clean(dev);
    (d.reads, d.blocks_read)
}

#[test]
fn reservation_and_sorted_prefetch_cut_cold_reads() {
    let (r_both, b_both) = cold_scan(true, true);
    let (r_nores, b_nores) = cold_scan(false, true);
    let (r_nopf, _) = cold_scan(true, false);
    eprintln!("cold readdirplus of 5000 entries: reserve+prefetch {r_both} requests / {b_both} blocks; no reservation {r_nores} / {b_nores}; no prefetch {r_nopf} requests");
    // With reservation the directory's 5000 inodes fill ~334 blocks of its own; without
    // it the four directories' inodes share blocks, so a scan touches about 4x as many.
    assert!(b_both * 2 < b_nores, "reservation: {b_both} blocks vs {b_nores} without");
    // Sorted, coalesced prefetch turns per-block reads into runs.
    assert!(r_both * 4 < r_nopf, "prefetch: {r_both} requests vs {r_nopf} without");
}
