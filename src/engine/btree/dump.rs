//! Per-leaf facts for the inspector (`dxfs debug htree`): which block, how many
//! records, how full, which key range.

use crate::disk::format::TreeRoot;
use crate::error::Result;

use super::check::walk;
use super::node::*;
use super::*;

/// One leaf of a tree, as the inspector shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeafInfo {
    pub block: u64,
    pub records: usize,
    /// Bytes of slots and live record bodies.
    pub bytes_used: usize,
    /// Bytes a leaf can use for slots and record bodies.
    pub capacity: usize,
    pub first_key: u64,
    pub last_key: u64,
}

/// The leaves of a tree in key order (an empty tree has none).
pub(crate) fn leaves(s: &mut impl NodeStore, t: &TreeRoot, owner: u64) -> Result<Vec<LeafInfo>> {
    let mut out = Vec::new();
    walk(s, t, owner, |blk, b, h, _| {
        if h.level == 0 && h.n > 0 {
            out.push(LeafInfo {
                block: blk,
                records: h.n,
                bytes_used: h.live(),
                capacity: USABLE,
                first_key: record(b, h, blk, 0)?.0,
                last_key: record(b, h, blk, h.n - 1)?.0,
            });
        }
        Ok(())
    })?;
    Ok(out)
}
