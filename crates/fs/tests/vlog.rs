//! Compaction of the version log (crates/fs `logcompact.rs`): a volume
//! that prunes its close versions keeps a log the size of what it keeps,
//! every version still reads its own state after records moved, and a
//! power cut inside a compaction step leaves the log as before or after
//! it, never a record twice or lost.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::sync::Arc;
use tarn_fs::{FileVolume, VersionKind, Versioned, ROOT};

mod common;
use common::{close_and_reopen, crash_and_reopen, file, fresh};

/// The numbers of the volume's close versions, as listed.
fn closes(fv: &FileVolume) -> Vec<u64> {
    let list = fv.versions().unwrap();
    list.iter().filter(|s| s.kind == VersionKind::Close).map(|s| s.number).collect()
}

/// The close versions a test expects: the file each is of, and the state
/// it holds (only those the keep bound keeps).
#[derive(Default)]
struct Expected {
    names: BTreeMap<u64, &'static str>,
    want: BTreeMap<u64, Vec<u8>>,
}

impl Expected {
    fn took(&mut self, n: u64, file: &'static str, data: Vec<u8>) {
        self.names.insert(n, file);
        self.want.insert(n, data);
    }

    /// Every expected close version reads its state, listed once each,
    /// in number order, and the checker finds nothing.
    fn check(&self, fv: FileVolume, at: &str) -> FileVolume {
        // The checker first: it must see a record twice on its own.
        assert_eq!(fv.check().unwrap().problems, Vec::<String>::new(), "{at}");
        let got = closes(&fv);
        assert_eq!(got, self.want.keys().copied().collect::<Vec<_>>(), "{at}: the close versions listed");
        let v = Versioned::new(fv);
        for (n, data) in &self.want {
            let name = format!("{}@{n}", self.names[n]);
            let ino = v.lookup(ROOT, name.as_bytes()).unwrap().inode.ino;
            assert_eq!(&v.read(ino, 0, 1 << 16).unwrap(), data, "{at}: {name}");
        }
        Arc::try_unwrap(v.live).ok().expect("the test holds the only handle")
    }
}

/// File b keeps two close versions at the front of the log while file a
/// is edited 3,000 times with two kept: the log, 3,002 slots without
/// compaction, stays within a step of the bound; every kept version
/// reads its state, also after a reopen; deleting a moved version frees
/// it.
#[test]
fn a_pruned_log_stays_the_size_of_what_it_keeps() {
    let (sim, pool, fv) = fresh();
    fv.set_keep(2).unwrap();
    let (a, b) = (file(&fv, ROOT, "a"), file(&fv, ROOT, "b"));
    let mut e = Expected::default();
    for k in 0..2u8 {
        fv.write(b, 0, &[k; 100]).unwrap();
        let n = fv.close_version(b, false).unwrap().number;
        e.took(n, "b", vec![k; 100]);
    }
    let mut most = 0;
    for k in 0..3000u32 {
        let data = k.to_le_bytes().repeat(25);
        fv.write(a, 0, &data).unwrap();
        let n = fv.close_version(a, k % 100 == 99).unwrap().number;
        e.took(n, "a", data);
        most = most.max(fv.version_log_slots());
    }
    let a_numbers: Vec<u64> = e.names.iter().filter(|(_, f)| **f == "a").map(|(n, _)| *n).collect();
    for n in &a_numbers[..a_numbers.len() - 2] {
        e.want.remove(n);
    }
    let bound = 2 * tarn_fs::MIN_FREE as u32 + tarn_fs::STEP as u32;
    assert!(most <= bound, "the log grew to {most} slots (bound {bound}) for {} versions", e.want.len());
    fv.sync().unwrap();
    let fv = e.check(fv, "after 3,000 edits");
    let (pool, fv) = close_and_reopen(&sim, fv, pool);
    let fv = e.check(fv, "after a reopen");
    let newest = *e.want.keys().last().unwrap();
    fv.delete_version(newest).unwrap();
    e.want.remove(&newest);
    let fv = e.check(fv, "after deleting the newest");
    drop(fv);
    assert_eq!(pool.check().problems, Vec::<String>::new());
}

/// A power cut at each of 16 points of the close whose change carries a
/// compaction step (b's two versions at slots 0 and 1, a's one kept
/// version moved from the end of the log to slot 2): after recovery
/// every version that was there before is there once and reads its
/// state, and the new one is whole or absent.
#[test]
fn a_crash_in_a_compaction_step_loses_and_doubles_no_record() {
    let mut cut_inside = 0;
    for seed in 0..16u64 {
        let (sim, pool, fv) = fresh();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        fv.set_keep(1).unwrap();
        let (a, b) = (file(&fv, ROOT, "a"), file(&fv, ROOT, "b"));
        let mut e = Expected::default();
        let b2 = file(&fv, ROOT, "b2");
        for (f, name) in [(b, "b"), (b2, "b2")] {
            fv.write(f, 0, name.as_bytes()).unwrap();
            let n = fv.close_version(f, false).unwrap().number;
            e.took(n, name, name.as_bytes().to_vec());
        }
        let mut last = 0;
        // One short of the step: 1,024 freed slots make it due.
        for k in 0..(tarn_fs::MIN_FREE as u32) {
            fv.write(a, 0, &k.to_le_bytes()).unwrap();
            last = fv.close_version(a, false).unwrap().number;
            e.names.insert(last, "a");
        }
        fv.sync().unwrap();
        let slots = fv.version_log_slots();
        assert_eq!(slots, 2 + tarn_fs::MIN_FREE as u32, "seed {seed}: no step yet");
        e.want.insert(last, (tarn_fs::MIN_FREE as u32 - 1).to_le_bytes().to_vec());
        fv.write(a, 0, b"new!").unwrap();
        sim.crash_after(seed);
        let done = match fv.close_version(a, true) {
            Ok(v) => Some(v.number),
            Err(_) => None,
        };
        cut_inside += u32::from(done.is_none());
        let (pool, fv) = crash_and_reopen(&sim, &mut rng, fv, pool);
        let after = fv.version_log_slots();
        let listed = closes(&fv);
        if let Some(n) = done {
            assert_eq!(after, 3, "seed {seed}: the step returned but the log was not packed");
            e.want.remove(&last);
            e.took(n, "a", b"new!".to_vec());
        } else if listed.contains(&(last + 1)) {
            e.want.remove(&last);
            e.took(last + 1, "a", b"new!".to_vec());
        } else {
            assert_eq!(after, slots, "seed {seed}: the step without its version");
        }
        let fv = e.check(fv, &format!("seed {seed}"));
        drop(fv);
        assert_eq!(pool.check().problems, Vec::<String>::new(), "seed {seed}");
    }
    assert!(cut_inside >= 8, "the power was cut inside only {cut_inside} times of 16");
}
