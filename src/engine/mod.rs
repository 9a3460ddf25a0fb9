//! The storage engine: the verified metadata cache, the log (deltas' commit and
//! recovery), free space, the store that bundles them, and the one B+tree.
//!
//! Order inside the layer, bottom up: `cache` → `log` → `space` → `store` → `btree`
//! (the tree allocates its nodes through the store).

pub(crate) mod btree;
pub(crate) mod cache;
pub(crate) mod log;
pub(crate) mod space;
pub(crate) mod store;
