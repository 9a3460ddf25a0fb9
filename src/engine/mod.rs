//! The storage engine: the verified metadata cache, the log (deltas' commit and
//! recovery), free space, the store that bundles them, and the one B+tree.
//!
//! Order inside the layer, bottom up: `leaf` (the small locks at the bottom of the lock
//! order) and `deferred` (reads put off until an operation lets go); `cache`; then `log`, `space` and `btree`, which do not use each other (the
//! tree is generic over `btree::NodeStore`); then `store`, which bundles them and is the
//! tree's node store. tests/layers.rs checks it.

pub(crate) mod btree;
pub(crate) mod cache;
pub(crate) mod deferred;
pub(crate) mod leaf;
pub(crate) mod log;
pub(crate) mod space;
pub(crate) mod store;
