//! Pool members: a mirrored member is one `MirrorDevice` over 2-4 legs
//! (`mirror.rs`); `assemble.rs` finds which device is which member and leg
//! at open; `rebuild.rs` stands in for a plain member that is missing or
//! being rebuilt from parity rows. Below the pool: knows devices and labels, never a `Pool`.

pub(crate) mod assemble;
pub mod mirror;
pub mod rebuild;
pub(crate) mod spare;
