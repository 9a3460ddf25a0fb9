//! Out of space (seed 003): the front end detects it, the volume fills to its reserve,
//! deletions work on a full volume, statfs tells the truth, and no commit ever fails.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::*;
use dxfs::block::{CrashMode, FaultDevice, MemDevice};
use dxfs::{Error, MkfsOptions, OpenOptions, Volume};
use dxfs::{RenameFlags, SetAttr, XattrMode};
use rand::{Rng, SeedableRng};

/// dd of 1 MiB blocks into a 320 MiB volume (the seed's test): ≥ 95% of the image
/// holds file data at the first ENOSPC, and statfs promised what could be written.
#[test]
fn fills_to_the_reserve_and_statfs_is_truthful() {
    let (dev, vol) = mem_volume(81_920);
    let root = vol.root();
    let before = vol.statfs();
    let f = vol.create(root, b"dd", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![0xA5u8; 1 << 20];
    let (mut off, err) = write_until_error(&vol, f, 0, &chunk);
    assert!(matches!(err, Error::NoSpace), "{err}");
    // Then page by page up to the last block.
    let page = vec![0x5Au8; 4096];
    while vol.write(f, off, &page).is_ok() {
        off += 4096;
    }
    vol.sync().unwrap();
    let image = 81_920u64 * 4096;
    assert!(off * 100 >= image * 95, "only {} of {} MiB written", off >> 20, image >> 20);
    // statfs before promised at most what could be written, and not much more was written.
    let promised = before.bavail * 4096;
    assert!(off <= promised + 64 * 4096, "wrote {off}, statfs promised {promised}");
    assert!(off + 64 * 4096 >= promised, "statfs promised {promised} but only {off} fit");
    let after = vol.statfs();
    assert!(after.bavail < 64, "statfs still says {} blocks available", after.bavail);
    drop(chunk);
    vol.close().unwrap();
    assert_clean(dev.clone());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    assert_eq!(vol.read(f, off - 4096, 4096).unwrap(), page);
    close_and_check(dev, vol);
}

/// Every deletion works on a full volume, and freed space is usable again.
#[test]
fn deletions_work_when_full() {
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let mut n = 0;
    // Fill with small files (directory growth, inode regions) and one big file.
    let big = vol.create(root, b"big", 0o644, 0, 0).unwrap().ino;
    let mut off = 0;
    while vol.write(big, off, &[1u8; 65536]).is_ok() {
        off += 65536;
        if off > 20 << 20 {
            break;
        }
    }
    loop {
        match vol.create(d, format!("f{n}").as_bytes(), 0o644, 0, 0) {
            Ok(a) => {
                if vol.write(a.ino, 0, &[2u8; 8192]).is_err() {
                    break;
                }
                n += 1;
            }
            Err(Error::NoSpace) => break,
            Err(e) => panic!("{e}"),
        }
    }
    vol.sync().unwrap();
    assert!(vol.statfs().bavail < 16);
    let open = vol.create(d, b"kept-open", 0o644, 0, 0);
    let open = match open {
        Ok(a) => Some(a.ino),
        Err(_) => vol.lookup(d, b"f0").ok().map(|a| a.ino),
    };
    // truncate, rename over, unlink of an open file, unlink, rmdir: all on a full volume.
    vol.setattr(big, &SetAttr { size: Some(4096 * 3 + 100), ..Default::default() }).unwrap();
    vol.rename(d, b"f1", d, b"f2", RenameFlags::default()).unwrap();
    if let Some(o) = open {
        vol.open_file(o).unwrap();
        let name = if vol.lookup(d, b"kept-open").is_ok() { b"kept-open".to_vec() } else { b"f0".to_vec() };
        vol.unlink(d, &name).unwrap();
        vol.release(o).unwrap();
    }
    assert!(n > 100, "only {n} small files fit");
    for e in vol.readdir(d, 0, usize::MAX).unwrap() {
        if e.name != b"." && e.name != b".." {
            vol.unlink(d, &e.name).unwrap();
        }
    }
    vol.rmdir(root, b"d").unwrap();
    vol.sync().unwrap();
    let g = vol.create(root, b"after", 0o644, 0, 0).unwrap().ino;
    vol.write(g, 0, &[3u8; 1 << 20]).unwrap();
    close_and_check(dev, vol);
}

/// Many threads hammer a nearly full volume. No operation may fail with anything but
/// ENOSPC (a failed commit would turn every later call into EIO), every acknowledged
/// write is there after a reopen, and every crash image at a flush point is clean.
#[test]
fn hammering_a_nearly_full_volume() {
    let base = Arc::new(MemDevice::new(6144));
    dxfs::mkfs(base.clone(), &MkfsOptions::default()).unwrap();
    let dev = Arc::new(FaultDevice::new(base.to_bytes()));
    let vol = Arc::new(Volume::open(dev.clone(), OpenOptions::default()).unwrap());
    let root = vol.root();
    // The threads' directories first: ENOSPC is a legal answer to a mkdir, but these
    // must exist for the test to run whatever the other threads have filled meanwhile.
    let dirs: Vec<u64> =
        (0..4u64).map(|t| vol.mkdir(root, format!("t{t}").as_bytes(), 0o755, 0, 0).unwrap().ino).collect();
    // Pre-fill to about 85%.
    let filler = vol.create(root, b"filler", 0o644, 0, 0).unwrap().ino;
    let fill = vol.statfs().bavail * 4096 * 85 / 100;
    vol.write(filler, 0, &vec![9u8; fill as usize]).unwrap();
    vol.sync().unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let vol = vol.clone();
            let d = dirs[t as usize];
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                // Model: what each file must contain, from acknowledged operations only.
                let mut model: HashMap<String, (u64, Vec<u8>)> = HashMap::new();
                let mut enospc = 0;
                for step in 0..400 {
                    let name = format!("f{}", rng.gen_range(0..40));
                    let r: dxfs::Result<()> = match rng.gen_range(0..10) {
                        0..=3 => {
                            let ino = match model.get(&name) {
                                Some((ino, _)) => Ok(*ino),
                                None => vol.create(d, name.as_bytes(), 0o644, 0, 0).map(|a| {
                                    model.insert(name.clone(), (a.ino, Vec::new()));
                                    a.ino
                                }),
                            };
                            ino.and_then(|ino| {
                                let off = if rng.gen_bool(0.3) { rng.gen_range(0..200_000) } else { 0 };
                                let len = if rng.gen_bool(0.2) {
                                    rng.gen_range(50_000..300_000)
                                } else {
                                    rng.gen_range(1..5000)
                                };
                                let data = vec![(step % 251) as u8; len];
                                vol.write(ino, off, &data).map(|_| {
                                    let c = &mut model.get_mut(&name).unwrap().1;
                                    let end = off as usize + len;
                                    if c.len() < end {
                                        c.resize(end, 0);
                                    }
                                    c[off as usize..end].copy_from_slice(&data);
                                })
                            })
                        }
                        4 | 5 => match model.remove(&name) {
                            Some(v) => vol.unlink(d, name.as_bytes()).inspect_err(|_| {
                                model.insert(name.clone(), v);
                            }),
                            None => Ok(()),
                        },
                        6 => match model.get_mut(&name) {
                            Some((ino, c)) => {
                                let size = rng.gen_range(0..100_000);
                                vol.setattr(*ino, &SetAttr { size: Some(size), ..Default::default() })
                                    .map(|_| c.resize(size as usize, 0))
                            }
                            None => Ok(()),
                        },
                        7 => match model.get(&name) {
                            Some((ino, _)) => {
                                vol.setxattr(*ino, b"user.x", &vec![1u8; rng.gen_range(1..3000)], XattrMode::Any)
                            }
                            None => Ok(()),
                        },
                        8 => vol.mkdir(d, format!("sub{step}").as_bytes(), 0o755, 0, 0).map(|_| ()),
                        _ => vol.sync(),
                    };
                    match r {
                        Ok(()) => {}
                        Err(Error::NoSpace) => enospc += 1,
                        Err(e) => panic!("thread {t} step {step}: {e}"),
                    }
                }
                (d, model, enospc)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let total_enospc: i32 = results.iter().map(|r| r.2).sum();
    assert!(total_enospc > 0, "the test did not reach full");
    vol.sync().unwrap();
    let vol = Arc::into_inner(vol).unwrap();
    vol.close().unwrap();
    // Every acknowledged byte is there after a clean reopen.
    let img = dev.crash_image(dev.events(), CrashMode::All);
    let check = Arc::new(MemDevice::from_bytes(img));
    assert_clean(check.clone());
    let vol = Volume::open(check.clone(), OpenOptions::default()).unwrap();
    for (_, model, _) in &results {
        for (name, (ino, want)) in model {
            assert_eq!(&vol.read(*ino, 0, 1 << 20).unwrap(), want, "{name}");
        }
    }
    drop(vol);
    // Crash images at flush points (about 40, evenly spread, and the last): clean and
    // openable. tests/crash.rs covers every write index of smaller workloads.
    let points = dev.flush_points();
    let step = points.len().div_ceil(40).max(1);
    let sampled = points.iter().step_by(step).chain(points.last()).copied();
    for at in sampled {
        for mode in [CrashMode::All, CrashMode::DropUnflushed] {
            let img = Arc::new(MemDevice::from_bytes(dev.crash_image(at, mode)));
            assert_clean(img.clone());
            Volume::open(img.clone(), OpenOptions::default()).unwrap().close().unwrap();
            assert_clean(img);
        }
    }
}

/// `df` right after `rm`, with no commit between (sync never reaches a FUSE daemon):
/// the removed file's blocks count as available at once, and can all be written.
#[test]
fn statfs_counts_what_the_delta_freed() {
    let (dev, vol) = mem_volume(16_384);
    let root = vol.root();
    let f = vol.create(root, b"big", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![0x11u8; 1 << 20];
    let (_, err) = write_until_error(&vol, f, 0, &chunk);
    assert!(matches!(err, Error::NoSpace), "{err}");
    vol.sync().unwrap();
    let full = vol.statfs().bavail;
    let size = vol.getattr(f).unwrap().size;
    vol.unlink(root, b"big").unwrap();
    let after_rm = vol.statfs();
    let freed = size / 4096;
    assert!(
        after_rm.bavail >= full + freed - 8,
        "after rm, statfs says {} available, {full} before, {freed} blocks freed",
        after_rm.bavail
    );
    // What it says is true: that much can be written before the next ENOSPC.
    let g = vol.create(root, b"again", 0o644, 0, 0).unwrap().ino;
    let (written, err) = write_until_error(&vol, g, 0, &vec![0x22u8; 1 << 16]);
    assert!(matches!(err, Error::NoSpace), "{err}");
    assert!(
        written + (64 << 12) >= after_rm.bavail * 4096,
        "statfs said {} blocks, {written} bytes fit",
        after_rm.bavail
    );
    close_and_check(dev, vol);
}

/// Near full, page writes that fit in what statfs reports available never fail with
/// ENOSPC while commits run beside them (another thread committing in a loop, as the
/// kernel's syncfs of a fuseblk mount makes the daemon do).
#[test]
fn writes_that_fit_never_fail_beside_commits_near_full() {
    for round in 0..20 {
        let (dev, vol) = mem_volume(8192);
        let root = vol.root();
        let fill = vol.create(root, b"fill", 0o644, 0, 0).unwrap().ino;
        let chunk = vec![1u8; 1 << 20];
        let _ = write_until_error(&vol, fill, 0, &chunk);
        vol.sync().unwrap();
        // Free 2 MiB, keep the rest full.
        vol.setattr(fill, &SetAttr { size: Some(vol.getattr(fill).unwrap().size - (2 << 20)), ..Default::default() })
            .unwrap();
        vol.sync().unwrap();
        let st = vol.statfs();
        let f = vol.create(root, b"f", 0o644, 0, 0).unwrap().ino;
        let page = vec![2u8; 4096];
        // All that statfs reports but a few blocks for the new file's own extent map
        // (with no commits beside, 5 of 693 go there).
        let budget = st.bavail.saturating_sub(24);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let mut failed = None;
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    vol.sync().unwrap();
                }
            });
            for i in 0..budget {
                match vol.write(f, i * 4096, &page) {
                    Ok(_) => {}
                    Err(Error::NoSpace) => {
                        failed = Some((i, budget, st.bavail));
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        assert!(failed.is_none(), "round {round}: ENOSPC at page {:?} (budget, bavail)", failed);
        close_and_check(dev, vol);
    }
}
