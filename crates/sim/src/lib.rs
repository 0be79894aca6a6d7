//! Deterministic simulation of tarn: simulated devices with crash and fault
//! injection, a reference model, and seeded runs that replay exactly.

pub mod device;
pub mod model;
pub mod run;

pub use device::SimDevice;
pub use run::{run_seed, SimConfig};

/// Seeds to run: `TARN_SEED=N` replays one; otherwise `count` from `TARN_SEED_BASE` (default 0).
pub fn seeds(count: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("TARN_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![seed];
    }
    let base = std::env::var("TARN_SEED_BASE").ok().and_then(|s| s.parse().ok()).unwrap_or(0u64);
    (base..base + count).collect()
}
