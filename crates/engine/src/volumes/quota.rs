//! Per-volume quotas and the pool's overcommit guard (issue 12 item 6).
//!
//! A quota bounds a volume's own space: what its head maps plus what only
//! its snapshots hold (`Volume::used_blocks`, kept by the map counters, so
//! the write path checks it without a scan). A clone's blocks still read
//! from its origin count to the origin; what the clone wrote or copied
//! counts to the clone. A write that would allocate past the quota fails
//! with `QuotaExceeded` (ENOSPC on the wire) before any space is taken;
//! writes in place, TRIM and deletes never allocate and always go on.
//!
//! The overcommit ratio bounds the sum of block volumes' virtual sizes
//! against the pool's size: creating or growing past it needs force. It
//! is a guard for admins (LVM thin warns, ZFS refuses a non-sparse zvol),
//! not a write-path limit: thin volumes stay thin.

use crate::error::{EngineError, Result};
use crate::map::state::State;
use crate::pool::{volume_named, Inner, Pool, VolumeInfo};
use tarn_format::ops::{Op, MAX_OVERCOMMIT_MILLI};
use tarn_format::superblock::incompat;
use tarn_format::BLOCK_SIZE;

impl Pool {
    /// Set or clear (`None`) a volume's quota in bytes, rounded up to
    /// 4 KiB. A quota below what the volume holds now is refused.
    pub fn set_quota(&self, name: &str, quota: Option<u64>) -> Result<VolumeInfo> {
        self.check_writable()?;
        let quota = quota.map(round_quota).transpose()?;
        // Refused before the feature bit's commit (and again under the lock).
        quota_op(&self.read_inner(), name, quota)?;
        self.enable_feature(&mut self.lock_commit(), incompat::QUOTAS)?;
        let id = {
            let mut inner = self.write_inner();
            let op = quota_op(&inner, name, quota)?;
            let id = volume_named(&inner.state, name)?.id;
            self.apply_ops(&mut inner, vec![op])?;
            id
        };
        self.flush()?;
        self.volume_info(id).ok_or(EngineError::VolumeGone(id))
    }

    /// Set or clear the overcommit ratio in thousandths of the pool's
    /// size (2000: virtual sizes may reach twice the pool). Volumes
    /// already past it stay; only new creations and growths are checked.
    pub fn set_overcommit(&self, milli: Option<u32>) -> Result<()> {
        self.check_writable()?;
        if let Some(m) = milli {
            if m == 0 || m > MAX_OVERCOMMIT_MILLI {
                return Err(EngineError::InvalidArgument(format!(
                    "overcommit ratio {} must be above 0 and at most {}",
                    ratio(m),
                    ratio(MAX_OVERCOMMIT_MILLI)
                )));
            }
        }
        self.enable_feature(&mut self.lock_commit(), incompat::QUOTAS)?;
        {
            let mut inner = self.write_inner();
            self.apply_ops(&mut inner, vec![Op::PoolOvercommit { milli }])?;
        }
        self.flush()
    }

    /// The overcommit ratio in thousandths (None: no limit).
    pub fn overcommit(&self) -> Option<u32> {
        self.read_inner().state.overcommit_milli
    }
}

/// The VolQuota op for `name`, or why it is refused.
fn quota_op(inner: &Inner, name: &str, quota: Option<u64>) -> Result<Op> {
    let v = volume_named(&inner.state, name)?;
    if let Some(q) = quota {
        let pending = inner.quota_pending.get(&v.id).copied().unwrap_or(0);
        let used = (v.used_blocks() + pending) * BLOCK_SIZE;
        if q < used {
            return Err(EngineError::QuotaBelowUse { volume: name.to_string(), quota: q, used });
        }
    }
    Ok(Op::VolQuota { vol: v.id, quota })
}

/// A quota in bytes rounded up to whole blocks; 0 is refused (say none).
pub(crate) fn round_quota(q: u64) -> Result<u64> {
    if q == 0 {
        return Err(EngineError::InvalidArgument("a quota of 0 bytes; say none to remove a quota".into()));
    }
    q.div_ceil(BLOCK_SIZE)
        .checked_mul(BLOCK_SIZE)
        .ok_or_else(|| EngineError::InvalidArgument(format!("quota {q} bytes is too large")))
}

fn ratio(milli: u32) -> String {
    format!("{}.{:03}", milli / 1000, milli % 1000)
}

/// Refuse (unless `force`) a change that makes the block volumes' virtual
/// sizes exceed the overcommit ratio: `old` bytes of one volume become
/// `new` (0 and the new size for a creation).
pub(crate) fn check_overcommit(inner: &Inner, old: u64, new: u64, force: bool) -> Result<()> {
    let Some(m) = inner.state.overcommit_milli else { return Ok(()) };
    if force || new <= old {
        return Ok(());
    }
    let virtual_after = virtual_size(&inner.state) - old + new;
    let pool = inner.space.data_blocks() * BLOCK_SIZE;
    // u128: a 16 EiB sum times 1000 does not fit u64.
    if u128::from(virtual_after) * 1000 > u128::from(pool) * u128::from(m) {
        return Err(EngineError::Overcommit { virtual_after, pool, ratio: ratio(m) });
    }
    Ok(())
}

/// Sum of block volumes' sizes (file volumes and objects are not counted,
/// as in `pool status`).
pub(crate) fn virtual_size(state: &State) -> u64 {
    state.volumes.values().filter(|v| v.role.is_none()).map(|v| v.size).sum()
}
