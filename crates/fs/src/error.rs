//! tarn-fs's typed error and its errno (the FUSE adapter answers with it).

use tarn_engine::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name longer than {max} bytes", max = crate::namespace::dir::MAX_NAME)]
    NameTooLong,
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("file too large (at most {max} bytes)", max = crate::MAX_FILE_SIZE)]
    TooLarge,
    #[error("the file volume's quota is reached")]
    Quota,
    #[error("too many links")]
    TooManyLinks,
    #[error("no file volume named {0:?}")]
    NoSuchVolume(String),
    #[error("read-only: {0}")]
    ReadOnly(&'static str),
    #[error("file volume {volume:?} has no snapshot {name:?}")]
    NoSuchSnapshot { volume: String, name: String },
    #[error("no such extended attribute")]
    NoData,
    #[error("extended attributes: only user.* names are kept (tarn's own: user.tarn.*)")]
    NotSupported,
    #[error("extended attributes: {0}")]
    XattrRange(&'static str),
    #[error("extended attribute value longer than {max} bytes", max = crate::namespace::xattr::MAX_VALUE)]
    XattrTooBig,
    #[error("extended attributes of one inode take at most {max} bytes", max = crate::namespace::xattr::MAX_SET)]
    XattrSpace,
    #[error("operation not permitted: {0}")]
    NotPermitted(&'static str),
    /// What was read from an object does not decode: never trusted.
    #[error("corrupt {what} (inode {ino}): {detail}")]
    Corrupt { what: &'static str, ino: u64, detail: String },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

pub type Result<T> = std::result::Result<T, FsError>;

impl FsError {
    pub(crate) fn corrupt(what: &'static str, ino: u64, detail: impl Into<String>) -> FsError {
        FsError::Corrupt { what, ino, detail: detail.into() }
    }

    /// The errno a POSIX caller sees.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound | FsError::NoSuchVolume(_) | FsError::NoSuchSnapshot { .. } => libc::ENOENT,
            FsError::ReadOnly(_) => libc::EROFS,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::TooLarge => libc::EFBIG,
            FsError::Quota => libc::EDQUOT,
            FsError::TooManyLinks => libc::EMLINK,
            FsError::Corrupt { .. } => libc::EIO,
            FsError::NoData => libc::ENODATA,
            FsError::NotSupported => libc::ENOTSUP,
            FsError::XattrRange(_) => libc::ERANGE,
            FsError::XattrTooBig => libc::E2BIG,
            FsError::XattrSpace => libc::ENOSPC,
            FsError::NotPermitted(_) => libc::EPERM,
            FsError::Engine(e) => engine_errno(e),
        }
    }
}

fn engine_errno(e: &EngineError) -> i32 {
    match e {
        EngineError::NoSpace => libc::ENOSPC,
        EngineError::QuotaExceeded { .. } => libc::EDQUOT,
        EngineError::ReadOnly => libc::EROFS,
        EngineError::SnapshotExists { .. } => libc::EEXIST,
        EngineError::OutOfRange { .. } => libc::EFBIG,
        EngineError::InvalidArgument(_) => libc::EINVAL,
        _ => libc::EIO,
    }
}
