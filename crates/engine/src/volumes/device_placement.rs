//! Per-device layout (Loris: a layout per physical device, which no
//! anchor has): a member may carry its own default placement policy
//! (`tarn dev set --placement`), used for data on it of volumes that name
//! no policy of their own, and a volume may name the members its new data
//! goes to (`vol create --devices`, `vol set --devices`). Together: an
//! `append` member for random-write logs, an `inplace` one for databases,
//! and volumes pinned to either.
//!
//! A member's default lives in the superblock's device table (incompat
//! DEVICE_PLACEMENT: a policy byte per entry), rewritten at once like a
//! draining member's state; a volume's members are op 24 (VolDevices) in
//! the journal and the DEVICES flag of its catalog entry.

use crate::error::{EngineError, Result};
use crate::pool::Pool;
use crate::space::placement::PlacementKind;
use crate::volumes::{volume_named, VolumeInfo};
use tarn_format::ops::Op;
use tarn_format::superblock::{incompat, MAX_DEVICE_ENTRIES};

impl Pool {
    /// Give member `index` a default placement (None: none; its data then
    /// follows the pool's default). Durable when it returns, with every
    /// write answered before it. Data already written stays where it is.
    pub fn set_device_placement(&self, index: usize, placement: Option<PlacementKind>) -> Result<()> {
        self.check_writable()?;
        self.check_members(1 << index.min(15), index)?;
        // A refusal does no I/O: checked before the commit below.
        if self.lock_commit().sb.devices.get(index).is_some_and(|e| e.removed) {
            return Err(EngineError::InvalidArgument(format!("device {index} was removed from this pool")));
        }
        // Like every admin command, it commits what was written before it.
        self.flush()?;
        let mut ctl = self.lock_commit();
        let code = placement.map(Into::into);
        if ctl.sb.devices.get(index).is_some_and(|e| e.placement == code) {
            return Ok(());
        }
        self.rewrite_member_entry(&mut ctl, index, incompat::DEVICE_PLACEMENT, |e| e.placement = code)?;
        let mut inner = self.write_inner();
        if inner.device_placement.len() <= index {
            inner.device_placement.resize(index + 1, None);
        }
        inner.device_placement[index] = placement;
        Ok(())
    }

    /// Each member's own default placement, by index (None: none).
    pub fn device_placements(&self) -> Vec<Option<PlacementKind>> {
        let inner = self.read_inner();
        (0..self.devices.len()).map(|i| inner.device_placement.get(i).copied().flatten()).collect()
    }

    /// Let volume `name`'s new data go only to the members in `devices`
    /// (bit i for member i; 0: any). Durable when it returns; data already
    /// written stays where it is (`pool compact` does not move it across
    /// members).
    pub fn set_volume_devices(&self, name: &str, devices: u16) -> Result<VolumeInfo> {
        self.check_writable()?;
        volume_named(&self.read_inner().state, name)?;
        self.check_members(devices, 0)?;
        self.enable_feature(&mut self.lock_commit(), incompat::DEVICE_PLACEMENT)?;
        let id = {
            let mut inner = self.write_inner();
            let id = volume_named(&inner.state, name)?.id;
            self.apply_ops(&mut inner, vec![Op::VolDevices { vol: id, devices }])?;
            id
        };
        self.flush()?;
        self.volume_info(id).ok_or(EngineError::VolumeGone(id))
    }

    /// Every member named in `devices` (and `index`) exists.
    pub(crate) fn check_members(&self, devices: u16, index: usize) -> Result<()> {
        let members = self.devices.len();
        let missing = (0..MAX_DEVICE_ENTRIES).find(|&d| devices & (1 << d) != 0 && d >= members);
        match missing.or((index >= members).then_some(index)) {
            Some(d) => Err(EngineError::InvalidArgument(format!(
                "device {d} is not a member of this pool (members are 0 to {})",
                members - 1
            ))),
            None => Ok(()),
        }
    }
}
