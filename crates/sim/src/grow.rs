//! Adding member devices mid-run (`Pool::add_device`), with power cuts
//! that can land anywhere in it: the reopened pool has the member or not,
//! and checks clean either way. Members also grow (`Pool::grow_device`),
//! cut the same way.

use crate::admin::Pending;
use crate::device::SimDevice;
use crate::run::{Control, Run};
use rand::Rng;
use std::sync::Arc;
use tarn_engine::{Device, Pool};

/// Most devices a run grows to (the table takes 16; small keeps runs fast).
const MAX_DEVICES: usize = 4;

impl Run {
    /// Add a device: the one a cut add left behind (its label names this
    /// pool but no table lists it), else a new one of the primary's size.
    pub(crate) fn dev_add(&mut self) -> Result<(), String> {
        if self.mirrored {
            // The last device is the primary's second leg, not a member.
            return Ok(());
        }
        let index = self.pool().devices().len();
        if index >= MAX_DEVICES {
            return Ok(());
        }
        if self.devs.len() == index {
            let size = self.devs[0].size();
            let dev = Arc::new(SimDevice::new(&format!("sim{index}"), size));
            if self.control == Some(Control::AddedDeviceIgnoresFlushes) {
                dev.ignore_flushes();
            }
            self.devs.push(dev);
        }
        let dev = self.devs[index].clone();
        let r = self.pool().add_device(dev.clone() as Arc<dyn Device>, &dev.name());
        trace!("dev add {}: {r:?}", dev.name());
        self.admin_outcome(Pending::DevAdd { index }, Ok(()), r).map(drop)
    }
}

impl Run {
    /// Grow a member by 256 KiB to 2 MiB past the device's size.
    pub(crate) fn dev_grow(&mut self) -> Result<(), String> {
        if self.mirrored {
            return Ok(());
        }
        let n = self.pool().devices().len();
        let index = self.rng.random_range(0..n);
        if matches!(self.pool().status().devices[index].state, "REMOVED" | "DRAINING" | "SPARE") {
            return Ok(()); // Refused: covered by the e2e test.
        }
        let from = self.pool().status().devices[index].data_bytes;
        let bytes = self.devs[index].size() + self.rng.random_range(1..=8u64) * (256 << 10);
        let r = self.pool().grow_device(index, bytes);
        trace!("dev grow {index} to {bytes}: {r:?}");
        self.admin_outcome(Pending::DevGrow { index, from }, Ok(()), r).map(drop)
    }
}

impl Run {
    /// Evacuate a random member other than the primary (`dev remove`):
    /// refused as the engine's own check predicts (the rest cannot hold
    /// its live data), else every live block leaves it; then, half the
    /// time, the removal is cancelled so later writes may use it again.
    /// A crash may cut it anywhere: the reopened pool must read as the
    /// model says, whichever moves landed.
    pub(crate) fn dev_remove(&mut self) -> Result<(), String> {
        let n = self.pool().devices().len();
        if self.mirrored || n < 2 {
            return Ok(());
        }
        let index = self.rng.random_range(1..n);
        if self.rng.random_bool(0.25) {
            // Store nodes are written to the roomiest member: a checkpoint
            // now may leave some on this one, for the removal's last step
            // to move (a crash may cut the checkpoint: the reopen replays).
            match self.pool().checkpoint() {
                Err(_) if self.any_dead() => return Ok(()),
                Err(e) => return Err(format!("checkpoint before dev remove {index}: {e}")),
                Ok(()) => {}
            }
        }
        let expect = match self.pool().refuse_removal(index) {
            Ok(_) => Ok(()),
            Err(_) => Err("InvalidArgument"),
        };
        let r = self.pool().evacuate_device(index, &mut |_, _| true);
        trace!("dev remove {index}: {r:?}");
        if matches!(r, Err(tarn_engine::EngineError::NoSpace)) && !self.any_dead() {
            // Room the check counted that placement could not use (the
            // reserve, region rules): moved so far stays, like a write's.
            self.stats.enospc += 1;
            return self.cancel_removal(index);
        }
        let Some(report) = self.admin_outcome(Pending::DevRemove { index }, expect, r)? else { return Ok(()) };
        if report.remaining_bytes != 0 {
            return Err(format!("member {index} still holds live data after its evacuation: {report:?}"));
        }
        let live = self.pool().live_blocks_on(index).map_err(|e| e.to_string())?;
        if live != 0 {
            return Err(format!("member {index}: {live} live blocks after an evacuation reported none"));
        }
        self.stats.blocks_evacuated += (report.moved_bytes / 4096) as usize;
        if let Some(d) = &report.detached {
            return self.check_detached(index, d.nodes_moved);
        }
        if self.rng.random_bool(0.5) {
            return self.cancel_removal(index);
        }
        Ok(())
    }

    /// The last step of a removal: the slot reads REMOVED, holds no space,
    /// and the device carries no pool label (unless the power was cut
    /// before its wipe: then the next reopen shows the slot removed).
    fn check_detached(&mut self, index: usize, nodes: u64) -> Result<(), String> {
        self.stats.devices_removed += 1;
        self.stats.nodes_rewritten += nodes as usize;
        let st = self.pool().status();
        let d = &st.devices[index];
        if d.state != "REMOVED" || d.data_bytes != 0 || d.free_bytes != 0 {
            return Err(format!("member {index} after its removal: {} with {} data bytes", d.state, d.data_bytes));
        }
        if self.any_dead() {
            // Cut after the removal's checkpoint (during the label's wipe):
            // the reopened pool must have the slot removed.
            self.crash_and_verify()?;
            self.stats.removals_cut_done += 1;
            let state = self.pool().status().devices.get(index).map(|d| d.state);
            if state != Some("REMOVED") {
                return Err(format!("member {index} reported removed, reopened {state:?}"));
            }
            return Ok(());
        }
        if let Ok(uuid) = Pool::pool_uuid(self.devs[index].as_ref()) {
            return Err(format!("member {index} removed but its device still carries pool {uuid}'s label"));
        }
        Ok(())
    }

    /// `dev remove --cancel`: one superblock rewrite, no content change; a
    /// power cut during it is a crash like any other (the member reopens
    /// draining or not, the model is unchanged either way).
    fn cancel_removal(&mut self, index: usize) -> Result<(), String> {
        match self.pool().undrain_device(index) {
            Ok(()) => Ok(()),
            Err(_) if self.any_dead() => self.crash_and_verify(),
            Err(e) => Err(format!("cancelling the removal of member {index}: {e}")),
        }
    }
}
