//! `dxfs resize IMAGE [SIZE]`: grow an unmounted volume (as resize2fs). An image file is
//! extended to SIZE; a block device or NBD export must already be that large. Without
//! SIZE the volume grows to fill its device.

use std::path::PathBuf;
use std::sync::Arc;

use dxfs::block::{open_device, BlockDevice, FileDevice};

use super::{fail, parse_size};

#[derive(clap::Args)]
pub struct ResizeArgs {
    /// Image file, block device, or NBD export (nbd://..., nbd+unix://...).
    image: PathBuf,
    /// New size (e.g. 2G, 512M), or +SIZE to add that much; default: the whole device.
    size: Option<String>,
}

pub fn run(a: ResizeArgs) -> i32 {
    let spec = a.image.to_string_lossy().into_owned();
    // A read-write open fails if the volume is mounted or otherwise in use (after a
    // daemon ending its session has let go).
    if !dxfs::block::is_nbd_uri(&spec) {
        super::wait_for_a_closing_holder(&a.image);
    }
    let dev = match open_device(&spec, false) {
        Ok(d) => d,
        Err(e) => return fail(format!("{spec}: {e}"), 8),
    };
    if dxfs::block::is_nbd_uri(&spec) {
        super::wait_for_a_closing_mark(&spec, &*dev);
    }
    // Grown from a map that calls live metadata free, the volume would write over it.
    if let Err(e) = super::known::check_before_writing(&spec, super::known::Check::UnlessKnown, Some(&dev)) {
        return fail(format!("{spec}: {e}"), 8);
    }
    let sb = match dxfs::read_superblock(&*dev) {
        Ok(sb) => sb,
        Err(e) => return fail(format!("{spec}: {e}"), 8),
    };
    let old = sb.layout.block_count;
    let bytes = match a.size.as_deref() {
        None => dev.block_count() * 4096,
        Some(s) => {
            let (add, s) = match s.strip_prefix('+') {
                Some(rest) => (true, rest),
                None => (false, s),
            };
            let Some(b) = parse_size(s) else { return fail(format!("bad size {s:?}"), 8) };
            if add {
                old * 4096 + b
            } else {
                b
            }
        }
    };
    let blocks = bytes / 4096;
    if blocks < old {
        return fail(
            format!(
                "{spec}: shrinking is not supported: the volume has {old} blocks ({} MiB), {blocks} blocks ({} MiB) were asked for",
                old / 256,
                blocks / 256
            ),
            8,
        );
    }
    // An image file grows to the new size (locked first); other devices must already
    // hold it.
    let extended_from =
        std::fs::metadata(&a.image).ok().filter(|m| m.is_file() && blocks > dev.block_count()).map(|m| m.len());
    let dev: Arc<dyn BlockDevice> = if extended_from.is_some() {
        drop(dev);
        match FileDevice::create(&a.image, blocks * 4096) {
            Ok(d) => Arc::new(d),
            Err(e) => return fail(format!("{spec}: cannot extend the image: {e}"), 8),
        }
    } else {
        dev
    };
    let r = dxfs::grow(dev.clone(), blocks);
    // A grow refused before its switch leaves the image as it was: its last block is where
    // a reader looks for the backup superblock.
    if let (Err(_), Some(len)) = (&r, extended_from) {
        if dxfs::read_superblock(&*dev).is_ok_and(|sb| sb.layout.block_count * 4096 <= len) {
            let _ = std::fs::OpenOptions::new().write(true).open(&a.image).and_then(|f| f.set_len(len));
        }
    }
    if r.is_ok() {
        // Checked (or as this host left it) before, and grown by this host since.
        super::known::record_checked(&spec, &*dev);
    }
    match r {
        Ok(g) if g.new_blocks == g.old_blocks => {
            if g.finished_earlier {
                println!(
                    "{spec}: finished the interrupted resize to {} blocks ({} MiB)",
                    g.old_blocks,
                    g.old_blocks / 256
                );
            } else {
                println!(
                    "{spec}: the volume already has {} blocks ({} MiB); nothing to do",
                    g.old_blocks,
                    g.old_blocks / 256
                );
            }
            0
        }
        Ok(g) => {
            println!(
                "{spec}: grown from {} to {} blocks ({} MiB to {} MiB){}",
                g.old_blocks,
                g.new_blocks,
                g.old_blocks / 256,
                g.new_blocks / 256,
                if g.new_bitmap_blocks > 0 {
                    format!(", {} new bitmap blocks", g.new_bitmap_blocks)
                } else {
                    String::new()
                }
            );
            0
        }
        Err(e) => fail(format!("{spec}: {e}"), 8),
    }
}
