//! The crash simulation: at least 500 seeds per test run. A failure prints
//! its seed; `TARN_SEED=N cargo test -p tarn-sim` replays exactly that run.

use tarn_sim::{run_seed, seeds, SimConfig};

#[test]
fn crash_simulation_500_seeds() {
    let cfg = SimConfig::default();
    let mut crashes = 0;
    let list = seeds(500);
    for &seed in &list {
        match run_seed(seed, &cfg) {
            Ok(stats) => crashes += stats.crashes,
            Err(e) => panic!("{e}\nreplay: TARN_SEED={seed} cargo test -p tarn-sim --release"),
        }
    }
    println!("{} seeds, {crashes} crashes survived", list.len());
    assert!(crashes >= list.len(), "every run ends in at least one crash");
}
