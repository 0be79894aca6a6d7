//! The leg label: which mirror leg a physical device is. Every leg of a
//! mirrored slot carries the same superblocks (they are written through the
//! mirror), so the one thing that tells legs apart lives in a block of the
//! label area the superblocks leave free. See docs/FORMAT.md §Mirrors.

use crate::checksum::{seal, unseal};
use crate::codec::Writer;
use crate::error::Result;
use crate::BLOCK_SIZE;

pub const LEG_MAGIC: [u8; 8] = *b"TARNLEG1";
/// Salt of the leg label checksum ("LEGL").
pub const SALT_LEG_LABEL: u32 = 0x4c45_474c;
/// Block of the label area holding the leg label (reserved, zero, on
/// devices that are not mirror legs).
pub const LEG_LABEL_BLOCK: u64 = 1;
const CRC_OFFSET: usize = 4092;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegLabel {
    pub pool_uuid: [u8; 16],
    /// The slot's uuid (its device table entry and superblock device_uuid).
    pub slot_uuid: [u8; 16],
    pub slot_index: u16,
    /// This leg (its entry in the slot's leg list).
    pub leg_uuid: [u8; 16],
}

impl LegLabel {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(BLOCK_SIZE as usize);
        w.bytes(&LEG_MAGIC);
        w.bytes(&self.pool_uuid);
        w.bytes(&self.slot_uuid);
        w.u16(self.slot_index);
        w.u16(0);
        w.bytes(&self.leg_uuid);
        debug_assert_eq!(w.len(), 60);
        seal(&mut w, SALT_LEG_LABEL, CRC_OFFSET);
        w.buf.resize(BLOCK_SIZE as usize, 0);
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<LegLabel> {
        let mut r = unseal(buf, &LEG_MAGIC, SALT_LEG_LABEL, CRC_OFFSET, "leg label")?;
        let pool_uuid = r.array()?;
        let slot_uuid = r.array()?;
        let slot_index = r.u16()?;
        r.u16()?;
        let leg_uuid = r.array()?;
        Ok(LegLabel { pool_uuid, slot_uuid, slot_index, leg_uuid })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leg_label_round_trips_and_detects_flips() {
        let l = LegLabel { pool_uuid: [1; 16], slot_uuid: [2; 16], slot_index: 3, leg_uuid: [4; 16] };
        let bytes = l.encode();
        assert_eq!(bytes.len(), 4096);
        assert_eq!(&bytes[0..8], b"TARNLEG1");
        assert_eq!(&bytes[40..42], &[3, 0]);
        assert_eq!(LegLabel::decode(&bytes).unwrap(), l);
        let mut b = bytes.clone();
        b[50] ^= 1;
        assert!(LegLabel::decode(&b).is_err());
        assert!(LegLabel::decode(&[0u8; 4096]).is_err(), "a zero block is no leg");
    }
}
