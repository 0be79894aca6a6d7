//! The FUSE kernel ABI this server speaks (include/uapi/linux/fuse.h):
//! opcodes, flags and the sizes of the structures it reads and writes.
//! Structures are read and written field by field, little-endian
//! (`decode.rs`, `reply.rs`), so nothing here is `repr(C)`.

/// The protocol version this server answers INIT with (7.42 has
/// FUSE_OVER_IO_URING; an older kernel gets its own minor back).
pub const KERNEL_MAJOR: u32 = 7;
pub const KERNEL_MINOR: u32 = 42;

pub const IN_HEADER: usize = 40;
pub const OUT_HEADER: usize = 16;

pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
}

/// INIT flags (the first 32 bits; `flags2` holds bits 32..63).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const BIG_WRITES: u64 = 1 << 5;
    /// The kernel leaves the umask to this server (it applies it unless
    /// the directory has a default access control list).
    pub const DONT_MASK: u64 = 1 << 6;
    /// The kernel checks permissions against POSIX access control lists
    /// it reads as `system.posix_acl_*` attributes (and turns on
    /// default_permissions); this server keeps them and the mode in step.
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    /// fuse_setxattr_in carries setxattr_flags (ACL_KILL_SGID).
    pub const SETXATTR_EXT: u64 = 1 << 29;
    /// The kernel reads `flags2` (the upper 32 bits).
    pub const INIT_EXT: u64 = 1 << 30;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// fuse_setattr_in.valid bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
}

/// fuse_setxattr_in with FUSE_SETXATTR_EXT (8 bytes without).
pub const SETXATTR_IN_EXT: usize = 16;
/// setxattr_flags: setting this access control list clears set-group-ID
/// (the caller is neither in the file's group nor CAP_FSETID).
pub const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;

/// FOPEN_KEEP_CACHE: the kernel keeps the file's page cache at open.
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
/// FUSE_WRITE_KILL_SUIDGID: this write drops the set-ID bits.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// fuse_notify_code FUSE_NOTIFY_INVAL_INODE.
pub const NOTIFY_INVAL_INODE: i32 = 2;

/// The io_uring transport (fs/fuse/dev_uring.c): the header buffer of a
/// ring entry is `struct fuse_uring_req_header`.
pub mod ring {
    /// `in_out`: the fuse_in_header of a request, the fuse_out_header of its reply.
    pub const IN_OUT: usize = 0;
    /// `op_in`: the request's first argument (its fixed-size struct).
    pub const OP_IN: usize = 128;
    pub const OP_IN_SIZE: usize = 128;
    /// `ring_ent_in_out`: flags u64, commit_id u64, payload_sz u32.
    pub const ENT_IN_OUT: usize = 256;
    pub const HEADER_SIZE: usize = 288;
    pub const CMD_REGISTER: u32 = 1;
    pub const CMD_COMMIT_AND_FETCH: u32 = 2;
}
