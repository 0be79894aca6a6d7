//! Store errors. Damage read from a device is always a value naming the
//! node, never a panic.

use tarn_format::{FormatError, Pba};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("reading store node {pba} of tree {tree:#x} on {device}: {source}")]
    Read { pba: Pba, tree: u64, device: String, source: std::io::Error },
    #[error("writing store node {pba} on {device}: {source}")]
    Write { pba: Pba, device: String, source: std::io::Error },
    #[error("store node {pba} of tree {tree:#x} (level {level}) on {device} is damaged: {source}")]
    Corrupt { pba: Pba, tree: u64, level: u8, device: String, source: FormatError },
    #[error("store node {pba} of tree {tree:#x}: {what}")]
    Invalid { pba: Pba, tree: u64, what: String },
    /// The counts a checkpoint recorded beside a map's root disagree with
    /// its entries (a damaged or forged catalog): found when a change
    /// would take them below zero or past `u64`.
    #[error("the counts of map tree {tree:#x} disagree with its entries ({what})")]
    Counts { tree: u64, what: &'static str },
    #[error("no space left for store nodes")]
    NoSpace,
    /// Only inside [`crate::without_io`]: the node is not cached; load it
    /// with [`crate::fetch`] outside the caller's lock and try again.
    #[error("store node {} of tree {:#x} is not cached", .0.pba, .0.tree)]
    Miss(crate::Miss),
    #[error("metadata cache of {bytes} bytes cannot hold one path from root to leaf (needs at least {needed})")]
    CacheTooSmall { bytes: usize, needed: usize },
}

pub type Result<T> = std::result::Result<T, StoreError>;
