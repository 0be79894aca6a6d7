//! Spare devices mid-run (`Pool::add_spare`, `take_spare`, `drop_spare`),
//! with power cuts anywhere in them: a cut add reopens with the spare or
//! without it, a cut take with the slot a spare or a member, a cut drop
//! with it a spare or removed; the pool matches the model and checks clean
//! either way. No content changes: each is a forced checkpoint (add, take)
//! or a superblock rewrite (drop).

use crate::admin::Pending;
use crate::device::SimDevice;
use crate::run::Run;
use rand::Rng;
use std::sync::Arc;
use tarn_engine::{Device, Pool};

/// Most slots a run grows to (as `grow.rs`).
const MAX_DEVICES: usize = 4;

impl Run {
    /// With a spare in the pool, take it (2 in 3) or drop it; else add one.
    pub(crate) fn spare_op(&mut self) -> Result<(), String> {
        if self.mirrored {
            return Ok(());
        }
        let st = self.pool().status();
        match st.devices.iter().position(|d| d.state == "SPARE") {
            Some(i) if self.rng.random_range(0..3) < 2 => self.spare_take(i),
            Some(i) => self.spare_drop(i),
            None if st.devices.len() < MAX_DEVICES => self.spare_add(st.devices.len()),
            None => Ok(()),
        }
    }

    /// Add a spare at slot `index`: the device a cut add left behind, else
    /// a new one of the primary's size.
    fn spare_add(&mut self, index: usize) -> Result<(), String> {
        if self.devs.len() == index {
            let size = self.devs[0].size();
            self.devs.push(Arc::new(SimDevice::new(&format!("sim{index}"), size)));
        }
        let dev = self.devs[index].clone();
        let r = self.pool().add_spare(dev.clone() as Arc<dyn Device>, &dev.name());
        trace!("spare add {}: {r:?}", dev.name());
        let Some(_) = self.admin_outcome(Pending::SpareAdd { index }, Ok(()), r)? else { return Ok(()) };
        let d = &self.pool().status().devices[index];
        if d.state != "SPARE" || d.data_bytes != 0 {
            return Err(format!("spare {index} after its add: {} with {} data bytes", d.state, d.data_bytes));
        }
        Ok(())
    }

    /// Take spare `index`: its whole data area joins the pool, free.
    fn spare_take(&mut self, index: usize) -> Result<(), String> {
        let before = self.pool().status().free;
        let r = self.pool().take_spare(&|_| false);
        trace!("spare take {index}: {r:?}");
        let r = r.and_then(|t| t.ok_or(tarn_engine::EngineError::InvalidArgument("no spare taken".into())));
        let Some(t) = self.admin_outcome(Pending::SpareTake { index }, Ok(()), r)? else { return Ok(()) };
        let st = self.pool().status();
        let d = &st.devices[index];
        if t.index != index || d.state != "ONLINE" || d.free_bytes != t.data_bytes || st.free <= before {
            return Err(format!("spare {index} after its take ({t:?}): {} with {} free bytes", d.state, d.free_bytes));
        }
        Ok(())
    }

    /// Drop spare `index`: the slot reads REMOVED and its device carries no
    /// label (unless the cut came between the superblock and the wipe).
    fn spare_drop(&mut self, index: usize) -> Result<(), String> {
        let r = self.pool().drop_spare(index);
        trace!("spare drop {index}: {r:?}");
        let Some(_) = self.admin_outcome(Pending::SpareDrop { index }, Ok(()), r)? else { return Ok(()) };
        let cut = self.any_dead();
        if cut {
            // Cut during the wipe: the reopened pool must have the slot removed.
            self.crash_and_verify()?;
        }
        let state = self.pool().status().devices.get(index).map(|d| d.state);
        if state != Some("REMOVED") {
            return Err(format!("spare {index} reported dropped, now {state:?}"));
        }
        if !cut {
            if let Ok(uuid) = Pool::pool_uuid(self.devs[index].as_ref()) {
                return Err(format!("spare {index} dropped but its device still carries pool {uuid}'s label"));
            }
        }
        Ok(())
    }
}
