//! dxfs: a POSIX filesystem in user space.
//!
//! A volume lives in an image file or on a block device; it is served to the kernel
//! through FUSE (`dxfs mount`, or [`fuse`] with the `fuse` feature) or used directly
//! through [`Volume`]. The source folders are the layers, bottom up: `disk` (block
//! devices and on-disk records) → `engine` (cache, log, space, store, B+tree) → `fs`
//! (directories, files, xattrs, ACLs) → `volume` (deltas and the operations) → [`fsck`]
//! and `tools` → `fuse` and the command line. A layer only calls the layers below it.
//! See docs/DESIGN.md and docs/FORMAT.md.
//!
//! The main paths, on a volume in memory (an image file: `dxfs::block::open_device`):
//!
//! ```
//! use std::sync::Arc;
//! use dxfs::block::{BlockDevice, MemDevice};
//! use dxfs::{mkfs, Caller, Error, MkfsOptions, OpenOptions, Volume, XattrMode};
//!
//! let dev = Arc::new(MemDevice::new(4096)); // 16 MiB in memory
//! mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
//! let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
//! let root = vol.root();
//! // Create, write, commit, read, list.
//! let f = vol.create(root, b"hello.txt", 0o644, 0, 0).unwrap();
//! vol.write(f.ino, 0, b"hello, world").unwrap();
//! vol.sync().unwrap();
//! assert_eq!(vol.read(f.ino, 0, 100).unwrap(), b"hello, world");
//! let names: Vec<_> = vol.readdir(root, 0, 100).unwrap().into_iter().map(|e| e.name).collect();
//! assert_eq!(names, vec![b".".to_vec(), b"..".to_vec(), b"hello.txt".to_vec()]);
//! // Extended attributes.
//! vol.setxattr(f.ino, b"user.colour", b"blue", XattrMode::Create).unwrap();
//! assert_eq!(vol.getxattr(f.ino, b"user.colour").unwrap(), b"blue");
//! // The plain operations check no permission (the kernel does, through a mount); the
//! // `_as` ones take the caller and apply the kernel's rules.
//! let nobody = Caller { uid: 65534, gid: 65534, groups: Vec::new() };
//! assert!(matches!(vol.unlink_as(root, b"hello.txt", &nobody), Err(Error::AccessDenied)));
//! // Close (the last delta commits), then check the volume as `dxfs fsck -n` does.
//! vol.close().unwrap();
//! let report = dxfs::fsck::check(dev as Arc<dyn BlockDevice>, false, &mut |_| {}).unwrap();
//! assert!(report.errors.is_empty());
//! ```
// Unsafe code is denied everywhere; the exceptions are in `fuse`: `uring` (the io_uring
// buffers the kernel writes into), `devfd` and `control` (one ioctl each) and
// `fusermount` (taking a descriptor passed over a socket), which allow it explicitly.
#![deny(unsafe_code)]
// What the API does not export is `pub(crate)`, so that `pub` means public (issue 41).
#![warn(unreachable_pub)]

mod disk;
mod engine;
mod error;
mod fs;
pub mod fsck;
#[cfg(feature = "fuse")]
pub mod fuse;
pub mod tools;
mod volume;

/// Block devices: the trait the volume stores its blocks through, image files and block
/// devices, memory, NBD servers, and the fault-injecting device of the crash tests.
pub mod block {
    pub use crate::disk::device::{AlignedBuf, BlockDevice, FileDevice, IoStats, MemDevice};
    #[cfg(feature = "testing")]
    pub use crate::disk::fault::{CrashImages, CrashMode, FaultDevice};
    pub use crate::disk::nbd::{is_nbd_uri, NbdDevice, NbdEndpoint, NbdTarget};
    pub use crate::disk::open_device;
    pub use crate::disk::probe::probe;
}
pub use disk::codec::BLOCK_SIZE;
pub use disk::format::{FileType, Layout, Superblock, DEFAULT_FILTER_HASHES, MAX_FILE_SIZE};
pub use disk::hash;
pub use disk::rstat::Rstat;
pub use error::{Error, Internal, Result};
pub use fs::acl;
pub use fs::dir::DirEntry;
pub use volume::{
    grow, mkfs, mount_mark_holder_on_this_host, mount_mark_status, read_superblock, AtimePolicy, Attr, Caller,
    EmptyStep, Grown, KnownEntry, KnownVolumes, LockStats, MkfsOptions, NewEntry, NewNode, OpenOptions, Quota,
    ReadStats, RenameFlags, SetAttr, SetTime, Standing, StatFs, SumStep, Time, TreeRemoval, Volume, WriteAs, XattrMode,
    LEAF_LOCK_NAMES, QUOTA_USED_XATTR, QUOTA_XATTR, RSTAT_XATTRS, RSTAT_XATTR_PREFIX,
};

/// Internals that the project's own tests, benchmarks and tools reach into (on-disk
/// addresses to damage, encodings to check). Not part of the API: no stability promise.
#[doc(hidden)]
pub mod internals {
    pub use crate::disk::codec::{get_u32, seal, Block};
    pub use crate::disk::format::{
        ino_loc, MountMark, INCOMPAT_SPILLED_BITMAP, KNOWN_INCOMPAT, LOG_START, RO_COMPAT_GROW_PENDING,
        RO_COMPAT_MOUNT_MARK, STATE_BLOCK,
    };
    pub use crate::fs::dir::name_key;
    pub use crate::fs::xattr::{filter_mask, filter_of, full_name, split_name, Xattr};
    // The decoders the fuzz targets (fuzz/) call directly.
    pub use crate::disk::format::{decode_dirent, Extent, Inode, State, TreeRoot};
    pub use crate::engine::btree::{check as btree_check, insert as btree_insert, remove as btree_remove};
    pub use crate::engine::btree::{salvage as btree_salvage, scan as btree_scan, NodeRead, NodeStore};
    pub use crate::engine::log::Journal;
}
