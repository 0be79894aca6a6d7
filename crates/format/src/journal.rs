//! Journal records: one per commit, appended block-aligned in the journal
//! region of the primary device. See docs/FORMAT.md §Journal.

use crate::address::BLOCK_SIZE;
use crate::checksum::{checksum, seal, unseal, SALT_JOURNAL_HEADER, SALT_JOURNAL_PAYLOAD};
use crate::codec::Writer;
use crate::error::{FormatError, Result};

pub const JOURNAL_MAGIC: [u8; 8] = *b"TARNJRNL";
pub const HEADER_LEN: usize = 64;
const HEADER_CRC_OFFSET: usize = 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// Must equal the superblock's journal generation.
    pub generation: u64,
    /// Commit sequence number: the checkpoint's seq + 1, + 2, ... in order.
    pub seq: u64,
    /// Block (within the device) where this record starts.
    pub self_block: u64,
    pub payload_len: u32,
    /// Record length in blocks, header included.
    pub blocks: u32,
    /// The pool's current epoch once this commit applies.
    pub epoch: u64,
    pub payload_crc: u32,
}

impl RecordHeader {
    pub fn blocks_for(payload_len: usize) -> u64 {
        (HEADER_LEN + payload_len).div_ceil(BLOCK_SIZE as usize) as u64
    }

    /// The whole record: header, payload, zero padding to a block boundary.
    pub fn encode_record(generation: u64, seq: u64, self_block: u64, epoch: u64, payload: &[u8]) -> Vec<u8> {
        let blocks = Self::blocks_for(payload.len());
        let h = RecordHeader {
            generation,
            seq,
            self_block,
            payload_len: u32::try_from(payload.len()).expect("journal payload under 4 GiB"),
            blocks: u32::try_from(blocks).expect("journal record under 2^32 blocks"),
            epoch,
            payload_crc: checksum(SALT_JOURNAL_PAYLOAD, payload),
        };
        let mut w = Writer::with_capacity((blocks * BLOCK_SIZE) as usize);
        w.bytes(&JOURNAL_MAGIC);
        w.u64(h.generation);
        w.u64(h.seq);
        w.u64(h.self_block);
        w.u32(h.payload_len);
        w.u32(h.blocks);
        w.u64(h.epoch);
        w.u32(h.payload_crc);
        seal(&mut w, SALT_JOURNAL_HEADER, HEADER_CRC_OFFSET);
        w.bytes(payload);
        w.buf.resize((blocks * BLOCK_SIZE) as usize, 0);
        w.buf
    }

    /// Decode the header in the first block of a record read at `block`.
    pub fn decode(buf: &[u8], block: u64) -> Result<RecordHeader> {
        const WHAT: &str = "journal record";
        let mut r = unseal(buf, &JOURNAL_MAGIC, SALT_JOURNAL_HEADER, HEADER_CRC_OFFSET, WHAT)?;
        let h = RecordHeader {
            generation: r.u64()?,
            seq: r.u64()?,
            self_block: r.u64()?,
            payload_len: r.u32()?,
            blocks: r.u32()?,
            epoch: r.u64()?,
            payload_crc: r.u32()?,
        };
        if h.self_block != block {
            return Err(FormatError::Misplaced { what: WHAT, stored: h.self_block, actual: block });
        }
        if u64::from(h.blocks) != Self::blocks_for(h.payload_len as usize) {
            return Err(r.bad("blocks", u64::from(h.blocks)));
        }
        Ok(h)
    }

    /// Check the payload (the bytes after the header, `payload_len` long).
    pub fn verify_payload(&self, payload: &[u8]) -> Result<()> {
        let computed = checksum(SALT_JOURNAL_PAYLOAD, payload);
        if computed != self.payload_crc {
            return Err(FormatError::BadChecksum { what: "journal payload", stored: self.payload_crc, computed });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_and_detects_damage() {
        let payload = vec![9u8; 5000];
        let rec = RecordHeader::encode_record(4, 17, 40, 2, &payload);
        assert_eq!(rec.len(), 8192);
        let h = RecordHeader::decode(&rec, 40).unwrap();
        assert_eq!((h.generation, h.seq, h.epoch, h.payload_len), (4, 17, 2, 5000));
        h.verify_payload(&rec[HEADER_LEN..HEADER_LEN + 5000]).unwrap();
        assert!(RecordHeader::decode(&rec, 41).is_err());
        let mut torn = rec.clone();
        torn[HEADER_LEN + 4097] ^= 1;
        assert!(h.verify_payload(&torn[HEADER_LEN..HEADER_LEN + 5000]).is_err());
        let mut bad = rec;
        bad[20] ^= 1;
        assert!(RecordHeader::decode(&bad, 40).is_err());
    }
}
