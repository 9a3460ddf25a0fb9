//! Sequential read of an NBD export through dxfs's NBD client alone (no volume, no FUSE),
//! to compare with `nbdcopy` from the same server and between `conns=` settings:
//!
//!     cargo run --release --example nbd_seqread -- 'nbd+unix:///?socket=S&conns=4' [MIB] [READ_KIB]
//!
//! Reads MIB MiB (default 1024, at most the export) from the start in READ_KIB pieces
//! (default 128, what FUSE sends: the client's sequential readahead serves them) and
//! prints the rate.

use std::time::Instant;

use dxfs::block::{BlockDevice, NbdDevice};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let fail = |msg: String| -> ! {
        eprintln!("nbd_seqread: {msg}");
        std::process::exit(1)
    };
    let Some(uri) = args.get(1) else { fail("usage: nbd_seqread URI [MIB] [READ_KIB]".into()) };
    let num = |i: usize, default: u64| -> u64 {
        args.get(i).map_or(default, |s| s.parse().unwrap_or_else(|_| fail(format!("not a number: {s}"))))
    };
    let (mib, kib) = (num(2, 1024), num(3, 128));
    if kib == 0 || kib % 4 != 0 {
        fail("READ_KIB must be a positive multiple of 4".into());
    }
    let dev = NbdDevice::open(uri, true).unwrap_or_else(|e| fail(e.to_string()));
    let total = (mib << 20).min(dev.block_count() * 4096) / (kib << 10) * (kib << 10);
    let mut buf = vec![0u8; (kib << 10) as usize];
    let t0 = Instant::now();
    let mut off = 0;
    while off < total {
        dev.read(off / 4096, &mut buf).unwrap_or_else(|e| fail(e.to_string()));
        off += buf.len() as u64;
    }
    let s = t0.elapsed().as_secs_f64();
    println!(
        "{} connection(s), {} MiB in {s:.3} s: {:.0} MiB/s",
        dev.connections(),
        total >> 20,
        (total >> 20) as f64 / s
    );
}
