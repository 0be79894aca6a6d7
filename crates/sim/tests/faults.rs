//! Fault injection between runs: random bit flips in the metadata a closed
//! pool carries (superblock copies, checkpoint segments, store nodes) are
//! detected every time: the pool refuses to open with a clear error, or
//! opens from the other superblock copy and says so, or (a store node,
//! read only when its tree is used) opens and the reads and the checker
//! meet the damage; it never serves wrong data. Devices
//! that fail I/O: errors reach the caller, the pool stays up, and a failed
//! commit fences it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tarn_engine::scrub::ScrubOptions;
use tarn_engine::{create_mirrored_pool, CreateOptions, Device, EngineError, OpenOptions, Pool};
use tarn_sim::{fixture, SimDevice};

const MIB: u64 = 1 << 20;
const BS: usize = 4096;

fn block(tag: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    for (i, chunk) in b.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&(tag * 7_000_001 + i as u64 + 1).to_le_bytes());
    }
    b
}

fn open(sim: &Arc<SimDevice>) -> Result<Pool, EngineError> {
    fixture::reopen(sim)
}

/// A closed pool with 48 data blocks over two volumes and a snapshot.
fn closed_pool() -> Arc<SimDevice> {
    let (sim, pool) = fixture::one_device_pool(32 * MIB);
    let a = pool.create_volume("a", 4 * MIB).unwrap().id;
    let b = pool.create_volume("b", 4 * MIB).unwrap().id;
    for i in 0..24 {
        pool.write(a, i * BS as u64, &block(i), false).unwrap();
    }
    pool.create_snapshot("a", "s").unwrap();
    for i in 0..8 {
        pool.write(a, i * BS as u64, &block(100 + i), false).unwrap();
    }
    for i in 0..16 {
        pool.write(b, i * BS as u64, &block(200 + i), false).unwrap();
    }
    pool.close().unwrap();
    sim
}

/// Offsets of bytes that carry live metadata after a clean close: the
/// non-zero bytes of the two superblock copies, of the catalog's segments
/// and of every store node the catalog reaches (as the pool lists them).
/// The journal is skipped: after a checkpoint its records belong to an
/// older generation and are rightly ignored, so flips there change
/// nothing; so are blocks of nodes and catalogs no longer reachable.
fn metadata_bytes(sim: &Arc<SimDevice>) -> Vec<u64> {
    // Read-only: a writable open's close would write a new checkpoint.
    let ro = OpenOptions { read_only: true, ..Default::default() };
    let pool = Pool::open(vec![sim.clone() as Arc<dyn Device>], ro).unwrap();
    let mut blocks: Vec<u64> = vec![0, 16];
    for (pba, len) in pool.metadata_blocks().unwrap() {
        blocks.extend((0..len).map(|i| pba.block() + i));
    }
    drop(pool);
    let mut buf = vec![0u8; BS];
    let mut out = Vec::new();
    for b in blocks {
        sim.read_at(&mut buf, b * BS as u64).unwrap();
        out.extend(buf.iter().enumerate().filter(|(_, &x)| x != 0).map(|(i, _)| b * BS as u64 + i as u64));
    }
    out
}

/// Every volume block reads back as written.
fn data_intact(pool: &Pool) -> bool {
    data_never_wrong(pool, false)
}

/// Every volume block reads as written, or (with `errors_allowed`) fails
/// with a typed error (pool metadata that cannot be read, or a data
/// checksum): never other bytes.
fn data_never_wrong(pool: &Pool, errors_allowed: bool) -> bool {
    let mut buf = vec![0u8; BS];
    let a = pool.volume_id("a").unwrap();
    let b = pool.volume_id("b").unwrap();
    let want_a = |i: u64| if i < 8 { block(100 + i) } else { block(i) };
    let ok = |r: Result<(), EngineError>, want: Vec<u8>, buf: &[u8]| match r {
        Ok(()) => buf == want,
        Err(e) => errors_allowed && matches!(e, EngineError::State(_) | EngineError::Checksum { .. }),
    };
    (0..24).all(|i| ok(pool.read(a, i * BS as u64, &mut buf), want_a(i), &buf))
        && (0..16).all(|i| ok(pool.read(b, i * BS as u64, &mut buf), block(200 + i), &buf))
}

/// A flip in a superblock copy is survived and noted; in the catalog it
/// refuses the open; in a store node (read only when its tree is used)
/// reads give the data or fail with a typed error, and the checker (which
/// reads every node) reports it. Never wrong data.
#[test]
fn every_metadata_bit_flip_is_detected() {
    let sim = closed_pool();
    let places = metadata_bytes(&sim);
    assert!(places.len() > 200, "only {} metadata bytes found", places.len());
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (mut refused, mut other_copy, mut by_check) = (0, 0, 0);
    for _ in 0..300 {
        let at = places[rng.random_range(0..places.len())];
        let bit = rng.random_range(0..8u8);
        sim.flip_bit(at, bit);
        match open(&sim) {
            Err(e) => {
                refused += 1;
                let msg = e.to_string();
                assert!(msg.contains("sim0"), "error does not name the device: {msg}");
            }
            Ok(pool) => {
                let noted = pool.status().notes.iter().any(|n| n.contains("superblock copy"));
                let report = pool.check();
                if noted {
                    assert!(data_intact(&pool), "flip at byte {at} changed data");
                    assert!(report.is_clean(), "flip at byte {at}: {:?}", report.problems);
                    other_copy += 1;
                } else {
                    assert!(!report.is_clean(), "flip at byte {at} bit {bit} went unnoticed");
                    assert!(data_never_wrong(&pool, true), "flip at byte {at} served wrong data");
                    by_check += 1;
                }
            }
        }
        sim.flip_bit(at, bit);
    }
    println!("refused {refused}, other copy {other_copy}, found by the checker {by_check}");
    assert!(refused > 0 && other_copy > 0 && by_check > 0, "refused {refused}, other copy {other_copy}, {by_check}");
    let pool = open(&sim).unwrap();
    assert!(data_intact(&pool));
}

#[test]
fn failing_device_errors_reach_caller_and_failed_commit_fences() {
    let (sim, pool) = fixture::one_device_pool(32 * MIB);
    let v = pool.create_volume("a", 4 * MIB).unwrap().id;
    pool.write(v, 0, &block(1), false).unwrap();
    // The device dies after one more call: the write lands, the flush fails.
    sim.crash_after(1);
    pool.write(v, BS as u64, &block(2), false).unwrap();
    let err = pool.flush().unwrap_err();
    assert!(matches!(err, EngineError::Io { .. }), "{err}");
    assert!(pool.is_fenced());
    assert!(matches!(pool.write(v, 0, &block(3), false), Err(EngineError::Fenced)));
    // Reads still answer (with errors while the device is gone), no panic.
    let mut buf = vec![0u8; BS];
    assert!(pool.read(v, 0, &mut buf).is_err());
    assert!(pool.status().read_errors >= 1);
}

/// A pool on the mirror (a, b) with 64 tagged blocks in volume "m".
fn mirrored_pool() -> (Arc<SimDevice>, Arc<SimDevice>, Pool, u32) {
    let a = Arc::new(SimDevice::new("a", 32 * MIB));
    let b = Arc::new(SimDevice::new("b", 32 * MIB));
    let slots =
        vec![vec![(a.clone() as Arc<dyn Device>, "a".to_string()), (b.clone() as Arc<dyn Device>, "b".to_string())]];
    let opts = CreateOptions { journal_bytes: Some(256 << 10), ..Default::default() };
    create_mirrored_pool(&slots, &opts).unwrap();
    let legs: Vec<Arc<dyn Device>> = vec![a.clone(), b.clone()];
    let pool = Pool::open_slots(vec![legs], OpenOptions::default()).unwrap();
    let v = pool.create_volume("m", 4 * MIB).unwrap().id;
    for i in 0..64 {
        pool.write(v, i * BS as u64, &block(300 + i), false).unwrap();
    }
    pool.flush().unwrap();
    (a, b, pool, v)
}

/// Byte offset of the block holding `data` on a device.
fn find_on(sim: &SimDevice, data: &[u8]) -> u64 {
    fixture::find_block(sim, data).expect("block not on the device")
}

#[test]
fn with_two_copies_every_data_bit_flip_is_repaired() {
    let (a, b, pool, v) = mirrored_pool();
    let places: Vec<u64> = (0..64).map(|i| find_on(&a, &block(300 + i))).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let mut buf = vec![0u8; BS];
    for _ in 0..100 {
        let i = rng.random_range(0..64u64);
        let leg = if rng.random_bool(0.5) { &a } else { &b };
        leg.flip_bit(places[i as usize] + rng.random_range(0..BS as u64), rng.random_range(0..8u8));
        // Whichever leg the read uses, the data is right and the bad copy healed.
        pool.read(v, i * BS as u64, &mut buf).unwrap();
        assert_eq!(buf, block(300 + i));
        let mut copy = vec![0u8; BS];
        a.read_at(&mut copy, places[i as usize]).unwrap();
        let healed_a = copy == block(300 + i);
        b.read_at(&mut copy, places[i as usize]).unwrap();
        let healed_b = copy == block(300 + i);
        // A read only heals the copy it saw; scrub repairs the other leg.
        if !(healed_a && healed_b) {
            let r = pool.scrub(&ScrubOptions::default(), &mut |_, _| {}).unwrap();
            assert_eq!((r.repaired, r.lost_blocks), (1, 0), "flip in block {i}");
        }
    }
    let st = pool.status();
    assert_eq!(st.checksum_errors, 0);
    assert!(st.healed_blocks >= 100, "{} healed", st.healed_blocks);
    let r = pool.scrub(&ScrubOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!((r.bad_copies, r.lost_blocks), (0, 0));
    assert_eq!(image_range(&a, &places), image_range(&b, &places), "legs differ after repair");
}

#[test]
fn with_two_copies_scrub_repairs_many_flips_and_loses_only_blocks_bad_on_both() {
    let (a, b, pool, v) = mirrored_pool();
    let places: Vec<u64> = (0..64).map(|i| find_on(&a, &block(300 + i))).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for (i, &at) in places.iter().enumerate().take(40) {
        let leg = if i % 2 == 0 { &a } else { &b };
        leg.flip_bit(at + rng.random_range(0..BS as u64), rng.random_range(0..8u8));
    }
    // Block 50 rots on both legs: nothing can give it back.
    a.flip_bit(places[50] + 1, 0);
    b.flip_bit(places[50] + 2, 0);
    let r = pool.scrub(&ScrubOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!((r.repaired, r.lost_blocks), (40, 1));
    assert_eq!((r.lost[0].offset, r.lost[0].len), (50 * BS as u64, BS as u64));
    let mut buf = vec![0u8; BS];
    for i in (0..64u64).filter(|&i| i != 50) {
        pool.read(v, i * BS as u64, &mut buf).unwrap();
        assert_eq!(buf, block(300 + i));
    }
    assert!(matches!(pool.read(v, 50 * BS as u64, &mut buf), Err(EngineError::Checksum { .. })));
}

fn image_range(d: &SimDevice, places: &[u64]) -> Vec<Vec<u8>> {
    places
        .iter()
        .map(|&at| {
            let mut b = vec![0u8; BS];
            d.read_at(&mut b, at).unwrap();
            b
        })
        .collect()
}

#[test]
fn with_two_copies_every_metadata_bit_flip_is_repaired() {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    for trial in 0..60 {
        let (a, b, pool, v) = mirrored_pool();
        pool.close().unwrap();
        drop(pool);
        let leg = if trial % 2 == 0 { &a } else { &b };
        let data: std::collections::HashSet<Vec<u8>> = (0..64).map(|i| block(300 + i)).collect();
        let places = live_metadata_bytes(leg, &data);
        let at = places[rng.random_range(0..places.len())];
        leg.flip_bit(at, rng.random_range(0..8u8));
        let legs: Vec<Arc<dyn Device>> = vec![a.clone(), b.clone()];
        let pool = Pool::open_slots(vec![legs], OpenOptions::default())
            .unwrap_or_else(|e| panic!("trial {trial}: flip at byte {at} of {} not repaired: {e}", leg.name()));
        let mut buf = vec![0u8; BS];
        for i in 0..64u64 {
            pool.read(v, i * BS as u64, &mut buf).unwrap();
            assert_eq!(buf, block(300 + i), "trial {trial}: block {i}");
        }
        assert!(pool.check().is_clean(), "trial {trial}");
        pool.close().unwrap();
        drop(pool);
        // Healed for good: the next open finds nothing to repair.
        let legs: Vec<Arc<dyn Device>> = vec![a.clone(), b.clone()];
        let pool = Pool::open_slots(vec![legs], OpenOptions::default()).unwrap();
        let notes = pool.status().notes;
        assert!(notes.is_empty(), "trial {trial}: still {notes:?}");
    }
}

/// Non-zero bytes of the label area and of the data area's non-data blocks
/// (the checkpoint) of one leg of a closed pool; the journal is skipped
/// (after a checkpoint its records are of an older generation).
fn live_metadata_bytes(sim: &SimDevice, data: &std::collections::HashSet<Vec<u8>>) -> Vec<u64> {
    let mut buf = vec![0u8; BS];
    let mut out = Vec::new();
    for b in (0..sim.size() / BS as u64).filter(|&b| !(32..32 + 64).contains(&b)) {
        sim.read_at(&mut buf, b * BS as u64).unwrap();
        if buf.iter().all(|&x| x == 0) || data.contains(&buf) {
            continue;
        }
        out.extend(buf.iter().enumerate().filter(|(_, &x)| x != 0).map(|(i, _)| b * BS as u64 + i as u64));
    }
    out
}

/// The same with coarse checksums (one crc per 64 KiB group): a flip on
/// either leg never reaches the reader, the bad copy of the whole group is
/// healed from the other leg (by the read or by scrub), and the legs end
/// equal.
#[test]
fn with_two_copies_a_flip_in_a_coarse_group_is_repaired() {
    let (a, b, pool, v) = mirrored_pool();
    let groups = pool.coarsen_sums(v, 0, 64).unwrap();
    pool.flush().unwrap();
    assert!(groups >= 3, "64 blocks written in order hold at least 3 whole groups, got {groups}");
    let places: Vec<u64> = (0..64).map(|i| find_on(&a, &block(300 + i))).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let mut buf = vec![0u8; BS];
    for _ in 0..60 {
        let i = rng.random_range(0..64u64);
        let leg = if rng.random_bool(0.5) { &a } else { &b };
        leg.flip_bit(places[i as usize] + rng.random_range(0..BS as u64), rng.random_range(0..8u8));
        // A neighbour in the same group reads through the whole group.
        let n = if i % 16 == 0 { i + 1 } else { i - 1 };
        pool.read(v, n * BS as u64, &mut buf).unwrap();
        assert_eq!(buf, block(300 + n));
        pool.read(v, i * BS as u64, &mut buf).unwrap();
        assert_eq!(buf, block(300 + i));
        let r = pool.scrub(&ScrubOptions::default(), &mut |_, _| {}).unwrap();
        assert_eq!(r.lost_blocks, 0, "flip in block {i}");
        assert_eq!(image_range(&a, &places), image_range(&b, &places), "legs differ after repair of block {i}");
    }
    assert_eq!(pool.status().checksum_errors, 0);
    assert!(pool.status().healed_blocks >= 60);
    assert!(pool.check().is_clean());
}
