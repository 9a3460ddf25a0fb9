//! Command-line front end. Each subcommand parses its arguments, calls the library and
//! prints; no filesystem logic lives here.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Parser, Subcommand};

use dxfs::block::{BlockDevice, FileDevice};
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

#[derive(Subcommand)]
enum DebugCmd {
    /// Print a name's directory hash, as debugfs's dx_hash does.
    Hash {
        /// Hash version: legacy, half_md4, tea or 0-5.
        #[arg(short = 'H', long = "hash", short_alias = 'h', default_value = "half_md4")]
        version: String,
        /// Seed as a UUID (all zero by default).
        #[arg(short = 's', long, default_value = "00000000-0000-0000-0000-000000000000")]
        seed: String,
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
        Cmd::Debug(DebugCmd::Hash { version, seed, name }) => {
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
        return fail(
            format!("{} already holds a dxfs volume; use --force to overwrite it", a.image.display()),
            8,
        );
    }
    let o = MkfsOptions {
        label: a.label,
        hash,
        seed,
        uuid: None,
        region_blocks: a.region_blocks,
        xattr_filter: !a.no_xattr_filter,
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
