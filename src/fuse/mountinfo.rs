//! Reading /proc/self/mountinfo: which mount is on a path, and where dxfs is mounted.
//! Reading it asks no file system anything, so it is safe while a mount is half set up.

use std::path::{Path, PathBuf};

/// (mount id, mount point, file system type) of each line, in mount order.
fn entries() -> Vec<(u64, PathBuf, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut f = left.split(' ');
            let id = f.next()?.parse().ok()?;
            let point = unescape(f.nth(3)?);
            Some((id, point, right.split(' ').next()?.to_string()))
        })
        .collect()
}

/// The id of the mount on `path`, the topmost if several are stacked there.
pub(super) fn mount_id_of(path: &Path) -> Option<u64> {
    let want = path.canonicalize().ok()?;
    entries().into_iter().rev().find(|(_, p, _)| *p == want).map(|(id, _, _)| id)
}

/// A FUSE mount's connection, named by its device number: an anonymous one (`0:N`) for
/// a plain mount, the block device's for a `fuseblk` mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Conn {
    major: u32,
    minor: u32,
}

impl Conn {
    /// Its directory under /sys/fs/fuse/connections (the kernel's `dev_t`, in decimal).
    pub(super) fn dir(self) -> String {
        format!("/sys/fs/fuse/connections/{}", (u64::from(self.major) << 20) | u64::from(self.minor))
    }

    /// Its backing device info under /sys/class/bdi (`fuse_bdi_init`'s name).
    pub(super) fn bdi(self) -> String {
        let suffix = if self.major == 0 { "" } else { "-fuseblk" };
        format!("/sys/class/bdi/{}:{}{suffix}", self.major, self.minor)
    }
}

/// The FUSE connection of the mount on `path`.
pub(super) fn connection_of(path: &Path) -> Option<Conn> {
    let want = path.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let dev = f.nth(2)?;
        let point = unescape(f.nth(1)?);
        let (major, minor) = dev.split_once(':')?;
        (point == want).then(|| Some(Conn { major: major.parse().ok()?, minor: minor.parse().ok()? })).flatten()
    })
}

/// Where volumes are mounted through FUSE as type `fuse.dxfs` (or `fuseblk.dxfs`).
pub fn dxfs_mounts() -> Vec<PathBuf> {
    entries().into_iter().filter(|(_, _, t)| t == "fuse.dxfs" || t == "fuseblk.dxfs").map(|(_, p, _)| p).collect()
}

/// Whether a dxfs mount of `image` is live: a `fuse.dxfs` mount whose source is the
/// image (an NBD address: spelled the same), or a `fuseblk.dxfs` one over a loop device
/// backed by it. Another process holding such an image for writing is its daemon, still
/// serving; one holding it with no mount left is a daemon finishing after `umount` (or a
/// tool).
pub fn image_is_mounted(image: &Path) -> bool {
    let want = image.canonicalize().ok();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines().filter_map(|l| l.split_once(" - ")).any(|(_, right)| {
        let mut f = right.split(' ');
        let (Some(kind), Some(source)) = (f.next(), f.next()) else { return false };
        if kind != "fuse.dxfs" && kind != "fuseblk.dxfs" {
            return false;
        }
        let source = unescape(source);
        if source == image {
            return true;
        }
        let Some(want) = &want else { return false };
        if source.canonicalize().is_ok_and(|p| p == *want) {
            return true;
        }
        // A loop device: its backing file, as the kernel names it.
        let name = source.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        name.starts_with("loop")
            && std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
                .is_ok_and(|b| Path::new(b.trim_end()).canonicalize().is_ok_and(|p| p == *want))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

#[cfg(test)]
mod tests {
    #[test]
    fn mountinfo_escapes() {
        assert_eq!(super::unescape("/mnt/a\\040b"), std::path::PathBuf::from("/mnt/a b"));
        assert_eq!(super::unescape("/plain"), std::path::PathBuf::from("/plain"));
        assert_eq!(super::unescape("/x\\134y"), std::path::PathBuf::from("/x\\y"));
    }

    #[test]
    fn the_root_mount_is_found() {
        assert!(super::mount_id_of(std::path::Path::new("/")).is_some());
        assert!(super::connection_of(std::path::Path::new("/")).is_some());
    }
}
