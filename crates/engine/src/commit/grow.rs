//! Growing a member device (`tarn dev grow`, and the expansion policy of
//! `tarn serve --expand-at`, VA and AoDI: grow the pool before a writer
//! sees ENOSPC). The device table (superblock) and the member's space map
//! (catalog) change together, by one forced checkpoint: the grown range
//! joins the space map held in flight, the checkpoint's superblock
//! records the new size, then the range is released. Two triggers grow
//! by policy: the service's committer each tick the pool's usage is past
//! the threshold, and a write that finds no space (`io/`), which then
//! plans again, so a writer faster than the tick never sees ENOSPC before
//! the limit.

use crate::error::{EngineError, Result};
use crate::pool::{CommitCtl, Pool};
use crate::space::expansion::ROOM_BLOCKS;
use std::sync::atomic::Ordering;
use tarn_format::BLOCK_SIZE;

/// What `grow_device` did.
#[derive(Debug, Clone)]
pub struct GrowReport {
    pub index: usize,
    pub old_bytes: u64,
    pub new_bytes: u64,
}

/// What `grow_device_by` did.
#[derive(Debug, Clone)]
pub enum Growth {
    Grown(GrowReport),
    /// Nothing: the pool had room by the time the lock was taken.
    Room,
    /// Nothing: the member is at its limit.
    AtLimit,
}

impl Pool {
    /// Grow member `index` to `bytes` (a file-backed device is extended;
    /// another must already be that large): the new space is usable when
    /// this returns, and durable. Same protocol as an add: the grown
    /// range is held (in flight) until the checkpoint whose superblock
    /// records the new size is durable.
    pub fn grow_device(&self, index: usize, bytes: u64) -> Result<GrowReport> {
        self.check_writable()?;
        let mut ctl = self.lock_commit();
        self.grow_locked(&mut ctl, index, bytes)
    }

    /// Grow member `index` by `step` bytes, to `max` at most, reading its
    /// size under the commit lock, unless `enough` says (under that lock)
    /// that the pool has room already: a growth another caller finished
    /// while this one waited for the lock. Concurrent callers so grow the
    /// member once, not once each.
    pub fn grow_device_by(
        &self,
        index: usize,
        (step, max): (u64, u64),
        enough: &dyn Fn(&Pool) -> bool,
    ) -> Result<Growth> {
        self.check_writable()?;
        let mut ctl = self.lock_commit();
        if enough(self) {
            return Ok(Growth::Room);
        }
        let Some(entry) = ctl.sb.devices.get(index) else {
            return Err(EngineError::InvalidArgument(format!("the pool has no device {index}")));
        };
        let now = entry.blocks * BLOCK_SIZE;
        let target = now.saturating_add(step).min(max) / BLOCK_SIZE * BLOCK_SIZE;
        if target <= now {
            return Ok(Growth::AtLimit);
        }
        self.grow_locked(&mut ctl, index, target).map(Growth::Grown)
    }

    fn grow_locked(&self, ctl: &mut CommitCtl, index: usize, bytes: u64) -> Result<GrowReport> {
        let bad = |why: String| Err(EngineError::InvalidArgument(why));
        let (Some(entry), Some(dev)) = (ctl.sb.devices.get(index), self.devices.get(index).cloned()) else {
            return bad(format!("the pool has no device {index}"));
        };
        if entry.removed || entry.draining {
            return bad(format!("device {index} is being removed or removed: it does not grow"));
        }
        if entry.spare {
            return bad(format!("device {index} is a spare: it is taken whole when the pool expands, not grown"));
        }
        let (old, new) = (entry.blocks, bytes / BLOCK_SIZE);
        if self.mirrors.get(index).is_some_and(Option::is_some) {
            return bad(format!("device {index} is a mirror: grow its legs and replace them instead"));
        }
        if new <= old || new > 1 << 48 {
            return bad(format!("device {index} has {} bytes: {bytes} is no growth", old * BLOCK_SIZE));
        }
        self.settle_checkpoint(ctl)?;
        if dev.size() < new * BLOCK_SIZE {
            dev.grow(new * BLOCK_SIZE).map_err(|e| EngineError::io("grow", dev.name(), e))?;
        }
        let held = self.write_inner().space.grow_device(index, new)?;
        ctl.growing = Some((index, new));
        self.commit_locked(ctl, true)?;
        if ctl.growing.is_some() || ctl.sb.devices.get(index).map(|e| e.blocks) != Some(new) {
            self.fenced.store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(EngineError::InvalidArgument("the checkpoint growing the member was not written".into()));
        }
        self.write_inner().space.release_growth(held.0, held.1)?;
        log::info!("device {index} ({}) grew from {old} to {new} blocks", dev.name());
        Ok(GrowReport { index, old_bytes: old * BLOCK_SIZE, new_bytes: new * BLOCK_SIZE })
    }

    /// Grow the expanding member by one step if the pool's usage is at or
    /// above the threshold, or, when `full` (a write found no space),
    /// unless it has room again. True when there is room to try again
    /// (grown, by this call or one it waited for); false with no policy,
    /// under the threshold, or at the limit.
    pub fn expand_if_needed(&self, full: bool) -> Result<bool> {
        let Some(e) = self.options.expansion else { return Ok(false) };
        let room = |p: &Pool| {
            if full {
                p.read_inner().space.available_blocks() >= ROOM_BLOCKS
            } else {
                p.usage_percent() < f64::from(e.at_percent)
            }
        };
        if room(self) {
            return Ok(full);
        }
        match self.grow_device_by(e.device, (e.step, e.max), &room)? {
            Growth::Grown(g) => {
                self.counters.expansions.fetch_add(1, Ordering::Relaxed);
                let why = if full { "a write found the pool full" } else { "usage crossed the threshold" };
                log::warn!(
                    "pool expanded: device {} grew from {} to {} bytes ({why}; limit {})",
                    g.index,
                    g.old_bytes,
                    g.new_bytes,
                    e.max
                );
                Ok(true)
            }
            Growth::Room => Ok(full),
            Growth::AtLimit => self.take_spare_for(full, &room),
        }
    }

    /// The growing member is at its limit: take a spare, if there is one
    /// (`spare.rs`). True when there is room to try again.
    fn take_spare_for(&self, full: bool, room: &dyn Fn(&Pool) -> bool) -> Result<bool> {
        let Some(t) = self.take_spare(room)? else {
            // No spare, or room by now (another caller took one).
            return Ok(full && room(self));
        };
        self.counters.expansions.fetch_add(1, Ordering::Relaxed);
        let why = if full { "a write found the pool full" } else { "usage crossed the threshold" };
        log::warn!(
            "pool expanded: spare {} ({}) taken as a member, {} bytes of data area ({why}; the growing member is at its limit)",
            t.index,
            t.path,
            t.data_bytes
        );
        Ok(true)
    }

    /// Percent of the data space not available to new writes.
    fn usage_percent(&self) -> f64 {
        let inner = self.read_inner();
        let total = inner.space.data_blocks().max(1) as f64;
        100.0 * (1.0 - inner.space.available_blocks() as f64 / total)
    }
}
