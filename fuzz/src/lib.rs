//! Helpers shared by the fuzz targets (`fuzz_targets/`) and the seed
//! generator (`examples/gen_corpus.rs`): checksum resealing, the NBD session
//! driver, and a deterministic pool image.

pub mod image;
pub mod nbd;
pub mod reseal;
pub mod samples;
