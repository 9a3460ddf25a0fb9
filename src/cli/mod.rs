//! Command-line front end. Each subcommand parses its arguments, calls the library and
//! prints; no filesystem logic lives here.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::io::{BufRead, Write};

use clap::{Parser, Subcommand};
use nix::sys::signal::{SigSet, Signal};

use dxfs::block::{BlockDevice, FileDevice};
use dxfs::fuse::{FuseOptions, ReaddirPlus};
use dxfs::hash::{ext4_hash, format_seed, parse_seed, HashVersion};
use dxfs::volume::{mkfs, read_superblock, MkfsOptions};

#[derive(Parser)]
#[command(name = "dxfs", version, about = "dxfs: a POSIX filesystem in user space")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Make a new volume on an image file (created if missing) or a block device.
    Mkfs(MkfsArgs),
    /// Check a volume (exit 0 clean, 1 fixed, 4 errors left, 8 operational error).
    Fsck(FsckArgs),
    /// Print the superblock and usage (like dumpe2fs -h).
    Info(InfoArgs),
    /// Serve a volume through FUSE on a directory (also run as `mount -t fuse.dxfs`).
    Mount(MountArgs),
    /// Debugging aids.
    #[command(subcommand)]
    Debug(DebugCmd),
}

#[derive(clap::Args)]
struct MkfsArgs {
    /// Image file or block device.
    image: PathBuf,
    /// Size of the image file to create, e.g. 512M, 4G (default: 1G for a new file).
    #[arg(long, short = 's')]
    size: Option<String>,
    /// Volume label (up to 32 bytes).
    #[arg(long, short = 'L', default_value = "")]
    label: String,
    /// Directory hash: legacy, half_md4, tea (or their _unsigned forms, or 0-5).
    #[arg(long, default_value = "half_md4")]
    hash: String,
    /// The 128-bit hash seed as a UUID (random by default).
    #[arg(long)]
    seed: Option<String>,
    /// Inode blocks (15 inodes each) in a directory's first reserved region.
    #[arg(long, default_value_t = 4)]
    region_blocks: u16,
    /// Do not keep the per-inode xattr-name bloom filter.
    #[arg(long)]
    no_xattr_filter: bool,
    /// Bits each xattr name sets in the bloom filter (1 = erofs's rule; the default is
    /// ln2 · 32 / n for the typical n = 2 names of an inode that has any).
    #[arg(long, default_value_t = dxfs::format::DEFAULT_FILTER_HASHES,
          value_parser = clap::value_parser!(u8).range(1..=32))]
    xattr_filter_hashes: u8,
    /// Overwrite an existing filesystem.
    #[arg(long, short = 'f')]
    force: bool,
}

#[derive(clap::Args)]
struct FsckArgs {
    image: PathBuf,
    /// Check only: change nothing.
    #[arg(short = 'n')]
    no_change: bool,
    /// Repair without asking (the default when -n is not given).
    #[arg(short = 'y', short_alias = 'p')]
    yes: bool,
    /// Print statistics.
    #[arg(short = 'v')]
    verbose: bool,
}

#[derive(clap::Args)]
struct InfoArgs {
    image: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct MountArgs {
    /// Image file or block device.
    image: PathBuf,
    /// Directory to mount on.
    dir: PathBuf,
    /// Mount options, comma-separated: ro, rw, default_permissions, allow_other,
    /// threads=N, writeback_cache, no_writeback_cache, attr_timeout=S, entry_timeout=S,
    /// readdirplus=auto|always|never,
    /// and the A/B switches noreserve, noprefetch, noxattrfilter, noaccounting (mount(8) options such
    /// as dev, nosuid, noauto, _netdev, defaults are ignored).
    #[arg(short = 'o', value_name = "OPTS")]
    options: Vec<String>,
    /// Go to the background once the mount is live.
    #[arg(long)]
    daemon: bool,
    /// Make a volume of this size (e.g. 4G) first if the image does not exist.
    #[arg(long, value_name = "SIZE")]
    create: Option<String>,
    /// Request-serving threads.
    #[arg(long)]
    threads: Option<usize>,
    /// Mount read-only.
    #[arg(long)]
    ro: bool,
    /// Let other users use the mount.
    #[arg(long)]
    allow_other: bool,
    /// Do not let the kernel check permissions (the daemon then allows everything).
    #[arg(long)]
    no_default_permissions: bool,
    /// Kernel write-back caching of file data (default off).
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    writeback_cache: Option<String>,
    /// Seconds the kernel may cache attributes.
    #[arg(long, value_name = "S")]
    attr_timeout: Option<f64>,
    /// Seconds the kernel may cache names.
    #[arg(long, value_name = "S")]
    entry_timeout: Option<f64>,
}

#[derive(Subcommand)]
enum DebugCmd {
    /// Print a name's directory hash, as debugfs's dx_hash does (`-h` is the hash
    /// version here, as in debugfs; use --help for help).
    #[command(disable_help_flag = true)]
    Hash {
        /// Hash version: legacy, half_md4, tea or 0-5.
        #[arg(short = 'h', long = "hash", default_value = "half_md4")]
        version: String,
        /// Seed as a UUID (all zero by default).
        #[arg(short = 's', long, default_value = "00000000-0000-0000-0000-000000000000")]
        seed: String,
        /// Print help.
        #[arg(long, action = clap::ArgAction::Help)]
        help: Option<bool>,
        name: String,
    },
}

/// Parse "512M", "4G", "1048576", "64K", "1T".
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1u64 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        't' | 'T' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

fn fail(msg: impl std::fmt::Display, code: i32) -> i32 {
    eprintln!("dxfs: {msg}");
    code
}

/// Entry point; returns the exit code.
pub fn run(args: Vec<OsString>) -> i32 {
    // mkfs.dxfs and fsck.dxfs behave as the subcommands.
    let prog = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut args = args;
    if let Some(sub) = prog.strip_suffix(".dxfs") {
        if sub == "mkfs" || sub == "fsck" {
            args.insert(1, sub.into());
        }
    }
    let raw = args.clone();
    if let Some(a) = mount_helper_args(&args) {
        args = a;
    }
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 8 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    match cli.cmd {
        Cmd::Mkfs(a) => cmd_mkfs(a),
        Cmd::Fsck(a) => cmd_fsck(a),
        Cmd::Info(a) => cmd_info(a),
        Cmd::Mount(a) => cmd_mount(a, &raw),
        Cmd::Debug(DebugCmd::Hash { version, seed, name, .. }) => {
            let Some(v) = HashVersion::parse(&version) else {
                return fail(format!("unknown hash version {version:?}"), 8);
            };
            let Some(s) = parse_seed(&seed) else {
                return fail(format!("bad seed {seed:?} (want a UUID)"), 8);
            };
            let (major, minor) = ext4_hash(v, s, name.as_bytes());
            println!("Hash of {name} is {major:#x} (minor {minor:#x})");
            0
        }
    }
}

fn cmd_mkfs(a: MkfsArgs) -> i32 {
    let Some(hash) = HashVersion::parse(&a.hash) else {
        return fail(format!("unknown hash {:?}", a.hash), 8);
    };
    let seed = match &a.seed {
        Some(s) => match parse_seed(s) {
            Some(x) => Some(x),
            None => return fail(format!("bad seed {s:?} (want a UUID)"), 8),
        },
        None => None,
    };
    let exists = a.image.exists();
    let dev: Arc<dyn BlockDevice> = if exists {
        let d = match FileDevice::open(&a.image, false) {
            Ok(d) => d,
            Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
        };
        if let Some(sz) = &a.size {
            let Some(bytes) = parse_size(sz) else { return fail(format!("bad size {sz:?}"), 8) };
            if bytes / 4096 > d.block_count() && std::fs::metadata(&a.image).map(|m| m.is_file()).unwrap_or(false) {
                drop(d);
                match FileDevice::create(&a.image, bytes / 4096 * 4096) {
                    Ok(d) => Arc::new(d),
                    Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
                }
            } else {
                Arc::new(d)
            }
        } else {
            Arc::new(d)
        }
    } else {
        let bytes = match &a.size {
            Some(sz) => match parse_size(sz) {
                Some(b) => b,
                None => return fail(format!("bad size {sz:?}"), 8),
            },
            None => 1 << 30,
        };
        match FileDevice::create(&a.image, bytes / 4096 * 4096) {
            Ok(d) => Arc::new(d),
            Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
        }
    };
    if exists && !a.force && read_superblock(&*dev).is_ok() {
        return fail(format!("{} already holds a dxfs volume; use --force to overwrite it", a.image.display()), 8);
    }
    let o = MkfsOptions {
        label: a.label,
        hash,
        seed,
        uuid: None,
        region_blocks: a.region_blocks,
        xattr_filter: !a.no_xattr_filter,
        filter_hashes: a.xattr_filter_hashes,
        log_blocks: None,
    };
    match mkfs(dev.clone(), &o) {
        Ok(sb) => {
            println!(
                "dxfs volume on {}: {} blocks of 4 KiB ({} MiB), hash {} seed {}, uuid {}",
                a.image.display(),
                sb.layout.block_count,
                sb.layout.block_count / 256,
                sb.hash.name(),
                format_seed(sb.hash_seed),
                uuid::Uuid::from_bytes(sb.uuid)
            );
            0
        }
        Err(e) => fail(format!("mkfs failed: {e}"), 8),
    }
}

fn cmd_fsck(a: FsckArgs) -> i32 {
    let dev = match FileDevice::open(&a.image, a.no_change) {
        Ok(d) => Arc::new(d) as Arc<dyn BlockDevice>,
        Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
    };
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(4));
    let mut progress = |n: u64| bar.set_message(format!("checked {n} inodes"));
    let r = dxfs::fsck::check(dev, !a.no_change, &mut progress);
    bar.finish_and_clear();
    let r = match r {
        Ok(r) => r,
        Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
    };
    let _ = a.yes;
    for f in &r.fixed {
        println!("fixed: {f}");
    }
    for e in &r.errors {
        println!("error: {e}");
    }
    let state = match r.exit_code() {
        0 => "clean",
        1 => "repaired",
        _ => "HAS ERRORS",
    };
    println!(
        "{}: {state}, {} inodes ({} directories, {} other), {}/{} blocks",
        a.image.display(),
        r.inodes,
        r.directories,
        r.files,
        r.blocks_used,
        r.blocks_total
    );
    if a.verbose && r.dir_leaves > 0 {
        println!(
            "directory leaves: {}, average fill {:.1}%",
            r.dir_leaves,
            100.0 * r.dir_leaf_bytes as f64 / (r.dir_leaves as f64 * 4064.0)
        );
    }
    r.exit_code()
}

fn cmd_info(a: InfoArgs) -> i32 {
    let dev = match FileDevice::open(&a.image, true) {
        Ok(d) => Arc::new(d) as Arc<dyn BlockDevice>,
        Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
    };
    let sb = match read_superblock(&*dev) {
        Ok(s) => s,
        Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
    };
    let vol = match dxfs::Volume::open(dev, dxfs::OpenOptions { read_only: true, ..Default::default() }) {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("dxfs: cannot open the volume for usage figures: {e}");
            None
        }
    };
    let sf = vol.as_ref().map(|v| v.statfs());
    let l = sb.layout;
    let uuid = uuid::Uuid::from_bytes(sb.uuid).to_string();
    if a.json {
        let j = serde_json::json!({
            "version": sb.version,
            "uuid": uuid,
            "label": sb.label,
            "block_size": 4096,
            "block_count": l.block_count,
            "log_blocks_per_area": l.log_blocks,
            "bitmap_start": l.bitmap_start,
            "bitmap_blocks": l.bitmap_blocks,
            "root_ino": sb.root_ino,
            "hash": sb.hash.name(),
            "hash_seed": format_seed(sb.hash_seed),
            "region_blocks": sb.region_blocks,
            "features": {"compat": sb.compat, "incompat": sb.incompat, "ro_compat": sb.ro_compat,
                         "xattr_filter": sb.xattr_filter()},
            "xattr_filter_hashes": if sb.xattr_filter() { Some(sb.filter_hashes()) } else { None },
            "mkfs_time": sb.mkfs_time,
            "free_blocks": sf.map(|s| s.bfree),
            "available_blocks": sf.map(|s| s.bavail),
            "inodes": sf.map(|s| s.files - s.ffree),
        });
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    } else {
        println!("Filesystem volume name:   {}", if sb.label.is_empty() { "<none>" } else { &sb.label });
        println!("Filesystem UUID:          {uuid}");
        println!("Format version:           {}", sb.version);
        println!(
            "Features:                 compat {:#x}{} ro_compat {:#x}{} incompat {:#x}",
            sb.compat,
            if sb.compat & 1 != 0 { " (dir_reservation)" } else { "" },
            sb.ro_compat,
            if sb.xattr_filter() { " (xattr_filter)" } else { "" },
            sb.incompat
        );
        if sb.xattr_filter() {
            println!("Xattr filter:             {} bits per name of 32", sb.filter_hashes());
        }
        println!("Block size:               4096");
        println!("Block count:              {}", l.block_count);
        println!("Log areas:                2 x {} blocks at {}", l.log_blocks, dxfs::format::LOG_START);
        println!("Bitmap:                   {} blocks at {}", l.bitmap_blocks, l.bitmap_start);
        println!("Root inode:               {}", sb.root_ino);
        println!("Directory hash:           {}", sb.hash.name());
        println!("Directory hash seed:      {}", format_seed(sb.hash_seed));
        println!("Inode region (blocks):    {}", sb.region_blocks);
        if let Some(s) = sf {
            println!("Free blocks:              {}", s.bfree);
            println!("Available blocks:         {}", s.bavail);
            println!("Inodes in use:            {}", s.files - s.ffree);
        }
    }
    0
}

/// Set by `dxfs mount --daemon` in the environment of the background copy it starts.
const DAEMON_CHILD_ENV: &str = "DXFS_MOUNT_DAEMON_CHILD";

/// mount.fuse3 (`mount -t fuse.dxfs`, /etc/fstab) runs `dxfs IMAGE DIR -o OPTS` with no
/// subcommand: read that as `dxfs mount --daemon IMAGE DIR -o OPTS`, backgrounded
/// because mount(8) waits for its helper to exit.
fn mount_helper_args(args: &[OsString]) -> Option<Vec<OsString>> {
    let first = args.get(1)?.to_string_lossy();
    let known = <Cli as clap::CommandFactory>::command()
        .get_subcommands()
        .any(|c| c.get_name() == first || c.get_all_aliases().any(|a| a == first));
    if first.starts_with('-') || first == "help" || known || !Path::new(args.get(2)?).is_dir() {
        return None;
    }
    let mut out = vec![args[0].clone(), "mount".into(), "--daemon".into()];
    out.extend_from_slice(&args[1..]);
    Some(out)
}

fn seconds(s: f64) -> Result<std::time::Duration, String> {
    std::time::Duration::try_from_secs_f64(s).map_err(|_| format!("bad timeout {s}"))
}

/// Apply one `-o` option.
fn mount_option(o: &mut FuseOptions, v: &mut dxfs::OpenOptions, opt: &str) -> Result<(), String> {
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
        "attr_timeout" => o.attr_timeout = seconds(num(val)?)?,
        "entry_timeout" => o.entry_timeout = seconds(num(val)?)?,
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
        "noxattrfilter" => v.use_xattr_filter = false,
        "noaccounting" => v.space_accounting = false,
        // mount(8) and mount.fuse3 options that mean nothing to the daemon.
        "dev" | "nodev" | "suid" | "nosuid" | "exec" | "noexec" | "auto" | "noauto" | "user" | "nouser" | "users"
        | "_netdev" | "defaults" | "nofail" | "atime" | "noatime" | "relatime" | "strictatime" | "nodiratime"
        | "async" | "fsname" | "subtype" => {}
        k if k.starts_with("x-") || k.starts_with("comment") => {}
        _ => return Err(format!("unknown mount option {opt:?}")),
    }
    Ok(())
}

fn cmd_mount(a: MountArgs, raw: &[OsString]) -> i32 {
    let child = std::env::var_os(DAEMON_CHILD_ENV).is_some();
    if a.daemon && !child {
        return spawn_daemon(raw);
    }
    let mut o = FuseOptions::default();
    let mut vol_opts = dxfs::OpenOptions::default();
    for opt in a.options.iter().flat_map(|s| s.split(',')).filter(|s| !s.is_empty()) {
        if let Err(e) = mount_option(&mut o, &mut vol_opts, opt) {
            return fail(e, 8);
        }
    }
    o.read_only |= a.ro;
    o.allow_other |= a.allow_other;
    o.default_permissions &= !a.no_default_permissions;
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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,fuser=error"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();

    let image = match std::path::absolute(&a.image) {
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
        if !image.exists() {
            let Some(bytes) = parse_size(size) else { return fail(format!("bad size {size:?}"), 8) };
            let made = FileDevice::create(&image, bytes / 4096 * 4096)
                .and_then(|d| mkfs(Arc::new(d), &MkfsOptions::default()));
            if let Err(e) = made {
                return fail(format!("{}: mkfs failed: {e}", image.display()), 8);
            }
        }
    }
    let opened = FileDevice::open(&image, o.read_only)
        .and_then(|d| dxfs::Volume::open(Arc::new(d), dxfs::OpenOptions { read_only: o.read_only, ..vol_opts }));
    let vol = match opened {
        Ok(v) => Arc::new(v),
        Err(e) => return fail(format!("{}: {e}", image.display()), 8),
    };
    let mut mounted = match dxfs::fuse::mount(vol, &dir, &o) {
        Ok(m) => m,
        Err(e) => return fail(format!("cannot mount on {}: {e}", dir.display()), 8),
    };
    if child {
        // The parent waits for this line; it exits 0 once the mount is live.
        let mut out = std::io::stdout();
        let _ = writeln!(out, "ready").and_then(|_| out.flush());
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

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("4g"), Some(4 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999T"), None);
    }
}
