//! A request from the kernel -> a typed operation, for both transports:
//! /dev/fuse hands the arguments in one piece, the io_uring transport
//! hands the op's fixed struct (`op_in`) and the rest (the payload)
//! apart. Every length is checked: a short or malformed request is an
//! `Err(Malformed)` (answered EIO), never a panic.

use crate::abi::{self, op, IN_HEADER};

/// The request did not hold what its opcode needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// `struct fuse_in_header`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    /// Header and arguments, in bytes.
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// The fields of fuse_setattr_in a handler reads (`valid` says which hold).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetattrIn {
    pub valid: u32,
    pub size: u64,
    pub atime: (u64, u32),
    pub mtime: (u64, u32),
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// One request, its arguments borrowed from the transport's buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Op<'a> {
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u64,
    },
    Destroy,
    Lookup {
        name: &'a [u8],
    },
    Forget {
        nlookup: u64,
    },
    /// (nodeid, nlookup) pairs.
    BatchForget(Vec<(u64, u64)>),
    Interrupt,
    Getattr,
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        mode: u32,
        /// A device node's number (the kernel's encoding).
        rdev: u32,
        umask: u32,
        name: &'a [u8],
    },
    Mkdir {
        mode: u32,
        umask: u32,
        name: &'a [u8],
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a [u8],
        newname: &'a [u8],
    },
    Link {
        oldnodeid: u64,
        newname: &'a [u8],
    },
    Open {
        flags: u32,
    },
    Opendir,
    Read {
        offset: u64,
        size: u32,
    },
    Readdir {
        offset: u64,
        size: u32,
    },
    Write {
        offset: u64,
        write_flags: u32,
        data: &'a [u8],
    },
    Statfs,
    Release {
        fh: u64,
    },
    Releasedir,
    Fsync,
    Fsyncdir,
    Flush {
        fh: u64,
    },
    Setxattr {
        flags: u32,
        /// fuse_setxattr_in's `setxattr_flags` (FUSE_SETXATTR_EXT; 0 in
        /// the compat form).
        setxattr_flags: u32,
        name: &'a [u8],
        value: &'a [u8],
    },
    Getxattr {
        size: u32,
        name: &'a [u8],
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Create {
        mode: u32,
        umask: u32,
        name: &'a [u8],
    },
    Lseek {
        offset: u64,
        whence: u32,
    },
    /// An opcode this server does not implement (answered ENOSYS).
    Other(u32),
}

/// The arguments of a request: `fixed` (the op's struct, or everything
/// for /dev/fuse) is read first, then `rest`.
struct Args<'a> {
    fixed: &'a [u8],
    rest: &'a [u8],
}

impl<'a> Args<'a> {
    fn part(&mut self) -> &mut &'a [u8] {
        if self.fixed.is_empty() {
            &mut self.rest
        } else {
            &mut self.fixed
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let part = self.part();
        if part.len() < n {
            return Err(Malformed);
        }
        let (head, tail) = part.split_at(n);
        *part = tail;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, Malformed> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, Malformed> {
        let lo = self.u32()? as u64;
        Ok(lo | (self.u32()? as u64) << 32)
    }

    fn skip(&mut self, n: usize) -> Result<(), Malformed> {
        self.take(n).map(drop)
    }

    /// A NUL-terminated name (the NUL is consumed, not returned).
    fn name(&mut self) -> Result<&'a [u8], Malformed> {
        let part = self.part();
        let end = part.iter().position(|&b| b == 0).ok_or(Malformed)?;
        let name = &part[..end];
        *part = &part[end + 1..];
        Ok(name)
    }

    /// Everything left.
    fn remaining(&mut self) -> &'a [u8] {
        std::mem::take(self.part())
    }
}

/// The in header at the start of `buf`.
pub fn header(buf: &[u8]) -> Result<Header, Malformed> {
    let mut a = Args { fixed: buf.get(..IN_HEADER).ok_or(Malformed)?, rest: &[] };
    Ok(Header {
        len: a.u32()?,
        opcode: a.u32()?,
        unique: a.u64()?,
        nodeid: a.u64()?,
        uid: a.u32()?,
        gid: a.u32()?,
        pid: a.u32()?,
    })
}

/// A request as /dev/fuse hands it: header and arguments in one buffer.
/// `setxattr_ext`: INIT settled FUSE_SETXATTR_EXT (fuse_setxattr_in is
/// then 16 bytes, not 8; nothing else in the buffer says which).
pub fn dev_request(buf: &[u8], setxattr_ext: bool) -> Result<(Header, Op<'_>), Malformed> {
    let h = header(buf)?;
    let body = buf.get(IN_HEADER..h.len as usize).ok_or(Malformed)?;
    Ok((h, op(h.opcode, body, &[], setxattr_ext)?))
}

/// A request as a ring entry hands it: `headers` is the entry's
/// fuse_uring_req_header, `payload` the bytes the kernel put in its
/// payload buffer. The op's struct takes what the header's length leaves
/// beyond the payload (zero for ops whose first argument is empty).
pub fn ring_request<'a>(headers: &'a [u8], payload: &'a [u8]) -> Result<(Header, Op<'a>), Malformed> {
    let h = header(headers)?;
    let fixed_len = (h.len as usize).checked_sub(IN_HEADER + payload.len()).ok_or(Malformed)?;
    if fixed_len > abi::ring::OP_IN_SIZE {
        return Err(Malformed);
    }
    let fixed = headers.get(abi::ring::OP_IN..abi::ring::OP_IN + fixed_len).ok_or(Malformed)?;
    // Here the op's struct comes apart from its payload: its length says
    // which fuse_setxattr_in the kernel sent.
    let setxattr_ext = fixed_len == abi::SETXATTR_IN_EXT;
    Ok((h, op(h.opcode, fixed, payload, setxattr_ext)?))
}

fn op<'a>(opcode: u32, fixed: &'a [u8], rest: &'a [u8], setxattr_ext: bool) -> Result<Op<'a>, Malformed> {
    let mut a = Args { fixed, rest };
    match opcode {
        op::INIT => init(&mut a),
        op::LOOKUP => Ok(Op::Lookup { name: a.name()? }),
        op::FORGET => Ok(Op::Forget { nlookup: a.u64()? }),
        op::BATCH_FORGET => batch_forget(&mut a),
        op::GETATTR => Ok(Op::Getattr),
        op::SETATTR => setattr(&mut a),
        op::READLINK => Ok(Op::Readlink),
        op::SYMLINK => Ok(Op::Symlink { name: a.name()?, target: a.name()? }),
        op::MKNOD => mknod(&mut a),
        op::MKDIR => Ok(Op::Mkdir { mode: a.u32()?, umask: a.u32()?, name: a.name()? }),
        op::UNLINK => Ok(Op::Unlink { name: a.name()? }),
        op::RMDIR => Ok(Op::Rmdir { name: a.name()? }),
        op::RENAME => Ok(Op::Rename { newdir: a.u64()?, flags: 0, name: a.name()?, newname: a.name()? }),
        op::RENAME2 => rename2(&mut a),
        op::LINK => Ok(Op::Link { oldnodeid: a.u64()?, newname: a.name()? }),
        op::OPEN => Ok(Op::Open { flags: a.u32()? }),
        op::OPENDIR => Ok(Op::Opendir),
        op::READ | op::READDIR => read(opcode, &mut a),
        op::WRITE => write(&mut a),
        op::STATFS => Ok(Op::Statfs),
        op::RELEASE => Ok(Op::Release { fh: a.u64()? }),
        op::RELEASEDIR => Ok(Op::Releasedir),
        op::FSYNC => Ok(Op::Fsync),
        op::FSYNCDIR => Ok(Op::Fsyncdir),
        op::FLUSH => Ok(Op::Flush { fh: a.u64()? }),
        op::SETXATTR => setxattr(&mut a, setxattr_ext),
        op::GETXATTR => Ok(Op::Getxattr {
            size: { a.u32()? },
            name: {
                a.skip(4)?;
                a.name()?
            },
        }),
        op::LISTXATTR => Ok(Op::Listxattr { size: a.u32()? }),
        op::REMOVEXATTR => Ok(Op::Removexattr { name: a.name()? }),
        op::CREATE => create(&mut a),
        op::INTERRUPT => Ok(Op::Interrupt),
        op::DESTROY => Ok(Op::Destroy),
        op::LSEEK => Ok(Op::Lseek {
            offset: {
                a.skip(8)?;
                a.u64()?
            },
            whence: a.u32()?,
        }),
        other => Ok(Op::Other(other)),
    }
}

/// fuse_setxattr_in: size, flags, and with FUSE_SETXATTR_EXT
/// setxattr_flags and padding; then the name and the value.
fn setxattr<'a>(a: &mut Args<'a>, ext: bool) -> Result<Op<'a>, Malformed> {
    let (_size, flags) = (a.u32()?, a.u32()?);
    let setxattr_flags = if ext { a.u64()? as u32 } else { 0 };
    Ok(Op::Setxattr { flags, setxattr_flags, name: a.name()?, value: a.remaining() })
}

/// fuse_init_in: major, minor, max_readahead, flags, then (7.36+) flags2.
fn init<'a>(a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    let (major, minor) = (a.u32()?, a.u32()?);
    let (max_readahead, low) = if minor >= 6 { (a.u32()?, a.u32()?) } else { (0, 0) };
    let high = if low as u64 & abi::init::INIT_EXT != 0 { a.u32()? } else { 0 };
    Ok(Op::Init { major, minor, max_readahead, flags: low as u64 | (high as u64) << 32 })
}

fn batch_forget<'a>(a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    let count = a.u32()?;
    a.skip(4)?;
    // Each entry is 16 bytes: a count beyond what was sent is malformed
    // (checked before the allocation it sizes).
    if count as usize > a.fixed.len().max(a.rest.len()) / 16 {
        return Err(Malformed);
    }
    (0..count).map(|_| Ok((a.u64()?, a.u64()?))).collect::<Result<_, _>>().map(Op::BatchForget)
}

/// fuse_setattr_in: valid, padding, fh, size, lock_owner, atime, mtime,
/// ctime, atimensec, mtimensec, ctimensec, mode, unused, uid, gid, unused.
fn setattr<'a>(a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    let valid = a.u32()?;
    a.skip(4 + 8)?;
    let size = a.u64()?;
    a.skip(8)?;
    let (atime, mtime) = (a.u64()?, a.u64()?);
    a.skip(8)?;
    let (atime_ns, mtime_ns) = (a.u32()?, a.u32()?);
    a.skip(4)?;
    let mode = a.u32()?;
    a.skip(4)?;
    let (uid, gid) = (a.u32()?, a.u32()?);
    a.skip(4)?;
    Ok(Op::Setattr(SetattrIn { valid, size, atime: (atime, atime_ns), mtime: (mtime, mtime_ns), mode, uid, gid }))
}

fn mknod<'a>(a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    let (mode, rdev, umask) = (a.u32()?, a.u32()?, a.u32()?);
    a.skip(4)?;
    Ok(Op::Mknod { mode, rdev, umask, name: a.name()? })
}

fn rename2<'a>(a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    let (newdir, flags) = (a.u64()?, a.u32()?);
    a.skip(4)?;
    Ok(Op::Rename { newdir, flags, name: a.name()?, newname: a.name()? })
}

/// fuse_read_in: fh, offset, size, read_flags, lock_owner, flags, padding.
fn read<'a>(opcode: u32, a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    a.skip(8)?;
    let (offset, size) = (a.u64()?, a.u32()?);
    a.skip(4 + 8 + 8)?;
    Ok(if opcode == op::READ { Op::Read { offset, size } } else { Op::Readdir { offset, size } })
}

/// fuse_write_in: fh, offset, size, write_flags, lock_owner, flags,
/// padding; then `size` bytes of data.
fn write<'a>(a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    a.skip(8)?;
    let (offset, size, write_flags) = (a.u64()?, a.u32()?, a.u32()?);
    a.skip(8 + 8)?;
    Ok(Op::Write { offset, write_flags, data: a.take(size as usize)? })
}

/// fuse_create_in: flags, mode, umask, open_flags; then the name.
fn create<'a>(a: &mut Args<'a>) -> Result<Op<'a>, Malformed> {
    let (_flags, mode, umask) = (a.u32()?, a.u32()?, a.u32()?);
    a.skip(4)?;
    Ok(Op::Create { mode, umask, name: a.name()? })
}
