//! The `dxfs` command: mkfs, fsck exit codes, info, debug hash against debugfs.

mod common;

use common::dxfs;

use std::path::Path;
use std::process::Command;

#[test]
fn mkfs_info_fsck_round_trip_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let img_s = img.to_str().unwrap();
    let (code, out, err) = dxfs(&["mkfs", img_s, "--size", "64M", "--label", "test-vol", "--hash", "tea"]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);
    // A second mkfs must refuse without --force, and leave the volume intact.
    let (code, _, err) = dxfs(&["mkfs", img_s]);
    assert_eq!(code, 8);
    assert!(err.contains("--force"), "{err}");
    let (code, out, _) = dxfs(&["info", "--json", img_s]);
    assert_eq!(code, 0);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["label"], "test-vol");
    assert_eq!(j["hash"], "tea");
    assert_eq!(j["block_count"], 16384);
    assert_eq!(j["inodes"], 1);
    let (code, out, _) = dxfs(&["fsck", "-n", img_s]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("clean"));
    let (code, _, _) = dxfs(&["mkfs", img_s, "--force", "--seed", "6b1c5a3e-9d2f-4e7a-8c11-0f3b2a4d5e6f"]);
    assert_eq!(code, 0);
    let (_, out, _) = dxfs(&["info", img_s]);
    assert!(out.contains("6b1c5a3e-9d2f-4e7a-8c11-0f3b2a4d5e6f"), "{out}");
}

#[test]
fn fsck_exit_codes_follow_e2fsck() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let img_s = img.to_str().unwrap();
    assert_eq!(dxfs(&["mkfs", img_s, "--size", "16M"]).0, 0);
    // Damage the backup superblock: -n reports it (4), a repair fixes it (1), then 0.
    let mut bytes = std::fs::read(&img).unwrap();
    let last = bytes.len() - 4096;
    bytes[last + 200] ^= 0xFF;
    std::fs::write(&img, &bytes).unwrap();
    assert_eq!(dxfs(&["fsck", "-n", img_s]).0, 4);
    let (code, out, _) = dxfs(&["fsck", img_s]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(dxfs(&["fsck", "-n", img_s]).0, 0);
    // Operational errors: a missing file, a file that is no volume.
    assert_eq!(dxfs(&["fsck", "-n", dir.path().join("missing").to_str().unwrap()]).0, 8);
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
    let (code, _, err) = dxfs(&["fsck", "-n", junk.to_str().unwrap()]);
    assert_eq!(code, 8);
    assert!(err.contains("not a dxfs volume"), "{err}");
    assert_eq!(dxfs(&["fsck", "--bogus"]).0, 8);
}

/// A trim hands back every block the map calls free: on an image whose map calls live
/// metadata free (its count moved with the bit, so the map agrees with itself), that
/// metadata. An image this host did not leave as it is is walked first and refused;
/// once `dxfs fsck` has repaired it, the trim runs.
#[test]
fn trim_walks_an_image_written_since_this_host_left_it() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let img_s = img.to_str().unwrap();
    assert_eq!(dxfs(&["mkfs", img_s, "--size", "16M"]).0, 0);
    common::mutate::free_the_roots_inode_block(&img);
    let before = std::fs::read(&img).unwrap();
    let (code, out, err) = dxfs(&["trim", img_s]);
    assert_eq!(code, 8, "{out}{err}");
    assert!(err.contains("not as this host left it") && err.contains("fsck -n found"), "{err}");
    assert!(std::fs::read(&img).unwrap() == before, "a refused trim changed the image");
    let (code, out, _) = dxfs(&["fsck", img_s]);
    assert_eq!(code, 1, "{out}");
    let (code, out, err) = dxfs(&["trim", img_s]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(dxfs(&["fsck", "-n", img_s]).0, 0);
}

#[test]
fn mkfs_and_fsck_names_work_through_argv0() {
    let dir = tempfile::tempdir().unwrap();
    let mkfs = dir.path().join("mkfs.dxfs");
    let fsck = dir.path().join("fsck.dxfs");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_dxfs"), &mkfs).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_dxfs"), &fsck).unwrap();
    let img = dir.path().join("v.img");
    let s = Command::new(&mkfs).args([img.to_str().unwrap(), "--size", "16M"]).status().unwrap();
    assert!(s.success());
    let s = Command::new(&fsck).args(["-n", img.to_str().unwrap()]).status().unwrap();
    assert_eq!(s.code(), Some(0));
}

/// `dxfs debug hash` prints what e2fsprogs' debugfs prints (when debugfs is installed).
#[test]
fn debug_hash_matches_debugfs() {
    let debugfs = Path::new("/usr/sbin/debugfs");
    let mkext4 = Path::new("/usr/sbin/mkfs.ext4");
    if !debugfs.exists() || !mkext4.exists() {
        assert!(std::env::var_os("DXFS_TEST_NO_SKIP").is_none_or(|v| v == "0"), "a case would be skipped");
        eprintln!("skipped: debugfs or mkfs.ext4 not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("ext4.img");
    let st = Command::new(mkext4).args(["-q", "-F", img.to_str().unwrap(), "4M"]).status().unwrap();
    assert!(st.success());
    let seed = "6b1c5a3e-9d2f-4e7a-8c11-0f3b2a4d5e6f";
    for (v, name) in
        [("0", "hello"), ("1", "caf\u{e9}"), ("4", "caf\u{e9}"), ("2", "a-much-longer-file-name.txt"), ("5", "x")]
    {
        let want = Command::new(debugfs)
            .args(["-R", &format!("dx_hash -h {v} -s {seed} {name}"), img.to_str().unwrap()])
            .output()
            .unwrap();
        let want = String::from_utf8_lossy(&want.stdout);
        let want = want.lines().find(|l| l.starts_with("Hash of")).expect("debugfs printed a hash").to_string();
        let (code, got, _) = dxfs(&["debug", "hash", "-h", v, "-s", seed, name]);
        assert_eq!(code, 0);
        assert_eq!(got.trim(), want.trim(), "version {v} name {name}");
    }
}

/// mkfs refuses whatever an image or device already holds — another filesystem or any
/// data — without --force, and leaves it untouched; it refuses a --size larger than a
/// device; the root directory belongs to whoever runs mkfs unless -E root_owner says.
#[test]
fn mkfs_refuses_filesystems_and_data() {
    let dir = tempfile::tempdir().unwrap();
    // A real ext4 image (e2fsprogs).
    let ext4 = dir.path().join("ext4.img");
    std::fs::write(&ext4, vec![0u8; 8 << 20]).unwrap();
    let made = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&ext4).status();
    if made.is_ok_and(|s| s.success()) {
        let before = std::fs::read(&ext4).unwrap();
        let (code, _, err) = dxfs(&["mkfs", ext4.to_str().unwrap()]);
        assert_eq!(code, 8, "{err}");
        assert!(err.contains("ext2/ext3/ext4") && err.contains("--force"), "{err}");
        assert!(std::fs::read(&ext4).unwrap() == before, "the ext4 image was changed");
    } else {
        assert!(std::env::var_os("DXFS_TEST_NO_SKIP").is_none_or(|v| v == "0"), "a case would be skipped");
        eprintln!("mkfs.ext4 not found: the ext4 case is skipped");
    }
    // An XFS image, when xfsprogs is installed.
    let xfs = dir.path().join("xfs.img");
    std::fs::write(&xfs, vec![0u8; 300 << 20]).unwrap();
    if Command::new("mkfs.xfs").args(["-q", "-f"]).arg(&xfs).status().is_ok_and(|s| s.success()) {
        let (code, _, err) = dxfs(&["mkfs", xfs.to_str().unwrap()]);
        assert_eq!(code, 8, "{err}");
        assert!(err.contains("XFS"), "{err}");
    }
    std::fs::remove_file(&xfs).unwrap();
    // A plain data file.
    let data = dir.path().join("data.bin");
    let bytes: Vec<u8> = (0..10u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&data, &bytes).unwrap();
    let (code, _, err) = dxfs(&["mkfs", data.to_str().unwrap()]);
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("holds data"), "{err}");
    assert!(std::fs::read(&data).unwrap() == bytes, "the data file was changed");
    // With --force it goes ahead; an empty (sparse) file needs no force.
    let (code, out, err) = dxfs(&["mkfs", "-f", data.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let empty = dir.path().join("empty.img");
    std::fs::File::create(&empty).unwrap().set_len(16 << 20).unwrap();
    let (code, out, err) = dxfs(&["mkfs", empty.to_str().unwrap(), "-E", "root_owner=1234:5678"]);
    assert_eq!(code, 0, "{out}{err}");
    let dev = std::sync::Arc::new(dxfs::block::FileDevice::open(&empty, true).unwrap());
    let vol = dxfs::Volume::open(dev, dxfs::OpenOptions { read_only: true, ..Default::default() }).unwrap();
    let root = vol.getattr(vol.root()).unwrap();
    assert_eq!((root.uid, root.gid), (1234, 5678));
    drop(vol);
    let (code, _, err) = dxfs(&["mkfs", "-f", empty.to_str().unwrap(), "-E", "root_owner=oops"]);
    assert_eq!(code, 8, "{err}");
    let (code, out, err) = dxfs(&["mkfs", "-f", empty.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let dev = std::sync::Arc::new(dxfs::block::FileDevice::open(&empty, true).unwrap());
    let vol = dxfs::Volume::open(dev, dxfs::OpenOptions { read_only: true, ..Default::default() }).unwrap();
    let me = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
    let root = vol.getattr(vol.root()).unwrap();
    assert_eq!((root.uid, root.gid), me, "the caller owns the root by default");
    drop(vol);
    for img in [&data, &empty] {
        let (code, out, _) = dxfs(&["fsck", "-n", img.to_str().unwrap()]);
        assert_eq!(code, 0, "{out}");
    }
    // --size larger than a block device is an error, not a smaller volume.
    let backing = dir.path().join("loop.img");
    std::fs::File::create(&backing).unwrap().set_len(32 << 20).unwrap();
    let Ok(out) = Command::new("losetup").args(["-f", "--show"]).arg(&backing).output() else { return };
    let loopdev = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || loopdev.is_empty() {
        assert!(std::env::var_os("DXFS_TEST_NO_SKIP").is_none_or(|v| v == "0"), "a case would be skipped");
        eprintln!("losetup failed: the block device case is skipped");
        return;
    }
    let (code, _, err) = dxfs(&["mkfs", "-f", &loopdev, "--size", "64M"]);
    let _ = Command::new("losetup").arg("-d").arg(&loopdev).status();
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("larger than the device"), "{err}");
}

/// A mount that other users can reach must keep the kernel's permission checks.
#[test]
fn allow_other_without_permission_checks_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let (code, _, _) = dxfs(&["mkfs", img.to_str().unwrap(), "--size", "16M"]);
    assert_eq!(code, 0);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let args = ["mount", img.to_str().unwrap(), mnt.to_str().unwrap(), "--allow-other", "--no-default-permissions"];
    let (code, _, err) = dxfs(&args);
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("allow_other needs the kernel's permission checks"), "{err}");
    let (code, out, _) = dxfs(&["fsck", "-n", img.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
}

/// Mounting on a regular file is a clear error, before anything is mounted.
#[test]
fn mount_on_a_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    assert_eq!(dxfs(&["mkfs", img.to_str().unwrap(), "--size", "16M"]).0, 0);
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let (code, _, err) = dxfs(&["mount", img.to_str().unwrap(), file.to_str().unwrap()]);
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("not a directory"), "{err}");
    let (code, out, _) = dxfs(&["fsck", "-n", img.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn resize_grows_and_info_shows_the_new_size() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let img_s = img.to_str().unwrap();
    assert_eq!(dxfs(&["mkfs", img_s, "--size", "16M"]).0, 0);
    let (code, out, err) = dxfs(&["resize", img_s, "200M"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("grown from 4096 to 51200 blocks"), "{out}");
    assert!(out.contains("1 new bitmap blocks"), "{out}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 200 << 20);
    let (_, out, _) = dxfs(&["info", img_s]);
    assert!(out.contains("Block count:              51200"), "{out}");
    assert!(out.contains("(spilled_bitmap)") && out.contains("1 more in the data area"), "{out}");
    // +SIZE adds; without SIZE the volume fills its (here externally extended) image.
    assert_eq!(dxfs(&["resize", img_s, "+4M"]).0, 0);
    let (_, out, _) = dxfs(&["info", "--json", img_s]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["block_count"], 52224);
    std::fs::OpenOptions::new().write(true).open(&img).unwrap().set_len(256 << 20).unwrap();
    let (code, out, err) = dxfs(&["resize", img_s]);
    assert_eq!(code, 0, "{out}{err}");
    let (_, out, _) = dxfs(&["info", "--json", img_s]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["block_count"], 65536);
    let (code, out, _) = dxfs(&["resize", img_s, "256M"]);
    assert_eq!(code, 0);
    assert!(out.contains("nothing to do"), "{out}");
    let (code, _, err) = dxfs(&["resize", img_s, "100M"]);
    assert_eq!(code, 8);
    assert!(err.contains("shrinking is not supported"), "{err}");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 256 << 20);
    let (code, out, _) = dxfs(&["fsck", "-n", img_s]);
    assert_eq!(code, 0, "{out}");
}

/// `dxfs quota --image`: set, show and remove a directory's quota on an unmounted
/// volume; bad sizes are refused; `info` names the feature; fsck clean after.
#[test]
fn quota_on_an_image() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("v.img");
    let img_s = img.to_str().unwrap();
    assert_eq!(dxfs(&["mkfs", img_s, "--size", "16M"]).0, 0);
    let (_, out, _) = dxfs(&["info", img_s]);
    assert!(out.contains("(dir_quota)"), "{out}");
    {
        let dev = dxfs::block::open_device(img_s, false).unwrap();
        let vol = dxfs::Volume::open(dev, dxfs::OpenOptions::default()).unwrap();
        let q = vol.mkdir(vol.root(), b"q", 0o755, 0, 0).unwrap().ino;
        vol.write(vol.create(q, b"f", 0o644, 0, 0).unwrap().ino, 0, &[1u8; 8192]).unwrap();
        vol.close().unwrap();
    }
    let (code, out, err) = dxfs(&["quota", "--image", img_s, "q"]);
    assert_eq!((code, out.trim()), (0, "q: no quota"), "{err}");
    let (code, out, err) = dxfs(&["quota", "--image", img_s, "q", "1M"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "q: quota 1.0M, used 12K (1%)");
    let (_, out, _) = dxfs(&["quota", "--image", img_s, "q"]);
    assert_eq!(out.trim(), "q: quota 1.0M, used 12K (1%)");
    for bad in ["1", "lots", "0"] {
        let (code, _, err) = dxfs(&["quota", "--image", img_s, "q", bad]);
        assert_eq!(code, 2, "{bad}: {err}");
    }
    let (code, _, err) = dxfs(&["quota", "--image", img_s, "nothere", "1M"]);
    assert_eq!(code, 1, "{err}");
    let (code, out, _) = dxfs(&["quota", "--image", img_s, "q", "none"]);
    assert_eq!((code, out.trim()), (0, "q: no quota"));
    let (code, out, err) = dxfs(&["fsck", "-n", img_s]);
    assert_eq!(code, 0, "{out}{err}");
}
