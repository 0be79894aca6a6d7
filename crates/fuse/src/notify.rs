//! Notifications to the kernel (FUSE_NOTIFY_*), and the one write of a
//! reply or notification to /dev/fuse both use.

use crate::abi::{self, OUT_HEADER};
use crate::reply;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

/// Notifications to the kernel (written on /dev/fuse, any thread).
#[derive(Clone)]
pub struct Notifier {
    fd: Arc<OwnedFd>,
}

impl Notifier {
    pub(crate) fn new(fd: Arc<OwnedFd>) -> Notifier {
        Notifier { fd }
    }

    /// FUSE_NOTIFY_INVAL_INODE: the kernel drops what it cached of `ino`
    /// (offset -1: its attributes only).
    pub fn inval_inode(&self, ino: u64, offset: i64, len: i64) -> io::Result<()> {
        let body = reply::inval_inode(ino, offset, len);
        write_reply(&self.fd, &reply::out_header(0, abi::NOTIFY_INVAL_INODE, body.len()), &body)
    }
}

/// `header` then `body` in one write (the kernel takes a reply whole).
pub(crate) fn write_reply(fd: &OwnedFd, header: &[u8; OUT_HEADER], body: &[u8]) -> io::Result<()> {
    let iov = [
        libc::iovec { iov_base: header.as_ptr() as *mut _, iov_len: header.len() },
        libc::iovec { iov_base: body.as_ptr() as *mut _, iov_len: body.len() },
    ];
    // SAFETY: both iovecs point to live buffers of their lengths.
    let n = unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), 2) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
