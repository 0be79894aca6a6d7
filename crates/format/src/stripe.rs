//! A volume's stripe layout (RAID-0 per volume, `tarn vol create
//! --stripe N[:UNIT]`): logical stripe unit k of the volume goes to the
//! (k mod N)-th member of its stripe set, the set's members taken in
//! ascending index order. Op 20 (VolStripe) and the catalog volume flag
//! STRIPE carry it (docs/FORMAT.md; incompat bit 15 STRIPES).

/// Largest stripe unit: 2^14 blocks (64 MiB).
pub const MAX_STRIPE_SHIFT: u8 = 14;
/// Members a stripe set holds at least (one member is no stripe).
pub const MIN_STRIPE_MEMBERS: u32 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stripe {
    /// The stripe set: bit i for member i, 2 to 16 members.
    pub devices: u16,
    /// log2 of the stripe unit in 4 KiB blocks (0..=14: 4 KiB to 64 MiB).
    pub shift: u8,
}

impl Stripe {
    /// The stripe from its two encoded fields, if valid.
    pub fn from_parts(devices: u16, shift: u8) -> Option<Stripe> {
        (devices.count_ones() >= MIN_STRIPE_MEMBERS && shift <= MAX_STRIPE_SHIFT).then_some(Stripe { devices, shift })
    }

    /// Members in the set.
    pub fn width(&self) -> u32 {
        self.devices.count_ones()
    }

    /// Blocks per stripe unit.
    pub fn unit_blocks(&self) -> u64 {
        1 << self.shift
    }

    /// The member logical block `lba` goes to: unit k = lba >> shift goes
    /// to the (k mod N)-th set bit of `devices`.
    pub fn member_of(&self, lba: u64) -> usize {
        let k = (lba >> self.shift) % u64::from(self.width());
        let mut left = k;
        let mut bits = self.devices;
        loop {
            let i = bits.trailing_zeros() as usize;
            if left == 0 {
                return i;
            }
            left -= 1;
            bits &= bits - 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_go_round_the_set_in_index_order() {
        let s = Stripe::from_parts(0b1011_0000, 4).unwrap();
        assert_eq!(s.width(), 3);
        let members: Vec<usize> = (0..7).map(|k| s.member_of(k * 16)).collect();
        assert_eq!(members, vec![4, 5, 7, 4, 5, 7, 4]);
        assert_eq!(s.member_of(15), 4, "a unit's last block stays on its member");
        assert!(Stripe::from_parts(0b1000, 4).is_none(), "one member is no stripe");
        assert!(Stripe::from_parts(0b11, 15).is_none(), "unit past 64 MiB");
        assert_eq!(Stripe::from_parts(0xffff, 14).map(|s| s.width()), Some(16));
    }
}
