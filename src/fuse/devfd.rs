//! More descriptors on one FUSE connection (`FUSE_DEV_IOC_CLONE`), so each classic serving
//! thread reads its own: replies then need no lookup on a shared processing list.
//! The one unsafe line is the ioctl.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;

nix::ioctl_read!(fuse_dev_ioc_clone, 229, 0, u32);

/// A new `/dev/fuse` descriptor attached to the connection `dev` serves.
pub(super) fn clone(dev: &File) -> io::Result<File> {
    let new = OpenOptions::new().read(true).write(true).open("/dev/fuse")?;
    let mut old = dev.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the descriptor to clone) through the
    // pointer, which points at a live local for the whole call; `new` is an open
    // /dev/fuse descriptor we own.
    unsafe { fuse_dev_ioc_clone(new.as_raw_fd(), &mut old) }.map_err(io::Error::from)?;
    Ok(new)
}
