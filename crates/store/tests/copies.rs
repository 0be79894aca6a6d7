//! Nodes kept in several copies (a mirrored device): a damaged or lost copy
//! is read around and rewritten from a good one; only when no copy is good
//! is the read an error, copy 0's. Negative controls: with one copy, or
//! with the rewrite refused, the same damage is not repaired.

mod common;

use common::{Rng, TestAlloc};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tarn_format::node::RangeValue;
use tarn_format::Pba;
use tarn_store::cache::MIN_CACHE_BYTES;
use tarn_store::{MemIo, NodeIo, RootRef, Store, StoreError, Tree, Written};

const ENTRIES: u64 = 20_000;

fn written_tree(io: Arc<MemIo>) -> (Arc<MemIo>, RootRef) {
    let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
    let mut tree: Tree<RangeValue> = Tree::new(7);
    for k in 0..ENTRIES {
        tree.insert(&store, k * 3, RangeValue { len: 2 }, &mut Vec::new()).unwrap();
    }
    let root = tree.freeze().write(&store, &mut TestAlloc::default(), 1, &mut Written::default()).unwrap();
    assert!(root.level >= 1, "the tree has leaves below its root: {root:?}");
    (io, root)
}

/// A new store over the same blocks: nothing cached.
fn reopen(io: &Arc<MemIo>, root: RootRef) -> (Store, Tree<RangeValue>) {
    (Store::new(io.clone(), MIN_CACHE_BYTES).unwrap(), Tree::open(7, root).unwrap())
}

/// Walk the whole tree cold; Ok if every entry is the one written.
fn check(io: &Arc<MemIo>, root: RootRef) -> Result<Store, StoreError> {
    let (store, tree) = reopen(io, root);
    let mut next = 0;
    let stats = tree.walk(&store, &mut |k, v| {
        assert_eq!((k, v.len), (next * 3, 2), "entry {next}");
        next += 1;
    })?;
    assert_eq!(stats.entries, ENTRIES);
    Ok(store)
}

fn copy_bytes(io: &MemIo, pba: Pba, copy: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    io.read_node_copy(pba, copy, &mut buf).ok().map(|_| buf)
}

/// Some leaf of the tree (kind byte 0 in its header).
fn a_leaf(io: &MemIo) -> Pba {
    let leaves = io.addresses().into_iter().filter(|p| copy_bytes(io, *p, 0).is_some_and(|b| b[32] == 0));
    leaves.last().expect("a written tree has leaves")
}

#[test]
fn a_damaged_copy_is_read_around_and_healed() {
    let (io, root) = written_tree(Arc::new(MemIo::with_copies(2)));
    let leaf = a_leaf(&io);
    assert!(io.flip_copy(leaf, 0, 1234, 5));
    let store = check(&io, root).expect("copy 1 is good");
    assert_eq!(store.healed_nodes(), 1);
    assert_eq!(copy_bytes(&io, leaf, 0), copy_bytes(&io, leaf, 1), "copy 0 rewritten from copy 1");
    // Copy 0 is what a read takes first: now good, so copy 1 may go bad.
    assert!(io.flip_copy(leaf, 1, 99, 0));
    let store = check(&io, root).expect("copy 0 was healed");
    assert_eq!(store.healed_nodes(), 0, "copy 0 read valid: nothing to heal");
}

/// Any bit of any node in copy 0: the tree reads right and copy 0 is whole again.
#[test]
fn random_flips_in_copy_0_are_all_healed() {
    let (io, root) = written_tree(Arc::new(MemIo::with_copies(2)));
    let mut rng = Rng(7);
    let blocks = io.addresses();
    for _ in 0..50 {
        let victim = blocks[rng.below(blocks.len() as u64) as usize];
        assert!(io.flip_copy(victim, 0, rng.below(4096) as usize, rng.below(8) as u8));
        assert_eq!(check(&io, root).unwrap().healed_nodes(), 1, "{victim}");
        assert_eq!(copy_bytes(&io, victim, 0), copy_bytes(&io, victim, 1));
    }
}

#[test]
fn a_lost_copy_is_read_around_and_rewritten() {
    let (io, root) = written_tree(Arc::new(MemIo::with_copies(2)));
    let leaf = a_leaf(&io);
    assert!(io.lose_copy(leaf, 0));
    assert_eq!(check(&io, root).unwrap().healed_nodes(), 1);
    assert_eq!(copy_bytes(&io, leaf, 0), copy_bytes(&io, leaf, 1));
}

#[test]
fn no_good_copy_is_copy_0s_error() {
    let (io, root) = written_tree(Arc::new(MemIo::with_copies(2)));
    let leaf = a_leaf(&io);
    io.flip_copy(leaf, 0, 100, 1);
    io.flip_copy(leaf, 1, 200, 2);
    let err = check(&io, root).expect_err("both copies damaged");
    assert!(matches!(err, StoreError::Corrupt { pba, .. } if pba == leaf), "{err}");
    assert_ne!(copy_bytes(&io, leaf, 0), copy_bytes(&io, leaf, 1), "nothing rewritten from a bad copy");
    io.lose_copy(leaf, 0);
    let err = check(&io, root).expect_err("copy 0 lost, copy 1 damaged");
    assert!(matches!(err, StoreError::Read { pba, .. } if pba == leaf), "copy 0's error: {err}");
}

/// Negative control: with one copy the same flip is an error.
#[test]
fn one_copy_cannot_heal() {
    let (io, root) = written_tree(Arc::new(MemIo::default()));
    let leaf = a_leaf(&io);
    io.flip_copy(leaf, 0, 1234, 5);
    let err = check(&io, root).expect_err("no other copy");
    assert!(matches!(err, StoreError::Corrupt { pba, .. } if pba == leaf), "{err}");
}

/// Negative control: a copy that refuses the rewrite stays damaged (the
/// read still succeeds), so the checks above do see whether healing happened.
#[test]
fn a_refused_rewrite_leaves_the_damage() {
    let (io, root) = written_tree(Arc::new(MemIo::with_copies(2)));
    let leaf = a_leaf(&io);
    io.flip_copy(leaf, 0, 1234, 5);
    io.refuse_copy_writes.store(true, Ordering::Relaxed);
    assert_eq!(check(&io, root).expect("read from copy 1").healed_nodes(), 0);
    assert_ne!(copy_bytes(&io, leaf, 0), copy_bytes(&io, leaf, 1), "copy 0 still damaged");
    io.flip_copy(leaf, 1, 99, 0);
    assert!(check(&io, root).is_err(), "now no copy is good");
}

/// However many copies an I/O layer claims, one damaged node costs at most
/// 9 reads: copy 0 twice (a flip on the way is read past), 7 others.
#[test]
fn copies_tried_are_bounded() {
    let (io, root) = written_tree(Arc::new(MemIo::with_copies(20)));
    assert!(io.flip(root.pba, 300, 3), "every copy of the root");
    let before = io.reads.load(Ordering::Relaxed);
    let (store, tree) = reopen(&io, root);
    assert!(matches!(tree.get_le(&store, 0), Err(StoreError::Corrupt { pba, .. }) if pba == root.pba));
    assert_eq!(io.reads.load(Ordering::Relaxed) - before, 9);
}

/// Found by fuzz/engine_open: a pointer of another tree (or with another
/// level or checksum) to a block the cache holds took the cached node
/// without any check, and a walk expecting a leaf met a branch (a level
/// underflow). The cache now answers only for the tree, checksum and level
/// the node was validated as; anything else is read and refused.
#[test]
fn a_cached_node_is_not_served_to_another_tree_or_level() {
    let (io, root) = written_tree(Arc::new(MemIo::default()));
    let (store, tree) = reopen(&io, root);
    assert!(tree.walk(&store, &mut |_, _| {}).is_ok(), "now cached");
    for (id, level, crc) in [(8, root.level, root.crc), (7, 0, root.crc), (7, root.level, root.crc ^ 1)] {
        let other: Tree<RangeValue> = Tree::open(id, RootRef { pba: root.pba, crc, level }).unwrap();
        let got = other.walk(&store, &mut |_, _| {});
        assert!(got.is_err(), "tree {id} level {level} crc {crc:#x}: {got:?}");
    }
    assert!(tree.walk(&store, &mut |_, _| {}).is_ok(), "the right pointer still reads");
}
