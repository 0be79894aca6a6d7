//! TCP congestion control of connections from this host.
//!
//! A connection whose peer is on this host goes over the loopback device:
//! no queue, no loss, a round trip of a few microseconds. A model-based
//! congestion control such as BBR (a common system default, this
//! machine's) sizes its window from bandwidth x minimum round trip there,
//! ~14-26 segments of 64 KiB, less than one 1 MiB read reply: the rest of
//! each reply then goes out as ACKs come back, from the softirq of the
//! client's CPU, while the next reply's `sendmsg` transmits from another
//! CPU, and segments overtake each other. The client sees them out of
//! order (SACKs, spurious retransmits, a lower bandwidth estimate and
//! pacing rate). Measured on warm 1 MiB reads at queue depth 8
//! (docs/ARCHITECTURE.md, *Sequential I/O*): with Reno on the server's
//! socket a reply goes out whole from its own `sendmsg`. Reno is the
//! choice because every Linux kernel has it built in and allows it to
//! unprivileged processes (`tcp_allowed_congestion_control`). Connections
//! from other hosts keep the system's default, which suits real networks.

use std::io;
use std::net::{IpAddr, TcpStream};
use std::os::fd::AsRawFd;

/// Congestion control for connections from this host.
const LOCAL_CONGESTION: &str = "reno";

/// Whether a connection from `peer` to `local` stays on this host.
pub(crate) fn is_local_peer(peer: IpAddr, local: IpAddr) -> bool {
    let peer = peer.to_canonical();
    peer.is_loopback() || peer == local.to_canonical()
}

/// Give a connection from this host the congestion control above. Best
/// effort: a kernel without it (or a policy that forbids it) leaves the
/// default, which works, only slower (logged at debug level).
pub(crate) fn tune_local(s: &TcpStream) {
    let (Ok(peer), Ok(local)) = (s.peer_addr(), s.local_addr()) else { return };
    if !is_local_peer(peer.ip(), local.ip()) {
        return;
    }
    if let Err(e) = set_congestion(s, LOCAL_CONGESTION) {
        log::debug!("nbd: cannot set TCP congestion control {LOCAL_CONGESTION} for {peer}: {e}");
    }
}

fn set_congestion(s: &TcpStream, name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes, which the
    // kernel only reads during the call.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The congestion control a socket uses.
#[cfg(test)]
fn congestion(s: &TcpStream) -> io::Result<String> {
    let mut buf = [0u8; 16];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `buf` and
    // stores the length written in `len`.
    let r = unsafe {
        libc::getsockopt(s.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_CONGESTION, buf.as_mut_ptr().cast(), &mut len)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let name = &buf[..len as usize];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, TcpListener};

    #[test]
    fn local_peers_are_loopback_or_this_hosts_address() {
        let here = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 5));
        assert!(is_local_peer(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), here));
        assert!(is_local_peer(IpAddr::V4(Ipv4Addr::new(127, 3, 2, 1)), here));
        assert!(is_local_peer(IpAddr::V6(Ipv6Addr::LOCALHOST), here));
        assert!(is_local_peer(IpAddr::V6(Ipv4Addr::new(127, 0, 0, 1).to_ipv6_mapped()), here));
        assert!(is_local_peer(here, here), "this host's own address goes over loopback");
        assert!(is_local_peer(IpAddr::V6(Ipv4Addr::new(10, 0, 0, 5).to_ipv6_mapped()), here));
        assert!(!is_local_peer(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 6)), here));
        assert!(!is_local_peer(IpAddr::V6("2001:db8::1".parse().unwrap()), here));
    }

    #[test]
    fn a_loopback_connection_gets_the_local_congestion_control() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        tune_local(&s);
        // Reno is built into every Linux kernel and always in
        // `tcp_allowed_congestion_control`, so an unprivileged socket can
        // take it: the client's socket shows that it can.
        set_congestion(&client, LOCAL_CONGESTION).unwrap();
        assert_eq!(congestion(&s).unwrap(), LOCAL_CONGESTION);
    }
}
