//! `decode_node` on arbitrary blocks (extent, range and sums codecs). The input is padded to a block and
//! its checksum fixed up, and the expected address, tree and level are
//! taken from its own header, so the fuzzer reaches the field and entry
//! decoding behind them. A decoded node must re-encode to a block that
//! decodes to the same node; nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_format::node::SumsValue;
use tarn_format::node::{
    decode_node, encode_node, node_crc, Expect, ExtentValue, LeafValue, NodeBody, RangeValue, NODE_CRC_OFFSET,
    NODE_SIZE,
};
use tarn_format::Pba;

fn check<V: LeafValue>(block: &[u8]) {
    let u64_at = |o: usize| u64::from_le_bytes(block[o..o + 8].try_into().expect("8 bytes"));
    let expect = Expect { pba: Pba(u64_at(8)), crc: node_crc(block), tree: u64_at(24), level: block[33] };
    let Ok((header, body)) = decode_node::<V>(block, &expect) else { return };
    if header.codec != V::CODEC {
        return;
    }
    let again = encode_node(&header, &body);
    let expect = Expect { crc: node_crc(&again), ..expect };
    let (h2, b2): (_, NodeBody) = decode_node::<V>(&again, &expect).expect("a re-encoded node decodes");
    assert_eq!((h2, b2), (header, body));
}

fuzz_target!(|data: &[u8]| {
    let mut block = data.to_vec();
    block.resize(NODE_SIZE, 0);
    let crc = node_crc(&block);
    block[NODE_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
    check::<ExtentValue>(&block);
    check::<RangeValue>(&block);
    check::<SumsValue>(&block);
});
