//! The top of the engine: creating and opening pools (`open.rs`),
//! replacing and resyncing mirror legs (`resilver.rs`), rebuilding a lost
//! member from parity rows (`rebuild.rs`), copying a present member onto
//! a new device (`replace.rs`), the pace of those background copies
//! (`pace.rs`: a rate, and yielding to clients), and the service
//! that runs a pool's background threads.

mod background;
pub mod grow;
pub mod open;
pub mod pace;
pub mod rebuild;
pub mod replace;
pub mod resilver;

pub use background::{Notice, Service, ServiceOptions};
