//! `dxfs mount`: serve a volume through FUSE; also the `mount -t fuse.dxfs` helper.

use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::signal::{SigSet, Signal};

use dxfs::block::FileDevice;
use dxfs::fuse::{FuseOptions, ReaddirPlus};
use dxfs::{mkfs, MkfsOptions};

use super::known::{Check, Refusal};
use super::Cli;
use super::{fail, parse_size};

#[derive(clap::Args)]
pub struct MountArgs {
    /// Image file, block device, or NBD export (nbd://HOST[:PORT]/EXPORT,
    /// nbd+unix:///EXPORT?socket=PATH).
    image: PathBuf,
    /// Directory to mount on.
    dir: PathBuf,
    /// Mount options, comma-separated: ro, rw, default_permissions, allow_other,
    /// threads=N, writeback_cache, no_writeback_cache, attr_timeout=S, entry_timeout=S,
    /// negative_timeout=S (how long a missing name is cached; 0 asks every time),
    /// recovery=rollback (open although the newest commit record is damaged, losing the
    /// deltas after the newest readable one),
    /// commit=S (seconds between periodic commits, default 5), lock_wait=S (how long to wait
    /// for the image's previous user, e.g. a daemon still finishing its unmount; default 10),
    /// readdirplus=auto|always|never, discard (trim blocks as deltas free them),
    /// nodata_readahead (read nothing ahead for sequential readers of file data),
    /// flush_from=N (dirty pages past which data is written back ahead of the commit, at
    /// most a quarter of the dirty limit; 0: only commits write it back),
    /// the kernel flags dev|nodev, suid|nosuid (default nodev,nosuid), exec|noexec,
    /// relatime|strictatime|noatime (when reads update atime; default relatime), nodiratime,
    /// and the A/B switches noreserve, noprefetch, noxattrfilter, noaccounting (mount(8) options such
    /// as noauto, _netdev, defaults are ignored).
    #[arg(short = 'o', value_name = "OPTS")]
    options: Vec<String>,
    /// Go to the background once the mount is live.
    #[arg(long)]
    daemon: bool,
    /// Make a volume of this size (e.g. 4G) first if the image does not exist.
    #[arg(long, value_name = "SIZE")]
    create: Option<String>,
    /// Request-serving threads, each with its own /dev/fuse descriptor (default: one per
    /// CPU).
    #[arg(long)]
    threads: Option<usize>,
    /// Mount read-only.
    #[arg(long)]
    ro: bool,
    /// Let other users use the mount.
    #[arg(long)]
    allow_other: bool,
    /// Do not let the kernel check permissions: only for a mount no other user can reach
    /// (refused together with --allow-other; the volume checks only access(2) itself).
    #[arg(long)]
    no_default_permissions: bool,
    /// Kernel write-back caching of file data (default on).
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    writeback_cache: Option<String>,
    /// Seconds the kernel may cache attributes.
    #[arg(long, value_name = "S")]
    attr_timeout: Option<f64>,
    /// Seconds the kernel may cache names.
    #[arg(long, value_name = "S")]
    entry_timeout: Option<f64>,
    /// Log more to stderr: -v for info (mount, unmount, lookup balance, request summary),
    /// -vv for debug, -vvv for trace. RUST_LOG, when set, takes precedence.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    verbose: u8,
}

/// Set by `dxfs mount --daemon` in the environment of the background copy it starts.
const DAEMON_CHILD_ENV: &str = "DXFS_MOUNT_DAEMON_CHILD";

/// mount.fuse3 (`mount -t fuse.dxfs`, /etc/fstab) runs `dxfs IMAGE DIR -o OPTS` with no
/// subcommand: read that as `dxfs mount --daemon IMAGE DIR -o OPTS`, backgrounded
/// because mount(8) waits for its helper to exit. mount(8) drops the default words `dev`
/// and `suid` before it calls the helper, so as root a helper mount is `dev,suid` unless
/// OPTS says `nodev`/`nosuid`, as with every file system (`dxfs mount` itself keeps the
/// safer `nodev,nosuid`; other users' mounts are always `nodev,nosuid`).
pub fn mount_helper_args(args: &[OsString]) -> Option<Vec<OsString>> {
    let first = args.get(1)?.to_string_lossy();
    let known = <Cli as clap::CommandFactory>::command()
        .get_subcommands()
        .any(|c| c.get_name() == first || c.get_all_aliases().any(|a| a == first));
    if first.starts_with('-') || first == "help" || known || !Path::new(args.get(2)?).is_dir() {
        return None;
    }
    let mut out = vec![args[0].clone(), "mount".into(), "--daemon".into()];
    if nix::unistd::geteuid().is_root() {
        // Before OPTS, which win.
        out.extend(["-o".into(), "dev,suid".into()]);
    }
    out.extend_from_slice(&args[1..]);
    Some(out)
}

fn seconds(s: f64) -> Result<std::time::Duration, String> {
    std::time::Duration::try_from_secs_f64(s).map_err(|_| format!("bad timeout {s}"))
}

/// Apply one `-o` option.
fn mount_option(
    o: &mut FuseOptions,
    v: &mut dxfs::OpenOptions,
    lock_wait: &mut std::time::Duration,
    blkdev: &mut Option<bool>,
    opt: &str,
) -> Result<(), String> {
    let (key, val) = match opt.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (opt, None),
    };
    let num = |v: Option<&str>| -> Result<f64, String> {
        v.and_then(|v| v.parse::<f64>().ok()).ok_or_else(|| format!("mount option {opt:?} needs a number"))
    };
    match key {
        "ro" => o.read_only = true,
        "rw" => o.read_only = false,
        "default_permissions" => o.default_permissions = true,
        "allow_other" => o.allow_other = true,
        "writeback_cache" => o.writeback_cache = true,
        "no_writeback_cache" => o.writeback_cache = false,
        "threads" => o.threads = num(val)? as usize,
        "transport" => o.transport = val.unwrap_or("").parse()?,
        "readahead_kb" => o.readahead_kb = num(val)? as u32,
        "spin_us" => o.spin = std::time::Duration::from_micros(num(val)? as u64),
        "keep_awake_us" if val == Some("auto") => o.keep_awake = None,
        "keep_awake_us" => o.keep_awake = Some(std::time::Duration::from_micros(num(val)? as u64)),
        "attr_timeout" => o.attr_timeout = seconds(num(val)?)?,
        "entry_timeout" => o.entry_timeout = seconds(num(val)?)?,
        "negative_timeout" => o.negative_timeout = seconds(num(val)?)?,
        // Seconds a mount waits for the image's previous user (0: refuse at once).
        "lock_wait" => *lock_wait = seconds(num(val)?)?,
        // As ext4's commit=: seconds between periodic commits.
        "commit" => o.sync_interval = seconds(num(val)?)?.max(std::time::Duration::from_millis(10)),
        "readdirplus" => {
            o.readdirplus = match val {
                Some("auto") => ReaddirPlus::Auto,
                Some("always") => ReaddirPlus::Always,
                Some("never") => ReaddirPlus::Never,
                _ => return Err(format!("mount option {opt:?}: readdirplus=auto|always|never")),
            }
        }
        // A/B switches of the seed features, for measurements on the same volume.
        "noreserve" => v.reserve_regions = false,
        "noprefetch" => v.sorted_prefetch = false,
        "nodata_readahead" => v.data_readahead = false,
        "data_readahead" => v.data_readahead = true,
        "noxattrfilter" => v.use_xattr_filter = false,
        "noaccounting" => v.space_accounting = false,
        // Write dirty pages back ahead of the commit past this many (0: only commits do).
        "flush_from" => v.flush_from = num(val)? as u64,
        "recovery" if val == Some("rollback") => v.allow_rollback = true,
        // Mount as fuseblk over the volume's block device (a loop device for an image).
        "blkdev" => *blkdev = Some(true),
        "noblkdev" => *blkdev = Some(false),
        // Trim the blocks each committed delta frees.
        "discard" => v.discard = true,
        "nodiscard" => v.discard = false,
        // Kernel mount flags; the atime policy is the volume's to apply.
        k if o.flags.set(k) => v.atime = o.flags.atime,
        // mount(8) and mount.fuse3 options that mean nothing to the daemon.
        "auto" | "noauto" | "user" | "nouser" | "users" | "_netdev" | "defaults" | "nofail" | "async" | "fsname"
        | "subtype" => {}
        k if k.starts_with("x-") || k.starts_with("comment") => {}
        _ => return Err(format!("unknown mount option {opt:?}")),
    }
    Ok(())
}

pub fn run(a: MountArgs, raw: &[OsString]) -> i32 {
    let opts: Vec<&str> = a.options.iter().flat_map(|s| s.split(',')).filter(|s| !s.is_empty()).collect();
    if opts.contains(&"remount") {
        return remount(&a.dir, &opts);
    }
    let child = std::env::var_os(DAEMON_CHILD_ENV).is_some();
    if a.daemon && !child {
        return spawn_daemon(raw);
    }
    let mut o = FuseOptions::default();
    // The default transport may come from the environment (the test suite runs once per
    // transport this way); `-o transport=` still wins.
    if let Some(t) = std::env::var_os("DXFS_TRANSPORT") {
        match t.to_string_lossy().parse() {
            Ok(t) => o.transport = t,
            Err(e) => return fail(format!("DXFS_TRANSPORT: {e}"), 8),
        }
    }
    let mut vol_opts = dxfs::OpenOptions::default();
    let mut lock_wait = std::time::Duration::from_secs(10);
    // `blkdev`: a fuseblk mount, where `sync` and `umount` reach the daemon. Unset: one
    // wherever the host allows it (as root, an image or a block device), else a plain
    // mount, said once in the log.
    let mut blkdev: Option<bool> = None;
    // fsck -n's walk before a read-write mount, which it refuses on any error: unless
    // the volume is as this host left it, always (`check`), or never (`nocheck`).
    let mut check = Check::UnlessKnown;
    for opt in a.options.iter().flat_map(|s| s.split(',')).filter(|s| !s.is_empty()) {
        if opt == "check" || opt == "nocheck" {
            check = if opt == "check" { Check::Always } else { Check::Never };
            continue;
        }
        if let Err(e) = mount_option(&mut o, &mut vol_opts, &mut lock_wait, &mut blkdev, opt) {
            return fail(e, 8);
        }
    }
    o.read_only |= a.ro;
    o.allow_other |= a.allow_other;
    o.default_permissions &= !a.no_default_permissions;
    if o.allow_other && !o.default_permissions {
        // The volume decides `access(2)` itself, but not every open, read, chmod or
        // chown: without the kernel's checks, other users could do all of them.
        return fail(
            "allow_other needs the kernel's permission checks: drop --no-default-permissions \
             (without allow_other only the mounting user can reach the mount)",
            8,
        );
    }
    if let Some(n) = a.threads {
        o.threads = n;
    }
    if let Some(w) = &a.writeback_cache {
        o.writeback_cache = w == "on";
    }
    for (t, dst) in [(a.attr_timeout, &mut o.attr_timeout), (a.entry_timeout, &mut o.entry_timeout)] {
        if let Some(t) = t {
            match seconds(t) {
                Ok(d) => *dst = d,
                Err(e) => return fail(e, 8),
            }
        }
    }
    // Block the stop signals before any thread starts, so that every thread inherits
    // the mask and only the signal thread's sigwait sees them.
    let mut sigs = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        sigs.add(s);
    }
    if let Err(e) = sigs.thread_block() {
        return fail(format!("cannot block signals: {e}"), 8);
    }
    let level = match a.verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // Colours only for a terminal: a log file or a pipe gets plain text. The background
    // copy started by --daemon points its stderr at a file or /dev/null later.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os(DAEMON_CHILD_ENV).is_none();
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();

    let nbd = dxfs::block::is_nbd_uri(&a.image.to_string_lossy());
    let image = match std::path::absolute(&a.image) {
        Ok(_) if nbd => a.image.clone(),
        Ok(p) => p,
        Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
    };
    o.fsname = image.display().to_string();
    // With --create, the mount point is made too (as `mount --mkdir` does), so one
    // command takes a fresh machine from nothing to a mounted volume.
    if a.create.is_some() && !a.dir.exists() {
        if let Err(e) = std::fs::create_dir_all(&a.dir) {
            return fail(format!("{}: {e}", a.dir.display()), 8);
        }
    }
    let dir = match a.dir.canonicalize() {
        Ok(p) => p,
        Err(e) => return fail(format!("{}: {e}", a.dir.display()), 8),
    };
    if child {
        // Leave the caller's session and working directory behind.
        let _ = nix::unistd::setsid();
        let _ = std::env::set_current_dir("/");
    }
    if let Some(size) = &a.create {
        if nbd {
            return fail("--create makes image files; run dxfs mkfs on an NBD export first", 8);
        }
        if !image.exists() {
            let Some(bytes) = parse_size(size) else { return fail(format!("bad size {size:?}"), 8) };
            let made = FileDevice::create(&image, bytes / 4096 * 4096).and_then(|d| {
                let d: Arc<dyn dxfs::block::BlockDevice> = Arc::new(d);
                mkfs(d.clone(), &MkfsOptions::default()).map(|_| d)
            });
            match made {
                Ok(d) => super::known::record_checked(&image.to_string_lossy(), &*d),
                Err(e) => return fail(format!("{}: mkfs failed: {e}", image.display()), 8),
            }
        }
    }
    // Checked before the volume is opened: the kernel would mount on a file too, and
    // every access would then fail.
    if !dir.is_dir() {
        return fail(format!("{}: not a directory (a mount point must be one)", dir.display()), 8);
    }
    let spec = image.to_string_lossy().into_owned();
    if !o.read_only {
        vol_opts.known = super::known::entry(&spec);
    }
    // The walk a read-write open may need runs once the device is ours to open (an old
    // daemon still committing after `umount` has let go), through the same handle.
    let (mut walked, mut refused) = (o.read_only, None);
    let opened = open_waiting(lock_wait, || {
        let dev = if nbd {
            dxfs::block::open_device(&image.to_string_lossy(), o.read_only)?
        } else {
            Arc::new(FileDevice::open(&image, o.read_only)?) as Arc<dyn dxfs::block::BlockDevice>
        };
        if !walked {
            match super::known::check_before_writing(&spec, check, Some(&dev)) {
                Ok(()) => walked = true,
                Err(Refusal::InUse(m)) => return Err(dxfs::Error::Busy(m)),
                Err(Refusal::Failed(m)) => {
                    refused = Some(m);
                    return Err(dxfs::Error::Failed);
                }
            }
        }
        dxfs::Volume::open(dev, dxfs::OpenOptions { read_only: o.read_only, ..vol_opts.clone() })
    });
    if let Some(m) = refused {
        return fail(format!("{spec}: {m}"), 8);
    }
    let vol = match opened {
        Ok(v) => Arc::new(v),
        Err(e) => return fail(format!("{}: {e}", image.display()), 8),
    };
    let mut attached = None;
    let root = nix::unistd::geteuid().is_root();
    match blkdev {
        Some(true) if nbd => return fail("-o blkdev: an NBD export has no block device on this host", 8),
        Some(true) if !root => return fail("-o blkdev: a fuseblk mount needs root", 8),
        Some(true) | None if !nbd && root => match block_source(&image) {
            Ok((bdev, loop_dev)) => {
                o.block_device = Some(bdev);
                attached = loop_dev;
            }
            Err(e) if blkdev.is_some() => return fail(format!("-o blkdev: {e}"), 8),
            Err(e) => tracing::info!("a plain mount, not fuseblk ({e}): `sync` will not reach it; `dxfs sync` will"),
        },
        None if !nbd => {
            tracing::info!("a plain mount (fuseblk needs root): `sync` will not reach it; `dxfs sync` will")
        }
        _ => {}
    }
    let mut mounted = dxfs::fuse::mount(vol.clone(), &dir, &o);
    // The mount holds the loop device now (or failed): it goes when the mount does.
    drop(attached);
    if let (None, Some(_), Err(e)) = (blkdev, &o.block_device, &mounted) {
        tracing::info!("cannot mount as fuseblk ({e}): a plain mount, which `sync` will not reach; `dxfs sync` will");
        o.block_device = None;
        mounted = dxfs::fuse::mount(vol, &dir, &o);
    }
    let mut mounted = match mounted {
        Ok(m) => m,
        Err(e) => return fail(format!("cannot mount on {}: {e}", dir.display()), 8),
    };
    if child {
        // The parent waits for this line; it exits 0 once the mount is live.
        let mut out = std::io::stdout();
        let _ = writeln!(out, "ready").and_then(|_| out.flush());
        // Then let go of the caller's terminal or pipes: `$(dxfs mount --daemon …)` and
        // mount(8) must not wait for the daemon, nor get its log lines.
        if let Err(e) = detach_stdio() {
            tracing::warn!("cannot detach from the caller's output: {e}");
        }
    }
    let mut stopper = mounted.stopper();
    let spawned = std::thread::Builder::new().name("dxfs-signals".into()).spawn(move || {
        while let Ok(sig) = sigs.wait() {
            tracing::info!("{sig}: committing and unmounting {}", dir.display());
            if let Err(e) = stopper.stop() {
                tracing::error!("unmount of {} failed: {e}", dir.display());
            }
        }
    });
    if let Err(e) = spawned {
        return fail(format!("cannot start the signal thread: {e}"), 8);
    }
    match mounted.run() {
        Ok(()) => 0,
        Err(e) => fail(e, 8),
    }
}

/// The block device a fuseblk mount of `image` names: the image itself when it is one,
/// else a loop device attached over it, with an open handle on it to keep until the
/// mount holds it. The device is detached at once while that handle holds it, which
/// only marks it to go with its last user (autoclear): a daemon killed before its
/// mount, or a mount that fails, leaves no loop device behind.
fn block_source(image: &Path) -> Result<(PathBuf, Option<std::fs::File>), String> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(image).map_err(|e| format!("{}: {e}", image.display()))?;
    if meta.file_type().is_block_device() {
        return Ok((image.to_path_buf(), None));
    }
    let out = std::process::Command::new(system_program("losetup"))
        .args(["--find", "--show", "--"])
        .arg(image)
        .output()
        .map_err(|e| format!("losetup: {e}"))?;
    if !out.status.success() {
        return Err(format!("losetup {}: {}", image.display(), String::from_utf8_lossy(&out.stderr).trim()));
    }
    let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let held = std::fs::File::open(&dev);
    detach_loop(&dev);
    let held = held.map_err(|e| format!("{}: {e}", dev.display()))?;
    Ok((dev, Some(held)))
}

/// Where to run system program `name` from: as PATH finds it, else from the system's
/// sbin and bin directories. mount(8) runs its helper with no PATH, or one without
/// them, and `losetup` is in sbin: a root mount through it was silently no fuseblk.
fn system_program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d.join(name).is_file()) {
        return PathBuf::from(name);
    }
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Detach loop device `dev` (`losetup -d`).
fn detach_loop(dev: &Path) {
    match std::process::Command::new(system_program("losetup")).arg("-d").arg(dev).status() {
        Ok(st) if st.success() => {}
        Ok(st) => tracing::warn!("losetup -d {}: {st}", dev.display()),
        Err(e) => tracing::warn!("losetup -d {}: {e}", dev.display()),
    }
}

/// `mount -o remount,ro|rw DIR` (mount(8) passes it to the helper): change the live
/// mount's flags in the kernel; the daemon keeps serving. Read-only is then the kernel's
/// to enforce (EROFS), as for any file system.
fn remount(dir: &Path, opts: &[&str]) -> i32 {
    use nix::mount::MsFlags;
    // MS_REMOUNT sets every per-mount flag anew: from the options given, with the same
    // defaults as a fresh mount (nodev, nosuid, relatime).
    let mut kernel = dxfs::fuse::MountFlags::default();
    for o in opts {
        kernel.set(o);
    }
    let mut flags = MsFlags::MS_REMOUNT | kernel.ms_flags();
    if opts.iter().rev().find(|o| **o == "ro" || **o == "rw") == Some(&"ro") {
        flags |= MsFlags::MS_RDONLY;
    }
    match nix::mount::mount(None::<&str>, dir, None::<&str>, flags, None::<&str>) {
        Ok(()) => 0,
        Err(e) => fail(format!("remount of {}: {e}", dir.display()), 8),
    }
}

/// Open the volume, waiting up to `wait` while it is in use (`Error::Busy`): after
/// `umount` the old daemon may still be writing its last commit, holding the image's lock
/// and, on any device (NBD too), the volume's mount mark; a remount right away must wait
/// for it rather than fail.
fn open_waiting<T>(wait: std::time::Duration, mut open: impl FnMut() -> dxfs::Result<T>) -> dxfs::Result<T> {
    let deadline = std::time::Instant::now() + wait;
    let mut told = false;
    loop {
        match open() {
            Err(dxfs::Error::Busy(m)) if std::time::Instant::now() < deadline => {
                if !told {
                    tracing::info!("{m}; waiting up to {wait:?} for it to be released");
                    told = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// Point stdin, stdout and stderr at /dev/null, or stderr at the log file named by
/// `DXFS_LOG` (the tracing writer follows fd 2).
fn detach_stdio() -> std::io::Result<()> {
    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
    nix::unistd::dup2_stdin(&null)?;
    nix::unistd::dup2_stdout(&null)?;
    match std::env::var_os("DXFS_LOG") {
        Some(path) => nix::unistd::dup2_stderr(std::fs::OpenOptions::new().create(true).append(true).open(path)?)?,
        None => nix::unistd::dup2_stderr(&null)?,
    }
    Ok(())
}

/// Start `dxfs mount` again in the background and exit 0 once it reports the mount
/// live, or with its exit code if it fails first (it explains on the shared stderr).
fn spawn_daemon(raw: &[OsString]) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return fail(format!("cannot find my own executable: {e}"), 8),
    };
    let mut child = match std::process::Command::new(exe)
        .args(&raw[1..])
        .env(DAEMON_CHILD_ENV, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return fail(format!("cannot start the daemon: {e}"), 8),
    };
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    if line.trim_end() == "ready" {
        return 0;
    }
    match child.wait() {
        Ok(st) => st.code().filter(|&c| c != 0).unwrap_or(8),
        Err(e) => fail(format!("daemon: {e}"), 8),
    }
}
