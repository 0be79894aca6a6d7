//! A file's data on its way to and from the pool: where it is placed
//! (layout rules per file), written behind the FUSE reply, and read ahead
//! for sequential readers.

pub(crate) mod layout;
pub mod layoutrules;
pub mod readahead;
pub mod writebehind;
