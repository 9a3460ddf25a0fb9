//! `dxfs cp -a SRC… DEST`: copy host files and trees into a directory as `cp -a` does.
//! This command reads the host files itself, as the calling user; on a dxfs mount it
//! sends the entries of each directory to the daemon in batches (`batch.rs`), with the
//! contents of small files, so a tree costs a request per batch instead of several per
//! file. Directories get their attributes after their contents. Elsewhere it copies
//! entry by entry with system calls.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, Metadata};
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::batch::{Item, Sender, ACCESS_ACL, DEFAULT_ACL};
use super::errno_text;

#[derive(clap::Args)]
pub struct CpArgs {
    /// Archive: copy trees keeping symlinks, hard links, modes, owners (as far as the
    /// caller may set them), times and xattrs, POSIX ACLs included. The only mode, as
    /// yet: required.
    #[arg(short = 'a', long)]
    archive: bool,
    /// The destination is inside this unmounted volume (image file, device or nbd://
    /// URI), from its root; the copy is made through the library, as root.
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// What to copy, then where: an existing directory receives each source under its
    /// own name; a single source may also name a new entry.
    #[arg(required = true, num_args = 2..)]
    paths: Vec<PathBuf>,
}

struct Copier {
    s: Sender,
    /// (device, inode) of a source with several links → where its first copy went.
    seen: HashMap<(u64, u64), PathBuf>,
    interrupt: Option<nix::sys::signalfd::SignalFd>,
    stopped: bool,
}

pub fn run(a: CpArgs) -> i32 {
    if !a.archive {
        return super::fail("cp: only archive copies (-a) are made", 1);
    }
    let (dest, srcs) = a.paths.split_last().expect("two paths at least");
    if let Some(image) = &a.image {
        return in_image(image, srcs, dest);
    }
    let into = fs::metadata(dest).is_ok_and(|m| m.is_dir());
    if srcs.len() > 1 && !into {
        return super::fail(format!("cp: target '{}' is not a directory", dest.display()), 1);
    }
    // SIGINT blocked first: the sending threads inherit the mask.
    let interrupt = super::rm::catch_interrupt();
    let mut c = Copier { s: Sender::new("cp"), seen: HashMap::new(), interrupt, stopped: false };
    for src in srcs {
        let (parent, name) = if into {
            (dest.clone(), src.file_name())
        } else {
            (
                dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf(),
                dest.file_name(),
            )
        };
        let Some(name) = name else {
            c.s.failed(format!("cannot copy '{}': no name to copy it under", src.display()));
            continue;
        };
        c.copy(src, &parent, name.as_bytes());
    }
    c.s.sync();
    c.s.bar().finish_and_clear();
    if c.stopped {
        eprintln!("dxfs cp: interrupted after copying {} entries", c.s.made());
        return 130;
    }
    let (by_daemon, batches) = c.s.counts();
    tracing::debug!(made = c.s.made(), by_daemon, batches, "cp");
    i32::from(!c.s.ok())
}

/// `--image`: copy through the library into the unmounted volume `image`, as root. An
/// entry that cannot be copied is reported, and the copy goes on, as `cp -a` does.
fn in_image(image: &str, srcs: &[PathBuf], dest: &Path) -> i32 {
    let vol = match super::open_image(image, false) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let into = super::image_lookup(&vol, dest).ok().filter(|a| a.kind == dxfs::FileType::Directory).map(|a| a.ino);
    let ok = std::cell::Cell::new(true);
    let failed = |msg: String| {
        eprintln!("dxfs cp: {msg}");
        ok.set(false);
    };
    let target = match into {
        Some(dir) => Some((dir, None)),
        None if srcs.len() > 1 => None,
        None => super::image_parent(&vol, dest).map(|(dir, name)| (dir, Some(name))),
    };
    let bar = super::spinner();
    match target {
        None if srcs.len() > 1 => failed(format!("target '{}' is not a directory", dest.display())),
        None => failed(format!("cannot create '{}': No such file or directory", dest.display())),
        Some((dir, name)) => {
            for src in srcs {
                let Some(name) = name.clone().or_else(|| src.file_name().map(|n| n.as_bytes().to_vec())) else {
                    failed(format!("cannot copy '{}': no name to copy it under", src.display()));
                    continue;
                };
                let r = dxfs::tools::import::import_as(
                    &vol,
                    src,
                    dir,
                    &name,
                    &mut |s| bar.set_message(format!("{} inodes, {} MiB", s.inodes, s.bytes >> 20)),
                    &mut |e| failed(format!("cannot copy '{}': {}", e.path.display(), e.error)),
                );
                if let Err(e) = r {
                    failed(format!("cannot copy '{}': {e}", src.display()));
                }
            }
        }
    }
    bar.finish_and_clear();
    if let Err(e) = vol.close() {
        return super::fail(format!("{image}: {e}"), 8);
    }
    i32::from(!ok.get())
}

impl Copier {
    /// Whether Ctrl-C was pressed: then nothing more is copied.
    fn stop(&mut self) -> bool {
        if !self.stopped {
            self.stopped = self.interrupt.as_ref().is_some_and(|fd| matches!(fd.read_signal(), Ok(Some(_))));
        }
        self.stopped
    }

    /// Copy `src` as `name` in directory `parent`.
    fn copy(&mut self, src: &Path, parent: &Path, name: &[u8]) {
        let md = match fs::symlink_metadata(src) {
            Ok(m) => m,
            Err(e) => return self.s.failed(format!("cannot stat '{}': {}", src.display(), errno_text(&e))),
        };
        if !self.s.enter(parent) {
            return;
        }
        let dest = parent.join(OsStr::from_bytes(name));
        let inherits = self.s.inherits_acl;
        if let Some(item) = self.one(src, &md, name, &dest) {
            self.s.sync();
            self.contents(src, &dest);
            self.s.sync();
            self.finish_dir(&dest, &item, inherits);
        }
    }

    /// Copy what directory `src` holds into directory `dest`, subdirectories after the
    /// entries of each directory.
    fn contents(&mut self, src: &Path, dest: &Path) {
        let mut names: Vec<_> = match fs::read_dir(src) {
            Ok(l) => l.filter_map(|e| e.ok().map(|e| e.file_name())).collect(),
            Err(e) => return self.s.failed(format!("cannot access '{}': {}", src.display(), errno_text(&e))),
        };
        names.sort();
        // A directory whose making failed was named already.
        if fs::symlink_metadata(dest).is_err() || !self.s.enter(dest) {
            return;
        }
        let mut subdirs = Vec::new();
        for n in names {
            if self.stop() {
                return;
            }
            let path = src.join(&n);
            let md = match fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) => {
                    self.s.failed(format!("cannot stat '{}': {}", path.display(), errno_text(&e)));
                    continue;
                }
            };
            if let Some(item) = self.one(&path, &md, n.as_bytes(), &dest.join(&n)) {
                subdirs.push((n, item));
            }
        }
        let inherits = self.s.inherits_acl;
        // The subdirectories are made before they are filled.
        self.s.sync();
        for (n, item) in subdirs {
            if self.stop() {
                return;
            }
            let d = dest.join(&n);
            self.contents(&src.join(&n), &d);
            self.s.sync();
            self.finish_dir(&d, &item, inherits);
        }
    }

    /// A directory's attributes, after its contents. Made where a default ACL is
    /// inherited, it took that ACL as its own default, which `cp -a` replaces with the
    /// source's: none, if the source has none.
    fn finish_dir(&mut self, dest: &Path, item: &Item, inherited: bool) {
        self.s.finish(dest, item);
        if inherited && !item.has_xattr(DEFAULT_ACL) {
            let _ = xattr::remove(dest, DEFAULT_ACL);
        }
    }

    /// Copy one entry into the current directory as `dest`; a directory is made and
    /// returned, for its contents and then its attributes.
    fn one(&mut self, src: &Path, md: &Metadata, name: &[u8], dest: &Path) -> Option<Item> {
        let mut item = Item {
            name: name.to_vec(),
            mode: md.mode(),
            uid: md.uid(),
            gid: md.gid(),
            rdev: md.rdev(),
            atime: (md.atime(), md.atime_nsec() as u32),
            mtime: (md.mtime(), md.mtime_nsec() as u32),
            data: Vec::new(),
            xattrs: read_xattrs(src),
        };
        let ft = md.file_type();
        // What the directory's default ACL gave the new entry, cp -a replaces with the
        // source's ACL, which the mode says all of when it has none.
        if self.s.inherits_acl && !ft.is_symlink() && !item.has_xattr(ACCESS_ACL) {
            item.xattrs.push((ACCESS_ACL.as_bytes().to_vec(), minimal_acl(md.mode())));
        }
        if !ft.is_dir() && md.nlink() > 1 {
            let key = (md.dev(), md.ino());
            if let Some(first) = self.seen.get(&key).cloned() {
                // The first copy must be made before it can be linked to.
                self.s.sync();
                match fs::hard_link(&first, dest) {
                    Ok(()) => self.s.count_made(),
                    Err(e) => self.s.failed(format!(
                        "cannot create hard link '{}' to '{}': {}",
                        dest.display(),
                        first.display(),
                        errno_text(&e)
                    )),
                }
                return None;
            }
            self.seen.insert(key, dest.to_path_buf());
        }
        if ft.is_dir() {
            self.s.add(item.clone());
            return Some(item);
        }
        if ft.is_symlink() {
            match fs::read_link(src) {
                Ok(t) => item.data = t.into_os_string().into_vec(),
                Err(e) => {
                    self.s.failed(format!("cannot read symbolic link '{}': {}", src.display(), errno_text(&e)));
                    return None;
                }
            }
        } else if ft.is_file() {
            let mut f = match fs::File::open(src) {
                Ok(f) => f,
                Err(e) => {
                    self.s.failed(format!("cannot open '{}' for reading: {}", src.display(), errno_text(&e)));
                    return None;
                }
            };
            if !item.fits_with(md.len()) {
                self.s.add_large(item, &mut f);
                return None;
            }
            if let Err(e) = f.read_to_end(&mut item.data) {
                self.s.failed(format!("error reading '{}': {}", src.display(), errno_text(&e)));
                return None;
            }
        }
        self.s.add(item);
        None
    }
}

/// The access ACL that says what mode `mode` says.
fn minimal_acl(mode: u32) -> Vec<u8> {
    use dxfs::acl::{encode, Entry, GROUP_OBJ, OTHER, USER_OBJ};
    let e = |tag, shift: u32| Entry { tag, perm: ((mode >> shift) & 7) as u16, id: u32::MAX };
    encode(&[e(USER_OBJ, 6), e(GROUP_OBJ, 3), e(OTHER, 0)])
}

/// `path`'s xattrs (not followed through a symlink), as far as the caller may read them.
pub(super) fn read_xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Ok(names) = xattr::list(path) else { return Vec::new() };
    names
        .filter_map(|n| {
            let v = xattr::get(path, &n).ok()??;
            Some((n.as_bytes().to_vec(), v))
        })
        .collect()
}
