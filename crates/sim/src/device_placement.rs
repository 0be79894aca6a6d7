//! Per-device layout in the snapshot workload: a member's default
//! placement (the device table's policy byte, rewritten at once) and the
//! members a volume's new data may go to (op 24). The model keeps both:
//! they survive every crash, a cut change settles to the old or the new
//! value, and clones inherit their origin's members.

use crate::admin::{Expect, Pending};
use crate::run::Run;
use rand::Rng;
use tarn_engine::PlacementKind;

impl Run {
    pub(crate) fn device_placement_op(&mut self) -> Result<(), String> {
        if self.rng.random_bool(0.4) {
            self.set_device_placement()
        } else {
            self.set_volume_devices()
        }
    }

    /// Give a member (sometimes one that does not exist: refused) a
    /// policy, or none.
    fn set_device_placement(&mut self) -> Result<(), String> {
        let members = self.pool().devices().len();
        let index = self.rng.random_range(0..=members);
        let to = match self.rng.random_range(0..=PlacementKind::NAMES.len()) {
            0 => None,
            k => Some(PlacementKind::NAMES[k - 1]),
        };
        // A member that does not exist, or a slot `dev remove` emptied,
        // is refused.
        let removed = self.pool().status().devices.get(index).is_some_and(|d| d.state == "REMOVED");
        let expect: Expect = if index < members && !removed { Ok(()) } else { Err("InvalidArgument") };
        let from = self.model.device_placement.get(index).copied().flatten();
        let r = self.pool().set_device_placement(index, to.and_then(PlacementKind::parse));
        trace!("device {index} placement {from:?} -> {to:?}: {r:?}");
        self.admin_outcome(Pending::DevPlacement { index, from, to }, expect, r).map(drop)
    }

    /// Restrict a volume to some members (sometimes naming one that does
    /// not exist: refused), or let it use any.
    fn set_volume_devices(&mut self) -> Result<(), String> {
        let names: Vec<String> = self.model.vols.keys().cloned().collect();
        if names.is_empty() {
            return self.verify_all("no volume for a device set");
        }
        let vol = names[self.rng.random_range(0..names.len())].clone();
        let members = self.pool().devices().len();
        let to: u16 = match self.rng.random_range(0..6) {
            0 => 0,
            1 => 1 << members.min(15),
            _ => self.rng.random_range(1..(1u32 << members.min(15))) as u16,
        };
        let expect: Expect = if to >> members.min(16) == 0 { Ok(()) } else { Err("InvalidArgument") };
        let from = self.model.vol(&vol).devices;
        let r = self.pool().set_volume_devices(&vol, to);
        trace!("volume {vol} devices {from:#b} -> {to:#b}: {:?}", r.as_ref().map(|i| i.devices));
        self.admin_outcome(Pending::VolDevices { vol, from, to }, expect, r).map(drop)
    }

    /// The pool's member policies and volume members are the model's.
    pub(crate) fn verify_device_placement(&self) -> Result<(), String> {
        let pool = self.pool();
        for (i, p) in pool.device_placements().iter().enumerate() {
            let want = self.model.device_placement.get(i).copied().flatten();
            if p.map(|k| k.name()) != want {
                return Err(format!("member {i} placement {p:?}, the model {want:?}"));
            }
        }
        for (name, v) in &self.model.vols {
            let info = pool.volume_id(name).and_then(|id| pool.volume_info(id)).ok_or(format!("{name} missing"))?;
            if info.devices != v.devices {
                return Err(format!("volume {name}: devices {:#b}, the model {:#b}", info.devices, v.devices));
            }
        }
        Ok(())
    }
}
