//! File-system hints' engine half (`Pool::place_hinted`): hinted blocks
//! move to a cluster or a metadata device and back without changing what
//! the volume or its snapshots read; blocks a snapshot shares move for it
//! too (no snapshot grows); a
//! metadata device too small stops the moves at its limit and writes go on.

use std::sync::Arc;
use tarn_engine::{create_pool, CreateOptions, Device, HintTarget, OpenOptions, Pool, View};
use tarn_sim::SimDevice;

const MIB: u64 = 1 << 20;
const BS: u64 = 4096;

/// A pool on a data device and a second (metadata) device, both simulated.
fn two_device_pool(data: u64, meta: u64) -> (Vec<Arc<SimDevice>>, Pool) {
    let sims = vec![Arc::new(SimDevice::new("sim0", data)), Arc::new(SimDevice::new("sim1", meta))];
    let dyns: Vec<Arc<dyn Device>> = sims.iter().map(|s| s.clone() as Arc<dyn Device>).collect();
    let opts = CreateOptions { journal_bytes: Some(256 << 10), ..Default::default() };
    create_pool(&dyns, &["sim0".into(), "sim1".into()], &opts).unwrap();
    let pool = Pool::open(dyns, OpenOptions::default()).unwrap();
    (sims, pool)
}

fn reopen(sims: &[Arc<SimDevice>]) -> Pool {
    Pool::open(sims.iter().map(|s| s.clone() as Arc<dyn Device>).collect(), OpenOptions::default()).unwrap()
}

/// Block `b` of the test pattern: its number in every byte pair.
fn pattern(blocks: u64) -> Vec<u8> {
    (0..blocks * BS / 2).flat_map(|i| ((i * 2 / BS) as u16).to_le_bytes()).collect()
}

/// (blocks on `device`, blocks elsewhere) of the head's mapped `ranges`.
fn placed(pool: &Pool, vol: u32, ranges: &[(u64, u64)], device: u16) -> (u64, u64) {
    let mut on = (0, 0);
    for &(lba, len) in ranges {
        for r in pool.physical_runs(vol, View::Head, lba, len).unwrap() {
            if r.device == device {
                on.0 += r.len;
            } else {
                on.1 += r.len;
            }
        }
    }
    on
}

fn read_all(pool: &Pool, vol: u32, view: View, blocks: u64) -> Vec<u8> {
    let mut buf = vec![0u8; (blocks * BS) as usize];
    pool.read_view(vol, view, 0, &mut buf).unwrap();
    buf
}

#[test]
fn hinted_blocks_move_to_the_metadata_device_and_back() {
    let (sims, pool) = two_device_pool(64 * MIB, 16 * MIB);
    pool.set_hint_device(Some(1)).unwrap();
    let v = pool.create_volume("v", 8 * MIB).unwrap().id;
    let blocks = 8 * MIB / BS;
    let data = pattern(blocks);
    pool.write(v, 0, &data, false).unwrap();
    let ranges = [(3, 5), (100, 40), (1000, 1)];
    assert_eq!(placed(&pool, v, &ranges, 1), (0, 46), "new data avoids the metadata device");

    let r = pool.place_hinted("v", &ranges, HintTarget::Device(1), &mut |_, _| {}).unwrap();
    assert_eq!((r.blocks_moved, r.stopped_full), (46, false));
    assert_eq!(placed(&pool, v, &ranges, 1), (46, 0));
    assert_eq!(read_all(&pool, v, View::Head, blocks), data);
    let again = pool.place_hinted("v", &ranges, HintTarget::Device(1), &mut |_, _| {}).unwrap();
    assert_eq!((again.blocks_moved, again.blocks_in_place), (0, 46), "a second hint moves nothing");

    pool.close().unwrap();
    let pool = reopen(&sims);
    assert_eq!(placed(&pool, v, &ranges, 1), (46, 0), "the moves are durable");
    let back = pool.place_hinted("v", &ranges, HintTarget::Natural, &mut |_, _| {}).unwrap();
    assert_eq!(back.blocks_moved, 46);
    assert_eq!(placed(&pool, v, &ranges, 1), (0, 46), "unhint: nothing left on the metadata device");
    assert_eq!(read_all(&pool, v, View::Head, blocks), data);
    assert!(pool.check().is_clean());
    pool.close().unwrap();
}

#[test]
fn blocks_a_snapshot_shares_move_for_the_snapshot_too() {
    let (_sims, pool) = two_device_pool(64 * MIB, 16 * MIB);
    let v = pool.create_volume("v", 4 * MIB).unwrap().id;
    let blocks = 4 * MIB / BS;
    let data = pattern(blocks);
    pool.write(v, 0, &data, false).unwrap();
    let snap = pool.create_snapshot("v", "s").unwrap();
    pool.write(v, 10 * BS, &vec![7u8; BS as usize], false).unwrap();
    let used = pool.status().used;
    let r = pool.place_hinted("v", &[(0, 20)], HintTarget::Device(1), &mut |_, _| {}).unwrap();
    assert_eq!((r.blocks_moved, r.blocks_shared), (20, 19), "{r:?}");
    assert_eq!(placed(&pool, v, &[(0, 20)], 1), (20, 0));
    assert_eq!(pool.status().used, used, "moving shared blocks copied them");
    let info = pool.snapshot_info("v", "s").unwrap();
    assert_eq!((info.exclusive, info.referenced), (BS, snap.referenced), "{info:?}");
    let runs = pool.physical_runs(v, View::Snapshot(snap.epoch), 0, 20).unwrap();
    assert!(runs.iter().filter(|r| r.lba != 10).all(|r| r.device == 1), "the snapshot follows: {runs:?}");
    assert_eq!(read_all(&pool, v, View::Snapshot(snap.epoch), blocks), data);
    let mut head = data.clone();
    head[(10 * BS) as usize..(11 * BS) as usize].fill(7);
    assert_eq!(read_all(&pool, v, View::Head, blocks), head);
    assert!(pool.check().is_clean());
}

#[test]
fn a_full_metadata_device_stops_the_moves_and_writes_go_on() {
    let (sims, pool) = two_device_pool(64 * MIB, 2 * MIB);
    let v = pool.create_volume("v", 16 * MIB).unwrap().id;
    let blocks = 16 * MIB / BS;
    let data = pattern(blocks);
    pool.write(v, 0, &data, false).unwrap();
    let r = pool.place_hinted("v", &[(0, blocks)], HintTarget::Device(1), &mut |_, _| {}).unwrap();
    assert!(r.stopped_full, "{r:?}");
    assert!(r.blocks_moved > 0 && r.blocks_moved < blocks, "{r:?}");
    assert_eq!(placed(&pool, v, &[(0, blocks)], 1).0, r.blocks_moved);
    assert_eq!(read_all(&pool, v, View::Head, blocks), data);
    pool.write(v, 5 * MIB, &vec![9u8; MIB as usize], false).unwrap();
    pool.flush().unwrap();
    pool.close().unwrap();
    let pool = reopen(&sims);
    let mut want = data;
    want[(5 * MIB) as usize..(6 * MIB) as usize].fill(9);
    assert_eq!(read_all(&pool, v, View::Head, blocks), want);
    assert!(pool.check().is_clean());
}

#[test]
fn ranges_outside_the_volume_are_refused_before_anything_moves() {
    let (_sims, pool) = two_device_pool(64 * MIB, 16 * MIB);
    let v = pool.create_volume("v", 4 * MIB).unwrap().id;
    pool.write(v, 0, &pattern(16), false).unwrap();
    let err = pool.place_hinted("v", &[(0, 4), (1024, 1)], HintTarget::Device(1), &mut |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("outside volume v"), "{err}");
    assert_eq!(placed(&pool, v, &[(0, 4)], 1), (0, 4), "the valid range before it did not move either");
    assert!(pool.place_hinted("nope", &[(0, 1)], HintTarget::Cluster, &mut |_, _| {}).is_err());
    assert!(pool.set_hint_device(Some(5)).is_err());
}
