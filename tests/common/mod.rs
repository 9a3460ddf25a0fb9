//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use dxfs::block::{BlockDevice, MemDevice};
use dxfs::volume::{mkfs, MkfsOptions, OpenOptions, Volume};

/// A fresh volume of `blocks` 4 KiB blocks in memory.
pub fn mem_volume(blocks: u64) -> (Arc<MemDevice>, Volume) {
    let dev = Arc::new(MemDevice::new(blocks));
    mkfs(dev.clone(), &MkfsOptions::default()).expect("mkfs");
    let vol = Volume::open(dev.clone(), OpenOptions::default()).expect("open");
    (dev, vol)
}

/// Run fsck (read-only) and fail the test with its findings unless clean.
pub fn assert_clean(dev: Arc<dyn BlockDevice>) {
    let r = dxfs::fsck::check(dev, false, &mut |_| {}).expect("fsck ran");
    assert!(r.errors.is_empty() && r.fixed.is_empty(), "fsck found problems: {:#?}", r.errors);
}

/// Close a volume and check its device.
pub fn close_and_check(dev: Arc<MemDevice>, vol: Volume) {
    vol.close().expect("close");
    assert_clean(dev);
}
