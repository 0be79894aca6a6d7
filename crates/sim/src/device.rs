//! A simulated device with a volatile write cache, crash and fault
//! injection. Reads see every write; a crash keeps what was flushed plus a
//! random subset of unflushed writes, and may tear one at sector granularity.
//!
//! Faults besides crashes, all deterministic (a rate draws from its own
//! seeded generator): bit rot of stored bytes ([`SimDevice::flip_bit`]),
//! bit flips in what a read returns while the stored bytes stay good
//! ([`SimDevice::flip_on_read`]), read and write errors on ranges or at a
//! rate, misdirected and lost writes ([`SimDevice::fault_write`]). Every
//! fault that fires is logged ([`SimDevice::events`]), and the device keeps
//! what each damaged 4 KiB block should hold ([`SimDevice::damage`]) until a
//! later write makes it right again, so a test knows exactly which blocks a
//! fault left wrong and can demand that each one is detected.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::io;
use std::sync::Mutex;
use tarn_engine::Device;

pub const SECTOR: usize = 512;
/// Granularity of the damage record (the engine's block).
pub const DAMAGE_BLOCK: usize = 4096;

/// Which write a one-shot write fault hits: the (`skip` + 1)-th write call
/// that overlaps `[lo, hi)` (byte offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteTarget {
    pub lo: u64,
    pub hi: u64,
    pub skip: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFault {
    /// The data lands at byte offset `to` instead (clamped to the device);
    /// the intended range keeps its old content. The write succeeds.
    Misdirect { to: u64 },
    /// The write succeeds but reaches neither the cache nor the medium:
    /// reads keep returning the old content, a flush does not help.
    Lost,
}

/// A fault that fired, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultEvent {
    Rot { offset: u64, bit: u8 },
    ReadFlip { offset: u64, bit: u8 },
    ReadError { offset: u64, len: usize },
    WriteError { offset: u64, len: usize },
    Misdirected { offset: u64, len: usize, to: u64 },
    Lost { offset: u64, len: usize },
}

#[derive(Debug, Clone)]
struct ReadFlip {
    offset: u64,
    bit: u8,
    /// Reads left to corrupt; `None`: every read (a sticky fault).
    left: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
struct BadRange {
    lo: u64,
    hi: u64,
    reads: bool,
    writes: bool,
}

struct ErrorRate {
    read: f64,
    write: f64,
    rng: ChaCha8Rng,
}

fn overlaps(off: u64, len: usize, lo: u64, hi: u64) -> bool {
    off < hi && off + len as u64 > lo
}

struct State {
    /// What a crash cannot take away.
    durable: Vec<u8>,
    /// What reads return: durable plus unflushed writes.
    cache: Vec<u8>,
    /// Unflushed writes in issue order.
    pending: Vec<(u64, Vec<u8>)>,
    /// Device calls (writes and flushes) left before the simulated power
    /// cut; after it every call fails until `crash` is applied.
    calls_left: Option<u64>,
    dead: bool,
    /// Injected media errors: reads / writes and flushes fail (until cleared).
    fail_reads: bool,
    fail_writes: bool,
    read_flips: Vec<ReadFlip>,
    bad: Vec<BadRange>,
    rate: Option<ErrorRate>,
    write_faults: Vec<(WriteTarget, WriteFault)>,
    events: Vec<FaultEvent>,
    /// Reads return the intended content of damaged blocks (a device that
    /// hides damage: negative controls only).
    repair_reads: bool,
    /// A flush answers but makes nothing durable (a device that lies about
    /// its cache: negative controls only).
    ignore_flushes: bool,
    /// Blocks (by index) whose cached content a fault made wrong, with what
    /// they should hold; a block leaves when its content is right again.
    damage: BTreeMap<u64, Vec<u8>>,
}

impl State {
    /// `[off, off + want.len())` should hold `want`: record it for every
    /// block it touches (the blocks' current content elsewhere).
    fn expect(&mut self, off: usize, want: &[u8]) {
        for b in off / DAMAGE_BLOCK..(off + want.len()).div_ceil(DAMAGE_BLOCK) {
            let base = b * DAMAGE_BLOCK;
            let cache = &self.cache;
            let entry = self.damage.entry(b as u64).or_insert_with(|| cache[base..base + DAMAGE_BLOCK].to_vec());
            let (from, to) = (off.max(base), (off + want.len()).min(base + DAMAGE_BLOCK));
            entry[from - base..to - base].copy_from_slice(&want[from - off..to - off]);
        }
    }

    /// `[off, off+len)` should keep what it holds now (a fault is about to
    /// change it); blocks already recorded keep their record.
    fn keep(&mut self, off: usize, len: usize) {
        for b in off / DAMAGE_BLOCK..(off + len).div_ceil(DAMAGE_BLOCK) {
            let base = b * DAMAGE_BLOCK;
            let cache = &self.cache;
            self.damage.entry(b as u64).or_insert_with(|| cache[base..base + DAMAGE_BLOCK].to_vec());
        }
    }

    /// A correct write: recorded blocks it touches should hold its data too.
    fn expect_if_damaged(&mut self, off: usize, data: &[u8]) {
        let (first, end) = (off / DAMAGE_BLOCK, (off + data.len()).div_ceil(DAMAGE_BLOCK));
        let hit: Vec<u64> = self.damage.range(first as u64..end as u64).map(|(&b, _)| b).collect();
        for b in hit {
            let base = b as usize * DAMAGE_BLOCK;
            let entry = self.damage.get_mut(&b).expect("listed above");
            let (from, to) = (off.max(base), (off + data.len()).min(base + DAMAGE_BLOCK));
            entry[from - base..to - base].copy_from_slice(&data[from - off..to - off]);
        }
    }

    /// Forget recorded blocks of `[off, off+len)` whose content is right.
    fn settle(&mut self, off: usize, len: usize) {
        let (first, end) = (off / DAMAGE_BLOCK, (off + len).div_ceil(DAMAGE_BLOCK));
        let cache = &self.cache;
        self.damage.retain(|&b, want| {
            let base = b as usize * DAMAGE_BLOCK;
            !((first..end).contains(&(b as usize)) && cache[base..base + DAMAGE_BLOCK] == want[..])
        });
    }

    fn overlay_intended(&self, buf: &mut [u8], off: usize) {
        let (first, end) = (off / DAMAGE_BLOCK, (off + buf.len()).div_ceil(DAMAGE_BLOCK));
        for (&b, want) in self.damage.range(first as u64..end as u64) {
            let base = b as usize * DAMAGE_BLOCK;
            let (from, to) = (off.max(base), (off + buf.len()).min(base + DAMAGE_BLOCK));
            buf[from - off..to - off].copy_from_slice(&want[from - base..to - base]);
        }
    }

    fn write_cache(&mut self, off: usize, data: &[u8]) {
        self.cache[off..off + data.len()].copy_from_slice(data);
        self.pending.push((off as u64, data.to_vec()));
    }

    fn rate_fails(&mut self, write: bool) -> bool {
        match self.rate.as_mut() {
            Some(r) => {
                let p = if write { r.write } else { r.read };
                p > 0.0 && r.rng.random_bool(p)
            }
            None => false,
        }
    }
}

pub struct SimDevice {
    name: String,
    /// A write of at least this many bytes sleeps one millisecond first
    /// (0: none): a slow device, so work queued behind it lags.
    slow_writes_from: std::sync::atomic::AtomicUsize,
    /// A write of at least this many bytes fails (0: none).
    failed_writes_from: std::sync::atomic::AtomicUsize,
    /// Grows (`Device::grow`): the new bytes are zero and durable at once.
    size: std::sync::atomic::AtomicU64,
    state: Mutex<State>,
    /// Flushes wait while it is held (`hold_flushes`): a commit in
    /// flight for as long as a test wants.
    flush_gate: Mutex<FlushGate>,
    flush_released: std::sync::Condvar,
}

#[derive(Default)]
struct FlushGate {
    held: bool,
    /// Flushes waiting at the gate now.
    waiting: usize,
}

/// How long a flush waits at a held gate at most (then it goes on, so a
/// test that forgot to let it go ends).
const FLUSH_HOLD_MAX: std::time::Duration = std::time::Duration::from_secs(60);

fn dead() -> io::Error {
    io::Error::other("simulated power loss")
}

impl SimDevice {
    pub fn new(name: &str, size: u64) -> SimDevice {
        let image = vec![0u8; size as usize];
        SimDevice {
            name: name.to_string(),
            slow_writes_from: std::sync::atomic::AtomicUsize::new(0),
            failed_writes_from: std::sync::atomic::AtomicUsize::new(0),
            size: std::sync::atomic::AtomicU64::new(size),
            flush_gate: Mutex::new(FlushGate::default()),
            flush_released: std::sync::Condvar::new(),
            state: Mutex::new(State {
                durable: image.clone(),
                cache: image,
                pending: Vec::new(),
                calls_left: None,
                dead: false,
                fail_reads: false,
                fail_writes: false,
                read_flips: Vec::new(),
                bad: Vec::new(),
                rate: None,
                write_faults: Vec::new(),
                events: Vec::new(),
                damage: BTreeMap::new(),
                repair_reads: false,
                ignore_flushes: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Negative controls: flushes answer without making anything durable.
    pub fn ignore_flushes(&self) {
        self.lock().ignore_flushes = true;
    }

    /// From now on every flush waits until `release_flushes` (at most a
    /// minute): the commit making it stays in flight.
    pub fn hold_flushes(&self) {
        self.flush_gate.lock().unwrap_or_else(|p| p.into_inner()).held = true;
    }

    pub fn release_flushes(&self) {
        self.flush_gate.lock().unwrap_or_else(|p| p.into_inner()).held = false;
        self.flush_released.notify_all();
    }

    /// Flushes waiting at the held gate now.
    pub fn flushes_waiting(&self) -> usize {
        self.flush_gate.lock().unwrap_or_else(|p| p.into_inner()).waiting
    }

    fn wait_at_flush_gate(&self) {
        let mut g = self.flush_gate.lock().unwrap_or_else(|p| p.into_inner());
        g.waiting += 1;
        let (mut g, _) =
            self.flush_released.wait_timeout_while(g, FLUSH_HOLD_MAX, |g| g.held).unwrap_or_else(|p| p.into_inner());
        g.waiting -= 1;
    }

    /// Writes of at least `bytes` (0: none) take a millisecond each, as
    /// on a slow disk (data lags behind whoever queued it).
    pub fn slow_writes_from(&self, bytes: usize) {
        self.slow_writes_from.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Writes of at least `bytes` (0: none) fail: data writes, not the
    /// small metadata ones.
    pub fn fail_writes_from(&self, bytes: usize) {
        self.failed_writes_from.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Cut the power after `calls` more writes or flushes.
    pub fn crash_after(&self, calls: u64) {
        self.lock().calls_left = Some(calls);
    }

    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// Apply the crash: keep a random subset of unflushed writes (in order),
    /// tearing some at sector granularity, and power back on.
    pub fn crash(&self, rng: &mut ChaCha8Rng) {
        let mut s = self.lock();
        let pending = std::mem::take(&mut s.pending);
        // The cache differs from the durable image only where unflushed
        // writes went: resetting those ranges afterwards is enough (and
        // much cheaper than copying the device).
        let touched: Vec<(usize, usize)> = pending.iter().map(|(off, d)| (*off as usize, d.len())).collect();
        for (off, data) in pending {
            let roll = rng.random_range(0..10);
            if roll < 4 {
                continue; // lost
            }
            let off = off as usize;
            if roll < 8 || data.len() <= SECTOR {
                s.durable[off..off + data.len()].copy_from_slice(&data);
                continue;
            }
            for (i, sector) in data.chunks(SECTOR).enumerate() {
                if rng.random_bool(0.5) {
                    let at = off + i * SECTOR;
                    s.durable[at..at + sector.len()].copy_from_slice(sector);
                }
            }
        }
        let State { durable, cache, .. } = &mut *s;
        for (at, len) in touched {
            cache[at..at + len].copy_from_slice(&durable[at..at + len]);
        }
        s.calls_left = None;
        s.dead = false;
        // What a crash took away was never promised: only rot, lost and
        // misdirected writes on the medium stay recorded as damage.
        let size = s.cache.len();
        s.settle(0, size);
    }

    /// Flip one bit of durable and cached content: rot of the stored bytes
    /// (flipping it again undoes it).
    pub fn flip_bit(&self, offset: u64, bit: u8) {
        let mut s = self.lock();
        s.keep(offset as usize, 1);
        s.durable[offset as usize] ^= 1 << (bit % 8);
        s.cache[offset as usize] ^= 1 << (bit % 8);
        s.events.push(FaultEvent::Rot { offset, bit: bit % 8 });
        s.settle(offset as usize, 1);
    }

    /// Flip `bit` of the byte at `offset` in what reads return, for the next
    /// `times` reads covering it (`None`: every read until cleared); the
    /// stored bytes stay good (a transient fault on the way, not rot).
    pub fn flip_on_read(&self, offset: u64, bit: u8, times: Option<u32>) {
        self.lock().read_flips.push(ReadFlip { offset, bit: bit % 8, left: times });
    }

    /// Reads and/or writes overlapping `[offset, offset+len)` fail with an
    /// I/O error (content is kept) until [`SimDevice::clear_faults`].
    pub fn fail_range(&self, offset: u64, len: u64, reads: bool, writes: bool) {
        self.lock().bad.push(BadRange { lo: offset, hi: offset + len, reads, writes });
    }

    /// Every read / write call fails with these probabilities, drawn from a
    /// generator seeded with `seed` (so a run replays); 0.0 turns one off.
    pub fn fail_at_rate(&self, read: f64, write: f64, seed: u64) {
        self.lock().rate = Some(ErrorRate { read, write, rng: ChaCha8Rng::seed_from_u64(seed) });
    }

    /// Arm a one-shot misdirected or lost write (see [`WriteTarget`]).
    pub fn fault_write(&self, target: WriteTarget, fault: WriteFault) {
        self.lock().write_faults.push((target, fault));
    }

    /// Disarm every fault not yet fired (read flips, failing ranges and
    /// rates, armed write faults, `fail_io`); damage already done stays.
    pub fn clear_faults(&self) {
        let mut s = self.lock();
        s.read_flips.clear();
        s.bad.clear();
        s.rate = None;
        s.write_faults.clear();
        s.fail_reads = false;
        s.fail_writes = false;
    }

    /// Armed write faults that have not fired yet.
    pub fn armed_write_faults(&self) -> usize {
        self.lock().write_faults.len()
    }

    /// Faults that fired, in order.
    pub fn events(&self) -> Vec<FaultEvent> {
        self.lock().events.clone()
    }

    /// Blocks (byte offset, 4 KiB) whose content is wrong because of a
    /// fault, each with the content it should have; a block drops out once
    /// a write makes it right. Only rot, misdirected and lost writes damage.
    pub fn damage(&self) -> Vec<(u64, Vec<u8>)> {
        self.lock().damage.iter().map(|(&b, want)| (b * DAMAGE_BLOCK as u64, want.clone())).collect()
    }

    /// Read what the medium should hold if no fault had hit it (damaged
    /// blocks give their intended content).
    pub fn read_intended(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let s = self.lock();
        let off = offset as usize;
        buf.copy_from_slice(&s.cache[off..off + buf.len()]);
        s.overlay_intended(buf, off);
        Ok(())
    }

    /// What the device holds now, whatever faults are armed (for tests).
    pub fn read_stored(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let s = self.lock();
        buf.copy_from_slice(&s.cache[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    /// Make every read return the intended content of damaged blocks: a
    /// device that hides damage, so that negative controls can show the
    /// checks fail when damage goes unseen.
    pub fn repair_reads(&self, on: bool) {
        self.lock().repair_reads = on;
    }

    /// Make reads and/or writes (and flushes) fail with an I/O error, like a
    /// dying disk; `(false, false)` heals it. Content is kept.
    pub fn fail_io(&self, reads: bool, writes: bool) {
        let mut s = self.lock();
        s.fail_reads = reads;
        s.fail_writes = writes;
    }

    fn tick(s: &mut State) -> io::Result<()> {
        if s.fail_writes {
            return Err(io::Error::other("injected write error"));
        }
        if s.dead {
            return Err(dead());
        }
        if let Some(n) = s.calls_left.as_mut() {
            if *n == 0 {
                s.dead = true;
                return Err(dead());
            }
            *n -= 1;
        }
        Ok(())
    }

    fn check(&self, off: u64, len: usize) -> io::Result<()> {
        match off.checked_add(len as u64) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} I/O at {off}+{len} past end {}", self.name, self.size()),
            )),
        }
    }
}

impl Device for SimDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let mut s = self.lock();
        if s.dead {
            return Err(dead());
        }
        if s.fail_reads {
            return Err(io::Error::other("injected read error"));
        }
        let len = buf.len();
        let bad = s.bad.iter().any(|r| r.reads && overlaps(offset, len, r.lo, r.hi));
        if bad || s.rate_fails(false) {
            s.events.push(FaultEvent::ReadError { offset, len });
            return Err(io::Error::other(format!("injected read error at {offset}+{len}")));
        }
        buf.copy_from_slice(&s.cache[offset as usize..offset as usize + len]);
        if s.repair_reads {
            s.overlay_intended(buf, offset as usize);
        }
        let State { read_flips, events, .. } = &mut *s;
        for f in read_flips.iter_mut().filter(|f| overlaps(offset, len, f.offset, f.offset + 1)) {
            buf[(f.offset - offset) as usize] ^= 1 << f.bit;
            events.push(FaultEvent::ReadFlip { offset: f.offset, bit: f.bit });
            if let Some(n) = f.left.as_mut() {
                *n -= 1;
            }
        }
        read_flips.retain(|f| f.left != Some(0));
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.check(offset, data.len())?;
        let slow = self.slow_writes_from.load(std::sync::atomic::Ordering::Relaxed);
        if slow > 0 && data.len() >= slow {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let failing = self.failed_writes_from.load(std::sync::atomic::Ordering::Relaxed);
        if failing > 0 && data.len() >= failing {
            return Err(io::Error::other(format!("injected write error at {offset}+{}", data.len())));
        }
        let mut s = self.lock();
        Self::tick(&mut s)?;
        let (off, len) = (offset as usize, data.len());
        let bad = s.bad.iter().any(|r| r.writes && overlaps(offset, len, r.lo, r.hi));
        if bad || s.rate_fails(true) {
            s.events.push(FaultEvent::WriteError { offset, len });
            return Err(io::Error::other(format!("injected write error at {offset}+{len}")));
        }
        let mut fired = None;
        for (i, (t, _)) in s.write_faults.iter_mut().enumerate() {
            if overlaps(offset, len, t.lo, t.hi) {
                if t.skip == 0 {
                    fired = Some(i);
                    break;
                }
                t.skip -= 1;
            }
        }
        match fired.map(|i| s.write_faults.remove(i).1) {
            None => {
                s.expect_if_damaged(off, data);
                s.write_cache(off, data);
                s.settle(off, len);
            }
            Some(WriteFault::Lost) => {
                s.expect(off, data);
                s.events.push(FaultEvent::Lost { offset, len });
                s.settle(off, len);
            }
            Some(WriteFault::Misdirect { to }) => {
                let to = to.min(self.size() - len as u64) as usize;
                s.expect(off, data);
                s.keep(to, len);
                s.write_cache(to, data);
                s.events.push(FaultEvent::Misdirected { offset, len, to: to as u64 });
                s.settle(off, len);
                s.settle(to, len);
            }
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.wait_at_flush_gate();
        let mut s = self.lock();
        Self::tick(&mut s)?;
        if s.ignore_flushes {
            return Ok(());
        }
        let pending = std::mem::take(&mut s.pending);
        for (off, data) in pending {
            s.durable[off as usize..off as usize + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        // Modelled as a write of zeros: discarding live data shows up as loss.
        self.write_at(&vec![0u8; len as usize], offset)
    }

    fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }

    fn grow(&self, size: u64) -> io::Result<()> {
        let mut s = self.lock();
        Self::tick(&mut s)?;
        if size > self.size() {
            s.durable.resize(size as usize, 0);
            s.cache.resize(size as usize, 0);
            self.size.store(size, std::sync::atomic::Ordering::Release);
        }
        Ok(())
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}
