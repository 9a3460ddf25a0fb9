//! Unlink cost of files whose xattrs live in blocks of their own, against the number of
//! such files (issue 12: releasing a block once scanned the whole share index).
//!
//! cargo run --release --example xattr_unlink -- [N...]

use std::sync::Arc;
use std::time::Instant;

use dxfs::block::MemDevice;
use dxfs::{mkfs, MkfsOptions, OpenOptions, Volume, XattrMode};

fn main() {
    let sizes: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![5_000, 10_000, 20_000, 40_000] } else { sizes };
    println!("{:>8} {:>14} {:>14}", "files", "setxattr µs", "unlink µs");
    for n in sizes {
        let dev = Arc::new(MemDevice::new(n * 2 + 65_536));
        mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
        let vol = Volume::open(dev.clone(), OpenOptions::default()).expect("open");
        let root = vol.root();
        let files: Vec<u64> =
            (0..n).map(|i| vol.create(root, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
        let t = Instant::now();
        for (i, f) in files.iter().enumerate() {
            // 64 distinct bytes: too long for the inode with its entry header.
            let value = format!("{i:0>64}");
            vol.setxattr(*f, b"user.v", value.as_bytes(), XattrMode::Any).unwrap();
        }
        let set = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        let t = Instant::now();
        for i in 0..n {
            vol.unlink(root, format!("f{i}").as_bytes()).unwrap();
        }
        let unlink = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        println!("{n:>8} {set:>14.2} {unlink:>14.2}");
        vol.close().expect("close");
        let r = dxfs::fsck::check(dev, false, &mut |_| {}).expect("fsck");
        assert!(r.errors.is_empty(), "fsck: {:#?}", r.errors);
    }
}
