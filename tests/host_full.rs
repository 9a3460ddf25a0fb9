//! When the storage under a volume runs out of room (a sparse image's host file system,
//! an NBD server's disk), a commit stalls instead of failing the volume: the writer gets
//! ENOSPC, reads go on, the disk holds the last committed delta, and once there is room
//! the stalled delta commits and the volume goes on without a remount.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::*;
use dxfs::block::{BlockDevice, CrashMode, FaultDevice, IoStats, MemDevice};
use dxfs::{mkfs, Error, MkfsOptions, OpenOptions, Volume};

/// Storage that allocates as a sparse file does: while `full` is set, a write that
/// touches a block never written before is refused with ENOSPC (and writes nothing),
/// while rewriting written blocks still works.
struct SparseHost {
    mem: Arc<dyn BlockDevice>,
    written: parking_lot::Mutex<HashSet<u64>>,
    full: AtomicBool,
    refused: std::sync::atomic::AtomicU64,
}

impl SparseHost {
    fn new(mem: Arc<dyn BlockDevice>) -> SparseHost {
        SparseHost { mem, written: Default::default(), full: AtomicBool::new(false), refused: Default::default() }
    }
}

impl BlockDevice for SparseHost {
    fn block_count(&self) -> u64 {
        self.mem.block_count()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> dxfs::Result<()> {
        self.mem.read(block, buf)
    }
    fn write(&self, block: u64, buf: &[u8]) -> dxfs::Result<()> {
        let n = (buf.len() / 4096) as u64;
        let mut w = self.written.lock();
        if self.full.load(Ordering::Acquire) && (block..block + n).any(|b| !w.contains(&b)) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Error::Io(std::io::ErrorKind::StorageFull.into()));
        }
        w.extend(block..block + n);
        self.mem.write(block, buf)
    }
    fn flush(&self) -> dxfs::Result<()> {
        self.mem.flush()
    }
    fn stats(&self) -> IoStats {
        self.mem.stats()
    }
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A volume on a sparse host with file `a` committed.
fn volume() -> (Arc<MemDevice>, Arc<SparseHost>, Volume, u64) {
    let mem = Arc::new(MemDevice::new(16_384));
    let host = Arc::new(SparseHost::new(mem.clone()));
    mkfs(host.clone(), &MkfsOptions::default()).unwrap();
    let vol = Volume::open(host.clone(), OpenOptions::default()).unwrap();
    let a = vol.create(vol.root(), b"a", 0o644, 0, 0).unwrap().ino;
    vol.write(a, 0, &data(100_000, 1)).unwrap();
    vol.sync().unwrap();
    (mem, host, vol, a)
}

/// What a copy of the disk holds, as a crash now would leave it: fsck finds it clean,
/// and a read-only open (the volume itself is still open read-write in this process)
/// replays its log in memory.
fn as_recovered(img: Vec<u8>) -> Dump {
    let dev = Arc::new(MemDevice::from_bytes(img));
    assert_clean(dev.clone());
    let ro = Volume::open(dev, OpenOptions { read_only: true, ..OpenOptions::default() }).unwrap();
    dump(&ro)
}

/// How the stalled delta changed file data: small (committed with one flush), large
/// (two flushes, its data written ahead of the log), or overwrites in place (written
/// home only after the commit).
#[derive(Clone, Copy, Debug)]
enum Shape {
    Small,
    Large,
    InPlace,
}

fn stall_and_resume(shape: Shape, resume_by_sync: bool) {
    let (mem, host, vol, a) = volume();
    let root = vol.root();
    let committed = dump(&vol);
    host.full.store(true, Ordering::Release);
    let b = vol.create(root, b"b", 0o644, 0, 0).unwrap().ino;
    let (file, want) = match shape {
        Shape::Small => {
            vol.write(b, 0, &data(300_000, 2)).unwrap();
            (b, data(300_000, 2))
        }
        Shape::Large => {
            vol.write(b, 0, &data(3 << 20, 3)).unwrap();
            (b, data(3 << 20, 3))
        }
        Shape::InPlace => {
            let mut want = data(100_000, 1);
            for at in [0usize, 40_960, 81_920] {
                vol.write(a, at as u64, b"overwritten in place").unwrap();
                want[at..at + 20].copy_from_slice(b"overwritten in place");
            }
            (a, want)
        }
    };
    // The writer learns it: the sync fails with ENOSPC, and so does every change after.
    let e = vol.sync().unwrap_err();
    assert!(matches!(e, Error::NoSpace), "{shape:?}: {e}");
    assert_eq!(e.errno(), libc::ENOSPC);
    assert!(host.refused.load(Ordering::Relaxed) > 0, "the host never refused a write");
    assert!(matches!(vol.fsync(file), Err(Error::NoSpace)));
    assert!(matches!(vol.create(root, b"c", 0o644, 0, 0), Err(Error::NoSpace)));
    assert!(matches!(vol.write(a, 0, b"x"), Err(Error::NoSpace)));
    // Reads go on: of what was committed, and of what waits (from memory). Data that
    // goes home only after the commit cannot be read meanwhile, and says why.
    assert_eq!(vol.lookup(root, b"b").unwrap().ino, b);
    match shape {
        Shape::InPlace => assert!(matches!(vol.read(a, 0, 100_000), Err(Error::NoSpace))),
        _ => {
            assert_eq!(vol.read(a, 0, 100_000).unwrap(), data(100_000, 1));
            assert_eq!(vol.read(file, 0, want.len()).unwrap(), want, "{shape:?}: the waiting data");
        }
    }
    // A crash now loses the stalled delta and nothing committed.
    assert_eq!(as_recovered(mem.to_bytes()), committed, "{shape:?}: the disk after the stall");
    // Still full: trying again changes nothing.
    assert!(matches!(vol.sync(), Err(Error::NoSpace)));
    host.full.store(false, Ordering::Release);
    if resume_by_sync {
        vol.sync().unwrap();
    } else {
        // No sync: a change, once the retry interval has passed, commits it first.
        std::thread::sleep(std::time::Duration::from_millis(150));
    }
    vol.create(root, b"c", 0o644, 0, 0).unwrap();
    assert_eq!(vol.read(file, 0, want.len()).unwrap(), want);
    let expected = dump(&vol);
    vol.close().unwrap();
    assert_clean(mem.clone());
    let vol = Volume::open(mem.clone(), OpenOptions::default()).unwrap();
    assert_eq!(dump(&vol), expected, "{shape:?}: after the reopen");
    vol.close().unwrap();
    assert_clean(mem);
}

#[test]
fn a_small_delta_stalls_then_commits_at_the_next_sync() {
    stall_and_resume(Shape::Small, true);
}

#[test]
fn a_large_delta_stalls_then_commits_by_itself() {
    stall_and_resume(Shape::Large, false);
}

#[test]
fn overwrites_in_place_stall_then_commit() {
    stall_and_resume(Shape::InPlace, true);
}

/// Closed while the host is still full: the stalled delta is lost, as in a crash, and
/// the volume opens clean at its last commit.
#[test]
fn closing_while_full_keeps_the_last_commit() {
    let (mem, host, vol, _) = volume();
    let committed = dump(&vol);
    host.full.store(true, Ordering::Release);
    let b = vol.create(vol.root(), b"b", 0o644, 0, 0).unwrap().ino;
    vol.write(b, 0, &data(50_000, 4)).unwrap();
    assert!(matches!(vol.close(), Err(Error::NoSpace)));
    host.full.store(false, Ordering::Release);
    assert_eq!(recover(mem.to_bytes()).unwrap(), committed);
}

/// A crash at any write of a stall and its resumption (two failed tries, then room)
/// leaves the volume at its last commit or with the stalled delta whole; fsck is clean.
#[test]
fn a_crash_anywhere_in_a_stall_and_its_resumption_is_recoverable() {
    let fault = Arc::new(FaultDevice::new(vec![0; 4096 * 4096]));
    let host = Arc::new(SparseHost::new(fault.clone()));
    mkfs(host.clone(), &MkfsOptions::default()).unwrap();
    let vol = Volume::open(host.clone(), OpenOptions::default()).unwrap();
    let root = vol.root();
    let a = vol.create(root, b"a", 0o644, 0, 0).unwrap().ino;
    vol.write(a, 0, &data(20_000, 1)).unwrap();
    vol.sync().unwrap();
    let before = dump(&vol);
    let start = fault.events();
    host.full.store(true, Ordering::Release);
    let b = vol.create(root, b"b", 0o644, 0, 0).unwrap().ino;
    vol.write(b, 0, &data(60_000, 2)).unwrap();
    vol.write(a, 4096, b"in place").unwrap();
    assert!(matches!(vol.sync(), Err(Error::NoSpace)));
    assert!(matches!(vol.sync(), Err(Error::NoSpace)));
    host.full.store(false, Ordering::Release);
    vol.sync().unwrap();
    let after = dump(&vol);
    vol.close().unwrap();
    let n = fault.events();
    assert!(n - start > 10, "too few writes to mean anything: {}", n - start);
    for mode in [CrashMode::All, CrashMode::DropUnflushed, CrashMode::Torn] {
        for at in start..=n {
            let got = recover(fault.crash_image(at, mode)).unwrap_or_else(|e| panic!("{mode:?} at {at}: {e}"));
            assert!(got == before || got == after, "{mode:?} at {at}: neither the last commit nor the stalled one");
        }
    }
}
