//! The file-aware read cache of a live file volume (docs/ARCHITECTURE.md
//! *File cache*): a sequential reader of a file gets the next window of
//! the file read ahead by a thread of its own (the window's scattered
//! blocks hinted to the device at once, then read and checked into a
//! bounded set of chunks), and its READs served from those chunks.
//! Eviction is per file: chunks of files known closed go first, then the
//! least recently used.
//!
//! Coherence: every change of a file's data (write, truncate, delete)
//! calls `invalidate` for its object after the change, which drops the
//! object's chunks and marks its readahead in flight stale, so a chunk
//! read before the change is never inserted after it.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use tarn_engine::{Pool, View};

/// Bytes of one cached chunk, at a multiple of it in the file: the
/// kernel's FUSE readahead asks READs of 128 KiB.
pub const CHUNK: u64 = 128 << 10;
/// A new sequential stream's first readahead window.
const FIRST_WINDOW: u64 = 128 << 10;
/// The window doubles per readahead up to this.
const MAX_WINDOW: u64 = 4 << 20;
/// Readahead jobs waiting for the reader thread (a full queue drops the
/// job: the READs then go to the pool as without a cache).
const QUEUE: usize = 8;
/// Streams tracked (cleared whole past this, as the namespace's caches).
const STREAMS: usize = 1024;
/// How far from a stream's next offset a READ may land and still
/// continue it: the kernel has several READs of its own readahead in
/// flight, and they may arrive out of order.
const SLACK: u64 = 2 << 20;

/// What the cache did, for tests and the mount's exit line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// READs served from chunks.
    pub hits: u64,
    /// Bytes read ahead into chunks.
    pub read_ahead: u64,
    /// Chunks evicted to make room.
    pub evicted: u64,
    /// Chunks read ahead but dropped: their file changed meanwhile.
    pub stale: u64,
}

/// One sequential reader of one file.
#[derive(Debug, Clone, Copy)]
struct Stream {
    /// Where the reader's next READ is expected.
    next: u64,
    window: u64,
    /// Readahead was asked up to here.
    ahead: u64,
}

struct Chunk {
    data: Vec<u8>,
    /// The tick of its last use (LRU among equals).
    used: u64,
}

/// A window to read ahead: bytes [offset, offset+len) of `object`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    pub object: u32,
    pub offset: u64,
    pub len: u64,
}

/// Readahead jobs of one object not finished yet.
#[derive(Default)]
struct Inflight {
    jobs: u32,
    /// The object changed since they were asked: their data is dropped.
    stale: bool,
}

/// The cache's state: pure bookkeeping (the reader thread and the pool
/// are `FileCache`'s), so tests drive it directly.
pub struct CacheState {
    capacity: u64,
    bytes: u64,
    tick: u64,
    streams: HashMap<u32, Stream>,
    chunks: HashMap<(u32, u64), Chunk>,
    /// Chunks per object (an object without any costs `invalidate` one
    /// lookup, not a walk of every chunk).
    per_object: HashMap<u32, u32>,
    /// Objects whose files are known closed (last release or forget, or
    /// a reader that reached the end): their chunks are evicted first.
    closed: HashSet<u32>,
    inflight: HashMap<u32, Inflight>,
    pub stats: CacheStats,
}

impl CacheState {
    /// An empty cache holding at most `capacity` bytes of chunks.
    pub fn new(capacity: u64) -> CacheState {
        CacheState {
            capacity,
            bytes: 0,
            tick: 0,
            streams: HashMap::new(),
            chunks: HashMap::new(),
            per_object: HashMap::new(),
            closed: HashSet::new(),
            inflight: HashMap::new(),
            stats: CacheStats::default(),
        }
    }

    /// Bytes of chunks held (never above the capacity).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether a chunk of `object` at file offset `at` is held.
    pub fn holds(&self, object: u32, at: u64) -> bool {
        self.chunks.contains_key(&(object, at / CHUNK))
    }

    /// Fill `buf` with bytes at `offset` of `object` when chunks hold all
    /// of them. Chunks the READ reaches the end of are dropped: the
    /// reader is past them and the kernel's page cache holds their data
    /// (kept here as well, they would only push out chunks still ahead).
    pub fn take(&mut self, object: u32, offset: u64, buf: &mut [u8]) -> bool {
        let end = offset + buf.len() as u64;
        if buf.is_empty() || !self.per_object.contains_key(&object) {
            return false;
        }
        let (first, last) = (offset / CHUNK, (end - 1) / CHUNK);
        let covered = (first..=last).all(|c| {
            self.chunks.get(&(object, c)).is_some_and(|k| c * CHUNK + k.data.len() as u64 >= end.min((c + 1) * CHUNK))
        });
        if !covered {
            return false;
        }
        self.tick += 1;
        for c in first..=last {
            let (from, to) = ((c * CHUNK).max(offset), ((c + 1) * CHUNK).min(end));
            let passed = to == (c + 1) * CHUNK;
            let Some(k) = self.chunks.get_mut(&(object, c)) else { return false };
            let at = (from - c * CHUNK) as usize;
            buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(&k.data[at..at + (to - from) as usize]);
            k.used = self.tick;
            if passed {
                self.remove(object, c);
            }
        }
        self.stats.hits += 1;
        true
    }

    /// A READ of bytes [offset, end) of `object` (a file of `size` bytes)
    /// was served: the window to read ahead now, if its reader is
    /// sequential and less than half a window is read ahead of it.
    pub fn plan(&mut self, object: u32, offset: u64, end: u64, size: u64) -> Option<Job> {
        self.closed.remove(&object);
        if self.streams.len() >= STREAMS && !self.streams.contains_key(&object) {
            self.streams.clear();
        }
        let mut s = match self.streams.get(&object) {
            Some(s) if offset.abs_diff(s.next) <= SLACK => *s,
            // A reader from the start is taken for a sequential one.
            _ if offset == 0 => Stream { next: 0, window: FIRST_WINDOW, ahead: 0 },
            _ => {
                // A random reader, or one that jumped: a stream starts
                // here, read ahead once its next READ follows this one.
                self.streams.insert(object, Stream { next: end, window: FIRST_WINDOW, ahead: end });
                return None;
            }
        };
        s.next = s.next.max(end);
        if end >= size {
            // Read to its end: likely closed soon, and nothing is ahead.
            self.streams.remove(&object);
            self.closed_file(object);
            return None;
        }
        s.ahead = s.ahead.max(end.next_multiple_of(CHUNK));
        let job = (s.ahead < size && s.ahead < end + s.window / 2)
            .then(|| Job { object, offset: s.ahead, len: s.window.min(size - s.ahead) });
        if let Some(job) = &job {
            s.ahead += job.len;
            s.window = (s.window * 2).min(MAX_WINDOW);
            self.inflight.entry(object).or_default().jobs += 1;
        }
        self.streams.insert(object, s);
        job
    }

    /// A planned job could not be queued: its window is asked again later.
    pub fn unplan(&mut self, job: &Job) {
        if let Some(s) = self.streams.get_mut(&job.object) {
            s.ahead = s.ahead.min(job.offset);
        }
        self.finished(job.object);
    }

    /// The reader thread is done with one job of `object`.
    pub fn finished(&mut self, object: u32) {
        if let Some(f) = self.inflight.get_mut(&object) {
            f.jobs -= 1;
            if f.jobs == 0 {
                self.inflight.remove(&object);
            }
        }
    }

    /// Keep a chunk read ahead at file offset `at` (a multiple of CHUNK),
    /// unless its file changed since the job was asked, or its reader is
    /// already past it (its READ went to the pool meanwhile).
    pub fn insert(&mut self, object: u32, at: u64, data: Vec<u8>) {
        let len = data.len() as u64;
        let stale = self.inflight.get(&object).is_none_or(|f| f.stale);
        let passed = self.streams.get(&object).is_none_or(|s| s.next >= at + len);
        if stale || passed || len > self.capacity || self.chunks.contains_key(&(object, at / CHUNK)) {
            self.stats.stale += u64::from(stale);
            return;
        }
        while self.bytes + len > self.capacity && self.evict_one() {}
        self.tick += 1;
        self.chunks.insert((object, at / CHUNK), Chunk { data, used: self.tick });
        *self.per_object.entry(object).or_default() += 1;
        self.bytes += len;
        self.stats.read_ahead += len;
    }

    /// Drop the chunk closed files' first, then the least recently used.
    fn evict_one(&mut self) -> bool {
        let victim = self.chunks.iter().min_by_key(|(key, k)| (!self.closed.contains(&key.0), k.used)).map(|(key, _)| *key);
        let Some((object, c)) = victim else { return false };
        self.remove(object, c);
        self.stats.evicted += 1;
        true
    }

    fn remove(&mut self, object: u32, c: u64) {
        let Some(k) = self.chunks.remove(&(object, c)) else { return };
        self.bytes -= k.data.len() as u64;
        if let Some(n) = self.per_object.get_mut(&object) {
            *n -= 1;
            if *n == 0 {
                self.per_object.remove(&object);
                self.closed.remove(&object);
            }
        }
    }

    /// `object`'s data changed (or it went): its chunks go, readahead in
    /// flight for it is dropped when it lands, and its reader's
    /// readahead starts again from where it reads.
    pub fn invalidate(&mut self, object: u32) {
        if let Some(f) = self.inflight.get_mut(&object) {
            f.stale = true;
        }
        if let Some(s) = self.streams.get_mut(&object) {
            s.ahead = s.next;
        }
        if self.per_object.contains_key(&object) {
            let bytes = &mut self.bytes;
            self.chunks.retain(|key, k| {
                let keep = key.0 != object;
                if !keep {
                    *bytes -= k.data.len() as u64;
                }
                keep
            });
            self.per_object.remove(&object);
            self.closed.remove(&object);
        }
    }

    /// The file of `object` is known closed: its chunks go first.
    pub fn closed_file(&mut self, object: u32) {
        if self.per_object.contains_key(&object) {
            self.closed.insert(object);
        }
    }
}

/// The reader thread and its queue, while the cache runs.
struct Reader {
    jobs: SyncSender<Job>,
    thread: JoinHandle<()>,
}

/// A live volume's cache: the state and the thread that reads ahead.
pub(crate) struct FileCache {
    state: Arc<Mutex<CacheState>>,
    reader: Mutex<Option<Reader>>,
}

fn lock(state: &Mutex<CacheState>) -> MutexGuard<'_, CacheState> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl FileCache {
    /// A cache of `capacity` bytes reading ahead from `pool` (None when
    /// the thread cannot start: reads then go to the pool as without).
    pub(crate) fn start(pool: Arc<Pool>, capacity: u64) -> Option<FileCache> {
        let state = Arc::new(Mutex::new(CacheState::new(capacity)));
        let (jobs, queue) = sync_channel(QUEUE);
        let shared = state.clone();
        let spawned = std::thread::Builder::new().name("fs-readahead".into()).spawn(move || read_ahead(&pool, &shared, queue));
        match spawned {
            Ok(thread) => Some(FileCache { state, reader: Mutex::new(Some(Reader { jobs, thread })) }),
            Err(e) => {
                log::warn!("no file cache: its reader thread did not start: {e}");
                None
            }
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, CacheState> {
        lock(&self.state)
    }

    /// Serve a READ of `object` (a file of `size` bytes) into `buf` from
    /// chunks, else through `read`; then ask the next window ahead.
    pub(crate) fn read<E>(
        &self,
        object: u32,
        offset: u64,
        size: u64,
        buf: &mut [u8],
        read: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        if !self.state().take(object, offset, buf) {
            read(buf)?;
        }
        let job = self.state().plan(object, offset, offset + buf.len() as u64, size);
        if let Some(job) = job {
            self.queue(job);
        }
        Ok(())
    }

    fn queue(&self, job: Job) {
        let sent = match &*self.reader.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(r) => match r.jobs.try_send(job) {
                Ok(()) => true,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        if !sent {
            self.state().unplan(&job);
        }
    }

    /// Stop the reader thread (at unmount): jobs queued are done first.
    pub(crate) fn stop(&self) {
        let reader = self.reader.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(Reader { jobs, thread }) = reader {
            drop(jobs);
            if thread.join().is_err() {
                log::error!("the file cache's reader thread panicked");
            }
        }
    }
}

impl Drop for FileCache {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The reader thread: each job's blocks are hinted to the devices as a
/// whole (scattered blocks then read at once), then read and checked
/// chunk by chunk into the cache. A failed read ends the job quietly:
/// the READ itself then goes to the pool and reports the error.
fn read_ahead(pool: &Pool, state: &Mutex<CacheState>, queue: Receiver<Job>) {
    for job in queue {
        pool.prefetch_view(job.object, View::Head, job.offset, job.len);
        let end = job.offset + job.len;
        let mut at = job.offset;
        while at < end {
            let mut data = vec![0u8; (end - at).min(CHUNK) as usize];
            if pool.read_view(job.object, View::Head, at, &mut data).is_err() {
                break;
            }
            lock(state).insert(job.object, at, data);
            at += CHUNK;
        }
        lock(state).finished(job.object);
    }
}

impl crate::FileVolume {
    /// Give this live volume a file cache of `bytes` (0: none; a view of
    /// a snapshot keeps none: its data never changes and the kernel's
    /// page cache keeps what it read).
    pub fn start_file_cache(&mut self, bytes: u64) {
        if bytes > 0 && self.view.is_none() {
            self.cache = FileCache::start(self.pool.clone(), bytes);
        }
    }

    /// What the file cache did so far (None: no cache).
    pub fn file_cache_stats(&self) -> Option<CacheStats> {
        self.cache.as_ref().map(|c| c.state().stats)
    }

    /// `object`'s data is about to change (or the object to go): its
    /// cached data is dropped when the guard is, after the change, on
    /// every path out of it (a failed write may have changed part of its
    /// range). Dropping it before the change would let readahead in
    /// flight insert data read before it.
    pub(crate) fn changing(&self, object: u32) -> Changing<'_> {
        Changing { fv: self, object }
    }

    /// The file of `object` is known closed (0: none yet).
    pub(crate) fn file_closed(&self, object: u32) {
        if let Some(c) = self.cache.as_ref().filter(|_| object != 0) {
            c.state().closed_file(object);
        }
    }

    /// Read file data of `object` (a file of `size` bytes) at `offset`:
    /// through the cache when there is one.
    pub(crate) fn read_file_data(&self, object: u32, offset: u64, size: u64, buf: &mut [u8]) -> crate::Result<()> {
        match &self.cache {
            Some(c) => c.read(object, offset, size, buf, |b| self.read_object(object, offset, b)),
            None => self.read_object(object, offset, buf),
        }
    }

    /// Stop the cache's reader thread (at unmount).
    pub(crate) fn stop_file_cache(&self) {
        if let Some(c) = &self.cache {
            c.stop();
        }
    }
}

/// Drops an object's cached data when it goes (`FileVolume::changing`).
pub(crate) struct Changing<'a> {
    fv: &'a crate::FileVolume,
    object: u32,
}

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.fv.cache.as_ref().filter(|_| self.object != 0) {
            c.state().invalidate(self.object);
        }
    }
}
