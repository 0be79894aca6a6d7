//! Metadata on the devices: the journal of op records (`journal.rs`) and
//! checkpoints of the whole state (`checkpoint.rs`): encode, write, read,
//! replay. No `Pool`: the commit (`commit/`) and the open (`service/`)
//! drive them.

pub(crate) mod checkpoint;
pub(crate) mod journal;
