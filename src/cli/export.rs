//! `dxfs export IMAGE DIR`, and the `mkfs -d DIR` population step: thin wrappers around
//! `dxfs::tools::{export, import}` with a progress line when stderr is a terminal.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dxfs::block::{BlockDevice, FileDevice};
use dxfs::{OpenOptions, Volume};

use super::{fail, spinner};

#[derive(clap::Args)]
pub struct ExportArgs {
    /// Image file or block device (opened read-only).
    image: PathBuf,
    /// Directory to write the tree into (created if missing; must be empty).
    dir: PathBuf,
}

pub fn run(a: ExportArgs) -> i32 {
    let dev = match FileDevice::open(&a.image, true) {
        Ok(d) => Arc::new(d) as Arc<dyn BlockDevice>,
        Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
    };
    let vol = match Volume::open(dev, OpenOptions { read_only: true, ..Default::default() }) {
        Ok(v) => v,
        Err(e) => return fail(format!("{}: {e}", a.image.display()), 8),
    };
    let bar = spinner();
    let r = dxfs::tools::export::export(&vol, &a.dir, &mut |s| {
        bar.set_message(format!("{} inodes, {} MiB", s.inodes, s.bytes >> 20))
    });
    bar.finish_and_clear();
    match r {
        Ok(s) if s.failures.is_empty() => 0,
        Ok(s) => {
            for f in &s.failures {
                eprintln!("dxfs: export: skipped {f}");
            }
            eprintln!(
                "dxfs: export: {} objects could not be read (the other {} were copied)",
                s.failures.len(),
                s.inodes
            );
            4
        }
        Err(e) => fail(format!("export: {e}"), 8),
    }
}

/// `mkfs -d`: copy `src` into the freshly made volume on `dev`, then close it.
pub fn populate(dev: Arc<dyn BlockDevice>, src: &Path) -> i32 {
    let vol = match Volume::open(dev, OpenOptions::default()) {
        Ok(v) => v,
        Err(e) => return fail(format!("cannot open the new volume: {e}"), 8),
    };
    let bar = spinner();
    let mut progress =
        |s: &dxfs::tools::import::ImportStats| bar.set_message(format!("{} inodes, {} MiB", s.inodes, s.bytes >> 20));
    let r = if dxfs::tools::import_tar::is_archive(src) {
        // A tar archive, as mke2fs -d takes one.
        match std::fs::File::open(src) {
            Ok(f) => {
                dxfs::tools::import_tar::import_tar(&vol, std::io::BufReader::with_capacity(1 << 20, f), &mut progress)
            }
            Err(e) => return fail(format!("{}: {e}", src.display()), 8),
        }
    } else {
        dxfs::tools::import::import(&vol, src, &mut progress)
    };
    bar.finish_and_clear();
    let r = r.map_err(|e| e.to_string()).and_then(|s| vol.close().map(|()| s).map_err(|e| e.to_string()));
    match r {
        Ok(s) => {
            println!(
                "copied {}: {} inodes, {} hard links, {} bytes, {} xattrs",
                src.display(),
                s.inodes,
                s.hard_links,
                s.bytes,
                s.xattrs
            );
            0
        }
        Err(e) => fail(format!("mkfs -d {}: {e}", src.display()), 8),
    }
}
