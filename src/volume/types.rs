//! The values the volume API takes and returns: attributes, times, options.

use super::*;

/// A time: seconds and nanoseconds since the epoch.
pub type Time = (i64, u32);

/// The current time, from the clock the kernel stamps inodes with (`current_time`: the
/// coarse real-time clock, which lags the precise one by up to a tick). With the
/// writeback cache the kernel stamps mtime and ctime itself; stamped from one clock, a
/// time set here after one set there is never earlier (relatime's comparisons, and the
/// order of two changes, hold).
pub(crate) fn now() -> Time {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME_COARSE) {
        Ok(t) => (t.tv_sec(), t.tv_nsec() as u32),
        Err(_) => {
            let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
            (d.as_secs() as i64, d.subsec_nanos())
        }
    }
}

/// Attributes of an inode, as stat reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    /// 512-byte units, as st_blocks.
    pub blocks: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub crtime: Time,
    pub kind: FileType,
    /// Full mode, type bits included.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub generation: u32,
}

/// A time to set: a given time or "now".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(Time),
}

/// Changes for `setattr`; `None` leaves a field alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (the file type is kept).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<Time>,
    /// The caller lacks CAP_FSETID: a truncate drops the setuid and setgid bits and the
    /// file capability (see [`Volume::write_unprivileged`](crate::Volume::write_unprivileged)).
    pub drop_privileges: bool,
}

/// Who makes a write, and whether it changes the file's times
/// ([`Volume::write_with`](crate::Volume::write_with)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteAs {
    /// The writer lacks CAP_FSETID: the setuid bit, the setgid bit of a group-executable
    /// file and the file capability are dropped (see
    /// [`Volume::write_unprivileged`](crate::Volume::write_unprivileged)).
    pub unprivileged: bool,
    /// Leave mtime and ctime as they are: the write is a cache's write-back of data whose
    /// times the cache keeps and sets itself (the kernel's writeback cache, which sends
    /// them as a SETATTR). Dropped privileges still move ctime.
    pub keep_times: bool,
    /// The write is a cache's write-back of data it accepted: it may use the room kept
    /// for write-back (`Volume::keep_for_write_back`).
    pub write_back: bool,
}

/// What `Volume::make` creates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NewNode {
    /// File type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Device number of a device node.
    pub rdev: u64,
    /// The creator's umask, applied unless a default ACL is inherited.
    pub umask: u32,
}

/// Flags of `rename`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with `Exists` if the target exists (RENAME_NOREPLACE).
    pub noreplace: bool,
    /// Swap the two entries, both of which must exist (RENAME_EXCHANGE).
    pub exchange: bool,
    /// Leave a whiteout (a character device 0:0, owned as the moved inode) at the old
    /// name, in the same step (RENAME_WHITEOUT, for overlayfs upper layers).
    pub whiteout: bool,
}

/// `setxattr` modes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrMode {
    /// Create or replace.
    #[default]
    Any,
    /// Fail with `Exists` if present (XATTR_CREATE).
    Create,
    /// Fail with `NoData` if absent (XATTR_REPLACE).
    Replace,
}

/// Volume-wide numbers, as statfs reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    /// What can really still be written (the budget, less the reserve).
    pub bavail: u64,
    /// Of `bfree` and `bavail`: blocks of files removed moments ago that come back once
    /// the kernel lets them go (their FORGET is on its way).
    pub settling: u64,
    /// Blocks kept free for a cache's write-back (`Volume::keep_for_write_back`) that
    /// are free: in `bfree`, not in `bavail`.
    pub kept: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}

/// Options of `Volume::open`.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    pub read_only: bool,
    /// Clean metadata blocks kept in memory.
    pub cache_blocks: usize,
    /// Dirty data pages (4 KiB) held before the delta commits by itself.
    pub dirty_limit: u64,
    /// Dirty data pages past which a background thread writes some back ahead of the
    /// commit (at most a quarter of `dirty_limit`; also past a quarter of the runs
    /// limit, or this many runs if fewer), so the commit has less to write and a writer
    /// at the dirty limit waits for one flush, not for a whole commit. 0: never (the
    /// commit writes everything back).
    pub flush_from: u64,
    /// Place children in their directory's reserved inode region (A/B switch).
    pub reserve_regions: bool,
    /// Answer getxattr from the bloom filter when it rules the name out (A/B switch).
    pub use_xattr_filter: bool,
    /// readdirplus reads a batch's inode blocks in one sorted sweep, and reads ahead
    /// the next leaves and their inodes of a directory read in order (A/B switch).
    pub sorted_prefetch: bool,
    /// Read the next piece of a file read sequentially ahead of its reader, on a thread
    /// of the volume (`-o nodata_readahead` turns it off; see `volume/ahead.rs`).
    pub data_readahead: bool,
    /// Check each operation's worst-case cost against free space before accepting it
    /// (A/B switch, for measuring what the check costs: without it a full volume fails
    /// in the commit instead of with ENOSPC up front, so keep it on for real use).
    pub space_accounting: bool,
    /// Time how long the volume lock is waited for and held (`Volume::lock_stats`).
    /// Off by default: reading the clock three times per operation costs ~0.1 µs here.
    pub measure_lock: bool,
    /// Open even when the newest commit record is damaged and recovering means losing
    /// deltas committed after the newest readable one (`-o recovery=rollback`). Off: such
    /// a volume is refused with a corruption error.
    pub allow_rollback: bool,
    /// Trim ([`BlockDevice::trim`](crate::block::BlockDevice::trim)) the blocks a
    /// delta frees once it is durable, so thin storage and sparse images shrink
    /// (`-o discard`). Off by default.
    pub discard: bool,
    /// When reads and directory listings update the access time (`-o relatime`, the
    /// default; `strictatime`; `noatime`).
    pub atime: AtimePolicy,
    /// How often a read-write open rewrites the volume's mount mark (ro_compat
    /// MOUNT_MARK), in milliseconds; 5000 by default. Another host's open waits about
    /// twice this long before it takes over a mark that stopped changing.
    pub mark_interval_ms: u32,
    /// Keep this host's record of the volume (`KnownVolumes`): open while the mount mark
    /// is held, closed with a fingerprint once it is written clean. `None` by default.
    pub known: Option<KnownEntry>,
    /// Test hook: take a linearization stamp in every operation ([`Volume::last_stamp`](
    /// crate::Volume::last_stamp)). Off by default: the stamps come from one counter all
    /// threads write, whose cache line then moves between CPUs at every operation.
    #[doc(hidden)]
    pub linearization_stamps: bool,
}

/// When an access updates an inode's atime. The FUSE client leaves atime to the daemon
/// (it marks every inode S_NOATIME), so the volume applies the policy itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimePolicy {
    /// Only when atime is not after mtime or ctime, or is a day old (Linux's default).
    #[default]
    Relative,
    /// At every access.
    Strict,
    /// Never.
    Never,
}

impl AtimePolicy {
    /// Whether an access at `now` updates an inode with these times.
    pub fn wants_update(self, atime: Time, mtime: Time, ctime: Time, now: Time) -> bool {
        match self {
            AtimePolicy::Never => false,
            AtimePolicy::Strict => atime != now,
            AtimePolicy::Relative => atime <= mtime || atime <= ctime || now.0 - atime.0 >= 24 * 3600,
        }
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read_only: false,
            cache_blocks: 262_144,
            dirty_limit: 32_768,
            flush_from: 8192,
            reserve_regions: true,
            use_xattr_filter: true,
            sorted_prefetch: true,
            data_readahead: true,
            space_accounting: true,
            measure_lock: false,
            allow_rollback: false,
            discard: false,
            atime: AtimePolicy::Relative,
            mark_interval_ms: 5000,
            known: None,
            linearization_stamps: false,
        }
    }
}

/// Who asks: the user, the primary group and the supplementary groups of a caller, for
/// the permission decisions the volume makes ([`Volume::access`](crate::Volume::access)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Caller {
    /// Whether the caller is in group `gid`.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}
