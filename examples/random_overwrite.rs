//! What a commit costs after random 4 KiB overwrites (issue 15), in process.
//!
//! cargo run --release --example random_overwrite -- [MiB] [--writes N] [--sync-every K] [--file IMAGE]
//!     [--flush-from PAGES] [--reopen] [--read-first]
//!
//! Writes a MiB-mebibyte file sequentially and commits, then overwrites N random 4 KiB
//! pages of it, committing every K writes (fio's `--fsync=K`). Prints the time per write
//! and per commit, the file's extent count at the end, and the blocks written. Every
//! overwrite goes to a fresh block at its commit (redirect on write), so this measures the
//! extent-map updates of write-back. `--flush-from 0` turns write-back ahead of the
//! commit off, so the commits do all of it. `--reopen` closes and opens the volume again
//! before the overwrites (a new mount knows none of the file's blocks as data: the first
//! overwrite in place of each reads it once); `--read-first` reads each page before
//! overwriting it, as a database does (the read proves it file data). fsck runs at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dxfs::block::{BlockDevice, MemDevice};
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let mib: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(256);
    let writes: u64 = opt("--writes").and_then(|s| s.parse().ok()).unwrap_or(50_000);
    let every: u64 = opt("--sync-every").and_then(|s| s.parse().ok()).unwrap_or(1000);
    let blocks = (mib * 256 * 4).max(1 << 18);
    let dev: Arc<dyn BlockDevice> = match opt("--file") {
        Some(p) => Arc::new(dxfs::block::FileDevice::create(p, blocks * 4096).expect("image file")),
        None => Arc::new(MemDevice::new(blocks)),
    };
    mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let mut opts = OpenOptions::default();
    if let Some(n) = opt("--flush-from").and_then(|s| s.parse().ok()) {
        opts.flush_from = n;
    }
    let mut vol = Volume::open(dev.clone(), opts.clone()).expect("open");
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![0x11u8; 1 << 20];
    for i in 0..mib {
        vol.write(f, i << 20, &chunk).unwrap();
    }
    vol.sync().unwrap();
    if args.iter().any(|a| a == "--reopen") {
        vol.close().expect("close");
        vol = Volume::open(dev.clone(), opts).expect("open again");
    }
    let pages = mib * 256;
    let read_first = args.iter().any(|a| a == "--read-first");
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let page = [0x22u8; 4096];
    let (mut in_writes, mut in_syncs, mut worst) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut worst_write = Duration::ZERO;
    let io0 = vol.io_stats();
    for n in 1..=writes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if read_first {
            vol.read(f, (x % pages) * 4096, 4096).unwrap();
        }
        let t = Instant::now();
        vol.write(f, (x % pages) * 4096, &page).unwrap();
        let d = t.elapsed();
        worst_write = worst_write.max(d);
        in_writes += d;
        if n % every == 0 {
            let t = Instant::now();
            vol.sync().unwrap();
            let d = t.elapsed();
            worst = worst.max(d);
            in_syncs += d;
        }
    }
    let io = vol.io_stats();
    let extents = vol.extent_tree_blocks(f).unwrap().len();
    println!(
        "{mib} MiB file, {writes} random 4 KiB writes, commit every {every}: write {:.2} µs, commit {:.2} ms \
         ({:.1} µs per page, worst {:.1} ms), worst write {:.1} ms (commits at the dirty limits), {} blocks \
         written, extent tree {} blocks",
        in_writes.as_secs_f64() * 1e6 / writes as f64,
        in_syncs.as_secs_f64() * 1e3 / (writes / every).max(1) as f64,
        in_syncs.as_secs_f64() * 1e6 / writes as f64,
        worst.as_secs_f64() * 1e3,
        worst_write.as_secs_f64() * 1e3,
        io.blocks_written - io0.blocks_written,
        extents
    );
    vol.close().expect("close");
    let r = dxfs::fsck::check(dev, false, &mut |_| {}).expect("fsck");
    assert!(r.errors.is_empty(), "fsck: {:#?}", r.errors);
}
