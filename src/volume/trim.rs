//! Free space handed back to the device: `Volume::trim_free` (what `dxfs trim` runs) and
//! the `discard` option's trim of the runs a committed delta freed.

use crate::disk::device::BlockDevice;
use crate::error::Result;

use super::Volume;

/// Longest run handed to the device in one trim call while sweeping (blocks): the
/// volume lock is dropped between calls.
const SWEEP_RUN: u64 = 1 << 18;

impl Volume {
    /// Trim every free block of the volume: commit, then walk the free-space bitmap and
    /// hand each free run to [`BlockDevice::trim`]. Returns the number of blocks trimmed.
    /// Safe on a volume in use: blocks that the current delta or a commit in flight may
    /// still need are marked in use in memory until they are durably free, and each run
    /// is trimmed under the volume lock, so nothing can allocate it meanwhile.
    pub fn trim_free(&self) -> Result<u64> {
        self.sync()?;
        let mut next = 0u64;
        let mut trimmed = 0u64;
        loop {
            let g = self.lock();
            g.check_writable()?;
            let count = g.st.sb.layout.block_count;
            while next < count && g.st.is_used(next) {
                next += 1;
            }
            if next >= count {
                return Ok(trimmed);
            }
            let start = next;
            while next < count && next - start < SWEEP_RUN && !g.st.is_used(next) {
                next += 1;
            }
            g.st.dev().trim(start, next - start)?;
            trimmed += next - start;
        }
    }

    /// `discard`: trim the runs a durable delta freed. A failed trim only costs space,
    /// so it is logged and otherwise ignored.
    pub(super) fn discard(dev: &dyn BlockDevice, runs: &[(u64, u64)]) {
        for &(start, len) in runs {
            if let Err(e) = dev.trim(start, len) {
                tracing::warn!("discard of {len} blocks at {start} failed: {e}");
                return;
            }
        }
    }
}
