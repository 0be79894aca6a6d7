//! The crash simulation: 500 seeds of each workload per test run (the two
//! tests run in parallel). A failure prints its seed;
//! `TARN_SEED=N cargo test -p tarn-sim --release --test crash` replays
//! exactly that run (in both tests); `TARN_SIM_TRACE=1` prints its steps.

use tarn_sim::{run_seed, seeds, RunStats, SimConfig};

fn run_all(cfg: &SimConfig) -> (usize, RunStats) {
    let mut total = RunStats::default();
    let list = seeds(500);
    for &seed in &list {
        let replay = format!("replay: TARN_SEED={seed} TARN_SIM_TRACE=1 cargo test -p tarn-sim --release --test crash");
        // An assertion inside the engine panics: name the seed for it too.
        match std::panic::catch_unwind(|| run_seed(seed, cfg)) {
            Ok(Ok(stats)) => total.add(&stats),
            Ok(Err(e)) => panic!("{e}\n{replay}"),
            Err(_) => panic!("seed {seed} panicked (message above)\n{replay}"),
        }
    }
    (list.len(), total)
}

#[test]
fn crash_simulation_500_seeds() {
    let (seeds, stats) = run_all(&SimConfig::default());
    println!("{seeds} seeds: {stats:?}");
    assert!(stats.crashes >= seeds, "every run ends in at least one crash");
}

#[test]
fn snapshot_crash_simulation_500_seeds() {
    let (seeds, stats) = run_all(&SimConfig::snapshots());
    println!("{seeds} seeds: {stats:?}");
    assert!(stats.crashes >= seeds, "every run ends in at least one crash");
    // Over many seeds every kind of admin op happens, and crashes cut some
    // both before and after their commit (a single replayed seed may not).
    let all_kinds = stats.done.iter().all(|&n| n > 0) && stats.cut_done > 0 && stats.cut_undone > 0;
    assert!(seeds < 100 || all_kinds, "admin ops done and cut: {stats:?}");
}
