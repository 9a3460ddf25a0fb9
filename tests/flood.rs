//! Hash flooding (issue 4): 2048 names that all collide under the unseeded legacy hash
//! (`tests/data/legacy_flood.txt`, made by `examples/legacy_flood.rs`: Joux
//! multicollisions on dx_hack_hash's full state), inserted under legacy, where they all
//! share one 63-bit key and live on displacement alone, and under seeded half-MD4, where
//! they are as spread out as random names. Correct in both; the cost of the collisions
//! stays within the colliding set.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use common::*;
use dxfs::block::MemDevice;
use dxfs::hash::{ext4_hash, HashVersion};
use dxfs::Error;
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume};
use rand::{Rng, SeedableRng};

/// The colliding names, in file order.
fn flood_names() -> Vec<Vec<u8>> {
    include_str!("data/legacy_flood.txt").lines().map(|l| l.as_bytes().to_vec()).collect()
}

/// The directory key of a name before displacement (as in `dxfs::internals::name_key`).
fn key(hash: HashVersion, seed: [u32; 4], name: &[u8]) -> u64 {
    let (major, minor) = ext4_hash(hash, seed, name);
    ((major as u64 >> 1) << 32) | minor as u64
}

/// A fresh in-memory volume with the given directory hash (and a random seed).
fn volume(hash: HashVersion, blocks: u64) -> (Arc<MemDevice>, Volume) {
    let dev = Arc::new(MemDevice::new(blocks));
    mkfs(dev.clone(), &MkfsOptions { hash, ..MkfsOptions::default() }).expect("mkfs");
    let vol = Volume::open(dev.clone(), OpenOptions::default()).expect("open");
    (dev, vol)
}

/// Names and inode numbers of a whole listing read `batch` entries at a time, without
/// "." and ".."; panics on a name listed twice.
fn list(vol: &Volume, d: u64, batch: usize) -> HashMap<Vec<u8>, u64> {
    let mut out = HashMap::new();
    let mut pos = 0;
    loop {
        let b = vol.readdir(d, pos, batch).unwrap();
        if b.is_empty() {
            return out;
        }
        for e in b {
            pos = e.next;
            if e.name != b"." && e.name != b".." {
                let n = String::from_utf8_lossy(&e.name).into_owned();
                assert!(out.insert(e.name, e.ino).is_none(), "{n} listed twice (batch {batch})");
            }
        }
    }
}

/// Cold-cache blocks read by looking `name` up in `d`.
/// Read requests of a cold lookup: one per index node visited, plus one for each inode
/// block's readahead window (the directory's and the found inode's).
fn cold_lookup_reads(vol: &Volume, d: u64, name: &[u8]) -> u64 {
    vol.drop_caches().unwrap();
    let before = vol.io_stats();
    vol.lookup(d, name).unwrap();
    vol.io_stats().since(before).reads
}

/// The data file cannot rot: at least 1024 distinct valid names, all with one legacy
/// major hash (signed and unsigned chars alike) and so one 63-bit key.
#[test]
fn flood_names_collide_under_legacy() {
    let names = flood_names();
    assert!(names.len() >= 1024, "only {} names", names.len());
    assert_eq!(names.iter().collect::<HashSet<_>>().len(), names.len(), "duplicate names");
    for n in &names {
        assert!(!n.is_empty() && n.len() <= 255);
        assert!(n.iter().all(|&b| (0x21..=0x7e).contains(&b) && b != b'/'), "{n:?}");
    }
    let want = ext4_hash(HashVersion::Legacy, [0; 4], &names[0]);
    assert_eq!(want.1, 0);
    for n in &names {
        assert_eq!(ext4_hash(HashVersion::Legacy, [0; 4], n), want, "{}", String::from_utf8_lossy(n));
        assert_eq!(ext4_hash(HashVersion::LegacyUnsigned, [0; 4], n), want);
        // Legacy ignores the seed.
        assert_eq!(ext4_hash(HashVersion::Legacy, [1, 2, 3, 4], n), want);
    }
    let k = key(HashVersion::Legacy, [0; 4], &names[0]);
    assert!(names.iter().all(|n| key(HashVersion::Legacy, [0; 4], n) == k));
}

/// Create, look up, list (whole and in small batches, resuming from saved positions),
/// survive a remount, unlink half, re-create some into the gaps, remove all: nothing
/// lost or duplicated, the directory ends as small as a fresh one, fsck clean.
fn exercise(hash: HashVersion) {
    let names = flood_names();
    let n = names.len();
    let (dev, vol) = volume(hash, 16_384);
    let root = vol.root();
    let d = vol.mkdir(root, b"flood", 0o755, 0, 0).unwrap().ino;
    let fresh = vol.getattr(d).unwrap();

    let mut ino: HashMap<Vec<u8>, u64> = HashMap::new();
    for name in &names[..n - 1] {
        ino.insert(name.clone(), vol.create(d, name, 0o644, 0, 0).unwrap().ino);
    }
    // Under legacy the missing name has the key of all the others: a miss walks the chain.
    let last = &names[n - 1];
    assert!(matches!(vol.lookup(d, last), Err(Error::NotFound)));
    assert!(matches!(vol.unlink(d, last), Err(Error::NotFound)));
    ino.insert(last.clone(), vol.create(d, last, 0o644, 0, 0).unwrap().ino);
    assert!(matches!(vol.create(d, &names[n / 2], 0o644, 0, 0), Err(Error::Exists)));
    assert!(matches!(vol.create(d, &names[n - 1], 0o644, 0, 0), Err(Error::Exists)));
    assert_eq!(vol.dir_stats(d).unwrap().0, n as u64);
    for name in &names {
        assert_eq!(vol.lookup(d, name).unwrap().ino, ino[name]);
    }
    let mut absent = names[0].clone();
    absent.push(b'x');
    assert!(matches!(vol.lookup(d, &absent), Err(Error::NotFound)));

    assert_eq!(list(&vol, d, 10_000), ino);
    assert_eq!(list(&vol, d, 7), ino);
    // Resume from positions saved in a first scan: the tail is the same every time.
    let full = vol.readdir(d, 0, 10_000).unwrap();
    assert_eq!(full.len(), n + 2);
    for cut in [1, 2, 3, n / 3, n - 1, n + 1] {
        let tail: Vec<Vec<u8>> = vol.readdir(d, full[cut].next, 10_000).unwrap().into_iter().map(|e| e.name).collect();
        let want: Vec<Vec<u8>> = full[cut + 1..].iter().map(|e| e.name.clone()).collect();
        assert_eq!(tail, want, "resume after entry {cut}");
    }

    // Everything survives a remount.
    vol.close().unwrap();
    assert_clean(dev.clone());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    for name in &names {
        assert_eq!(vol.lookup(d, name).unwrap().ino, ino[name]);
    }

    // Unlink every other name (holes all along the displacement chain).
    for name in names.iter().step_by(2) {
        vol.unlink(d, name).unwrap();
        ino.remove(name);
    }
    assert!(matches!(vol.unlink(d, &names[0]), Err(Error::NotFound)));
    for (i, name) in names.iter().enumerate() {
        match vol.lookup(d, name) {
            Ok(a) if i % 2 == 1 => assert_eq!(a.ino, ino[name]),
            Err(Error::NotFound) if i % 2 == 0 => {}
            r => panic!("{}: {:?}", String::from_utf8_lossy(name), r.map(|a| a.ino)),
        }
    }
    assert_eq!(list(&vol, d, 5), ino);
    assert_eq!(vol.dir_stats(d).unwrap().0, (n / 2) as u64);

    // Re-create a quarter of the removed names: they fill the holes.
    for name in names.iter().step_by(8) {
        ino.insert(name.clone(), vol.create(d, name, 0o644, 0, 0).unwrap().ino);
    }
    assert!(matches!(vol.create(d, &names[1], 0o644, 0, 0), Err(Error::Exists)));
    for (name, i) in &ino {
        assert_eq!(vol.lookup(d, name).unwrap().ino, *i);
    }
    assert_eq!(list(&vol, d, 13), ino);
    vol.sync().unwrap();
    assert_clean(dev.clone());

    // Remove the rest, in reverse order.
    for name in names.iter().rev() {
        if ino.remove(name).is_some() {
            vol.unlink(d, name).unwrap();
        }
    }
    assert!(list(&vol, d, 100).is_empty());
    assert_eq!(vol.dir_stats(d).unwrap(), (0, 0));
    assert!(vol.dir_blocks(d).unwrap().is_empty());
    let empty = vol.getattr(d).unwrap();
    assert_eq!((empty.size, empty.blocks), (fresh.size, fresh.blocks));
    // The emptied directory forgot its collision history: fill and empty it again.
    for name in names.iter().take(100) {
        vol.create(d, name, 0o644, 0, 0).unwrap();
    }
    for name in names.iter().take(100) {
        vol.unlink(d, name).unwrap();
    }
    assert_eq!(vol.dir_stats(d).unwrap(), (0, 0));
    vol.rmdir(root, b"flood").unwrap();
    close_and_check(dev, vol);
}

#[test]
fn flood_under_legacy_is_correct() {
    exercise(HashVersion::Legacy);
}

#[test]
fn flood_under_seeded_half_md4_is_correct() {
    exercise(HashVersion::HalfMd4);
}

/// Largest number of names sharing the top 12 bits of the major hash.
fn max_bucket(hash: HashVersion, seed: [u32; 4], names: &[Vec<u8>]) -> usize {
    let mut buckets: HashMap<u32, usize> = HashMap::new();
    for n in names {
        *buckets.entry(ext4_hash(hash, seed, n).0 >> 20).or_default() += 1;
    }
    buckets.into_values().max().unwrap_or(0)
}

/// Under legacy all the names share one key; under the volume's seeded half-MD4 every
/// name has its own 63-bit key and they spread like random names of the same shape.
#[test]
fn flood_distribution_legacy_vs_seeded() {
    let names = flood_names();
    let n = names.len();
    let (_dev, vol) = volume(HashVersion::HalfMd4, 4096);
    let sb = vol.superblock();
    assert_eq!(sb.hash, HashVersion::HalfMd4);
    let seed = sb.hash_seed;
    assert_ne!(seed, [0; 4], "mkfs should pick a random seed");

    let legacy: HashSet<u64> = names.iter().map(|x| key(HashVersion::Legacy, [0; 4], x)).collect();
    assert_eq!(legacy.len(), 1);
    assert_eq!(max_bucket(HashVersion::Legacy, [0; 4], &names), n);

    let seeded: HashSet<u64> = names.iter().map(|x| key(HashVersion::HalfMd4, seed, x)).collect();
    assert_eq!(seeded.len(), n, "63-bit keys collide under seeded half-MD4");
    let majors: HashSet<u32> = names.iter().map(|x| ext4_hash(HashVersion::HalfMd4, seed, x).0).collect();
    assert!(majors.len() >= n - 2, "{} distinct majors of {n}", majors.len());

    // Random names of the same length and alphabet, for comparison. With 2048 names in
    // 4096 buckets the largest bucket is ~4-5; 9 or more happens with p ~ 1e-5.
    let alpha = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+_";
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let random: Vec<Vec<u8>> =
        (0..n).map(|_| (0..names[0].len()).map(|_| alpha[rng.gen_range(0..alpha.len())]).collect()).collect();
    let flood_max = max_bucket(HashVersion::HalfMd4, seed, &names);
    let random_max = max_bucket(HashVersion::HalfMd4, seed, &random);
    assert!(
        flood_max <= random_max + 4 && flood_max <= 10,
        "seeded half-MD4: largest bucket {flood_max} for the flood names, {random_max} for random names"
    );
    // The same names hashed under legacy with any seed stay in one bucket; random names
    // under legacy spread out, which is what the attack defeats.
    assert!(max_bucket(HashVersion::Legacy, [0; 4], &random) <= 10);
}

/// Cold-cache blocks read by lookups: a colliding name under legacy costs the leaves of
/// the colliding set and no more; names outside the set cost depth + 2 as usual, even
/// in the flooded directory; under half-MD4 the flood names cost depth + 2 too.
#[test]
fn flood_lookup_cost_stays_within_the_colliding_set() {
    let names = flood_names();
    let n = names.len();
    let others: Vec<Vec<u8>> = (0..6000).map(|i| format!("ordinary-file-name-{i:05}").into_bytes()).collect();

    for hash in [HashVersion::Legacy, HashVersion::HalfMd4] {
        let (dev, vol) = volume(hash, 32_768);
        let root = vol.root();
        // "only": the colliding set alone; "mixed": the set among 6000 ordinary names.
        let only = vol.mkdir(root, b"only", 0o755, 0, 0).unwrap().ino;
        let mixed = vol.mkdir(root, b"mixed", 0o755, 0, 0).unwrap().ino;
        for name in &names {
            vol.create(only, name, 0o644, 0, 0).unwrap();
        }
        for i in 0..others.len().max(n) {
            if let Some(x) = others.get(i) {
                vol.create(mixed, x, 0o644, 0, 0).unwrap();
            }
            if let Some(x) = names.get(i) {
                vol.create(mixed, x, 0o644, 0, 0).unwrap();
            }
        }
        let only_blocks = vol.dir_blocks(only).unwrap().len() as u64;
        let (_, only_depth) = vol.dir_stats(only).unwrap();
        let (mixed_entries, mixed_depth) = vol.dir_stats(mixed).unwrap();
        assert_eq!(mixed_entries, (others.len() + n) as u64);
        let (only_depth, mixed_depth) = (u64::from(only_depth), u64::from(mixed_depth));

        // Worst colliding names: the last created has the largest displacement.
        let worst_only = (0..n).step_by(97).map(|i| cold_lookup_reads(&vol, only, &names[i])).max().unwrap();
        let last_only = cold_lookup_reads(&vol, only, &names[n - 1]);
        let last_mixed = cold_lookup_reads(&vol, mixed, &names[n - 1]);
        let worst_other = others.iter().step_by(211).map(|x| cold_lookup_reads(&vol, mixed, x)).max().unwrap();
        eprintln!(
            "{hash:?}: only: {only_blocks} blocks, depth {only_depth}, worst lookup {worst_only}, last {last_only}; \
             mixed: depth {mixed_depth}, last flood name {last_mixed}, worst ordinary name {worst_other}"
        );
        match hash {
            HashVersion::Legacy => {
                // Every block of "only" holds the colliding set.
                let bound = 2 * only_blocks + 4;
                assert!(worst_only.max(last_only) < bound, "{worst_only}/{last_only} blocks read, bound {bound}");
                assert!(last_mixed < bound + mixed_depth, "{last_mixed} blocks read in the mixed directory");
            }
            _ => {
                assert!(worst_only.max(last_only) <= only_depth + 2);
                assert!(last_mixed <= mixed_depth + 2);
            }
        }
        // Names outside the colliding set are not slowed down by it.
        assert!(worst_other <= mixed_depth + 2, "{worst_other} blocks for an ordinary name, depth {mixed_depth}");
        close_and_check(dev, vol);
    }
}
