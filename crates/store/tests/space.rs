//! The space map against a bitmap model, checkpointed with its own node
//! blocks allocated from itself (the checkpoint records them; opening
//! claims them back) and freed blocks returned only once the checkpoint
//! that frees them is durable. After every checkpoint, the map reopened
//! from what the checkpoint recorded equals the live map.

mod common;

use common::Rng;
use std::sync::Arc;
use tarn_format::Pba;
use tarn_store::cache::MIN_CACHE_BYTES;
use tarn_store::{MemIo, NodeAlloc, SpaceMap, Store, Written};

const START: u64 = 100;
const END: u64 = 300_000;

/// Allocates from the live map and remembers what it handed out.
struct Recording<'a> {
    space: &'a mut SpaceMap,
    store: &'a Store,
    sup: &'a mut Vec<Pba>,
    taken: Vec<Pba>,
}

impl NodeAlloc for Recording<'_> {
    fn alloc_node(&mut self) -> Option<Pba> {
        let p = (&mut *self.space, self.store, &mut *self.sup).alloc_node()?;
        self.taken.push(p);
        Some(p)
    }
}

fn free_set(space: &SpaceMap, store: &Store) -> Vec<(u64, u64)> {
    space.verify(store).expect("a consistent space map")
}

#[test]
fn checkpointed_space_map_reopens_equal_to_the_live_one() {
    let io = Arc::new(MemIo::default());
    let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
    let mut space = SpaceMap::new(&store, 50, 0, START, END).unwrap();
    let mut used = vec![false; END as usize];
    let mut data: Vec<(u64, u64)> = Vec::new();
    let (mut rng, mut sup, mut left_prev, mut frees_pending) = (Rng(0x51ace), Vec::new(), Vec::new(), Vec::new());
    for round in 0..30 {
        for _ in 0..3_000 {
            if rng.below(5) < 3 || data.is_empty() {
                let mut out = Vec::new();
                let got = space.take(&store, 1 + rng.below(8), 4, &mut out, &mut sup).unwrap();
                assert_eq!(got, out.iter().map(|o| o.1).sum::<u64>());
                for (p, n) in out {
                    (p.block()..p.block() + n).for_each(|b| assert!(!std::mem::replace(&mut used[b as usize], true)));
                    data.push((p.block(), n));
                }
            } else {
                // Freed by a commit: reusable once that commit is durable.
                let (b, n) = data.swap_remove(rng.below(data.len() as u64) as usize);
                frees_pending.push((Pba::new(0, b), n));
            }
        }
        // Checkpoint G.
        let deferred: Vec<(Pba, u64)> = std::mem::take(&mut sup)
            .into_iter()
            .chain(std::mem::take(&mut left_prev))
            .map(|p| (p, 1))
            .chain(std::mem::take(&mut frees_pending))
            .collect();
        let (free_at_freeze, cursor_at_freeze) = (space.free_blocks, space.cursor);
        let frozen = space.tree.freeze();
        let mut written = Written::default();
        let mut sup_during = Vec::new();
        let mut rec = Recording { space: &mut space, store: &store, sup: &mut sup_during, taken: Vec::new() };
        let root = frozen.write(&store, &mut rec, round, &mut written).unwrap();
        let own_nodes = std::mem::take(&mut rec.taken);
        for p in &own_nodes {
            assert!(!std::mem::replace(&mut used[p.block() as usize], true), "node block {p} was in use");
        }
        sup.extend(sup_during);
        left_prev = space.tree.adopt(&store, frozen, &mut written);
        written.take_fills().apply(&store);
        // Durable: what G freed goes back.
        for &(p, n) in &deferred {
            store.forget(p);
            space.give_back(&store, p.block(), n, &mut sup).unwrap();
            (p.block()..p.block() + n).for_each(|b| assert!(std::mem::replace(&mut used[b as usize], false)));
        }
        // Reopen as after a crash right here: G's map, its own node blocks
        // claimed, its deferred frees returned.
        let cold = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
        let mut again = SpaceMap::open(50, 0, root, free_at_freeze, (START, END), cursor_at_freeze).unwrap();
        let mut scratch = Vec::new();
        for p in &own_nodes {
            again.claim(&cold, p.block(), 1, &mut scratch).unwrap();
        }
        for &(p, n) in &deferred {
            again.give_back(&cold, p.block(), n, &mut scratch).unwrap();
        }
        let live = free_set(&space, &store);
        assert_eq!(free_set(&again, &cold), live, "round {round}");
        let model_free = used[START as usize..].iter().filter(|u| !**u).count() as u64;
        assert_eq!(space.free_blocks, model_free, "round {round}");
    }
}

#[test]
fn bad_frees_and_claims_are_errors() {
    let store = Store::new(Arc::new(MemIo::default()), MIN_CACHE_BYTES).unwrap();
    let mut space = SpaceMap::new(&store, 1, 0, 10, 1000).unwrap();
    let mut sup = Vec::new();
    let mut out = Vec::new();
    assert_eq!(space.take(&store, 100, 1, &mut out, &mut sup).unwrap(), 100);
    assert!(space.give_back(&store, 200, 5, &mut sup).is_err(), "double free of free space");
    assert!(space.give_back(&store, 5, 5, &mut sup).is_err(), "outside the data area");
    assert!(space.claim(&store, 50, 2, &mut sup).is_err(), "claim of used space");
    space.give_back(&store, 50, 2, &mut sup).unwrap();
    space.claim(&store, 50, 2, &mut sup).unwrap();
    assert_eq!(space.take(&store, 10_000, 8, &mut out, &mut sup).unwrap(), 890, "running out is a value");
    assert_eq!(space.free_blocks, 0);
    assert_eq!(space.verify(&store).unwrap(), vec![]);
}

#[test]
fn aligned_runs_are_found_next_fit_and_claims_take_only_free_runs() {
    let store = Store::memory();
    let mut m = SpaceMap::new(&store, 4 << 56, 0, 10, 10 + 64).unwrap();
    let mut sup = Vec::new();
    // Taken: block 12 (first region of 16 is partly used), and 42.
    m.claim(&store, 12, 1, &mut sup).unwrap();
    m.claim(&store, 42, 1, &mut sup).unwrap();
    assert_eq!(m.find_aligned(&store, 16, 100).unwrap(), Some(26), "10+16: the first whole aligned run");
    assert_eq!(m.find_aligned(&store, 16, 100).unwrap(), Some(58), "next fit: 42 breaks 42..58");
    assert_eq!(m.find_aligned(&store, 16, 100).unwrap(), Some(26), "wraps around");
    assert!(!m.try_claim(&store, 11, 2, &mut sup).unwrap(), "12 is taken: nothing claimed");
    assert!(!m.try_claim(&store, 70, 10, &mut sup).unwrap(), "outside the data area");
    assert!(m.try_claim(&store, 26, 16, &mut sup).unwrap());
    assert_eq!(m.find_aligned(&store, 16, 100).unwrap(), Some(58), "26.. is taken now");
    assert_eq!(m.find_aligned(&store, 64, 100).unwrap(), None);
}

/// The searches for whole aligned free runs placement makes, against the
/// free list they were given: within a window, within a bound on the
/// ranges looked at, and from the cursor with wrap-around.
#[test]
fn aligned_searches_find_the_first_run_that_fits() {
    let io = Arc::new(MemIo::default());
    let store = Store::new(io, MIN_CACHE_BYTES).unwrap();
    let mut space = SpaceMap::new(&store, 50, 0, START, END).unwrap();
    let mut sup = Vec::new();
    // Free: 100..110, 120..121, 130..200, 264..400, the rest used.
    for (start, len) in [(110u64, 10u64), (121, 9), (200, 64), (400, END - 400)] {
        assert!(space.try_claim(&store, start, len, &mut sup).unwrap());
    }
    // Aligned to 64 counted from the data start (100): 164, 228, 292, ...
    assert_eq!(space.aligned_between(&store, 100, 1000, 64, 64).unwrap(), Some(292));
    assert_eq!(space.aligned_between(&store, 100, 1000, 64, 3).unwrap(), None, "three ranges looked at, no more");
    assert_eq!(space.aligned_between(&store, 140, 1000, 16, 64).unwrap(), Some(148), "inside the range holding from");
    assert_eq!(space.aligned_between(&store, 100, 260, 64, 64).unwrap(), None, "no free run begins in the window");
    // The cursor's search wraps to the front and moves the cursor past.
    space.cursor = 900;
    assert_eq!(space.find_aligned(&store, 64, 64).unwrap(), Some(292));
    assert_eq!(space.cursor, 356);
}
