//! Quotas and the overcommit ratio in the snapshot workload (ops 22, 23).
//! The model keeps each volume's quota and the pool's ratio: they must
//! survive every crash (journal replay and checkpoints), a crash cutting
//! the change settles to the old or the new value, a volume never holds
//! more than its quota, and creating or growing past the ratio is refused
//! exactly when the model says so.

use crate::admin::{Expect, Pending};
use crate::model::BLOCK;
use crate::run::Run;
use rand::Rng;

/// Ratios the workload picks, in thousandths: the small ones bind often
/// with the workload's volumes on its tight pool.
const RATIOS: [u32; 5] = [500, 1000, 2000, 4000, 1_000_000];

impl Run {
    /// Set, change or remove a base volume's quota: above its use (and
    /// sometimes below, or 0: refused). Clones get none (a flatten copies
    /// without charging: see `volumes/quota.rs`).
    pub(crate) fn set_quota(&mut self) -> Result<(), String> {
        let bases: Vec<String> =
            self.model.vols.iter().filter(|(_, v)| v.origin.is_none()).map(|(n, _)| n.clone()).collect();
        if bases.is_empty() {
            return self.verify_all("no volume for a quota");
        }
        let vol = bases[self.rng.random_range(0..bases.len())].clone();
        let id = self.pool().volume_id(&vol).ok_or("model volume missing")?;
        let info = self.pool().volume_info(id).ok_or("no info")?;
        let used = info.allocated + info.snapshot_bytes;
        let (to, expect): (Option<u64>, Expect) = match self.rng.random_range(0..10) {
            0..=2 => (None, Ok(())),
            3 if used > BLOCK as u64 => (Some(used - BLOCK as u64), Err("QuotaBelowUse")),
            4 => (Some(0), Err("InvalidArgument")),
            _ => (Some(used + self.rng.random_range(0..64) * BLOCK as u64).filter(|&q| q > 0), Ok(())),
        };
        let from = self.model.vol(&vol).quota;
        let r = self.pool().set_quota(&vol, to);
        trace!("quota {vol} {from:?} -> {to:?} (used {used}): {:?}", r.as_ref().map(|i| i.quota));
        if let Ok(i) = &r {
            if i.quota != to {
                return Err(format!("set_quota {vol} {to:?} answered {:?}", i.quota));
            }
        }
        self.admin_outcome(Pending::VolQuota { vol, from, to }, expect, r).map(drop)
    }

    /// Set or clear the overcommit ratio (sometimes out of range: refused).
    pub(crate) fn set_overcommit(&mut self) -> Result<(), String> {
        let (to, expect): (Option<u32>, Expect) = match self.rng.random_range(0..12) {
            0..=3 => (None, Ok(())),
            4 => (Some(0), Err("InvalidArgument")),
            5 => (Some(1_000_001), Err("InvalidArgument")),
            r => (Some(RATIOS[r % RATIOS.len()]), Ok(())),
        };
        let from = self.model.overcommit;
        let r = self.pool().set_overcommit(to);
        trace!("overcommit {from:?} -> {to:?}: {r:?}");
        self.admin_outcome(Pending::Overcommit { from, to }, expect, r).map(drop)
    }

    /// Whether making a volume of `old` bytes `new` (0: a new one) is
    /// refused by the overcommit ratio, as the model sees it.
    pub(crate) fn over_ratio(&self, old: usize, new: usize) -> bool {
        let Some(m) = self.model.overcommit else { return false };
        let virtual_size: usize = self.model.vols.values().map(|v| v.current.len()).sum();
        let after = (virtual_size - old + new) as u128;
        new > old && after * 1000 > u128::from(self.pool().status().size) * u128::from(m)
    }

    /// The pool's quotas and ratio are the model's, and no volume holds
    /// more than its quota.
    pub(crate) fn verify_quotas(&self) -> Result<(), String> {
        let pool = self.pool();
        if pool.overcommit() != self.model.overcommit {
            return Err(format!("overcommit ratio {:?}, the model {:?}", pool.overcommit(), self.model.overcommit));
        }
        for (name, v) in &self.model.vols {
            let info = pool.volume_id(name).and_then(|id| pool.volume_info(id)).ok_or(format!("{name} missing"))?;
            if info.quota != v.quota {
                return Err(format!("volume {name}: quota {:?}, the model {:?}", info.quota, v.quota));
            }
            let used = info.allocated + info.snapshot_bytes;
            if v.quota.is_some_and(|q| used > q) {
                return Err(format!("volume {name} holds {used} bytes, over its quota {:?}", v.quota));
            }
        }
        Ok(())
    }
}
