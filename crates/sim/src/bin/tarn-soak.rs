//! Long crash soak: `tarn-soak [SEEDS] [STEPS] [basic|snapshots|both]`
//! (defaults 20000, 600, both). Runs seeds from TARN_SEED_BASE (default 0),
//! or only TARN_SEED; prints progress, totals and the first failing seed.
//! TARN_SIM_DEVICE_KIB sets the device size.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tarn_sim::{run_seed, seeds, RunStats, SimConfig, Workload};

/// The seed running now: a panic (this binary aborts on panic) names it.
static SEED: AtomicU64 = AtomicU64::new(u64::MAX);

fn main() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        eprintln!("PANIC in seed {}", SEED.load(Ordering::SeqCst));
    }));
    let args: Vec<String> = std::env::args().collect();
    let count = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let steps = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(600);
    let workloads: Vec<Workload> = match args.get(3).map(String::as_str) {
        Some("basic") => vec![Workload::Basic],
        Some("snapshots") => vec![Workload::Snapshots],
        None | Some("both") => vec![Workload::Basic, Workload::Snapshots],
        Some(other) => {
            eprintln!("unknown workload {other:?}: basic, snapshots or both");
            std::process::exit(2);
        }
    };
    for w in workloads {
        let base = match w {
            Workload::Basic => SimConfig::default(),
            Workload::Snapshots => SimConfig::snapshots(),
        };
        soak(&with_device_size(SimConfig { steps, ..base }), count);
    }
}

/// `TARN_SIM_DEVICE_KIB=N` runs every seed on devices of N KiB (small
/// ones run out of space often).
fn with_device_size(cfg: SimConfig) -> SimConfig {
    match std::env::var("TARN_SIM_DEVICE_KIB").ok().and_then(|s| s.parse::<u64>().ok()) {
        Some(kib) => SimConfig { device_bytes: kib << 10, tight_bytes: None, ..cfg },
        None => cfg,
    }
}

fn soak(cfg: &SimConfig, count: u64) {
    let start = Instant::now();
    let list = seeds(count);
    let mut total = RunStats::default();
    for (i, &seed) in list.iter().enumerate() {
        SEED.store(seed, Ordering::SeqCst);
        match run_seed(seed, cfg) {
            Ok(s) => total.add(&s),
            Err(e) => {
                let arg = if cfg.workload == Workload::Basic { "basic" } else { "snapshots" };
                eprintln!(
                    "FAILED ({:?}): {e}\nreplay: TARN_SEED={seed} TARN_SIM_TRACE=1 cargo run --release -p tarn-sim --bin tarn-soak -- 1 {} {arg}",
                    cfg.workload, cfg.steps
                );
                std::process::exit(1);
            }
        }
        if (i + 1) % 1000 == 0 {
            println!("{:?}: {} seeds, {:.0?}, {total:?}", cfg.workload, i + 1, start.elapsed());
        }
    }
    println!(
        "{:?}: {} seeds of {} steps passed in {:.1?}: {total:?}",
        cfg.workload,
        list.len(),
        cfg.steps,
        start.elapsed()
    );
}
