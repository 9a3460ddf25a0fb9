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

/// An entry's result in an import that may go on past errors: with `going_on`, an
/// error is reported there and passed over, unless the volume itself has stopped
/// (`Error::Failed`); without, it ends the import.
#[cfg(feature = "host-tools")]
fn go_on(r: Result<(), PathError>, going_on: &mut Option<&mut dyn FnMut(PathError)>) -> Result<(), PathError> {
    match (r, going_on) {
        (Err(e), Some(report)) if !matches!(e.error, crate::error::Error::Failed) => {
            report(e);
            Ok(())
        }
        (r, _) => r,
    }
}

/// The buffer [`copy_contents`] reads through: one per import, not one per file (an
/// allocation of this size per small file doubled an import's time).
#[cfg(feature = "host-tools")]
fn copy_buffer() -> Vec<u8> {
    vec![0u8; 256 * crate::disk::codec::BLOCK_SIZE]
}

/// Copy what `src` reads into file `ino` from offset 0 through `buf`, leaving whole zero
/// blocks as holes, and set the size to what was read (a file may end in a hole).
/// Returns the bytes copied; a read error comes as `Error::Io`.
#[cfg(feature = "host-tools")]
fn copy_contents(
    vol: &crate::volume::Volume,
    ino: u64,
    src: &mut impl std::io::Read,
    buf: &mut [u8],
) -> crate::error::Result<u64> {
    use crate::disk::codec::BLOCK_SIZE;
    let mut off = 0u64;
    loop {
        // The buffer is filled before it is written (a reader may hand out its data in
        // pieces), so every write but the last starts and ends on a block boundary.
        let mut n = 0;
        while n < buf.len() {
            match src.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(crate::error::Error::Io(e)),
            }
        }
        if n == 0 {
            break;
        }
        for (k, chunk) in buf[..n].chunks(BLOCK_SIZE).enumerate() {
            if chunk.len() < BLOCK_SIZE || chunk.iter().any(|&b| b != 0) {
                vol.write(ino, off + (k * BLOCK_SIZE) as u64, chunk)?;
            }
        }
        off += n as u64;
    }
    vol.setattr(ino, &crate::volume::SetAttr { size: Some(off), ..Default::default() })?;
    Ok(off)
}

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
