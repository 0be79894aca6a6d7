//! A simulated device with a volatile write cache, crash and fault
//! injection. Reads see every write; a crash keeps what was flushed plus a
//! random subset of unflushed writes, and may tear one at sector granularity.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::io;
use std::sync::Mutex;
use tarn_engine::Device;

pub const SECTOR: usize = 512;

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
}

pub struct SimDevice {
    name: String,
    size: u64,
    state: Mutex<State>,
}

fn dead() -> io::Error {
    io::Error::other("simulated power loss")
}

impl SimDevice {
    pub fn new(name: &str, size: u64) -> SimDevice {
        let image = vec![0u8; size as usize];
        SimDevice {
            name: name.to_string(),
            size,
            state: Mutex::new(State {
                durable: image.clone(),
                cache: image,
                pending: Vec::new(),
                calls_left: None,
                dead: false,
                fail_reads: false,
                fail_writes: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
    }

    /// Flip one bit of durable and cached content (fault injection).
    pub fn flip_bit(&self, offset: u64, bit: u8) {
        let mut s = self.lock();
        s.durable[offset as usize] ^= 1 << (bit % 8);
        s.cache[offset as usize] ^= 1 << (bit % 8);
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
            Some(end) if end <= self.size => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} I/O at {off}+{len} past end {}", self.name, self.size),
            )),
        }
    }
}

impl Device for SimDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(offset, buf.len())?;
        let s = self.lock();
        if s.dead {
            return Err(dead());
        }
        if s.fail_reads {
            return Err(io::Error::other("injected read error"));
        }
        buf.copy_from_slice(&s.cache[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.check(offset, data.len())?;
        let mut s = self.lock();
        Self::tick(&mut s)?;
        s.cache[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        s.pending.push((offset, data.to_vec()));
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut s = self.lock();
        Self::tick(&mut s)?;
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
        self.size
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}
