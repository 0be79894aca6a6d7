//! The mount's staging area for file data (docs/ARCHITECTURE.md, *File
//! volumes*, *Dirty data held by the mount*): a WRITE is acknowledged once
//! its payload is copied here, and written into the volume later — by the
//! `fs-writeback` thread once more than half the bound is held (oldest
//! file first, on the machine's other core), by the session thread when
//! a WRITE would pass the bound (back-pressure), before any request that
//! reads or captures that file's data (`drain`), and whole before every
//! commit. Data of a file freed before it was written is dropped, never
//! written (PostMark deletes most of what it writes, as ext4's delayed
//! allocation never writes such data either).
//!
//! Ordering: the writes of one file reach the volume in the order they
//! came; a file being written by one thread is `busy`, and any other
//! thread wanting its data waits for that write to end first. The
//! staging mutex is never held while the volume is called.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
#[cfg(test)]
use std::sync::Arc;
use tarn_fs::FsError;

/// Where staged data goes (the file volume; a recorder in tests).
pub trait Sink {
    /// Write `data` at `offset` of file `ino`; `keep_times`: the file's
    /// times were set after this data came, leave them.
    fn put(&self, ino: u64, offset: u64, data: &[u8], keep_times: bool) -> Result<(), FsError>;
}

impl Sink for tarn_fs::FileVolume {
    fn put(&self, ino: u64, offset: u64, data: &[u8], keep_times: bool) -> Result<(), FsError> {
        self.write_held(ino, offset, data, !keep_times).map(drop)
    }
}

/// Bytes of one file at one offset: contiguous WRITEs are joined.
pub struct Run {
    at: u64,
    data: Vec<u8>,
    /// The file's times were set after this data came: its write keeps
    /// them.
    keep_times: bool,
}

/// The capacity of the buffer holding `len` bytes: a power of two up
/// to 64 KiB, then a multiple of 64 KiB (few sizes, so buffers are
/// reused: a fresh buffer's first touch costs a page fault and a zeroed
/// page per 4 KiB, which cost the mount as much as the copy it saves).
fn class(len: usize) -> usize {
    const STEP: usize = 64 << 10;
    if len <= STEP {
        len.max(4096).next_power_of_two()
    } else {
        len.div_ceil(STEP) * STEP
    }
}

/// Written buffers kept for reuse, by capacity.
#[derive(Default)]
struct Spares {
    free: HashMap<usize, Vec<Vec<u8>>>,
    bytes: usize,
}

impl Spares {
    /// An empty buffer of capacity `class(len)`.
    fn take(&mut self, len: usize) -> Vec<u8> {
        let cap = class(len);
        match self.free.get_mut(&cap).and_then(Vec::pop) {
            Some(b) => {
                self.bytes -= cap;
                b
            }
            None => Vec::with_capacity(cap),
        }
    }

    /// Keep `b` for reuse while under `max` bytes kept.
    fn give(&mut self, mut b: Vec<u8>, max: usize) {
        let cap = b.capacity();
        if self.bytes + cap <= max && cap == class(cap) {
            b.clear();
            self.bytes += cap;
            self.free.entry(cap).or_default().push(b);
        }
    }
}

/// What one file has staged, in the order it came.
pub struct Staged {
    runs: Vec<Run>,
    /// Capacity of the buffers held (what the bound counts).
    bytes: usize,
    /// When the oldest of it came.
    since: Instant,
}

impl Default for Staged {
    fn default() -> Self {
        Staged { runs: Vec::new(), bytes: 0, since: Instant::now() }
    }
}

impl Staged {
    /// The end of the last byte held (the file's size once written).
    fn end(&self) -> u64 {
        self.runs.iter().map(|r| r.at + r.data.len() as u64).max().unwrap_or(0)
    }

    /// Holds `data` after what is held (joined to the last run when it
    /// follows it and fits its buffer); the capacity added.
    fn push(&mut self, offset: u64, data: &[u8], spares: &mut Spares) -> usize {
        if let Some(r) = self.runs.last_mut() {
            let joins = r.at + r.data.len() as u64 == offset && !r.keep_times;
            if joins && r.data.len() + data.len() <= r.data.capacity() {
                r.data.extend_from_slice(data);
                return 0;
            }
        }
        let mut b = spares.take(data.len());
        b.extend_from_slice(data);
        let cap = b.capacity();
        self.bytes += cap;
        self.runs.push(Run { at: offset, data: b, keep_times: false });
        cap
    }
}

/// How often the writer thread looks for data held past its expiry.
const EXPIRY_CHECK: Duration = Duration::from_millis(500);

/// Bytes that went through the staging area (reported at unmount).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub staged: u64,
    pub written: u64,
    /// Never written: the file was freed first.
    pub dropped: u64,
    /// WRITEs that found the area full and waited for older data to be
    /// written (back-pressure).
    pub pressed: u64,
}

#[derive(Default)]
struct State {
    files: HashMap<u64, Staged>,
    /// Files by the time their data was first staged (an entry whose file
    /// was written since, or staged again, is skipped or taken early).
    order: VecDeque<u64>,
    busy: HashSet<u64>,
    bytes: usize,
    /// The first error writing a file's staged data, for its next fsync.
    errors: HashMap<u64, FsError>,
    counts: Counts,
    spares: Spares,
    stop: bool,
}

/// The bounded staging area of one mount.
pub struct Staging {
    state: Mutex<State>,
    /// Signalled when a file stops being busy, when the writer has work,
    /// and at stop.
    changed: Condvar,
    max: usize,
    /// Data held this long is written by the `fs-writeback` thread
    /// (ext4's dirty_expire_centisecs: 30 s), then committed by the next
    /// periodic commit.
    expire: Duration,
}

impl Staging {
    /// An area holding at most `max` bytes, each for at most `expire`
    /// (then the writer thread writes it).
    pub fn new(max: usize, expire: Duration) -> Staging {
        Staging { state: Mutex::new(State::default()), changed: Condvar::new(), max, expire }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hold `data` for `offset` of `ino`; written through at once when it
    /// alone is larger than the bound. Older files are written first while
    /// it would not fit.
    pub fn stage(&self, sink: &dyn Sink, ino: u64, offset: u64, data: &[u8]) {
        if data.len() > self.max / 2 {
            self.drain(sink, ino);
            let run = Run { at: offset, data: data.to_vec(), keep_times: false };
            return self.write_out(sink, ino, vec![run]);
        }
        self.make_room(sink, class(data.len()));
        let mut st = self.lock();
        if !st.files.contains_key(&ino) {
            st.order.push_back(ino);
        }
        let st = &mut *st;
        let added = st.files.entry(ino).or_default().push(offset, data, &mut st.spares);
        st.bytes += added;
        st.counts.staged += data.len() as u64;
        if st.bytes > self.writer_at() {
            self.changed.notify_all();
        }
    }

    /// Write the oldest files until `more` bytes fit under the bound.
    fn make_room(&self, sink: &dyn Sink, more: usize) {
        let mut counted = false;
        loop {
            let oldest = {
                let mut st = self.lock();
                if st.bytes + more <= self.max {
                    return;
                }
                if !counted {
                    st.counts.pressed += 1;
                    counted = true;
                }
                Self::oldest(&mut st)
            };
            match oldest {
                Some(ino) => self.drain(sink, ino),
                None => {
                    // What is held is being written by another thread:
                    // wait for it (nothing busy: nothing to wait for).
                    let st = self.lock();
                    if st.busy.is_empty() {
                        return;
                    }
                    drop(self.changed.wait(st));
                }
            }
        }
    }

    /// The oldest file with staged data not being written (entries of
    /// files written since are dropped on the way).
    fn oldest(st: &mut State) -> Option<u64> {
        while let Some(front) = st.order.front() {
            if st.files.contains_key(front) {
                break;
            }
            st.order.pop_front();
        }
        let at = st.order.iter().position(|i| st.files.contains_key(i) && !st.busy.contains(i))?;
        st.order.remove(at)
    }

    /// Waits until no thread writes `ino`, then takes what it has staged.
    fn take(&self, ino: u64) -> (MutexGuard<'_, State>, Option<Staged>) {
        let mut st = self.lock();
        while st.busy.contains(&ino) {
            st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        let taken = st.files.remove(&ino);
        if let Some(s) = &taken {
            st.bytes -= s.bytes;
        }
        (st, taken)
    }

    /// Write everything `ino` has staged into the volume; returns once
    /// it is there (an error is kept for the file's next fsync).
    pub fn drain(&self, sink: &dyn Sink, ino: u64) {
        let (mut st, taken) = self.take(ino);
        let Some(s) = taken else { return };
        st.busy.insert(ino);
        drop(st);
        self.write_out(sink, ino, s.runs);
        self.lock().busy.remove(&ino);
        self.changed.notify_all();
    }

    fn write_out(&self, sink: &dyn Sink, ino: u64, runs: Vec<Run>) {
        let mut written = 0;
        let mut failed = None;
        for r in &runs {
            match sink.put(ino, r.at, &r.data, r.keep_times) {
                Ok(()) => written += r.data.len() as u64,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let mut st = self.lock();
        st.counts.written += written;
        self.recycle(&mut st, runs);
        if let Some(e) = failed {
            log::warn!("writing the held data of inode {ino}: {e}");
            st.errors.entry(ino).or_insert(e);
        }
    }

    /// Keeps the buffers of `runs` for reuse, up to a quarter of the bound.
    fn recycle(&self, st: &mut State, runs: Vec<Run>) {
        for r in runs {
            st.spares.give(r.data, self.max / 4);
        }
    }

    /// Write everything staged now (what is staged meanwhile may stay),
    /// and wait for the writes other threads had begun.
    pub fn drain_all(&self, sink: &dyn Sink) {
        let files: Vec<u64> = {
            let mut st = self.lock();
            let busy: Vec<u64> = st.busy.iter().copied().collect();
            st.order.drain(..).chain(busy).collect()
        };
        for ino in files {
            self.drain(sink, ino);
        }
    }

    /// Whether `ino` has data staged.
    pub fn holds(&self, ino: u64) -> bool {
        self.lock().files.contains_key(&ino)
    }

    /// The size `ino` will have once its staged data is written, if
    /// larger than `size`.
    pub fn size(&self, ino: u64, size: u64) -> u64 {
        self.lock().files.get(&ino).map_or(size, |s| size.max(s.end()))
    }

    /// The file's times were just set: the data staged so far keeps them
    /// when written (what comes later is stamped as it is written).
    pub fn times_set(&self, ino: u64) {
        if let Some(s) = self.lock().files.get_mut(&ino) {
            s.runs.iter_mut().for_each(|r| r.keep_times = true);
        }
    }

    /// Runs `op`, which may free `ino` (unlink, rename over it, forget,
    /// release), with `ino`'s staged data out of reach of the writers;
    /// if `freed()` says `ino` is gone after it, the data is dropped
    /// unwritten, else it goes back (ahead of anything else).
    pub fn around_free<R>(&self, ino: u64, op: impl FnOnce() -> R, freed: impl FnOnce() -> bool) -> R {
        let (st, taken) = self.take(ino);
        drop(st);
        let Some(s) = taken else { return op() };
        let r = op();
        let mut st = self.lock();
        if freed() {
            st.counts.dropped += s.runs.iter().map(|r| r.data.len() as u64).sum::<u64>();
            st.errors.remove(&ino);
            self.recycle(&mut st, s.runs);
        } else {
            st.bytes += s.bytes;
            st.order.push_front(ino);
            st.files.insert(ino, s);
        }
        r
    }

    /// The first error writing `ino`'s data since the last call.
    pub fn take_error(&self, ino: u64) -> Result<(), FsError> {
        self.lock().errors.remove(&ino).map_or(Ok(()), Err)
    }

    /// The first error writing any file's data (its other errors go).
    pub fn take_any_error(&self) -> Result<(), FsError> {
        let mut st = self.lock();
        let first = st.errors.keys().next().copied();
        let e = first.and_then(|ino| st.errors.remove(&ino));
        st.errors.clear();
        e.map_or(Ok(()), Err)
    }

    pub fn counts(&self) -> Counts {
        self.lock().counts
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.lock().bytes
    }

    /// The `fs-writeback` thread: writes the oldest files while more than
    /// half the bound is held, until `stop`.
    pub fn run_writer(&self, sink: &dyn Sink) {
        loop {
            let next = {
                let mut st = self.lock();
                loop {
                    if st.stop {
                        return;
                    }
                    if st.bytes > self.writer_at() || self.expired(&mut st) {
                        break;
                    }
                    // Woken by a WRITE passing half the bound, or to look
                    // for expired data again.
                    let (g, _) = self.changed.wait_timeout(st, EXPIRY_CHECK).unwrap_or_else(|p| p.into_inner());
                    st = g;
                }
                Self::oldest(&mut st)
            };
            match next {
                Some(ino) => self.drain(sink, ino),
                None => {
                    // Everything held is being written by others: wait.
                    let st = self.lock();
                    if !st.stop && !st.busy.is_empty() {
                        drop(self.changed.wait(st));
                    }
                }
            }
        }
    }

    /// Held bytes past which the writer thread writes the oldest files:
    /// three quarters of the bound (at half, a PostMark run at full size
    /// dropped 33% of its data and ran 3-22% faster than without holding;
    /// holding more drops more of what is deleted soon after).
    fn writer_at(&self) -> usize {
        self.max / 4 * 3
    }

    /// Whether the oldest file held has held its data past `expire`.
    fn expired(&self, st: &mut State) -> bool {
        while let Some(front) = st.order.front() {
            match st.files.get(front) {
                Some(f) => return f.since.elapsed() >= self.expire,
                None => st.order.pop_front(),
            };
        }
        false
    }

    /// Ends `run_writer`.
    pub fn stop(&self) {
        self.lock().stop = true;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink keeping each file's bytes as written, and every write.
    #[derive(Default)]
    struct Files {
        data: Mutex<HashMap<u64, Vec<u8>>>,
        puts: Mutex<Vec<(u64, u64, usize, bool)>>,
    }

    impl Sink for Files {
        fn put(&self, ino: u64, offset: u64, data: &[u8], keep_times: bool) -> Result<(), FsError> {
            let mut files = self.data.lock().unwrap();
            let f = files.entry(ino).or_default();
            let end = offset as usize + data.len();
            if f.len() < end {
                f.resize(end, 0);
            }
            f[offset as usize..end].copy_from_slice(data);
            self.puts.lock().unwrap().push((ino, offset, data.len(), keep_times));
            Ok(())
        }
    }

    impl Files {
        fn of(&self, ino: u64) -> Vec<u8> {
            self.data.lock().unwrap().get(&ino).cloned().unwrap_or_default()
        }
    }

    #[test]
    fn held_data_is_written_only_when_drained_in_order() {
        let (s, f) = (Staging::new(1 << 20, Duration::MAX), Files::default());
        s.stage(&f, 7, 0, &[1; 2048]);
        s.stage(&f, 7, 2048, &[2; 2048]);
        s.stage(&f, 7, 0, &[3; 100]);
        assert!(f.of(7).is_empty(), "nothing written before a drain");
        assert!(s.holds(7));
        assert_eq!(s.size(7, 0), 4096);
        s.drain(&f, 7);
        let d = f.of(7);
        assert_eq!((d.len(), d[0], d[100], d[2048]), (4096, 3, 1, 2), "later writes win");
        // The two contiguous writes went as one run (they fit one 4 KiB
        // buffer), the overwrite alone.
        assert_eq!(f.puts.lock().unwrap().len(), 2);
        assert!(!s.holds(7));
        assert_eq!(s.counts().written, 4196);
    }

    #[test]
    fn a_freed_file_is_never_written() {
        let (s, f) = (Staging::new(1 << 20, Duration::MAX), Files::default());
        s.stage(&f, 1, 0, &[9; 5000]);
        s.stage(&f, 2, 0, &[8; 300]);
        s.around_free(1, || (), || true);
        // A file that survived the operation keeps its data for later.
        s.around_free(2, || (), || false);
        s.drain_all(&f);
        assert!(f.of(1).is_empty());
        assert_eq!(f.of(2), vec![8; 300]);
        let c = s.counts();
        assert_eq!((c.staged, c.written, c.dropped), (5300, 300, 5000));
    }

    #[test]
    fn the_bound_is_held_by_writing_the_oldest_first() {
        let (s, f) = (Staging::new(64 << 10, Duration::MAX), Files::default());
        for ino in 1..=20 {
            s.stage(&f, ino, 0, &[ino as u8; 8 << 10]);
            assert!(s.held() <= 64 << 10, "held {} over the bound", s.held());
        }
        // 8 files fit; the 12 oldest were written to make room.
        let written: Vec<u64> = f.puts.lock().unwrap().iter().map(|p| p.0).collect();
        assert_eq!(written, (1..=12).collect::<Vec<_>>());
        assert!(s.counts().pressed > 0);
        // A write larger than half the bound goes through at once.
        s.stage(&f, 30, 0, &[5; 40 << 10]);
        assert_eq!(f.of(30).len(), 40 << 10);
    }

    #[test]
    fn times_set_after_data_are_kept_by_its_write() {
        let (s, f) = (Staging::new(1 << 20, Duration::MAX), Files::default());
        s.stage(&f, 4, 0, &[1; 10]);
        s.times_set(4);
        // Data after the times change gets its own stamp, in order after
        // what came before it (not joined to it though contiguous).
        s.stage(&f, 4, 10, &[2; 10]);
        assert!(f.puts.lock().unwrap().is_empty(), "held still");
        s.drain(&f, 4);
        let puts = f.puts.lock().unwrap().clone();
        assert_eq!(puts, vec![(4, 0, 10, true), (4, 10, 10, false)]);
    }

    /// A sink failing every write: the error waits for the file's fsync.
    struct Full;
    impl Sink for Full {
        fn put(&self, _: u64, _: u64, _: &[u8], _: bool) -> Result<(), FsError> {
            Err(FsError::Quota)
        }
    }

    #[test]
    fn a_failed_write_reaches_the_next_fsync_once() {
        let s = Staging::new(1 << 20, Duration::MAX);
        s.stage(&Full, 3, 0, &[1; 10]);
        s.drain(&Full, 3);
        assert!(matches!(s.take_error(3), Err(FsError::Quota)));
        assert!(s.take_error(3).is_ok());
    }

    #[test]
    fn the_writer_thread_and_drains_write_everything_once() {
        let s = Arc::new(Staging::new(64 << 10, Duration::MAX));
        let f = Arc::new(Files::default());
        let (s2, f2) = (s.clone(), f.clone());
        let writer = std::thread::spawn(move || s2.run_writer(&*f2));
        for ino in 1..=6 {
            s.stage(&*f, ino, 0, &[1; 8 << 10]);
        }
        // 48 KiB held, over half of 64: the writer writes the oldest
        // until at most 32 KiB are held. Waiting on the writer, not on
        // time: `drain` returns once the file is written by whoever.
        for ino in 1..=2 {
            s.drain(&*f, ino);
        }
        s.stop();
        writer.join().unwrap();
        s.drain_all(&*f);
        for ino in 1..=6 {
            assert_eq!(f.of(ino), vec![1; 8 << 10]);
        }
        assert_eq!(s.counts().written, 6 * (8 << 10));
    }
}
