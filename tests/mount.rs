//! Real system calls through a real FUSE mount: `dxfs mount` runs as a child process
//! on a temporary directory, the tests drive it with std::fs, nix and libc, unmount it
//! and check the image with `dxfs fsck -n`.
//!
//! Skipped (with a message) unless running as root with /dev/fuse and fusermount3.
//!
//! With `DXFS_TEST_NBD=1` every volume is served to the daemon over NBD (nbdkit's file
//! plugin on a Unix socket, `nbd+unix://` address) instead of being opened as a file;
//! the few tests about image files themselves (the file lock, mount(8), a user other
//! than root) say so and skip. `.ci/run` runs the suite both ways.

mod common;

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dxfs::block::FileDevice;
use dxfs::{mkfs, MkfsOptions};
use nix::fcntl::{renameat2, FallocateFlags, RenameFlags, AT_FDCWD};
use nix::sys::stat::{utimensat, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;

/// Why the mount tests cannot run here, if they cannot.
fn skip_reason() -> Option<String> {
    // /proc/self belongs to the effective user of the process.
    match fs::metadata("/proc/self") {
        Ok(m) if m.uid() == 0 => {}
        _ => return Some("not running as root".into()),
    }
    if let Err(e) = OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        return Some(format!("/dev/fuse: {e}"));
    }
    match Command::new("fusermount3").arg("-V").stdout(Stdio::null()).status() {
        Ok(s) if s.success() => None,
        _ => Some("fusermount3 not found (apt-get install fuse3)".into()),
    }
}

/// Say why a test is skipped; with `DXFS_TEST_NO_SKIP=1` (CI, where every tool is
/// installed and the suite runs as root) a skip is a failure instead: a test that did
/// not run must not count as passed.
fn skipping(why: &str) {
    assert!(
        std::env::var_os("DXFS_TEST_NO_SKIP").is_none_or(|v| v == "0"),
        "skipped, and DXFS_TEST_NO_SKIP forbids it: {why}"
    );
    eprintln!("skipping {why}");
}

macro_rules! require_fuse {
    () => {
        if let Some(why) = skip_reason() {
            skipping(&format!("{}: {why}", module_path!()));
            return;
        }
    };
}

fn dxfs() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dxfs"));
    c.env("DXFS_STATE_DIR", state_dir());
    c
}

/// Where the daemons and tools of this suite keep their records of the volumes they left
/// (not the host's /var/lib/dxfs).
fn state_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("dxfs-state")
}

/// A temporary directory holding an image and a mount point.
struct Scratch {
    tmp: tempfile::TempDir,
    image: PathBuf,
    mnt: PathBuf,
    /// The NBD server that serves `image` when the suite runs over NBD.
    nbd: std::sync::Mutex<Option<NbdServer>>,
}

/// Whether volumes are mounted over NBD (`DXFS_TEST_NBD=1`).
fn over_nbd() -> bool {
    std::env::var_os("DXFS_TEST_NBD").is_some_and(|v| v != "0")
}

/// Skip a test that is about image files themselves when the suite runs over NBD.
macro_rules! not_over_nbd {
    ($why:expr) => {
        if over_nbd() {
            eprintln!("skipping over NBD: {}", $why);
            return;
        }
    };
}

/// nbdkit serving an image file on a Unix socket; killed when dropped.
struct NbdServer {
    child: Child,
    sock: PathBuf,
}

impl NbdServer {
    fn start(image: &Path, sock: PathBuf) -> NbdServer {
        NbdServer::start_with(image, sock, &[])
    }

    /// With nbdkit's filter arguments `filters` (e.g. `--filter=delay`, `wdelay=20ms`).
    fn start_with(image: &Path, sock: PathBuf, filters: &[&str]) -> NbdServer {
        let (flags, params): (Vec<&str>, Vec<&str>) = filters.iter().partition(|a| a.starts_with("--"));
        let child = Command::new("nbdkit")
            .args(["-f", "-U"])
            .arg(&sock)
            .args(flags)
            .arg("file")
            .arg(image)
            .args(params)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdkit (apt-get install nbdkit)");
        // The socket file appears before nbdkit accepts on it: wait for a connection.
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(Instant::now() < deadline, "nbdkit did not listen on {}", sock.display());
            std::thread::sleep(Duration::from_millis(10));
        }
        NbdServer { child, sock }
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Scratch {
    /// A fresh volume of `mib` MiB, made with the library.
    fn new(mib: u64) -> Scratch {
        let tmp = tempfile::tempdir().expect("tempdir");
        // Other users must reach the mount point for the permission tests.
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let image = tmp.path().join("image");
        let mnt = tmp.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        let dev = FileDevice::create(&image, mib << 20).expect("image");
        mkfs(Arc::new(dev), &MkfsOptions::default()).expect("mkfs");
        let nbd = over_nbd().then(|| NbdServer::start(&image, tmp.path().join("nbd.sock")));
        Scratch { tmp, image, mnt, nbd: std::sync::Mutex::new(nbd) }
    }

    /// What `dxfs mount` is given: the image, or its NBD address (an nbdkit that is no
    /// longer there is started again first).
    fn source(&self) -> std::ffi::OsString {
        let mut nbd = self.nbd.lock().unwrap();
        match nbd.as_mut() {
            Some(n) => {
                let listening = std::os::unix::net::UnixStream::connect(&n.sock).is_ok();
                if !listening || !matches!(n.child.try_wait(), Ok(None)) {
                    let _ = n.child.kill();
                    let _ = n.child.wait();
                    let sock = n.sock.clone();
                    let _ = fs::remove_file(&sock);
                    *n = NbdServer::start(&self.image, sock);
                }
                format!("nbd+unix:///?socket={}", n.sock.display()).into()
            }
            None => self.image.clone().into(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mnt.join(name)
    }

    /// `dxfs mount IMAGE MNT ARGS` in the foreground, returned once the mount is live.
    /// The daemon's stderr goes to `daemon.log`, shown if the test fails.
    fn mount(&self, args: &[&str]) -> Mounted {
        self.mount_with_env(args, &[])
    }

    /// As `mount`, with extra environment variables for the daemon.
    fn mount_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> Mounted {
        let log = self.tmp.path().join("daemon.log");
        let child = dxfs()
            .envs(env.iter().copied())
            .arg("mount")
            .arg(self.source())
            .arg(&self.mnt)
            .args(args)
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("spawn dxfs");
        let mut m = Mounted { child: Some(child), mnt: self.mnt.clone(), image: self.image.clone(), log: Some(log) };
        m.wait_mounted();
        m
    }

    /// `dxfs fsck -n` must find the image clean.
    fn fsck(&self) {
        let out = dxfs().arg("fsck").arg("-n").arg(&self.image).output().unwrap();
        assert!(
            out.status.success(),
            "fsck: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The per-mount options of the mount on `mnt`, as /proc/self/mountinfo lists them.
fn mount_options(mnt: &Path) -> String {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info.lines().find(|l| l.split(' ').nth(4) == Some(mnt.to_str().unwrap())).unwrap().to_string();
    line.split(' ').nth(5).unwrap().to_string()
}

fn is_mounted(mnt: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let want = mnt.as_os_str().as_bytes();
    info.lines().any(|l| l.split(' ').nth(4).is_some_and(|p| p.as_bytes() == want))
}

/// A mount served by a `dxfs mount` child. Dropping it (say, when a test fails)
/// detaches the mount and kills that child only.
struct Mounted {
    child: Option<Child>,
    mnt: PathBuf,
    image: PathBuf,
    log: Option<PathBuf>,
}

impl Mounted {
    fn wait_mounted(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !is_mounted(&self.mnt) {
            if let Some(c) = self.child.as_mut() {
                if let Some(st) = c.try_wait().unwrap() {
                    panic!("dxfs mount exited before mounting: {st}");
                }
            }
            assert!(Instant::now() < deadline, "{} did not get mounted", self.mnt.display());
            std::thread::sleep(Duration::from_millis(10));
        }
        // The mount is in the table before the daemon has answered INIT; a stat waits for
        // that. (An unmount before it, as a test that only mounts and unmounts did, ends
        // the daemon's handshake with ENODEV: "cannot mount", exit 8.)
        let _ = fs::metadata(&self.mnt);
    }

    /// `fusermount3 -u`, then the daemon must exit 0 (it commits first).
    fn unmount(mut self) {
        let st = unmount_by("fusermount3", &self.mnt);
        assert!(st.success(), "fusermount3 -u {}: {st}", self.mnt.display());
        let mut child = self.child.take().expect("a foreground child");
        let st = wait_timeout(&mut child, Duration::from_secs(20));
        assert_eq!(st.code(), Some(0), "dxfs mount exit status");
        // The daemon is gone: nothing for the drop to stop (over NBD, killing the image's
        // users would kill the nbdkit serving it, racing the next mount's connect).
        self.image = PathBuf::new();
    }

    /// `unmount`, waiting up to 5 s for the mount to stop being busy: the kernel drops
    /// the last reference to a file used for AIO from a worker after close returns, so
    /// an unmount right after can find it still open.
    fn unmount_when_idle(self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let st = Command::new("umount").arg(&self.mnt).stderr(Stdio::null()).status().unwrap();
            if st.success() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut m = self;
        let mut child = m.child.take().expect("a foreground child");
        let st = wait_timeout(&mut child, Duration::from_secs(20));
        assert_eq!(st.code(), Some(0), "dxfs mount exit status");
        assert!(!is_mounted(&m.mnt), "still mounted");
        m.image = PathBuf::new(); // the daemon is gone: nothing for the drop to stop
    }

    /// The daemon, to be waited for later (after an unmount that did not wait for it).
    fn detach_child(mut self) -> Child {
        let child = self.child.take().expect("a foreground child");
        // Not the Drop below: it would kill the daemon in the middle of its last commit.
        std::mem::forget(self);
        child
    }

    /// SIGKILL the daemon mid-flight and detach the dead mount.
    fn kill9(self) {
        self.kill9_and(|| {});
    }

    /// `kill9`, running `after_kill` once the daemon is dead and before the unmount (to
    /// close files that would keep the mount busy).
    fn kill9_and(mut self, after_kill: impl FnOnce()) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        after_kill();
        // Over io_uring the kernel tears the dead daemon's rings down asynchronously: the
        // connection ends (and a caller blocked on it lets go of its file) a moment after
        // the process is gone, so the unmount may find the mount busy until then.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let st = Command::new("fusermount3").arg("-u").arg(&self.mnt).stderr(Stdio::null()).status().unwrap();
            if st.success() {
                break;
            }
            assert!(Instant::now() < deadline, "fusermount3 -u of a dead mount: {st}");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Nothing is left to stop: the drop must not go after other holders of the image
        // (an NBD server serving it, when the suite runs over NBD).
        self.image = PathBuf::new();
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(log) = &self.log {
                eprintln!("daemon log:\n{}", fs::read_to_string(log).unwrap_or_default());
            }
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3").arg("-u").arg("-z").arg(&self.mnt).stderr(Stdio::null()).status();
        }
        match self.child.as_mut() {
            Some(c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            // A daemon is not our child: stop the processes holding our image open.
            None => kill_users(&self.image),
        }
    }
}

/// Unmount `mnt` with `umount` or `fusermount3 -u` (`program`), retried for up to 2 s
/// while it fails with the directory still mounted: another test thread's child process
/// (between its fork and its exec) briefly holds a copy of every descriptor this process
/// has open, files on this mount included, and the kernel then refuses with EBUSY.
fn unmount_by(program: &str, mnt: &Path) -> std::process::ExitStatus {
    let mut tries = 0;
    loop {
        let mut cmd = Command::new(program);
        if program == "fusermount3" {
            cmd.arg("-u");
        }
        let st = cmd.arg(mnt).stderr(Stdio::null()).status().unwrap();
        tries += 1;
        if st.success() || !is_mounted(mnt) || tries == 100 {
            return st;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_timeout(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(Instant::now() < deadline, "dxfs mount did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Processes that have `file` open.
fn users_of(file: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    for p in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<i32>() else { continue };
        let fds = fs::read_dir(p.path().join("fd")).into_iter().flatten().flatten();
        if fds.into_iter().any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t == file)) {
            pids.push(pid);
        }
    }
    pids
}

fn kill_users(file: &Path) {
    for pid in users_of(file) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// Wait until no process has `file` open (a daemon that is not our child has exited).
fn wait_unused(file: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !users_of(file).is_empty() {
        assert!(Instant::now() < deadline, "{} still in use", file.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    r.expect_err("expected an error").raw_os_error().expect("an OS error")
}

fn nix_errno<T: std::fmt::Debug>(r: nix::Result<T>) -> i32 {
    r.expect_err("expected an error") as i32
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<()> {
    let (p, n) = (cstr(p), CString::new(name).unwrap());
    // SAFETY: p and n are NUL-terminated and outlive the call; value is valid for
    // value.len() bytes.
    let r = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// getxattr into a buffer of `cap` bytes (0: ask for the size only).
fn getxattr(p: &Path, name: &str, cap: usize) -> io::Result<Vec<u8>> {
    let (p, n) = (cstr(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; cap];
    // SAFETY: p and n are NUL-terminated; buf is valid for writes of cap bytes (with
    // cap 0 the kernel writes nothing and returns the size).
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), cap) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if cap == 0 {
        return Ok(vec![0; r as usize]);
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// listxattr into a buffer of `cap` bytes, split into names.
fn listxattr(p: &Path, cap: usize) -> io::Result<BTreeSet<String>> {
    let p = cstr(p);
    let mut buf = vec![0u8; cap];
    // SAFETY: p is NUL-terminated; buf is valid for writes of cap bytes.
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), cap) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf.split(|&b| b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect())
}

fn removexattr(p: &Path, name: &str) -> io::Result<()> {
    let (p, n) = (cstr(p), CString::new(name).unwrap());
    // SAFETY: p and n are NUL-terminated and outlive the call.
    let r = unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Deterministic content: byte i of a file is a function of i.
/// Store `bytes` at `at` through a shared writable mapping of the first `len` bytes of
/// `f` (at least `at + bytes.len()` long), then msync and unmap it: the pages reach the
/// volume by write-back.
fn store_through_mapping(f: &File, len: usize, at: usize, bytes: &[u8]) {
    assert!(at + bytes.len() <= len);
    // SAFETY: maps `len` bytes of the open file; the mapping is checked, written only
    // within its bounds (asserted above), synced and unmapped before `f` can be closed.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
        std::slice::from_raw_parts_mut(p.cast::<u8>(), len)[at..at + bytes.len()].copy_from_slice(bytes);
        assert_eq!(libc::msync(p, len, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(p, len), 0);
    }
}

fn pattern(offset: u64, len: usize) -> Vec<u8> {
    (offset..offset + len as u64).map(|i| (i.wrapping_mul(0x9E37_79B9) >> 13) as u8).collect()
}

#[test]
fn file_io() {
    require_fuse!();
    let s = Scratch::new(256);
    // The kernel's writeback cache and two serving threads: the paths the defaults skip.
    let m = s.mount(&["-o", "writeback_cache,threads=2"]);
    let a = s.path("a");

    // O_CREAT|O_EXCL, then O_EXCL on an existing name.
    let mut f = OpenOptions::new().write(true).create_new(true).mode(0o640).open(&a).unwrap();
    f.write_all(b"hello world").unwrap();
    drop(f);
    assert_eq!(errno(OpenOptions::new().write(true).create_new(true).open(&a)), libc::EEXIST);
    assert_eq!(fs::metadata(&a).unwrap().mode() & 0o7777, 0o640);

    // O_APPEND appends whatever the offset.
    let mut f = OpenOptions::new().append(true).open(&a).unwrap();
    f.write_all(b", again").unwrap();
    drop(f);
    assert_eq!(fs::read(&a).unwrap(), b"hello world, again");

    // pread / pwrite, and a read past the end.
    let f = OpenOptions::new().read(true).write(true).open(&a).unwrap();
    f.write_at(b"HELLO", 0).unwrap();
    let mut buf = [0u8; 5];
    f.read_exact_at(&mut buf, 6).unwrap();
    assert_eq!(&buf, b"world");
    assert_eq!(f.read_at(&mut buf, 100).unwrap(), 0);
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(fs::read(&a).unwrap(), b"HELLO world, again");

    // O_TRUNC empties the file.
    drop(OpenOptions::new().write(true).truncate(true).open(&a).unwrap());
    assert_eq!(fs::metadata(&a).unwrap().len(), 0);

    // truncate up reads as zeros, truncate down cuts, ftruncate on an open handle.
    fs::write(&a, pattern(0, 10_000)).unwrap();
    let f = OpenOptions::new().write(true).open(&a).unwrap();
    f.set_len(20_000).unwrap();
    let d = fs::read(&a).unwrap();
    assert_eq!(d.len(), 20_000);
    assert_eq!(&d[..10_000], &pattern(0, 10_000)[..]);
    assert!(d[10_000..].iter().all(|&b| b == 0));
    f.set_len(3000).unwrap();
    drop(f);
    assert_eq!(fs::read(&a).unwrap(), pattern(0, 3000));

    // A sparse file: a byte at 10 MiB costs a block or two, not 10 MiB.
    let h = s.path("holes");
    let f = OpenOptions::new().read(true).write(true).create_new(true).open(&h).unwrap();
    f.write_at(b"x", 10 << 20).unwrap();
    f.sync_all().unwrap();
    let md = fs::metadata(&h).unwrap();
    assert_eq!(md.len(), (10 << 20) + 1);
    assert!(md.blocks() <= 16, "st_blocks of a sparse file: {}", md.blocks());
    let mut head = vec![1u8; 8192];
    f.read_exact_at(&mut head, 0).unwrap();
    assert!(head.iter().all(|&b| b == 0));
    drop(f);

    // fallocate: allocate, keep size, punch a hole.
    let fa = s.path("falloc");
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&fa).unwrap();
    nix::fcntl::fallocate(&f, FallocateFlags::empty(), 0, 1 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    nix::fcntl::fallocate(&f, FallocateFlags::FALLOC_FL_KEEP_SIZE, 0, 2 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    f.write_all_at(&pattern(0, 1 << 20), 0).unwrap();
    let punch = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    nix::fcntl::fallocate(&f, punch, 4096, 8192).unwrap();
    let mut back = vec![0u8; 1 << 20];
    f.read_exact_at(&mut back, 0).unwrap();
    let mut want = pattern(0, 1 << 20);
    want[4096..12288].fill(0);
    assert!(back == want, "content after punching a hole");
    let zero_range = FallocateFlags::FALLOC_FL_ZERO_RANGE;
    nix::fcntl::fallocate(&f, zero_range, 0, 4096).unwrap();
    f.read_exact_at(&mut back, 0).unwrap();
    want[..4096].fill(0);
    assert!(back == want, "content after ZERO_RANGE");
    drop(f);

    // A big sequential file, written and read back in 1 MiB pieces.
    let big = s.path("big");
    let t = Instant::now();
    let mut f = File::create(&big).unwrap();
    for i in 0..64u64 {
        f.write_all(&pattern(i << 20, 1 << 20)).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let written = t.elapsed();
    let t = Instant::now();
    let mut f = File::open(&big).unwrap();
    let mut chunk = vec![0u8; 1 << 20];
    for i in 0..64u64 {
        f.read_exact(&mut chunk).unwrap();
        assert!(chunk == pattern(i << 20, 1 << 20), "big file differs in MiB {i}");
    }
    assert_eq!(f.read(&mut chunk).unwrap(), 0);
    eprintln!("64 MiB through the mount: write+fsync {written:?}, read {:?}", t.elapsed());
    f.seek(SeekFrom::Start(0)).unwrap();

    // An unlinked file stays readable through its open handle.
    fs::remove_file(&big).unwrap();
    let mut first = vec![0u8; 4096];
    f.read_exact(&mut first).unwrap();
    assert_eq!(first, pattern(0, 4096));
    drop(f);

    // Names longer than 255 bytes.
    let long = s.path(&"n".repeat(256));
    assert_eq!(errno(File::create(&long)), libc::ENAMETOOLONG);
    File::create(s.path(&"n".repeat(255))).unwrap();

    // statfs reports the volume.
    let st = nix::sys::statvfs::statvfs(&s.mnt).unwrap();
    assert_eq!(st.block_size(), 4096);
    assert_eq!(st.blocks(), 256 * 256);
    assert!(st.blocks_available() > 0 && st.blocks_available() < st.blocks());
    assert_eq!(st.name_max(), 255);

    m.unmount();
    s.fsck();
}

#[test]
fn namespace_ops() {
    require_fuse!();
    let s = Scratch::new(64);
    let m = s.mount(&[]);

    // mkdir / rmdir / ENOTEMPTY, and directory link counts.
    let d = s.path("d");
    fs::create_dir(&d).unwrap();
    fs::create_dir(d.join("sub")).unwrap();
    fs::write(d.join("f"), b"1").unwrap();
    assert_eq!(fs::metadata(&d).unwrap().nlink(), 3);
    assert_eq!(errno(fs::remove_dir(&d)), libc::ENOTEMPTY);
    assert_eq!(errno(fs::create_dir(&d)), libc::EEXIST);
    assert_eq!(errno(fs::remove_dir(d.join("f"))), libc::ENOTDIR);
    assert_eq!(errno(fs::remove_file(d.join("sub"))), libc::EISDIR);
    fs::remove_dir(d.join("sub")).unwrap();
    assert_eq!(fs::metadata(&d).unwrap().nlink(), 2);
    fs::remove_file(d.join("f")).unwrap();
    fs::remove_dir(&d).unwrap();
    assert_eq!(errno(fs::metadata(&d)), libc::ENOENT);

    // rename: plain (replacing), RENAME_NOREPLACE, RENAME_EXCHANGE.
    fs::write(s.path("x"), b"x").unwrap();
    fs::write(s.path("y"), b"y").unwrap();
    let noreplace = renameat2(AT_FDCWD, &s.path("x"), AT_FDCWD, &s.path("y"), RenameFlags::RENAME_NOREPLACE);
    assert_eq!(nix_errno(noreplace), libc::EEXIST);
    renameat2(AT_FDCWD, &s.path("x"), AT_FDCWD, &s.path("y"), RenameFlags::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(s.path("x")).unwrap(), b"y");
    assert_eq!(fs::read(s.path("y")).unwrap(), b"x");
    let exchange_missing = renameat2(AT_FDCWD, &s.path("x"), AT_FDCWD, &s.path("nope"), RenameFlags::RENAME_EXCHANGE);
    assert_eq!(nix_errno(exchange_missing), libc::ENOENT);
    fs::rename(s.path("x"), s.path("y")).unwrap();
    assert_eq!(fs::read(s.path("y")).unwrap(), b"y");
    assert_eq!(errno(fs::metadata(s.path("x"))), libc::ENOENT);
    fs::create_dir_all(s.path("p/q")).unwrap();
    fs::rename(s.path("y"), s.path("p/q/y")).unwrap();
    fs::rename(s.path("p/q"), s.path("q2")).unwrap();
    assert_eq!(fs::read(s.path("q2/y")).unwrap(), b"y");
    assert_eq!(errno(fs::rename(s.path("p"), s.path("p/inside"))), libc::EINVAL);

    // Hard links and st_nlink.
    let (a, b) = (s.path("a"), s.path("b"));
    fs::write(&a, b"linked").unwrap();
    fs::hard_link(&a, &b).unwrap();
    assert_eq!(fs::metadata(&a).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(&a).unwrap().ino(), fs::metadata(&b).unwrap().ino());
    fs::remove_file(&a).unwrap();
    assert_eq!(fs::metadata(&b).unwrap().nlink(), 1);
    assert_eq!(fs::read(&b).unwrap(), b"linked");
    assert_eq!(errno(fs::hard_link(s.path("p"), s.path("p2"))), libc::EPERM);

    // Symlinks: short and long targets, readlink, following.
    std::os::unix::fs::symlink("b", s.path("sl")).unwrap();
    assert_eq!(fs::read_link(s.path("sl")).unwrap(), Path::new("b"));
    assert_eq!(fs::read(s.path("sl")).unwrap(), b"linked");
    let long_target = "t/".repeat(1000);
    std::os::unix::fs::symlink(&long_target, s.path("long")).unwrap();
    assert_eq!(fs::read_link(s.path("long")).unwrap(), Path::new(&long_target));
    assert!(fs::symlink_metadata(s.path("sl")).unwrap().file_type().is_symlink());
    std::os::unix::fs::symlink("loop", s.path("loop")).unwrap();
    assert_eq!(errno(fs::read(s.path("loop"))), libc::ELOOP);

    // mkfifo and mknod.
    nix::unistd::mkfifo(&s.path("fifo"), Mode::from_bits_truncate(0o644)).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fs::metadata(s.path("fifo")).unwrap().file_type()));
    let dev = nix::sys::stat::makedev(1, 3);
    nix::sys::stat::mknod(&s.path("null"), SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), dev).unwrap();
    let md = fs::metadata(s.path("null")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(&md.file_type()));
    assert_eq!(md.rdev(), dev);

    // chmod, chown.
    fs::set_permissions(&b, fs::Permissions::from_mode(0o4751)).unwrap();
    assert_eq!(fs::metadata(&b).unwrap().mode() & 0o7777, 0o4751);
    std::os::unix::fs::chown(&b, Some(1234), Some(5678)).unwrap();
    let md = fs::metadata(&b).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    // A chown of an executable clears setuid.
    assert_eq!(md.mode() & 0o7777, 0o751);

    // utimensat with explicit times, UTIME_OMIT and UTIME_NOW.
    let t1 = TimeSpec::new(1_000_000_000, 123_456_789);
    utimensat(AT_FDCWD, &b, &t1, &t1, UtimensatFlags::FollowSymlink).unwrap();
    let md = fs::metadata(&b).unwrap();
    assert_eq!(
        (md.atime(), md.atime_nsec(), md.mtime(), md.mtime_nsec()),
        (1_000_000_000, 123_456_789, 1_000_000_000, 123_456_789)
    );
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    utimensat(AT_FDCWD, &b, &TimeSpec::UTIME_OMIT, &TimeSpec::UTIME_NOW, UtimensatFlags::FollowSymlink).unwrap();
    let md = fs::metadata(&b).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789), "UTIME_OMIT kept atime");
    // The kernel stamps UTIME_NOW with its coarse clock, a tick behind this one: a
    // second's slack.
    assert!(md.mtime() >= before - 1, "UTIME_NOW set mtime");
    let old = TimeSpec::new(-86_400, 5);
    utimensat(AT_FDCWD, &b, &old, &TimeSpec::UTIME_OMIT, UtimensatFlags::FollowSymlink).unwrap();
    let md = fs::metadata(&b).unwrap();
    assert_eq!((md.atime(), md.atime_nsec()), (-86_400, 5), "a time before 1970");

    // xattrs: set, get (with the size probe), list, replace, remove, ENODATA, ERANGE.
    setxattr(&b, "user.color", b"blue", 0).unwrap();
    setxattr(&b, "trusted.t", b"", 0).unwrap();
    setxattr(&b, "security.s", &[7u8; 300], 0).unwrap();
    assert_eq!(getxattr(&b, "user.color", 0).unwrap().len(), 4);
    assert_eq!(getxattr(&b, "user.color", 64).unwrap(), b"blue");
    assert_eq!(getxattr(&b, "security.s", 300).unwrap(), vec![7u8; 300]);
    assert_eq!(errno(getxattr(&b, "user.color", 2)), libc::ERANGE);
    assert_eq!(errno(getxattr(&b, "user.none", 64)), libc::ENODATA);
    assert_eq!(errno(getxattr(&b, "system.posix_acl_access", 64)), libc::ENODATA);
    assert_eq!(errno(setxattr(&b, "user.color", b"red", libc::XATTR_CREATE)), libc::EEXIST);
    assert_eq!(errno(setxattr(&b, "user.new", b"1", libc::XATTR_REPLACE)), libc::ENODATA);
    setxattr(&b, "user.color", b"red", libc::XATTR_REPLACE).unwrap();
    assert_eq!(getxattr(&b, "user.color", 64).unwrap(), b"red");
    let names: BTreeSet<String> = ["user.color", "trusted.t", "security.s"].iter().map(|s| s.to_string()).collect();
    assert_eq!(listxattr(&b, 4096).unwrap(), names);
    assert_eq!(errno(listxattr(&b, 5)), libc::ERANGE);
    removexattr(&b, "user.color").unwrap();
    assert_eq!(errno(removexattr(&b, "user.color")), libc::ENODATA);
    assert_eq!(errno(getxattr(&b, "user.color", 64)), libc::ENODATA);
    assert_eq!(listxattr(&b, 4096).unwrap().len(), 2);
    setxattr(&s.path("p"), "user.on_a_dir", b"yes", 0).unwrap();
    assert_eq!(getxattr(&s.path("p"), "user.on_a_dir", 16).unwrap(), b"yes");

    m.unmount();
    s.fsck();
}

#[test]
fn big_directory_readdir() {
    require_fuse!();
    let s = Scratch::new(256);
    let m = s.mount(&[]);
    let d = s.path("big");
    fs::create_dir(&d).unwrap();
    let names: BTreeSet<String> = (0..10_000).map(|i| format!("file-{i:05}-{}", "x".repeat(i % 40))).collect();
    let t = Instant::now();
    for n in &names {
        File::create(d.join(n)).unwrap();
    }
    let created = t.elapsed();
    let t = Instant::now();
    let listed: BTreeSet<String> =
        fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let read = t.elapsed();
    assert!(listed == names, "readdir returned {} names, want {}", listed.len(), names.len());
    let t = Instant::now();
    let mut bytes = 0;
    for e in fs::read_dir(&d).unwrap() {
        bytes += e.unwrap().metadata().unwrap().len();
    }
    assert_eq!(bytes, 0);
    eprintln!("10k files: create {created:?}, readdir {read:?}, readdir+stat {:?}", t.elapsed());

    // While entries go, every entry present for the whole scan is returned exactly once.
    let all: Vec<&String> = names.iter().collect();
    let mut seen = BTreeSet::new();
    let mut deleted = BTreeSet::new();
    for (i, e) in fs::read_dir(&d).unwrap().enumerate() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(seen.insert(name.clone()), "{name} returned twice");
        if i % 2 == 0 {
            let victim = all[(i * 7919) % all.len()];
            if fs::remove_file(d.join(victim)).is_ok() {
                deleted.insert(victim.clone());
            }
        }
    }
    let stayed: BTreeSet<String> = names.difference(&deleted).cloned().collect();
    assert!(stayed.is_subset(&seen), "{} entries missed by a scan", stayed.difference(&seen).count());
    let remaining: BTreeSet<String> =
        fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(remaining == stayed);
    assert_eq!(fs::metadata(&d).unwrap().nlink(), 2);

    let t = Instant::now();
    for n in &remaining {
        fs::remove_file(d.join(n)).unwrap();
    }
    eprintln!("{} unlinks: {:?}", remaining.len(), t.elapsed());
    fs::remove_dir(&d).unwrap();
    m.unmount();
    s.fsck();
}

#[test]
fn persists_across_remount_and_read_only() {
    require_fuse!();
    let s = Scratch::new(64);
    let m = s.mount(&["--attr-timeout", "0.5", "-o", "entry_timeout=0.5"]);
    fs::create_dir_all(s.path("a/b")).unwrap();
    fs::write(s.path("a/b/data"), pattern(7, 100_000)).unwrap();
    fs::set_permissions(s.path("a/b/data"), fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink("b/data", s.path("a/link")).unwrap();
    fs::hard_link(s.path("a/b/data"), s.path("a/hard")).unwrap();
    setxattr(&s.path("a/b/data"), "user.k", b"v", 0).unwrap();
    let before = fs::metadata(s.path("a/b/data")).unwrap();
    // A shared writable mapping: its pages reach the volume by write-back.
    let f = OpenOptions::new().read(true).write(true).create_new(true).open(s.path("mapped")).unwrap();
    f.set_len(8192).unwrap();
    store_through_mapping(&f, 8192, 4090, b"across pages");
    drop(f);
    m.unmount();
    s.fsck();

    let m = s.mount(&["--ro"]);
    assert_eq!(fs::read(s.path("a/link")).unwrap(), pattern(7, 100_000));
    let after = fs::metadata(s.path("a/hard")).unwrap();
    assert_eq!(
        (after.ino(), after.nlink(), after.mode(), after.size()),
        (before.ino(), 2, before.mode(), before.size())
    );
    assert_eq!((after.mtime(), after.mtime_nsec()), (before.mtime(), before.mtime_nsec()));
    assert_eq!(getxattr(&s.path("a/hard"), "user.k", 8).unwrap(), b"v");
    let mapped = fs::read(s.path("mapped")).unwrap();
    assert_eq!((mapped.len(), &mapped[4090..4102]), (8192, &b"across pages"[..]));
    assert_eq!(errno(File::create(s.path("new"))), libc::EROFS);
    assert_eq!(errno(OpenOptions::new().write(true).open(s.path("a/hard"))), libc::EROFS);
    assert_eq!(errno(fs::remove_file(s.path("a/hard"))), libc::EROFS);
    m.unmount();
    s.fsck();
}

#[test]
fn kill9_recovers() {
    require_fuse!();
    let s = Scratch::new(128);
    let m = s.mount(&[]);
    fs::create_dir(s.path("keep")).unwrap();
    for i in 0..50 {
        let mut f = File::create(s.path(&format!("keep/{i}"))).unwrap();
        f.write_all(&pattern(i, 50_000)).unwrap();
        f.sync_all().unwrap();
    }
    // More work in flight, never synced, when the daemon dies.
    let mnt = s.mnt.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let writer = std::thread::spawn(move || {
        // Runs until the dead daemon makes a call fail, or it is told the daemon is dead
        // (a writer that slept through the kill would otherwise go on forever in the
        // directory under the mount, once it is unmounted).
        for i in 0.. {
            let p = mnt.join(format!("scratch-{i}"));
            if stopped.load(std::sync::atomic::Ordering::SeqCst)
                || fs::write(&p, pattern(i, 20_000)).is_err()
                || (i % 2 == 1 && fs::remove_file(&p).is_err())
            {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    // The writer ends before the unmount: after the kill every call on the mount fails.
    m.kill9_and(move || {
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        writer.join().unwrap();
    });

    s.fsck();
    let m = s.mount(&[]);
    for i in 0..50 {
        assert!(fs::read(s.path(&format!("keep/{i}"))).unwrap() == pattern(i, 50_000), "keep/{i} lost");
    }
    m.unmount();
    s.fsck();
}

/// Run a shell command as user and group 65534 (nobody).
fn as_nobody(script: &str) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script])
        .output()
        .expect("setpriv (util-linux)")
}

#[test]
fn permissions_for_other_users() {
    require_fuse!();
    if Command::new("setpriv").arg("--version").stdout(Stdio::null()).status().is_err() {
        skipping("permissions_for_other_users: setpriv not found");
        return;
    }
    let s = Scratch::new(64);
    let m = s.mount(&["--allow-other"]);
    let secret = s.path("secret");
    fs::write(&secret, b"root only").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let tmp = s.path("tmp");
    fs::create_dir(&tmp).unwrap();
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777)).unwrap();
    fs::write(tmp.join("roots"), b"r").unwrap();
    fs::set_permissions(tmp.join("roots"), fs::Permissions::from_mode(0o666)).unwrap();

    let q = |p: &Path| format!("'{}'", p.display());
    let out = as_nobody(&format!("cat {}", q(&secret)));
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied"));
    let out = as_nobody(&format!("rm -f {}", q(&tmp.join("roots"))));
    assert!(!out.status.success(), "nobody deleted root's file in a sticky directory");
    assert!(tmp.join("roots").exists());
    let out = as_nobody(&format!("chown 65534 {}", q(&tmp.join("roots"))));
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not permitted"));
    // What nobody may do works: write a world-writable file, make and delete its own.
    let mine = tmp.join("mine");
    let script =
        format!("echo hi >> {} && echo x > {m} && chmod 600 {m} && rm {m}", q(&tmp.join("roots")), m = q(&mine));
    let out = as_nobody(&script);
    assert!(out.status.success(), "nobody's own work failed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(fs::read(tmp.join("roots")).unwrap(), b"rhi\n");
    // Files nobody creates belong to nobody.
    let out = as_nobody(&format!("touch {}", q(&tmp.join("owned"))));
    assert!(out.status.success());
    let md = fs::metadata(tmp.join("owned")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));

    // A write by another user clears setuid and setgid (group-executable).
    let suid = s.path("suid");
    fs::write(&suid, b"#!/bin/sh\n").unwrap();
    fs::set_permissions(&suid, fs::Permissions::from_mode(0o6777)).unwrap();
    let out = as_nobody(&format!("echo more >> {}", q(&suid)));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(fs::metadata(&suid).unwrap().mode() & 0o7777, 0o777);

    // In a setgid directory, new nodes take its group and subdirectories stay setgid.
    let shared = s.path("shared");
    fs::create_dir(&shared).unwrap();
    std::os::unix::fs::chown(&shared, None, Some(4321)).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o2777)).unwrap();
    let out = as_nobody(&format!("touch {f} && mkdir {d}", f = q(&shared.join("f")), d = q(&shared.join("d"))));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (f, d) = (fs::metadata(shared.join("f")).unwrap(), fs::metadata(shared.join("d")).unwrap());
    assert_eq!((f.uid(), f.gid(), d.gid()), (65534, 4321, 4321));
    assert_ne!(d.mode() & 0o2000, 0, "subdirectory of a setgid directory lost setgid");
    m.unmount();
    s.fsck();
}

/// POSIX ACLs through the mount (seed 001): setfacl/getfacl, the kernel enforces them for
/// another user, chmod updates the mask, and default ACLs are inherited.
#[test]
fn posix_acls_through_the_mount() {
    require_fuse!();
    let tools = ["setpriv", "setfacl", "getfacl"];
    if tools.iter().any(|t| Command::new(t).arg("--version").stdout(Stdio::null()).status().is_err()) {
        skipping(&format!("posix_acls_through_the_mount: needs {tools:?} (util-linux, acl)"));
        return;
    }
    let s = Scratch::new(64);
    let m = s.mount(&["--allow-other"]);
    let q = |p: &Path| format!("'{}'", p.display());
    let f = s.path("private");
    fs::write(&f, b"for nobody's eyes").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    assert!(!as_nobody(&format!("cat {}", q(&f))).status.success());
    let st = Command::new("setfacl").args(["-m", "u:nobody:r"]).arg(&f).status().unwrap();
    assert!(st.success());
    let out = as_nobody(&format!("cat {}", q(&f)));
    assert!(out.status.success(), "ACL grant not enforced: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o777, 0o640, "group bits show the ACL mask");
    let acl = Command::new("getfacl").args(["-c", "-n"]).arg(&f).output().unwrap();
    assert!(
        String::from_utf8_lossy(&acl.stdout).contains("user:65534:r--"),
        "{}",
        String::from_utf8_lossy(&acl.stdout)
    );
    // chmod g-r masks the named entry out again.
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    assert!(!as_nobody(&format!("cat {}", q(&f))).status.success(), "chmod did not update the ACL mask");
    // Default ACLs: new files in the directory inherit nobody's write access.
    let d = s.path("shared");
    fs::create_dir(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    let st = Command::new("setfacl").args(["-d", "-m", "u:nobody:rwx", "-m", "u:nobody:rwx"]).arg(&d).status().unwrap();
    assert!(st.success());
    fs::write(d.join("new"), b"x").unwrap();
    fs::create_dir(d.join("sub")).unwrap();
    let out = as_nobody(&format!("echo more >> {} && touch {}", q(&d.join("new")), q(&d.join("sub/deeper"))));
    assert!(out.status.success(), "default ACL not inherited: {}", String::from_utf8_lossy(&out.stderr));
    m.unmount();
    s.fsck();
}

#[test]
fn daemon_and_mount_helper() {
    require_fuse!();
    not_over_nbd!("mount(8) is given an image path");
    let s = Scratch::new(64);
    // --daemon returns only once the mount is live; --create makes a missing image.
    let image = s.tmp.path().join("created");
    let st = dxfs()
        .args(["mount", "--daemon", "--create", "32M"])
        .arg(&image)
        .arg(&s.mnt)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let guard = Mounted { child: None, mnt: s.mnt.clone(), image: image.clone(), log: None };
    assert!(is_mounted(&s.mnt), "--daemon returned before the mount was live");
    fs::write(s.path("f"), b"daemon").unwrap();
    let st = unmount_by("umount", &s.mnt);
    assert!(st.success());
    wait_unused(&image);
    drop(guard);
    let out = dxfs().arg("fsck").arg("-n").arg(&image).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));

    // mount -t fuse.dxfs (and /etc/fstab) run mount.fuse3, which runs `dxfs IMAGE DIR
    // -o OPTS`. mount(8) itself resets PATH, so call the helper directly with a PATH
    // that finds this build as `dxfs` and nothing else (no sbin: as root the mount is
    // still fuseblk, over a loop device).
    let helper = ["/sbin/mount.fuse3", "/usr/sbin/mount.fuse3"].into_iter().find(|p| Path::new(p).exists());
    let Some(helper) = helper else {
        skipping("the mount.fuse3 part: no mount.fuse3");
        return;
    };
    let bin = s.tmp.path().join("bin");
    fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_dxfs"), bin.join("dxfs")).unwrap();
    let path = bin.display().to_string();
    let st = Command::new(helper)
        .arg(&image)
        .arg(&s.mnt)
        .args(["-t", "dxfs", "-o", "defaults,_netdev,nosuid,allow_other,attr_timeout=2"])
        .env("PATH", path)
        .status()
        .unwrap();
    assert!(st.success(), "mount.fuse3 -t dxfs: {st}");
    let guard = Mounted { child: None, mnt: s.mnt.clone(), image: image.clone(), log: None };
    assert_eq!(fs::read(s.path("f")).unwrap(), b"daemon");
    // As with every file system through mount(8): `nosuid` as asked, `dev` by default
    // (mount(8) drops the word before it calls the helper).
    let flags = mount_options(&s.mnt);
    let has = |w: &str| flags.split(',').any(|f| f == w);
    assert!(has("nosuid"), "{flags}");
    assert_eq!(has("nodev"), !nix::unistd::geteuid().is_root(), "{flags}");
    if nix::unistd::geteuid().is_root() {
        assert_eq!(mount_type(&s.mnt), "fuseblk.dxfs", "a root mount through the helper is fuseblk");
    }
    let st = unmount_by("umount", &s.mnt);
    assert!(st.success());
    wait_unused(&image);
    drop(guard);
    let out = dxfs().arg("fsck").arg("-n").arg(&image).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn full_volume() {
    require_fuse!();
    let s = Scratch::new(32);
    // Without the writeback cache every write() reaches the volume: ENOSPC is exact, to
    // the last blocks (with it, see full_volume_with_writeback_cache).
    let m = s.mount(&["--writeback-cache", "off"]);
    let fill = s.path("fill");
    let mut f = File::create(&fill).unwrap();
    let chunk = pattern(0, 1 << 20);
    let err = loop {
        if let Err(e) = f.write_all(&chunk) {
            break e;
        }
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    // Then page by page up to the last block.
    let err = loop {
        if let Err(e) = f.write_all(&chunk[..4096]) {
            break e;
        }
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    let st = nix::sys::statvfs::statvfs(&s.mnt).unwrap();
    assert!(st.blocks_available() < 16, "{} blocks still available", st.blocks_available());
    // Everything accepted before ENOSPC is there.
    f.sync_all().unwrap();
    let len = f.metadata().unwrap().len();
    assert!(len > 16 << 20);
    drop(f);
    let back = fs::read(&fill).unwrap();
    assert!(back.len() as u64 == len && back.starts_with(&chunk), "content of the full file");
    // Deleting works on a full volume and gives the space back: with the kernel's FORGET
    // of the file, which follows the UNLINK on its own and may come late under load
    // (`df` waits for it; so, once, does a write short of space). The file was created
    // before the mount's first OPEN (`fs::read`), whose refusal stops the kernel's
    // RELEASEs: it failed here now and then while CREATE counted a handle.
    fs::remove_file(&fill).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while nix::sys::statvfs::statvfs(&s.mnt).unwrap().blocks_available() < 1024 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    fs::write(s.path("after"), &chunk).unwrap();
    m.unmount();
    s.fsck();
}

/// With the writeback cache (the default) ENOSPC still comes from write(), never only
/// at write-back: a file open for writing when the volume comes near full asks before
/// each write() and is refused once less than the kernel's dirty limit is left, and
/// that room is kept for the kernel's write-back: no other change may take it, so the
/// dirty pages still in the kernel land even when another writer tries for the last
/// blocks first (it gets ENOSPC, and `df` shows no room). So everything write()
/// accepted is kept — fsync and close succeed, and it is all there after a remount.
#[test]
fn full_volume_with_writeback_cache() {
    require_fuse!();
    let s = Scratch::new(64);
    let m = s.mount(&[]);
    // The kernel's dirty bound for the mount: a quarter of the volume while it is roomy.
    let bound = dirty_bound(&s.mnt);
    if let Some(b) = bound() {
        assert!(about(b, 16 << 20), "dirty bound of an empty 64 MiB volume: {b}");
    }
    let fill = s.path("fill");
    let mut f = File::create(&fill).unwrap();
    let mut accepted = 0u64;
    let mut fill_to_enospc = |f: &mut File| {
        let err = loop {
            match f.write(&pattern(accepted, 1 << 20)) {
                Ok(n) => accepted += n as u64,
                Err(e) => break e,
            }
            assert!(accepted < 200 << 20, "100 MiB more than the volume holds went into the page cache");
        };
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    };
    fill_to_enospc(&mut f);
    if let Some(b) = bound() {
        // Lowered once free space went below two bounds (after the kernel wrote its
        // dirty pages back, in a thread of the daemon's: give it a moment).
        let t = std::time::Instant::now();
        while !bound().is_some_and(|b| about(b, 4 << 20)) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let now = bound().unwrap_or(0);
        assert!(about(now, 4 << 20), "dirty bound of a full 64 MiB volume: {now} (was {b})");
        // The daemon keeps the smaller room once the kernel has written back what it
        // held under the large bound: free but not available, the bound, a sixteenth
        // more, the slack, the reserve (32 blocks).
        let kept = || {
            let st = nix::sys::statvfs::statvfs(&s.mnt).unwrap();
            (st.blocks_free() - st.blocks_available()) * 4096
        };
        while kept() > 9 << 20 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(kept() <= 9 << 20, "{} bytes kept with a 4 MiB bound", kept());
    }
    // The bound is lowered, and with it the room kept: a write() may fit again, up to the
    // new bound's room.
    fill_to_enospc(&mut f);
    assert!(accepted > 16 << 20, "only {accepted} bytes accepted");
    // Before the kernel has written all of it back, another writer (a file opened now
    // bypasses the cache) and a mkdir try for the last blocks: they get what the serving
    // threads still held for changes, and the room kept for the pages write() accepted
    // stays kept (`df` agrees).
    // (Less than a mebibyte: an operation's worst case, a create's or a write's, may
    // not fit in the last few hundred blocks, where the kept room is the kernel's bound
    // and the slack, 8 MiB here.)
    let tail = write_until_enospc(&s.path("tail"));
    assert!(tail < 1 << 20, "{tail} bytes went into the room kept for write-back");
    (0..64)
        .position(|i| match fs::create_dir(s.path(&format!("dir{i}"))) {
            Ok(()) => false,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                true
            }
        })
        .expect("64 directories made in the room kept for write-back");
    f.sync_all().expect("fsync after ENOSPC: what write() accepted must be on the volume");
    drop(f);
    let st = nix::sys::statvfs::statvfs(&s.mnt).unwrap();
    assert!(st.blocks_available() < 512, "{} blocks still available", st.blocks_available());
    m.unmount();
    let m = s.mount(&[]);
    let back = fs::read(&fill).unwrap();
    assert_eq!(back.len() as u64, accepted, "size of the file written into the page cache");
    assert!(back == pattern(0, back.len()), "content of the file written into the page cache");
    if tail > 0 {
        assert_eq!(fs::read(s.path("tail")).unwrap(), pattern(0, tail as usize));
    }
    // Deleting gives the space back, and writes go through the cache again, with the
    // large bound again once the volume is roomy.
    fs::remove_file(&fill).unwrap();
    let _ = fs::remove_file(s.path("tail"));
    let bound = dirty_bound(&s.mnt);
    if bound().is_some() {
        // An open for writing looks at the free space (three bounds and the slack: 52
        // of the 64 MiB, and nearly all of it is free now). The removed files give it
        // back with the RELEASE of the reader's descriptor and their FORGET, which the
        // kernel sends on their own: near full, the open waits for them.
        File::create(s.path("again")).unwrap();
        let now = bound().unwrap_or(0);
        assert!(about(now, 16 << 20), "dirty bound once the volume is roomy again: {now}");
    }
    fs::write(s.path("after"), pattern(0, 8 << 20)).unwrap();
    m.unmount();
    s.fsck();
}

/// A directory quota through the mount, with the writeback cache (the default): set by
/// root with the virtual xattr (`setfattr -n dxfs.quota.max_bytes`), refused to other
/// users; EDQUOT comes from write() — for a file opened before the quota was set too —
/// and everything write() accepted is kept; rename out of the quota is EXDEV.
#[test]
fn directory_quota_through_the_mount() {
    require_fuse!();
    let s = Scratch::new(64);
    let m = s.mount(&["--allow-other"]);
    let q = s.path("q");
    fs::create_dir(&q).unwrap();
    fs::set_permissions(&q, fs::Permissions::from_mode(0o777)).unwrap();
    let early = q.join("early");
    let mut f = File::create(&early).unwrap();
    setxattr(&q, dxfs::QUOTA_XATTR, b"4194304", 0).unwrap();
    assert_eq!(getxattr(&q, dxfs::QUOTA_XATTR, 64).unwrap(), b"4194304");
    // `dxfs quota` reads it through the same attributes.
    let out = dxfs().arg("quota").arg(&q).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && shown.contains("quota 4.0M, used "), "{shown}");
    // `df q` shows the quota as the size, as CephFS shows a quota root.
    let st = nix::sys::statvfs::statvfs(&q).unwrap();
    assert_eq!(st.blocks() * st.fragment_size(), 4 << 20, "df of the quota's directory");
    let whole = nix::sys::statvfs::statvfs(&s.mnt).unwrap();
    assert!(whole.blocks() * whole.fragment_size() > 32 << 20, "df of the mount");
    if Command::new("setpriv").arg("--version").stdout(Stdio::null()).status().is_ok() {
        let script = format!(
            "python3 -c \"import os,sys\ntry:\n os.setxattr('{}', '{}', b'1')\nexcept OSError as e:\n sys.exit(e.errno)\"",
            q.display(),
            dxfs::QUOTA_XATTR
        );
        let out = as_nobody(&script);
        assert_eq!(out.status.code(), Some(libc::EPERM), "{}", String::from_utf8_lossy(&out.stderr));
    } else {
        skipping("directory_quota_through_the_mount: the EPERM check needs setpriv (util-linux)");
    }
    let mut accepted = 0u64;
    let err = loop {
        match f.write(&pattern(accepted, 256 << 10)) {
            Ok(n) => accepted += n as u64,
            Err(e) => break e,
        }
        assert!(accepted <= 64 << 20, "64 MiB written under a 4 MiB quota");
    };
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    assert!(accepted <= 4 << 20, "{accepted} bytes accepted under a 4 MiB quota");
    f.sync_all().expect("fsync after EDQUOT: what write() accepted must be on the volume");
    drop(f);
    // A file opened now bypasses the cache: EDQUOT at once, or after what little is left.
    let late = q.join("late");
    let mut g = File::create(&late).unwrap();
    let mut more = 0u64;
    let err = loop {
        match g.write(&pattern(more, 64 << 10)) {
            Ok(n) => more += n as u64,
            Err(e) => break e,
        }
        assert!(more <= 4 << 20);
    };
    assert_eq!(err.raw_os_error(), Some(libc::EDQUOT), "{err}");
    drop(g);
    let st = nix::sys::statvfs::statvfs(&q).unwrap();
    assert!(
        st.blocks_available() * st.fragment_size() < 256 << 10,
        "df of a full quota: {} free",
        st.blocks_available()
    );
    let e = fs::rename(&early, s.path("out")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");
    // Outside the quota, writes go on; removing a file gives its room back.
    fs::write(s.path("free"), pattern(0, 8 << 20)).unwrap();
    fs::remove_file(&late).unwrap();
    m.unmount();
    let m = s.mount(&[]);
    assert_eq!(getxattr(&q, dxfs::QUOTA_XATTR, 64).unwrap(), b"4194304");
    let back = fs::read(&early).unwrap();
    assert_eq!(back.len() as u64, accepted);
    assert!(back == pattern(0, back.len()), "content written under the quota");
    let out = dxfs().args(["quota"]).arg(&q).arg("none").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(getxattr(&q, dxfs::QUOTA_XATTR, 64).map_err(|e| e.raw_os_error()), Err(Some(libc::ENODATA)));
    fs::write(q.join("big"), pattern(0, 8 << 20)).unwrap();
    m.unmount();
    s.fsck();
}

/// On a full mount with the writeback cache (opens are messages there), a file read and
/// removed gives its space to the next write at once, though the RELEASE of the reader's
/// descriptor is sent by the kernel in the background and may come after the UNLINK and
/// the WRITE (`cat big; rm big; cp x y`). Several rounds, as the order is a race, and
/// one rarely lost here: this passed six times without the wait for a late RELEASE, so
/// `a_write_short_of_space_waits_for_a_file_unlinked_moments_ago` (volume) is the test
/// that shows that wait.
#[test]
fn space_of_a_file_read_then_removed_goes_to_the_next_write() {
    require_fuse!();
    let s = Scratch::new(32);
    let m = s.mount(&[]);
    let chunk = pattern(0, 1 << 20);
    for round in 0..6 {
        let big = s.path("big");
        let mut f = File::create(&big).unwrap();
        let err = loop {
            if let Err(e) = f.write_all(&chunk) {
                break e;
            }
        };
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
        f.sync_all().unwrap();
        drop(f);
        // The last blocks: kept for the kernel's write-back, so another file gets little
        // or nothing (its create may already fail).
        write_until_enospc(&s.path("tail"));
        assert!(fs::read(&big).unwrap().len() > 8 << 20);
        fs::remove_file(&big).unwrap();
        fs::write(s.path("after"), &chunk).unwrap_or_else(|e| panic!("round {round}: a write right after rm: {e}"));
        fs::remove_file(s.path("after")).unwrap();
        let _ = fs::remove_file(s.path("tail"));
    }
    m.unmount();
    s.fsck();
}

/// Create `path` and write `pattern` into it 4 KiB at a time until ENOSPC (from the
/// create or a write, nothing else), then fsync it; returns the bytes written.
fn write_until_enospc(path: &std::path::Path) -> u64 {
    let mut g = match File::create(path) {
        Ok(g) => g,
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "create: {e}");
            return 0;
        }
    };
    let mut done = 0u64;
    let err = loop {
        match g.write(&pattern(done, 4096)) {
            Ok(n) => done += n as u64,
            Err(e) => break e,
        }
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    g.sync_all().unwrap();
    done
}

/// Whether a bound the kernel reports is `want` as it stores it (a share of its dirty
/// limit, which follows free memory: a little off, and drifting).
fn about(got: u64, want: u64) -> bool {
    got.abs_diff(want) <= want / 20
}

/// The kernel's dirty bound for the mount at `mnt` (its bdi's `max_bytes`), read on each
/// call; None where sysfs does not show it.
fn dirty_bound(mnt: &std::path::Path) -> impl Fn() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(mnt).unwrap().dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    // A fuseblk mount's bdi is named after its block device, with a suffix (the
    // device's own bdi has the bare name).
    let suffix = if major == 0 { "" } else { "-fuseblk" };
    let path = format!("/sys/class/bdi/{major}:{minor}{suffix}/max_bytes");
    move || fs::read_to_string(&path).ok().and_then(|s| s.trim().parse().ok())
}

/// One random operation on one of `files`, chosen at random (the other is the source of
/// copies): pwrite at a random offset and length, whole pages written O_DIRECT, truncate
/// down or up, fallocate (extending or not), punch hole, zero range, copy_file_range from
/// the other file, stores through a shared writable mapping, or fsync; made on `model`
/// too, then a random range and the size read back and compared. `ctx` names the run in
/// failure messages.
fn random_file_op(
    rng: &mut rand::rngs::StdRng,
    files: &[File; 2],
    names: [&str; 2],
    model: &mut [Vec<u8>; 2],
    ctx: &str,
) {
    use rand::Rng;
    // Files are written below 3 MiB.
    const MAX: u64 = 3 << 20;
    let k = rng.gen_range(0..2);
    let (f, other_f) = (&files[k], &files[1 - k]);
    let [first, second] = model;
    let (m_, other) = if k == 0 { (first, &*second) } else { (second, &*first) };
    let len = m_.len() as u64;
    let what = rng.gen_range(0..100);
    let ctx = format!("{ctx}, file {}", names[k]);
    match what {
        0..=39 => {
            let off = rng.gen_range(0..MAX - 70_000);
            let n = if rng.gen_bool(0.3) { rng.gen_range(1..10) } else { rng.gen_range(1..70_000) };
            let data: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            f.write_all_at(&data, off).unwrap();
            let end = (off + n) as usize;
            if m_.len() < end {
                m_.resize(end, 0);
            }
            m_[off as usize..end].copy_from_slice(&data);
        }
        40..=44 => {
            // Whole pages through a second descriptor of the file, opened O_DIRECT.
            let first = rng.gen_range(0..(MAX - 70_000) / 4096);
            let d = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(format!("/proc/self/fd/{}", f.as_raw_fd()))
                .unwrap();
            for at in (first..first + rng.gen_range(1..=16)).map(|p| p * 4096) {
                let mut page = Aligned([0; 4096]);
                rng.fill(&mut page.0[..]);
                d.write_all_at(&page.0, at).unwrap_or_else(|e| panic!("O_DIRECT write at {at}: {e} ({ctx})"));
                let end = at as usize + 4096;
                if m_.len() < end {
                    m_.resize(end, 0);
                }
                m_[at as usize..end].copy_from_slice(&page.0);
            }
        }
        45..=54 => {
            let to = if rng.gen_bool(0.5) { rng.gen_range(0..=len) } else { rng.gen_range(0..MAX) };
            f.set_len(to).unwrap();
            m_.resize(to as usize, 0);
        }
        55..=64 => {
            let off = rng.gen_range(0..MAX - 70_000);
            let n = rng.gen_range(1..70_000);
            let keep = rng.gen_bool(0.5);
            let flags = if keep { FallocateFlags::FALLOC_FL_KEEP_SIZE } else { FallocateFlags::empty() };
            nix::fcntl::fallocate(f, flags, off as i64, n as i64).unwrap();
            if !keep && m_.len() < (off + n) as usize {
                m_.resize((off + n) as usize, 0);
            }
        }
        65..=74 if len > 0 => {
            let off = rng.gen_range(0..len);
            let n = rng.gen_range(1..=(len - off).min(100_000));
            let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
            nix::fcntl::fallocate(f, flags, off as i64, n as i64).unwrap();
            m_[off as usize..(off + n) as usize].fill(0);
        }
        75..=84 if len >= 4096 => {
            // Stores through a shared mapping of the whole file, then msync.
            let stores: Vec<(usize, u8)> =
                (0..rng.gen_range(1..50)).map(|_| (rng.gen_range(0..len as usize), rng.gen())).collect();
            // SAFETY: maps the file's `len` bytes (the file is not truncated while
            // mapped), stores only within them, syncs and unmaps before going on.
            unsafe {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                );
                assert_ne!(p, libc::MAP_FAILED, "mmap: {} ({ctx})", io::Error::last_os_error());
                let map = std::slice::from_raw_parts_mut(p.cast::<u8>(), len as usize);
                for &(at, b) in &stores {
                    map[at] = b;
                }
                assert_eq!(libc::msync(p, len as usize, libc::MS_SYNC), 0, "{ctx}");
                assert_eq!(libc::munmap(p, len as usize), 0);
            }
            for (at, b) in stores {
                m_[at] = b;
            }
        }
        85..=89 => f.sync_all().unwrap(),
        90..=94 => {
            // Zero a range, within the size or extending it.
            let off = rng.gen_range(0..MAX - 70_000);
            let n = rng.gen_range(1..70_000);
            let keep = rng.gen_bool(0.5);
            let mut flags = FallocateFlags::FALLOC_FL_ZERO_RANGE;
            if keep {
                flags |= FallocateFlags::FALLOC_FL_KEEP_SIZE;
            }
            nix::fcntl::fallocate(f, flags, off as i64, n as i64).unwrap();
            let end = (off + n) as usize;
            if !keep && m_.len() < end {
                m_.resize(end, 0);
            }
            let zero_to = end.min(m_.len());
            if (off as usize) < zero_to {
                m_[off as usize..zero_to].fill(0);
            }
        }
        _ => {
            // Copy from the other file (the daemon copies; dirty pages of either
            // file in the kernel's cache must be written back first).
            let src_len = other.len() as u64;
            let from = rng.gen_range(0..=src_len) as usize;
            let at_out = rng.gen_range(0..MAX - 100_000) as usize;
            let (mut off_in, mut off_out) = (from as i64, at_out as i64);
            let n = rng.gen_range(1..100_000);
            let done = nix::fcntl::copy_file_range(other_f, Some(&mut off_in), f, Some(&mut off_out), n)
                .unwrap_or_else(|e| panic!("copy_file_range: {e} ({ctx})"));
            assert!(done <= n && from + done <= other.len(), "copied {done} of {n} ({ctx})");
            if done > 0 {
                if m_.len() < at_out + done {
                    m_.resize(at_out + done, 0);
                }
                m_[at_out..at_out + done].copy_from_slice(&other[from..from + done]);
            }
        }
    }
    // Read back a random range, and the size.
    let len = m_.len() as u64;
    assert_eq!(f.metadata().unwrap().len(), len, "size ({ctx})");
    if len > 0 {
        let off = rng.gen_range(0..len);
        let n = rng.gen_range(1..=(len - off).min(200_000)) as usize;
        let mut got = vec![0u8; n];
        f.read_exact_at(&mut got, off).unwrap();
        assert!(got[..] == m_[off as usize..off as usize + n], "bytes {off}..+{n} ({ctx})");
    }
}

/// Random file operations (`random_file_op`) on two files through the mount, compared
/// with a model of the bytes after each, then after a remount; with the writeback cache
/// on (the default) and off. Seeded; DXFS_SEED reruns one seed.
#[test]
fn random_file_ops_match_a_model() {
    use rand::SeedableRng;
    require_fuse!();
    let seed: u64 = std::env::var("DXFS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_f11e);
    for cache in ["on", "off"] {
        let s = Scratch::new(64);
        let m = s.mount(&["--writeback-cache", cache]);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (cache == "on") as u64);
        let names = ["a", "b"];
        let files = names.map(|n| OpenOptions::new().read(true).write(true).create_new(true).open(s.path(n)).unwrap());
        let mut model: [Vec<u8>; 2] = Default::default();
        for step in 0..400 {
            random_file_op(&mut rng, &files, names, &mut model, &format!("seed {seed}, cache {cache}, step {step}"));
        }
        for f in &files {
            f.sync_all().unwrap();
        }
        drop(files);
        m.unmount();
        s.fsck();
        let m = s.mount(&[]);
        for (n, want) in names.iter().zip(&model) {
            assert!(fs::read(s.path(n)).unwrap() == *want, "{n} after a remount (seed {seed}, cache {cache})");
        }
        m.unmount();
        s.fsck();
    }
}

/// The same random file operations from four threads at once, each on two files of its
/// own, with write-back ahead of commits from 64 dirty pages and a commit every second:
/// flushes, commits and the kernel's write-back of one file run while the others are
/// written, truncated and copied. Every thread's files match its model after each
/// operation and after a remount. Seeded; DXFS_SEED reruns one seed.
#[test]
fn concurrent_random_file_ops_match_their_models() {
    use rand::SeedableRng;
    require_fuse!();
    let seed: u64 = std::env::var("DXFS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xc0_f11e);
    const THREADS: usize = 4;
    let s = Scratch::new(128);
    let m = s.mount(&["-o", "flush_from=64,commit=1"]);
    let names: Vec<[String; 2]> = (0..THREADS).map(|t| [format!("t{t}a"), format!("t{t}b")]).collect();
    let models: Vec<[Vec<u8>; 2]> = std::thread::scope(|sc| {
        let workers: Vec<_> = names
            .iter()
            .enumerate()
            .map(|(t, pair)| {
                let s = &s;
                sc.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (t as u64) << 32);
                    let files = [0, 1].map(|i| {
                        OpenOptions::new().read(true).write(true).create_new(true).open(s.path(&pair[i])).unwrap()
                    });
                    let mut model: [Vec<u8>; 2] = Default::default();
                    for step in 0..600 {
                        let ctx = format!("seed {seed}, thread {t}, step {step}");
                        random_file_op(&mut rng, &files, [&pair[0], &pair[1]], &mut model, &ctx);
                    }
                    for f in &files {
                        f.sync_all().unwrap();
                    }
                    model
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    m.unmount();
    s.fsck();
    let m = s.mount(&[]);
    for (pair, model) in names.iter().zip(&models) {
        for (n, want) in pair.iter().zip(model) {
            assert!(fs::read(s.path(n)).unwrap() == *want, "{n} after a remount (seed {seed})");
        }
    }
    m.unmount();
    s.fsck();
}

#[test]
fn checksum_failure_is_euclean() {
    require_fuse!();
    let s = Scratch::new(32);
    // A clean volume passes `-o check` (fsck -n's walk first).
    let m = s.mount(&["-o", "check"]);
    fs::create_dir(s.path("d")).unwrap();
    fs::write(s.path("d/victim"), b"v").unwrap();
    let ino = fs::metadata(s.path("d/victim")).unwrap().ino();
    m.unmount();
    // Recovery replays the newest delta at every open: make one that leaves the
    // victim's inode block alone, so the home copy scribbled below is the only one.
    let m = s.mount(&[]);
    fs::write(s.path("newer"), b"n").unwrap();
    m.unmount();
    // Scribble over the middle of the inode's block (not its checksum).
    let (block, _) = dxfs::internals::ino_loc(ino);
    let img = OpenOptions::new().write(true).open(&s.image).unwrap();
    img.write_all_at(&[0x5a; 64], block * 4096 + 2048).unwrap();
    drop(img);

    // `-o check` refuses to mount it read-write, naming what the walk found.
    let out = dxfs().arg("mount").arg(s.source()).arg(&s.mnt).args(["-o", "check"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !is_mounted(&s.mnt), "a damaged volume was mounted with -o check: {said}");
    assert!(said.contains("-o check: fsck -n found") && said.contains(&format!("block {block}")), "{said}");
    let m = s.mount(&["-o", "check,ro"]);
    assert_eq!(errno(fs::metadata(s.path("d/victim"))), libc::EUCLEAN);
    m.unmount();

    // The image was written since this host closed it: a plain mount walks it first and
    // refuses too (over NBD the written block is not one the record looks at).
    if !over_nbd() {
        let out = dxfs().arg("mount").arg(s.source()).arg(&s.mnt).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && !is_mounted(&s.mnt), "a damaged volume was mounted: {said}");
        assert!(said.contains("not as this host left it") && said.contains("fsck -n found"), "{said}");
    }
    let m = s.mount(&["-o", "nocheck"]);
    // "Structure needs cleaning", as ext4 and XFS say of a corrupt record.
    assert_eq!(errno(fs::metadata(s.path("d/victim"))), libc::EUCLEAN);
    let log = fs::read_to_string(m.log.as_ref().unwrap()).unwrap();
    assert!(log.contains("checksum mismatch"), "no log line for the bad block: {log}");
    // The rest of the volume still works, and the daemon neither panics nor hangs.
    fs::write(s.path("other"), b"fine").unwrap();
    assert_eq!(fs::read(s.path("other")).unwrap(), b"fine");
    m.unmount();
}

/// Whether a log shows the walk a read-write mount gives a volume this host did not leave
/// as it is.
fn walked_first(m: &Mounted) -> bool {
    fs::read_to_string(m.log.as_ref().unwrap()).unwrap().contains("checking it first")
}

/// A read-write mount walks a volume first (as `-o check` does) unless this host left it
/// as it is: closed by a mount or checked whole by fsck, with no write since; or left
/// open by a mount of this host that crashed. A damaged volume from elsewhere is refused.
#[test]
fn a_volume_this_host_did_not_leave_is_walked_before_a_read_write_mount() {
    require_fuse!();
    not_over_nbd!("an image file's ctime is what shows a write the record does not see");
    let s = Scratch::new(32);
    let info = [("RUST_LOG", "dxfs=info")];
    // Made by the library: no record, so the first mount walks it.
    let m = s.mount_with_env(&[], &info);
    assert!(walked_first(&m), "a volume with no record was not walked");
    fs::write(s.path("f"), b"kept").unwrap();
    m.unmount();
    // Left by that mount as it is: no walk, again and again.
    for round in 0..2 {
        let m = s.mount_with_env(&[], &info);
        assert!(!walked_first(&m), "round {round}: a volume this host left as it is was walked");
        fs::write(s.path(&format!("g{round}")), b"x").unwrap();
        m.unmount();
    }
    // A crash leaves it open by a process of this host that is gone: no walk either (the
    // log is replayed), and nothing committed is lost.
    let m = s.mount_with_env(&[], &info);
    fs::write(s.path("h"), b"synced").unwrap();
    File::open(s.path("h")).unwrap().sync_all().unwrap();
    m.kill9();
    let m = s.mount_with_env(&[], &info);
    assert!(!walked_first(&m), "the volume a crashed mount of this host left was walked");
    assert_eq!(fs::read(s.path("h")).unwrap(), b"synced");
    m.unmount();
    s.fsck();
    // Any write to the image since (here: its bitmap's first free bit set, with no count
    // change) makes it a volume from elsewhere: walked, found wrong, refused.
    let sb = dxfs::read_superblock(&FileDevice::open(&s.image, true).unwrap()).unwrap();
    let bitmap = sb.layout.bitmap_start * 4096;
    let img = OpenOptions::new().read(true).write(true).open(&s.image).unwrap();
    let mut byte = [0u8; 1];
    img.read_exact_at(&mut byte, bitmap + 4000).unwrap();
    img.write_all_at(&byte, bitmap + 4000).unwrap(); // the same byte: only the ctime moves
    drop(img);
    let m = s.mount_with_env(&[], &info);
    assert!(walked_first(&m), "an image written since this host closed it was not walked");
    m.unmount();
    // A volume from elsewhere whose map calls the root's inode block free, its count
    // moved with the bit and resealed: the map agrees with itself, and only the walk sees
    // the block is live (a mount without it would write data over the root).
    common::mutate::free_the_roots_inode_block(&s.image);
    let out = dxfs().arg("mount").arg(s.source()).arg(&s.mnt).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !is_mounted(&s.mnt), "a map calling live metadata free was mounted: {said}");
    assert!(said.contains("not as this host left it") && said.contains("fsck -n found"), "{said}");
    // `dxfs fsck` checks it whole: the next mount does not walk it again.
    let out = dxfs().arg("fsck").arg(&s.image).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.code() == Some(1) && said.contains("in use but marked free"), "{said}");
    let m = s.mount_with_env(&[], &info);
    assert!(!walked_first(&m), "a volume fsck had just repaired was walked");
    assert_eq!(fs::read(s.path("f")).unwrap(), b"kept");
    m.unmount();
    s.fsck();
}

/// Every lookup reference the kernel is given (entry replies, READDIRPLUS entries) comes
/// back in a FORGET once the kernel evicts the inode: after a mixed workload and a
/// dentry/inode cache drop, the daemon finds its counts balanced. (At unmount the kernel
/// drops the connection without FORGETs, so the eviction has to come first.)
#[test]
fn lookup_counts_are_balanced_by_forgets() {
    require_fuse!();
    if fs::OpenOptions::new().write(true).open("/proc/sys/vm/drop_caches").is_err() {
        eprintln!("skipped: cannot write /proc/sys/vm/drop_caches (not root)");
        return;
    }
    let s = Scratch::new(64);
    let m = s.mount_with_env(&[], &[("RUST_LOG", "dxfs=info")]);
    fs::create_dir_all(s.path("a/b/c")).unwrap();
    for i in 0..500 {
        fs::write(s.path(&format!("a/f{i}")), b"x").unwrap();
    }
    fs::hard_link(s.path("a/f1"), s.path("a/b/hard")).unwrap();
    std::os::unix::fs::symlink("f2", s.path("a/sym")).unwrap();
    fs::rename(s.path("a/f3"), s.path("a/b/c/moved")).unwrap();
    fs::rename(s.path("a/f4"), s.path("a/f5")).unwrap(); // over an existing file
    let out = Command::new("ls").arg("-lR").arg(&s.mnt).output().unwrap();
    assert!(out.status.success());
    for e in fs::read_dir(s.path("a")).unwrap() {
        fs::symlink_metadata(e.unwrap().path()).unwrap();
    }
    let open = File::open(s.path("a/f6")).unwrap();
    fs::remove_file(s.path("a/f6")).unwrap(); // unlinked while open
    drop(open);
    for i in 100..300 {
        fs::remove_file(s.path(&format!("a/f{i}"))).unwrap();
    }
    fs::remove_dir_all(s.path("a/b")).unwrap();
    assert!(fs::metadata(s.path("a/missing")).is_err()); // a negative lookup
    fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    // FORGETs are queued by the eviction; give the daemon a moment to read them.
    let log = s.tmp.path().join("daemon.log");
    std::thread::sleep(Duration::from_millis(300));
    m.unmount();
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.contains("lookup counts balanced"), "daemon log does not report balanced lookup counts:\n{text}");
    s.fsck();
}

/// `sync(1)` cannot reach a FUSE daemon; `dxfs sync` (an fsync of the mount's root)
/// can: what it synced survives a SIGKILL of the daemon, also when it is given a
/// directory inside the mount that did not change (an fsync of that directory alone
/// would commit nothing). And `df` right after `rm` shows the space, with no commit in
/// between.
#[test]
fn dxfs_sync_and_df_after_rm() {
    require_fuse!();
    let s = Scratch::new(64);
    // A long commit interval: nothing but `dxfs sync` commits during the test.
    let m = s.mount(&["-o", "commit=3600"]);
    fs::create_dir(s.path("sub")).unwrap();
    assert!(dxfs().arg("sync").arg(&s.mnt).status().unwrap().success());
    let big = s.path("big");
    fs::write(&big, pattern(1, 24 << 20)).unwrap();
    fs::write(s.path("small"), pattern(2, 5000)).unwrap();
    let st = dxfs().arg("sync").arg(s.path("sub")).status().unwrap();
    assert!(st.success(), "dxfs sync: {st}");
    let before = nix::sys::statvfs::statvfs(&s.mnt).unwrap().blocks_available();
    fs::remove_file(&big).unwrap();
    let after = nix::sys::statvfs::statvfs(&s.mnt).unwrap().blocks_available();
    assert!(after >= before + (24 << 20) / 4096 - 16, "df after rm: {before} -> {after} blocks available");
    m.kill9();
    s.fsck();
    let m = s.mount(&[]);
    assert!(fs::read(s.path("small")).unwrap() == pattern(2, 5000), "synced file lost");
    // The rm came after the last commit: the volume is as of `dxfs sync`.
    assert_eq!(fs::metadata(s.path("big")).unwrap().len(), 24 << 20, "the volume is as of the sync");
    m.unmount();
    s.fsck();
}

/// Loop devices attached now (`losetup -a`, one line each).
/// The file system type of the mount at `mnt` ("fuse.dxfs", "fuseblk.dxfs").
fn mount_type(mnt: &std::path::Path) -> String {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info.lines().find(|l| l.split(' ').nth(4) == mnt.to_str()).expect("not mounted");
    line.split(" - ").nth(1).and_then(|t| t.split(' ').next()).unwrap_or_default().to_string()
}

fn loop_devices_of(image: &std::path::Path) -> usize {
    let out = Command::new("losetup").arg("-j").arg(image).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// Whether no loop device is left over `image` within 5 s (the kernel detaches an
/// autoclear device from a work queue, a moment after its last user lets go). Other
/// tests' mounts have loop devices of their own meanwhile.
fn no_loop_device_of(image: &std::path::Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while loop_devices_of(image) != 0 {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A fuseblk mount (the default as root, `-o blkdev`; an image gets a loop device as its
/// source, `-o noblkdev` mounts plain):
/// this kernel sends `sync(1)` to the daemon (FUSE_SYNCFS), so what was written before
/// `sync` survives a SIGKILL of the daemon with no other commit; and `umount` returns
/// only after the DESTROY, which the daemon answers once the volume is committed. The
/// loop device goes with the mount, also when the daemon was killed.
#[test]
fn sync_and_umount_reach_a_fuseblk_mount() {
    require_fuse!();
    not_over_nbd!("an NBD export has no block device on this host");
    if !nix::unistd::geteuid().is_root() {
        skipping("sync_and_umount_reach_a_fuseblk_mount: a fuseblk mount needs root");
        return;
    }
    let s = Scratch::new(32);
    // A long commit interval: nothing but `sync` (and the DESTROY) commits.
    let m = s.mount(&["-o", "blkdev,commit=3600"]);
    assert_eq!(mount_type(&s.mnt), "fuseblk.dxfs");
    fs::write(s.path("synced"), pattern(3, 10_000)).unwrap();
    assert!(Command::new("sync").status().unwrap().success());
    fs::write(s.path("lost"), b"after the sync").unwrap();
    m.kill9();
    s.fsck();
    assert!(no_loop_device_of(&s.image), "the loop device outlived the mount");
    // The default as root: fuseblk.
    let m = s.mount(&["-o", "commit=3600"]);
    assert_eq!(mount_type(&s.mnt), "fuseblk.dxfs");
    assert_eq!(fs::read(s.path("synced")).unwrap(), pattern(3, 10_000), "sync did not reach the daemon");
    assert!(fs::metadata(s.path("lost")).is_err(), "written after the last commit, yet there");
    fs::write(s.path("at-umount"), b"committed by the DESTROY").unwrap();
    // `umount` returns after the DESTROY: kill the daemon at once, and the file is there.
    let mut m = m;
    let mut child = m.child.take().unwrap();
    let st = Command::new("umount").arg(&s.mnt).status().unwrap();
    assert!(st.success(), "umount: {st}");
    let _ = child.kill();
    child.wait().unwrap();
    m.image = PathBuf::new(); // nothing left to stop
    drop(m);
    s.fsck();
    // And the volume is free when `umount` returns, though the daemon may still be
    // exiting: a repairing fsck opens it at once (three times, as the race was lost in
    // about half the tries), and the daemon writes nothing after that.
    for i in 0..3 {
        let mut m = s.mount(&["-o", "commit=3600"]);
        fs::write(s.path(&format!("then-{i}")), b"x").unwrap();
        // Free already (fsck would wait a moment for a daemon letting go).
        umount_then_repair(&s, || assert!(!dxfs::block::FileDevice::in_use(&s.image), "held after umount"));
        let after_fsck = fs::read(&s.image).unwrap();
        let st = wait_timeout(m.child.as_mut().unwrap(), Duration::from_secs(20));
        assert!(st.success(), "the daemon after umount: {st}");
        m.child = None;
        m.image = PathBuf::new(); // nothing left to stop
        assert!(fs::read(&s.image).unwrap() == after_fsck, "the daemon wrote after its DESTROY was answered");
    }
    s.fsck();
    let m = s.mount(&["-o", "noblkdev"]);
    assert_eq!(mount_type(&s.mnt), "fuse.dxfs");
    assert_eq!(fs::read(s.path("at-umount")).unwrap(), b"committed by the DESTROY");
    m.unmount();
    s.fsck();
    assert!(no_loop_device_of(&s.image), "a loop device was left behind");
}

/// `umount` the mount of `s`, run `between`, then a repairing `dxfs fsck`, which must
/// succeed.
fn umount_then_repair(s: &Scratch, between: impl FnOnce()) {
    let st = unmount_by("umount", &s.mnt);
    assert!(st.success(), "umount: {st}");
    between();
    let out = dxfs().arg("fsck").arg(s.source()).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(out.status.success(), "fsck right after umount: {}{}", text(&out.stdout), text(&out.stderr));
}

/// After `umount` of a plain mount (no DESTROY: the kernel waits for nothing) the daemon
/// may still hold the image for a moment: a repairing `dxfs fsck` right after waits for it
/// to let go instead of refusing (it did every time). A live mount is refused at once.
/// Over NBD no lock tells: the wait watches the mount mark.
#[test]
fn fsck_right_after_umount_of_a_plain_mount() {
    require_fuse!();
    let s = Scratch::new(32);
    let mut first = Some(s.mount(&["-o", "noblkdev"]));
    assert_eq!(mount_type(&s.mnt), "fuse.dxfs");
    fs::write(s.path("f"), b"x").unwrap();
    let t = Instant::now();
    let out = dxfs().arg("fsck").arg(s.source()).output().unwrap();
    assert_eq!(out.status.code(), Some(8), "fsck of a live mount: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("busy"));
    assert!(t.elapsed() < Duration::from_secs(5), "refused after {:?}", t.elapsed());
    for i in 0..3 {
        let m = first.take().unwrap_or_else(|| s.mount(&["-o", "noblkdev"]));
        fs::write(s.path(&format!("then-{i}")), b"x").unwrap();
        umount_then_repair(&s, || {});
        drop(m);
    }
    s.fsck();
}

/// Over NBD no image lock tells that a daemon is still releasing the volume after
/// `umount`: `dxfs fsck` watches the mount mark instead. Each write to this export waits
/// 20 ms (nbdkit's delay filter), so the release after `umount` (a commit, the mark
/// written clean) takes a while: a repairing fsck right after was refused.
#[test]
fn fsck_right_after_umount_of_a_slow_nbd_export() {
    require_fuse!();
    let s = Scratch::new(32);
    let srv = NbdServer::start_with(&s.image, s.tmp.path().join("slow.sock"), &["--filter=delay", "wdelay=20ms"]);
    let source = format!("nbd+unix:///?socket={}", srv.sock.display());
    for i in 0..3 {
        let log = s.tmp.path().join("slow.log");
        let child = dxfs().arg("mount").arg(&source).arg(&s.mnt).stderr(File::create(&log).unwrap()).spawn().unwrap();
        let mut m = Mounted { child: Some(child), mnt: s.mnt.clone(), image: s.image.clone(), log: Some(log) };
        m.wait_mounted();
        fs::write(s.path(&format!("f{i}")), b"x").unwrap();
        let st = unmount_by("umount", &s.mnt);
        assert!(st.success(), "umount: {st}");
        let out = dxfs().arg("fsck").arg(&source).output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        assert!(out.status.success(), "fsck right after umount: {}{}", text(&out.stdout), text(&out.stderr));
        drop(m);
    }
    drop(srv);
    s.fsck();
}

/// A mount right after `umount` of a slow export, whose daemon is still committing and
/// holds the mount mark: the new mount waits for it to let go, then finds the volume as
/// that daemon left it, with no walk (a walk of a volume still changing could refuse
/// it for what it saw mid-commit).
#[test]
fn mount_right_after_umount_of_a_slow_nbd_export_waits_and_does_not_walk() {
    require_fuse!();
    let s = Scratch::new(32);
    let srv = NbdServer::start_with(&s.image, s.tmp.path().join("slow.sock"), &["--filter=delay", "wdelay=20ms"]);
    let source = format!("nbd+unix:///?socket={}", srv.sock.display());
    let mut daemons = Vec::new();
    for i in 0..4 {
        let log = s.tmp.path().join(format!("slow{i}.log"));
        let child = dxfs()
            .env("RUST_LOG", "dxfs=info")
            .arg("mount")
            .arg(&source)
            .arg(&s.mnt)
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut m = Mounted { child: Some(child), mnt: s.mnt.clone(), image: s.image.clone(), log: Some(log) };
        m.wait_mounted();
        // The first mount of a volume the library made walks it; none after.
        assert_eq!(walked_first(&m), i == 0, "mount {i}: {}", fs::read_to_string(m.log.as_ref().unwrap()).unwrap());
        for j in 0..20 {
            fs::write(s.path(&format!("f{i}-{j}")), b"x").unwrap();
        }
        let st = unmount_by("umount", &s.mnt);
        assert!(st.success(), "umount: {st}");
        // Not waited for: the next mount starts while this daemon may still commit.
        daemons.push(m.detach_child());
    }
    for mut d in daemons {
        assert_eq!(wait_timeout(&mut d, Duration::from_secs(20)).code(), Some(0), "a daemon's exit status");
    }
    drop(srv);
    s.fsck();
}

/// The transport is the one asked for: `-o transport=classic` never uses the ring;
/// `-o transport=uring` uses it when the kernel offers it (module parameter
/// `enable_uring` Y, which a mount as root turns on) and otherwise serves through
/// /dev/fuse, saying why in the log. With `DXFS_TRANSPORT` set (CI runs the suite once
/// per transport) the default mount must use that transport, so a fallback cannot pass
/// the uring run silently.
#[test]
fn transport_is_the_one_asked_for() {
    require_fuse!();
    let s = Scratch::new(32);
    let stats = mount_stats;
    let offered = fs::read_to_string(ENABLE_URING).is_ok_and(|v| v.trim() == "Y")
        || (nix::unistd::geteuid().is_root() && fs::metadata(ENABLE_URING).is_ok());
    for (opt, env) in
        [("transport=classic", None), ("transport=uring", None), ("", std::env::var("DXFS_TRANSPORT").ok())]
    {
        let Some(want) = (if opt.is_empty() { env.clone() } else { Some(opt[10..].to_string()) }) else { continue };
        let args: Vec<&str> = if opt.is_empty() { vec!["-v"] } else { vec!["-v", "-o", opt] };
        let m = s.mount(&args);
        for i in 0..20 {
            fs::write(s.path(&format!("f{i}")), b"x").unwrap();
            fs::remove_file(s.path(&format!("f{i}"))).unwrap();
        }
        let v = stats(&s.mnt);
        let transport = v["transport"].as_str().unwrap().to_string();
        let via_ring = v["via_ring"].as_u64().unwrap();
        let log = m.log.clone().unwrap();
        m.unmount();
        let log = fs::read_to_string(log).unwrap();
        match want.as_str() {
            "classic" => {
                assert!(transport.starts_with("/dev/fuse"), "{opt:?}: {transport}");
                assert_eq!(via_ring, 0, "{opt:?}: classic requests came through a ring");
            }
            "uring" if offered || !opt.is_empty() => {
                if offered {
                    assert!(transport.starts_with("io_uring"), "{opt:?}: {transport}\n{log}");
                    assert!(via_ring >= 40, "{opt:?}: only {via_ring} requests through the ring");
                } else {
                    eprintln!("enable_uring is not Y: checking the fallback to /dev/fuse");
                    assert!(transport.starts_with("/dev/fuse"), "{transport}");
                    assert!(log.contains("enable_uring"), "the fallback must say why: {log}");
                }
            }
            "uring" => panic!("DXFS_TRANSPORT=uring but the kernel does not offer FUSE over io_uring"),
            other => panic!("DXFS_TRANSPORT={other}"),
        }
    }
    s.fsck();
}

/// The fuse module's switch for FUSE over io_uring.
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// A plain mount as root gets the fast transport: the mount turns the module's switch on
/// when it is off (`offer_uring`'s unit test shows the switch turned); `-o
/// transport=classic` never does.
#[test]
fn a_mount_as_root_gets_uring() {
    require_fuse!();
    if fs::metadata(ENABLE_URING).is_err() || !nix::unistd::geteuid().is_root() {
        skipping("a_mount_as_root_gets_uring: no FUSE over io_uring here, or not root");
        return;
    }
    let s = Scratch::new(32);
    let m = s.mount(&["-v", "-o", "transport=classic"]);
    let log = m.log.clone().unwrap();
    m.unmount();
    let log = fs::read_to_string(log).unwrap();
    assert!(!log.contains("turned FUSE over io_uring on"), "transport=classic turned it on: {log}");
    let m = s.mount(&["-v", "-o", "transport=auto"]);
    fs::write(s.path("f"), b"x").unwrap();
    let v = mount_stats(&s.mnt);
    m.unmount();
    assert_eq!(fs::read_to_string(ENABLE_URING).unwrap().trim(), "Y");
    assert!(v["transport"].as_str().unwrap().starts_with("io_uring"), "{v}");
    s.fsck();
}

/// A ring whose setup fails half way (one queue's registration refused, the others
/// registered) leaves the mount on /dev/fuse, saying why, never hanging or half mounted.
#[test]
fn uring_failing_half_way_falls_back_to_dev_fuse() {
    require_fuse!();
    if !nix::unistd::geteuid().is_root() || fs::metadata(ENABLE_URING).is_err() {
        skipping("uring_failing_half_way_falls_back_to_dev_fuse: no FUSE over io_uring to turn on");
        return;
    }
    let s = Scratch::new(32);
    let queues = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    for broken in ["0", queues.trim().rsplit(['-', ',']).next().unwrap()] {
        let m = s.mount_with_env(&["-v", "-o", "transport=uring"], &[("DXFS_TEST_BREAK_URING_QUEUE", broken)]);
        fs::write(s.path("f"), b"served").unwrap();
        assert_eq!(fs::read(s.path("f")).unwrap(), b"served");
        let v = mount_stats(&s.mnt);
        assert!(v["transport"].as_str().unwrap().starts_with("/dev/fuse"), "queue {broken}: {v}");
        assert_eq!(v["via_ring"].as_u64(), Some(0));
        let log = m.log.clone().unwrap();
        m.unmount();
        let log = fs::read_to_string(log).unwrap();
        assert!(log.contains("not registered") && log.contains("serving through /dev/fuse"), "{log}");
    }
    s.fsck();
}

/// `dxfs stats` reads a live mount's request counters: every create shows up, and the
/// counters cannot be set.
#[test]
fn request_counters_of_a_live_mount() {
    require_fuse!();
    let s = Scratch::new(32);
    let m = s.mount(&[]);
    for i in 0..20 {
        File::create(s.path(&format!("f{i}"))).unwrap();
    }
    let out = dxfs().arg("stats").arg("--json").arg(&s.mnt).output().unwrap();
    assert!(out.status.success(), "dxfs stats: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(v["ops"]["CREATE"]["count"].as_u64().unwrap() >= 20, "{v}");
    assert!(v["requests"].as_u64().unwrap() >= 20);
    let text = dxfs().arg("stats").arg(&s.mnt).output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("CREATE"));
    assert_eq!(errno(setxattr(&s.mnt, "user.dxfs.stats", b"{}", 0)), libc::EPERM);
    let plain = dxfs().arg("stats").arg(s.tmp.path()).output().unwrap();
    assert_eq!(plain.status.code(), Some(8), "not a dxfs mount");
    // A missing name is asked once, then cached as a negative entry; creating it through
    // the mount replaces the negative entry.
    let lookups = || {
        let v = mount_stats(&s.mnt);
        v["ops"]["LOOKUP"]["count"].as_u64().unwrap_or(0)
    };
    let before = lookups();
    for _ in 0..10 {
        assert!(fs::metadata(s.path("missing")).is_err());
    }
    assert_eq!(lookups() - before, 1, "ten stats of a missing name: one LOOKUP");
    fs::write(s.path("missing"), b"now here").unwrap();
    assert_eq!(fs::read(s.path("missing")).unwrap(), b"now here");
    m.unmount();
    s.fsck();
}

/// fallocate modes and copy_file_range through the mount, against a byte model. The
/// kernel's FUSE client passes KEEP_SIZE, PUNCH_HOLE and ZERO_RANGE to the daemon;
/// COLLAPSE_RANGE and INSERT_RANGE it refuses itself (EOPNOTSUPP) before any request, so
/// they exist only in the library (`Volume::collapse_range`, `insert_range`).
#[test]
fn fallocate_modes_and_copy_file_range() {
    require_fuse!();
    let s = Scratch::new(64);
    let m = s.mount(&[]);
    let a = s.path("a");
    let mut model: Vec<u8> = (0..200_000u32).map(|k| (k % 253) as u8).collect();
    fs::write(&a, &model).unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&a).unwrap();
    nix::fcntl::fallocate(&f, FallocateFlags::FALLOC_FL_ZERO_RANGE | FallocateFlags::FALLOC_FL_KEEP_SIZE, 1000, 30_000)
        .unwrap();
    model[1000..31_000].fill(0);
    nix::fcntl::fallocate(&f, FallocateFlags::FALLOC_FL_ZERO_RANGE, 199_000, 10_000).unwrap();
    model.resize(209_000, 0);
    model[199_000..].fill(0);
    let collapse = nix::fcntl::fallocate(&f, FallocateFlags::FALLOC_FL_COLLAPSE_RANGE, 4096, 4096);
    assert_eq!(nix_errno(collapse), libc::EOPNOTSUPP, "the kernel keeps COLLAPSE_RANGE from FUSE");
    drop(f);
    assert!(fs::read(&a).unwrap() == model, "content after ZERO_RANGE");
    // copy_file_range is served inside the daemon (one COPY_FILE_RANGE request).
    let src = File::open(&a).unwrap();
    let dst = OpenOptions::new().write(true).create(true).truncate(true).open(s.path("b")).unwrap();
    let mut off_in: i64 = 5000;
    let mut off_out: i64 = 0;
    let n = nix::fcntl::copy_file_range(&src, Some(&mut off_in), &dst, Some(&mut off_out), 100_000).unwrap();
    assert_eq!(n, 100_000);
    drop((src, dst));
    assert!(fs::read(s.path("b")).unwrap() == model[5000..105_000], "copied range");
    let v = mount_stats(&s.mnt);
    assert!(v["ops"]["COPY_FILE_RANGE"]["count"].as_u64().unwrap_or(0) >= 1, "{v}");
    m.unmount();
    s.fsck();
}

/// Writes cost one request, not two: the daemon drops setuid/setgid bits and file
/// capabilities itself (HANDLE_KILLPRIV_V2), so the kernel stops asking for
/// security.capability before every write. The rules still hold: a write or truncate by a
/// user without CAP_FSETID drops setuid (and setgid with group execute), root's does not,
/// and chown drops them.
#[test]
fn privileges_dropped_by_the_daemon() {
    require_fuse!();
    if Command::new("setpriv").arg("--version").stdout(Stdio::null()).status().is_err() {
        skipping("privileges_dropped_by_the_daemon: setpriv not found");
        return;
    }
    let s = Scratch::new(32);
    let m = s.mount(&["--allow-other"]);
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    let make = |name: &str, perm: u32| {
        let p = s.path(name);
        fs::write(&p, b"0123456789").unwrap();
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(perm)).unwrap();
        p
    };
    let (suid, sgid_x, sgid_nox) = (make("suid", 0o4777), make("sgid-x", 0o2777), make("sgid-nox", 0o2767));
    for p in [&suid, &sgid_x, &sgid_nox] {
        let out = as_nobody(&format!("printf abc >> '{}'", p.display()));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(mode(&suid), 0o777, "a write by nobody drops setuid");
    assert_eq!(mode(&sgid_x), 0o777, "and setgid of a group-executable file");
    assert_eq!(mode(&sgid_nox), 0o2767, "but not setgid without group execute");
    // Unless the writer is not in the file's group (the kernel's setattr_should_drop_sgid).
    let outside = make("sgid-outside", 0o2767);
    std::os::unix::fs::chown(&outside, None, Some(0)).unwrap();
    fs::set_permissions(&outside, fs::Permissions::from_mode(0o2767)).unwrap();
    let out = as_nobody(&format!("printf abc >> '{}'", outside.display()));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode(&outside), 0o767, "setgid of a file whose group the writer is not in");
    // A plain file written by root in ten separate opens: no GETXATTR but the stats
    // read's own. (Measured: the kernel still asks before each write by a user without
    // CAP_FSETID, and before each write to a file that keeps a setgid bit.)
    let plain = make("plain", 0o666);
    // The first write after a mode change asks once (the kernel then marks it S_NOSEC).
    fs::OpenOptions::new().append(true).open(&plain).unwrap().write_all(b"abc").unwrap();
    let before = lookups_and_getxattrs(&s);
    for _ in 0..10 {
        fs::OpenOptions::new().append(true).open(&plain).unwrap().write_all(b"abc").unwrap();
    }
    let after = lookups_and_getxattrs(&s);
    assert_eq!(after.1 - before.1, 1, "no GETXATTR per write (the stats read itself is one)");
    // Root (CAP_FSETID) keeps them; a truncate by nobody drops them; so does chown.
    fs::set_permissions(&suid, fs::Permissions::from_mode(0o4777)).unwrap();
    fs::OpenOptions::new().append(true).open(&suid).unwrap().write_all(b"root").unwrap();
    assert_eq!(mode(&suid), 0o4777, "root's write keeps setuid");
    let out = as_nobody(&format!("truncate -s 2 '{}'", suid.display()));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode(&suid), 0o777, "a truncate by nobody drops setuid");
    fs::set_permissions(&suid, fs::Permissions::from_mode(0o4755)).unwrap();
    std::os::unix::fs::chown(&suid, Some(0), None).unwrap();
    assert_eq!(mode(&suid), 0o755, "chown drops setuid");
    // So does a chown to the owner and group it has (the kernel's chown_common; xfstests
    // generic/193), setgid only with group execute.
    fs::set_permissions(&suid, fs::Permissions::from_mode(0o6755)).unwrap();
    let md = fs::metadata(&suid).unwrap();
    std::os::unix::fs::chown(&suid, Some(md.uid()), Some(md.gid())).unwrap();
    assert_eq!(mode(&suid), 0o755, "a chown to the same owner drops setuid and setgid");
    fs::set_permissions(&suid, fs::Permissions::from_mode(0o6745)).unwrap();
    std::os::unix::fs::chown(&suid, Some(md.uid()), None).unwrap();
    assert_eq!(mode(&suid), 0o2745, "setgid without group execute stays");
    // A fallocate by nobody drops setuid, and setgid too when nobody is not in the file's
    // group (xfstests generic/683–685); the kernel's cached mode goes with them.
    for (group, want) in [(65534, 0o2666), (0, 0o666)] {
        std::os::unix::fs::chown(&suid, None, Some(group)).unwrap();
        fs::set_permissions(&suid, fs::Permissions::from_mode(0o6666)).unwrap();
        assert_eq!(mode(&suid), 0o6666);
        let out = as_nobody(&format!("fallocate -o 0 -l 8192 '{}'", suid.display()));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(mode(&suid), want, "a fallocate by nobody, the file's group {group}");
    }
    m.unmount();
    s.fsck();
}

/// A live mount's request counters (`dxfs stats --json`).
fn mount_stats(mnt: &Path) -> serde_json::Value {
    let out = dxfs().arg("stats").arg("--json").arg(mnt).output().unwrap();
    assert!(out.status.success(), "dxfs stats: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// (LOOKUP, GETXATTR) requests served so far by the mount of `s`.
fn lookups_and_getxattrs(s: &Scratch) -> (u64, u64) {
    let v = mount_stats(&s.mnt);
    let n = |op: &str| v["ops"][op]["count"].as_u64().unwrap_or(0);
    (n("LOOKUP"), n("GETXATTR"))
}

/// One writer per volume: a second read-write mount, a repairing fsck and mkfs of a
/// mounted image are refused with a clear message; `fsck -n` runs but warns.
#[test]
fn one_writer_per_volume() {
    require_fuse!();
    not_over_nbd!("the one-writer lock is a lock on the image file, which the NBD server holds open; NBD itself has no lock (docs/DESIGN.md)");
    let s = Scratch::new(32);
    let m = s.mount(&[]);
    fs::write(s.path("f"), b"kept").unwrap();
    let other = s.tmp.path().join("mnt2");
    fs::create_dir(&other).unwrap();
    let second = dxfs().arg("mount").arg(&s.image).arg(&other).args(["-o", "lock_wait=0"]).output().unwrap();
    assert_eq!(second.status.code(), Some(8), "a second read-write mount must be refused");
    let msg = String::from_utf8_lossy(&second.stderr);
    assert!(msg.contains("in use"), "the refusal says why: {msg}");
    assert!(!is_mounted(&other));
    let fsck = dxfs().arg("fsck").arg(&s.image).output().unwrap();
    assert_eq!(fsck.status.code(), Some(8), "a repairing fsck of a mounted volume is refused");
    assert!(String::from_utf8_lossy(&fsck.stderr).contains("unmount it first"));
    let look = dxfs().arg("fsck").arg("-n").arg(&s.image).output().unwrap();
    assert!(String::from_utf8_lossy(&look.stderr).contains("warning"), "fsck -n warns");
    let mkfs = dxfs().arg("mkfs").arg("-f").arg(&s.image).output().unwrap();
    assert_ne!(mkfs.status.code(), Some(0), "mkfs over a mounted volume is refused");
    // The library refuses the same way.
    let lib = dxfs::block::FileDevice::open(&s.image, false);
    assert!(matches!(lib, Err(dxfs::Error::Busy(_))), "{:?}", lib.map(|_| ()));
    m.unmount();
    assert_eq!(fs::read(s.path("f")).unwrap_or_default(), b"", "unmounted");
    s.fsck();
    let m = s.mount(&[]);
    assert_eq!(fs::read(s.path("f")).unwrap(), b"kept");
    m.unmount();
}

/// Unmount and mount again at once, many times, on one directory, alternating two
/// images: the exiting daemon never unmounts the next mount (of the other image, whose
/// lock it does not hold). Every file written survives, and both volumes are clean.
/// (Remounting the same image at once: `remount_of_the_same_image_waits_for_the_old_daemon`.)
#[test]
fn rapid_unmount_and_remount() {
    require_fuse!();
    let s = Scratch::new(32);
    let other = s.tmp.path().join("image2");
    mkfs(Arc::new(FileDevice::create(&other, 32 << 20).unwrap()), &MkfsOptions::default()).unwrap();
    let images = [s.image.clone(), other.clone()];
    let rounds = 100;
    let mut daemons = Vec::new();
    for round in 0..rounds {
        let image = &images[round % 2];
        let log = File::create(s.tmp.path().join(format!("daemon{round}.log"))).unwrap();
        let child = dxfs().arg("mount").arg(image).arg(&s.mnt).stderr(log).spawn().unwrap();
        let mut m = Mounted { child: Some(child), mnt: s.mnt.clone(), image: image.clone(), log: None };
        m.wait_mounted();
        if round > 0 {
            // The previous daemon, of the other image, exits while this mount is live:
            // this mount must still be there afterwards.
            let st = wait_timeout(&mut daemons[round - 1], Duration::from_secs(20));
            assert_eq!(st.code(), Some(0), "daemon of round {}", round - 1);
            assert!(is_mounted(&s.mnt), "round {round}: the previous daemon unmounted this mount");
        }
        for earlier in (round % 2..round).step_by(2) {
            let got =
                fs::read(s.path(&format!("r{earlier}"))).unwrap_or_else(|e| panic!("round {round}: r{earlier}: {e}"));
            assert_eq!(got, pattern(earlier as u64, 3000), "round {round}: r{earlier}");
        }
        fs::write(s.path(&format!("r{round}")), pattern(round as u64, 3000)).unwrap();
        // Unmount with umount(8) and do not wait for the daemon: the next mount starts
        // while the old daemon may still be committing (and exiting).
        let st = unmount_by("umount", &s.mnt);
        assert!(st.success(), "round {round}: umount");
        daemons.push(m.detach_child());
    }
    for (i, mut d) in daemons.into_iter().enumerate() {
        let st = wait_timeout(&mut d, Duration::from_secs(20));
        assert_eq!(st.code(), Some(0), "daemon of round {i}");
    }
    for image in &images {
        let out = dxfs().arg("fsck").arg("-n").arg(image).output().unwrap();
        assert!(out.status.success(), "fsck {}: {}", image.display(), String::from_utf8_lossy(&out.stdout));
    }
}

/// `dxfs mount --daemon` lets go of its caller's output once the mount is live, so a
/// caller capturing it (`out=$(dxfs mount … --daemon)`) returns at once.
#[test]
fn daemon_detaches_from_captured_output() {
    require_fuse!();
    not_over_nbd!("mounts the image path itself");
    let s = Scratch::new(32);
    let t = Instant::now();
    let script = format!(
        "out=$('{}' mount '{}' '{}' --daemon 2>&1); echo \"[$out]\"",
        env!("CARGO_BIN_EXE_dxfs"),
        s.image.display(),
        s.mnt.display()
    );
    let mut sh = Command::new("sh").arg("-c").arg(&script).stdout(Stdio::piped()).spawn().unwrap();
    let st = wait_timeout(&mut sh, Duration::from_secs(15));
    assert!(st.success());
    let mut out = String::new();
    sh.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(t.elapsed() < Duration::from_secs(10), "the caller waited {:?}", t.elapsed());
    assert_eq!(out.trim(), "[]", "the daemon printed into its caller's output: {out}");
    assert!(is_mounted(&s.mnt));
    fs::write(s.path("x"), b"y").unwrap();
    let m = Mounted { child: None, mnt: s.mnt.clone(), image: s.image.clone(), log: None };
    let st = unmount_by("umount", &s.mnt);
    assert!(st.success());
    wait_unused(&s.image);
    drop(m);
    s.fsck();
}

/// `ls` of a directory with one damaged inode block lists every name (READDIRPLUS sends
/// the damaged entries without attributes); only those entries fail, with EUCLEAN.
#[test]
fn damaged_inode_block_lists_the_rest() {
    require_fuse!();
    let s = Scratch::new(64);
    let m = s.mount(&[]);
    fs::create_dir(s.path("d")).unwrap();
    let mut inos = Vec::new();
    for i in 0..3000 {
        let p = s.path(&format!("d/f{i:04}"));
        File::create(&p).unwrap();
        inos.push(fs::metadata(&p).unwrap().ino());
    }
    m.unmount();
    let victim = dxfs::internals::ino_loc(inos[1500]).0;
    let mut img = OpenOptions::new().write(true).open(&s.image).unwrap();
    img.seek(SeekFrom::Start(victim * 4096)).unwrap();
    img.write_all(&[0xA5u8; 4096]).unwrap();
    drop(img);
    let damaged = inos.iter().filter(|&&i| dxfs::internals::ino_loc(i).0 == victim).count();
    let m = s.mount(&["-o", "nocheck"]); // damaged on purpose: served as it is
    let names = fs::read_dir(s.path("d")).unwrap().filter(|e| e.is_ok()).count();
    assert_eq!(names, 3000, "every name is listed");
    assert_eq!(errno(fs::metadata(s.path("d/f1500"))), libc::EUCLEAN);
    let failing = (0..3000).filter(|i| fs::metadata(s.path(&format!("d/f{i:04}"))).is_err()).count();
    assert_eq!(failing, damaged, "only the damaged block's entries fail");
    m.unmount();
}

/// `mount -o remount,ro` and back to rw through the mount helper (mount(8) runs
/// mount.fuse3, which runs `dxfs IMAGE DIR -o remount,ro`): the live mount turns
/// read-only (EROFS) and writable again, its daemon serving throughout.
#[test]
fn remount_read_only_and_back() {
    require_fuse!();
    let Some(helper) = ["/sbin/mount.fuse3", "/usr/sbin/mount.fuse3"].into_iter().find(|p| Path::new(p).exists())
    else {
        skipping("remount_read_only_and_back: no mount.fuse3");
        return;
    };
    let s = Scratch::new(32);
    let m = s.mount(&[]);
    fs::write(s.path("a"), b"before").unwrap();
    let bin = s.tmp.path().join("bin");
    fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_dxfs"), bin.join("dxfs")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let remount = |how: &str| {
        let st = Command::new(helper)
            .arg(&s.image)
            .arg(&s.mnt)
            .args(["-t", "dxfs", "-o", &format!("remount,{how}")])
            .env("PATH", &path)
            .status()
            .unwrap();
        assert!(st.success(), "remount,{how}: {st}");
    };
    remount("ro");
    assert_eq!(errno(fs::write(s.path("b"), b"x")), libc::EROFS);
    assert_eq!(fs::read(s.path("a")).unwrap(), b"before");
    remount("rw");
    fs::write(s.path("b"), b"after").unwrap();
    m.unmount();
    s.fsck();
}

/// renameat2(RENAME_WHITEOUT) through the mount leaves a whiteout device.
#[test]
fn rename_whiteout_through_the_mount() {
    require_fuse!();
    let s = Scratch::new(32);
    let m = s.mount(&[]);
    fs::write(s.path("a"), b"x").unwrap();
    renameat2(AT_FDCWD, &s.path("a"), AT_FDCWD, &s.path("b"), RenameFlags::RENAME_WHITEOUT).unwrap();
    assert_eq!(fs::read(s.path("b")).unwrap(), b"x");
    let w = fs::symlink_metadata(s.path("a")).unwrap();
    assert!(w.file_type().is_char_device() && w.rdev() == 0, "{w:?}");
    m.unmount();
    s.fsck();
}

/// The daemon's stderr redirected to a file holds plain text (no ANSI escape codes), and a
/// clean mount/unmount session logs no warning: the references the kernel drops without
/// FORGETs at unmount are not one. `-v` turns on the info lines, so the log is not empty.
#[test]
fn daemon_log_is_plain_and_quiet() {
    require_fuse!();
    let s = Scratch::new(32);
    let m = s.mount(&["-v"]);
    fs::create_dir(s.path("d")).unwrap();
    for i in 0..50 {
        fs::write(s.path(&format!("d/f{i}")), b"data").unwrap();
    }
    // Lookups the kernel still holds at unmount.
    for e in fs::read_dir(s.path("d")).unwrap() {
        fs::metadata(e.unwrap().path()).unwrap();
    }
    let log = s.tmp.path().join("daemon.log");
    m.unmount();
    let bytes = fs::read(&log).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("requests served"), "-v did not turn on the info lines:\n{text}");
    assert!(!bytes.contains(&0x1b), "escape codes in the daemon's log:\n{text:?}");
    assert!(!text.contains("WARN"), "a clean session logged a warning:\n{text}");
    s.fsck();
}

/// An open directory outlives its last link, as a file does: fstat on a directory fd
/// still works after the directory was renamed over (or removed), and the volume frees it
/// at the last close.
#[test]
fn open_directory_outlives_its_name() {
    require_fuse!();
    let s = Scratch::new(32);
    let m = s.mount(&[]);
    fs::create_dir(s.path("old")).unwrap();
    fs::create_dir(s.path("new")).unwrap();
    let fd = File::open(s.path("old")).unwrap();
    let ino = fd.metadata().unwrap().ino();
    fs::rename(s.path("new"), s.path("old")).unwrap();
    let st = nix::sys::stat::fstat(&fd).expect("fstat of a directory replaced while open");
    assert_eq!(st.st_ino, ino);
    fs::create_dir(s.path("gone")).unwrap();
    let fd2 = File::open(s.path("gone")).unwrap();
    fs::remove_dir(s.path("gone")).unwrap();
    assert!(nix::sys::stat::fstat(&fd2).is_ok(), "fstat of a removed directory");
    drop((fd, fd2));
    m.unmount();
    s.fsck();
}

/// Unmount and remount the same image at once, many times: the new daemon waits for the
/// old one to finish its last commit and let go of the image (`lock_wait`: the image's
/// lock, or over NBD the volume's mount mark), and nothing
/// written before an unmount is ever missing after the remount.
#[test]
fn remount_of_the_same_image_waits_for_the_old_daemon() {
    require_fuse!();
    let s = Scratch::new(32);
    let mut daemons = Vec::new();
    for round in 0..15 {
        let m = s.mount(&[]);
        for earlier in 0..round {
            let got =
                fs::read(s.path(&format!("r{earlier}"))).unwrap_or_else(|e| panic!("round {round}: r{earlier}: {e}"));
            assert_eq!(got, pattern(earlier as u64, 3000), "round {round}: r{earlier}");
        }
        // Enough dirty data that the last commit takes a moment.
        fs::write(s.path(&format!("r{round}")), pattern(round as u64, 3000)).unwrap();
        fs::write(s.path("bulk"), pattern(round as u64, 4 << 20)).unwrap();
        let st = unmount_by("umount", &s.mnt);
        assert!(st.success(), "round {round}: umount");
        daemons.push(m.detach_child());
    }
    for (i, mut d) in daemons.into_iter().enumerate() {
        let st = wait_timeout(&mut d, Duration::from_secs(20));
        assert_eq!(st.code(), Some(0), "daemon of round {i}");
    }
    s.fsck();
}

/// atime through the mount: FUSE leaves atime to the daemon, which applies relatime by
/// default (a read updates atime only when it is not after mtime/ctime, or a day old),
/// strictatime (every read) and noatime (never); a listing counts as an access of the
/// directory. The kernel mount flags follow the options (/proc/self/mountinfo).
#[test]
fn atime_policies() {
    require_fuse!();
    let s = Scratch::new(32);
    let atime = |p: &Path| {
        let m = fs::metadata(p).unwrap();
        (m.atime(), m.atime_nsec())
    };
    let set_atime = |p: &Path, sec: i64| {
        utimensat(AT_FDCWD, p, &TimeSpec::new(sec, 0), &TimeSpec::UTIME_OMIT, UtimensatFlags::FollowSymlink).unwrap();
    };
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    {
        let m = s.mount(&[]);
        assert!(mount_options(&s.mnt).contains("relatime"), "{}", mount_options(&s.mnt));
        fs::write(s.path("f"), b"hello").unwrap();
        fs::create_dir(s.path("d")).unwrap();
        fs::write(s.path("d/x"), b"").unwrap();
        // relatime: atime not after mtime -> the read updates it.
        let t0 = now();
        set_atime(&s.path("f"), t0 - 3600);
        // utimensat set ctime to now, after atime: the next read moves atime. Past the
        // clock's tick, so that atime ends after ctime, not equal to it (equal moves it
        // again, as in the kernel).
        std::thread::sleep(Duration::from_millis(20));
        fs::read(s.path("f")).unwrap();
        let a1 = atime(&s.path("f"));
        assert!(a1.0 >= t0 - 1, "relatime: atime {a1:?} not updated by a read (was {})", t0 - 3600);
        // Now atime is after mtime and ctime and fresh: another read leaves it.
        std::thread::sleep(Duration::from_millis(1100));
        fs::read(s.path("f")).unwrap();
        assert_eq!(atime(&s.path("f")), a1, "relatime: a second read moved atime");
        // A day-old atime moves even when after mtime/ctime... set_atime changes ctime,
        // so make mtime and ctime old first by checking the rule on a directory listing.
        let d0 = atime(&s.path("d"));
        let _ = fs::read_dir(s.path("d")).unwrap().count();
        let d1 = atime(&s.path("d"));
        assert!(d1 > d0, "relatime: listing a directory changed since its atime left atime {d0:?}");
        // While a writer has the file open the kernel keeps its mtime (writeback cache),
        // maybe later than the volume's: an open for reading moves atime, even from after
        // the mtime and ctime the volume has (here, set an hour ahead).
        let mut w = fs::OpenOptions::new().append(true).open(s.path("f")).unwrap();
        w.write_all(b" again").unwrap();
        set_atime(&s.path("f"), now() + 3600);
        fs::read(s.path("f")).unwrap();
        let a2 = atime(&s.path("f"));
        assert!(a2.0 <= now(), "relatime: an open for reading beside a writer left atime {a2:?} (an hour ahead)");
        drop(w);
        m.unmount();
    }
    {
        let m = s.mount(&["-o", "strictatime"]);
        assert!(!mount_options(&s.mnt).contains("relatime"), "{}", mount_options(&s.mnt));
        let a0 = atime(&s.path("f"));
        std::thread::sleep(Duration::from_millis(1100));
        fs::read(s.path("f")).unwrap();
        assert!(atime(&s.path("f")) > a0, "strictatime: a read did not move atime");
        m.unmount();
    }
    {
        let m = s.mount(&["-o", "noatime"]);
        assert!(mount_options(&s.mnt).contains("noatime"), "{}", mount_options(&s.mnt));
        set_atime(&s.path("f"), 1000);
        fs::read(s.path("f")).unwrap();
        assert_eq!(atime(&s.path("f")).0, 1000, "noatime: a read moved atime");
        m.unmount();
    }
    // The atime written through the mount is on the volume.
    let m = s.mount(&["-o", "noatime"]);
    assert_eq!(atime(&s.path("f")).0, 1000);
    m.unmount();
    s.fsck();
}

/// A file read through a second handle while its writer still holds it open (git's
/// index-pack reads its pack so) is read from the kernel's page cache, dirty pages and
/// all: the open that records the access (relatime: the read after a change) moves atime
/// itself, rather than having the kernel drop the cache, which writes back each dirty
/// page as a WRITE of its own before the read can start. (A close writes the pages
/// back first, in large WRITEs.)
/// `statx` of `p` asking for the birth time too.
fn statx_of(p: &Path) -> libc::statx {
    let c = cstr(p);
    // SAFETY: an all-zero `struct statx` is valid; the kernel fills it.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let mask = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
    // SAFETY: a NUL-terminated path and a `struct statx` the call may write.
    let r = unsafe { libc::statx(libc::AT_FDCWD, c.as_ptr(), 0, mask, &mut st) };
    assert_eq!(r, 0, "statx {}: {}", p.display(), io::Error::last_os_error());
    st
}

/// A `statx_timestamp` in nanoseconds since the epoch.
fn nanos(t: libc::statx_timestamp) -> i128 {
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}

/// The birth time `statx` gives (the kernel asks STATX for it) is when the inode was
/// made: later writes and changes of attributes leave it, and so does a remount. A device
/// node's numbers come back as they went in.
#[test]
fn birth_time_through_statx() {
    require_fuse!();
    let s = Scratch::new(32);
    let m = s.mount(&[]);
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i128;
    // The daemon stamps with the kernel's coarse clock, which lags this one by up to a
    // tick: `before` is read from it too. The slack covers rounding only.
    const SLACK: i128 = 2_000_000;
    let coarse = nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME_COARSE).unwrap();
    let before = i128::from(coarse.tv_sec()) * 1_000_000_000 + i128::from(coarse.tv_nsec());
    fs::write(s.path("f"), b"one").unwrap();
    fs::create_dir(s.path("d")).unwrap();
    let dev = nix::sys::stat::makedev(4, 5);
    nix::sys::stat::mknod(&s.path("c"), SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), dev).unwrap();
    let after = now();
    let mut born = Vec::new();
    for name in ["f", "d", "c"] {
        let st = statx_of(&s.path(name));
        assert_ne!(st.stx_mask & libc::STATX_BTIME, 0, "{name}: no birth time (mask {:#x})", st.stx_mask);
        let b = nanos(st.stx_btime);
        assert!(before - SLACK <= b && b <= after + SLACK, "{name}: born {b}, made in {before}..{after}");
        born.push(b);
    }
    let c = statx_of(&s.path("c"));
    assert_eq!((c.stx_rdev_major, c.stx_rdev_minor), (4, 5));
    std::thread::sleep(Duration::from_millis(20));
    let mut f = OpenOptions::new().append(true).open(s.path("f")).unwrap();
    f.write_all(b"two").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::set_permissions(s.path("f"), fs::Permissions::from_mode(0o600)).unwrap();
    let st = statx_of(&s.path("f"));
    assert_eq!(nanos(st.stx_btime), born[0], "a write and a chmod keep the birth time");
    assert!(nanos(st.stx_mtime) > born[0] && nanos(st.stx_ctime) > born[0], "but move mtime and ctime");
    assert_eq!(st.stx_size, 6);
    m.unmount();
    s.fsck();
    let m = s.mount(&[]);
    for (name, b) in ["f", "d", "c"].into_iter().zip(born) {
        assert_eq!(nanos(statx_of(&s.path(name)).stx_btime), b, "{name} after a remount");
    }
    m.unmount();
    s.fsck();
}

#[test]
fn reading_a_freshly_written_file_keeps_its_pages() {
    require_fuse!();
    let s = Scratch::new(64);
    let m = s.mount(&[]);
    let writes = || mount_stats(&s.mnt)["ops"]["WRITE"]["count"].as_u64().unwrap_or(0);
    let pages: Vec<Vec<u8>> = (0..1024u32).map(|i| i.to_le_bytes().repeat(1024)).collect();
    // Counted around the whole: asking for the counters in between has the kernel write
    // the dirty pages back.
    let before = writes();
    let mut f = File::create(s.path("out")).unwrap();
    for p in &pages {
        f.write_all(p).unwrap();
    }
    let written = fs::metadata(s.path("out")).unwrap();
    let mut back = Vec::new();
    File::open(s.path("out")).unwrap().read_to_end(&mut back).unwrap();
    assert!(back == pages.concat(), "the file read back differs from what was written");
    drop(f);
    let sent = writes() - before;
    assert!(sent < 64, "writing 1,024 pages and reading them back sent {sent} WRITEs");
    m.unmount();
    // The open was the access: the volume's atime is at or past the writes' mtime, which
    // the kernel kept (the writer is still open) and stamped with its coarse clock, so
    // the volume may have had an earlier mtime at the open, even one before the file's
    // creation. (Asked of a fresh mount: the kernel's copy can lag, when a SETATTR of the
    // times answered just before the open's attribute drop lands after it.)
    let m = s.mount(&[]);
    let md = fs::metadata(s.path("out")).unwrap();
    let (a, w) = ((md.atime(), md.atime_nsec()), (written.mtime(), written.mtime_nsec()));
    assert!(a >= w, "relatime: the read left atime {a:?} before the writes' mtime {w:?}");
    // And it all reached the volume.
    assert!(fs::read(s.path("out")).unwrap() == pages.concat(), "after a remount");
    m.unmount();
    s.fsck();
}

/// With the writeback cache the kernel keeps a file's mtime and ctime and sends them
/// itself (a SETATTR of the times); its write-back of the pages must not stamp the time
/// it reaches the volume. A write() in the same timestamp tick as the times the kernel
/// last sent changes no time, so no SETATTR follows that write-back: the volume kept
/// the WRITE's arrival, later than the mtime everyone had seen, and showed it after a
/// remount.
#[test]
fn write_back_keeps_the_kernels_times() {
    require_fuse!();
    let s = Scratch::new(32);
    let m = s.mount(&[]);
    let mtime = |md: &fs::Metadata| (md.mtime(), md.mtime_nsec(), md.ctime(), md.ctime_nsec());
    let mut seen = Vec::new();
    for k in 0..5 {
        let p = s.path(&format!("f{k}"));
        let mut f = File::create(&p).unwrap();
        f.write_all(b"first").unwrap();
        // The page and the times reach the volume (WRITE, SETATTR, FSYNC).
        f.sync_all().unwrap();
        // Most likely in the same tick: no time changes, and no SETATTR will follow.
        f.write_all(b" second").unwrap();
        seen.push(mtime(&fs::metadata(&p).unwrap()));
        // The close writes the page back, well after the write.
        std::thread::sleep(Duration::from_millis(30));
        drop(f);
    }
    m.unmount();
    let m = s.mount(&[]);
    for (k, want) in seen.iter().enumerate() {
        let md = fs::metadata(s.path(&format!("f{k}"))).unwrap();
        assert_eq!(md.len(), 12);
        assert_eq!(mtime(&md), *want, "f{k}: the volume's times differ from those the kernel showed");
    }
    m.unmount();
    s.fsck();
}

/// Stores through a shared writable mapping move the file's mtime, with the writeback
/// cache (the kernel sends its own times) and without it (the write-back WRITE is the
/// only news of the stores, and stamps the time, though it comes from the page cache).
#[test]
fn mmap_stores_move_mtime() {
    require_fuse!();
    for cache in ["on", "off"] {
        let s = Scratch::new(32);
        let m = s.mount(&["--writeback-cache", cache]);
        let f = OpenOptions::new().read(true).write(true).create_new(true).open(s.path("mapped")).unwrap();
        f.set_len(8192).unwrap();
        let old = TimeSpec::new(1_000_000, 0);
        utimensat(AT_FDCWD, &s.path("mapped"), &old, &old, UtimensatFlags::FollowSymlink).unwrap();
        store_through_mapping(&f, 8192, 100, b"stored");
        drop(f);
        m.unmount();
        let m = s.mount(&[]);
        let md = fs::metadata(s.path("mapped")).unwrap();
        assert_eq!(&fs::read(s.path("mapped")).unwrap()[100..106], b"stored");
        assert!(md.mtime() > 1_600_000_000, "cache {cache}: the stores left mtime at {}", md.mtime());
        m.unmount();
        s.fsck();
    }
}

/// A READDIRPLUS leaves out the attributes of entries the kernel was just handed and
/// that nothing has touched since (`git status` stats every path before it lists a
/// directory), and sends them again for entries changed in between; `stat` shows the
/// right attributes either way.
#[test]
fn readdirplus_leaves_out_what_the_kernel_holds_fresh() {
    require_fuse!();
    let s = Scratch::new(32);
    let m = s.mount(&[]);
    let bare = || mount_stats(&s.mnt)["entries_without_attrs"].as_u64().expect("entries_without_attrs");
    fs::create_dir(s.path("d")).unwrap();
    for i in 0..40 {
        fs::write(s.path(&format!("d/f{i}")), b"x").unwrap();
    }
    m.unmount();
    // As git does: stat every path (LOOKUPs, with attributes), then list.
    let m = s.mount(&[]);
    for i in 0..40 {
        assert_eq!(fs::symlink_metadata(s.path(&format!("d/f{i}"))).unwrap().len(), 1);
    }
    let before = bare();
    assert_eq!(fs::read_dir(s.path("d")).unwrap().count(), 40);
    assert_eq!(bare() - before, 40, "a listing right after the lookups");
    // Two files change: their attributes come again, the others' not. (A removal
    // changes the directory, so the kernel lists it again instead of from its cache.)
    fs::set_permissions(s.path("d/f1"), fs::Permissions::from_mode(0o600)).unwrap();
    OpenOptions::new().append(true).open(s.path("d/f2")).unwrap().write_all(b"more").unwrap();
    fs::remove_file(s.path("d/f39")).unwrap();
    let before = bare();
    assert_eq!(fs::read_dir(s.path("d")).unwrap().count(), 39);
    assert_eq!(bare() - before, 37, "a listing after two files changed");
    assert_eq!(fs::metadata(s.path("d/f1")).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(fs::metadata(s.path("d/f2")).unwrap().len(), 5);
    assert_eq!(fs::metadata(s.path("d/f3")).unwrap().len(), 1);
    m.unmount();
    s.fsck();
}

/// `-o dev,suid` clear the kernel's nodev/nosuid (the defaults), so device nodes on the
/// volume can be opened when asked for; `-o noexec` is passed on too.
#[test]
fn dev_suid_and_exec_flags() {
    require_fuse!();
    let s = Scratch::new(32);
    {
        let m = s.mount(&[]);
        let o = mount_options(&s.mnt);
        assert!(o.contains("nodev") && o.contains("nosuid"), "defaults: {o}");
        nix::sys::stat::mknod(
            &s.path("null"),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, 3),
        )
        .unwrap();
        // nodev: opening the node is refused by the kernel.
        assert_eq!(errno(OpenOptions::new().write(true).open(s.path("null"))), libc::EACCES);
        m.unmount();
    }
    {
        let m = s.mount(&["-o", "dev,suid,noexec"]);
        let o = mount_options(&s.mnt);
        assert!(!o.contains("nodev") && !o.contains("nosuid") && o.contains("noexec"), "dev,suid,noexec: {o}");
        // dev: the node is /dev/null.
        let mut f = OpenOptions::new().read(true).write(true).open(s.path("null")).unwrap();
        f.write_all(b"gone").unwrap();
        let mut buf = Vec::new();
        assert_eq!(f.read_to_end(&mut buf).unwrap(), 0);
        drop(f);
        m.unmount();
    }
    s.fsck();
}

/// A file handle: `struct file_handle` with room for FUSE's (node id + generation +
/// parent's, at most 128 bytes per MAX_HANDLE_SZ).
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: i32,
    data: [u8; 128],
}

/// name_to_handle_at(AT_FDCWD, path).
fn name_to_handle(p: &Path) -> io::Result<Handle> {
    let mut h = Handle { bytes: 128, kind: 0, data: [0; 128] };
    let mut mount_id = 0;
    let c = cstr(p);
    // SAFETY: `h` starts with the kernel's struct file_handle header and has
    // `h.bytes` bytes of payload after it; the path is a NUL-terminated string.
    let r = unsafe {
        libc::name_to_handle_at(libc::AT_FDCWD, c.as_ptr(), (&mut h as *mut Handle).cast(), &mut mount_id, 0)
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(h)
}

/// open_by_handle_at(mount_fd, handle, O_RDONLY).
fn open_by_handle(mount: &File, h: &mut Handle) -> io::Result<File> {
    // SAFETY: as in `name_to_handle`; the returned descriptor is new and owned here.
    let fd = unsafe { libc::open_by_handle_at(mount.as_raw_fd(), (h as *mut Handle).cast(), libc::O_RDONLY) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// File handles (FUSE_EXPORT_SUPPORT): a handle taken on one mount opens the same file
/// on a later mount of the volume (the kernel decodes it with a LOOKUP of "." on the node
/// id, which is the inode number), and turns stale once the file is gone and its inode
/// slot reused by another file.
#[test]
fn file_handles_survive_remount_and_go_stale() {
    require_fuse!();
    let s = Scratch::new(32);
    let m = s.mount(&[]);
    fs::write(s.path("f"), b"handle me").unwrap();
    fs::create_dir(s.path("d")).unwrap();
    let mut hf = name_to_handle(&s.path("f")).unwrap();
    let mut hd = name_to_handle(&s.path("d")).unwrap();
    m.unmount();

    let m = s.mount(&[]);
    let root = File::open(&s.mnt).unwrap();
    let mut f = open_by_handle(&root, &mut hf).unwrap();
    let mut got = String::new();
    f.read_to_string(&mut got).unwrap();
    assert_eq!(got, "handle me");
    drop(f);
    let d = open_by_handle(&root, &mut hd).unwrap();
    assert!(d.metadata().unwrap().is_dir());
    drop(d);
    // Remove the file and take its slot with another one: the old handle is stale.
    fs::remove_file(s.path("f")).unwrap();
    fs::write(s.path("g"), b"other").unwrap();
    drop(root);
    m.unmount();
    let m = s.mount(&[]);
    let root = File::open(&s.mnt).unwrap();
    let g = name_to_handle(&s.path("g")).unwrap();
    assert_eq!(
        errno(open_by_handle(&root, &mut hf)),
        libc::ESTALE,
        "slot reused: {:?} / {:?}",
        &hf.data[..16],
        &g.data[..16]
    );
    drop(root);
    m.unmount();
    s.fsck();
}

/// A user other than root: a read-write mount of an image only root may write is refused
/// with a hint to use `-o ro`, and `-o ro` then mounts through fusermount3 and serves.
#[test]
fn non_root_mounts_read_only_through_fusermount3() {
    require_fuse!();
    not_over_nbd!("about a user's access to an image file");
    if Command::new("setpriv").arg("--version").stdout(Stdio::null()).status().is_err() {
        skipping("non_root_mounts_read_only_through_fusermount3: setpriv not found");
        return;
    }
    let s = Scratch::new(32);
    {
        let m = s.mount(&[]);
        fs::write(s.path("hello"), b"world").unwrap();
        m.unmount();
    }
    fs::set_permissions(&s.image, fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::chown(&s.mnt, Some(65534), Some(65534)).unwrap();
    let bin = env!("CARGO_BIN_EXE_dxfs");
    let (img, mnt) = (s.image.display(), s.mnt.display());
    let out = as_nobody(&format!("{bin} mount {img} {mnt}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a read-write mount by nobody was accepted");
    assert!(err.contains("read-only") && err.contains("-o ro"), "no hint in: {err}");
    // /dev/fuse is 0600 on some systems (this one), which keeps every user but root from
    // mounting, through fusermount3 or not: open it up for the test, and put its mode
    // back however the test ends.
    struct ModeBack(u32);
    impl Drop for ModeBack {
        fn drop(&mut self) {
            let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.0));
        }
    }
    let mode = fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o7777;
    let _back = ModeBack(mode);
    let out = as_nobody(&format!("{bin} mount -o ro --daemon {img} {mnt}"));
    let err = String::from_utf8_lossy(&out.stderr);
    if mode & 0o006 == 0 {
        assert!(err.contains("fusermount3") && err.contains("/dev/fuse"), "unclear refusal: {err}");
    }
    fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody(&format!("{bin} mount -o ro --daemon {img} {mnt} && cat {mnt}/hello; fusermount3 -u {mnt}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("world"), "read-only mount by nobody: {stdout} / {}", String::from_utf8_lossy(&out.stderr));
    // fusermount3 -u returns before the daemon has closed the image; wait for it.
    wait_unused(&s.image);
    assert!(!is_mounted(&s.mnt));
    s.fsck();
}

/// A block-aligned buffer for O_DIRECT.
#[repr(C, align(4096))]
struct Aligned([u8; 4096]);

/// Linux's struct iocb (little-endian layout).
#[repr(C)]
#[derive(Default)]
struct Iocb {
    data: u64,
    key: u32,
    rw_flags: u32,
    lio_opcode: u16,
    reqprio: i16,
    fildes: u32,
    buf: u64,
    nbytes: u64,
    offset: i64,
    reserved2: u64,
    flags: u32,
    resfd: u32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

/// One asynchronous write through Linux AIO (io_submit), waited for.
fn aio_pwrite(fd: i32, buf: &Aligned, offset: i64) -> i64 {
    let mut ctx: u64 = 0;
    // SAFETY: io_setup writes the new context id into `ctx`.
    assert_eq!(unsafe { libc::syscall(libc::SYS_io_setup, 1, &mut ctx as *mut u64) }, 0, "io_setup");
    let mut cb = Iocb {
        lio_opcode: 1, // IOCB_CMD_PWRITE
        fildes: fd as u32,
        buf: buf.0.as_ptr() as u64,
        nbytes: buf.0.len() as u64,
        offset,
        ..Default::default()
    };
    let mut list = [&mut cb as *mut Iocb];
    // SAFETY: `list` points at one valid iocb whose buffer outlives the request, which is
    // waited for below before either goes away.
    let n = unsafe { libc::syscall(libc::SYS_io_submit, ctx, 1, list.as_mut_ptr()) };
    assert_eq!(n, 1, "io_submit: {}", io::Error::last_os_error());
    let mut ev = [IoEvent::default()];
    let got = loop {
        // SAFETY: room for one event; no timeout (wait for it).
        let got = unsafe { libc::syscall(libc::SYS_io_getevents, ctx, 1, 1, ev.as_mut_ptr(), std::ptr::null::<u8>()) };
        // A signal to the test process (another test's child ending) interrupts the wait.
        if got != -1 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break got;
        }
    };
    assert_eq!(got, 1, "io_getevents: {}", io::Error::last_os_error());
    // SAFETY: the context was set up above and has nothing in flight.
    unsafe { libc::syscall(libc::SYS_io_destroy, ctx) };
    ev[0].res
}

/// An AIO O_DIRECT write is seen by buffered reads of the same range: the kernel drops
/// the cached pages before a direct write, but a buffered read served while the write is
/// in flight (another daemon thread) caches the old data again, and the kernel's async
/// direct-I/O completion does not drop it. The daemon does, before it answers a direct
/// write to a file whose data the kernel may cache, so a read right after the write
/// completes finds the new data: every round takes a new file, written
/// buffered (its pages dirty, written back before the direct write) or, in odd rounds,
/// by direct I/O (its pages cached only by the buffered reads that follow).
#[test]
fn aio_direct_write_then_buffered_read() {
    require_fuse!();
    let s = Scratch::new(32);
    let m = s.mount(&["-o", "threads=4"]);
    let mut stale = 0;
    for round in 0..200u32 {
        let p = s.path(&format!("f{round}"));
        let old = (round % 200) as u8 + 1;
        let new = old.wrapping_add(100);
        if round % 2 == 0 {
            fs::write(&p, vec![old; 8192]).unwrap();
        } else {
            let d = OpenOptions::new().write(true).create(true).custom_flags(libc::O_DIRECT).open(&p).unwrap();
            let page = Aligned([old; 4096]);
            d.write_all_at(&page.0, 0).unwrap();
            d.write_all_at(&page.0, 4096).unwrap();
        }
        let mut buffered = File::open(&p).unwrap();
        let mut got = vec![0u8; 8192];
        buffered.read_exact(&mut got).unwrap();
        let direct = OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(&p).unwrap();
        let buf = Aligned([new; 4096]);
        // A reader racing the write, as in fsx and xfstests' aio tests.
        let reader = {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut f = File::open(&p).unwrap();
                let mut b = vec![0u8; 8192];
                for _ in 0..20 {
                    f.seek(SeekFrom::Start(0)).unwrap();
                    let _ = f.read(&mut b);
                }
            })
        };
        assert_eq!(aio_pwrite(direct.as_raw_fd(), &buf, 4096), 4096);
        reader.join().unwrap();
        drop(direct);
        // At once: the write completed only after the stale pages were dropped.
        buffered.seek(SeekFrom::Start(0)).unwrap();
        buffered.read_exact(&mut got).unwrap();
        assert!(got[..4096].iter().all(|&b| b == old), "round {round}: first page changed");
        if !got[4096..].iter().all(|&b| b == new) {
            stale += 1;
        }
    }
    assert_eq!(stale, 0, "{stale} of 200 rounds read stale data after an AIO O_DIRECT write");
    m.unmount_when_idle();
    s.fsck();
}

/// Direct writes to a file whose data the kernel never cached are one request each: no
/// notification drops the file's attributes, so no write() asks for them (GETATTR) and
/// for `security.capability` (GETXATTR) again, as each did when every direct write was
/// followed by one.
#[test]
fn direct_writes_to_an_uncached_file_are_one_request_each() {
    require_fuse!();
    let s = Scratch::new(32);
    let m = s.mount(&[]);
    let f = OpenOptions::new().write(true).create(true).custom_flags(libc::O_DIRECT).open(s.path("d")).unwrap();
    let counts = || {
        let v = mount_stats(&s.mnt);
        ["WRITE", "GETATTR", "GETXATTR"].map(|op| v["ops"][op]["count"].as_u64().unwrap_or(0))
    };
    let before = counts();
    for k in 0..64u8 {
        f.write_all_at(&Aligned([k; 4096]).0, u64::from(k) * 4096).unwrap();
    }
    let after = counts();
    let [writes, getattrs, getxattrs] = [0, 1, 2].map(|i| after[i] - before[i]);
    assert_eq!(writes, 64);
    assert!(getattrs + getxattrs < 8, "{getattrs} GETATTRs and {getxattrs} GETXATTRs for 64 direct writes");
    drop(f);
    let back = fs::read(s.path("d")).unwrap();
    assert!((0..64u8).all(|k| back[usize::from(k) * 4096..][..4096].iter().all(|&b| b == k)));
    m.unmount();
    s.fsck();
}

/// `linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, dst, AT_SYMLINK_FOLLOW)`: how a program
/// names an O_TMPFILE file without CAP_DAC_READ_SEARCH.
fn link_open_file(f: &File, dst: &Path) -> io::Result<()> {
    let src = cstr(Path::new(&format!("/proc/self/fd/{}", f.as_raw_fd())));
    let dst = cstr(dst);
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let r =
        unsafe { libc::linkat(libc::AT_FDCWD, src.as_ptr(), libc::AT_FDCWD, dst.as_ptr(), libc::AT_SYMLINK_FOLLOW) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// O_TMPFILE through the mount (FUSE_TMPFILE): an unnamed file, named later by linkat;
/// one opened with O_EXCL cannot be named; one never named is gone at close, and one
/// open when the daemon is killed is freed at the next mount. fsck is clean throughout.
/// With the writeback cache (opens are messages) and without (zero-message opens: the
/// file lives by the kernel's reference).
#[test]
fn tmpfile_through_the_mount() {
    require_fuse!();
    tmpfile_through_a_mount(&[]);
    tmpfile_through_a_mount(&["--writeback-cache", "off"]);
}

fn tmpfile_through_a_mount(args: &[&str]) {
    let s = Scratch::new(64);
    let m = s.mount(args);
    let tmp = |extra: i32| {
        OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE | extra).mode(0o640).open(&s.mnt)
    };
    let mut f = tmp(0).expect("O_TMPFILE");
    f.write_all(&pattern(1, 100_000)).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    assert_eq!(fs::read_dir(&s.mnt).unwrap().count(), 0, "a tmpfile has no name");
    link_open_file(&f, &s.path("named")).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    drop(f);
    assert!(fs::read(s.path("named")).unwrap() == pattern(1, 100_000));

    let excl = tmp(libc::O_EXCL).unwrap();
    assert_eq!(errno(link_open_file(&excl, &s.path("never"))), libc::ENOENT);
    drop(excl);
    let mut gone = tmp(0).unwrap();
    gone.write_all(&pattern(2, 300_000)).unwrap();
    drop(gone);
    m.unmount();
    s.fsck();

    // Open at a kill -9: an orphan, freed by the next mount.
    let m = s.mount(args);
    let mut open = tmp(0).unwrap();
    open.write_all(&pattern(3, 200_000)).unwrap();
    open.sync_all().unwrap();
    m.kill9_and(|| drop(open));
    let m = s.mount(args);
    let names: Vec<_> = fs::read_dir(&s.mnt).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("named")]);
    m.unmount();
    s.fsck();
}

/// With zero-message opens (writeback cache off) the kernel sends no RELEASE once it has
/// had an OPEN refused, also for the handles of files it created (CREATE, O_TMPFILE)
/// before or after: such files live by the kernel's reference, not by a handle count, and
/// removed (or closed unnamed) they give their space back. Before, each kept its blocks
/// until unmount — a file open at the mount's first OPEN, and every file created after it
/// (`full_volume`'s failures in CI).
#[test]
fn removed_files_give_their_space_back_with_zero_message_opens() {
    require_fuse!();
    let s = Scratch::new(64);
    let m = s.mount(&["--writeback-cache", "off"]);
    let free = || nix::sys::statvfs::statvfs(&s.mnt).unwrap().blocks_available();
    fs::write(s.path("b"), b"b").unwrap();
    let start = free();
    // The FORGET that gives the space back may come late under load: up to 10 s.
    let back = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while free() + 16 < start && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(free() + 16 >= start, "{what}: {} blocks free, {start} before", free());
    };
    // Open across the mount's first OPEN (refused: the kernel stops sending OPEN and RELEASE).
    let mut a = File::create(s.path("a")).unwrap();
    a.write_all(&pattern(1, 8 << 20)).unwrap();
    assert_eq!(fs::read(s.path("b")).unwrap(), b"b");
    drop(a);
    fs::remove_file(s.path("a")).unwrap();
    back("a file open at the first OPEN, removed");
    fs::write(s.path("c"), pattern(2, 8 << 20)).unwrap();
    fs::remove_file(s.path("c")).unwrap();
    back("a file created after the first OPEN, removed");
    let mut t =
        OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE).mode(0o600).open(&s.mnt).unwrap();
    t.write_all(&pattern(3, 8 << 20)).unwrap();
    drop(t);
    back("an O_TMPFILE file closed unnamed");
    m.unmount();
    s.fsck();
}

/// Opens cost no request (zero-message opens): an open, unlinked file lives by the kernel's
/// reference, across commits; its space comes back once it is closed and forgotten; one
/// open at a kill -9 after a commit is freed by the next mount.
#[test]
fn unlinked_open_file_outlives_commits() {
    require_fuse!();
    let s = Scratch::new(64);
    let m = s.mount(&[]);
    let free = || nix::sys::statvfs::statvfs(&s.mnt).unwrap().blocks_available();
    let start = free();
    fs::write(s.path("f"), pattern(7, 8 << 20)).unwrap();
    let mut f = File::open(s.path("f")).unwrap();
    fs::remove_file(s.path("f")).unwrap();
    let st = dxfs().arg("sync").arg(&s.mnt).status().unwrap();
    assert!(st.success());
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert!(back == pattern(7, 8 << 20), "an unlinked open file must stay readable across a commit");
    assert!(free() < start - 1000, "its blocks are still in use while it is open");
    drop(f);
    // The FORGET follows the close once the kernel drops the inode.
    let deadline = Instant::now() + Duration::from_secs(10);
    while free() < start - 16 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(free() >= start - 16, "space not back after close: {} of {start}", free());
    let v = mount_stats(&s.mnt);
    assert!(v["ops"]["OPEN"]["count"].as_u64().unwrap_or(0) <= 1, "opens cost no request: {v}");

    fs::write(s.path("g"), pattern(8, 1 << 20)).unwrap();
    let g = File::open(s.path("g")).unwrap();
    fs::remove_file(s.path("g")).unwrap();
    assert!(dxfs().arg("sync").arg(&s.mnt).status().unwrap().success());
    m.kill9_and(|| drop(g));
    s.fsck();
    let m = s.mount(&[]);
    assert_eq!(fs::read_dir(&s.mnt).unwrap().count(), 0);
    m.unmount();
    s.fsck();
}

/// The kernel's write-back of a file larger than the delta's dirty limit, with no
/// flusher (`-o flush_from=0`): WRITEs past the limit must wait for a commit. Over
/// io_uring they are handed to the queue's kept threads (counted in `writes_waited`)
/// while the queue goes on. The file reads back as written, after a remount too.
#[test]
fn writes_past_the_dirty_limit_wait_off_the_queue() {
    require_fuse!();
    let s = Scratch::new(512);
    let m = s.mount(&["-o", "flush_from=0"]);
    let f = s.path("big");
    let mut w = File::create(&f).unwrap();
    // 160 MiB: past the 128 MiB dirty limit.
    for k in 0..160u64 {
        w.write_all(&pattern(k << 20, 1 << 20)).unwrap();
    }
    w.sync_all().unwrap();
    drop(w);
    let v = mount_stats(&s.mnt);
    if v["transport"].as_str().unwrap_or("").starts_with("io_uring") {
        assert!(v["writes_waited"].as_u64().unwrap() > 0, "no WRITE waited for room: {v}");
    }
    m.unmount();
    let m = s.mount(&[]);
    let mut r = File::open(&f).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    for k in 0..160u64 {
        r.read_exact(&mut buf).unwrap();
        assert!(buf == pattern(k << 20, 1 << 20), "MiB {k} differs after a remount");
    }
    drop(r);
    m.unmount();
    s.fsck();
}

/// Paths under `root`, relative to it, sorted (symlinks not followed).
fn tree_paths(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(list) = fs::read_dir(&d) else { continue };
        for e in list.flatten() {
            let p = e.path();
            out.insert(p.strip_prefix(root).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// `dxfs rm -r` on a mount: the daemon removes the files (IOCTL, no UNLINK), and the
/// kernel's caches stay true: every name it had cached (entries live 60 s) in a
/// directory that stays is gone, a file held open still reads with no links, and a
/// directory held open takes no new names, as after `rm -rf`. The removal runs as
/// nobody, so a sticky directory of root's, with a file of root's in it, stays.
#[test]
fn dxfs_rm_keeps_the_kernels_caches_true() {
    require_fuse!();
    if Command::new("setpriv").arg("--version").stdout(Stdio::null()).status().is_err() {
        skipping("dxfs_rm_keeps_the_kernels_caches_true: setpriv not found");
        return;
    }
    let s = Scratch::new(64);
    let m = s.mount(&["--allow-other"]);
    let t = s.path("t");
    let mut paths = Vec::new();
    for d in 0..4 {
        let dir = t.join(format!("d{d}")).join("sub");
        fs::create_dir_all(&dir).unwrap();
        for f in 0..60 {
            let p = if f % 2 == 0 { dir.join(format!("f{f}")) } else { dir.parent().unwrap().join(format!("f{f}")) };
            fs::write(&p, format!("{d}/{f}")).unwrap();
            paths.push(p);
        }
    }
    std::os::unix::fs::symlink("/etc", t.join("link")).unwrap();
    for p in walk_all(&t).into_iter().chain([t.clone()]) {
        std::os::unix::fs::lchown(&p, Some(65534), Some(65534)).unwrap();
    }
    // d0 is root's and sticky, and holds a file of root's: it stays, emptied of the rest.
    fs::write(t.join("d0/keep"), b"k").unwrap();
    std::os::unix::fs::chown(t.join("d0"), Some(0), Some(0)).unwrap();
    fs::set_permissions(t.join("d0"), fs::Permissions::from_mode(0o1777)).unwrap();
    // The kernel caches every entry, and holds a file and a directory open.
    for p in &paths {
        fs::metadata(p).unwrap();
    }
    let held = File::open(t.join("d0/f1")).unwrap();
    let held_dir = File::open(t.join("d2")).unwrap();
    // A file with a second name outside the tree, both cached: it keeps one link.
    fs::hard_link(t.join("d3/f3"), s.path("outside")).unwrap();
    assert_eq!(fs::metadata(s.path("outside")).unwrap().nlink(), 2);
    fs::metadata(t.join("d3/f3")).unwrap();
    let before = mount_stats(&s.mnt);
    let out = as_nobody(&format!("{} rm -r '{}'", env!("CARGO_BIN_EXE_dxfs"), t.display()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot remove") && err.contains("d0/keep': Operation not permitted"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let after = mount_stats(&s.mnt);
    let n = |v: &serde_json::Value, op: &str| v["ops"][op]["count"].as_u64().unwrap_or(0);
    assert!(n(&after, "IOCTL") > n(&before, "IOCTL"), "the daemon was not asked");
    assert_eq!(n(&after, "UNLINK"), n(&before, "UNLINK"), "files were unlinked one request each");
    for p in &paths {
        assert_eq!(errno(fs::symlink_metadata(p)), libc::ENOENT, "{} still seen", p.display());
    }
    let left: Vec<_> = tree_paths(&t).into_iter().collect();
    assert_eq!(left, ["d0", "d0/keep"]);
    let outside = fs::metadata(s.path("outside")).unwrap();
    assert_eq!(outside.nlink(), 1, "the kernel was told the last link went");
    assert_eq!(fs::read(s.path("outside")).unwrap(), b"3/3");
    // The open file: its data, no links left.
    let mut data = String::new();
    (&held).read_to_string(&mut data).unwrap();
    assert_eq!(data, "0/1");
    assert_eq!(held.metadata().unwrap().nlink(), 0);
    // The open directory was removed: no new names in it.
    let r = nix::fcntl::openat(
        &held_dir,
        "new",
        nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_WRONLY,
        Mode::from_bits_truncate(0o644),
    );
    assert_eq!(r.err(), Some(nix::errno::Errno::ENOENT));
    drop((held, held_dir));
    m.unmount();
    s.fsck();
}

/// An unprivileged `dxfs rm -r` meets the same refusals, at the same entries, as
/// `rm -rf` on an identical tree, and leaves the same tree behind.
#[test]
fn dxfs_rm_refuses_what_rm_refuses() {
    require_fuse!();
    if Command::new("setpriv").arg("--version").stdout(Stdio::null()).status().is_err() {
        skipping("dxfs_rm_refuses_what_rm_refuses: setpriv not found");
        return;
    }
    let s = Scratch::new(64);
    let m = s.mount(&["--allow-other"]);
    let play = s.path("play");
    fs::create_dir(&play).unwrap();
    fs::set_permissions(&play, fs::Permissions::from_mode(0o777)).unwrap();
    let nobody = Some(65534);
    for side in ["a", "b"] {
        let top = play.join(side);
        fs::create_dir_all(top.join("own/deep")).unwrap();
        for f in 0..20 {
            fs::write(top.join(format!("own/f{f}")), b"x").unwrap();
            fs::write(top.join(format!("own/deep/g{f}")), b"y").unwrap();
        }
        // Root's directory: its files stay (EACCES each).
        fs::create_dir(top.join("roots")).unwrap();
        fs::write(top.join("roots/r1"), b"r").unwrap();
        fs::write(top.join("roots/r2"), b"r").unwrap();
        // Sticky and world-writable: root's file stays (EPERM), nobody's goes.
        fs::create_dir(top.join("sticky")).unwrap();
        fs::write(top.join("sticky/root-file"), b"r").unwrap();
        fs::write(top.join("sticky/nobody-file"), b"n").unwrap();
        for p in walk_all(&top) {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if !p.starts_with(top.join("roots")) && name != "root-file" && name != "sticky" {
                std::os::unix::fs::lchown(&p, nobody, nobody).unwrap();
            }
        }
        std::os::unix::fs::lchown(&top, nobody, nobody).unwrap();
        fs::set_permissions(top.join("sticky"), fs::Permissions::from_mode(0o1777)).unwrap();
    }
    let q = |p: &Path| format!("'{}'", p.display());
    let rm = as_nobody(&format!("cd {} && rm -rf a", q(&play)));
    let ours = as_nobody(&format!("cd {} && {} rm -r b", q(&play), q(Path::new(env!("CARGO_BIN_EXE_dxfs")))));
    // "rm: cannot remove 'a/x': Why" and "dxfs rm: cannot remove 'b/x': Why", by path.
    let refusals = |out: &std::process::Output, side: &str| -> BTreeSet<String> {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter_map(|l| l.split_once("cannot remove '").map(|(_, r)| r.to_string()))
            .map(|r| r.replacen(&format!("{side}/"), "", 1))
            .collect()
    };
    let (want, got) = (refusals(&rm, "a"), refusals(&ours, "b"));
    assert!(!want.is_empty(), "rm -rf refused nothing: {}", String::from_utf8_lossy(&rm.stderr));
    assert_eq!(
        got,
        want,
        "rm -rf said:\n{}\ndxfs rm -r said:\n{}",
        String::from_utf8_lossy(&rm.stderr),
        String::from_utf8_lossy(&ours.stderr)
    );
    assert_eq!(rm.status.code(), Some(1));
    assert_eq!(ours.status.code(), Some(1));
    assert_eq!(tree_paths(&play.join("b")), tree_paths(&play.join("a")));
    m.unmount();
    s.fsck();
}

/// Every path under `root`, `root` excluded.
fn walk_all(root: &Path) -> Vec<PathBuf> {
    tree_paths(root).into_iter().map(|p| root.join(p)).collect()
}

/// `dxfs du` prints what du(1) prints, for every combination of -s, -h and
/// --apparent-size, on a tree with hard links (counted once), a sparse file, symlinks
/// and nested directories; the daemon sums the entries (IOCTL) instead of a stat each.
#[test]
fn dxfs_du_prints_what_du_prints() {
    require_fuse!();
    let s = Scratch::new(128);
    let m = s.mount(&[]);
    let t = s.path("t");
    fs::create_dir_all(t.join("a/b/c")).unwrap();
    fs::create_dir_all(t.join("empty")).unwrap();
    for i in 0..400usize {
        let dir = ["a", "a/b", "a/b/c"][i % 3];
        fs::write(t.join(dir).join(format!("f{i}")), vec![7u8; i * 97]).unwrap();
    }
    fs::write(t.join("a/big"), vec![1u8; 3 << 20]).unwrap();
    fs::hard_link(t.join("a/big"), t.join("a/b/big-again")).unwrap();
    fs::hard_link(t.join("a/f3"), t.join("a/b/c/f3-again")).unwrap();
    std::os::unix::fs::symlink("/nowhere/at/all", t.join("a/link")).unwrap();
    File::create(t.join("a/sparse")).unwrap().set_len(50 << 20).unwrap();
    Command::new("sync").status().unwrap();
    let before = mount_stats(&s.mnt);
    let lines = |o: &std::process::Output| -> BTreeSet<String> {
        String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect()
    };
    let all_flags = [&[][..], &["-s"], &["--apparent-size"], &["-h"], &["-s", "-h"], &["-s", "--apparent-size", "-h"]];
    let mut printed = Vec::new();
    for flags in all_flags {
        let theirs = Command::new("du").args(flags).arg("t").current_dir(&s.mnt).output().unwrap();
        let ours = dxfs().arg("du").args(flags).arg("t").current_dir(&s.mnt).output().unwrap();
        assert!(theirs.status.success() && ours.status.success(), "{}", String::from_utf8_lossy(&ours.stderr));
        assert_eq!(lines(&ours), lines(&theirs), "du {flags:?}");
        assert!(lines(&ours).len() >= if flags.contains(&"-s") { 1 } else { 5 });
        printed.push(lines(&theirs));
    }
    let after = mount_stats(&s.mnt);
    let n = |v: &serde_json::Value, op: &str| v["ops"][op]["count"].as_u64().unwrap_or(0);
    assert!(n(&after, "IOCTL") > n(&before, "IOCTL"), "the daemon was not asked");
    m.unmount();
    // Unmounted, through the library: the same numbers.
    for (flags, theirs) in all_flags.iter().zip(&printed) {
        let ours = dxfs().arg("du").arg("--image").arg(&s.image).args(*flags).arg("t").output().unwrap();
        assert!(ours.status.success(), "{}", String::from_utf8_lossy(&ours.stderr));
        assert_eq!(&lines(&ours), theirs, "du --image {flags:?}");
    }
    let missing = dxfs().arg("du").arg("--image").arg(&s.image).arg("t/none").output().unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot access 't/none'"));
    s.fsck();
}

/// `dxfs du -s` of a tree with no hard links reads the directory's recursive statistics
/// (the virtual xattrs `dxfs.dir.r*`, one GETXATTR each, no IOCTL) and prints what du(1)
/// prints; once a hard link lies below it, it walks again, and still agrees.
#[test]
fn dxfs_du_s_reads_the_counters_while_they_are_what_du_sums() {
    require_fuse!();
    let s = Scratch::new(128);
    let m = s.mount(&[]);
    let t = s.path("t");
    fs::create_dir_all(t.join("a/b")).unwrap();
    for i in 0..300usize {
        let dir = ["a", "a/b", ""][i % 3];
        fs::write(t.join(dir).join(format!("f{i}")), vec![3u8; i * 131]).unwrap();
    }
    std::os::unix::fs::symlink("somewhere", t.join("a/link")).unwrap();
    File::create(t.join("a/sparse")).unwrap().set_len(9 << 20).unwrap();
    Command::new("sync").status().unwrap();
    let run = |prog: &str, flags: &[&str]| -> String {
        let mut c = if prog == "du" { Command::new("du") } else { dxfs() };
        if prog != "du" {
            c.arg("du");
        }
        let o = c.args(flags).arg("t").current_dir(&s.mnt).output().unwrap();
        assert!(o.status.success(), "{prog}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let flag_sets = [&["-s"][..], &["-s", "--apparent-size"], &["-s", "-h"]];
    let ioctls = |s: &Scratch| mount_stats(&s.mnt)["ops"]["IOCTL"]["count"].as_u64().unwrap_or(0);
    let before = ioctls(&s);
    for flags in flag_sets {
        assert_eq!(run("dxfs", flags), run("du", flags), "du {flags:?}");
    }
    assert_eq!(ioctls(&s), before, "the counters answered: no directory was walked");
    let rfiles = xattr::get(&t, "dxfs.dir.rfiles").unwrap().unwrap();
    assert_eq!(String::from_utf8(rfiles).unwrap(), "302", "300 files, a symlink, a sparse file");
    assert_eq!(xattr::get(&t, "dxfs.dir.rsubdirs").unwrap().unwrap(), b"2");
    // A hard link below: du counts it where it meets it, so the walk answers.
    fs::hard_link(t.join("a/f0"), t.join("a/b/f0-again")).unwrap();
    Command::new("sync").status().unwrap();
    assert_eq!(xattr::get(&t, "dxfs.dir.rhardlinks").unwrap().unwrap(), b"2");
    for flags in flag_sets {
        assert_eq!(run("dxfs", flags), run("du", flags), "du {flags:?} with a hard link");
    }
    assert!(ioctls(&s) > before, "walked");
    m.unmount();
    s.fsck();
}

/// Ctrl-C stops `dxfs rm -r` between two steps: it exits 130 saying how much went, and
/// what is left is whole (fsck clean).
#[test]
fn dxfs_rm_stops_cleanly_at_ctrl_c() {
    require_fuse!();
    let s = Scratch::new(64);
    let m = s.mount(&[]);
    let t = s.path("t");
    fs::create_dir(&t).unwrap();
    const N: usize = 3000;
    for i in 0..N {
        fs::write(t.join(format!("f{i}")), b"x").unwrap();
    }
    // One entry a step, so the removal takes thousands of requests.
    let child = dxfs().args(["rm", "-r"]).arg(&t).env("DXFS_RM_STEP", "1").stderr(Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    while fs::read_dir(&t).map(|d| d.count()).unwrap_or(0) > N - 50 {
        assert!(started.elapsed() < Duration::from_secs(60), "the removal never started");
        std::thread::sleep(Duration::from_millis(2));
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let left = fs::read_dir(&t).map(|d| d.count()).unwrap_or(0);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted after removing"), "{err}");
    assert!(left > 0 && left < N - 40, "{left} of {N} left");
    for e in fs::read_dir(&t).unwrap() {
        assert_eq!(fs::read(e.unwrap().path()).unwrap(), b"x");
    }
    m.unmount();
    s.fsck();
}

/// A tmpfs of a given size mounted on a directory, unmounted when dropped: a host file
/// system that fills.
struct SmallHost(PathBuf);

impl SmallHost {
    fn mount(dir: PathBuf, mib: u64) -> SmallHost {
        fs::create_dir_all(&dir).unwrap();
        let st = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={mib}M"), "tmpfs"]).arg(&dir).status();
        assert!(st.unwrap().success(), "mount tmpfs");
        SmallHost(dir)
    }

    /// Fill it but for about `leave` bytes.
    fn fill(&self, leave: u64) {
        let st = nix::sys::statvfs::statvfs(&self.0).unwrap();
        let avail = st.blocks_available() * st.fragment_size();
        fs::write(self.0.join("filler"), vec![0u8; avail.saturating_sub(leave) as usize]).unwrap();
    }
}

impl Drop for SmallHost {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The file system holding a sparse image fills (issue 39, item 15): the writer's fsync
/// gets ENOSPC, changes get ENOSPC, reads go on, nothing committed is lost, and once the
/// host has room again `dxfs sync` commits what waited, without a remount.
#[test]
fn a_full_host_file_system_gives_enospc_and_the_mount_goes_on() {
    require_fuse!();
    not_over_nbd!("the image lies on a small tmpfs");
    let tmp = tempfile::tempdir().unwrap();
    let host = SmallHost::mount(tmp.path().join("host"), 40);
    let image = host.0.join("image");
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    mkfs(Arc::new(FileDevice::create(&image, 256 << 20).unwrap()), &MkfsOptions::default()).unwrap();
    let s = Scratch { tmp, image, mnt, nbd: std::sync::Mutex::new(None) };
    let m = s.mount(&["-o", "commit=3600"]);
    fs::write(s.path("keep"), pattern(1, 100_000)).unwrap();
    assert!(dxfs().arg("sync").arg(&s.mnt).status().unwrap().success());
    host.fill(2 << 20);
    let big = pattern(2, 16 << 20);
    let mut f = File::create(s.path("big")).unwrap();
    f.write_all(&big).unwrap();
    assert_eq!(errno(f.sync_all()), libc::ENOSPC, "fsync on a full host");
    drop(f);
    assert_eq!(errno(File::create(s.path("new"))), libc::ENOSPC, "a create while the host is full");
    assert_eq!(fs::read(s.path("keep")).unwrap(), pattern(1, 100_000));
    let out = dxfs().arg("sync").arg(&s.mnt).output().unwrap();
    assert!(!out.status.success(), "dxfs sync on a full host succeeded");
    fs::remove_file(host.0.join("filler")).unwrap();
    let st = dxfs().arg("sync").arg(&s.mnt).status().unwrap();
    assert!(st.success(), "dxfs sync once there is room: {st}");
    fs::write(s.path("new"), b"after").unwrap();
    assert!(fs::read(s.path("big")).unwrap() == big, "the data that waited");
    m.unmount();
    s.fsck();
    let m = s.mount(&[]);
    assert!(fs::read(s.path("big")).unwrap() == big, "the data after a remount");
    assert_eq!(fs::read(s.path("new")).unwrap(), b"after");
    m.unmount();
    s.fsck();
}

/// `bench/tree_compare.py A B`: the two trees agree in content and metadata (types,
/// modes, owners, sizes, mtimes in ns, xattrs and ACLs, symlink targets, hard links).
fn trees_agree(a: &Path, b: &Path) {
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/tree_compare.py"))
        .args([a, b])
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{} and {} differ:\n{text}", a.display(), b.display());
    assert!(text.contains("differences: 0") && text.contains("files "), "{text}");
}

/// A host tree with what `cp -a` keeps: small and large files (some past an import
/// batch), a hundred empty ones in one batch, a hard link across directories, symlinks, a fifo, user xattrs, access and
/// default ACLs, a setgid directory, other owners, setuid, times with nanoseconds
/// (directories' set after their contents).
fn host_tree(top: &Path) {
    let sh = |script: &str| {
        let st = Command::new("sh").args(["-c", script]).current_dir(top).status().unwrap();
        assert!(st.success(), "{script}");
    };
    fs::create_dir_all(top.join("sub/deep")).unwrap();
    for i in 0..30u64 {
        fs::write(top.join(format!("f{i}")), pattern(i, (i * 700) as usize)).unwrap();
        fs::write(top.join(format!("sub/deep/g{i}")), pattern(i + 100, (i * 13) as usize)).unwrap();
    }
    fs::write(top.join("big"), pattern(7, 300_000)).unwrap();
    // A batch of more entries than a serving thread makes before it hands the rest on.
    fs::create_dir(top.join("many")).unwrap();
    for i in 0..100 {
        fs::write(top.join(format!("many/e{i}")), b"").unwrap();
    }
    fs::hard_link(top.join("f3"), top.join("sub/hard")).unwrap();
    std::os::unix::fs::symlink("f1", top.join("link")).unwrap();
    std::os::unix::fs::symlink("x".repeat(200), top.join("sub/long-link")).unwrap();
    nix::unistd::mkfifo(&top.join("fifo"), Mode::from_bits_truncate(0o640)).unwrap();
    xattr::set(top.join("f4"), "user.colour", b"blue").unwrap();
    sh("setfacl -m u:1234:rw f5 && setfacl -d -m g:55:rx sub && chmod 2775 sub");
    sh("chown 1234:55 f6 && chmod 4755 f7 && chown -h 77:88 link");
    sh("touch -h -d '2001-02-03 04:05:06.123456789' f1 f2 link sub/hard sub/deep sub/deep/g1");
    sh("touch -d '1999-12-31 23:59:59.5' sub .");
}

/// `dxfs cp -a` on a mount copies what `cp -a` copies, in batches the daemon makes
/// (IOCTL, hardly a CREATE), and the kernel's caches stay true: a name it had cached
/// as missing is found, and the directory's link count moves.
#[test]
fn dxfs_cp_copies_what_cp_copies() {
    require_fuse!();
    if Command::new("setfacl").arg("--version").stdout(Stdio::null()).status().is_err() {
        skipping("dxfs_cp_copies_what_cp_copies: setfacl not found");
        return;
    }
    let s = Scratch::new(128);
    let top = s.tmp.path().join("top");
    host_tree(&top);
    let m = s.mount(&[]);
    let st = Command::new("cp").arg("-a").arg(&top).arg(s.path("real")).status().unwrap();
    assert!(st.success());
    // Cached as missing, and the directory's attributes cached, before the copy.
    fs::create_dir(s.path("into")).unwrap();
    assert_eq!(errno(fs::symlink_metadata(s.path("into/top"))), libc::ENOENT);
    assert_eq!(fs::metadata(s.path("into")).unwrap().nlink(), 2);
    let before = mount_stats(&s.mnt);
    let (code, _, err) = run_dxfs(&["cp", "-a", top.to_str().unwrap(), s.path("into").to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(fs::metadata(s.path("into")).unwrap().nlink(), 3);
    let after = mount_stats(&s.mnt);
    let n = |v: &serde_json::Value, op: &str| v["ops"][op]["count"].as_u64().unwrap_or(0);
    assert!(n(&after, "IOCTL") > n(&before, "IOCTL"), "the daemon was not asked");
    // Only what does not fit in a batch is created by the kernel: f24..f29 and big.
    assert!(n(&after, "CREATE") - n(&before, "CREATE") <= 7, "files were created one request each");
    assert_eq!(n(&after, "MKDIR"), n(&before, "MKDIR"));
    // Where the kernel held no miss (whose drop drops the directory's attributes too).
    fs::create_dir(s.path("into2")).unwrap();
    assert_eq!(fs::metadata(s.path("into2")).unwrap().nlink(), 2);
    let (code, _, err) = run_dxfs(&["cp", "-a", top.join("sub").to_str().unwrap(), s.path("into2").to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(fs::metadata(s.path("into2")).unwrap().nlink(), 3, "the directory's attributes were not dropped");
    assert!(fs::symlink_metadata(s.path("into/top")).unwrap().is_dir(), "the cached miss was not dropped");
    trees_agree(&s.path("real"), &s.path("into/top"));
    trees_agree(&top, &s.path("into/top"));
    m.unmount();
    s.fsck();
}

/// An unprivileged `dxfs cp -a` meets the same refusals, at the same entries, as
/// `cp -a`, and leaves the same tree: an unreadable source, a directory of root's it
/// merges into, owners it may not give.
#[test]
fn dxfs_cp_refuses_what_cp_refuses() {
    require_fuse!();
    if Command::new("setpriv").arg("--version").stdout(Stdio::null()).status().is_err() {
        skipping("dxfs_cp_refuses_what_cp_refuses: setpriv not found");
        return;
    }
    let s = Scratch::new(64);
    let src = s.tmp.path().join("src");
    fs::create_dir_all(src.join("dir")).unwrap();
    fs::create_dir_all(src.join("roots")).unwrap();
    for (p, data) in [("ok", "o"), ("secret", "s"), ("dir/f", "d"), ("roots/r1", "r"), ("roots/r2", "r")] {
        fs::write(src.join(p), data).unwrap();
    }
    fs::set_permissions(src.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(src.join("ok"), Some(1234), Some(55)).unwrap();
    fs::set_permissions(s.tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let m = s.mount(&["--allow-other"]);
    fs::set_permissions(&s.mnt, fs::Permissions::from_mode(0o777)).unwrap();
    let stamp = TimeSpec::new(1_000_000_000, 0);
    for side in ["a", "b"] {
        fs::create_dir_all(s.path(&format!("{side}/src/roots"))).unwrap();
        for p in ["", "/src"] {
            std::os::unix::fs::chown(s.path(&format!("{side}{p}")), Some(65534), Some(65534)).unwrap();
        }
        utimensat(AT_FDCWD, &s.path(&format!("{side}/src/roots")), &stamp, &stamp, UtimensatFlags::NoFollowSymlink)
            .unwrap();
    }
    let q = |p: &Path| format!("'{}'", p.display());
    let cp = as_nobody(&format!("cd {} && LC_ALL=C cp -a {} a/", q(&s.mnt), q(&src)));
    let ours =
        as_nobody(&format!("cd {} && {} cp -a {} b/", q(&s.mnt), q(Path::new(env!("CARGO_BIN_EXE_dxfs"))), q(&src)));
    // "cp: cannot create regular file 'a/src/roots/r1': Permission denied", by message.
    let said = |out: &std::process::Output, side: &str| -> BTreeSet<String> {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .map(|l| l.trim_start_matches("dxfs ").trim_start_matches("cp: ").replace(&format!("'{side}/"), "'"))
            .collect()
    };
    let (want, got) = (said(&cp, "a"), said(&ours, "b"));
    assert!(want.len() >= 3, "cp -a refused too little: {want:?}");
    assert_eq!(got, want);
    assert_eq!(cp.status.code(), Some(1));
    assert_eq!(ours.status.code(), Some(1));
    trees_agree(&s.path("a/src"), &s.path("b/src"));
    m.unmount();
    s.fsck();
}

/// `dxfs import --tar` on a mount unpacks what `tar -x` unpacks (as root: owners and
/// modes as recorded, user xattrs), in batches; a name the kernel had cached as missing
/// is found; unpacking again over it replaces every entry and gives the same tree.
#[test]
fn dxfs_import_unpacks_what_tar_unpacks() {
    require_fuse!();
    if Command::new("setfacl").arg("--version").stdout(Stdio::null()).status().is_err() {
        skipping("dxfs_import_unpacks_what_tar_unpacks: setfacl not found");
        return;
    }
    let s = Scratch::new(128);
    let top = s.tmp.path().join("top");
    host_tree(&top);
    // GNU tar keeps ACLs only with --acls, in records of its own; not compared here.
    let st = Command::new("sh")
        .arg("-c")
        .arg("setfacl -b f5 && setfacl -k sub && tar --xattrs -cf ../a.tar .")
        .current_dir(&top)
        .status()
        .unwrap();
    assert!(st.success());
    let archive = s.tmp.path().join("a.tar");
    let m = s.mount(&[]);
    fs::create_dir(s.path("real")).unwrap();
    fs::create_dir(s.path("ours")).unwrap();
    let st = Command::new("tar").arg("--xattrs").arg("-xpf").arg(&archive).arg("-C").arg(s.path("real")).status();
    assert!(st.unwrap().success());
    assert_eq!(errno(fs::symlink_metadata(s.path("ours/f1"))), libc::ENOENT);
    let before = mount_stats(&s.mnt);
    for round in 0..2 {
        let (code, _, err) =
            run_dxfs(&["import", "--tar", archive.to_str().unwrap(), s.path("ours").to_str().unwrap()]);
        assert_eq!(code, 0, "round {round}: {err}");
        // Before anything lists the directory (a listing refreshes the kernel's names).
        assert!(fs::symlink_metadata(s.path("ours/f1")).is_ok(), "the cached miss was not dropped");
        trees_agree(&s.path("real"), &s.path("ours"));
    }
    let after = mount_stats(&s.mnt);
    let n = |v: &serde_json::Value, op: &str| v["ops"][op]["count"].as_u64().unwrap_or(0);
    assert!(n(&after, "IOCTL") > n(&before, "IOCTL"), "the daemon was not asked");
    m.unmount();
    s.fsck();
}

/// Run the `dxfs` command: exit code, stdout, stderr.
fn run_dxfs(args: &[&str]) -> (i32, String, String) {
    let out = dxfs().args(args).output().expect("run dxfs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// `dxfs import --tar` on a mount does what `tar -x` does with names met twice and
/// links: a later entry replaces an earlier file or empty directory, a hard link finds a
/// file under a directory the archive never listed, directories get their times after
/// their contents; a name with `..` is refused and nothing lands outside.
#[test]
fn dxfs_import_replaces_and_refuses_as_tar_does() {
    use tar::EntryType::{Directory, Link, Regular};
    require_fuse!();
    let s = Scratch::new(64);
    let archive = s.tmp.path().join("t.tar");
    let mut b = tar::Builder::new(File::create(&archive).unwrap());
    let entry = common::tar_entry;
    let mut add = |kind, name: &str, mode, mtime, data: &[u8]| {
        b.append(&entry(kind, name, mode, mtime, data.len() as u64), data).unwrap();
    };
    add(Directory, "empty/", 0o700, 1_500_000_000, b"");
    add(Regular, "x", 0o640, 1_600_000_000, b"first");
    add(Regular, "unlisted/sub/f", 0o640, 1_600_000_000, b"linked");
    add(Regular, "x", 0o640, 1_600_000_000, b"second");
    add(Regular, "empty", 0o640, 1_600_000_000, b"now a file");
    add(Directory, "d/", 0o751, 1_400_000_000, b"");
    add(Regular, "d/inside", 0o640, 1_600_000_000, b"made after d");
    let mut link = entry(Link, "l", 0o644, 1, 0);
    link.set_link_name("unlisted/sub/f").unwrap();
    link.set_cksum();
    b.append(&link, &[][..]).unwrap();
    // The name is written raw: `set_path` refuses `..` itself.
    let mut evil = entry(Regular, "placeholder", 0o644, 1, 5);
    evil.as_old_mut().name = [0; 100];
    evil.as_old_mut().name[..10].copy_from_slice(b"../outside");
    evil.set_cksum();
    b.append(&evil, &b"hello"[..]).unwrap();
    b.finish().unwrap();
    drop(b);
    let m = s.mount(&[]);
    let dst = s.path("t");
    fs::create_dir(&dst).unwrap();
    let (code, _, err) = run_dxfs(&["import", "--tar", archive.to_str().unwrap(), dst.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("../outside: a name with a '..' component is refused"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(errno(fs::symlink_metadata(s.path("outside"))), libc::ENOENT);
    assert_eq!(fs::read(dst.join("x")).unwrap(), b"second");
    assert_eq!(fs::read(dst.join("empty")).unwrap(), b"now a file");
    let f = fs::metadata(dst.join("unlisted/sub/f")).unwrap();
    let l = fs::metadata(dst.join("l")).unwrap();
    assert_eq!((f.ino(), f.nlink()), (l.ino(), 2), "l is a hard link of unlisted/sub/f");
    let d = fs::metadata(dst.join("d")).unwrap();
    assert_eq!((d.mode() & 0o7777, d.mtime()), (0o751, 1_400_000_000), "d's time is set after its contents");
    assert_eq!(fs::read(dst.join("d/inside")).unwrap(), b"made after d");
    m.unmount();
    s.fsck();
}

/// An unprivileged `dxfs import --tar` refuses what `tar -x` refuses, at the same
/// entries (a directory of root's it would unpack into), gives the caller's ids and the
/// modes less the umask as `tar -x` does for a user, and leaves the same tree.
#[test]
fn dxfs_import_refuses_what_tar_refuses() {
    use tar::EntryType::{Directory, Regular, Symlink};
    require_fuse!();
    if Command::new("setpriv").arg("--version").stdout(Stdio::null()).status().is_err() {
        skipping("dxfs_import_refuses_what_tar_refuses: setpriv not found");
        return;
    }
    let s = Scratch::new(64);
    let archive = s.tmp.path().join("t.tar");
    let mut b = tar::Builder::new(File::create(&archive).unwrap());
    let mut add = |kind, name: &str, mode, data: &[u8], link: Option<&str>| {
        let mut h = tar::Header::new_gnu();
        h.set_path(name).unwrap();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(1234);
        h.set_gid(55);
        h.set_mtime(1_600_000_000);
        h.set_size(data.len() as u64);
        if let Some(l) = link {
            h.set_link_name(l).unwrap();
        }
        h.set_cksum();
        b.append(&h, data).unwrap();
    };
    add(Directory, "top/", 0o775, b"", None);
    add(Regular, "top/setuid", 0o4777, b"s", None);
    add(Regular, "top/plain", 0o666, b"p", None);
    add(Symlink, "top/link", 0o777, b"", Some("plain"));
    add(Directory, "top/roots/", 0o755, b"", None);
    add(Regular, "top/roots/r1", 0o644, b"r", None);
    add(Regular, "top/roots/r2", 0o644, b"r", None);
    add(Directory, "top/sub/", 0o700, b"", None);
    add(Regular, "top/sub/f", 0o640, b"f", None);
    b.finish().unwrap();
    drop(b);
    fs::set_permissions(s.tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&archive, fs::Permissions::from_mode(0o644)).unwrap();
    let m = s.mount(&["--allow-other"]);
    fs::set_permissions(&s.mnt, fs::Permissions::from_mode(0o777)).unwrap();
    let stamp = TimeSpec::new(1_000_000_000, 0);
    for side in ["a", "b"] {
        fs::create_dir_all(s.path(&format!("{side}/top/roots"))).unwrap();
        for p in ["", "/top"] {
            std::os::unix::fs::chown(s.path(&format!("{side}{p}")), Some(65534), Some(65534)).unwrap();
        }
        utimensat(AT_FDCWD, &s.path(&format!("{side}/top/roots")), &stamp, &stamp, UtimensatFlags::NoFollowSymlink)
            .unwrap();
    }
    let q = |p: &Path| format!("'{}'", p.display());
    let tar = as_nobody(&format!("cd {} && umask 022 && LC_ALL=C tar -xf {} -C a", q(&s.mnt), q(&archive)));
    let dxfs_bin = q(Path::new(env!("CARGO_BIN_EXE_dxfs")));
    let ours = as_nobody(&format!("cd {} && umask 022 && {dxfs_bin} import --tar {} b", q(&s.mnt), q(&archive)));
    // tar: "tar: top/roots/r1: Cannot open: Permission denied"; dxfs: "dxfs import:
    // cannot create regular file 'b/top/roots/r1': Permission denied".
    let refused = |out: &std::process::Output| -> BTreeSet<String> {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter_map(|l| {
                if let Some(rest) = l.strip_prefix("tar: ") {
                    rest.split_once(": Cannot open").map(|(p, _)| p.to_string())
                } else {
                    l.split_once("cannot create regular file 'b/")
                        .map(|(_, r)| r.trim_end_matches("': Permission denied").to_string())
                }
            })
            .collect()
    };
    let (want, got) = (refused(&tar), refused(&ours));
    assert_eq!(want, BTreeSet::from(["top/roots/r1".to_string(), "top/roots/r2".to_string()]), "{tar:?}");
    assert_eq!(got, want, "dxfs import said:\n{}", String::from_utf8_lossy(&ours.stderr));
    assert_eq!(tar.status.code(), Some(2));
    assert_eq!(ours.status.code(), Some(2));
    let f = fs::metadata(s.path("b/top/setuid")).unwrap();
    // tar -x for a user restores no setuid bit.
    assert_eq!((f.uid(), f.gid(), f.mode() & 0o7777), (65534, 65534, 0o755));
    trees_agree(&s.path("a/top"), &s.path("b/top"));
    m.unmount();
    s.fsck();
}

/// Ctrl-C stops `dxfs cp -a` between batches: exit 130, part of the tree copied, every
/// file there whole (each entry is one operation in the daemon).
#[test]
fn dxfs_cp_stops_cleanly_at_ctrl_c() {
    require_fuse!();
    let s = Scratch::new(128);
    let src = s.tmp.path().join("src");
    const DIRS: usize = 300;
    for d in 0..DIRS {
        let dir = src.join(format!("d{d:03}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..10u64 {
            fs::write(dir.join(format!("f{f}")), pattern(f, 3000 + f as usize)).unwrap();
        }
    }
    let m = s.mount(&[]);
    let dst = s.path("dst");
    let child = dxfs().args(["cp", "-a"]).arg(&src).arg(&dst).stderr(Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    // The directories are made first, then filled one by one.
    while !dst.join("d002/f0").exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "the copy never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted after copying"), "{err}");
    let copied: Vec<PathBuf> = walk_all(&dst).into_iter().filter(|p| p.is_file()).collect();
    assert!(!copied.is_empty() && copied.len() < DIRS * 10, "{} of {} files copied", copied.len(), DIRS * 10);
    for p in copied {
        let rel = p.strip_prefix(&dst).unwrap();
        assert_eq!(fs::read(&p).unwrap(), fs::read(src.join(rel)).unwrap(), "{} is not whole", rel.display());
    }
    m.unmount();
    s.fsck();
}

/// CPU time so far of the daemon `pid`'s threads named `dxfs-keep-*`, and how many.
fn keeper_cpu(pid: u32) -> (Duration, usize) {
    let (mut ns, mut n) = (0u64, 0);
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.starts_with("dxfs-keep-") {
            n += 1;
            let stat = fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            ns += stat.split(' ').next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    (Duration::from_nanos(ns), n)
}

/// Keepers (`-o keep_awake_us`) run while requests come and sleep once they stop;
/// `keep_awake_us=0`, the default, starts none.
#[test]
fn keepers_spin_only_while_requests_come() {
    require_fuse!();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if fs::metadata(ENABLE_URING).is_err() || !nix::unistd::geteuid().is_root() || cpus < 2 {
        skipping("keepers_spin_only_while_requests_come: needs FUSE over io_uring, root and two CPUs");
        return;
    }
    let s = Scratch::new(32);
    let m = s.mount(&["-o", "transport=uring,keep_awake_us=2000"]);
    fs::write(s.path("f"), b"x").unwrap();
    let pid = m.child.as_ref().unwrap().id();
    let v = mount_stats(&s.mnt);
    assert!(v["transport"].as_str().unwrap().contains("idle CPUs kept awake"), "{v}");
    let (before, n) = keeper_cpu(pid);
    assert_eq!(n, cpus, "one keeper per CPU");
    let start = Instant::now();
    for _ in 0..20_000 {
        listxattr(&s.path("f"), 4096).unwrap();
    }
    let busy = start.elapsed();
    let (during, _) = keeper_cpu(pid);
    // How much they spin depends on what else runs (a keeper leaves a CPU others want):
    // that they ran at all is what is checked here, the rest is for benchmarks.
    assert!(during > before, "keepers never ran in {busy:?} of requests");
    std::thread::sleep(Duration::from_millis(100));
    let (idle_start, _) = keeper_cpu(pid);
    std::thread::sleep(Duration::from_millis(500));
    let (idle_end, _) = keeper_cpu(pid);
    assert!(idle_end - idle_start < Duration::from_millis(50), "keepers spun {:?} while idle", idle_end - idle_start);
    m.unmount();
    for opts in ["transport=uring,keep_awake_us=0", "transport=uring"] {
        let m = s.mount(&["-o", opts]);
        let pid = m.child.as_ref().unwrap().id();
        assert_eq!(keeper_cpu(pid).1, 0, "{opts} started keepers");
        m.unmount();
    }
    s.fsck();
}
