//! The crash simulation with a mirrored primary: power cuts hit one leg at a
//! time (it is faulted and the pool goes on) and then every device; after
//! each reopen the pool must match the model and check clean, with the
//! faulted leg recorded so that it is never read again.

use tarn_sim::{run_seed, seeds, RunStats, SimConfig};

#[test]
fn mirror_crash_simulation_200_seeds() {
    let cfg = SimConfig { mirror: true, ..SimConfig::default() };
    let mut total = RunStats::default();
    let list = seeds(200);
    for &seed in &list {
        let replay = format!("replay: TARN_SEED={seed} cargo test -p tarn-sim --release --test mirror_crash");
        match std::panic::catch_unwind(|| run_seed(seed, &cfg)) {
            Ok(Ok(stats)) => total.add(&stats),
            Ok(Err(e)) => panic!("{e}\n{replay}"),
            Err(_) => panic!("seed {seed} panicked (message above)\n{replay}"),
        }
    }
    println!("{} seeds: {total:?}", list.len());
    assert!(total.crashes >= list.len(), "every run ends in at least one crash");
}
