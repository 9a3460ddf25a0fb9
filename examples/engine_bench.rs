//! In-process engine benchmark (no FUSE): create N empty files in one directory, look
//! each up, unlink them all. Prints µs per operation and device blocks read/written.
//!
//! cargo run --release --example engine_bench -- [N] [--file IMAGE] [--hash H] [--name-len L]
//!
//! By default the volume lives in memory (a `MemDevice`); `--file` puts it in an image
//! file instead (e.g. on tmpfs), so the numbers include real pread/pwrite calls.
//! `--hash` picks the directory hash (legacy, half_md4, tea, ...), `--name-len` pads the
//! names to L bytes (seed 000's lookup cost against name length).

use std::sync::Arc;
use std::time::Instant;

use dxfs::block::{BlockDevice, FileDevice, IoStats, MemDevice};
use dxfs::hash::HashVersion;
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let opt = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let file = opt("--file");
    let hash = opt("--hash").map(|h| HashVersion::parse(&h).expect("hash version")).unwrap_or(HashVersion::HalfMd4);
    let name_len: usize = opt("--name-len").and_then(|s| s.parse().ok()).unwrap_or(0);
    // Room for the inodes (15 per block), the index and slack.
    // Big enough for the inodes (15 per block), the index and slack, and for the default
    // log to reach its full 256 MiB (1/64 of a 16 GiB volume), as on any real volume.
    let blocks = (n / 15 + n / 40 + 100_000).max(1 << 22);
    let dev: Arc<dyn BlockDevice> = match &file {
        Some(p) => Arc::new(FileDevice::create(p, blocks * 4096).expect("image file")),
        None => Arc::new(MemDevice::new(blocks)),
    };
    mkfs(dev.clone(), &MkfsOptions { hash, ..Default::default() }).expect("mkfs");
    let vol = Volume::open(dev.clone(), OpenOptions::default()).expect("open");
    let root = vol.root();
    let dir = vol.mkdir(root, b"d", 0o755, 0, 0).expect("mkdir").ino;
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
    phase("unlink", &mut || {
        for nm in &names {
            vol.unlink(dir, nm).expect("unlink");
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
