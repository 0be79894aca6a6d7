//! Moving a tree's nodes off one device (`tarn dev remove`, last step):
//! every clean node stored there, and the path from the root to it, is
//! made dirty in place (copy-on-write, as a change would), so the next
//! checkpoint writes them wherever allocation goes, which never is a
//! device being removed. The old blocks go to `superseded` like any
//! replaced node's: free once that checkpoint is durable.

use crate::error::Result;
use crate::node::{Node, Ptr};
use crate::tree::{Bounds, Tree};
use crate::Store;
use std::collections::HashSet;
use tarn_format::node::LeafValue;
use tarn_format::Pba;

/// Nodes to make dirty: clean ones by block, dirty ones by address (the
/// tree does not change between the marking walk and the rewrite).
#[derive(Default)]
struct Marked {
    clean: HashSet<Pba>,
    dirty: HashSet<usize>,
    /// Clean nodes found on the device.
    on_device: u64,
}

impl<V: LeafValue> Tree<V> {
    /// Make dirty every node stored on `device` and the nodes above it;
    /// returns how many were on the device. Reads every branch node once
    /// (leaves are known by their parent's pointer, never read).
    pub fn rewrite_device(&mut self, store: &Store, device: u16, superseded: &mut Vec<Pba>) -> Result<u64> {
        let mut marked = Marked::default();
        let root = self.root.clone();
        if !self.mark_in(store, &root, self.height, Bounds::ALL, device, &mut marked)? {
            return Ok(0);
        }
        let mut root = std::mem::replace(&mut self.root, Ptr::Clean { pba: Pba(0), crc: 0 });
        let result = self.rewrite_in(store, &mut root, self.height, Bounds::ALL, &marked, superseded);
        self.root = root;
        result?;
        Ok(marked.on_device)
    }

    /// Whether the subtree at `ptr` holds a clean node on `device`.
    fn mark_in(&self, store: &Store, ptr: &Ptr<V>, level: u8, b: Bounds, device: u16, m: &mut Marked) -> Result<bool> {
        let mut touched = match ptr {
            Ptr::Clean { pba, .. } if *pba == Pba(0) => return Ok(false),
            Ptr::Clean { pba, .. } => pba.device() == device,
            Ptr::Dirty(_) => false,
        };
        m.on_device += u64::from(touched);
        if level > 0 {
            let node = self.load(store, ptr, level, b)?;
            if let Node::Branch(br) = &*node {
                for (i, c) in br.children.iter().enumerate() {
                    touched |= self.mark_in(store, c, level - 1, b.child(&br.keys, i), device, m)?;
                }
            }
        }
        if touched {
            match ptr {
                Ptr::Clean { pba, .. } => m.clean.insert(*pba),
                Ptr::Dirty(arc) => m.dirty.insert(std::sync::Arc::as_ptr(arc) as *const () as usize),
            };
        }
        Ok(touched)
    }

    fn rewrite_in(
        &self,
        store: &Store,
        ptr: &mut Ptr<V>,
        level: u8,
        b: Bounds,
        m: &Marked,
        sup: &mut Vec<Pba>,
    ) -> Result<()> {
        let wanted = match ptr {
            Ptr::Clean { pba, .. } => m.clean.contains(pba),
            Ptr::Dirty(arc) => m.dirty.contains(&(std::sync::Arc::as_ptr(arc) as *const () as usize)),
        };
        if !wanted {
            return Ok(());
        }
        if let Node::Branch(br) = self.make_mut(store, ptr, level, b, sup)? {
            for i in 0..br.children.len() {
                let cb = b.child(&br.keys, i);
                self.rewrite_in(store, &mut br.children[i], level - 1, cb, m, sup)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::checkpoint::NodeAlloc;
    use crate::tree::Tree;
    use crate::Store;
    use tarn_format::node::RangeValue;
    use tarn_format::Pba;

    /// Hands out blocks on one device, counting up.
    struct OnDevice(u16, u64);
    impl NodeAlloc for OnDevice {
        fn alloc_node(&mut self) -> Option<Pba> {
            self.1 += 1;
            Some(Pba::new(self.0, self.1))
        }
    }

    fn write(store: &Store, t: &mut Tree<RangeValue>, alloc: &mut OnDevice) {
        let frozen = t.freeze();
        let mut written = crate::checkpoint::Written::default();
        frozen.write(store, alloc, 1, &mut written).unwrap();
        t.adopt(store, frozen, &mut written);
        written.take_fills().apply(store);
    }

    /// A tree written on device 1, then partly changed and written on
    /// device 2: after `rewrite_device(1)` and a write on device 3, no
    /// node is left on device 1, every entry reads back, and the blocks
    /// superseded are exactly the device-1 nodes plus the paths to them.
    #[test]
    fn every_node_leaves_the_device() {
        let store = Store::memory();
        let mut t: Tree<RangeValue> = Tree::new(7);
        let mut sup = Vec::new();
        for k in 0..50_000u64 {
            t.insert(&store, k * 10, RangeValue { len: k % 5 + 2 }, &mut sup).unwrap();
        }
        write(&store, &mut t, &mut OnDevice(1, 0));
        for k in (0..50_000u64).step_by(9973) {
            t.insert(&store, k * 10, RangeValue { len: 1 }, &mut sup).unwrap();
        }
        write(&store, &mut t, &mut OnDevice(2, 0));
        let before = t.walk(&store, &mut |_, _| {}).unwrap();
        let on1 = before.blocks.iter().filter(|p| p.device() == 1).count() as u64;
        assert!(on1 > 10 && on1 < before.blocks.len() as u64, "a mix of devices: {on1}");
        let mut sup = Vec::new();
        assert_eq!(t.rewrite_device(&store, 1, &mut sup).unwrap(), on1);
        assert!(sup.iter().filter(|p| p.device() == 1).count() as u64 == on1);
        write(&store, &mut t, &mut OnDevice(3, 0));
        let mut n = 0u64;
        let after = t
            .walk(&store, &mut |k, v| {
                assert_eq!(v.len, if (k / 10) % 9973 == 0 { 1 } else { (k / 10) % 5 + 2 });
                n += 1;
            })
            .unwrap();
        assert_eq!(n, 50_000);
        assert!(after.blocks.iter().all(|p| p.device() != 1));
        // Nothing left to move: a second call changes nothing.
        assert_eq!(t.rewrite_device(&store, 1, &mut Vec::new()).unwrap(), 0);
    }
}
