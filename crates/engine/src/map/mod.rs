//! The pool state in memory: volumes and their extent maps
//! (`extent_map.rs`), snapshots' dead lists and every op's effect
//! (`state.rs`, the only place ops are applied), what a head or snapshot
//! shows (`view.rs`), and the data checksums (a store tree) and overwrite
//! regions (`sums.rs`). Pure data: no devices, no locks.

pub mod extent_map;
pub mod state;
pub mod sums;
pub mod view;
