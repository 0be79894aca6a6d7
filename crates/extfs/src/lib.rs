//! ext2/3/4 as tarn sees it from below: a guest file system on a volume,
//! parsed read-only to learn which blocks it uses (gray-box reclaim, VA
//! seed 000) and which are metadata (file-system hints, seed 002).
//!
//! Everything here is read from a disk a guest wrote, so nothing is
//! trusted: every field is validated at decode, every loop is bounded by
//! the superblock's validated geometry, and errors are typed. A wrong
//! answer must never cost data: callers use what this crate says only to
//! free blocks the file system itself marks free in a consistent snapshot.

pub mod classify;
pub mod error;
pub mod free;
pub mod groups;
pub mod inode;
pub mod source;
pub mod superblock;

pub use classify::{classify, MetaKind, MetadataMap};
pub use error::ExtError;
pub use free::{free_byte_ranges, FreeSummary};
pub use groups::{GroupDesc, Groups};
pub use source::{BlockSource, SliceSource};
pub use superblock::{Superblock, SUPERBLOCK_OFFSET};
