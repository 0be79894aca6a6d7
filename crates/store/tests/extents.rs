//! The extent map on a tree against a flat model (one optional physical
//! block per logical block), as the engine's in-memory map is tested:
//! random inserts and removes with splits and merges, buffered, merged by
//! checkpoints while changes go on, and reopened cold; counts kept exact.

mod common;

use common::{Rng, TestAlloc};
use std::sync::Arc;
use tarn_format::Pba;
use tarn_store::cache::MIN_CACHE_BYTES;
use tarn_store::extents::{Extent, Segment};
use tarn_store::{ExtentTree, MemIo, Store};

const BLOCKS: u64 = 4096;

fn flatten(map: &ExtentTree, store: &Store) -> Vec<Option<u64>> {
    let mut v = vec![None; BLOCKS as usize];
    for s in map.lookup(store, 0, BLOCKS, usize::MAX).unwrap() {
        if let Segment::Mapped { lba, len, pba, .. } = s {
            (0..len).for_each(|i| v[(lba + i) as usize] = Some(pba.block() + i));
        }
    }
    v
}

#[test]
fn random_ranges_match_a_flat_model_across_checkpoints() {
    let io = Arc::new(MemIo::default());
    let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
    let mut map = ExtentTree::new(&store, 3);
    let mut model: Vec<Option<u64>> = vec![None; BLOCKS as usize];
    let (mut rng, mut alloc) = (Rng(0xabcdef), TestAlloc::default());
    let mut frozen = None;
    let mut phys = 10_000;
    for step in 0..20_000u64 {
        let lba = rng.below(BLOCKS - 1);
        let len = 1 + rng.below((BLOCKS - lba).min(16));
        if rng.below(3) == 0 {
            let killed = map.remove(&store, lba, len).unwrap();
            let expect = (lba..lba + len).filter(|b| model[*b as usize].is_some()).count() as u64;
            assert_eq!(killed.iter().map(|k| k.1.len).sum::<u64>(), expect);
            (lba..lba + len).for_each(|b| model[b as usize] = None);
        } else {
            map.insert(&store, lba, Extent { len, pba: Pba::new(0, phys), birth: 1 }).unwrap();
            (0..len).for_each(|i| model[(lba + i) as usize] = Some(phys + i));
            // Often physically next: neighbours merge.
            phys += len + rng.below(2);
        }
        // Freeze, go on changing the map (reads see base, frozen and
        // pending changes), then merge and adopt.
        if step % 2_000 == 999 {
            frozen = Some((map.freeze(), model.clone(), map.counts));
        }
        if step % 2_000 == 1_999 && step % 6_000 == 3_999 {
            // A checkpoint that failed: never adopted, its changes go to
            // the next one under the newer changes (`Buffered::freeze`).
            frozen = None;
            assert_eq!(flatten(&map, &store), model, "after a failed checkpoint at step {step}");
        }
        if step % 2_000 == 1_999 && frozen.is_some() {
            let (f, then, counts) = frozen.take().unwrap();
            let merged = f.write(&store, &mut alloc, step).unwrap();
            let cold = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
            let reopened = ExtentTree::open(&cold, 3, merged.root, counts).unwrap();
            assert_eq!(flatten(&reopened, &cold), then, "reopened at step {step}");
            assert_eq!(flatten(&map, &store), model, "live before adopt at step {step}");
            assert!(map.tree.adopt(&f, &merged));
            assert_eq!(flatten(&map, &store), model, "live after adopt at step {step}");
        }
        if step % 97 == 0 {
            assert_eq!(flatten(&map, &store), model, "live at step {step}");
        }
        // One block looked up alone: the entry covering it found from
        // any point inside it, through every layer.
        let b = rng.below(BLOCKS);
        let one = match map.lookup(&store, b, 1, 2).unwrap()[..] {
            [Segment::Mapped { pba, .. }] => Some(pba.block()),
            _ => None,
        };
        assert_eq!(one, model[b as usize], "block {b} at step {step}");
    }
    assert_eq!(flatten(&map, &store), model);
    assert_eq!(map.counts.mapped_blocks, model.iter().filter(|b| b.is_some()).count() as u64);
    let f = map.freeze();
    let merged = f.write(&store, &mut alloc, 1 << 20).unwrap();
    assert!(map.tree.adopt(&f, &merged));
    assert_eq!(store.buffered_bytes(), 0);
    let mut entries = 0;
    map.tree.base.walk(&store, &mut |_, _| entries += 1).unwrap();
    assert_eq!(map.counts.extents, entries);
}

/// A merge larger than one chunk (its nodes written and made clean between
/// chunks) reopens as the model, and so does the live map after adopt.
#[test]
fn a_merge_of_many_chunks_matches_the_model() {
    let io = Arc::new(MemIo::default());
    let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
    let mut map = ExtentTree::new(&store, 5);
    let (mut rng, mut alloc) = (Rng(0x5eed), TestAlloc::default());
    let mut model: Vec<Option<u64>> = vec![None; BLOCKS as usize];
    for round in 0..3u64 {
        for i in 0..3 * BLOCKS {
            let lba = rng.below(BLOCKS);
            let phys = 100_000 * (round + 1) + i;
            map.insert(&store, lba, Extent { len: 1, pba: Pba::new(0, phys), birth: 1 }).unwrap();
            model[lba as usize] = Some(phys);
        }
        let f = map.freeze();
        assert!(f.len() > 2048, "{} changes: more than one chunk", f.len());
        let merged = f.write(&store, &mut alloc, round).unwrap();
        let cold = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
        let reopened = ExtentTree::open(&cold, 5, merged.root, map.counts).unwrap();
        assert_eq!(flatten(&reopened, &cold), model, "round {round}");
        assert!(map.tree.adopt(&f, &merged));
        assert_eq!(flatten(&map, &store), model, "round {round}, live");
    }
}

#[test]
fn sequential_fill_is_one_entry() {
    let store = Store::new(Arc::new(MemIo::default()), MIN_CACHE_BYTES).unwrap();
    let mut map = ExtentTree::new(&store, 1);
    for i in 0..1000 {
        let killed = map.insert(&store, i * 8, Extent { len: 8, pba: Pba::new(0, 500 + i * 8), birth: 2 });
        assert!(killed.unwrap().is_empty());
    }
    assert_eq!(map.counts.extents, 1);
    assert_eq!(map.counts.mapped_blocks, 8000);
}

/// Bug guarded (found by fuzzing engine_open): counts read from a damaged
/// catalog that disagree with the map's entries made the next removal
/// underflow them (a panic in debug builds, garbage in release); it must be
/// a typed error.
#[test]
fn counts_that_disagree_with_the_entries_are_an_error() {
    let store = Store::new(Arc::new(MemIo::default()), MIN_CACHE_BYTES).unwrap();
    let mut map = ExtentTree::new(&store, 3);
    map.insert(&store, 10, Extent { len: 8, pba: Pba::new(0, 500), birth: 1 }).unwrap();
    assert_eq!((map.counts.mapped_blocks, map.counts.extents), (8, 1));
    map.counts.mapped_blocks = 2;
    let err = map.remove(&store, 10, 8).unwrap_err();
    assert!(matches!(err, tarn_store::StoreError::Counts { tree: 3, .. }), "{err}");
}

/// Small maps kept in memory by checkpoints (the engine's inline dead
/// lists): while base and changes hold at most 8 entries a checkpoint
/// writes no node (`small`, `adopt_in_memory`), a cold reopen from the
/// entries alone (`open_in_memory`) matches the model, and once the map
/// grows past 8 it is written as a tree and stays one.
#[test]
fn small_maps_stay_in_memory_until_they_grow() {
    let io = Arc::new(MemIo::default());
    let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
    let mut map = ExtentTree::new(&store, 7);
    let (mut rng, mut alloc) = (Rng(0x1a1e), TestAlloc::default());
    let mut model: Vec<Option<u64>> = vec![None; BLOCKS as usize];
    let (mut kept, mut phys) = (0, 50_000);
    for round in 0..400u64 {
        // Scattered single blocks (no merges): one entry each, among 8
        // places for 200 rounds (so at most 8 entries), then anywhere.
        let (places, removals) = if round < 200 { (8, 2) } else { (BLOCKS / 2, 4) };
        for _ in 0..1 + round / 100 {
            let lba = rng.below(places) * 2;
            if rng.below(removals) == 0 {
                map.remove(&store, lba, 1).unwrap();
                model[lba as usize] = None;
            } else {
                map.insert(&store, lba, Extent { len: 1, pba: Pba::new(0, phys), birth: 1 }).unwrap();
                model[lba as usize] = Some(phys);
                phys += 2;
            }
        }
        let f = map.freeze();
        let before = alloc.allocated;
        match f.small(8) {
            Some(entries) => {
                assert!(entries.len() <= 8 && entries.len() as u64 == map.counts.extents, "round {round}");
                let cold = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
                let reopened = ExtentTree::open_in_memory(&cold, 7, &entries, map.counts);
                assert_eq!(flatten(&reopened, &cold), model, "reopened from entries, round {round}");
                assert!(map.tree.adopt_in_memory(&f, &entries));
                assert_eq!(map.tree.base_in_memory(), !entries.is_empty());
                // A checkpoint with no change since keeps the same leaf.
                let again = map.freeze();
                assert_eq!(again.small(8).as_ref(), Some(&entries), "round {round}");
                assert!(map.tree.adopt_in_memory(&again, &entries));
                kept += 1;
            }
            None => {
                let merged = f.write(&store, &mut alloc, round).unwrap();
                assert!(map.tree.adopt(&f, &merged));
                assert!(!map.tree.base_in_memory());
                assert!(map.counts.extents > 8 || kept == 0 || alloc.allocated == before, "round {round}");
            }
        }
        assert_eq!(flatten(&map, &store), model, "live after adopt, round {round}");
        if kept > 0 && alloc.allocated == 0 {
            assert_eq!(store.buffered_bytes(), 0, "nothing buffered after an adopt");
        }
    }
    assert!(kept >= 200, "the map was kept in memory at {kept} checkpoints");
    assert!(map.counts.extents > 8 && alloc.allocated > 0, "the map grew into a tree");
    // A map written as a tree is never kept in memory again.
    map.insert(&store, 1, Extent { len: 1, pba: Pba::new(0, 7), birth: 1 }).unwrap();
    assert!(map.freeze().small(usize::MAX).is_none());
}
