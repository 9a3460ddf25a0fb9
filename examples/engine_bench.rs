//! In-process engine benchmark (no FUSE): create N empty files in one directory, look
//! each up, unlink them all. Prints µs per operation and device blocks read/written.
//!
//! cargo run --release --example engine_bench -- [N] [--file IMAGE] [--hash H] [--name-len L]
//!     [--readdir-order] [--sync-every K] [--no-lazy-free] [--no-rstats] [--quota BYTES]
//! cargo run --release --example engine_bench -- [N] --threads T [--dirs private|shared]
//!
//! By default the volume lives in memory (a `MemDevice`); `--file` puts it in an image
//! file instead (e.g. on tmpfs), so the numbers include real pread/pwrite calls.
//! `--hash` picks the directory hash (legacy, half_md4, tea, ...), `--name-len` pads the
//! names to L bytes (seed 000's lookup cost against name length). `--readdir-order` unlinks
//! in readdir order (as `rm -rf`), `--sync-every K` commits every K unlinks (as a mount's
//! periodic commits cut a long removal), `--no-lazy-free` makes the volume without lazy
//! inode frees and `--no-rstats` without recursive statistics (the A/B baselines);
//! `--quota BYTES` puts the directory under a quota.
//!
//! `--threads T` measures scaling instead (issue 14): for 1..=T threads, in private
//! directories and in one shared directory, each thread creates, looks up and unlinks
//! its share of N files. It prints operations per second, the speedup over one thread,
//! the share of the operations' thread time spent holding the volume lock exclusively
//! ("excl": commits' snapshots, which stop every operation), holding volume-wide leaf
//! locks ("leaf": the space map, the inodes' lives, ...), waiting for either ("waited"),
//! and holding the volume lock shared with the other operations ("shared": not serial),
//! and from the one-thread serial share (excl + leaf) an Amdahl projection to 16 and 64
//! cores. The projection counts only time under locks, not the cost of cache lines the
//! threads share (the shared lock's word itself): the measured speedup is the check.
//!
//! The benchmark runs on the daemon's allocator (mimalloc, with the default `cli`
//! feature), as the engine has in a mount: under glibc's malloc two threads met on its
//! arena locks, in the names this benchmark formats and in cache blocks one thread frees
//! after the other allocated them (most of a two-thread run's futex calls).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dxfs::block::{BlockDevice, FileDevice, IoStats, MemDevice};
use dxfs::hash::HashVersion;
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume};

#[cfg(feature = "cli")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let opt = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let file = opt("--file");
    let hash = opt("--hash").map(|h| HashVersion::parse(&h).expect("hash version")).unwrap_or(HashVersion::HalfMd4);
    let name_len: usize = opt("--name-len").and_then(|s| s.parse().ok()).unwrap_or(0);
    if let Some(t) = opt("--threads") {
        let t: usize = t.parse().expect("--threads T");
        let n = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(200_000);
        let which = match opt("--dirs").as_deref() {
            Some("private") => vec![false],
            Some("shared") => vec![true],
            _ => vec![false, true],
        };
        return scaling(n, t.max(1), file.as_deref(), &which);
    }
    // Room for the inodes (15 per block), the index and slack.
    // Big enough for the inodes (15 per block), the index and slack, and for the default
    // log to reach its full 256 MiB (1/64 of a 16 GiB volume), as on any real volume.
    let blocks = (n / 15 + n / 40 + 100_000).max(1 << 22);
    let dev: Arc<dyn BlockDevice> = match &file {
        Some(p) => Arc::new(FileDevice::create(p, blocks * 4096).expect("image file")),
        None => Arc::new(MemDevice::new(blocks)),
    };
    let lazy_inode_free = !args.iter().any(|a| a == "--no-lazy-free");
    let rstats = !args.iter().any(|a| a == "--no-rstats");
    mkfs(dev.clone(), &MkfsOptions { hash, lazy_inode_free, rstats, ..Default::default() }).expect("mkfs");
    let vol = Volume::open(dev.clone(), OpenOptions::default()).expect("open");
    let root = vol.root();
    let dir = vol.mkdir(root, b"d", 0o755, 0, 0).expect("mkdir").ino;
    // `--quota BYTES`: the directory under a quota (every create charged to it).
    if let Some(q) = opt("--quota").and_then(|q| q.parse().ok()) {
        vol.set_quota(dir, Some(q)).expect("quota");
    }
    let names: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let mut v = format!("file-{i:08}").into_bytes();
            v.resize(name_len.max(v.len()), b'x');
            v
        })
        .collect();
    println!(
        "dxfs engine benchmark: {n} files in one directory, hash {}, names of {} bytes, device {}",
        hash.name(),
        names[0].len(),
        file.as_deref().unwrap_or("memory")
    );
    println!(
        "{:<10} {:>10} {:>12} {:>12} {:>12} {:>10}",
        "phase", "seconds", "µs/op", "blk read", "blk written", "flushes"
    );

    let phase = |name: &str, f: &mut dyn FnMut()| {
        let s0 = dev.stats();
        let t = Instant::now();
        f();
        let secs = t.elapsed().as_secs_f64();
        let d: IoStats = dev.stats().since(s0);
        println!(
            "{:<10} {:>10.3} {:>12.3} {:>12} {:>12} {:>10}",
            name,
            secs,
            secs * 1e6 / n as f64,
            d.blocks_read,
            d.blocks_written,
            d.flushes
        );
    };
    phase("create", &mut || {
        for nm in &names {
            vol.create(dir, nm, 0o644, 0, 0).expect("create");
        }
    });
    phase("sync", &mut || vol.sync().expect("sync"));
    let (entries, depth) = vol.dir_stats(dir).unwrap();
    let dblocks = vol.dir_blocks(dir).unwrap().len();
    println!("directory: {entries} entries, index depth {depth}, {dblocks} index blocks");
    let r = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).expect("fsck");
    println!(
        "leaf fill: {} leaves, {:.0} bytes used per leaf ({:.1}% of 4064)",
        r.dir_leaves,
        r.dir_leaf_bytes as f64 / r.dir_leaves.max(1) as f64,
        100.0 * r.dir_leaf_bytes as f64 / (r.dir_leaves.max(1) as f64 * 4064.0)
    );
    phase("lookup", &mut || {
        for nm in &names {
            vol.lookup(dir, nm).expect("lookup");
        }
    });
    vol.drop_caches().unwrap();
    phase("lookup-cold", &mut || {
        for nm in names.iter().take(100_000) {
            vol.lookup(dir, nm).expect("lookup");
        }
    });
    // `rm -rf` unlinks in readdir order, and a mount commits every few seconds.
    let sync_every: usize = opt("--sync-every").and_then(|s| s.parse().ok()).unwrap_or(usize::MAX);
    let order: Vec<Vec<u8>> = if args.iter().any(|a| a == "--readdir-order") {
        let (mut out, mut pos) = (Vec::new(), 0);
        loop {
            let batch = vol.readdir(dir, pos, 4096).expect("readdir");
            let Some(last) = batch.last() else { break };
            pos = last.next;
            out.extend(batch.into_iter().map(|e| e.name).filter(|n| n != b"." && n != b".."));
        }
        out
    } else {
        names.clone()
    };
    phase("unlink", &mut || {
        for (k, nm) in order.iter().enumerate() {
            vol.unlink(dir, nm).expect("unlink");
            if k % sync_every == sync_every - 1 {
                vol.sync().expect("sync");
            }
        }
    });
    phase("sync", &mut || vol.sync().expect("sync"));
    let (entries, depth) = vol.dir_stats(dir).unwrap();
    println!(
        "directory after unlink: {entries} entries, index depth {depth}, {} index blocks",
        vol.dir_blocks(dir).unwrap().len()
    );
    vol.close().expect("close");
    let r = dxfs::fsck::check(dev, false, &mut |_| {}).expect("fsck");
    println!("fsck: {} errors", r.errors.len());
    if !r.errors.is_empty() {
        eprintln!("{:#?}", r.errors);
        std::process::exit(1);
    }
}

/// What one thread does for its `i`-th name.
type Step<'a> = &'a (dyn Fn(usize, u64) + Sync);

/// One phase of the scaling run: every thread does `f(thread, i)` for its share of names.
fn run_phase(vol: &Volume, threads: usize, per: u64, f: Step) -> (Duration, dxfs::LockStats) {
    let l0 = vol.lock_stats();
    let t = Instant::now();
    std::thread::scope(|sc| {
        for th in 0..threads {
            sc.spawn(move || (0..per).for_each(|i| f(th, i)));
        }
    });
    (t.elapsed(), vol.lock_stats().since(l0))
}

/// Runs of each configuration in the scaling table: throughput is the best of them, the
/// thread counts taken in turn (1, 2, …, 1, 2, …) so that each has its share of the
/// host's good and bad stretches (its speed moves by tens of per cent from second to
/// second); shares come from one more run with the locks measured (measuring reads the
/// clock around every lock, which costs).
const RUNS: usize = 5;

/// One configuration of the scaling run: `threads` threads, each in a directory of its
/// own or all in one; per phase, the throughput and the lock totals.
fn scaling_run(n: u64, threads: usize, shared: bool, file: Option<&str>, measure: bool) -> Vec<(f64, dxfs::LockStats)> {
    let blocks = (n / 15 + n / 40 + 100_000).max(1 << 20);
    let dev: Arc<dyn BlockDevice> = match file {
        Some(p) => Arc::new(FileDevice::create(p, blocks * 4096).expect("image file")),
        None => Arc::new(MemDevice::new(blocks)),
    };
    mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let vol = Volume::open(dev.clone(), OpenOptions { measure_lock: measure, ..Default::default() }).expect("open");
    let root = vol.root();
    let dirs: Vec<u64> = (0..threads)
        .map(
            |t| if shared && t > 0 { 0 } else { vol.mkdir(root, format!("d{t}").as_bytes(), 0o755, 0, 0).unwrap().ino },
        )
        .collect();
    let dir_of = |t: usize| if shared { dirs[0] } else { dirs[t] };
    let name = |t: usize, i: u64| format!("t{t}-file-{i:08}").into_bytes();
    let per = n / threads as u64;
    let phases: [Step; 3] = [
        &|t, i| {
            vol.create(dir_of(t), &name(t, i), 0o644, 0, 0).expect("create");
        },
        &|t, i| {
            vol.lookup(dir_of(t), &name(t, i)).expect("lookup");
        },
        &|t, i| vol.unlink(dir_of(t), &name(t, i)).expect("unlink"),
    ];
    let out = phases
        .iter()
        .map(|f| {
            let (wall, l) = run_phase(&vol, threads, per, *f);
            ((per * threads as u64) as f64 / wall.as_secs_f64(), l)
        })
        .collect();
    vol.close().expect("close");
    let r = dxfs::fsck::check(dev, false, &mut |_| {}).expect("fsck");
    assert!(r.errors.is_empty(), "fsck: {:#?}", r.errors);
    out
}

/// The host's ceiling: `threads` threads, each on a volume of its own (nothing shared in
/// dxfs), creating, looking up and unlinking `n / threads` files each. What two threads
/// reach here bounds what they can reach on one volume (memory, caches and the host's
/// clock speed under load are shared whatever dxfs does).
fn separate_run(n: u64, threads: usize) -> [f64; 3] {
    let per = n / threads as u64;
    let vols: Vec<(Volume, u64)> = (0..threads)
        .map(|_| {
            let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new((per / 15 + per / 40 + 100_000).max(1 << 20)));
            mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
            let vol = Volume::open(dev, OpenOptions::default()).expect("open");
            let d = vol.mkdir(vol.root(), b"d", 0o755, 0, 0).unwrap().ino;
            (vol, d)
        })
        .collect();
    let name = |i: u64| format!("file-{i:08}").into_bytes();
    let phase = |f: &(dyn Fn(&Volume, u64, u64) + Sync)| {
        let t = Instant::now();
        std::thread::scope(|sc| {
            for (vol, d) in &vols {
                sc.spawn(move || (0..per).for_each(|i| f(vol, *d, i)));
            }
        });
        (per * threads as u64) as f64 / t.elapsed().as_secs_f64()
    };
    [
        phase(&|v, d, i| {
            v.create(d, &name(i), 0o644, 0, 0).expect("create");
        }),
        phase(&|v, d, i| {
            v.lookup(d, &name(i)).expect("lookup");
        }),
        phase(&|v, d, i| v.unlink(d, &name(i)).expect("unlink")),
    ]
}

/// Scaling of creates, lookups and unlinks with 1..=`max_threads` threads (issue 14).
fn scaling(n: u64, max_threads: usize, file: Option<&str>, which: &[bool]) {
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    println!(
        "dxfs engine scaling: {n} files per run, {cpus} CPUs here, device {}; ops/s best of {RUNS} runs, \
         shares of thread time from one more run with the locks measured",
        file.unwrap_or("memory")
    );
    println!(
        "{:<8} {:>7} {:<7} {:>11} {:>8} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10}  largest leaf locks",
        "dirs",
        "threads",
        "phase",
        "ops/s",
        "speedup",
        "excl %",
        "leaf %",
        "waited %",
        "shared %",
        "Amdahl 16",
        "Amdahl 64"
    );
    let labels = ["create", "lookup", "unlink"];
    let mut best = vec![[0f64; 3]; max_threads + 1];
    for _ in 0..RUNS {
        for (threads, b) in best.iter_mut().enumerate().skip(1) {
            for (k, ops) in separate_run(n, threads).into_iter().enumerate() {
                b[k] = b[k].max(ops);
            }
        }
    }
    for threads in 1..=max_threads {
        for k in 0..3 {
            println!(
                "{:<8} {:>7} {:<7} {:>11.0} {:>7.2}x   (one volume per thread: this host's ceiling)",
                "separate",
                threads,
                labels[k],
                best[threads][k],
                best[threads][k] / best[1][k]
            );
        }
    }
    for &shared in which {
        let mut base: Vec<f64> = Vec::new();
        let mut serial: Vec<f64> = Vec::new();
        let mut best = vec![[0f64; 3]; max_threads + 1];
        for _ in 0..RUNS {
            for (threads, b) in best.iter_mut().enumerate().skip(1) {
                for (k, (ops, _)) in scaling_run(n, threads, shared, file, false).into_iter().enumerate() {
                    b[k] = b[k].max(ops);
                }
            }
        }
        for threads in 1..=max_threads {
            let best = best[threads];
            let measured = scaling_run(n, threads, shared, file, true);
            for (k, (ops_measured, l)) in measured.into_iter().enumerate() {
                let ops = best[k];
                // Thread time spent in operations: every thread was busy for the whole wall
                // time of the measured run.
                let busy = (n / threads as u64 * threads as u64) as f64 / ops_measured * threads as f64;
                // Serial: time on locks that keep every other operation out of their part:
                // the volume lock held exclusively (commits' snapshots) and leaf locks.
                let held = l.held.as_secs_f64() / busy;
                let leaf = l.leaf_held.as_secs_f64() / busy;
                let waited = (l.waited + l.shared_waited + l.leaf_waited).as_secs_f64() / busy;
                let shared_held = l.shared_held.as_secs_f64() / busy;
                if threads == 1 {
                    base.push(ops);
                    serial.push(held + leaf);
                }
                let amdahl = |cores: f64| 1.0 / (serial[k] + (1.0 - serial[k]) / cores);
                // Which leaf locks the leaf share goes to (the two largest).
                let mut by: Vec<(f64, &str)> = l
                    .leaf_held_by
                    .iter()
                    .zip(dxfs::LEAF_LOCK_NAMES)
                    .map(|(d, name)| (d.as_secs_f64() / busy, name))
                    .filter(|(share, _)| *share > 0.0)
                    .collect();
                by.sort_by(|a, b| b.0.total_cmp(&a.0));
                let largest: Vec<String> =
                    by.iter().take(2).map(|(s, name)| format!("{name} {:.2}%", 100.0 * s)).collect();
                println!(
                    "{:<8} {:>7} {:<7} {:>11.0} {:>7.2}x {:>8.1}% {:>8.1}% {:>8.1}% {:>8.1}% {:>9.1}x {:>9.1}x  {}",
                    if shared { "shared" } else { "private" },
                    threads,
                    labels[k],
                    ops,
                    ops / base[k],
                    100.0 * held,
                    100.0 * leaf,
                    100.0 * waited,
                    100.0 * shared_held,
                    amdahl(16.0),
                    amdahl(64.0),
                    largest.join(", ")
                );
            }
        }
    }
}
