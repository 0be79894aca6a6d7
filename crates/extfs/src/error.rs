//! What can be wrong with a file system found on a volume.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ExtError {
    /// No ext2/3/4 superblock magic at byte 1024.
    #[error("no ext2/3/4 file system at the start of the volume (superblock magic {found:#06x}, want 0xef53)")]
    NotExt { found: u16 },
    /// A superblock or descriptor field outside what ext allows.
    #[error("corrupt ext superblock or group descriptor: {0}")]
    Corrupt(String),
    /// Well-formed, but using a feature whose blocks this parser cannot
    /// account for: refusing is safe, guessing is not.
    #[error("unsupported ext feature: {0}")]
    Unsupported(String),
    /// The file system must be consistent on disk before its bitmaps mean
    /// anything (mounted, dirty, or with a journal to replay).
    #[error("file system is not clean: {0}")]
    NotClean(String),
    #[error("reading the volume at byte {offset}: {message}")]
    Read { offset: u64, message: String },
}

pub type Result<T> = std::result::Result<T, ExtError>;

/// Shorthand for a validation failure.
pub(crate) fn corrupt(msg: impl Into<String>) -> ExtError {
    ExtError::Corrupt(msg.into())
}
