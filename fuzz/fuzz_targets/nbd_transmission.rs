//! Requests after a completed handshake. The first byte picks the
//! handshake (see `tarn_fuzz::nbd::handshake`: structured replies, metadata
//! contexts, read-only export, EXPORT_NAME; bit 4 runs requests on two
//! worker threads); the rest is sent as the transmission phase, so request
//! headers, lengths, flags, payloads, structured replies and block status
//! for every negotiated context are exercised against the memory export.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_fuzz::nbd::{handshake, run, Setup};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, requests)) = data.split_first() else {
        return;
    };
    let mut client = handshake(mode);
    client.extend_from_slice(requests);
    run(&client, Setup { workers: if mode & 0x10 != 0 { 2 } else { 0 } });
});
