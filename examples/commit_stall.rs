//! How long the front end stalls while commits write data back (issues 14 and 15).
//!
//! cargo run --release --example commit_stall -- [MiB] [--file IMAGE]
//!
//! One thread writes MiB mebibytes into a file in 1 MiB pieces (its delta commits when
//! the dirty data passes the limit, and a syncer commits every second, as the mount does
//! every 5 s); another creates empty files in its own directory meanwhile and records how
//! long each create took. Prints the creates' latency distribution and the longest stall,
//! and the writer's longest write.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dxfs::block::{BlockDevice, FileDevice, MemDevice};
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let file = args.iter().position(|a| a == "--file").and_then(|i| args.get(i + 1)).cloned();
    let blocks = (mib * 256 * 2).max(1 << 20);
    let dev: Arc<dyn BlockDevice> = match &file {
        Some(p) => Arc::new(FileDevice::create(p, blocks * 4096).expect("image file")),
        None => Arc::new(MemDevice::new(blocks)),
    };
    mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let vol = Volume::open(dev.clone(), OpenOptions { measure_lock: true, ..OpenOptions::default() }).expect("open");
    let root = vol.root();
    let big = vol.create(root, b"big", 0o644, 0, 0).unwrap().ino;
    let small = vol.mkdir(root, b"small", 0o755, 0, 0).unwrap().ino;
    let done = AtomicBool::new(false);
    let mut lat: Vec<Duration> = Vec::new();
    let mut longest_write = Duration::ZERO;
    let t0 = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            let chunk = vec![0x5Au8; 1 << 20];
            for i in 0..mib {
                let t = Instant::now();
                vol.write(big, i << 20, &chunk).expect("write");
                longest_write = longest_write.max(t.elapsed());
            }
            done.store(true, Ordering::Release);
        });
        s.spawn(|| {
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_secs(1));
                vol.sync().expect("sync");
            }
        });
        let mut i = 0u64;
        while !done.load(Ordering::Acquire) {
            let t = Instant::now();
            vol.create(small, format!("f{i}").as_bytes(), 0o644, 0, 0).expect("create");
            lat.push(t.elapsed());
            i += 1;
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    let wall = t0.elapsed();
    let l = vol.lock_stats();
    vol.close().expect("close");
    let r = dxfs::fsck::check(dev, false, &mut |_| {}).expect("fsck");
    assert!(r.errors.is_empty(), "fsck: {:#?}", r.errors);
    lat.sort();
    let q = |f: f64| lat[((lat.len() - 1) as f64 * f) as usize];
    println!(
        "{mib} MiB written in {:.2} s ({:.0} MiB/s) on {}; {} creates beside it",
        wall.as_secs_f64(),
        mib as f64 / wall.as_secs_f64(),
        file.as_deref().unwrap_or("memory"),
        lat.len()
    );
    println!(
        "create latency: median {:?}, p99 {:?}, p99.9 {:?}, max {:?}",
        q(0.5),
        q(0.99),
        q(0.999),
        lat.last().unwrap()
    );
    println!(
        "volume lock held alone {} times, longest {:?} (a commit's snapshot or a flush's write-back); \
         longest wait of an operation to share it {:?}, longest operation {:?}",
        l.acquisitions, l.held_longest, l.shared_waited_longest, l.shared_held_longest
    );
    // The writer fills the delta: it waits for the snapshot of a background commit (and
    // for the previous commit when it is still running), not for each commit's I/O.
    println!("longest 1 MiB write: {longest_write:?}");
}
