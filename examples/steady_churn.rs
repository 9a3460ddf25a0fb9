//! Seed 000's steady-state experiment (Phillips), in process: a directory of P live
//! entries with random names from a range of 10^9, then C delete-one/create-one cycles.
//! Prints the directory's size (st_size, index blocks) every C/S cycles, as CSV.
//!
//! cargo run --release --example steady_churn -- [P] [C] [S]   (DXFS_SEED=n for other names)

use std::sync::Arc;

use dxfs::block::{BlockDevice, MemDevice};
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume};
use rand::{Rng, SeedableRng};

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|s| s.parse().ok()).collect();
    let (population, cycles, samples) = (
        args.first().copied().unwrap_or(10_000),
        args.get(1).copied().unwrap_or(1_000_000),
        args.get(2).copied().unwrap_or(20),
    );
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 18));
    mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let vol = Volume::open(dev, OpenOptions::default()).expect("open");
    let d = vol.mkdir(vol.root(), b"d", 0o755, 0, 0).expect("mkdir").ino;
    // DXFS_SEED varies the names and the choice of victims between runs.
    let seed: u64 = std::env::var("DXFS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(2026 + seed);
    let mut name = || format!("{}", rng.gen_range(0..1_000_000_000u64));
    let mut live: Vec<String> = Vec::new();
    while (live.len() as u64) < population {
        let n = name();
        if vol.create(d, n.as_bytes(), 0o644, 0, 0).is_ok() {
            live.push(n);
        }
    }
    let mut pick = rand::rngs::StdRng::seed_from_u64(7 + seed);
    println!("cycle,st_size,blocks_512");
    let every = (cycles / samples.max(1)).max(1);
    for c in 0..=cycles {
        if c % every == 0 {
            let a = vol.getattr(d).expect("getattr");
            println!("{c},{},{}", a.size, a.blocks);
        }
        if c == cycles {
            break;
        }
        let i = pick.gen_range(0..live.len());
        let old = live.swap_remove(i);
        vol.unlink(d, old.as_bytes()).expect("unlink");
        loop {
            let n = name();
            if vol.create(d, n.as_bytes(), 0o644, 0, 0).is_ok() {
                live.push(n);
                break;
            }
        }
    }
    vol.shutdown().expect("shutdown");
}
