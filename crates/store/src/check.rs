//! Walk a tree from its root, reading and validating every node (checksum,
//! address, tree, level, key bounds), with progress by nodes visited. Time
//! is proportional to the tree's size; memory to its height.

use crate::error::Result;
use crate::node::Node;
use crate::tree::{Bounds, Tree};
use crate::Store;
use tarn_format::node::LeafValue;
use tarn_format::Pba;

/// What a walk saw.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TreeStats {
    pub nodes: u64,
    pub leaves: u64,
    pub entries: u64,
    /// Blocks of the nodes on devices (dirty nodes have none yet).
    pub blocks: Vec<Pba>,
}

impl<V: LeafValue> Tree<V> {
    /// Visit every node; `f` sees each leaf entry in key order.
    pub fn walk(&self, store: &Store, f: &mut dyn FnMut(u64, &V)) -> Result<TreeStats> {
        let mut stats = TreeStats::default();
        self.walk_in(store, &self.root.clone(), self.height, Bounds::ALL, &mut stats, f)?;
        Ok(stats)
    }

    fn walk_in(
        &self,
        store: &Store,
        ptr: &crate::node::Ptr<V>,
        level: u8,
        b: Bounds,
        stats: &mut TreeStats,
        f: &mut dyn FnMut(u64, &V),
    ) -> Result<()> {
        if let crate::node::Ptr::Clean { pba, .. } = ptr {
            stats.blocks.push(*pba);
        }
        let node = self.load(store, ptr, level, b)?;
        stats.nodes += 1;
        match &*node {
            Node::Leaf(l) => {
                stats.leaves += 1;
                stats.entries += l.len() as u64;
                l.for_each_in(0, u64::MAX, &mut |k, v| {
                    f(k, v);
                    true
                });
            }
            Node::Branch(br) => {
                for (i, c) in br.children.iter().enumerate() {
                    self.walk_in(store, c, level - 1, b.child(&br.keys, i), stats, f)?;
                }
            }
        }
        Ok(())
    }
}
