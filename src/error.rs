//! The one error type of the library, with the errno each variant maps to.

use std::fmt;

/// Everything that can go wrong in dxfs. More variants may come: match with a wildcard.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The device failed a read, write or flush.
    Io(std::io::Error),
    /// On-disk data failed a check (checksum, magic, bounds). Never trusted.
    Corrupt(String),
    /// Out of space (ENOSPC).
    NoSpace,
    /// A directory quota above the change has no room for it (EDQUOT).
    QuotaExceeded,
    /// A rename or link would move blocks between directories under different quotas
    /// (EXDEV: copy and remove instead, as `mv` does).
    CrossDevice,
    /// No such file or directory (ENOENT).
    NotFound,
    /// Entry already exists (EEXIST).
    Exists,
    /// Not a directory (ENOTDIR).
    NotDir,
    /// Is a directory (EISDIR).
    IsDir,
    /// Directory not empty (ENOTEMPTY).
    NotEmpty,
    /// A name is longer than 255 bytes (ENAMETOOLONG).
    NameTooLong,
    /// An argument is not valid (EINVAL).
    Invalid(String),
    /// No such extended attribute (ENODATA).
    NoData,
    /// A buffer is too small (ERANGE).
    Range,
    /// Too many hard links (EMLINK).
    TooManyLinks,
    /// The volume is read-only (EROFS).
    ReadOnly,
    /// The file is too large (EFBIG).
    FileTooBig,
    /// An operation is not permitted (EPERM).
    NotPermitted,
    /// An xattr value or set is too large (E2BIG).
    TooBig,
    /// Not supported here, e.g. an unknown xattr namespace (EOPNOTSUPP).
    NotSupported,
    /// Permission denied by mode bits or ACL (EACCES).
    AccessDenied,
    /// The volume is in use: another process holds it open read-write (EBUSY).
    Busy(String),
    /// The volume stopped accepting changes after an earlier failure (a commit that failed
    /// half way, or a panic in the volume): memory may no longer match any state on disk,
    /// which still holds the last committed delta. Reported as EIO; remount to recover.
    Failed,
    /// Control flow between the volume's layers, opaque outside the crate: never returned
    /// by the library; EIO if it ever were.
    Internal(Internal),
}

/// What [`Error::Internal`] carries: nothing a caller can make or look into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Internal(Flow);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// A metadata block an operation needs is not cached, and the operation puts the
    /// device read off until it has let go of its locks, then starts again
    /// (`engine::deferred`).
    Missed,
    /// An operation asked not to wait (`Volume::try_write`,
    /// `Volume::unless_it_waits_for_requests`) would have had to wait; nothing was changed.
    WouldWait,
}

impl Error {
    /// [`Flow::Missed`].
    pub(crate) fn missed() -> Error {
        Error::Internal(Internal(Flow::Missed))
    }

    /// [`Flow::WouldWait`].
    pub(crate) fn would_wait() -> Error {
        Error::Internal(Internal(Flow::WouldWait))
    }

    pub(crate) fn is_missed(&self) -> bool {
        matches!(self, Error::Internal(Internal(Flow::Missed)))
    }

    pub(crate) fn is_would_wait(&self) -> bool {
        matches!(self, Error::Internal(Internal(Flow::WouldWait)))
    }

    /// The errno this error is reported as through FUSE.
    pub fn errno(&self) -> i32 {
        match self {
            // The storage under the volume ran out (a sparse image's host file system):
            // the caller's write failed for want of space, whatever happens after.
            Error::Io(e)
                if e.kind() == std::io::ErrorKind::StorageFull || e.kind() == std::io::ErrorKind::QuotaExceeded =>
            {
                libc::ENOSPC
            }
            Error::Io(_) => libc::EIO,
            // As ext4 and XFS: "structure needs cleaning", which fsck does.
            Error::Corrupt(_) => libc::EUCLEAN,
            Error::NoSpace => libc::ENOSPC,
            Error::QuotaExceeded => libc::EDQUOT,
            Error::CrossDevice => libc::EXDEV,
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::Invalid(_) => libc::EINVAL,
            Error::NoData => libc::ENODATA,
            Error::Range => libc::ERANGE,
            Error::TooManyLinks => libc::EMLINK,
            Error::ReadOnly => libc::EROFS,
            Error::FileTooBig => libc::EFBIG,
            Error::NotPermitted => libc::EPERM,
            Error::TooBig => libc::E2BIG,
            Error::NotSupported => libc::EOPNOTSUPP,
            Error::AccessDenied => libc::EACCES,
            Error::Busy(_) => libc::EBUSY,
            Error::Failed | Error::Internal(_) => libc::EIO,
        }
    }

    /// Shorthand for a corruption error.
    pub fn corrupt(msg: impl Into<String>) -> Error {
        Error::Corrupt(msg.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "I/O error: {e}"),
            Error::Corrupt(m) => write!(f, "corrupt volume: {m}"),
            Error::NoSpace => f.write_str("no space left on volume"),
            Error::QuotaExceeded => f.write_str("directory quota exceeded"),
            Error::CrossDevice => f.write_str("the directories are under different quotas"),
            Error::NotFound => f.write_str("no such file or directory"),
            Error::Exists => f.write_str("file exists"),
            Error::NotDir => f.write_str("not a directory"),
            Error::IsDir => f.write_str("is a directory"),
            Error::NotEmpty => f.write_str("directory not empty"),
            Error::NameTooLong => f.write_str("file name too long"),
            Error::Invalid(m) => write!(f, "invalid argument: {m}"),
            Error::NoData => f.write_str("no such attribute"),
            Error::Range => f.write_str("buffer too small"),
            Error::TooManyLinks => f.write_str("too many links"),
            Error::ReadOnly => f.write_str("read-only volume"),
            Error::FileTooBig => f.write_str("file too large"),
            Error::NotPermitted => f.write_str("operation not permitted"),
            Error::TooBig => f.write_str("attribute too large"),
            Error::NotSupported => f.write_str("operation not supported"),
            Error::AccessDenied => f.write_str("permission denied"),
            Error::Busy(m) => write!(f, "volume busy: {m}"),
            Error::Failed => f.write_str("the volume failed earlier and accepts no more changes; remount to recover"),
            Error::Internal(Internal(Flow::Missed)) => {
                f.write_str("a metadata block was not cached (internal: the operation starts again)")
            }
            Error::Internal(Internal(Flow::WouldWait)) => {
                f.write_str("the operation would wait for room (internal: it is done elsewhere)")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

/// Result with the dxfs error.
pub type Result<T> = std::result::Result<T, Error>;
