//! Adding member devices mid-run (`Pool::add_device`), with power cuts
//! that can land anywhere in it: the reopened pool has the member or not,
//! and checks clean either way. Members also grow (`Pool::grow_device`),
//! cut the same way.

use crate::admin::Pending;
use crate::device::SimDevice;
use crate::run::{Control, Run};
use rand::Rng;
use std::sync::Arc;
use tarn_engine::Device;

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
        let from = self.pool().status().devices[index].data_bytes;
        let bytes = self.devs[index].size() + self.rng.random_range(1..=8u64) * (256 << 10);
        let r = self.pool().grow_device(index, bytes);
        trace!("dev grow {index} to {bytes}: {r:?}");
        self.admin_outcome(Pending::DevGrow { index, from }, Ok(()), r).map(drop)
    }
}
