//! Volume snapshots by epoch on a real engine pool (the sim device): what
//! each snapshot shows after later changes, deletes, retirement and
//! freeing, and crashes around snapshots (the simulated device drops
//! what was not flushed).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tarn_engine::{Device, OpenOptions, Pool};
use tarn_fs::{FileVolume, FsError, Kind, SetAttr, ROOT};
use tarn_sim::fixture::wait_until;

mod common;
use common::{file, fresh};

/// The content of `path` (names from the root) in `fv`, None if absent.
fn cat(fv: &FileVolume, path: &[&str]) -> Option<Vec<u8>> {
    let mut ino = ROOT;
    for name in path {
        ino = fv.lookup(ino, name.as_bytes()).ok()?.inode.ino;
    }
    Some(fv.read(ino, 0, 1 << 20).unwrap())
}

/// `freed` is `data` plus a few blocks of inode table and directories.
fn freed_about(freed: u64, data: u64) {
    assert!(freed >= data && freed <= data + 4 * 4096, "freed {freed}, data {data}");
}

fn objects(pool: &Pool) -> u64 {
    pool.file_volume("home").unwrap().objects
}

#[test]
fn each_snapshot_shows_the_volume_as_it_was() {
    let (_sim, pool, fv) = fresh();
    let a = file(&fv, ROOT, "a");
    fv.write(a, 0, &vec![1u8; 20_000]).unwrap();
    let d = fv.create(ROOT, b"d", Kind::Dir, 0o755, 0, 0).unwrap().inode.ino;
    let b = file(&fv, d, "b");
    fv.write(b, 0, b"bee").unwrap();
    assert_eq!(fv.snap_create("one").unwrap().number, 1);
    // Changes after the snapshot: overwrite, truncate, delete, create.
    fv.write(a, 4096, &[2u8; 10]).unwrap();
    fv.unlink(d, b"b").unwrap();
    let c = file(&fv, ROOT, "c");
    fv.write(c, 0, b"sea").unwrap();
    assert_eq!(fv.snap_create("two").unwrap().number, 2);
    fv.setattr(a, &SetAttr { size: Some(5), ..Default::default() }).unwrap();
    assert!(matches!(fv.snap_create("two"), Err(FsError::Engine(_))), "a name twice");

    let one = FileVolume::open_snapshot(pool.clone(), "home", "one").unwrap();
    assert_eq!(cat(&one, &["a"]).unwrap(), vec![1u8; 20_000]);
    assert_eq!(cat(&one, &["d", "b"]).unwrap(), b"bee", "a deleted file stays in the older snapshot");
    assert_eq!(cat(&one, &["c"]), None);
    let two = FileVolume::open_snapshot(pool.clone(), "home", "two").unwrap();
    let mut want = vec![1u8; 20_000];
    want[4096..4106].fill(2);
    assert_eq!(cat(&two, &["a"]).unwrap(), want);
    assert_eq!(cat(&two, &["d", "b"]), None);
    assert_eq!(cat(&two, &["c"]).unwrap(), b"sea");
    assert_eq!(cat(&fv, &["a"]).unwrap(), vec![1u8; 5]);
    // A snapshot is read-only.
    assert!(matches!(two.write(c, 0, b"x"), Err(FsError::ReadOnly(_))));
    assert!(matches!(two.unlink(ROOT, b"c"), Err(FsError::ReadOnly(_))));
    assert!(matches!(FileVolume::open_snapshot(pool.clone(), "home", "nine"), Err(FsError::NoSuchSnapshot { .. })));
    assert_eq!(fv.check().unwrap().problems, Vec::<String>::new());
    assert_eq!(two.check().unwrap().problems, Vec::<String>::new());
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

/// Deleting a snapshot frees what only it held: the deleted file's
/// retired object goes with the last snapshot that saw it, the space of
/// overwritten blocks comes back, and the other snapshot still reads.
#[test]
fn delete_frees_only_what_that_snapshot_held() {
    let (_sim, pool, fv) = fresh();
    let a = file(&fv, ROOT, "a");
    fv.write(a, 0, &vec![7u8; 1 << 20]).unwrap();
    let gone = file(&fv, ROOT, "gone");
    fv.write(gone, 0, &vec![9u8; 1 << 20]).unwrap();
    fv.sync().unwrap();
    fv.snap_create("one").unwrap();
    fv.write(a, 0, &vec![8u8; 1 << 20]).unwrap();
    fv.unlink(ROOT, b"gone").unwrap();
    fv.sync().unwrap();
    fv.snap_create("two").unwrap();
    fv.write(a, 0, &vec![6u8; 1 << 20]).unwrap();
    fv.sync().unwrap();
    let live = objects(&pool);
    let before = pool.status().free;
    fv.snap_delete("two").unwrap();
    // "two" alone held a's second state (1 MiB) and its own inode table
    // and directory blocks; "gone" is still seen by "one".
    freed_about(pool.status().free - before, 1 << 20);
    assert_eq!(objects(&pool), live);
    let one = FileVolume::open_snapshot(pool.clone(), "home", "one").unwrap();
    assert_eq!(cat(&one, &["gone"]).unwrap(), vec![9u8; 1 << 20]);
    assert_eq!(cat(&one, &["a"]).unwrap(), vec![7u8; 1 << 20]);
    drop(one);
    let before = pool.status().free;
    fv.snap_delete("one").unwrap();
    // a's first state and the deleted file.
    freed_about(pool.status().free - before, 2 << 20);
    assert_eq!(objects(&pool), live - 1, "the retired object is deleted");
    assert!(matches!(fv.snap_delete("one"), Err(FsError::NoSuchSnapshot { .. })));
    assert_eq!(cat(&fv, &["a"]).unwrap(), vec![6u8; 1 << 20]);
    assert_eq!(fv.snap_list().unwrap(), vec![]);
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

/// A crash anywhere around snapshots: every snapshot listed reads as the
/// volume was when it was taken, and what was flushed is in the head.
#[test]
fn crashes_around_snapshots_keep_them_consistent() {
    let mut cut_inside = 0;
    for seed in 0..12u64 {
        let (sim, pool, fv) = fresh();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = file(&fv, ROOT, "a");
        fv.write(a, 0, b"state0").unwrap();
        fv.sync().unwrap();
        sim.crash_after(rand::Rng::random_range(&mut rng, 1..60));
        let mut taken = 0;
        for n in 1..=6u8 {
            let ok = fv.snap_create(&format!("s{n}")).is_ok() && fv.write(a, 0, format!("state{n}").as_bytes()).is_ok();
            if !ok || fv.sync().is_err() {
                break;
            }
            taken = n;
        }
        cut_inside += u32::from(taken < 6);
        sim.crash(&mut rng);
        drop(fv);
        drop(pool);
        let pool = Arc::new(Pool::open(vec![sim.clone() as Arc<dyn Device>], OpenOptions::default()).unwrap());
        let fv = FileVolume::open(pool.clone(), "home").unwrap();
        let list = fv.snap_list().unwrap();
        assert!(list.len() >= usize::from(taken), "seed {seed}: {} snapshots, {taken} synced", list.len());
        let head = cat(&fv, &["a"]).unwrap();
        assert!(head >= format!("state{taken}").into_bytes(), "seed {seed}: head {head:?} older than the last sync");
        // A change after the crash must not alter any snapshot: every
        // object's tag and its inode's epoch survived together.
        let a = fv.lookup(ROOT, b"a").unwrap().inode.ino;
        fv.write(a, 0, b"after!").unwrap();
        fv.sync().unwrap();
        for s in &list {
            let n: u8 = s.name[1..].parse().unwrap();
            let v = FileVolume::open_snapshot(pool.clone(), "home", &s.name).unwrap();
            assert_eq!(cat(&v, &["a"]).unwrap(), format!("state{}", n - 1).into_bytes(), "seed {seed} {}", s.name);
        }
        assert_eq!(fv.check().unwrap().problems, Vec::<String>::new(), "seed {seed}");
        assert_eq!(pool.check().problems, Vec::<String>::new(), "seed {seed}");
    }
    assert!(cut_inside >= 6, "the power was cut inside the snapshots only {cut_inside} times of 12");
}

/// Snapshot cost does not grow with the number of files: it writes the
/// header and one engine snapshot, whatever the table holds. Counted in
/// objects touched, not time: no object gets a snapshot at creation.
#[test]
fn a_snapshot_touches_no_object() {
    let (_sim, pool, fv) = fresh();
    for i in 0..200 {
        let f = file(&fv, ROOT, &format!("f{i}"));
        fv.write(f, 0, b"x").unwrap();
    }
    fv.snap_create("s").unwrap();
    let tagged = pool.objects_with_snapshots(pool.file_volume("home").unwrap().id);
    assert!(tagged.iter().all(|o| o.snapshots.is_empty()));
    // The first change of one file tags that object only.
    let f0 = fv.lookup(ROOT, b"f0").unwrap().inode.ino;
    fv.write(f0, 0, b"y").unwrap();
    let tagged = pool.objects_with_snapshots(pool.file_volume("home").unwrap().id);
    assert_eq!(tagged.iter().filter(|o| !o.snapshots.is_empty()).count(), 1);
}

/// A crash inside a snapshot's deletion: the other snapshot still reads
/// as it was, the pool checks clean, and deleting it afterwards leaves
/// no tag and no retired object behind (a later delete finishes the job).
#[test]
fn crash_inside_delete_loses_nothing_still_seen() {
    let mut cut_inside = 0;
    for seed in 0..8u64 {
        let (sim, pool, fv) = fresh();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = file(&fv, ROOT, "a");
        fv.write(a, 0, &vec![1u8; 64 << 10]).unwrap();
        for i in 0..8 {
            let f = file(&fv, ROOT, &format!("gone{i}"));
            fv.write(f, 0, &[i as u8; 5000]).unwrap();
        }
        fv.snap_create("one").unwrap();
        fv.write(a, 0, &vec![2u8; 64 << 10]).unwrap();
        for i in 0..8 {
            fv.unlink(ROOT, format!("gone{i}").as_bytes()).unwrap();
        }
        fv.snap_create("two").unwrap();
        fv.write(a, 0, &vec![3u8; 64 << 10]).unwrap();
        fv.sync().unwrap();
        let live = objects(&pool) - 8;
        sim.crash_after(rand::Rng::random_range(&mut rng, 0..3));
        let r = fv.snap_delete("one");
        cut_inside += u32::from(r.is_err());
        sim.crash(&mut rng);
        drop(fv);
        drop(pool);
        let pool = Arc::new(Pool::open(vec![sim.clone() as Arc<dyn Device>], OpenOptions::default()).unwrap());
        let fv = FileVolume::open(pool.clone(), "home").unwrap();
        let two = FileVolume::open_snapshot(pool.clone(), "home", "two").unwrap();
        assert_eq!(cat(&two, &["a"]).unwrap(), vec![2u8; 64 << 10], "seed {seed}");
        if let Ok(one) = FileVolume::open_snapshot(pool.clone(), "home", "one") {
            assert_eq!(cat(&one, &["gone3"]).unwrap(), vec![3u8; 5000], "seed {seed}");
            assert_eq!(cat(&one, &["a"]).unwrap(), vec![1u8; 64 << 10], "seed {seed}");
        }
        assert_eq!(pool.check().problems, Vec::<String>::new(), "seed {seed}");
        drop(two);
        for s in fv.snap_list().unwrap() {
            fv.snap_delete(&s.name).unwrap();
        }
        assert_eq!(objects(&pool), live, "seed {seed}: retired objects left");
        let tagged = pool.objects_with_snapshots(pool.file_volume("home").unwrap().id);
        assert!(tagged.iter().all(|o| o.snapshots.is_empty()), "seed {seed}: tags left");
        assert_eq!(cat(&fv, &["a"]).unwrap(), vec![3u8; 64 << 10]);
        assert_eq!(fv.check().unwrap().problems, Vec::<String>::new(), "seed {seed}");
    }
    assert!(cut_inside >= 4, "the power was cut inside the delete only {cut_inside} times of 8");
}

/// A new file volume has what its snapshots need (FS_VERSIONS): its first
/// snapshot, taken under the namespace lock on a mount, makes no commit
/// of its own, so it returns while a commit is held in its device flush
/// (it waited for that commit, then made its own: 1.5 s of stalled
/// requests in PostMark). Queued, it is durable with the next commit.
#[test]
fn the_first_snapshot_of_a_new_volume_waits_for_no_commit() {
    let (sim, pool, fv) = fresh();
    assert!(pool.has_feature(tarn_format::superblock::incompat::FS_VERSIONS));
    let a = file(&fv, ROOT, "a");
    fv.write(a, 0, b"before").unwrap();
    sim.hold_flushes();
    std::thread::scope(|s| {
        let in_flight = s.spawn(|| pool.flush());
        wait_until("the commit reaches its device flush", || sim.flushes_waiting() == 1);
        let (taken, answer) = std::sync::mpsc::channel();
        let fv = &fv;
        s.spawn(move || taken.send(fv.queue_snap_create("s1").map(|s| s.number)));
        let number = answer.recv_timeout(std::time::Duration::from_secs(20));
        sim.release_flushes();
        assert!(number.is_ok(), "the first snapshot waited for the commit in flight");
        number.unwrap().unwrap();
        in_flight.join().unwrap().unwrap();
    });
    fv.write(a, 0, b"after!").unwrap();
    fv.sync().unwrap();
    drop(fv);
    pool.close().unwrap();
    let pool = Arc::new(Pool::open(vec![sim as Arc<dyn Device>], OpenOptions::default()).unwrap());
    let fv = FileVolume::open(pool.clone(), "home").unwrap();
    let s1 = FileVolume::open_snapshot(pool, "home", "s1").unwrap();
    assert_eq!(cat(&s1, &["a"]).unwrap(), b"before");
    assert_eq!(cat(&fv, &["a"]).unwrap(), b"after!");
    assert_eq!(fv.check().unwrap().problems, Vec::<String>::new());
}
