//! The client side of a fixed-newstyle handshake (everything after the
//! server's greeting: client flags, options, and whatever follows a GO)
//! against the real server code over a Unix socket pair, memory exports.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarn_fuzz::nbd::{run, Setup};

fuzz_target!(|data: &[u8]| {
    run(data, Setup::default());
});
