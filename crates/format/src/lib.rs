//! tarn's on-disk format: every structure that reaches a device, its encoding,
//! and its validation. No I/O happens here. docs/FORMAT.md is the normative
//! description; the offsets and constants in this crate mirror it.

pub mod address;
pub mod catalog;
pub mod checkpoint;
pub mod checksum;
pub mod codec;
pub mod error;
pub mod journal;
pub mod leg;
pub mod node;
pub mod ops;
pub mod placement;
pub mod role;
pub mod stripe;
pub mod superblock;
pub mod trace;

pub use address::{Pba, BLOCK_SIZE};
pub use error::FormatError;
