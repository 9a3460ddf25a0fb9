//! Filesystem objects on top of the engine: directories (the hashed index), files
//! (extent maps, delayed allocation), xattrs (with the name filter) and POSIX ACLs.
//!
//! These modules change metadata through the store; they know nothing of deltas,
//! budgets or locks, which belong to the volume above.

pub mod acl;
pub(crate) mod dir;
pub(crate) mod file;
pub(crate) mod pages;
pub(crate) mod xattr;
