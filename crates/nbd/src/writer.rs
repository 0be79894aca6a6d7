//! Reply output of a connection: a combining writer shared by the worker
//! threads, and a small pool of data buffers.
//!
//! A worker that finishes a request hands its [`Reply`] to
//! [`ReplyWriter::send`]. If no other thread is writing, it becomes the
//! writer and sends every queued reply with one `sendmsg` per batch;
//! otherwise it only queues the reply and returns, and the thread that is
//! writing sends it before it stops writing. Each reply (header + payload)
//! is thus written contiguously, replies are batched under load, and payload
//! buffers are never copied.
//!
//! A reply with a large payload (a big READ) is not handed over: its own
//! thread waits for the socket and writes it, while the payload it has just
//! read is still in that CPU's cache. On plain sockets its header goes out
//! with `MSG_MORE` and the payload in a `sendmsg` of its own. Both measured
//! on loopback TCP, 1 MiB sequential reads from the page cache
//! (docs/ARCHITECTURE.md, *Sequential I/O*): header and payload in one
//! `sendmsg` made each send ~3x slower at queue depth 1, and payloads sent
//! by another thread than the one that read them cost ~20% at depth 8.

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::protocol;
use crate::transport::Transport;
use crate::util::{lock, wait};

/// One reply: a short inline header followed by an optional payload.
pub(crate) struct Reply {
    head: [u8; protocol::MAX_READ_HEAD_LEN],
    head_len: u8,
    /// Payload sent after the header.
    data: Vec<u8>,
    /// A buffer returned to the pool after sending (not sent).
    spare: Vec<u8>,
}

impl Reply {
    /// A simple reply without payload.
    pub(crate) fn simple(handle: u64, error: u32) -> Reply {
        let mut head = [0u8; protocol::MAX_READ_HEAD_LEN];
        head[..protocol::SIMPLE_REPLY_LEN].copy_from_slice(&protocol::encode_simple_reply(handle, error));
        Reply { head, head_len: protocol::SIMPLE_REPLY_LEN as u8, data: Vec::new(), spare: Vec::new() }
    }

    /// A successful simple reply to a read, followed by `data`.
    pub(crate) fn simple_read(handle: u64, data: Vec<u8>) -> Reply {
        let mut r = Reply::simple(handle, 0);
        r.data = data;
        r
    }

    /// A single final `OFFSET_DATA` chunk (structured or extended, as
    /// `framing` says) carrying `data` read at `offset`.
    pub(crate) fn read_chunk(framing: &protocol::ChunkFraming, offset: u64, data: Vec<u8>) -> Reply {
        let (head, len) = framing.read_data_head(offset, data.len() as u64, true);
        Reply { head, head_len: len as u8, data, spare: Vec::new() }
    }

    /// A single final structured `OFFSET_DATA` chunk carrying `data` read at `offset`.
    #[cfg(test)]
    pub(crate) fn structured_read(handle: u64, offset: u64, data: Vec<u8>) -> Reply {
        let framing = protocol::ChunkFraming { extended: false, handle, request_offset: offset };
        Reply::read_chunk(&framing, offset, data)
    }

    /// A fully encoded message.
    pub(crate) fn encoded(bytes: Vec<u8>) -> Reply {
        Reply { head: [0u8; protocol::MAX_READ_HEAD_LEN], head_len: 0, data: bytes, spare: Vec::new() }
    }

    /// Attach a buffer to be recycled once the reply is sent.
    pub(crate) fn with_spare(mut self, spare: Vec<u8>) -> Reply {
        self.spare = spare;
        self
    }

    #[cfg(test)]
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut v = self.head[..self.head_len as usize].to_vec();
        v.extend_from_slice(&self.data);
        v
    }
}

/// Pool of payload buffers (per connection) to avoid an allocation and a
/// page-faulting zero fill per request.
pub(crate) struct BufPool {
    inner: Mutex<PoolInner>,
}

struct PoolInner {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

/// Buffers larger than this are not kept.
const POOL_MAX_BUF: usize = 4 << 20;
/// Total capacity kept per connection.
const POOL_MAX_BYTES: usize = 16 << 20;
const POOL_MAX_COUNT: usize = 256;

impl BufPool {
    pub(crate) fn new() -> BufPool {
        BufPool { inner: Mutex::new(PoolInner { bufs: Vec::new(), bytes: 0 }) }
    }

    /// A buffer of exactly `len` bytes (contents unspecified: old data or zero).
    pub(crate) fn get(&self, len: usize) -> Vec<u8> {
        let mut v = if len <= POOL_MAX_BUF {
            let mut p = lock(&self.inner);
            match p.bufs.pop() {
                Some(v) => {
                    p.bytes -= v.capacity();
                    v
                }
                None => Vec::new(),
            }
        } else {
            Vec::new()
        };
        if v.len() < len {
            v.resize(len, 0);
        } else {
            v.truncate(len);
        }
        v
    }

    /// Return buffers to the pool.
    pub(crate) fn put_many(&self, bufs: impl Iterator<Item = Vec<u8>>) {
        let mut p = lock(&self.inner);
        for v in bufs {
            let cap = v.capacity();
            if cap == 0 || cap > POOL_MAX_BUF || p.bufs.len() >= POOL_MAX_COUNT || p.bytes + cap > POOL_MAX_BYTES {
                continue;
            }
            p.bytes += cap;
            p.bufs.push(v);
        }
    }

    pub(crate) fn put(&self, v: Vec<u8>) {
        self.put_many(std::iter::once(v));
    }
}

/// The shared, combining reply writer of one connection.
pub(crate) struct ReplyWriter {
    transport: Transport,
    state: Mutex<WriterState>,
    /// Signalled (one waiter) when a writer stops writing and a large reply
    /// waits for the socket; all waiters when the writer breaks.
    idle: Condvar,
    broken: AtomicBool,
}

struct WriterState {
    queue: Vec<Reply>,
    writing: bool,
    spare: Vec<Reply>,
    /// Threads waiting on `idle` to write their large reply.
    waiting: usize,
}

/// Replies per `sendmsg` (two iovecs each).
const BATCH: usize = 64;

/// Replies whose payload is at least this long are written by their own
/// thread (see the module comment).
pub(crate) const OWN_SEND_MIN: usize = 64 << 10;

impl ReplyWriter {
    pub(crate) fn new(transport: Transport) -> ReplyWriter {
        ReplyWriter {
            transport,
            state: Mutex::new(WriterState {
                queue: Vec::with_capacity(64),
                writing: false,
                spare: Vec::with_capacity(64),
                waiting: 0,
            }),
            idle: Condvar::new(),
            broken: AtomicBool::new(false),
        }
    }

    /// Whether a write failed (the connection is unusable).
    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// Queue `reply`; send it (and everything queued meanwhile) unless
    /// another thread is already sending. When every caller of `send` and
    /// [`ReplyWriter::flush`] has returned, every queued reply has been
    /// written (or the writer broke).
    pub(crate) fn send(&self, reply: Reply, pool: &BufPool) {
        let mut st = lock(&self.state);
        if reply.data.len() >= OWN_SEND_MIN {
            // Bounded: every writer stops once the queue is empty, and a
            // broken writer stops at once. Each writer that stops wakes one
            // waiter (not all: at queue depth 8 up to seven threads wait
            // here, and waking them all for one to write cost a futex call
            // and a context switch each per reply); a woken waiter either
            // writes, and wakes the next when done, or finds another writer
            // at it, which will.
            while st.writing && !self.is_broken() {
                st.waiting += 1;
                st = wait(&self.idle, st);
                st.waiting -= 1;
            }
        }
        if let Some(st) = self.push(st, reply, pool) {
            self.drain(st, pool);
        }
    }

    /// Queue `reply` without writing it: it goes out with the next
    /// [`ReplyWriter::send`] or [`ReplyWriter::flush`] (batching replies
    /// produced back to back into one system call).
    pub(crate) fn defer(&self, reply: Reply, pool: &BufPool) {
        let st = lock(&self.state);
        let _ = self.push(st, reply, pool);
    }

    /// Write every queued reply (unless another thread is already at it).
    pub(crate) fn flush(&self, pool: &BufPool) {
        let st = lock(&self.state);
        if !st.writing && !st.queue.is_empty() {
            self.drain(st, pool);
        }
    }

    /// Push under the lock; returns the guard if the caller should drain.
    fn push<'a>(
        &self,
        mut st: MutexGuard<'a, WriterState>,
        reply: Reply,
        pool: &BufPool,
    ) -> Option<MutexGuard<'a, WriterState>> {
        if self.is_broken() {
            drop(st);
            pool.put_many([reply.data, reply.spare].into_iter());
            return None;
        }
        st.queue.push(reply);
        if st.writing {
            None
        } else {
            Some(st)
        }
    }

    /// Become the writer and write until the queue is empty.
    fn drain<'a>(&'a self, mut st: MutexGuard<'a, WriterState>, pool: &BufPool) {
        st.writing = true;
        let mut batch = std::mem::take(&mut st.spare);
        loop {
            std::mem::swap(&mut batch, &mut st.queue);
            drop(st);
            let res = self.write_batch(&batch);
            pool.put_many(batch.drain(..).flat_map(|r| [r.data, r.spare]));
            st = lock(&self.state);
            if let Err(e) = res {
                log::debug!("nbd: reply write failed: {e}");
                self.broken.store(true, Ordering::Relaxed);
                // Wake the reader too: the connection is over.
                self.transport.shutdown();
                let dropped = std::mem::take(&mut st.queue);
                st.writing = false;
                drop(st);
                self.idle.notify_all();
                pool.put_many(dropped.into_iter().flat_map(|r| [r.data, r.spare]));
                return;
            }
            if st.queue.is_empty() {
                st.writing = false;
                st.spare = batch;
                // No system call when nobody waits (the common case for
                // small replies): Condvar::notify_one always makes one.
                let waiter = st.waiting > 0;
                drop(st);
                if waiter {
                    self.idle.notify_one();
                }
                return;
            }
        }
    }

    /// Close the connection in both directions.
    pub(crate) fn shutdown(&self) {
        self.transport.shutdown();
    }

    fn write_batch(&self, batch: &[Reply]) -> std::io::Result<()> {
        for chunk in batch.chunks(BATCH) {
            let mut iov = [IoSlice::new(&[]); 2 * BATCH];
            let mut n = 0;
            for r in chunk {
                if r.head_len > 0 {
                    iov[n] = IoSlice::new(&r.head[..r.head_len as usize]);
                    n += 1;
                }
                if r.data.len() >= OWN_SEND_MIN {
                    if let Transport::Plain(s) = &self.transport {
                        // What is gathered so far, the header last, corked
                        // by MSG_MORE; then the payload on its own.
                        s.write_all_vectored(&mut iov[..n], true)?;
                        s.write_all_vectored(&mut [IoSlice::new(&r.data)], false)?;
                        n = 0;
                        continue;
                    }
                }
                if !r.data.is_empty() {
                    iov[n] = IoSlice::new(&r.data);
                    n += 1;
                }
            }
            match &self.transport {
                Transport::Plain(s) => s.write_all_vectored(&mut iov[..n], false)?,
                Transport::Tls(t) => t.write_all_vectored(&iov[..n])?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_bytes() {
        assert_eq!(Reply::simple(3, 22).bytes(), protocol::encode_simple_reply(3, 22).to_vec());
        let r = Reply::structured_read(1, 512, vec![9u8; 4]);
        let b = r.bytes();
        assert_eq!(&b[..28], &protocol::encode_read_chunk_header(1, 512, 4, true));
        assert_eq!(&b[28..], &[9, 9, 9, 9]);
        let r = Reply::simple_read(1, vec![1, 2]).with_spare(vec![0; 10]);
        assert_eq!(r.bytes().len(), 18);
        assert_eq!(Reply::encoded(vec![5; 7]).bytes(), vec![5; 7]);
    }

    /// Reply `i` of thread `t`: every third one a large read (written by
    /// its own thread), else a small read or a bare reply. The payload
    /// repeats the handle's low byte, so a reply cut by another shows.
    fn mixed_reply(t: u64, i: u64) -> Reply {
        let handle = (t << 32) | i;
        match i % 3 {
            0 => Reply::structured_read(handle, i, vec![handle as u8; OWN_SEND_MIN * 2 + 7]),
            1 => Reply::structured_read(handle, i, vec![handle as u8; 1000]),
            _ => Reply::simple(handle, 0),
        }
    }

    /// Parse `n` replies from `r`, checking each is whole; returns them
    /// as (handle, payload length).
    fn read_replies(mut r: impl std::io::Read, n: usize) -> Vec<(u64, usize)> {
        let mut seen = Vec::with_capacity(n);
        for _ in 0..n {
            let mut h = [0u8; protocol::SIMPLE_REPLY_LEN];
            r.read_exact(&mut h).unwrap();
            let magic = u32::from_be_bytes(h[..4].try_into().unwrap());
            if magic == protocol::SIMPLE_REPLY_MAGIC {
                seen.push((u64::from_be_bytes(h[8..16].try_into().unwrap()), 0));
                continue;
            }
            assert_eq!(magic, protocol::STRUCTURED_REPLY_MAGIC, "a reply was cut by another");
            let mut rest = [0u8; protocol::READ_CHUNK_HEADER_LEN - protocol::SIMPLE_REPLY_LEN];
            r.read_exact(&mut rest).unwrap();
            let handle = u64::from_be_bytes(h[8..16].try_into().unwrap());
            let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize - 8;
            let mut data = vec![0u8; len];
            r.read_exact(&mut data).unwrap();
            assert!(data.iter().all(|&b| b == handle as u8), "payload of {handle:#x} mixed with another");
            seen.push((handle, len));
        }
        seen
    }

    /// Send `replies(t)` from each of `threads` threads and wait for them
    /// all. A sender that never returns is a waiter nobody woke: the
    /// watchdog turns that into a failure instead of a hang (a bound on
    /// progress, generous on a loaded machine, not a timing).
    fn send_all<I>(
        writer: &std::sync::Arc<ReplyWriter>,
        pool: &std::sync::Arc<BufPool>,
        threads: u64,
        replies: impl Fn(u64) -> I + Send + Copy + 'static,
    ) where
        I: Iterator<Item = Reply>,
    {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        for t in 0..threads {
            let (w, p, tx) = (writer.clone(), pool.clone(), done_tx.clone());
            std::thread::spawn(move || {
                replies(t).for_each(|r| w.send(r, &p));
                tx.send(()).unwrap();
            });
        }
        for n in 0..threads {
            let waited = done_rx.recv_timeout(std::time::Duration::from_secs(120));
            assert!(waited.is_ok(), "{} of {threads} senders stalled: a waiter was never woken", threads - n);
        }
    }

    #[test]
    fn large_and_small_replies_from_many_threads_stay_whole() {
        use crate::stream::Stream;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let writer = std::sync::Arc::new(ReplyWriter::new(Transport::Plain(Stream::Tcp(server))));
        let pool = std::sync::Arc::new(BufPool::new());
        const THREADS: u64 = 4;
        const EACH: u64 = 60;
        let reader = std::thread::spawn(move || read_replies(client, (THREADS * EACH) as usize));
        send_all(&writer, &pool, THREADS, move |t| (0..EACH).map(move |i| mixed_reply(t, i)));
        let mut seen = reader.join().unwrap();
        seen.sort_unstable();
        let mut want: Vec<(u64, usize)> =
            (0..THREADS).flat_map(|t| (0..EACH).map(move |i| ((t << 32) | i, mixed_reply(t, i).data.len()))).collect();
        want.sort_unstable();
        assert_eq!(seen, want);
        assert!(!writer.is_broken());
    }

    /// Eight threads send only large replies, far more than the socket
    /// buffers, so most of them wait for the writer at any time; each
    /// writer that stops wakes one waiter only. Every reply must arrive
    /// whole and no waiter may be left asleep (see [`send_all`]).
    #[test]
    fn every_large_reply_waiter_gets_its_turn() {
        use crate::stream::Stream;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let writer = std::sync::Arc::new(ReplyWriter::new(Transport::Plain(Stream::Tcp(server))));
        let pool = std::sync::Arc::new(BufPool::new());
        const THREADS: u64 = 8;
        const EACH: u64 = 24;
        let large = |t: u64, i: u64| {
            let handle = (t << 32) | i;
            Reply::structured_read(handle, i, vec![handle as u8; OWN_SEND_MIN * 4 + (i as usize)])
        };
        let reader = std::thread::spawn(move || read_replies(client, (THREADS * EACH) as usize));
        send_all(&writer, &pool, THREADS, move |t| (0..EACH).map(move |i| large(t, i)));
        let mut seen = reader.join().unwrap();
        seen.sort_unstable();
        let mut want: Vec<(u64, usize)> =
            (0..THREADS).flat_map(|t| (0..EACH).map(move |i| ((t << 32) | i, large(t, i).data.len()))).collect();
        want.sort_unstable();
        assert_eq!(seen, want);
        let st = lock(&writer.state);
        assert!(!st.writing && st.waiting == 0 && st.queue.is_empty());
    }

    #[test]
    fn pool_reuses_and_bounds() {
        let p = BufPool::new();
        let mut v = p.get(4096);
        assert_eq!(v.len(), 4096);
        v[0] = 1;
        let ptr = v.as_ptr();
        p.put(v);
        let v = p.get(100);
        assert_eq!(v.len(), 100);
        assert_eq!(v.as_ptr(), ptr);
        p.put(v);
        let v = p.get(8192);
        assert_eq!(v.len(), 8192);
        p.put(vec![0u8; POOL_MAX_BUF + 1]);
        assert_eq!(lock(&p.inner).bufs.len(), 0);
        p.put(v);
        assert_eq!(lock(&p.inner).bufs.len(), 1);
    }
}
