//! Listeners, connection bookkeeping and graceful shutdown.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::congestion;
use crate::connection;
use crate::error::NbdError;
use crate::export::Backend;
use crate::handshake;
use crate::session;
use crate::stream::Stream;
use crate::tls::TlsConfig;
use crate::transport::{Channel, Transport};
use crate::util::{lock, wait_timeout};

pub use crate::session::ServerConfig;

/// Time connections get to answer in-flight requests after [`Server::shutdown`]
/// stops their reading, before their sockets are closed outright.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);
/// Further wait after the sockets were closed outright.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an accept thread waits in poll(2) before looking at the
/// shutdown flag again. Listening sockets are never shut down to wake it,
/// because one may be shared with the next process (systemd socket
/// activation, a takeover): `shutdown(2)` would stop it listening there too.
const ACCEPT_POLL: Duration = Duration::from_millis(100);
/// Most listening sockets adopted from a predecessor or a service manager.
pub const MAX_ADOPTED: usize = 16;

enum ListenSock {
    Tcp(Arc<TcpListener>),
    Unix(Arc<UnixListener>, PathBuf),
}

impl ListenSock {
    fn fd(&self) -> RawFd {
        match self {
            ListenSock::Tcp(t) => t.as_raw_fd(),
            ListenSock::Unix(u, _) => u.as_raw_fd(),
        }
    }
}

struct Listener {
    sock: ListenSock,
    thread: Option<JoinHandle<()>>,
    /// The socket belongs to someone else (a service manager, or the
    /// process it was handed over to): at shutdown it keeps listening, with
    /// its backlog, and a Unix socket file stays.
    kept: bool,
}

#[derive(Default)]
struct Conns {
    /// A handle on each live connection's socket, to shut it down.
    live: HashMap<u64, Stream>,
    threads: Vec<JoinHandle<()>>,
}

struct Inner {
    backend: Arc<dyn Backend>,
    /// Copied by each connection when it starts, so that a reload
    /// ([`Server::set_tls`]) applies to the connections that follow.
    config: Mutex<ServerConfig>,
    shutting_down: AtomicBool,
    listeners: Mutex<Vec<Listener>>,
    conns: Mutex<Conns>,
    conns_cv: Condvar,
    next_id: AtomicU64,
}

/// An NBD server: listeners plus one thread (and its workers) per connection.
///
/// Dropping a `Server` shuts it down.
pub struct Server {
    inner: Arc<Inner>,
}

impl Server {
    pub fn new(backend: Arc<dyn Backend>, config: ServerConfig) -> Server {
        Server {
            inner: Arc::new(Inner {
                backend,
                config: Mutex::new(config),
                shutting_down: AtomicBool::new(false),
                listeners: Mutex::new(Vec::new()),
                conns: Mutex::new(Conns::default()),
                conns_cv: Condvar::new(),
                next_id: AtomicU64::new(1),
            }),
        }
    }

    /// Replace the TLS settings (certificates reloaded, mode or allow-list
    /// changed): connections accepted from now on use them; established
    /// ones keep the session they negotiated.
    pub fn set_tls(&self, tls: Option<TlsConfig>) {
        lock(&self.inner.config).tls = tls;
    }

    /// Bind a TCP address (e.g. `127.0.0.1:10809`, port 0 for any) and
    /// spawn its accept thread. Returns the bound address.
    pub fn listen_tcp(&self, addr: &str) -> io::Result<SocketAddr> {
        self.check_running()?;
        let l = TcpListener::bind(addr)?;
        let local = l.local_addr()?;
        self.add_listener(ListenSock::Tcp(Arc::new(l)), false)?;
        log::info!("nbd: listening on {local}");
        Ok(local)
    }

    /// Bind a Unix socket at `path` (a stale socket there is removed; a live
    /// one is an `AddrInUse` error) with mode 0600, and spawn its accept thread.
    pub fn listen_unix(&self, path: &Path) -> io::Result<()> {
        self.listen_unix_with_mode(path, 0o600)
    }

    /// [`Server::listen_unix`] with permission bits `mode` (e.g. 0o660 for
    /// a group). The socket never has wider permissions than `mode`, not
    /// even briefly.
    pub fn listen_unix_with_mode(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.check_running()?;
        let l = bind_unix(path, mode & 0o777)?;
        self.add_listener(ListenSock::Unix(Arc::new(l), path.to_owned()), false)?;
        log::info!("nbd: listening on {}", path.display());
        Ok(())
    }

    /// Serve on a socket that already listens (TCP or Unix stream), from a
    /// service manager (`LISTEN_FDS`) or a predecessor (a takeover).
    /// `kept`: the socket stays the manager's: [`Server::shutdown`] leaves
    /// it listening and its file in place. Returns what it listens on.
    /// Anything but a listening stream socket is an `InvalidInput` error.
    pub fn listen_fd(&self, fd: OwnedFd, kept: bool) -> io::Result<String> {
        self.check_running()?;
        let (listening, family) = socket_kind(&fd)?;
        if !listening {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a listening stream socket"));
        }
        let (sock, what) = match family {
            libc::AF_INET | libc::AF_INET6 => {
                let l = TcpListener::from(fd);
                let what = l.local_addr()?.to_string();
                (ListenSock::Tcp(Arc::new(l)), what)
            }
            libc::AF_UNIX => {
                let l = UnixListener::from(fd);
                let path = l.local_addr()?.as_pathname().map(Path::to_path_buf).unwrap_or_default();
                let what = path.display().to_string();
                (ListenSock::Unix(Arc::new(l), path), what)
            }
            f => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("socket family {f} is not TCP or Unix"),
                ))
            }
        };
        self.add_listener(sock, kept)?;
        log::info!("nbd: listening on {what} (inherited)");
        Ok(what)
    }

    /// Hand the listening sockets over to the next process: returns a
    /// duplicate of each (to send with `SCM_RIGHTS`) and marks them kept,
    /// so the [`Server::shutdown`] that follows stops accepting without
    /// closing them for the receiver; connections that arrive meanwhile
    /// wait in the kernel's backlog.
    pub fn hand_over(&self) -> io::Result<Vec<OwnedFd>> {
        let mut ls = lock(&self.inner.listeners);
        let fds = ls
            .iter()
            .map(|l| match &l.sock {
                ListenSock::Tcp(t) => t.as_fd().try_clone_to_owned(),
                ListenSock::Unix(u, _) => u.as_fd().try_clone_to_owned(),
            })
            .collect::<io::Result<Vec<_>>>()?;
        for l in ls.iter_mut() {
            l.kept = true;
        }
        Ok(fds)
    }

    fn add_listener(&self, sock: ListenSock, kept: bool) -> io::Result<()> {
        let inner = Arc::clone(&self.inner);
        // Non-blocking: another process polling the same socket may take
        // the connection first; accept then says EAGAIN instead of hanging.
        let (accept, fd): (Box<dyn FnMut() -> io::Result<Stream> + Send>, RawFd) = match &sock {
            ListenSock::Tcp(l) => {
                l.set_nonblocking(true)?;
                let l = Arc::clone(l);
                (Box::new(move || l.accept().and_then(|(s, _)| tcp_stream(s))), sock.fd())
            }
            ListenSock::Unix(l, _) => {
                l.set_nonblocking(true)?;
                let l = Arc::clone(l);
                (
                    Box::new(move || l.accept().and_then(|(s, _)| s.set_nonblocking(false).map(|_| Stream::Unix(s)))),
                    sock.fd(),
                )
            }
        };
        // The accept thread holds an Arc on the listener, so `fd` stays open while it runs.
        let thread =
            std::thread::Builder::new().name("nbd-accept".into()).spawn(move || accept_loop(&inner, fd, accept))?;
        lock(&self.inner.listeners).push(Listener { sock, thread: Some(thread), kept });
        Ok(())
    }

    /// Stop accepting, let connections finish in-flight requests (reply to them), close sockets, join threads. Bounded wait.
    ///
    /// Connections stop reading at once; requests already read are answered
    /// within a few seconds, after which remaining sockets are closed
    /// outright. Threads stuck inside the export are left detached.
    pub fn shutdown(&self) {
        let inner = &self.inner;
        if inner.shutting_down.swap(true, Ordering::SeqCst) {
            log::debug!("nbd: shutdown already requested");
        } else {
            log::info!("nbd: shutting down");
        }

        // Listeners: the accept threads see the flag within ACCEPT_POLL.
        // Our own sockets are shut down too, so that clients waiting in
        // their backlog are refused at once; kept ones go on listening.
        let listeners = std::mem::take(&mut *lock(&inner.listeners));
        for l in listeners.iter().filter(|l| !l.kept) {
            // SAFETY: the fd stays open: we hold an Arc on the listener.
            unsafe { libc::shutdown(l.sock.fd(), libc::SHUT_RDWR) };
        }
        for mut l in listeners {
            if let Some(t) = l.thread.take() {
                if join_within(t, ACCEPT_POLL * 10).is_err() {
                    log::warn!("nbd: an accept thread did not stop; left detached");
                }
            }
            if let (ListenSock::Unix(_, path), false) = (&l.sock, l.kept) {
                let _ = std::fs::remove_file(path);
            }
        }

        // Connections: stop reading, let them drain, then close outright.
        {
            let c = lock(&inner.conns);
            for s in c.live.values() {
                s.shutdown(Shutdown::Read);
            }
        }
        if !self.wait_conns(DRAIN_TIMEOUT) {
            {
                let c = lock(&inner.conns);
                log::warn!("nbd: {} connection(s) still busy; closing their sockets", c.live.len());
                for s in c.live.values() {
                    s.shutdown(Shutdown::Both);
                }
            }
            if !self.wait_conns(CLOSE_TIMEOUT) {
                log::warn!("nbd: giving up on {} connection(s)", lock(&inner.conns).live.len());
            }
        }
        let threads = std::mem::take(&mut lock(&inner.conns).threads);
        for t in threads {
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }

    /// Serve one already connected Unix stream on the calling thread:
    /// handshake, then transmission, until the peer closes it or a protocol
    /// error ends the connection. Not counted in [`Server::connection_count`]
    /// and not stopped by [`Server::shutdown`]. For the fuzz targets in
    /// `fuzz/`, which feed the real server code over a socket pair.
    #[doc(hidden)]
    pub fn serve_unix_stream(&self, stream: UnixStream) {
        run_connection(&self.inner, 0, Stream::Unix(stream));
    }

    /// Number of connections currently open.
    pub fn connection_count(&self) -> usize {
        lock(&self.inner.conns).live.len()
    }

    fn check_running(&self) -> io::Result<()> {
        if self.inner.shutting_down.load(Ordering::SeqCst) {
            return Err(io::Error::other("server is shut down"));
        }
        Ok(())
    }

    /// Wait until no connection is live; false on timeout.
    fn wait_conns(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut c = lock(&self.inner.conns);
        while !c.live.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            c = wait_timeout(&self.inner.conns_cv, c, left);
        }
        true
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn tcp_stream(s: TcpStream) -> io::Result<Stream> {
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    congestion::tune_local(&s);
    Ok(Stream::Tcp(s))
}

fn join_within(t: JoinHandle<()>, d: Duration) -> Result<(), JoinHandle<()>> {
    let deadline = Instant::now() + d;
    while !t.is_finished() {
        if Instant::now() >= deadline {
            return Err(t);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = t.join();
    Ok(())
}

fn bind_unix(path: &Path, mode: u32) -> io::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(io::ErrorKind::AddrInUse, format!("{} is in use", path.display())));
        }
        log::info!("nbd: removing stale socket {}", path.display());
        std::fs::remove_file(path)?;
    }
    bind_with_mode(path, mode)
}

/// Bind and listen on `path` so that the socket file is never more open
/// than `mode`: Linux creates it with the socket's own mode minus the
/// umask, so the socket is fchmod-ed before bind; the file is then set to
/// exactly `mode` (only adding back what the umask removed) before
/// listen, so no client can connect while it has other permissions.
fn bind_with_mode(path: &Path, mode: u32) -> io::Result<UnixListener> {
    // SAFETY: plain system calls on a descriptor we own; the sockaddr is
    // zeroed and filled within its bounds.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        if libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad socket path {}", path.display())));
        }
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
        if libc::bind(fd.as_raw_fd(), &addr as *const _ as *const libc::sockaddr, len as libc::socklen_t) != 0 {
            return Err(io::Error::last_os_error());
        }
        let placed = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
        if placed.is_err() || libc::listen(fd.as_raw_fd(), 128) != 0 {
            let e = placed.err().unwrap_or_else(io::Error::last_os_error);
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        Ok(UnixListener::from(fd))
    }
}

/// Whether `fd` is a listening stream socket, and its address family.
fn socket_kind(fd: &OwnedFd) -> io::Result<(bool, libc::c_int)> {
    let int_opt = |opt| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt into a c_int of the size given, on a descriptor we own.
        let r = unsafe {
            libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, opt, &mut v as *mut _ as *mut libc::c_void, &mut len)
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(v)
    };
    let listening = int_opt(libc::SO_ACCEPTCONN)? != 0 && int_opt(libc::SO_TYPE)? == libc::SOCK_STREAM;
    Ok((listening, int_opt(libc::SO_DOMAIN)?))
}

/// Accept on `fd` until the server shuts down. Waits in poll(2), never
/// in accept(2), so that it stops within [`ACCEPT_POLL`] without the
/// socket being shut down, and takes no connection once the flag is set:
/// those stay in the backlog for the next process.
fn accept_loop(inner: &Arc<Inner>, fd: RawFd, mut accept: impl FnMut() -> io::Result<Stream>) {
    let stopping = || inner.shutting_down.load(Ordering::SeqCst);
    while !stopping() {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, valid for the call; the caller keeps `fd` open.
        let ready = unsafe { libc::poll(&mut p, 1, ACCEPT_POLL.as_millis() as libc::c_int) };
        if ready <= 0 || stopping() {
            continue;
        }
        match accept() {
            Ok(s) => start_connection(inner, s),
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock) => {}
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                log::warn!("nbd: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    log::debug!("nbd: accept loop finished");
}

fn start_connection(inner: &Arc<Inner>, stream: Stream) {
    let mut c = lock(&inner.conns);
    c.threads.retain(|t| !t.is_finished());
    if inner.shutting_down.load(Ordering::SeqCst) {
        return;
    }
    let max = lock(&inner.config).max_connections;
    if c.live.len() >= max {
        log::warn!("nbd: connection limit ({max}) reached; refusing {}", stream.peer());
        return;
    }
    let handle = match stream.try_clone() {
        Ok(h) => h,
        Err(e) => {
            log::warn!("nbd: cannot clone socket: {e}");
            return;
        }
    };
    let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
    let inner2 = Arc::clone(inner);
    let spawned = std::thread::Builder::new().name(format!("nbd-conn-{id}")).spawn(move || {
        run_connection(&inner2, id, stream);
        let mut c = lock(&inner2.conns);
        c.live.remove(&id);
        inner2.conns_cv.notify_all();
    });
    match spawned {
        Ok(t) => {
            c.live.insert(id, handle);
            c.threads.push(t);
        }
        Err(e) => log::error!("nbd: cannot spawn connection thread: {e}"),
    }
}

fn run_connection(inner: &Inner, id: u64, stream: Stream) {
    let peer = stream.peer();
    log::info!("nbd: connection {id} from {peer}");
    let (ctl, chan) = match stream.try_clone().and_then(|ctl| Ok((ctl, Channel::plain(stream, session::READ_BUF)?))) {
        Ok(x) => x,
        Err(e) => {
            log::warn!("nbd: connection {id}: cannot clone socket: {e}");
            return;
        }
    };
    let config = lock(&inner.config).clone();
    match handshake::negotiate(chan, &*inner.backend, &config, &inner.shutting_down) {
        Ok((neg, chan)) => {
            let name = neg.name.clone();
            let (cfg, stop) = (&config, &inner.shutting_down);
            // Two monomorphic read loops: the plaintext one is unchanged.
            let end = match chan {
                Channel::Plain { reader, writer } => {
                    connection::serve(neg, reader, Transport::Plain(writer), cfg, stop)
                }
                Channel::Tls { reader, session } => connection::serve(neg, reader, Transport::Tls(session), cfg, stop),
            };
            log::info!("nbd: connection {id} ({peer}, export {name:?}) closed: {end:?}");
        }
        Err(e) => {
            match &e {
                NbdError::Aborted => {
                    log::info!("nbd: connection {id} ({peer}): client ended the handshake")
                }
                NbdError::Io(io)
                    if matches!(
                        io.kind(),
                        io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    log::info!("nbd: connection {id} ({peer}): client disconnected during the handshake")
                }
                NbdError::Tls(tls) => log::warn!("nbd: connection {id} ({peer}): TLS refused: {tls}"),
                _ => log::warn!("nbd: connection {id} ({peer}): handshake failed: {e}"),
            }
            ctl.shutdown(Shutdown::Both);
        }
    }
}
