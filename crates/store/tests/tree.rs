//! The B-tree against a `BTreeMap` model: random inserts and removes with
//! splits, merges and root changes; checkpoints taken while the live tree
//! keeps changing; every checkpoint reopened from its root with a cold,
//! small cache (so nodes are evicted and re-read) and compared with the
//! model of its moment; superseded blocks reused as soon as the protocol
//! allows, so reuse that came too early shows as a damaged read.

mod common;

use common::{Rng, TestAlloc};
use std::collections::BTreeMap;
use std::sync::Arc;
use tarn_format::node::RangeValue;
use tarn_format::Pba;
use tarn_store::cache::MIN_CACHE_BYTES;
use tarn_store::{MemIo, RootRef, Store, StoreError, Tree, Written};

type Model = BTreeMap<u64, u64>;

fn contents(tree: &Tree<RangeValue>, store: &Store) -> Model {
    let mut out = Model::new();
    tree.walk(store, &mut |k, v| {
        out.insert(k, v.len);
    })
    .unwrap();
    out
}

fn reopen(io: &Arc<MemIo>, root: RootRef) -> (Store, Tree<RangeValue>) {
    let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
    let tree = Tree::open(7, root).unwrap();
    (store, tree)
}

/// One random change to tree and model; keys spaced so ranges never touch.
fn change(rng: &mut Rng, tree: &mut Tree<RangeValue>, store: &Store, model: &mut Model, sup: &mut Vec<Pba>) {
    let key = rng.below(2_000_000) * 4;
    if rng.below(3) == 0 {
        let got = tree.remove(store, key, sup).unwrap().map(|v| v.len);
        assert_eq!(got, model.remove(&key), "remove {key}");
    } else {
        let len = 1 + rng.below(3);
        let got = tree.insert(store, key, RangeValue { len }, sup).unwrap().map(|v| v.len);
        assert_eq!(got, model.insert(key, len), "insert {key}");
    }
}

#[test]
fn random_changes_and_checkpoints_match_the_model() {
    let seed = std::env::var("TARN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    churn(seed, false).unwrap();
}

/// Negative control: reusing the blocks a checkpoint wrote as soon as the
/// live tree replaced them (one checkpoint too early) breaks the previous
/// checkpoint, and the check above sees it.
#[test]
fn reusing_written_nodes_too_early_is_caught() {
    let err = churn(0x5eed, true).expect_err("early reuse must damage the fallback checkpoint");
    assert!(err.contains("survives"), "{err}");
}

/// Changes, checkpoints and reopen checks; Err when a fallback checkpoint
/// is found damaged or different.
fn churn(seed: u64, reuse_too_early: bool) -> Result<(), String> {
    let mut rng = Rng(seed | 1);
    let io = Arc::new(MemIo::default());
    let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
    let mut tree: Tree<RangeValue> = Tree::new(7);
    let mut model = Model::new();
    let mut alloc = TestAlloc::default();
    let (mut sup, mut left_before): (Vec<Pba>, Vec<Pba>) = (Vec::new(), Vec::new());
    let mut durable: Option<(RootRef, Model)> = None;
    for round in 0..12 {
        // A big tree first (larger than the cache), then small rounds, so
        // most nodes stay clean between checkpoints, as in a pool.
        for _ in 0..if round == 0 { 200_000 } else { 3_000 } {
            change(&mut rng, &mut tree, &store, &mut model, &mut sup);
        }
        // Checkpoint G: freeze, keep changing, write, keep changing, adopt.
        let frozen = tree.freeze();
        let at_freeze = model.clone();
        let pending = std::mem::take(&mut sup);
        for _ in 0..200 {
            change(&mut rng, &mut tree, &store, &mut model, &mut sup);
        }
        let mut written = Written::default();
        let root = frozen.write(&store, &mut alloc, round, &mut written).unwrap();
        for _ in 0..200 {
            change(&mut rng, &mut tree, &store, &mut model, &mut sup);
        }
        let left = tree.adopt(&store, frozen, &mut written);
        written.take_fills().apply(&store);
        // Until G is durable a crash falls back to G-1: it must be intact
        // although G's nodes went into freed blocks.
        if let Some((prev, prev_model)) = durable.take() {
            let (cold, t) = reopen(&io, prev);
            let mut seen = Model::new();
            let walked = t.walk(&cold, &mut |k, v| {
                seen.insert(k, v.len);
            });
            if walked.is_err() || seen != prev_model {
                return Err(format!("checkpoint before {round} survives its successor's writes: {walked:?}"));
            }
        }
        durable = Some((root, at_freeze.clone()));
        // G is durable: what G no longer reaches may be reused now.
        let now = if reuse_too_early { left } else { std::mem::replace(&mut left_before, left) };
        for pba in pending.into_iter().chain(now) {
            store.forget(pba);
            alloc.free.push(pba);
        }
        let (cold, reopened) = reopen(&io, root);
        assert_eq!(contents(&reopened, &cold), at_freeze, "checkpoint {round} reopened");
        let stats = cold.cache.stats();
        assert!(stats.evictions > 0 && stats.bytes <= stats.capacity, "a cold walk evicts: {stats:?}");
        assert_eq!(contents(&tree, &store), model, "live tree after round {round}");
    }
    let stats = store.cache.stats();
    assert!(stats.evictions > 0 && stats.misses > 0, "the live tree re-read evicted nodes: {stats:?}");
    assert!(stats.bytes <= stats.capacity, "{stats:?}");
    // Blocks in use stay proportional to the tree, not to what was written.
    let (cold, t) = reopen(&io, tree.freeze().write(&store, &mut alloc, 99, &mut Written::default()).unwrap());
    let walked = t.walk(&cold, &mut |_, _| {}).unwrap();
    assert!(alloc.next < 8 * walked.nodes + 200, "{} blocks made for {} nodes", alloc.next, walked.nodes);
    Ok(())
}

#[test]
fn removing_everything_collapses_to_an_empty_root() {
    let io = Arc::new(MemIo::default());
    let store = Store::new(io, MIN_CACHE_BYTES).unwrap();
    let mut tree: Tree<RangeValue> = Tree::new(7);
    let mut sup = Vec::new();
    for k in 0..50_000u64 {
        tree.insert(&store, k * 2, RangeValue { len: 1 }, &mut sup).unwrap();
    }
    let mut alloc = TestAlloc::default();
    let mut written = Written::default();
    let root = tree.freeze().write(&store, &mut alloc, 1, &mut written).unwrap();
    assert!(root.level >= 1, "50,000 entries need branches: {root:?}");
    for k in (0..50_000u64).rev() {
        assert_eq!(tree.remove(&store, k * 2, &mut sup).unwrap(), Some(RangeValue { len: 1 }));
    }
    assert_eq!(tree.get_ge(&store, 0).unwrap(), None);
    let root = tree.freeze().write(&store, &mut alloc, 2, &mut written).unwrap();
    assert_eq!(root, RootRef::EMPTY);
}

fn written_tree(entries: u64) -> (Arc<MemIo>, RootRef) {
    let io = Arc::new(MemIo::default());
    let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
    let mut tree: Tree<RangeValue> = Tree::new(7);
    for k in 0..entries {
        tree.insert(&store, k * 3, RangeValue { len: 2 }, &mut Vec::new()).unwrap();
    }
    let root = tree.freeze().write(&store, &mut TestAlloc::default(), 1, &mut Written::default()).unwrap();
    (io, root)
}

/// Every bit flip in any node is reported as damage naming the node, and
/// never returned as data.
#[test]
fn damaged_nodes_are_errors_never_data() {
    let (io, root) = written_tree(20_000);
    let mut rng = Rng(99);
    for _ in 0..200 {
        let blocks = io.addresses();
        let victim = blocks[rng.below(blocks.len() as u64) as usize];
        let (byte, bit) = (rng.below(4096) as usize, rng.below(8) as u8);
        io.flip(victim, byte, bit);
        let (store, tree) = reopen(&io, root);
        let err = tree.walk(&store, &mut |_, _| {}).expect_err("a flipped bit is found");
        assert!(matches!(err, StoreError::Corrupt { pba, .. } if pba == victim), "{err}");
        io.flip(victim, byte, bit);
    }
}

/// A node written to the wrong block (or a stale one left there) is caught
/// by its self address and its parent's checksum.
#[test]
fn misdirected_and_lost_writes_are_caught() {
    let (io, root) = written_tree(20_000);
    let blocks = io.addresses();
    let (a, b) = (blocks[3], blocks[10]);
    let saved = {
        let mut buf = vec![0u8; 4096];
        tarn_store::NodeIo::read_node(&*io, b, &mut buf).unwrap();
        buf
    };
    io.copy_block(a, b);
    let (store, tree) = reopen(&io, root);
    let err = tree.walk(&store, &mut |_, _| {}).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { pba, .. } if pba == b), "{err}");
    tarn_store::NodeIo::write_node(&*io, b, &saved).unwrap();
    let (store, tree) = reopen(&io, root);
    assert_eq!(tree.walk(&store, &mut |_, _| {}).unwrap().entries, 20_000);
}

/// Reads under a lock writers wait on do no I/O: a cold node is a Miss,
/// fetched outside the lock, after which the same read succeeds.
#[test]
fn reads_without_io_miss_then_fetch() {
    let (io, root) = written_tree(20_000);
    let (store, tree) = reopen(&io, root);
    let reads = io.reads.load(std::sync::atomic::Ordering::Relaxed);
    let mut fetched = 0;
    let found = loop {
        match tarn_store::without_io(|| tree.get_le(&store, 3 * 12_345)) {
            Err(StoreError::Miss(m)) => {
                assert_eq!(io.reads.load(std::sync::atomic::Ordering::Relaxed), reads + fetched, "no read inside");
                tarn_store::fetch::<RangeValue>(&store, &m).unwrap();
                fetched += 1;
                assert!(fetched <= 17, "one fetch per level at most");
            }
            other => break other.unwrap(),
        }
    };
    assert_eq!(found, Some((3 * 12_345, RangeValue { len: 2 })));
    assert!(fetched >= 2, "root and leaf were cold: {fetched}");
    assert_eq!(tree.get_le(&store, 3 * 12_345).unwrap(), found, "and with I/O allowed");
}
