//! A modeled spinning disk, for benchmarks only (`tarn serve
//! --bench-disk-model hdd`): the placement seeds (VA, AoDI, VC) measured
//! their trade-offs on disks whose cost is the seek, and this machine has
//! none. The wrapper delays every read and write by what one head would
//! take to get there and transfer it, and lets one request at a time
//! through, the cheapest to reach first (command queueing) and none held
//! in a write cache: a disk with NCQ and its write cache off. The data
//! path is otherwise the wrapped device's.
//!
//! The model is the one the placement replay uses for its read-time
//! estimate (`tarn trace replay`, VC equation 1): a seek of distance d on
//! a device of n bytes costs `min + (full - min) * sqrt(d / n)` plus half a
//! rotation; a forward gap shorter than `read_through` is read through
//! (its bytes are transferred) instead of sought.

use crate::device::Device;
use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The parameters of a modeled disk (microseconds and bytes per second, so
/// the options that carry it stay `Eq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskModel {
    pub seek_min_us: u64,
    pub seek_full_us: u64,
    pub half_rotation_us: u64,
    pub bytes_per_sec: u64,
    /// Forward gaps shorter than this are read through, not sought.
    pub read_through: u64,
}

impl DiskModel {
    /// A 7,200 rpm disk of the seeds' era, at today's transfer rate.
    pub const HDD: DiskModel = DiskModel {
        seek_min_us: 500,
        seek_full_us: 8_000,
        half_rotation_us: 4_170,
        bytes_per_sec: 150_000_000,
        read_through: 256 * 1024,
    };

    /// A model by name (`hdd`), for the CLI.
    pub fn parse(name: &str) -> Option<DiskModel> {
        (name == "hdd").then_some(DiskModel::HDD)
    }

    /// Seconds to move the head `distance` bytes on a device of `size`
    /// bytes, rotation included (0 for no move).
    pub fn seek_secs(&self, distance: u64, size: u64) -> f64 {
        if distance == 0 {
            return 0.0;
        }
        let fraction = (distance as f64 / size.max(1) as f64).min(1.0);
        let span = self.seek_full_us.saturating_sub(self.seek_min_us) as f64;
        (self.seek_min_us as f64 + span * fraction.sqrt() + self.half_rotation_us as f64) / 1e6
    }

    /// Seconds for one request of `len` bytes at `to` with the head at
    /// `head`, on a device of `size` bytes.
    pub fn request_secs(&self, head: u64, to: u64, len: u64, size: u64) -> f64 {
        let rate = self.bytes_per_sec.max(1) as f64;
        let positioning = match to.checked_sub(head) {
            Some(gap) if gap < self.read_through => gap as f64 / rate,
            Some(gap) => self.seek_secs(gap, size),
            None => self.seek_secs(head - to, size),
        };
        positioning + len as f64 / rate
    }
}

/// Counters of a modeled disk.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ModelStats {
    pub requests: u64,
    pub seeks: u64,
    pub busy_secs: f64,
}

/// The head and the requests waiting for it.
struct Head {
    at: u64,
    busy: bool,
    next_ticket: u64,
    /// Waiting requests: ticket -> (offset, when it arrived).
    waiting: BTreeMap<u64, (u64, Instant)>,
    stats: ModelStats,
}

/// A device whose requests take the time [`DiskModel`] says, one at a
/// time, the cheapest to reach first (command queueing, as SATA NCQ
/// does), so that requests issued together by several threads in an
/// order a little off the device's are not each charged a seek.
pub struct ModeledDisk {
    inner: Arc<dyn Device>,
    model: DiskModel,
    head: Mutex<Head>,
    turn: Condvar,
}

/// A waiting request older than this goes next whatever its distance
/// (NCQ's starvation bound).
const MAX_WAIT: Duration = Duration::from_millis(100);

impl ModeledDisk {
    pub fn new(inner: Arc<dyn Device>, model: DiskModel) -> ModeledDisk {
        let head = Head { at: 0, busy: false, next_ticket: 0, waiting: BTreeMap::new(), stats: ModelStats::default() };
        ModeledDisk { inner, model, head: Mutex::new(head), turn: Condvar::new() }
    }

    pub fn stats(&self) -> ModelStats {
        self.head.lock().unwrap_or_else(|e| e.into_inner()).stats
    }

    /// The waiting request that goes next: the oldest if it waited too
    /// long, else the cheapest to reach from the head.
    fn next_up(&self, head: &Head) -> Option<u64> {
        let (&oldest, &(_, since)) = head.waiting.iter().next()?;
        if since.elapsed() >= MAX_WAIT {
            return Some(oldest);
        }
        let cost = |off: u64| self.model.request_secs(head.at, off, 0, self.inner.size());
        let best = head.waiting.iter().min_by(|a, b| cost(a.1 .0).total_cmp(&cost(b.1 .0)).then(a.0.cmp(b.0)));
        best.map(|(&t, _)| t)
    }

    /// Run `op` at `offset` for `len` bytes when the head is ours, taking
    /// at least the modeled time with the head held.
    fn timed<T>(&self, offset: u64, len: u64, op: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let mut head = self.head.lock().unwrap_or_else(|e| e.into_inner());
        let ticket = head.next_ticket;
        head.next_ticket += 1;
        head.waiting.insert(ticket, (offset, Instant::now()));
        while head.busy || self.next_up(&head) != Some(ticket) {
            head = self.turn.wait_timeout(head, MAX_WAIT).unwrap_or_else(|e| e.into_inner()).0;
        }
        head.waiting.remove(&ticket);
        head.busy = true;
        let from = head.at;
        drop(head);
        let secs = self.model.request_secs(from, offset, len, self.inner.size());
        let started = Instant::now();
        let result = op();
        if let Some(left) = Duration::from_secs_f64(secs).checked_sub(started.elapsed()) {
            std::thread::sleep(left);
        }
        let mut head = self.head.lock().unwrap_or_else(|e| e.into_inner());
        let sought = !(from..from.saturating_add(self.model.read_through)).contains(&offset);
        head.stats.requests += 1;
        head.stats.seeks += u64::from(sought);
        head.stats.busy_secs += secs;
        head.at = offset.saturating_add(len);
        head.busy = false;
        self.turn.notify_all();
        result
    }
}

impl Device for ModeledDisk {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let len = buf.len() as u64;
        self.timed(offset, len, || self.inner.read_at(buf, offset))
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.timed(offset, data.len() as u64, || self.inner.write_at(data, offset))
    }

    /// No write cache is modeled: every write was on the platter already.
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.discard(offset, len)
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn name(&self) -> String {
        self.inner.name()
    }

    fn copies(&self) -> usize {
        self.inner.copies()
    }

    fn read_copy(&self, copy: usize, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let len = buf.len() as u64;
        self.timed(offset, len, || self.inner.read_copy(copy, buf, offset))
    }

    fn write_copy(&self, copy: usize, data: &[u8], offset: u64) -> io::Result<()> {
        self.timed(offset, data.len() as u64, || self.inner.write_copy(copy, data, offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mem_device::MemDevice;
    use std::sync::Arc;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_seek_costs_more_with_distance_and_sequential_costs_only_transfer() {
        let m = DiskModel::HDD;
        let near = m.request_secs(0, GIB / 100, 4096, GIB);
        let far = m.request_secs(0, GIB - 4096, 4096, GIB);
        assert!(far > near, "{far} <= {near}");
        assert!((far - (8.0e-3 + 4.17e-3 + 4096.0 / 150e6)).abs() < 1e-4, "{far}");
        let next = m.request_secs(4096, 4096, 4096, GIB);
        assert!((next - 4096.0 / 150e6).abs() < 1e-12, "{next}");
        let back = m.request_secs(8192, 4096, 4096, GIB);
        assert!(back > 4e-3, "a step back is a seek: {back}");
    }

    #[test]
    fn the_wrapper_counts_seeks_and_keeps_the_data() {
        let fast = DiskModel { seek_min_us: 1, seek_full_us: 2, half_rotation_us: 1, ..DiskModel::HDD };
        let disk = ModeledDisk::new(Arc::new(MemDevice::new("m", 1 << 20, 1)), fast);
        disk.write_at(&[7u8; 4096], 0).unwrap();
        disk.write_at(&[8u8; 4096], 4096).unwrap();
        disk.write_at(&[9u8; 4096], 900 * 1024).unwrap();
        let mut buf = [0u8; 4096];
        disk.read_at(&mut buf, 4096).unwrap();
        assert_eq!(buf, [8u8; 4096]);
        let s = disk.stats();
        assert_eq!((s.requests, s.seeks), (4, 2), "{s:?}");
    }

    #[test]
    fn requests_queued_together_go_in_the_order_cheapest_to_reach() {
        let disk = Arc::new(ModeledDisk::new(Arc::new(MemDevice::new("m", 1 << 30, 1)), DiskModel::HDD));
        disk.write_at(&[1u8; 4096], 512 << 20).unwrap();
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let disk = disk.clone();
                std::thread::spawn(move || {
                    for i in 0..16u64 {
                        disk.write_at(&[2u8; 4096], (i * 8 + t) * 4096).unwrap();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let s = disk.stats();
        // Arrival order would seek about every other request (a step back
        // is a seek); taken cheapest first, the 8 streams merge into one
        // forward sweep that seeks only when a request arrives behind it.
        assert!(s.seeks <= 12, "{s:?}");
        assert_eq!(s.requests, 129);
    }
}
