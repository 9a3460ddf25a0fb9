//! Xattrs (seed 001): a property test against a model, 64 KiB values, identical lists
//! shared with reference counts, and the bloom filter answering misses without reading
//! xattr blocks.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use dxfs::block::MemDevice;
use dxfs::XattrMode;
use dxfs::{Error, OpenOptions, Volume};
use proptest::prelude::*;

// ACL names carry validated values; posix_acls_and_mode_stay_in_step covers them.
const NAMES: &[&[u8]] = &[b"user.a", b"user.bb", b"trusted.t", b"security.selinux", b"trusted.other", b"user.c"];

#[derive(Clone, Debug)]
enum Op {
    Set { f: usize, n: usize, len: usize, mode: u8 },
    Remove { f: usize, n: usize },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..4, 0usize..NAMES.len(), prop_oneof![0usize..40, 40usize..5000, 5000usize..70_000], 0u8..3)
            .prop_map(|(f, n, len, mode)| Op::Set { f, n, len, mode }),
        3 => (0usize..4, 0usize..NAMES.len()).prop_map(|(f, n)| Op::Remove { f, n }),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn xattrs_match_a_model(ops in proptest::collection::vec(op(), 1..40)) {
        let (dev, mut vol) = mem_volume(16_384);
        let root = vol.root();
        let files: Vec<u64> = (0..4).map(|i| vol.create(root, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
        let mut model: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = vec![BTreeMap::new(); 4];
        for op in &ops {
            match op {
                Op::Set { f, n, len, mode } => {
                    let name = NAMES[*n];
                    // Lists of equal content on different files share a block.
                    let value = vec![(*n as u8).wrapping_mul(31); *len];
                    let m = [XattrMode::Any, XattrMode::Create, XattrMode::Replace][*mode as usize];
                    let r = vol.setxattr(files[*f], name, &value, m);
                    let exists = model[*f].contains_key(name);
                    let total: usize = model[*f].iter().filter(|(k, _)| k.as_slice() != name).map(|(k, v)| k.len() + v.len() + 6).sum::<usize>() + name.len() + value.len();
                    let want = match m {
                        _ if *len > 65536 => Err(libc::E2BIG),
                        XattrMode::Create if exists => Err(libc::EEXIST),
                        XattrMode::Replace if !exists => Err(libc::ENODATA),
                        _ if total > 68_000 => r.as_ref().map(|_| ()).map_err(|e| e.errno()),
                        _ => Ok(()),
                    };
                    prop_assert_eq!(r.as_ref().map(|_| ()).map_err(|e| e.errno()), want, "{:?}", op);
                    if r.is_ok() {
                        model[*f].insert(name.to_vec(), value);
                    }
                }
                Op::Remove { f, n } => {
                    let r = vol.removexattr(files[*f], NAMES[*n]);
                    let want = if model[*f].remove(NAMES[*n]).is_some() { Ok(()) } else { Err(libc::ENODATA) };
                    prop_assert_eq!(r.map_err(|e| e.errno()), want);
                }
                Op::Reopen => {
                    vol.close().unwrap();
                    assert_clean(dev.clone());
                    vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
                }
            }
            for (k, f) in files.iter().enumerate() {
                let mut names = vol.listxattr(*f).unwrap();
                names.sort();
                prop_assert_eq!(names, model[k].keys().cloned().collect::<Vec<_>>());
                for name in NAMES {
                    match (vol.getxattr(*f, name), model[k].get(*name)) {
                        (Ok(v), Some(w)) => prop_assert_eq!(&v, w),
                        (Err(Error::NoData), None) => {}
                        (got, want) => prop_assert!(false, "{:?}: got {:?}, want {:?}", String::from_utf8_lossy(name), got.map(|v| v.len()), want.map(|v| v.len())),
                    }
                }
            }
        }
        close_and_check(dev, vol);
    }
}

#[test]
fn values_up_to_64k_and_limits() {
    let (dev, vol) = mem_volume(8192);
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let big: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    vol.setxattr(f, b"user.big", &big, XattrMode::Any).unwrap();
    assert!(matches!(vol.setxattr(f, b"user.huge", &vec![0; 65537], XattrMode::Any), Err(Error::TooBig)));
    assert!(matches!(vol.setxattr(f, &[b'u'; 300], b"", XattrMode::Any), Err(Error::Range) | Err(Error::NotSupported)));
    vol.close().unwrap();
    assert_clean(dev.clone());
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    assert_eq!(vol.getxattr(f, b"user.big").unwrap(), big);
    assert_eq!(vol.getattr(f).unwrap().blocks, 8 * 17, "a head block and 16 continuations");
    vol.removexattr(f, b"user.big").unwrap();
    assert_eq!(vol.getattr(f).unwrap().blocks, 0);
    close_and_check(dev, vol);
}

/// Identical lists share one block; a change gives the changed inode its own.
#[test]
fn identical_lists_are_stored_once() {
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    // An ACL with 20 named users: too big for the inode, so it goes to a block.
    let mut entries = vec![
        (dxfs::acl::USER_OBJ, 6, 0),
        (dxfs::acl::GROUP_OBJ, 4, 0),
        (dxfs::acl::MASK, 6, 0),
        (dxfs::acl::OTHER, 0, 0),
    ];
    entries.extend((0..20).map(|u| (dxfs::acl::USER, 4, 1000 + u)));
    let acl = acl(&entries);
    let before = vol.statfs().bfree;
    let files: Vec<u64> = (0..200)
        .map(|i| {
            let f = vol.create(root, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            vol.setxattr(f, b"system.posix_acl_access", &acl, XattrMode::Any).unwrap();
            f
        })
        .collect();
    vol.sync().unwrap();
    let used = before - vol.statfs().bfree;
    // 200 inodes take 14 inode blocks and a few index blocks; 200 private xattr blocks
    // would add 200.
    assert!(used < 40, "{used} blocks for 200 files with one shared list");
    vol.setxattr(files[5], b"user.extra", b"x", XattrMode::Any).unwrap();
    vol.close().unwrap();
    assert_clean(dev.clone()); // fsck checks every reference count
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    assert_eq!(vol.getxattr(files[5], b"user.extra").unwrap(), b"x");
    assert_eq!(vol.getxattr(files[6], b"system.posix_acl_access").unwrap(), acl);
    for f in &files {
        vol.removexattr(*f, b"system.posix_acl_access").unwrap();
    }
    for i in 0..200 {
        vol.unlink(root, format!("f{i}").as_bytes()).unwrap();
    }
    close_and_check(dev, vol);
}

/// A getxattr the filter rules out reads no xattr block; with the filter off, it does.
/// For erofs's one bit per name and for dxfs's default of eleven.
#[test]
fn the_filter_answers_misses_without_reading_xattr_blocks() {
    for k in [1, dxfs::DEFAULT_FILTER_HASHES] {
        filter_misses(k);
    }
}

fn filter_misses(k: u8) {
    let dev = Arc::new(MemDevice::new(16_384));
    dxfs::mkfs(dev.clone(), &dxfs::MkfsOptions { filter_hashes: k, ..Default::default() }).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let root = vol.root();
    let n = 1000;
    let files: Vec<u64> = (0..n)
        .map(|i| {
            let f = vol.create(root, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
            // A private list in a block (user data differs per file).
            vol.setxattr(f, b"user.comment", format!("file number {i} {}", "z".repeat(80)).as_bytes(), XattrMode::Any)
                .unwrap();
            f
        })
        .collect();
    vol.close().unwrap();
    let probe = |use_filter: bool| {
        let vol =
            Volume::open(dev.clone(), OpenOptions { use_xattr_filter: use_filter, ..Default::default() }).unwrap();
        let before = vol.xattr_block_reads();
        for f in &files {
            assert!(matches!(vol.getxattr(*f, b"system.posix_acl_access"), Err(Error::NoData)));
        }
        vol.xattr_block_reads() - before
    };
    let with = probe(true);
    let without = probe(false);
    assert_eq!(without, n as u64, "without the filter every miss reads the block");
    // One name per inode sets k bits of 32: a miss gets through 1 time in 32 for k = 1,
    // about one in a million for k = 11 (or never, when the two names' bits differ).
    assert!(with <= n as u64 / 16, "k={k}: {with} of {n} misses read xattr storage with the filter on");
    // The volume says how many bits it uses; fsck checks every filter with that count.
    assert_eq!(Volume::open(dev.clone(), OpenOptions::default()).unwrap().superblock().filter_hashes(), u32::from(k));
    assert_clean(dev);
}

fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    dxfs::acl::encode(&entries.iter().map(|&(tag, perm, id)| dxfs::acl::Entry { tag, perm, id }).collect::<Vec<_>>())
}

/// POSIX ACL rules the volume keeps for a FUSE server: mode and ACL in step, minimal
/// ACLs folded into the mode, default ACLs inherited (and the umask ignored then).
#[test]
fn posix_acls_and_mode_stay_in_step() {
    use dxfs::acl::{GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
    use dxfs::{NewNode, SetAttr};
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o600, 0, 0).unwrap().ino;
    // A named-user entry with mask r--: the group bits show the mask.
    let a = acl(&[(USER_OBJ, 6, 0), (USER, 4, 65534), (GROUP_OBJ, 0, 0), (MASK, 4, 0), (OTHER, 0, 0)]);
    vol.setxattr(f, b"system.posix_acl_access", &a, XattrMode::Any).unwrap();
    assert_eq!(vol.getattr(f).unwrap().mode & 0o777, 0o640);
    // chmod rewrites the mask, not the owning group's entry.
    vol.setattr(f, &SetAttr { mode: Some(0o600), ..Default::default() }).unwrap();
    let got = dxfs::acl::decode(&vol.getxattr(f, b"system.posix_acl_access").unwrap()).unwrap();
    assert_eq!(got.iter().find(|e| e.tag == MASK).unwrap().perm, 0);
    assert_eq!(got.iter().find(|e| e.tag == USER).unwrap().perm, 4);
    // A minimal ACL is the mode: stored as mode bits only.
    let g = vol.create(root, b"g", 0o600, 0, 0).unwrap().ino;
    vol.setxattr(
        g,
        b"system.posix_acl_access",
        &acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0), (OTHER, 1, 0)]),
        XattrMode::Any,
    )
    .unwrap();
    assert_eq!(vol.getattr(g).unwrap().mode & 0o777, 0o751);
    assert!(matches!(vol.getxattr(g, b"system.posix_acl_access"), Err(Error::NoData)));
    assert!(matches!(vol.setxattr(g, b"system.posix_acl_access", b"junk", XattrMode::Any), Err(Error::Invalid(_))));
    assert!(vol.setxattr(g, b"system.posix_acl_default", &a, XattrMode::Any).is_err(), "default ACL on a file");
    // Inheritance: a directory with a default ACL.
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let def = acl(&[(USER_OBJ, 7, 0), (USER, 6, 65534), (GROUP_OBJ, 5, 0), (MASK, 7, 0), (OTHER, 5, 0)]);
    vol.setxattr(d, b"system.posix_acl_default", &def, XattrMode::Any).unwrap();
    let c =
        vol.make(d, b"child", NewNode { mode: libc::S_IFREG | 0o666, uid: 0, gid: 0, rdev: 0, umask: 0o077 }).unwrap();
    assert_eq!(c.mode & 0o777, 0o664, "default ACL applies, umask does not");
    let ca = dxfs::acl::decode(&vol.getxattr(c.ino, b"system.posix_acl_access").unwrap()).unwrap();
    assert!(ca.iter().any(|e| e.tag == USER && e.id == 65534 && e.perm == 6));
    assert!(matches!(vol.getxattr(c.ino, b"system.posix_acl_default"), Err(Error::NoData)));
    let sub =
        vol.make(d, b"sub", NewNode { mode: libc::S_IFDIR | 0o777, uid: 0, gid: 0, rdev: 0, umask: 0o022 }).unwrap();
    assert_eq!(vol.getxattr(sub.ino, b"system.posix_acl_default").unwrap(), def, "directories inherit the default");
    // Without a default ACL the umask applies.
    let plain = vol
        .make(root, b"plain", NewNode { mode: libc::S_IFREG | 0o666, uid: 0, gid: 0, rdev: 0, umask: 0o027 })
        .unwrap();
    assert_eq!(plain.mode & 0o777, 0o640);
    close_and_check(dev, vol);
}
