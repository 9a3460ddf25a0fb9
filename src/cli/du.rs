//! `dxfs du [-s] [-h] [--apparent-size] PATH…`: disk usage as du(1) prints it. On a dxfs
//! mount the daemon sums each directory's entries in steps of thousands
//! (`dxfs::fuse::control`), so a tree costs a few requests per directory instead of a
//! stat per file; elsewhere entries are stat'ed one by one. Files with several links
//! count once, as du counts them.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use dxfs::fuse::control::{self, StepRequest};

use super::{errno_text, open_dir};

#[derive(clap::Args)]
// `-h` is du's human-readable sizes, so help is `--help` only, as in du.
#[command(disable_help_flag = true)]
pub struct DuArgs {
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
    /// Print only a total for each path.
    #[arg(short, long)]
    summarize: bool,
    /// Sizes in powers of 1024 with a unit (4.0K, 12M).
    #[arg(short = 'h', long = "human-readable")]
    human: bool,
    /// Apparent sizes (bytes in the files) instead of the space allocated.
    #[arg(long)]
    apparent_size: bool,
    /// What to measure (default: the current directory).
    paths: Vec<PathBuf>,
}

/// A file with several links or a subdirectory, met in listing order.
enum Next {
    Linked { ino: u64, blocks: u64, bytes: u64 },
    Dir(PathBuf),
}

/// Entries the daemon looks at per step.
const STEP_ENTRIES: u32 = 4096;

struct Walk<'a> {
    a: &'a DuArgs,
    /// Inodes with several links already counted.
    seen: HashSet<u64>,
    ok: bool,
}

/// A size as du adds it: allocated bytes or apparent bytes.
#[derive(Clone, Copy, Default)]
struct Size {
    allocated: u64,
    apparent: u64,
}

impl Size {
    fn add(&mut self, blocks: u64, bytes: u64) {
        self.allocated = self.allocated.saturating_add(blocks.saturating_mul(512));
        self.apparent = self.apparent.saturating_add(bytes);
    }
}

pub fn run(mut a: DuArgs) -> i32 {
    if a.paths.is_empty() {
        a.paths.push(PathBuf::from("."));
    }
    let mut w = Walk { a: &a, seen: HashSet::new(), ok: true };
    for p in &a.paths {
        w.path(p, true);
    }
    i32::from(!w.ok)
}

impl Walk<'_> {
    fn failed(&mut self, what: &str, path: &Path, e: &io::Error) {
        eprintln!("dxfs du: {what} '{}': {}", path.display(), errno_text(e));
        self.ok = false;
    }

    fn print(&self, s: Size, path: &Path) {
        let bytes = if self.a.apparent_size { s.apparent } else { s.allocated };
        let shown = if self.a.human { human(bytes) } else { bytes.div_ceil(1024).to_string() };
        println!("{shown}\t{}", path.display());
    }

    /// The size of `path` and everything under it; printed for a directory (every one,
    /// or only the top with -s) and for a top-level file.
    fn path(&mut self, path: &Path, top: bool) -> Size {
        let mut total = Size::default();
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) => {
                self.failed("cannot access", path, &e);
                return total;
            }
        };
        if meta.nlink() > 1 && !meta.is_dir() && !self.seen.insert(meta.ino()) {
            return total;
        }
        total.add(meta.blocks(), meta.size());
        if meta.is_dir() {
            let below = self.dir(path);
            total.add(below.allocated / 512, below.apparent);
            if top || !self.a.summarize {
                self.print(total, path);
            }
        } else if top {
            self.print(total, path);
        }
        total
    }

    /// What lies under directory `path`, summed by the daemon when it serves it.
    fn dir(&mut self, path: &Path) -> Size {
        let mut total = Size::default();
        let dir = match open_dir(path) {
            Ok(d) => d,
            Err(e) => {
                self.failed("cannot read directory", path, &e);
                return total;
            }
        };
        // What comes after the one-link files, in listing order: du counts a file with
        // several names under the first it meets, descending into each subdirectory as
        // it meets it.
        let mut next: Vec<Next> = Vec::new();
        let mut from = 0;
        loop {
            match control::sum_step(dir.as_fd(), StepRequest { from, max: STEP_ENTRIES }) {
                Ok(r) => {
                    total.add(r.blocks, r.bytes);
                    for n in r.unreadable {
                        let e = io::Error::from_raw_os_error(libc::EIO);
                        self.failed("cannot access", &path.join(OsStr::from_bytes(&n)), &e);
                    }
                    let mut linked = r.linked.into_iter().peekable();
                    for (k, name) in r.subdirs.into_iter().enumerate() {
                        while let Some((ino, blocks, bytes, _)) = linked.next_if(|l| l.3 as usize <= k) {
                            next.push(Next::Linked { ino, blocks, bytes });
                        }
                        next.push(Next::Dir(path.join(OsStr::from_bytes(&name))));
                    }
                    next.extend(linked.map(|(ino, blocks, bytes, _)| Next::Linked { ino, blocks, bytes }));
                    from = r.next;
                    if r.done {
                        break;
                    }
                }
                // Not a dxfs mount: stat each entry.
                Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => return self.by_entries(path, total),
                Err(e) => {
                    self.failed("cannot read directory", path, &e);
                    return total;
                }
            }
        }
        drop(dir);
        for n in next {
            match n {
                Next::Linked { ino, blocks, bytes } => {
                    if self.seen.insert(ino) {
                        total.add(blocks, bytes);
                    }
                }
                Next::Dir(sub) => {
                    let s = self.path(&sub, false);
                    total.add(s.allocated / 512, s.apparent);
                }
            }
        }
        total
    }

    fn by_entries(&mut self, path: &Path, mut total: Size) -> Size {
        let list = match std::fs::read_dir(path) {
            Ok(l) => l,
            Err(e) => {
                self.failed("cannot read directory", path, &e);
                return total;
            }
        };
        let names: Vec<_> = list.filter_map(|e| e.ok().map(|e| e.file_name())).collect();
        for n in names {
            let s = self.path(&path.join(n), false);
            total.add(s.allocated / 512, s.apparent);
        }
        total
    }
}

/// A size as `du -h` prints it: bytes below 1 KiB, else powers of 1024 rounded up, with
/// one decimal below 10.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];
    if bytes < 1024 {
        return bytes.to_string();
    }
    let mut e = 0;
    let mut v = bytes as f64;
    while v >= 1024.0 && e < UNITS.len() - 1 {
        v /= 1024.0;
        e += 1;
    }
    let tenths = (v * 10.0).ceil() / 10.0;
    if tenths < 10.0 {
        return format!("{tenths:.1}{}", UNITS[e]);
    }
    let whole = v.ceil();
    if whole >= 1024.0 && e < UNITS.len() - 1 {
        return format!("1.0{}", UNITS[e + 1]);
    }
    format!("{whole}{}", UNITS[e])
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn human_sizes_as_du_prints_them() {
        assert_eq!(human(0), "0");
        assert_eq!(human(1023), "1023");
        assert_eq!(human(1024), "1.0K");
        assert_eq!(human(4096), "4.0K");
        assert_eq!(human(1025), "1.1K");
        assert_eq!(human(10 * 1024), "10K");
        assert_eq!(human(10 * 1024 + 1), "11K");
        assert_eq!(human((1 << 20) - 1), "1.0M");
        assert_eq!(human(3 << 30), "3.0G");
    }
}
