//! `dxfs du [-s] [-h] [--apparent-size] PATH…`: disk usage as du(1) prints it. On a dxfs
//! mount the daemon sums each directory's entries in steps of thousands
//! (`dxfs::fuse::control`), so a tree costs a few requests per directory instead of a
//! stat per file; elsewhere entries are stat'ed one by one. With `--image` the volume
//! is read through the library (`Volume::sum_step`), unmounted. Files with several
//! links count once, as du counts them.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use dxfs::fuse::control::{self, StepRequest};
use dxfs::Volume;

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
    /// The paths are inside this unmounted volume (image file, device or nbd:// URI),
    /// from its root; read through the library, as root.
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// What to measure (default: the current directory).
    paths: Vec<PathBuf>,
}

/// A file with several links or a subdirectory (with its inode, in an image), met in
/// listing order.
enum Next {
    Linked { ino: u64, blocks: u64, bytes: u64 },
    Dir(PathBuf, Option<u64>),
}

/// What a step of summing a directory found, from the daemon or the library.
struct Step {
    next: u64,
    done: bool,
    blocks: u64,
    bytes: u64,
    unreadable: Vec<Vec<u8>>,
    /// Inode, st_blocks, st_size, subdirectories listed before it.
    linked: Vec<(u64, u64, u64, u32)>,
    subdirs: Vec<(Vec<u8>, Option<u64>)>,
}

/// What `path` is, as du needs it.
struct Meta {
    dir: bool,
    nlink: u64,
    ino: u64,
    blocks: u64,
    size: u64,
}

/// Entries the daemon looks at per step.
const STEP_ENTRIES: u32 = 4096;

struct Walk<'a> {
    a: &'a DuArgs,
    /// An unmounted volume the paths are in (`--image`).
    vol: Option<&'a Volume>,
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
    let vol = match &a.image {
        Some(image) => match super::open_image(image, true) {
            Ok(v) => Some(v),
            Err(code) => return code,
        },
        None => None,
    };
    let mut w = Walk { a: &a, vol: vol.as_ref(), seen: HashSet::new(), ok: true };
    for p in &a.paths {
        let ino = match w.vol {
            Some(v) => match super::image_lookup(v, p) {
                Ok(at) => Some(at.ino),
                Err(e) => {
                    w.failed("cannot access", p, e);
                    continue;
                }
            },
            None => None,
        };
        w.path(p, ino, true);
    }
    i32::from(!w.ok)
}

impl Walk<'_> {
    fn failed(&mut self, what: &str, path: &Path, e: impl std::fmt::Display) {
        eprintln!("dxfs du: {what} '{}': {e}", path.display());
        self.ok = false;
    }

    /// `path`'s attributes (`ino`'s, in an image).
    fn meta(&self, path: &Path, ino: Option<u64>) -> Result<Meta, String> {
        match (self.vol, ino) {
            (Some(v), Some(ino)) => v
                .getattr(ino)
                .map(|a| Meta {
                    dir: a.kind == dxfs::FileType::Directory,
                    nlink: u64::from(a.nlink),
                    ino,
                    blocks: a.blocks,
                    size: a.size,
                })
                .map_err(|e| e.to_string()),
            _ => std::fs::symlink_metadata(path)
                .map(|m| Meta { dir: m.is_dir(), nlink: m.nlink(), ino: m.ino(), blocks: m.blocks(), size: m.size() })
                .map_err(|e| errno_text(&e)),
        }
    }

    /// One step of summing the directory open as `dir` (the daemon's), or `ino` (an
    /// image's). None: not a dxfs mount.
    fn step(&self, dir: Option<&std::fs::File>, ino: Option<u64>, from: u64) -> Option<Result<Step, String>> {
        if let (Some(v), Some(ino)) = (self.vol, ino) {
            let root = dxfs::Caller { uid: 0, gid: 0, groups: Vec::new() };
            let r = v.sum_step(ino, &root, from, STEP_ENTRIES as usize, usize::MAX);
            return Some(r.map_err(|e| e.to_string()).map(|r| Step {
                next: r.next,
                done: r.done,
                blocks: r.blocks,
                bytes: r.bytes,
                unreadable: r.unreadable,
                linked: r.linked,
                subdirs: r.subdirs.into_iter().map(|(n, i)| (n, Some(i))).collect(),
            }));
        }
        match control::sum_step(dir?.as_fd(), StepRequest { from, max: STEP_ENTRIES }) {
            Ok(r) => Some(Ok(Step {
                next: r.next,
                done: r.done,
                blocks: r.blocks,
                bytes: r.bytes,
                unreadable: r.unreadable,
                linked: r.linked,
                subdirs: r.subdirs.into_iter().map(|n| (n, None)).collect(),
            })),
            Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => None,
            Err(e) => Some(Err(errno_text(&e))),
        }
    }

    fn print(&self, s: Size, path: &Path) {
        let bytes = if self.a.apparent_size { s.apparent } else { s.allocated };
        let shown = if self.a.human { human(bytes) } else { bytes.div_ceil(1024).to_string() };
        println!("{shown}\t{}", path.display());
    }

    /// The size of `path` (inode `ino` in an image) and everything under it; printed
    /// for a directory (every one, or only the top with -s) and for a top-level file.
    fn path(&mut self, path: &Path, ino: Option<u64>, top: bool) -> Size {
        let mut total = Size::default();
        let meta = match self.meta(path, ino) {
            Ok(m) => m,
            Err(e) => {
                self.failed("cannot access", path, e);
                return total;
            }
        };
        if meta.nlink > 1 && !meta.dir && !self.seen.insert(meta.ino) {
            return total;
        }
        total.add(meta.blocks, meta.size);
        if meta.dir {
            let below = self.dir(path, ino);
            total.add(below.allocated / 512, below.apparent);
            if top || !self.a.summarize {
                self.print(total, path);
            }
        } else if top {
            self.print(total, path);
        }
        total
    }

    /// What lies under directory `path` (`ino`, in an image), summed by the daemon when
    /// it serves it, or by the library.
    fn dir(&mut self, path: &Path, ino: Option<u64>) -> Size {
        let mut total = Size::default();
        let dir = if self.vol.is_some() {
            None
        } else {
            match open_dir(path) {
                Ok(d) => Some(d),
                Err(e) => {
                    self.failed("cannot read directory", path, errno_text(&e));
                    return total;
                }
            }
        };
        // What comes after the one-link files, in listing order: du counts a file with
        // several names under the first it meets, descending into each subdirectory as
        // it meets it.
        let mut next: Vec<Next> = Vec::new();
        let mut from = 0;
        loop {
            match self.step(dir.as_ref(), ino, from) {
                Some(Ok(r)) => {
                    total.add(r.blocks, r.bytes);
                    for n in r.unreadable {
                        let e = io::Error::from_raw_os_error(libc::EIO);
                        self.failed("cannot access", &path.join(OsStr::from_bytes(&n)), errno_text(&e));
                    }
                    let mut linked = r.linked.into_iter().peekable();
                    for (k, (name, sub)) in r.subdirs.into_iter().enumerate() {
                        while let Some((ino, blocks, bytes, _)) = linked.next_if(|l| l.3 as usize <= k) {
                            next.push(Next::Linked { ino, blocks, bytes });
                        }
                        next.push(Next::Dir(path.join(OsStr::from_bytes(&name)), sub));
                    }
                    next.extend(linked.map(|(ino, blocks, bytes, _)| Next::Linked { ino, blocks, bytes }));
                    from = r.next;
                    if r.done {
                        break;
                    }
                }
                // Not a dxfs mount: stat each entry.
                None => return self.by_entries(path, total),
                Some(Err(e)) => {
                    self.failed("cannot read directory", path, e);
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
                Next::Dir(sub, ino) => {
                    let s = self.path(&sub, ino, false);
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
                self.failed("cannot read directory", path, errno_text(&e));
                return total;
            }
        };
        let names: Vec<_> = list.filter_map(|e| e.ok().map(|e| e.file_name())).collect();
        for n in names {
            let s = self.path(&path.join(n), None, false);
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
