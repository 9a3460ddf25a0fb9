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
/// (`fsck` finding it clean, `mkfs`). Best effort: a record not written costs the next
/// read-write open a walk.
pub(crate) fn record_checked(source: &str, dev: &dyn dxfs::block::BlockDevice) {
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
) -> Result<(), String> {
    let dev = match dev {
        Some(d) => d.clone(),
        None if check == Check::Never => return Ok(()),
        None => dxfs::block::open_device(source, true).map_err(|e| e.to_string())?,
    };
    let why = match check {
        Check::Never => return Ok(()),
        Check::Always => "-o check".to_string(),
        Check::UnlessKnown => {
            let not = |why: String| format!("not as this host left it: {why}");
            match volumes().map(|k| k.standing(source, &*dev)) {
                Some(Ok(Standing::AsLeft)) => return Ok(()),
                Some(Ok(Standing::Unknown(why))) => not(why),
                Some(Err(e)) => not(e.to_string()),
                None => not("this host keeps no records (no state directory)".to_string()),
            }
        }
    };
    tracing::info!("{source}: checking it first, as fsck -n does ({why})");
    let report = dxfs::fsck::check(dev.clone(), false, &mut |_| {}).map_err(|e| format!("checking it first: {e}"))?;
    match report.errors.first() {
        None => {
            record_checked(source, &*dev);
            Ok(())
        }
        Some(first) => Err(format!(
            "{why}: fsck -n found {} problem(s), the first: {first}; \
             not opened for writing. Repair it with `dxfs fsck`, or mount it read-only (-o ro), or \
             trust it as it is (-o nocheck)",
            report.errors.len()
        )),
    }
}
