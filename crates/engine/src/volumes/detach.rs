//! The last step of `tarn dev remove`: taking an evacuated member out of
//! the pool. Its slot stays in the device table (a block address names
//! its device by index, so no index changes meaning), marked removed.
//!
//! Order (docs/ARCHITECTURE.md *Removing a member device*):
//! 1. under the commit lock, with no checkpoint in progress, every store
//!    node still on the member (maps, dead lists, checksums, space maps)
//!    and the path to it is made dirty (`Tree::rewrite_device`);
//! 2. forced checkpoints write them elsewhere (allocation avoids a
//!    draining member) and a new catalog elsewhere; once durable, the
//!    member's old nodes and catalog segments are free, so its space map is
//!    all free (checked: anything else is an error and nothing changes);
//! 3. the space map is emptied (its area claimed, then of length zero) and
//!    a forced checkpoint's superblock marks the slot removed (incompat
//!    REMOVAL): durable on the primary (every leg, if mirrored) before...
//! 4. ...the member's two superblock copies are zeroed and flushed: the
//!    device then belongs to no pool.
//!
//! A crash before 3's superblock leaves the old pool, the member draining
//! (the next `dev remove` or the server's `evacuate` thread finds nothing
//! to move and does this again); after it, the new pool, and a crash
//! before 4 leaves a label naming a slot that is removed: `dev remove`
//! of that slot wipes it (`wipe_removed_label`).

pub use crate::device::label::wipe_label;
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::pool::Pool;
use tarn_format::BLOCK_SIZE;

/// Forced checkpoints tried before the member's space map must be all
/// free: the first writes the nodes elsewhere and frees the old blocks;
/// a second releases what a checkpoint before it still held.
const MAX_SETTLING_CHECKPOINTS: usize = 3;

/// What `detach_device` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DetachReport {
    pub index: usize,
    /// Store nodes found on the member and written elsewhere.
    pub nodes_moved: u64,
    /// Whether its pool label was wiped (false: it could not be written;
    /// the pool no longer lists it either way).
    pub label_wiped: bool,
}

impl Pool {
    /// Take member `index`, drained and holding no live block, out of the
    /// pool. Durable when it returns.
    pub fn detach_device(&self, index: usize) -> Result<DetachReport> {
        self.check_writable()?;
        let mut ctl = self.lock_commit();
        let entry = ctl.sb.devices.get(index).cloned();
        match entry {
            Some(e) if e.removed => {
                return Err(EngineError::InvalidArgument(format!("member {index} is removed already")))
            }
            Some(e) if e.draining && index != 0 => {}
            _ => return Err(EngineError::InvalidArgument(format!("member {index} is not being removed"))),
        }
        self.settle_checkpoint(&mut ctl)?;
        let live = self.live_blocks_on(index)?;
        if live > 0 {
            return Err(EngineError::InvalidArgument(format!(
                "member {index} still holds {} KiB of live data: evacuate it first",
                live * BLOCK_SIZE / 1024
            )));
        }
        let nodes_moved = self.rewrite_nodes_on(index)?;
        for _ in 0..MAX_SETTLING_CHECKPOINTS {
            self.commit_locked(&mut ctl, true)?;
            if self.member_all_free(index) {
                break;
            }
        }
        // The removal's superblock must come with a catalog frozen after
        // the map was emptied: no earlier checkpoint may be left to flip.
        self.settle_checkpoint(&mut ctl)?;
        self.write_inner().space.empty_device(index)?;
        ctl.removing = Some(index);
        self.commit_locked(&mut ctl, true)?;
        if ctl.removing.is_some() || !ctl.sb.devices.get(index).is_some_and(|e| e.removed) {
            // A forced commit always writes its checkpoint: a defect.
            self.fenced.store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(EngineError::Inconsistent("the checkpoint removing the member was not written".into()));
        }
        let dev = self.devices[index].clone();
        let label_wiped = match wipe_label(dev.as_ref()) {
            Ok(()) => true,
            Err(e) => {
                log::error!("member {index} removed, but its label could not be wiped: {e}");
                false
            }
        };
        log::warn!("member {index} ({}) removed from the pool: {nodes_moved} store nodes moved off it", dev.name());
        Ok(DetachReport { index, nodes_moved, label_wiped })
    }

    /// Make every store node on member `index` dirty (written elsewhere by
    /// the next checkpoint); how many there were.
    fn rewrite_nodes_on(&self, index: usize) -> Result<u64> {
        let dev = index as u16;
        let mut inner = self.write_inner();
        let inner = &mut *inner;
        let mut n = 0;
        for v in inner.state.volumes.values_mut() {
            n += v.map.rewrite_device(dev)?;
            for s in v.snapshots.iter_mut() {
                n += s.dead.rewrite_device(dev)?;
            }
        }
        n += inner.state.sums.rewrite_device(dev)?;
        let space = &mut inner.space;
        for d in space.devices.iter_mut() {
            n += d.tree.rewrite_device(&space.store, dev, &mut space.superseded)?;
        }
        Ok(n)
    }

    fn member_all_free(&self, index: usize) -> bool {
        let inner = self.read_inner();
        inner.space.devices.get(index).is_some_and(|d| d.free_blocks == d.data_end - d.data_start)
    }

    /// Whether slot `index` is removed (`dev remove` finished).
    pub fn is_removed(&self, index: usize) -> bool {
        self.lock_commit().sb.devices.get(index).is_some_and(|e| e.removed)
    }

    /// The recorded path of removed slot `index`, if it is one.
    pub fn removed_path(&self, index: usize) -> Option<String> {
        let ctl = self.lock_commit();
        ctl.sb.devices.get(index).filter(|e| e.removed).map(|e| e.path.clone())
    }

    /// Wipe the label `dev` still carries for removed slot `index` (a
    /// crash came between the removal's checkpoint and the wipe). True if
    /// it was this slot's label; another device is never touched.
    pub fn wipe_removed_label(&self, index: usize, dev: &dyn Device) -> Result<bool> {
        let (pool_uuid, uuid) = {
            let ctl = self.lock_commit();
            match ctl.sb.devices.get(index).filter(|e| e.removed) {
                Some(e) => (ctl.sb.pool_uuid, e.uuid),
                None => return Err(EngineError::InvalidArgument(format!("member {index} is not removed"))),
            }
        };
        match crate::device::label::read_label(dev) {
            Ok(l) if l.current.pool_uuid == pool_uuid && l.current.device_uuid == uuid => {
                wipe_label(dev)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}
