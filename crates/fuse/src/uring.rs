//! FUSE over io_uring (Linux 6.14+, fs/fuse/dev_uring.c): one queue per
//! possible CPU, each served by a thread pinned to that CPU. The kernel
//! puts a request on the queue of the CPU its caller runs on, so the
//! caller, the kernel and this server meet on one CPU (a cross-CPU
//! wake-up is what a round trip cost on a VM whose idle CPUs halt), and
//! answering a request and fetching the next is one io_uring_enter.
//!
//! Each ring entry is a header buffer (`fuse_uring_req_header`) and a
//! payload buffer registered with the kernel (FUSE_IO_URING_CMD_REGISTER);
//! a completion means a request sits in them, and its reply goes back in
//! the same buffers with COMMIT_AND_FETCH, which also makes the entry
//! wait for the next request.
//!
//! A reply that waits for a commit (fsync, a volume snapshot) is made by
//! the commit thread (`deferred.rs`) while this queue serves its other
//! entries; the commit thread leaves it in the queue's mailbox and wakes
//! the queue through the mailbox's eventfd, which the queue polls.

use crate::abi::{ring, OUT_HEADER};
use crate::decode;
use crate::deferred::Deferrer;
use crate::dispatch::{serve, Shared};
use crate::reply::{self, Reply};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

/// Ring entries per queue (libfuse's default too): requests one CPU's
/// callers may have in flight at once before they wait for an entry.
const ENTRIES: usize = 8;
/// The user_data of the stop poll (entries use their index).
const STOP: u64 = u64::MAX;
/// The user_data of the mailbox poll.
const WAKE: u64 = u64::MAX - 1;

/// The error of `--fuse-uring on` on a kernel without the transport.
pub fn unavailable() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "the kernel does not offer FUSE over io_uring (Linux 6.14+, and `echo Y > \
         /sys/module/fuse/parameters/enable_uring` as root)",
    )
}

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Whether the fuse module lets a server use io_uring now.
pub fn enabled() -> bool {
    std::fs::read_to_string(ENABLE_URING).is_ok_and(|v| v.trim() == "Y")
}

/// Whether the fuse module has io_uring but does not let servers use it
/// (its default): worth a hint to the user.
pub fn switched_off() -> bool {
    std::fs::read_to_string(ENABLE_URING).is_ok_and(|v| v.trim() == "N")
}

/// What every queue is started with.
#[derive(Clone)]
pub(crate) struct QueueConfig {
    /// The session's /dev/fuse descriptor (the rings' commands name it).
    pub dev: Arc<OwnedFd>,
    pub fs: Shared,
    /// Bytes of each entry's payload buffer.
    pub payload: usize,
    /// Told when a queue fails (the session's `report`).
    pub report: fn(&str),
    /// Where replies that wait for a commit go (`deferred.rs`).
    pub deferrer: Deferrer,
}

/// The running queues.
pub(crate) struct Rings {
    /// An eventfd every queue polls: written to end them.
    stop: OwnedFd,
    threads: Vec<JoinHandle<()>>,
    /// Requests answered through the ring.
    pub served: Arc<AtomicU64>,
}

impl Rings {
    /// One queue per possible CPU (the kernel uses the ring only once
    /// every queue has an entry registered); `payload` bytes per entry.
    pub fn start(cfg: QueueConfig) -> io::Result<Rings> {
        // SAFETY: plain syscalls on values this function owns.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
        // SAFETY: as above.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `efd` was just opened and is owned here only.
        let stop = unsafe { OwnedFd::from_raw_fd(efd) };
        let served = Arc::new(AtomicU64::new(0));
        let mut rings = Rings { stop, threads: Vec::new(), served };
        for qid in 0..cpus {
            let (ready, started) = mpsc::channel();
            let q = QueueArgs { qid, cfg: cfg.clone(), stop: efd, served: rings.served.clone() };
            let t = std::thread::Builder::new().name(format!("fuse-ring-{qid}")).spawn(move || q.run(ready))?;
            rings.threads.push(t);
            started.recv().unwrap_or_else(|_| Err(io::Error::other("ring queue thread ended")))?;
        }
        Ok(rings)
    }

    pub fn queues(&self) -> usize {
        self.threads.len()
    }

    /// Ends every queue (the session is over: the kernel has ended the
    /// entries it held, or does so as each ring closes); returns how many
    /// requests they served.
    pub fn stop(mut self) -> u64 {
        self.end_threads();
        self.served.load(Ordering::Relaxed)
    }

    fn end_threads(&mut self) {
        if !self.threads.is_empty() {
            self.wake_all();
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
        }
    }

    fn wake_all(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write from a live buffer to our eventfd.
        if unsafe { libc::write(self.stop.as_raw_fd(), one.as_ptr().cast(), 8) } != 8 {
            log::error!("waking the ring queues: {}", io::Error::last_os_error());
        }
    }
}

impl Drop for Rings {
    /// A session that ends in an error still ends its queues.
    fn drop(&mut self) {
        self.end_threads();
    }
}

/// What a queue thread is started with.
struct QueueArgs {
    qid: usize,
    cfg: QueueConfig,
    stop: RawFd,
    served: Arc<AtomicU64>,
}

/// The buffers of one ring entry. The kernel writes into them between a
/// REGISTER or COMMIT_AND_FETCH and its completion; this thread reads
/// and writes them only after the completion.
struct Entry {
    header: Box<[u8; ring::HEADER_SIZE]>,
    /// The payload buffer is `buf[start..start + len]`, on a 4 KiB
    /// boundary: a WRITE's data sits at its start, so the pool file's
    /// O_DIRECT write takes it as it is instead of through a bounce copy
    /// (`FileDevice::write_at`).
    buf: Vec<u8>,
    start: usize,
    len: usize,
    /// Where the header and payload are (read by the kernel at REGISTER).
    iov: Box<[libc::iovec; 2]>,
}

/// The alignment of a payload buffer (O_DIRECT's).
const PAYLOAD_ALIGN: usize = 4096;

impl Entry {
    fn new(len: usize) -> Entry {
        let mut header = Box::new([0u8; ring::HEADER_SIZE]);
        let mut buf = vec![0u8; len + PAYLOAD_ALIGN];
        let start = (PAYLOAD_ALIGN - buf.as_ptr() as usize % PAYLOAD_ALIGN) % PAYLOAD_ALIGN;
        let payload = &mut buf[start..start + len];
        let iov = Box::new([
            libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: ring::HEADER_SIZE },
            libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: len },
        ]);
        Entry { header, buf, start, len, iov }
    }

    fn payload(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }

    fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }

    fn u64_at(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.header[at..at + 8]);
        u64::from_le_bytes(b)
    }
}

struct Queue {
    /// Declared first: dropped (closed) before the buffers it points to.
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    qid: u16,
    dev: Arc<OwnedFd>,
    fs: Shared,
    ents: Vec<Entry>,
    served: Arc<AtomicU64>,
    deferrer: Deferrer,
    mailbox: Arc<Mailbox>,
}

/// Replies the commit thread made for this queue's entries (entry,
/// request id, reply), and the eventfd it writes to wake the queue. An
/// entry whose reply is deferred is not touched by the queue (nor by the
/// kernel, which waits for its COMMIT_AND_FETCH) until it comes back here.
struct Mailbox {
    done: Mutex<Vec<(usize, u64, Reply)>>,
    wake: OwnedFd,
}

impl Mailbox {
    fn new() -> io::Result<Mailbox> {
        // SAFETY: a plain syscall; the descriptor is owned below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `efd` was just opened and is owned here only.
        Ok(Mailbox { done: Mutex::new(Vec::new()), wake: unsafe { OwnedFd::from_raw_fd(efd) } })
    }

    /// On the commit thread: leave the reply, then wake the queue.
    fn post(&self, ent: usize, unique: u64, reply: Reply) {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).push((ent, unique, reply));
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write from a live buffer to our eventfd.
        if unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) } != 8 {
            log::error!("waking a fuse ring queue: {}", io::Error::last_os_error());
        }
    }

    /// On the queue's thread, woken: the replies left so far. The count
    /// is read first, so a reply posted after the take wakes it again.
    fn take(&self) -> Vec<(usize, u64, Reply)> {
        let mut count = [0u8; 8];
        // SAFETY: an 8-byte read into a live buffer; EAGAIN when zero.
        unsafe { libc::read(self.wake.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        std::mem::take(&mut *self.done.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl QueueArgs {
    /// The thread of queue `qid`: pinned to its CPU, registers its
    /// entries, says so on `ready`, then serves until stopped.
    fn run(self, ready: mpsc::Sender<io::Result<()>>) {
        pin_to_cpu(self.qid);
        let (qid, stop, report) = (self.qid, self.stop, self.cfg.report);
        let mut q = match Queue::new(self).and_then(|mut q| q.register(stop).map(|_| q)) {
            Ok(q) => q,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        if let Err(e) = q.serve() {
            // Requests of this CPU now wait for an entry that will not
            // come: say so where the mount's user sees it.
            report(&format!("fuse ring queue {qid} failed: {e}"));
        }
    }
}

/// Runs this thread on `cpu` only (a possible CPU not online refuses:
/// its queue is still registered, the kernel wants every one).
fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: the set outlives the call; 0 is this thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) } != 0 {
        log::warn!("fuse ring queue {cpu}: pinning to its CPU: {}", io::Error::last_os_error());
    }
}

/// Sets an SQE's `len` field (bytes 24..28), which UringCmd80 leaves 0:
/// REGISTER reads its iovec count there.
fn with_len(e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: Entry128 is a repr(C) 128-byte SQE of plain integers; any
    // bytes are a valid value of it.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[24..28].copy_from_slice(&len.to_le_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

impl Queue {
    fn new(a: QueueArgs) -> io::Result<Queue> {
        let ring = IoUring::builder().setup_cqsize(4 * ENTRIES as u32).build(2 * ENTRIES as u32)?;
        let ents = (0..ENTRIES).map(|_| Entry::new(a.cfg.payload)).collect();
        let mailbox = Arc::new(Mailbox::new()?);
        let (dev, fs, deferrer) = (a.cfg.dev, a.cfg.fs, a.cfg.deferrer);
        Ok(Queue { ring, qid: a.qid as u16, dev, fs, ents, served: a.served, deferrer, mailbox })
    }

    /// A FUSE ring command for entry `ent` (`commit_id`: the request it answers).
    fn command(&self, cmd_op: u32, ent: usize, commit_id: u64) -> squeue::Entry128 {
        // struct fuse_uring_cmd_req: flags u64, commit_id u64, qid u16.
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_le_bytes());
        cmd[16..18].copy_from_slice(&self.qid.to_le_bytes());
        let iov = self.ents[ent].iov.as_ptr() as u64;
        let sqe = opcode::UringCmd80::new(types::Fd(self.dev.as_raw_fd()), cmd_op).cmd(cmd).addr(Some(iov)).build();
        with_len(sqe.user_data(ent as u64), 2)
    }

    fn push(&mut self, sqe: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: the buffers the SQE names (iovecs, header, payload)
        // live in `self.ents`, which outlives the ring.
        unsafe { self.ring.submission().push(sqe) }.map_err(|_| io::Error::other("ring submission queue full"))
    }

    /// Registers every entry and the stop poll, and submits them.
    fn register(&mut self, stop: RawFd) -> io::Result<()> {
        for i in 0..self.ents.len() {
            let sqe = self.command(ring::CMD_REGISTER, i, 0);
            self.push(&sqe)?;
        }
        let poll = opcode::PollAdd::new(types::Fd(stop), libc::POLLIN as u32).build().user_data(STOP);
        self.push(&poll.into())?;
        self.poll_mailbox()?;
        self.ring.submit()?;
        Ok(())
    }

    /// (Re)arm the one-shot poll of the mailbox's eventfd.
    fn poll_mailbox(&mut self) -> io::Result<()> {
        let fd = self.mailbox.wake.as_raw_fd();
        let poll = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build().user_data(WAKE);
        self.push(&poll.into())
    }

    /// Send the replies the commit thread left; then poll again.
    fn answer_deferred(&mut self) -> io::Result<u64> {
        let done = self.mailbox.take();
        let n = done.len() as u64;
        for (ent, unique, reply) in done {
            self.commit_reply(ent, unique, reply)?;
        }
        self.poll_mailbox()?;
        Ok(n)
    }

    /// Until the stop poll fires or every entry has ended (the kernel
    /// ends them with an error when the session ends).
    fn serve(&mut self) -> io::Result<()> {
        let (mut live, mut answered) = (self.ents.len(), 0u64);
        loop {
            match self.ring.submit_and_wait(1) {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                r => r?,
            };
            let done: Vec<(u64, i32)> = self.ring.completion().map(|c| (c.user_data(), c.result())).collect();
            for (ud, res) in done {
                if ud == STOP {
                    return Ok(());
                }
                if ud == WAKE {
                    answered += self.answer_deferred()?;
                    continue;
                }
                let ent = ud as usize;
                if res >= 0 && ent < self.ents.len() {
                    self.answer(ent)?;
                    answered += 1;
                    continue;
                }
                // ENOTCONN/ECONNABORTED: the session ended; another error
                // before any request: the kernel refused the registration.
                let ended = [libc::ENOTCONN, libc::ECONNABORTED, libc::ECANCELED].contains(&-res);
                let err = io::Error::from_raw_os_error(-res);
                if !ended && answered == 0 {
                    return Err(io::Error::new(err.kind(), format!("the kernel refused an entry: {err}")));
                }
                live = live.saturating_sub(1);
                if live == 0 {
                    return Ok(());
                }
                log::debug!("fuse ring queue {} entry {ent}: {err}", self.qid);
            }
        }
    }

    /// Serves the request in entry `ent` and queues its reply, or leaves
    /// it to the commit thread.
    fn answer(&mut self, ent: usize) -> io::Result<()> {
        let e = &self.ents[ent];
        let payload_sz = (e.u64_at(ring::ENT_IN_OUT + 16) as u32 as usize).min(e.len);
        let h = decode::header(&e.header[..]).unwrap_or_default();
        let served = serve(&self.fs, &h, decode::ring_request(&e.header[..], &e.payload()[..payload_sz]).map(|r| r.1));
        self.served.fetch_add(1, Ordering::Relaxed);
        let mailbox = self.mailbox.clone();
        match served.reply_or_defer(&self.deferrer, move |r| mailbox.post(ent, h.unique, r)) {
            Some(reply) => self.commit_reply(ent, h.unique, reply),
            None => Ok(()),
        }
    }

    /// Writes `reply` to request `unique` into entry `ent` and queues its
    /// COMMIT_AND_FETCH.
    fn commit_reply(&mut self, ent: usize, unique: u64, reply: Reply) -> io::Result<()> {
        let reply = if reply == Reply::None { Reply::Empty } else { reply };
        let commit_id = self.ents[ent].u64_at(ring::ENT_IN_OUT + 8);
        let mut body = Vec::new();
        let mut error = reply.encode(&mut body);
        let e = &mut self.ents[ent];
        if body.len() > e.len {
            (error, body) = (-libc::EIO, Vec::new());
        }
        e.payload_mut()[..body.len()].copy_from_slice(&body);
        let out: [u8; OUT_HEADER] = reply::out_header(unique, error, body.len());
        e.header[ring::IN_OUT..ring::IN_OUT + OUT_HEADER].copy_from_slice(&out);
        e.header[ring::ENT_IN_OUT + 16..ring::ENT_IN_OUT + 20].copy_from_slice(&(body.len() as u32).to_le_bytes());
        let sqe = self.command(ring::CMD_COMMIT_AND_FETCH, ent, commit_id);
        self.push(&sqe)
    }
}
