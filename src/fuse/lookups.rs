//! The kernel's lookup references, counted to show that FORGETs balance them.

/// The kernel's references to inodes: every entry reply (LOOKUP, CREATE, MKNOD, MKDIR,
/// SYMLINK, LINK, and each READDIRPLUS entry but `.` and `..`) adds one, FORGET takes
/// them back. An inode the kernel references outlives its last link (the volume asks,
/// see `Volume::set_holder`): the kernel may have it open without having told the daemon
/// (zero-message opens). At the end of the session they show whether FORGETs balanced.
#[derive(Default)]
pub(super) struct LookupCounts(parking_lot::Mutex<rustc_hash::FxHashMap<u64, u64>>);

impl LookupCounts {
    pub(super) fn add(&self, ino: u64) {
        *self.0.lock().entry(ino).or_insert(0) += 1;
    }

    /// Drop `n` references; true when none is left.
    pub(super) fn forget(&self, ino: u64, n: u64) -> bool {
        let mut m = self.0.lock();
        match m.get_mut(&ino) {
            Some(c) if *c > n => {
                *c -= n;
                false
            }
            Some(c) if *c == n => {
                m.remove(&ino);
                true
            }
            _ => {
                tracing::error!("FORGET of inode {ino} by {n}: more than the kernel was given");
                m.remove(&ino);
                true
            }
        }
    }

    /// Whether the kernel holds a reference to `ino`.
    pub(super) fn holds(&self, ino: u64) -> bool {
        self.0.lock().contains_key(&ino)
    }

    /// Every inode still referenced, forgetting them all (the session is over: the
    /// kernel dropped its references without FORGETs).
    pub(super) fn drain(&self) -> Vec<u64> {
        self.0.lock().drain().map(|(ino, _)| ino).collect()
    }

    /// (inodes, references) still held.
    pub(super) fn outstanding(&self) -> (usize, u64) {
        let m = self.0.lock();
        (m.len(), m.values().sum())
    }
}
