//! The engine's typed error. Running out of space and corruption are values;
//! callers map them to their own vocabulary (NBD errno, CLI messages).

use tarn_format::FormatError;
use tarn_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{op} on device {device}: {source}")]
    Io { op: &'static str, device: String, source: std::io::Error },
    #[error("device {device} holds no valid tarn pool: {detail}")]
    NotAPool { device: String, detail: String },
    #[error("corrupt {what} on device {device}: {source}")]
    Corrupt { what: &'static str, device: String, source: FormatError },
    #[error("inconsistent pool metadata: {0}")]
    Inconsistent(String),
    #[error(
        "device {device} holds a pool in format {version}, written by an older tarn; \
         convert it with `tarn pool upgrade` (nothing was changed)"
    )]
    NeedsUpgrade { device: String, version: u32 },
    #[error("device {device} does not belong to this pool: {detail}")]
    ForeignDevice { device: String, detail: String },
    #[error("member {member} of the pool is unavailable: {detail}")]
    MemberUnavailable { member: usize, detail: String },
    #[error("no space left in the pool")]
    NoSpace,
    /// A write made without commits (`Pool::write_reserved`) needs one
    /// first (a feature to enable, overwrite regions to open, a full or
    /// growing pool): write it again the ordinary way.
    #[error("the write needs a commit first")]
    NeedsCommit,
    /// A write would allocate past the volume's quota (ENOSPC on the
    /// wire). Distinct from `NoSpace`: it never grows the pool.
    #[error("volume {volume:?} is at its quota of {quota} bytes ({used} used)")]
    QuotaExceeded { volume: String, quota: u64, used: u64 },
    #[error("quota {quota} bytes of volume {volume:?} is below its current use of {used} bytes; free space or pick a larger quota")]
    QuotaBelowUse { volume: String, quota: u64, used: u64 },
    #[error("virtual sizes would reach {virtual_after} bytes, over the overcommit ratio {ratio} of the pool's {pool} bytes; pass --force or raise it (pool set --overcommit)")]
    Overcommit { virtual_after: u64, pool: u64, ratio: String },
    #[error("no volume named {0:?}")]
    NoSuchVolume(String),
    #[error("volume id {0} no longer exists")]
    VolumeGone(u32),
    #[error("a volume named {0:?} already exists")]
    VolumeExists(String),
    #[error("volume {volume:?} has no snapshot named {name:?}")]
    NoSuchSnapshot { volume: String, name: String },
    #[error("volume {volume:?} already has a snapshot named {name:?}")]
    SnapshotExists { volume: String, name: String },
    #[error("{what} is in use: {detail}")]
    InUse { what: String, detail: String },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{op} of {len} bytes at offset {offset} is outside volume {volume} (size {size})")]
    OutOfRange { op: &'static str, volume: String, offset: u64, len: u64, size: u64 },
    #[error("the pool was opened read-only")]
    ReadOnly,
    #[error("the pool is fenced after a failed commit; restart to recover from the last commit")]
    Fenced,
    #[error("data at block {block} of device {device} failed its checksum on every copy (stored {expected:#010x}, read {found:#010x})")]
    Checksum { device: String, block: u64, expected: u32, found: u32 },
    #[error("operation not supported: {0}")]
    NotSupported(&'static str),
    /// Pool metadata could not be read or broke an invariant (see `StateError`).
    #[error("pool metadata: {0}")]
    State(#[from] StateError),
}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        EngineError::State(StateError::Store(e))
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;

/// Why an op was not applied.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The op does not fit the state (a bug, or a damaged journal at
    /// replay); it changed nothing.
    #[error("{0}")]
    Refused(String),
    /// The state breaks an invariant: damaged metadata got past decoding.
    /// The change may be half done: the pool must not commit it.
    #[error("metadata invariant broken: {0}")]
    Invariant(String),
    /// A map node could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<String> for StateError {
    fn from(s: String) -> Self {
        StateError::Refused(s)
    }
}

impl From<&str> for StateError {
    fn from(s: &str) -> Self {
        StateError::Refused(s.to_string())
    }
}

impl EngineError {
    pub fn io(op: &'static str, device: String, source: std::io::Error) -> Self {
        EngineError::Io { op, device, source }
    }
}
