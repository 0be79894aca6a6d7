//! A minimal raw-protocol NBD client for the integration tests.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use tarn_nbd::memory::{MemoryBackend, MemoryExport};
use tarn_nbd::protocol::*;
use tarn_nbd::{BlockStatusExtent, Export, ExportError, Server, ServerConfig};

pub const SIZE: u64 = 16 << 20;

pub struct TestServer {
    pub server: Server,
    pub addr: SocketAddr,
    pub export: Arc<MemoryExport>,
}

pub fn start() -> TestServer {
    start_with(MemoryExport::new(SIZE), ServerConfig::default())
}

/// A server whose export "mem" tracks changes as `qemu:dirty-bitmap:<bitmap>`.
pub fn start_dirty(bitmap: &str) -> TestServer {
    start_with(MemoryExport::new(SIZE).with_dirty_bitmap(bitmap), ServerConfig::default())
}

pub fn start_with(export: MemoryExport, config: ServerConfig) -> TestServer {
    let export = Arc::new(export);
    let backend = MemoryBackend::new().with_export("mem", "test export", export.clone());
    let server = Server::new(Arc::new(backend), config);
    let addr = server.listen_tcp("127.0.0.1:0").expect("listen");
    TestServer { server, addr, export }
}

/// A raw client on a TCP stream, or on any other byte stream (a TLS
/// session after NBD_OPT_STARTTLS).
pub struct Client<S: Read + Write = TcpStream> {
    pub s: S,
}

#[derive(Debug)]
pub struct OptReply {
    pub option: u32,
    pub rtype: u32,
    pub data: Vec<u8>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Chunk {
    pub flags: u16,
    pub ctype: u16,
    pub handle: u64,
    pub payload: Vec<u8>,
}

/// An extended reply chunk (NBD_EXTENDED_REPLY_MAGIC).
#[derive(Debug, PartialEq, Eq)]
pub struct ExtChunk {
    pub flags: u16,
    pub ctype: u16,
    pub handle: u64,
    /// The request's offset, echoed.
    pub offset: u64,
    pub payload: Vec<u8>,
}

impl ExtChunk {
    /// Error value of an error chunk.
    pub fn error(&self) -> u32 {
        assert_eq!(self.ctype, NBD_REPLY_TYPE_ERROR, "expected an error chunk: {self:?}");
        u32::from_be_bytes(self.payload[0..4].try_into().unwrap())
    }
}

/// Any reply in the transmission phase.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Simple { error: u32, handle: u64 },
    Chunk(Chunk),
}

impl Client<TcpStream> {
    /// Connect and do the initial greeting with the given client flags.
    pub fn connect_raw(addr: SocketAddr, client_flags: u32) -> Client {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = Client { s };
        let mut g = [0u8; 18];
        c.s.read_exact(&mut g).expect("greeting");
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(u16::from_be_bytes([g[16], g[17]]), NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
        c.s.write_all(&client_flags.to_be_bytes()).unwrap();
        c
    }

    pub fn connect(addr: SocketAddr) -> Client {
        Client::connect_raw(addr, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)
    }

    /// Full handshake: optionally structured replies + base:allocation, then GO.
    pub fn open(addr: SocketAddr, structured: bool) -> (Client, u64, u16) {
        let mut c = Client::connect(addr);
        if structured {
            c.structured();
            let r = c.set_meta("mem", &["base:allocation"]);
            assert_eq!(r.len(), 2);
            assert_eq!(r[0].rtype, NBD_REP_META_CONTEXT);
        }
        let (size, flags, _) = c.go("mem", &[NBD_INFO_BLOCK_SIZE]).expect("GO");
        (c, size, flags)
    }
}

impl<S: Read + Write> Client<S> {
    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut b = Vec::new();
        b.extend_from_slice(&IHAVEOPT.to_be_bytes());
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).unwrap();
    }

    pub fn read_opt_reply(&mut self) -> OptReply {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h).expect("option reply header");
        assert_eq!(u64::from_be_bytes(h[0..8].try_into().unwrap()), OPT_REPLY_MAGIC);
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize;
        let mut data = vec![0u8; len];
        self.s.read_exact(&mut data).unwrap();
        OptReply {
            option: u32::from_be_bytes(h[8..12].try_into().unwrap()),
            rtype: u32::from_be_bytes(h[12..16].try_into().unwrap()),
            data,
        }
    }

    /// Send an option and collect replies up to the final one.
    pub fn option(&mut self, option: u32, data: &[u8]) -> Vec<OptReply> {
        self.send_option(option, data);
        let mut v = Vec::new();
        loop {
            let r = self.read_opt_reply();
            assert_eq!(r.option, option);
            let last = r.rtype == NBD_REP_ACK || r.rtype & 0x8000_0000 != 0;
            v.push(r);
            if last {
                return v;
            }
        }
    }

    pub fn structured(&mut self) {
        let r = self.option(NBD_OPT_STRUCTURED_REPLY, &[]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].rtype, NBD_REP_ACK);
    }

    pub fn set_meta(&mut self, name: &str, queries: &[&str]) -> Vec<OptReply> {
        self.option(NBD_OPT_SET_META_CONTEXT, &meta_data(name, queries))
    }

    /// NBD_OPT_LIST_META_CONTEXT that must succeed; the context names listed
    /// (whose reserved IDs must be 0).
    pub fn list_meta(&mut self, name: &str, queries: &[&str]) -> Vec<String> {
        let r = self.option(NBD_OPT_LIST_META_CONTEXT, &meta_data(name, queries));
        assert_eq!(r.last().unwrap().rtype, NBD_REP_ACK, "{r:?}");
        let ctx = meta_contexts_of(&r);
        assert!(ctx.iter().all(|(id, _)| *id == 0), "{ctx:?}");
        ctx.into_iter().map(|(_, n)| n).collect()
    }

    /// NBD_OPT_SET_META_CONTEXT that must succeed; the (id, name) selected.
    pub fn set_meta_ids(&mut self, name: &str, queries: &[&str]) -> Vec<(u32, String)> {
        let r = self.set_meta(name, queries);
        assert_eq!(r.last().unwrap().rtype, NBD_REP_ACK, "{r:?}");
        meta_contexts_of(&r)
    }

    /// Send NBD_CMD_BLOCK_STATUS and read chunks up to the one flagged DONE
    /// (at most 100).
    pub fn block_status(&mut self, flags: u16, handle: u64, offset: u64, length: u32) -> Vec<Chunk> {
        self.request(flags, NBD_CMD_BLOCK_STATUS, handle, offset, length, &[]);
        self.chunks(handle)
    }

    /// Structured chunks of `handle` up to the one flagged DONE (at most 1000).
    pub fn chunks(&mut self, handle: u64) -> Vec<Chunk> {
        self.until_done(handle, Self::chunk, |c| (c.handle, c.flags))
    }

    /// Chunks read by `next` until the one flagged DONE (at most 1000),
    /// each checked to answer `handle` (`head` gives its handle and flags).
    fn until_done<C>(&mut self, handle: u64, next: fn(&mut Self) -> C, head: fn(&C) -> (u64, u16)) -> Vec<C> {
        let mut v = Vec::new();
        for _ in 0..1000 {
            let c = next(self);
            let (h, flags) = head(&c);
            assert_eq!(h, handle);
            v.push(c);
            if flags & NBD_REPLY_FLAG_DONE != 0 {
                return v;
            }
        }
        panic!("no chunk flagged DONE among 1000");
    }

    /// NBD_OPT_GO; returns (size, transmission flags) or the error reply type.
    pub fn go(&mut self, name: &str, infos: &[u16]) -> Result<(u64, u16, Vec<OptReply>), u32> {
        let replies = self.option(NBD_OPT_GO, &info_data(name, infos));
        let last = replies.last().unwrap();
        if last.rtype != NBD_REP_ACK {
            return Err(last.rtype);
        }
        let exp = replies
            .iter()
            .find(|r| r.rtype == NBD_REP_INFO && r.data[0..2] == NBD_INFO_EXPORT.to_be_bytes())
            .expect("NBD_INFO_EXPORT");
        assert_eq!(exp.data.len(), 12);
        let size = u64::from_be_bytes(exp.data[2..10].try_into().unwrap());
        let flags = u16::from_be_bytes(exp.data[10..12].try_into().unwrap());
        Ok((size, flags, replies))
    }

    pub fn request(&mut self, flags: u16, command: u16, handle: u64, offset: u64, length: u32, payload: &[u8]) {
        let h = RequestHeader { flags, command, handle, offset, length };
        let mut b = encode_request_header(&h).to_vec();
        b.extend_from_slice(payload);
        self.s.write_all(&b).unwrap();
    }

    /// Read one reply; `read_len` tells how much data follows a successful
    /// simple reply (the client must know it from its own request).
    pub fn reply(&mut self, read_len: impl Fn(u64) -> usize) -> (Reply, Vec<u8>) {
        let mut m = [0u8; 4];
        self.s.read_exact(&mut m).expect("reply magic");
        let magic = u32::from_be_bytes(m);
        if magic == SIMPLE_REPLY_MAGIC {
            let mut r = [0u8; 12];
            self.s.read_exact(&mut r).unwrap();
            let error = u32::from_be_bytes(r[0..4].try_into().unwrap());
            let handle = u64::from_be_bytes(r[4..12].try_into().unwrap());
            let mut data = Vec::new();
            if error == 0 {
                data = vec![0u8; read_len(handle)];
                self.s.read_exact(&mut data).unwrap();
            }
            (Reply::Simple { error, handle }, data)
        } else {
            assert_eq!(magic, STRUCTURED_REPLY_MAGIC, "unexpected reply magic {magic:#x}");
            let mut r = [0u8; 16];
            self.s.read_exact(&mut r).unwrap();
            let len = u32::from_be_bytes(r[12..16].try_into().unwrap()) as usize;
            let mut payload = vec![0u8; len];
            self.s.read_exact(&mut payload).unwrap();
            let chunk = Chunk {
                flags: u16::from_be_bytes(r[0..2].try_into().unwrap()),
                ctype: u16::from_be_bytes(r[2..4].try_into().unwrap()),
                handle: u64::from_be_bytes(r[4..12].try_into().unwrap()),
                payload,
            };
            (Reply::Chunk(chunk), Vec::new())
        }
    }

    /// Simple reply without data; returns (error, handle).
    pub fn simple(&mut self) -> (u32, u64) {
        match self.reply(|_| 0).0 {
            Reply::Simple { error, handle } => (error, handle),
            other => panic!("expected a simple reply, got {other:?}"),
        }
    }

    /// Structured chunk.
    pub fn chunk(&mut self) -> Chunk {
        match self.reply(|_| 0).0 {
            Reply::Chunk(c) => c,
            other => panic!("expected a chunk, got {other:?}"),
        }
    }

    /// Error value of the next reply, simple or structured error chunk.
    pub fn error_of_next(&mut self) -> (u32, u64) {
        match self.reply(|_| 0).0 {
            Reply::Simple { error, handle } => (error, handle),
            Reply::Chunk(c) => {
                assert_eq!(c.ctype, NBD_REPLY_TYPE_ERROR, "expected an error chunk: {c:?}");
                assert_ne!(c.flags & NBD_REPLY_FLAG_DONE, 0);
                (u32::from_be_bytes(c.payload[0..4].try_into().unwrap()), c.handle)
            }
        }
    }

    pub fn write(&mut self, handle: u64, offset: u64, data: &[u8]) {
        self.request(0, NBD_CMD_WRITE, handle, offset, data.len() as u32, data);
    }

    /// Simple-reply read.
    pub fn read_simple(&mut self, handle: u64, offset: u64, len: u32) -> Vec<u8> {
        self.request(0, NBD_CMD_READ, handle, offset, len, &[]);
        let (r, data) = self.reply(|_| len as usize);
        assert_eq!(r, Reply::Simple { error: 0, handle });
        data
    }

    /// Send an extended (32-byte) request header and its payload.
    pub fn ext_request(&mut self, flags: u16, command: u16, handle: u64, offset: u64, length: u64, payload: &[u8]) {
        let h = ExtendedRequestHeader { flags, command, handle, offset, length };
        let mut b = encode_extended_request_header(&h).to_vec();
        b.extend_from_slice(payload);
        self.s.write_all(&b).unwrap();
    }

    /// Read one extended reply chunk (any other magic fails the test; a
    /// payload above 64 MiB too).
    pub fn ext_chunk(&mut self) -> ExtChunk {
        let mut h = [0u8; 32];
        self.s.read_exact(&mut h).expect("extended reply header");
        let magic = u32::from_be_bytes(h[0..4].try_into().unwrap());
        assert_eq!(magic, EXTENDED_REPLY_MAGIC, "expected an extended reply, got magic {magic:#x}");
        let len = u64::from_be_bytes(h[24..32].try_into().unwrap());
        assert!(len <= 64 << 20, "absurd reply length {len}");
        let mut payload = vec![0u8; len as usize];
        self.s.read_exact(&mut payload).unwrap();
        ExtChunk {
            flags: u16::from_be_bytes([h[4], h[5]]),
            ctype: u16::from_be_bytes([h[6], h[7]]),
            handle: u64::from_be_bytes(h[8..16].try_into().unwrap()),
            offset: u64::from_be_bytes(h[16..24].try_into().unwrap()),
            payload,
        }
    }

    /// Extended chunks of `handle` up to the one flagged DONE (at most 1000).
    pub fn ext_chunks(&mut self, handle: u64) -> Vec<ExtChunk> {
        self.until_done(handle, Self::ext_chunk, |c| (c.handle, c.flags))
    }

    pub fn disc(&mut self) {
        self.request(0, NBD_CMD_DISC, 0, 0, 0, &[]);
    }

    /// True if the server closed the connection (EOF or an error) within
    /// the read timeout; false if it sent something. Panics on a timeout.
    pub fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 1];
        read_shows_close(&self.s.read(&mut b), "closed_by_server")
    }
}

/// Whether the result of a read shows the peer closed the connection: EOF,
/// or an error such as a reset or a TLS alert. A read timeout panics: a
/// server that neither answers nor closes must not pass for one that closed.
pub fn read_shows_close(r: &std::io::Result<usize>, what: &str) -> bool {
    use std::io::ErrorKind::{TimedOut, WouldBlock};
    match r {
        Ok(n) => *n == 0,
        Err(e) if matches!(e.kind(), WouldBlock | TimedOut) => {
            panic!("{what}: the server neither closed nor answered within the read timeout ({e})")
        }
        Err(_) => true,
    }
}

pub fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// (id, name) of the NBD_REP_META_CONTEXT replies.
pub fn meta_contexts_of(replies: &[OptReply]) -> Vec<(u32, String)> {
    replies
        .iter()
        .filter(|r| r.rtype == NBD_REP_META_CONTEXT)
        .map(|r| {
            let id = u32::from_be_bytes(r.data[0..4].try_into().unwrap());
            (id, String::from_utf8(r.data[4..].to_vec()).unwrap())
        })
        .collect()
}

pub fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    tarn_nbd::protocol::encode_meta_context_request(name, queries)
}

/// Parse a BLOCK_STATUS chunk payload into (context id, [(length, status)]).
pub fn parse_block_status(payload: &[u8]) -> (u32, Vec<(u32, u32)>) {
    assert!(payload.len() >= 12 && payload.len() % 8 == 4);
    let id = u32::from_be_bytes(payload[0..4].try_into().unwrap());
    let d = payload[4..]
        .chunks(8)
        .map(|c| (u32::from_be_bytes(c[0..4].try_into().unwrap()), u32::from_be_bytes(c[4..8].try_into().unwrap())))
        .collect();
    (id, d)
}

/// Parse an OFFSET_HOLE chunk payload into (offset, size).
pub fn parse_hole(payload: &[u8]) -> (u64, u32) {
    assert_eq!(payload.len(), 12, "OFFSET_HOLE payload");
    (u64::from_be_bytes(payload[0..8].try_into().unwrap()), u32::from_be_bytes(payload[8..12].try_into().unwrap()))
}

pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A memory export whose reads and writes take a while: requests stay in
/// flight, and the server answers them on worker threads.
pub struct SlowExport {
    pub inner: MemoryExport,
    pub read_delay: Duration,
    pub write_delay: Duration,
    pub flush_delay: Duration,
    /// Export flushes run so far.
    pub flushes: std::sync::atomic::AtomicU64,
    /// Reads running now, and the most that ever ran at once.
    pub reads_now: std::sync::atomic::AtomicUsize,
    pub reads_max: std::sync::atomic::AtomicUsize,
    /// Writes running now, and the most that ever ran at once.
    pub writes_now: std::sync::atomic::AtomicUsize,
    pub writes_max: std::sync::atomic::AtomicUsize,
}

impl SlowExport {
    pub fn new(size: u64, read_delay: Duration, write_delay: Duration, flush_delay: Duration) -> SlowExport {
        let inner = MemoryExport::new(size);
        SlowExport {
            inner,
            read_delay,
            write_delay,
            flush_delay,
            flushes: Default::default(),
            reads_now: Default::default(),
            reads_max: Default::default(),
            writes_now: Default::default(),
            writes_max: Default::default(),
        }
    }
}

impl Export for SlowExport {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read(&self, o: u64, b: &mut [u8]) -> Result<(), ExportError> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.reads_now.fetch_add(1, SeqCst) + 1;
        self.reads_max.fetch_max(now, SeqCst);
        std::thread::sleep(self.read_delay);
        let r = self.inner.read(o, b);
        self.reads_now.fetch_sub(1, SeqCst);
        r
    }
    fn write(&self, o: u64, d: &[u8], f: bool) -> Result<(), ExportError> {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.writes_now.fetch_add(1, SeqCst) + 1;
        self.writes_max.fetch_max(now, SeqCst);
        std::thread::sleep(self.write_delay);
        let r = self.inner.write(o, d, f);
        self.writes_now.fetch_sub(1, SeqCst);
        r
    }
    fn flush(&self) -> Result<(), ExportError> {
        std::thread::sleep(self.flush_delay);
        self.flushes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.flush()
    }
    fn trim(&self, o: u64, l: u64, f: bool) -> Result<(), ExportError> {
        self.inner.trim(o, l, f)
    }
    fn write_zeroes(&self, o: u64, l: u64, n: bool, fa: bool, fu: bool) -> Result<(), ExportError> {
        self.inner.write_zeroes(o, l, n, fa, fu)
    }
    fn block_status(&self, o: u64, l: u64) -> Result<Vec<BlockStatusExtent>, ExportError> {
        self.inner.block_status(o, l)
    }
}
