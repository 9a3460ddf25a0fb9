//! `dxfs du [-s] [-h] [--apparent-size] PATH…`: disk usage as du(1) prints it. On a dxfs
//! mount the daemon sums each directory's entries in steps of thousands
//! (`dxfs::fuse::control`), so a tree costs a few requests per directory instead of a
//! stat per file; elsewhere entries are stat'ed one by one. With `--image` the volume
//! is read through the library (`Volume::sum_step`), unmounted. Files with several
//! links count once, as du counts them. `-s` of a directory on a volume that keeps
//! recursive statistics reads them instead of walking (`Summer::read_counters`).

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

/// Where the directories are summed: the daemon of a mount, or an image's library.
#[derive(Clone, Copy)]
struct Summer<'a> {
    /// An unmounted volume the paths are in (`--image`).
    vol: Option<&'a Volume>,
}

/// All of one directory's steps: its one-link files' size, then what comes after them
/// in listing order.
struct DirSum {
    files: Size,
    unreadable: Vec<Vec<u8>>,
    next: Vec<Next>,
}

/// How summing a directory ended.
enum Summed {
    Done(DirSum),
    /// Not a dxfs mount: stat each entry.
    NotDxfs,
    /// (what failed, why)
    Failed(&'static str, String),
}

/// Directories summed ahead of the walk by a second thread, so that two directories'
/// steps are served at once (the daemon serves each on the CPU it comes from, and on
/// slow storage their reads overlap). The walk itself stays in du's order: a file with
/// several links is counted where du meets it first.
#[derive(Default)]
struct Ahead {
    state: parking_lot::Mutex<AheadState>,
    changed: parking_lot::Condvar,
}

#[derive(Default)]
struct AheadState {
    /// Directories met and not yet summed, the newest last.
    queue: Vec<(PathBuf, Option<u64>)>,
    /// Directories either thread took.
    taken: std::collections::HashMap<PathBuf, Taken>,
    finished: bool,
}

enum Taken {
    /// Being summed.
    Busy,
    /// Summed by the second thread, for the walk to take.
    Ready(Summed),
    /// The walk has it.
    Walked,
}

struct Walk<'a> {
    a: &'a DuArgs,
    summer: Summer<'a>,
    ahead: &'a Ahead,
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
    let summer = Summer { vol: vol.as_ref() };
    let ahead = Ahead::default();
    let ok = std::thread::scope(|s| {
        // No thread to be had: the walk sums every directory itself.
        let _ = std::thread::Builder::new().spawn_scoped(s, || summer.sum_ahead(&ahead));
        let mut w = Walk { a: &a, summer, ahead: &ahead, seen: HashSet::new(), ok: true };
        for p in &a.paths {
            let ino = match summer.vol {
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
        ahead.state.lock().finished = true;
        ahead.changed.notify_all();
        w.ok
    });
    i32::from(!ok)
}

impl Summer<'_> {
    /// The second thread: sum the newest directory met and not yet taken, until the
    /// walk ends.
    fn sum_ahead(self, ahead: &Ahead) {
        let mut st = ahead.state.lock();
        loop {
            let Some((path, ino)) = st.queue.pop() else {
                if st.finished {
                    return;
                }
                ahead.changed.wait(&mut st);
                continue;
            };
            if st.taken.contains_key(&path) {
                continue;
            }
            st.taken.insert(path.clone(), Taken::Busy);
            drop(st);
            let r = self.sum_dir(&path, ino);
            st = ahead.state.lock();
            st.taken.insert(path, Taken::Ready(r));
            ahead.changed.notify_all();
        }
    }

    /// What lies below directory `path` (`ino`, in an image), read from its recursive
    /// statistics (FORMAT.md §6.2) when they are exactly what du sums: on a volume that
    /// keeps them, with no entry below naming a file of several links (du counts such a
    /// file where it meets it first; the counters, in the one directory it is counted
    /// in). `None`: walk.
    fn read_counters(&self, path: &Path, ino: Option<u64>) -> Option<Size> {
        let (allocated, apparent, hardlinks) = match (self.vol, ino) {
            (Some(v), Some(ino)) => {
                let r = v.rstat(ino).ok()??;
                (r.blocks.saturating_mul(dxfs::BLOCK_SIZE as u64), r.bytes, r.hardlinks)
            }
            _ => {
                let get = |n: &str| -> Option<u64> {
                    let v = xattr::get(path, format!("{}{n}", dxfs::RSTAT_XATTR_PREFIX)).ok()??;
                    std::str::from_utf8(&v).ok()?.parse().ok()
                };
                (get("rallocated")?, get("rbytes")?, get("rhardlinks")?)
            }
        };
        (hardlinks == 0).then_some(Size { allocated, apparent })
    }

    /// Every step of directory `path` (`ino`, in an image).
    fn sum_dir(&self, path: &Path, ino: Option<u64>) -> Summed {
        let dir = if self.vol.is_some() {
            None
        } else {
            match open_dir(path) {
                Ok(d) => Some(d),
                Err(e) => return Summed::Failed("cannot read directory", errno_text(&e)),
            }
        };
        let mut sum = DirSum { files: Size::default(), unreadable: Vec::new(), next: Vec::new() };
        let mut from = 0;
        loop {
            match self.step(dir.as_ref(), ino, from) {
                Some(Ok(r)) => {
                    sum.files.add(r.blocks, r.bytes);
                    sum.unreadable.extend(r.unreadable);
                    let mut linked = r.linked.into_iter().peekable();
                    for (k, (name, sub)) in r.subdirs.into_iter().enumerate() {
                        while let Some((ino, blocks, bytes, _)) = linked.next_if(|l| l.3 as usize <= k) {
                            sum.next.push(Next::Linked { ino, blocks, bytes });
                        }
                        sum.next.push(Next::Dir(path.join(OsStr::from_bytes(&name)), sub));
                    }
                    sum.next.extend(linked.map(|(ino, blocks, bytes, _)| Next::Linked { ino, blocks, bytes }));
                    from = r.next;
                    if r.done {
                        return Summed::Done(sum);
                    }
                }
                None => return Summed::NotDxfs,
                Some(Err(e)) => return Summed::Failed("cannot read directory", e),
            }
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
}

impl Walk<'_> {
    fn print(&self, s: Size, path: &Path) {
        let bytes = if self.a.apparent_size { s.apparent } else { s.allocated };
        let shown = if self.a.human { human(bytes) } else { bytes.div_ceil(1024).to_string() };
        println!("{shown}\t{}", path.display());
    }

    fn failed(&mut self, what: &str, path: &Path, e: impl std::fmt::Display) {
        eprintln!("dxfs du: {what} '{}': {e}", path.display());
        self.ok = false;
    }

    /// `path`'s attributes (`ino`'s, in an image).
    fn meta(&self, path: &Path, ino: Option<u64>) -> Result<Meta, String> {
        match (self.summer.vol, ino) {
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
            let counted = if top && self.a.summarize { self.summer.read_counters(path, ino) } else { None };
            let below = match counted {
                Some(s) => s,
                None => self.dir(path, ino),
            };
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
        let sum = match self.summed(path, ino) {
            Summed::Done(sum) => sum,
            Summed::NotDxfs => return self.by_entries(path, Size::default()),
            Summed::Failed(what, e) => {
                self.failed(what, path, e);
                return Size::default();
            }
        };
        for n in &sum.unreadable {
            let e = io::Error::from_raw_os_error(libc::EIO);
            self.failed("cannot access", &path.join(OsStr::from_bytes(n)), errno_text(&e));
        }
        // The subdirectories met, for the second thread to sum ahead: the walk takes
        // them first to last, that thread last to first, and they meet in the middle.
        let subdirs: Vec<_> = sum
            .next
            .iter()
            .filter_map(|n| match n {
                Next::Dir(p, i) => Some((p.clone(), *i)),
                Next::Linked { .. } => None,
            })
            .collect();
        if subdirs.len() > 1 {
            self.ahead.state.lock().queue.extend(subdirs.into_iter().skip(1));
            self.ahead.changed.notify_all();
        }
        // du counts a file with several names under the first it meets, descending
        // into each subdirectory as it meets it.
        let mut total = sum.files;
        for n in sum.next {
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

    /// Directory `path` summed: by the second thread if it took it (waiting for it to
    /// finish), else here.
    fn summed(&self, path: &Path, ino: Option<u64>) -> Summed {
        let mut st = self.ahead.state.lock();
        while matches!(st.taken.get(path), Some(Taken::Busy)) {
            self.ahead.changed.wait(&mut st);
        }
        if let Some(Taken::Ready(r)) = st.taken.insert(path.to_path_buf(), Taken::Walked) {
            return r;
        }
        // Taken here: the second thread passes it by.
        drop(st);
        self.summer.sum_dir(path, ino)
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
pub(super) fn human(bytes: u64) -> String {
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
