//! Write-behind (`writebehind.rs`): file data written by a thread of its
//! own. On a simulated device whose data writes are slow, so that writes
//! really wait in the queue, every reader, size, snapshot, delete and
//! fsync must see them as if written at once.

mod common;

use common::{crash_and_reopen, file, fresh, MIB};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use tarn_fs::{FileVolume, FsError, SetAttr, ROOT};

/// Data writes (64 KiB and up) take a millisecond each on the device.
const SLOW_FROM: usize = 64 << 10;

fn truncate(fv: &FileVolume, ino: u64, size: u64) {
    let s = SetAttr { perm: None, uid: None, gid: None, size: Some(size), atime: None, mtime: None };
    fv.setattr(ino, &s).unwrap();
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

/// Apply a write to the model of a file.
fn model_write(m: &mut Vec<u8>, off: usize, data: &[u8]) {
    if m.len() < off + data.len() {
        m.resize(off + data.len(), 0);
    }
    m[off..off + data.len()].copy_from_slice(data);
}

/// Random writes, overwrites, truncates, reads and unlinks: every read
/// matches the model while writes wait in the queue, and the writer did
/// queue (the test is not served by writes made at once). (Without the
/// settle in `FileVolume::read` it fails.)
#[test]
fn reads_truncates_and_unlinks_see_queued_writes() {
    let (sim, pool, mut fv) = fresh();
    fv.start_write_behind(8 * MIB as usize).unwrap();
    sim.slow_writes_from(SLOW_FROM);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut files: Vec<(String, u64, Vec<u8>)> = Vec::new();
    for n in 0..12 {
        let name = format!("f{n}");
        files.push((name.clone(), file(&fv, ROOT, &name), Vec::new()));
    }
    for step in 0..300u64 {
        let k = rng.random_range(0..files.len());
        let (name, ino, model) = &mut files[k];
        match rng.random_range(0..10) {
            0..=5 => {
                let len = rng.random_range(1..(1 << 20));
                let off = rng.random_range(0..(2 << 20)) / 4096 * 4096 + rng.random_range(0..2) * 100;
                let data = pattern(step, len);
                fv.write(*ino, off as u64, &data).unwrap();
                model_write(model, off, &data);
            }
            6 => {
                let size = rng.random_range(0..model.len().max(1));
                truncate(&fv, *ino, size as u64);
                model.truncate(size);
            }
            7 => {
                fv.unlink(ROOT, name.as_bytes()).unwrap();
                *ino = file(&fv, ROOT, name);
                model.clear();
            }
            _ => {
                let got = fv.read(*ino, 0, model.len() as u32 + 10).unwrap();
                assert!(got == *model, "step {step}: {name} reads {} bytes unlike its model", got.len());
                assert_eq!(fv.getattr(*ino).unwrap().inode.size, model.len() as u64);
            }
        }
    }
    let stats = fv.write_behind_stats().unwrap();
    assert!(stats.queued > 50, "only {} writes were queued", stats.queued);
    for (name, ino, model) in &files {
        assert!(fv.read(*ino, 0, model.len() as u32 + 10).unwrap() == *model, "{name} at the end");
    }
    fv.sync().unwrap();
    assert_eq!(fv.check().unwrap().problems, Vec::<String>::new());
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

/// fsync'd data survives a crash with writes queued behind it; what was
/// written after the last fsync is lost or whole per file, and the volume
/// checks clean. (Without the settle before a file's record is saved
/// (`FileVolume::save`) and the `settle_all` of `save_dirty`, the fsync
/// commits sizes over data still queued: the files read zeros after the
/// crash and this test fails, as does the next one.)
#[test]
fn fsync_is_durable_across_a_crash_with_writes_queued() {
    for seed in 0..6u64 {
        let (sim, pool, mut fv) = fresh();
        fv.start_write_behind(8 * MIB as usize).unwrap();
        sim.slow_writes_from(SLOW_FROM);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        for n in 0..6 {
            let ino = file(&fv, ROOT, &format!("f{n}"));
            let data = pattern(seed * 100 + n, rng.random_range(64 << 10..(1 << 20)));
            fv.write(ino, 0, &data).unwrap();
            model.insert(ino, data);
        }
        let last = *model.keys().max().unwrap();
        fv.fsync(last).unwrap();
        // More, never synced: queued when the power goes.
        for (&ino, _) in model.iter().filter(|(i, _)| **i % 2 == 0) {
            fv.write(ino, 1 << 20, &pattern(seed * 1000 + ino, 512 << 10)).unwrap();
        }
        let mut crash_rng = ChaCha8Rng::seed_from_u64(seed);
        let (_pool, fv) = crash_and_reopen(&sim, &mut crash_rng, fv, pool);
        for (ino, want) in &model {
            let got = fv.read(*ino, 0, want.len() as u32).unwrap();
            assert!(got == *want, "seed {seed}: inode {ino}'s fsync'd data is not what was written");
        }
        assert_eq!(fv.check().unwrap().problems, Vec::<String>::new(), "seed {seed}");
    }
}

/// A volume snapshot and a file's own snapshot hold every byte written
/// before them, queued or not; writes after them do not show there.
#[test]
fn snapshots_hold_what_was_queued_before_them() {
    let (sim, pool, mut fv) = fresh();
    fv.start_write_behind(8 * MIB as usize).unwrap();
    sim.slow_writes_from(SLOW_FROM);
    let ino = file(&fv, ROOT, "f");
    let before = pattern(1, 3 << 20);
    for (i, chunk) in before.chunks(1 << 20).enumerate() {
        fv.write(ino, (i as u64) << 20, chunk).unwrap();
    }
    fv.snap_create("s1").unwrap();
    let own = fv.snap_file(ino, "mine").unwrap();
    fv.write(ino, 0, &pattern(2, 1 << 20)).unwrap();
    let snap = FileVolume::open_snapshot(pool.clone(), "home", "s1").unwrap();
    assert!(snap.read(ino, 0, 3 << 20).unwrap() == before, "the volume snapshot misses queued data");
    let versions = fv.versions().unwrap();
    assert!(versions.iter().any(|v| v.number == own.number), "the file's snapshot is listed");
    assert!(fv.read(ino, 0, 1 << 20).unwrap() == pattern(2, 1 << 20));
    fv.sync().unwrap();
    assert_eq!(fv.check().unwrap().problems, Vec::<String>::new());
}

/// A write the writer cannot make is made again by the next settler; one
/// that fails there too fails the file's next fsync (once), as a lost
/// writeback does, and nothing else.
#[test]
fn a_write_lost_behind_fails_the_files_fsync() {
    let (sim, _pool, mut fv) = fresh();
    fv.start_write_behind(8 * MIB as usize).unwrap();
    let ino = file(&fv, ROOT, "f");
    let other = file(&fv, ROOT, "g");
    fv.write(other, 0, &pattern(3, 256 << 10)).unwrap();
    fv.sync().unwrap();
    sim.fail_writes_from(SLOW_FROM);
    fv.write(ino, 0, &pattern(4, 256 << 10)).unwrap();
    let e = fv.fsync(ino).unwrap_err();
    assert!(matches!(e, FsError::Engine(_)), "fsync says {e:?}");
    sim.fail_writes_from(0);
    let stats = fv.write_behind_stats().unwrap();
    assert_eq!(stats.lost, 1, "{stats:?}");
    fv.fsync(ino).unwrap();
    fv.fsync(other).unwrap();
    assert!(fv.read(other, 0, 256 << 10).unwrap() == pattern(3, 256 << 10));
}

/// A file deleted while its data waits in the queue: those writes are
/// dropped unwritten (counted), the other files' queued data lands, and
/// the space, volume and pool check clean; a file unlinked while held
/// open keeps its queued data readable until it is freed.
#[test]
fn a_deleted_files_queued_writes_are_dropped() {
    let (sim, pool, mut fv) = fresh();
    fv.start_write_behind(32 * MIB as usize).unwrap();
    sim.slow_writes_from(SLOW_FROM);
    let (gone, kept, held) = (file(&fv, ROOT, "gone"), file(&fv, ROOT, "kept"), file(&fv, ROOT, "held"));
    let data = pattern(5, 2 << 20);
    let write_all = |ino: u64| {
        for (i, chunk) in data.chunks(256 << 10).enumerate() {
            fv.write(ino, (i as u64) << 18, chunk).unwrap();
        }
    };
    write_all(gone);
    fv.unlink(ROOT, b"gone").unwrap();
    write_all(held);
    fv.opened(held);
    fv.unlink(ROOT, b"held").unwrap();
    write_all(kept);
    let dropped = fv.write_behind_stats().unwrap().discarded;
    assert!(dropped > 0, "no queued write of the deleted file was dropped");
    assert!(fv.read(held, 0, 2 << 20).unwrap() == data, "an open unlinked file lost its queued data");
    fv.released(held).unwrap();
    assert!(fv.read(kept, 0, 2 << 20).unwrap() == data);
    fv.sync().unwrap();
    assert_eq!(fv.check().unwrap().problems, Vec::<String>::new());
    assert_eq!(pool.check().problems, Vec::<String>::new());
}
