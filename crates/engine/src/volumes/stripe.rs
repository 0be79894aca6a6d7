//! Striping per volume (RAID-0, `tarn vol create --stripe N[:UNIT]`;
//! format: op 20 VolStripe, catalog volume flag STRIPE, incompat bit 15
//! STRIPES). The map stays as it is: striping is a placement constraint.
//! The write path (`io/`) cuts a striped volume's holes at stripe units
//! and places unit k on the (k mod N)-th member of its stripe set; when
//! that member cannot take it (full, or being removed) the piece goes to
//! any of the volume's members, so the volume sees ENOSPC only when
//! the pool would.

use crate::error::{EngineError, Result};
use crate::pool::Pool;
use tarn_format::stripe::{Stripe, MAX_STRIPE_SHIFT};
use tarn_format::BLOCK_SIZE;

/// The default stripe unit: 64 KiB.
pub const DEFAULT_STRIPE_UNIT: u64 = 64 << 10;

impl Pool {
    /// The stripe set for a new volume striped over `width` members in
    /// units of `unit` bytes: the `width` usable members (not spares,
    /// removed or being removed; among `devices` when that names any) with
    /// the most free space. Refuses a unit that is not a power of two
    /// multiple of 4 KiB up to 64 MiB, fewer than 2 members, and more
    /// members than the pool (or the volume's device set) has usable.
    pub(crate) fn stripe_for(&self, width: u32, unit: u64, devices: u16) -> Result<Stripe> {
        let bad = |why: String| Err(EngineError::InvalidArgument(why));
        let max = BLOCK_SIZE << MAX_STRIPE_SHIFT;
        if !unit.is_power_of_two() || !(BLOCK_SIZE..=max).contains(&unit) {
            return bad(format!("a stripe unit of {unit} bytes: give a power of two from 4 KiB to 64 MiB"));
        }
        if width < 2 {
            return bad(format!("a stripe over {width} member(s): give 2 or more"));
        }
        let set = self.roomiest_set(width as usize, devices, &format!("a stripe over {width} members"))?;
        let shift = (unit / BLOCK_SIZE).trailing_zeros() as u8;
        Stripe::from_parts(set, shift).ok_or(EngineError::InvalidArgument(format!("a stripe over set {set:#b}")))
    }

    /// The `width` usable members (not spares, removed or being removed;
    /// among `devices` when that names any) with the most free space, ties
    /// to the lower index, as a set; refused (`what` names the layout) when
    /// there are fewer.
    pub(crate) fn roomiest_set(&self, width: usize, devices: u16, what: &str) -> Result<u16> {
        // Allocation avoids spares, removed and draining members (the
        // avoid bits): they are not usable. No commit lock: a refusal does
        // no I/O (taking it may rewrite a mirror's superblock).
        let inner = self.read_inner();
        let named = |i: usize| devices == 0 || (i < 16 && devices & (1 << i) != 0);
        let mut usable: Vec<(u64, usize)> = (0..inner.space.devices.len().min(16))
            .filter(|&i| named(i) && inner.space.usable(i))
            .map(|i| (inner.space.devices[i].free_blocks, i))
            .collect();
        if usable.len() < width {
            let among = if devices == 0 { "the pool has" } else { "the volume's --devices set has" };
            return Err(EngineError::InvalidArgument(format!(
                "{what}: {among} {} usable (spares, removed and draining members do not count)",
                usable.len()
            )));
        }
        usable.sort_by_key(|&(free, i)| (std::cmp::Reverse(free), i));
        Ok(usable[..width].iter().fold(0u16, |set, &(_, i)| set | 1 << i))
    }
}
