//! What a volume keeps of its past: volume snapshots and writable clones
//! by epoch, per-file snapshots, close versions (owed, batched, recorded
//! in the version log, pruned by policy), and the version directories
//! that show them (`foo@`, `foo@N`, `dir@N/foo`).

pub(crate) mod clone;
pub(crate) mod close;
pub(crate) mod fileversions;
pub(crate) mod logcompact;
pub(crate) mod owed;
pub mod policy;
pub mod snap;
pub mod versions;
pub(crate) mod vindex;
pub mod vrecord;
