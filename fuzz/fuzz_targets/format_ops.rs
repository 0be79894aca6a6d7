//! `decode_ops` on arbitrary bytes (a journal payload); decoded ops must
//! round-trip, and are then applied to an empty engine state in order with
//! `State::apply`, as journal replay does (an op that does not fit is an
//! error, never a panic).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_engine::state::State;
use tarn_format::ops::{decode_ops, encode_ops};

fuzz_target!(|data: &[u8]| {
    let Ok(ops) = decode_ops(data) else {
        return;
    };
    assert_eq!(decode_ops(&encode_ops(&ops)).as_ref(), Ok(&ops));
    let mut state = State::default();
    let mut freed = Vec::new();
    for op in &ops {
        let _ = state.apply(op, &mut freed);
    }
});
