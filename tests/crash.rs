//! Crash tests: run a workload on a device that records every block write, then build
//! the image a power cut could leave at every write index (all writes issued, only the
//! flushed ones, a torn last write, a random subset of unflushed writes) and check that
//! each one opens, checks clean, and holds exactly the state of some committed delta no
//! older than the last completed sync.

mod common;

use std::sync::Arc;

use common::*;
use dxfs::block::{CrashMode, FaultDevice, MemDevice};
use dxfs::{MkfsOptions, OpenOptions, Volume};
use dxfs::{RenameFlags, SetAttr, XattrMode};
use rand::{Rng, SeedableRng};

const BLOCKS: u64 = 1024;

/// The states a crash may recover to, recorded as a workload runs: the state at each sync
/// (with the device's write count when it returned), and the states after each operation
/// between sync k and sync k+1 (`between[k]`: a delta may commit between syncs, when its
/// write-back's worst case no longer fits in the log beside the next operation, or when a
/// change short of quota commits).
struct States {
    snaps: Vec<(usize, Dump)>,
    between: Vec<Vec<Dump>>,
}

impl States {
    /// The state the workload starts from.
    fn new(vol: &Volume, dev: &FaultDevice) -> States {
        States { snaps: vec![(dev.events(), dump(vol))], between: vec![Vec::new()] }
    }

    /// Sync, and record the state it made durable.
    fn sync(&mut self, vol: &Volume, dev: &FaultDevice) {
        vol.sync().unwrap();
        self.snaps.push((dev.events(), dump(vol)));
        self.between.push(Vec::new());
    }

    /// Record the state after an operation.
    fn op_done(&mut self, vol: &Volume) {
        self.between.last_mut().expect("one per sync").push(dump(vol));
    }

    /// After an operation: a sync one time in three, else the state recorded.
    fn step(&mut self, vol: &Volume, dev: &FaultDevice, rng: &mut impl Rng) {
        if rng.gen_range(0..3) == 0 {
            self.sync(vol, dev);
        } else {
            self.op_done(vol);
        }
    }
}

/// What a workload leaves: its states and the flushes ahead of the commit it ran.
struct Run {
    states: States,
    flushes: u64,
}

/// A deterministic workload of small deltas, synced now and then.
fn workload(dev: Arc<FaultDevice>, seed: u64, steps: usize, opts: OpenOptions) -> Run {
    let vol = Volume::open(dev.clone(), opts).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let root = vol.root();
    let mut states = States::new(&vol, &dev);
    let mut files: Vec<u64> = Vec::new();
    let mut dirs: Vec<u64> = vec![root];
    for step in 0..steps {
        let d = dirs[rng.gen_range(0..dirs.len())];
        let name = format!("f{}", rng.gen_range(0..12));
        // Errors (exists, not found, ...) are part of the workload, not failures.
        match rng.gen_range(0..12) {
            0 | 1 => {
                if let Ok(a) = vol.create(d, name.as_bytes(), 0o644, 0, 0) {
                    files.push(a.ino);
                }
            }
            2 => {
                if let Ok(a) = vol.mkdir(d, format!("d{step}").as_bytes(), 0o755, 0, 0) {
                    dirs.push(a.ino);
                }
            }
            3 | 4 if !files.is_empty() => {
                let f = files[rng.gen_range(0..files.len())];
                let off = rng.gen_range(0..40_000u64);
                let len = rng.gen_range(1..12_000usize);
                let _ = vol.write(f, off, &vec![step as u8; len]);
                // Let a flush ahead of the commit (if the options ask for them) run now,
                // between this delta's operations.
                vol.wait_flushed(std::time::Duration::from_secs(5));
            }
            5 if !files.is_empty() => {
                let f = files[rng.gen_range(0..files.len())];
                let _ = vol.setattr(f, &SetAttr { size: Some(rng.gen_range(0..30_000)), ..Default::default() });
            }
            6 => {
                let _ = vol.unlink(d, name.as_bytes());
            }
            7 => {
                let d2 = dirs[rng.gen_range(0..dirs.len())];
                let n2 = format!("f{}", rng.gen_range(0..12));
                let _ = vol.rename(d, name.as_bytes(), d2, n2.as_bytes(), RenameFlags::default());
            }
            8 if !files.is_empty() => {
                let f = files[rng.gen_range(0..files.len())];
                let _ = vol.link(f, d, format!("l{step}").as_bytes());
                let _ = vol.setxattr(f, b"user.k", &vec![1u8; rng.gen_range(0..200)], XattrMode::Any);
            }
            // Preallocation (allocated at once, in steps) and hole punching: extent-map
            // and space changes that no write makes.
            10 if !files.is_empty() => {
                let f = files[rng.gen_range(0..files.len())];
                let off = rng.gen_range(0..40_000u64);
                let len = rng.gen_range(1..64_000u64);
                let _ = vol.fallocate(f, off, len, rng.gen_range(0..2) == 0, false);
            }
            11 if !files.is_empty() => {
                let f = files[rng.gen_range(0..files.len())];
                let off = rng.gen_range(0..40_000u64);
                let _ = vol.fallocate(f, off, rng.gen_range(1..20_000u64), true, true);
            }
            _ => {
                let _ = vol.symlink(d, format!("s{step}").as_bytes(), &vec![b'x'; rng.gen_range(1..100)], 0, 0);
            }
        }
        states.step(&vol, &dev, &mut rng);
    }
    states.sync(&vol, &dev);
    let flushes = vol.flushes();
    drop(vol);
    Run { states, flushes }
}

/// A fresh volume of `BLOCKS` blocks with log areas of `log_blocks`, on a device that
/// records every write from here on.
fn fault_device(log_blocks: u32) -> Arc<FaultDevice> {
    let base = Arc::new(MemDevice::new(BLOCKS));
    dxfs::mkfs(base.clone(), &MkfsOptions { log_blocks: Some(log_blocks), ..Default::default() }).unwrap();
    Arc::new(FaultDevice::new(base.to_bytes()))
}

fn crash_everywhere(seed: u64, steps: usize, modes: &[CrashMode]) {
    crash_everywhere_with(seed, steps, modes, 64, OpenOptions::default());
}

/// Returns the flushes ahead of the commit the workload ran.
fn crash_everywhere_with(seed: u64, steps: usize, modes: &[CrashMode], log_blocks: u32, opts: OpenOptions) -> u64 {
    let dev = fault_device(log_blocks);
    let run = workload(dev.clone(), seed, steps, opts);
    crash_at_every_write(&dev, &run.states.snaps, &run.states.between, modes);
    run.flushes
}

/// Cut the write stream of a finished workload at every point from its first snapshot
/// on: each crash image must recover (fsck clean) to the newest sync before the cut, the
/// one after it, or a state between them after one of the operations (`between`, where
/// given: empty lists for a workload whose deltas commit only at its syncs).
fn crash_at_every_write(dev: &FaultDevice, snaps: &[(usize, Dump)], between: &[Vec<Dump>], modes: &[CrashMode]) {
    let n = dev.events();
    assert!(n > 100, "workload too small to mean anything: {n} writes");
    for &mode in modes {
        for at in snaps[0].0..=n {
            // The newest completed sync at or before this point, and the one after it,
            // are the only acceptable states.
            let k = snaps.iter().rposition(|(w, _)| *w <= at).expect("initial state at 0");
            let got = recover(dev.crash_image(at, mode)).unwrap_or_else(|e| panic!("{mode:?} at write {at}/{n}: {e}"));
            let ok_now = got == snaps[k].1;
            let ok_next = snaps.get(k + 1).is_some_and(|s| got == s.1);
            let ok_between = between.get(k).is_some_and(|b| b.contains(&got));
            if !(ok_now || ok_next || ok_between) && std::env::var_os("DXFS_CRASH_DEBUG").is_some() {
                eprintln!(
                    "got {got:#?}\nsync {:#?}\nnext {:#?}\nbetween {:#?}",
                    snaps[k].1,
                    snaps.get(k + 1).map(|s| &s.1),
                    between.get(k)
                );
            }
            assert!(
                ok_now || ok_next || ok_between,
                "{mode:?} at write {at}/{n}: recovered state is neither sync {k}, nor the next, nor one between"
            );
        }
    }
}

/// `rm -rf` of a directory over several deltas, with lazy inode frees (the default):
/// partly emptied inode blocks stay as they are and the lazy-free tree records the
/// freed slots; a crash anywhere recovers to a sync point, fsck clean.
#[test]
fn crash_during_a_removal_over_many_deltas() {
    let dev = fault_device(64);
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let d = vol.mkdir(vol.root(), b"d", 0o755, 0, 0).unwrap().ino;
    for i in 0..240 {
        vol.create(d, format!("file-{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    vol.sync().unwrap();
    let mut snaps = vec![(dev.events(), dump(&vol))];
    // Readdir order, as rm unlinks in.
    let (mut names, mut pos) = (Vec::new(), 0);
    loop {
        let batch = vol.readdir(d, pos, 64).unwrap();
        let Some(last) = batch.last() else { break };
        pos = last.next;
        names.extend(batch.into_iter().map(|e| e.name).filter(|n| !n.starts_with(b".")));
    }
    for (k, name) in names.iter().enumerate() {
        vol.unlink(d, name).unwrap();
        if k % 20 == 19 {
            vol.sync().unwrap();
            snaps.push((dev.events(), dump(&vol)));
        }
    }
    vol.rmdir(vol.root(), b"d").unwrap();
    vol.sync().unwrap();
    snaps.push((dev.events(), dump(&vol)));
    drop(vol);
    crash_at_every_write(&dev, &snaps, &[], &[CrashMode::All, CrashMode::DropUnflushed]);
}

/// A file's xattr list long enough for a chain of blocks is written over its own chain
/// in place (through the log) as it grows, changes and shrinks: every cut recovers to a
/// sync point, fsck clean, with the list whole.
#[test]
fn crash_at_every_write_of_an_xattr_chain_rewritten_in_place() {
    let dev = fault_device(64);
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let set =
        |i: usize, v: u8| vol.setxattr(f, format!("user.name-{i}").as_bytes(), &[v; 300], XattrMode::Any).unwrap();
    for i in 0..20 {
        set(i, 1);
    }
    vol.sync().unwrap();
    let mut snaps = vec![(dev.events(), dump(&vol))];
    let step = |snaps: &mut Vec<(usize, Dump)>| {
        vol.sync().unwrap();
        snaps.push((dev.events(), dump(&vol)));
    };
    // Grows (continuation blocks added), changes in place, shrinks (blocks freed), and
    // falls back into one block; twice.
    for round in 0..2 {
        for i in 20..45 {
            set(i, 2 + round);
        }
        step(&mut snaps);
        for i in (0..45).step_by(3) {
            set(i, 4 + round);
        }
        step(&mut snaps);
        for i in 10..40 {
            vol.removexattr(f, format!("user.name-{i}").as_bytes()).unwrap();
        }
        step(&mut snaps);
        for i in 0..10 {
            vol.removexattr(f, format!("user.name-{i}").as_bytes()).unwrap();
        }
        step(&mut snaps);
        for i in 0..20 {
            set(i, 6 + round);
        }
        step(&mut snaps);
    }
    drop(vol);
    crash_at_every_write(&dev, &snaps, &[], &[CrashMode::All, CrashMode::DropUnflushed, CrashMode::Torn]);
}

/// Overwrites in place: single pages and short runs of a synced file overwritten again
/// and again, synced now and then. Their new contents travel in the log and reach the
/// file's own blocks only after the commit is durable, so every cut, in every mode,
/// recovers to a sync point (the old contents or the new, never a mix).
#[test]
fn crash_at_every_write_overwriting_in_place() {
    use rand::rngs::StdRng;
    let dev = fault_device(64);
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    vol.write(f, 0, &vec![1u8; 40 * 4096]).unwrap();
    vol.sync().unwrap();
    let mut snaps = vec![(dev.events(), dump(&vol))];
    let mut rng = StdRng::seed_from_u64(11);
    for step in 0..80u64 {
        let page = rng.gen_range(0..38u64);
        let len = if rng.gen_range(0..5) == 0 { rng.gen_range(4096..3 * 4096) } else { rng.gen_range(1..4096) };
        vol.write(f, page * 4096 + rng.gen_range(0..100), &vec![step as u8 + 2; len]).unwrap();
        if rng.gen_range(0..4) == 0 {
            vol.sync().unwrap();
            snaps.push((dev.events(), dump(&vol)));
        }
    }
    vol.sync().unwrap();
    snaps.push((dev.events(), dump(&vol)));
    drop(vol);
    let modes = [
        CrashMode::All,
        CrashMode::DropUnflushed,
        CrashMode::Torn,
        CrashMode::DropRandomUnflushed(5),
        CrashMode::NewestUnflushed(3),
    ];
    crash_at_every_write(&dev, &snaps, &[], &modes);
}

/// Writes, truncates and removals under a directory quota, with the commits a write
/// short of quota makes itself: a crash anywhere recovers to a sync point or a state
/// between (fsck clean), the quota is there, and the subtree holds no more than it.
#[test]
fn crash_at_every_write_under_a_quota() {
    use rand::rngs::StdRng;
    const LIMIT: u64 = 256 << 10;
    let dev = fault_device(64);
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let q = vol.mkdir(vol.root(), b"q", 0o755, 0, 0).unwrap().ino;
    let s = vol.mkdir(q, b"s", 0o755, 0, 0).unwrap().ino;
    vol.set_quota(q, Some(LIMIT)).unwrap();
    let mut states = States::new(&vol, &dev);
    let mut rng = StdRng::seed_from_u64(5);
    let mut refused = 0;
    for step in 0..120u64 {
        let d = if rng.gen_range(0..2) == 0 { q } else { s };
        let name = format!("f{}", rng.gen_range(0..6));
        match rng.gen_range(0..6) {
            0..=2 => {
                let f = match vol.lookup(d, name.as_bytes()) {
                    Ok(a) => Ok(a),
                    Err(_) => {
                        // A state of its own: the write's quota check may commit it.
                        let f = vol.create(d, name.as_bytes(), 0o644, 0, 0);
                        states.op_done(&vol);
                        f
                    }
                };
                if let Ok(a) = f {
                    let len = rng.gen_range(1..48_000usize);
                    match vol.write(a.ino, rng.gen_range(0..60_000u64), &vec![step as u8; len]) {
                        Ok(_) => {}
                        Err(dxfs::Error::QuotaExceeded) => refused += 1,
                        Err(e) => panic!("{e:?}"),
                    }
                }
            }
            3 => {
                if let Ok(a) = vol.lookup(d, name.as_bytes()) {
                    let _ = vol.setattr(a.ino, &SetAttr { size: Some(rng.gen_range(0..20_000)), ..Default::default() });
                }
            }
            _ => {
                let _ = vol.unlink(d, name.as_bytes());
            }
        }
        states.step(&vol, &dev, &mut rng);
    }
    states.sync(&vol, &dev);
    drop(vol);
    assert!(refused > 5, "the workload met the quota only {refused} times");
    let States { snaps, between } = states;
    crash_at_every_write(&dev, &snaps, &between, &[CrashMode::All, CrashMode::DropUnflushed, CrashMode::Torn]);
    for at in snaps[0].0..=dev.events() {
        let img = Arc::new(MemDevice::from_bytes(dev.crash_image(at, CrashMode::All)));
        let vol = Volume::open(img, OpenOptions { read_only: true, ..Default::default() }).unwrap();
        let q = vol.lookup(vol.root(), b"q").unwrap().ino;
        assert_eq!(vol.quota(q).unwrap().map(|q| q.limit), Some(LIMIT), "the quota at write {at}");
        let used = vol.rstat(q).unwrap().unwrap().blocks * 4096 + vol.getattr(q).unwrap().blocks * 512;
        assert!(used <= LIMIT, "{used} bytes under the quota at write {at}");
    }
}

#[test]
fn crash_at_every_write_all_issued() {
    crash_everywhere(1, 80, &[CrashMode::All]);
}

#[test]
fn crash_at_every_write_unflushed_dropped_or_torn() {
    crash_everywhere(2, 80, &[CrashMode::DropUnflushed, CrashMode::Torn]);
}

/// A device that reorders writes between flushes: the newest few writes before the cut
/// arrived, older unflushed ones did not (a one-flush commit's log may be on the device
/// while the previous delta's home writes are not).
#[test]
fn crash_at_every_write_newest_unflushed_kept() {
    crash_everywhere(5, 80, &[CrashMode::NewestUnflushed(2), CrashMode::NewestUnflushed(9)]);
}

#[test]
fn crash_at_every_write_random_unflushed_subsets() {
    crash_everywhere(3, 60, &[CrashMode::DropRandomUnflushed(7), CrashMode::DropRandomUnflushed(8)]);
}

/// Dirty pages written back ahead of the commit (from 2 pages on, by the flusher thread,
/// between the deltas' own writes): they go to free blocks only, so a cut anywhere still
/// recovers to a sync point. (A log of 64 blocks leaves a flush no room: it stops short
/// of the room any operation needs.)
#[test]
fn crash_at_every_write_with_flushes_ahead_of_the_commit() {
    let modes = [CrashMode::All, CrashMode::DropUnflushed, CrashMode::Torn, CrashMode::DropRandomUnflushed(9)];
    let opts = OpenOptions { flush_from: 2, ..OpenOptions::default() };
    let flushes = crash_everywhere_with(4, 80, &modes, 256, opts);
    assert!(flushes > 0, "no flush ahead of the commit ran");
}

/// A device that stops accepting writes half way: the volume reports an error, never
/// panics, refuses further changes, and the image recovers to a synced state.
#[test]
fn device_dies_mid_commit() {
    let dev = fault_device(64);
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let root = vol.root();
    let a = vol.create(root, b"kept", 0o644, 0, 0).unwrap();
    vol.write(a.ino, 0, b"durable").unwrap();
    vol.sync().unwrap();
    let synced = dump(&vol);
    dev.set_cut_after(Some(dev.events() + 3));
    let b = vol.create(root, b"lost", 0o644, 0, 0).unwrap();
    vol.write(b.ino, 0, &[7u8; 50_000]).unwrap();
    assert!(vol.sync().is_err(), "a sync whose writes failed must fail");
    assert!(vol.create(root, b"after", 0o644, 0, 0).is_err(), "a failed volume must refuse changes");
    drop(vol);
    let got = recover(dev.crash_image(dev.events(), CrashMode::All)).unwrap();
    assert_eq!(got, synced);
}

/// A device that dies while the flusher writes pages back ahead of the commit: the
/// volume fails, a read of the file being flushed returns (an error) instead of waiting
/// for data that will never land, and the image recovers to the last sync.
#[test]
fn device_dies_under_a_flush_ahead_of_the_commit() {
    let dev = fault_device(256);
    let vol = Arc::new(Volume::open(dev.clone(), OpenOptions { flush_from: 8, ..OpenOptions::default() }).unwrap());
    let root = vol.root();
    let a = vol.create(root, b"kept", 0o644, 0, 0).unwrap();
    vol.write(a.ino, 0, b"durable").unwrap();
    vol.sync().unwrap();
    let synced = dump(&vol);
    let f = vol.create(root, b"lost", 0o644, 0, 0).unwrap().ino;
    dev.set_cut_after(Some(dev.events()));
    for p in 0..32u64 {
        let _ = vol.write(f, p * 4096, &[7u8; 4096]);
    }
    vol.wait_flushed(std::time::Duration::from_secs(10));
    assert!(vol.flushes() > 0, "no flush ran");
    let v = vol.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || tx.send(v.read(f, 0, 4096).is_err()).unwrap());
    let failed = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("a read of the flushed file hung");
    reader.join().unwrap();
    assert!(failed, "a read from a failed volume's unwritten blocks returned data");
    assert!(vol.sync().is_err(), "a sync of a failed volume must fail");
    drop(Arc::into_inner(vol).expect("one owner"));
    let got = recover(dev.crash_image(dev.events(), CrashMode::All)).unwrap();
    assert_eq!(got, synced);
}

/// Issue 42, item 8: after xfstests generic/551 (AIO O_DIRECT writes of many sizes, many
/// in flight) was killed, its image had one block marked in use that nothing owned.
/// Writers of that shape, as the server calls the volume for them (`try_write` on the
/// receiving thread, `write_with` on a kept one when it would wait): three threads
/// writing aligned and unaligned runs of up to 16 blocks over one another into three
/// files, with fsyncs and truncates, on a 4 MiB volume. Cut at every write,
/// keeping all of them or the flushed ones: each image recovers fsck clean (a leak is an
/// fsck error).
#[test]
fn crash_at_every_write_of_concurrent_direct_writes() {
    let dev = fault_device(64);
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let root = vol.root();
    let files: Vec<u64> =
        (0..3).map(|i| vol.create(root, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
    vol.sync().unwrap();
    let start = dev.events();
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (vol, files) = (&vol, &files);
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(551 + t);
                for step in 0..14 {
                    let f = files[rng.gen_range(0..files.len())];
                    let blocks = rng.gen_range(1..=16u64);
                    let (off, len) = if rng.gen_range(0..3) == 0 {
                        (rng.gen_range(0..64 * 4096), rng.gen_range(1..blocks as usize * 4096))
                    } else {
                        (rng.gen_range(0..64) * 4096, blocks as usize * 4096)
                    };
                    let data = vec![(t * 16 + step) as u8; len];
                    let how = dxfs::WriteAs::default();
                    if let Ok(None) = vol.try_write(f, off, &data, how) {
                        let _ = vol.write_with(f, off, &data, how);
                    }
                    match rng.gen_range(0..6) {
                        0 => drop(vol.fsync(f)),
                        1 => drop(
                            vol.setattr(f, &SetAttr { size: Some(rng.gen_range(0..200_000)), ..Default::default() }),
                        ),
                        _ => {}
                    }
                }
            });
        }
    });
    vol.sync().unwrap();
    drop(vol);
    let n = dev.events();
    assert!(n - start > 100, "too few writes to mean anything: {}", n - start);
    eprintln!("{} writes cut", n - start);
    for mode in [CrashMode::All, CrashMode::DropUnflushed] {
        for at in start..=n {
            if let Err(e) = recover(dev.crash_image(at, mode)) {
                panic!("{mode:?} at {at} of {n}: {e}");
            }
        }
    }
}
