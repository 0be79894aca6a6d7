//! The device seam: the only way the engine touches stable storage.
//!
//! Everything below the engine (a regular file, a block device, the crash
//! simulator, later a RADOS object set) implements [`Device`]. The engine never
//! calls the file system, the clock or OS randomness directly, so the simulator
//! can stand in for any of them.

mod direct_ring;
pub mod disk_model;
pub use direct_ring::submit_direct_writes_async;
pub mod file_device;
pub mod label;
pub mod mem_device;
pub mod members;
pub mod node_io;
pub mod rebuild_slot;
pub mod vacant;

use std::io;

/// A place bytes live. Offsets and lengths are in bytes; the engine only issues
/// 4 KiB-aligned I/O but implementations must not rely on that for correctness.
///
/// Durability contract (that of a disk with a volatile write cache): a
/// `write_at` that returned may still be lost by a crash until a later `flush`
/// returns; a crash may also tear a write at 512-byte sector granularity.
pub trait Device: Send + Sync {
    /// Read exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write all of `data` at `offset`.
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Make every write that returned before this call durable.
    fn flush(&self) -> io::Result<()>;
    /// Tell the device a range no longer holds data (a hint; may do nothing).
    fn discard(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Grow to `size` bytes (pool expansion); a device that cannot says so.
    fn grow(&self, _size: u64) -> io::Result<()> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "this device cannot grow"))
    }
    /// A human name for error messages (a path, or "sim#3").
    fn name(&self) -> String;
    /// A hint that `[offset, offset+len)` will be read soon: start reading
    /// it (may do nothing). Lets one request's reads on several members
    /// (a striped volume) proceed at once, in large I/Os.
    fn prefetch(&self, _offset: u64, _len: u64) {}
    /// False only for the stand-in of a slot with no device (a removed
    /// slot, a missing spare): nothing is there to take or read.
    fn present(&self) -> bool {
        true
    }
    /// True only for the stand-in of a member holding data whose device
    /// could not be opened (the pool is DEGRADED; `device/rebuild_slot.rs`).
    fn missing_member(&self) -> bool {
        false
    }
    /// True for a member some of whose blocks cannot be read by design
    /// (missing, or being rebuilt): such reads fail without counting as
    /// device errors.
    fn degraded(&self) -> bool {
        false
    }
    /// The stand-in of a missing or rebuilding member, to put a new device
    /// in its place (`device/rebuild_slot.rs`).
    fn rebuild_slot(&self) -> Option<&crate::device::rebuild_slot::RebuildSlot> {
        None
    }
    /// Independent copies of every byte (1 unless mirrored).
    fn copies(&self) -> usize {
        1
    }
    /// Read copy `copy` (0..copies()) only; Err if that copy is unavailable.
    fn read_copy(&self, copy: usize, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if copy == 0 {
            self.read_at(buf, offset)
        } else {
            Err(io::Error::other("no such copy"))
        }
    }
    /// Rewrite copy `copy` only (self-heal).
    fn write_copy(&self, copy: usize, data: &[u8], offset: u64) -> io::Result<()> {
        if copy == 0 {
            self.write_at(data, offset)
        } else {
            Err(io::Error::other("no such copy"))
        }
    }
}
