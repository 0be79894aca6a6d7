//! The namespace: the inode table, directories and the operations on
//! them (create, link, rename, unlink, attributes, extended attributes),
//! and the offline check of it all.

pub mod acl;
pub mod check;
pub mod dir;
pub mod dirblock;
pub mod inode;
pub(crate) mod ns;
pub(crate) mod rename;
pub mod xattr;
