//! Data checksums on simulated devices: bit flips in data are detected on
//! read (an error, never the bad bytes), counted, listed by scrub; a crash
//! after an unflushed in-place overwrite is resynchronized, not reported.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tarn_engine::scrub::ScrubOptions;
use tarn_engine::sums::IDLE_COMMITS;
use tarn_engine::{create_pool, CreateOptions, Device, EngineError, OpenOptions, PlacementKind, Pool};
use tarn_sim::{fixture, SimDevice};

const MIB: u64 = 1 << 20;
const BS: usize = 4096;

/// A block whose every byte says which block it is.
fn block(tag: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    for (i, chunk) in b.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&(tag * 1_000_003 + i as u64).to_le_bytes());
    }
    b
}

/// Byte offset of the block holding `data` on the device.
fn find(sim: &SimDevice, data: &[u8]) -> u64 {
    fixture::find_block(sim, data).expect("block not found on the device")
}

fn fill(pool: &Pool, vol: u32, blocks: u64) {
    for b in 0..blocks {
        pool.write(vol, b * BS as u64, &block(b), false).unwrap();
    }
    pool.flush().unwrap();
}

#[test]
fn flipped_data_bit_is_an_error_counted_and_listed_by_scrub() {
    let (sim, pool) = fixture::one_device_pool(64 * MIB);
    let v = pool.create_volume("d", 16 * MIB).unwrap().id;
    fill(&pool, v, 32);
    let at = find(&sim, &block(7));
    sim.flip_bit(at + 100, 3);
    let mut buf = vec![0u8; BS];
    let err = pool.read(v, 7 * BS as u64, &mut buf).unwrap_err();
    assert!(matches!(err, EngineError::Checksum { .. }), "{err}");
    // A sub-block read of the damaged block fails too; its neighbours read.
    assert!(pool.read(v, 7 * BS as u64 + 512, &mut buf[..512]).is_err());
    pool.read(v, 6 * BS as u64, &mut buf).unwrap();
    assert_eq!(buf, block(6));
    assert_eq!(pool.status().checksum_errors, 2);
    let report = pool.scrub(&ScrubOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!(report.blocks, 32);
    assert_eq!(report.lost_blocks, 1);
    assert_eq!(report.repaired, 0);
    assert_eq!(report.lost.len(), 1);
    assert_eq!((report.lost[0].volume.as_str(), report.lost[0].offset, report.lost[0].len), ("d", 7 * 4096, 4096));
    // The sums are durable: after a clean reopen the block still fails.
    pool.close().unwrap();
    drop(pool);
    let pool = fixture::reopen(&sim).unwrap();
    assert!(matches!(pool.read(v, 7 * BS as u64, &mut buf), Err(EngineError::Checksum { .. })));
    assert!(pool.check().is_clean());
}

#[test]
fn every_random_bit_flip_in_written_data_is_detected() {
    let (sim, pool) = fixture::one_device_pool(64 * MIB);
    let v = pool.create_volume("d", 16 * MIB).unwrap().id;
    fill(&pool, v, 64);
    let places: Vec<u64> = (0..64).map(|b| find(&sim, &block(b))).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut whole = vec![0u8; 64 * BS];
    for _ in 0..200 {
        let b = rng.random_range(0..64usize);
        let at = places[b] + rng.random_range(0..BS as u64);
        let bit = rng.random_range(0..8u8);
        sim.flip_bit(at, bit);
        let err = pool.read(v, 0, &mut whole).unwrap_err();
        assert!(matches!(err, EngineError::Checksum { .. }), "flip in block {b} not detected: {err}");
        sim.flip_bit(at, bit);
        pool.read(v, 0, &mut whole).unwrap();
    }
    assert_eq!(pool.status().checksum_errors, 200);
}

#[test]
fn crash_after_unflushed_in_place_overwrite_is_resynced_not_reported() {
    let (sim, pool) = fixture::one_device_pool(64 * MIB);
    let v = pool.create_volume("d", 16 * MIB).unwrap().id;
    fill(&pool, v, 32);
    // The first overwrite redirects and asks its region open; after the
    // flush that opens it, overwrites go in place.
    pool.write(v, 3 * BS as u64, &block(103), false).unwrap();
    pool.flush().unwrap();
    let before = pool.volume_info(v).unwrap();
    pool.write(v, 3 * BS as u64, &block(203), false).unwrap();
    assert_eq!(pool.volume_info(v).unwrap().extents, before.extents, "overwrite in an open region moved");
    // The data reaches the device, the commit with its new sum does not.
    sim.flush().unwrap();
    sim.crash(&mut ChaCha8Rng::seed_from_u64(1));
    drop(pool);
    let pool = fixture::reopen(&sim).unwrap();
    // Opening scans nothing: the region waits for its resync; a read there
    // resyncs the blocks it touches first.
    assert_eq!(pool.resync_pending(), 1);
    let mut buf = vec![0u8; BS];
    pool.read(v, 3 * BS as u64, &mut buf).unwrap();
    assert_eq!(buf, block(203));
    let st = pool.status();
    assert_eq!((st.checksum_errors, st.resynced_blocks), (0, 1));
    assert_eq!(pool.resync().unwrap(), 0, "the read already renewed the only stale sum");
    assert_eq!(pool.resync_pending(), 0);
    assert!(pool.check().is_clean());
    let report = pool.scrub(&ScrubOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!((report.bad_copies, report.lost_blocks), (0, 0));
}

#[test]
fn scrub_reports_progress_and_respects_its_rate() {
    let (_sim, pool) = fixture::one_device_pool(64 * MIB);
    let v = pool.create_volume("d", 16 * MIB).unwrap().id;
    fill(&pool, v, 256);
    let mut last = (0, 0);
    let t = std::time::Instant::now();
    let report = pool.scrub(&ScrubOptions { rate: Some(4 * MIB) }, &mut |d, n| last = (d, n)).unwrap();
    assert_eq!(last, (MIB, MIB));
    assert_eq!(report.bytes, MIB);
    // 1 MiB at 4 MiB/s: at least ~250 ms (the first chunk is free).
    assert!(t.elapsed() >= std::time::Duration::from_millis(200), "{:?}", t.elapsed());
}

#[test]
fn idle_regions_close_so_a_crash_does_not_excuse_their_corruption() {
    let (sim, pool) = fixture::one_device_pool(256 * MIB);
    let a = pool.create_volume("a", 16 * MIB).unwrap().id;
    let b = pool.create_volume("b", 128 * MIB).unwrap().id;
    fill(&pool, a, 32);
    // Open a's region: a redirected overwrite asks, the flush opens it.
    pool.write(a, 3 * BS as u64, &block(103), false).unwrap();
    pool.flush().unwrap();
    // b's data goes past the first 64 MiB region of the device.
    let chunk = vec![0x11u8; MIB as usize];
    for i in 0..100 {
        pool.write(b, i * MIB, &chunk, false).unwrap();
    }
    pool.flush().unwrap();
    // Commits with in-place writes only in b's last region: a's goes idle.
    for i in 0..IDLE_COMMITS + 4 {
        pool.write(b, 99 * MIB + i * BS as u64, &block(500 + i), false).unwrap();
        pool.flush().unwrap();
    }
    let at = find(&sim, &block(5));
    sim.flip_bit(at + 7, 1);
    sim.crash(&mut ChaCha8Rng::seed_from_u64(3));
    drop(pool);
    let pool = fixture::reopen(&sim).unwrap();
    let mut buf = vec![0u8; BS];
    let err = pool.read(a, 5 * BS as u64, &mut buf).unwrap_err();
    assert!(matches!(err, EngineError::Checksum { .. }), "{err}");
    // b's region was open at the crash: resynced, and b reads back.
    assert!(pool.status().resynced_blocks == 0, "nothing changed behind the sums in b");
    pool.read(b, 99 * MIB + 4 * BS as u64, &mut buf).unwrap();
    assert_eq!(buf, block(504));
}

/// Coarse checksums (one crc per 64 KiB group): every block still reads
/// back right (reads widened to whole groups at either end, sub-block
/// reads too), a flipped bit fails every read of its group (and only its
/// group), scrub lists the group's blocks, and after a reopen the sums are
/// still coarse and still catch it; `pool check` stays clean.
#[test]
fn coarse_groups_verify_reads_and_scrub() {
    let (sim, pool) = fixture::one_device_pool(64 * MIB);
    let v = pool.create_volume("d", 16 * MIB).unwrap().id;
    let data: Vec<u8> = (0..96).flat_map(block).collect();
    pool.write(v, 0, &data, false).unwrap();
    pool.flush().unwrap();
    let groups = pool.coarsen_sums(v, 0, 96).unwrap();
    pool.flush().unwrap();
    assert!(groups >= 5, "96 blocks in one piece hold at least 5 whole groups, got {groups}");
    let mut buf = vec![0u8; BS];
    for b in 0..96u64 {
        pool.read(v, b * BS as u64, &mut buf).unwrap();
        assert_eq!(buf, block(b), "block {b}");
    }
    let mut part = vec![0u8; 700];
    pool.read(v, 37 * BS as u64 + 3000, &mut part).unwrap();
    assert_eq!(part[..], data[37 * BS + 3000..37 * BS + 3700]);
    assert!(pool.check().is_clean());
    // A bit of block 40: its physical group is the one at (pba of 40) / 16.
    let at = find(&sim, &block(40));
    let first = (at / BS as u64) / 16 * 16;
    let group: Vec<u64> = (0..96).filter(|&b| (find(&sim, &block(b)) / BS as u64) / 16 * 16 == first).collect();
    assert_eq!(group.len(), 16, "block 40's group is coarse and whole: {group:?}");
    sim.flip_bit(at + 9, 1);
    for b in 0..96u64 {
        let r = pool.read(v, b * BS as u64, &mut buf);
        if group.contains(&b) {
            assert!(matches!(r, Err(EngineError::Checksum { .. })), "block {b} of the damaged group: {r:?}");
        } else {
            r.unwrap();
            assert_eq!(buf, block(b), "block {b}");
        }
    }
    let report = pool.scrub(&ScrubOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!(report.lost_blocks, 16, "the damaged group's blocks");
    pool.close().unwrap();
    drop(pool);
    let pool = fixture::reopen(&sim).unwrap();
    assert!(matches!(pool.read(v, 40 * BS as u64, &mut buf), Err(EngineError::Checksum { .. })));
    pool.read(v, group[0].saturating_sub(1) * BS as u64, &mut buf).unwrap();
    assert!(pool.check().is_clean());
}

/// A crash after an unflushed in-place overwrite of a whole coarse group:
/// the group's durable sum is the old group crc, its region was open, so
/// after reopening a read resyncs the whole group (a sum per block from
/// what is there: a split) instead of failing; `pool check` is clean.
#[test]
fn crash_after_unflushed_overwrite_of_a_coarse_group_is_resynced() {
    let (sim, pool) = fixture::one_device_pool(64 * MIB);
    let v = pool.create_volume("d", 16 * MIB).unwrap().id;
    let data: Vec<u8> = (0..64).flat_map(block).collect();
    pool.write(v, 0, &data, false).unwrap();
    pool.flush().unwrap();
    assert!(pool.coarsen_sums(v, 0, 64).unwrap() >= 3);
    pool.flush().unwrap();
    // The logical blocks of one whole physical group.
    let phys = |b: u64| find(&sim, &block(b)) / BS as u64;
    let first = (0..64).find(|&b| phys(b).is_multiple_of(16) && b + 16 <= 64).unwrap();
    let new: Vec<u8> = (0..16).flat_map(|i| block(1000 + i)).collect();
    // Setting COARSE_SUMS checkpointed, which closed the region: a
    // redirected overwrite elsewhere asks it open again.
    let other = if first == 0 { 63 } else { 0 };
    pool.write(v, other * BS as u64, &block(other), false).unwrap();
    pool.flush().unwrap();
    let before = pool.volume_info(v).unwrap();
    pool.write(v, first * BS as u64, &new, false).unwrap();
    assert_eq!(pool.volume_info(v).unwrap().extents, before.extents, "the overwrite went in place");
    sim.flush().unwrap();
    sim.crash(&mut ChaCha8Rng::seed_from_u64(2));
    drop(pool);
    let pool = fixture::reopen(&sim).unwrap();
    assert_eq!(pool.resync_pending(), 1);
    let mut buf = vec![0u8; 16 * BS];
    pool.read(v, first * BS as u64, &mut buf).unwrap();
    assert_eq!(buf, new, "the overwrite reached the device: its data is kept");
    let st = pool.status();
    assert_eq!((st.checksum_errors, st.resynced_blocks), (0, 16));
    pool.resync().unwrap();
    assert!(pool.check().is_clean());
    let report = pool.scrub(&ScrubOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!((report.bad_copies, report.lost_blocks), (0, 0));
    // The other groups are still coarse and read right.
    let mut all = vec![0u8; 64 * BS];
    pool.read(v, 0, &mut all).unwrap();
    let mut want = data.clone();
    want[first as usize * BS..(first as usize + 16) * BS].copy_from_slice(&new);
    assert_eq!(all, want);
}

/// Scrub reads in chunks of 256 blocks: a coarse group cut by a chunk's
/// end is checked whole from either side, and a flip in it makes exactly
/// its 16 blocks lost, counted once each.
#[test]
fn scrub_checks_a_coarse_group_cut_by_its_chunks() {
    let (sim, pool) = fixture::one_device_pool(64 * MIB);
    // Three blocks first, so the data after starts off a group boundary.
    let a = pool.create_volume("a", MIB).unwrap().id;
    pool.write(a, 0, &[block(9000), block(9001), block(9002)].concat(), false).unwrap();
    let v = pool.create_volume("d", 16 * MIB).unwrap().id;
    let data: Vec<u8> = (0..600).flat_map(block).collect();
    pool.write(v, 0, &data, false).unwrap();
    pool.flush().unwrap();
    assert!(pool.coarsen_sums(v, 0, 600).unwrap() >= 36);
    pool.flush().unwrap();
    let phys = |b: u64| find(&sim, &block(b)) / BS as u64;
    assert!(!phys(0).is_multiple_of(16), "the volume's data starts off a group boundary");
    assert_eq!(phys(256), phys(0) + 256, "one extent");
    // The group holding logical block 256 starts in the first chunk.
    let first = (phys(256) / 16 * 16 - phys(0)) as usize;
    assert!(first < 256);
    sim.flip_bit(phys(256) * BS as u64 + 5, 0);
    let report = pool.scrub(&ScrubOptions::default(), &mut |_, _| {}).unwrap();
    assert_eq!(report.lost_blocks, 16);
    let blocks = |l: &tarn_engine::scrub::LostRange| l.offset / BS as u64..(l.offset + l.len) / BS as u64;
    let mut lost: Vec<u64> = report.lost.iter().filter(|l| l.volume == "d").flat_map(blocks).collect();
    lost.sort_unstable();
    assert_eq!(lost, (first as u64..first as u64 + 16).collect::<Vec<_>>());
    let mut buf = vec![0u8; BS];
    assert!(pool.read(v, (first as u64 - 1) * BS as u64, &mut buf).is_ok());
    assert!(pool.read(v, first as u64 * BS as u64, &mut buf).is_err());
}

/// After a trim of part of a coarse group and a crash right after the
/// trim's commit, a flip in one of the group's remaining blocks: whether
/// that block, and a neighbour of it, fail their reads.
fn flip_after_partial_trim_and_crash(split_late: bool) -> (bool, bool) {
    // The trim's own early split is off: this is the commit's split.
    let opts = OpenOptions { control_split_late: split_late, control_no_presplit: true, ..Default::default() };
    let (sim, pool, v, first) = long_write_pool(opts);
    pool.trim(v, (first + 2) * BS as u64, 4 * BS as u64).unwrap();
    pool.flush().unwrap();
    assert_eq!(pool.status().split_groups, 1);
    sim.crash(&mut ChaCha8Rng::seed_from_u64(3));
    drop(pool);
    let pool = fixture::reopen(&sim).unwrap();
    assert!(pool.check().is_clean());
    sim.flip_bit(find(&sim, &block(first + 10)) + 77, 1);
    let mut buf = vec![0u8; BS];
    let mut fails = |b: u64| pool.read(v, b * BS as u64, &mut buf).is_err();
    (fails(first + 10), fails(first + 12))
}

/// A new pool opened with `opts`, holding [`one_long_write_checkpointed`].
fn long_write_pool(opts: OpenOptions) -> (Arc<SimDevice>, Pool, u32, u64) {
    let (sim, pool) = fixture::one_device_pool(64 * MIB);
    pool.close().unwrap();
    drop(pool);
    let pool = Pool::open(vec![sim.clone() as Arc<dyn Device>], opts).unwrap();
    let (v, first) = one_long_write_checkpointed(&sim, &pool);
    (sim, pool, v, first)
}

/// A volume "d" with blocks 0..64 written in one write (whole physical
/// groups coarse) and checkpointed; the first logical block of a whole
/// group.
fn one_long_write_checkpointed(sim: &SimDevice, pool: &Pool) -> (u32, u64) {
    let v = pool.create_volume("d", 16 * MIB).unwrap().id;
    let data: Vec<u8> = (0..64).flat_map(block).collect();
    pool.write(v, 0, &data, false).unwrap();
    pool.flush().unwrap();
    assert!(pool.status().coarse_groups >= 3, "one long write, whole groups coarse");
    // A checkpoint closes the data's overwrite region: after a crash a
    // mismatch there is corruption, not a torn write to resync.
    pool.checkpoint().unwrap();
    let first = (0..16).find(|&b| (find(sim, &block(b)) / BS as u64).is_multiple_of(16)).unwrap();
    (v, first)
}

/// A trim freeing part of a coarse group splits it before it unmaps, read
/// with no lock held, so the commit splits nothing (`commit_splits` 0),
/// and the group's other blocks keep sums of their own. Negative control:
/// without the early split the commit splits it.
fn trim_part_of_a_group(presplit: bool) -> (u64, u64) {
    let (sim, pool, v, first) = long_write_pool(OpenOptions { control_no_presplit: !presplit, ..Default::default() });
    pool.trim(v, (first + 2) * BS as u64, 4 * BS as u64).unwrap();
    pool.flush().unwrap();
    let mut buf = vec![0u8; BS];
    sim.flip_bit(find(&sim, &block(first + 10)) + 77, 1);
    assert!(pool.read(v, (first + 10) * BS as u64, &mut buf).is_err(), "the flipped block fails");
    assert!(pool.read(v, (first + 12) * BS as u64, &mut buf).is_ok(), "its neighbour does not");
    (pool.status().split_groups, pool.counters.commit_splits.load(Ordering::Relaxed))
}

#[test]
fn a_trim_splits_the_group_it_frees_in_part_before_its_commit() {
    assert_eq!(trim_part_of_a_group(true), (1, 0));
    assert_eq!(trim_part_of_a_group(false), (1, 1), "control: no early split");
}

/// An overwrite that sends blocks the head owns to new space (here: into
/// a closed overwrite region; also re-layout and `append`) frees part of
/// their coarse group: the writer splits it before its commit, read with
/// no pool lock held, so the commit splits nothing (`commit_splits` 0) and
/// other writers never wait on that read. The group's other blocks keep
/// sums of their own. Negative control: without the early split the
/// commit splits it.
fn redirect_part_of_a_group(presplit: bool) -> (u64, u64) {
    let (sim, pool, v, first) = long_write_pool(OpenOptions { control_no_presplit: !presplit, ..Default::default() });
    let old = find(&sim, &block(first + 5));
    pool.write(v, (first + 5) * BS as u64, &block(2000), false).unwrap();
    pool.flush().unwrap();
    assert_ne!(find(&sim, &block(2000)), old, "the overwrite went to new space");
    let mut buf = vec![0u8; BS];
    pool.read(v, (first + 5) * BS as u64, &mut buf).unwrap();
    assert_eq!(buf, block(2000));
    sim.flip_bit(find(&sim, &block(first + 6)) + 9, 2);
    assert!(pool.read(v, (first + 6) * BS as u64, &mut buf).is_err(), "the flipped block fails");
    assert!(pool.read(v, (first + 4) * BS as u64, &mut buf).is_ok(), "its neighbour in the group does not");
    (pool.status().split_groups, pool.counters.commit_splits.load(Ordering::Relaxed))
}

#[test]
fn a_redirected_overwrite_splits_the_group_it_frees_in_part_before_its_commit() {
    assert_eq!(redirect_part_of_a_group(true), (1, 0));
    assert_eq!(redirect_part_of_a_group(false), (1, 1), "control: no early split");
}

/// A coarse group freed in part is split in the record that frees the
/// blocks: after a crash right after it, the group's remaining blocks have
/// their own sums (a flip fails its block alone). Negative control: split
/// a record later, the crash leaves the group coarse with blocks free, and
/// the flip fails the neighbour too (as new data in the freed blocks
/// would fail every block still referenced).
#[test]
fn a_partly_freed_coarse_group_is_split_in_the_freeing_record() {
    assert_eq!(flip_after_partial_trim_and_crash(false), (true, false));
    assert_eq!(flip_after_partial_trim_and_crash(true), (true, true), "control: split a record late");
}

/// A snapshot deletion whose dead list frees parts of coarse groups (here:
/// three blocks overwritten after the snapshot, copied on write, in three
/// groups) splits those groups before it takes the commit lock, reading
/// them with no lock held, so its commit reads nothing under the pool lock
/// (`commit_splits` stays 0; on a cold pool those reads stalled every
/// writer for seconds). The remaining blocks of those groups have sums of
/// their own, and the data is right after a crash and reopen. Negative
/// control: without the early split the commit splits all three.
fn delete_snapshot_freeing_parts_of_groups(presplit: bool) -> (u64, u64) {
    let (sim, pool, v, first) = long_write_pool(OpenOptions { control_no_presplit: !presplit, ..Default::default() });
    let changed = [first + 5, first + 21, first + 37];
    pool.create_snapshot("d", "s").unwrap();
    for b in changed {
        pool.write(v, b * BS as u64, &block(1000 + b), false).unwrap();
    }
    pool.flush().unwrap();
    let splits = pool.status().split_groups;
    pool.delete_snapshot("d", "s").unwrap();
    let split = pool.status().split_groups - splits;
    let at_commit = pool.counters.commit_splits.load(Ordering::Relaxed);
    // The remaining blocks of a split group carry their own sums: a flip
    // fails that block alone.
    let mut buf = vec![0u8; BS];
    sim.flip_bit(find(&sim, &block(first + 6)) + 9, 2);
    assert!(pool.read(v, (first + 6) * BS as u64, &mut buf).is_err(), "the flipped block fails");
    assert!(pool.read(v, (first + 4) * BS as u64, &mut buf).is_ok(), "its neighbour in the group does not");
    sim.crash(&mut ChaCha8Rng::seed_from_u64(5));
    drop(pool);
    let pool = fixture::reopen(&sim).unwrap();
    assert!(pool.check().is_clean());
    for b in (0..64u64).filter(|&b| b != first + 6) {
        pool.read(v, b * BS as u64, &mut buf).unwrap();
        let want = if changed.contains(&b) { block(1000 + b) } else { block(b) };
        assert_eq!(buf, want, "block {b} after the crash");
    }
    (split, at_commit)
}

#[test]
fn deleting_a_snapshot_splits_the_groups_it_frees_in_part_before_its_commit() {
    assert_eq!(delete_snapshot_freeing_parts_of_groups(true), (3, 0));
    assert_eq!(delete_snapshot_freeing_parts_of_groups(false), (3, 3), "control: no early split");
}

/// A device counting the reads that reach it.
struct CountedReads {
    inner: Arc<SimDevice>,
    reads: AtomicU64,
}

impl Device for CountedReads {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(data, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.discard(offset, len)
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

/// A pool on a device counting its reads, with a volume whose blocks
/// 0..8 lie one block apart (appended in turn with blocks 1000..1008).
fn interleaved() -> (Arc<SimDevice>, Arc<CountedReads>, Pool, u32) {
    let sim = Arc::new(SimDevice::new("sim0", 64 * MIB));
    let dev = Arc::new(CountedReads { inner: sim.clone(), reads: AtomicU64::new(0) });
    let dyns: Vec<Arc<dyn Device>> = vec![dev.clone()];
    let opts = CreateOptions { journal_bytes: Some(256 << 10), ..Default::default() };
    create_pool(&dyns, &["sim0".into()], &opts).unwrap();
    let pool = Pool::open(dyns, OpenOptions::default()).unwrap();
    let v = pool.create_volume_placed("d", 16 * MIB, Some(PlacementKind::Append)).unwrap().id;
    for b in 0..8u64 {
        pool.write(v, b * BS as u64, &block(b), false).unwrap();
        pool.write(v, (1000 + b) * BS as u64, &block(1000 + b), false).unwrap();
    }
    pool.flush().unwrap();
    (sim, dev, pool, v)
}

#[test]
fn pieces_a_short_gap_apart_are_read_as_one_request_and_verified_apart() {
    let (sim, dev, pool, v) = interleaved();
    let mut buf = vec![0u8; 8 * BS];
    let before = dev.reads.load(Ordering::Relaxed);
    pool.read(v, 0, &mut buf).unwrap();
    assert_eq!(dev.reads.load(Ordering::Relaxed) - before, 1, "eight pieces, one request");
    for (b, got) in buf.chunks_exact(BS).enumerate() {
        assert_eq!(got, block(b as u64), "block {b}");
    }
    // A bad block in a gap is nobody's business here; in a piece it is an error.
    sim.flip_bit(find(&sim, &block(1003)) + 9, 1);
    pool.read(v, 0, &mut buf).unwrap();
    assert!(matches!(pool.read(v, 1003 * BS as u64, &mut buf[..BS]), Err(EngineError::Checksum { .. })));
    let five = find(&sim, &block(5));
    sim.flip_bit(five + 9, 1);
    let err = pool.read(v, 0, &mut buf).unwrap_err();
    assert!(matches!(err, EngineError::Checksum { .. }), "{err}");
    sim.flip_bit(five + 9, 1);
    // A gap that cannot be read: each piece is then read on its own.
    let gap = find(&sim, &block(1002));
    sim.fail_range(gap, BS as u64, true, false);
    pool.read(v, 0, &mut buf).unwrap();
    assert_eq!(&buf[2 * BS..3 * BS], &block(2)[..]);
}

#[test]
fn a_gathered_read_checks_the_coarse_groups_it_spans_whole() {
    let (sim, dev, pool, _) = interleaved();
    // Two runs one after the other on the device, written either side of
    // a snapshot (two map entries), each holding whole coarse groups.
    let v = pool.create_volume_placed("c", 16 * MIB, Some(PlacementKind::Append)).unwrap().id;
    let mut data = Vec::new();
    for b in 0..96u64 {
        data.extend(block(5000 + b));
    }
    pool.write(v, 0, &data[..48 * BS], false).unwrap();
    pool.create_snapshot("c", "s").unwrap();
    pool.write(v, 48 * BS as u64, &data[48 * BS..], false).unwrap();
    pool.flush().unwrap();
    assert!(pool.coarsen_sums(v, 0, 96).unwrap() >= 4);
    pool.flush().unwrap();
    let mut buf = vec![0u8; 96 * BS];
    let before = dev.reads.load(Ordering::Relaxed);
    pool.read(v, 0, &mut buf).unwrap();
    assert_eq!(dev.reads.load(Ordering::Relaxed) - before, 1, "two runs of coarse groups, one request");
    assert!(buf == data);
    // Cut inside the runs: widened to whole groups, the blocks asked for.
    pool.read(v, BS as u64, &mut buf[..94 * BS]).unwrap();
    assert!(buf[..94 * BS] == data[BS..95 * BS]);
    // A flip in a coarse group fails the read.
    let at = find(&sim, &block(5000 + 40));
    sim.flip_bit(at + 9, 1);
    let err = pool.read(v, 0, &mut buf).unwrap_err();
    assert!(matches!(err, EngineError::Checksum { .. }), "{err}");
}
