//! Trimming what a guest freed without telling: gray-box reclaim (VA seed
//! 000). The caller reads a snapshot of the volume, learns from the guest's
//! own structures which blocks it leaves unused, and asks to unmap them in
//! the head. Only blocks the head still shares with that snapshot go: a
//! block written since may belong to a file created after the snapshot was
//! read, so it is kept.

use crate::error::{EngineError, Result};
use crate::map::extent_map::Segment;
use crate::map::view::View;
use crate::pool::Pool;
use tarn_format::ops::Op;
use tarn_format::BLOCK_SIZE;

/// Blocks looked at per hold of the pool lock, so writers wait little.
const BLOCKS_PER_HOLD: u64 = 1 << 16;

/// What [`Pool::trim_unchanged_since`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimCount {
    /// Mapped blocks unmapped in the head.
    pub unmapped: u64,
    /// Blocks kept because they were written after the snapshot.
    pub kept_changed: u64,
}

impl Pool {
    /// Unmap whole blocks of the byte ranges `ranges` in `vol`'s head
    /// where the head still holds what its snapshot at epoch `since` holds
    /// (entries born at or before it). Blocks written since are kept. The
    /// snapshot itself keeps the space until it is deleted. With `apply`
    /// false nothing changes: the count says what would go.
    pub fn trim_unchanged_since(
        &self,
        vol: u32,
        since: u64,
        ranges: &[(u64, u64)],
        apply: bool,
    ) -> Result<ReclaimCount> {
        if apply {
            self.check_writable()?;
        }
        let mut count = ReclaimCount::default();
        for &(offset, len) in ranges {
            self.check_view_range("reclaim", vol, View::Head, offset, len, u64::MAX)?;
            let first = offset.div_ceil(BLOCK_SIZE);
            let end = (offset + len) / BLOCK_SIZE;
            let mut lba = first;
            while lba < end {
                let n = BLOCKS_PER_HOLD.min(end - lba);
                self.trim_unchanged_piece(vol, since, (lba, n), apply, &mut count)?;
                lba += n;
            }
        }
        if apply {
            self.write_gen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(count)
    }

    fn trim_unchanged_piece(
        &self,
        vol: u32,
        since: u64,
        (lba, n): (u64, u64),
        apply: bool,
        count: &mut ReclaimCount,
    ) -> Result<()> {
        if apply {
            self.make_room()?;
        }
        let mut inner = self.write_inner();
        let v = inner.state.volume(vol).ok_or(EngineError::VolumeGone(vol))?;
        if v.snapshot_index(since).is_none() {
            return Err(EngineError::InvalidArgument(format!("epoch {since} is not a snapshot of {}", v.name)));
        }
        let mut ops = Vec::new();
        for seg in v.map.lookup(lba, n, usize::MAX)? {
            if let Segment::Mapped { lba, len, birth, .. } = seg {
                if birth <= since {
                    count.unmapped += len;
                    ops.push(Op::Unmap { vol, lba, len });
                } else {
                    count.kept_changed += len;
                }
            }
        }
        if apply && !ops.is_empty() {
            self.apply_ops(&mut inner, ops)?;
        }
        Ok(())
    }
}
