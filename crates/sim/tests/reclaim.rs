//! Gray-box reclaim's engine half: unmapping in the head only what it
//! still shares with a snapshot, for every placement policy (an in-place
//! overwrite after the snapshot must not look unchanged).

use tarn_engine::{PlacementKind, View};
use tarn_sim::fixture::{one_device_pool, reopen};

const MIB: u64 = 1 << 20;
const BS: u64 = 4096;

#[test]
fn trims_only_blocks_unchanged_since_the_snapshot() {
    for placement in [None, Some(PlacementKind::Inplace), Some(PlacementKind::Append), Some(PlacementKind::Contiguous)]
    {
        let (sim, pool) = one_device_pool(64 * MIB);
        let v = pool.create_volume_placed("v", 16 * MIB, placement).unwrap().id;
        pool.write(v, 0, &vec![0xaa; 16 * BS as usize], false).unwrap();
        pool.flush().unwrap();
        let snap = pool.create_snapshot("v", "before").unwrap();
        // Rewritten after the snapshot: must survive the reclaim.
        pool.write(v, 3 * BS, &vec![0xbb; BS as usize], false).unwrap();
        let ranges = [(0, 8 * BS), (10 * BS + 100, 3 * BS)];
        let dry = pool.trim_unchanged_since(v, snap.epoch, &ranges, false).unwrap();
        let count = pool.trim_unchanged_since(v, snap.epoch, &ranges, true).unwrap();
        assert_eq!(dry, count, "{placement:?}: a dry run counts what a real one does");
        assert_eq!(count.kept_changed, 1, "{placement:?}");
        // Blocks 0-7 but 3, and 11-12 (the partial blocks at 10 and 13 stay).
        assert_eq!(count.unmapped, 7 + 2, "{placement:?}");
        let mut buf = vec![0u8; 16 * BS as usize];
        pool.read(v, 0, &mut buf).unwrap();
        for (b, chunk) in buf.chunks(BS as usize).enumerate() {
            let want = match b {
                3 => 0xbb,
                0..=7 | 11 | 12 => 0,
                _ => 0xaa,
            };
            assert!(chunk.iter().all(|&x| x == want), "{placement:?}: block {b}");
        }
        pool.read_view(v, View::Snapshot(snap.epoch), 0, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0xaa), "{placement:?}: the snapshot keeps everything");
        let before = pool.volume_info(v).unwrap().allocated;
        pool.delete_snapshot("v", "before").unwrap();
        pool.flush().unwrap();
        pool.close().unwrap();
        let pool = reopen(&sim).unwrap();
        let after = pool.volume_info(v).unwrap();
        assert_eq!(after.allocated, before, "{placement:?}");
        assert_eq!(after.allocated, 7 * BS, "{placement:?}: 16 written, 9 trimmed");
        let mut buf = vec![0u8; BS as usize];
        pool.read(v, 3 * BS, &mut buf).unwrap();
        assert!(buf.iter().all(|&x| x == 0xbb), "{placement:?}: durable across reopen");
        pool.close().unwrap();
    }
}

#[test]
fn refuses_an_epoch_that_is_no_snapshot() {
    let (_sim, pool) = one_device_pool(64 * MIB);
    let v = pool.create_volume("v", 16 * MIB).unwrap().id;
    pool.write(v, 0, &vec![1; BS as usize], false).unwrap();
    let err = pool.trim_unchanged_since(v, 12345, &[(0, BS)], true).unwrap_err();
    assert!(err.to_string().contains("not a snapshot"), "{err}");
    let err = pool.trim_unchanged_since(v, 0, &[(0, 32 * MIB)], true).unwrap_err();
    assert!(err.to_string().contains("outside volume v"), "{err}");
    let mut buf = vec![0u8; BS as usize];
    pool.read(v, 0, &mut buf).unwrap();
    assert!(buf.iter().all(|&x| x == 1));
}
