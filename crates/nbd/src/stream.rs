//! A connected socket (TCP or Unix) with the few operations the server needs.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A client connection.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    /// Shut down one or both directions; errors (already closed) are ignored.
    pub(crate) fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        };
    }

    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    /// Peer description for logs.
    pub(crate) fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "tcp:?".into()),
            Stream::Unix(_) => "unix".into(),
        }
    }

    /// Write all of `bufs` with `sendmsg(MSG_NOSIGNAL)`: one system call in
    /// the common case, and no SIGPIPE if the peer has gone away. `more`
    /// adds `MSG_MORE`: more data follows at once, so the kernel holds a
    /// short tail back for it.
    pub(crate) fn write_all_vectored(&self, mut bufs: &mut [IoSlice<'_>], more: bool) -> io::Result<()> {
        // Skip leading empty slices.
        while bufs.first().is_some_and(|b| b.is_empty()) {
            bufs = &mut bufs[1..];
        }
        while !bufs.is_empty() {
            let n = sendmsg_nosignal(self.as_raw_fd(), bufs, more)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            advance_slices(&mut bufs, n);
        }
        Ok(())
    }
}

const IOV_MAX: usize = 1024;

fn sendmsg_nosignal(fd: RawFd, bufs: &[IoSlice<'_>], more: bool) -> io::Result<usize> {
    let cnt = bufs.len().min(IOV_MAX);
    // SAFETY: IoSlice is ABI-compatible with `struct iovec` on Unix; the
    // msghdr only borrows `bufs`, which outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = cnt as _;
    loop {
        let flags = if more { libc::MSG_NOSIGNAL | libc::MSG_MORE } else { libc::MSG_NOSIGNAL };
        let r = unsafe { libc::sendmsg(fd, &msg, flags) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Drop `n` written bytes from the front of `bufs` (stable replacement of
/// `IoSlice::advance_slices`).
fn advance_slices<'a>(bufs: &mut &mut [IoSlice<'a>], mut n: usize) {
    let mut remove = 0;
    for b in bufs.iter() {
        if n >= b.len() {
            n -= b.len();
            remove += 1;
        } else {
            break;
        }
    }
    *bufs = &mut std::mem::take(bufs)[remove..];
    if let Some(first) = bufs.first_mut() {
        if n > 0 {
            // SAFETY-free re-slicing: build a new IoSlice over the tail of the
            // same memory. `n < first.len()` here.
            let rest: &'a [u8] = unsafe { std::slice::from_raw_parts(first.as_ptr().add(n), first.len() - n) };
            *first = IoSlice::new(rest);
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let slice = [IoSlice::new(buf)];
        sendmsg_nosignal(self.as_raw_fd(), &slice, false)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance() {
        let a = [1u8, 2, 3];
        let b = [4u8, 5];
        let mut v = [IoSlice::new(&a), IoSlice::new(&b)];
        let mut s: &mut [IoSlice<'_>] = &mut v;
        advance_slices(&mut s, 2);
        assert_eq!(s.len(), 2);
        assert_eq!(&*s[0], &[3]);
        advance_slices(&mut s, 1);
        assert_eq!(s.len(), 1);
        assert_eq!(&*s[0], &[4, 5]);
        advance_slices(&mut s, 2);
        assert!(s.is_empty());
    }
}
