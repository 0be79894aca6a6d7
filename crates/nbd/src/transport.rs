//! The byte stream of a connection: the plain socket, or a TLS session
//! started with `NBD_OPT_STARTTLS`.
//!
//! The transmission phase reads on one thread and writes replies from
//! whichever thread holds the combining writer, so the rustls connection
//! (one object for both directions) sits behind a mutex that is never held
//! while blocking on the socket: the reader reads ciphertext from the socket
//! without the lock and only decrypts under it; the writer encrypts under
//! it into a buffer and sends that after releasing it. A writer stuck on a
//! full socket thus never stops the reader from draining requests (which
//! would deadlock with a client that sends before it reads). Records go out
//! in the order they were encrypted because only one thread writes at a
//! time (the reply writer's `writing` flag; the handshake is one thread).
//!
//! The plaintext path does not go through this module's TLS code at all:
//! its reader is a plain `BufReader<Stream>` and its writer `sendmsg`.

use std::io::{self, BufReader, IoSlice, Read};
use std::net::Shutdown;
use std::sync::{Arc, Mutex};

use rustls::ServerConnection;

use crate::error::NbdError;
use crate::stream::Stream;
use crate::tls::ClientIdentity;
use crate::util::lock;

/// Ciphertext read from the socket per system call.
const RAW_BUF: usize = 64 * 1024;
/// Plaintext encrypted per lock hold when sending.
const ENCRYPT_CHUNK: usize = 256 * 1024;
/// Ciphertext gathered before it is sent.
const SEND_AT: usize = 1 << 20;
/// TLS handshake round trips before the client is considered abusive.
const MAX_HANDSHAKE_ROUNDS: usize = 256;

/// The TLS session of a connection, shared by its reader and writers.
pub(crate) struct TlsSession {
    conn: Mutex<ServerConnection>,
    sock: Stream,
    identity: Option<ClientIdentity>,
}

/// Ciphertext read from the socket and not yet handed to rustls.
struct RawIn {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    eof: bool,
}

impl RawIn {
    fn new(leftover: &[u8]) -> RawIn {
        let mut buf = vec![0u8; RAW_BUF.max(leftover.len())].into_boxed_slice();
        buf[..leftover.len()].copy_from_slice(leftover);
        RawIn { buf, start: 0, end: leftover.len(), eof: false }
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Read more ciphertext from the socket (blocking, no lock held).
    fn fill(&mut self, sock: &mut Stream) -> io::Result<()> {
        let n = sock.read(&mut self.buf)?;
        self.start = 0;
        self.end = n;
        self.eof = n == 0;
        Ok(())
    }

    /// Hand buffered ciphertext (or the end of the stream) to rustls and
    /// decrypt what is complete.
    fn feed(&mut self, conn: &mut ServerConnection) -> Result<(), NbdError> {
        let n = conn.read_tls(&mut &self.buf[self.start..self.end])?;
        if n == 0 && !self.is_empty() {
            // rustls takes bytes whenever its plaintext is drained, which
            // the callers do first: a stall is a misbehaving peer.
            return Err(io::Error::new(io::ErrorKind::InvalidData, "TLS input stalled").into());
        }
        self.start += n;
        conn.process_new_packets()?;
        Ok(())
    }
}

impl TlsSession {
    /// Run the TLS handshake on a socket whose NBD_OPT_STARTTLS was just
    /// acknowledged. `leftover` holds bytes already read past the option
    /// (the start of the client's TLS handshake). Read timeouts set on the
    /// socket bound the handshake.
    pub(crate) fn accept(
        config: Arc<rustls::ServerConfig>,
        mut sock: Stream,
        leftover: &[u8],
    ) -> Result<(TlsReader, Arc<TlsSession>), NbdError> {
        let mut conn = ServerConnection::new(config)?;
        let mut raw = RawIn::new(leftover);
        let write_sock = sock.try_clone()?;
        let mut rounds = 0;
        while conn.is_handshaking() {
            if conn.wants_write() {
                send_pending(&mut conn, &write_sock)?;
                continue;
            }
            rounds += 1;
            if rounds > MAX_HANDSHAKE_ROUNDS {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "TLS handshake does not end").into());
            }
            if raw.is_empty() {
                raw.fill(&mut sock)?;
                if raw.eof {
                    return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
                }
            }
            if let Err(e) = raw.feed(&mut conn) {
                // Tell the client why (the alert rustls queued), best effort.
                let _ = send_pending(&mut conn, &write_sock);
                return Err(e);
            }
        }
        // Session tickets and the like.
        send_pending(&mut conn, &write_sock)?;
        // Replies are encrypted in bounded chunks (ENCRYPT_CHUNK) and sent
        // at once, so rustls' own output buffer needs no limit.
        conn.set_buffer_limit(None);
        let identity = conn.peer_certificates().and_then(|c| c.first()).map(|c| ClientIdentity::from_der(c));
        let session = Arc::new(TlsSession { conn: Mutex::new(conn), sock: write_sock, identity });
        Ok((TlsReader { session: Arc::clone(&session), sock, raw }, session))
    }

    /// The verified client certificate's names (mutual TLS only).
    pub(crate) fn identity(&self) -> Option<&ClientIdentity> {
        self.identity.as_ref()
    }

    /// Encrypt and send `bufs` in order. Only one thread may call this at a
    /// time (see the module comment).
    pub(crate) fn write_all_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let mut out = Vec::new();
        for b in bufs {
            for piece in b.chunks(ENCRYPT_CHUNK) {
                {
                    let mut c = lock(&self.conn);
                    io::Write::write_all(&mut c.writer(), piece)?;
                    while c.wants_write() {
                        c.write_tls(&mut out)?;
                    }
                }
                if out.len() >= SEND_AT {
                    self.sock.write_all_vectored(&mut [IoSlice::new(&out)], false)?;
                    out.clear();
                }
            }
        }
        self.sock.write_all_vectored(&mut [IoSlice::new(&out)], false)
    }

    /// Send close_notify (best effort) and close the socket both ways.
    pub(crate) fn shutdown(&self) {
        let mut out = Vec::new();
        {
            let mut c = lock(&self.conn);
            c.send_close_notify();
            while c.wants_write() {
                if c.write_tls(&mut out).is_err() {
                    break;
                }
            }
        }
        let _ = self.sock.write_all_vectored(&mut [IoSlice::new(&out)], false);
        self.sock.shutdown(Shutdown::Both);
    }

    pub(crate) fn sock(&self) -> &Stream {
        &self.sock
    }
}

/// Write whatever rustls has queued straight to the socket (handshake only:
/// one thread owns the connection then).
fn send_pending(conn: &mut ServerConnection, sock: &Stream) -> io::Result<()> {
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out)?;
    }
    sock.write_all_vectored(&mut [IoSlice::new(&out)], false)
}

/// The decrypting read side of a TLS session.
pub(crate) struct TlsReader {
    session: Arc<TlsSession>,
    sock: Stream,
    raw: RawIn,
}

impl Read for TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // Each pass either returns, consumes buffered ciphertext, or reads
        // the socket; the socket eventually reports EOF or an error.
        loop {
            {
                let mut c = lock(&self.session.conn);
                match c.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if self.raw.eof {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                if !self.raw.is_empty() {
                    self.raw.feed(&mut c).map_err(into_io)?;
                    continue;
                }
            }
            self.raw.fill(&mut self.sock)?;
            if self.raw.eof {
                // Let rustls see the end: a clean close_notify reads as 0.
                let mut c = lock(&self.session.conn);
                let _ = c.read_tls(&mut io::empty());
                return match c.reader().read(buf) {
                    Ok(n) => Ok(n),
                    Err(_) => Err(io::ErrorKind::UnexpectedEof.into()),
                };
            }
        }
    }
}

fn into_io(e: NbdError) -> io::Error {
    match e {
        NbdError::Io(e) => e,
        other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
    }
}

/// Where replies go: the socket itself, or the TLS session.
pub(crate) enum Transport {
    Plain(Stream),
    Tls(Arc<TlsSession>),
}

impl Transport {
    pub(crate) fn shutdown(&self) {
        match self {
            Transport::Plain(s) => s.shutdown(Shutdown::Both),
            Transport::Tls(t) => t.shutdown(),
        }
    }
}

/// The connection during option haggling: reads options, writes replies;
/// upgraded in place by NBD_OPT_STARTTLS.
pub(crate) enum Channel {
    Plain { reader: BufReader<Stream>, writer: Stream },
    Tls { reader: BufReader<TlsReader>, session: Arc<TlsSession> },
}

impl Channel {
    pub(crate) fn plain(stream: Stream, read_buf: usize) -> io::Result<Channel> {
        let writer = stream.try_clone()?;
        Ok(Channel::Plain { reader: BufReader::with_capacity(read_buf, stream), writer })
    }

    /// The socket (for timeouts, which apply to every handle on it).
    pub(crate) fn sock(&self) -> &Stream {
        match self {
            Channel::Plain { writer, .. } => writer,
            Channel::Tls { session, .. } => session.sock(),
        }
    }

    pub(crate) fn identity(&self) -> Option<&ClientIdentity> {
        match self {
            Channel::Plain { .. } => None,
            Channel::Tls { session, .. } => session.identity(),
        }
    }

    pub(crate) fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        match self {
            Channel::Plain { reader, .. } => reader.read_exact(buf),
            Channel::Tls { reader, .. } => reader.read_exact(buf),
        }
    }

    pub(crate) fn write_all(&self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Channel::Plain { writer, .. } => writer.write_all_vectored(&mut [IoSlice::new(bytes)], false),
            Channel::Tls { session, .. } => session.write_all_vectored(&[IoSlice::new(bytes)]),
        }
    }

    /// Switch to TLS after NBD_OPT_STARTTLS was acknowledged. Bytes the
    /// plain reader had buffered beyond the option belong to the TLS
    /// handshake. Fails (the connection must close) on a failed handshake.
    pub(crate) fn start_tls(self, config: Arc<rustls::ServerConfig>, read_buf: usize) -> Result<Channel, NbdError> {
        let Channel::Plain { reader, writer: _ } = self else {
            return Err(io::Error::other("TLS already started").into());
        };
        let leftover = reader.buffer().to_vec();
        let (tls_reader, session) = TlsSession::accept(config, reader.into_inner(), &leftover)?;
        Ok(Channel::Tls { reader: BufReader::with_capacity(read_buf, tls_reader), session })
    }
}
