//! `Pool::open` (read-only) and `Pool::check` on a damaged copy of a small
//! valid pool image (`tarn_fuzz::image`): superblocks, journal records
//! (replayed through `State::apply`), checkpoint segments and payload
//! (`decode_state`), free-space rebuild. The input is a list of edits plus
//! flags that reseal checksums and append a journal record of arbitrary
//! ops (see `tarn_fuzz::image::apply_input`). Open must return Ok or a
//! typed error, and the checker must not panic, whatever the bytes.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tarn_fuzz::image::{apply_input, build, open, Image};

fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let img = build();
        let pool = open(img.bytes.clone()).expect("the undamaged pool image opens");
        let report = pool.check();
        assert!(report.is_clean(), "the undamaged pool image is not clean: {:?}", report.problems);
        img
    })
}

fuzz_target!(|data: &[u8]| {
    let img = image();
    if let Ok(pool) = open(apply_input(img, data)) {
        let _ = pool.check();
    }
});
