//! Metadata on the devices: the journal of op records (`journal.rs`),
//! store checkpoints (`catalog.rs`: freeze, write, adopt the trees; the
//! catalog) and their segments plus the format 1 whole-state decoder kept
//! for upgrades (`checkpoint.rs`). No `Pool`: the commit (`commit/`) and
//! the open (`service/`) drive them.

pub(crate) mod catalog;
pub(crate) mod checkpoint;
pub(crate) mod journal;
