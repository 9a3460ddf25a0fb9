//! The `dxfs` command: mkfs, fsck exit codes, info, debug hash against debugfs.

use std::path::Path;
use std::process::Command;

fn dxfs(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dxfs")).args(args).output().expect("run dxfs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

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
