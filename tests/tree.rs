//! Whole-tree removal in the library (`Volume::empty_step`, `Volume::remove_tree`) and
//! the caller's permission rules it applies (`unlink_as`, `rmdir_as`): compared with a
//! model of the kernel's rules, stepped in small pieces, and cut at every write; and
//! entries made whole as a caller (`Volume::import_entry`, what `dxfs cp -a` sends).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use common::*;
use dxfs::block::{CrashMode, FaultDevice, MemDevice};
use dxfs::{Caller, Error, MkfsOptions, NewEntry, OpenOptions, SetAttr, Volume, XattrMode};

fn user(uid: u32) -> Caller {
    Caller { uid, gid: uid, groups: Vec::new() }
}

fn chmod(vol: &Volume, ino: u64, mode: u32) {
    vol.setattr(ino, &SetAttr { mode: Some(mode), ..SetAttr::default() }).unwrap();
}

#[test]
fn unlink_as_follows_the_kernels_rules() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    chmod(&vol, root, 0o777);
    // A directory of user 1000, and one of root that others may not write.
    let mine = vol.mkdir(root, b"mine", 0o755, 1000, 1000).unwrap().ino;
    let closed = vol.mkdir(root, b"closed", 0o755, 0, 0).unwrap().ino;
    let tmp = vol.mkdir(root, b"tmp", 0o1777, 0, 0).unwrap().ino;
    for d in [mine, closed, tmp] {
        vol.create(d, b"of-1000", 0o644, 1000, 1000).unwrap();
        vol.create(d, b"of-2000", 0o644, 2000, 2000).unwrap();
    }
    let u = user(1000);
    // Write and search on the directory decide, not the file's owner.
    vol.unlink_as(mine, b"of-2000", &u).unwrap();
    assert!(matches!(vol.unlink_as(closed, b"of-1000", &u), Err(Error::AccessDenied)));
    // Sticky: only the owner of the file or of the directory.
    assert!(matches!(vol.unlink_as(tmp, b"of-2000", &u), Err(Error::NotPermitted)));
    vol.unlink_as(tmp, b"of-1000", &u).unwrap();
    vol.unlink_as(tmp, b"of-2000", &user(0)).unwrap();
    // Group write through the mode, and a named user's entry in an ACL.
    chmod(&vol, closed, 0o775);
    assert!(vol.unlink_as(closed, b"of-1000", &Caller { uid: 1000, gid: 7, groups: vec![0] }).is_ok());
    chmod(&vol, closed, 0o755);
    let acl = dxfs::acl::encode(&[
        dxfs::acl::Entry { tag: dxfs::acl::USER_OBJ, perm: 7, id: u32::MAX },
        dxfs::acl::Entry { tag: dxfs::acl::USER, perm: 3, id: 1000 },
        dxfs::acl::Entry { tag: dxfs::acl::GROUP_OBJ, perm: 5, id: u32::MAX },
        dxfs::acl::Entry { tag: dxfs::acl::MASK, perm: 7, id: u32::MAX },
        dxfs::acl::Entry { tag: dxfs::acl::OTHER, perm: 5, id: u32::MAX },
    ]);
    vol.setxattr(closed, b"system.posix_acl_access", &acl, XattrMode::Any).unwrap();
    vol.unlink_as(closed, b"of-2000", &u).unwrap();
    // rmdir as well.
    let sub = vol.mkdir(tmp, b"sub", 0o755, 2000, 2000).unwrap();
    assert!(matches!(vol.rmdir_as(tmp, b"sub", &u), Err(Error::NotPermitted)));
    assert!(vol.lookup(tmp, b"sub").unwrap().ino == sub.ino);
    vol.rmdir_as(tmp, b"sub", &user(2000)).unwrap();
    close_and_check(dev, vol);
}

/// Empty a directory in steps of a few entries and a small reply: every entry is met
/// exactly once (removed, reported as a subdirectory, or failed), and the failures are
/// exactly what the sticky rule refuses.
#[test]
fn empty_steps_meet_each_entry_once() {
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    let d = vol.mkdir(root, b"d", 0o1777, 0, 0).unwrap().ino;
    let mut want_failed = BTreeSet::new();
    let mut want_subdirs = BTreeSet::new();
    let mut want_removed = BTreeSet::new();
    for i in 0..600u32 {
        let name = format!("entry-{i:04}-{}", "x".repeat((i % 40) as usize));
        let owner = if i % 7 == 0 { 2000 } else { 1000 };
        if i % 11 == 0 {
            vol.mkdir(d, name.as_bytes(), 0o755, owner, owner).unwrap();
            want_subdirs.insert(name);
        } else if i % 13 == 0 {
            vol.symlink(d, name.as_bytes(), b"target", owner, owner).unwrap();
            (if owner == 2000 { &mut want_failed } else { &mut want_removed }).insert(name);
        } else {
            vol.create(d, name.as_bytes(), 0o644, owner, owner).unwrap();
            (if owner == 2000 { &mut want_failed } else { &mut want_removed }).insert(name);
        }
    }
    let (mut removed, mut subdirs, mut failed) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    let mut pos = 0;
    let mut steps = 0;
    loop {
        let s = vol.empty_step(d, &user(1000), pos, 7, 200).unwrap();
        steps += 1;
        assert!(steps < 10_000, "no progress");
        let reported: usize =
            s.subdirs.iter().map(|(n, _)| n).chain(s.failed.iter().map(|(n, _)| n)).map(|n| n.len() + 8).sum();
        assert!(reported <= 200, "a step reported {reported} bytes of names");
        for (n, _, _) in s.removed {
            assert!(removed.insert(String::from_utf8(n).unwrap()), "removed twice");
        }
        for (n, _) in s.subdirs {
            assert!(subdirs.insert(String::from_utf8(n).unwrap()), "subdirectory reported twice");
        }
        for (n, e) in s.failed {
            assert!(matches!(e, Error::NotPermitted), "{e}");
            assert!(failed.insert(String::from_utf8(n).unwrap()), "failure reported twice");
        }
        pos = s.next;
        if s.done {
            break;
        }
    }
    assert_eq!(removed, want_removed);
    assert_eq!(subdirs, want_subdirs);
    assert_eq!(failed, want_failed);
    let left: BTreeSet<String> = vol
        .readdir(d, 0, 10_000)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .filter(|n| n != "." && n != "..")
        .collect();
    assert_eq!(left, &want_subdirs | &want_failed);
    close_and_check(dev, vol);
}

#[test]
fn remove_tree_removes_what_it_may_and_names_the_rest() {
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    chmod(&vol, root, 0o777);
    let top = vol.mkdir(root, b"top", 0o755, 1000, 1000).unwrap().ino;
    let outside = vol.mkdir(root, b"outside", 0o755, 0, 0).unwrap().ino;
    let mut dirs = vec![top];
    for i in 0..40u32 {
        let parent = dirs[(i as usize * 7) % dirs.len()];
        let sub = vol.mkdir(parent, format!("dir{i}").as_bytes(), 0o755, 1000, 1000).unwrap().ino;
        dirs.push(sub);
        for j in 0..25u32 {
            let f = vol.create(sub, format!("f{j}").as_bytes(), 0o644, 1000, 1000).unwrap().ino;
            vol.write(f, 0, &vec![j as u8; (j as usize) * 300]).unwrap();
            if j == 3 {
                vol.setxattr(f, b"user.k", b"v", XattrMode::Any).unwrap();
                // A second name outside the tree keeps the file.
                vol.link(f, outside, format!("keep{i}").as_bytes()).unwrap();
            }
        }
    }
    // One directory the caller may not write: its file stays, and so do its ancestors.
    let locked = vol.mkdir(dirs[5], b"locked", 0o755, 2000, 2000).unwrap().ino;
    vol.create(locked, b"stays", 0o644, 2000, 2000).unwrap();
    vol.sync().unwrap();
    let under_top = |d: &Dump| -> BTreeSet<String> { d.keys().filter(|p| p.starts_with("/top/")).cloned().collect() };
    let before = under_top(&dump(&vol));
    let mut seen = Vec::new();
    let r = vol.remove_tree(root, b"top", &user(1000), &mut |n| seen.push(n)).unwrap();
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "progress went back");
    let failed: Vec<_> = r.failed.iter().map(|(p, e)| (String::from_utf8_lossy(p).into_owned(), e.errno())).collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].0.starts_with("top/") && failed[0].0.ends_with("/locked/stays"), "{failed:?}");
    assert_eq!(failed[0].1, libc::EACCES);
    // What is left under top is exactly the path to the file that stayed.
    let left = under_top(&dump(&vol));
    let stays = format!("/{}", failed[0].0);
    assert!(left.contains(&stays));
    for p in &left {
        assert!(stays.starts_with(&format!("{p}/")) || *p == stays, "{p} should be gone");
    }
    assert_eq!(r.removed, (before.len() - left.len()) as u64);
    // The files linked from outside are intact, with one link each.
    for i in 0..40 {
        let a = vol.lookup(outside, format!("keep{i}").as_bytes()).unwrap();
        assert_eq!(a.nlink, 1);
        assert_eq!(vol.read(a.ino, 0, 10_000).unwrap(), vec![3u8; 900]);
        assert_eq!(vol.getxattr(a.ino, b"user.k").unwrap(), b"v");
    }
    // As root, the rest goes.
    let r = vol.remove_tree(root, b"top", &user(0), &mut |_| {}).unwrap();
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    assert!(matches!(vol.lookup(root, b"top"), Err(Error::NotFound)));
    close_and_check(dev, vol);
}

/// A removal over many deltas (committed between its steps), cut at every
/// write: each image recovers fsck clean to a part of the tree, every path in it as it
/// was, and no directory without its parent.
#[test]
fn crash_anywhere_in_a_tree_removal_leaves_part_of_the_tree() {
    let base = Arc::new(MemDevice::new(2048));
    dxfs::mkfs(base.clone(), &MkfsOptions { log_blocks: Some(64), ..Default::default() }).unwrap();
    let dev = Arc::new(FaultDevice::new(base.to_bytes()));
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let root = vol.root();
    let top = vol.mkdir(root, b"top", 0o755, 0, 0).unwrap().ino;
    for i in 0..12u32 {
        let sub = vol.mkdir(top, format!("d{i}").as_bytes(), 0o755, 0, 0).unwrap().ino;
        let deeper = vol.mkdir(sub, b"deeper", 0o755, 0, 0).unwrap().ino;
        for j in 0..20u32 {
            let f = vol.create(if j % 2 == 0 { sub } else { deeper }, format!("f{j}").as_bytes(), 0o644, 0, 0).unwrap();
            vol.write(f.ino, 0, &vec![(i * 20 + j) as u8; 100 + j as usize * 50]).unwrap();
        }
    }
    vol.sync().unwrap();
    let before = simple(&dump(&vol));
    let start = dev.events();
    // Commits between the steps too, as the delta's timer would make them.
    vol.remove_tree(root, b"top", &user(0), &mut |_| vol.sync().unwrap()).unwrap();
    vol.sync().unwrap();
    let after = simple(&dump(&vol));
    drop(vol);
    every_cut(&dev, start, |at, got| {
        for (p, v) in got {
            assert_eq!(before.get(p), Some(v), "{at}: {p} is not as it was");
            if let Some((parent, _)) = p.rsplit_once('/') {
                assert!(parent.is_empty() || got.contains_key(parent), "{at}: {p} without its parent");
            }
        }
        assert!(after.keys().all(|p| got.contains_key(p)));
    });
}

/// Cut the writes from event `start` on at every point, keeping all of them or only the
/// flushed ones (more than 100, or the test means nothing): each image must recover
/// (fsck clean), and `check` gets where it was cut and what it holds.
fn every_cut(dev: &FaultDevice, start: usize, mut check: impl FnMut(&str, &BTreeMap<String, String>)) {
    let n = dev.events();
    assert!(n - start > 100, "too few writes to mean anything: {}", n - start);
    for mode in [CrashMode::All, CrashMode::DropUnflushed] {
        for at in start..=n {
            let got = simple(&recover(dev.crash_image(at, mode)).unwrap_or_else(|e| panic!("{mode:?} at {at}: {e}")));
            check(&format!("{mode:?} at {at}"), &got);
        }
    }
}

/// A tar import over many deltas (hard links across directories among its entries, so
/// link records and counting directories are written too), cut at every write: each
/// image recovers fsck clean, which checks the recursive counters exactly, and holds a
/// prefix of the archive's tree.
#[test]
fn crash_anywhere_in_a_tar_import_leaves_exact_counters() {
    let mut b = tar::Builder::new(Vec::new());
    for d in 0..6 {
        let dir = format!("top/d{d}/");
        b.append(&tar_entry(tar::EntryType::Directory, &dir, 0o755, 1, 0), &[][..]).unwrap();
        for f in 0..8 {
            let data = vec![(d * 8 + f) as u8; 300 * f + 1];
            b.append(
                &tar_entry(tar::EntryType::Regular, &format!("{dir}f{f}"), 0o644, 1, data.len() as u64),
                &data[..],
            )
            .unwrap();
        }
        if d > 0 {
            let mut h = tar_entry(tar::EntryType::Link, &format!("{dir}again"), 0o644, 1, 0);
            h.set_link_name(format!("top/d{}/f1", d - 1)).unwrap();
            h.set_cksum();
            b.append(&h, &[][..]).unwrap();
        }
    }
    let archive = b.into_inner().unwrap();
    let base = Arc::new(MemDevice::new(2048));
    dxfs::mkfs(base.clone(), &MkfsOptions { log_blocks: Some(64), ..Default::default() }).unwrap();
    let dev = Arc::new(FaultDevice::new(base.to_bytes()));
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let start = dev.events();
    let mut entries = 0;
    // Commits between entries, as the delta's timer would make them.
    dxfs::tools::import_tar::import_tar(&vol, &archive[..], &mut |_| {
        entries += 1;
        if entries % 5 == 0 {
            vol.sync().unwrap();
        }
    })
    .unwrap();
    vol.sync().unwrap();
    let after = simple(&dump(&vol));
    assert_eq!(vol.rstat(vol.root()).unwrap().unwrap().hardlinks, 10, "five files of two names");
    drop(vol);
    every_cut(&dev, start, |at, got| {
        for p in got.keys() {
            assert!(after.contains_key(p), "{at}: {p} is not in the archive");
        }
    });
}

/// Paths with their type and contents (link counts change as a tree goes).
fn simple(d: &Dump) -> BTreeMap<String, String> {
    d.iter()
        .map(|(p, (node, xs))| {
            let v = match node {
                Node::File { data, .. } => format!("file {data:?} {xs:?}"),
                other => format!("{other:?} {xs:?}"),
            };
            (p.clone(), v)
        })
        .collect()
}

/// Summing a directory in small steps counts every entry once: files with one link in
/// the totals, the others by inode, subdirectories by name; the totals equal the sum
/// of each entry's attributes.
#[test]
fn sum_steps_count_each_entry_once() {
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let (mut blocks, mut bytes, mut files) = (0, 0, 0);
    let mut linked = BTreeSet::new();
    let mut subdirs = BTreeSet::new();
    for i in 0..300u32 {
        let name = format!("e{i:03}");
        if i % 17 == 0 {
            vol.mkdir(d, name.as_bytes(), 0o755, 0, 0).unwrap();
            subdirs.insert(name);
            continue;
        }
        let f = vol.create(d, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        vol.write(f, 0, &vec![1u8; i as usize * 61]).unwrap();
        if i % 10 == 0 {
            vol.link(f, root, format!("other{i}").as_bytes()).unwrap();
            linked.insert(f);
        } else {
            let a = vol.getattr(f).unwrap();
            (blocks, bytes, files) = (blocks + a.blocks, bytes + a.size, files + 1);
        }
    }
    let mut got = (0, 0, 0, BTreeSet::new(), BTreeSet::new());
    let mut pos = 0;
    loop {
        let s = vol.sum_step(d, &user(0), pos, 9, 120).unwrap();
        got.0 += s.blocks;
        got.1 += s.bytes;
        got.2 += s.files;
        for (ino, b, n, _) in s.linked {
            let a = vol.getattr(ino).unwrap();
            assert_eq!((b, n), (a.blocks, a.size));
            assert!(got.3.insert(ino), "a linked file twice");
        }
        for (n, _) in s.subdirs {
            assert!(got.4.insert(String::from_utf8(n).unwrap()), "a subdirectory twice");
        }
        pos = s.next;
        if s.done {
            break;
        }
    }
    assert_eq!(got, (blocks, bytes, files, linked, subdirs));
    // Search permission on the directory is needed.
    chmod(&vol, d, 0o700);
    assert!(matches!(vol.sum_step(d, &user(1000), 0, 10, 1000), Err(Error::AccessDenied)));
    close_and_check(dev, vol);
}

fn entry<'a>(name: &'a [u8], mode: u32, data: &'a [u8], xattrs: &'a [(&'a [u8], &'a [u8])]) -> NewEntry<'a> {
    NewEntry {
        name,
        mode,
        uid: u32::MAX,
        gid: u32::MAX,
        rdev: 0,
        atime: (1_000_000_000, 5),
        mtime: (1_234_567_890, 999_999_999),
        data,
        xattrs,
    }
}

/// `import_entry` makes an entry whole as the caller, with what the kernel would let
/// `cp -a` do: creation needs write and search on the directory; another owner needs
/// root, another group root or membership; the setgid bit stays only for a member;
/// `trusted.`/`security.` xattrs need root, `user.` ones a file or directory; device
/// nodes need root. Contents and times arrive as given.
#[test]
fn import_entry_follows_the_kernels_rules() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    chmod(&vol, root, 0o777);
    let closed = vol.mkdir(root, b"closed", 0o755, 0, 0).unwrap().ino;
    let open = vol.mkdir(root, b"open", 0o777, 0, 0).unwrap().ino;
    let sgid = vol.mkdir(root, b"sgid", 0o777, 0, 50).unwrap().ino;
    chmod(&vol, sgid, 0o2777);
    let u = Caller { uid: 1000, gid: 1000, groups: vec![60] };
    let xs: &[(&[u8], &[u8])] = &[(b"user.a", b"1"), (b"trusted.t", b"2"), (b"security.s", b"3")];
    let data = vec![9u8; 9000];
    let f = entry(b"f", libc::S_IFREG | 0o6755, &data, xs);
    assert!(matches!(vol.import_entry(closed, &f, &u), Err(Error::AccessDenied)));
    assert!(matches!(vol.lookup(closed, b"f"), Err(Error::NotFound)));

    // Another owner is not given; a group the caller is in is.
    let ino = vol.import_entry(open, &NewEntry { uid: 2000, gid: 60, ..f }, &u).unwrap();
    let a = vol.getattr(ino).unwrap();
    assert_eq!((a.uid, a.gid, a.mode & 0o7777), (1000, 60, 0o6755));
    assert_eq!(vol.read(ino, 0, 10_000).unwrap(), data);
    assert_eq!((a.atime, a.mtime), (f.atime, f.mtime));
    assert_eq!(vol.listxattr(ino).unwrap(), vec![b"user.a".to_vec()]);
    // A group the caller is not in is not given: the file keeps the caller's, whose
    // setgid bit the caller may set.
    let ino = vol.import_entry(open, &NewEntry { name: b"g", gid: 70, ..f }, &u).unwrap();
    let a = vol.getattr(ino).unwrap();
    assert_eq!((a.uid, a.gid, a.mode & 0o7777), (1000, 1000, 0o6755));
    // A setgid directory gives its group; the caller is no member of it, so the file's
    // setgid bit goes.
    let ino = vol.import_entry(sgid, &NewEntry { name: b"h", ..f }, &u).unwrap();
    let a = vol.getattr(ino).unwrap();
    assert_eq!((a.gid, a.mode & 0o7777), (50, 0o4755));
    // Taken names, device nodes, user xattrs on a symlink.
    assert!(matches!(vol.import_entry(open, &f, &u), Err(Error::Exists)));
    let chr = NewEntry { name: b"tty", mode: libc::S_IFCHR | 0o600, rdev: 0x0501, ..f };
    assert!(matches!(vol.import_entry(open, &chr, &u), Err(Error::NotPermitted)));
    let l = entry(b"l", libc::S_IFLNK | 0o700, b"../somewhere", &[(b"user.a", b"1")]);
    let ino = vol.import_entry(open, &l, &u).unwrap();
    assert_eq!(vol.readlink(ino).unwrap(), b"../somewhere");
    assert_eq!(vol.getattr(ino).unwrap().mode & 0o777, 0o777, "a symlink's bits are all set");
    assert!(vol.listxattr(ino).unwrap().is_empty());
    assert_eq!(vol.getattr(ino).unwrap().mtime, l.mtime);
    // A directory is made open to its owner; its attributes come later.
    let d = entry(b"d", libc::S_IFDIR | 0o500, b"", xs);
    let ino = vol.import_entry(open, &d, &u).unwrap();
    let a = vol.getattr(ino).unwrap();
    assert_eq!((a.uid, a.mode & 0o7777), (1000, 0o700));
    assert!(vol.listxattr(ino).unwrap().is_empty());
    // Root gives any owner, device nodes and every namespace.
    let r = user(0);
    let ino = vol.import_entry(closed, &NewEntry { uid: 2000, gid: 70, ..f }, &r).unwrap();
    let a = vol.getattr(ino).unwrap();
    assert_eq!((a.uid, a.gid, a.mode & 0o7777), (2000, 70, 0o6755));
    assert_eq!(vol.listxattr(ino).unwrap().len(), 3);
    let ino = vol.import_entry(closed, &chr, &r).unwrap();
    assert_eq!(vol.getattr(ino).unwrap().rdev, 0x0501);
    // Names the volume refuses.
    let long = vec![b'n'; 256];
    assert!(matches!(vol.import_entry(open, &NewEntry { name: &long, ..f }, &u), Err(Error::NameTooLong)));
    assert!(vol.import_entry(open, &NewEntry { name: b"a/b", ..f }, &u).is_err());
    close_and_check(dev, vol);
}

/// An import over many deltas, cut at every write: each image recovers fsck clean,
/// and every entry in it is whole (one operation each: contents and xattrs all there).
#[test]
fn crash_anywhere_in_an_import_leaves_whole_entries() {
    let base = Arc::new(MemDevice::new(2048));
    dxfs::mkfs(base.clone(), &MkfsOptions { log_blocks: Some(64), ..Default::default() }).unwrap();
    let dev = Arc::new(FaultDevice::new(base.to_bytes()));
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    let root = vol.root();
    vol.sync().unwrap();
    let start = dev.events();
    let u = user(0);
    let xs: &[(&[u8], &[u8])] = &[(b"user.k", b"v"), (b"trusted.big", &[7; 3000])];
    let mut dir = root;
    for i in 0..40u32 {
        let name = format!("e{i}");
        let data = vec![i as u8; 700 * (i as usize % 13)];
        let e = match i % 10 {
            0 => entry(name.as_bytes(), libc::S_IFDIR | 0o755, b"", &[]),
            7 => entry(name.as_bytes(), libc::S_IFLNK | 0o777, b"target", &[]),
            _ => entry(name.as_bytes(), libc::S_IFREG | 0o640, &data, xs),
        };
        let ino = vol.import_entry(dir, &e, &u).unwrap();
        if i % 10 == 0 {
            dir = ino;
        }
        if i % 6 == 5 {
            vol.sync().unwrap();
        }
    }
    vol.sync().unwrap();
    let after = dump(&vol);
    drop(vol);
    let n = dev.events();
    assert!(n - start > 60, "too few writes to mean anything: {}", n - start);
    for mode in [CrashMode::All, CrashMode::DropUnflushed] {
        for at in start..=n {
            let got = recover(dev.crash_image(at, mode)).unwrap_or_else(|e| panic!("{mode:?} at {at}: {e}"));
            for (p, (node, xs)) in &got {
                let (want, want_xs) = after.get(p).unwrap_or_else(|| panic!("{mode:?} at {at}: {p} was never made"));
                assert_eq!(node, want, "{mode:?} at {at}: {p}");
                assert_eq!(xs, want_xs, "{mode:?} at {at}: {p}'s xattrs");
            }
        }
    }
}

/// An imported entry inherits its directory's default ACL unless it brings an access
/// ACL of its own; a minimal one (what the mode says) leaves it without one, as
/// `cp -a` of a file with no ACL does. Values the volume refuses are left out.
#[test]
fn import_entry_acls_replace_the_inherited_ones() {
    use dxfs::acl::{encode, Entry, GROUP, GROUP_OBJ, MASK, OTHER, USER_OBJ};
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let e = |tag, perm, id| Entry { tag, perm, id };
    let def = encode(&[
        e(USER_OBJ, 7, u32::MAX),
        e(GROUP, 5, 55),
        e(GROUP_OBJ, 5, u32::MAX),
        e(MASK, 7, u32::MAX),
        e(OTHER, 0, u32::MAX),
    ]);
    vol.setxattr(d, b"system.posix_acl_default", &def, XattrMode::Any).unwrap();
    let minimal = encode(&[e(USER_OBJ, 6, u32::MAX), e(GROUP_OBJ, 4, u32::MAX), e(OTHER, 4, u32::MAX)]);
    let own = encode(&[
        e(USER_OBJ, 6, u32::MAX),
        e(GROUP, 6, 77),
        e(GROUP_OBJ, 4, u32::MAX),
        e(MASK, 6, u32::MAX),
        e(OTHER, 0, u32::MAX),
    ]);
    let r = user(0);
    let names = |ino| vol.listxattr(ino).unwrap();
    let plain = vol.import_entry(d, &entry(b"inherits", libc::S_IFREG | 0o640, b"x", &[]), &r).unwrap();
    assert_eq!(names(plain), vec![b"system.posix_acl_access".to_vec()]);
    let none: &[(&[u8], &[u8])] = &[(b"system.posix_acl_access", &minimal)];
    let ino = vol.import_entry(d, &entry(b"minimal", libc::S_IFREG | 0o644, b"x", none), &r).unwrap();
    assert!(names(ino).is_empty());
    assert_eq!(vol.getattr(ino).unwrap().mode & 0o777, 0o644);
    let mine: &[(&[u8], &[u8])] = &[(b"system.posix_acl_access", &own), (b"system.posix_acl_default", &def)];
    let ino = vol.import_entry(d, &entry(b"own", libc::S_IFREG | 0o660, b"x", mine), &r).unwrap();
    assert_eq!(names(ino), vec![b"system.posix_acl_access".to_vec()], "no default ACL on a file");
    assert_eq!(vol.getxattr(ino, b"system.posix_acl_access").unwrap(), own);
    let bad: &[(&[u8], &[u8])] = &[(b"system.posix_acl_access", b"junk"), (b"user.ok", b"1"), (b"nonsense", b"2")];
    let ino = vol.import_entry(d, &entry(b"bad", libc::S_IFREG | 0o600, b"x", bad), &r).unwrap();
    // A refused ACL counts as none given: the inherited one stays.
    assert_eq!(names(ino), vec![b"system.posix_acl_access".to_vec(), b"user.ok".to_vec()]);
    close_and_check(dev, vol);
}
