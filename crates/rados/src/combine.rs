//! Write combining. Every RADOS operation costs the OSD about the same
//! whatever its size up to tens of KiB (a PG lock, a transaction, a
//! reply), and tarn's placement puts concurrent small writes next to
//! each other, mostly in one 4 MiB object. So small writes that arrive
//! while `MAX_BATCHES` batches are already in flight wait in a queue, and
//! the next free sender takes the whole queue and sends it as one
//! operation per object (`Op::WriteMany`). At low load nothing waits: a
//! write goes at once, alone, as before. Under load the batch grows with
//! the queue, like a group commit.
//!
//! Each write still returns only once its own operation completed, so a
//! caller's view is unchanged: durable on return, an error if its
//! operation failed. Writes in one batch are in flight together, as
//! concurrent calls already were, so their relative order is not a
//! promise; to one object they are applied in queue order anyway (RADOS
//! applies one client's operations on an object in submission order).

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Writes this size or larger go alone, uncopied: their operation cost is
/// already small next to their bytes.
pub const MAX_COMBINED_WRITE: usize = 64 << 10;
/// Batches in flight at once before new writes queue.
const MAX_BATCHES: usize = 4;
/// The most writes one batch takes: bounds one operation's size.
const MAX_BATCH_WRITES: usize = 256;

/// One queued write: a copy of its bytes, where they go, and the ticket
/// its caller waits on.
pub struct Queued {
    pub object: u64,
    pub offset: u64,
    pub data: Vec<u8>,
    ticket: u64,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    in_flight: usize,
    next_ticket: u64,
    /// Results of finished writes, until their callers take them. Holds
    /// at most one entry per waiting caller.
    results: HashMap<u64, i32>,
}

#[derive(Default)]
pub struct Combiner {
    state: Mutex<State>,
    done: Condvar,
}

impl Combiner {
    /// Write `data` at `offset` of `object` through `send`, which sends a
    /// batch and returns one result per write (0 or a negative errno).
    /// Returns this write's result once its batch has completed.
    pub fn write(&self, object: u64, offset: u64, data: &[u8], send: &dyn Fn(&[Queued]) -> Vec<i32>) -> i32 {
        let mut st = self.lock();
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.queue.push_back(Queued { object, offset, data: data.to_vec(), ticket });
        loop {
            if let Some(rc) = st.results.remove(&ticket) {
                return rc;
            }
            if st.in_flight < MAX_BATCHES && !st.queue.is_empty() {
                st = self.send_queue(st, send);
                continue;
            }
            st = self.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Take up to `MAX_BATCH_WRITES` queued writes, send them without the
    /// lock, record their results and wake the waiters.
    fn send_queue<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        send: &dyn Fn(&[Queued]) -> Vec<i32>,
    ) -> MutexGuard<'a, State> {
        st.in_flight += 1;
        let n = st.queue.len().min(MAX_BATCH_WRITES);
        let batch: Vec<Queued> = st.queue.drain(..n).collect();
        drop(st);
        let rcs = send(&batch);
        debug_assert_eq!(rcs.len(), batch.len(), "one result per write");
        let mut st = self.lock();
        st.in_flight -= 1;
        for (i, q) in batch.iter().enumerate() {
            // A sender that returned too few results fails the rest.
            st.results.insert(q.ticket, rcs.get(i).copied().unwrap_or(-libc::EIO));
        }
        self.done.notify_all();
        st
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::Duration;

    /// A sender that takes 2 ms per batch and answers each write with its
    /// own offset, so a result handed to the wrong caller shows.
    fn slow_echo<'a>(batches: &'a AtomicUsize, largest: &'a AtomicUsize) -> impl Fn(&[Queued]) -> Vec<i32> + 'a {
        move |b: &[Queued]| {
            batches.fetch_add(1, Ordering::SeqCst);
            largest.fetch_max(b.len(), Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(2));
            b.iter().map(|q| q.offset as i32).collect()
        }
    }

    #[test]
    fn a_lone_write_goes_at_once_alone() {
        let c = Combiner::default();
        let (batches, largest) = (AtomicUsize::new(0), AtomicUsize::new(0));
        assert_eq!(c.write(3, 4096, &[1; 4096], &slow_echo(&batches, &largest)), 4096);
        assert_eq!((batches.load(Ordering::SeqCst), largest.load(Ordering::SeqCst)), (1, 1));
    }

    #[test]
    fn concurrent_writes_are_combined_and_each_gets_its_own_result() {
        const THREADS: usize = 16;
        const WRITES: usize = 40;
        let c = Arc::new(Combiner::default());
        let counts = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let start = Arc::new(Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (c, counts, start) = (c.clone(), counts.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for w in 0..WRITES {
                        let offset = ((t * WRITES + w) * 4096) as u64;
                        let rc = c.write(0, offset, &[t as u8; 4096], &slow_echo(&counts.0, &counts.1));
                        assert_eq!(rc, offset as i32, "thread {t} write {w} got another write's result");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("writer thread");
        }
        let batches = counts.0.load(Ordering::SeqCst);
        // 16 writers and at most 4 batches in flight: writes must queue
        // and be sent together.
        assert!(batches < THREADS * WRITES, "{batches} batches for {} writes: nothing combined", THREADS * WRITES);
        assert!(counts.1.load(Ordering::SeqCst) > 1);
        let st = c.lock();
        assert!(st.queue.is_empty() && st.results.is_empty() && st.in_flight == 0);
    }
}
