//! Incremental checkpoints of a tree, without stopping writers:
//!
//! 1. `freeze` (under the caller's lock, O(1)): keep a second reference to
//!    the root. Every dirty node is now shared, so a writer that changes
//!    one changes a copy (`Arc::make_mut`), and the frozen tree stays as
//!    it was.
//! 2. `write` (no lock): write the frozen tree's dirty nodes, children
//!    before parents (a parent records each child's address and checksum),
//!    to blocks the caller allocates. Clean subtrees are not touched: the
//!    cost is what changed since the last checkpoint.
//! 3. `adopt` (under the lock, proportional to what was written): the
//!    live tree's nodes that were written unchanged become clean (cached,
//!    evictable); written nodes the live tree replaced meanwhile are
//!    superseded (freed once the next checkpoint is durable).

use crate::error::{Result, StoreError};
use crate::node::{Branch, Node, Ptr};
use crate::tree::{RootRef, Tree};
use crate::Store;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tarn_format::node::{encode_node, node_crc, ChildRef, LeafValue, NodeBody, NodeHeader};
use tarn_format::Pba;

/// Where a checkpoint may put a node.
pub trait NodeAlloc {
    /// A free block, or None when the pool has no room.
    fn alloc_node(&mut self) -> Option<Pba>;
}

/// A tree as it was at `freeze`.
pub struct Frozen<V: LeafValue> {
    tree: u64,
    root: Ptr<V>,
    height: u8,
}

/// What `write` wrote: by node identity, its block and checksum.
#[derive(Default)]
pub struct Written {
    nodes: HashMap<usize, (Pba, u32)>,
    /// Nodes written in all.
    pub count: u64,
    /// Encoded nodes at consecutive blocks not yet written: a checkpoint
    /// takes its blocks in runs, so its nodes go out in a few large writes.
    batch: Option<(Pba, Vec<u8>)>,
    /// Nodes adopt made clean, for the cache (`take_fills`).
    fills: Vec<(Pba, crate::cache::Tag, crate::cache::AnyNode, usize)>,
}

/// Clean nodes for the cache, from an adopt: inserted by [`Fills::apply`]
/// after the caller's lock is released (inserting evicts: the work is
/// proportional to the nodes written).
#[derive(Default)]
pub struct Fills(Vec<(Pba, crate::cache::Tag, crate::cache::AnyNode, usize)>);

impl Fills {
    pub fn extend(&mut self, more: Fills) {
        self.0.extend(more.0);
    }

    pub fn apply(self, store: &Store) {
        for (pba, tag, node, bytes) in self.0 {
            store.cache.insert_any(pba, tag, node, bytes);
        }
    }
}

/// The largest write of consecutive nodes.
const BATCH_BYTES: usize = 256 << 10;

impl Written {
    /// Queue the node encoded as `block` for `pba`, writing what was
    /// queued first unless it continues it.
    fn push(&mut self, store: &Store, pba: Pba, block: Vec<u8>) -> Result<()> {
        if let Some((first, buf)) = &mut self.batch {
            let next = first.offset_by((buf.len() / block.len()) as u64);
            if next == pba && buf.len() < BATCH_BYTES {
                buf.extend_from_slice(&block);
                return Ok(());
            }
        }
        self.flush_batch(store)?;
        self.batch = Some((pba, block));
        Ok(())
    }

    /// Write what is queued. A failed run is written again node by node,
    /// so the error names the node whose write failed.
    fn flush_batch(&mut self, store: &Store) -> Result<()> {
        let Some((first, buf)) = self.batch.take() else { return Ok(()) };
        if store.io.write_nodes(first, &buf).is_ok() {
            return Ok(());
        }
        for (i, block) in buf.chunks(tarn_format::node::NODE_SIZE).enumerate() {
            let pba = first.offset_by(i as u64);
            store.io.write_node(pba, block).map_err(|source| StoreError::Write {
                pba,
                device: store.io.device_name(pba),
                source,
            })?;
        }
        Ok(())
    }

    /// The clean nodes adopt made, for the cache: apply them (after any
    /// lock the adopt ran under), or they are read again when next used.
    pub fn take_fills(&mut self) -> Fills {
        Fills(std::mem::take(&mut self.fills))
    }

    /// Every block written, for a tree that is gone by adopt time: its
    /// nodes are in the checkpoint but in no live tree.
    pub fn into_blocks(self) -> Vec<Pba> {
        self.nodes.into_values().map(|(pba, _)| pba).collect()
    }
}

fn identity<V: LeafValue>(n: &Arc<Node<V>>) -> usize {
    Arc::as_ptr(n) as usize
}

impl<V: LeafValue> Tree<V> {
    pub fn freeze(&self) -> Frozen<V> {
        Frozen { tree: self.id, root: self.root.clone(), height: self.height }
    }

    /// Step 3. Returns the blocks written that the live tree no longer
    /// uses: free once the *next* checkpoint is durable.
    pub fn adopt(&mut self, store: &Store, frozen: Frozen<V>, written: &mut Written) -> Vec<Pba> {
        adopt_ptr(self.id, &mut self.root, written);
        store.dirty_nodes.fetch_sub(written.count.min(store.dirty_nodes.load(Ordering::Relaxed)), Ordering::Relaxed);
        drop(frozen);
        let left: Vec<Pba> = written.nodes.drain().map(|(_, (pba, _))| pba).collect();
        written.count = 0;
        left
    }
}

impl<V: LeafValue> Frozen<V> {
    /// Step 2: write every dirty node; returns the root to record.
    pub fn write(
        &self,
        store: &Store,
        alloc: &mut dyn NodeAlloc,
        generation: u64,
        written: &mut Written,
    ) -> Result<RootRef> {
        if let Ptr::Dirty(n) = &self.root {
            if matches!(&**n, Node::Leaf(l) if l.is_empty()) {
                return Ok(RootRef::EMPTY);
            }
        }
        let (pba, crc) = self.write_ptr(store, &self.root, self.height, alloc, generation, written)?;
        written.flush_batch(store)?;
        Ok(RootRef { pba, crc, level: self.height })
    }

    fn write_ptr(
        &self,
        store: &Store,
        ptr: &Ptr<V>,
        level: u8,
        alloc: &mut dyn NodeAlloc,
        generation: u64,
        written: &mut Written,
    ) -> Result<(Pba, u32)> {
        let node = match ptr {
            Ptr::Clean { pba, crc } => return Ok((*pba, *crc)),
            Ptr::Dirty(n) => n,
        };
        let body = match &**node {
            Node::Leaf(l) => NodeBody::Leaf(l.to_packed()),
            Node::Branch(b) => {
                let mut children = Vec::with_capacity(b.children.len());
                for (key, child) in b.keys.iter().zip(&b.children) {
                    let (pba, crc) = self.write_ptr(store, child, level - 1, alloc, generation, written)?;
                    children.push(ChildRef { key: *key, pba, crc });
                }
                NodeBody::Branch(children)
            }
        };
        let pba = alloc.alloc_node().ok_or(StoreError::NoSpace)?;
        let header = NodeHeader { self_pba: pba, generation, tree: self.tree, level, codec: V::CODEC };
        let block = encode_node(&header, &body);
        let crc = node_crc(&block);
        written.push(store, pba, block)?;
        written.nodes.insert(identity(node), (pba, crc));
        written.count += 1;
        Ok((pba, crc))
    }
}

/// Make the live tree's written-and-unchanged nodes clean.
fn adopt_ptr<V: LeafValue>(tree: u64, ptr: &mut Ptr<V>, written: &mut Written) {
    let Ptr::Dirty(node) = ptr else { return };
    if written.nodes.contains_key(&identity(node)) {
        let (pba, crc) = adopt_written(tree, node, written);
        *ptr = Ptr::Clean { pba, crc };
        return;
    }
    // Made or changed after the freeze: only its children may be written.
    if let Node::Branch(b) = Arc::make_mut(node) {
        b.children.iter_mut().for_each(|c| adopt_ptr(tree, c, written));
    }
}

/// A node the checkpoint wrote, as a clean node (children by address) in
/// the cache; its written descendants too.
fn adopt_written<V: LeafValue>(tree: u64, node: &Arc<Node<V>>, written: &mut Written) -> (Pba, u32) {
    let (pba, crc) = written.nodes.remove(&identity(node)).expect("adopt only written nodes");
    let clean = match &**node {
        // A leaf edited in memory has spare capacity in its vectors (up to
        // twice its bytes); the clean copy is cloned to exact size, so the
        // cache holds about what the disk holds.
        Node::Leaf(l) => Arc::new(Node::Leaf(l.clone())),
        Node::Branch(b) => {
            let children = b
                .children
                .iter()
                .map(|c| match c {
                    Ptr::Clean { .. } => c.clone(),
                    Ptr::Dirty(n) => {
                        let (pba, crc) = adopt_written(tree, n, written);
                        Ptr::Clean { pba, crc }
                    }
                })
                .collect();
            Arc::new(Node::Branch(Branch { level: b.level, keys: b.keys.clone(), children }))
        }
    };
    let tag = crate::cache::Tag { tree, crc, level: clean.level() };
    let bytes = clean.mem_bytes();
    written.fills.push((pba, tag, clean, bytes));
    (pba, crc)
}
