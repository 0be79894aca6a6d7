//! Deterministic simulation of tarn: simulated devices with crash and fault
//! injection, a reference model, and seeded runs that replay exactly.

/// Whether `TARN_SIM_TRACE` asks for every step on stderr.
fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("TARN_SIM_TRACE").is_some())
}

macro_rules! trace {
    ($($arg:tt)*) => { if crate::tracing() { eprintln!($($arg)*); } };
}

pub mod accounting;
mod admin;
pub mod device;
mod device_placement;
pub mod faultsim;
pub mod fixture;
mod grow;
pub mod model;
mod quota;
pub mod run;
pub mod settle;
mod spare;
mod verify;
mod workload;

pub use device::SimDevice;
pub use run::{run_seed, Control, RunStats, SimConfig, Workload, OP_NAMES};

/// Seeds to run: `TARN_SEED=N` replays one; otherwise `count` from `TARN_SEED_BASE` (default 0).
pub fn seeds(count: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("TARN_SEED").ok().and_then(|s| s.parse().ok()) {
        return vec![seed];
    }
    let base = std::env::var("TARN_SEED_BASE").ok().and_then(|s| s.parse().ok()).unwrap_or(0u64);
    (base..base + count).collect()
}
