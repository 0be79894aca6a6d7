//! `Pool::io_gate` held shared, counted by kind, so a snapshot of one
//! file object can skip draining every write in the pool.
//!
//! Why: a snapshot takes the gate exclusively to drain the writes planned
//! against the old epoch, one of which could overwrite in place a block
//! the snapshot now shows. Only writes to the snapshotted volume can.
//! With tarn-fs's write-behind thread streaming other files' data, every
//! close version and every first write after a volume snapshot waited
//! for that thread's transfer in flight (2.7 s of a versioned PostMark
//! run). A plain write counts itself in its volume's slot (hashed, so a
//! slot may count several volumes: only ever too many); every other
//! holder of the gate that may write (relayout, scrub, rebuild, parity,
//! a checksum split) counts as "other". A snapshot that finds, under the
//! pool lock (no write is then between its plan and its count), neither
//! an other holder nor a write in its volume's slot applies at once: any
//! write planned later sees the snapshot.

use crate::pool::Pool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLockReadGuard;

/// Slots of per-volume write counts: any 1,024 consecutive volume ids
/// have a slot each. With 64, a tarn-fs file's tag (its first change
/// after a volume snapshot, its delete) found the write-behind thread's
/// write to another object in its slot once in 64, and waited 0.3-0.6 s
/// for it on a busy disk: one or two stalled requests per PostMark run
/// with snapshots (a scratch timer: "others 0, slot 1, 348 ms").
pub(crate) const SLOTS: usize = 1024;

pub(crate) struct GateCounts {
    others: AtomicUsize,
    writes: [AtomicUsize; SLOTS],
}

impl Default for GateCounts {
    fn default() -> Self {
        GateCounts { others: AtomicUsize::new(0), writes: std::array::from_fn(|_| AtomicUsize::new(0)) }
    }
}

/// The gate held shared, with its count; both go when dropped.
pub(crate) struct GateShared<'a> {
    _guard: RwLockReadGuard<'a, ()>,
    count: &'a AtomicUsize,
}

impl Drop for GateShared<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

fn slot(vol: u32) -> usize {
    (vol as usize).wrapping_mul(0x9e37_79b9) % SLOTS
}

impl Pool {
    fn gate_counted<'a>(&'a self, count: &'a AtomicUsize) -> GateShared<'a> {
        let guard = self.io_gate.read().unwrap_or_else(|p| p.into_inner());
        // Counted before the holder plans anything (under the pool lock).
        count.fetch_add(1, Ordering::SeqCst);
        GateShared { _guard: guard, count }
    }

    /// The gate for I/O that may write blocks of any volume.
    pub(crate) fn gate_shared(&self) -> GateShared<'_> {
        self.gate_counted(&self.gate_counts.others)
    }

    /// The gate for a plain write to `vol`.
    pub(crate) fn gate_for_write(&self, vol: u32) -> GateShared<'_> {
        self.gate_counted(&self.gate_counts.writes[slot(vol)])
    }

    /// Whether no holder of the gate may be writing `vol`'s blocks: call
    /// it holding the pool lock for writing, so none plans meanwhile.
    pub(crate) fn quiet_for(&self, vol: u32) -> bool {
        let c = &self.gate_counts;
        c.others.load(Ordering::SeqCst) == 0 && c.writes[slot(vol)].load(Ordering::SeqCst) == 0
    }

    /// The pool lock for a change that must not race a write planned
    /// against `vol`'s old map (a snapshot of it, a shrink freeing its
    /// tail): taken at once when none can be in flight (`quiet_for`),
    /// else after draining every write (the gate held exclusively, and
    /// returned with it). Lock order: the gate before the pool lock.
    pub(crate) fn write_inner_quiet_for(&self, vol: u32) -> (Option<GateExclusive<'_>>, InnerWrite<'_>) {
        let inner = self.write_inner();
        if self.quiet_for(vol) {
            return (None, inner);
        }
        drop(inner);
        let quiet = self.io_gate.write().unwrap_or_else(|p| p.into_inner());
        (Some(quiet), self.write_inner())
    }
}

/// The gate held exclusively: no I/O planned against an older map is in flight.
pub(crate) type GateExclusive<'a> = std::sync::RwLockWriteGuard<'a, ()>;
/// The pool lock held for writing.
pub(crate) type InnerWrite<'a> = crate::pool::Held<std::sync::RwLockWriteGuard<'a, crate::pool::Inner>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mem_device::MemDevice;
    use crate::{create_pool, CreateOptions, Device, OpenOptions};
    use std::sync::Arc;

    fn pool() -> Pool {
        let dev: Vec<Arc<dyn Device>> = vec![Arc::new(MemDevice::new("m", 64 << 20, 1))];
        create_pool(&dev, &["m".into()], &CreateOptions::default()).unwrap();
        Pool::open(dev, OpenOptions::default()).unwrap()
    }

    /// A write in flight to one volume keeps a snapshot of it from the
    /// fast path, not one of a volume in another slot; any other holder
    /// of the gate keeps every snapshot from it.
    #[test]
    fn only_writes_to_the_volume_or_other_holders_stop_the_fast_path() {
        let p = pool();
        let (x, y) = (5u32, 6u32);
        assert_ne!(slot(x), slot(y));
        assert!(p.quiet_for(x) && p.quiet_for(y));
        let w = p.gate_for_write(x);
        assert!(!p.quiet_for(x), "a write to x is in flight");
        assert!(p.quiet_for(y), "a write to x does not touch y");
        drop(w);
        assert!(p.quiet_for(x));
        let other = p.gate_shared();
        assert!(!p.quiet_for(x) && !p.quiet_for(y), "a relayout or scrub may write anything");
        drop(other);
        assert!(p.quiet_for(x) && p.quiet_for(y));
    }

    /// Neighbouring objects (tarn-fs makes them in order) never share a
    /// slot, so a write to one never holds up a tag of another.
    #[test]
    fn consecutive_volumes_have_slots_of_their_own() {
        const WINDOW: u32 = 1024;
        for base in [0u32, 1, 5_000, u32::MAX - WINDOW] {
            let slots: std::collections::HashSet<usize> = (base..base + WINDOW).map(slot).collect();
            assert_eq!(slots.len(), WINDOW as usize, "ids from {base}");
        }
    }

    /// A change to y (a snapshot, a shrink) takes the pool lock without
    /// the gate while a write to x is in flight; one to x drains it (the
    /// write, held by another thread for 50 ms, must have ended first).
    #[test]
    fn a_change_drains_only_writes_that_may_touch_its_volume() {
        let p = pool();
        let (x, y) = (5u32, 6u32);
        let (held, release) = (std::sync::Barrier::new(2), std::time::Duration::from_millis(50));
        std::thread::scope(|s| {
            s.spawn(|| {
                let _w = p.gate_for_write(x);
                held.wait();
                std::thread::sleep(release);
            });
            // Before the barrier: the write is released at least 50 ms
            // after it, however late either thread runs past it.
            let started = std::time::Instant::now();
            held.wait();
            let (gate, inner) = p.write_inner_quiet_for(y);
            assert!(gate.is_none(), "y is quiet: no drain");
            drop(inner);
            let (gate, _inner) = p.write_inner_quiet_for(x);
            assert!(gate.is_some(), "x drained through the gate");
            assert!(started.elapsed() >= release, "did not wait for the write to x");
        });
    }
}
