//! The checksum tree against a flat model (one optional sum per block):
//! random runs of sums set per block, buffered, merged by checkpoints of
//! many chunks while sets go on, read live and reopened cold.

mod common;

use common::{Rng, TestAlloc};
use std::sync::Arc;
use tarn_format::Pba;
use tarn_store::cache::MIN_CACHE_BYTES;
use tarn_store::{BlockSum, MemIo, Store, SumsTree};

/// Blocks 0..BLOCKS of device 1 (device bits in the key: not block 0 of the tree).
const BLOCKS: u64 = 200_000;

fn sums(tree: &SumsTree, store: &Store) -> Vec<Option<BlockSum>> {
    tree.get_run(store, Pba::new(1, 0), BLOCKS).unwrap()
}

/// The sums of a run as the tree returns them.
fn per_block(sums: &[Option<u32>]) -> Vec<Option<BlockSum>> {
    sums.iter().map(|s| s.map(BlockSum::Block)).collect()
}

/// Set the model like the tree: a coarse group replaces the sums of its
/// 16 blocks; a sum per block over a coarse group leaves the group's other
/// blocks without one.
fn model_set(model: &mut [Option<BlockSum>], at: u64, run: &[u32]) {
    for (i, &s) in run.iter().enumerate() {
        let b = at as usize + i;
        let g = b / 16 * 16;
        if matches!(model[b], Some(BlockSum::Group(_))) {
            model[g..g + 16].iter_mut().for_each(|m| *m = None);
        }
        model[b] = Some(BlockSum::Block(s));
    }
}

#[test]
fn per_block_sums_match_a_flat_model_across_checkpoints() {
    let io = Arc::new(MemIo::default());
    let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
    let mut tree = SumsTree::new(&store, 4);
    let mut model: Vec<Option<BlockSum>> = vec![None; BLOCKS as usize];
    let (mut rng, mut alloc) = (Rng(0x5u64 << 40 | 17), TestAlloc::default());
    let mut frozen = None;
    for step in 0..30_000u64 {
        // Mostly single blocks anywhere (overwrites in place), some runs.
        // Mostly single blocks anywhere (overwrites in place), some runs,
        // some coarse groups (whole groups of sequential data).
        let len = if rng.below(4) == 0 { 1 + rng.below(40) } else { 1 };
        let at = rng.below(BLOCKS - len);
        let run: Vec<u32> = (0..len).map(|_| rng.step() as u32).collect();
        if rng.below(8) == 0 {
            let key = at / 16;
            let crcs = &run[..run.len().min((BLOCKS / 16 - key) as usize)];
            tree.set_groups(Pba::new(1, key * 16), crcs);
            for (k, &c) in (key as usize..).zip(crcs) {
                model[k * 16..k * 16 + 16].iter_mut().for_each(|m| *m = Some(BlockSum::Group(c)));
            }
        } else {
            tree.set(Pba::new(1, at), &run);
            model_set(&mut model, at, &run);
        }
        if step % 10_000 == 4_999 {
            frozen = Some((tree.freeze(), model.clone()));
        }
        if step % 10_000 == 9_999 {
            let (f, then) = frozen.take().unwrap();
            assert!(f.len() > 2 * 2_048, "{} groups and blocks: a merge of several chunks", f.len());
            let merged = f.write(&store, &mut alloc, step).unwrap();
            let cold = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
            assert_eq!(sums(&SumsTree::open(&cold, 4, merged.root).unwrap(), &cold), then, "reopened at {step}");
            assert_eq!(sums(&tree, &store), model, "live before adopt at {step}");
            assert!(tree.adopt(&f, &merged));
            assert_eq!(sums(&tree, &store), model, "live after adopt at {step}");
        }
        if step % 1_009 == 0 {
            let got = sums(&tree, &store);
            if let Some(i) = (0..model.len()).find(|&i| got[i] != model[i]) {
                panic!(
                    "live at {step}: block {i}: {:?} against the model {:?}",
                    &got[i / 16 * 16..i / 16 * 16 + 16],
                    &model[i / 16 * 16..i / 16 * 16 + 16]
                );
            }
        }
    }
    let f = tree.freeze();
    let merged = f.write(&store, &mut alloc, 1 << 20).unwrap();
    assert!(tree.adopt(&f, &merged));
    assert_eq!(store.buffered_bytes(), 0, "every buffered sum was merged");
    assert_eq!(sums(&tree, &store), model);
    assert_eq!(tree.get_run(&store, Pba::new(0, 0), 64).unwrap(), vec![None; 64], "another device has none");
}

/// Sums frozen by a checkpoint that never became durable are frozen again,
/// under the newer ones: nothing is lost, the newest sum wins.
#[test]
fn an_unadopted_freeze_is_handed_again_under_newer_sums() {
    let store = Store::new(Arc::new(MemIo::default()), MIN_CACHE_BYTES).unwrap();
    let mut tree = SumsTree::new(&store, 4);
    // Blocks 30..33 single; group 3 (blocks 48..64) whole.
    tree.set(Pba::new(1, 30), &[1, 2, 3]);
    tree.set(Pba::new(1, 48), &[5; 16]);
    let lost = tree.freeze();
    // Newer: a single block in the old group, a group over an old block.
    tree.set(Pba::new(1, 31), &[9]);
    tree.set(Pba::new(1, 50), &[7]);
    tree.set(Pba::new(1, 32), &[6; 16]);
    let again = tree.freeze();
    assert!(!tree.adopt(&lost, &Default::default()), "a superseded freeze is not adopted");
    let mut want: Vec<Option<u32>> = vec![Some(1), Some(9)];
    want.extend([Some(6); 16]);
    want.extend([Some(5); 16]);
    want[50 - 30] = Some(7);
    let want = per_block(&want);
    assert_eq!(tree.get_run(&store, Pba::new(1, 30), 34).unwrap(), want, "live, before the merge");
    let merged = again.write(&store, &mut TestAlloc::default(), 1).unwrap();
    assert!(tree.adopt(&again, &merged));
    assert_eq!(tree.get_run(&store, Pba::new(1, 30), 34).unwrap(), want, "merged");
    assert_eq!(store.buffered_bytes(), 0);
}

/// A run of new data fills whole groups: buffered per group, not per
/// block (a sixth of the memory); single blocks stay single.
#[test]
fn runs_are_buffered_per_group_and_single_blocks_per_block() {
    let store = Store::new(Arc::new(MemIo::default()), MIN_CACHE_BYTES).unwrap();
    let mut tree = SumsTree::new(&store, 4);
    let run: Vec<u32> = (0..160).collect();
    tree.set(Pba::new(1, 320), &run);
    assert_eq!(tree.len(), 10, "160 blocks from a group boundary: 10 groups");
    let per_group = store.buffered_bytes();
    tree.set(Pba::new(1, 5_000), &[1]);
    tree.set(Pba::new(1, 6_000), &[2]);
    assert_eq!(tree.len(), 12);
    assert!(store.buffered_bytes() - per_group < per_group / 10 * 2, "two single blocks cost less than two groups");
    // Three blocks of one group become a group entry.
    tree.set(Pba::new(1, 6_001), &[3, 4]);
    assert_eq!(tree.len(), 12);
    assert_eq!(tree.get_run(&store, Pba::new(1, 5_999), 4).unwrap(), per_block(&[None, Some(2), Some(3), Some(4)]));
}
