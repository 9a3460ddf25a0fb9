//! Offline tools at fsck's layer: they read and write a volume through the same layers
//! fsck does. [`inspect`] is the read-only inspector behind `dxfs debug`; with the
//! `host-tools` feature, [`import`] (`mkfs -d`) and [`export`] copy trees between a host
//! directory and a volume, and [`import_tar`] (`mkfs -d ARCHIVE`) unpacks a tar archive.

#[cfg(feature = "host-tools")]
pub mod export;
#[cfg(feature = "host-tools")]
pub mod import;
#[cfg(feature = "host-tools")]
pub mod import_tar;
pub mod inspect;

/// An error met at a host or volume path while copying a tree: the path and the error,
/// whose kind is kept (`NoSpace` stays `NoSpace`).
#[derive(Debug)]
pub struct PathError {
    pub path: std::path::PathBuf,
    pub error: crate::error::Error,
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.error)
    }
}

impl std::error::Error for PathError {}

/// What an import (`import`, `import_tar`) copied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportStats {
    /// Inodes made (directories, files, links' targets once).
    pub inodes: u64,
    /// Extra names given to an inode already copied.
    pub hard_links: u64,
    /// Bytes of file data copied.
    pub bytes: u64,
    pub xattrs: u64,
}
