//! This host's record of the volumes it left (`dxfs::KnownVolumes`), and the walk that
//! a read-write open gives a volume this host did not leave as it is (`-o check`).

use std::path::PathBuf;
use std::sync::Arc;

use dxfs::block::BlockDevice;
use dxfs::{KnownEntry, KnownVolumes, Standing};

/// Whether a read-write open walks the volume first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// `-o check`: always.
    Always,
    /// `-o nocheck`: never (the map is trusted as it is).
    Never,
    /// The default: unless the volume is as this host left it.
    UnlessKnown,
}

/// Where the records live: `$DXFS_STATE_DIR/known`; else `/var/lib/dxfs/known` for
/// root, `$XDG_STATE_HOME/dxfs/known` or `~/.local/state/dxfs/known` for others. `None`
/// when there is nowhere: every read-write open then walks.
pub(crate) fn volumes() -> Option<KnownVolumes> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let base = if let Some(d) = env("DXFS_STATE_DIR") {
        d
    } else if nix::unistd::geteuid().is_root() {
        PathBuf::from("/var/lib/dxfs")
    } else if let Some(d) = env("XDG_STATE_HOME") {
        d.join("dxfs")
    } else {
        env("HOME")?.join(".local/state/dxfs")
    };
    Some(KnownVolumes::new(base.join("known")))
}

/// The entry a read-write open of `source` keeps (`OpenOptions::known`).
pub(crate) fn entry(source: &str) -> Option<KnownEntry> {
    volumes().map(|volumes| KnownEntry { volumes, source: source.to_string() })
}

/// Record `source` as this host leaves it, after a tool that checked or made it whole
/// (`fsck` finding it clean or repaired, `mkfs`, `resize`). Best effort: a record not written costs the next
/// read-write open a walk.
pub(crate) fn record_checked(source: &str, dev: &dyn BlockDevice) {
    if let Some(k) = volumes() {
        if let Err(e) = k.record_closed(source, dev) {
            tracing::info!("cannot record {source} as checked: {e}");
        }
    }
}

/// Before a read-write open of `source`: walk it as `fsck -n` does, unless `check` says
/// not to or the volume is as this host left it. `Err` refuses the open, naming what the
/// walk found. The volume trusts its free-space map once open, and only the walk can
/// check that map against the tree (data would be written over live metadata that a
/// self-consistent map calls free).
///
/// `dev` is the device the tool has open already, if it has (an NBD server may serve one
/// connection only); else the walk opens one of its own, read-only.
pub(crate) fn check_before_writing(
    source: &str,
    check: Check,
    dev: Option<&Arc<dyn BlockDevice>>,
) -> Result<(), Refusal> {
    let dev = match dev {
        Some(d) => d.clone(),
        None if check == Check::Never => return Ok(()),
        None => dxfs::block::open_device(source, true).map_err(|e| Refusal::Failed(e.to_string()))?,
    };
    let standing = match volumes() {
        Some(k) => Some(k.standing(source, &*dev)),
        // No records: a holder of this host still tells.
        None => match dxfs::mount_mark_holder_on_this_host(&*dev) {
            Ok(Some(pid)) => Some(Ok(Standing::InUse(format!("process {pid} of this host")))),
            _ => None,
        },
    };
    if let Some(Ok(Standing::InUse(who))) = &standing {
        return Err(Refusal::InUse(format!("the volume is in use by {who} (dxfs mount mark)")));
    }
    let why = match check {
        Check::Never => return Ok(()),
        Check::Always => "-o check".to_string(),
        Check::UnlessKnown => {
            let not = |why: String| format!("not as this host left it: {why}");
            match standing {
                Some(Ok(Standing::AsLeft)) => return Ok(()),
                Some(Ok(Standing::Unknown(why) | Standing::InUse(why))) => not(why),
                Some(Err(e)) => not(e.to_string()),
                None => not("this host keeps no records (no state directory)".to_string()),
            }
        }
    };
    tracing::info!("{source}: checking it first, as fsck -n does ({why})");
    let report = dxfs::fsck::check(dev.clone(), false, &mut |_| {})
        .map_err(|e| Refusal::Failed(format!("checking it first: {e}")))?;
    match report.errors.first() {
        None => {
            record_checked(source, &*dev);
            Ok(())
        }
        Some(first) => Err(Refusal::Failed(format!(
            "{why}: fsck -n found {} problem(s), the first: {first}; \
             not opened for writing. Repair it with `dxfs fsck`, or mount it read-only (-o ro), or \
             trust it as it is (-o nocheck)",
            report.errors.len()
        ))),
    }
}

/// Why a read-write open may not go ahead.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Someone holds the volume: an open now would be refused too (a daemon ending after
    /// `umount` lets go soon; `dxfs mount` waits for it).
    InUse(String),
    /// The walk found problems, or could not run.
    Failed(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::InUse(m) | Refusal::Failed(m) => f.write_str(m),
        }
    }
}
