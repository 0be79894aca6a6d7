//! User extended attributes on a real engine pool (the sim device): a
//! power cut anywhere in a run of changes leaves every inode with one
//! whole set it had (never a mix, never an error), snapshots keep the set
//! of their time, and the namespace and pool checks stay clean.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tarn_engine::{Device, OpenOptions, Pool};
use tarn_fs::{FileVolume, FsError, Kind, Versioned, XattrMode, ROOT};

mod common;
use common::{file, fresh};

/// State k of the value: long enough to span several sectors and blocks.
fn value(k: u8) -> Vec<u8> {
    vec![k; 20_000 + k as usize]
}

#[test]
fn a_crash_in_a_run_of_xattr_changes_keeps_one_whole_set() {
    let mut cut_inside = 0;
    for seed in 0..16u64 {
        let (sim, pool, fv) = fresh();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = file(&fv, ROOT, "a");
        let d = fv.create(ROOT, b"d", Kind::Dir, 0o755, 0, 0).unwrap().inode.ino;
        fv.write(a, 0, b"data").unwrap();
        fv.set_xattr(a, b"user.k", &value(0), XattrMode::Any).unwrap();
        fv.set_xattr(d, b"user.k", &value(0), XattrMode::Any).unwrap();
        fv.sync().unwrap();
        // Cut after `seed` device writes or flushes, inside the changes.
        sim.crash_after(seed * 3);
        let mut synced = 0u8;
        for k in 1..=4u8 {
            let ok = fv.set_xattr(a, b"user.k", &value(k), XattrMode::Replace).is_ok()
                && fv.set_xattr(d, b"user.k", &value(k), XattrMode::Replace).is_ok()
                && fv.set_xattr(a, format!("user.n{k}").as_bytes(), b"x", XattrMode::Create).is_ok()
                && fv.sync().is_ok();
            if !ok {
                break;
            }
            synced = k;
        }
        cut_inside += u32::from(synced < 4);
        sim.crash(&mut rng);
        drop(fv);
        drop(pool);
        let pool = Arc::new(Pool::open(vec![sim.clone() as Arc<dyn Device>], OpenOptions::default()).unwrap());
        let fv = FileVolume::open(pool.clone(), "home").unwrap();
        for ino in [a, d] {
            let v = fv.get_xattr(ino, b"user.k").unwrap_or_else(|e| panic!("seed {seed}: inode {ino}: {e}"));
            let k = v[0];
            assert!(k >= synced && k <= synced + 1, "seed {seed}: state {k}, {synced} synced");
            assert_eq!(v, value(k), "seed {seed}: a torn value");
        }
        // The file's extra names: those of the states it kept (the last
        // change's name may be missing when its value is the new one).
        let k = fv.get_xattr(a, b"user.k").unwrap()[0];
        let names = fv.list_xattrs(a).unwrap();
        let want = |j: u8| {
            let mut n: Vec<String> = (1..=j).map(|j| format!("user.n{j}")).collect();
            n.push("user.k".into());
            n.sort();
            n.iter().flat_map(|n| format!("{n}\0").into_bytes()).collect::<Vec<u8>>()
        };
        let ok = names == want(k) || (k > synced && names == want(k - 1));
        assert!(ok, "seed {seed}: state {k}, names {:?}", String::from_utf8_lossy(&names));
        assert_eq!(fv.read(a, 0, 16).unwrap(), b"data", "seed {seed}");
        assert_eq!(fv.check().unwrap().problems, Vec::<String>::new(), "seed {seed}");
        assert_eq!(pool.check().problems, Vec::<String>::new(), "seed {seed}");
    }
    assert!(cut_inside >= 8, "the power was cut inside only {cut_inside} times of 16");
}

#[test]
fn snapshots_and_versions_keep_the_set_of_their_time() {
    let (_sim, pool, fv) = fresh();
    let a = file(&fv, ROOT, "a");
    fv.set_xattr(a, b"user.c", b"blue", XattrMode::Any).unwrap();
    fv.snap_create("s1").unwrap();
    fv.set_xattr(a, b"user.c", b"red", XattrMode::Any).unwrap();
    fv.snap_file(a, "").unwrap();
    fv.remove_xattr(a, b"user.c").unwrap();
    assert!(matches!(fv.remove_xattr(a, b"user.c"), Err(FsError::NoData)));
    fv.sync().unwrap();
    let v = Versioned::new(fv);
    let at = |name: &str| v.get_xattr(v.lookup(ROOT, name.as_bytes()).unwrap().inode.ino, b"user.c");
    assert_eq!(at("a@1").unwrap(), b"blue");
    assert_eq!(at("a@2").unwrap(), b"red");
    assert!(matches!(at("a"), Err(FsError::NoData)));
    assert_eq!(v.live.list_xattrs(a).unwrap(), b"");
    // Deleting the volume snapshot keeps the file version's set.
    v.live.snap_delete("s1").unwrap();
    v.forget_views();
    assert_eq!(at("a@2").unwrap(), b"red");
    assert_eq!(v.live.check().unwrap().problems, Vec::<String>::new());
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

#[test]
fn limits_and_flags() {
    let (_sim, _pool, fv) = fresh();
    let a = file(&fv, ROOT, "a");
    assert!(matches!(fv.set_xattr(a, b"user.k", b"1", XattrMode::Replace), Err(FsError::NoData)));
    fv.set_xattr(a, b"user.k", b"1", XattrMode::Create).unwrap();
    assert!(matches!(fv.set_xattr(a, b"user.k", b"2", XattrMode::Create), Err(FsError::Exists)));
    assert!(matches!(fv.set_xattr(a, b"trusted.k", b"2", XattrMode::Any), Err(FsError::NotSupported)));
    assert!(matches!(fv.set_xattr(a, b"user.tarn.x", b"2", XattrMode::Any), Err(FsError::NotSupported)));
    assert!(matches!(fv.set_xattr(a, b"user.v", &[0; 65537], XattrMode::Any), Err(FsError::XattrTooBig)));
    let long = [b"user.".to_vec(), vec![b'n'; 251]].concat();
    assert!(matches!(fv.set_xattr(a, &long, b"", XattrMode::Any), Err(FsError::XattrRange(_))));
    for k in 0..3 {
        fv.set_xattr(a, format!("user.big{k}").as_bytes(), &[k; 65536], XattrMode::Any).unwrap();
    }
    // A fourth 64 KiB value does not fit the 256 KiB slot: nothing changes.
    assert!(matches!(fv.set_xattr(a, b"user.big3", &[3; 65536], XattrMode::Any), Err(FsError::XattrSpace)));
    assert_eq!(fv.get_xattr(a, b"user.big2").unwrap(), vec![2; 65536]);
    assert_eq!(fv.list_xattrs(a).unwrap(), b"user.big0\0user.big1\0user.big2\0user.k\0");
    let s = fv.symlink(ROOT, b"l", b"a", 0, 0).unwrap().inode.ino;
    assert!(matches!(fv.set_xattr(s, b"user.k", b"1", XattrMode::Any), Err(FsError::NotPermitted(_))));
    assert!(matches!(fv.write(a, tarn_fs::MAX_FILE_SIZE - 1, b"xy"), Err(FsError::TooLarge)));
}
