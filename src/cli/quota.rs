//! `dxfs quota [--image IMAGE] DIR [SIZE|none]`: show, set or remove a directory's quota
//! (FORMAT.md §7.4). On a mount it reads and writes the virtual xattrs
//! `dxfs.quota.max_bytes` and `dxfs.quota.used_bytes`, so the kernel resolves the path
//! and the daemon sees who asks (only root may set or remove a quota); with `--image`
//! the volume is changed through the library, unmounted.

use std::path::{Path, PathBuf};

use dxfs::{QUOTA_USED_XATTR, QUOTA_XATTR};

use super::du::human;
use super::{fail, image_lookup, open_image, parse_size};

#[derive(clap::Args)]
pub struct QuotaArgs {
    /// The directory is inside this unmounted volume (image file, device or nbd:// URI),
    /// from its root.
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// The directory.
    dir: PathBuf,
    /// The new limit on the bytes the directory and its subtree allocate (a number, or
    /// with K, M, G, T); `none` removes it. Without it, the limit and use are printed.
    size: Option<String>,
}

/// What to do with the quota.
enum Change {
    Show,
    Set(u64),
    Remove,
}

pub fn run(a: QuotaArgs) -> i32 {
    let change = match a.size.as_deref() {
        None => Change::Show,
        Some("none") => Change::Remove,
        Some(s) => match parse_size(s) {
            Some(n) if n >= dxfs::BLOCK_SIZE as u64 => Change::Set(n),
            _ => return fail(format!("{s}: not a size of at least 4K (or none)"), 2),
        },
    };
    let shown = match &a.image {
        Some(image) => on_image(image, &a.dir, &change),
        None => on_mount(&a.dir, &change),
    };
    match shown {
        Ok(Some((limit, used))) => {
            let pct = used.saturating_mul(100) / limit.max(1);
            println!("{}: quota {}, used {} ({pct}%)", a.dir.display(), human(limit), human(used));
            0
        }
        Ok(None) => {
            println!("{}: no quota", a.dir.display());
            0
        }
        Err(m) => fail(format!("{}: {m}", a.dir.display()), 1),
    }
}

/// Change or read the quota through the library; the limit and use after it.
fn on_image(image: &str, dir: &Path, change: &Change) -> Result<Option<(u64, u64)>, String> {
    let vol = open_image(image, matches!(change, Change::Show)).map_err(|_| "cannot open the volume".to_string())?;
    let ino = image_lookup(&vol, dir).map_err(|e| e.to_string())?.ino;
    match change {
        Change::Show => {}
        Change::Set(n) => vol.set_quota(ino, Some(*n)).map_err(|e| e.to_string())?,
        Change::Remove => vol.set_quota(ino, None).map_err(|e| e.to_string())?,
    }
    let q = vol.quota(ino).map_err(|e| e.to_string())?;
    if !matches!(change, Change::Show) {
        vol.close().map_err(|e| e.to_string())?;
    }
    Ok(q.map(|q| (q.limit, q.used)))
}

/// Change or read the quota through a mount's virtual xattrs.
fn on_mount(dir: &Path, change: &Change) -> Result<Option<(u64, u64)>, String> {
    let text = |e: std::io::Error| match e.raw_os_error() {
        Some(libc::EPERM) => "only root may set or remove a quota".to_string(),
        Some(libc::ENOTSUP) => "not a directory on a dxfs mount whose volume allows quotas".to_string(),
        _ => e.to_string(),
    };
    match change {
        Change::Show => {}
        Change::Set(n) => xattr::set(dir, QUOTA_XATTR, n.to_string().as_bytes()).map_err(text)?,
        Change::Remove => match xattr::remove(dir, QUOTA_XATTR) {
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            r => r.map_err(text)?,
        },
    }
    let number = |name: &str| -> Result<Option<u64>, String> {
        match xattr::get(dir, name) {
            Ok(Some(v)) => std::str::from_utf8(&v)
                .ok()
                .and_then(|s| s.parse().ok())
                .map(Some)
                .ok_or_else(|| format!("{name}: not a number")),
            Ok(None) => Ok(None),
            Err(e) => Err(text(e)),
        }
    };
    let Some(limit) = number(QUOTA_XATTR)? else { return Ok(None) };
    Ok(Some((limit, number(QUOTA_USED_XATTR)?.unwrap_or(0))))
}
