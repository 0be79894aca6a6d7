//! Snapshots, rollback and clones on simulated devices: contents of every
//! view, space accounting, and what survives a reopen.

use std::sync::Arc;
use tarn_engine::{EngineError, Pool, View};
use tarn_sim::{fixture, SimDevice};

const MIB: u64 = 1 << 20;
const BS: usize = 4096;

fn new_pool(size: u64) -> (Arc<SimDevice>, Pool) {
    fixture::one_device_pool(size)
}

fn reopen(sim: &Arc<SimDevice>) -> Pool {
    fixture::reopen(sim).unwrap()
}

fn block(tag: u8) -> Vec<u8> {
    vec![tag; BS]
}

fn read_block(pool: &Pool, vol: u32, view: View, lba: u64) -> u8 {
    let mut b = vec![0u8; BS];
    pool.read_view(vol, view, lba * BS as u64, &mut b).unwrap();
    assert!(b.iter().all(|x| *x == b[0]), "block {lba} mixed");
    b[0]
}

fn assert_clean(pool: &Pool) {
    let r = pool.check();
    assert!(r.is_clean(), "{:?}", r.problems);
}

#[test]
fn snapshot_shows_old_data_and_accounts_exactly() {
    let (sim, pool) = new_pool(32 * MIB);
    let v = pool.create_volume("vol", 4 * MIB).unwrap().id;
    for lba in 0..8 {
        pool.write(v, lba * BS as u64, &block(1), false).unwrap();
    }
    let s1 = pool.create_snapshot("vol", "s1").unwrap();
    assert_eq!((s1.exclusive, s1.referenced), (0, 8 * BS as u64));
    pool.write(v, 0, &block(2), false).unwrap();
    pool.write(v, 0, &block(3), false).unwrap(); // head owns block 0 now: in place
    pool.trim(v, 4 * BS as u64, BS as u64).unwrap();
    let e1 = View::Snapshot(s1.epoch);
    assert_eq!((read_block(&pool, v, View::Head, 0), read_block(&pool, v, e1, 0)), (3, 1));
    assert_eq!((read_block(&pool, v, View::Head, 4), read_block(&pool, v, e1, 4)), (0, 1));
    let info = pool.snapshot_info("vol", "s1").unwrap();
    assert_eq!(info.exclusive, 2 * BS as u64, "blocks 0 and 4 only s1 holds");
    let changed = pool.changed_runs(v, View::Head, s1.epoch, 0, 8 * BS as u64).unwrap();
    let flags: Vec<(u64, bool)> = changed.iter().map(|r| (r.length / BS as u64, r.changed)).collect();
    assert_eq!(flags, vec![(1, true), (3, false), (1, true), (3, false)]);
    pool.flush().unwrap();
    let used = pool.status().used;
    assert_eq!(pool.delete_snapshot("vol", "s1").unwrap(), 2 * BS as u64);
    assert_eq!(pool.status().used, used - 2 * BS as u64);
    assert_clean(&pool);
    drop(pool);
    let pool = reopen(&sim);
    assert_eq!(read_block(&pool, v, View::Head, 0), 3);
    assert_clean(&pool);
}

#[test]
fn deleting_a_middle_snapshot_keeps_what_neighbours_see() {
    let (sim, pool) = new_pool(32 * MIB);
    let v = pool.create_volume("vol", MIB).unwrap().id;
    pool.write(v, 0, &block(1), false).unwrap();
    let a = pool.create_snapshot("vol", "a").unwrap().epoch;
    pool.write(v, BS as u64, &block(2), false).unwrap();
    let b = pool.create_snapshot("vol", "b").unwrap().epoch;
    pool.write(v, 0, &block(3), false).unwrap();
    pool.write(v, BS as u64, &block(4), false).unwrap();
    let c = pool.create_snapshot("vol", "c").unwrap().epoch;
    pool.write(v, 0, &block(5), false).unwrap();
    // b holds block 1 version 2 alone; version 1 of block 0 is a's too.
    assert_eq!(read_block(&pool, v, View::Snapshot(b), 1), 2);
    assert_eq!(pool.snapshot_info("vol", "b").unwrap().exclusive, BS as u64);
    assert_eq!(pool.delete_snapshot("vol", "b").unwrap(), BS as u64);
    assert_eq!(read_block(&pool, v, View::Snapshot(a), 0), 1);
    assert_eq!(read_block(&pool, v, View::Snapshot(a), 1), 0);
    assert_eq!(read_block(&pool, v, View::Snapshot(c), 0), 3);
    assert_eq!(read_block(&pool, v, View::Snapshot(c), 1), 4);
    assert_clean(&pool);
    pool.close().unwrap();
    drop(pool);
    let pool = reopen(&sim);
    assert_eq!(read_block(&pool, v, View::Snapshot(a), 0), 1);
    assert_eq!(read_block(&pool, v, View::Head, 0), 5);
    assert_clean(&pool);
}

#[test]
fn rollback_restores_and_refuses_to_skip_newer_snapshots() {
    let (_sim, pool) = new_pool(32 * MIB);
    let v = pool.create_volume("vol", MIB).unwrap().id;
    pool.write(v, 0, &block(1), false).unwrap();
    pool.create_snapshot("vol", "a").unwrap();
    pool.write(v, 0, &block(2), false).unwrap();
    pool.write(v, 2 * BS as u64, &block(2), false).unwrap();
    pool.create_snapshot("vol", "b").unwrap();
    pool.write(v, BS as u64, &block(3), false).unwrap();
    let err = pool.rollback("vol", "a", false).unwrap_err();
    assert!(matches!(err, EngineError::InUse { .. }), "{err}");
    pool.rollback("vol", "b", false).unwrap();
    assert_eq!([0, 1, 2].map(|l| read_block(&pool, v, View::Head, l)), [2, 0, 2]);
    pool.rollback("vol", "a", true).unwrap();
    assert_eq!([0, 1, 2].map(|l| read_block(&pool, v, View::Head, l)), [1, 0, 0]);
    assert_eq!(pool.list_snapshots(Some("vol")).unwrap().len(), 1);
    pool.flush().unwrap();
    assert_clean(&pool);
}

#[test]
fn clones_read_through_write_apart_and_flatten() {
    let (sim, pool) = new_pool(64 * MIB);
    let v = pool.create_volume("base", MIB).unwrap().id;
    pool.write(v, 0, &block(1), false).unwrap();
    pool.write(v, 3 * BS as u64, &block(1), false).unwrap();
    pool.create_snapshot("base", "gold").unwrap();
    let c = pool.create_clone("base", "gold", "c1").unwrap();
    assert_eq!(c.origin.as_deref(), Some("base@gold"));
    pool.write(c.id, BS as u64, &block(7), false).unwrap();
    pool.trim(c.id, 3 * BS as u64, BS as u64).unwrap();
    pool.write(v, 0, &block(9), false).unwrap();
    assert_eq!([0, 1, 3].map(|l| read_block(&pool, c.id, View::Head, l)), [1, 7, 0]);
    let s = pool.create_snapshot("c1", "cs").unwrap();
    pool.write(c.id, 0, &block(8), false).unwrap();
    let c2 = pool.create_clone("c1", "cs", "c2").unwrap();
    assert_eq!([0, 1, 3].map(|l| read_block(&pool, c2.id, View::Head, l)), [1, 7, 0]);
    assert!(matches!(pool.delete_snapshot("base", "gold"), Err(EngineError::InUse { .. })));
    let mut calls = 0;
    pool.flatten("c1", &mut |_, _| calls += 1).unwrap();
    assert!(calls > 0);
    assert_eq!(pool.volume_info(c.id).unwrap().origin, None);
    assert_eq!(read_block(&pool, c.id, View::Snapshot(s.epoch), 0), 1);
    assert_eq!(read_block(&pool, c.id, View::Head, 0), 8);
    pool.delete_snapshot("base", "gold").unwrap();
    assert_eq!([0, 1, 3].map(|l| read_block(&pool, c2.id, View::Head, l)), [1, 7, 0]);
    assert_clean(&pool);
    pool.close().unwrap();
    drop(pool);
    let pool = reopen(&sim);
    assert_eq!([0, 1, 3].map(|l| read_block(&pool, c2.id, View::Head, l)), [1, 7, 0]);
    assert_clean(&pool);
}

/// A clone of a sparse volume (a file volume's table spans terabytes)
/// flattens its origin's holes a hole at a time, reading nothing there:
/// chunk by chunk, 16 TiB would take 16 million steps.
#[test]
fn a_sparse_clone_flattens_its_holes_without_stepping_through_them() {
    const TIB: u64 = 1 << 40;
    let (_sim, pool) = new_pool(64 * MIB);
    let v = pool.create_volume("sparse", 16 * TIB).unwrap().id;
    let at = [0, 5 * TIB, 10 * TIB + 7 * BS as u64, 16 * TIB - BS as u64];
    for (i, &off) in at.iter().enumerate() {
        pool.write(v, off, &block(i as u8 + 1), false).unwrap();
    }
    pool.create_snapshot("sparse", "s").unwrap();
    let c = pool.create_clone("sparse", "s", "c").unwrap().id;
    pool.write(c, 5 * TIB + BS as u64, &block(9), false).unwrap();
    let mut steps = 0u64;
    pool.flatten("c", &mut |_, _| steps += 1).unwrap();
    assert!(steps < 64, "{steps} steps for 4 blocks and the holes between");
    pool.delete_snapshot("sparse", "s").unwrap();
    pool.delete_volume("sparse", false).unwrap();
    for (i, &off) in at.iter().enumerate() {
        assert_eq!(read_block(&pool, c, View::Head, off / BS as u64), i as u8 + 1, "block at {off}");
    }
    assert_eq!(read_block(&pool, c, View::Head, 5 * TIB / BS as u64 + 1), 9);
    assert_eq!(read_block(&pool, c, View::Head, 3 * TIB / BS as u64), 0, "a hole reads zeros");
    assert_clean(&pool);
}

#[test]
fn bad_names_and_duplicates_are_refused() {
    let (_sim, pool) = new_pool(16 * MIB);
    pool.create_volume("vol", MIB).unwrap();
    for bad in ["", "a@b", "a/b", "a b"] {
        assert!(matches!(pool.create_snapshot("vol", bad), Err(EngineError::InvalidArgument(_))), "{bad:?}");
    }
    pool.create_snapshot("vol", "s").unwrap();
    assert!(matches!(pool.create_snapshot("vol", "s"), Err(EngineError::SnapshotExists { .. })));
    assert!(matches!(pool.delete_snapshot("vol", "nope"), Err(EngineError::NoSuchSnapshot { .. })));
    assert!(matches!(pool.delete_volume("vol", false), Err(EngineError::InUse { .. })));
    pool.delete_volume("vol", true).unwrap();
    assert_clean(&pool);
}

/// A pool from before INLINE_DEAD_LISTS (incompat bit 19) keeps working:
/// its dead lists, trees of nodes, are read, kept as trees and deleted;
/// its next snapshot sets the bit and small new dead lists live in the
/// catalog; every view reads right across reopens, the checker is clean.
#[test]
fn dead_lists_of_a_pool_from_before_inline_lists_are_read_and_deleted() {
    let (sim, pool) = new_pool(32 * MIB);
    drop(pool);
    let old = tarn_engine::OpenOptions { compat_no_inline_dead_lists: true, ..Default::default() };
    let devices = || vec![sim.clone() as Arc<dyn tarn_engine::Device>];
    let pool = Pool::open(devices(), old).unwrap();
    let v = pool.create_volume("vol", 4 * MIB).unwrap().id;
    for lba in 0..8 {
        pool.write(v, lba * BS as u64, &block(1), false).unwrap();
    }
    let s1 = pool.create_snapshot("vol", "s1").unwrap().epoch;
    for lba in [0, 2, 4] {
        pool.write(v, lba * BS as u64, &block(2), false).unwrap();
    }
    pool.close().unwrap();
    let pool = reopen(&sim);
    assert_eq!(pool.status().inline_dead_lists, 0, "the older build wrote s1's dead list as a tree");
    let s2 = pool.create_snapshot("vol", "s2").unwrap().epoch;
    pool.write(v, 6 * BS as u64, &block(3), false).unwrap();
    pool.write(v, 0, &block(3), false).unwrap();
    pool.close().unwrap();
    let pool = reopen(&sim);
    assert_eq!(pool.status().inline_dead_lists, 1, "s2's dead list (2 extents) is in the catalog");
    let views = |pool: &Pool| -> Vec<Vec<u8>> {
        [View::Snapshot(s1), View::Snapshot(s2), View::Head]
            .iter()
            .map(|&view| (0..8).map(|lba| read_block(pool, v, view, lba)).collect())
            .collect()
    };
    let want = vec![vec![1; 8], vec![2, 1, 2, 1, 2, 1, 1, 1], vec![3, 1, 2, 1, 2, 1, 3, 1]];
    assert_eq!(views(&pool), want);
    assert_clean(&pool);
    // Deleting the old snapshot frees its 3 blocks (its tree's entries
    // born before s1 with no older snapshot), and s2's list stays inline.
    assert_eq!(pool.delete_snapshot("vol", "s1").unwrap(), 3 * BS as u64);
    assert_clean(&pool);
    pool.close().unwrap();
    let pool = reopen(&sim);
    assert_eq!(pool.status().inline_dead_lists, 1);
    let read = |view| (0..8).map(|lba| read_block(&pool, v, view, lba)).collect::<Vec<u8>>();
    assert_eq!((read(View::Snapshot(s2)), read(View::Head)), (want[1].clone(), want[2].clone()));
    assert_eq!(pool.delete_snapshot("vol", "s2").unwrap(), 2 * BS as u64);
    assert_clean(&pool);
    pool.close().unwrap();
    let pool = reopen(&sim);
    assert_eq!((pool.status().inline_dead_lists, read_block(&pool, v, View::Head, 6)), (0, 3));
    assert_clean(&pool);
}
