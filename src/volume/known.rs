//! Which volumes this host left as they are now: a record per volume in a directory of
//! the host (`/var/lib/dxfs/known` for the `dxfs` command run as root), so that a
//! read-write open can tell an image it did not make, or one changed since, and walk it
//! first (`dxfs mount` does; the walk is fsck -n's). The volume trusts its free-space map
//! once open, and only a walk can check that map against the tree: an image from
//! elsewhere may call live metadata free, and data would then be written over it.
//!
//! A record is written by the mount mark's holder (`mark.rs`): *open* when it takes the
//! mark, naming the holder (so that after a crash the mark it left is recognised as
//! this host's), and *closed* when it writes the mark clean, with a fingerprint of the
//! blocks every open or commit rewrites (superblocks, state block, commit blocks, the
//! mark, whose `seq` is random at each open) and, for an image file, its ctime, which
//! any write to it moves and no unprivileged user can set back. Tools that check a
//! volume whole (`fsck`, `mkfs`) record it closed too.
//!
//! What the record cannot see: a raw write to a block device or an NBD export that
//! leaves those blocks alone (an image file's ctime sees every write). Only a writer
//! that could change the volume under a live mount anyway can do that.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::disk::codec::BLOCK_SIZE;
use crate::disk::device::BlockDevice;
use crate::disk::format::{Superblock, LOG_START, STATE_BLOCK};
use crate::error::{Error, Result};

use super::mark;

/// The first line of every record (its format's version).
const RECORD_MAGIC: &str = "dxfs-known 1";
/// Records kept at most; the oldest go first (each is ~100 bytes).
const MAX_RECORDS: usize = 4096;

/// A directory of records of the volumes this host left (see the module's notes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownVolumes {
    dir: PathBuf,
}

/// One volume's place in [`KnownVolumes`]: what a read-write open given in
/// [`OpenOptions::known`](crate::OpenOptions::known) records as it takes and leaves the
/// volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownEntry {
    pub volumes: KnownVolumes,
    /// The volume's source as the user gave it: an image file, a block device or an NBD
    /// address (files and devices are told apart by what they are, not how spelled).
    pub source: String,
}

/// Whether a volume is as this host left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Left closed by this host, unchanged since; or left open by a process of this host
    /// that is gone (a crash: its log is replayed at the open).
    AsLeft,
    /// Not known to be: why.
    Unknown(String),
    /// Held read-write now, as far as one read of its mount mark can tell (a live process
    /// of this host, or a mark rewritten lately): by whom. Nothing can be told until the
    /// holder lets go, and a walk now would read a volume that is changing.
    InUse(String),
}

/// What a record says.
#[derive(Debug, PartialEq, Eq)]
enum Record {
    /// Closed: the fingerprint, and an image file's ctime (seconds, nanoseconds).
    Closed { fingerprint: u128, ctime: Option<(i64, i64)> },
    /// Open by this holder, as its mark names it.
    Open { pid: u32, pid_ns: u64, boot_id: [u8; 16] },
}

impl Record {
    fn encode(&self) -> String {
        match self {
            Record::Closed { fingerprint, ctime } => {
                let ctime = ctime.map(|(s, ns)| format!(" {s} {ns}")).unwrap_or_default();
                format!("{RECORD_MAGIC}\nclosed {fingerprint:032x}{ctime}\n")
            }
            Record::Open { pid, pid_ns, boot_id } => {
                format!("{RECORD_MAGIC}\nopen {pid} {pid_ns} {}\n", hex(boot_id))
            }
        }
    }

    /// `None` for anything else (a record of another version, or damaged): unknown.
    fn decode(text: &str) -> Option<Record> {
        let mut lines = text.lines();
        if lines.next()? != RECORD_MAGIC {
            return None;
        }
        let words: Vec<&str> = lines.next()?.split(' ').collect();
        match words.as_slice() {
            ["closed", fp, rest @ ..] => {
                let fingerprint = u128::from_str_radix(fp, 16).ok()?;
                let ctime = match rest {
                    [] => None,
                    [s, ns] => Some((s.parse().ok()?, ns.parse().ok()?)),
                    _ => return None,
                };
                Some(Record::Closed { fingerprint, ctime })
            }
            ["open", pid, pid_ns, boot] => {
                let b = u128::from_str_radix(boot, 16).ok()?;
                Some(Record::Open { pid: pid.parse().ok()?, pid_ns: pid_ns.parse().ok()?, boot_id: b.to_be_bytes() })
            }
            _ => None,
        }
    }
}

fn hex(b: &[u8; 16]) -> String {
    format!("{:032x}", u128::from_be_bytes(*b))
}

/// What a source is on this host: an image file's device and inode (and its ctime), a
/// block device's number, or an NBD address as spelled.
fn identity(source: &str) -> (String, Option<(i64, i64)>) {
    if !crate::disk::nbd::is_nbd_uri(source) {
        if let Ok(m) = std::fs::metadata(source) {
            if m.file_type().is_file() {
                return (format!("file {} {}", m.dev(), m.ino()), Some((m.ctime(), m.ctime_nsec())));
            }
            return (format!("device {}", m.rdev()), None);
        }
    }
    (format!("nbd {source}"), None)
}

/// A hash of the blocks every read-write open or commit rewrites.
fn fingerprint(dev: &dyn BlockDevice, sb: &Superblock) -> Result<u128> {
    let l = &sb.layout;
    let mut blocks = vec![0, STATE_BLOCK, LOG_START, l.log_area(1), l.block_count.saturating_sub(1)];
    if sb.mount_mark() {
        blocks.push(l.mark_block);
    }
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut b = vec![0u8; BLOCK_SIZE];
    for n in blocks {
        if n < dev.block_count() {
            dev.read_fresh(n, &mut b)?;
            h.update(&n.to_le_bytes());
            h.update(&b);
        }
    }
    Ok(h.digest128())
}

impl KnownVolumes {
    pub fn new(dir: impl Into<PathBuf>) -> KnownVolumes {
        KnownVolumes { dir: dir.into() }
    }

    /// Where the records live.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The record file of the volume with superblock `sb` at `source`.
    fn path(&self, source: &str, sb: &Superblock) -> PathBuf {
        let (id, _) = identity(source);
        let mut key = sb.uuid.to_vec();
        key.extend_from_slice(id.as_bytes());
        self.dir.join(format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&key)))
    }

    /// Whether the volume on `dev` (at `source`) is as this host left it. Reads a few
    /// blocks; changes nothing.
    pub fn standing(&self, source: &str, dev: &dyn BlockDevice) -> Result<Standing> {
        let sb = match super::read_superblock(dev) {
            Ok(sb) => sb,
            Err(e) => return Ok(Standing::Unknown(format!("its superblock: {e}"))),
        };
        let mark = mark::inspect(dev, &sb)?;
        if let Some(Ok(m)) = &mark {
            if mark::looks_held(m) {
                return Ok(Standing::InUse(mark::describe(m)));
            }
        }
        let text = match std::fs::read_to_string(self.path(source, &sb)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Standing::Unknown("this host has no record of it".into()))
            }
            Err(e) => return Ok(Standing::Unknown(format!("its record: {e}"))),
        };
        Ok(match Record::decode(&text) {
            Some(Record::Closed { fingerprint: f, ctime }) => {
                if ctime.is_some() && identity(source).1 != ctime {
                    Standing::Unknown("the image file was written since this host closed it".into())
                } else if fingerprint(dev, &sb)? != f {
                    Standing::Unknown("it was changed since this host closed it".into())
                } else {
                    Standing::AsLeft
                }
            }
            // Left in use by a holder that is gone (a crash), or written clean by it a
            // moment ago, its closed record not yet written: the mark names it either way,
            // and any other dxfs writer since would have put its own name there.
            Some(Record::Open { pid, pid_ns, boot_id }) => match mark {
                Some(Ok(m)) if m.pid == pid && m.pid_ns == pid_ns && m.boot_id == boot_id => Standing::AsLeft,
                _ => Standing::Unknown("it was changed since a mount of this host left it open".into()),
            },
            None => Standing::Unknown("its record is unreadable".into()),
        })
    }

    /// Record the volume on `dev` as closed now, as it is, if its mark says nobody holds
    /// it: for a tool that has just checked it whole or made it (`fsck`, `mkfs`), or a
    /// holder that has just written the mark clean. Returns whether it did.
    pub fn record_closed(&self, source: &str, dev: &dyn BlockDevice) -> Result<bool> {
        let sb = super::read_superblock(dev)?;
        if !matches!(mark::inspect(dev, &sb)?, Some(Ok(m)) if !m.in_use) {
            // No mark, or a held or damaged one: nothing to tell a crash from a change by.
            self.forget(source, &sb);
            return Ok(false);
        }
        let record = Record::Closed { fingerprint: fingerprint(dev, &sb)?, ctime: identity(source).1 };
        self.write(&self.path(source, &sb), &record)?;
        Ok(true)
    }

    /// Record the volume as open by the holder its mark names now (this process).
    pub(crate) fn record_open(&self, source: &str, dev: &dyn BlockDevice) -> Result<()> {
        let sb = super::read_superblock(dev)?;
        match mark::inspect(dev, &sb)? {
            Some(Ok(m)) if m.in_use && m.pid == std::process::id() => {
                let record = Record::Open { pid: m.pid, pid_ns: m.pid_ns, boot_id: m.boot_id };
                self.write(&self.path(source, &sb), &record)
            }
            _ => {
                self.forget(source, &sb);
                Ok(())
            }
        }
    }

    fn forget(&self, source: &str, sb: &Superblock) {
        let _ = std::fs::remove_file(self.path(source, sb));
    }

    /// Write a record whole or not at all (a new file renamed over the old), readable by
    /// its owner only.
    fn write(&self, path: &Path, record: &Record) -> Result<()> {
        let io = |e: std::io::Error| Error::Io(std::io::Error::new(e.kind(), format!("{}: {e}", self.dir.display())));
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.dir).map_err(io)?;
        let tmp = path.with_extension(format!("new{}", std::process::id()));
        let mut f =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(io)?;
        f.write_all(record.encode().as_bytes()).and_then(|_| f.sync_all()).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)?;
        self.prune();
        Ok(())
    }

    /// Keep at most `MAX_RECORDS`, dropping the least recently written.
    fn prune(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return };
        let mut all: Vec<(std::time::SystemTime, PathBuf)> =
            rd.filter_map(|e| e.ok()).filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path()))).collect();
        if all.len() <= MAX_RECORDS {
            return;
        }
        all.sort();
        for (_, p) in &all[..all.len() - MAX_RECORDS] {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_reject_others() {
        for r in [
            Record::Closed { fingerprint: u128::MAX - 5, ctime: Some((1_700_000_000, 999_999_999)) },
            Record::Closed { fingerprint: 1, ctime: None },
            Record::Open { pid: 42, pid_ns: 4026531836, boot_id: [0xab; 16] },
        ] {
            assert_eq!(Record::decode(&r.encode()), Some(r));
        }
        for bad in ["", "dxfs-known 2\nclosed 1\n", "dxfs-known 1\nclosed zz\n", "dxfs-known 1\nopen 1 2\n"] {
            assert_eq!(Record::decode(bad), None, "{bad:?}");
        }
    }
}
