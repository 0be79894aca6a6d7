//! A journal record as replay reads it: `RecordHeader::decode`, then
//! `verify_payload` and `decode_ops` on the payload it announces. First
//! byte: bit 0 reseals both checksums, bit 1 reads the record at the block
//! it names (else at block 32). Decoded ops and headers must round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_format::journal::{RecordHeader, HEADER_LEN};
use tarn_format::ops::{decode_ops, encode_ops};
use tarn_fuzz::reseal;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut buf = rest.to_vec();
    if flags & 1 != 0 {
        reseal::journal_record(&mut buf);
    }
    let block = if flags & 2 != 0 && buf.len() >= 32 { reseal::get_u64(&buf, 24) } else { 32 };
    let Ok(h) = RecordHeader::decode(&buf, block) else {
        return;
    };
    let Some(payload) = buf.get(HEADER_LEN..HEADER_LEN + h.payload_len as usize) else {
        return;
    };
    if h.verify_payload(payload).is_err() {
        return;
    }
    let rec = RecordHeader::encode_record(h.generation, h.seq, h.self_block, h.epoch, payload);
    assert_eq!(RecordHeader::decode(&rec, block), Ok(h));
    if let Ok(ops) = decode_ops(payload) {
        assert_eq!(decode_ops(&encode_ops(&ops)), Ok(ops));
    }
});
