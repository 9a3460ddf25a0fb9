//! Sequential read of an NBD export through dxfs's NBD client alone (no volume, no FUSE),
//! to compare with `nbdcopy` from the same server and between `conns=` settings:
//!
//!     cargo run --release --example nbd_seqread -- 'nbd+unix:///?socket=S&conns=4' [MIB] [KIB] [write]
//!
//! Reads MIB MiB (default 1024, at most the export) from the start in KIB pieces
//! (default 128, what FUSE sends: the client's sequential readahead serves them) and
//! prints the rate. With `write`, writes them instead (overwriting the export!), each
//! batch of 64 pieces in flight at once as the log's home writes go (`write_many`),
//! then flushes.

use std::time::Instant;

use dxfs::block::{BlockDevice, NbdDevice};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let fail = |msg: String| -> ! {
        eprintln!("nbd_seqread: {msg}");
        std::process::exit(1)
    };
    let Some(uri) = args.get(1) else { fail("usage: nbd_seqread URI [MIB] [KIB] [write]".into()) };
    let write = match args.get(4).map(String::as_str) {
        None => false,
        Some("write") => true,
        Some(x) => fail(format!("unknown mode {x:?} (want write)")),
    };
    let num = |i: usize, default: u64| -> u64 {
        args.get(i).map_or(default, |s| s.parse().unwrap_or_else(|_| fail(format!("not a number: {s}"))))
    };
    let (mib, kib) = (num(2, 1024), num(3, 128));
    if kib == 0 || kib % 4 != 0 {
        fail("KIB must be a positive multiple of 4".into());
    }
    let dev = NbdDevice::open(uri, !write).unwrap_or_else(|e| fail(e.to_string()));
    let total = (mib << 20).min(dev.block_count() * 4096) / (kib << 10) * (kib << 10);
    let mut buf = vec![0x5au8; (kib << 10) as usize];
    let t0 = Instant::now();
    let mut off = 0;
    while off < total {
        if write {
            let n = ((total - off) / buf.len() as u64).min(64);
            let reqs: Vec<(u64, &[u8])> = (0..n).map(|i| ((off + i * buf.len() as u64) / 4096, &buf[..])).collect();
            dev.write_many(&reqs).unwrap_or_else(|e| fail(e.to_string()));
            off += n * buf.len() as u64;
        } else {
            dev.read(off / 4096, &mut buf).unwrap_or_else(|e| fail(e.to_string()));
            off += buf.len() as u64;
        }
    }
    if write {
        dev.flush().unwrap_or_else(|e| fail(e.to_string()));
    }
    let s = t0.elapsed().as_secs_f64();
    println!(
        "{} connection(s), {} MiB {} in {s:.3} s: {:.0} MiB/s",
        dev.connections(),
        total >> 20,
        if write { "written" } else { "read" },
        (total >> 20) as f64 / s
    );
}
