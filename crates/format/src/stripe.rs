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

/// Largest parity unit: 2^4 blocks (64 KiB): a partial-row write reads
/// the rest of its row, N x unit, so the unit stays small.
pub const MAX_PARITY_SHIFT: u8 = 4;
/// Members a parity set holds at least: 2 data units and the parity unit
/// (one data unit and its parity would be a mirror).
pub const MIN_PARITY_MEMBERS: u32 = 3;

/// A volume's parity layout (RAID-5 per volume, `tarn vol create --parity
/// N[:UNIT]`; op 21 VolParity, catalog volume flag PARITY, incompat bit 16
/// PARITY). Logical row k is the volume's data units kN..kN+N-1 plus one
/// parity unit (their XOR) kept in the volume's own map past its data
/// rows; the row's N+1 units go to the set's N+1 members, one each, the
/// parity's member rotating with k (left-symmetric, as md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parity {
    /// The parity set: bit i for member i, 3 to 16 members (N+1).
    pub devices: u16,
    /// log2 of the unit in 4 KiB blocks (0..=4: 4 KiB to 64 KiB).
    pub shift: u8,
}

impl Parity {
    /// The layout from its two encoded fields, if valid.
    pub fn from_parts(devices: u16, shift: u8) -> Option<Parity> {
        (devices.count_ones() >= MIN_PARITY_MEMBERS && shift <= MAX_PARITY_SHIFT).then_some(Parity { devices, shift })
    }

    /// Data units per row (N).
    pub fn data_units(&self) -> u64 {
        u64::from(self.devices.count_ones()) - 1
    }

    /// Blocks per unit.
    pub fn unit_blocks(&self) -> u64 {
        1 << self.shift
    }

    /// Data blocks per row (N x unit).
    pub fn row_blocks(&self) -> u64 {
        self.data_units() << self.shift
    }

    /// Rows a volume of `blocks` data blocks has (the last one may be
    /// partly past the volume's end: those blocks are never written).
    pub fn rows(&self, blocks: u64) -> u64 {
        blocks.div_ceil(self.row_blocks())
    }

    /// First logical block of the parity area of a volume of `blocks`.
    pub fn parity_start(&self, blocks: u64) -> u64 {
        self.rows(blocks) * self.row_blocks()
    }

    /// Logical blocks a volume of `blocks` data blocks maps at most: whole
    /// data rows, then one parity unit per row.
    pub fn map_blocks(&self, blocks: u64) -> u64 {
        self.rows(blocks) * (self.row_blocks() + self.unit_blocks())
    }

    /// Logical block of the parity of data block `lba` (same offset in
    /// its unit) in a volume of `blocks`.
    pub fn parity_block(&self, blocks: u64, lba: u64) -> u64 {
        let row = lba / self.row_blocks();
        self.parity_start(blocks) + (row << self.shift) + (lba & (self.unit_blocks() - 1))
    }

    /// The member logical block `lba` goes to in a volume of `blocks`: a
    /// data unit j of row k at position (k + 1 + j) mod (N+1) of the set,
    /// the row's parity at position k mod (N+1) (positions in ascending
    /// member index), so a row's units lie on distinct members.
    pub fn member_of(&self, blocks: u64, lba: u64) -> usize {
        let width = self.data_units() + 1;
        let start = self.parity_start(blocks);
        let pos = if lba >= start {
            ((lba - start) >> self.shift) % width
        } else {
            let (row, unit) = (lba / self.row_blocks(), (lba % self.row_blocks()) >> self.shift);
            (row + 1 + unit) % width
        };
        nth_member(self.devices, pos)
    }
}

/// The index of the `pos`-th set bit of `devices` (pos < its count).
fn nth_member(devices: u16, pos: u64) -> usize {
    let mut bits = devices;
    for _ in 0..pos {
        bits &= bits.wrapping_sub(1);
    }
    bits.trailing_zeros() as usize
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

    #[test]
    fn a_parity_row_s_units_lie_on_distinct_members() {
        // 3 data + parity over members 1, 2, 4, 6 in 16 KiB units; 100 blocks.
        let p = Parity::from_parts(0b101_0110, 2).unwrap();
        assert_eq!((p.data_units(), p.row_blocks(), p.rows(100)), (3, 12, 9));
        assert_eq!((p.parity_start(100), p.map_blocks(100)), (108, 144));
        for row in 0..9u64 {
            let mut seen: Vec<usize> = (0..3).map(|j| p.member_of(100, row * 12 + j * 4 + 1)).collect();
            seen.push(p.member_of(100, p.parity_block(100, row * 12)));
            seen.sort();
            assert_eq!(seen, vec![1, 2, 4, 6], "row {row}");
        }
        assert_eq!(p.parity_block(100, 12 + 5), 108 + 4 + 1);
        assert_eq!(p.member_of(100, p.parity_block(100, 0)), 1, "row 0's parity on position 0");
        assert_eq!(p.member_of(100, 0), 2);
        assert!(Parity::from_parts(0b11, 2).is_none(), "two members are a mirror");
        assert!(Parity::from_parts(0b111, 5).is_none(), "unit past 64 KiB");
    }
}
