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
}

impl RebuildSlot {
    /// A member whose device could not be opened.
    pub fn missing(index: usize, path: &str) -> RebuildSlot {
        RebuildSlot { index, path: path.to_string(), dev: RwLock::new(None), rebuilt: AtomicU64::new(0) }
    }

    /// A member whose new device holds its first `rebuilt` blocks.
    pub fn rebuilding(index: usize, dev: Arc<dyn Device>, rebuilt: u64) -> RebuildSlot {
        let path = dev.name();
        RebuildSlot { index, path, dev: RwLock::new(Some(dev)), rebuilt: AtomicU64::new(rebuilt) }
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
        if end > self.rebuilt() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("member {} is being rebuilt: block {} is not yet", self.index, end - 1),
            ));
        }
        dev.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.device().ok_or_else(|| self.missing_error())?.write_at(data, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.device().map_or(Ok(()), |d| d.flush())
    }
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.device().map_or(Ok(()), |d| d.discard(offset, len))
    }
    fn size(&self) -> u64 {
        self.device().map_or(LABEL_BLOCKS * BLOCK_SIZE, |d| d.size())
    }
    fn name(&self) -> String {
        match self.device() {
            Some(d) => d.name(),
            None => format!("(missing member {}: {})", self.index, self.path),
        }
    }
    fn prefetch(&self, offset: u64, len: u64) {
        if let Some(d) = self.device() {
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
