//! Replacing a present member (`Pool::replace_present`,
//! `Pool::copy_member`): member 3 of a 4-member pool holding a plain
//! volume (with a snapshot and a clone), a striped and a parity volume is
//! copied onto a new device while writes go on; the new device then takes
//! index 3 and the old one carries no pool label. The crash simulation
//! cuts the power at random points of the replace (on any device, the new
//! one included), reopens as the CLI would (member 3 is the devices the
//! superblock names: the old and the new while the copy runs), checks
//! that every volume reads what was written and goes on until the replace
//! ends.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tarn_engine::device::label::read_label;
use tarn_engine::{create_pool, CreateOptions, Device, EngineError, OpenOptions, Pool, View, VolumeOptions};
use tarn_sim::SimDevice;

const MIB: u64 = 1 << 20;
const VOL: usize = 2 << 20;
const BLOCK: usize = 4096;
/// The volumes written: plain, striped over 4, parity 3+1, the clone.
const NAMES: [&str; 4] = ["a", "s", "p", "c"];

struct Rig {
    sims: Vec<Arc<SimDevice>>,
    /// The devices made to replace member 3, the last one current.
    news: Vec<Arc<SimDevice>>,
}

impl Rig {
    fn all(&self) -> Vec<Arc<SimDevice>> {
        self.sims.iter().cloned().chain(self.news.last().cloned()).collect()
    }

    /// Open as the CLI does: every member is the devices its entry names
    /// (member 3 while replaced: the old one and the new one).
    fn open(&self) -> Pool {
        let legs = Pool::member_legs(self.sims[0].as_ref()).unwrap();
        let known: Vec<Arc<SimDevice>> = self.sims.iter().chain(&self.news).cloned().collect();
        let slots = legs
            .iter()
            .map(|paths| {
                let found = paths.iter().filter_map(|p| known.iter().find(|d| &d.name() == p));
                found.map(|d| d.clone() as Arc<dyn Device>).collect()
            })
            .collect();
        Pool::open_slots(slots, OpenOptions::default()).unwrap()
    }
}

/// Per volume (NAMES order), its id and the bytes it must read.
struct Model {
    ids: Vec<u32>,
    data: Vec<Vec<u8>>,
    /// The snapshot of `a` and what it must read.
    snap: Vec<u8>,
}

/// A 4-member pool with the four volumes written at random, `a`'s
/// snapshot `as` (cloned as `c`) taken half-way.
fn rig(seed: u64) -> (Rig, Pool, Model) {
    let sims: Vec<Arc<SimDevice>> = (0..4).map(|i| Arc::new(SimDevice::new(&format!("sim{i}"), 24 * MIB))).collect();
    let dyns: Vec<Arc<dyn Device>> = sims.iter().map(|s| s.clone() as Arc<dyn Device>).collect();
    let names: Vec<String> = (0..4).map(|i| format!("sim{i}")).collect();
    let opts = CreateOptions { journal_bytes: Some(256 << 10), ..Default::default() };
    create_pool(&dyns, &names, &opts).unwrap();
    let pool = Pool::open(dyns, OpenOptions::default()).unwrap();
    let layouts = [
        VolumeOptions::default(),
        VolumeOptions { stripe: Some((4, 16 << 10)), ..Default::default() },
        VolumeOptions { parity: Some((3, 16 << 10)), ..Default::default() },
    ];
    let mut ids: Vec<u32> =
        NAMES[..3].iter().zip(&layouts).map(|(n, o)| pool.create_volume_with(n, VOL as u64, o).unwrap().id).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut data = vec![vec![0u8; VOL]; 3];
    for i in 0..90 {
        let v = i % 3;
        write_some(&pool, ids[v], &mut data[v], &mut rng, i).unwrap();
    }
    pool.create_snapshot("a", "as").unwrap();
    let snap = data[0].clone();
    ids.push(pool.create_clone("a", "as", "c").unwrap().id);
    data.push(snap.clone());
    for i in 90..150 {
        let v = i % 4;
        write_some(&pool, ids[v], &mut data[v], &mut rng, i).unwrap();
    }
    pool.close().unwrap();
    let rig = Rig { sims, news: Vec::new() };
    let pool = rig.open();
    (rig, pool, Model { ids, data, snap })
}

/// One aligned write (whole blocks, up to 64 KiB), mirrored in `model`.
fn write_some(pool: &Pool, vol: u32, model: &mut [u8], rng: &mut ChaCha8Rng, i: usize) -> Result<(), EngineError> {
    let (off, data) = some_write(rng, i);
    pool.write(vol, off as u64, &data, false)?;
    model[off..off + data.len()].copy_from_slice(&data);
    Ok(())
}

fn some_write(rng: &mut ChaCha8Rng, i: usize) -> (usize, Vec<u8>) {
    let blocks = rng.random_range(1..=16);
    let off = rng.random_range(0..VOL / BLOCK - blocks) * BLOCK;
    let data: Vec<u8> = (0..blocks * BLOCK).map(|j| (i * 31 + j * 7 + (j >> 12)) as u8 ^ 0xa5).collect();
    (off, data)
}

fn read_view(pool: &Pool, vol: u32, view: View) -> Vec<u8> {
    let mut out = vec![0u8; VOL];
    for (i, chunk) in out.chunks_mut(1 << 20).enumerate() {
        pool.read_view(vol, view, (i << 20) as u64, chunk).unwrap();
    }
    out
}

/// Blocks each volume has on member 3 (head views).
fn on3(pool: &Pool, m: &Model) -> u64 {
    let runs = |v: u32| pool.physical_runs(v, View::Head, 0, (VOL / BLOCK) as u64 * 2).unwrap();
    m.ids.iter().flat_map(|&v| runs(v)).filter(|r| r.device == 3).map(|r| r.len).sum()
}

/// Put a fresh device in the place of member 3, present.
fn start(rig: &mut Rig, pool: &Pool) -> Result<(), EngineError> {
    let new = Arc::new(SimDevice::new(&format!("new{}", rig.news.len()), 24 * MIB));
    rig.news.push(new.clone());
    pool.replace_present(3, new.clone(), &new.name())
}

/// A write the power cut may have kept or not.
type CutWrite = Option<(usize, usize, Vec<u8>)>;

/// Every volume reads what was written: block by block the model's, or
/// the cut write's (then adopted), and the snapshot is intact.
fn verify(pool: &Pool, m: &mut Model, cut: &CutWrite, what: &str) {
    let epoch = pool.snapshot_info("a", "as").unwrap().epoch;
    assert!(read_view(pool, m.ids[0], View::Snapshot(epoch)) == m.snap, "{what}: the snapshot");
    for (v, name) in NAMES.iter().enumerate() {
        let head = read_view(pool, m.ids[v], View::Head);
        for b in 0..VOL / BLOCK {
            let r = b * BLOCK..(b + 1) * BLOCK;
            if head[r.clone()] == m.data[v][r.clone()] {
                continue;
            }
            let new = cut.as_ref().filter(|(cv, off, d)| *cv == v && r.start >= *off && r.end <= off + d.len());
            let where_ = pool.physical_runs(m.ids[v], View::Head, b as u64, 1).unwrap();
            let Some((_, off, d)) = new else { panic!("{what}: {} block {b} lost data ({where_:?})", name) };
            // A write cut in place (plain and striped volumes overwrite
            // in place) may be torn: each sector old or new.
            let new_data = &d[r.start - off..r.end - off];
            let torn_ok = (0..BLOCK / 512).all(|s| {
                let (at, sec) = (r.start + s * 512, s * 512..(s + 1) * 512);
                head[at..at + 512] == m.data[v][at..at + 512] || head[at..at + 512] == new_data[sec]
            });
            assert!(
                torn_ok,
                "{what}: {} block {b} is neither old nor new ({where_:?}; {:?})",
                name,
                pool.status().notes
            );
            m.data[v][r.clone()].copy_from_slice(&head[r]);
        }
    }
    let r = pool.check_parity(m.ids[2], false).unwrap();
    assert_eq!(r.mismatched, 0, "{what}: {r:?}");
    assert!(pool.check().is_clean(), "{what}: {:?}", pool.check().problems);
}

/// Run (or resume) the copy with writes (each flushed) to every volume
/// between its chunks, recording the cursor every `step` blocks. Err: the
/// write in flight when something failed, if one did.
fn copy_with_writes(pool: &Pool, m: &mut Model, rng: &mut ChaCha8Rng, step: u64) -> Result<(), CutWrite> {
    let mut cut = None;
    let mut i = 1000;
    let mut writes = |_: u64, _: u64| {
        for _ in 0..2 {
            i += 1;
            let v = i % 4;
            let (off, data) = some_write(rng, i);
            match pool.write(m.ids[v], off as u64, &data, false).and_then(|()| pool.flush()) {
                Ok(()) => m.data[v][off..off + data.len()].copy_from_slice(&data),
                Err(_) => {
                    cut = Some((v, off, data));
                    return false;
                }
            }
        }
        true
    };
    match pool.copy_member_by(3, step, &mut writes) {
        Ok(r) if !r.stopped && cut.is_none() => Ok(()),
        _ => Err(cut),
    }
}

/// The replace is over: the new device is member 3, the old one has no
/// label, every volume reads right after a reopen, nothing reconstructed.
/// `strict`: no label at all on the old device (else: none naming a
/// member, which a crash between the last superblock and the wipe leaves).
fn check_replaced(rig: &Rig, pool: Pool, m: &mut Model, what: &str, strict: bool) {
    let st = pool.status();
    assert_eq!((st.state, st.devices[3].state), ("ONLINE", "ONLINE"), "{what}: {:?}", st.notes);
    let new = rig.news.last().unwrap();
    assert_eq!(st.devices[3].path, new.name(), "{what}");
    pool.close().unwrap();
    let uuid = read_label(new.as_ref()).unwrap().current.device_uuid;
    match read_label(rig.sims[3].as_ref()) {
        Err(_) => {}
        Ok(l) => assert!(!strict && l.current.device_uuid != uuid, "{what}: the old device keeps a member label"),
    }
    assert_eq!(Pool::member_paths(rig.sims[0].as_ref()).unwrap()[3], new.name(), "{what}");
    let pool = rig.open();
    verify(&pool, m, &None, what);
    let r = pool.check_parity(m.ids[2], false).unwrap();
    assert_eq!((r.mismatched, r.rebuilt), (0, 0), "{what}: every unit reads from its member: {r:?}");
    assert_eq!(pool.status().reconstructed_blocks, 0, "{what}: nothing read by reconstruction");
    assert!(on3(&pool, m) > 0, "{what}: member 3 still holds data");
}

#[test]
fn a_present_member_is_replaced_while_writes_go_on() {
    let (mut rig, pool, mut m) = rig(1);
    assert!(on3(&pool, &m) > 100, "member 3 holds blocks of the volumes ({})", on3(&pool, &m));
    // Refusals change nothing: the primary, a device too small, a
    // labelled device.
    let e = pool.replace_present(0, Arc::new(SimDevice::new("x", 24 * MIB)), "x").unwrap_err().to_string();
    assert!(e.contains("primary"), "{e}");
    let e = pool.replace_present(3, Arc::new(SimDevice::new("small", MIB)), "small").unwrap_err().to_string();
    assert!(e.contains("too small"), "{e}");
    let e = pool.replace_present(3, rig.sims[1].clone(), "sim1").unwrap_err().to_string();
    assert!(e.contains("tarn label"), "{e}");
    assert_eq!(pool.status().devices[3].state, "ONLINE");
    start(&mut rig, &pool).unwrap();
    let st = pool.status();
    assert_eq!((st.state, st.devices[3].state), ("ONLINE", "REPLACING"), "{:?}", st.notes);
    let e = pool.replace_present(3, Arc::new(SimDevice::new("y", 24 * MIB)), "y").unwrap_err().to_string();
    assert!(e.contains("already"), "{e}");
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    copy_with_writes(&pool, &mut m, &mut rng, 64).map_err(|_| "a write failed").unwrap();
    verify(&pool, &mut m, &None, "after the copy");
    // Member 3 is allocated from again.
    for i in 0..40 {
        let v = i % 4;
        write_some(&pool, m.ids[v], &mut m.data[v], &mut rng, 3000 + i).unwrap();
    }
    check_replaced(&rig, pool, &mut m, "replaced", true);
}

/// Replace member 3 with the power cut at random points until it ends;
/// returns (crashes, reopens past a recorded cursor).
fn replace_through_crashes(seed: u64) -> (usize, usize) {
    let (mut rig, mut pool, mut m) = rig(seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xbeef);
    let (mut crashes, mut mid) = (0, 0);
    // Bounded: at most 12 cut attempts, then one run with no cut.
    for attempt in 0..13 {
        let armed = attempt < 12;
        let state = pool.status().devices[3].state;
        if state == "ONLINE" && !rig.news.is_empty() && Pool::member_paths(rig.sims[0].as_ref()).unwrap()[3] != "sim3" {
            break; // The cut came after the end was recorded.
        }
        if armed {
            let devs = rig.all();
            devs[rng.random_range(0..devs.len())].crash_after(rng.random_range(0..120));
        }
        let mut outcome = Err(None);
        if state == "REPLACING" || start(&mut rig, &pool).is_ok() {
            if armed && !rig.all().iter().any(|d| d.is_dead()) {
                let devs = rig.all();
                devs[rng.random_range(0..devs.len())].crash_after(rng.random_range(0..150));
            }
            outcome = copy_with_writes(&pool, &mut m, &mut rng, 8);
        }
        match outcome {
            Ok(()) => {
                rig.all().iter().for_each(|d| d.crash_after(u64::MAX));
                break;
            }
            Err(cut) => {
                assert!(rig.all().iter().any(|d| d.is_dead()), "seed {seed}: failed without a crash");
                drop(pool);
                for d in rig.sims.iter().chain(&rig.news) {
                    d.crash(&mut rng);
                }
                crashes += 1;
                pool = rig.open();
                let cursor = |n: &String| n.split("copied below block ").nth(1).and_then(|b| b.parse::<u64>().ok());
                if pool.status().notes.iter().filter_map(cursor).any(|b| b > 32) {
                    mid += 1;
                }
                verify(&pool, &mut m, &cut, &format!("seed {seed} after crash {crashes}"));
            }
        }
    }
    check_replaced(&rig, pool, &mut m, &format!("seed {seed}"), false);
    (crashes, mid)
}

#[test]
fn replace_crash_simulation_64_seeds() {
    let seeds: u64 = std::env::var("TARN_REPLACE_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(64);
    let (mut crashes, mut mid) = (0, 0);
    for seed in 0..seeds {
        let (c, m) = replace_through_crashes(seed);
        crashes += c;
        mid += m;
    }
    eprintln!("replace crash simulation: {seeds} seeds, {crashes} crashes, {mid} resumed past a recorded cursor");
    assert!(crashes >= seeds as usize && mid >= seeds as usize / 4, "the power was cut ({crashes}, {mid} mid-copy)");
}

#[test]
fn a_member_added_online_is_replaced_online() {
    let (mut rig, pool, mut m) = rig(5);
    let added = Arc::new(SimDevice::new("sim4", 24 * MIB));
    let report = pool.add_device(added.clone(), "sim4").unwrap();
    assert_eq!(report.index, 4);
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    // Writes land on the new member (the roomiest).
    for i in 0..60 {
        let v = i % 4;
        write_some(&pool, m.ids[v], &mut m.data[v], &mut rng, 4000 + i).unwrap();
    }
    let new = Arc::new(SimDevice::new("new4", 24 * MIB));
    pool.replace_present(4, new.clone(), "new4").unwrap();
    assert_eq!(pool.status().devices[4].state, "REPLACING");
    let r = pool.copy_member(4, &mut |_, _| true).unwrap();
    assert!(r.copied > 0 && r.lost == 0 && !r.stopped, "{r:?}");
    verify(&pool, &mut m, &None, "after replacing the added member");
    assert_eq!(pool.status().devices[4].path, "new4");
    pool.close().unwrap();
    assert!(read_label(added.as_ref()).is_err(), "the added device carries no label");
    rig.sims.push(added);
    rig.news.push(new);
    let pool = rig.open();
    verify(&pool, &mut m, &None, "after a reopen");
}

#[test]
fn blocks_the_old_device_cannot_read_are_rebuilt_from_their_rows() {
    let (mut rig, pool, m) = rig(7);
    let on3 = |v: u32| {
        let runs = pool.physical_runs(v, View::Head, 0, (VOL / BLOCK) as u64 * 2).unwrap();
        runs.iter().filter(|r| r.device == 3).map(|r| r.len).sum::<u64>()
    };
    let (p3, plain3) = (on3(m.ids[2]), on3(m.ids[0]) + on3(m.ids[1]) + on3(m.ids[3]));
    assert!(p3 > 50 && plain3 > 50, "member 3 holds parity ({p3}) and other ({plain3}) blocks");
    // Every data block of member 3 fails its reads from now on.
    rig.sims[3].fail_range(32 * 4096, 24 * MIB, true, false);
    start(&mut rig, &pool).unwrap();
    let r = pool.copy_member(3, &mut |_, _| true).unwrap();
    // (A clone shares blocks with its origin: `plain3` counts some twice.)
    let every = r.copied == 0 && r.reconstructed + r.lost == r.blocks;
    assert!(every && r.reconstructed >= p3 && r.lost > 0, "{r:?} ({p3} parity, {plain3} other)");
    // The parity volume reads right from the new device, nothing read by
    // reconstruction; the others' blocks that were there fail (EIO),
    // never read as something else.
    rig.sims[3].clear_faults();
    let before = pool.status().reconstructed_blocks;
    assert!(read_view(&pool, m.ids[2], View::Head) == m.data[2], "p after the copy");
    assert_eq!(pool.status().reconstructed_blocks, before, "p read from the new device");
    let r = pool.check_parity(m.ids[2], false).unwrap();
    assert_eq!((r.mismatched, r.rebuilt), (0, 0), "{r:?}");
    let mut buf = vec![0u8; VOL];
    assert!(pool.read_view(m.ids[1], View::Head, 0, &mut buf).is_err(), "s lost blocks: EIO");
}

#[test]
fn a_replace_whose_new_device_is_lost_starts_again_with_another() {
    let (mut rig, pool, mut m) = rig(9);
    start(&mut rig, &pool).unwrap();
    let r = pool.copy_member_by(3, 16, &mut |done, _| done < 40).unwrap();
    assert!(r.stopped);
    pool.close().unwrap();
    // The new device is gone: member 3 opens whole on the old one.
    let lost = rig.news.pop().unwrap();
    let pool = rig.open();
    assert_eq!(pool.status().devices[3].state, "ONLINE");
    verify(&pool, &mut m, &None, "without the new device");
    start(&mut rig, &pool).unwrap();
    let r = pool.copy_member(3, &mut |_, _| true).unwrap();
    assert!(!r.stopped && r.lost == 0, "{r:?}");
    drop(lost);
    check_replaced(&rig, pool, &mut m, "replaced by another device", true);
}
