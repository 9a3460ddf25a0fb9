//! `dxfs mkfs -d DIR|ARCHIVE` and `dxfs export IMAGE DIR`: a tree holding every kind of node, a
//! hard link, user xattrs and POSIX ACLs goes in and comes back out the same (contents,
//! modes, owners, times, link structure, xattrs); fsck finds the volume clean.

mod common;

use common::{dxfs, tar_entry};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use dxfs::block::{BlockDevice, FileDevice};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn set_times(p: &Path, sec: i64, nsec: i64) {
    use nix::sys::stat::{utimensat, UtimensatFlags};
    use nix::sys::time::TimeSpec;
    utimensat(
        nix::fcntl::AT_FDCWD,
        p,
        &TimeSpec::new(sec - 100, nsec),
        &TimeSpec::new(sec, nsec),
        UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
}

/// A tree with each kind of node. Returns whether ACLs were set (setfacl present).
fn make_tree(root: &Path) -> bool {
    fs::create_dir(root.join("dir")).unwrap();
    fs::create_dir(root.join("dir/sub")).unwrap();
    fs::create_dir(root.join("empty")).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(root.join("dir/data"), &data).unwrap();
    fs::write(root.join("small"), b"hello\n").unwrap();
    fs::write(root.join("dir/sub/zero-length"), b"").unwrap();
    // Sparse: a hole, data, and a hole at the end.
    let f = fs::File::create(root.join("sparse")).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, b"middle", 1 << 20).unwrap();
    f.set_len(3 << 20).unwrap();
    drop(f);
    fs::hard_link(root.join("dir/data"), root.join("dir/sub/data-link")).unwrap();
    fs::hard_link(root.join("small"), root.join("small-link")).unwrap();
    std::os::unix::fs::symlink("dir/data", root.join("sym")).unwrap();
    std::os::unix::fs::symlink("/nowhere/at/all", root.join("dir/dangling")).unwrap();
    nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o640)).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    if is_root() {
        nix::sys::stat::mknod(
            &root.join("null"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            libc::makedev(1, 3),
        )
        .unwrap();
        nix::sys::stat::mknod(
            &root.join("blk"),
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            libc::makedev(7, 42),
        )
        .unwrap();
        std::os::unix::fs::lchown(root.join("small"), Some(1234), Some(5678)).unwrap();
        std::os::unix::fs::lchown(root.join("sym"), Some(42), Some(43)).unwrap();
    }
    fs::set_permissions(root.join("dir/data"), fs::Permissions::from_mode(0o4751)).unwrap();
    fs::set_permissions(root.join("dir/sub"), fs::Permissions::from_mode(0o1777)).unwrap();
    xattr::set(root.join("small"), "user.colour", b"blue").unwrap();
    xattr::set(root.join("dir"), "user.big", &[9u8; 2000]).unwrap();
    xattr::set(root.join("dir/sub/zero-length"), "user.empty", b"").unwrap();
    let acl = Command::new("setfacl").arg("-m").arg("u:1234:rw,g:99:r").arg(root.join("small")).status();
    let acls = matches!(acl, Ok(s) if s.success());
    if acls {
        let ok = Command::new("setfacl").args(["-d", "-m", "u:1234:rwx"]).arg(root.join("dir")).status().unwrap();
        assert!(ok.success());
    } else {
        eprintln!("setfacl not found (apt-get install acl): ACLs not covered");
    }
    // Times last, leaves before their directories.
    let mut all = Vec::new();
    walk(root, root, &mut all);
    for (i, rel) in all.iter().rev().enumerate() {
        set_times(&root.join(rel), 1_600_000_000 + i as i64 * 1000, 123_456_789 + i as i64);
    }
    set_times(root, 1_500_000_000, 5);
    acls
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let mut names: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    for p in names {
        out.push(p.strip_prefix(root).unwrap().to_path_buf());
        if fs::symlink_metadata(&p).unwrap().is_dir() {
            walk(root, &p, out);
        }
    }
}

/// Everything compared about a node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
    atime: Option<(i64, i64)>,
    rdev: u64,
    content: Vec<u8>,
    xattrs: BTreeMap<String, Vec<u8>>,
}

/// Nodes by path, and the link structure: the sets of paths sharing an inode.
fn snapshot(root: &Path) -> (BTreeMap<String, Node>, BTreeSet<BTreeSet<String>>) {
    let mut all = vec![std::path::PathBuf::new()];
    walk(root, root, &mut all);
    let mut nodes = BTreeMap::new();
    let mut by_ino: HashMap<u64, BTreeSet<String>> = HashMap::new();
    for rel in all {
        let p = root.join(&rel);
        let md = fs::symlink_metadata(&p).unwrap();
        let name = rel.display().to_string();
        let ft = md.file_type();
        let content = if ft.is_file() {
            fs::read(&p).unwrap()
        } else if ft.is_symlink() {
            fs::read_link(&p).unwrap().into_os_string().into_encoded_bytes()
        } else {
            Vec::new()
        };
        let xattrs = xattr::list(&p)
            .unwrap()
            .map(|n| (n.to_string_lossy().into_owned(), xattr::get(&p, &n).unwrap().unwrap_or_default()))
            .collect();
        let dir = ft.is_dir();
        nodes.insert(
            name.clone(),
            Node {
                mode: md.mode(),
                uid: md.uid(),
                gid: md.gid(),
                size: if dir { 0 } else { md.size() },
                mtime: (md.mtime(), md.mtime_nsec()),
                // Reading a file or a link (or listing a directory) updates its atime on
                // the host (relatime, old times): compare it for nodes nothing reads.
                atime: (!ft.is_file() && !dir && !ft.is_symlink()).then_some((md.atime(), md.atime_nsec())),
                rdev: md.rdev(),
                content,
                xattrs,
            },
        );
        if !dir {
            by_ino.entry(md.ino()).or_default().insert(name);
        }
    }
    (nodes, by_ino.into_values().collect())
}

#[test]
fn mkfs_d_then_export_gives_back_the_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    let acls = make_tree(&src);
    let before = snapshot(&src);
    let img = tmp.path().join("v.img");
    let (code, out, err) = dxfs(&["mkfs", img.to_str().unwrap(), "--size", "64M", "-d", src.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("hard links"), "{out}");
    assert_image_clean(&img);

    let dst = tmp.path().join("out");
    let (code, out, err) = dxfs(&["export", img.to_str().unwrap(), dst.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let after = snapshot(&dst);
    assert_eq!(before.0.keys().collect::<Vec<_>>(), after.0.keys().collect::<Vec<_>>());
    for (name, n) in &before.0 {
        assert_eq!(Some(n), after.0.get(name), "{name:?} differs");
    }
    assert_eq!(before.1, after.1, "link structure");
    assert!(before.1.iter().any(|s| s.len() == 2), "the tree has hard links");
    if acls {
        let small = &after.0["small"];
        assert!(small.xattrs.contains_key("system.posix_acl_access"), "{:?}", small.xattrs.keys());
        assert!(after.0["dir"].xattrs.contains_key("system.posix_acl_default"));
    }
    // The image is still clean after a read-only export; exporting into a non-empty
    // directory is refused.
    assert_image_clean(&img);
    let (code, _, err) = dxfs(&["export", img.to_str().unwrap(), dst.to_str().unwrap()]);
    assert_eq!(code, 8);
    assert!(err.contains("not empty"), "{err}");
}

/// `mkfs -d ARCHIVE` unpacks a tar archive as `tar -x` would: GNU tar's PAX archive of
/// the same tree (with its xattrs) gives back the tree `mkfs -d DIR` gives, but for
/// what tar itself leaves out (sockets; ACLs, which GNU tar keeps in records of its own).
#[test]
fn mkfs_d_of_a_tar_archive_gives_the_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    make_tree(&src);
    let archive = tmp.path().join("tree.tar");
    let out = Command::new("tar")
        .args(["--format=posix", "--xattrs", "--xattrs-include=*", "-cf"])
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .output()
        .expect("GNU tar");
    assert!(out.status.success(), "tar: {}", String::from_utf8_lossy(&out.stderr));
    let before = snapshot(&src);
    let dst = unpack_and_export(tmp.path(), &archive, "64M");
    let after = snapshot(&dst);
    let acl = |n: &mut Node| n.xattrs.retain(|k, _| !k.starts_with("system.posix_acl_"));
    let mut want: BTreeMap<String, Node> = before.0.into_iter().filter(|(name, _)| name != "sock").collect();
    want.values_mut().for_each(acl);
    let mut got = after.0;
    got.values_mut().for_each(acl);
    assert_eq!(want.keys().collect::<Vec<_>>(), got.keys().collect::<Vec<_>>());
    for (name, n) in &want {
        assert_eq!(Some(n), got.get(name), "{name:?} differs");
    }
    let links: BTreeSet<BTreeSet<String>> = before.1.into_iter().filter(|s| !s.contains("sock")).collect();
    assert_eq!(links, after.1, "link structure");
    // A name with a `..` component is refused, and the volume stays clean.
    let mut h = tar_entry(tar::EntryType::Regular, "placeholder", 0o644, 1, 5);
    // The name is written raw: `set_path` refuses `..` itself.
    h.as_old_mut().name = [0; 100];
    h.as_old_mut().name[..10].copy_from_slice(b"../outside");
    h.set_cksum();
    archive_refused(tmp.path(), "evil", h, b"hello", "..");
    // So is an owner a volume cannot store, rather than cut to 32 bits.
    let mut h = tar_entry(tar::EntryType::Regular, "f", 0o644, 1, 0);
    h.set_uid(1 << 33);
    h.set_cksum();
    archive_refused(tmp.path(), "big-uid", h, b"", "uid out of range");
}

/// `mkfs -d` of a one-entry archive (`h`, then `data`) in `dir` fails (exit 8) saying
/// `why`, and the volume it made is clean.
fn archive_refused(dir: &Path, name: &str, h: tar::Header, data: &[u8], why: &str) {
    let archive = dir.join(format!("{name}.tar"));
    let mut b = tar::Builder::new(fs::File::create(&archive).unwrap());
    b.append(&h, data).unwrap();
    b.finish().unwrap();
    let img = dir.join(format!("{name}.img"));
    let (code, _, err) = dxfs(&["mkfs", img.to_str().unwrap(), "--size", "16M", "-d", archive.to_str().unwrap()]);
    assert_eq!(code, 8, "{err}");
    assert!(err.contains(why), "{err}");
    assert_image_clean(&img);
}

/// What `tar -x` does with names met twice and links to names it made itself: a later
/// entry replaces an earlier file or empty directory, a hard link finds a file under a
/// directory the archive never listed, and directories get their times after their
/// contents.
#[test]
fn mkfs_d_of_a_tar_archive_replaces_and_links_as_tar_does() {
    use tar::EntryType::{Directory, Link, Regular};
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("t.tar");
    let mut b = tar::Builder::new(fs::File::create(&path).unwrap());
    let mut add = |kind, name: &str, mode, mtime, data: &[u8]| {
        b.append(&tar_entry(kind, name, mode, mtime, data.len() as u64), data).unwrap();
    };
    add(Directory, "empty/", 0o700, 1_500_000_000, b"");
    add(Regular, "x", 0o640, 1_600_000_000, b"first");
    add(Regular, "unlisted/sub/f", 0o640, 1_600_000_000, b"linked");
    add(Regular, "x", 0o640, 1_600_000_000, b"second");
    add(Regular, "empty", 0o640, 1_600_000_000, b"now a file");
    add(Directory, "d/", 0o751, 1_400_000_000, b"");
    add(Regular, "d/inside", 0o640, 1_600_000_000, b"made after d");
    let mut link = tar_entry(Link, "l", 0o644, 1, 0);
    link.set_link_name("unlisted/sub/f").unwrap();
    link.set_cksum();
    b.append(&link, &[][..]).unwrap();
    b.finish().unwrap();
    drop(b);
    let dst = unpack_and_export(tmp.path(), &path, "16M");
    assert_eq!(fs::read(dst.join("x")).unwrap(), b"second");
    assert_eq!(fs::read(dst.join("empty")).unwrap(), b"now a file");
    let f = fs::metadata(dst.join("unlisted/sub/f")).unwrap();
    let l = fs::metadata(dst.join("l")).unwrap();
    assert_eq!((f.ino(), f.nlink()), (l.ino(), 2), "l is a hard link of unlisted/sub/f");
    assert_eq!(fs::metadata(dst.join("unlisted")).unwrap().mode() & 0o7777, 0o755);
    let d = fs::metadata(dst.join("d")).unwrap();
    assert_eq!((d.mode() & 0o7777, d.mtime()), (0o751, 1_400_000_000), "d's time is set after its contents");
}

/// `mkfs -d ARCHIVE` into a new image in `dir` (fsck clean), exported to `dir/out`.
fn unpack_and_export(dir: &Path, archive: &Path, size: &str) -> std::path::PathBuf {
    let img = dir.join("v.img");
    let (code, out, err) = dxfs(&["mkfs", img.to_str().unwrap(), "--size", size, "-d", archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert_image_clean(&img);
    let dst = dir.join("out");
    let (code, out, err) = dxfs(&["export", img.to_str().unwrap(), dst.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert_image_clean(&img);
    dst
}

/// fsck -n of the image file finds nothing.
fn assert_image_clean(img: &Path) {
    let dev = Arc::new(FileDevice::open(img, true).unwrap()) as Arc<dyn BlockDevice>;
    let r = dxfs::fsck::check(dev, false, &mut |_| {}).unwrap();
    assert!(r.errors.is_empty(), "fsck: {:#?}", r.errors);
}

#[test]
fn mkfs_d_refuses_a_missing_directory_and_a_too_small_volume() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("v.img");
    let (code, _, err) = dxfs(&["mkfs", img.to_str().unwrap(), "--size", "16M", "-d", "/nonexistent/dir"]);
    assert_eq!(code, 8);
    assert!(err.contains("/nonexistent/dir") && !err.contains("panicked"), "{err}");
    let src = tmp.path().join("big");
    fs::create_dir(&src).unwrap();
    let chunk: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 253) as u8 + 1).collect();
    for i in 0..24 {
        fs::write(src.join(format!("f{i}")), &chunk).unwrap();
    }
    let img2 = tmp.path().join("small.img");
    let (code, _, err) = dxfs(&["mkfs", img2.to_str().unwrap(), "--size", "16M", "-d", src.to_str().unwrap()]);
    assert_eq!(code, 8);
    assert!(err.contains("space") && !err.contains("panicked"), "{err}");
}

/// `a` and `b` hold the same nodes, with the same contents, attributes and links.
fn assert_same_tree(
    a: &(BTreeMap<String, Node>, BTreeSet<BTreeSet<String>>),
    b: &(BTreeMap<String, Node>, BTreeSet<BTreeSet<String>>),
) {
    assert_eq!(a.0.keys().collect::<Vec<_>>(), b.0.keys().collect::<Vec<_>>());
    for (name, n) in &a.0 {
        let m = &b.0[name];
        let fields = |n: &Node| (n.mode, n.uid, n.gid, n.size, n.mtime, n.atime, n.rdev, n.xattrs.clone());
        assert_eq!(fields(n), fields(m), "{name:?}: mode, ids, size, times, rdev or xattrs differ");
        assert!(n.content == m.content, "{name:?}: contents differ");
    }
    assert_eq!(a.1, b.1, "link structure");
}

/// `IMAGE`'s tree, exported afresh into `dir/NAME`.
fn exported(img: &Path, dir: &Path, name: &str) -> std::path::PathBuf {
    let out = dir.join(name);
    let (code, o, e) = dxfs(&["export", img.to_str().unwrap(), out.to_str().unwrap()]);
    assert_eq!(code, 0, "{o}{e}");
    out
}

/// Without a mount, `cp -a --image`, `import --tar --image` and `rm -r --image` work on a
/// volume's live tree as `cp -a`, `tar -x` and `rm -r` work on a directory: a copy lands
/// under its own name or a new one, a second copy merges into the first and replaces
/// what changed, a directory and a file never replace each other, an archive unpacks
/// into a directory that already holds entries.
#[test]
fn cp_import_and_rm_work_on_an_image() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    make_tree(&src);
    let img = tmp.path().join("v.img");
    let image = img.to_str().unwrap();
    let (code, o, e) = dxfs(&["mkfs", image, "--size", "64M"]);
    assert_eq!(code, 0, "{o}{e}");
    let cp = |args: &[&str]| dxfs(&[&["cp", "-a", "--image", image], args].concat());

    // Into the root under its own name, then one file under a new name.
    let (code, o, e) = cp(&[src.to_str().unwrap(), "/"]);
    assert_eq!(code, 0, "{o}{e}");
    let (code, o, e) = cp(&[src.join("small").to_str().unwrap(), "/src/dir/renamed"]);
    assert_eq!(code, 0, "{o}{e}");
    assert_image_clean(&img);
    let out = exported(&img, tmp.path(), "out1");
    let mut got = snapshot(&out.join("src"));
    let renamed = got.0.remove("dir/renamed").expect("the copy under a new name");
    assert_eq!(renamed.content, b"hello\n");
    got.1.retain(|s| !s.contains("dir/renamed"));
    // The copy under a new name moved `dir`'s times; all else is as in the source.
    let mut want = snapshot(&src);
    want.0.get_mut("dir").unwrap().mtime = got.0["dir"].mtime;
    assert_same_tree(&want, &got);

    // A second copy after the source changed merges into the first.
    fs::write(src.join("small"), b"changed, through both links\n").unwrap();
    fs::write(src.join("dir/new"), b"new").unwrap();
    let (code, o, e) = cp(&[src.to_str().unwrap(), "/"]);
    assert_eq!(code, 0, "{o}{e}");
    let out = exported(&img, tmp.path(), "out2");
    let mut got = snapshot(&out.join("src"));
    assert!(got.0.remove("dir/renamed").is_some(), "an entry the source lacks stays, as with cp");
    got.1.retain(|s| !s.contains("dir/renamed"));
    assert_same_tree(&snapshot(&src), &got);

    // A directory over a file and a file over a directory are refused, and the rest
    // of the copy goes on.
    let (code, _, e) = cp(&[src.join("dir").to_str().unwrap(), src.join("small").to_str().unwrap(), "/src/dir/sub"]);
    assert_eq!(code, 0, "nothing is taken yet in sub: {e}");
    let (code, _, e) = cp(&[src.join("small").to_str().unwrap(), "/src/dir"]);
    assert_eq!(code, 0, "{e}");
    let (code, _, e) = cp(&[src.join("dir").to_str().unwrap(), "/src/small"]);
    assert_eq!(code, 1, "a directory over a file: {e}");
    assert!(e.contains("cannot copy") && e.contains("not a directory"), "{e}");
    fs::create_dir(tmp.path().join("other")).unwrap();
    fs::write(tmp.path().join("other/sub"), b"a file named as a directory").unwrap();
    let (code, _, e) = cp(&[tmp.path().join("other/sub").to_str().unwrap(), "/src/dir"]);
    assert_eq!(code, 1, "a file over a directory: {e}");
    assert!(e.contains("is a directory"), "{e}");
    let (code, _, e) = cp(&[src.join("small").to_str().unwrap(), src.join("fifo").to_str().unwrap(), "/src/nowhere"]);
    assert_eq!(code, 1, "{e}");
    assert!(e.contains("is not a directory"), "{e}");
    assert_image_clean(&img);

    // Inside a tree, an entry that cannot be copied is reported and the copy goes on
    // with its siblings, as cp -a does (exit 1); so does an archive's (exit 2, as tar).
    let mixed = tmp.path().join("mixed");
    fs::create_dir_all(mixed.join("b")).unwrap();
    fs::write(mixed.join("b/inner"), b"keeps b from being removed").unwrap();
    fs::write(mixed.join("a"), b"a1").unwrap();
    let (code, _, e) = cp(&[mixed.to_str().unwrap(), "/"]);
    assert_eq!(code, 0, "{e}");
    fs::remove_dir_all(mixed.join("b")).unwrap();
    fs::write(mixed.join("b"), b"now a file").unwrap();
    fs::write(mixed.join("a"), b"a2").unwrap();
    fs::write(mixed.join("c"), b"c").unwrap();
    let (code, _, e) = cp(&[mixed.to_str().unwrap(), "/"]);
    assert_eq!(code, 1, "{e}");
    assert!(e.contains(&format!("cannot copy '{}'", mixed.join("b").display())) && e.contains("is a directory"), "{e}");
    let out = exported(&img, tmp.path(), "out-mixed");
    assert_eq!(fs::read(out.join("mixed/a")).unwrap(), b"a2", "the sibling before the refused entry");
    assert_eq!(fs::read(out.join("mixed/c")).unwrap(), b"c", "the sibling after it");
    assert!(out.join("mixed/b").is_dir(), "the directory is not replaced by a file");
    // The archive names the refused entry first (a non-empty directory in the way).
    fs::write(mixed.join("a"), b"a3").unwrap();
    fs::write(mixed.join("c"), b"c3").unwrap();
    let mixed_tar = tmp.path().join("mixed.tar");
    let ok = Command::new("tar").arg("-cf").arg(&mixed_tar).arg("-C").arg(&mixed).args(["b", "a", "c"]).status();
    assert!(ok.expect("GNU tar").success());
    let (code, _, e) = dxfs(&["import", "--image", image, "--tar", mixed_tar.to_str().unwrap(), "/mixed"]);
    assert_eq!(code, 2, "{e}");
    assert!(e.lines().count() == 1 && e.contains("b:"), "{e}");
    assert_image_clean(&img);
    let out = exported(&img, tmp.path(), "out-mixed-tar");
    assert_eq!(fs::read(out.join("mixed/a")).unwrap(), b"a3");
    assert_eq!(fs::read(out.join("mixed/c")).unwrap(), b"c3");
    assert!(out.join("mixed/b").is_dir());

    // An archive of the source unpacks into a directory holding other entries.
    let archive = tmp.path().join("tree.tar");
    let ok = Command::new("tar")
        .args(["--format=posix", "--xattrs", "--xattrs-include=*", "-cf"])
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .status()
        .expect("GNU tar");
    assert!(ok.success());
    let (code, o, e) = dxfs(&["import", "--image", image, "--tar", archive.to_str().unwrap(), "/src/dir/sub"]);
    assert_eq!(code, 0, "{o}{e}");
    let (code, _, e) = dxfs(&["import", "--image", image, "--tar", archive.to_str().unwrap(), "/src/small"]);
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("not a directory"), "{e}");
    assert_image_clean(&img);
    let out = exported(&img, tmp.path(), "out3");
    let got = snapshot(&out.join("src/dir/sub"));
    assert_eq!(got.0["small"].content, b"changed, through both links\n");
    assert_eq!(
        got.0["zero-length"].xattrs.get("user.empty").map(Vec::as_slice),
        Some(&b""[..]),
        "sub's own entry stays"
    );
    let acl = |n: &mut Node| n.xattrs.retain(|k, _| !k.starts_with("system.posix_acl_"));
    for (name, mut n) in snapshot(&src).0.into_iter().filter(|(name, _)| !name.is_empty() && name != "sock") {
        let mut g = got.0.get(&name).unwrap_or_else(|| panic!("{name} unpacked")).clone();
        acl(&mut n);
        acl(&mut g);
        assert_eq!(n, g, "{name} differs");
    }

    // rm -r removes inside the image.
    let (code, o, e) = dxfs(&["rm", "-r", "--image", image, "/src/dir"]);
    assert_eq!(code, 0, "{o}{e}");
    let (code, _, e) = dxfs(&["rm", "--image", image, "/src/dir"]);
    assert_eq!(code, 1, "{e}");
    assert_image_clean(&img);
    let out = exported(&img, tmp.path(), "out4");
    assert!(!out.join("src/dir").exists() && out.join("src/small").exists());
}
