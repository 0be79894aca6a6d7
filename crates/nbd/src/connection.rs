//! Transmission phase of one connection.
//!
//! The connection thread reads and validates requests (including WRITE
//! payloads: small ones through a 256 KiB read buffer, large ones straight
//! from the stream into their own buffer). Each valid request is either
//! run right there ("inline": no hand-off, WRITE data taken straight from
//! the read buffer) or pushed into a bounded queue served by up to
//! `workers_per_conn` worker threads spawned on demand; [`CostModel`]
//! picks inline for request classes the export answers quickly and the
//! workers for slow ones. Flushes go to a flusher thread of their own,
//! which answers all the flushes queued meanwhile with one export flush, so
//! a slow commit never occupies the workers. Replies go through the shared
//! combining [`ReplyWriter`]: inline replies are batched and written before
//! the thread next blocks on the socket. Invalid requests are answered by
//! the reading thread. Replies may be sent out of order.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::ExportError;
use crate::export::Export;
use crate::meta::MetaContext;
use crate::protocol::*;
use crate::read;
use crate::request::*;
use crate::session::{Negotiated, ServerConfig};
use crate::status::*;
use crate::transport::Transport;
use crate::util::{lock, wait};
use crate::writer::{BufPool, Reply, ReplyWriter};

/// Payload bytes in flight per connection before the reader waits (one
/// request may always be in flight, whatever its size).
const MAX_IN_FLIGHT_BYTES: u64 = 256 << 20;
/// Largest oversized WRITE payload read and discarded to keep the stream in
/// sync; beyond this the client is disconnected.
const MAX_DISCARD_BYTES: u64 = 64 << 20;

/// Reply to NBD_CMD_BLOCK_STATUS: one chunk per negotiated context, in the
/// order they were selected, only the last one flagged DONE. Any failure
/// turns the whole reply into one error chunk (nothing is sent before the
/// reply is complete).
fn block_status_reply(sh: &Shared, t: Tag, offset: u64, length: u64, req_one: bool) -> Reply {
    let contexts = &sh.contexts;
    let max_descriptors = MAX_DESCRIPTORS / contexts.len().max(1);
    let q = StatusQuery { offset, length, size: sh.params.size, req_one, max_descriptors };
    let framing = sh.framing(t);
    let mut out = Vec::new();
    for (i, c) in contexts.iter().enumerate() {
        match context_descriptors(&*sh.export, c, &q) {
            Ok(d) => framing.push_block_status(&mut out, c.id, &d, i + 1 == contexts.len()),
            Err(err) => {
                log::debug!("nbd: block status of {:?} at {offset} length {length} failed: {err}", c.name);
                return sh.error_reply(t, err.errno(), "block status failed");
            }
        }
    }
    if out.is_empty() {
        // Unreachable: validate_request refuses block status without contexts.
        return sh.error_reply(t, NBD_EINVAL, "no metadata context was negotiated");
    }
    Reply::encoded(out)
}

/// What every reply to a request carries: the client's handle (cookie)
/// and, in extended reply headers, the request's offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tag {
    pub handle: u64,
    pub offset: u64,
}

impl Tag {
    fn of(h: &ExtendedRequestHeader) -> Tag {
        Tag { handle: h.handle, offset: h.offset }
    }
}

/// A validated request with its payload.
struct Job {
    tag: Tag,
    req: Request,
    data: Vec<u8>,
}

impl Job {
    fn cost(&self) -> u64 {
        match self.req {
            Request::Read { length, .. } | Request::Write { length, .. } => length as u64,
            _ => 0,
        }
    }
}

struct QueueState {
    jobs: VecDeque<Job>,
    /// FLUSH requests waiting for the connection's flusher thread.
    flushes: Vec<Job>,
    /// The flusher thread has been started.
    flusher: bool,
    closed: bool,
    idle: usize,
    in_flight: usize,
    in_flight_bytes: u64,
    reader_waiting: bool,
}

/// State shared by the reader and the workers of one connection.
struct Shared {
    export: Arc<dyn Export>,
    params: TransmissionParams,
    /// Negotiated metadata contexts, in selection order.
    contexts: Vec<MetaContext>,
    writer: ReplyWriter,
    pool: BufPool,
    costs: CostModel,
    queue: Mutex<QueueState>,
    work_cv: Condvar,
    space_cv: Condvar,
    flush_cv: Condvar,
}

impl Shared {
    /// How chunks of the reply to `t` are framed.
    fn framing(&self, t: Tag) -> ChunkFraming {
        ChunkFraming { extended: self.params.extended, handle: t.handle, request_offset: t.offset }
    }

    fn error_reply(&self, t: Tag, errno: u32, msg: &str) -> Reply {
        if self.params.structured {
            let mut out = Vec::with_capacity(64);
            self.framing(t).push_error(&mut out, errno, msg);
            Reply::encoded(out)
        } else {
            Reply::simple(t.handle, errno)
        }
    }

    /// Success without data: a simple reply, or with extended headers
    /// (which forbid simple replies) a final NBD_REPLY_TYPE_NONE chunk.
    fn ok_reply(&self, t: Tag) -> Reply {
        if self.params.extended {
            let mut out = Vec::with_capacity(EXTENDED_HEADER_LEN);
            self.framing(t).push_none(&mut out);
            Reply::encoded(out)
        } else {
            Reply::simple(t.handle, 0)
        }
    }

    fn send(&self, reply: Reply) {
        self.writer.send(reply, &self.pool);
    }

    /// `jobs` requests of `bytes` payload answered: their room in the
    /// queue is free again, and a reader waiting for room is woken.
    fn finished(&self, q: &mut QueueState, jobs: usize, bytes: u64) {
        q.in_flight -= jobs;
        q.in_flight_bytes -= bytes;
        if q.reader_waiting {
            q.reader_waiting = false;
            self.space_cv.notify_one();
        }
    }
}

/// How the transmission phase ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// NBD_CMD_DISC.
    Disconnect,
    /// The client closed the connection (or a read failed).
    Eof,
    /// The server is shutting down.
    Shutdown,
    /// Protocol violation: hard disconnect.
    Violation,
    /// The reply stream failed.
    WriteError,
}

/// Serve the transmission phase until the client disconnects, the stream
/// breaks, or `shutting_down` is set. Returns once every in-flight request
/// has been answered and the socket is shut down.
pub(crate) fn serve<R: Read>(
    neg: Negotiated,
    mut reader: BufReader<R>,
    transport: Transport,
    config: &ServerConfig,
    shutting_down: &AtomicBool,
) -> End {
    let params = TransmissionParams {
        size: neg.size,
        read_only: neg.export.read_only(),
        structured: neg.structured,
        extended: neg.extended,
        has_meta_context: !neg.meta_contexts.is_empty(),
        min_block: neg.min_block,
        max_payload: neg.max_payload,
    };
    let shared = Arc::new(Shared {
        export: neg.export,
        params,
        contexts: neg.meta_contexts,
        writer: ReplyWriter::new(transport),
        pool: BufPool::new(),
        costs: CostModel::new(),
        queue: Mutex::new(QueueState {
            jobs: VecDeque::new(),
            flushes: Vec::new(),
            flusher: false,
            closed: false,
            idle: 0,
            in_flight: 0,
            in_flight_bytes: 0,
            reader_waiting: false,
        }),
        work_cv: Condvar::new(),
        space_cv: Condvar::new(),
        flush_cv: Condvar::new(),
    });
    serve_inner(&shared, &mut reader, config, shutting_down)
}

fn serve_inner<R: Read>(
    shared: &Arc<Shared>,
    reader: &mut BufReader<R>,
    config: &ServerConfig,
    shutting_down: &AtomicBool,
) -> End {
    let max_workers = config.workers_per_conn;
    let max_in_flight = config.max_in_flight_per_conn.max(1);
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let end = read_loop(shared, reader, max_in_flight, max_workers, &mut workers, shutting_down);

    // Let the workers drain the queue, then close.
    lock(&shared.queue).closed = true;
    shared.work_cv.notify_all();
    shared.flush_cv.notify_all();
    for w in workers {
        let _ = w.join();
    }
    shared.writer.flush(&shared.pool);
    shared.writer.shutdown();
    end
}

fn read_loop<R: Read>(
    shared: &Arc<Shared>,
    reader: &mut BufReader<R>,
    max_in_flight: usize,
    max_workers: usize,
    workers: &mut Vec<JoinHandle<()>>,
    shutting_down: &AtomicBool,
) -> End {
    // The last request was a large WRITE whose payload came straight from
    // the stream: read the next header alone too (large sequential writes
    // then cost two reads and no copy through the read buffer each).
    let mut after_direct = false;
    loop {
        let limits = (max_in_flight, max_workers);
        if let Err(end) = serve_request(shared, reader, limits, workers, shutting_down, &mut after_direct) {
            return end;
        }
    }
}

/// Read one request and answer it: refused, run on this thread, or queued
/// for the workers. `Err` ends the connection, saying how.
fn serve_request<R: Read>(
    shared: &Arc<Shared>,
    reader: &mut BufReader<R>,
    (max_in_flight, max_workers): (usize, usize),
    workers: &mut Vec<JoinHandle<()>>,
    shutting_down: &AtomicBool,
    after_direct: &mut bool,
) -> Result<(), End> {
    check_running(shared, reader, shutting_down)?;
    let h = read_header(shared, reader, shutting_down, std::mem::take(after_direct))?;
    let validated = validate_request(&h, &shared.params);
    // The payload follows whether or not the request is valid.
    let payload = payload_len(&h, shared.params.extended);
    if shared.params.extended && payload > shared.params.max_payload as u64 {
        // proto.md, "Request message": "A server SHOULD initiate hard
        // disconnect if a client sets the NBD_CMD_FLAG_PAYLOAD_LEN flag
        // and uses a length larger than a server's advertised or default
        // maximum payload length".
        log::warn!("nbd: {payload}-byte request payload beyond the maximum; disconnecting");
        return Err(End::Violation);
    }
    if payload > reader.buffer().len() as u64 {
        // About to block on the payload: send the replies produced so far.
        shared.writer.flush(&shared.pool);
    }
    let req = match validated {
        Ok(Request::Disc) => {
            log::debug!("nbd: client sent NBD_CMD_DISC");
            return Err(End::Disconnect);
        }
        Ok(r) => r,
        Err(rej) => return reject_request(shared, reader, &h, rej, payload),
    };
    let inline = max_workers == 0 || shared.costs.run_inline(&req);
    if inline && write_from_buffer(shared, reader, Tag::of(&h), req) {
        return Ok(());
    }
    let job = Job { tag: Tag::of(&h), req, data: read_payload(shared, reader, req, after_direct)? };
    if req == Request::Flush {
        if enqueue_flush(shared, job, max_in_flight) {
            spawn_flusher(shared, workers)?;
        }
        return Ok(());
    }
    if inline {
        let reply = run_job(shared, job);
        shared.writer.defer(reply, &shared.pool);
        return Ok(());
    }
    if enqueue(shared, job, max_in_flight, workers.len() < max_workers) {
        spawn_worker(shared, workers)?;
    }
    Ok(())
}

/// `Err` when the connection must end before the next request: the server
/// is shutting down (requests already received in full are still served,
/// see [`complete_request_buffered`]), or replies can no longer be written.
fn check_running<R: Read>(shared: &Shared, reader: &mut BufReader<R>, shutting_down: &AtomicBool) -> Result<(), End> {
    if shutting_down.load(Ordering::Relaxed) && !complete_request_buffered(shared, reader) {
        return Err(End::Shutdown);
    }
    if shared.writer.is_broken() {
        return Err(End::WriteError);
    }
    Ok(())
}

/// The next request header; `Err` at the end of the stream or on a header
/// that is not a (negotiated) request.
fn read_header<R: Read>(
    shared: &Shared,
    reader: &mut BufReader<R>,
    shutting_down: &AtomicBool,
    after_direct: bool,
) -> Result<ExtendedRequestHeader, End> {
    let extended = shared.params.extended;
    let len = header_len(extended);
    // About to block on the socket: send the replies produced so far.
    if reader.buffer().len() < len {
        shared.writer.flush(&shared.pool);
    }
    let mut buf = [0u8; EXTENDED_REQUEST_HEADER_LEN];
    let hb = &mut buf[..len];
    let got = if after_direct && reader.buffer().is_empty() {
        reader.get_mut().read_exact(hb)
    } else {
        reader.read_exact(hb)
    };
    if let Err(e) = got {
        if shutting_down.load(Ordering::Relaxed) {
            return Err(End::Shutdown);
        }
        if e.kind() != io::ErrorKind::UnexpectedEof {
            log::debug!("nbd: read error: {e}");
        }
        return Err(End::Eof);
    }
    parse_header(hb, extended).map_err(|e| {
        let magic = u32::from_be_bytes([hb[0], hb[1], hb[2], hb[3]]);
        if magic == EXTENDED_REQUEST_MAGIC {
            log::warn!("nbd: extended request header without negotiation; disconnecting");
        } else if magic == REQUEST_MAGIC {
            log::warn!("nbd: compact request header after negotiating extended headers; disconnecting");
        } else {
            log::warn!("nbd: {e}; disconnecting");
        }
        End::Violation
    })
}

/// Answer a refused request with its error. A request's `payload` is read and
/// dropped first so that the next header is found; `Err` if it is too big
/// to drop or the stream ends within it.
fn reject_request<R: Read>(
    shared: &Shared,
    reader: &mut BufReader<R>,
    h: &ExtendedRequestHeader,
    rej: Rejection,
    payload: u64,
) -> Result<(), End> {
    log::info!(
        "nbd: rejecting command {} flags {:#x} offset {} length {}: {} (errno {})",
        h.command,
        h.flags,
        h.offset,
        h.length,
        rej.msg,
        rej.errno
    );
    if payload > 0 {
        if payload > MAX_DISCARD_BYTES.max(shared.params.max_payload as u64) {
            log::warn!("nbd: refusing to discard a {payload}-byte write payload; disconnecting");
            return Err(End::Violation);
        }
        match io::copy(&mut reader.by_ref().take(payload), &mut io::sink()) {
            Ok(n) if n == payload => {}
            _ => return Err(End::Eof),
        }
    }
    shared.writer.defer(shared.error_reply(Tag::of(h), rej.errno, rej.msg), &shared.pool);
    Ok(())
}

/// Zero copy: run a WRITE straight from the read buffer when its whole
/// payload is there already. False (nothing consumed) otherwise.
fn write_from_buffer<R: Read>(shared: &Shared, reader: &mut BufReader<R>, tag: Tag, req: Request) -> bool {
    let Request::Write { length, .. } = req else { return false };
    let len = length as usize;
    if reader.buffer().len() < len {
        return false;
    }
    let reply = run(shared, tag, req, &reader.buffer()[..len]);
    reader.consume(len);
    shared.writer.defer(reply, &shared.pool);
    true
}

/// A WRITE's payload in a pooled buffer; empty for the other requests.
fn read_payload<R: Read>(
    shared: &Shared,
    reader: &mut BufReader<R>,
    req: Request,
    direct: &mut bool,
) -> Result<Vec<u8>, End> {
    let Request::Write { length, .. } = req else { return Ok(Vec::new()) };
    let mut buf = shared.pool.get(length as usize);
    *direct = read_payload_into(reader, &mut buf).map_err(|_| End::Eof)?;
    Ok(buf)
}

/// Payloads at least this large are read from the stream straight into
/// their buffer, past the read buffer.
const DIRECT_PAYLOAD: usize = 64 * 1024;

/// Read a WRITE payload into `buf`. A large one takes what the read buffer
/// already holds, then the rest straight from the stream into `buf`: its
/// bytes are copied once (socket to `buf`), and its tail never drags the
/// next request's header and payload through the read buffer. A small one
/// goes through the read buffer, which batches the requests behind it.
/// Returns whether the payload was read straight from the stream.
fn read_payload_into<R: Read>(reader: &mut BufReader<R>, buf: &mut [u8]) -> io::Result<bool> {
    let have = reader.buffer().len().min(buf.len());
    if buf.len() - have < DIRECT_PAYLOAD {
        return reader.read_exact(buf).map(|()| false);
    }
    buf[..have].copy_from_slice(&reader.buffer()[..have]);
    reader.consume(have);
    reader.get_mut().read_exact(&mut buf[have..]).map(|()| true)
}

/// Queue a job for the workers, first waiting while the connection is at
/// its in-flight limit (after sending the replies produced so far, which
/// the workers may be waiting on). True if a worker should be spawned:
/// more jobs than idle workers, and `can_spawn`.
fn enqueue(shared: &Shared, job: Job, max_in_flight: usize, can_spawn: bool) -> bool {
    let mut q = wait_for_room(shared, job.cost(), max_in_flight);
    q.in_flight += 1;
    q.in_flight_bytes += job.cost();
    q.jobs.push_back(job);
    let notify = q.idle > 0;
    let spawn = q.jobs.len() > q.idle && can_spawn;
    drop(q);
    if notify {
        shared.work_cv.notify_one();
    }
    spawn
}

/// The queue, once it has room for a request of `cost` payload bytes (the
/// replies produced so far are sent before the reader waits).
fn wait_for_room(shared: &Shared, cost: u64, max_in_flight: usize) -> MutexGuard<'_, QueueState> {
    let full = |q: &QueueState| {
        q.in_flight >= max_in_flight || (q.in_flight > 0 && q.in_flight_bytes + cost > MAX_IN_FLIGHT_BYTES)
    };
    let mut q = lock(&shared.queue);
    if full(&q) {
        drop(q);
        shared.writer.flush(&shared.pool);
        q = lock(&shared.queue);
        while full(&q) {
            q.reader_waiting = true;
            q = wait(&shared.space_cv, q);
        }
    }
    q
}

/// Queue a FLUSH for the connection's flusher; true if the flusher must be
/// started. Flushes have a lane of their own: a slow commit then holds up
/// one thread, never the workers that answer the writes behind it.
fn enqueue_flush(shared: &Shared, job: Job, max_in_flight: usize) -> bool {
    let mut q = wait_for_room(shared, 0, max_in_flight);
    q.in_flight += 1;
    q.flushes.push(job);
    let spawn = !std::mem::replace(&mut q.flusher, true);
    drop(q);
    shared.flush_cv.notify_one();
    spawn
}

/// Start the flusher (joined with the workers). `Err` if it cannot start:
/// nobody would ever answer the queued flushes.
fn spawn_flusher(shared: &Arc<Shared>, workers: &mut Vec<JoinHandle<()>>) -> Result<(), End> {
    let s = Arc::clone(shared);
    match std::thread::Builder::new().name("nbd-flusher".into()).spawn(move || flusher(s)) {
        Ok(h) => {
            workers.push(h);
            Ok(())
        }
        Err(e) => {
            log::error!("nbd: cannot spawn flusher thread: {e}");
            Err(End::Violation)
        }
    }
}

/// Answer flushes in batches: every flush queued when a batch starts is
/// answered by one export flush, which covers every write completed before
/// any of them was received (a group commit per connection).
fn flusher(sh: Arc<Shared>) {
    let mut done = 0;
    loop {
        let batch = {
            let mut q = lock(&sh.queue);
            if done > 0 {
                sh.finished(&mut q, done, 0);
            }
            loop {
                if !q.flushes.is_empty() {
                    break std::mem::take(&mut q.flushes);
                }
                if q.closed {
                    return;
                }
                q = wait(&sh.flush_cv, q);
            }
        };
        done = batch.len();
        if sh.writer.is_broken() {
            continue;
        }
        let result = catch_unwind(AssertUnwindSafe(|| sh.export.flush())).unwrap_or_else(|_| {
            log::error!("nbd: export panicked while flushing");
            Err(ExportError::Io)
        });
        for job in batch {
            sh.send(match &result {
                Ok(()) => sh.ok_reply(job.tag),
                Err(err) => sh.error_reply(job.tag, err.errno(), "flush failed"),
            });
        }
    }
}

/// One more worker for the connection. `Err` if none can be started and
/// there is no other: nobody would ever answer the queued requests.
fn spawn_worker(shared: &Arc<Shared>, workers: &mut Vec<JoinHandle<()>>) -> Result<(), End> {
    let s = Arc::clone(shared);
    match std::thread::Builder::new().name("nbd-worker".into()).spawn(move || worker(s)) {
        Ok(h) => workers.push(h),
        Err(e) => {
            log::error!("nbd: cannot spawn worker thread: {e}");
            if workers.is_empty() {
                return Err(End::Violation);
            }
        }
    }
    Ok(())
}

/// On shutdown: whether the read buffer holds a whole request (header and
/// payload), which is then served as usual rather than refused: a client
/// that reconnects (qemu `reconnect-delay`) resends requests left
/// unanswered, but takes an error reply (`NBD_ESHUTDOWN`) as the request's
/// failure. Bounded: every request served consumes the buffer, and the
/// socket is no longer read (its read side is shut down).
fn complete_request_buffered<R: Read>(shared: &Shared, reader: &BufReader<R>) -> bool {
    let extended = shared.params.extended;
    let buf = reader.buffer();
    let Ok(h) = parse_header(buf, extended) else { return false };
    let payload = payload_len(&h, extended);
    ((buf.len() - header_len(extended)) as u64) >= payload
}

/// Adaptive choice between running a request on the reading thread and
/// handing it to a worker.
///
/// Handing a request over costs a thread wake-up and context switches,
/// which dominate when the export answers in a few microseconds (page
/// cache, memory); running it inline then is both cheaper and, on few
/// cores, faster. A slow request run inline, however, stops the connection
/// from reading further requests, so classes of requests whose recent
/// average duration exceeds [`INLINE_MAX_NS`] go to the workers (who keep
/// measuring, so a class returns inline when it gets fast again). Flushes
/// always go to the flusher.
pub(crate) struct CostModel {
    /// Moving average of export call durations (ns) per class.
    avg_ns: [AtomicU64; 3],
}

/// Requests of a class averaging longer than this run on workers.
pub(crate) const INLINE_MAX_NS: u64 = 20_000;

impl CostModel {
    pub(crate) fn new() -> CostModel {
        CostModel { avg_ns: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)] }
    }

    fn class(req: &Request) -> Option<usize> {
        match req {
            Request::Read { .. } => Some(0),
            Request::Write { .. } => Some(1),
            Request::Flush | Request::Disc => None,
            _ => Some(2),
        }
    }

    pub(crate) fn run_inline(&self, req: &Request) -> bool {
        Self::class(req).is_some_and(|c| self.avg_ns[c].load(Ordering::Relaxed) <= INLINE_MAX_NS)
    }

    /// Record one duration (exponential moving average, weight 1/8; the
    /// benign races between threads only lose samples).
    pub(crate) fn record(&self, req: &Request, ns: u64) {
        if let Some(c) = Self::class(req) {
            let a = &self.avg_ns[c];
            let old = a.load(Ordering::Relaxed);
            let new = old - old / 8 + ns.min(1 << 40) / 8;
            a.store(new, Ordering::Relaxed);
            if (old <= INLINE_MAX_NS) != (new <= INLINE_MAX_NS) {
                const NAMES: [&str; 3] = ["reads", "writes", "other requests"];
                let mode = if new <= INLINE_MAX_NS { "inline" } else { "on workers" };
                log::debug!("nbd: {} now run {mode} (average {} us)", NAMES[c], new / 1000);
            }
        }
    }
}

/// Run a job (catching export panics) and record its duration.
fn run_job(sh: &Shared, job: Job) -> Reply {
    let Job { tag, req, data } = job;
    run(sh, tag, req, &data).with_spare(data)
}

/// Execute a request against the export, catching panics and recording
/// the duration; `data` is the WRITE payload.
fn run(sh: &Shared, tag: Tag, req: Request, data: &[u8]) -> Reply {
    let start = Instant::now();
    let reply = match catch_unwind(AssertUnwindSafe(|| execute(sh, tag, req, data))) {
        Ok(r) => r,
        Err(_) => {
            log::error!("nbd: export panicked while handling a request");
            sh.error_reply(tag, NBD_EIO, "internal error")
        }
    };
    sh.costs.record(&req, start.elapsed().as_nanos() as u64);
    reply
}

fn worker(sh: Arc<Shared>) {
    let mut done: Option<u64> = None;
    loop {
        let job = {
            let mut q = lock(&sh.queue);
            if let Some(cost) = done.take() {
                sh.finished(&mut q, 1, cost);
            }
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if q.closed {
                    return;
                }
                q.idle += 1;
                q = wait(&sh.work_cv, q);
                q.idle -= 1;
            }
        };
        let cost = job.cost();
        if sh.writer.is_broken() {
            // Nobody will see the reply: skip the work.
            sh.pool.put(job.data);
            done = Some(cost);
            continue;
        }
        let reply = run_job(&sh, job);
        sh.send(reply);
        done = Some(cost);
    }
}

/// Reply to a validated read (see [`crate::read`]).
fn read_reply(sh: &Shared, t: Tag, offset: u64, length: u32, df: bool) -> Reply {
    let style = if sh.params.structured {
        read::Style::Chunks(sh.framing(t))
    } else {
        read::Style::Simple { handle: t.handle }
    };
    read::reply(&*sh.export, &sh.pool, style, offset, length, df).unwrap_or_else(|(err, buf)| {
        log::debug!("nbd: read at {offset} length {length} failed: {err}");
        sh.error_reply(t, err.errno(), "read failed").with_spare(buf)
    })
}

fn execute(sh: &Shared, t: Tag, req: Request, data: &[u8]) -> Reply {
    let e = &*sh.export;
    let res = match req {
        Request::Read { offset, length, df } => return read_reply(sh, t, offset, length, df),
        Request::Write { offset, .. } if data.is_empty() => {
            // Cannot happen (zero-length writes are rejected); no panic.
            log::error!("nbd: write at {offset} without payload");
            return sh.error_reply(t, NBD_EIO, "internal error");
        }
        Request::Write { offset, fua, .. } => e.write(offset, data, fua),
        Request::Flush => e.flush(),
        Request::Trim { offset, length, fua } => e.trim(offset, length, fua),
        Request::Cache { offset, length } => e.cache(offset, length),
        Request::WriteZeroes { offset, length, no_hole, fast, fua } => {
            e.write_zeroes(offset, length, no_hole, fast, fua)
        }
        Request::BlockStatus { offset, length, req_one } => return block_status_reply(sh, t, offset, length, req_one),
        Request::Disc => Ok(()),
    };
    match res {
        Ok(()) => sh.ok_reply(t),
        Err(err) => {
            log::debug!("nbd: request failed: {err}");
            sh.error_reply(t, err.errno(), "request failed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_read_whole_and_in_order() {
        // Payloads below and above DIRECT_PAYLOAD, each followed by a
        // marker, through a read buffer that holds part of each.
        let sizes = [100usize, DIRECT_PAYLOAD - 1, DIRECT_PAYLOAD, 3 * DIRECT_PAYLOAD + 7, 1 << 20];
        let mut stream = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            stream.extend((0..n).map(|j| (j * 7 + i) as u8));
            stream.extend_from_slice(b"MARK");
        }
        for cap in [16usize, 4096, crate::session::READ_BUF] {
            let mut r = BufReader::with_capacity(cap, io::Cursor::new(stream.clone()));
            for (i, &n) in sizes.iter().enumerate() {
                let mut buf = vec![0u8; n];
                let direct = read_payload_into(&mut r, &mut buf).unwrap();
                assert!(!direct || n >= DIRECT_PAYLOAD, "small payloads go through the read buffer");
                if n >= DIRECT_PAYLOAD + cap {
                    assert!(direct, "payload {i} cap {cap}: the read buffer holds less than cap");
                }
                assert!(buf.iter().enumerate().all(|(j, &b)| b == (j * 7 + i) as u8), "payload {i} cap {cap}");
                let mut m = [0u8; 4];
                r.read_exact(&mut m).unwrap();
                assert_eq!(&m, b"MARK");
            }
            let mut b = [0u8; 1];
            assert!(read_payload_into(&mut r, &mut b).is_err(), "end of stream");
        }
    }

    #[test]
    fn cost_model_adapts() {
        let m = CostModel::new();
        let w = Request::Write { offset: 0, length: 1, fua: false };
        let r = Request::Read { offset: 0, length: 1, df: false };
        assert!(m.run_inline(&w) && m.run_inline(&r));
        assert!(!m.run_inline(&Request::Flush));
        m.record(&w, 10_000_000);
        assert!(!m.run_inline(&w));
        assert!(m.run_inline(&r), "classes are independent");
        for _ in 0..100 {
            m.record(&w, 1_000);
        }
        assert!(m.run_inline(&w), "fast again: back inline");
    }
}
