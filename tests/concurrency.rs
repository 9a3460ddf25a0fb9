//! Many threads at once: writers, creators, deleters and a thread that keeps committing
//! (the commit's I/O runs while the others go on with the next delta). Everything must
//! be there afterwards, fsck clean, and again after a reopen.

mod common;

use std::sync::Arc;

use common::*;
use dxfs::{OpenOptions, Volume};

fn content(t: usize, i: usize) -> Vec<u8> {
    (0..(1000 + (i * 7919) % 30_000)).map(|k| (k as u8).wrapping_mul(t as u8 + 3).wrapping_add(i as u8)).collect()
}

#[test]
fn writers_and_committer_in_parallel() {
    let (dev, vol) = mem_volume(32_768);
    let vol = Arc::new(vol);
    let root = vol.root();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let vol = vol.clone();
            std::thread::spawn(move || {
                let d = vol.mkdir(root, format!("t{t}").as_bytes(), 0o755, 0, 0).unwrap().ino;
                for i in 0..300 {
                    let f = vol.create(d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
                    let c = content(t, i);
                    // Two halves, so pages are dirtied across deltas.
                    vol.write(f, 0, &c[..c.len() / 2]).unwrap();
                    vol.write(f, (c.len() / 2) as u64, &c[c.len() / 2..]).unwrap();
                    if i % 3 == 0 && i > 0 {
                        vol.unlink(d, format!("f{}", i - 1).as_bytes()).unwrap();
                    }
                }
            })
        })
        .collect();
    let syncer = {
        let vol = vol.clone();
        std::thread::spawn(move || {
            for _ in 0..200 {
                vol.sync().unwrap();
                std::thread::yield_now();
            }
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    syncer.join().unwrap();
    let check = |vol: &Volume| {
        for t in 0..4 {
            let d = vol.lookup(root, format!("t{t}").as_bytes()).unwrap().ino;
            for i in 0..300 {
                let gone = i % 3 == 2 && i < 299;
                match vol.lookup(d, format!("f{i}").as_bytes()) {
                    Ok(a) => {
                        assert!(!gone, "t{t}/f{i} should be gone");
                        assert_eq!(vol.read(a.ino, 0, 1 << 20).unwrap(), content(t, i), "t{t}/f{i}");
                    }
                    Err(e) => assert!(gone, "t{t}/f{i}: {e}"),
                }
            }
        }
    };
    check(&vol);
    let vol = Arc::into_inner(vol).unwrap();
    vol.close().unwrap();
    assert_clean(dev.clone());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    check(&vol);
    close_and_check(dev, vol);
}
