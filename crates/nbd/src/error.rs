//! Typed errors of the NBD crate.
//!
//! * [`ExportError`] is what an [`crate::Export`] returns; it is mapped to an
//!   NBD error value (errno) only at the wire boundary ([`ExportError::errno`]).
//! * [`ProtocolError`] is returned by the pure decoders in [`crate::protocol`].
//! * [`NbdError`] is the error of a connection or handshake as a whole.

use crate::protocol;
// Defined beside the decoders that return it, so that protocol.rs needs
// nothing from this module (dependencies run error -> protocol).
pub use crate::protocol::ProtocolError;

/// Error an export returns; mapped to an NBD errno at this boundary only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    /// Input/output error (`NBD_EIO`).
    #[error("input/output error")]
    Io,
    /// Operation not permitted (`NBD_EPERM`).
    #[error("operation not permitted")]
    Perm,
    /// No space left on device (`NBD_ENOSPC`).
    #[error("no space left on device")]
    NoSpace,
    /// Invalid argument (`NBD_EINVAL`).
    #[error("invalid argument")]
    Invalid,
    /// Operation not supported (`NBD_ENOTSUP`), e.g. a fast zero that is not fast.
    #[error("operation not supported")]
    NotSupported,
    /// Value too large (`NBD_EOVERFLOW`).
    #[error("value too large")]
    Overflow,
    /// Server is shutting down (`NBD_ESHUTDOWN`).
    #[error("server is shutting down")]
    Shutdown,
}

impl ExportError {
    /// The NBD error value sent on the wire for this error.
    pub fn errno(self) -> u32 {
        match self {
            ExportError::Io => protocol::NBD_EIO,
            ExportError::Perm => protocol::NBD_EPERM,
            ExportError::NoSpace => protocol::NBD_ENOSPC,
            ExportError::Invalid => protocol::NBD_EINVAL,
            ExportError::NotSupported => protocol::NBD_ENOTSUP,
            ExportError::Overflow => protocol::NBD_EOVERFLOW,
            ExportError::Shutdown => protocol::NBD_ESHUTDOWN,
        }
    }
}

/// Error of a connection (handshake or transmission phase).
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol error: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("client did not finish the handshake in time")]
    HandshakeTimeout,
    #[error("client sent too many options ({0})")]
    TooManyOptions(usize),
    #[error("option {option} has an absurd length {length}")]
    OptionTooLong { option: u32, length: u32 },
    #[error("client requested unknown export {0:?} with NBD_OPT_EXPORT_NAME")]
    UnknownExport(String),
    #[error("client is not fixed-newstyle and sent option {0}")]
    NotFixedNewstyle(u32),
    #[error("client aborted the handshake")]
    Aborted,
    #[error("server is shutting down")]
    ShuttingDown,
    /// The TLS handshake failed (e.g. a client certificate that does not
    /// verify) or a TLS record was bad.
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("client sent NBD_OPT_EXPORT_NAME after negotiating extended headers")]
    ExportNameAfterExtendedHeaders,
    #[error("client sent option {0} before STARTTLS to a server that requires TLS")]
    TlsRequired(u32),
}
