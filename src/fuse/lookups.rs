//! The kernel's lookup references, counted to show that FORGETs balance them.

/// The kernel's references to inodes: every entry reply (LOOKUP, CREATE, MKNOD, MKDIR,
/// SYMLINK, LINK, and each READDIRPLUS entry but `.` and `..`) adds one, FORGET takes
/// them back. The volume does not need them (an inode lives by its links and open
/// handles), so they are kept only to show, at the end of the session, that they
/// balance: an imbalance is a leak in the kernel interface.
#[derive(Default)]
pub(super) struct LookupCounts(parking_lot::Mutex<rustc_hash::FxHashMap<u64, u64>>);

impl LookupCounts {
    pub(super) fn add(&self, ino: u64) {
        *self.0.lock().entry(ino).or_insert(0) += 1;
    }

    pub(super) fn forget(&self, ino: u64, n: u64) {
        let mut m = self.0.lock();
        match m.get_mut(&ino) {
            Some(c) if *c > n => *c -= n,
            Some(c) if *c == n => {
                m.remove(&ino);
            }
            _ => {
                tracing::error!("FORGET of inode {ino} by {n}: more than the kernel was given");
                m.remove(&ino);
            }
        }
    }

    /// (inodes, references) still held.
    pub(super) fn outstanding(&self) -> (usize, u64) {
        let m = self.0.lock();
        (m.len(), m.values().sum())
    }
}
