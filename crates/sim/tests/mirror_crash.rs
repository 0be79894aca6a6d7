//! The crash simulation with a mirrored primary: power cuts hit one leg at a
//! time (it is faulted and the pool goes on) and then every device; after
//! each reopen the pool must match the model and check clean, with the
//! faulted leg recorded so that it is never read again.

use tarn_sim::{run_seed, seeds, RunStats, SimConfig};

fn run_all(cfg: &SimConfig, count: u64) -> (usize, RunStats) {
    let mut total = RunStats::default();
    let list = seeds(count);
    for &seed in &list {
        let replay = format!("replay: TARN_SEED={seed} cargo test -p tarn-sim --release --test mirror_crash");
        match std::panic::catch_unwind(|| run_seed(seed, cfg)) {
            Ok(Ok(stats)) => total.add(&stats),
            Ok(Err(e)) => panic!("{e}\n{replay}"),
            Err(_) => panic!("seed {seed} panicked (message above)\n{replay}"),
        }
    }
    (list.len(), total)
}

#[test]
fn mirror_crash_simulation_200_seeds() {
    let (seeds, stats) = run_all(&SimConfig { mirror: true, ..SimConfig::default() }, 200);
    println!("{seeds} seeds: {stats:?}");
    assert!(stats.crashes >= seeds, "every run ends in at least one crash");
}

#[test]
fn mirror_snapshot_crash_simulation_100_seeds() {
    let (seeds, stats) = run_all(&SimConfig { mirror: true, ..SimConfig::snapshots() }, 100);
    println!("{seeds} seeds: {stats:?}");
    assert!(stats.crashes >= seeds && stats.admin > 0, "crashes and admin ops happen: {stats:?}");
}
