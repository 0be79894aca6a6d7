//! Close versions owed at release and taken in batches (`owed.rs`): each
//! holds its file as it was closed, the next commit takes them all (in
//! batches of one commit each), a deleted file's owed version goes with
//! it, and a crash keeps a batch whole or loses it, never the data.

mod common;

use common::{crash_and_reopen, file, fresh};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tarn_fs::{Change, FileVolume, SetAttr, VersionKind, Versioned, OWED_BOUND, ROOT};

/// Files f0..fN, file k holding `content(k)`, committed.
fn files(fv: &FileVolume, n: usize) -> Vec<u64> {
    let inos: Vec<u64> = (0..n).map(|k| file(fv, ROOT, &format!("f{k}"))).collect();
    for (k, ino) in inos.iter().enumerate() {
        fv.write(*ino, 0, &content(k, 0)).unwrap();
    }
    fv.sync().unwrap();
    inos
}

fn content(k: usize, round: u8) -> Vec<u8> {
    vec![k as u8 ^ round; 3000 + 97 * (k % 64)]
}

/// `name@N`'s data and mode, N the newest close version of `name`.
fn newest(v: &Versioned, name: &str) -> Option<(Vec<u8>, u32)> {
    let ino = v.live.lookup(ROOT, name.as_bytes()).ok()?.inode.ino;
    let list = v.live.versions().unwrap();
    let n = list.iter().filter(|s| s.owner == ino && s.kind == VersionKind::Close).map(|s| s.number).max()?;
    let a = v.lookup(ROOT, format!("{name}@{n}").as_bytes()).unwrap();
    Some((v.read(a.inode.ino, 0, 1 << 20).unwrap(), a.inode.perm))
}

fn closes(fv: &FileVolume) -> usize {
    fv.versions().unwrap().iter().filter(|s| s.kind == VersionKind::Close).count()
}

/// 100 owed versions (two batches): none is a version before the commit,
/// every one after it, as its file was closed (a later chmod does not
/// show, a write after the file's own version was taken does not show);
/// a file deleted while owed has none. After a crash they are all there.
#[test]
fn owed_versions_are_taken_at_the_next_commit_as_their_files_were_closed() {
    let (sim, pool, fv) = fresh();
    let inos = files(&fv, 100);
    for ino in &inos {
        fv.owe_close_version(*ino).unwrap();
    }
    assert!(fv.owes_versions());
    assert_eq!(closes(&fv), 0, "owed versions are not taken yet");
    // Changes that do not come through the mount's requests: what the
    // record keeps is the file at its release.
    let chmod = SetAttr { perm: Some(0o600), ..Default::default() };
    fv.setattr(inos[1], &chmod).unwrap();
    // A write through the mount takes the file's version first.
    assert_eq!(fv.take_owed(Some(&inos[2..3])).unwrap(), 1);
    fv.write(inos[2], 0, &content(2, 0xff)).unwrap();
    fv.unlink(ROOT, b"f3").unwrap();
    fv.sync().unwrap();
    assert!(!fv.owes_versions());
    assert_eq!(closes(&fv), 99, "every owed version but the deleted file's");
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (pool, fv) = crash_and_reopen(&sim, &mut rng, fv, pool);
    let v = Versioned::new(fv);
    for k in (0..100).filter(|&k| k != 3) {
        let (data, perm) = newest(&v, &format!("f{k}")).unwrap_or_else(|| panic!("f{k} has no version"));
        assert!(data == content(k, 0), "f{k}'s version holds other data");
        assert_eq!(perm, 0o644, "f{k}'s version holds another mode");
    }
    assert_eq!(v.live.read(inos[2], 0, 1 << 20).unwrap(), content(2, 0xff));
    assert_eq!(v.live.check().unwrap().problems, Vec::<String>::new());
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

/// The data of every close version of `name`, oldest first.
fn close_data(v: &Versioned, name: &str) -> Vec<Vec<u8>> {
    let ino = v.live.lookup(ROOT, name.as_bytes()).unwrap().inode.ino;
    let mut numbers: Vec<u64> = v
        .live
        .versions()
        .unwrap()
        .iter()
        .filter(|s| s.owner == ino && s.kind == VersionKind::Close)
        .map(|s| s.number)
        .collect();
    numbers.sort_unstable();
    let read = |n: u64| {
        let a = v.lookup(ROOT, format!("{name}@{n}").as_bytes()).unwrap();
        v.read(a.inode.ino, 0, 1 << 20).unwrap()
    };
    numbers.into_iter().map(read).collect()
}

/// A change that leaves every byte an owed version holds as it is (an
/// append rewriting its first page as it was, a chmod, an extension)
/// leaves the version to the next commit's batch; one that changes a
/// byte below the version's end (a write, a truncate) takes it first.
/// Each version holds its file as closed, after a crash too.
#[test]
fn a_change_that_spares_the_owed_bytes_leaves_the_version_to_the_batch() {
    let (sim, pool, fv) = fresh();
    let inos = files(&fv, 4);
    let c: Vec<Vec<u8>> = (0..4).map(|k| content(k, 0)).collect();
    for ino in &inos {
        fv.owe_close_version(*ino).unwrap();
    }
    // f0: appended to (its one page rewritten as it was), closed again.
    let mut appended = c[0].clone();
    appended.extend_from_slice(b"appended");
    assert_eq!(fv.take_owed_before(inos[0], Change::Write { offset: 0, data: &appended }).unwrap(), 0);
    fv.write(inos[0], 0, &appended).unwrap();
    fv.owe_close_version(inos[0]).unwrap();
    // f1: a chmod, then an extension.
    let chmod = SetAttr { perm: Some(0o600), ..Default::default() };
    assert_eq!(fv.take_owed_before(inos[1], Change::Attributes).unwrap(), 0);
    fv.setattr(inos[1], &chmod).unwrap();
    let longer = c[1].len() as u64 + 10;
    assert_eq!(fv.take_owed_before(inos[1], Change::Size(longer)).unwrap(), 0);
    fv.setattr(inos[1], &SetAttr { size: Some(longer), ..Default::default() }).unwrap();
    // f2: one byte below its end changed; f3: truncated below its end.
    let mut changed = c[2].clone();
    changed[100] ^= 1;
    assert_eq!(fv.take_owed_before(inos[2], Change::Write { offset: 0, data: &changed }).unwrap(), 1);
    fv.write(inos[2], 0, &changed).unwrap();
    assert_eq!(fv.take_owed_before(inos[3], Change::Size(10)).unwrap(), 1);
    fv.setattr(inos[3], &SetAttr { size: Some(10), ..Default::default() }).unwrap();
    assert_eq!(closes(&fv), 2, "the spared versions wait for the commit");
    fv.sync().unwrap();
    let (pool, fv) = crash_and_reopen(&sim, &mut ChaCha8Rng::seed_from_u64(5), fv, pool);
    let v = Versioned::new(fv);
    assert!(close_data(&v, "f0") == [c[0].clone(), appended], "f0: as closed, then as appended");
    assert!(close_data(&v, "f1") == [c[1].clone()], "f1: as closed (its extension not in it)");
    assert_eq!(newest(&v, "f1").unwrap().1, 0o644, "f1's version keeps its mode at close");
    assert!(close_data(&v, "f2") == [c[2].clone()], "f2: as closed, not as changed");
    assert!(close_data(&v, "f3") == [c[3].clone()], "f3: as closed, not truncated");
    assert_eq!(v.live.read(inos[2], 0, 1 << 20).unwrap(), changed);
    assert_eq!(v.live.check().unwrap().problems, Vec::<String>::new());
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

/// Owing the bound's worth takes them all at once, without a commit asked.
#[test]
fn owing_the_bound_takes_the_owed_versions() {
    let (_sim, pool, fv) = fresh();
    let inos = files(&fv, OWED_BOUND);
    for ino in &inos[..OWED_BOUND - 1] {
        fv.owe_close_version(*ino).unwrap();
    }
    assert_eq!(closes(&fv), 0);
    fv.owe_close_version(inos[OWED_BOUND - 1]).unwrap();
    assert!(!fv.owes_versions());
    assert_eq!(closes(&fv), OWED_BOUND);
    assert_eq!(fv.check().unwrap().problems, Vec::<String>::new());
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

/// A power cut anywhere in the commit that takes owed versions: the data
/// committed before stays; each version is there holding what its file
/// held at its close, or absent; all of them when the commit returned;
/// the volume and pool check clean.
#[test]
fn a_crash_in_the_commit_taking_owed_versions_loses_no_data() {
    let mut cut_inside = 0;
    for seed in 0..12u64 {
        let (sim, pool, fv) = fresh();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let inos = files(&fv, 70);
        for ino in &inos {
            fv.owe_close_version(*ino).unwrap();
        }
        sim.crash_after(seed * 3);
        let done = fv.sync().is_ok();
        cut_inside += u32::from(!done);
        let (pool, fv) = crash_and_reopen(&sim, &mut rng, fv, pool);
        let taken = closes(&fv);
        if done {
            assert_eq!(taken, 70, "seed {seed}: versions committed but lost");
        }
        let v = Versioned::new(fv);
        for (k, ino) in inos.iter().enumerate() {
            let name = format!("f{k}");
            assert!(v.live.read(*ino, 0, 1 << 20).unwrap() == content(k, 0), "seed {seed}: {name} lost data");
            if let Some((data, _)) = newest(&v, &name) {
                assert!(data == content(k, 0), "seed {seed}: {name}'s version holds other data");
            }
        }
        assert_eq!(v.live.check().unwrap().problems, Vec::<String>::new(), "seed {seed}");
        assert_eq!(pool.check().problems, Vec::<String>::new(), "seed {seed}");
    }
    assert!(cut_inside >= 4, "the power was cut inside the commit only {cut_inside} times of 12");
}
