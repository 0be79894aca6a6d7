//! Typed replies -> the bytes the kernel reads (the out header is the
//! transport's: `dev.rs` writes it before these bytes, `uring.rs` into
//! the entry's header buffer).

use crate::abi::{self, OUT_HEADER};
use std::time::Duration;

/// `struct fuse_attr`, times in nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    /// File type and permission bits (st_mode).
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// A device node's number.
    pub rdev: u32,
    pub blksize: u32,
}

/// `struct fuse_entry_out`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Entry {
    pub attr: Attr,
    pub generation: u64,
    pub entry_ttl: Duration,
    pub attr_ttl: Duration,
}

/// What this server answers INIT with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InitOut {
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u64,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub max_pages: u16,
}

/// `struct fuse_kstatfs`, the fields a server sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Statfs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// A handler's answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// FORGET, BATCH_FORGET and INTERRUPT get none.
    None,
    Error(i32),
    Empty,
    Entry(Entry),
    Attr {
        attr: Attr,
        ttl: Duration,
    },
    Open {
        fh: u64,
        flags: u32,
    },
    Create {
        entry: Entry,
        fh: u64,
        flags: u32,
    },
    Written(u32),
    Data(Vec<u8>),
    Statfs(Statfs),
    XattrSize(u32),
    Lseek(u64),
    Init(InitOut),
}

/// Little-endian field writer.
trait Put {
    fn u16(&mut self, v: u16);
    fn u32(&mut self, v: u32);
    fn u64(&mut self, v: u64);
}

impl Put for Vec<u8> {
    fn u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes())
    }
    fn u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes())
    }
}

/// Seconds and nanoseconds of a time in nanoseconds (before the epoch:
/// negative seconds, as the kernel reads them).
fn split_time(ns: i64) -> (u64, u32) {
    (ns.div_euclid(1_000_000_000) as u64, ns.rem_euclid(1_000_000_000) as u32)
}

fn put_attr(out: &mut Vec<u8>, a: &Attr) {
    let (at, an) = split_time(a.atime);
    let (mt, mn) = split_time(a.mtime);
    let (ct, cn) = split_time(a.ctime);
    for v in [a.ino, a.size, a.blocks, at, mt, ct] {
        out.u64(v);
    }
    // atimensec, mtimensec, ctimensec, mode, nlink, uid, gid, rdev, blksize, flags
    for v in [an, mn, cn, a.mode, a.nlink, a.uid, a.gid, a.rdev, a.blksize, 0] {
        out.u32(v);
    }
}

fn put_entry(out: &mut Vec<u8>, e: &Entry) {
    out.u64(e.attr.ino);
    out.u64(e.generation);
    out.u64(e.entry_ttl.as_secs());
    out.u64(e.attr_ttl.as_secs());
    out.u32(e.entry_ttl.subsec_nanos());
    out.u32(e.attr_ttl.subsec_nanos());
    put_attr(out, &e.attr);
}

fn put_init(out: &mut Vec<u8>, i: &InitOut) {
    out.u32(abi::KERNEL_MAJOR);
    out.u32(i.minor);
    out.u32(i.max_readahead);
    out.u32(i.flags as u32);
    out.u16(i.max_background);
    out.u16(i.congestion_threshold);
    out.u32(i.max_write);
    out.u32(1); // time_gran: nanoseconds
    out.u16(i.max_pages);
    out.u16(0); // map_alignment
    out.u32((i.flags >> 32) as u32);
    out.u32(0); // max_stack_depth
    out.extend_from_slice(&[0; 24]);
}

fn put_statfs(out: &mut Vec<u8>, s: &Statfs) {
    for v in [s.blocks, s.bfree, s.bavail, s.files, s.ffree] {
        out.u64(v);
    }
    for v in [s.bsize, s.namelen, s.frsize, 0, 0, 0, 0, 0, 0, 0] {
        out.u32(v);
    }
}

impl Reply {
    pub fn is_ok(&self) -> bool {
        !matches!(self, Reply::Error(_))
    }

    /// Appends the reply's arguments to `out`; returns the out header's
    /// error field (0 or a negative errno).
    pub fn encode(&self, out: &mut Vec<u8>) -> i32 {
        match self {
            Reply::None | Reply::Empty => {}
            Reply::Error(errno) => return -errno.abs(),
            Reply::Entry(e) => put_entry(out, e),
            Reply::Attr { attr, ttl } => {
                out.u64(ttl.as_secs());
                out.u32(ttl.subsec_nanos());
                out.u32(0);
                put_attr(out, attr);
            }
            Reply::Open { fh, flags } => put_open(out, *fh, *flags),
            Reply::Create { entry, fh, flags } => {
                put_entry(out, entry);
                put_open(out, *fh, *flags);
            }
            Reply::Written(n) | Reply::XattrSize(n) => {
                out.u32(*n);
                out.u32(0);
            }
            Reply::Data(d) => out.extend_from_slice(d),
            Reply::Statfs(s) => put_statfs(out, s),
            Reply::Lseek(at) => out.u64(*at),
            Reply::Init(i) => put_init(out, i),
        }
        0
    }
}

fn put_open(out: &mut Vec<u8>, fh: u64, flags: u32) {
    out.u64(fh);
    out.u32(flags);
    out.u32(0);
}

/// `struct fuse_out_header` for a reply of `args` bytes.
pub fn out_header(unique: u64, error: i32, args: usize) -> [u8; OUT_HEADER] {
    let mut h = Vec::with_capacity(OUT_HEADER);
    h.u32((OUT_HEADER + args) as u32);
    h.u32(error as u32);
    h.u64(unique);
    let mut out = [0; OUT_HEADER];
    out.copy_from_slice(&h);
    out
}

/// A notification's bytes after its header: FUSE_NOTIFY_INVAL_INODE's
/// fuse_notify_inval_inode_out (offset -1: attributes only).
pub fn inval_inode(ino: u64, offset: i64, len: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.u64(ino);
    out.u64(offset as u64);
    out.u64(len as u64);
    out
}

/// Appends one `struct fuse_dirent` (name padded to 8 bytes) if it fits
/// in `max` bytes in all; false when it does not.
pub fn add_dirent(out: &mut Vec<u8>, max: usize, ino: u64, cookie: u64, typ: u32, name: &[u8]) -> bool {
    let len = (24 + name.len()).next_multiple_of(8);
    if out.len() + len > max {
        return false;
    }
    out.u64(ino);
    out.u64(cookie);
    out.u32(name.len() as u32);
    out.u32(typ);
    out.extend_from_slice(name);
    out.resize(out.len() + len - 24 - name.len(), 0);
    true
}
