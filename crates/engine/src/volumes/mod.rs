//! Creating, resizing and deleting volumes: the administrative side of
//! plain volumes (snapshots and clones are in `snapshot.rs`). Each change
//! is one op, durable when the call returns.

pub mod clean;
mod coarse;
mod dead_relayout;
pub mod detach;
pub mod device_placement;
pub mod evacuate;
pub mod files;
mod flatten;
mod gather;
pub mod hints;
pub mod layout;
pub mod members_snap;
pub mod object_layout;
pub mod parity;
pub mod quota;
pub mod reclaim;
pub mod relayout;
pub mod snapshot;
pub mod stripe;

use crate::error::{EngineError, Result};
use crate::map::state::State;
use crate::pool::{volume_named, CommitCtl, Pool, VolumeInfo};
use crate::space::placement::PlacementKind;
use tarn_format::ops::Op;
use tarn_format::superblock::incompat;
use tarn_format::BLOCK_SIZE;

/// Settings of a new volume besides its name and size.
#[derive(Debug, Clone, Copy, Default)]
pub struct VolumeOptions {
    /// Its own placement (None: the pool's default).
    pub placement: Option<PlacementKind>,
    /// Bytes of own space it may hold (rounded up to 4 KiB; None: no quota).
    pub quota: Option<u64>,
    /// Create it even past the pool's overcommit ratio.
    pub force: bool,
    /// Members its new data may go to, bit i for member i (0: any).
    pub devices: u16,
    /// Stripe it over this many members in units of this many bytes
    /// (`vol create --stripe N[:UNIT]`; `stripe.rs`).
    pub stripe: Option<(u32, u64)>,
    /// Keep single parity: this many data members plus one, in units of
    /// this many bytes (`vol create --parity N[:UNIT]`; `parity.rs`).
    pub parity: Option<(u32, u64)>,
}

impl Pool {
    /// Create a thin volume of `size` bytes (rounded up to 4 KiB); durable
    /// when it returns. The size may exceed the pool (overcommit).
    pub fn create_volume(&self, name: &str, size: u64) -> Result<VolumeInfo> {
        self.create_volume_placed(name, size, None)
    }

    /// [`Pool::create_volume`] with a placement of the volume's own (None:
    /// it follows the pool's default).
    pub fn create_volume_placed(&self, name: &str, size: u64, placement: Option<PlacementKind>) -> Result<VolumeInfo> {
        self.create_volume_with(name, size, &VolumeOptions { placement, ..Default::default() })
    }

    /// [`Pool::create_volume`] with a placement and a quota of its own,
    /// refused past the overcommit ratio unless forced.
    pub fn create_volume_with(&self, name: &str, size: u64, opts: &VolumeOptions) -> Result<VolumeInfo> {
        self.check_writable()?;
        files::check_user_name(name)?;
        let size = round_size(size)?;
        let quota = opts.quota.map(quota::round_quota).transpose()?;
        let refused = |inner: &crate::pool::Inner| {
            if inner.state.by_name.contains_key(name) {
                return Err(EngineError::VolumeExists(name.to_string()));
            }
            quota::check_overcommit(inner, 0, size, opts.force)
        };
        // A refused create does no I/O: check before the feature bits'
        // commits (and again under the lock below).
        refused(&self.read_inner())?;
        if opts.devices != 0 {
            self.check_members(opts.devices, 0)?;
        }
        let stripe = opts.stripe.map(|(n, unit)| self.stripe_for(n, unit, opts.devices)).transpose()?;
        if stripe.is_some() && opts.parity.is_some() {
            return Err(EngineError::InvalidArgument(
                "--stripe with --parity: a parity volume stripes its rows already; give one".into(),
            ));
        }
        let parity = opts.parity.map(|(n, unit)| self.parity_for(n, unit, opts.devices)).transpose()?;
        if opts.placement.is_some() {
            self.enable_feature(&mut self.lock_commit(), incompat::PLACEMENT)?;
        }
        if quota.is_some() {
            self.enable_feature(&mut self.lock_commit(), incompat::QUOTAS)?;
        }
        if opts.devices != 0 {
            self.enable_feature(&mut self.lock_commit(), incompat::DEVICE_PLACEMENT)?;
        }
        if stripe.is_some() {
            self.enable_feature(&mut self.lock_commit(), incompat::STRIPES)?;
        }
        if parity.is_some() {
            self.enable_feature(&mut self.lock_commit(), incompat::PARITY)?;
        }
        let id = {
            let mut inner = self.write_inner();
            refused(&inner)?;
            let id = inner.state.next_volume_id;
            let mut ops = vec![Op::VolCreate { vol: id, size, name: name.to_string() }];
            if let Some(p) = opts.placement {
                ops.push(Op::VolPlacement { vol: id, policy: Some(p.into()) });
            }
            if quota.is_some() {
                ops.push(Op::VolQuota { vol: id, quota });
            }
            if opts.devices != 0 {
                ops.push(Op::VolDevices { vol: id, devices: opts.devices });
            }
            if stripe.is_some() {
                ops.push(Op::VolStripe { vol: id, stripe });
            }
            if parity.is_some() {
                ops.push(Op::VolParity { vol: id, parity });
            }
            self.apply_ops(&mut inner, ops)?;
            id
        };
        self.flush()?;
        self.volume_info(id).ok_or(EngineError::VolumeGone(id))
    }

    /// Change where a volume's new data goes from now on (None: the pool's
    /// default). Data already written stays where it is; `pool compact`
    /// or a sequential rewrite moves it.
    pub fn set_placement(&self, name: &str, placement: Option<PlacementKind>) -> Result<VolumeInfo> {
        self.check_writable()?;
        volume_named(&self.read_inner().state, name)?;
        self.enable_feature(&mut self.lock_commit(), incompat::PLACEMENT)?;
        let id = {
            let mut inner = self.write_inner();
            let id = volume_named(&inner.state, name)?.id;
            self.apply_ops(&mut inner, vec![Op::VolPlacement { vol: id, policy: placement.map(Into::into) }])?;
            id
        };
        self.flush()?;
        self.volume_info(id).ok_or(EngineError::VolumeGone(id))
    }

    /// Set before a volume's first snapshot or clone: snapshot ops, and
    /// small dead lists kept in the catalog (INLINE_DEAD_LISTS), so a pool
    /// from before bit 19 gets it with its next snapshot and keeps its old
    /// dead lists as trees.
    pub(crate) fn snapshot_features(&self) -> u64 {
        let inline = if self.options.compat_no_inline_dead_lists { 0 } else { incompat::INLINE_DEAD_LISTS };
        incompat::SNAPSHOTS | inline
    }

    /// A feature bit (or bits, all set by one commit) must be durable before the first record that uses it
    /// (older builds then refuse the pool instead of failing on an
    /// unknown op).
    pub(crate) fn enable_feature(&self, ctl: &mut CommitCtl, bit: u64) -> Result<()> {
        if ctl.sb.incompat & bit == bit {
            self.enabled_features.fetch_or(bit, std::sync::atomic::Ordering::Release);
            return Ok(());
        }
        ctl.sb.incompat |= bit;
        self.commit_locked(ctl, true)?;
        self.enabled_features.fetch_or(bit, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Grow or shrink; shrinking discards the tail and needs `allow_shrink`.
    pub fn resize_volume(&self, name: &str, size: u64, allow_shrink: bool) -> Result<VolumeInfo> {
        self.resize_volume_forced(name, size, allow_shrink, false)
    }

    /// [`Pool::resize_volume`]; growing past the overcommit ratio needs `force`.
    pub fn resize_volume_forced(&self, name: &str, size: u64, allow_shrink: bool, force: bool) -> Result<VolumeInfo> {
        self.check_writable()?;
        let size = round_size(size)?;
        let id = {
            let mut inner = self.write_inner();
            let id = volume_named(&inner.state, name)?.id;
            let old = inner.state.volume(id).map(|v| v.size).unwrap_or(0);
            if inner.state.volume(id).is_some_and(|v| v.parity.is_some()) {
                return Err(EngineError::InvalidArgument(format!(
                    "{name} keeps parity: its parity units lie past its data rows, so its size is fixed (not built: resizing a parity volume)"
                )));
            }
            if size < old && !allow_shrink {
                return Err(EngineError::InvalidArgument(format!(
                    "shrinking {name} from {old} to {size} bytes discards its tail; pass --allow-shrink"
                )));
            }
            quota::check_overcommit(&inner, old, size, force)?;
            self.apply_ops(&mut inner, vec![Op::VolResize { vol: id, size }])?;
            id
        };
        self.flush()?;
        self.volume_info(id).ok_or(EngineError::VolumeGone(id))
    }

    /// Delete a volume; its space is free when this returns. A volume with
    /// snapshots goes only with `with_snapshots` (they go too); one whose
    /// snapshots have clones never.
    pub fn delete_volume(&self, name: &str, with_snapshots: bool) -> Result<()> {
        self.check_writable()?;
        {
            let mut ctl = self.lock_commit();
            // Refused before any I/O; then the maps it clears must not be merging.
            delete_op(&self.read_inner().state, name, with_snapshots)?;
            self.settle_checkpoint(&mut ctl)?;
            let mut inner = self.write_inner();
            let op = delete_op(&inner.state, name, with_snapshots)?;
            self.apply_ops(&mut inner, vec![op])?;
        }
        self.flush()
    }
}

/// The op that deletes volume `name`, or why it is refused.
fn delete_op(state: &State, name: &str, with_snapshots: bool) -> Result<Op> {
    let v = volume_named(state, name)?;
    let clones: Vec<String> = state.clones_of(v.id, None).iter().map(|c| c.name.clone()).collect();
    if !clones.is_empty() {
        return Err(EngineError::InUse {
            what: format!("volume {name}"),
            detail: format!("clones {} depend on its snapshots; flatten or delete them first", clones.join(", ")),
        });
    }
    if !v.snapshots.is_empty() && !with_snapshots {
        return Err(EngineError::InUse {
            what: format!("volume {name}"),
            detail: format!("it has {} snapshots; pass --recursive to delete them too", v.snapshots.len()),
        });
    }
    Ok(Op::VolDelete { vol: v.id })
}

/// Volume sizes are whole blocks: round up, refuse zero and absurd sizes.
fn round_size(size: u64) -> Result<u64> {
    const MAX: u64 = 1 << 60;
    if size == 0 || size > MAX {
        return Err(EngineError::InvalidArgument(format!("volume size must be between 1 byte and {MAX} bytes")));
    }
    Ok(size.div_ceil(BLOCK_SIZE) * BLOCK_SIZE)
}
