//! Pool members: a mirrored member is one `MirrorDevice` over 2-4 legs
//! (`mirror.rs`); `assemble.rs` finds which device is which member and leg
//! at open. Below the pool: knows devices and labels, never a `Pool`.

pub(crate) mod assemble;
pub mod mirror;
pub(crate) mod spare;
