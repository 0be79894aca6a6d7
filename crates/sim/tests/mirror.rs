//! Mirrors on simulated devices: a failing leg, a missing leg, a stale leg,
//! foreign devices, replace + resilver, and metadata healed from the other
//! copy (superblock, journal record, checkpoint segment).

use std::sync::Arc;
use tarn_engine::{create_mirrored_pool, CreateOptions, Device, EngineError, OpenOptions, Pool};
use tarn_format::superblock::Superblock;
use tarn_format::{Pba, BLOCK_SIZE};
use tarn_sim::SimDevice;

const MIB: u64 = 1 << 20;

fn sim(name: &str) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(name, 8 * MIB))
}

fn dyns(devs: &[&Arc<SimDevice>]) -> Vec<Arc<dyn Device>> {
    devs.iter().map(|d| (*d).clone() as Arc<dyn Device>).collect()
}

/// A pool whose primary is a mirror of `a` and `b`, plus plain member `c`.
fn mirrored(a: &Arc<SimDevice>, b: &Arc<SimDevice>, c: &Arc<SimDevice>) -> Pool {
    create(&[&[a, b], &[c]])
}

fn create(members: &[&[&Arc<SimDevice>]]) -> Pool {
    let slots: Vec<Vec<(Arc<dyn Device>, String)>> =
        members.iter().map(|m| m.iter().map(|d| ((*d).clone() as Arc<dyn Device>, d.name())).collect()).collect();
    let opts = CreateOptions { journal_bytes: Some(256 << 10), ..Default::default() };
    create_mirrored_pool(&slots, &opts).unwrap();
    open(members.iter().map(|m| dyns(m)).collect()).unwrap()
}

/// Devices found per member.
type Slots = Vec<Vec<Arc<dyn Device>>>;

fn open(slots: Slots) -> Result<Pool, EngineError> {
    Pool::open_slots(slots, OpenOptions::default())
}

/// A pool on the mirror (a, b) with volume "v" (4 MiB) holding
/// `pattern(seed)` in its first 64 KiB.
fn mirror_with_volume(a: &Arc<SimDevice>, b: &Arc<SimDevice>, seed: u8) -> (Pool, u32) {
    let pool = create(&[&[a, b]]);
    let v = pool.create_volume("v", 4 * MIB).unwrap().id;
    pool.write(v, 0, &pattern(seed, 64 << 10), false).unwrap();
    (pool, v)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn read_vol(pool: &Pool, vol: u32, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    pool.read(vol, offset, &mut buf).unwrap();
    buf
}

fn image(d: &SimDevice) -> Vec<u8> {
    let mut buf = vec![0u8; d.size() as usize];
    d.read_at(&mut buf, 0).unwrap();
    buf
}

fn range(d: &SimDevice, block: u64, blocks: u64) -> Vec<u8> {
    let mut buf = vec![0u8; (blocks * BLOCK_SIZE) as usize];
    d.read_at(&mut buf, block * BLOCK_SIZE).unwrap();
    buf
}

fn leg_states(pool: &Pool) -> Vec<&'static str> {
    pool.status().devices[0].legs.iter().map(|l| l.state).collect()
}

/// Bug guarded: a leg returning I/O errors must not fail reads or writes;
/// it is faulted, the table records it at the next commit, and a reopen
/// with the stale leg back does not trust it.
#[test]
fn failing_leg_is_faulted_and_the_pool_carries_on() {
    let (a, b, c) = (sim("a"), sim("b"), sim("c"));
    let pool = mirrored(&a, &b, &c);
    let v = pool.create_volume("v", 4 * MIB).unwrap().id;
    pool.write(v, 0, &pattern(1, 256 << 10), false).unwrap();
    pool.flush().unwrap();
    b.fail_io(true, true);
    pool.write(v, 256 << 10, &pattern(2, 256 << 10), false).unwrap();
    pool.flush().unwrap();
    assert_eq!(read_vol(&pool, v, 0, 256 << 10), pattern(1, 256 << 10));
    assert_eq!(read_vol(&pool, v, 256 << 10, 256 << 10), pattern(2, 256 << 10));
    let st = pool.status();
    assert_eq!((st.state, st.devices[0].state), ("DEGRADED", "DEGRADED"));
    assert_eq!(leg_states(&pool), vec!["ONLINE", "FAULTED"]);
    assert!(st.devices[0].legs[1].write_errors > 0);
    assert!(pool.check().is_clean());
    pool.close().unwrap();
    drop(pool);
    b.fail_io(false, false);
    let pool = open(vec![dyns(&[&a, &b]), dyns(&[&c])]).unwrap();
    assert_eq!(leg_states(&pool), vec!["ONLINE", "FAULTED"], "the stale leg is not trusted");
    assert!(pool.status().notes.iter().any(|n| n.contains("stale")), "{:?}", pool.status().notes);
    assert_eq!(read_vol(&pool, v, 256 << 10, 256 << 10), pattern(2, 256 << 10));
}

/// A leg missing at open: DEGRADED, readable and writable; the table then
/// records the leg faulted, so it is stale when it comes back.
#[test]
fn missing_leg_opens_degraded_and_comes_back_stale() {
    let (a, b, c) = (sim("a"), sim("b"), sim("c"));
    let pool = mirrored(&a, &b, &c);
    let v = pool.create_volume("v", 4 * MIB).unwrap().id;
    pool.write(v, 0, &pattern(3, MIB as usize), false).unwrap();
    pool.close().unwrap();
    drop(pool);
    let pool = open(vec![dyns(&[&b]), dyns(&[&c])]).expect("degraded open from leg b alone");
    assert_eq!(pool.status().state, "DEGRADED");
    assert_eq!(leg_states(&pool), vec!["MISSING", "ONLINE"]);
    assert!(pool.status().notes.iter().any(|n| n.contains("leg 0 (a) is missing")), "{:?}", pool.status().notes);
    assert_eq!(read_vol(&pool, v, 0, MIB as usize), pattern(3, MIB as usize));
    pool.write(v, MIB, &pattern(4, 4096), false).unwrap();
    pool.close().unwrap();
    drop(pool);
    let pool = open(vec![dyns(&[&a, &b]), dyns(&[&c])]).unwrap();
    assert_eq!(leg_states(&pool), vec!["FAULTED", "ONLINE"], "a missed a write: stale");
    assert_eq!(read_vol(&pool, v, MIB, 4096), pattern(4, 4096));
    // Opened with only the stale leg, the newer table is not available and
    // the stale leg is all there is: that is the operator's choice (like
    // importing one half of a split mirror). Not tested as an error.
}

/// A non-mirrored member missing is a clear error and nothing is written.
#[test]
fn missing_plain_member_is_an_error_and_writes_nothing() {
    let (a, b, c) = (sim("a"), sim("b"), sim("c"));
    drop(mirrored(&a, &b, &c));
    let before = [image(&a), image(&b)];
    match open(vec![dyns(&[&a, &b])]) {
        Err(EngineError::InvalidArgument(m)) => assert!(m.contains("pool has 2 devices, 1 given"), "{m}"),
        other => panic!("expected an error, got {:?}", other.map(|_| ())),
    }
    assert!(before == [image(&a), image(&b)], "a failed open wrote");
}

/// Devices of another pool, or a leg in the wrong place, are refused by
/// name before anything is written.
#[test]
fn foreign_legs_are_refused_by_name() {
    let (a, b, c) = (sim("a"), sim("b"), sim("c"));
    let (x, y, z) = (sim("x"), sim("y"), sim("z"));
    drop(mirrored(&a, &b, &c));
    drop(mirrored(&x, &y, &z));
    let before = [image(&a), image(&b), image(&c)];
    let cases: Vec<(Slots, &str)> = vec![
        (vec![dyns(&[&a, &y]), dyns(&[&c])], "y"),
        (vec![dyns(&[&a]), dyns(&[&z])], "z"),
        (vec![dyns(&[&a]), dyns(&[&b])], "b"),
        (vec![dyns(&[&a, &c]), dyns(&[&c])], "c"),
    ];
    for (slots, name) in cases {
        match open(slots) {
            Err(EngineError::ForeignDevice { device, detail }) => assert_eq!(device, name, "{detail}"),
            other => panic!("expected {name} refused, got {:?}", other.map(|_| ())),
        }
    }
    assert!(before == [image(&a), image(&b), image(&c)], "a refused open wrote");
}

/// Replace + resilver while writes continue: the new leg matches the old
/// over every used range, the pool checks clean, and the new leg alone
/// holds everything.
#[test]
fn replace_resilvers_while_writing() {
    let (a, b, c, d) = (sim("a"), sim("b"), sim("c"), sim("d"));
    let pool = Arc::new(mirrored(&a, &b, &c));
    let v = pool.create_volume("v", 6 * MIB).unwrap().id;
    for i in 0..16u64 {
        pool.write(v, i * 256 * 1024, &pattern(i as u8, 256 << 10), false).unwrap();
    }
    pool.flush().unwrap();
    b.fail_io(true, true);
    pool.write(v, 0, &pattern(50, 4096), false).unwrap();
    pool.flush().unwrap();
    let writer = {
        let pool = pool.clone();
        std::thread::spawn(move || {
            for i in 0..64u64 {
                pool.write(v, (i % 16) * 256 * 1024 + 8192, &pattern(100 + i as u8, 8192), false).unwrap();
                pool.flush().unwrap();
            }
        })
    };
    let mut calls = Vec::new();
    let report = pool.replace_leg("b", d.clone(), "d", &mut |done, total| calls.push((done, total))).unwrap();
    writer.join().unwrap();
    assert!(report.copied_bytes > MIB, "copied {}", report.copied_bytes);
    assert_eq!(calls.last().map(|c| c.0 == c.1), Some(true), "progress ends at 100%");
    assert_eq!(leg_states(&pool), vec!["ONLINE", "ONLINE"]);
    pool.flush().unwrap();
    for (start, len) in pool.used_ranges(0) {
        assert!(range(&a, start, len) == range(&d, start, len), "legs differ in blocks {start}+{len}");
    }
    assert!(pool.check().is_clean());
    let expect: Vec<Vec<u8>> = (0..16).map(|i| read_vol(&pool, v, i * 256 * 1024, 256 << 10)).collect();
    Arc::try_unwrap(pool).ok().expect("writer joined").close().unwrap();
    let pool = open(vec![dyns(&[&d]), dyns(&[&c])]).expect("the new leg alone opens");
    assert_eq!(leg_states(&pool), vec!["MISSING", "ONLINE"]);
    for (i, want) in expect.iter().enumerate() {
        assert!(&read_vol(&pool, v, i as u64 * 256 * 1024, 256 << 10) == want, "chunk {i} differs on leg d alone");
    }
    assert!(pool.check().is_clean());
    drop(pool);
    // The replaced leg, readable again, is no longer a leg of the pool.
    b.fail_io(false, false);
    match open(vec![dyns(&[&a, &b]), dyns(&[&c])]) {
        Err(EngineError::ForeignDevice { device, .. }) => assert_eq!(device, "b"),
        other => panic!("expected the replaced leg refused, got {:?}", other.map(|_| ())),
    }
}

/// Damage on one leg (a superblock copy, a journal record, a checkpoint
/// segment) is read around and rewritten from the other leg.
#[test]
fn metadata_damage_on_one_leg_is_healed() {
    let (a, b) = (sim("a"), sim("b"));
    let (pool, v) = mirror_with_volume(&a, &b, 7);
    pool.close().unwrap();
    drop(pool);
    // Checkpoint segment on leg a, superblock copy 0 on leg b.
    let sb = Superblock::decode(&range(&a, 0, 1), 0).unwrap();
    let seg = Pba(sb.checkpoint.first_segment).block();
    a.flip_bit(seg * BLOCK_SIZE + 100, 2);
    b.flip_bit(100, 5);
    let pool = open(vec![dyns(&[&a, &b])]).expect("opens from the good copies");
    assert_eq!(read_vol(&pool, v, 0, 64 << 10), pattern(7, 64 << 10));
    assert!(range(&a, seg, 1) == range(&b, seg, 1), "segment rewritten on leg a");
    assert!(Superblock::decode(&range(&b, 0, 1), 0).is_ok(), "superblock copy rewritten on leg b");
    assert!(pool.status().notes.iter().any(|n| n.contains("superblock copy 0 of leg b")), "{:?}", pool.status().notes);
    assert_eq!(pool.status().devices[0].legs[0].healed_blocks, 1);
    // A journal record (committed, not checkpointed) damaged on leg a.
    pool.write(v, 64 << 10, &pattern(8, 4096), false).unwrap();
    pool.create_volume("w", MIB).unwrap();
    drop(pool); // no close: the journal holds the commit
                // The side of the superblock's generation (a pool's first long write
                // sets COARSE_SUMS with a checkpoint of its own: either side it may be).
    let journal = sb.journal_start + (sb.journal_generation % 2) * (sb.journal_blocks / 2);
    let rec = range(&b, journal, 1);
    assert_eq!(&rec[..8], b"TARNJRNL");
    a.flip_bit(journal * BLOCK_SIZE + 70, 1);
    let pool = open(vec![dyns(&[&a, &b])]).unwrap();
    assert!(pool.volume_id("w").is_some(), "the record was replayed from leg b");
    assert_eq!(read_vol(&pool, v, 64 << 10, 4096), pattern(8, 4096));
    assert!(range(&a, journal, 1) == range(&b, journal, 1), "journal record rewritten on leg a");
    assert!(pool.check().is_clean());
}

/// Bug guarded: a leg that failed a write must be recorded faulted by the
/// commit that makes the write durable; otherwise, after a crash, the
/// reopened pool trusts it and reads the old data from it (leg 0 is read first).
#[test]
fn leg_fault_is_durable_with_the_commit() {
    let (a, b) = (sim("a"), sim("b"));
    let (pool, v) = mirror_with_volume(&a, &b, 1);
    pool.flush().unwrap();
    a.fail_io(false, true);
    pool.write(v, 0, &pattern(2, 64 << 10), false).unwrap();
    pool.create_volume("w", MIB).unwrap(); // a journal commit
    drop(pool); // crash: no close, no checkpoint
    a.fail_io(false, false);
    let pool = open(vec![dyns(&[&a, &b])]).unwrap();
    assert_eq!(leg_states(&pool), vec!["FAULTED", "ONLINE"]);
    assert_eq!(read_vol(&pool, v, 0, 64 << 10), pattern(2, 64 << 10), "stale leg a was read");
    assert!(pool.volume_id("w").is_some());
}

/// Bug guarded (found by the mirrored crash simulation): after a crash the
/// legs may differ where a write was cut; reads must come from one leg until
/// the others are resynced from it, and a clean close must not trigger it.
#[test]
fn unclean_shutdown_resyncs_the_other_legs() {
    let (a, b) = (sim("a"), sim("b"));
    let (pool, v) = mirror_with_volume(&a, &b, 1);
    pool.flush().unwrap();
    pool.close().unwrap();
    drop(pool);
    let pool = open(vec![dyns(&[&a, &b])]).unwrap();
    assert!(!pool.needs_resync(), "a clean close needs no resync");
    pool.write(v, 0, &pattern(2, 64 << 10), false).unwrap();
    pool.flush().unwrap();
    drop(pool); // crash
                // As if the crash cut a later overwrite that reached leg b only.
    let img = image(&a);
    let want = pattern(2, 4096);
    let block = (0..img.len() / 4096).find(|&i| img[i * 4096..(i + 1) * 4096] == want[..]).expect("data on leg a");
    b.write_at(&pattern(9, 4096), block as u64 * BLOCK_SIZE).unwrap();
    let pool = open(vec![dyns(&[&a, &b])]).unwrap();
    assert!(pool.needs_resync());
    assert_eq!(read_vol(&pool, v, 0, 4096), want, "reads come from leg a only");
    assert_eq!(leg_states(&pool), vec!["ONLINE", "RESILVERING"]);
    assert!(pool.status().notes.iter().any(|n| n.contains("unclean shutdown")), "{:?}", pool.status().notes);
    let copied = pool.resync_legs(&mut |_, _| {}).unwrap();
    assert!(copied > 0);
    assert_eq!(leg_states(&pool), vec!["ONLINE", "ONLINE"]);
    for (start, len) in pool.used_ranges(0) {
        assert!(range(&a, start, len) == range(&b, start, len), "legs differ in blocks {start}+{len}");
    }
    assert_eq!(read_vol(&pool, v, 0, 64 << 10), pattern(2, 64 << 10));
    pool.close().unwrap();
}
