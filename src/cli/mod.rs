//! Command-line front end: one file per subcommand. Each parses its arguments, calls the
//! library and prints; no filesystem logic lives here.

use std::ffi::OsString;
use std::path::Path;

use clap::{Parser, Subcommand};

// The commands print through these, not std's: a reader that goes away (`dxfs fsck |
// head -1`) ends the command quietly, as SIGPIPE ends C tools, instead of a panic.
macro_rules! println {
    () => {
        $crate::cli::out(format_args!("\n"))
    };
    ($($t:tt)*) => {
        $crate::cli::out(format_args!("{}\n", format_args!($($t)*)))
    };
}
macro_rules! print {
    ($($t:tt)*) => {
        $crate::cli::out(format_args!($($t)*))
    };
}

/// Write to stdout; when the reader has gone, exit at once with the status of a
/// process killed by SIGPIPE (128 + 13). Other errors are reported once, likewise.
pub fn out(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("dxfs: cannot write to standard output: {e}");
        }
        std::process::exit(141);
    }
}

mod batch;
mod cp;
mod debug;
mod du;
mod export;
mod fsck;
mod import;
mod info;
mod inspect;
mod known;
mod mkfs;
mod mount;
mod quota;
mod resize;
mod rm;
mod stats;
mod sync;
mod trim;

use debug::DebugCmd;
use du::DuArgs;
use export::ExportArgs;
use fsck::FsckArgs;
use info::InfoArgs;
use mkfs::MkfsArgs;
use mount::{mount_helper_args, MountArgs};
use resize::ResizeArgs;
use rm::RmArgs;
use stats::StatsArgs;
use sync::SyncArgs;
use trim::TrimArgs;

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
    /// Requests a live mount has served, per opcode, and the time spent on each.
    Stats(StatsArgs),
    /// Commit mounted volumes and wait until durable (`sync(1)` cannot reach FUSE).
    Sync(SyncArgs),
    /// Grow an unmounted volume (an image file is extended; shrinking is refused).
    Resize(ResizeArgs),
    /// Disk usage, as du(1) prints it; on a mount the daemon sums each directory's
    /// entries in steps instead of a stat per file.
    Du(DuArgs),
    /// Remove files and trees (`-r`); on a mount the daemon removes each directory's
    /// files in steps, as the caller, instead of a request per file.
    Rm(RmArgs),
    /// Copy host trees into a directory as `cp -a`; on a mount the daemon makes each
    /// directory's entries in batches, as the caller, instead of requests per file.
    Cp(cp::CpArgs),
    /// Unpack a tar archive into a directory as `tar -x` (with its xattrs); on a mount
    /// the daemon makes the entries in batches, as the caller.
    Import(import::ImportArgs),
    /// Show, set (`SIZE`) or remove (`none`) a directory's quota: a limit on the bytes it
    /// and its subtree allocate, enforced at write() with EDQUOT.
    Quota(quota::QuotaArgs),
    /// Trim every free block of an unmounted volume (thin storage and sparse images shrink).
    Trim(TrimArgs),
    /// Copy a volume's tree out to a directory, read-only (the inverse of mkfs -d).
    Export(ExportArgs),
    /// Debugging aids.
    #[command(subcommand)]
    Debug(DebugCmd),
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

/// Open a directory for the whole-tree commands' ioctls, never through a symlink.
pub(crate) fn open_dir(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// An error as rm and du print it: the system's text without Rust's "(os error N)".
pub(crate) fn errno_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => nix::errno::Errno::from_raw(n).desc().to_string(),
        None => e.to_string(),
    }
}

/// A progress line on stderr, drawn only when stderr is a terminal.
pub(crate) fn spinner() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr_with_hz(4));
    bar
}

/// `--image`: open the unmounted volume `image` (image file, device or nbd:// URI)
/// through the library; a failure is printed and gives exit status 8.
/// How long a tool waits for a daemon still letting go of a volume after `umount`.
const CLOSING_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Wait up to [`CLOSING_WAIT`] while `holder` names who still holds `what` with no mount
/// of it live: a plain FUSE mount's daemon goes on committing and releasing the volume
/// for a moment after `umount` returns (the kernel waits for no answer from it; a
/// fuseblk mount's DESTROY makes `umount` wait). A live mount keeps it held: no wait then.
fn wait_while_held(what: &str, holder: impl Fn() -> Option<String>) {
    let start = std::time::Instant::now();
    let mut told = false;
    while start.elapsed() < CLOSING_WAIT {
        let Some(who) = holder() else { return };
        // Said only when it takes a while: the usual wait is milliseconds.
        if !told && start.elapsed() > std::time::Duration::from_millis(500) {
            eprintln!(
                "dxfs: {what} is held by {who} with no mount of it (a daemon ending after umount?): \
                 waiting up to {}s for it to let go",
                CLOSING_WAIT.as_secs()
            );
            told = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// [`wait_while_held`] for an image file or block device: its write lock tells.
pub(crate) fn wait_for_a_closing_holder(image: &Path) {
    let held = || dxfs::block::FileDevice::in_use(image) && !dxfs::fuse::image_is_mounted(image);
    wait_while_held(&image.display().to_string(), || held().then(|| "a process".to_string()));
}

/// [`wait_while_held`] for an NBD export, which has no lock to watch: the mount mark
/// tells, while a process of this host holds it.
pub(crate) fn wait_for_a_closing_mark(spec: &str, dev: &dyn dxfs::block::BlockDevice) {
    wait_while_held(spec, || match dxfs::mount_mark_holder_on_this_host(dev) {
        Ok(Some(pid)) if !dxfs::fuse::image_is_mounted(Path::new(spec)) => Some(format!("process {pid}")),
        _ => None,
    });
}

/// Open an unmounted volume for a tool; for writing, after the walk that a volume not as
/// this host left it gets first (`known::check_before_writing`).
pub(crate) fn open_image(image: &str, read_only: bool) -> Result<dxfs::Volume, i32> {
    let mut opts = dxfs::OpenOptions { read_only, ..Default::default() };
    if !read_only {
        known::check_before_writing(image, known::Check::UnlessKnown, None)
            .map_err(|e| fail(format!("{image}: {e}"), 8))?;
        opts.known = known::entry(image);
    }
    let dev = dxfs::block::open_device(image, read_only).map_err(|e| fail(format!("{image}: {e}"), 8))?;
    dxfs::Volume::open(dev, opts).map_err(|e| fail(format!("{image}: {e}"), 8))
}

/// The names of `p`, a path inside a volume taken from its root (`..` steps back).
fn image_names(p: &Path) -> Vec<&[u8]> {
    use std::os::unix::ffi::OsStrExt;
    let mut names: Vec<&[u8]> = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::Normal(n) => names.push(n.as_bytes()),
            std::path::Component::ParentDir => {
                names.pop();
            }
            _ => {}
        }
    }
    names
}

/// The attributes of what `p` (inside the volume, from its root) names.
pub(crate) fn image_lookup(vol: &dxfs::Volume, p: &Path) -> dxfs::Result<dxfs::Attr> {
    image_names(p).into_iter().try_fold(vol.getattr(vol.root())?, |dir, n| vol.lookup(dir.ino, n))
}

/// The directory holding `p` (inside the volume, from its root) and `p`'s last name.
pub(crate) fn image_parent(vol: &dxfs::Volume, p: &Path) -> Option<(u64, Vec<u8>)> {
    let mut names = image_names(p);
    let last = names.pop()?.to_vec();
    let dir = names.into_iter().try_fold(vol.root(), |dir, n| vol.lookup(dir, n).map(|a| a.ino)).ok()?;
    Some((dir, last))
}

pub(crate) fn fail(msg: impl std::fmt::Display, code: i32) -> i32 {
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
        Cmd::Mkfs(a) => mkfs::run(a),
        Cmd::Fsck(a) => fsck::run(a),
        Cmd::Info(a) => info::run(a),
        Cmd::Mount(a) => mount::run(a, &raw),
        Cmd::Stats(a) => stats::run(a),
        Cmd::Sync(a) => sync::run(a),
        Cmd::Resize(a) => resize::run(a),
        Cmd::Trim(a) => trim::run(a),
        Cmd::Rm(a) => rm::run(a),
        Cmd::Du(a) => du::run(a),
        Cmd::Quota(a) => quota::run(a),
        Cmd::Cp(a) => cp::run(a),
        Cmd::Import(a) => import::run(a),
        Cmd::Debug(c) => debug::run(c),
        Cmd::Export(a) => export::run(a),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    /// clap's own checks of the command line's definition (unique flags and the like),
    /// which otherwise run only in debug builds, at the first use of a subcommand.
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }

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
