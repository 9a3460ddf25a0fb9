//! Hashed directories: readdir positions survive splits and merges, directories shrink
//! back to nothing, and concurrent readers see every stable entry exactly once.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use common::*;
use rand::{Rng, SeedableRng};

/// Read a directory in small batches while entries come and go between the batches:
/// entries present for the whole scan appear exactly once, others at most once.
#[test]
fn readdir_positions_survive_churn() {
    let (dev, vol) = mem_volume(16_384);
    let root = vol.root();
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let stable: Vec<String> = (0..3000).map(|i| format!("stable-{i}")).collect();
    for n in &stable {
        vol.create(d, n.as_bytes(), 0o644, 0, 0).unwrap();
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut churn_live: Vec<String> = Vec::new();
    let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut pos = 0;
    let mut next_churn = 0;
    loop {
        let batch = vol.readdir(d, pos, 17).unwrap();
        if batch.is_empty() {
            break;
        }
        for e in &batch {
            *seen.entry(e.name.clone()).or_default() += 1;
            pos = e.next;
        }
        // Enough churn between batches to split and merge leaves under the reader.
        for _ in 0..40 {
            if rng.gen_bool(0.55) || churn_live.is_empty() {
                let n = format!("churn-{next_churn}-{}", "y".repeat(next_churn % 60));
                next_churn += 1;
                vol.create(d, n.as_bytes(), 0o644, 0, 0).unwrap();
                churn_live.push(n);
            } else {
                let i = rng.gen_range(0..churn_live.len());
                let n = churn_live.swap_remove(i);
                vol.unlink(d, n.as_bytes()).unwrap();
            }
        }
    }
    for n in &stable {
        assert_eq!(seen.get(n.as_bytes()), Some(&1), "{n} not returned exactly once");
    }
    for (n, c) in &seen {
        assert!(*c <= 1, "{} returned {c} times", String::from_utf8_lossy(n));
    }
    assert!(next_churn > 3000, "not enough churn to mean anything");
    close_and_check(dev, vol);
}

/// A directory that grows to three levels and is emptied again owns no index block.
#[test]
fn directories_shrink_to_nothing() {
    let (dev, vol) = mem_volume(65_536);
    let root = vol.root();
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let fresh = vol.getattr(d).unwrap();
    let names: Vec<String> = (0..60_000).map(|i| format!("a-fairly-long-file-name-number-{i:06}")).collect();
    for n in &names {
        vol.create(d, n.as_bytes(), 0o644, 0, 0).unwrap();
    }
    let (entries, depth) = vol.dir_stats(d).unwrap();
    assert_eq!(entries, 60_000);
    assert!(depth >= 3, "depth {depth}: the test wants a 3-level index");
    let peak = vol.getattr(d).unwrap();
    assert!(peak.size > 600 * 4096);
    // Delete all but 1%: the index shrinks with them.
    for n in names.iter().skip(600) {
        vol.unlink(d, n.as_bytes()).unwrap();
    }
    let small = vol.getattr(d).unwrap();
    assert!(small.size * 50 <= peak.size, "size {} after deleting 99% (peak {})", small.size, peak.size);
    for n in names.iter().take(600) {
        vol.unlink(d, n.as_bytes()).unwrap();
    }
    let empty = vol.getattr(d).unwrap();
    assert_eq!((empty.size, empty.blocks), (fresh.size, fresh.blocks));
    assert_eq!(vol.dir_stats(d).unwrap(), (0, 0));
    assert!(vol.dir_blocks(d).unwrap().is_empty());
    vol.rmdir(root, b"d").unwrap();
    close_and_check(dev, vol);
}

/// Readers scan while writers insert and delete in other threads.
#[test]
fn concurrent_readdir_sees_stable_entries_exactly_once() {
    let (dev, vol) = mem_volume(16_384);
    let vol = Arc::new(vol);
    let root = vol.root();
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let stable: HashSet<Vec<u8>> = (0..2000).map(|i| format!("s{i}").into_bytes()).collect();
    for n in &stable {
        vol.create(d, n, 0o644, 0, 0).unwrap();
    }
    let writers: Vec<_> = (0..2)
        .map(|t| {
            let vol = vol.clone();
            std::thread::spawn(move || {
                for i in 0..4000 {
                    let n = format!("w{t}-{i}");
                    vol.create(d, n.as_bytes(), 0o644, 0, 0).unwrap();
                    if i >= 50 {
                        vol.unlink(d, format!("w{t}-{}", i - 50).as_bytes()).unwrap();
                    }
                }
            })
        })
        .collect();
    for _ in 0..20 {
        let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut pos = 0;
        loop {
            let b = vol.readdir(d, pos, 50).unwrap();
            if b.is_empty() {
                break;
            }
            for e in b {
                *seen.entry(e.name).or_default() += 1;
                pos = e.next;
            }
        }
        for n in &stable {
            assert_eq!(seen.get(n), Some(&1));
        }
        assert!(seen.values().all(|c| *c == 1));
    }
    for w in writers {
        w.join().unwrap();
    }
    let vol = Arc::into_inner(vol).unwrap();
    close_and_check(dev, vol);
}

/// Phillips' steady-state experiment (seed 000), scaled down: a fixed population of
/// random names under delete-one/create-one churn. The directory must not grow.
#[test]
fn steady_churn_does_not_grow_the_directory() {
    // A random hash seed per run (mkfs's default): the target holds for every seed, so
    // each run of the suite tries a new one.
    let dev = Arc::new(dxfs::block::MemDevice::new(65_536));
    dxfs::mkfs(dev.clone(), &dxfs::MkfsOptions::default()).unwrap();
    let vol = dxfs::Volume::open(dev.clone(), dxfs::OpenOptions::default()).unwrap();
    let root = vol.root();
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let mut rng = rand::rngs::StdRng::seed_from_u64(77);
    let mut live: Vec<String> = Vec::new();
    let name = |rng: &mut rand::rngs::StdRng| format!("{}", rng.gen_range(0..1_000_000_000u64));
    while live.len() < 20_000 {
        let n = name(&mut rng);
        if vol.create(d, n.as_bytes(), 0o644, 0, 0).is_ok() {
            live.push(n);
        }
    }
    let mut sizes = Vec::new();
    for cycle in 0..=100_000 {
        if cycle % 20_000 == 0 {
            sizes.push(vol.getattr(d).unwrap().size);
        }
        let i = rng.gen_range(0..live.len());
        let old = live.swap_remove(i);
        vol.unlink(d, old.as_bytes()).unwrap();
        loop {
            let n = name(&mut rng);
            if vol.create(d, n.as_bytes(), 0o644, 0, 0).is_ok() {
                live.push(n);
                break;
            }
        }
    }
    let built = sizes[0];
    // Seed 000's target is zero growth, issue 17's at most 1%: shifts along and spreads
    // over up to nine leaves hold the index at its freshly built size (one-sibling
    // shifts and three-leaf spreads: +3-11%; midpoint splits alone: +15-18%).
    for s in &sizes[1..] {
        assert!(s * 100 <= built * 101, "directory grew from {built} to {s} bytes under churn: {sizes:?}");
    }
    close_and_check(dev, vol);
}
