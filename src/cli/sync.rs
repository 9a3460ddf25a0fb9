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
    let paths = if a.paths.is_empty() { dxfs_mounts() } else { a.paths };
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

/// Mount points of type fuse.dxfs, from /proc/self/mountinfo (field 5 is the mount
/// point, the field after " - " the type).
fn dxfs_mounts() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == "fuse.dxfs").then(|| unescape(point))
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

#[cfg(test)]
mod tests {
    #[test]
    fn mountinfo_escapes() {
        assert_eq!(super::unescape("/mnt/a\\040b"), std::path::PathBuf::from("/mnt/a b"));
        assert_eq!(super::unescape("/plain"), std::path::PathBuf::from("/plain"));
        assert_eq!(super::unescape("/x\\134y"), std::path::PathBuf::from("/x\\y"));
    }
}
