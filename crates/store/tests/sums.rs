//! The checksum tree against a flat model (one optional sum per block):
//! random runs of sums set per block, buffered, merged by checkpoints of
//! many chunks while sets go on, read live and reopened cold.

mod common;

use common::{Rng, TestAlloc};
use std::sync::Arc;
use tarn_format::Pba;
use tarn_store::cache::MIN_CACHE_BYTES;
use tarn_store::{MemIo, Store, SumsTree};

/// Blocks 0..BLOCKS of device 1 (device bits in the key: not block 0 of the tree).
const BLOCKS: u64 = 20_000;

fn sums(tree: &SumsTree, store: &Store) -> Vec<Option<u32>> {
    tree.get_run(store, Pba::new(1, 0), BLOCKS).unwrap()
}

#[test]
fn per_block_sums_match_a_flat_model_across_checkpoints() {
    let io = Arc::new(MemIo::default());
    let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
    let mut tree = SumsTree::new(&store, 4);
    let mut model: Vec<Option<u32>> = vec![None; BLOCKS as usize];
    let (mut rng, mut alloc) = (Rng(0x5u64 << 40 | 17), TestAlloc::default());
    let mut frozen = None;
    for step in 0..30_000u64 {
        // Mostly single blocks anywhere (overwrites in place), some runs.
        let len = if rng.below(4) == 0 { 1 + rng.below(40) } else { 1 };
        let at = rng.below(BLOCKS - len);
        let run: Vec<u32> = (0..len).map(|_| rng.step() as u32).collect();
        tree.set(Pba::new(1, at), &run);
        run.iter().enumerate().for_each(|(i, &s)| model[(at as usize) + i] = Some(s));
        if step % 10_000 == 4_999 {
            frozen = Some((tree.freeze(), model.clone()));
        }
        if step % 10_000 == 9_999 {
            let (f, then) = frozen.take().unwrap();
            assert!(f.len() > 4_096, "{} sums: a merge of several chunks", f.len());
            let merged = f.write(&store, &mut alloc, step).unwrap();
            let cold = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
            assert_eq!(sums(&SumsTree::open(&cold, 4, merged.root).unwrap(), &cold), then, "reopened at {step}");
            assert_eq!(sums(&tree, &store), model, "live before adopt at {step}");
            assert!(tree.adopt(&f, &merged));
            assert_eq!(sums(&tree, &store), model, "live after adopt at {step}");
        }
        if step % 1_009 == 0 {
            assert_eq!(sums(&tree, &store), model, "live at {step}");
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
    tree.set(Pba::new(1, 30), &[1, 2, 3]);
    let lost = tree.freeze();
    tree.set(Pba::new(1, 31), &[9]);
    let again = tree.freeze();
    assert_eq!(again.len(), 3);
    assert!(!tree.adopt(&lost, &Default::default()), "a superseded freeze is not adopted");
    let merged = again.write(&store, &mut TestAlloc::default(), 1).unwrap();
    assert!(tree.adopt(&again, &merged));
    assert_eq!(tree.get_run(&store, Pba::new(1, 30), 3).unwrap(), vec![Some(1), Some(9), Some(3)]);
}
