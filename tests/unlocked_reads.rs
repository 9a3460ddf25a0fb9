//! Metadata reads on the request path with no lock held (issue 14): an operation that
//! misses the cache lets go of its locks, the blocks are read, and it starts again.
//! On a cold cache the read-only operations read nothing under their locks, give what a
//! warm cache gives, and stay right while other threads change the volume, commit and
//! drop the cache under them.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use dxfs::{Error, ReadStats, Volume, XattrMode};

const DIRS: usize = 3;
const FILES: usize = 400;

fn content(d: usize, i: usize) -> Vec<u8> {
    (0..(200 + (i * 613) % 9_000)).map(|k| (k as u8).wrapping_add((d * 31 + i) as u8)).collect()
}

/// Directories d0.. of files f0.. with contents and, on every third, an xattr.
fn populate(vol: &Volume) -> Vec<u64> {
    let root = vol.root();
    (0..DIRS)
        .map(|d| {
            let dir = vol.mkdir(root, format!("d{d}").as_bytes(), 0o755, 0, 0).unwrap().ino;
            for i in 0..FILES {
                let f = vol.create(dir, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                vol.write(f, 0, &content(d, i)).unwrap();
                if i % 3 == 0 {
                    vol.setxattr(f, b"user.n", i.to_string().as_bytes(), XattrMode::Any).unwrap();
                }
            }
            dir
        })
        .collect()
}

/// Everything a reader sees of directory `d` through lookups, getattr, readdirplus,
/// getxattr and reads, checked against what `populate` wrote.
fn read_all(vol: &Volume, dirs: &[u64]) -> BTreeMap<String, (u64, u64, Option<Vec<u8>>)> {
    let mut seen = BTreeMap::new();
    for (d, &dir) in dirs.iter().enumerate() {
        let mut pos = 0;
        let mut listed = 0;
        loop {
            let batch = vol.readdir_plus(dir, pos, 64).unwrap();
            let Some(last) = batch.last() else { break };
            pos = last.0.next;
            for (e, a) in batch.iter().filter(|(e, _)| e.name != b"." && e.name != b"..") {
                let a = a.as_ref().expect("attributes");
                assert_eq!(a.ino, e.ino);
                listed += 1;
            }
        }
        assert_eq!(listed, FILES, "listing of d{d}");
        for i in 0..FILES {
            let a = vol.lookup(dir, format!("f{i}").as_bytes()).unwrap();
            assert_eq!(vol.getattr(a.ino).unwrap().size, a.size);
            let data = vol.read(a.ino, 0, 1 << 20).unwrap();
            assert_eq!(data, content(d, i), "contents of d{d}/f{i}");
            let x = match vol.getxattr(a.ino, b"user.n") {
                Ok(v) => Some(v),
                Err(Error::NoData) => None,
                Err(e) => panic!("getxattr d{d}/f{i}: {e}"),
            };
            assert_eq!(x.is_some(), i % 3 == 0);
            seen.insert(format!("d{d}/f{i}"), (a.ino, a.size, x));
        }
    }
    seen
}

fn delta(a: ReadStats, b: ReadStats) -> ReadStats {
    ReadStats {
        under_locks: b.under_locks - a.under_locks,
        put_off_rounds: b.put_off_rounds - a.put_off_rounds,
        put_off_blocks: b.put_off_blocks - a.put_off_blocks,
    }
}

#[test]
fn cold_reads_read_nothing_under_their_locks() {
    let (dev, vol) = mem_volume(65_536);
    let dirs = populate(&vol);
    let warm = read_all(&vol, &dirs);
    vol.drop_caches().unwrap();
    let before = vol.read_stats();
    let cold = read_all(&vol, &dirs);
    let d = delta(before, vol.read_stats());
    assert_eq!(cold, warm, "a cold cache reads what a warm one does");
    assert_eq!(d.under_locks, 0, "blocks read under an operation's locks: {d:?}");
    assert!(d.put_off_rounds > 0 && d.put_off_blocks > 0, "nothing was read with the locks let go: {d:?}");
    close_and_check(dev, vol);
}

#[test]
fn cold_unlinks_and_creates_read_with_their_locks_let_go() {
    let (dev, vol) = mem_volume(65_536);
    let dirs = populate(&vol);
    vol.drop_caches().unwrap();
    let before = vol.read_stats();
    // No lookup first (the kernel's would warm the cache): unlink and create straight
    // into cold directories.
    for &dir in &dirs {
        for i in (0..FILES).step_by(2) {
            vol.unlink(dir, format!("f{i}").as_bytes()).unwrap();
        }
        for i in 0..50 {
            vol.create(dir, format!("new{i}").as_bytes(), 0o644, 0, 0).unwrap();
        }
    }
    let d = delta(before, vol.read_stats());
    eprintln!("cold unlinks and creates: {d:?}");
    assert!(d.put_off_blocks > 0, "nothing was read with the locks let go: {d:?}");
    // The unlinks read the leaf neighbours their removal may rebalance with before they
    // change anything (`dir::read_for_remove`); a rebalance that reaches further, which
    // depends on the volume's hash seed, still reads under its locks (0 or 3 blocks in
    // 10 runs, against about 140 read with the locks let go).
    assert!(d.under_locks * 10 <= d.put_off_blocks, "blocks read under an operation's locks: {d:?}");
    for &dir in &dirs {
        for i in 0..FILES {
            let r = vol.lookup(dir, format!("f{i}").as_bytes());
            assert_eq!(r.is_ok(), i % 2 == 1, "f{i}");
        }
    }
    close_and_check(dev, vol);
}

#[test]
fn readers_stay_right_beside_writers_commits_and_cache_drops() {
    let (dev, vol) = mem_volume(65_536);
    let dirs = populate(&vol);
    let warm = read_all(&vol, &dirs);
    let vol = Arc::new(vol);
    let stop = Arc::new(AtomicBool::new(false));
    let root = vol.root();
    let scratch = vol.mkdir(root, b"scratch", 0o755, 0, 0).unwrap().ino;
    // A writer that checks its own view as it goes.
    let writer = {
        let (vol, stop) = (vol.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{n}");
                let f = vol.create(scratch, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
                vol.write(f, 0, name.as_bytes()).unwrap();
                assert_eq!(vol.lookup(scratch, name.as_bytes()).unwrap().ino, f);
                if n >= 8 {
                    let old = format!("w{}", n - 8);
                    vol.unlink(scratch, old.as_bytes()).unwrap();
                    assert!(matches!(vol.lookup(scratch, old.as_bytes()), Err(Error::NotFound)));
                }
                if n % 16 == 0 {
                    vol.sync().unwrap();
                }
                n += 1;
            }
            n
        })
    };
    let dropper = {
        let (vol, stop) = (vol.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                vol.drop_caches().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (vol, dirs) = (vol.clone(), dirs.clone());
            std::thread::spawn(move || {
                let mut rounds = Vec::new();
                for _ in 0..3 {
                    rounds.push(read_all(&vol, &dirs));
                    let listed = vol.readdir_plus(scratch, 0, 1000).unwrap().len() - 2;
                    assert!(listed <= 9, "the writer keeps at most 9 files: {listed}");
                }
                rounds
            })
        })
        .collect();
    for r in readers {
        for seen in r.join().unwrap() {
            assert_eq!(seen, warm);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let created = writer.join().unwrap();
    dropper.join().unwrap();
    let s = vol.read_stats();
    eprintln!("writer created {created}; reads: {s:?}");
    assert!(s.put_off_rounds > 0);
    let vol = Arc::try_unwrap(vol).ok().expect("last reference");
    close_and_check(dev, vol);
}
