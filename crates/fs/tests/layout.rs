//! Per-file placement and protection (issue 15 item 6a) on a real engine
//! pool of simulated devices whose member 0 is a mirror (a, b) and member
//! 1 a plain device (c): layout rules give new files their placement and
//! members, a file matching none is made as before, a file's own layout
//! (`user.tarn.layout`), refusals that write nothing, and crashes.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tarn_engine::{create_mirrored_pool, CreateOptions, Device, ObjectLayout, OpenOptions, PlacementKind, Pool};
use tarn_fs::{FileVolume, FsError, LayoutSpec, Versioned, ROOT};
use tarn_sim::SimDevice;

mod common;
use common::{crash_and_reopen, file, fresh, MIB};

/// Member 0 the mirror (a, b), member 1 plain c; file volume "home".
fn mirrored_pool() -> (Vec<Arc<SimDevice>>, Arc<Pool>, FileVolume) {
    let sims: Vec<Arc<SimDevice>> = ["a", "b", "c"].iter().map(|n| Arc::new(SimDevice::new(n, 64 * MIB))).collect();
    let dev = |i: usize| (sims[i].clone() as Arc<dyn Device>, sims[i].name());
    let slots = vec![vec![dev(0), dev(1)], vec![dev(2)]];
    create_mirrored_pool(&slots, &CreateOptions { journal_bytes: Some(256 << 10), ..Default::default() }).unwrap();
    let open = slots.iter().map(|s| s.iter().map(|(d, _)| d.clone()).collect()).collect();
    let pool = Arc::new(Pool::open_slots(open, OpenOptions::default()).unwrap());
    FileVolume::format(&pool, "home", 0, 0, 0).unwrap();
    let fv = FileVolume::open(pool.clone(), "home").unwrap();
    (sims, pool, fv)
}

fn spec(text: &str) -> LayoutSpec {
    LayoutSpec::parse(text).unwrap()
}

/// Make `name` in the root as a mount does (create, then its first open
/// for writing) and write `len` bytes; its object.
fn made(v: &Versioned, name: &str, len: usize) -> (u64, u32) {
    let ino = file(&v.live, ROOT, name);
    v.noted(ROOT, name.as_bytes(), ino);
    v.open_write(ino).unwrap();
    v.live.write(ino, 0, &vec![7u8; len]).unwrap();
    (ino, v.live.getattr(ino).unwrap().inode.object)
}

fn invalid_naming(r: Result<(), FsError>, cause: &str) {
    match r {
        Err(FsError::Invalid(m)) => assert!(m.contains(cause), "{m:?} does not say {cause:?}"),
        Err(FsError::Engine(e)) => assert!(e.to_string().contains(cause), "{e} does not say {cause:?}"),
        other => panic!("accepted, or not as invalid: {other:?}"),
    }
}

#[test]
fn rules_place_new_files_and_a_file_matching_none_is_made_as_before() {
    let (_sims, pool, fv) = mirrored_pool();
    fv.layout_add("!keep.db", LayoutSpec::default()).unwrap();
    fv.layout_add("*.db", spec("mirrored")).unwrap();
    fv.layout_add("*.log", spec("devices=1 placement=append")).unwrap();
    let v = Versioned::new(fv);
    let (_, db) = made(&v, "x.db", 1 << 20);
    let (log_ino, log) = made(&v, "x.log", 1 << 20);
    let (_, plain) = made(&v, "x.txt", 4096);
    let (_, kept) = made(&v, "keep.db", 4096);
    pool.flush().unwrap();
    assert_eq!(pool.object_layout(db).unwrap(), ObjectLayout { devices: 1, ..Default::default() });
    let want = ObjectLayout { placement: Some(PlacementKind::Append), devices: 2, stripe: None };
    assert_eq!(pool.object_layout(log).unwrap(), want);
    assert_eq!(pool.object_layout(plain).unwrap(), ObjectLayout::default(), "no rule: as before");
    assert_eq!(pool.object_layout(kept).unwrap(), ObjectLayout::default(), "excluded");
    assert_eq!(pool.object_blocks_per_member(db).unwrap(), vec![256, 0]);
    assert_eq!(pool.object_blocks_per_member(log).unwrap(), vec![0, 256]);
    assert_eq!(v.live.file_layout(log_ino).unwrap(), "placement=append devices=1 blocks=0:0,1:256");
    let db_ino = v.live.lookup(ROOT, b"x.db").unwrap().inode.ino;
    assert_eq!(v.live.file_layout(db_ino).unwrap(), "mirrored devices=0 blocks=0:256,1:0");
    assert_eq!(v.live.check().unwrap().problems, Vec::<String>::new());
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

/// With no rules the first open for writing makes nothing: the object
/// comes at the first write, as before the layout policy existed.
#[test]
fn no_rules_no_object_before_the_first_write() {
    let (_sims, _pool, fv) = mirrored_pool();
    let v = Versioned::new(fv);
    let ino = file(&v.live, ROOT, "x.db");
    v.noted(ROOT, b"x.db", ino);
    v.open_write(ino).unwrap();
    assert_eq!(v.live.getattr(ino).unwrap().inode.object, 0);
    assert_eq!(v.live.file_layout(ino).unwrap(), "default blocks=none");
}

/// A refused rule writes nothing: no policy object appears.
#[test]
fn rules_the_pool_cannot_give_are_refused_naming_the_cause() {
    let (_sim, pool, fv) = fresh();
    let allocated = pool.file_volume("home").unwrap().allocated;
    invalid_naming(fv.layout_add("*.db", spec("mirrored")), "no mirrored member");
    invalid_naming(fv.layout_add("*.db", spec("devices=3")), "not a member");
    invalid_naming(fv.layout_add("*.db", spec("stripe=2")), "stripe over 2");
    invalid_naming(fv.layout_add("*.db", LayoutSpec::default()), "sets nothing");
    invalid_naming(fv.layout_add("a/*.db", spec("placement=append")), "no '/'");
    assert!(fv.layout_policy().unwrap().is_empty());
    assert_eq!(pool.file_volume("home").unwrap().objects, 0, "no policy object made");
    assert_eq!(pool.file_volume("home").unwrap().allocated, allocated);
    fv.layout_add("*.db", spec("placement=inplace")).unwrap();
    invalid_naming(fv.layout_add("*.db", spec("placement=append")), "already");
    invalid_naming(fv.layout_remove("*.log"), "no such rule");
}

#[test]
fn the_layout_policy_is_kept_in_the_volume() {
    let (sim, pool, fv) = fresh();
    fv.layout_add("db/", spec("placement=inplace")).unwrap();
    fv.layout_add("*.log", spec("placement=append")).unwrap();
    drop(fv);
    pool.close().unwrap();
    let pool = Arc::new(Pool::open(vec![sim as Arc<dyn Device>], OpenOptions::default()).unwrap());
    let fv = FileVolume::open(pool, "home").unwrap();
    let rules: Vec<(String, String)> =
        fv.layout_policy().unwrap().iter().map(|r| (r.rule.text(), r.spec.text())).collect();
    assert_eq!(rules, [("db/", "placement=inplace"), ("*.log", "placement=append")].map(|(a, b)| (a.into(), b.into())));
    fv.layout_remove("db/").unwrap();
    assert_eq!(fv.layout_policy().unwrap().len(), 1);
    assert!(fv.policy().unwrap().is_empty(), "the version policy is another object");
}

/// `user.tarn.layout`: members and placement apply to what is written
/// after; a stripe only before the file has data.
#[test]
fn a_files_own_layout_applies_to_data_written_after_it() {
    let (_sims, pool, fv) = mirrored_pool();
    let v = Versioned::new(fv);
    let ino = file(&v.live, ROOT, "f");
    v.set_layout(ino, b"placement=append mirrored").unwrap();
    v.live.write(ino, 0, &[1u8; 65536]).unwrap();
    v.set_layout(ino, b"devices=1").unwrap();
    v.live.write(ino, 65536, &[2u8; 65536]).unwrap();
    pool.flush().unwrap();
    let object = v.live.getattr(ino).unwrap().inode.object;
    assert_eq!(pool.object_blocks_per_member(object).unwrap(), vec![16, 16], "old data stays where it is");
    assert_eq!(String::from_utf8(v.layout(ino).unwrap()).unwrap(), "devices=1 blocks=0:16,1:16");
    invalid_naming(v.set_layout(ino, b"stripe=2"), "before it has data");
    invalid_naming(v.set_layout(ino, b"placement=quick"), "placement is");
    invalid_naming(v.set_layout(ROOT, b"placement=append"), "regular files");
    let empty = file(&v.live, ROOT, "g");
    v.set_layout(empty, b"stripe=2:4K").unwrap();
    v.live.write(empty, 0, &[3u8; 8 * 4096]).unwrap();
    pool.flush().unwrap();
    let striped = v.live.getattr(empty).unwrap().inode.object;
    assert_eq!(pool.object_blocks_per_member(striped).unwrap(), vec![4, 4]);
    assert_eq!(v.live.read(empty, 0, 8 * 4096).unwrap(), vec![3u8; 8 * 4096]);
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

/// A power cut after a file's layout change and a write: after recovery
/// the write's data is there only with the layout it was written under,
/// and nothing is torn (both checks clean).
#[test]
fn a_crash_loses_a_layout_change_only_with_what_was_written_after_it() {
    let mut cut_inside = 0;
    for seed in 0..12u64 {
        let (sim, pool, fv) = fresh();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = file(&fv, ROOT, "a");
        fv.sync().unwrap();
        sim.crash_after(seed);
        let done = fv.set_file_layout(a, &spec("placement=append")).is_ok()
            && fv.write(a, 0, &[5u8; 8192]).is_ok()
            && fv.sync().is_ok();
        cut_inside += u32::from(!done);
        let (pool, fv) = crash_and_reopen(&sim, &mut rng, fv, pool);
        let i = fv.getattr(a).unwrap().inode;
        if i.size > 0 || done {
            assert_eq!(fv.read(a, 0, 8192).unwrap(), vec![5u8; 8192], "seed {seed}");
        }
        if i.object != 0 {
            assert_eq!(pool.object_layout(i.object).unwrap().placement, Some(PlacementKind::Append), "seed {seed}");
        }
        assert_eq!(fv.check().unwrap().problems, Vec::<String>::new(), "seed {seed}");
        assert_eq!(pool.check().problems, Vec::<String>::new(), "seed {seed}");
    }
    assert!(cut_inside >= 4, "the power was cut inside only {cut_inside} times of 12");
}

/// A power cut anywhere in a rule's add (the policy object, the header
/// naming it, one commit): after recovery the policy has the rules before
/// or after the add, whole, and the volume checks clean.
#[test]
fn a_crash_in_a_rule_add_leaves_the_old_or_the_new_policy() {
    let mut cut_inside = 0;
    for seed in 0..12u64 {
        let (sim, pool, fv) = fresh();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        fv.layout_add("*.log", spec("placement=append")).unwrap();
        sim.crash_after(seed);
        let done = fv.layout_add("db/", spec("placement=inplace")).is_ok();
        cut_inside += u32::from(!done);
        let (pool, fv) = crash_and_reopen(&sim, &mut rng, fv, pool);
        let rules: Vec<String> = fv.layout_policy().unwrap().iter().map(|r| r.rule.text()).collect();
        if done {
            assert_eq!(rules, ["*.log", "db/"], "seed {seed}: an add that returned was lost");
        } else {
            assert!(rules == ["*.log"] || rules == ["*.log", "db/"], "seed {seed}: {rules:?}");
        }
        assert_eq!(fv.check().unwrap().problems, Vec::<String>::new(), "seed {seed}");
        assert_eq!(pool.check().problems, Vec::<String>::new(), "seed {seed}");
    }
    assert!(cut_inside >= 2, "the power was cut inside only {cut_inside} times of 12");
}
