//! `decode_trace` on arbitrary bytes (a request trace file): an error or
//! records that encode back to the same bytes, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_format::trace::{decode_trace, encode_header};

fuzz_target!(|data: &[u8]| {
    let Ok((start, records)) = decode_trace(data) else {
        return;
    };
    let mut again = encode_header(start).to_vec();
    records.iter().for_each(|r| r.encode(&mut again));
    let (start2, records2) = decode_trace(&again).expect("re-encoded trace decodes");
    assert_eq!((start2, &records2), (start, &records));
});
