//! Close versions owed at release and taken in batches (`owed.rs`): each
//! holds its file as it was closed, the next commit takes them all (in
//! batches of one commit each), a deleted file's owed version goes with
//! it, and a crash keeps a batch whole or loses it, never the data.

mod common;

use common::{crash_and_reopen, file, fresh};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tarn_fs::{FileVolume, SetAttr, VersionKind, Versioned, OWED_BOUND, ROOT};

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
