//! The engine's background service and the bound on the queue of pending
//! ops, on a simulated device.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tarn_engine::{Service, ServiceOptions};
use tarn_sim::fixture::{one_device_pool, reopen};

const MIB: u64 = 1 << 20;

/// Bug guarded: the committer must commit on its own (clients that never
/// flush), and stopping must wake it at once, not after its interval.
#[test]
fn service_commits_in_the_background_and_stops_promptly() {
    let (sim, pool) = one_device_pool(64 * MIB);
    let pool = Arc::new(pool);
    let v = pool.create_volume("v", 8 * MIB).unwrap().id;
    let opts =
        ServiceOptions { commit_interval: Duration::from_millis(50), tick: Duration::from_millis(10), notice: None };
    let service = Service::start(pool.clone(), opts);
    pool.write(v, 0, &vec![0xabu8; 64 << 10], false).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while pool.is_dirty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!pool.is_dirty(), "the committer did not commit the write");
    let started = Instant::now();
    service.stop();
    assert!(started.elapsed() < Duration::from_secs(2), "stop took {:?}", started.elapsed());

    // A service with a long interval still stops at once.
    let slow =
        ServiceOptions { commit_interval: Duration::from_secs(3600), tick: Duration::from_secs(60), notice: None };
    let service = Service::start(pool.clone(), slow);
    let started = Instant::now();
    drop(service);
    assert!(started.elapsed() < Duration::from_secs(2), "drop took {:?}", started.elapsed());

    // What the committer made durable survives a power cut.
    sim.crash(&mut ChaCha8Rng::seed_from_u64(5));
    drop(pool);
    let pool = reopen(&sim).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    pool.read(v, 0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0xab));
}
