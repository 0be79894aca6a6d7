//! Data integrity on a pool: verified reads and self-heal (`verify.rs`),
//! the resync of overwrite regions a crash left open (`resync.rs`), scrub
//! (`scrub.rs`) and the metadata checker (`check.rs`). Uses the pool core
//! (`pool/`) and never commits: callers above (`commit/`, `io/`, the
//! service) do.

pub mod check;
pub mod resync;
pub mod scrub;
pub mod split;
pub mod verify;
