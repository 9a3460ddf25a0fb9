//! The Volume API, operation by operation: results, errors and what persists.

mod common;

use std::sync::Arc;

use common::*;
use dxfs::block::MemDevice;
use dxfs::{Error, OpenOptions, Volume};
use dxfs::{RenameFlags, SetAttr, SetTime, WriteAs, XattrMode};

/// A holder for `vol` (as the FUSE kernel's references are) that holds the inodes in the
/// set it returns.
fn holder_set(vol: &Volume) -> Arc<std::sync::Mutex<std::collections::HashSet<u64>>> {
    let held: Arc<std::sync::Mutex<std::collections::HashSet<u64>>> = Arc::default();
    let h = held.clone();
    vol.set_holder(Arc::new(move |ino| h.lock().unwrap().contains(&ino)));
    held
}

fn reopen(dev: &Arc<MemDevice>, vol: Volume) -> Volume {
    vol.close().unwrap();
    assert_clean(dev.clone());
    Volume::open(dev.clone(), OpenOptions::default()).unwrap()
}

#[test]
fn errors_are_the_right_ones() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o644, 0, 0).unwrap();
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    vol.create(d.ino, b"inner", 0o644, 0, 0).unwrap();
    let long = vec![b'x'; 256];
    assert!(matches!(vol.create(root, &long, 0o644, 0, 0), Err(Error::NameTooLong)));
    assert!(matches!(vol.lookup(root, &long), Err(Error::NameTooLong)));
    assert!(vol.create(root, &vec![b'x'; 255], 0o644, 0, 0).is_ok());
    assert!(matches!(vol.create(root, b"a/b", 0o644, 0, 0), Err(Error::Invalid(_))));
    assert!(matches!(vol.create(root, b"", 0o644, 0, 0), Err(Error::Invalid(_))));
    assert!(matches!(vol.lookup(root, b"nope"), Err(Error::NotFound)));
    assert!(matches!(vol.create(f.ino, b"x", 0o644, 0, 0), Err(Error::NotDir)));
    assert!(matches!(vol.unlink(root, b"d"), Err(Error::IsDir)));
    assert!(matches!(vol.rmdir(root, b"f"), Err(Error::NotDir)));
    assert!(matches!(vol.rmdir(root, b"d"), Err(Error::NotEmpty)));
    assert!(matches!(vol.link(d.ino, root, b"dl"), Err(Error::NotPermitted)));
    assert!(matches!(vol.rename(root, b"d", d.ino, b"sub", RenameFlags::default()), Err(Error::Invalid(_))));
    assert!(matches!(vol.read(d.ino, 0, 10), Err(Error::IsDir)));
    assert!(matches!(vol.write(d.ino, 0, b"x"), Err(Error::IsDir)));
    assert!(matches!(vol.readlink(f.ino), Err(Error::Invalid(_))));
    assert!(matches!(vol.getattr(12345678), Err(Error::NotFound)));
    assert!(matches!(vol.write(f.ino, dxfs::MAX_FILE_SIZE, b"x"), Err(Error::FileTooBig)));
    assert!(matches!(vol.symlink(root, b"s", &vec![b'a'; 4096], 0, 0), Err(Error::NameTooLong)));
    close_and_check(dev, vol);
}

#[test]
fn rename_replace_noreplace_exchange() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let a = vol.create(root, b"a", 0o644, 0, 0).unwrap();
    let b = vol.create(root, b"b", 0o644, 0, 0).unwrap();
    vol.write(b.ino, 0, b"bee").unwrap();
    let d1 = vol.mkdir(root, b"d1", 0o755, 0, 0).unwrap();
    let d2 = vol.mkdir(root, b"d2", 0o755, 0, 0).unwrap();
    let noreplace = RenameFlags { noreplace: true, ..Default::default() };
    let exchange = RenameFlags { exchange: true, ..Default::default() };
    assert!(matches!(vol.rename(root, b"a", root, b"b", noreplace), Err(Error::Exists)));
    vol.rename(root, b"a", root, b"b", exchange).unwrap();
    assert_eq!(vol.lookup(root, b"a").unwrap().ino, b.ino);
    assert_eq!(vol.lookup(root, b"b").unwrap().ino, a.ino);
    // Replace: the old target goes away.
    vol.rename(root, b"a", root, b"b", RenameFlags::default()).unwrap();
    assert_eq!(vol.lookup(root, b"b").unwrap().ino, b.ino);
    assert!(matches!(vol.getattr(a.ino), Err(Error::NotFound)));
    // Directories: moving changes both parents' link counts and the child's "..".
    vol.rename(root, b"d1", d2.ino, b"moved", RenameFlags::default()).unwrap();
    assert_eq!(vol.getattr(root).unwrap().nlink, 3);
    assert_eq!(vol.getattr(d2.ino).unwrap().nlink, 3);
    assert_eq!(vol.lookup(d1.ino, b"..").unwrap().ino, d2.ino);
    // Exchange a file and a directory across parents.
    vol.rename(root, b"b", d2.ino, b"moved", exchange).unwrap();
    assert_eq!(vol.lookup(root, b"b").unwrap().ino, d1.ino);
    assert_eq!(vol.lookup(d1.ino, b"..").unwrap().ino, root);
    assert_eq!(vol.getattr(root).unwrap().nlink, 4);
    assert_eq!(vol.getattr(d2.ino).unwrap().nlink, 2);
    let vol = reopen(&dev, vol);
    assert_eq!(vol.read(b.ino, 0, 10).unwrap(), b"bee");
    close_and_check(dev, vol);
}

#[test]
fn files_holes_truncate_and_huge_offsets() {
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    vol.write(f, 10_000, b"middle").unwrap();
    let data = vol.read(f, 0, 20_000).unwrap();
    assert_eq!(data.len(), 10_006);
    assert!(data[..10_000].iter().all(|b| *b == 0));
    vol.sync().unwrap();
    assert_eq!(vol.getattr(f).unwrap().blocks, 8, "one 4 KiB block for a file with a hole");
    // Truncate down into the middle of the data, then up again: the tail reads as zeros.
    vol.setattr(f, &SetAttr { size: Some(10_003), ..Default::default() }).unwrap();
    vol.setattr(f, &SetAttr { size: Some(12_000), ..Default::default() }).unwrap();
    let data = vol.read(f, 10_000, 100).unwrap();
    assert_eq!(&data[..3], b"mid");
    assert!(data[3..].iter().all(|b| *b == 0));
    // Near the 16 TiB limit: a sparse file of 1 TiB and more.
    let big = vol.create(root, b"big", 0o644, 0, 0).unwrap().ino;
    let off = (1u64 << 40) + 12345;
    vol.write(big, off, b"far away").unwrap();
    assert_eq!(vol.getattr(big).unwrap().size, off + 8);
    let vol = reopen(&dev, vol);
    assert_eq!(vol.read(big, off, 8).unwrap(), b"far away");
    assert_eq!(vol.read(big, 5 << 30, 4).unwrap(), vec![0; 4]);
    // Many extents: the map moves into a tree and back.
    for k in 0..50u64 {
        vol.write(f, (k * 3 + 10) * 4096, &[k as u8; 4096]).unwrap();
        vol.sync().unwrap();
    }
    for k in 0..50u64 {
        assert_eq!(vol.read(f, (k * 3 + 10) * 4096, 4096).unwrap(), vec![k as u8; 4096]);
    }
    vol.setattr(f, &SetAttr { size: Some(0), ..Default::default() }).unwrap();
    assert_eq!(vol.getattr(f).unwrap().blocks, 0);
    close_and_check(dev, vol);
}

/// What statfs reports available can be preallocated, less a little: fallocate of
/// (available − 512 KiB) on a fresh volume succeeds, as on ext4 (it charged a 64th of the
/// request for extent-map growth, which a contiguous preallocation never needs).
#[test]
fn fallocate_of_nearly_all_free_space() {
    for blocks in [8192u64, 1 << 17] {
        let (dev, vol) = mem_volume(blocks);
        let f = vol.create(vol.root(), b"big", 0o644, 0, 0).unwrap().ino;
        let avail = vol.statfs().bavail * 4096;
        let want = avail - (512 << 10);
        vol.fallocate(f, 0, want, false, false)
            .unwrap_or_else(|e| panic!("{blocks} blocks: fallocate of {want} of {avail}: {e}"));
        assert_eq!(vol.getattr(f).unwrap().size, want);
        // The rest is still usable, and past it the volume says ENOSPC.
        let g = vol.create(vol.root(), b"rest", 0o644, 0, 0).unwrap().ino;
        let (_, e) = write_until_error(&vol, g, 0, &[7u8; 65536]);
        assert!(matches!(e, dxfs::Error::NoSpace), "{e}");
        close_and_check(dev, vol);
    }
}

#[test]
fn fallocate_and_punch() {
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    vol.fallocate(f, 0, 1 << 20, false, false).unwrap();
    let a = vol.getattr(f).unwrap();
    assert_eq!((a.size, a.blocks), (1 << 20, 2048));
    assert_eq!(vol.read(f, 0, 100).unwrap(), vec![0; 100]);
    vol.write(f, 0, &[1u8; 1 << 20]).unwrap();
    vol.sync().unwrap();
    vol.fallocate(f, 4096 + 100, 3 * 4096, true, true).unwrap();
    let d = vol.read(f, 0, 1 << 20).unwrap();
    assert!(d[..4196].iter().all(|b| *b == 1));
    assert!(d[4196..4196 + 3 * 4096].iter().all(|b| *b == 0));
    assert!(d[4196 + 3 * 4096..].iter().all(|b| *b == 1));
    assert_eq!(vol.getattr(f).unwrap().size, 1 << 20, "keep size");
    vol.sync().unwrap();
    assert_eq!(vol.getattr(f).unwrap().blocks, 8 * (256 - 2), "two whole blocks punched");
    close_and_check(dev, vol);
}

#[test]
fn unlinked_open_files_live_until_release_and_after_a_crash() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    vol.write(f, 0, &[9u8; 100_000]).unwrap();
    vol.open_file(f).unwrap();
    vol.unlink(root, b"f").unwrap();
    assert_eq!(vol.read(f, 0, 10).unwrap(), vec![9; 10], "still readable while open");
    let free_before = vol.statfs().bfree;
    vol.release(f).unwrap();
    vol.sync().unwrap();
    assert!(vol.statfs().bfree > free_before + 20, "blocks not freed at release");
    assert!(matches!(vol.getattr(f), Err(Error::NotFound)));
    // Open, unlink, crash (no release): the next open frees it.
    let g = vol.create(root, b"g", 0o644, 0, 0).unwrap().ino;
    vol.write(g, 0, &[1u8; 50_000]).unwrap();
    vol.open_file(g).unwrap();
    vol.unlink(root, b"g").unwrap();
    vol.sync().unwrap();
    let image = dev.to_bytes();
    drop(vol);
    let dev2 = Arc::new(MemDevice::from_bytes(image));
    assert_clean(dev2.clone());
    let vol2 = Volume::open(dev2.clone(), OpenOptions::default()).unwrap();
    assert!(matches!(vol2.getattr(g), Err(Error::NotFound)));
    close_and_check(dev2, vol2);
}

#[test]
fn xattrs_flags_sizes_and_filter() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    assert!(matches!(vol.getxattr(f, b"system.posix_acl_access"), Err(Error::NoData)));
    assert!(matches!(vol.setxattr(f, b"user.a", b"1", XattrMode::Replace), Err(Error::NoData)));
    vol.setxattr(f, b"user.a", b"1", XattrMode::Create).unwrap();
    assert!(matches!(vol.setxattr(f, b"user.a", b"2", XattrMode::Create), Err(Error::Exists)));
    vol.setxattr(f, b"user.a", b"2", XattrMode::Replace).unwrap();
    vol.setxattr(f, b"trusted.big", &[7u8; 2000], XattrMode::Any).unwrap();
    assert!(matches!(vol.setxattr(f, b"nonsense.x", b"", XattrMode::Any), Err(Error::NotSupported)));
    let mut names = vol.listxattr(f).unwrap();
    names.sort();
    assert_eq!(names, vec![b"trusted.big".to_vec(), b"user.a".to_vec()]);
    let vol = reopen(&dev, vol);
    assert_eq!(vol.getxattr(f, b"trusted.big").unwrap(), vec![7u8; 2000]);
    vol.removexattr(f, b"trusted.big").unwrap();
    assert!(matches!(vol.removexattr(f, b"trusted.big"), Err(Error::NoData)));
    assert_eq!(vol.getattr(f).unwrap().blocks, 0, "xattr block freed when the list fits inline again");
    close_and_check(dev, vol);
}

#[test]
fn setattr_times_modes_owners() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o4755, 1, 1).unwrap().ino;
    let a = vol
        .setattr(
            f,
            &SetAttr {
                mode: Some(0o600),
                uid: Some(1000),
                gid: Some(100),
                atime: Some(SetTime::At((1_000_000, 5))),
                mtime: Some(SetTime::Now),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(a.mode, libc::S_IFREG | 0o600);
    assert_eq!((a.uid, a.gid), (1000, 100));
    assert_eq!(a.atime, (1_000_000, 5));
    assert!(a.mtime.0 > 1_600_000_000);
    let vol = reopen(&dev, vol);
    assert_eq!(vol.getattr(f).unwrap().atime, (1_000_000, 5));
    close_and_check(dev, vol);
}

/// A write made as a cache's write-back (`keep_times`) leaves mtime and ctime as they
/// were, and keeps its data and size; a plain write stamps them; a write-back by a
/// caller without CAP_FSETID still drops the setuid bit and moves ctime for it.
#[test]
fn writes_that_keep_the_times() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o4755, 1, 1).unwrap().ino;
    let old = SetTime::At((1_000_000, 7));
    let set_old = || {
        let s = SetAttr { mtime: Some(old), ctime: Some((1_000_000, 7)), ..Default::default() };
        vol.setattr(f, &s).unwrap();
    };
    set_old();
    let kept = WriteAs { keep_times: true, ..WriteAs::default() };
    assert_eq!(vol.write_with(f, 0, b"hello", kept).unwrap(), 5);
    let a = vol.getattr(f).unwrap();
    assert_eq!((a.mtime, a.ctime, a.size), ((1_000_000, 7), (1_000_000, 7), 5));
    assert_eq!(a.mode & 0o7777, 0o4755, "a privileged write keeps the setuid bit");
    // The privileges a caller without CAP_FSETID drops are a change: ctime moves, mtime not.
    let unprivileged = WriteAs { unprivileged: true, keep_times: true, ..WriteAs::default() };
    assert_eq!(vol.try_write(f, 5, b" world", unprivileged).unwrap(), Some(6));
    let a = vol.getattr(f).unwrap();
    assert_eq!(a.mode & 0o7777, 0o755);
    assert_eq!(a.mtime, (1_000_000, 7));
    assert!(a.ctime.0 > 1_600_000_000, "ctime {:?} did not move with the dropped bit", a.ctime);
    // A plain write stamps both.
    set_old();
    vol.write(f, 11, b"!").unwrap();
    let a = vol.getattr(f).unwrap();
    assert!(a.mtime.0 > 1_600_000_000 && a.ctime.0 > 1_600_000_000, "{:?} {:?}", a.mtime, a.ctime);
    let vol = reopen(&dev, vol);
    assert_eq!(vol.read(f, 0, 64).unwrap(), b"hello world!");
    close_and_check(dev, vol);
}

/// Fill the volume with data, fail cleanly, delete, and write again.
#[test]
fn full_volume_fails_cleanly_and_recovers_after_delete() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let f = vol.create(root, b"fill", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![3u8; 1 << 20];
    let (written, err) = write_until_error(&vol, f, 0, &chunk);
    assert!(matches!(err, Error::NoSpace), "{err}");
    vol.sync().unwrap();
    let st = vol.statfs();
    assert!(written >= (st.blocks - 400) * 4096 * 9 / 10, "only {written} bytes fit");
    assert!(matches!(vol.create(root, b"more", 0o644, 0, 0), Ok(_) | Err(Error::NoSpace)));
    vol.unlink(root, b"fill").unwrap();
    vol.sync().unwrap();
    let g = vol.create(root, b"again", 0o644, 0, 0).unwrap().ino;
    vol.write(g, 0, &chunk).unwrap();
    vol.sync().unwrap();
    assert_eq!(vol.read(g, 0, 1 << 20).unwrap(), chunk);
    close_and_check(dev, vol);
}

/// Room kept for a cache's write-back (the FUSE server keeps the kernel's dirty bound):
/// ordinary writes stop short of it, `statfs` does not show it as
/// available, and only writes made as write-back (and deletions) use it.
#[test]
fn room_kept_for_write_back() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let before = vol.statfs();
    let keep = 400u64;
    vol.keep_for_write_back(keep * 4096 - 100);
    let st = vol.statfs();
    assert_eq!((st.bavail, st.kept), (before.bavail - keep, keep), "rounded up to blocks");
    let f = vol.create(root, b"fill", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![5u8; 64 << 10];
    let (big, err) = write_until_error(&vol, f, 0, &chunk);
    assert!(matches!(err, Error::NoSpace), "{err}");
    let (plain, err) = write_until_error(&vol, f, big, &chunk[..4096]);
    assert!(matches!(err, Error::NoSpace), "{err}");
    let st = vol.statfs();
    assert!(st.bavail < 64 && st.kept == keep, "{st:?}");
    // The cache's write-back goes on into the kept room, and stops at the end of it.
    let wb = WriteAs { write_back: true, ..WriteAs::default() };
    let mut at = plain;
    let err = loop {
        match vol.write_with(f, at, &chunk, wb) {
            Ok(n) => at += n as u64,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::NoSpace), "{err}");
    assert!(at - plain >= (keep - 64) * 4096, "write-back got {} of the {keep} kept blocks", (at - plain) / 4096);
    vol.sync().unwrap();
    // A deletion may use it too, and gives everything back.
    vol.unlink(root, b"fill").unwrap();
    vol.sync().unwrap();
    let st = vol.statfs();
    assert_eq!(st.kept, keep);
    assert!(before.bavail - keep - st.bavail < 8, "{st:?}, {before:?}");
    vol.keep_for_write_back(0);
    assert_eq!(vol.statfs().bavail, st.bavail + keep);
    close_and_check(dev, vol);
}

/// On a full volume the blocks of a file whose last link just went, but which its holder
/// (the FUSE kernel) still held, come back when the holder lets go moments later (its
/// FORGET comes right behind the UNLINK), and so do those of a file unlinked while open
/// when its last release comes: a write short of space waits for that, once, rather than
/// fail (`rm big; cp x y` on a full mount). `statfs` waits for nothing: it counts the
/// held ones' blocks as free (`settling`), not the open ones'. A thread that serves
/// requests is never made to wait for them: its write stops, undone, for another thread.
#[test]
fn a_write_short_of_space_waits_for_a_file_unlinked_moments_ago() {
    let (dev, vol) = mem_volume(4096);
    let held = holder_set(&vol);
    let root = vol.root();
    let after = vol.create(root, b"after", 0o644, 0, 0).unwrap().ino;
    let fill = vol.create(root, b"fill", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![3u8; 1 << 20];
    let (_, err) = write_until_error(&vol, fill, 0, &chunk);
    assert!(matches!(err, Error::NoSpace), "{err}");
    vol.sync().unwrap();
    held.lock().unwrap().insert(fill);
    let fill_blocks = vol.getattr(fill).unwrap().blocks / 8;
    let before = vol.statfs();
    vol.unlink(root, b"fill").unwrap();
    let st = vol.statfs();
    assert_eq!(st.settling, fill_blocks, "the held file's blocks are on their way back");
    assert!(st.bfree >= before.bfree + fill_blocks && st.bavail >= before.bavail + fill_blocks);
    // On a serving thread the write stops before it changes anything.
    let size_before = vol.getattr(after).unwrap().size;
    assert!(vol.unless_it_waits_for_requests(|v| v.write(after, 0, &chunk)).unwrap().is_none());
    assert_eq!(vol.getattr(after).unwrap().size, size_before, "a write put off changed the file");
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(30));
            held.lock().unwrap().remove(&fill);
            vol.forgotten(fill).unwrap();
        });
        assert_eq!(vol.write(after, 0, &chunk).unwrap(), chunk.len(), "the unlinked file's blocks");
    });
    // Unlinked while open, with the close's RELEASE arriving just behind (it travels on
    // its own): the same wait.
    let fill = vol.create(root, b"fill", 0o644, 0, 0).unwrap().ino;
    let (_, err) = write_until_error(&vol, fill, 1 << 20, &chunk);
    assert!(matches!(err, Error::NoSpace), "{err}");
    vol.sync().unwrap();
    vol.open_file(fill).unwrap();
    vol.unlink(root, b"fill").unwrap();
    // A file removed while open may stay open for long: not counted as free.
    assert_eq!(vol.statfs().settling, 0, "a file removed while open counted as free");
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(30));
            vol.release(fill).unwrap();
        });
        assert_eq!(vol.write(after, 1 << 20, &chunk).unwrap(), chunk.len(), "the file released late");
    });
    // Held for good (an open file): ENOSPC as before, after one wait.
    let other = vol.create(root, b"other", 0o644, 0, 0).unwrap().ino;
    let (_, err) = write_until_error(&vol, other, 0, &chunk);
    assert!(matches!(err, Error::NoSpace), "{err}");
    held.lock().unwrap().insert(other);
    vol.unlink(root, b"other").unwrap();
    assert!(matches!(vol.write(after, 2 << 20, &chunk), Err(Error::NoSpace)));
    vol.sync().unwrap();
    assert_eq!(vol.read(after, 0, 2 << 20).unwrap(), [&chunk[..], &chunk[..]].concat());
    close_and_check(dev, vol);
}

#[test]
fn read_only_open_refuses_changes() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    vol.create(root, b"f", 0o644, 0, 0).unwrap();
    vol.close().unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions { read_only: true, ..Default::default() }).unwrap();
    assert!(matches!(vol.create(root, b"g", 0o644, 0, 0), Err(Error::ReadOnly)));
    assert!(vol.lookup(root, b"f").is_ok());
    drop(vol);
    assert_clean(dev);
}

/// Inodes freed in the current delta (or the one being committed) read as NotFound, the
/// answer a FUSE server owes the kernel for a stale inode number.
#[test]
fn freed_inodes_are_not_found_not_corrupt() {
    let (dev, vol) = mem_volume(16_384);
    let root = vol.root();
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let inos: Vec<u64> =
        (0..3000).map(|i| vol.create(d, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
    for i in 0..3000 {
        vol.unlink(d, format!("f{i}").as_bytes()).unwrap();
    }
    vol.rmdir(root, b"d").unwrap();
    for ino in &inos {
        assert!(matches!(vol.getattr(*ino), Err(Error::NotFound)), "inode {ino}: {:?}", vol.getattr(*ino));
        assert!(matches!(vol.setattr(*ino, &SetAttr::default()), Err(Error::NotFound)));
    }
    vol.sync().unwrap();
    for ino in &inos {
        assert!(matches!(vol.getattr(*ino), Err(Error::NotFound)));
    }
    close_and_check(dev, vol);
}

/// A preallocation and a write far larger than one delta's log or dirty limit go
/// through in steps.
#[test]
fn huge_fallocate_and_write_fit_any_delta() {
    let dev = Arc::new(MemDevice::new(65_536));
    dxfs::mkfs(dev.clone(), &dxfs::MkfsOptions { log_blocks: Some(64), ..Default::default() }).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions { dirty_limit: 1024, ..Default::default() }).unwrap();
    let root = vol.root();
    let f = vol.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    vol.fallocate(f, 0, 100 << 20, false, false).unwrap();
    assert_eq!(vol.getattr(f).unwrap().size, 100 << 20);
    let g = vol.create(root, b"g", 0o644, 0, 0).unwrap().ino;
    let data: Vec<u8> = (0..(40usize << 20)).map(|i| (i / 4096) as u8).collect();
    assert_eq!(vol.write(g, 0, &data).unwrap(), data.len());
    assert_eq!(vol.read(g, 0, data.len()).unwrap(), data);
    close_and_check(dev, vol);
}

/// The filesystem rules live in the volume, so a library caller gets what the mount
/// gets: a setgid directory gives its group to new inodes and its setgid bit to new
/// subdirectories; `make_open` creates and opens in one step.
#[test]
fn setgid_directories_pass_on_their_group() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let shared = vol.mkdir(root, b"shared", 0o2775, 0, 50).unwrap();
    assert_eq!(shared.mode & 0o7777, 0o2775);
    let f = vol.create(shared.ino, b"f", 0o644, 1000, 1000).unwrap();
    assert_eq!((f.uid, f.gid, f.mode & 0o7777), (1000, 50, 0o644));
    let sub = vol.mkdir(shared.ino, b"sub", 0o755, 1000, 1000).unwrap();
    assert_eq!((sub.gid, sub.mode & 0o7777), (50, 0o2755), "subdirectories inherit the setgid bit");
    let s = vol.symlink(shared.ino, b"s", b"f", 1000, 1000).unwrap();
    assert_eq!(s.gid, 50);
    let plain = vol.mkdir(root, b"plain", 0o755, 0, 0).unwrap();
    let g = vol.create(plain.ino, b"g", 0o644, 1000, 1000).unwrap();
    assert_eq!(g.gid, 1000, "no setgid: the caller's group");
    let n = dxfs::NewNode { mode: libc::S_IFREG | 0o600, uid: 7, gid: 7, rdev: 0, umask: 0 };
    let o = vol.make_open(plain.ino, b"open", n).unwrap();
    vol.unlink(plain.ino, b"open").unwrap();
    assert_eq!(vol.getattr(o.ino).unwrap().nlink, 0, "open handle keeps the unlinked inode");
    vol.release(o.ino).unwrap();
    assert!(matches!(vol.getattr(o.ino), Err(Error::NotFound)));
    close_and_check(dev, vol);
}

/// `access` decides by mode bits, supplementary groups and POSIX ACLs.
#[test]
fn access_decisions() {
    use dxfs::acl::{encode, Entry, GROUP, GROUP_OBJ, MASK, OTHER, USER_OBJ};
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o640, 1000, 100).unwrap();
    let who = |uid, gid, groups: &[u32]| dxfs::Caller { uid, gid, groups: groups.to_vec() };
    assert!(vol.access(f.ino, &who(1000, 1000, &[]), 6).is_ok());
    assert!(matches!(vol.access(f.ino, &who(2000, 2000, &[]), 4), Err(Error::AccessDenied)));
    assert!(vol.access(f.ino, &who(2000, 2000, &[100]), 4).is_ok(), "supplementary group");
    assert!(matches!(vol.access(f.ino, &who(2000, 100, &[]), 2), Err(Error::AccessDenied)));
    let e = |tag, perm, id| Entry { tag, perm, id };
    let acl = [e(USER_OBJ, 6, 0), e(GROUP_OBJ, 4, 0), e(GROUP, 6, 7), e(MASK, 6, 0), e(OTHER, 0, 0)];
    vol.setxattr(f.ino, b"system.posix_acl_access", &encode(&acl), XattrMode::Any).unwrap();
    assert!(vol.access(f.ino, &who(3000, 3000, &[7]), 6).is_ok(), "named group entry");
    assert!(matches!(vol.access(f.ino, &who(3000, 3000, &[]), 4), Err(Error::AccessDenied)));
    assert!(matches!(vol.access(f.ino, &who(0, 0, &[]), 1), Err(Error::AccessDenied)), "no x bit: not even root");
    close_and_check(dev, vol);
}

/// The volume's locks are measured: every operation shares the volume lock, creates take
/// leaf locks (the space map, to refill their lease of blocks), a commit takes the volume lock
/// exclusively, and the times are counted (the serial share engine_bench --threads
/// reports).
#[test]
fn lock_use_is_counted() {
    let dev = std::sync::Arc::new(MemDevice::new(4096));
    dxfs::mkfs(dev.clone(), &dxfs::MkfsOptions::default()).unwrap();
    let vol = Volume::open(dev.clone(), OpenOptions { measure_lock: true, ..Default::default() }).unwrap();
    let root = vol.root();
    let before = vol.lock_stats();
    for i in 0..100 {
        vol.create(root, format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let d = vol.lock_stats().since(before);
    assert!(d.shared_acquisitions >= 100, "{d:?}");
    assert!(d.shared_held > std::time::Duration::ZERO, "{d:?}");
    assert!(d.leaf_acquisitions > 0 && d.leaf_held > std::time::Duration::ZERO, "{d:?}");
    assert_eq!(d.acquisitions, 0, "creates do not take the volume lock exclusively: {d:?}");
    let before = vol.lock_stats();
    vol.sync().unwrap();
    let d = vol.lock_stats().since(before);
    assert!(d.acquisitions >= 1 && d.held > std::time::Duration::ZERO, "a commit does: {d:?}");
    close_and_check(dev, vol);
    let (dev, vol) = mem_volume(4096);
    vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap();
    assert_eq!(vol.lock_stats(), dxfs::LockStats::default(), "not measured unless asked");
    close_and_check(dev, vol);
}

/// Reads run with the volume lock shared, also when what they need is not cached: after
/// the cache is dropped they read it from the device, never take the volume lock
/// exclusively, and give the same answers.
#[test]
fn reads_share_the_lock_and_survive_cache_misses() {
    let dev = std::sync::Arc::new(MemDevice::new(16_384));
    dxfs::mkfs(dev.clone(), &dxfs::MkfsOptions::default()).unwrap();
    // No atime updates: listing the directory would change its attributes.
    let opts = OpenOptions { measure_lock: true, atime: dxfs::AtimePolicy::Never, ..Default::default() };
    let vol = Volume::open(dev.clone(), opts).unwrap();
    let root = vol.root();
    let dir = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    for i in 0..2000 {
        let f = vol.create(dir, format!("file-{i:05}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        if i % 7 == 0 {
            let value = format!("{i}").repeat(40);
            vol.setxattr(f, b"user.note", value.as_bytes(), XattrMode::Any).unwrap();
        }
    }
    let answers = |vol: &Volume| {
        let mut out = Vec::new();
        for i in (0..2000).step_by(13) {
            let a = vol.lookup(dir, format!("file-{i:05}").as_bytes()).unwrap();
            out.push(format!("{:?}", vol.getattr(a.ino).unwrap()));
            out.push(format!("{:?}", vol.getxattr(a.ino, b"user.note")));
            out.push(format!("{:?}", vol.listxattr(a.ino).unwrap()));
        }
        out.push(format!("{:?}", vol.lookup(dir, b"missing")));
        let mut pos = 0;
        loop {
            let batch = vol.readdir_plus(dir, pos, 100).unwrap();
            let Some(last) = batch.last() else { break };
            pos = last.0.next;
            out.extend(batch.iter().map(|(e, a)| format!("{:?} {a:?}", e.name)));
        }
        out.push(format!("{}", vol.readdir(dir, 0, 10_000).unwrap().len()));
        out
    };
    vol.sync().unwrap();
    let warm = answers(&vol);
    vol.drop_caches().unwrap();
    let before = vol.lock_stats();
    let reads = vol.io_stats().reads;
    let cold = answers(&vol);
    let d = vol.lock_stats().since(before);
    assert!(vol.io_stats().reads > reads, "a dropped cache is read again");
    let first_difference = |a: &[String], b: &[String]| {
        let i = a.iter().zip(b).position(|(x, y)| x != y);
        i.map(|i| format!("at {i}: {} against {}", a[i], b[i]))
            .or_else(|| (a.len() != b.len()).then(|| "length".into()))
    };
    assert_eq!(first_difference(&cold, &warm), None, "answers after a cache drop");
    assert_eq!(d.acquisitions, 0, "reads never take the volume lock exclusively: {d:?}");
    assert!(d.shared_acquisitions > 400 && d.shared_held > std::time::Duration::ZERO, "{d:?}");
    let reads = vol.io_stats().reads;
    let again = answers(&vol);
    assert_eq!(first_difference(&again, &warm), None);
    assert_eq!(vol.io_stats().reads, reads, "everything is cached now");
    close_and_check(dev, vol);
}

/// fallocate's ZERO_RANGE, COLLAPSE_RANGE and INSERT_RANGE, and copy_file_range, against
/// a byte model of the file, with data both committed and still dirty.
#[test]
fn range_operations_match_a_model() {
    let (dev, vol) = mem_volume(16_384);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    let bs = 4096usize;
    let mut model: Vec<u8> = (0..64 * bs).map(|k| (k / bs * 7 + k % 251) as u8).collect();
    // Many small extents: write pages in a scattered order across commits.
    for (n, p) in (0..64).map(|k| (k * 37) % 64).enumerate() {
        vol.write(f, (p * bs) as u64, &model[p * bs..(p + 1) * bs]).unwrap();
        if n % 9 == 0 {
            vol.sync().unwrap();
        }
    }
    let check = |model: &Vec<u8>, what: &str| {
        assert_eq!(vol.getattr(f).unwrap().size, model.len() as u64, "size after {what}");
        assert!(vol.read(f, 0, model.len() + 10).unwrap() == *model, "content after {what}");
    };
    check(&model, "writes");
    // Zero a range across page boundaries, keeping the size.
    vol.zero_range(f, 5000, 20_000, true).unwrap();
    model[5000..25_000].fill(0);
    check(&model, "zero_range");
    // Collapse pages 10..13 (committed data), then 3..4 with dirty pages around it.
    vol.sync().unwrap();
    vol.collapse_range(f, (10 * bs) as u64, (3 * bs) as u64).unwrap();
    model.drain(10 * bs..13 * bs);
    check(&model, "collapse of committed data");
    vol.write(f, (2 * bs) as u64, &[0xEE; 4096 * 3]).unwrap();
    model[2 * bs..5 * bs].fill(0xEE);
    vol.collapse_range(f, (3 * bs) as u64, bs as u64).unwrap();
    model.drain(3 * bs..4 * bs);
    check(&model, "collapse of dirty data");
    // Insert a hole of two pages at page 7.
    vol.insert_range(f, (7 * bs) as u64, (2 * bs) as u64).unwrap();
    model.splice(7 * bs..7 * bs, std::iter::repeat_n(0u8, 2 * bs));
    check(&model, "insert");
    vol.sync().unwrap();
    check(&model, "sync");
    // The rules: alignment, and ranges that reach the end.
    assert!(matches!(vol.collapse_range(f, 100, 4096), Err(Error::Invalid(_))));
    let size = model.len() as u64;
    assert!(matches!(vol.collapse_range(f, size - 4096, 4096), Err(Error::Invalid(_))));
    assert!(matches!(vol.insert_range(f, size, 4096), Err(Error::Invalid(_))));
    // Zero past the end without keep_size grows the file.
    vol.zero_range(f, size, 3000, false).unwrap();
    model.resize(size as usize + 3000, 0);
    check(&model, "zero_range past the end");
    // Copy within the volume, to another file and back into a gap of the same file.
    let g = vol.create(root, b"g", 0o644, 0, 0).unwrap().ino;
    assert_eq!(vol.copy_range(f, 1000, g, 0, 50_000).unwrap(), 50_000);
    assert!(vol.read(g, 0, 60_000).unwrap() == model[1000..51_000]);
    let n = vol.copy_range(f, size - 100, g, 0, 1_000_000).unwrap();
    assert_eq!(n, 100 + 3000, "a copy stops at the end of the source");
    assert!(matches!(vol.copy_range(f, 0, f, 100, 200), Err(Error::Invalid(_))), "overlap refused");
    assert_eq!(vol.copy_range(f, 0, f, 200_000, 4096).unwrap(), 4096);
    if model.len() < 200_000 + 4096 {
        model.resize(200_000 + 4096, 0);
    }
    let head = model[..4096].to_vec();
    model[200_000..204_096].copy_from_slice(&head);
    check(&model, "copy within the file");
    close_and_check(dev, vol);
}

/// Names and targets with a NUL byte are refused with a message that says so (listxattr
/// returns NUL-separated names; a symlink target is a C string).
#[test]
fn nul_bytes_are_refused() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    match vol.setxattr(f, b"user.a\0b", b"v", XattrMode::Any) {
        Err(Error::Invalid(m)) => assert!(m.contains("NUL"), "{m}"),
        r => panic!("{r:?}"),
    }
    assert_eq!(vol.listxattr(f).unwrap(), Vec::<Vec<u8>>::new());
    match vol.symlink(root, b"s", b"a\0b", 0, 0) {
        Err(Error::Invalid(m)) => assert!(m.contains("NUL"), "{m}"),
        r => panic!("{r:?}"),
    }
    close_and_check(dev, vol);
}

/// The file system holding a sparse image runs full: the sync that needed the space fails
/// with ENOSPC, and so do changes after it (the commit waits: `HeldWrites`); once the
/// host has room, a sync commits what waited and the volume goes on, with no remount.
#[test]
fn host_file_system_full() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    std::fs::create_dir(&host).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=6m", "tmpfs"])
        .arg(&host)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        assert!(
            std::env::var_os("DXFS_TEST_NO_SKIP").is_none_or(|v| v == "0"),
            "host_file_system_full skipped, and DXFS_TEST_NO_SKIP forbids it"
        );
        eprintln!("skipping host_file_system_full: cannot mount a small tmpfs (not root?)");
        return;
    }
    let run = || {
        let img = host.join("v.img");
        let filler = host.join("filler");
        std::fs::write(&filler, vec![0u8; 2 << 20]).unwrap();
        let dev = Arc::new(dxfs::block::FileDevice::create(&img, 64 << 20).unwrap());
        dxfs::mkfs(dev.clone(), &dxfs::MkfsOptions::default()).unwrap();
        let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
        let root = vol.root();
        let kept = vol.create(root, b"kept", 0o644, 0, 0).unwrap().ino;
        vol.write(kept, 0, b"committed before the host filled").unwrap();
        vol.sync().unwrap();
        let f = vol.create(root, b"big", 0o644, 0, 0).unwrap().ino;
        let mut failure = None;
        let mut written = 0u64;
        for i in 0..40u64 {
            let r = vol.write(f, i << 20, &[i as u8; 1 << 20]).and_then(|_| vol.sync());
            if let Err(e) = r {
                failure = Some(e);
                break;
            }
            written = (i + 1) << 20;
        }
        let e = failure.expect("a 6 MiB host cannot take 40 MiB");
        assert_eq!(e.errno(), libc::ENOSPC, "{e}");
        assert!(matches!(vol.create(root, b"more", 0o644, 0, 0), Err(Error::NoSpace)));
        assert_eq!(vol.read(kept, 0, 100).unwrap(), b"committed before the host filled");
        // Room again: the waiting commit goes through, and so do changes.
        std::fs::remove_file(&filler).unwrap();
        vol.sync().unwrap();
        vol.create(root, b"more", 0o644, 0, 0).unwrap();
        let size = vol.getattr(f).unwrap().size;
        assert!(size > written, "the megabyte that waited is in the file ({size} bytes)");
        drop(vol);
        drop(dev);
        let dev = Arc::new(dxfs::block::FileDevice::open(&img, false).unwrap());
        assert_clean(dev.clone());
        let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
        let k = vol.lookup(root, b"kept").unwrap().ino;
        assert_eq!(vol.read(k, 0, 100).unwrap(), b"committed before the host filled");
        assert!(vol.lookup(root, b"more").is_ok());
        let last = (size - 1) >> 20;
        assert_eq!(vol.read(f, last << 20, 1 << 20).unwrap(), vec![last as u8; (size - (last << 20)) as usize]);
        vol.close().unwrap();
        assert_clean(dev);
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
    let _ = std::process::Command::new("umount").arg(&host).status();
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}

/// RENAME_WHITEOUT leaves a character device 0:0 at the old name, owned as the moved
/// inode, in the same step (what overlayfs needs of an upper layer).
#[test]
fn rename_whiteout() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o644, 1000, 100).unwrap().ino;
    let wo = RenameFlags { whiteout: true, ..Default::default() };
    vol.rename(root, b"f", root, b"g", wo).unwrap();
    assert_eq!(vol.lookup(root, b"g").unwrap().ino, f);
    let w = vol.lookup(root, b"f").unwrap();
    assert_eq!((w.mode & libc::S_IFMT, w.rdev, w.uid, w.gid), (libc::S_IFCHR, 0, 1000, 100));
    let both = RenameFlags { whiteout: true, exchange: true, ..Default::default() };
    assert!(matches!(vol.rename(root, b"g", root, b"f", both), Err(Error::Invalid(_))));
    close_and_check(dev, vol);
}

/// An access ACL set by a caller who is neither root nor in the file's group drops the
/// setgid bit (the kernel's posix_acl_update_mode, as chmod does); set by a group member
/// or root, the bit stays.
#[test]
fn setting_an_acl_outside_the_group_drops_setgid() {
    use dxfs::acl::{encode, Entry, GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let e = |tag, perm, id| Entry { tag, perm, id };
    let acl = encode(&[e(USER_OBJ, 6, 0), e(USER, 4, 7), e(GROUP_OBJ, 4, 0), e(MASK, 4, 0), e(OTHER, 0, 0)]);
    let name = b"system.posix_acl_access";
    let who = |uid, gid, groups: &[u32]| dxfs::Caller { uid, gid, groups: groups.to_vec() };
    let sgid = |n: &[u8]| {
        let f = vol.mknod(root, n, libc::S_IFREG | 0o2670, 0, 1000, 50).unwrap().ino;
        assert_eq!(vol.getattr(f).unwrap().mode & 0o7777, 0o2670);
        f
    };
    let a = sgid(b"a");
    vol.setxattr_as(a, name, &acl, XattrMode::Any, &who(1000, 1000, &[])).unwrap();
    assert_eq!(vol.getattr(a).unwrap().mode & libc::S_ISGID, 0, "owner outside the group");
    let b = sgid(b"b");
    vol.setxattr_as(b, name, &acl, XattrMode::Any, &who(1000, 1000, &[50])).unwrap();
    assert_ne!(vol.getattr(b).unwrap().mode & libc::S_ISGID, 0, "a member of the group keeps it");
    let c = sgid(b"c");
    vol.setxattr_as(c, name, &acl, XattrMode::Any, &who(0, 0, &[])).unwrap();
    assert_ne!(vol.getattr(c).unwrap().mode & libc::S_ISGID, 0, "root keeps it");
    close_and_check(dev, vol);
}

/// A small write inside a preallocated range, or over written data, needs no new block:
/// st_blocks does not grow (before the write-back swaps the block, and after), while a
/// write into a hole counts its block at once.
#[test]
fn st_blocks_counts_only_new_blocks() {
    let (dev, vol) = mem_volume(8192);
    let root = vol.root();
    let f = vol.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    vol.fallocate(f, 0, 1 << 20, false, false).unwrap();
    let full = vol.getattr(f).unwrap().blocks;
    assert_eq!(full, 2048, "1 MiB in 512-byte sectors");
    vol.write(f, 100, b"hi").unwrap();
    assert_eq!(vol.getattr(f).unwrap().blocks, full, "a write inside a preallocated range");
    vol.write(f, 8192, &[1u8; 4096]).unwrap();
    assert_eq!(vol.getattr(f).unwrap().blocks, full);
    vol.sync().unwrap();
    assert_eq!(vol.getattr(f).unwrap().blocks, full, "after write-back");
    vol.write(f, 5 << 20, b"x").unwrap();
    assert_eq!(vol.getattr(f).unwrap().blocks, full + 8, "a write into a hole counts its block");
    vol.setattr(f, &dxfs::SetAttr { size: Some(10_000), ..Default::default() }).unwrap();
    assert_eq!(vol.getattr(f).unwrap().blocks, 3 * 8, "truncated: three blocks left");
    close_and_check(dev, vol);
}

/// O_TMPFILE for a holder (FUSE with zero-message opens, which may never send the
/// RELEASE): no handle is counted; the file lives while held, is freed when the holder
/// lets go unless it was named, and across a commit in between (on the orphan list) too.
#[test]
fn tmpfile_held_lives_by_its_holder() {
    let (dev, vol) = mem_volume(4096);
    let held = holder_set(&vol);
    let root = vol.root();
    let node = dxfs::NewNode { mode: libc::S_IFREG | 0o600, uid: 0, gid: 0, rdev: 0, umask: 0 };
    let free = |vol: &Volume| vol.statfs().bavail;
    let start = free(&vol);
    let u = vol.make_tmpfile_held(root, node).unwrap();
    held.lock().unwrap().insert(u.ino);
    vol.write(u.ino, 0, &[7u8; 1 << 20]).unwrap();
    vol.sync().unwrap();
    assert!(free(&vol) + 200 < start, "its blocks are in use while held");
    held.lock().unwrap().remove(&u.ino);
    vol.forgotten(u.ino).unwrap();
    assert!(matches!(vol.getattr(u.ino), Err(Error::NotFound)), "freed when the holder let go");
    vol.sync().unwrap();
    assert!(free(&vol) + 16 >= start, "its space is back: {} of {start}", free(&vol));
    let t = vol.make_tmpfile_held(root, node).unwrap();
    held.lock().unwrap().insert(t.ino);
    vol.write(t.ino, 0, b"kept").unwrap();
    assert_eq!(vol.link(t.ino, root, b"kept").unwrap().nlink, 1);
    held.lock().unwrap().remove(&t.ino);
    vol.forgotten(t.ino).unwrap();
    assert_eq!(vol.read(vol.lookup(root, b"kept").unwrap().ino, 0, 10).unwrap(), b"kept");
    close_and_check(dev, vol);
}

/// O_TMPFILE: an unnamed open file, with no link until `link` names it; one never named
/// is freed at its last release, and one still open when the volume closes (as at a
/// crash) is freed by the next open, from the orphan list.
#[test]
fn tmpfile_is_unnamed_until_linked() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let node = dxfs::NewNode { mode: libc::S_IFREG | 0o640, uid: 7, gid: 8, rdev: 0, umask: 0o022 };
    let names =
        |vol: &Volume| -> Vec<Vec<u8>> { vol.readdir(root, 0, 100).unwrap().into_iter().map(|e| e.name).collect() };
    let inodes = |vol: &Volume| vol.statfs().files - vol.statfs().ffree;

    let t = vol.make_tmpfile(root, node).unwrap();
    assert_eq!((t.nlink, t.mode, t.uid, t.gid), (0, libc::S_IFREG | 0o640, 7, 8));
    vol.write(t.ino, 0, b"kept data").unwrap();
    assert_eq!(names(&vol), vec![b".".to_vec(), b"..".to_vec()], "a tmpfile has no name");
    assert_eq!(vol.link(t.ino, root, b"kept").unwrap().nlink, 1);
    vol.release(t.ino).unwrap();
    assert_eq!(vol.lookup(root, b"kept").unwrap().ino, t.ino);

    let before = inodes(&vol);
    let u = vol.make_tmpfile(root, node).unwrap();
    vol.write(u.ino, 0, &[7u8; 10_000]).unwrap();
    assert_eq!(inodes(&vol), before + 1);
    vol.release(u.ino).unwrap();
    assert!(matches!(vol.getattr(u.ino), Err(Error::NotFound)), "freed at its last release");
    assert!(matches!(vol.link(u.ino, root, b"late"), Err(Error::NotFound)));
    assert_eq!(inodes(&vol), before);

    let w = vol.make_tmpfile(root, node).unwrap();
    vol.write(w.ino, 0, &[9u8; 50_000]).unwrap();
    vol.sync().unwrap();
    assert!(matches!(vol.make_tmpfile(t.ino, node), Err(Error::NotDir)));
    // Closed with `w` still open: the next open frees it.
    let vol = reopen(&dev, vol);
    assert!(matches!(vol.getattr(w.ino), Err(Error::NotFound)), "an orphan at open is freed");
    assert_eq!(inodes(&vol), before);
    assert_eq!(vol.read(t.ino, 0, 100).unwrap(), b"kept data");
    assert_eq!(names(&vol), vec![b".".to_vec(), b"..".to_vec(), b"kept".to_vec()]);
    close_and_check(dev, vol);
}

/// A holder (the FUSE kernel's references) keeps an inode that lost its last link alive,
/// readable and linkable, until `forgotten`; one still held at a commit is on the orphan
/// list, so closing the volume (as a crash would) leaves it to the next open to free.
#[test]
fn a_holder_keeps_an_unlinked_inode_until_forgotten() {
    let (dev, vol) = mem_volume(4096);
    let held = holder_set(&vol);
    let root = vol.root();
    let inodes = |vol: &Volume| vol.statfs().files - vol.statfs().ffree;
    let before = inodes(&vol);

    let f = vol.create(root, b"f", 0o644, 0, 0).unwrap();
    vol.write(f.ino, 0, &[5u8; 9000]).unwrap();
    held.lock().unwrap().insert(f.ino);
    vol.unlink(root, b"f").unwrap();
    assert_eq!(vol.getattr(f.ino).unwrap().nlink, 0);
    assert_eq!(vol.read(f.ino, 0, 9000).unwrap(), vec![5u8; 9000]);
    vol.forgotten(f.ino).unwrap();
    assert!(vol.getattr(f.ino).is_ok(), "still held: forgotten must not free it");
    held.lock().unwrap().remove(&f.ino);
    vol.forgotten(f.ino).unwrap();
    assert!(matches!(vol.getattr(f.ino), Err(Error::NotFound)));
    assert_eq!(inodes(&vol), before);

    // Held across a commit, then named again (linkat of an open file).
    let g = vol.create(root, b"g", 0o644, 0, 0).unwrap();
    vol.write(g.ino, 0, b"relinked").unwrap();
    held.lock().unwrap().insert(g.ino);
    vol.unlink(root, b"g").unwrap();
    vol.sync().unwrap();
    assert_eq!(vol.link(g.ino, root, b"g2").unwrap().nlink, 1);
    held.lock().unwrap().remove(&g.ino);
    vol.forgotten(g.ino).unwrap();
    assert_eq!(vol.read(g.ino, 0, 100).unwrap(), b"relinked", "a named inode is not freed");

    // Many held across a commit, forgotten out of order: each leaves the orphan list
    // wherever it stands in it.
    let many: Vec<u64> = (0..6)
        .map(|n| {
            let name = format!("m{n}");
            let ino = vol.create(root, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
            held.lock().unwrap().insert(ino);
            vol.unlink(root, name.as_bytes()).unwrap();
            ino
        })
        .collect();
    vol.sync().unwrap();
    for &k in &[many[2], many[5], many[0], many[3], many[1], many[4]] {
        held.lock().unwrap().remove(&k);
        vol.forgotten(k).unwrap();
        assert!(matches!(vol.getattr(k), Err(Error::NotFound)));
    }
    assert_eq!(inodes(&vol), before + 1, "only g2 is left");

    // Held at close: freed by the next open.
    let k = vol.create(root, b"k", 0o644, 0, 0).unwrap();
    vol.write(k.ino, 0, &[1u8; 50_000]).unwrap();
    held.lock().unwrap().insert(k.ino);
    vol.unlink(root, b"k").unwrap();
    let vol = reopen(&dev, vol);
    assert!(matches!(vol.getattr(k.ino), Err(Error::NotFound)));
    assert_eq!(inodes(&vol), before + 1, "only g2 is left");
    close_and_check(dev, vol);
}

/// Write-back of single pages over written ones changes the extent records in place
/// (`file::remap_one`): at an extent's start, middle and end, one-page extents, pages
/// next to holes and preallocated (unwritten) ones, which take the general path. The
/// file reads back as a model after every commit and after reopening; pages rewritten one
/// per commit, in order, merge with the block before them; fsck is clean.
#[test]
fn single_page_overwrites_remap_in_place() {
    let (dev, vol) = mem_volume(16384);
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    const PAGES: u64 = 1024;
    let page = |p: u64, tag: u64| -> Vec<u8> { (0..4096u64).map(|i| (p * 7 + tag * 13 + i / 512) as u8).collect() };
    let mut model = vec![0u8; (PAGES * 4096) as usize];
    // Eight pages written, eight left as holes, all along: 64 extents, in a tree.
    for c in (0..PAGES).step_by(16) {
        for p in c..c + 8 {
            let d = page(p, 0);
            vol.write(f, p * 4096, &d).unwrap();
            model[(p * 4096) as usize..][..4096].copy_from_slice(&d);
        }
    }
    // The last page, so the size stays put; one of the holes preallocated: its pages are
    // unwritten extents.
    let d = page(PAGES - 1, 0);
    vol.write(f, (PAGES - 1) * 4096, &d).unwrap();
    model[((PAGES - 1) * 4096) as usize..].copy_from_slice(&d);
    vol.fallocate(f, 24 * 4096, 8 * 4096, false, false).unwrap();
    vol.sync().unwrap();
    assert!(!vol.extent_tree_blocks(f).unwrap().is_empty(), "the extents are in a tree");
    let check = |vol: &Volume, model: &[u8]| {
        let got = vol.read(f, 0, model.len()).unwrap();
        let first = got.iter().zip(model).position(|(a, b)| a != b);
        assert!(
            got.len() == model.len() && first.is_none(),
            "the file differs from the model: {} bytes read of {}, first difference at {first:?}",
            got.len(),
            model.len()
        );
    };
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for i in 1..=3000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let p = x % PAGES;
        let d = page(p, i);
        vol.write(f, p * 4096, &d).unwrap();
        model[(p * 4096) as usize..][..4096].copy_from_slice(&d);
        if i % 97 == 0 {
            vol.sync().unwrap();
            check(&vol, &model);
        }
    }
    vol.sync().unwrap();
    check(&vol, &model);
    let vol = reopen(&dev, vol);
    check(&vol, &model);

    // A second file: 256 pages, then single pages far apart (a tree), then its first 256
    // pages rewritten one per commit, in order: each new block follows the one before on
    // the device and merges with it, so the tree stays one leaf.
    let g = vol.create(vol.root(), b"g", 0o644, 0, 0).unwrap().ino;
    vol.write(g, 0, &vec![1u8; 256 * 4096]).unwrap();
    for p in (300..360).step_by(10) {
        vol.write(g, p * 4096, &[2u8; 4096]).unwrap();
    }
    vol.sync().unwrap();
    assert!(!vol.extent_tree_blocks(g).unwrap().is_empty(), "the extents are in a tree");
    for p in 0..256u64 {
        vol.write(g, p * 4096, &[3u8; 4096]).unwrap();
        vol.sync().unwrap();
    }
    assert_eq!(vol.read(g, 0, 256 * 4096).unwrap(), vec![3u8; 256 * 4096]);
    assert_eq!(vol.extent_tree_blocks(g).unwrap().len(), 1, "256 one-page extents would need more than one leaf");
    close_and_check(dev, vol);
}

/// A write of many pages over written pages and holes counts in st_blocks only the
/// holes' blocks, before its write-back and after (the write reads the extents of its
/// range once and walks them page by page).
#[test]
fn a_long_write_counts_only_the_holes_it_fills() {
    let (dev, vol) = mem_volume(8192);
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    for start in [0u64, 8, 16] {
        vol.write(f, start * 4096, &[1u8; 4 * 4096]).unwrap();
    }
    vol.sync().unwrap();
    let before = vol.getattr(f).unwrap().blocks;
    assert_eq!(before, 12 * 8, "three extents of four pages, in 512-byte sectors");
    // Pages 0..24: 12 over written pages, holes 4..8 and 12..16, and 20..24 past the end.
    vol.write(f, 0, &[2u8; 24 * 4096]).unwrap();
    assert_eq!(vol.getattr(f).unwrap().blocks, 24 * 8, "only the 12 new pages count");
    vol.sync().unwrap();
    assert_eq!(vol.getattr(f).unwrap().blocks, 24 * 8, "after write-back");
    assert_eq!(vol.read(f, 0, 24 * 4096).unwrap(), vec![2u8; 24 * 4096]);
    close_and_check(dev, vol);
}

/// With write-back ahead of the commit (`flush_from`: 16 pages), random writes, partial
/// pages and truncates over three files, read back while the flusher runs, match a model;
/// `st_blocks` counts each page the file holds once, whether it is dirty, flushed or
/// committed (and a truncate into a hole adds no block); after a reopen everything is
/// there and fsck is clean.
#[test]
fn writes_flushed_ahead_of_the_commit_read_back_and_count_right() {
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeSet;
    let dev = Arc::new(MemDevice::new(16_384));
    dxfs::mkfs(dev.clone(), &dxfs::MkfsOptions::default()).unwrap();
    let opts = OpenOptions { flush_from: 16, ..OpenOptions::default() };
    let vol = Volume::open(dev.clone(), opts).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let files: Vec<u64> =
        (0..3).map(|i| vol.create(vol.root(), format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino).collect();
    // Per file: its contents, and the pages it holds blocks (or dirty pages) for.
    let mut model: Vec<(Vec<u8>, BTreeSet<u64>)> = vec![(Vec::new(), BTreeSet::new()); 3];
    let check_blocks = |vol: &Volume, model: &[(Vec<u8>, BTreeSet<u64>)], when: &str| {
        for (k, &f) in files.iter().enumerate() {
            let a = vol.getattr(f).unwrap();
            assert_eq!(a.size, model[k].0.len() as u64, "{when}: size of f{k}");
            // Its pages, and its extent tree's blocks (as ext4 counts them).
            let tree = vol.extent_tree_blocks(f).unwrap().len() as u64;
            assert_eq!(a.blocks, 8 * (model[k].1.len() as u64 + tree), "{when}: blocks of f{k}");
        }
    };
    for step in 0..4000u32 {
        let k = rng.gen_range(0..3);
        let f = files[k];
        match rng.gen_range(0..20) {
            0 => {
                let size = rng.gen_range(0..300 * 4096u64);
                vol.setattr(f, &SetAttr { size: Some(size), ..Default::default() }).unwrap();
                let keep = size.div_ceil(4096);
                model[k].0.resize(size as usize, 0);
                model[k].1.retain(|&p| p < keep);
            }
            1..=3 => {
                let len = model[k].0.len() as u64;
                let off = rng.gen_range(0..=len);
                let n = rng.gen_range(0..3 * 4096).min((len - off) as usize);
                let got = vol.read(f, off, n).unwrap();
                let want = &model[k].0[off as usize..off as usize + n];
                let first_wrong = got.iter().zip(want).position(|(a, b)| a != b);
                assert!(
                    got.len() == n && first_wrong.is_none(),
                    "step {step}: read of f{k} at {off}: byte {first_wrong:?}"
                );
            }
            4 => {
                vol.sync().unwrap();
                check_blocks(&vol, &model, &format!("step {step}, synced"));
            }
            _ => {
                // Mostly whole scattered pages (each its own run), some partial.
                let page = rng.gen_range(0..256u64);
                let (off, len) = if rng.gen_bool(0.8) {
                    (page * 4096, 4096 * rng.gen_range(1..3))
                } else {
                    (page * 4096 + rng.gen_range(1..4096), rng.gen_range(1..6000))
                };
                let data: Vec<u8> = (0..len).map(|i| (step as u64 * 7 + i) as u8 | 1).collect();
                assert_eq!(vol.write(f, off, &data).unwrap(), len as usize);
                let end = off as usize + len as usize;
                if model[k].0.len() < end {
                    model[k].0.resize(end, 0);
                }
                model[k].0[off as usize..end].copy_from_slice(&data);
                model[k].1.extend(off / 4096..=(end as u64 - 1) / 4096);
            }
        }
        if step % 50 == 0 {
            check_blocks(&vol, &model, &format!("step {step}"));
        }
        if step % 20 == 0 {
            // Now and then let the flusher catch up, so flushes happen however busy the
            // machine is (between these points they race with the operations).
            vol.wait_flushed(std::time::Duration::from_secs(10));
        }
    }
    check_blocks(&vol, &model, "the end");
    assert!(vol.flushes() > 10, "only {} flushes ahead of the commit ran", vol.flushes());
    let vol = reopen(&dev, vol);
    for (k, &f) in files.iter().enumerate() {
        assert_eq!(vol.read(f, 0, model[k].0.len()).unwrap(), model[k].0, "f{k} after a reopen");
    }
    check_blocks(&vol, &model, "after a reopen");
    close_and_check(dev, vol);
}

/// fsync commits only when the file or directory has something in the delta: a second
/// fsync, or one of a file that other changes left alone, writes nothing; each kind of
/// change of its own makes it commit; an fsync of the root always commits; and what the
/// fsyncs made durable is what a crash right after them recovers.
#[test]
fn an_fsync_of_an_unchanged_file_writes_nothing() {
    use dxfs::block::BlockDevice;
    let dev = Arc::new(MemDevice::new(4096));
    dxfs::mkfs(dev.clone(), &dxfs::MkfsOptions::default()).unwrap();
    // No mount-mark refresh may write during the test.
    let vol = Volume::open(dev.clone(), OpenOptions { mark_interval_ms: 600_000, ..Default::default() }).unwrap();
    let root = vol.root();
    let d = vol.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let f = vol.create(d, b"f", 0o644, 0, 0).unwrap().ino;
    let g = vol.create(d, b"g", 0o644, 0, 0).unwrap().ino;
    vol.write(f, 0, b"one").unwrap();
    let writes = || dev.stats().writes;
    let w = writes();
    vol.fsync(f).unwrap();
    let mut w1 = writes();
    assert!(w1 > w, "the first fsync committed");
    vol.fsync(f).unwrap();
    vol.fsync(d).unwrap(); // the creates went with f's commit
    assert_eq!(writes(), w1, "nothing of f or d is left to commit");
    vol.write(g, 0, b"two").unwrap();
    vol.fsync(f).unwrap();
    assert_eq!(writes(), w1, "only g changed");
    vol.fsync(g).unwrap();
    assert!(writes() > w1, "g's change committed");
    // An fsync of the root commits whatever the delta holds (how a mount is synced).
    vol.write(g, 3, b"!").unwrap();
    w1 = writes();
    vol.fsync(root).unwrap();
    assert!(writes() > w1, "an fsync of the root commits everything");
    type Change<'a> = (&'a str, Box<dyn Fn() + 'a>);
    let changes: Vec<Change> = vec![
        ("write", Box::new(|| assert_eq!(vol.write(f, 3, b"!").unwrap(), 1))),
        (
            "truncate",
            Box::new(|| vol.setattr(f, &SetAttr { size: Some(4), ..Default::default() }).map(|_| ()).unwrap()),
        ),
        (
            "chmod",
            Box::new(|| vol.setattr(f, &SetAttr { mode: Some(0o600), ..Default::default() }).map(|_| ()).unwrap()),
        ),
        ("setxattr", Box::new(|| vol.setxattr(f, b"user.k", b"v", XattrMode::Any).unwrap())),
        ("link", Box::new(|| vol.link(f, root, b"f2").map(|_| ()).unwrap())),
        ("rename", Box::new(|| vol.rename(root, b"f2", root, b"f3", RenameFlags::default()).unwrap())),
        ("unlink", Box::new(|| vol.unlink(root, b"f3").unwrap())),
    ];
    for (what, change) in &changes {
        w1 = writes();
        vol.fsync(f).unwrap();
        assert_eq!(writes(), w1, "before the {what}: nothing to commit");
        change();
        vol.fsync(f).unwrap();
        assert!(writes() > w1, "the fsync after a {what} committed");
    }
    // A crash now recovers everything the fsyncs made durable (the image, read-only: the
    // volume is still open read-write here).
    let img = Arc::new(MemDevice::from_bytes(dev.to_bytes()));
    assert_clean(img.clone());
    let got = dump(&Volume::open(img, OpenOptions { read_only: true, ..Default::default() }).unwrap());
    let file = |path: &str| match &got[path].0 {
        Node::File { data, .. } => data.clone(),
        other => panic!("{path}: {other:?}"),
    };
    assert_eq!(file("/d/f"), b"one!");
    assert_eq!(file("/d/g"), b"two!");
    assert!(!got.contains_key("/f3"));
    drop(changes);
    close_and_check(dev, vol);
}

/// A small delta commits with one device flush, its file data logged with its metadata
/// (ONE_FLUSH_COMMIT, set by mkfs); a volume made without the feature takes two, as a
/// delta with more data than the log takes does. Either way the data reads back after a
/// reopen, and fsck is clean.
#[test]
fn a_small_fsync_commits_with_one_flush() {
    use dxfs::block::BlockDevice;
    for (one_flush, size, flushes) in [(true, 3, 1), (true, 8 << 20, 2), (false, 3, 2)] {
        let dev = Arc::new(MemDevice::new(16_384));
        dxfs::mkfs(dev.clone(), &dxfs::MkfsOptions { one_flush_commit: one_flush, ..Default::default() }).unwrap();
        let vol = Volume::open(dev.clone(), OpenOptions { mark_interval_ms: 600_000, ..Default::default() }).unwrap();
        let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
        vol.fsync(f).unwrap();
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        vol.write(f, 0, &data).unwrap();
        let before = dev.stats().flushes;
        vol.fsync(f).unwrap();
        assert_eq!(dev.stats().flushes - before, flushes, "feature {one_flush}, {size} bytes");
        drop(vol);
        let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
        assert_eq!(vol.read(f, 0, size).unwrap(), data);
        drop(vol);
        assert_clean(dev);
    }
}

/// Overwrites of pages a file already maps go in place (through the log), and only
/// short runs do: random single-page overwrites leave a written file with its one
/// extent on the same blocks, where redirect on write would have cut it into one extent
/// per overwritten page; a long run still goes to fresh blocks. The data reads back as
/// written, before and after a remount.
#[test]
fn short_overwrites_go_in_place_and_keep_the_extents() {
    use dxfs::tools::inspect::Inspector;
    let (dev, vol) = mem_volume(8192);
    let f = vol.create(vol.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let mut model = vec![1u8; 64 * 4096];
    vol.write(f, 0, &model).unwrap();
    close_and_check(dev.clone(), vol);
    let before = Inspector::open(dev.clone()).unwrap().extents("/f").unwrap();
    assert_eq!(before.len(), 1, "one extent after the first write: {before:?}");
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    for (i, page) in [3u64, 17, 40, 41, 63, 0, 17].into_iter().enumerate() {
        let at = (page * 4096 + 100 * i as u64) as usize;
        let data = vec![10 + i as u8; 1000];
        vol.write(f, at as u64, &data).unwrap();
        model[at..at + 1000].copy_from_slice(&data);
        if i % 3 == 2 {
            vol.sync().unwrap();
        }
    }
    assert_eq!(vol.read(f, 0, model.len()).unwrap(), model);
    close_and_check(dev.clone(), vol);
    let after = Inspector::open(dev.clone()).unwrap().extents("/f").unwrap();
    assert_eq!(
        after.iter().map(|e| (e.logical, e.physical, e.length)).collect::<Vec<_>>(),
        before.iter().map(|e| (e.logical, e.physical, e.length)).collect::<Vec<_>>(),
        "short overwrites moved blocks"
    );
    // A run longer than what goes in place is redirected: the map changes.
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    assert_eq!(vol.read(f, 0, model.len()).unwrap(), model, "after a remount");
    let long = vec![7u8; 32 * 4096];
    vol.write(f, 8 * 4096, &long).unwrap();
    model[8 * 4096..40 * 4096].copy_from_slice(&long);
    close_and_check(dev.clone(), vol);
    let redirected = Inspector::open(dev.clone()).unwrap().extents("/f").unwrap();
    assert!(redirected.len() > 1, "a 32-page overwrite stayed in place: {redirected:?}");
    let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
    assert_eq!(vol.read(f, 0, model.len()).unwrap(), model);
    close_and_check(dev, vol);
}

/// `drop_privileges_of`, the rule a server applies after a change by a caller without
/// CAP_FSETID: setuid always; setgid with group execute, or when the caller is not in the
/// file's group; a file capability when asked to look. ctime moves only when something
/// was dropped.
#[test]
fn privileges_dropped_for_a_caller_without_cap_fsetid() {
    let (dev, vol) = mem_volume(4096);
    let root = vol.root();
    let mode = |ino: u64| vol.getattr(ino).unwrap().mode & 0o7777;
    let set = |ino: u64, m: u32| {
        vol.setattr(ino, &SetAttr { mode: Some(m), gid: Some(50), ..SetAttr::default() }).unwrap();
        vol.setattr(ino, &SetAttr { mode: Some(m), ..SetAttr::default() }).unwrap();
    };
    let f = vol.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    let member = |g: u32| g == 50;
    let outsider = |_: u32| false;
    for (m, in_group, want) in [
        (0o6760, &member as &dyn Fn(u32) -> bool, 0o2760),
        (0o6760, &outsider, 0o760),
        (0o2770, &member, 0o770),
        (0o2760, &member, 0o2760),
        (0o0755, &outsider, 0o755),
    ] {
        set(f, m);
        let before = vol.getattr(f).unwrap().ctime;
        std::thread::sleep(std::time::Duration::from_millis(5));
        let dropped = vol.drop_privileges_of(f, in_group, false).unwrap();
        assert_eq!(mode(f), want, "mode {m:o}");
        assert_eq!(dropped, want != m, "mode {m:o}");
        assert_eq!(vol.getattr(f).unwrap().ctime != before, dropped, "ctime moves only with a drop");
    }
    // A file capability goes when asked to look for one.
    vol.setxattr(f, b"security.capability", b"\x01\x00\x00\x02", XattrMode::Any).unwrap();
    assert!(!vol.drop_privileges_of(f, &member, false).unwrap(), "not asked to look");
    assert!(vol.getxattr(f, b"security.capability").is_ok());
    assert!(vol.drop_privileges_of(f, &member, true).unwrap());
    assert!(matches!(vol.getxattr(f, b"security.capability"), Err(Error::NoData)));
    assert!(!vol.drop_privileges_of(f, &member, true).unwrap(), "nothing left to drop");
    close_and_check(dev, vol);
}
