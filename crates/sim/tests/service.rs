//! The engine's background service and the bound on the queue of pending
//! ops, on a simulated device.

use rand::{Rng, SeedableRng};
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
    let (sim, pool, v, service) = served_volume(no_compaction(Duration::from_millis(50), Duration::from_millis(10)));
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
    let service = Service::start(pool.clone(), no_compaction(Duration::from_secs(3600), Duration::from_secs(60)));
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

/// The checkpointer sleeps until a commit freezes a checkpoint (it used
/// to poll every 2 ms). Guarded: a frozen checkpoint is written by the
/// checkpointer on its own, with no later commit, long before its safety
/// timeout (60 s): without the commit's wake-up it stays frozen past the
/// bound below (a bound on progress, generous on a loaded machine; with
/// the wake-up removed this test failed).
#[test]
fn the_checkpointer_is_woken_by_the_commit_that_freezes_a_checkpoint() {
    use std::sync::atomic::Ordering::Relaxed;
    let (_sim, pool, v, service) = served_volume(no_compaction(Duration::from_secs(3600), Duration::from_secs(3600)));
    // Until a checkpoint is seen frozen, or two were written (the first
    // may be written by its commit: the journal's other side not free).
    let checkpoints = pool.counters.checkpoints.load(Relaxed);
    let stopped = (0..40_000u64).any(|i| {
        pool.write(v, (i * 97) % 2048 * 4096, &[7u8; 4096], false).unwrap();
        pool.flush().unwrap();
        pool.checkpoint_waiting() || pool.counters.checkpoints.load(Relaxed) >= checkpoints + 2
    });
    assert!(stopped, "no checkpoint froze in 40,000 flushes");
    // No commit from here on: only the checkpointer can write it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool.checkpoint_waiting() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!pool.checkpoint_waiting(), "the frozen checkpoint was not written: the checkpointer slept on");
    assert!(pool.counters.checkpoints.load(Relaxed) > checkpoints);
    service.stop();
}

/// Bug guarded: writes that never flush grew the queue of pending ops
/// without limit until a commit took it (memory, and a journal record that
/// no longer fits the journal). Now a writer over the bound commits first:
/// the queue stays within the bound plus one request's ops, and the data
/// is what was written, before and after a reopen.
#[test]
fn pending_ops_stay_bounded_under_a_write_burst_without_flushes() {
    let (sim, pool) = one_device_pool(256 * MIB);
    let vol_blocks = 16384u64; // 64 MiB
    let v = pool.create_volume("burst", vol_blocks * 4096).unwrap().id;
    let limit = pool.pending().limit;
    assert!(limit >= 16 << 10, "limit {limit}");
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut model = vec![0u32; vol_blocks as usize]; // per block: the tag written last (0 = never)
    let commits_before = pool.counters.commits.load(std::sync::atomic::Ordering::Relaxed);
    let mut max_seen = 0;
    for i in 1..=20_000u32 {
        // 1-16 blocks at a random place, some overlapping earlier writes
        // (redirects and in-place overwrites), some trimmed.
        let lba = rng.random_range(0..vol_blocks - 16);
        let n = rng.random_range(1..=16u64);
        if i % 50 == 0 {
            pool.trim(v, lba * 4096, n * 4096).unwrap();
            model[lba as usize..(lba + n) as usize].fill(0);
        } else {
            let mut data = vec![0u8; (n * 4096) as usize];
            for (b, chunk) in data.chunks_mut(4096).enumerate() {
                chunk[..4].copy_from_slice(&i.to_le_bytes());
                chunk[4..12].copy_from_slice(&(lba + b as u64).to_le_bytes());
            }
            pool.write(v, lba * 4096, &data, false).unwrap();
            model[lba as usize..(lba + n) as usize].fill(i);
        }
        let p = pool.pending();
        max_seen = max_seen.max(p.bytes);
        // One request of at most 16 blocks queues at most a few hundred bytes.
        assert!(p.bytes <= limit + 4096, "pending {} bytes over the bound {limit} after write {i}", p.bytes);
    }
    let commits = pool.counters.commits.load(std::sync::atomic::Ordering::Relaxed) - commits_before;
    assert!(commits > 0, "the burst never committed");
    assert!(max_seen > limit / 2, "the burst never came near the bound ({max_seen} of {limit})");
    let check = |pool: &tarn_engine::Pool| {
        let mut buf = vec![0u8; 4096];
        for (lba, &tag) in model.iter().enumerate() {
            pool.read(v, lba as u64 * 4096, &mut buf).unwrap();
            let mut want = vec![0u8; 4096];
            if tag != 0 {
                want[..4].copy_from_slice(&tag.to_le_bytes());
                want[4..12].copy_from_slice(&(lba as u64).to_le_bytes());
            }
            assert!(buf == want, "block {lba}: expected tag {tag}");
        }
    };
    check(&pool);
    assert!(pool.check().is_clean(), "{:?}", pool.check().problems);
    pool.close().unwrap();
    drop(pool);
    let pool = reopen(&sim).unwrap();
    check(&pool);
    assert!(pool.check().is_clean());
}

/// Bug guarded: a volume first written at random stayed scattered for life
/// unless someone ran `pool compact`; once clients stop writing, the
/// service must re-lay it out by itself, contents unchanged, and rest
/// after a pass that finds nothing to move.
#[test]
fn idle_compaction_re_lays_out_scattered_data() {
    let (_sim, pool) = one_device_pool(64 * MIB);
    let pool = Arc::new(pool);
    let v = pool.create_volume("v", 8 * MIB).unwrap().id;
    for i in 0..2048u64 {
        let b = (i * 97) % 2048;
        pool.write(v, b * 4096, &vec![b as u8; 4096], false).unwrap();
    }
    let scattered = pool.volume_info(v).unwrap().extents;
    assert!(scattered > 1000, "the fill made only {scattered} extents");
    let service = Service::start(pool.clone(), idle_compaction_after_200_ms());
    let deadline = Instant::now() + Duration::from_secs(20);
    while pool.volume_info(v).unwrap().extents > 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let extents = pool.volume_info(v).unwrap().extents;
    assert!(extents <= 8, "still {extents} extents (from {scattered}) after 20 s idle");
    // Resting: no more moves once a pass found nothing to do.
    std::thread::sleep(Duration::from_millis(1500));
    let gen = pool.status().commit_seq;
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(pool.status().commit_seq, gen, "the idle pool kept committing");
    service.stop();
    let mut back = vec![0u8; 8 * MIB as usize];
    pool.read(v, 0, &mut back).unwrap();
    for (b, block) in back.chunks(4096).enumerate() {
        assert!(block.iter().all(|&x| x == b as u8), "block {b} changed");
    }
    assert!(pool.check().is_clean());
}

/// Bug guarded: a pool whose clients never pause stayed fragmented for
/// life, since the compactor waited for idleness. With a fragmentation
/// threshold it compacts while a client writes, contents unchanged.
#[test]
fn a_fragmentation_threshold_compacts_while_clients_write() {
    let (_sim, pool) = one_device_pool(256 * MIB);
    let pool = Arc::new(pool);
    let v = pool.create_volume("v", 80 * MIB).unwrap().id;
    let w = pool.create_volume("w", 4 * MIB).unwrap().id;
    let blocks = 80 * MIB / 4096;
    for i in 0..blocks {
        let b = (i * 7919) % blocks;
        pool.write(v, b * 4096, &vec![b as u8; 4096], false).unwrap();
    }
    let scattered = pool.volume_info(v).unwrap().extents;
    assert!(scattered > 10_000, "the fill made only {scattered} extents");
    let opts = ServiceOptions {
        commit_interval: Duration::from_millis(50),
        tick: Duration::from_millis(10),
        notice: None,
        compact_idle: None,
        compact_at: Some(4096),
    };
    let service = Service::start(pool.clone(), opts);
    // A client that never pauses: the pool is never idle.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let b = rng.random_range(0..1024u64);
                pool.write(w, b * 4096, &[7u8; 4096], false).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while pool.volume_info(v).unwrap().extents > 400 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    service.stop();
    let extents = pool.volume_info(v).unwrap().extents;
    assert!(extents <= 400, "still {extents} extents (from {scattered}) after 60 s of a busy client");
    let mut back = vec![0u8; 4 * MIB as usize];
    for chunk in 0..20u64 {
        pool.read(v, chunk * 4 * MIB, &mut back).unwrap();
        for (i, block) in back.chunks(4096).enumerate() {
            let b = chunk * 1024 + i as u64;
            assert!(block.iter().all(|&x| x == b as u8), "block {b} changed");
        }
    }
    assert!(pool.check().is_clean());
}

/// AoDI's compactor reclaims the space behind an append head on its own:
/// once clients are idle and the volumes compact, the idle compactor
/// cleans the partly used regions random overwrites left, contents kept.
#[test]
fn the_idle_compactor_cleans_regions_behind_an_append_head() {
    use tarn_engine::volumes::clean::CLEAN_REGION_BLOCKS;
    use tarn_engine::PlacementKind;
    let (_sim, pool) = one_device_pool(96 * MIB);
    let pool = Arc::new(pool);
    let blocks = 16 * MIB / 4096;
    let v = pool.create_volume_placed("log", 16 * MIB, Some(PlacementKind::Append)).unwrap().id;
    let mut last = vec![0u8; blocks as usize];
    for b in 0..blocks {
        pool.write(v, b * 4096, &vec![b as u8; 4096], false).unwrap();
        last[b as usize] = b as u8;
    }
    // Three quarters overwritten: each 4 MiB region keeps its first MiB,
    // one long run, which the compaction of volumes leaves alone.
    for b in (0..blocks).filter(|b| b % 1024 >= 256) {
        pool.write(v, b * 4096, &vec![0xa0 ^ b as u8; 4096], false).unwrap();
        last[b as usize] = 0xa0 ^ b as u8;
    }
    pool.flush().unwrap();
    let left = |pool: &tarn_engine::Pool| pool.start_cleaning(CLEAN_REGION_BLOCKS, &|_| true).unwrap().report;
    let before = left(&pool);
    assert!(before.candidates >= 4, "{before:?}");
    let service = Service::start(pool.clone(), idle_compaction_after_200_ms());
    let deadline = Instant::now() + Duration::from_secs(60);
    while left(&pool).candidates > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    service.stop();
    let after = left(&pool);
    assert_eq!(after.candidates, 0, "still partly used regions after 60 s idle: {after:?} (before {before:?})");
    assert!(after.free_regions_before >= before.free_regions_before + 3, "{after:?} (before {before:?})");
    let mut back = vec![0u8; 16 * MIB as usize];
    pool.read(v, 0, &mut back).unwrap();
    assert!(back.chunks(4096).zip(&last).all(|(c, &x)| c.iter().all(|&y| y == x)), "the volume changed");
    assert!(pool.check().is_clean());
}

/// A 64 MiB pool on a simulated device with an 8 MiB volume, served by a
/// service with `opts`.
fn served_volume(opts: ServiceOptions) -> (Arc<tarn_sim::SimDevice>, Arc<tarn_engine::Pool>, u32, Service) {
    let (sim, pool) = one_device_pool(64 * MIB);
    let pool = Arc::new(pool);
    let v = pool.create_volume("v", 8 * MIB).unwrap().id;
    let service = Service::start(pool.clone(), opts);
    (sim, pool, v, service)
}

/// A service that commits every `commit_interval`, looks every `tick`,
/// and never compacts.
fn no_compaction(commit_interval: Duration, tick: Duration) -> ServiceOptions {
    ServiceOptions { commit_interval, tick, notice: None, compact_idle: None, compact_at: None }
}

/// A service that commits every 50 ms and compacts after 200 ms idle.
fn idle_compaction_after_200_ms() -> ServiceOptions {
    ServiceOptions {
        commit_interval: Duration::from_millis(50),
        tick: Duration::from_millis(10),
        notice: None,
        compact_idle: Some(Duration::from_millis(200)),
        compact_at: None,
    }
}
