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

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ")
    }

    /// Pins the encoding of a journal record: the header and a payload of
    /// ops of six kinds, every byte. A change here is a format change
    /// (docs/FORMAT.md, version log). The hex was not copied from the
    /// encoders: scripts/golden_format.py builds it from the tables of
    /// docs/FORMAT.md §Journal and §Journal payload (and its own CRC-32C).
    #[test]
    fn golden_record_bytes() {
        use crate::ops::{encode_ops, Op};
        let pba = (1 << 48) | 0x1234; // device 1, block 0x1234
        let ops = [
            Op::VolCreate { vol: 1, size: 1 << 20, name: "vol".into() },
            Op::Map { vol: 1, lba: 300, len: 2, pba, birth: 5 },
            Op::Sums { pba, sums: vec![0x98f9_4189, 0x1234_5678] },
            Op::Unmap { vol: 1, lba: 7, len: 200 },
            Op::SnapCreate { vol: 1, name: "s1".into(), created: 1_700_000_000 },
            Op::Regions { open: true, ids: vec![0, 70_000] },
        ];
        let payload = encode_ops(&ops);
        let rec = RecordHeader::encode_record(3, 42, 37, 5, &payload);
        let header = [
            "54 41 52 4e 4a 52 4e 4c", // 0 magic "TARNJRNL"
            "03 00 00 00 00 00 00 00", // 8 generation 3
            "2a 00 00 00 00 00 00 00", // 16 seq 42
            "25 00 00 00 00 00 00 00", // 24 self_block 37
            "5b 00 00 00",             // 32 payload_len 91
            "01 00 00 00",             // 36 blocks 1
            "05 00 00 00 00 00 00 00", // 40 epoch 5
            "ee a3 7c 21",             // 48 payload_crc (JPLD)
            "00 00 00 00 00 00 00 00", // 52 reserved
            "67 e3 9b ef",             // 60 header crc (JHDR, bytes 0..60)
        ]
        .join(" ");
        assert_eq!(hex(&rec[..HEADER_LEN]), header);
        let ops = [
            "06",                                                                // op count 6 (varint)
            "03 01 00 00 00 00 00 10 00 00 00 00 00 03 76 6f 6c", // VolCreate vol 1, size 1 MiB u64, name "vol"
            "01 01 00 00 00 ac 02 02 34 12 00 00 00 00 01 00 05", // Map vol 1, lba 300 (ac 02), len 2, pba u64, birth 5
            "0c 00 00 00 00 34 12 00 00 00 00 01 00 02 89 41 f9 98 78 56 34 12", // Sums vol 0, pba, n 2, 2 x crc u32
            "02 01 00 00 00 07 c8 01",                            // Unmap vol 1, lba 7, len 200 (c8 01)
            "06 01 00 00 00 00 f1 53 65 00 00 00 00 02 73 31",    // SnapCreate vol 1, created u64, name "s1"
            "0d 00 00 00 00 02 00 f0 a2 04",                      // RegionsOpen vol 0, n 2, regions 0 and 70000
        ]
        .join(" ");
        assert_eq!(hex(&rec[HEADER_LEN..HEADER_LEN + payload.len()]), ops);
        assert_eq!(rec.len(), 4096);
        assert!(rec[HEADER_LEN + payload.len()..].iter().all(|&b| b == 0), "zero to the block's end");
        let h = RecordHeader::decode(&rec, 37).unwrap();
        h.verify_payload(&payload).unwrap();
    }
}
