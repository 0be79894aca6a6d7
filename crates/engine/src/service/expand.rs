//! Expansion ahead of the writer (Virtual Allocation, AoDI): when the
//! pool's usage crosses a threshold, a file-backed member grows by a step,
//! up to a limit, in the background (the service's committer checks every
//! tick); and a write that finds no space while growth is still possible
//! grows the member itself and goes on, so a writer streaming faster than
//! the background check still never sees ENOSPC before the limit.

use crate::error::Result;
use crate::pool::Pool;
use crate::service::grow::Growth;
use std::sync::atomic::Ordering;

/// Free blocks (1 MiB) a write that found the pool full takes as room
/// again, rather than growing it once more.
const ROOM_BLOCKS: u64 = 256;

/// How a pool grows (`tarn serve --expand-at --expand-step --expand-max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expansion {
    /// Grow once this much of the pool's data space is in use (1..=99).
    pub at_percent: u8,
    /// Bytes added per growth.
    pub step: u64,
    /// The grown member's largest size in bytes.
    pub max: u64,
    /// The member that grows (a regular file: its length is extended).
    pub device: usize,
}

impl Expansion {
    /// The reasons a policy cannot be used, for the CLI to print.
    pub fn check(&self) -> std::result::Result<(), String> {
        if !(1..=99).contains(&self.at_percent) {
            return Err(format!("an expansion threshold of {}%: give 1 to 99", self.at_percent));
        }
        if self.step < 1 << 20 {
            return Err(format!("an expansion step of {} bytes: give at least 1 MiB", self.step));
        }
        Ok(())
    }
}

impl Pool {
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
            Growth::AtLimit => Ok(false),
        }
    }

    /// Percent of the data space not available to new writes.
    fn usage_percent(&self) -> f64 {
        let inner = self.read_inner();
        let total = inner.space.data_blocks().max(1) as f64;
        100.0 * (1.0 - inner.space.available_blocks() as f64 / total)
    }
}
