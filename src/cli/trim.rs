//! `dxfs trim`: hand every free block of an unmounted volume back to its device.

use std::path::PathBuf;

use dxfs::block::open_device;

use super::fail;

#[derive(clap::Args)]
pub struct TrimArgs {
    /// Image file, block device, or NBD export (nbd://..., nbd+unix://...).
    image: PathBuf,
}

pub fn run(a: TrimArgs) -> i32 {
    let spec = a.image.to_string_lossy();
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
    // A trim hands back what the map calls free: on a map that calls live metadata free,
    // that metadata (a sparse image reads zeros there after).
    if let Err(e) = super::known::check_before_writing(&spec, super::known::Check::UnlessKnown, Some(&dev)) {
        return fail(format!("{spec}: {e}"), 8);
    }
    let opts = dxfs::OpenOptions { known: super::known::entry(&spec), ..Default::default() };
    let vol = match dxfs::Volume::open(dev, opts) {
        Ok(v) => v,
        Err(e) => return fail(format!("{spec}: {e}"), 8),
    };
    let trimmed = match vol.trim_free() {
        Ok(n) => n,
        Err(e) => return fail(format!("{spec}: trim failed: {e}"), 8),
    };
    if let Err(e) = vol.close() {
        return fail(format!("{spec}: {e}"), 8);
    }
    println!("{spec}: trimmed {trimmed} free blocks ({} MiB)", trimmed / 256);
    0
}
