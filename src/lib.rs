//! dxfs: a POSIX filesystem in user space.
//!
//! A volume lives in an image file or on a block device; it is served to the kernel
//! through FUSE (`dxfs mount`) or used directly through [`Volume`]. Layers, bottom up:
//! [`block`] → [`cache`] → [`journal`] (deltas) → [`space`] → [`store`] (inodes) →
//! [`file`](mod@file) / [`dir`] / [`xattr`] → [`volume`] → `fuse` and the CLI. A layer only calls
//! the layers below it. See docs/DESIGN.md and docs/FORMAT.md.
//!
//! ```
//! use std::sync::Arc;
//! use dxfs::block::MemDevice;
//! use dxfs::volume::{mkfs, MkfsOptions, OpenOptions, Volume};
//!
//! let dev = Arc::new(MemDevice::new(4096)); // 16 MiB in memory
//! mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
//! let vol = Volume::open(dev.clone(), OpenOptions::default()).unwrap();
//! let root = vol.root();
//! let f = vol.create(root, b"hello.txt", 0o644, 0, 0).unwrap();
//! vol.write(f.ino, 0, b"hello, world").unwrap();
//! vol.sync().unwrap();
//! assert_eq!(vol.read(f.ino, 0, 100).unwrap(), b"hello, world");
//! let names: Vec<_> = vol.readdir(root, 0, 100).unwrap().into_iter().map(|e| e.name).collect();
//! assert_eq!(names, vec![b".".to_vec(), b"..".to_vec(), b"hello.txt".to_vec()]);
//! ```
#![forbid(unsafe_code)]

pub mod acl;
pub mod block;
pub mod btree;
pub mod cache;
pub mod codec;
pub mod dir;
pub mod error;
pub mod file;
pub mod format;
pub mod fsck;
pub mod fuse;
pub mod hash;
pub mod journal;
pub mod space;
pub mod store;
pub mod volume;
pub mod xattr;

pub use error::{Error, Result};
pub use volume::{mkfs, Attr, MkfsOptions, OpenOptions, Volume};
