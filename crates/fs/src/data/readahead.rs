//! Per-file readahead of a live file volume (docs/ARCHITECTURE.md *File
//! readahead*): a file read sequentially gets the next window of its
//! blocks asked of the devices at once, however scattered they lie in
//! the pool (`Pool::prefetch_view`), by a thread of the mount, so that
//! the READs after it find them in the page cache of the pool's files
//! instead of reading them one synchronous 4 KiB read after another.
//!
//! Only hints: no data is kept here, so no change of a file can leave
//! anything stale (the pool's files' page cache is the one the writes go
//! through). A cache of its own, read ahead into and served from, was
//! built and measured: no faster than the hints alone, and it costs
//! memory and a copy (ARCHITECTURE.md, the figures).

use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use tarn_engine::{Pool, View};

/// A new sequential stream's first window (the kernel's own FUSE
/// readahead asks READs of 128 KiB).
pub const FIRST_WINDOW: u64 = 128 << 10;
/// Windows are asked at this alignment in the file.
const ALIGN: u64 = 128 << 10;
/// Windows waiting for the hinting thread (past it one is dropped: the
/// READs then read as without readahead, and the stream asks again).
const QUEUE: usize = 16;
/// Streams tracked (cleared whole past this, as the namespace's caches).
const STREAMS: usize = 1024;
/// How far from a stream's next offset a READ may land and still
/// continue it: the kernel has several READs of its own readahead in
/// flight, and they may arrive out of order.
const SLACK: u64 = 2 << 20;

/// What readahead did, for tests and the mount's exit line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadaheadStats {
    /// Windows asked of the hinting thread.
    pub windows: u64,
    /// Of those, windows scattered enough to be hinted.
    pub hinted: u64,
    /// Bytes of the hinted windows.
    pub hinted_bytes: u64,
    /// Windows dropped: the queue was full.
    pub dropped: u64,
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

/// A window to read ahead: bytes [offset, offset+len) of `object`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub object: u32,
    pub offset: u64,
    pub len: u64,
}

/// The sequential streams of a volume's files: pure bookkeeping (the
/// thread and the pool are `Readahead`'s), so tests drive it directly.
pub struct Streams {
    max_window: u64,
    streams: HashMap<u32, Stream>,
    pub stats: ReadaheadStats,
}

impl Streams {
    /// Windows grow from FIRST_WINDOW, doubling, up to `max_window`.
    pub fn new(max_window: u64) -> Streams {
        Streams { max_window: max_window.max(FIRST_WINDOW), streams: HashMap::new(), stats: ReadaheadStats::default() }
    }

    /// Streams tracked now.
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }

    /// A READ of bytes [offset, end) of `object` (a file of `size` bytes)
    /// was served: the window to read ahead now, if its reader is
    /// sequential and less than half a window is asked ahead of it. A
    /// reader reaching the end is forgotten (the file is likely closed
    /// next: its stream's memory goes with it).
    pub fn plan(&mut self, object: u32, offset: u64, end: u64, size: u64) -> Option<Window> {
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
            self.streams.remove(&object);
            return None;
        }
        s.ahead = s.ahead.max(end.next_multiple_of(ALIGN));
        let window = (s.ahead < size && s.ahead < end + s.window / 2).then(|| Window {
            object,
            offset: s.ahead,
            len: s.window.min(size - s.ahead),
        });
        if let Some(w) = &window {
            s.ahead += w.len;
            s.window = (s.window * 2).min(self.max_window);
            self.stats.windows += 1;
        }
        self.streams.insert(object, s);
        window
    }

    /// A planned window could not be queued: it is asked again later.
    pub fn unplan(&mut self, w: &Window) {
        if let Some(s) = self.streams.get_mut(&w.object) {
            s.ahead = s.ahead.min(w.offset);
        }
        self.stats.windows -= 1;
        self.stats.dropped += 1;
    }
}

/// The hinting thread and its queue, while readahead runs.
struct Hinter {
    windows: SyncSender<Window>,
    thread: JoinHandle<()>,
}

/// A live volume's readahead: the streams and the thread that hints.
pub(crate) struct Readahead {
    streams: Arc<Mutex<Streams>>,
    hinter: Mutex<Option<Hinter>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Readahead {
    /// Readahead of windows up to `max_window` bytes from `pool` (None
    /// when the thread cannot start: reads then go on without).
    fn start(pool: Arc<Pool>, max_window: u64) -> Option<Readahead> {
        let streams = Arc::new(Mutex::new(Streams::new(max_window)));
        let (windows, queue) = sync_channel(QUEUE);
        let shared = streams.clone();
        let spawned =
            std::thread::Builder::new().name("fs-readahead".into()).spawn(move || hint(&pool, &shared, queue));
        match spawned {
            Ok(thread) => Some(Readahead { streams, hinter: Mutex::new(Some(Hinter { windows, thread })) }),
            Err(e) => {
                log::warn!("no file readahead: its thread did not start: {e}");
                None
            }
        }
    }

    /// After a READ of bytes [offset, end) of `object`: queue the next
    /// window when its reader is sequential (never waits: a full queue
    /// drops the window).
    fn served(&self, object: u32, offset: u64, end: u64, size: u64) {
        let Some(w) = lock(&self.streams).plan(object, offset, end, size) else { return };
        let sent = lock(&self.hinter).as_ref().is_some_and(|h| h.windows.try_send(w).is_ok());
        if !sent {
            lock(&self.streams).unplan(&w);
        }
    }

    /// Stop the thread (at unmount): windows queued are hinted first.
    fn stop(&self) {
        let hinter = lock(&self.hinter).take();
        if let Some(Hinter { windows, thread }) = hinter {
            drop(windows);
            if thread.join().is_err() {
                log::error!("the file readahead thread panicked");
            }
        }
    }
}

impl Drop for Readahead {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The hinting thread: each window's scattered blocks asked of the
/// devices at once (asynchronous: the call returns once they are asked).
fn hint(pool: &Pool, streams: &Mutex<Streams>, queue: Receiver<Window>) {
    for w in queue {
        if pool.prefetch_view(w.object, View::Head, w.offset, w.len) > 0 {
            let mut s = lock(streams);
            s.stats.hinted += 1;
            s.stats.hinted_bytes += w.len;
        }
    }
}

impl crate::FileVolume {
    /// Read files ahead on this live volume, in windows of up to
    /// `max_window` bytes (0: no readahead; a view of a snapshot has
    /// none: the kernel's page cache keeps what it read of its files).
    pub fn start_readahead(&mut self, max_window: u64) {
        if max_window > 0 && self.view.is_none() {
            self.readahead = Readahead::start(self.pool.clone(), max_window);
        }
    }

    /// What readahead did so far (None: none).
    pub fn readahead_stats(&self) -> Option<ReadaheadStats> {
        self.readahead.as_ref().map(|r| lock(&r.streams).stats)
    }

    /// A READ of `buf` at `offset` of `object` (a file of `size` bytes)
    /// was served.
    pub(crate) fn read_ahead(&self, object: u32, offset: u64, buf: &[u8], size: u64) {
        if let Some(r) = &self.readahead {
            r.served(object, offset, offset + buf.len() as u64, size);
        }
    }

    /// Stop the readahead thread (at unmount) and say what it did.
    pub(crate) fn stop_readahead(&self) {
        if let Some(r) = &self.readahead {
            r.stop();
            let s = lock(&r.streams).stats;
            log::info!(
                "readahead: {} windows, {} hinted ({} MiB), {} dropped",
                s.windows,
                s.hinted,
                s.hinted_bytes >> 20,
                s.dropped
            );
        }
    }
}
