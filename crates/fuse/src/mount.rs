//! Mounting through fusermount3 (the setuid helper, so a user who may
//! mount FUSE needs no root): it opens /dev/fuse, mounts it on the
//! directory and hands the descriptor back over a socket (SCM_RIGHTS on
//! the socket named by `_FUSE_COMMFD`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;

/// Mounts /dev/fuse on `dir` with the comma-separated mount `options`;
/// returns the session's /dev/fuse descriptor.
pub fn mount(dir: &Path, options: &str) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    let theirs_fd = theirs.as_raw_fd();
    clear_cloexec(theirs_fd)?;
    let status = Command::new("fusermount3")
        .env("_FUSE_COMMFD", theirs_fd.to_string())
        .arg("-o")
        .arg(options)
        .arg("--")
        .arg(dir)
        .status()
        .map_err(|e| io::Error::new(e.kind(), format!("fusermount3: {e}")))?;
    drop(theirs);
    if !status.success() {
        return Err(io::Error::other(format!("fusermount3 failed ({status})")));
    }
    receive_fd(&ours)
}

/// Unmounts `dir` (lazily: the session may still be reading).
pub fn unmount(dir: &Path) -> io::Result<()> {
    let status = Command::new("fusermount3").arg("-u").arg("-z").arg("--").arg(dir).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("fusermount3 -u failed ({status})")))
    }
}

fn clear_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor this process owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The one descriptor fusermount3 sent on `sock`.
fn receive_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // Room for one cmsghdr with one int, 8-aligned.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: recvmsg writes into the buffers `msg` points to, within their lengths.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: CMSG_FIRSTHDR reads the msghdr recvmsg filled in.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: a non-null cmsg points into `control`, filled by the kernel.
    if cmsg.is_null() || unsafe { (*cmsg).cmsg_level != libc::SOL_SOCKET || (*cmsg).cmsg_type != libc::SCM_RIGHTS } {
        return Err(io::Error::other("fusermount3 sent no descriptor"));
    }
    // SAFETY: an SCM_RIGHTS message holds at least one int; read unaligned.
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>()) };
    // SAFETY: the kernel installed `fd` in this process for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
