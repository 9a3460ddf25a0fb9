//! `dxfs import --tar ARCHIVE DEST`: unpack a tar archive (ustar, GNU, PAX) into a
//! directory as `tar -x --xattrs -C DEST` does for the caller: as root with the owners
//! and modes the archive records, as another user with the caller's ids and the modes
//! less the umask. On a dxfs mount the entries go to the daemon in batches (`batch.rs`),
//! small files with their contents. A name already there is replaced (a directory kept);
//! names with a `..` component are refused; directory attributes are set at the end,
//! deepest first, as tar sets them.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use dxfs::tools::import_tar::{components, pax_records, PaxRecords};
use tar::EntryType;

use super::batch::{Item, Sender};
use super::errno_text;

#[derive(clap::Args)]
pub struct ImportArgs {
    /// The archive (`-` reads standard input).
    #[arg(long, value_name = "ARCHIVE", required = true)]
    tar: PathBuf,
    /// The directory is inside this unmounted volume (image file, device or nbd://
    /// URI), from its root; unpacked through the library, as root (an entry that
    /// cannot be made is reported and the next one unpacked, as tar does).
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// The directory to unpack into (it must exist, as for `tar -C`).
    dest: PathBuf,
}

pub fn run(a: ImportArgs) -> i32 {
    let input: Box<dyn Read> = if a.tar.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        match std::fs::File::open(&a.tar) {
            Ok(f) => Box::new(std::io::BufReader::with_capacity(1 << 20, f)),
            Err(e) => return super::fail(format!("import: {}: {}", a.tar.display(), errno_text(&e)), 2),
        }
    };
    if let Some(image) = &a.image {
        return in_image(image, input, &a);
    }
    if !std::fs::metadata(&a.dest).is_ok_and(|m| m.is_dir()) {
        return super::fail(format!("import: '{}' is not a directory", a.dest.display()), 2);
    }
    let root = nix::unistd::geteuid().is_root();
    let umask = {
        let m = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        nix::sys::stat::umask(m);
        m.bits()
    };
    // SIGINT blocked first: the sending threads inherit the mask.
    let interrupt = super::rm::catch_interrupt();
    let mut s = Sender::new("import");
    let mut dirs: Vec<(PathBuf, Item)> = Vec::new();
    let mut seen = HashSet::from([a.dest.clone()]);
    let mut archive = tar::Archive::new(input);
    let entries = match archive.entries() {
        Ok(e) => e,
        Err(e) => return super::fail(format!("import: {}: {e}", a.tar.display()), 2),
    };
    let mut stopped = false;
    for entry in entries {
        if interrupt.as_ref().is_some_and(|fd| matches!(fd.read_signal(), Ok(Some(_)))) {
            stopped = true;
            break;
        }
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) => {
                s.failed(format!("{}: {e}", a.tar.display()));
                break;
            }
        };
        if let Err(msg) = unpack(&mut s, &mut entry, &a.dest, (root, umask), (&mut dirs, &mut seen)) {
            s.failed(msg);
        }
    }
    s.sync();
    // Directory attributes last, deepest first, so nothing made in them moves them.
    for (path, item) in dirs.iter().rev() {
        s.finish(path, item);
    }
    s.bar().finish_and_clear();
    if stopped {
        eprintln!("dxfs import: interrupted after {} entries", s.made());
        return 130;
    }
    let (by_daemon, batches) = s.counts();
    tracing::debug!(made = s.made(), by_daemon, batches, "import");
    i32::from(!s.ok()) * 2
}

/// `--image`: unpack through the library into the unmounted volume `image`, as root.
fn in_image(image: &str, input: Box<dyn Read>, a: &ImportArgs) -> i32 {
    let vol = match super::open_image(image, false) {
        Ok(v) => v,
        Err(code) => return code,
    };
    let mut code = match super::image_lookup(&vol, &a.dest) {
        Ok(d) if d.kind == dxfs::FileType::Directory => {
            let bar = super::spinner();
            let mut failed = false;
            let r = dxfs::tools::import_tar::import_tar_into(
                &vol,
                input,
                d.ino,
                &mut |s| bar.set_message(format!("{} inodes, {} MiB", s.inodes, s.bytes >> 20)),
                &mut |e| {
                    // As tar: the entry is reported, the next one unpacked, and the exit is 2.
                    eprintln!("dxfs import: {e}");
                    failed = true;
                },
            );
            bar.finish_and_clear();
            r.map_or_else(|e| super::fail(format!("import: {e}"), 2), |_| i32::from(failed) * 2)
        }
        _ => super::fail(format!("import: '{}' is not a directory in {image}", a.dest.display()), 2),
    };
    if let Err(e) = vol.close() {
        code = super::fail(format!("{image}: {e}"), 8);
    }
    code
}

/// Unpack one archive entry under `dest`.
fn unpack<R: Read>(
    s: &mut Sender,
    entry: &mut tar::Entry<'_, R>,
    dest: &Path,
    (root, umask): (bool, u32),
    (dirs, seen): (&mut Vec<(PathBuf, Item)>, &mut HashSet<PathBuf>),
) -> Result<(), String> {
    let raw = entry.path_bytes().into_owned();
    let shown = String::from_utf8_lossy(&raw).into_owned();
    let parts = components(&raw).map_err(|_| format!("{shown}: a name with a '..' component is refused"))?;
    let h = entry.header().clone();
    let kind = h.entry_type();
    let bad = |e: std::io::Error| format!("{shown}: {e}");
    let type_bits = match kind {
        EntryType::Directory => libc::S_IFDIR,
        EntryType::Regular | EntryType::Continuous => libc::S_IFREG,
        EntryType::Symlink => libc::S_IFLNK,
        EntryType::Char => libc::S_IFCHR,
        EntryType::Block => libc::S_IFBLK,
        EntryType::Fifo => libc::S_IFIFO,
        EntryType::Link => 0,
        // Headers the tar crate reads for us (long names, PAX records) never reach here.
        other => return Err(format!("{shown}: entry type {:?} is not unpacked", other.as_byte() as char)),
    };
    let mut perm = h.mode().map_err(bad)? & 0o7777;
    if !root {
        // As tar -x for a user (--no-same-permissions): the umask applies, and the
        // setuid, setgid and sticky bits are not restored.
        perm &= 0o777 & !umask;
    }
    let (mut uid, mut gid) = (u32::MAX, u32::MAX);
    if root {
        uid = u32::try_from(h.uid().map_err(bad)?).map_err(|_| format!("{shown}: uid out of range"))?;
        gid = u32::try_from(h.gid().map_err(bad)?).map_err(|_| format!("{shown}: gid out of range"))?;
    }
    let mtime = (i64::try_from(h.mtime().map_err(bad)?).map_err(|_| format!("{shown}: mtime out of range"))?, 0);
    let PaxRecords { xattrs, mtime, atime } = pax_records(entry, mtime).map_err(bad)?;
    let Some((name, parents)) = parts.split_last() else {
        // The archive's own root (`./`): the destination takes its attributes.
        let item = Item {
            mode: libc::S_IFDIR | perm,
            uid,
            gid,
            atime: atime.unwrap_or(mtime),
            mtime,
            xattrs,
            ..Item::default()
        };
        dirs.push((dest.to_path_buf(), item));
        return Ok(());
    };
    let parent = parents.iter().fold(dest.to_path_buf(), |p, c| p.join(OsStr::from_bytes(c)));
    if !seen.contains(&parent) {
        // A directory the archive named may still be on its way; one it named only as
        // a parent is made as tar makes it.
        s.sync();
        if std::fs::symlink_metadata(&parent).is_err() {
            std::fs::create_dir_all(&parent).map_err(|e| format!("{}: {}", parent.display(), errno_text(&e)))?;
        }
        seen.insert(parent.clone());
    }
    if !s.enter(&parent) {
        return Ok(());
    }
    let path = parent.join(OsStr::from_bytes(name));
    if kind == EntryType::Link {
        let target = entry.link_name_bytes().ok_or_else(|| format!("{shown}: a hard link without a target"))?;
        let tparts = components(&target).map_err(|_| format!("{shown}: a link target with '..' is refused"))?;
        let target = tparts.iter().fold(dest.to_path_buf(), |p, c| p.join(OsStr::from_bytes(c)));
        s.sync();
        if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_dir()) {
            let _ = std::fs::remove_file(&path);
        }
        return match std::fs::hard_link(&target, &path) {
            Ok(()) => {
                s.count_made();
                Ok(())
            }
            Err(e) => Err(format!("{shown}: cannot hard link to '{}': {}", target.display(), errno_text(&e))),
        };
    }
    let rdev = match (h.device_major(), h.device_minor()) {
        (Ok(Some(ma)), Ok(Some(mi))) => libc::makedev(ma, mi),
        _ => 0,
    };
    let mut item = Item {
        name: name.to_vec(),
        mode: type_bits | perm,
        uid,
        gid,
        rdev,
        atime: atime.unwrap_or(mtime),
        mtime,
        data: Vec::new(),
        xattrs,
    };
    match kind {
        EntryType::Directory => {
            s.add(item.clone());
            dirs.push((path, item));
        }
        EntryType::Symlink => {
            item.data = entry.link_name_bytes().map(|t| t.into_owned()).unwrap_or_default();
            s.add(item);
        }
        EntryType::Regular | EntryType::Continuous => {
            let size = entry.size();
            if item.fits_with(size) {
                entry.read_to_end(&mut item.data).map_err(bad)?;
                s.add(item);
            } else {
                s.add_large(item, entry);
            }
        }
        _ => s.add(item),
    }
    Ok(())
}
