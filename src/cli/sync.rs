//! `dxfs sync`: commit mounted volumes and make them durable. `sync(1)` and `syncfs(2)`
//! never reach a FUSE daemon (the kernel sends SYNCFS only to virtiofs), but `fsync` does,
//! and an fsync of any file or directory of a dxfs mount commits the whole volume (deltas
//! are atomic): this command fsyncs each mount's root directory.

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
    for p in paths {
        // Directories open read-only; fsync on that descriptor reaches the daemon as
        // FSYNCDIR (or FSYNC for a file) and returns once the delta is durable.
        match File::open(&p).and_then(|f| f.sync_all()) {
            Ok(()) => {}
            Err(e) => code = fail(format!("{}: {e}", p.display()), 1),
        }
    }
    code
}
