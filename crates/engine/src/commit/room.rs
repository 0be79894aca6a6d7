//! Room in the pending-op queue held for a write made later, on another
//! thread, without back-pressure commits (`Pool::write_reserved`).
//!
//! Why: tarn-fs makes a namespace change whole by making room for it
//! first (`Pool::make_room_for`), so no back-pressure commit falls inside
//! it. A write-behind thread writing file data meanwhile would grow the
//! queue under the change and could push one of its writes into a
//! commit. With its room reserved up front (under the namespace lock,
//! where a commit is allowed) and counted as pending, the queue never
//! grows past what the change made room for.

use crate::error::Result;
use crate::pool::Pool;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Queue weight reserved for one write; given back when dropped (the
/// write's own ops are in the queue by then, or it was not made).
pub struct OpsRoom {
    pool: Arc<Pool>,
    bytes: usize,
}

impl Drop for OpsRoom {
    fn drop(&mut self) {
        let before = self.pool.reserved.fetch_sub(self.bytes, Ordering::SeqCst);
        debug_assert!(before >= self.bytes, "room given back twice");
    }
}

impl Pool {
    /// Reserve queue room for ops weighing at most `bytes`, committing
    /// first if the queue would pass its bound: call it where a commit is
    /// allowed (between namespace changes). None when the reservations
    /// would take more than half the bound (the rest stays for the
    /// changes made meanwhile): write synchronously then.
    pub fn reserve_ops(self: &Arc<Self>, bytes: usize) -> Result<Option<OpsRoom>> {
        let cap = self.pending_limit / 2;
        if self.reserved.load(Ordering::SeqCst).saturating_add(bytes) > cap {
            return Ok(None);
        }
        self.make_room_for(bytes)?;
        // Only the caller reserves (one namespace lock); a racing reserver
        // could still pass the cap by one room, never the bound.
        self.reserved.fetch_add(bytes, Ordering::SeqCst);
        Ok(Some(OpsRoom { pool: self.clone(), bytes }))
    }

    /// Make what `write_reserved` would otherwise refuse once ready now
    /// (a commit of its own): whole-group checksums enabled. Call it where
    /// a commit is allowed, before the first such write.
    pub fn prepare_reserved_writes(&self) -> Result<()> {
        if self.checksums {
            self.enable_coarse()?;
        }
        Ok(())
    }

    /// Bytes user data may still take (free space less the metadata
    /// reserve): a cheap look, no commit.
    pub fn available_bytes(&self) -> u64 {
        self.read_inner().space.available_blocks() * tarn_format::BLOCK_SIZE
    }
}
