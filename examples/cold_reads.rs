//! What a cold reader costs the writers beside it when device reads are slow (issue 14:
//! no lock held across device I/O on the request path).
//!
//! cargo run --release --example cold_reads -- [--latency-us N] [--files N]
//!
//! A volume in memory whose reads take N µs each (default 1,000: a network block device)
//! holds 8 directories of F files each (default 2,000), with its cache dropped. One
//! thread lists them cold (readdirplus in batches of 128, then a getattr of each entry),
//! while another creates files in a directory of its own every 200 µs and commits after
//! every 50. Prints the creates' and commits' latency and the reader's pace. A commit
//! takes the volume lock alone, so it waits for every operation holding it shared: with
//! the reader's device reads done under its locks, the commit and every create queued
//! behind it wait for a read.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dxfs::block::{BlockDevice, IoStats, MemDevice};
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume};

/// A memory device whose reads take `latency` once `slow` is set.
struct SlowReads {
    inner: MemDevice,
    latency: Duration,
    slow: AtomicBool,
}

impl SlowReads {
    fn wait(&self) {
        if self.slow.load(Ordering::Relaxed) {
            std::thread::sleep(self.latency);
        }
    }
}

impl BlockDevice for SlowReads {
    fn block_count(&self) -> u64 {
        self.inner.block_count()
    }
    fn read(&self, block: u64, buf: &mut [u8]) -> dxfs::Result<()> {
        self.wait();
        self.inner.read(block, buf)
    }
    fn write(&self, block: u64, buf: &[u8]) -> dxfs::Result<()> {
        self.inner.write(block, buf)
    }
    fn flush(&self) -> dxfs::Result<()> {
        self.inner.flush()
    }
    fn stats(&self) -> IoStats {
        self.inner.stats()
    }
    fn read_many(&self, reqs: &mut [(u64, &mut [u8])]) -> dxfs::Result<()> {
        // One round trip for the batch, as a device with many requests in flight.
        self.wait();
        for (b, buf) in reqs.iter_mut() {
            self.inner.read(*b, buf)?;
        }
        Ok(())
    }
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let latency = Duration::from_micros(arg(&args, "--latency-us", 1000));
    let files = arg(&args, "--files", 2000);
    let dev = Arc::new(SlowReads { inner: MemDevice::new(1 << 19), latency, slow: AtomicBool::new(false) });
    mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let vol = Volume::open(dev.clone(), OpenOptions { measure_lock: true, ..OpenOptions::default() }).expect("open");
    let root = vol.root();
    let dirs: Vec<u64> = (0..8)
        .map(|d| {
            let dir = vol.mkdir(root, format!("d{d}").as_bytes(), 0o755, 0, 0).unwrap().ino;
            for i in 0..files {
                vol.create(dir, format!("file-{i:06}").as_bytes(), 0o644, 0, 0).unwrap();
            }
            dir
        })
        .collect();
    let mine = vol.mkdir(root, b"writer", 0o755, 0, 0).unwrap().ino;
    vol.sync().unwrap();
    // Warm the writer's directory, then forget everything else.
    vol.drop_caches().unwrap();
    vol.lookup(root, b"writer").unwrap();
    dev.slow.store(true, Ordering::Relaxed);
    let done = AtomicBool::new(false);
    let (mut creates, mut commits) = (Vec::new(), Vec::new());
    let t0 = Instant::now();
    let mut listed = 0u64;
    std::thread::scope(|s| {
        s.spawn(|| {
            for &d in &dirs {
                let mut pos = 0;
                loop {
                    let batch = vol.readdir_plus(d, pos, 128).expect("readdirplus");
                    let Some(last) = batch.last() else { break };
                    pos = last.0.next;
                    for (e, _) in &batch {
                        vol.getattr(e.ino).expect("getattr");
                        listed += 1;
                    }
                }
            }
            done.store(true, Ordering::Release);
        });
        let mut i = 0u64;
        while !done.load(Ordering::Acquire) {
            let t = Instant::now();
            vol.create(mine, format!("w{i}").as_bytes(), 0o644, 0, 0).expect("create");
            creates.push(t.elapsed());
            i += 1;
            if i % 50 == 0 {
                let t = Instant::now();
                vol.sync().expect("sync");
                commits.push(t.elapsed());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    });
    let wall = t0.elapsed();
    let l = vol.lock_stats();
    dev.slow.store(false, Ordering::Relaxed);
    vol.close().expect("close");
    let r = dxfs::fsck::check(dev, false, &mut |_| {}).expect("fsck");
    assert!(r.errors.is_empty(), "fsck: {:#?}", r.errors);
    let q = |v: &mut Vec<Duration>, f: f64| {
        v.sort();
        v.get(((v.len().max(1) - 1) as f64 * f) as usize).copied().unwrap_or_default()
    };
    println!(
        "cold listing of {listed} entries in {:.2} s with {} µs reads; {} creates and {} commits beside it",
        wall.as_secs_f64(),
        latency.as_micros(),
        creates.len(),
        commits.len()
    );
    println!(
        "create: median {:?}, p99 {:?}, max {:?}",
        q(&mut creates, 0.5),
        q(&mut creates, 0.99),
        q(&mut creates, 1.0)
    );
    println!("commit: median {:?}, max {:?}", q(&mut commits, 0.5), q(&mut commits, 1.0));
    println!(
        "volume lock: longest wait to share it {:?}, longest shared hold {:?}",
        l.shared_waited_longest, l.shared_held_longest
    );
}
