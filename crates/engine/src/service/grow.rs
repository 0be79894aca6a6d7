//! Adding a member device online (`tarn dev add`). The device table (in
//! the superblock) and the per-device space maps (in the catalog) change
//! together, by one checkpoint: the new member's label is written and
//! flushed first, then its space map joins the pool with allocation
//! avoiding it, a forced checkpoint writes a catalog with that map and a
//! superblock listing the member, and only then may data go there. A
//! crash before that superblock is durable leaves the old pool (the new
//! device's label names a member no table lists: it may be added again);
//! after it, the new one. No journal op and no feature bit: pools of
//! several members exist since format 1.

use crate::device::label::{read_label, uuid_string, write_both_labels};
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::pool::Pool;
use crate::service::open::{random_bytes, MIN_DATA_BLOCKS};
use std::sync::Arc;
use tarn_format::superblock::{DeviceEntry, Superblock, LABEL_BLOCKS, MAX_DEVICE_ENTRIES};
use tarn_format::BLOCK_SIZE;

/// What `add_device` did.
#[derive(Debug, Clone)]
pub struct AddReport {
    pub index: usize,
    pub path: String,
    /// Bytes of its data area, free and usable.
    pub data_bytes: u64,
}

impl Pool {
    /// Add `dev` (recorded as `path`) as a new member; its space is
    /// usable when this returns, and durable (checkpointed). Refuses a
    /// device of another pool, one already a member, one too small, one
    /// that cannot be written, and a full device table, changing nothing.
    pub fn add_device(&self, dev: Arc<dyn Device>, path: &str) -> Result<AddReport> {
        self.add_member(dev, path, false)
    }

    /// Add `dev` as a spare (`tarn dev add --spare`, `members/spare.rs`):
    /// the same steps as a member, but its table entry says spare (state 3)
    /// and its space map is empty until it is taken.
    pub fn add_spare(&self, dev: Arc<dyn Device>, path: &str) -> Result<AddReport> {
        self.add_member(dev, path, true)
    }

    fn add_member(&self, dev: Arc<dyn Device>, path: &str, spare: bool) -> Result<AddReport> {
        self.check_writable()?;
        let mut ctl = self.lock_commit();
        self.refuse_new_member(&ctl.sb, dev.as_ref(), path)?;
        // The checkpoint in progress was frozen without the new space map:
        // its superblock must not list the member.
        self.settle_checkpoint(&mut ctl)?;
        let index = ctl.sb.devices.len();
        let blocks = dev.size() / BLOCK_SIZE;
        let entry = DeviceEntry {
            uuid: random_bytes::<16>()?,
            blocks,
            path: path.to_string(),
            legs: Vec::new(),
            draining: false,
            placement: None,
            removed: false,
            spare,
            rebuilt: None,
            replacing: None,
        };
        let mut label = member_label(&ctl.sb, &entry, index);
        label.created_unix = ctl.sb.created_unix;
        let mut table = ctl.sb.clone();
        table.devices.push(entry.clone());
        if !table.fits() {
            return Err(EngineError::InvalidArgument(format!(
                "path {path} does not fit in the device table (too long for the entries already there)"
            )));
        }
        // Written and flushed before any superblock lists it: an open
        // that finds the member always finds its label.
        write_both_labels(dev.as_ref(), &label)
            .and_then(|()| dev.flush().map_err(|e| EngineError::io("flush superblock", dev.name(), e)))
            .map_err(|e| refine_write_error(e, dev.as_ref()))?;
        // A member (not a spare) in a slot a present-member replace can
        // use, as members are at open (`service/replace.rs`).
        let slot: Arc<dyn Device> = match spare {
            true => dev.clone(),
            false => Arc::new(crate::device::rebuild_slot::RebuildSlot::whole(index, dev.clone())),
        };
        if self.devices.push(slot) != Some(index) {
            return Err(EngineError::InvalidArgument("device table full".into()));
        }
        // A spare's area is empty: nothing is allocated there, and its
        // space map holds nothing until `take_spare` extends it.
        let end = if spare { LABEL_BLOCKS } else { blocks };
        self.write_inner().space.add_device(LABEL_BLOCKS, end)?;
        ctl.adding = Some(entry);
        self.commit_locked(&mut ctl, true)?;
        if ctl.adding.is_some() || ctl.sb.devices.len() != index + 1 {
            // A forced commit always writes its checkpoint: a defect.
            self.fenced.store(true, std::sync::atomic::Ordering::SeqCst);
            return Err(EngineError::InvalidArgument("the checkpoint adding the member was not written".into()));
        }
        if spare {
            log::info!("device {path} added as spare {index}: {} blocks when taken", blocks - LABEL_BLOCKS);
        } else {
            self.write_inner().space.open_device(index);
            log::info!("device {path} added as member {index}: {} blocks of data area", blocks - LABEL_BLOCKS);
        }
        Ok(AddReport { index, path: path.to_string(), data_bytes: (blocks - LABEL_BLOCKS) * BLOCK_SIZE })
    }

    /// Every reason `dev` cannot become a member, before anything is written.
    fn refuse_new_member(&self, sb: &Superblock, dev: &dyn Device, path: &str) -> Result<()> {
        let name = dev.name();
        let bad = |why: String| Err(EngineError::InvalidArgument(why));
        if sb.devices.len() >= MAX_DEVICE_ENTRIES {
            return bad(format!("the pool has {MAX_DEVICE_ENTRIES} members, the most a device table holds"));
        }
        let members = sb.devices.iter().filter(|d| !d.removed);
        if members.clone().any(|d| d.path == path || d.legs.iter().any(|l| l.path == path))
            || self
                .devices
                .iter()
                .enumerate()
                .any(|(i, d)| !sb.devices.get(i).is_some_and(|e| e.removed) && d.name() == name)
        {
            let spare = members.clone().any(|d| d.spare && d.path == path);
            let what = if spare { "a spare" } else { "a member" };
            return bad(format!("device {path} is already {what} of this pool"));
        }
        if let Ok(l) = read_label(dev) {
            let l = l.current;
            if l.pool_uuid != sb.pool_uuid {
                return bad(format!(
                    "device {path} belongs to another pool ({}); destroy that pool or wipe the device first",
                    uuid_string(&l.pool_uuid)
                ));
            }
            // A removed slot's label (a crash came before its wipe) is no member's.
            if l.is_primary() || members.clone().any(|d| d.uuid == l.device_uuid) {
                return bad(format!("device {path} is already a member of this pool (member {})", l.device_index));
            }
            // Else: the label of an add a crash cut short; taken again.
        }
        let need = (LABEL_BLOCKS + MIN_DATA_BLOCKS) * BLOCK_SIZE;
        if dev.size() < need {
            return bad(format!("device {path} is too small: {} bytes, a member needs at least {need}", dev.size()));
        }
        Ok(())
    }
}

/// The superblock of member `index` (its own label; the table is the
/// primary's).
pub(crate) fn member_label(primary: &Superblock, entry: &DeviceEntry, index: usize) -> Superblock {
    Superblock {
        version: primary.version,
        incompat: primary.incompat,
        ro_compat: primary.ro_compat,
        compat: primary.compat,
        pool_uuid: primary.pool_uuid,
        device_uuid: entry.uuid,
        device_index: index as u16,
        flags: 0,
        txid: 1,
        device_blocks: entry.blocks,
        data_start: LABEL_BLOCKS,
        journal_start: 0,
        journal_blocks: 0,
        journal_generation: primary.journal_generation,
        checkpoint: Default::default(),
        created_unix: 0,
        devices: Vec::new(),
    }
}

/// A write refused because the device is read-only says so.
fn refine_write_error(e: EngineError, dev: &dyn Device) -> EngineError {
    match &e {
        EngineError::Io { source, .. }
            if source.raw_os_error() == Some(30) || source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            EngineError::InvalidArgument(format!("device {} is read-only: {source}", dev.name()))
        }
        _ => e,
    }
}
