//! Many threads at once: writers, creators, deleters and a thread that keeps committing
//! (the commit's I/O runs while the others go on with the next delta). Everything must
//! be there afterwards, fsck clean, and again after a reopen.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::*;
use dxfs::block::{BlockDevice, MemDevice};
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

/// A commit writes file data back without the volume lock: while it does, the file's
/// extent map already points at blocks not written yet. Readers (and partial-page
/// writers) of that file must wait for the data, never see what the blocks held before.
/// Every page of the file holds one byte value naming (generation, page); a reader that
/// sees any other value read a block before its data landed.
#[test]
fn readers_never_see_data_before_it_lands() {
    const PAGES: u64 = 256;
    let mark = |gen: u64, page: u64| (1 + (gen * 31 + page * 7) % 250) as u8;
    let (dev, vol) = mem_volume(65_536);
    let vol = Arc::new(vol);
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let generation = Arc::new(std::sync::atomic::AtomicU64::new(0));
    for p in 0..PAGES {
        vol.write(f, p * 4096, &[mark(0, p); 4096]).unwrap();
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (vol, generation, stop, reads) = (vol.clone(), generation.clone(), stop.clone(), reads.clone());
        std::thread::spawn(move || {
            for gen in 1..=200u64 {
                // Let the reader in between generations, however busy the machine is.
                while reads.load(std::sync::atomic::Ordering::SeqCst) < 5 * gen {
                    std::thread::yield_now();
                }
                generation.store(gen, std::sync::atomic::Ordering::SeqCst);
                for p in 0..PAGES {
                    vol.write(f, p * 4096, &[mark(gen, p); 4096]).unwrap();
                }
                // Partial-page writes read the page first: they must see landed data too.
                vol.write(f, 100, &[mark(gen, 0); 10]).unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let syncer = {
        let (vol, stop) = (vol.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                vol.sync().unwrap();
            }
        })
    };
    let mut checked = 0u64;
    let mut p = 0u64;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        p = (p * 1103 + 17) % PAGES;
        let data = vol.read(f, p * 4096, 4096).unwrap();
        // Loaded after the read: no generation newer than this can have been read.
        let upto = generation.load(std::sync::atomic::Ordering::SeqCst);
        for &b in &data {
            assert!((0..=upto).any(|g| mark(g, p) == b), "page {p}: byte {b} is no generation's (≤ {upto})");
        }
        checked += 1;
        reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    writer.join().unwrap();
    syncer.join().unwrap();
    assert!(checked >= 5 * 200, "only {checked} reads overlapped the writes");
    let vol = Arc::try_unwrap(vol).ok().expect("one owner");
    close_and_check(dev, vol);
}

/// A device whose flushes wait at a gate the test opens: a commit stops there.
struct GatedDevice {
    mem: Arc<MemDevice>,
    open: Mutex<bool>,
    cv: Condvar,
    flushes_waiting: AtomicU64,
}

impl GatedDevice {
    fn set(&self, open: bool) {
        *self.open.lock().unwrap() = open;
        self.cv.notify_all();
    }
}

impl BlockDevice for GatedDevice {
    fn block_count(&self) -> u64 {
        self.mem.block_count()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> dxfs::Result<()> {
        self.mem.read(block, buf)
    }
    fn write(&self, block: u64, buf: &[u8]) -> dxfs::Result<()> {
        self.mem.write(block, buf)
    }
    fn flush(&self) -> dxfs::Result<()> {
        self.flushes_waiting.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cv.wait(open).unwrap();
        }
        self.flushes_waiting.fetch_sub(1, Ordering::SeqCst);
        self.mem.flush()
    }
    fn stats(&self) -> dxfs::block::IoStats {
        self.mem.stats()
    }
}

/// Opens the gate when dropped.
struct OpenOnDrop(Arc<GatedDevice>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.set(true);
    }
}

/// Run `f` in a thread; its result, or None if it did not finish within `secs`.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs)).ok()
}

/// A write that fills the delta (here: the dirty-data limit) waits only for the delta's
/// snapshot, not for its commit: it returns while the commit's flush is held at a gate,
/// and so do further writes into the next delta. Dropping the volume waits for the
/// commit; afterwards everything is there and fsck is clean.
#[test]
fn a_full_delta_commits_in_the_background() {
    let mem = Arc::new(MemDevice::new(16_384));
    dxfs::mkfs(mem.clone(), &dxfs::MkfsOptions::default()).unwrap();
    let gated = Arc::new(GatedDevice {
        mem: mem.clone(),
        open: Mutex::new(true),
        cv: Condvar::new(),
        flushes_waiting: AtomicU64::new(0),
    });
    // No flushes ahead of the commit: the delta must fill and commit.
    let opts = OpenOptions { dirty_limit: 64, flush_from: 0, ..OpenOptions::default() };
    let vol = Arc::new(Volume::open(gated.clone(), opts).unwrap());
    // Whatever happens below, the gate opens before the volume is dropped (a failed
    // assertion must not leave a drop waiting for a commit held at the gate forever).
    let _open_at_exit = OpenOnDrop(gated.clone());
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    vol.sync().unwrap();
    gated.set(false);
    let page = |i: u64| vec![(i % 251) as u8 + 1; 4096];
    // 64 pages fill the delta; the 65th needs a commit, which stops at the gate.
    let v = vol.clone();
    let wrote = within(20, move || {
        for i in 0..100u64 {
            v.write(f, i * 4096, &page(i)).unwrap();
        }
    });
    assert!(wrote.is_some(), "a write waited for the commit of the delta it filled");
    // The commit goes on in its thread up to the gate.
    let t = std::time::Instant::now();
    while gated.flushes_waiting.load(Ordering::SeqCst) == 0 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(gated.flushes_waiting.load(Ordering::SeqCst) > 0, "no commit was under way");
    // The data is readable while its commit is held (reads wait only for landed data,
    // which is written before the flush).
    let v = vol.clone();
    let read = within(20, move || v.read(f, 0, 100 * 4096).unwrap()).expect("a read hung");
    assert_eq!(read, (0..100).flat_map(page).collect::<Vec<u8>>());
    // Dropping the volume waits for the commit in flight. (The helper threads' clones
    // may take a moment to go.)
    let t = std::time::Instant::now();
    while Arc::strong_count(&vol) > 1 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let vol = Arc::try_unwrap(vol).ok().expect("one owner");
    let dropped = Arc::new(AtomicU64::new(0));
    let d = dropped.clone();
    let dropper = std::thread::spawn(move || {
        drop(vol);
        d.store(1, Ordering::SeqCst);
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(dropped.load(Ordering::SeqCst), 0, "the drop did not wait for the commit");
    gated.set(true);
    dropper.join().unwrap();
    assert_clean(mem.clone());
    let vol = Volume::open(mem.clone(), OpenOptions::default()).unwrap();
    let f = vol.lookup(vol.root(), b"f").unwrap().ino;
    assert_eq!(vol.read(f, 0, 100 * 4096).unwrap(), (0..100).flat_map(page).collect::<Vec<u8>>());
    close_and_check(mem, vol);
}

/// Opens, writes through open handles, releases, creates and unlinks of a few shared
/// names, from four threads while a fifth commits. An unlinked file stays writable while
/// a handle is open and is freed by its last release: afterwards exactly the names left
/// hold inodes (none leaked on the orphan list, none freed twice), and fsck is clean.
#[test]
fn opens_releases_and_unlinks_of_shared_names_race_cleanly() {
    race_opens_and_unlinks(false);
}

/// The same with a holder, as the FUSE frontend: every lookup and create gives "the
/// kernel" a reference, dropped later (`Volume::forgotten`); an unlinked inode still
/// referenced lives until its last reference and handle are gone.
#[test]
fn opens_unlinks_and_forgets_of_held_inodes_race_cleanly() {
    race_opens_and_unlinks(true);
}

fn race_opens_and_unlinks(with_holder: bool) {
    use std::collections::HashMap;
    let (dev, vol) = mem_volume(32_768);
    // The kernel's references: inode → count.
    let refs: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    if with_holder {
        let r = refs.clone();
        vol.set_holder(Arc::new(move |ino| r.lock().unwrap().get(&ino).is_some_and(|&n| n > 0)));
    }
    let vol = Arc::new(vol);
    let d = vol.mkdir(vol.root(), b"shared", 0o755, 0, 0).unwrap().ino;
    let used = |vol: &Volume| {
        let s = vol.statfs();
        s.files - s.ffree
    };
    let before = used(&vol);
    let new_file = dxfs::NewNode { mode: libc::S_IFREG | 0o644, uid: 0, gid: 0, rdev: 0, umask: 0 };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syncer = {
        let (vol, stop) = (vol.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                vol.sync().unwrap();
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (vol, refs) = (vol.clone(), refs.clone());
            std::thread::spawn(move || {
                // A reference is taken after the volume answered, as the frontend does.
                let take = |held: &mut Vec<u64>, ino: u64| {
                    if with_holder {
                        *refs.lock().unwrap().entry(ino).or_insert(0) += 1;
                        held.push(ino);
                    }
                };
                let forget = |ino: u64| {
                    let left = {
                        let mut r = refs.lock().unwrap();
                        let n = r.get_mut(&ino).unwrap();
                        *n -= 1;
                        *n
                    };
                    if left == 0 {
                        vol.forgotten(ino).unwrap();
                    }
                };
                let mut held: Vec<u64> = Vec::new();
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut handles: Vec<u64> = Vec::new();
                for _ in 0..1500 {
                    let r = next();
                    let name = format!("n{}", r % 8);
                    match (r >> 8) % 6 {
                        0 => match vol.make_open(d, name.as_bytes(), new_file) {
                            Ok(a) => {
                                handles.push(a.ino);
                                take(&mut held, a.ino);
                            }
                            Err(dxfs::Error::Exists) => {}
                            Err(e) => panic!("create {name}: {e}"),
                        },
                        1 => {
                            // Another thread may unlink (and free) it between the two.
                            if let Ok(a) = vol.lookup(d, name.as_bytes()) {
                                take(&mut held, a.ino);
                                if vol.open_file(a.ino).is_ok() {
                                    handles.push(a.ino);
                                }
                            }
                        }
                        2 => match vol.unlink(d, name.as_bytes()) {
                            Ok(()) | Err(dxfs::Error::NotFound) => {}
                            Err(e) => panic!("unlink {name}: {e}"),
                        },
                        3 if !handles.is_empty() => {
                            // Open, linked or not: the data must go in and read back (each
                            // thread writes its own four bytes: others may hold it too).
                            let ino = handles[(r >> 16) as usize % handles.len()];
                            let data = (r as u32).to_le_bytes();
                            vol.write(ino, t * 4, &data).unwrap();
                            assert_eq!(vol.read(ino, t * 4, 4).unwrap(), data);
                        }
                        4 if !handles.is_empty() => {
                            let ino = handles.swap_remove((r >> 16) as usize % handles.len());
                            vol.release(ino).unwrap();
                        }
                        5 if !held.is_empty() => forget(held.swap_remove((r >> 16) as usize % held.len())),
                        _ => {}
                    }
                }
                for ino in handles {
                    vol.release(ino).unwrap();
                }
                for ino in held {
                    forget(ino);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    syncer.join().unwrap();
    let left = vol.readdir(d, 0, 100).unwrap().into_iter().filter(|e| !e.name.starts_with(b".")).count() as u64;
    assert_eq!(used(&vol), before + left, "inodes in use: those of the {left} names left, no more");
    let vol = Arc::into_inner(vol).unwrap();
    close_and_check(dev, vol);
}

/// `Volume::try_write` past the dirty limit (no flusher, so only a commit makes room)
/// does not wait: it answers `None` and changes nothing; `Volume::write` then waits for
/// the room and writes. The file ends as a model of the writes that were done.
#[test]
fn a_write_that_would_wait_for_room_is_not_done() {
    let dev = Arc::new(MemDevice::new(8192));
    dxfs::mkfs(dev.clone(), &dxfs::MkfsOptions::default()).unwrap();
    let opts = OpenOptions { dirty_limit: 16, flush_from: 0, ..OpenOptions::default() };
    let vol = Volume::open(dev.clone(), opts).unwrap();
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let page = |p: u64, v: u8| vec![v ^ p as u8; 4096];
    let mut model = vec![0u8; 64 * 4096];
    let mut refused = 0;
    for p in 0..64u64 {
        // Scattered pages: each its own run.
        let at = (p * 37) % 64;
        let data = page(at, 1);
        match vol.try_write(f, at * 4096, &data, dxfs::WriteAs::default()).unwrap() {
            Some(n) => assert_eq!(n, 4096),
            None => {
                refused += 1;
                let before = vol.read(f, at * 4096, 4096).unwrap();
                let was = &model[(at * 4096) as usize..(at * 4096 + 4096) as usize];
                assert_eq!(&before[..], &was[..before.len()], "a refused write changed page {at}");
                assert_eq!(vol.write(f, at * 4096, &data).unwrap(), 4096);
            }
        }
        model[(at * 4096) as usize..(at * 4096 + 4096) as usize].copy_from_slice(&data);
    }
    assert!(refused > 0, "64 pages past a 16-page limit and no write was refused");
    assert_eq!(vol.read(f, 0, 64 * 4096).unwrap(), model);
    close_and_check(dev, vol);
}
