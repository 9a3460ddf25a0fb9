//! `dxfs sync`: commit mounted volumes and make them durable. `sync(1)` and `syncfs(2)`
//! never reach a FUSE daemon (the kernel sends SYNCFS only to virtiofs), but `fsync` does,
//! and an fsync of a dxfs mount's root directory commits the whole volume (an fsync of
//! anything else commits only when that has changes): this command fsyncs the root of
//! each mount, or of the mount each path given lies in.

use std::fs::File;
use std::path::PathBuf;

use super::fail;

#[derive(clap::Args)]
pub struct SyncArgs {
    /// Mount points (or any path inside a dxfs mount); all dxfs mounts when none given.
    paths: Vec<PathBuf>,
}

pub fn run(a: SyncArgs) -> i32 {
    let paths = if a.paths.is_empty() { dxfs::fuse::dxfs_mounts() } else { a.paths };
    let mut code = 0;
    let mounts = dxfs::fuse::dxfs_mounts();
    for p in paths {
        // The root of the dxfs mount the path lies in (the deepest one), else the path.
        let full = std::fs::canonicalize(&p).unwrap_or_else(|_| p.clone());
        let root = mounts.iter().filter(|m| full.starts_with(m)).max_by_key(|m| m.components().count());
        let target = root.cloned().unwrap_or_else(|| p.clone());
        // Directories open read-only; fsync on that descriptor reaches the daemon as
        // FSYNCDIR and returns once the delta is durable.
        match File::open(&target).and_then(|f| f.sync_all()) {
            Ok(()) => {}
            Err(e) => code = fail(format!("{}: {e}", p.display()), 1),
        }
    }
    code
}
