//! Decode errors. Corruption is always a value, never a panic.

/// Why a byte sequence is not a valid tarn structure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{what}: bad magic")]
    BadMagic { what: &'static str },
    #[error("{what}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    BadChecksum { what: &'static str, stored: u32, computed: u32 },
    #[error("{what}: truncated (needed {needed} bytes, had {had})")]
    Truncated { what: &'static str, needed: usize, had: usize },
    #[error("{what}: field {field} has invalid value {value}")]
    BadField { what: &'static str, field: &'static str, value: u64 },
    #[error("{what}: written for block {stored} but read from block {actual} (misdirected write)")]
    Misplaced { what: &'static str, stored: u64, actual: u64 },
    #[error("unsupported format version {0}")]
    UnsupportedVersion(u32),
    #[error("unsupported incompatible features {0:#x}")]
    UnsupportedFeatures(u64),
}

pub type Result<T> = std::result::Result<T, FormatError>;
