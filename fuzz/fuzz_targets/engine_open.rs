//! `Pool::open` (read-only) and `Pool::check` on a damaged copy of a small
//! valid pool image the engine wrote (`tarn_fuzz::image`): superblocks,
//! journal records (replayed through `State::apply`), the checkpoint's
//! segments and catalog, the copy-on-write tree nodes it names (read
//! lazily, checked against their parents' checksums), free-space maps. The
//! input is a list of edits plus flags that reseal checksums, append a
//! journal record of arbitrary ops, or pick the larger image with branch
//! nodes (see `tarn_fuzz::image::apply_input`). Open must return Ok or a
//! typed error, and the checker must not panic, whatever the bytes.
#![no_main]

use std::sync::{Arc, Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use tarn_fuzz::image::{
    apply_input_into, build_flavour, device, flavour_of, locked, open, open_device, Flavour, Image,
};

fn checked(flavour: Flavour) -> Image {
    let img = build_flavour(flavour);
    let pool = open(img.bytes.clone()).expect("the undamaged pool image opens");
    let report = pool.check();
    assert!(report.is_clean(), "the undamaged pool image is not clean: {:?}", report.problems);
    img
}

fn image(flavour: Flavour) -> &'static Image {
    static SMALL: OnceLock<Image> = OnceLock::new();
    static BRANCHES: OnceLock<Image> = OnceLock::new();
    let cell = match flavour {
        Flavour::Small => &SMALL,
        Flavour::Branches => &BRANCHES,
    };
    cell.get_or_init(|| checked(flavour))
}

/// The device bytes of the previous run, reused: a fresh copy of the
/// image each run costs more (mapping, page faults) than opening it.
static SCRATCH: Mutex<Vec<u8>> = Mutex::new(Vec::new());

fuzz_target!(|data: &[u8]| {
    let img = image(flavour_of(data));
    let mut bytes = std::mem::take(&mut *SCRATCH.lock().unwrap_or_else(|p| p.into_inner()));
    apply_input_into(img, data, &mut bytes);
    let dev = Arc::new(device(bytes));
    if let Ok(pool) = open_device(dev.clone()) {
        let _ = pool.check();
    }
    *SCRATCH.lock().unwrap_or_else(|p| p.into_inner()) = std::mem::take(&mut *locked(&dev));
});
