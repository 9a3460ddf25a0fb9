//! Directory quotas (issue 40 item 5, FORMAT.md §7.4): EDQUOT at the write that would
//! pass a limit and never past it, nested limits, deletions that give room back within
//! the same delta, EXDEV between quotas, limits that survive a reopen and go with their
//! directory, a random workload judged against the counters, and fsck clean at the end.

mod common;

use std::sync::Arc;

use common::*;
use dxfs::block::MemDevice;
use dxfs::{Error, OpenOptions, RenameFlags, Volume, XattrMode, BLOCK_SIZE, QUOTA_XATTR};
use proptest::prelude::*;

const B: u64 = BLOCK_SIZE as u64;

fn mkdir(vol: &Volume, parent: u64, name: &str) -> u64 {
    vol.mkdir(parent, name.as_bytes(), 0o755, 0, 0).unwrap().ino
}

fn create(vol: &Volume, parent: u64, name: &str) -> u64 {
    vol.create(parent, name.as_bytes(), 0o644, 0, 0).unwrap().ino
}

/// Bytes allocated by `dir` and below it, as its counters and its own attributes say
/// after a commit.
fn allocated(vol: &Volume, dir: u64) -> u64 {
    vol.sync().unwrap();
    vol.rstat(dir).unwrap().unwrap().blocks * B + vol.getattr(dir).unwrap().blocks * 512
}

/// Writes into a directory under a 1 MiB quota stop with EDQUOT, at the limit less at
/// most one write's worst case, and the subtree never holds more than the limit; what
/// was written reads back; a deletion gives the room back at once.
#[test]
fn writes_stop_at_the_limit_with_edquot() {
    let (dev, vol) = mem_volume(16384);
    let root = vol.root();
    let q = mkdir(&vol, root, "q");
    vol.set_quota(q, Some(1 << 20)).unwrap();
    assert_eq!(vol.quota(q).unwrap().unwrap().limit, 1 << 20);
    let f = create(&vol, q, "f");
    let chunk = vec![7u8; 64 << 10];
    let (reached, e) = write_until_error(&vol, f, 0, &chunk);
    assert!(matches!(e, Error::QuotaExceeded), "{e:?}");
    assert_eq!(e.errno(), libc::EDQUOT);
    let used = allocated(&vol, q);
    assert!(used <= 1 << 20, "the subtree holds {used} bytes, past its limit");
    // Early by at most one write's worst case (its pages and their extent-map blocks).
    assert!(reached + chunk.len() as u64 + 8 * B > 1 << 20, "stopped at {reached}");
    assert_eq!(vol.read(f, 0, reached as usize).unwrap(), vec![7u8; reached as usize]);
    // Single blocks fill what is left, up to one single-block write's worst case: its
    // page and, first in a delta, extent-map blocks (2 · depth + 5, depth ≤ 1 here).
    let (more, e) = write_until_error(&vol, f, reached, &[1u8; 4096]);
    assert!(matches!(e, Error::QuotaExceeded));
    let used = allocated(&vol, q);
    assert!(used <= 1 << 20);
    assert!(used + 8 * B >= 1 << 20, "{more}: room was left unused: {used}");
    // Outside the quota, writes go on.
    let g = create(&vol, root, "g");
    vol.write(g, 0, &chunk).unwrap();
    // A deletion in the same delta makes room again without a sync first.
    vol.unlink(q, b"f").unwrap();
    let h = create(&vol, q, "h");
    vol.write(h, 0, &vec![3u8; 512 << 10]).unwrap();
    // Creating names, xattrs and directories is charged too.
    let (_, e) = write_until_error(&vol, h, 512 << 10, &chunk);
    assert!(matches!(e, Error::QuotaExceeded));
    let mut made = 0;
    let e = loop {
        match vol.mkdir(q, format!("d{made}").as_bytes(), 0o755, 0, 0) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 100_000, "mkdir never hit the quota");
    };
    assert!(matches!(e, Error::QuotaExceeded), "{e:?}");
    assert!(allocated(&vol, q) <= 1 << 20);
    close_and_check(dev, vol);
}

/// A quota inside a quota: each limits its own subtree, the outer one the sum.
#[test]
fn nested_quotas_each_hold() {
    let (dev, vol) = mem_volume(16384);
    let root = vol.root();
    let outer = mkdir(&vol, root, "outer");
    let inner = mkdir(&vol, outer, "inner");
    let deep = mkdir(&vol, inner, "deep");
    vol.set_quota(outer, Some(2 << 20)).unwrap();
    vol.set_quota(inner, Some(1 << 20)).unwrap();
    let chunk = vec![1u8; 32 << 10];
    let a = create(&vol, deep, "a");
    let (_, e) = write_until_error(&vol, a, 0, &chunk);
    assert!(matches!(e, Error::QuotaExceeded));
    assert!(allocated(&vol, inner) <= 1 << 20);
    let b = create(&vol, outer, "b");
    let (_, e) = write_until_error(&vol, b, 0, &chunk);
    assert!(matches!(e, Error::QuotaExceeded));
    let (o, i) = (allocated(&vol, outer), allocated(&vol, inner));
    assert!(o <= 2 << 20 && i <= 1 << 20, "outer {o}, inner {i}");
    assert!(o > (3 << 20) / 2, "the outer quota stopped early: {o}");
    // Clearing the inner limit leaves the outer one.
    vol.set_quota(inner, None).unwrap();
    assert!(vol.quota(inner).unwrap().is_none());
    let (_, e) = write_until_error(&vol, a, 1 << 20, &chunk);
    assert!(matches!(e, Error::QuotaExceeded));
    assert!(allocated(&vol, outer) <= 2 << 20);
    close_and_check(dev, vol);
}

/// Rename and link between directories under different quotas fail with EXDEV (mv then
/// copies); within one quota, and between unlimited directories, they work.
#[test]
fn moves_across_quotas_are_exdev() {
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    let q1 = mkdir(&vol, root, "q1");
    let q2 = mkdir(&vol, root, "q2");
    let free = mkdir(&vol, root, "free");
    let sub = mkdir(&vol, q1, "sub");
    vol.set_quota(q1, Some(1 << 20)).unwrap();
    vol.set_quota(q2, Some(1 << 20)).unwrap();
    let f = create(&vol, q1, "f");
    let none = RenameFlags::default();
    for (to, name) in [(q2, "f"), (free, "f"), (root, "f")] {
        let e = vol.rename(q1, b"f", to, name.as_bytes(), none).unwrap_err();
        assert!(matches!(e, Error::CrossDevice), "{e:?}");
        assert_eq!(e.errno(), libc::EXDEV);
        assert!(matches!(vol.link(f, to, b"l"), Err(Error::CrossDevice)));
    }
    vol.rename(q1, b"f", sub, b"f2", none).unwrap();
    vol.link(f, q1, b"f3").unwrap();
    assert!(matches!(vol.rename(root, b"free", q1, b"free", none), Err(Error::CrossDevice)));
    // A quota root itself moves freely between directories outside any quota.
    vol.rename(root, b"q2", free, b"q2", none).unwrap();
    vol.write(create(&vol, q2, "x"), 0, &[1u8; 8192]).unwrap();
    close_and_check(dev, vol);
}

/// A limit is stored with its directory: it survives a reopen, its use is read from the
/// counters, and it goes with the directory when that is removed.
#[test]
fn limits_survive_reopen_and_go_with_their_directory() {
    let dev = Arc::new(MemDevice::new(16384));
    dxfs::mkfs(dev.clone(), &dxfs::MkfsOptions::default()).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let root = vol.root();
    let q = mkdir(&vol, root, "q");
    vol.write(create(&vol, q, "before"), 0, &vec![1u8; 300 << 10]).unwrap();
    // Set through the virtual xattr, as `setfattr` would.
    vol.setxattr(q, QUOTA_XATTR.as_bytes(), b"1048576", XattrMode::Any).unwrap();
    assert_eq!(vol.getxattr(q, QUOTA_XATTR.as_bytes()).unwrap(), b"1048576");
    assert!(matches!(vol.getxattr(root, QUOTA_XATTR.as_bytes()), Err(Error::NoData)));
    assert!(matches!(vol.setxattr(q, QUOTA_XATTR.as_bytes(), b"lots", XattrMode::Any), Err(Error::Invalid(_))));
    let used = vol.quota(q).unwrap().unwrap().used;
    assert!(used >= 300 << 10, "use {used} counts what was there before the limit");
    vol.close().unwrap();
    assert_clean(dev.clone());

    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let q = vol.lookup(root, b"q").unwrap().ino;
    assert_eq!(vol.quota(q).unwrap().unwrap().limit, 1 << 20);
    let f = create(&vol, q, "after");
    let (reached, e) = write_until_error(&vol, f, 0, &[2u8; 4096]);
    assert!(matches!(e, Error::QuotaExceeded));
    assert!(reached <= (1 << 20) - (300 << 10), "reached {reached}: the old data was not counted");
    assert!(allocated(&vol, q) <= 1 << 20);
    // Emptied and removed, its number taken again by a new directory: no limit there.
    vol.unlink(q, b"before").unwrap();
    vol.unlink(q, b"after").unwrap();
    vol.rmdir(root, b"q").unwrap();
    let n = mkdir(&vol, root, "n");
    assert!(vol.quota(n).unwrap().is_none());
    vol.write(create(&vol, n, "big"), 0, &vec![1u8; 2 << 20]).unwrap();
    vol.removexattr(n, QUOTA_XATTR.as_bytes()).unwrap_err();
    close_and_check(dev, vol);
}

/// Four threads write into one quota at once, each its own file: the charges are taken
/// under one lock, so together they never pass the limit, and each ends with EDQUOT.
#[test]
fn concurrent_writers_share_one_limit() {
    let (dev, vol) = mem_volume(16384);
    let vol = Arc::new(vol);
    let q = mkdir(&vol, vol.root(), "q");
    vol.set_quota(q, Some(8 << 20)).unwrap();
    let files: Vec<u64> = (0..4).map(|k| create(&vol, q, &format!("f{k}"))).collect();
    let written: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = files
            .iter()
            .map(|&f| {
                let vol = vol.clone();
                s.spawn(move || {
                    let (reached, e) = write_until_error(&vol, f, 0, &[4u8; 16 << 10]);
                    assert!(matches!(e, Error::QuotaExceeded), "{e:?}");
                    reached
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let total: u64 = written.iter().sum();
    let used = allocated(&vol, q);
    assert!(used <= 8 << 20, "four writers together hold {used} bytes");
    assert!(total > 7 << 20, "stopped early: {total} bytes written");
    for (&f, &n) in files.iter().zip(&written) {
        assert_eq!(vol.getattr(f).unwrap().size, n);
    }
    let vol = Arc::into_inner(vol).unwrap();
    close_and_check(dev, vol);
}

/// An import (`dxfs cp -a`, `dxfs import`) into a quota stops with EDQUOT at an entry,
/// which is then absent: each entry is one charge, whole or not made.
#[test]
fn an_import_stops_whole_at_the_limit() {
    let (dev, vol) = mem_volume(16384);
    let q = mkdir(&vol, vol.root(), "q");
    vol.set_quota(q, Some(1 << 20)).unwrap();
    let caller = dxfs::Caller::default();
    let data = vec![6u8; 40 << 10];
    let mut made = 0;
    let e = loop {
        let name = format!("e{made}");
        let e = dxfs::NewEntry {
            name: name.as_bytes(),
            mode: libc::S_IFREG | 0o644,
            uid: u32::MAX,
            gid: u32::MAX,
            rdev: 0,
            atime: (1, 0),
            mtime: (1, 0),
            data: &data,
            xattrs: &[],
        };
        match vol.import_entry(q, &e, &caller) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(made < 1000);
    };
    assert!(matches!(e, Error::QuotaExceeded), "{e:?}");
    assert!(matches!(vol.lookup(q, format!("e{made}").as_bytes()), Err(Error::NotFound)));
    assert!(made >= 20, "only {made} entries of 40 KiB in 1 MiB");
    for k in 0..made {
        let ino = vol.lookup(q, format!("e{k}").as_bytes()).unwrap().ino;
        assert_eq!(vol.read(ino, 0, 1 << 20).unwrap(), data);
    }
    assert!(allocated(&vol, q) <= 1 << 20);
    close_and_check(dev, vol);
}

/// A file with no link still takes its blocks: one unlinked while open, and an
/// O_TMPFILE, stay charged to the quota they were below (the counters count them
/// nowhere), across commits, until they are freed; an O_TMPFILE links only under the
/// quota it was made below.
#[test]
fn files_without_a_link_stay_charged() {
    let (dev, vol) = mem_volume(16384);
    let root = vol.root();
    let q = mkdir(&vol, root, "q");
    let other = mkdir(&vol, root, "other");
    vol.set_quota(q, Some(1 << 20)).unwrap();
    vol.set_quota(other, Some(1 << 20)).unwrap();
    // Unlinked while open: its 600 KiB still count after a commit.
    let f = create(&vol, q, "f");
    vol.open_file(f).unwrap();
    vol.write(f, 0, &vec![1u8; 600 << 10]).unwrap();
    vol.unlink(q, b"f").unwrap();
    vol.sync().unwrap();
    let used = vol.quota(q).unwrap().unwrap().used;
    assert!(used >= 600 << 10, "an open unlinked file's blocks left the quota: {used}");
    let g = create(&vol, q, "g");
    let (reached, e) = write_until_error(&vol, g, 0, &[2u8; 4096]);
    assert!(matches!(e, Error::QuotaExceeded));
    assert!(reached <= 424 << 10, "{reached} bytes beside 600 KiB held open under 1 MiB");
    // Writes into the unlinked file are charged too.
    let (_, e) = write_until_error(&vol, f, 600 << 10, &[1u8; 4096]);
    assert!(matches!(e, Error::QuotaExceeded));
    // Its last release frees it, and the room comes back.
    vol.release(f).unwrap();
    vol.sync().unwrap();
    vol.write(g, reached, &vec![2u8; 400 << 10]).unwrap();
    vol.unlink(q, b"g").unwrap();
    // An O_TMPFILE below the quota: charged, and linked only below it.
    let n = dxfs::NewNode { mode: libc::S_IFREG | 0o600, uid: 0, gid: 0, rdev: 0, umask: 0 };
    let t = vol.make_tmpfile(q, n).unwrap().ino;
    let (written, e) = write_until_error(&vol, t, 0, &[3u8; 64 << 10]);
    assert!(matches!(e, Error::QuotaExceeded));
    vol.sync().unwrap();
    assert!(vol.quota(q).unwrap().unwrap().used >= written);
    assert!(matches!(vol.link(t, other, b"t"), Err(Error::CrossDevice)));
    assert!(matches!(vol.link(t, root, b"t"), Err(Error::CrossDevice)));
    vol.link(t, q, b"t").unwrap();
    vol.release(t).unwrap();
    assert!(allocated(&vol, q) <= 1 << 20);
    assert!(allocated(&vol, q) >= written);
    close_and_check(dev, vol);
}

/// A volume made without the counters has no quotas to set.
#[test]
fn no_quota_without_counters() {
    let dev = Arc::new(MemDevice::new(4096));
    let o = dxfs::MkfsOptions { rstats: false, ..Default::default() };
    dxfs::mkfs(dev.clone(), &o).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let d = mkdir(&vol, vol.root(), "d");
    assert!(matches!(vol.set_quota(d, Some(1 << 20)), Err(Error::NotSupported)));
    close_and_check(dev, vol);
}

/// One step of the random workload.
#[derive(Clone, Debug)]
enum Step {
    /// Write `blocks` blocks at block `at` of file `file` in directory `dir`.
    Write {
        dir: usize,
        file: usize,
        at: u64,
        blocks: u64,
    },
    Unlink {
        dir: usize,
        file: usize,
    },
    Truncate {
        dir: usize,
        file: usize,
        blocks: u64,
    },
    Sync,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..3usize, 0..4usize, 0..64u64, 1..48u64).prop_map(|(dir, file, at, blocks)| Step::Write { dir, file, at, blocks }),
        1 => (0..3usize, 0..4usize).prop_map(|(dir, file)| Step::Unlink { dir, file }),
        1 => (0..3usize, 0..4usize, 0..32u64).prop_map(|(dir, file, blocks)| Step::Truncate { dir, file, blocks }),
        1 => Just(Step::Sync),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random writes, truncates and unlinks in three directories, two of them (one inside
    /// the other) under quotas. After every step, committed: no subtree holds more than
    /// its limit. A write refused with EDQUOT would not have fitted: the exact use plus
    /// the blocks it would newly allocate passes a limit (less the worst case of its
    /// extent-map blocks, which a write may need).
    #[test]
    fn no_subtree_passes_its_limit(steps in proptest::collection::vec(step(), 1..60)) {
        let (dev, vol) = mem_volume(8192);
        let root = vol.root();
        let outer = mkdir(&vol, root, "outer");
        let inner = mkdir(&vol, outer, "inner");
        let free = mkdir(&vol, root, "free");
        let dirs = [outer, inner, free];
        let (lo, li) = (96 * B, 48 * B);
        vol.set_quota(outer, Some(lo)).unwrap();
        vol.set_quota(inner, Some(li)).unwrap();
        let name = |f: usize| format!("f{f}");
        for s in steps {
            match s {
                Step::Write { dir, file, at, blocks } => {
                    let d = dirs[dir];
                    let ino = match vol.lookup(d, name(file).as_bytes()) {
                        Ok(a) => a.ino,
                        Err(_) => match vol.create(d, name(file).as_bytes(), 0o644, 0, 0) {
                            Ok(a) => a.ino,
                            Err(Error::QuotaExceeded) => continue,
                            Err(e) => panic!("{e:?}"),
                        },
                    };
                    // Blocks of the range not allocated yet, counted before the write.
                    vol.sync().unwrap();
                    let before = vol.getattr(ino).unwrap().blocks / 8;
                    match vol.write(ino, at * B, &vec![5u8; (blocks * B) as usize]) {
                        Ok(_) => {}
                        Err(Error::QuotaExceeded) => {
                            prop_assert!(dir != 2, "EDQUOT outside any quota");
                            // It would have taken at most `blocks` new blocks and their
                            // extent-map blocks.
                            let used = |q| allocated(&vol, q);
                            let most = (blocks + 8) * B;
                            let over = used(outer) + most > lo || (dir == 1 && used(inner) + most > li);
                            prop_assert!(over, "EDQUOT with room: outer {} inner {} file {before} blocks",
                                used(outer), used(inner));
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                }
                Step::Unlink { dir, file } => {
                    let _ = vol.unlink(dirs[dir], name(file).as_bytes());
                }
                Step::Truncate { dir, file, blocks } => {
                    if let Ok(a) = vol.lookup(dirs[dir], name(file).as_bytes()) {
                        let s = dxfs::SetAttr { size: Some(blocks * B), ..Default::default() };
                        match vol.setattr(a.ino, &s) {
                            Ok(_) | Err(Error::QuotaExceeded) => {}
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                }
                Step::Sync => vol.sync().unwrap(),
            }
            prop_assert!(allocated(&vol, outer) <= lo, "outer holds {}", allocated(&vol, outer));
            prop_assert!(allocated(&vol, inner) <= li, "inner holds {}", allocated(&vol, inner));
        }
        close_and_check(dev, vol);
    }
}
