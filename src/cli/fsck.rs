//! `dxfs fsck` (also `fsck.dxfs`): check and repair a volume.

use std::path::PathBuf;

use dxfs::block::{is_nbd_uri, open_device, FileDevice};

use super::fail;

#[derive(clap::Args)]
pub struct FsckArgs {
    /// Image file, block device, or NBD export (nbd://..., nbd+unix://...).
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
    /// When the newest commit record is damaged, go back to the newest readable delta
    /// (what was committed after it is lost); without it such a volume is only reported.
    #[arg(long)]
    rollback: bool,
}

pub fn run(a: FsckArgs) -> i32 {
    // A repairing fsck opens read-write, which a mounted volume's lock refuses; a
    // read-only check runs, but what it reads may be behind the mount's memory.
    let spec = a.image.to_string_lossy();
    if !is_nbd_uri(&spec) {
        super::wait_for_a_closing_holder(&a.image);
    }
    let locked = a.no_change && !is_nbd_uri(&spec) && FileDevice::in_use(&a.image);
    let dev = match open_device(&spec, a.no_change) {
        Ok(d) => d,
        Err(e @ dxfs::Error::Busy(_)) => {
            return fail(format!("{e}; unmount it first (or check it read-only with -n)"), 8)
        }
        Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
    };
    if is_nbd_uri(&spec) && !a.no_change {
        super::wait_for_a_closing_mark(&spec, &*dev);
    }
    let bar = super::spinner();
    let mut progress = |n: u64| bar.set_message(format!("checked {n} inodes"));
    let opts = dxfs::fsck::CheckOptions { repair: !a.no_change, rollback: a.rollback };
    let r = dxfs::fsck::check_with(dev.clone(), &opts, &mut progress);
    bar.finish_and_clear();
    let r = match r {
        Ok(r) => r,
        Err(e @ dxfs::Error::Busy(_)) => {
            return fail(format!("{}: {e}; or check it read-only with -n", a.image.display()), 8)
        }
        Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
    };
    // The mount mark's warning names the holder; the image's lock only says "in use".
    if locked && !r.warnings.iter().any(|w| w.contains("in use by")) {
        eprintln!(
            "dxfs: warning: {} is in use (mounted?): checking what is on disk, which may lag behind",
            a.image.display()
        );
    }
    for w in &r.warnings {
        eprintln!("dxfs: warning: {w}");
    }
    let _ = a.yes;
    for f in &r.fixed {
        println!("fixed: {f}");
    }
    for e in &r.errors {
        println!("error: {e}");
    }
    if r.exit_code() <= 1 && !locked {
        // Checked whole: the next read-write open need not walk it again.
        super::known::record_checked(&spec, &*dev);
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
