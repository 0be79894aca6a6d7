//! Fault injection between runs: random bit flips in the metadata a closed
//! pool carries (superblock copies, checkpoint segments) are detected every
//! time: the pool refuses to open with a clear error, or opens from the
//! other superblock copy and says so; it never serves wrong data. Devices
//! that fail I/O: errors reach the caller, the pool stays up, and a failed
//! commit fences it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tarn_engine::{Device, EngineError, Pool};
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
/// non-zero bytes of the two superblock copies and of every block of the
/// data area that is not data we wrote (the checkpoint). The journal is
/// skipped: after a checkpoint its records belong to an older generation
/// and are rightly ignored, so flips there change nothing.
fn metadata_bytes(sim: &SimDevice) -> Vec<u64> {
    let data: std::collections::HashSet<Vec<u8>> = (0..24).chain(100..108).chain(200..216).map(block).collect();
    let mut buf = vec![0u8; BS];
    let mut out = Vec::new();
    // Superblock copies live at blocks 0 and 16; after the label area and
    // the 64-block journal comes the data area, where the checkpoint is.
    let journal_end = 32 + 64;
    for b in (0..sim.size() / BS as u64).filter(|&b| b == 0 || b == 16 || b >= journal_end) {
        sim.read_at(&mut buf, b * BS as u64).unwrap();
        if buf.iter().all(|&x| x == 0) || data.contains(&buf) {
            continue;
        }
        out.extend(buf.iter().enumerate().filter(|(_, &x)| x != 0).map(|(i, _)| b * BS as u64 + i as u64));
    }
    out
}

/// Every volume block reads back as written (or the read fails: never
/// other bytes).
fn data_intact(pool: &Pool) -> bool {
    let mut buf = vec![0u8; BS];
    let a = pool.volume_id("a").unwrap();
    let b = pool.volume_id("b").unwrap();
    let want_a = |i: u64| if i < 8 { block(100 + i) } else { block(i) };
    (0..24).all(|i| pool.read(a, i * BS as u64, &mut buf).is_ok() && buf == want_a(i))
        && (0..16).all(|i| pool.read(b, i * BS as u64, &mut buf).is_ok() && buf == block(200 + i))
}

#[test]
fn every_metadata_bit_flip_is_detected() {
    let sim = closed_pool();
    let places = metadata_bytes(&sim);
    assert!(places.len() > 200, "only {} metadata bytes found", places.len());
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let (mut refused, mut other_copy) = (0, 0);
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
                // Only a damaged superblock copy may be survived, and said.
                let notes = pool.status().notes;
                assert!(
                    notes.iter().any(|n| n.contains("superblock copy")),
                    "flip at byte {at} bit {bit} went unnoticed"
                );
                assert!(data_intact(&pool), "flip at byte {at} changed data");
                assert!(pool.check().is_clean());
                other_copy += 1;
            }
        }
        sim.flip_bit(at, bit);
    }
    assert!(refused > 0 && other_copy > 0, "refused {refused}, other copy {other_copy}");
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
