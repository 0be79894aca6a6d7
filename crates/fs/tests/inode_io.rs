//! The inode I/O a request costs: an inode saved or read once is read
//! again from memory, and a times-only setattr (one per close of a
//! written file under the writeback cache) waits with the pending size
//! and mtime for the next sync, yet is durable once that returns.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tarn_engine::{Device, OpenOptions, Pool};
use tarn_fs::{FileVolume, Kind, SetAttr, ROOT};

mod common;
use common::{file, fresh, MIB};

fn reopen(sim: &Arc<tarn_sim::SimDevice>) -> FileVolume {
    let pool = Arc::new(Pool::open(vec![sim.clone() as Arc<dyn Device>], OpenOptions::default()).unwrap());
    FileVolume::open(pool, "home").unwrap()
}

#[test]
fn an_inode_saved_or_read_once_is_not_read_from_the_device_again() {
    let (sim, _pool, fv) = fresh();
    let saved = file(&fv, ROOT, "saved");
    fv.setattr(saved, &SetAttr { perm: Some(0o600), ..Default::default() }).unwrap();
    let d = fv.create(ROOT, b"d", Kind::Dir, 0o750, 3, 4).unwrap().inode.ino;
    fv.sync().unwrap();
    // A fresh open reads the records from the device once.
    let fv = reopen(&sim);
    assert_eq!(fv.getattr(d).unwrap().inode.perm, 0o750);
    sim.fail_range(0, 256 * MIB, true, false);
    assert_eq!(fv.getattr(d).unwrap().inode.uid, 3, "read once, kept");
    let a = fv.setattr(saved, &SetAttr { uid: Some(7), ..Default::default() });
    // The save's read-modify-write of the table block may fail here; if
    // it did, the record must not be kept as if written.
    match a {
        Ok(_) => assert_eq!(fv.getattr(saved).unwrap().inode.uid, 7),
        Err(_) => assert!(fv.getattr(saved).is_err(), "a failed save is not kept"),
    }
    sim.clear_faults();
    assert_eq!(fv.getattr(saved).unwrap().inode.perm, 0o600);
}

#[test]
fn what_the_cache_shows_is_what_a_reopen_reads() {
    let (sim, _pool, fv) = fresh();
    let a = file(&fv, ROOT, "a");
    let b = file(&fv, ROOT, "b");
    let d = fv.create(ROOT, b"d", Kind::Dir, 0o755, 0, 0).unwrap().inode.ino;
    fv.write(a, 0, &[1u8; 10_000]).unwrap();
    fv.link(a, d, b"a2").unwrap();
    fv.rename(ROOT, b"b", d, b"b").unwrap();
    fv.setattr(b, &SetAttr { size: Some(77), ..Default::default() }).unwrap();
    fv.unlink(ROOT, b"a").unwrap();
    fv.setattr(a, &SetAttr { mtime: Some(123), ..Default::default() }).unwrap();
    let gone = file(&fv, ROOT, "gone");
    fv.unlink(ROOT, b"gone").unwrap();
    fv.sync().unwrap();
    let live: Vec<_> = [ROOT, a, b, d].iter().map(|&i| fv.getattr(i).unwrap().inode).collect();
    assert!(fv.getattr(gone).is_err());
    let again = reopen(&sim);
    let read: Vec<_> = [ROOT, a, b, d].iter().map(|&i| again.getattr(i).unwrap().inode).collect();
    assert_eq!(live, read);
    assert!(again.getattr(gone).is_err());
    assert_eq!((read[1].nlink, read[1].size, read[1].mtime), (1, 10_000, 123));
}

#[test]
fn a_times_only_setattr_writes_nothing_until_the_next_sync() {
    let (sim, pool, fv) = fresh();
    let f = file(&fv, ROOT, "f");
    fv.write(f, 0, b"data").unwrap();
    fv.sync().unwrap();
    // Any device write from here on fails (the power is cut).
    sim.crash_after(0);
    let a = fv.setattr(f, &SetAttr { atime: Some(5), mtime: Some(6), ..Default::default() }).unwrap();
    assert_eq!((a.inode.atime, a.inode.mtime), (5, 6));
    assert_eq!(fv.getattr(f).unwrap().inode.mtime, 6);
    assert!(fv.setattr(f, &SetAttr { perm: Some(0o600), ..Default::default() }).is_err(), "other changes write");
    drop(fv);
    drop(pool);
    sim.crash(&mut ChaCha8Rng::seed_from_u64(1));
    let fv = reopen(&sim);
    assert_ne!(fv.getattr(f).unwrap().inode.mtime, 6, "never synced");
    // Synced, the times are durable.
    fv.setattr(f, &SetAttr { mtime: Some(9), ..Default::default() }).unwrap();
    fv.sync().unwrap();
    drop(fv);
    sim.crash(&mut ChaCha8Rng::seed_from_u64(2));
    assert_eq!(reopen(&sim).getattr(f).unwrap().inode.mtime, 9);
}

#[test]
fn a_create_or_unlink_leaves_the_directory_record_to_the_next_sync_unless_its_links_change() {
    let (sim, pool, fv) = fresh();
    let d = fv.create(ROOT, b"d", Kind::Dir, 0o755, 0, 0).unwrap().inode.ino;
    file(&fv, d, "first");
    fv.sync().unwrap();
    // The same change but for the parent's link count (a new directory
    // links `..` to it): only that one must write the parent's record.
    let queued = |f: &dyn Fn()| {
        fv.sync().unwrap();
        f();
        pool.pending().ops
    };
    let by_create = queued(&|| {
        file(&fv, d, "f");
    });
    let by_mkdir = queued(&|| drop(fv.create(d, b"sub", Kind::Dir, 0o755, 0, 0).unwrap()));
    assert!(by_create < by_mkdir, "create queued {by_create} ops, mkdir {by_mkdir}");
    let by_unlink = queued(&|| fv.unlink(d, b"f").unwrap());
    let by_rmdir = queued(&|| fv.rmdir(d, b"sub").unwrap());
    assert!(by_unlink < by_rmdir, "unlink queued {by_unlink} ops, rmdir {by_rmdir}");
    // Shown at once, durable at the sync.
    file(&fv, d, "last");
    let shown = fv.getattr(d).unwrap().inode;
    assert_eq!(shown.nlink, 2);
    fv.sync().unwrap();
    drop(fv);
    drop(pool);
    sim.crash(&mut ChaCha8Rng::seed_from_u64(3));
    let fv = reopen(&sim);
    assert_eq!(fv.getattr(d).unwrap().inode, shown);
    assert_eq!(fv.check().unwrap().problems, Vec::<String>::new());
}
