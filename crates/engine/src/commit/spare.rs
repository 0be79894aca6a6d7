//! Spare devices (`tarn dev add --spare`, issue 12 item 3: the pool grows a
//! file-backed member up to a limit, then takes a configured spare). A
//! spare is a slot of the device table in state 3 (incompat bit SPARES):
//! labelled like a member, with an empty data area and an empty space map,
//! so nothing is ever allocated there. Taking it is a growth of that empty
//! area to the whole device by the growth protocol (`grow.rs`): the area
//! joins the space map held in flight, one forced checkpoint writes the
//! catalog with it and a superblock in which the slot is a member, then
//! the range is released. A crash before that superblock is durable leaves
//! the spare a spare; after it, a member. Dropping a spare (`dev remove`)
//! is a superblock rewrite to state 2 (removed): the space maps are the
//! same (empty) either way; its label is wiped after.

use crate::error::{EngineError, Result};
use crate::pool::{CommitCtl, Pool};
use std::sync::atomic::Ordering;
use tarn_format::superblock::{incompat, LABEL_BLOCKS};
use tarn_format::BLOCK_SIZE;

/// What `take_spare` did.
#[derive(Debug, Clone)]
pub struct TakeReport {
    pub index: usize,
    pub path: String,
    /// Bytes of data area the pool gained.
    pub data_bytes: u64,
}

/// What `drop_spare` did.
#[derive(Debug, Clone)]
pub struct DropReport {
    pub index: usize,
    pub path: String,
    /// Both label copies zeroed; false when that failed (logged): the
    /// pool no longer lists the device either way.
    pub label_wiped: bool,
}

impl Pool {
    /// Take the first usable spare (present, lowest index) as a member,
    /// unless `enough` says under the commit lock that the pool has room
    /// already (a take or growth another caller finished meanwhile).
    /// `Ok(None)`: no spare to take, or room.
    pub fn take_spare(&self, enough: &dyn Fn(&Pool) -> bool) -> Result<Option<TakeReport>> {
        self.check_writable()?;
        let mut ctl = self.lock_commit();
        if enough(self) {
            return Ok(None);
        }
        let Some(index) = self.usable_spare(&ctl) else { return Ok(None) };
        self.take_locked(&mut ctl, index).map(Some)
    }

    /// The lowest spare slot whose device was found at open.
    fn usable_spare(&self, ctl: &CommitCtl) -> Option<usize> {
        let spares = ctl.sb.devices.iter().enumerate().filter(|(_, e)| e.spare);
        spares.map(|(i, _)| i).find(|&i| self.devices.get(i).is_some_and(|d| d.present()))
    }

    fn take_locked(&self, ctl: &mut CommitCtl, index: usize) -> Result<TakeReport> {
        let entry = ctl.sb.devices[index].clone();
        self.settle_checkpoint(ctl)?;
        let held = self.write_inner().space.grow_device(index, entry.blocks)?;
        ctl.taking = Some(index);
        self.commit_locked(ctl, true)?;
        if ctl.taking.is_some() || ctl.sb.devices.get(index).is_none_or(|e| e.spare) {
            // A forced commit always writes its checkpoint: a defect.
            self.fenced.store(true, Ordering::SeqCst);
            return Err(EngineError::InvalidArgument("the checkpoint taking the spare was not written".into()));
        }
        {
            let mut inner = self.write_inner();
            inner.space.release_growth(held.0, held.1)?;
            inner.space.open_device(index);
        }
        let data_bytes = (entry.blocks - LABEL_BLOCKS) * BLOCK_SIZE;
        Ok(TakeReport { index, path: entry.path, data_bytes })
    }

    /// Drop spare `index` (`dev remove` of a spare): its slot becomes
    /// removed (state 2) by a superblock rewrite, then its label is wiped.
    /// Durable when it returns, with every write answered before it.
    pub fn drop_spare(&self, index: usize) -> Result<DropReport> {
        self.check_writable()?;
        // A refusal does no I/O: checked before the commit below.
        if !self.is_spare(index) {
            return Err(EngineError::InvalidArgument(format!("device {index} is not a spare")));
        }
        // Like every admin command, it commits what was written before it.
        self.flush()?;
        let mut ctl = self.lock_commit();
        let Some(entry) = ctl.sb.devices.get(index).filter(|e| e.spare).cloned() else {
            return Err(EngineError::InvalidArgument(format!("device {index} is not a spare")));
        };
        let bits = incompat::EVACUATION | incompat::REMOVAL;
        self.rewrite_member_entry(&mut ctl, index, bits, |e| {
            e.spare = false;
            e.removed = true;
        })?;
        drop(ctl);
        let dev = self.devices.get(index).cloned();
        // A missing spare has nothing to wipe.
        let label_wiped = match dev.filter(|d| d.present()) {
            Some(d) => crate::device::label::wipe_label(d.as_ref())
                .inspect_err(|e| log::warn!("spare {index}: label not wiped: {e}"))
                .is_ok(),
            None => false,
        };
        log::info!("spare {index} ({}) dropped from the pool", entry.path);
        Ok(DropReport { index, path: entry.path, label_wiped })
    }

    /// Whether slot `index` is a spare.
    pub fn is_spare(&self, index: usize) -> bool {
        self.lock_commit().sb.devices.get(index).is_some_and(|e| e.spare)
    }
}
