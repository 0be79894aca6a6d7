//! Listening sockets from a predecessor: systemd socket activation
//! (`LISTEN_FDS`, sd_listen_fds(3) semantics) and a takeover, where a new
//! `tarn serve --takeover` asks the running server over its control socket
//! for its listening sockets (sent with `SCM_RIGHTS`); the old server then
//! stops accepting, drains, commits and exits, while clients that connect
//! meanwhile wait in the kernel's listen backlog.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;
use tarn_nbd::MAX_ADOPTED;

/// The control request line that asks for the listening sockets.
pub const REQUEST: &str = r#"{"handover":true}"#;
/// The first descriptor a service manager passes (SD_LISTEN_FDS_START).
const LISTEN_FDS_START: RawFd = 3;

/// A socket passed by the service manager, with its `FileDescriptorName=`.
pub struct Activated {
    pub fd: OwnedFd,
    pub name: String,
}

/// The sockets systemd passed, when `LISTEN_PID` is this process (else
/// none). The variables are removed, so children do not see them; the
/// descriptors are made close-on-exec.
pub fn activated() -> Result<Vec<Activated>> {
    let pid = std::env::var("LISTEN_PID").ok();
    let count = std::env::var("LISTEN_FDS").ok();
    let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
    for v in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(v);
    }
    let (Some(pid), Some(count)) = (pid, count) else { return Ok(Vec::new()) };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(Vec::new());
    }
    let n: usize = count.trim().parse().with_context(|| format!("LISTEN_FDS={count:?} is not a number"))?;
    if n > MAX_ADOPTED {
        bail!("LISTEN_FDS={n}: at most {MAX_ADOPTED} sockets are supported");
    }
    let mut names = names.split(':');
    (0..n)
        .map(|i| {
            let fd = LISTEN_FDS_START + i as RawFd;
            // SAFETY: fcntl on a descriptor number; fails harmlessly if not open.
            if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
                bail!("LISTEN_FDS={n} but descriptor {fd} is not open: {}", io::Error::last_os_error());
            }
            // SAFETY: the service manager passed it to this process, and
            // nothing else in it took ownership.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            Ok(Activated { fd, name: names.next().unwrap_or("").to_string() })
        })
        .collect()
}

/// Ask the server whose control socket is `control` for its listening
/// sockets. Returns them and the old server's pid.
pub fn take(control: &Path) -> Result<(Vec<OwnedFd>, u32)> {
    let mut s = UnixStream::connect(control).with_context(|| format!("connect to {}", control.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(format!("{REQUEST}\n").as_bytes())?;
    let (mut data, fds) = recv_with_fds(&s).context("receive the listening sockets")?;
    if !data.contains(&b'\n') {
        BufReader::new(&s).take(64 * 1024).read_until(b'\n', &mut data)?;
    }
    let v: Value = serde_json::from_slice(&data).context("the running server answered with invalid JSON")?;
    if v["ok"].as_bool() != Some(true) {
        bail!("the running server refused the takeover: {}", v["error"].as_str().unwrap_or("no reason given"));
    }
    if fds.is_empty() {
        bail!("the running server handed over no listening sockets (is it already stopping?)");
    }
    Ok((fds, v["data"]["pid"].as_u64().unwrap_or(0) as u32))
}

/// Answer a takeover request on `conn`: the sockets and this pid in one message.
pub fn answer(conn: &UnixStream, fds: &[OwnedFd]) -> io::Result<()> {
    let line = format!("{}\n", json!({ "ok": true, "data": { "pid": std::process::id(), "sockets": fds.len() } }));
    send_with_fds(conn, line.as_bytes(), fds)
}

fn cmsg_space(fds: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    unsafe { libc::CMSG_SPACE((fds * std::mem::size_of::<RawFd>()) as u32) as usize }
}

fn send_with_fds(conn: &UnixStream, data: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
    if fds.len() > MAX_ADOPTED {
        return Err(io::Error::other(format!("{} sockets: at most {MAX_ADOPTED}", fds.len())));
    }
    let mut control = vec![0u8; cmsg_space(fds.len().max(1))];
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    // SAFETY: msghdr and its cmsg are built within the buffers above, which
    // outlive the sendmsg call; CMSG_* stay inside `control`.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = cmsg_space(fds.len()) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN((fds.len() * std::mem::size_of::<RawFd>()) as u32) as _;
            let slots = libc::CMSG_DATA(cmsg) as *mut RawFd;
            for (i, fd) in fds.iter().enumerate() {
                slots.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
        if libc::sendmsg(conn.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn recv_with_fds(conn: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut data = vec![0u8; 4096];
    let mut control = vec![0u8; cmsg_space(MAX_ADOPTED)];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr() as *mut libc::c_void, iov_len: data.len() };
    let mut fds = Vec::new();
    // SAFETY: as in send_with_fds; the kernel writes at most the lengths
    // given, and every descriptor it passed is taken into an OwnedFd once.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = control.len() as _;
        let n = libc::recvmsg(conn.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let slots = libc::CMSG_DATA(cmsg) as *const RawFd;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(slots.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::other(format!("more than {MAX_ADOPTED} sockets sent")));
        }
        n as usize
    };
    data.truncate(n);
    Ok((data, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_cross_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        answer(&a, &[OwnedFd::from(l)]).unwrap();
        let (data, mut fds) = recv_with_fds(&b).unwrap();
        let v: Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(v["data"]["pid"], std::process::id());
        assert_eq!(fds.len(), 1);
        let got = std::net::TcpListener::from(fds.remove(0));
        assert_eq!(got.local_addr().unwrap(), addr);
    }
}
