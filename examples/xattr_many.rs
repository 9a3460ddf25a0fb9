//! In-process benchmark of xattr changes on one file as its list grows, no FUSE: what
//! stress-ng's xattr stressor does (names `user.var_N` with short values, set until the
//! list is full, then read and removed).
//!
//! cargo run --release --example xattr_many -- [MAX_NAMES]
//!
//! Prints µs per setxattr for each band of names, then µs per getxattr and per
//! removexattr over the full list, and the device blocks written by the commit.

use std::sync::Arc;
use std::time::Instant;

use dxfs::block::{BlockDevice, MemDevice};
use dxfs::Error;
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume, XattrMode};

fn main() {
    let max: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(4096);
    let dev = Arc::new(MemDevice::new(65536));
    mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let vol = Volume::open(dev.clone(), OpenOptions::default()).expect("open");
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).expect("create").ino;
    let name = |i: usize| format!("user.var_{i}").into_bytes();
    let value = |i: usize| format!("value-{i:08}").into_bytes();
    let mut set = 0;
    let mut band = Instant::now();
    let all = Instant::now();
    println!("names      µs per setxattr");
    while set < max {
        match vol.setxattr(f, &name(set), &value(set), XattrMode::Create) {
            Ok(()) => set += 1,
            Err(Error::TooBig | Error::NoSpace) => break,
            Err(e) => panic!("setxattr {set}: {e}"),
        }
        if set % 512 == 0 {
            println!("{:>5}  {:>14.1}", set, band.elapsed().as_secs_f64() * 1e6 / 512.0);
            band = Instant::now();
        }
    }
    let set_us = all.elapsed().as_secs_f64() * 1e6 / set as f64;
    let w0 = dev.stats().writes;
    vol.sync().expect("sync");
    let written = dev.stats().writes - w0;
    let t = Instant::now();
    for i in 0..set {
        assert_eq!(vol.getxattr(f, &name(i)).expect("getxattr"), value(i));
    }
    let get_us = t.elapsed().as_secs_f64() * 1e6 / set as f64;
    let t = Instant::now();
    for i in 0..set {
        vol.removexattr(f, &name(i)).expect("removexattr");
    }
    let rm_us = t.elapsed().as_secs_f64() * 1e6 / set as f64;
    println!("{set} names (the list full at {set}): setxattr {set_us:.1} µs, getxattr {get_us:.1} µs, removexattr {rm_us:.1} µs on average; the sync wrote {written} blocks");
}
