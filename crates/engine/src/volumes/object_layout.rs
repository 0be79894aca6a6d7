//! Per-file placement and protection (Loris: a layout per file; issue 15
//! item 6, docs/ARCHITECTURE.md *File volumes*, per-file layout): a file
//! object carries the same per-volume settings a block volume has (its
//! own placement, op VolPlacement; the members its new data goes to, op 24
//! VolDevices; a stripe, op 20 VolStripe). A file is mirrored when its
//! data goes only to mirrored members. No format of its own: the ops and
//! feature bits are the block volumes'.

use crate::error::{EngineError, Result};
use crate::pool::Pool;
use crate::space::placement::PlacementKind;
use crate::volumes::layout::Holder;
use tarn_format::ops::Op;
use tarn_format::stripe::Stripe;
use tarn_format::superblock::incompat;
use tarn_format::BLOCK_SIZE;

/// Where an object's new data goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectLayout {
    /// Its own placement (None: the member's or the pool's default).
    pub placement: Option<PlacementKind>,
    /// Members its new data may go to, bit i for member i (0: any).
    pub devices: u16,
    /// Striped over this many members in units of this many bytes.
    pub stripe: Option<(u32, u64)>,
}

/// An [`ObjectLayout`] checked against the pool, its stripe set chosen.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Resolved {
    pub(crate) placement: Option<PlacementKind>,
    pub(crate) devices: u16,
    pub(crate) stripe: Option<Stripe>,
}

/// The ops giving volume `vol` the settings of `r` (none for defaults).
pub(crate) fn layout_ops(vol: u32, r: &Resolved) -> Vec<Op> {
    let mut ops = Vec::new();
    if let Some(p) = r.placement {
        ops.push(Op::VolPlacement { vol, policy: Some(p.into()) });
    }
    if r.devices != 0 {
        ops.push(Op::VolDevices { vol, devices: r.devices });
    }
    if r.stripe.is_some() {
        ops.push(Op::VolStripe { vol, stripe: r.stripe });
    }
    ops
}

fn stripe_pair(s: &Stripe) -> (u32, u64) {
    (s.width(), s.unit_blocks() * BLOCK_SIZE)
}

impl Pool {
    /// The members that are mirrors and take new data (bit i for member
    /// i): a degraded mirror is still one.
    pub fn mirrored_members(&self) -> u16 {
        // Spares, removed and draining members take no new data: not usable.
        let inner = self.read_inner();
        let usable = |i: usize| i < inner.space.devices.len() && inner.space.usable(i);
        let mirrors = self.mirrors.iter().enumerate().take(16);
        mirrors.filter(|(i, m)| m.is_some() && usable(*i)).fold(0u16, |set, (i, _)| set | 1 << i)
    }

    /// Check `layout` against the pool (members exist, stripe fits) and
    /// set the feature bits its ops need (one commit each, the first
    /// time only): a refusal writes nothing.
    pub(crate) fn resolve_layout(&self, layout: &ObjectLayout) -> Result<Resolved> {
        if layout.devices != 0 {
            self.check_members(layout.devices, 0)?;
        }
        let stripe = layout.stripe.map(|(n, unit)| self.stripe_for(n, unit, layout.devices)).transpose()?;
        let mut bits = 0;
        if layout.placement.is_some() {
            bits |= incompat::PLACEMENT;
        }
        if layout.devices != 0 {
            bits |= incompat::DEVICE_PLACEMENT;
        }
        if stripe.is_some() {
            bits |= incompat::STRIPES;
        }
        // The commit lock (held by a commit through its device flush) only
        // the first time: tarn-fs creates files under its namespace lock.
        if bits != 0 && !self.has_feature(bits) {
            self.enable_feature(&mut self.lock_commit(), bits)?;
        }
        Ok(Resolved { placement: layout.placement, devices: layout.devices, stripe })
    }

    /// Check `layout` as [`Pool::resolve_layout`] does (for a rule given
    /// before any file uses it).
    pub fn check_object_layout(&self, layout: &ObjectLayout) -> Result<()> {
        self.resolve_layout(layout).map(drop)
    }

    /// A new object of file volume `owner` laid out as `layout`: its
    /// create and layout ops in one record. Not flushed.
    pub fn create_object_laid_out(&self, owner: u32, size: u64, layout: &ObjectLayout) -> Result<u32> {
        let resolved = self.resolve_layout(layout)?;
        self.create_object_resolved(owner, size, &resolved)
    }

    /// The layout object `id` has now.
    pub fn object_layout(&self, id: u32) -> Result<ObjectLayout> {
        let inner = self.read_inner();
        let v = super::files::object_of(&inner.state, id)?;
        Ok(ObjectLayout {
            placement: v.placement.map(PlacementKind::from),
            devices: v.devices,
            stripe: v.stripe.as_ref().map(stripe_pair),
        })
    }

    /// Give object `id` `layout` for the data written from now on (data
    /// already written stays where it is): ops for what differs, queued,
    /// durable at the next commit. A stripe changes only while the object
    /// maps nothing (its units would be cut differently).
    pub fn set_object_layout(&self, id: u32, layout: &ObjectLayout) -> Result<()> {
        self.check_writable()?;
        let now = self.object_layout(id)?;
        if now.stripe != layout.stripe && self.object_maps_any(id)? {
            return Err(EngineError::InvalidArgument(
                "the stripe of a file is set before it has data (copy it to a new file to restripe)".into(),
            ));
        }
        let r = self.resolve_layout(layout)?;
        let mut ops = Vec::new();
        if now.placement != layout.placement {
            ops.push(Op::VolPlacement { vol: id, policy: layout.placement.map(Into::into) });
        }
        if now.devices != layout.devices {
            ops.push(Op::VolDevices { vol: id, devices: layout.devices });
        }
        if now.stripe != layout.stripe {
            ops.push(Op::VolStripe { vol: id, stripe: r.stripe });
        }
        if ops.is_empty() {
            return Ok(());
        }
        let mut inner = self.write_inner();
        super::files::object_of(&inner.state, id)?;
        self.apply_ops(&mut inner, ops)
    }

    fn object_maps_any(&self, id: u32) -> Result<bool> {
        let inner = self.read_inner();
        let v = super::files::object_of(&inner.state, id)?;
        Ok(v.map.physical_blocks() + v.map.origin_blocks() > 0)
    }

    /// Blocks of object `id` its head holds on each member (index i:
    /// member i), so a user can see where a file's data is.
    pub fn object_blocks_per_member(&self, id: u32) -> Result<Vec<u64>> {
        super::files::object_of(&self.read_inner().state, id)?;
        let mut per = vec![0u64; self.devices.len()];
        self.held_runs(id, &mut |runs| {
            for r in runs.iter().filter(|r| r.holder != Holder::Snapshots) {
                if let Some(n) = per.get_mut(usize::from(r.device)) {
                    *n += r.len;
                }
            }
        })?;
        Ok(per)
    }
}
