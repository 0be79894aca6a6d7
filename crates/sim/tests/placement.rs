//! Per-volume placement policies: what each does with an overwrite, and
//! that a volume's policy is durable (journal replay, checkpoint, clone).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tarn_engine::{EngineError, PlacementKind, Pool};
use tarn_sim::fixture::{find_block, one_device_pool, reopen};

const MIB: u64 = 1 << 20;

/// A 4 KiB block filled with `byte` (distinct per write, to find it).
fn block(byte: u8) -> Vec<u8> {
    vec![byte; 4096]
}

/// Write three versions of block 5 of a volume of `placement`, each
/// followed by a flush, and return the device offset of each version.
/// (The first overwrite after a commit may be redirected whatever the
/// policy: its overwrite region opens with that commit.)
fn three_versions(placement: Option<PlacementKind>, first: u8) -> [u64; 3] {
    let (sim, pool) = one_device_pool(64 * MIB);
    let v = pool.create_volume_placed("v", 16 * MIB, placement).unwrap().id;
    let mut at = [0u64; 3];
    for (i, byte) in (first..first + 3).enumerate() {
        pool.write(v, 5 * 4096, &block(byte), false).unwrap();
        pool.flush().unwrap();
        at[i] = find_block(&sim, &block(byte)).expect("the version written is on the device");
    }
    pool.close().unwrap();
    at
}

#[test]
fn append_moves_every_overwrite_and_inplace_keeps_it_where_it_is() {
    let append = three_versions(Some(PlacementKind::Append), 0x10);
    assert_ne!(append[1], append[0], "append: an overwrite goes to new space");
    assert_ne!(append[2], append[1], "append: every overwrite goes to new space");
    for placement in [Some(PlacementKind::Inplace), Some(PlacementKind::Linear), None] {
        let at = three_versions(placement, 0x20);
        assert_eq!(at[2], at[1], "{placement:?}: an overwrite in an open region stays in place");
    }
}

/// An `append` volume's block rewritten before any commit took its ops
/// stays where it was first written (no durable entry maps it: in place
/// is as safe as new space), so a block rewritten many times between
/// commits is placed once; once committed, the next overwrite moves. A
/// power cut after the rewrites returns the last commit's content, and
/// one after the commit the last rewrite's, on every seed.
#[test]
fn append_rewrites_before_a_commit_stay_in_place() {
    for seed in 0..8u64 {
        let (sim, pool) = one_device_pool(64 * MIB);
        let v = pool.create_volume_placed("v", 16 * MIB, Some(PlacementKind::Append)).unwrap().id;
        pool.write(v, 5 * 4096, &block(0x31), false).unwrap();
        pool.flush().unwrap();
        let committed = find_block(&sim, &block(0x31)).expect("on the device");
        pool.write(v, 5 * 4096, &block(0x32), false).unwrap();
        let first = find_block(&sim, &block(0x32)).expect("on the device");
        assert_ne!(first, committed, "seed {seed}: an overwrite of committed data moves");
        let used = pool.status().used;
        for byte in 0x33..0x38 {
            pool.write(v, 5 * 4096, &block(byte), false).unwrap();
        }
        assert_eq!(find_block(&sim, &block(0x37)), Some(first), "seed {seed}: rewrites of new data stay in place");
        assert_eq!(pool.status().used, used, "seed {seed}: no block taken by the rewrites");
        // Even seeds cut the power now, odd ones after a commit.
        let flushed = seed % 2 == 1;
        if flushed {
            pool.flush().unwrap();
        }
        sim.crash(&mut ChaCha8Rng::seed_from_u64(seed));
        drop(pool);
        let pool = reopen(&sim).unwrap();
        let mut back = block(0);
        pool.read(v, 5 * 4096, &mut back).unwrap();
        let want = if flushed { 0x37 } else { 0x31 };
        assert_eq!(back, block(want), "seed {seed}: the last commit's content (flushed: {flushed})");
        assert!(pool.check().is_clean(), "seed {seed}");
        if flushed {
            pool.write(v, 5 * 4096, &block(0x40), false).unwrap();
            assert_ne!(find_block(&sim, &block(0x40)), Some(first), "seed {seed}: committed now, so it moves");
        }
    }
}

fn placements(pool: &Pool) -> Vec<(String, &'static str, bool)> {
    let mut v: Vec<_> = pool.list_volumes().into_iter().map(|i| (i.name, i.placement, i.placement_own)).collect();
    v.sort();
    v
}

#[test]
fn a_volume_keeps_its_placement_across_replay_checkpoint_and_clone() {
    let (sim, pool) = one_device_pool(64 * MIB);
    pool.create_volume_placed("a", 4 * MIB, Some(PlacementKind::Append)).unwrap();
    pool.create_volume("b", 4 * MIB).unwrap();
    pool.create_volume_placed("c", 4 * MIB, Some(PlacementKind::Contiguous)).unwrap();
    pool.set_placement("b", Some(PlacementKind::Inplace)).unwrap();
    pool.set_placement("c", None).unwrap();
    let want =
        vec![("a".to_string(), "append", true), ("b".to_string(), "inplace", true), ("c".to_string(), "linear", false)];
    assert_eq!(placements(&pool), want);
    // A crash: the journal alone carries the placements.
    drop(pool);
    sim.crash(&mut ChaCha8Rng::seed_from_u64(7));
    let pool = reopen(&sim).unwrap();
    assert_eq!(placements(&pool), want, "after journal replay");
    // A checkpoint: the catalog carries them.
    pool.checkpoint().unwrap();
    pool.close().unwrap();
    let pool = reopen(&sim).unwrap();
    assert_eq!(placements(&pool), want, "after a checkpoint");
    pool.create_snapshot("a", "s").unwrap();
    let clone = pool.create_clone("a", "s", "a2").unwrap();
    assert_eq!((clone.placement, clone.placement_own), ("append", true), "a clone places as its origin");
    assert!(pool.check().is_clean());
}

#[test]
fn unknown_volume_is_an_error_and_changes_nothing() {
    let (_sim, pool) = one_device_pool(16 * MIB);
    pool.create_volume("a", MIB).unwrap();
    let err = pool.set_placement("nope", Some(PlacementKind::Append)).unwrap_err();
    assert!(matches!(err, EngineError::NoSuchVolume(_)), "{err}");
    assert_eq!(placements(&pool), vec![("a".to_string(), "linear", false)]);
}

/// A full pool fails only writes to holes, whatever the policy: an
/// `append` volume's overwrites then go in place instead of failing.
#[test]
fn a_full_pool_still_takes_overwrites_of_an_append_volume() {
    let (_sim, pool) = one_device_pool(8 * MIB);
    let v = pool.create_volume_placed("a", 64 * MIB, Some(PlacementKind::Append)).unwrap().id;
    let mut written = 0u64;
    // Large pieces, then single blocks, each until the pool is full; a
    // flush between may give space back, so fill again after it.
    for piece in [256 << 10, 4096, 4096] {
        let data = vec![0x5au8; piece];
        let err = loop {
            match pool.write(v, written, &data, false) {
                Ok(()) => written += piece as u64,
                Err(e) => break e,
            }
            assert!(written < 64 * MIB, "the pool accepted 64 MiB");
        };
        assert!(matches!(err, EngineError::NoSpace), "got {err}");
        pool.flush().unwrap();
    }
    let over = vec![0x66u8; 256 << 10];
    pool.write(v, 0, &over, false).expect("an overwrite on a full pool goes in place");
    pool.flush().unwrap();
    let mut back = vec![0u8; over.len()];
    pool.read(v, 0, &mut back).unwrap();
    assert_eq!(back, over);
    assert!(pool.check().is_clean());
}

/// The idle compactor leaves `inplace` volumes as their first writes laid
/// them out, and re-lays the others.
#[test]
fn the_idle_compactor_skips_inplace_volumes() {
    use tarn_engine::volumes::relayout::RelayoutCursor;
    let (_sim, pool) = one_device_pool(64 * MIB);
    let v = pool.create_volume_placed("v", 4 * MIB, Some(PlacementKind::Inplace)).unwrap().id;
    // Blocks written backwards, a commit between: scattered on disk.
    for b in (0..256u64).rev() {
        pool.write(v, b * 4096, &block(b as u8), false).unwrap();
        if b % 16 == 0 {
            pool.flush().unwrap();
        }
    }
    pool.flush().unwrap();
    let pass = |pool: &Pool| {
        let mut cursor = RelayoutCursor::default();
        (0..16).map(|_| pool.relayout_step(&mut cursor, 8).unwrap().windows_moved).sum::<u64>()
    };
    assert_eq!(pass(&pool), 0, "an inplace volume is not compacted in the background");
    pool.set_placement("v", Some(PlacementKind::Linear)).unwrap();
    assert!(pass(&pool) > 0, "the same data under linear is re-laid");
    assert!(pool.check().is_clean());
}

/// Physical blocks where a volume's blocks [lba, lba+len) lie, in order.
fn first_block(pool: &Pool, vol: u32, lba: u64) -> u64 {
    let runs = pool.physical_runs(vol, tarn_engine::View::Head, lba, 1).unwrap();
    runs.first().expect("block is mapped").block
}

#[test]
fn allocation_started_in_the_middle_stays_there_across_a_reopen_and_wraps_to_the_front() {
    let (sim, pool) = one_device_pool(64 * MIB);
    let device_blocks = 64 * MIB / 4096;
    pool.start_allocation_at(tarn_engine::AllocationStart::Middle).unwrap();
    // A power cut right after: the start is durable when the call returns.
    sim.crash(&mut ChaCha8Rng::seed_from_u64(5));
    drop(pool);
    let pool = reopen(&sim).unwrap();
    let v = pool.create_volume("v", 60 * MIB).unwrap().id;
    pool.write(v, 0, &vec![1u8; MIB as usize], false).unwrap();
    let first = first_block(&pool, v, 0);
    assert!(
        (device_blocks * 3 / 8..device_blocks / 2).contains(&first),
        "first data at block {first} of {device_blocks}: the middle of the data part"
    );
    // Sequential data goes on from there, then wraps to the front.
    let mut lba_bytes = MIB;
    let mut wrapped = false;
    while lba_bytes < 60 * MIB && !wrapped {
        pool.write(v, lba_bytes, &vec![2u8; MIB as usize], false).unwrap();
        wrapped = first_block(&pool, v, lba_bytes / 4096) < first;
        lba_bytes += MIB;
    }
    assert!(wrapped, "allocation reached the end and went on at the front");
    pool.flush().unwrap();
    pool.close().unwrap();
}

/// Write `mib` MiB of `byte` to a new volume `name` of `placement`,
/// sequentially.
fn filled(pool: &Pool, name: &str, mib: u64, byte: u8, placement: Option<PlacementKind>) -> u32 {
    let v = pool.create_volume_placed(name, mib * MIB, placement).unwrap().id;
    for i in 0..mib {
        pool.write(v, i * MIB, &vec![byte; MIB as usize], false).unwrap();
    }
    v
}

#[test]
fn contiguous_copies_on_write_pack_near_the_original() {
    let (_sim, pool) = one_device_pool(256 * MIB);
    let v = filled(&pool, "v", 8, 1, Some(PlacementKind::Contiguous));
    filled(&pool, "gap", 32, 2, None);
    let far = filled(&pool, "far", 8, 3, None);
    // Whole free regions now lie right after v's data; the cursor is after far's.
    pool.delete_volume("gap", false).unwrap();
    pool.flush().unwrap();
    let original = first_block(&pool, v, 0);
    let far_start = first_block(&pool, far, 0);
    pool.create_snapshot("v", "s").unwrap();
    // Two blocks of one 256 KiB logical region, in reverse order: each a
    // copy-on-write (the snapshot keeps them).
    for (lba, byte) in [(40u64, 0x40u8), (3, 0x03)] {
        pool.write(v, lba * 4096, &block(byte), false).unwrap();
    }
    let (first, second) = (first_block(&pool, v, 40), first_block(&pool, v, 3));
    assert!(
        (original..far_start).contains(&first),
        "copy at {first}: between the original ({original}) and far ({far_start})"
    );
    assert_eq!(second, first + 1, "a region's copies pack one after the other, in the order written");
    let mut buf = vec![0u8; 4096];
    pool.read(v, 40 * 4096, &mut buf).unwrap();
    assert_eq!(buf, block(0x40));
    let (_, snap) = pool.lookup_view("v@s").expect("the snapshot");
    pool.read_view(v, snap, 40 * 4096, &mut buf).unwrap();
    assert_eq!(buf, block(1));
    pool.flush().unwrap();
    assert!(pool.check().is_clean());
}
