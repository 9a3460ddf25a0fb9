//! The disk layers: block devices (I/O) and the on-disk records (pure encoding, no I/O).
//!
//! Nothing here knows about caches, deltas or files; every layer above builds on it.

pub(crate) mod codec;
pub(crate) mod device;
#[cfg(any(test, feature = "testing"))]
pub(crate) mod fault;
pub(crate) mod format;
pub mod hash;
pub(crate) mod nbd;
pub(crate) mod overlay;
pub(crate) mod probe;
pub(crate) mod rstat;
pub(crate) mod valid;

use std::sync::Arc;

/// Open a volume's device from what a user typed: an NBD URI (`nbd://HOST[:PORT]/EXPORT`,
/// `nbd+unix:///EXPORT?socket=PATH`) becomes an [`nbd::NbdDevice`], anything else is a
/// path to an image file or block device ([`device::FileDevice`]).
pub fn open_device(spec: &str, read_only: bool) -> crate::error::Result<Arc<dyn device::BlockDevice>> {
    if nbd::is_nbd_uri(spec) {
        Ok(Arc::new(nbd::NbdDevice::open(spec, read_only)?))
    } else {
        Ok(Arc::new(device::FileDevice::open(spec, read_only)?))
    }
}
