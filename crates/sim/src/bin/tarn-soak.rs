//! Long crash soak: `tarn-soak [SEEDS] [STEPS]` (defaults 20000, 600).
//! Runs seeds from TARN_SEED_BASE (default 0); prints progress and the
//! first failing seed.

use tarn_sim::{run_seed, seeds, SimConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let count = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let steps = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(600);
    let cfg = SimConfig { steps, ..SimConfig::default() };
    let list = seeds(count);
    let mut crashes = 0;
    for (i, &seed) in list.iter().enumerate() {
        match run_seed(seed, &cfg) {
            Ok(s) => crashes += s.crashes,
            Err(e) => {
                eprintln!("FAILED: {e}\nreplay: TARN_SEED={seed} cargo run --release -p tarn-sim --bin tarn-soak");
                std::process::exit(1);
            }
        }
        if (i + 1) % 1000 == 0 {
            println!("{} seeds, {crashes} crashes", i + 1);
        }
    }
    println!("{} seeds passed, {crashes} crashes survived", list.len());
}
