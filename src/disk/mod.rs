//! The disk layers: block devices (I/O) and the on-disk records (pure encoding, no I/O).
//!
//! Nothing here knows about caches, deltas or files; every layer above builds on it.

pub(crate) mod codec;
pub mod device;
pub mod fault;
pub(crate) mod format;
pub mod hash;
pub mod probe;
