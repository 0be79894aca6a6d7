//! Mirrors: a pool member ("slot") kept as 2+ byte-identical legs on
//! different devices, like an md raid1 or a ZFS mirror vdev. The rest of the
//! engine sees one [`Device`]; this module fans writes out to every usable
//! leg, serves reads from the first healthy one, takes a failing leg out
//! (faulted) instead of failing the I/O, and exposes the legs as "copies" so
//! checksum-verifying readers can heal a bad copy from a good one.
//!
//! Leg states live in memory here; the pool writes them into the device
//! table of the primary's superblock at the next commit (see `commit/superblock.rs`), so a
//! leg that dropped out is never trusted again without a resilver.

use crate::device::Device;
use locks::{read, write};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};
use tarn_format::superblock::{LegEntry, LegState};

/// What a leg is doing right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LegHealth {
    /// In sync: read and written.
    Online = 0,
    /// Took an I/O error, or is stale from an earlier fault: neither read nor written.
    Faulted = 1,
    /// Not found at open.
    Missing = 2,
    /// A replacement being filled: written (so it keeps up) but not read.
    Resilvering = 3,
}

impl LegHealth {
    fn from_u8(v: u8) -> LegHealth {
        match v {
            0 => LegHealth::Online,
            2 => LegHealth::Missing,
            3 => LegHealth::Resilvering,
            _ => LegHealth::Faulted,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            LegHealth::Online => "ONLINE",
            LegHealth::Faulted => "FAULTED",
            LegHealth::Missing => "MISSING",
            LegHealth::Resilvering => "RESILVERING",
        }
    }

    /// How the superblock's device table records it.
    fn recorded(self) -> LegState {
        match self {
            LegHealth::Online => LegState::InSync,
            LegHealth::Resilvering => LegState::NeedsResilver,
            LegHealth::Faulted | LegHealth::Missing => LegState::Faulted,
        }
    }

    fn writable(self) -> bool {
        matches!(self, LegHealth::Online | LegHealth::Resilvering)
    }
}

/// One leg: its device (None when missing), identity and counters.
pub struct Leg {
    pub dev: Option<Arc<dyn Device>>,
    pub uuid: [u8; 16],
    /// The path the table records (a hint).
    pub path: String,
    state: AtomicU8,
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    /// Blocks of this leg rewritten from another copy (self-heal).
    pub healed: AtomicU64,
}

impl Leg {
    pub fn new(dev: Option<Arc<dyn Device>>, uuid: [u8; 16], path: String, health: LegHealth) -> Leg {
        Leg {
            dev,
            uuid,
            path,
            state: AtomicU8::new(health as u8),
            read_errors: AtomicU64::new(0),
            write_errors: AtomicU64::new(0),
            healed: AtomicU64::new(0),
        }
    }

    pub fn health(&self) -> LegHealth {
        LegHealth::from_u8(self.state.load(Ordering::SeqCst))
    }

    fn name(&self) -> String {
        self.dev.as_ref().map(|d| d.name()).unwrap_or_else(|| self.path.clone())
    }
}

/// A point-in-time view of one leg, for status.
#[derive(Debug, Clone)]
pub struct LegStatus {
    pub index: usize,
    pub path: String,
    pub uuid: String,
    pub state: &'static str,
    pub read_errors: u64,
    pub write_errors: u64,
    pub healed_blocks: u64,
}

pub struct MirrorDevice {
    name: String,
    size: u64,
    legs: RwLock<Vec<Arc<Leg>>>,
    /// Writes hold it shared for their whole fan-out; a resilver copies each
    /// chunk holding it exclusively, so a copy never lands after (and
    /// overwrites) a newer write to the same blocks.
    gate: RwLock<()>,
    writable: bool,
    /// A resilver is running (one at a time).
    pub(crate) resilvering: AtomicBool,
}

/// Poison-tolerant lock helpers (a panicked writer leaves plain data).
mod locks {
    use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
    pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
        l.read().unwrap_or_else(|p| p.into_inner())
    }
    pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
        l.write().unwrap_or_else(|p| p.into_inner())
    }
}

impl MirrorDevice {
    /// `size` is the slot's size (every leg is at least that big).
    pub fn new(legs: Vec<Leg>, size: u64, writable: bool) -> MirrorDevice {
        let names: Vec<String> = legs.iter().map(Leg::name).collect();
        MirrorDevice {
            name: format!("mirror({})", names.join(",")),
            size,
            legs: RwLock::new(legs.into_iter().map(Arc::new).collect()),
            gate: RwLock::new(()),
            writable,
            resilvering: AtomicBool::new(false),
        }
    }

    pub fn legs(&self) -> Vec<Arc<Leg>> {
        read(&self.legs).clone()
    }

    fn leg(&self, i: usize) -> io::Result<Arc<Leg>> {
        read(&self.legs).get(i).cloned().ok_or_else(|| io::Error::other(format!("no leg {i}")))
    }

    /// Take a leg out after an I/O error: its copy is no longer trusted.
    fn fault(&self, leg: &Leg, what: &str, e: &io::Error) {
        let prev = leg.state.swap(LegHealth::Faulted as u8, Ordering::SeqCst);
        if prev != LegHealth::Faulted as u8 {
            log::warn!("{}: leg {} FAULTED after {what} error: {e}; continuing DEGRADED", self.name, leg.name());
        }
    }

    pub(crate) fn set_health(&self, i: usize, h: LegHealth) -> io::Result<()> {
        self.leg(i)?.state.store(h as u8, Ordering::SeqCst);
        Ok(())
    }

    /// Put `leg` in position `i` (a replacement), waiting out in-flight writes
    /// so every write that starts afterwards reaches it.
    pub(crate) fn install(&self, i: usize, leg: Leg) -> io::Result<()> {
        let _g = write(&self.gate);
        let mut legs = write(&self.legs);
        let slot = legs.get_mut(i).ok_or_else(|| io::Error::other(format!("no leg {i}")))?;
        *slot = Arc::new(leg);
        Ok(())
    }

    /// Copy `len` bytes at `offset` from leg `src` to leg `dst` with writes
    /// held off, so the copy cannot overtake a concurrent write.
    pub(crate) fn copy_leg(&self, src: usize, dst: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let _g = write(&self.gate);
        self.read_copy(src, buf, offset)?;
        let leg = self.leg(dst)?;
        let dev = leg.dev.as_ref().ok_or_else(|| io::Error::other("replacement leg has no device"))?;
        dev.write_at(buf, offset)
    }

    /// The leg list as the superblock should record it now.
    pub fn leg_entries(&self) -> Vec<LegEntry> {
        self.legs()
            .iter()
            .map(|l| LegEntry { uuid: l.uuid, state: l.health().recorded(), path: l.path.clone() })
            .collect()
    }

    /// ONLINE, DEGRADED (a leg out) or RESILVERING, and each leg.
    pub fn status(&self) -> (&'static str, Vec<LegStatus>) {
        let legs: Vec<LegStatus> = self
            .legs()
            .iter()
            .enumerate()
            .map(|(i, l)| LegStatus {
                index: i,
                // As recorded (what `replace` takes), not as opened.
                path: l.path.clone(),
                uuid: crate::device::label::uuid_string(&l.uuid),
                state: l.health().label(),
                read_errors: l.read_errors.load(Ordering::Relaxed),
                write_errors: l.write_errors.load(Ordering::Relaxed),
                healed_blocks: l.healed.load(Ordering::Relaxed),
            })
            .collect();
        let state = if legs.iter().all(|l| l.state == "ONLINE") {
            "ONLINE"
        } else if legs.iter().any(|l| l.state == "RESILVERING") {
            "RESILVERING"
        } else {
            "DEGRADED"
        };
        (state, legs)
    }

    /// Run `op` on every writable leg; succeed if an in-sync leg did (a
    /// resilvering leg alone is not readable). Legs that failed while one
    /// succeeded are faulted; if none did (a power cut, say) the states stay
    /// and the error is the device's.
    fn fan_out(&self, what: &str, op: impl Fn(&dyn Device) -> io::Result<()>) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::other(format!("{} is open read-only", self.name)));
        }
        let _g = read(&self.gate);
        let legs = self.legs();
        let mut failed = Vec::new();
        let mut ok = 0;
        for leg in legs.iter().filter(|l| l.health().writable()) {
            let Some(dev) = &leg.dev else { continue };
            match op(dev.as_ref()) {
                Ok(()) => ok += usize::from(leg.health() == LegHealth::Online),
                Err(e) => failed.push((leg.clone(), e)),
            }
        }
        if ok == 0 {
            return Err(failed
                .pop()
                .map(|(_, e)| e)
                .unwrap_or_else(|| io::Error::other(format!("{}: no usable leg", self.name))));
        }
        for (leg, e) in failed {
            leg.write_errors.fetch_add(1, Ordering::Relaxed);
            self.fault(&leg, what, &e);
        }
        Ok(())
    }
}

impl Device for MirrorDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let legs = self.legs();
        let mut last = None;
        for (i, leg) in legs.iter().enumerate() {
            if leg.health() != LegHealth::Online {
                continue;
            }
            match self.read_copy(i, buf, offset) {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other(format!("{}: no readable leg", self.name))))
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.fan_out("write", |d| d.write_at(data, offset))
    }

    fn flush(&self) -> io::Result<()> {
        self.fan_out("flush", |d| d.flush())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        // A hint: a leg that cannot discard is not faulty.
        let _g = read(&self.gate);
        let mut result = Ok(());
        for leg in self.legs().iter().filter(|l| l.health().writable()) {
            if let Some(dev) = &leg.dev {
                if let Err(e) = dev.discard(offset, len) {
                    result = Err(e);
                }
            }
        }
        result
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn copies(&self) -> usize {
        read(&self.legs).len()
    }

    /// Also from a RESILVERING leg: callers of `read_copy` validate what they
    /// read (checksums, self addresses, sequence numbers), and a block a
    /// resilvering leg holds that validates is right.
    fn read_copy(&self, copy: usize, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let leg = self.leg(copy)?;
        let dev = match (&leg.dev, leg.health()) {
            (Some(dev), LegHealth::Online | LegHealth::Resilvering) => dev,
            (_, h) => return Err(io::Error::other(format!("leg {} is {}", leg.name(), h.label()))),
        };
        dev.read_at(buf, offset).inspect_err(|e| {
            leg.read_errors.fetch_add(1, Ordering::Relaxed);
            self.fault(&leg, "read", e);
        })
    }

    fn write_copy(&self, copy: usize, data: &[u8], offset: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::other(format!("{} is open read-only", self.name)));
        }
        let _g = read(&self.gate);
        let leg = self.leg(copy)?;
        let dev = match (&leg.dev, leg.health()) {
            (Some(dev), LegHealth::Online | LegHealth::Resilvering) => dev,
            (_, h) => return Err(io::Error::other(format!("leg {} is {}", leg.name(), h.label()))),
        };
        match dev.write_at(data, offset) {
            Ok(()) => {
                leg.healed.fetch_add((data.len() as u64).div_ceil(4096), Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                leg.write_errors.fetch_add(1, Ordering::Relaxed);
                self.fault(&leg, "heal write", &e);
                Err(e)
            }
        }
    }
}

/// Read `buf` at `offset` from the first copy `valid` accepts, and rewrite
/// the copies read before it that `valid` rejected (self-heal). Returns
/// whether a valid copy was found; if none was, `buf` holds the first copy
/// that could be read (the caller decides what an invalid block means, e.g.
/// the end of the journal). Errs only when no copy could be read at all.
pub(crate) fn read_validated(
    dev: &dyn Device,
    buf: &mut [u8],
    offset: u64,
    valid: impl Fn(&[u8]) -> bool,
) -> io::Result<bool> {
    let copies = dev.copies();
    if copies <= 1 {
        dev.read_at(buf, offset)?;
        return Ok(valid(buf));
    }
    let mut first: Option<Vec<u8>> = None;
    let mut bad = Vec::new();
    let mut last_err = None;
    for c in 0..copies {
        match dev.read_copy(c, buf, offset) {
            Err(e) => last_err = Some(e),
            Ok(()) if valid(buf) => {
                heal(dev, &bad, buf, offset);
                return Ok(true);
            }
            Ok(()) => {
                bad.push(c);
                first.get_or_insert_with(|| buf.to_vec());
            }
        }
    }
    match first {
        Some(b) => {
            buf.copy_from_slice(&b);
            Ok(false)
        }
        None => Err(last_err.unwrap_or_else(|| io::Error::other("no copy readable"))),
    }
}

/// Rewrite copies `bad` of a range with the good bytes.
pub(crate) fn heal(dev: &dyn Device, bad: &[usize], good: &[u8], offset: u64) {
    for &c in bad {
        match dev.write_copy(c, good, offset) {
            Ok(()) => log::warn!("{}: copy {c} at byte {offset} was invalid; rewritten from a good copy", dev.name()),
            Err(e) => log::warn!("{}: copy {c} at byte {offset} is invalid and was not rewritten: {e}", dev.name()),
        }
    }
}

/// Rewrite copy `copy` of a range with `good` if it reads differently
/// (an unavailable copy is left alone: it is not in sync anyway).
pub(crate) fn heal_if_differs(dev: &dyn Device, copy: usize, good: &[u8], offset: u64) {
    let mut mine = vec![0u8; good.len()];
    if dev.read_copy(copy, &mut mine, offset).is_ok() && mine != good {
        heal(dev, &[copy], good, offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memory device that can be told to fail.
    struct Mem {
        data: std::sync::Mutex<Vec<u8>>,
        fail: AtomicBool,
    }

    impl Mem {
        fn new(size: usize) -> Arc<Mem> {
            Arc::new(Mem { data: std::sync::Mutex::new(vec![0; size]), fail: AtomicBool::new(false) })
        }
        fn check(&self) -> io::Result<()> {
            if self.fail.load(Ordering::SeqCst) {
                return Err(io::Error::other("injected"));
            }
            Ok(())
        }
    }

    impl Device for Mem {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
            self.check()?;
            let d = self.data.lock().unwrap();
            buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }
        fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
            self.check()?;
            self.data.lock().unwrap()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            self.check()
        }
        fn discard(&self, _: u64, _: u64) -> io::Result<()> {
            Ok(())
        }
        fn size(&self) -> u64 {
            self.data.lock().unwrap().len() as u64
        }
        fn name(&self) -> String {
            "mem".into()
        }
    }

    fn pair() -> (Arc<Mem>, Arc<Mem>, MirrorDevice) {
        let (a, b) = (Mem::new(8192), Mem::new(8192));
        let legs = vec![
            Leg::new(Some(a.clone()), [1; 16], "a".into(), LegHealth::Online),
            Leg::new(Some(b.clone()), [2; 16], "b".into(), LegHealth::Online),
        ];
        (a, b, MirrorDevice::new(legs, 8192, true))
    }

    #[test]
    fn a_failing_leg_is_faulted_and_io_continues() {
        let (a, b, m) = pair();
        m.write_at(&[7; 4096], 0).unwrap();
        a.fail.store(true, Ordering::SeqCst);
        let mut buf = [0u8; 4096];
        m.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [7; 4096], "served by the other leg");
        assert_eq!(m.legs()[0].health(), LegHealth::Faulted);
        m.write_at(&[8; 4096], 4096).unwrap();
        m.flush().unwrap();
        assert_eq!(m.status().0, "DEGRADED");
        assert_eq!(m.leg_entries()[0].state, LegState::Faulted);
        b.fail.store(true, Ordering::SeqCst);
        assert!(m.write_at(&[9; 4096], 0).is_err(), "no leg left: the write fails");
        assert_eq!(m.legs()[1].health(), LegHealth::Online, "the last leg is not faulted by its own failure");
    }

    #[test]
    fn a_resilvering_leg_is_written_but_never_read_nor_enough() {
        let (a, b, m) = pair();
        m.set_health(1, LegHealth::Resilvering).unwrap();
        m.write_at(&[3; 4096], 0).unwrap();
        let mut buf = [0u8; 4096];
        b.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [3; 4096], "the resilvering leg gets writes");
        b.write_at(&[4; 4096], 0).unwrap();
        m.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [3; 4096], "reads come from the in-sync leg only");
        a.fail.store(true, Ordering::SeqCst);
        assert!(m.write_at(&[5; 4096], 0).is_err(), "only a resilvering leg took it: not durable anywhere readable");
        assert!(m.read_at(&mut buf, 0).is_err());
    }

    #[test]
    fn read_validated_heals_the_bad_copy() {
        let (a, b, m) = pair();
        m.write_at(&[5; 4096], 0).unwrap();
        a.write_at(&[6; 4096], 0).unwrap(); // leg 0 rots
        let mut buf = [0u8; 4096];
        assert!(read_validated(&m, &mut buf, 0, |x| x[0] == 5).unwrap());
        assert_eq!(buf, [5; 4096]);
        let mut back = [0u8; 4096];
        a.read_at(&mut back, 0).unwrap();
        assert_eq!(back, [5; 4096], "leg 0 rewritten");
        assert_eq!(m.legs()[0].healed.load(Ordering::Relaxed), 1);
        b.write_at(&[6; 4096], 0).unwrap();
        a.write_at(&[6; 4096], 0).unwrap();
        assert!(!read_validated(&m, &mut buf, 0, |x| x[0] == 5).unwrap(), "no valid copy");
    }
}
