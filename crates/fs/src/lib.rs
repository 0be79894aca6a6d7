//! tarn file volumes (docs/ARCHITECTURE.md *File volumes*): every regular
//! file, directory and long symlink is an engine object (a hidden thin
//! volume), so its data has the pool's allocator, placement, checksums
//! and mirrors, and a per-file snapshot later is an engine snapshot of
//! its object. The inode table is the file volume's own map. No FUSE
//! here: `tarn-fuse` adapts this API.

pub mod data;
pub mod error;
pub mod history;
pub mod namespace;

pub use data::layoutrules::{LayoutRule, LayoutSpec};
pub use error::{FsError, Result};
pub use history::logcompact::{MIN_FREE, STEP};
pub use history::owed::{Change, OWED_BOUND};
pub use history::snap::{FsSnapshot, VersionKind};
pub use history::versions::{Node, Versioned};
pub use namespace::acl::AclKind;
pub use namespace::check::CheckReport;
pub use namespace::inode::{Inode, Kind};
pub use namespace::ns::{Attr, DirEntry, FileVolume, NewMode, SetAttr, StatFs};
pub use namespace::rename::RenameMode;
pub use namespace::xattr::XattrMode;

/// Each object is a thin volume of this size (16 TiB).
pub const OBJECT_SIZE: u64 = 1 << 44;
/// Largest file: the object less its extended attributes' area at the
/// end (`xattr::AREA`, 512 KiB).
pub const MAX_FILE_SIZE: u64 = OBJECT_SIZE - namespace::xattr::AREA;
/// Inode numbers are below this: the inode table's size / 256.
pub const MAX_INODES: u64 = 1 << 32;
/// The root directory's inode.
pub const ROOT: u64 = 1;
