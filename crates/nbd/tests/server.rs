//! Server lifecycle: abrupt clients, graceful shutdown, Unix sockets,
//! connection limits.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tarn_nbd::memory::{MemoryBackend, MemoryExport};
use tarn_nbd::protocol::*;
use tarn_nbd::{Export, Server, ServerConfig};

fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn client_disconnect_mid_flight() {
    let t = start();
    for round in 0..5 {
        let (mut c, _, _) = Client::open(t.addr, round % 2 == 0);
        // Lots of requests in flight (writes with payload, big reads), then
        // vanish without reading a single reply.
        let mut batch = Vec::new();
        for i in 0..300u64 {
            let (cmd, len) = if i % 2 == 0 { (NBD_CMD_WRITE, 65536) } else { (NBD_CMD_READ, 1 << 20) };
            let h = RequestHeader { flags: 0, command: cmd, handle: i, offset: (i % 8) << 20, length: len };
            batch.extend_from_slice(&encode_request_header(&h));
            if cmd == NBD_CMD_WRITE {
                batch.extend_from_slice(&vec![i as u8; len as usize]);
            }
        }
        let _ = c.s.set_write_timeout(Some(Duration::from_secs(2)));
        let _ = c.s.write_all(&batch[..batch.len() / 2]);
        drop(c);
    }
    // Every connection goes away and the server still serves.
    assert!(wait_for(|| t.server.connection_count() == 0), "connections leaked");
    let (mut c, _, _) = Client::open(t.addr, false);
    c.write(1, 0, &[7; 512]);
    assert_eq!(c.simple(), (0, 1));
    assert_eq!(c.read_simple(2, 0, 512), vec![7; 512]);
}

#[test]
fn disc_answers_in_flight_requests_first() {
    let t = start();
    let (mut c, _, _) = Client::open(t.addr, false);
    let mut batch = Vec::new();
    for i in 0..50u64 {
        let h = RequestHeader { flags: 0, command: NBD_CMD_WRITE, handle: i, offset: i * 4096, length: 4096 };
        batch.extend_from_slice(&encode_request_header(&h));
        batch.extend_from_slice(&[i as u8; 4096]);
    }
    batch.extend_from_slice(&encode_request_header(&RequestHeader {
        flags: 0,
        command: NBD_CMD_DISC,
        handle: 99,
        offset: 0,
        length: 0,
    }));
    c.s.write_all(&batch).unwrap();
    let mut got = 0;
    for _ in 0..50 {
        assert_eq!(c.simple().0, 0);
        got += 1;
    }
    assert_eq!(got, 50);
    assert!(c.closed_by_server());
    assert_eq!(t.export.allocated_blocks(), 50);
}

/// An export whose writes take 100 ms, to have requests in flight.
fn slow_writes() -> Arc<SlowExport> {
    Arc::new(SlowExport::new(1 << 20, Duration::ZERO, Duration::from_millis(100), Duration::ZERO))
}

#[test]
fn shutdown_answers_in_flight_then_closes() {
    let backend = MemoryBackend::new().with_export("mem", "", slow_writes());
    let server = Server::new(Arc::new(backend), ServerConfig::default());
    let addr = server.listen_tcp("127.0.0.1:0").unwrap();
    let (mut c, _, _) = Client::open(addr, false);
    // A connection still in the handshake, and one idle in transmission.
    let mut hs = Client::connect(addr);
    let (mut idle, _, _) = Client::open(addr, false);
    for i in 0..4u64 {
        c.write(i, i * 4096, &[1; 4096]);
    }
    // Let the server read them (the first slow write marks writes as slow,
    // so they are spread over the workers).
    std::thread::sleep(Duration::from_millis(150));
    let start = Instant::now();
    let stopper = std::thread::spawn(move || {
        server.shutdown();
        server
    });
    let mut answered = 0;
    while answered < 4 {
        assert_eq!(c.simple().0, 0);
        answered += 1;
    }
    assert!(c.closed_by_server());
    assert!(idle.closed_by_server());
    assert!(hs.closed_by_server());
    let server = stopper.join().unwrap();
    assert!(start.elapsed() < Duration::from_secs(4), "shutdown took {:?}", start.elapsed());
    assert_eq!(server.connection_count(), 0);
    // No longer accepting.
    assert!(std::net::TcpStream::connect(addr).is_err());
    assert!(server.listen_tcp("127.0.0.1:0").is_err());
}

#[test]
fn shutdown_serves_requests_received_in_full() {
    let backend = MemoryBackend::new().with_export("mem", "", slow_writes());
    let server = Server::new(Arc::new(backend), ServerConfig::default());
    let addr = server.listen_tcp("127.0.0.1:0").unwrap();
    let (mut c, _, _) = Client::open(addr, false);
    // One slow write (run by the reading thread: nothing is known to be
    // slow yet) followed by reads that arrive in the same segment.
    let mut batch =
        encode_request_header(&RequestHeader { flags: 0, command: NBD_CMD_WRITE, handle: 0, offset: 0, length: 512 })
            .to_vec();
    batch.extend_from_slice(&[3; 512]);
    for i in 1..=3u64 {
        batch.extend_from_slice(&encode_request_header(&RequestHeader {
            flags: 0,
            command: NBD_CMD_READ,
            handle: i,
            offset: 0,
            length: 512,
        }));
    }
    c.s.write_all(&batch).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    let stopper = std::thread::spawn(move || server.shutdown());
    let mut replies = std::collections::HashMap::new();
    for _ in 0..4 {
        let (e, h) = c.simple();
        if h != 0 && e == 0 {
            let mut data = [0u8; 512];
            c.s.read_exact(&mut data).unwrap();
            assert_eq!(data, [3; 512], "read {h} sees the write before it");
        }
        replies.insert(h, e);
    }
    assert_eq!(replies[&0], 0, "the write in progress completes");
    // Already in the read buffer: answered, not refused (a reconnecting
    // client would take NBD_ESHUTDOWN as the request's failure).
    for i in 1..=3 {
        assert_eq!(replies[&i], 0, "request {i}");
    }
    assert!(c.closed_by_server());
    stopper.join().unwrap();
}

#[test]
fn slow_requests_run_concurrently() {
    // Writes take 100 ms each: after the first one the server must spread
    // them over its workers instead of running them one after another.
    // Counted in the export (writes running at once), not timed.
    let export = slow_writes();
    let backend = MemoryBackend::new().with_export("mem", "", export.clone());
    let server = Server::new(Arc::new(backend), ServerConfig::default());
    let addr = server.listen_tcp("127.0.0.1:0").unwrap();
    let (mut c, _, _) = Client::open(addr, false);
    c.write(0, 0, &[1; 512]);
    assert_eq!(c.simple(), (0, 0));
    for i in 1..=8u64 {
        c.write(i, i * 4096, &[1; 512]);
    }
    for _ in 1..=8 {
        assert_eq!(c.simple().0, 0);
    }
    let most = export.writes_max.load(std::sync::atomic::Ordering::SeqCst);
    assert!(most >= 2, "8 pipelined slow writes ran one at a time (at most {most} at once)");
}

/// Fast large reads pipelined far beyond what the socket buffers hold:
/// most replies wait for the socket while the reads behind them queue up;
/// every one must still be answered, whole and with its data. A read
/// nobody takes shows as the client's read timeout (a bound on progress,
/// not a timing). Guards any rule that holds reads back from the workers
/// (one was tried: docs/ARCHITECTURE.md, *Sequential I/O*).
#[test]
fn large_reads_behind_a_full_socket_all_arrive() {
    const MIB: usize = 1 << 20;
    let export = Arc::new(SlowExport::new(16 << 20, Duration::ZERO, Duration::ZERO, Duration::ZERO));
    for i in 0..16u64 {
        export.inner.write(i * MIB as u64, &pattern(i as u8, MIB), false).unwrap();
    }
    let backend = MemoryBackend::new().with_export("mem", "", export.clone());
    let server = Server::new(Arc::new(backend), ServerConfig::default());
    let (mut c, _, _) = Client::open(server.listen_tcp("127.0.0.1:0").unwrap(), false);
    c.s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    const READS: u64 = 96;
    let mut batch = Vec::new();
    for h in 0..READS {
        let h = RequestHeader {
            flags: 0,
            command: NBD_CMD_READ,
            handle: h,
            offset: (h % 16) * MIB as u64,
            length: MIB as u32,
        };
        batch.extend_from_slice(&encode_request_header(&h));
    }
    c.s.write_all(&batch).unwrap();
    let mut seen = vec![false; READS as usize];
    for _ in 0..READS {
        let (r, data) = c.reply(|_| MIB);
        let Reply::Simple { error: 0, handle } = r else { panic!("read failed: {r:?}") };
        assert!(!std::mem::replace(&mut seen[handle as usize], true), "reply {handle} twice");
        assert!(data == pattern((handle % 16) as u8, MIB), "reply {handle}: wrong data");
    }
}

/// Large reads slower than the socket (a cold device): each one sent
/// while the others still run must get a worker of its own, not wait for
/// a busy one (the device then sees the client's queue depth).
#[test]
fn slow_large_reads_still_run_concurrently() {
    use std::sync::atomic::Ordering::SeqCst;
    let export = Arc::new(SlowExport::new(16 << 20, Duration::from_secs(2), Duration::ZERO, Duration::ZERO));
    let backend = MemoryBackend::new().with_export("mem", "", export.clone());
    let server = Server::new(Arc::new(backend), ServerConfig::default());
    let (mut c, _, _) = Client::open(server.listen_tcp("127.0.0.1:0").unwrap(), false);
    // Slow enough to go to the workers from now on.
    assert_eq!(c.read_simple(0, 0, 1 << 20).len(), 1 << 20);
    for h in 1..=4u64 {
        c.request(0, NBD_CMD_READ, h, h << 20, 1 << 20, &[]);
        let running = wait_for(|| export.reads_now.load(SeqCst) as u64 >= h);
        assert!(running, "read {h} sent while {} ran: it waits for a busy worker", h - 1);
    }
    for _ in 1..=4 {
        let (r, _) = c.reply(|_| 1 << 20);
        assert!(matches!(r, Reply::Simple { error: 0, .. }), "{r:?}");
    }
}

#[test]
fn slow_flushes_do_not_hold_up_the_writes_behind_them() {
    // More flushes than workers, each flush slow: the writes sent after
    // them are answered first, and the queued flushes share a commit.
    let flush_delay = Duration::from_millis(400);
    let export = Arc::new(SlowExport::new(1 << 20, Duration::ZERO, Duration::from_millis(2), flush_delay));
    let backend = MemoryBackend::new().with_export("mem", "", export.clone());
    let server = Server::new(Arc::new(backend), ServerConfig::default());
    let (mut c, _, _) = Client::open(server.listen_tcp("127.0.0.1:0").unwrap(), false);
    // Slow enough to go to the workers from now on.
    c.write(0, 0, &[1; 512]);
    assert_eq!(c.simple(), (0, 0));
    let flushes = 2 * ServerConfig::default().workers_per_conn as u64;
    for h in 1..=flushes {
        c.request(0, NBD_CMD_FLUSH, h, 0, 0, &[]);
    }
    for h in 100..108u64 {
        c.write(h, h * 4096, &[2; 512]);
    }
    let order: Vec<(u32, u64)> = (0..flushes + 8).map(|_| c.simple()).collect();
    assert!(order.iter().all(|&(e, _)| e == 0), "{order:?}");
    let first_flush = order.iter().position(|&(_, h)| h < 100).unwrap();
    assert_eq!(first_flush, 8, "every write answered before the first flush: {order:?}");
    let ran = export.flushes.load(std::sync::atomic::Ordering::SeqCst);
    assert!(ran < flushes, "{flushes} queued flushes ran {ran} export flushes");
}

#[test]
fn shutdown_is_bounded_with_a_client_that_never_reads() {
    let t = start();
    let (mut c, _, _) = Client::open(t.addr, false);
    // Fill the pipes with reads the client never collects.
    let mut batch = Vec::new();
    for i in 0..200u64 {
        batch.extend_from_slice(&encode_request_header(&RequestHeader {
            flags: 0,
            command: NBD_CMD_READ,
            handle: i,
            offset: 0,
            length: 1 << 20,
        }));
    }
    c.s.write_all(&batch).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    t.server.shutdown();
    assert!(start.elapsed() < Duration::from_secs(8), "shutdown took {:?}", start.elapsed());
    assert_eq!(t.server.connection_count(), 0);
}

#[test]
fn unix_socket() {
    let dir = std::env::temp_dir().join(format!("tarn-nbd-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("nbd.sock");
    // A stale socket file is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let backend = MemoryBackend::new().with_export("mem", "", Arc::new(MemoryExport::new(1 << 20)));
    let server = Server::new(Arc::new(backend.clone()), ServerConfig::default());
    server.listen_unix(&path).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // A live socket is not stolen by a second server.
    let other = Server::new(Arc::new(backend), ServerConfig::default());
    assert_eq!(other.listen_unix(&path).unwrap_err().kind(), std::io::ErrorKind::AddrInUse);
    // Regular files are not removed.
    let file = dir.join("file");
    std::fs::write(&file, b"x").unwrap();
    assert!(other.listen_unix(&file).is_err());
    assert!(file.exists());

    let mut s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    assert_eq!(&g[0..8], b"NBDMAGIC");
    s.write_all(&3u32.to_be_bytes()).unwrap();
    let mut opt = IHAVEOPT.to_be_bytes().to_vec();
    opt.extend_from_slice(&NBD_OPT_EXPORT_NAME.to_be_bytes());
    opt.extend_from_slice(&3u32.to_be_bytes());
    opt.extend_from_slice(b"mem");
    s.write_all(&opt).unwrap();
    let mut r = [0u8; 10];
    s.read_exact(&mut r).unwrap();
    assert_eq!(u64::from_be_bytes(r[0..8].try_into().unwrap()), 1 << 20);
    let mut req =
        encode_request_header(&RequestHeader { flags: 0, command: NBD_CMD_WRITE, handle: 1, offset: 0, length: 3 })
            .to_vec();
    req.extend_from_slice(b"abc");
    req.extend_from_slice(&encode_request_header(&RequestHeader {
        flags: 0,
        command: NBD_CMD_READ,
        handle: 2,
        offset: 0,
        length: 3,
    }));
    s.write_all(&req).unwrap();
    let mut replies = [0u8; 16 + 16 + 3];
    s.read_exact(&mut replies).unwrap();
    assert_eq!(&replies[0..16], &encode_simple_reply(1, 0));
    assert_eq!(&replies[16..32], &encode_simple_reply(2, 0));
    assert_eq!(&replies[32..], b"abc");

    server.shutdown();
    assert!(!path.exists(), "socket file left behind");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn connection_limit() {
    let cfg = ServerConfig { max_connections: 2, ..Default::default() };
    let t = start_with(MemoryExport::new(1 << 20), cfg);
    let (a, _, _) = Client::open(t.addr, false);
    let (_b, _, _) = Client::open(t.addr, false);
    // Refused means closed before the greeting; a read timeout would mean
    // neither served nor refused, and fails (read_shows_close).
    assert!(!greeted(t.addr), "third connection was served");
    // The limit counts live connections: once one ends, a new one is served
    // (after the server has noticed the end).
    drop(a);
    assert!(wait_for(|| greeted(t.addr)), "no connection served after one of the two ended");
}

/// Connect; true if the server sends the greeting, false if it closes.
fn greeted(addr: std::net::SocketAddr) -> bool {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut magic = [0u8; 8];
    let mut got = 0;
    while got < magic.len() {
        let r = s.read(&mut magic[got..]);
        if read_shows_close(&r, "greeting") {
            return false;
        }
        got += r.unwrap();
    }
    assert_eq!(&magic, b"NBDMAGIC");
    true
}

#[test]
fn handed_over_socket_keeps_its_backlog_for_the_next_server() {
    use std::os::fd::OwnedFd;
    let mem = || Arc::new(MemoryBackend::new().with_export("mem", "", Arc::new(MemoryExport::new(1 << 20))));
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let first = Server::new(mem(), ServerConfig::default());
    first.listen_fd(OwnedFd::from(l), false).unwrap();
    let (mut c, _, _) = Client::open(addr, false);
    assert_eq!(c.read_simple(1, 0, 512), vec![0; 512]);
    let mut fds = first.hand_over().unwrap();
    first.shutdown();
    assert!(c.closed_by_server());
    drop(first);
    // Between the two servers a client is queued by the kernel, not refused.
    let waiting = std::thread::spawn(move || Client::open(addr, false));
    std::thread::sleep(Duration::from_millis(300));
    let second = Server::new(mem(), ServerConfig::default());
    assert_eq!(second.listen_fd(fds.remove(0), false).unwrap(), addr.to_string());
    let (mut c2, _, _) = waiting.join().unwrap();
    c2.write(2, 0, &[5; 512]);
    assert_eq!(c2.simple(), (0, 2));
    // A socket that does not listen is refused with a reason.
    let stream = std::net::TcpStream::connect(addr).unwrap();
    let err = second.listen_fd(OwnedFd::from(stream), false).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}
