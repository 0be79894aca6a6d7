//! Writes made without commits, their journal room reserved ahead
//! (`commit/room.rs`): tarn-fs's write-behind thread.

use crate::commit::room::OpsRoom;
use crate::error::{EngineError, Result};
use crate::pool::Pool;
use std::sync::atomic::Ordering;

impl Pool {
    /// Write `data` at byte `offset` of `vol` with its ops charged to
    /// `room`: never commits. A write that would need a commit (a feature
    /// to enable first, overwrite regions to open, a full pool, strict
    /// mode) returns `NeedsCommit` or `NoSpace` having changed nothing the
    /// ordinary `write` cannot redo.
    pub fn write_reserved(&self, vol: u32, offset: u64, data: &[u8], room: OpsRoom) -> Result<()> {
        self.client_ops.fetch_add(1, Ordering::Relaxed);
        self.check_writable()?;
        self.check_range("write", vol, offset, data.len() as u64, super::MAX_IO_BYTES)?;
        if self.options.strict {
            return Err(EngineError::NeedsCommit);
        }
        let result = self.write_pieces(vol, offset, data, false);
        self.write_gen.fetch_add(1, Ordering::SeqCst);
        drop(room);
        result.map(drop)
    }
}
