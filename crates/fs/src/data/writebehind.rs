//! Write-behind: a file's data written to the pool by a thread of its
//! own, so a WRITE is answered once its bytes are copied, not once the
//! pool's device has them.
//!
//! Why: under the kernel's writeback cache every close(2) writes the file
//! back and waits for the WRITE replies; written through at once, the
//! device's time was on PostMark's path (10 s of a 21 s run were WRITEs
//! waiting for O_DIRECT transfers into the pool file). Here the session
//! thread copies the payload into a reused, aligned buffer, reserves the
//! write's journal room (`Pool::reserve_ops`: no back-pressure commit of
//! the write can then fall inside a namespace change), queues it and
//! replies; the `fs-write-behind` thread writes the queue in order
//! (`Pool::write_reserved`, O_DIRECT writes submitted asynchronously, so
//! the pool file's inode lock is not held across the transfer and the
//! session's small buffered writes do not wait behind it).
//!
//! What a user relies on holds, by settling (waiting for) a file's queued
//! writes before anything looks at or changes its object: a read, seek,
//! truncate, snapshot or version, layout, delete; and before a file's
//! record is saved, so a durable size never covers data not yet written
//! (`FileVolume::settle`). Every queued write is settled before the
//! pending records are saved and committed (fsync, syncfs, the periodic
//! commit, unmount). A write that fails behind is written again the
//! ordinary way by the next settler; if that fails too its error is kept
//! and returned by the file's next fsync (as the kernel reports a failed
//! writeback), and logged. Writes near a full pool, past the queue's
//! bound or larger than a buffer go through at once, as before.

use crate::error::{FsError, Result};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tarn_engine::{EngineError, OpsRoom, Pool};

/// The largest write queued (the FUSE layer's largest WRITE).
pub const BUFFER_BYTES: usize = 1 << 20;
/// O_DIRECT needs the buffer's address on this boundary.
const ALIGN: usize = 4096;
/// Queue weight a write of one block may add at most: a Map op, a Sums
/// op and a freed range (as `FileVolume::room` counts them).
const OPS_PER_BLOCK: usize = 96;
/// Free pool space a queued write leaves at least, beyond the queue: a
/// write that would cut into it goes through at once and meets ENOSPC
/// there, not behind the writer's back.
const SPACE_MARGIN: u64 = 64 << 20;
/// How long a full queue is waited on per look (the writer signals every
/// write it finishes).
const WAIT_STEP: Duration = Duration::from_millis(50);
/// Looks at a full queue before the write goes through at once instead.
const MAX_WAITS: usize = 100;

/// An aligned, reused buffer of BUFFER_BYTES.
struct Buffer {
    bytes: Vec<u8>,
    start: usize,
}

impl Buffer {
    fn new() -> Buffer {
        let bytes = vec![0u8; BUFFER_BYTES + ALIGN];
        let start = bytes.as_ptr().align_offset(ALIGN);
        Buffer { bytes, start }
    }

    fn slice(&self, len: usize) -> &[u8] {
        &self.bytes[self.start..self.start + len]
    }

    fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + len]
    }
}

/// One queued write.
struct Job {
    ino: u64,
    object: u32,
    offset: u64,
    len: usize,
    buffer: Buffer,
    /// Its journal room, taken by `write_reserved`.
    room: Option<OpsRoom>,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Jobs the writer could not write: a settler writes them again.
    failed: Vec<Job>,
    /// Jobs queued, in flight or failed, per object.
    per_object: HashMap<u32, Pending>,
    /// Bytes of those jobs (the queue's bound counts them).
    bytes: usize,
    /// Errors of writes lost behind, per inode: returned by its fsync.
    errors: HashMap<u64, FsError>,
    spare: Vec<Buffer>,
    stop: bool,
}

#[derive(Default, Clone, Copy)]
struct Pending {
    jobs: usize,
    bytes: u64,
}

/// What the write-behind did so far (`tarn mount` prints it at the end).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriteBehindStats {
    pub queued: u64,
    pub queued_bytes: u64,
    /// Writes that went through at once (queue full, too large, pool
    /// near full, no journal room).
    pub direct: u64,
    /// Writes the writer failed and a settler wrote again.
    pub retried: u64,
    /// Writes lost behind (their error kept for the file's fsync).
    pub lost: u64,
    /// Writes dropped unwritten: their file was deleted first.
    pub discarded: u64,
}

struct Shared {
    pool: Arc<Pool>,
    bound: usize,
    queue: Mutex<Queue>,
    /// The writer waits here for work.
    work: Condvar,
    /// Settlers and a full queue wait here for the writer.
    done: Condvar,
    stats: Mutex<WriteBehindStats>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut WriteBehindStats)) {
        f(&mut self.stats.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// The queue and its writer thread.
pub(crate) struct WriteBehind {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

/// A queued write is over: its counts go, its buffer is kept for reuse.
fn finish(q: &mut Queue, bound: usize, job: Job) {
    let gone = match q.per_object.get_mut(&job.object) {
        Some(p) => {
            p.jobs -= 1;
            p.bytes -= job.len as u64;
            p.jobs == 0
        }
        None => false,
    };
    if gone {
        q.per_object.remove(&job.object);
    }
    q.bytes -= job.len;
    if q.spare.len() * BUFFER_BYTES < bound {
        q.spare.push(job.buffer);
    }
}

impl WriteBehind {
    /// Start the writer; `bound`: bytes queued at most.
    pub(crate) fn start(pool: Arc<Pool>, bound: usize) -> Result<WriteBehind> {
        // What would make the first queued write refuse, done now.
        pool.prepare_reserved_writes()?;
        let shared = Arc::new(Shared {
            pool,
            bound,
            queue: Mutex::new(Queue::default()),
            work: Condvar::new(),
            done: Condvar::new(),
            stats: Mutex::new(WriteBehindStats::default()),
        });
        let s = shared.clone();
        let writer = std::thread::Builder::new()
            .name("fs-write-behind".into())
            .spawn(move || write_queue(&s))
            .map_err(|e| FsError::Invalid(leak_io(e)))?;
        Ok(WriteBehind { shared, writer: Mutex::new(Some(writer)) })
    }

    pub(crate) fn stats(&self) -> WriteBehindStats {
        *self.shared.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `data` for `object` at `offset` (of inode `ino`); false: not
    /// queued, write it at once (after settling the object). Call it
    /// holding the namespace lock: reserving journal room may commit.
    pub(crate) fn push(&self, ino: u64, object: u32, offset: u64, data: &[u8]) -> Result<bool> {
        let s = &self.shared;
        let len = data.len();
        if len == 0 || len > BUFFER_BYTES || len > s.bound {
            return Ok(false);
        }
        if !self.wait_for_room(len) {
            s.count(|c| c.direct += 1);
            return Ok(false);
        }
        let blocks = len.div_ceil(ALIGN) + 1;
        let Some(room) = s.pool.reserve_ops(blocks * OPS_PER_BLOCK)? else {
            s.count(|c| c.direct += 1);
            return Ok(false);
        };
        // The copy (up to 1 MiB) is made with the queue unlocked: the
        // writer and settlers take the lock after every write. Pushes
        // stay in order: each is made under the namespace lock.
        let mut buffer = s.lock().spare.pop().unwrap_or_else(Buffer::new);
        buffer.slice_mut(len).copy_from_slice(data);
        let mut q = s.lock();
        let p = q.per_object.entry(object).or_default();
        p.jobs += 1;
        p.bytes += len as u64;
        q.bytes += len;
        q.jobs.push_back(Job { ino, object, offset, len, buffer, room: Some(room) });
        drop(q);
        s.work.notify_one();
        s.count(|c| {
            c.queued += 1;
            c.queued_bytes += len as u64;
        });
        Ok(true)
    }

    /// Wait (bounded) until `len` more bytes fit in the queue and the pool
    /// keeps its margin with them; false: write at once.
    fn wait_for_room(&self, len: usize) -> bool {
        let s = &self.shared;
        let mut q = s.lock();
        for _ in 0..MAX_WAITS {
            if !q.failed.is_empty() || q.stop {
                return false;
            }
            if q.bytes + len <= s.bound {
                let queued = (q.bytes + len) as u64;
                return s.pool.available_bytes() >= queued.saturating_add(SPACE_MARGIN);
            }
            q = s.done.wait_timeout(q, WAIT_STEP).unwrap_or_else(|p| p.into_inner()).0;
        }
        false
    }

    /// Bytes queued for `object` (not yet on the pool): what its allocated
    /// size does not show yet.
    pub(crate) fn queued_bytes(&self, object: u32) -> u64 {
        self.shared.lock().per_object.get(&object).map_or(0, |p| p.bytes)
    }

    /// Wait until nothing is queued for `object` (Some) or at all (None),
    /// writing again, the ordinary way, what the writer failed. Call it
    /// holding the namespace lock, before the change it settles for.
    pub(crate) fn settle(&self, object: Option<u32>) {
        let s = &self.shared;
        let mut q = s.lock();
        loop {
            if !q.failed.is_empty() {
                let failed = std::mem::take(&mut q.failed);
                drop(q);
                for job in failed {
                    self.write_again(job);
                }
                s.work.notify_one();
                q = s.lock();
                continue;
            }
            let settled = match object {
                Some(o) => !q.per_object.contains_key(&o),
                None => q.bytes == 0,
            };
            if settled {
                return;
            }
            q = s.done.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// `object` is being deleted: its writes not yet taken by the writer
    /// are dropped (never written: the file is gone), the one in flight
    /// waited for. Call it holding the namespace lock.
    pub(crate) fn discard(&self, object: u32) {
        let s = &self.shared;
        let dropped = {
            let mut q = s.lock();
            // Most deleted files have nothing queued: no pass over the queue.
            if !q.per_object.contains_key(&object) {
                return;
            }
            let (mine, rest): (VecDeque<Job>, VecDeque<Job>) =
                std::mem::take(&mut q.jobs).into_iter().partition(|j| j.object == object);
            q.jobs = rest;
            let (failed, others): (Vec<Job>, Vec<Job>) =
                std::mem::take(&mut q.failed).into_iter().partition(|j| j.object == object);
            q.failed = others;
            let n = mine.len() + failed.len();
            for job in mine.into_iter().chain(failed) {
                finish(&mut q, s.bound, job);
            }
            n
        };
        if dropped > 0 {
            s.count(|st| st.discarded += dropped as u64);
            s.done.notify_all();
        }
        self.settle(Some(object));
    }

    /// A job the writer failed, written with commits allowed (a full pool
    /// commits freed space back); its error kept if it fails again.
    fn write_again(&self, job: Job) {
        let s = &self.shared;
        let data = job.buffer.slice(job.len);
        let r = match s.pool.write(job.object, job.offset, data, false) {
            Err(EngineError::NoSpace) => {
                s.pool.flush().and_then(|()| s.pool.write(job.object, job.offset, data, false))
            }
            r => r,
        };
        let mut q = s.lock();
        match r {
            Ok(()) => s.count(|c| c.retried += 1),
            Err(e) => {
                log::error!("write-behind of inode {} ({} bytes at {}) failed: {e}", job.ino, job.len, job.offset);
                q.errors.entry(job.ino).or_insert(FsError::from(e));
                s.count(|c| c.lost += 1);
            }
        }
        finish(&mut q, s.bound, job);
        drop(q);
        s.done.notify_all();
    }

    /// The error of a write of `ino` lost behind, once (its fsync's).
    pub(crate) fn take_error(&self, ino: u64) -> Option<FsError> {
        self.shared.lock().errors.remove(&ino)
    }

    /// Write out everything queued and end the writer (unmount).
    pub(crate) fn stop(&self) {
        self.settle(None);
        self.shared.lock().stop = true;
        self.shared.work.notify_all();
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = writer {
            let _ = t.join();
        }
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The writer thread: the queue in order, until stopped with it empty.
fn write_queue(s: &Shared) {
    tarn_engine::device::submit_direct_writes_async();
    loop {
        let mut job = {
            let mut q = s.lock();
            loop {
                // After a failure the writer waits until a settler wrote the
                // failed job again: later writes of its range must follow it.
                if q.failed.is_empty() {
                    if let Some(job) = q.jobs.pop_front() {
                        break job;
                    }
                }
                if q.stop && q.jobs.is_empty() {
                    return;
                }
                q = s.work.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        let room = job.room.take().expect("a queued job holds its room");
        // A helper's share: a commit its write must make (a full pool)
        // then waits for no settler, which may be waiting for this write
        // holding the namespace lock (engine `pool/changes.rs`).
        let share = s.pool.enter_changes(true);
        let r = s.pool.write_reserved(job.object, job.offset, job.buffer.slice(job.len), room);
        drop(share);
        let mut q = s.lock();
        match r {
            Ok(()) => finish(&mut q, s.bound, job),
            Err(e) => {
                log::debug!("write-behind of inode {} to be written again: {e}", job.ino);
                q.failed.push(job);
            }
        }
        drop(q);
        s.done.notify_all();
    }
}

/// A thread that could not start, as the error's static text.
fn leak_io(e: std::io::Error) -> &'static str {
    log::error!("starting the write-behind thread: {e}");
    "the write-behind thread could not start"
}
