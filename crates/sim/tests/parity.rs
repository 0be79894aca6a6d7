//! Parity volumes (RAID-5 per volume, `vol create --parity`): data reads
//! back after writes, trims and a reopen with every row's parity the XOR
//! of its data; each unit of a row on its own member; reads through a
//! member returning I/O errors and through rotted blocks are rebuilt from
//! the row (counted); scrub heals rotted data and parity units.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tarn_engine::{create_pool, CreateOptions, Device, EngineError, OpenOptions, Pool, VolumeOptions};
use tarn_sim::fixture::find_block;
use tarn_sim::SimDevice;

const MIB: u64 = 1 << 20;
const VOL: usize = 6 << 20;

fn pool_of(n: usize) -> (Vec<Arc<SimDevice>>, Pool) {
    let sims: Vec<Arc<SimDevice>> = (0..n).map(|i| Arc::new(SimDevice::new(&format!("sim{i}"), 64 * MIB))).collect();
    let dyns: Vec<Arc<dyn Device>> = sims.iter().map(|s| s.clone() as Arc<dyn Device>).collect();
    let names: Vec<String> = (0..n).map(|i| format!("sim{i}")).collect();
    let opts = CreateOptions { journal_bytes: Some(256 << 10), ..Default::default() };
    create_pool(&dyns, &names, &opts).unwrap();
    (sims, Pool::open(dyns, OpenOptions::default()).unwrap())
}

fn reopen(sims: &[Arc<SimDevice>]) -> Pool {
    Pool::open(sims.iter().map(|s| s.clone() as Arc<dyn Device>).collect(), OpenOptions::default()).unwrap()
}

/// A 3+1 parity volume in 16 KiB units on a 4-member pool.
fn parity_volume(pool: &Pool) -> u32 {
    let opts = VolumeOptions { parity: Some((3, 16 << 10)), ..Default::default() };
    let info = pool.create_volume_with("p", VOL as u64, &opts).unwrap();
    assert_eq!(info.parity.map(|p| (p.data_units(), p.unit_blocks(), p.devices)), Some((3, 4, 0b1111)));
    info.id
}

/// Random writes (unaligned, up to 300 KiB), trims and zeroes, mirrored
/// in `model`.
fn workload(pool: &Pool, vol: u32, model: &mut [u8], rng: &mut ChaCha8Rng, ops: usize) {
    for i in 0..ops {
        let len = rng.random_range(1..300 << 10);
        let off = rng.random_range(0..VOL - len);
        match rng.random_range(0..10) {
            0 => {
                pool.trim(vol, off as u64, len as u64).unwrap();
                let (first, end) = (off.div_ceil(4096) * 4096, (off + len) / 4096 * 4096);
                if end > first {
                    model[first..end].fill(0);
                }
            }
            1 => {
                pool.write_zeroes(vol, off as u64, len as u64, false, false).unwrap();
                model[off..off + len].fill(0);
            }
            _ => {
                let data: Vec<u8> = (0..len).map(|j| (i * 7 + j * 13 + (j >> 12)) as u8).collect();
                pool.write(vol, off as u64, &data, false).unwrap();
                model[off..off + len].copy_from_slice(&data);
            }
        }
        if rng.random_bool(0.1) {
            pool.flush().unwrap();
        }
    }
}

fn read_all(pool: &Pool, vol: u32) -> Result<Vec<u8>, EngineError> {
    let mut out = vec![0u8; VOL];
    for (i, chunk) in out.chunks_mut(1 << 20).enumerate() {
        pool.read(vol, (i << 20) as u64, chunk)?;
    }
    Ok(out)
}

#[test]
fn data_reads_back_and_every_row_xors_to_zero() {
    let (sims, pool) = pool_of(4);
    let vol = parity_volume(&pool);
    let mut model = vec![0u8; VOL];
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    workload(&pool, vol, &mut model, &mut rng, 300);
    assert!(read_all(&pool, vol).unwrap() == model, "reads match the model");
    let r = pool.check_parity(vol, false).unwrap();
    assert!(r.rows > 100, "{r:?}");
    assert_eq!((r.mismatched, r.rebuilt), (0, 0), "{r:?}");
    // Each data unit lies on its row's member (the parity's are checked
    // by reconstruction below).
    let p = pool.volume_info(vol).unwrap().parity.unwrap();
    for run in pool.physical_runs(vol, tarn_engine::View::Head, 0, (VOL / 4096) as u64).unwrap() {
        for lba in run.lba..run.lba + run.len {
            assert_eq!(usize::from(run.device), p.member_of((VOL / 4096) as u64, lba), "block {lba}");
        }
    }
    assert!(pool.check().is_clean(), "{:?}", pool.check().problems);
    pool.close().unwrap();
    let pool = reopen(&sims);
    assert!(read_all(&pool, vol).unwrap() == model, "reads match the model after a reopen");
    assert_eq!(pool.check_parity(vol, false).unwrap().mismatched, 0);
    assert!(pool.check().is_clean(), "{:?}", pool.check().problems);
    assert!(
        matches!(pool.resize_volume("p", 2 * VOL as u64, false), Err(EngineError::InvalidArgument(m)) if m.contains("parity")),
        "a parity volume's size is fixed"
    );
    assert_eq!(pool.status().reconstructed_blocks, 0, "nothing was rebuilt");
}

#[test]
fn reads_through_a_member_failing_every_read_are_rebuilt() {
    let (sims, pool) = pool_of(4);
    let vol = parity_volume(&pool);
    let mut model = vec![0u8; VOL];
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    workload(&pool, vol, &mut model, &mut rng, 200);
    pool.flush().unwrap();
    // Every data block on member 2 fails its reads (metadata stays readable).
    let runs = pool.physical_runs(vol, tarn_engine::View::Head, 0, (VOL / 4096) as u64).unwrap();
    let mut failed = 0;
    for r in runs.iter().filter(|r| r.device == 2) {
        sims[2].fail_range(r.block * 4096, r.len * 4096, true, false);
        failed += r.len;
    }
    assert!(failed > 100, "member 2 holds data ({failed} blocks)");
    assert!(read_all(&pool, vol).unwrap() == model, "reads through the failing member match the model");
    let st = pool.status();
    assert!(st.reconstructed_blocks >= failed, "{} rebuilt of {failed}", st.reconstructed_blocks);
    // The same read with member 2 healthy rebuilds nothing more.
    sims[2].clear_faults();
    let before = pool.status().reconstructed_blocks;
    assert!(read_all(&pool, vol).unwrap() == model);
    assert_eq!(pool.status().reconstructed_blocks, before);
}

#[test]
fn rotted_data_and_parity_read_right_and_scrub_heals_them() {
    let (sims, pool) = pool_of(4);
    let vol = parity_volume(&pool);
    let mut model = vec![0u8; VOL];
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    workload(&pool, vol, &mut model, &mut rng, 150);
    pool.flush().unwrap();
    let runs = pool.physical_runs(vol, tarn_engine::View::Head, 0, (VOL / 4096) as u64).unwrap();
    // Rot one data block in each of 5 rows (two in one row would be lost).
    let mut rows = std::collections::BTreeSet::new();
    for r in runs.iter().filter(|r| rows.insert(r.lba / 12)).take(5) {
        sims[usize::from(r.device)].flip_bit(r.block * 4096 + 100, 3);
    }
    assert_eq!(rows.len(), 5);
    assert!(read_all(&pool, vol).unwrap() == model, "rotted blocks read right");
    assert!(pool.status().reconstructed_blocks >= 5);
    let r = pool.scrub_parity(true).unwrap();
    assert!(r.rebuilt >= 5 && r.healed >= 5, "{r:?}");
    pool.flush().unwrap();
    let again = pool.check_parity(vol, false).unwrap();
    assert_eq!((again.mismatched, again.rebuilt), (0, 0), "healed: {again:?}");
    let before = pool.status().reconstructed_blocks;
    assert!(read_all(&pool, vol).unwrap() == model);
    assert_eq!(pool.status().reconstructed_blocks, before, "healed rows read without rebuilding");
    assert!(pool.check().is_clean(), "{:?}", pool.check().problems);
}

#[test]
fn a_rotted_parity_unit_is_rebuilt_by_scrub_and_two_lost_units_fail_the_read() {
    let (sims, pool) = pool_of(3);
    let opts = VolumeOptions { parity: Some((2, 4096)), ..Default::default() };
    let vol = pool.create_volume_with("p", 64 << 10, &opts).unwrap().id;
    // Row 0: data 0x11.. and 0x22.., so its parity is 0x33..
    pool.write(vol, 0, &[[0x11u8; 4096], [0x22u8; 4096]].concat(), false).unwrap();
    pool.flush().unwrap();
    let p = pool.volume_info(vol).unwrap().parity.unwrap();
    let parity_member = p.member_of(16, p.parity_block(16, 0));
    let data_members: Vec<usize> = (0..2).map(|j| p.member_of(16, j)).collect();
    let runs = pool.physical_runs(vol, tarn_engine::View::Head, 0, 2).unwrap();
    assert_eq!(runs.iter().map(|r| usize::from(r.device)).collect::<Vec<_>>(), data_members);
    let at = find_block(&sims[parity_member], &[0x33u8; 4096]).expect("the row's parity on its own member");
    sims[parity_member].flip_bit(at + 9, 1);
    let r = pool.scrub_parity(true).unwrap();
    assert_eq!((r.rows, r.rebuilt, r.healed), (1, 1, 1), "{r:?}");
    pool.flush().unwrap();
    assert_eq!(pool.check_parity(vol, false).unwrap(), tarn_engine::ParityReport { rows: 1, ..Default::default() });
    // Two units of one row unreadable: the read fails (EIO), it does not
    // invent data; one: rebuilt. (The heal wrote the row to new space.)
    let runs = pool.physical_runs(vol, tarn_engine::View::Head, 0, 2).unwrap();
    sims[data_members[0]].fail_range(runs[0].block * 4096, 4096, true, false);
    sims[data_members[1]].fail_range(runs[1].block * 4096, 4096, true, false);
    let mut buf = vec![0u8; 4096];
    let r = pool.read(vol, 0, &mut buf);
    assert!(matches!(r, Err(EngineError::Io { .. })), "two units of one row lost: {r:?}");
    sims[data_members[1]].clear_faults();
    pool.read(vol, 0, &mut buf).unwrap();
    assert_eq!(buf, vec![0x11u8; 4096], "one unit lost: rebuilt");
    assert!(pool.check().is_clean(), "{:?}", pool.check().problems);
}

/// Open with member `gone` absent (nothing given for it, as the CLI does
/// for a device it cannot open).
fn open_without(sims: &[Arc<SimDevice>], gone: usize) -> Pool {
    let slots = sims
        .iter()
        .enumerate()
        .map(|(i, s)| if i == gone { Vec::new() } else { vec![s.clone() as Arc<dyn Device>] })
        .collect();
    Pool::open_slots(slots, OpenOptions::default()).unwrap()
}

/// Blocks of `vol`'s head on member `dev`.
fn blocks_on(pool: &Pool, vol: u32, blocks: u64, dev: u16) -> u64 {
    let runs = pool.physical_runs(vol, tarn_engine::View::Head, 0, blocks).unwrap();
    runs.iter().filter(|r| r.device == dev).map(|r| r.len).sum()
}

#[test]
fn a_pool_opens_degraded_with_a_member_missing() {
    let (sims, pool) = pool_of(4);
    let vol = parity_volume(&pool);
    // A plain volume kept on member 3 alone: it has no other copy.
    let plain_opts = VolumeOptions { devices: 0b1000, ..Default::default() };
    let plain = pool.create_volume_with("plain", MIB, &plain_opts).unwrap().id;
    pool.write(plain, 0, &[0x77u8; 8192], false).unwrap();
    let mut model = vec![0u8; VOL];
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    workload(&pool, vol, &mut model, &mut rng, 200);
    pool.close().unwrap();
    let on3 = {
        let pool = reopen(&sims);
        blocks_on(&pool, vol, (VOL / 4096) as u64, 3)
    };
    assert!(on3 > 100, "member 3 holds data of p ({on3} blocks)");

    let pool = open_without(&sims, 3);
    let st = pool.status();
    assert_eq!((st.state, st.devices[3].state), ("DEGRADED", "UNAVAIL"), "{:?}", st.notes);
    assert!(st.notes.iter().any(|n| n.contains("member 3") && n.contains("MISSING")), "{:?}", st.notes);
    assert!(read_all(&pool, vol).unwrap() == model, "p reads right through the missing member");
    assert!(pool.status().reconstructed_blocks >= on3, "{} rebuilt", pool.status().reconstructed_blocks);
    let mut buf = vec![0u8; 4096];
    let r = pool.read(plain, 0, &mut buf);
    assert!(matches!(r, Err(EngineError::Io { .. })), "a plain block on the missing member: EIO, not data: {r:?}");
    // Writes go on, never to the missing member (its stand-in refuses
    // every write: one there would fail).
    workload(&pool, vol, &mut model, &mut rng, 100);
    assert!(read_all(&pool, vol).unwrap() == model, "p after writes while degraded");
    assert!(blocks_on(&pool, vol, (VOL / 4096) as u64, 3) <= on3, "nothing new on member 3");
    let r = pool.check_parity(vol, false).unwrap();
    assert_eq!(r.mismatched, 0, "every row still XORs to zero: {r:?}");
    assert!(pool.check().is_clean(), "{:?}", pool.check().problems);
    pool.close().unwrap();

    // The member comes back: nothing was written there meanwhile, so the
    // pool is whole again with nothing to rebuild.
    let pool = reopen(&sims);
    assert_eq!(pool.status().state, "ONLINE");
    assert!(read_all(&pool, vol).unwrap() == model, "p with member 3 back");
    assert_eq!(pool.status().reconstructed_blocks, 0);
    let r = pool.check_parity(vol, false).unwrap();
    assert_eq!((r.mismatched, r.rebuilt), (0, 0), "{r:?}");
    pool.read(plain, 0, &mut buf).unwrap();
    assert_eq!(buf, vec![0x77u8; 4096]);
    assert!(pool.check().is_clean(), "{:?}", pool.check().problems);
}

#[test]
fn scrub_verifies_the_rows_a_snapshot_keeps() {
    let (sims, pool) = pool_of(4);
    let vol = parity_volume(&pool);
    let mut model = vec![0u8; VOL];
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    workload(&pool, vol, &mut model, &mut rng, 100);
    let epoch = pool.create_snapshot("p", "s").unwrap().epoch;
    let snap = model.clone();
    // Rewrite the first MiB in the head: the snapshot alone keeps its rows.
    pool.write(vol, 0, &vec![0x42u8; 1 << 20], false).unwrap();
    model[..1 << 20].fill(0x42);
    pool.flush().unwrap();
    let r = pool.check_parity(vol, false).unwrap();
    assert!(r.snapshot_rows > 10 && r.snapshot_rows < r.rows, "{r:?}");
    assert_eq!((r.mismatched, r.rebuilt), (0, 0), "{r:?}");
    // Rot a data block only the snapshot holds.
    let head: std::collections::HashSet<(u16, u64)> = pool
        .physical_runs(vol, tarn_engine::View::Head, 0, 256)
        .unwrap()
        .iter()
        .flat_map(|r| (r.block..r.block + r.len).map(move |b| (r.device, b)))
        .collect();
    let only = pool
        .physical_runs(vol, tarn_engine::View::Snapshot(epoch), 0, 256)
        .unwrap()
        .into_iter()
        .find(|r| !head.contains(&(r.device, r.block)))
        .expect("a block only the snapshot holds");
    sims[usize::from(only.device)].flip_bit(only.block * 4096 + 7, 2);
    let r = pool.scrub_parity(true).unwrap();
    assert_eq!((r.rebuilt, r.healed), (1, 0), "found in the snapshot's rows, not rewritten: {r:?}");
    let mut buf = vec![0u8; 1 << 20];
    pool.read_view(vol, tarn_engine::View::Snapshot(epoch), 0, &mut buf).unwrap();
    assert!(buf == snap[..1 << 20], "the snapshot reads right through the rot");
    assert!(pool.check().is_clean(), "{:?}", pool.check().problems);
}
