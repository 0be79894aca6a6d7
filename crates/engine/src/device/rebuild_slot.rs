//! The device of a plain member that was missing at open, or that is
//! being rebuilt from parity rows onto a new device (`tarn pool replace`;
//! the pool side is `service/rebuild.rs`).
//!
//! Missing: every read and write fails (a parity volume rebuilds the block
//! from its row, any other volume gets EIO); flushes succeed. Rebuilding:
//! blocks [0, rebuilt) of the new device hold what the member held, so
//! reads there go to it; a read reaching past fails like a missing
//! member's, and the parity read path rebuilds it from its row. Writes go
//! to the new device (the rebuild's own: allocation avoids the member
//! until the rebuild ends). Whole (`rebuilt` = u64::MAX): the new device.
//!
//! Replacing (a present member copied onto a new device, `tarn pool
//! replace`; the pool side is `service/replace.rs`): the old device stays
//! the source. Reads of `[start, rebuilt)` go to the new device, the rest
//! (the label area, the blocks not copied yet) to the old one; every write
//! goes to the old device, and a write of `[start, rebuilt)` to the new
//! one too. A copy step ([`RebuildSlot::copy`]) reads the old device and
//! writes the new one under the exclusive `gate` and moves the cursor
//! before releasing it, while writes hold it shared: a write either ends
//! before the step reads (the step copies the new data) or starts after
//! the cursor passed it (it writes both devices). No write lands between
//! the step's read and its write, which would be undone.
//! Every plain member other than the primary is opened in such a slot
//! (whole) so that a replace can start online.

use crate::device::Device;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tarn_format::superblock::LABEL_BLOCKS;
use tarn_format::BLOCK_SIZE;

/// Every block is readable: no rebuild in progress.
pub const WHOLE: u64 = u64::MAX;

pub struct RebuildSlot {
    index: usize,
    /// The path the pool recorded for the member.
    path: String,
    dev: RwLock<Option<Arc<dyn Device>>>,
    /// Blocks of `dev` from its start that hold what the member held.
    rebuilt: AtomicU64,
    /// While a present member is replaced: its old device (the source).
    source: RwLock<Option<Arc<dyn Device>>>,
    /// First data block: below it each device keeps its own label.
    start: AtomicU64,
    /// Writes shared, copy steps exclusive (see the module comment).
    gate: RwLock<()>,
    /// A replace is under way (the old device may be gone: then the rest
    /// is rebuilt from parity rows, `service/replace.rs`).
    replace: std::sync::atomic::AtomicBool,
}

impl RebuildSlot {
    /// A member whose device could not be opened.
    pub fn missing(index: usize, path: &str) -> RebuildSlot {
        RebuildSlot::new(index, path.to_string(), None, 0)
    }

    fn new(index: usize, path: String, dev: Option<Arc<dyn Device>>, rebuilt: u64) -> RebuildSlot {
        RebuildSlot {
            index,
            path,
            dev: RwLock::new(dev),
            rebuilt: AtomicU64::new(rebuilt),
            source: RwLock::new(None),
            start: AtomicU64::new(0),
            gate: RwLock::new(()),
            replace: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A member whose new device holds its first `rebuilt` blocks.
    pub fn rebuilding(index: usize, dev: Arc<dyn Device>, rebuilt: u64) -> RebuildSlot {
        RebuildSlot::new(index, dev.name(), Some(dev), rebuilt)
    }

    /// A present member, whole (a replace may start on it).
    pub fn whole(index: usize, dev: Arc<dyn Device>) -> RebuildSlot {
        RebuildSlot::new(index, dev.name(), Some(dev), WHOLE)
    }

    /// A present member `old` being copied onto `new`, which holds its
    /// blocks `[start, copied)`.
    pub fn replacing(index: usize, old: Arc<dyn Device>, new: Arc<dyn Device>, start: u64, copied: u64) -> RebuildSlot {
        let slot = RebuildSlot::new(index, old.name(), Some(new), copied);
        *slot.source.write().unwrap_or_else(|e| e.into_inner()) = Some(old);
        slot.start.store(start, Ordering::SeqCst);
        slot.replace.store(true, Ordering::SeqCst);
        slot
    }

    /// A member being replaced whose old device is missing: the new one
    /// holds `[start, copied)`, the rest is rebuilt from parity rows.
    pub fn replacing_without_old(index: usize, new: Arc<dyn Device>, start: u64, copied: u64) -> RebuildSlot {
        let slot = RebuildSlot::new(index, new.name(), Some(new), copied);
        slot.start.store(start, Ordering::SeqCst);
        slot.replace.store(true, Ordering::SeqCst);
        slot
    }

    fn old(&self) -> Option<Arc<dyn Device>> {
        self.source.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether a member is being copied onto a new device.
    pub fn is_replacing(&self) -> bool {
        self.replace.load(Ordering::SeqCst)
    }

    /// Start copying this whole member onto `new` from block `start` (the
    /// label area is `new`'s own). Refused unless whole.
    pub fn begin_replace(&self, new: Arc<dyn Device>, start: u64) -> io::Result<()> {
        let _g = self.gate.write().unwrap_or_else(|e| e.into_inner());
        let mut src = self.source.write().unwrap_or_else(|e| e.into_inner());
        let mut dev = self.dev.write().unwrap_or_else(|e| e.into_inner());
        if src.is_some() || self.rebuilt() != WHOLE || dev.is_none() {
            return Err(io::Error::other(format!("member {} is not whole", self.index)));
        }
        self.start.store(start, Ordering::SeqCst);
        self.rebuilt.store(start, Ordering::SeqCst);
        *src = dev.replace(new);
        self.replace.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Copy blocks `[from, from + buf.len()/4096)` from the old device to
    /// the new one and move the cursor past them, writes held off meanwhile.
    /// False when the old device (gone, or failing) cannot read them:
    /// nothing written. Err: the new device failed the write.
    pub fn copy(&self, from: u64, buf: &mut [u8]) -> io::Result<bool> {
        let _g = self.gate.write().unwrap_or_else(|e| e.into_inner());
        let new = self.device().ok_or_else(|| self.missing_error())?;
        let Some(old) = self.old() else { return Ok(false) };
        if old.read_at(buf, from * BLOCK_SIZE).is_err() {
            return Ok(false);
        }
        new.write_at(buf, from * BLOCK_SIZE)?;
        self.rebuilt.fetch_max(from + buf.len() as u64 / BLOCK_SIZE, Ordering::SeqCst);
        Ok(true)
    }

    /// Write `data` to the new device only (a block the old one could not
    /// read, rebuilt from its parity row under the row's lock).
    pub fn write_new(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.device().ok_or_else(|| self.missing_error())?.write_at(data, offset)
    }

    /// The copy is over: the new device is the member. The old one is
    /// returned (its label is the caller's to wipe).
    pub fn end_replace(&self) -> Option<Arc<dyn Device>> {
        let _g = self.gate.write().unwrap_or_else(|e| e.into_inner());
        self.rebuilt.store(WHOLE, Ordering::SeqCst);
        self.replace.store(false, Ordering::SeqCst);
        self.source.write().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn device(&self) -> Option<Arc<dyn Device>> {
        self.dev.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Put `dev` in the member's place, trusted for its first `rebuilt`
    /// blocks (its labels).
    pub fn install(&self, dev: Arc<dyn Device>, rebuilt: u64) {
        self.rebuilt.store(rebuilt, Ordering::SeqCst);
        *self.dev.write().unwrap_or_else(|e| e.into_inner()) = Some(dev);
    }

    /// Reads of blocks below `n` go to the new device from now on.
    pub fn advance(&self, n: u64) {
        self.rebuilt.fetch_max(n, Ordering::SeqCst);
    }

    pub fn rebuilt(&self) -> u64 {
        self.rebuilt.load(Ordering::SeqCst)
    }

    /// A device is in place and the rebuild has not ended.
    pub fn is_rebuilding(&self) -> bool {
        self.device().is_some() && self.rebuilt() != WHOLE
    }

    fn missing_error(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("member {} ({}) is missing: the pool is DEGRADED", self.index, self.path),
        )
    }
}

impl Device for RebuildSlot {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let dev = self.device().ok_or_else(|| self.missing_error())?;
        let end = (offset + buf.len() as u64).div_ceil(BLOCK_SIZE);
        if let Some(old) = self.old() {
            // Below the cursor both hold the data: the new one is read (it
            // is what stays); the label area is each one's own.
            let copied = offset / BLOCK_SIZE >= self.start.load(Ordering::SeqCst) && end <= self.rebuilt();
            return if copied { dev.read_at(buf, offset) } else { old.read_at(buf, offset) };
        }
        if end > self.rebuilt() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("member {} is being rebuilt: block {} is not yet", self.index, end - 1),
            ));
        }
        dev.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let _g = self.gate.read().unwrap_or_else(|e| e.into_inner());
        let dev = self.device().ok_or_else(|| self.missing_error())?;
        let Some(old) = self.old() else { return dev.write_at(data, offset) };
        old.write_at(data, offset)?;
        let block = offset / BLOCK_SIZE;
        if block >= self.start.load(Ordering::SeqCst) && block < self.rebuilt() {
            dev.write_at(data, offset)?;
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        if let Some(old) = self.old() {
            old.flush()?;
        }
        self.device().map_or(Ok(()), |d| d.flush())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        // A hint: while replacing, the old device's (the new one's copy of
        // a freed range is never read as data).
        match self.old() {
            Some(old) => old.discard(offset, len),
            None => self.device().map_or(Ok(()), |d| d.discard(offset, len)),
        }
    }
    fn size(&self) -> u64 {
        if let Some(old) = self.old() {
            return old.size();
        }
        self.device().map_or(LABEL_BLOCKS * BLOCK_SIZE, |d| d.size())
    }
    fn grow(&self, size: u64) -> io::Result<()> {
        if self.old().is_some() || self.rebuilt() != WHOLE {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "a member being replaced or rebuilt cannot grow"));
        }
        self.device().ok_or_else(|| self.missing_error())?.grow(size)
    }
    fn name(&self) -> String {
        if let Some(old) = self.old() {
            return old.name();
        }
        match self.device() {
            Some(d) => d.name(),
            None => format!("(missing member {}: {})", self.index, self.path),
        }
    }
    fn prefetch(&self, offset: u64, len: u64) {
        if let Some(d) = self.old().or_else(|| self.device()) {
            d.prefetch(offset, len);
        }
    }
    fn present(&self) -> bool {
        self.device().is_some()
    }
    fn missing_member(&self) -> bool {
        self.device().is_none()
    }
    fn degraded(&self) -> bool {
        self.rebuilt() != WHOLE
    }
    fn rebuild_slot(&self) -> Option<&RebuildSlot> {
        Some(self)
    }
}
