//! Checkpoints. First byte: bit 0 means the next 64 bytes are a segment
//! header for `SegmentHeader::decode` (read at the address it names; bit 1
//! reseals its checksum); the rest is a checkpoint payload, walked whole
//! with `CheckpointDecoder` (volumes, extents, snapshots, dead lists) and
//! round-tripped through `CheckpointEncoder`, then rebuilt into an engine
//! state by `tarn_engine::decode_checkpoint_state` (what `Pool::open` does
//! with a format 1 checkpoint, to upgrade it). The same payload is also
//! decoded as a format 2 catalog (`Catalog::decode`) and round-tripped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_format::catalog::Catalog;
use tarn_format::checkpoint::{SegmentHeader, SEGMENT_HEADER_LEN};
use tarn_fuzz::{reseal, samples};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut payload)) = data.split_first() else {
        return;
    };
    if flags & 1 != 0 {
        let Some(head) = payload.get(..SEGMENT_HEADER_LEN) else {
            return;
        };
        let mut head = head.to_vec();
        if flags & 2 != 0 {
            reseal::segment_header(&mut head);
        }
        let at = reseal::get_u64(&head, 24);
        if let Ok(h) = SegmentHeader::decode(&head, at) {
            assert_eq!(SegmentHeader::decode(&h.encode(), at), Ok(h));
        }
        payload = &payload[SEGMENT_HEADER_LEN..];
    }
    if let Ok(ckpt) = samples::decode_checkpoint(payload) {
        let again = samples::encode_checkpoint(&ckpt);
        assert_eq!(samples::decode_checkpoint(&again), Ok(ckpt));
    }
    let _ = tarn_engine::decode_checkpoint_state(payload);
    if let Ok(c) = Catalog::decode(payload) {
        assert_eq!(Catalog::decode(&c.encode()), Ok(c));
    }
});
