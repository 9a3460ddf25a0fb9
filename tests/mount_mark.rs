//! The mount mark (ro_compat MOUNT_MARK): a read-write open records its host and process
//! in the volume and keeps the record fresh, so a second host's open, which the image's
//! flock cannot see, is refused, and a mark left by a crash is taken over once it is
//! known to be stale. Another host is simulated by writing a mark with another host's
//! name, boot id and pid.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dxfs::block::{BlockDevice, FileDevice, IoStats, MemDevice};
use dxfs::internals::{MountMark, RO_COMPAT_MOUNT_MARK};
use dxfs::{mkfs, read_superblock, Error, MkfsOptions, OpenOptions, Volume, BLOCK_SIZE};

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn mark_block(dev: &dyn BlockDevice) -> u64 {
    let sb = read_superblock(dev).unwrap();
    assert_ne!(sb.ro_compat & RO_COMPAT_MOUNT_MARK, 0, "mkfs sets MOUNT_MARK by default");
    sb.layout.mark_block
}

fn read_mark(dev: &dyn BlockDevice) -> MountMark {
    let at = mark_block(dev);
    let mut b = [0u8; BLOCK_SIZE];
    dev.read(at, &mut b).unwrap();
    MountMark::decode(&b, at).unwrap()
}

/// A mark as another host's open writes it.
fn foreign(seq: u64, time_ms: u64, interval_ms: u32) -> MountMark {
    MountMark {
        seq,
        in_use: true,
        interval_ms,
        time_ms,
        pid: 4242,
        pid_ns: 4026531836,
        boot_id: [0xab; 16],
        host: "other-host".into(),
    }
}

fn write_mark(dev: &dyn BlockDevice, m: &MountMark) {
    let at = mark_block(dev);
    dev.write(at, &m.encode(at)[..]).unwrap();
}

fn volume() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(4096));
    mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    vol.write(f, 0, b"before").unwrap();
    vol.close().unwrap();
    dev
}

fn busy_message(r: dxfs::Result<Volume>) -> String {
    match r {
        Err(Error::Busy(m)) => m,
        Err(e) => panic!("expected Busy, got {e}"),
        Ok(_) => panic!("the open was not refused"),
    }
}

#[test]
fn open_marks_the_volume_and_close_marks_it_clean() {
    let dev = volume();
    assert!(!read_mark(&*dev).in_use, "closed volume");
    let vol = Volume::open(dev.clone(), OpenOptions { mark_interval_ms: 100, ..Default::default() }).unwrap();
    let m = read_mark(&*dev);
    assert!(m.in_use);
    assert_eq!(m.pid, std::process::id());
    assert_eq!(m.interval_ms, 100);
    // The holder rewrites it.
    std::thread::sleep(Duration::from_millis(350));
    let later = read_mark(&*dev);
    assert!(later.in_use && later.seq != m.seq && later.time_ms > m.time_ms, "{m:?} then {later:?}");
    // A check without repair says the volume is in use, and by whom.
    let r = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).unwrap();
    assert!(
        r.warnings.iter().any(|w| w.contains("in use by host") && w.contains(&format!("pid {}", std::process::id()))),
        "{:?}",
        r.warnings
    );
    // A read-only open neither needs nor changes it.
    let ro = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
    drop(ro);
    assert!(read_mark(&*dev).in_use);
    vol.close().unwrap();
    assert!(!read_mark(&*dev).in_use);
    common::assert_clean(dev);
}

#[test]
fn a_fresh_mark_of_another_host_refuses_the_open_at_once() {
    let dev = volume();
    write_mark(&*dev, &foreign(77, now_ms(), 5000));
    let t = Instant::now();
    let m = busy_message(Volume::open(dev.clone(), OpenOptions::default()));
    assert!(t.elapsed() < Duration::from_secs(2), "refused without waiting");
    assert!(m.contains("other-host") && m.contains("pid 4242"), "{m}");
    // Nothing was written: the mark is still the other host's.
    assert_eq!(read_mark(&*dev), foreign(77, read_mark(&*dev).time_ms, 5000));
    // A repairing fsck is refused the same way; a read-only one warns and checks.
    assert!(matches!(dxfs::fsck::check(dev.clone(), true, &mut |_| {}), Err(Error::Busy(_))));
    let r = dxfs::fsck::check(dev.clone(), false, &mut |_| {});
    let r = r.unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    assert!(
        r.warnings.iter().any(|w| w.contains("in use by host other-host") && w.contains("pid 4242")),
        "{:?}",
        r.warnings
    );
    // Nor is it made anew over the other host's volume.
    assert!(matches!(mkfs(dev.clone(), &MkfsOptions::default()), Err(Error::Busy(_))));
    // Read-only opens still work.
    let ro = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
    let f = ro.lookup(ro.root(), b"f").unwrap().ino;
    assert_eq!(ro.read(f, 0, 100).unwrap(), b"before");
}

#[test]
fn a_stale_mark_is_taken_over_after_watching_it() {
    let dev = volume();
    // Last rewritten an hour ago by a host that went down; it said every 200 ms.
    write_mark(&*dev, &foreign(9, now_ms() - 3_600_000, 200));
    let r = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).unwrap();
    assert!(r.warnings.iter().any(|w| w.contains("not closed cleanly by host other-host")), "{:?}", r.warnings);
    let t = Instant::now();
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    // Watched for 2·200 ms + 1 s, then again after writing its own.
    assert!(t.elapsed() >= Duration::from_millis(2 * 1400), "took over after {:?}", t.elapsed());
    let m = read_mark(&*dev);
    assert!(m.in_use && m.pid == std::process::id() && m.host != "other-host", "{m:?}");
    let f = vol.lookup(vol.root(), b"f").unwrap().ino;
    vol.write(f, 0, b"after!").unwrap();
    vol.close().unwrap();
    assert!(!read_mark(&*dev).in_use);
    common::assert_clean(dev);
}

#[test]
fn a_mark_that_keeps_changing_is_not_taken_over_whatever_its_clock() {
    let dev = volume();
    // The other host's clock is an hour behind, but it does rewrite its mark.
    write_mark(&*dev, &foreign(100, now_ms() - 3_600_000, 200));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (dev, stop) = (dev.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seq = 100;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                seq += 1;
                write_mark(&*dev, &foreign(seq, now_ms() - 3_600_000, 200));
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let m = busy_message(Volume::open(dev.clone(), OpenOptions::default()));
    assert!(m.contains("other-host"), "{m}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert_eq!(read_mark(&*dev).host, "other-host");
}

#[test]
fn a_holder_whose_mark_is_taken_over_stops_changing_the_volume() {
    let dev = volume();
    let vol = Volume::open(dev.clone(), OpenOptions { mark_interval_ms: 100, ..Default::default() }).unwrap();
    let f = vol.lookup(vol.root(), b"f").unwrap().ino;
    vol.write(f, 0, b"mine").unwrap();
    vol.sync().unwrap();
    // Another host takes the volume over (say, after a network partition).
    write_mark(&*dev, &foreign(5, now_ms(), 5000));
    std::thread::sleep(Duration::from_millis(400));
    assert!(matches!(vol.write(f, 0, b"late"), Err(Error::Failed)));
    assert!(matches!(vol.sync(), Err(Error::Failed)));
    drop(vol);
    // The other host's mark is left alone, and what was synced is there.
    assert_eq!(read_mark(&*dev).host, "other-host");
    let ro = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
    assert_eq!(ro.read(f, 0, 100).unwrap(), b"minere");
}

/// A second handle on the same storage, which the first handle's holder does not know.
struct Alias(Arc<MemDevice>);

impl BlockDevice for Alias {
    fn block_count(&self) -> u64 {
        self.0.block_count()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> dxfs::Result<()> {
        self.0.read(block, buf)
    }
    fn write(&self, block: u64, buf: &[u8]) -> dxfs::Result<()> {
        self.0.write(block, buf)
    }
    fn flush(&self) -> dxfs::Result<()> {
        self.0.flush()
    }
    fn stats(&self) -> IoStats {
        self.0.stats()
    }
}

#[test]
fn two_read_write_opens_through_different_handles_are_refused() {
    let dev = volume();
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let m = busy_message(Volume::open(Arc::new(Alias(dev.clone())), OpenOptions::default()));
    assert!(m.contains("already open read-write in this process"), "{m}");
    // Through the same handle the mark is shared (fsck and resize reopen while they hold it).
    vol.close().unwrap();
    // Once closed, the other handle opens at once.
    let t = Instant::now();
    Volume::open(Arc::new(Alias(dev.clone())), OpenOptions::default()).unwrap().close().unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
    common::assert_clean(dev);
}

#[test]
fn a_crashed_open_of_this_host_is_taken_over_at_once() {
    let dev = volume();
    // A mark of this host, by a process that no longer exists: pid numbers go up to
    // pid_max, and one that is not running is what a crash leaves.
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let ours = read_mark(&*dev);
    std::mem::forget(vol); // its thread keeps running, on its own seq: look at a copy
    let copy = Arc::new(MemDevice::from_bytes(dev.to_bytes()));
    let dead = (2..4_000_000u32).rev().find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()).unwrap();
    write_mark(&*copy, &MountMark { pid: dead, seq: ours.seq ^ 1, ..ours.clone() });
    let t = Instant::now();
    Volume::open(copy.clone(), OpenOptions::default()).unwrap().close().unwrap();
    assert!(t.elapsed() < Duration::from_secs(1), "waited {:?}", t.elapsed());
    // A copy of the image holding this process's own live mark opens too (crash images).
    let copy2 = Arc::new(MemDevice::from_bytes(dev.to_bytes()));
    write_mark(&*copy2, &MountMark { seq: ours.seq ^ 3, ..ours });
    Volume::open(copy2.clone(), OpenOptions::default()).unwrap().close().unwrap();
    common::assert_clean(copy);
}

#[test]
fn an_unreadable_mark_is_reported_and_rewritten_by_a_repair() {
    let dev = volume();
    let at = mark_block(&*dev);
    dev.write(at, &[0x5a; BLOCK_SIZE]).unwrap();
    let r = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).unwrap();
    assert!(r.errors.iter().any(|e| e.contains("mount mark unreadable")), "{:?}", r.errors);
    let r = dxfs::fsck::check(dev.clone(), true, &mut |_| {}).unwrap();
    assert!(r.errors.is_empty() && r.fixed.iter().any(|f| f.contains("mount mark")), "{r:?}");
    assert!(!read_mark(&*dev).in_use);
    common::assert_clean(dev);
}

#[test]
fn a_volume_without_the_mark_still_opens_and_checks() {
    let dev = Arc::new(MemDevice::new(4096));
    mkfs(dev.clone(), &MkfsOptions { mount_mark: false, ..Default::default() }).unwrap();
    let sb = read_superblock(&*dev).unwrap();
    assert_eq!(sb.ro_compat & RO_COMPAT_MOUNT_MARK, 0);
    assert_eq!(sb.layout.mark_block, 0);
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    vol.write(f, 0, b"old style").unwrap();
    vol.close().unwrap();
    let r = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).unwrap();
    assert!(r.errors.is_empty() && r.warnings.is_empty(), "{r:?}");
    common::assert_clean(dev);
}

#[test]
fn the_cli_names_the_holder_of_a_fresh_mark() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.img");
    let img = path.to_str().unwrap();
    let (code, _, err) = common::dxfs(&["mkfs", img, "--size", "16M"]);
    assert_eq!(code, 0, "{err}");
    // Another host's fresh mark: the repairing fsck names it, fsck -n warns.
    {
        let dev = FileDevice::open(&path, false).unwrap();
        write_mark(&dev, &foreign(3, now_ms(), 60_000));
        dev.flush().unwrap();
    }
    let (code, out, err) = common::dxfs(&["fsck", img]);
    assert_eq!(code, 8, "{out}{err}");
    assert!(err.contains("other-host") && err.contains("pid 4242"), "{err}");
    let (code, out, err) = common::dxfs(&["fsck", "-n", img]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("warning") && err.contains("in use by host other-host"), "{err}");
    let (code, out, _) = common::dxfs(&["info", img]);
    assert_eq!(code, 0);
    assert!(out.contains("mount_mark"), "{out}");
    assert!(out.contains("Mount mark:") && out.contains("in use by host other-host, pid 4242"), "{out}");
}

/// `Volume::shutdown` leaves the volume clean, and its mark too, even if the volume is
/// never dropped (a daemon that exits right after): the next change takes it back, unless
/// another host took the volume meanwhile.
#[test]
fn a_volume_left_clean_frees_its_mark_until_it_changes_again() {
    let dev = volume();
    let vol = Volume::open(dev.clone(), OpenOptions { mark_interval_ms: 100, ..Default::default() }).unwrap();
    let f = vol.lookup(vol.root(), b"f").unwrap().ino;
    vol.shutdown().unwrap();
    assert!(!read_mark(&*dev).in_use, "clean after shutdown");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!read_mark(&*dev).in_use, "not rewritten while clean");
    // A sync with nothing to commit leaves it clean; a change takes it back.
    vol.sync().unwrap();
    assert!(!read_mark(&*dev).in_use);
    vol.write(f, 0, b"again").unwrap();
    vol.sync().unwrap();
    let m = read_mark(&*dev);
    assert!(m.in_use && m.pid == std::process::id(), "{m:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert_ne!(read_mark(&*dev).seq, m.seq, "rewritten again");
    vol.shutdown().unwrap();
    // Another host opens it now: this open may not change it any more.
    write_mark(&*dev, &foreign(8, now_ms(), 5000));
    vol.write(f, 0, b"late!").unwrap();
    assert!(matches!(vol.sync(), Err(Error::Busy(_))));
    assert!(matches!(vol.write(f, 0, b"later"), Err(Error::Failed)));
    drop(vol);
    assert_eq!(read_mark(&*dev).host, "other-host");
    let ro = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
    assert_eq!(ro.read(f, 0, 100).unwrap(), b"againe");
    drop(ro);
    let r = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

/// `Volume::unmount` (a fuseblk DESTROY) leaves the volume committed, clean and free while
/// the process still holds it: another open of the image succeeds at once, later changes
/// are refused, and nothing is written after, the drop included.
#[test]
fn an_unmounted_volume_is_free_for_the_next_open_and_writes_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::create(&img, 4096 * BLOCK_SIZE as u64).unwrap());
    mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
    drop(dev);
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&img, false).unwrap());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    vol.write(f, 0, b"before the unmount").unwrap();
    assert!(matches!(FileDevice::open(&img, false), Err(Error::Busy(_))));
    vol.unmount().unwrap();
    assert!(!read_mark(&*dev).in_use, "the mark is clean");
    let next: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&img, false).expect("free after unmount"));
    let image = std::fs::read(&img).unwrap();
    assert!(matches!(vol.write(f, 0, b"after"), Err(Error::ReadOnly)));
    assert!(matches!(vol.create(vol.root(), b"g", 0o644, 0, 0), Err(Error::ReadOnly)));
    vol.sync().unwrap();
    drop(vol);
    assert!(std::fs::read(&img).unwrap() == image, "written after the unmount");
    let r = dxfs::fsck::check(next.clone(), true, &mut |_| {}).unwrap();
    assert!(r.errors.is_empty() && r.fixed.is_empty(), "{:?} {:?}", r.errors, r.fixed);
    let vol = Volume::open(next, OpenOptions::default()).unwrap();
    let f = vol.lookup(vol.root(), b"f").unwrap().ino;
    assert_eq!(vol.read(f, 0, 100).unwrap(), b"before the unmount");
    vol.close().unwrap();
}

/// A flush ahead of the commit takes the mark back as a commit does: once another host
/// has taken a volume left clean here, the flusher writes nothing and the volume fails.
#[test]
fn a_flush_ahead_of_the_commit_respects_a_mark_taken_meanwhile() {
    let dev = volume();
    let opts = OpenOptions { mark_interval_ms: 100, flush_from: 4, ..Default::default() };
    let vol = Volume::open(dev.clone(), opts).unwrap();
    let f = vol.lookup(vol.root(), b"f").unwrap().ino;
    vol.shutdown().unwrap();
    write_mark(&*dev, &foreign(8, now_ms(), 5000));
    let writes = dev.stats().writes;
    for p in 0..16u64 {
        let _ = vol.write(f, p * 4096, &[7u8; 4096]);
    }
    vol.wait_flushed(Duration::from_secs(10));
    assert_eq!(dev.stats().writes, writes, "the flusher wrote to a volume another host holds");
    assert!(matches!(vol.write(f, 0, b"x"), Err(Error::Failed)));
    drop(vol);
    assert_eq!(read_mark(&*dev).host, "other-host");
    let r = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).unwrap();
    assert!(r.errors.is_empty(), "{:?}", r.errors);
}

/// A stale mark whose holder closes cleanly while it is being watched: the volume is free.
#[test]
fn a_mark_closed_while_watched_is_taken() {
    let dev = volume();
    write_mark(&*dev, &foreign(40, now_ms() - 3_600_000, 200));
    let closer = {
        let dev = dev.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            write_mark(&*dev, &MountMark { in_use: false, ..foreign(41, now_ms(), 200) });
        })
    };
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    closer.join().unwrap();
    assert_eq!(read_mark(&*dev).pid, std::process::id());
    vol.close().unwrap();
    common::assert_clean(dev);
}
