//! The store's nodes on a real two-leg `MirrorDevice` through
//! `DeviceNodeIo`: a node damaged on leg 0 is read from leg 1 by a cold
//! store and leg 0 rewritten (the store and the leg both count it); damaged
//! on both legs, the read is a typed error and no leg is faulted.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use tarn_engine::device::mem_device::MemDevice;
use tarn_engine::device::node_io::DeviceNodeIo;
use tarn_engine::members::mirror::{Leg, LegHealth};
use tarn_engine::{Device, MirrorDevice};
use tarn_format::node::{RangeValue, NODE_SIZE};
use tarn_format::Pba;
use tarn_store::cache::MIN_CACHE_BYTES;
use tarn_store::{NodeAlloc, NodeIo, RootRef, Store, StoreError, Tree, Written};

const SIZE: usize = 256 * NODE_SIZE;

/// One leg in memory, damaged at byte `byte` of block `pba`.
fn flip(leg: &MemDevice, pba: Pba, byte: usize) {
    leg.bytes(0).unwrap()[pba.byte_offset() as usize + byte] ^= 0x10;
}

struct Blocks(u64);

impl NodeAlloc for Blocks {
    fn alloc_node(&mut self) -> Option<Pba> {
        self.0 += 1;
        Some(Pba::new(0, self.0))
    }
}

/// A mirror of two memory legs holding a written tree.
fn mirrored_tree() -> ([Arc<MemDevice>; 2], Arc<MirrorDevice>, Arc<dyn NodeIo>, RootRef) {
    let legs = [0, 1].map(|i| Arc::new(MemDevice::new(&format!("leg{i}"), SIZE as u64, 1)));
    let leg = |i: usize| Leg::new(Some(legs[i].clone()), [i as u8 + 1; 16], format!("leg{i}"), LegHealth::Online);
    let mirror = Arc::new(MirrorDevice::new(vec![leg(0), leg(1)], SIZE as u64, true));
    let io: Arc<dyn NodeIo> = Arc::new(DeviceNodeIo::new(Arc::new(tarn_engine::device::members::Members::new(vec![
        mirror.clone() as Arc<dyn Device>,
    ]))));
    let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
    let mut tree: Tree<RangeValue> = Tree::new(9);
    for k in 0..20_000 {
        tree.insert(&store, k * 2, RangeValue { len: 1 }, &mut Vec::new()).unwrap();
    }
    let root = tree.freeze().write(&store, &mut Blocks(0), 1, &mut Written::default()).unwrap();
    assert!(root.level >= 1);
    (legs, mirror, io, root)
}

fn walk_cold(io: &Arc<dyn NodeIo>, root: RootRef) -> (Store, Result<u64, StoreError>) {
    let store = Store::new(io.clone(), MIN_CACHE_BYTES).unwrap();
    let tree: Tree<RangeValue> = Tree::open(9, root).unwrap();
    let entries = tree.walk(&store, &mut |_, _| {}).map(|s| s.entries);
    (store, entries)
}

#[test]
fn a_node_damaged_on_one_leg_is_read_from_the_other_and_healed() {
    let (legs, mirror, io, root) = mirrored_tree();
    let victim = Pba::new(0, 2);
    flip(&legs[0], victim, 777);
    let (store, entries) = walk_cold(&io, root);
    assert_eq!(entries.unwrap(), 20_000);
    assert_eq!(store.healed_nodes(), 1);
    assert_eq!(legs[0].block(0, victim.block()), legs[1].block(0, victim.block()), "leg 0 rewritten");
    assert_eq!(mirror.legs()[0].healed.load(Ordering::Relaxed), 1, "the mirror counts it too");
    assert_eq!(mirror.status().0, "ONLINE", "damage is not an I/O error: no leg faulted");
}

#[test]
fn a_node_damaged_on_both_legs_is_an_error() {
    let (legs, mirror, io, root) = mirrored_tree();
    let victim = Pba::new(0, 2);
    flip(&legs[0], victim, 777);
    flip(&legs[1], victim, 1777);
    let (store, entries) = walk_cold(&io, root);
    assert!(matches!(entries, Err(StoreError::Corrupt { pba, .. }) if pba == victim), "{entries:?}");
    assert_eq!(store.healed_nodes(), 0);
    assert_eq!(mirror.status().0, "ONLINE");
}
