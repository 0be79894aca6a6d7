//! Per-file snapshots and close versions on a real engine pool (the sim
//! device): what a version shows (data and inode record), block sharing,
//! deleting one version, the keep bound, and crashes between a close and
//! its version's commit (the simulated device drops what was not flushed).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tarn_engine::{Device, OpenOptions, Pool};
use tarn_fs::{FileVolume, SetAttr, VersionKind, Versioned, ROOT};

mod common;
use common::{crash_and_reopen, file, fresh};

/// Version `n` of `name` (in the root) as `name@n` reads: data and mode.
fn version(v: &Versioned, name: &str, n: u64) -> Option<(Vec<u8>, u32)> {
    let a = v.lookup(ROOT, format!("{name}@{n}").as_bytes()).ok()?;
    Some((v.read(a.inode.ino, 0, 1 << 20).unwrap(), a.inode.perm))
}

fn listed(v: &Versioned, name: &str) -> Vec<String> {
    let list = v.lookup(ROOT, format!("{name}@").as_bytes()).unwrap().inode.ino;
    let names = v.readdir(list, 0).unwrap().into_iter().map(|e| String::from_utf8(e.name).unwrap());
    names.filter(|n| n != "." && n != "..").collect()
}

#[test]
fn a_file_version_keeps_data_and_record_and_only_its_file_sees_it() {
    let (_sim, pool, fv) = fresh();
    let a = file(&fv, ROOT, "a");
    let b = file(&fv, ROOT, "b");
    fv.write(a, 0, &[1u8; 9000]).unwrap();
    fv.write(b, 0, b"bee").unwrap();
    let s = fv.snap_file(a, "mine").unwrap();
    assert_eq!((s.number, s.kind), (1, VersionKind::File));
    fv.write(a, 4096, &[2u8; 100]).unwrap();
    fv.setattr(a, &SetAttr { perm: Some(0o600), size: Some(5000), ..Default::default() }).unwrap();
    // A file version costs other objects no tag (only volume snapshots do).
    fv.write(b, 0, b"BEE").unwrap();
    let id = pool.file_volume("home").unwrap().id;
    let b_obj = fv.getattr(b).unwrap().inode.object;
    let tagged = pool.objects_with_snapshots(id);
    assert!(tagged.iter().find(|o| o.id == b_obj).unwrap().snapshots.is_empty(), "b tagged");
    assert_eq!(fv.snap_list().unwrap(), vec![], "a file version is not a volume snapshot");
    let v = Versioned::new(fv);
    assert_eq!(version(&v, "a", 1), Some((vec![1u8; 9000], 0o644)), "data, size and mode as they were");
    assert_eq!(listed(&v, "a"), vec!["1"]);
    assert_eq!(listed(&v, "b"), Vec::<String>::new());
    assert!(version(&v, "b", 1).is_none(), "another file's version is ENOENT");
    let x = v.lookup(ROOT, b"a@1").unwrap().inode.ino;
    assert_eq!(v.version_type(x).unwrap(), Some(VersionKind::File));
    let mut want = vec![1u8; 5000];
    want[4096..4196].fill(2);
    assert_eq!(v.live.read(a, 0, 1 << 20).unwrap(), want);
    assert!(v.live.snap_file(ROOT, "").is_err(), "a directory has no file version");
    assert!(v.live.snap_file(a, "a/b").is_err(), "a label with '/'");
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

#[test]
fn close_versions_share_blocks_and_one_deleted_frees_only_its_own() {
    let (_sim, pool, fv) = fresh();
    let a = file(&fv, ROOT, "a");
    let mut states = vec![vec![7u8; 1 << 20]];
    fv.write(a, 0, &states[0]).unwrap();
    fv.sync().unwrap();
    fv.close_version(a, true).unwrap();
    let free0 = pool.status().free;
    // Each session rewrites the same block, so version k (2..4) alone
    // holds its state of it once version k+1 is taken.
    for i in 1..5usize {
        let mut s = states[i - 1].clone();
        s[8192..8192 + 4096].fill(i as u8);
        fv.write(a, 8192, &s[8192..8192 + 4096]).unwrap();
        fv.sync().unwrap();
        fv.close_version(a, true).unwrap();
        states.push(s);
    }
    let grew = free0 - pool.status().free;
    // 4 changed blocks (and the version log's block), not 4 MiB.
    assert!((4 * 4096..=64 * 4096).contains(&grew), "grew {grew}");
    let v = Versioned::new(fv);
    for (n, s) in states.iter().enumerate() {
        assert_eq!(version(&v, "a", n as u64 + 1).unwrap().0, *s, "version {}", n + 1);
    }
    // Version 3 alone held the block version 4 overwrote: exactly it goes.
    v.live.write(a, 0, b"head").unwrap();
    v.live.sync().unwrap();
    let before = pool.status().free;
    v.remove_version(a, b"3").unwrap();
    // Freed by the commit that makes the delete durable.
    v.live.sync().unwrap();
    let freed = pool.status().free - before;
    assert_eq!(freed, 4096, "freed");
    assert!(version(&v, "a", 3).is_none());
    for n in [1, 2, 4, 5] {
        assert_eq!(version(&v, "a", n).unwrap().0, states[n as usize - 1], "version {n} after deleting 3");
    }
    assert_eq!(pool.check().problems, Vec::<String>::new());
    assert_eq!(v.live.check().unwrap().problems, Vec::<String>::new());
}

#[test]
fn the_keep_bound_prunes_the_oldest_close_versions() {
    let (_sim, pool, fv) = fresh();
    fv.set_keep(2).unwrap();
    assert!(fv.set_keep(0).is_err() && fv.set_keep(1025).is_err());
    let a = file(&fv, ROOT, "a");
    fv.snap_create("vol").unwrap();
    for i in 0..5u8 {
        fv.write(a, 0, &[i; 10]).unwrap();
        fv.sync().unwrap();
        fv.close_version(a, true).unwrap();
    }
    let v = Versioned::new(fv);
    assert_eq!(listed(&v, "a"), vec!["1", "5", "6"], "the volume snapshot and the last 2 close versions");
    assert_eq!(version(&v, "a", 6).unwrap().0, vec![4u8; 10]);
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

/// The policy is stored in the volume: a bad rule changes nothing, and
/// the rules survive a reopen.
#[test]
fn the_policy_is_kept_in_the_volume() {
    let (sim, pool, fv) = fresh();
    let records = tarn_format::superblock::incompat::FS_VERSION_RECORDS;
    assert!(!pool.has_feature(records));
    fv.policy_add("*.c").unwrap();
    // Enabled with the policy, not by the first close version's batch.
    assert!(pool.has_feature(records));
    fv.policy_add("!tmp/").unwrap();
    assert!(fv.policy_add("a/*.c").is_err());
    assert!(fv.policy_add("*.c").is_err(), "twice");
    assert!(fv.policy_remove("*.h").is_err());
    drop(fv);
    pool.close().unwrap();
    let pool = Arc::new(Pool::open(vec![sim as Arc<dyn Device>], OpenOptions::default()).unwrap());
    let fv = FileVolume::open(pool, "home").unwrap();
    let rules: Vec<String> = fv.policy().unwrap().iter().map(|r| r.text()).collect();
    assert_eq!(rules, vec!["*.c", "!tmp/"]);
    fv.policy_remove("*.c").unwrap();
    assert_eq!(fv.policy().unwrap().len(), 1);
}

/// A power cut anywhere between a close and its version's commit (the
/// close's sync, then the version's one commit): after recovery every
/// version listed is whole (its tag is there and it reads one exact
/// state with that state's size), a version of the new state only
/// exists with the new state committed, and a later change alters no
/// version.
#[test]
fn a_crash_between_a_close_and_its_commit_never_leaves_a_half_version() {
    crash_around_a_close_version(true);
}

/// The same with the version queued behind the data and committed by the
/// next commit (a mount with a commit interval): one commit holds both.
#[test]
fn a_queued_close_version_is_whole_or_absent_after_a_crash() {
    crash_around_a_close_version(false);
}

fn crash_around_a_close_version(durable: bool) {
    let (s0, s1) = (vec![1u8; 5000], vec![2u8; 9000]);
    let mut cut_inside = 0;
    for seed in 0..16u64 {
        let (sim, pool, fv) = fresh();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = file(&fv, ROOT, "a");
        fv.write(a, 0, &s0).unwrap();
        fv.sync().unwrap();
        fv.close_version(a, true).unwrap();
        fv.write(a, 0, &s1).unwrap();
        // Cut after `seed` device writes or flushes: inside the sync, the
        // version's commit, or after both.
        sim.crash_after(seed);
        let done = if durable {
            fv.sync().is_ok() && fv.close_version(a, true).is_ok()
        } else {
            fv.close_version(a, false).is_ok() && fv.sync().is_ok()
        };
        cut_inside += u32::from(!done);
        let (pool, fv) = crash_and_reopen(&sim, &mut rng, fv, pool);
        let list = fv.versions().unwrap();
        assert!(!list.is_empty() && list.len() <= 2, "seed {seed}: {} versions", list.len());
        if done {
            assert_eq!(list.len(), 2, "seed {seed}: a version returned but lost");
        }
        let head = fv.read(a, 0, 1 << 20).unwrap();
        fv.write(a, 0, b"later").unwrap();
        fv.sync().unwrap();
        let v = Versioned::new(fv);
        assert_eq!(version(&v, "a", 1).unwrap().0, s0, "seed {seed}");
        if list.len() == 2 {
            assert_eq!(version(&v, "a", 2).unwrap().0, s1, "seed {seed}: version 2 half there");
            assert_eq!(head, s1, "seed {seed}: a version of a state the head lost");
        }
        assert_eq!(v.live.check().unwrap().problems, Vec::<String>::new(), "seed {seed}");
        assert_eq!(pool.check().problems, Vec::<String>::new(), "seed {seed}");
    }
    // One commit instead of two when queued: fewer device writes to cut in.
    let least = if durable { 8 } else { 4 };
    assert!(cut_inside >= least, "the power was cut inside only {cut_inside} times of 16");
}

/// A close version leaves a clean inode whose epoch already covers the
/// latest volume snapshot unsaved (`save_epoch`), but saves a size a write
/// left pending: a commit that does not save pending inode changes (a
/// back-pressure commit, `Pool::flush` here) right after the version must
/// still not hold a version longer than the file after a crash.
#[test]
fn a_commit_holding_a_close_version_holds_the_size_it_versions() {
    for clean_first in [false, true] {
        let (sim, pool, fv) = fresh();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let a = file(&fv, ROOT, "a");
        fv.write(a, 0, &[1u8; 5000]).unwrap();
        fv.sync().unwrap();
        fv.write(a, 5000, &[2u8; 4000]).unwrap();
        if clean_first {
            // As the mount's times SETATTR at close does: the inode saved.
            fv.setattr(a, &SetAttr { mtime: Some(1), ..Default::default() }).unwrap();
        }
        let n = fv.close_version(a, false).unwrap().number;
        pool.flush().unwrap();
        let (_pool, fv) = crash_and_reopen(&sim, &mut rng, fv, pool);
        assert_eq!(fv.getattr(a).unwrap().inode.size, 9000, "clean first: {clean_first}");
        let v = Versioned::new(fv);
        assert_eq!(version(&v, "a", n).unwrap().0.len(), 9000, "clean first: {clean_first}");
    }
}

/// Deleting a volume snapshot drops another object's tag that only a
/// file version of a different file falls in the range of: a tag's
/// readers are the volume snapshots and its own object's versions.
#[test]
fn another_files_version_keeps_no_tag_alive() {
    let (_sim, pool, fv) = fresh();
    let a = file(&fv, ROOT, "a");
    let b = file(&fv, ROOT, "b");
    fv.write(a, 0, b"a0").unwrap();
    fv.write(b, 0, b"b0").unwrap();
    fv.snap_create("v").unwrap();
    fv.snap_file(a, "").unwrap();
    // b's first change after "v": tag g2 (the header epoch), read by "v".
    fv.write(b, 0, b"b1").unwrap();
    fv.sync().unwrap();
    let id = pool.file_volume("home").unwrap().id;
    let b_obj = fv.getattr(b).unwrap().inode.object;
    let tags = |pool: &tarn_engine::Pool| pool.objects_with_snapshots(id).into_iter().find(|o| o.id == b_obj).unwrap();
    assert_eq!(tags(&pool).snapshots.len(), 1);
    fv.snap_delete("v").unwrap();
    assert!(tags(&pool).snapshots.is_empty(), "b's tag kept alive by a's version");
    let v = Versioned::new(fv);
    assert_eq!(version(&v, "a", 2).unwrap().0, b"a0");
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

/// The rule for versions of deleted files: close versions go with the
/// file's last name (no name leads to them), in the same change, and
/// free what they alone held; a named file snapshot stays; a volume
/// snapshot's `dir@N` still recovers the deleted file.
#[test]
fn a_deleted_file_takes_its_close_versions_with_it() {
    let (_sim, pool, fv) = fresh();
    let sub = fv.create(ROOT, b"sub", tarn_fs::Kind::Dir, 0o755, 1, 2).unwrap().inode.ino;
    let (a, d) = (file(&fv, sub, "a"), file(&fv, sub, "d"));
    fv.write(d, 0, b"dee").unwrap();
    fv.snap_create("vol").unwrap();
    // Made after "vol": no volume snapshot reads c.
    let c = file(&fv, sub, "c");
    for i in 0..3u8 {
        for f in [a, c] {
            fv.write(f, 0, &vec![i; 256 << 10]).unwrap();
            fv.sync().unwrap();
            fv.close_version(f, true).unwrap();
        }
    }
    fv.snap_file(a, "named").unwrap();
    let closes = |fv: &FileVolume, ino: u64| {
        fv.versions().unwrap().iter().filter(|s| s.owner == ino && s.kind == VersionKind::Close).count()
    };
    assert_eq!((closes(&fv, a), closes(&fv, c)), (3, 3));
    let c_obj = fv.getattr(c).unwrap().inode.object;
    let before = pool.status().free;
    for n in ["a", "c", "d"] {
        fv.unlink(sub, n.as_bytes()).unwrap();
    }
    fv.sync().unwrap();
    assert_eq!((closes(&fv, a), closes(&fv, c)), (0, 0), "close versions of deleted files");
    let left: Vec<_> = fv.versions().unwrap().into_iter().map(|s| (s.kind, s.owner)).collect();
    assert_eq!(left, vec![(VersionKind::Volume, 0), (VersionKind::File, a)], "the volume and the named snapshot stay");
    // c's data (3 versions of 256 KiB, made after "vol") is all freed.
    let freed = pool.status().free - before;
    assert!(freed >= 3 * (256 << 10), "freed {freed}");
    let id = pool.file_volume("home").unwrap().id;
    assert!(pool.objects_with_snapshots(id).iter().all(|o| o.id != c_obj), "c's object is gone");
    let v = Versioned::new(fv);
    let old = v.lookup(ROOT, b"sub@1").unwrap().inode.ino;
    let dd = v.lookup(old, b"d").unwrap().inode.ino;
    assert_eq!(v.read(dd, 0, 10).unwrap(), b"dee", "the deleted file from sub@1");
    assert_eq!(pool.check().problems, Vec::<String>::new());
    assert_eq!(v.live.check().unwrap().problems, Vec::<String>::new());
}

/// A crash inside the unlink of a file with close versions (queued with
/// it, committed by the next sync): after it, the file is there with all
/// its versions, or gone with none of its close versions; the named
/// snapshot stays either way; the checkers are clean.
#[test]
fn a_crash_in_an_unlink_keeps_the_file_and_its_versions_together() {
    crash_in_an_unlink(true);
}

/// The same without a named snapshot: the object goes whole with its
/// tags (one VolDelete) and the version records in one change.
#[test]
fn a_crash_in_an_unlink_of_a_file_with_close_versions_only() {
    crash_in_an_unlink(false);
}

fn crash_in_an_unlink(named: bool) {
    let mut cut_inside = 0;
    for seed in 0..16u64 {
        let (sim, pool, fv) = fresh();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = file(&fv, ROOT, "a");
        for i in 0..3u8 {
            fv.write(a, 0, &vec![i; 9000]).unwrap();
            fv.sync().unwrap();
            fv.close_version(a, true).unwrap();
        }
        if named {
            fv.snap_file(a, "named").unwrap();
        }
        let object = fv.getattr(a).unwrap().inode.object;
        sim.crash_after(seed);
        let done = fv.unlink(ROOT, b"a").is_ok() && fv.sync().is_ok();
        cut_inside += u32::from(!done);
        let (pool, fv) = crash_and_reopen(&sim, &mut rng, fv, pool);
        let kinds: Vec<VersionKind> = fv.versions().unwrap().into_iter().map(|s| s.kind).collect();
        let there = fv.lookup(ROOT, b"a").is_ok();
        let closes = kinds.iter().filter(|k| **k == VersionKind::Close).count();
        assert_eq!(closes, if there { 3 } else { 0 }, "seed {seed}: file there {there}");
        assert_eq!(kinds.contains(&VersionKind::File), named, "seed {seed}: the named snapshot");
        let id = pool.file_volume("home").unwrap().id;
        let object_there = pool.objects_with_snapshots(id).iter().any(|o| o.id == object);
        assert_eq!(object_there, there || named, "seed {seed}: the object (with its tags)");
        if done {
            assert!(!there, "seed {seed}: an unlink returned and synced but the file is back");
        }
        assert_eq!(fv.check().unwrap().problems, Vec::<String>::new(), "seed {seed}");
        assert_eq!(pool.check().problems, Vec::<String>::new(), "seed {seed}");
    }
    assert!(cut_inside >= 2, "the power was cut inside only {cut_inside} times of 16");
}

/// A clone starts with no version log: the origin's close version
/// records are not the clone's (its `foo@` lists none of them), its own
/// close versions go to a log of its own, and deleting them leaves the
/// origin's versions alone.
#[test]
fn a_clone_has_a_version_log_of_its_own() {
    let (_sim, pool, fv) = fresh();
    let a = file(&fv, ROOT, "a");
    for i in 0..2u8 {
        fv.write(a, 0, &[i; 100]).unwrap();
        fv.close_version(a, true).unwrap();
    }
    fv.snap_create("s").unwrap();
    FileVolume::clone_snapshot(pool.clone(), "home", "s", "copy").unwrap();
    let c = FileVolume::open(pool.clone(), "copy").unwrap();
    assert!(c.versions().unwrap().is_empty(), "the origin's versions in the clone");
    c.write(a, 0, b"clone").unwrap();
    c.close_version(a, true).unwrap();
    let mine: Vec<u64> = c.versions().unwrap().iter().map(|s| s.number).collect();
    assert_eq!(mine, vec![4], "the clone's own close version, numbered on from the origin's counter");
    c.delete_version(4).unwrap();
    let v = Versioned::new(c);
    assert!(v.lookup(ROOT, b"a@4").is_err());
    assert_eq!(fv.versions().unwrap().len(), 3, "the origin keeps its two close versions and its snapshot");
    let o = Versioned::new(fv);
    assert_eq!(version(&o, "a", 2).unwrap().0, vec![1u8; 100]);
    assert_eq!(v.live.check().unwrap().problems, Vec::<String>::new());
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

/// What a close version costs beyond the same unversioned edit (the
/// measure of bench/fs_close_versions.sh, on the sim pool, after a
/// checkpoint): the 4 KiB data block it keeps plus metadata, under the
/// issue's 200 bytes: the record, the tag's catalog entry and its dead
/// list kept there (INLINE_DEAD_LISTS). With the dead list a node of its
/// own it was about 4.2 KiB, as a table snapshot about 12 KiB
/// (docs/ARCHITECTURE.md, *Close versions as records*). 1,000 edits, so
/// the 4 KiB granularity of pool figures is 4 bytes a version.
#[test]
fn a_close_version_costs_its_block_and_under_200_bytes_of_metadata() {
    let (_sim, pool, fv) = fresh();
    fv.set_keep(1024).unwrap();
    let (o, c) = (file(&fv, ROOT, "o"), file(&fv, ROOT, "c"));
    for f in [o, c] {
        fv.write(f, 0, &vec![1u8; 1 << 20]).unwrap();
    }
    fv.sync().unwrap();
    let cost = |pool: &Pool| {
        pool.checkpoint().unwrap();
        let s = pool.status();
        (s.used + s.metadata) as i64
    };
    let edits = 1000;
    let c0 = cost(&pool);
    for k in 0..edits {
        fv.write(o, (k % 256) * 4096, &[k as u8; 4096]).unwrap();
        fv.sync().unwrap();
    }
    let c1 = cost(&pool);
    for k in 0..edits {
        fv.write(c, (k % 256) * 4096, &[k as u8; 4096]).unwrap();
        fv.close_version(c, true).unwrap();
    }
    let c2 = cost(&pool);
    let metadata = ((c2 - c1) - (c1 - c0)) / edits as i64 - 4096;
    println!("metadata per close version: {metadata} bytes");
    assert!((0..200).contains(&metadata), "{metadata} bytes of metadata per close version");
}

/// `rm foo@/N` on a mount is a namespace change like an unlink: made at
/// once (the version is gone from `foo@`), durable with the next commit.
/// A power cut before that commit brings the version back whole, with
/// the volume as at the last commit; after a sync it stays gone.
#[test]
fn a_version_deleted_from_the_mount_is_durable_with_the_next_commit() {
    for synced in [false, true] {
        let (sim, pool, fv) = fresh();
        let mut rng = ChaCha8Rng::seed_from_u64(u64::from(synced));
        let a = file(&fv, ROOT, "a");
        for k in 0..2u8 {
            fv.write(a, 0, &[k; 100]).unwrap();
            fv.close_version(a, true).unwrap();
        }
        let v = Versioned::new(fv);
        v.remove_version(a, b"1").unwrap();
        assert!(version(&v, "a", 1).is_none(), "gone at once");
        if synced {
            v.live.sync().unwrap();
        }
        let fv = std::sync::Arc::try_unwrap(v.live).ok().expect("the only handle");
        let (pool, fv) = crash_and_reopen(&sim, &mut rng, fv, pool);
        let v = Versioned::new(fv);
        let want = (!synced).then(|| vec![0u8; 100]);
        assert_eq!(version(&v, "a", 1).map(|x| x.0), want, "synced {synced}");
        assert_eq!(version(&v, "a", 2).unwrap().0, vec![1u8; 100]);
        assert_eq!(v.live.check().unwrap().problems, Vec::<String>::new());
        drop(v);
        assert_eq!(pool.check().problems, Vec::<String>::new());
    }
}
