//! Changing a tree: insert and remove with splits, merges and root growth
//! and collapse. Every node on the changed path becomes dirty; a clean
//! node's block is recorded in `superseded` (free once the next checkpoint
//! is durable, never before: the last checkpoint still reaches it).

use crate::error::Result;
use crate::node::{Branch, Leaf, Node, Ptr};
use crate::tree::{route, Bounds, Tree};
use crate::Store;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tarn_format::node::{LeafValue, BRANCH_MAX, MAX_LEVEL, NODE_PAYLOAD_MAX};
use tarn_format::Pba;

/// A node under this fill is merged with a neighbour when they fit together.
const LEAF_LOW: usize = NODE_PAYLOAD_MAX / 4;
const BRANCH_LOW: usize = BRANCH_MAX / 4;

type Split<V> = Option<(u64, Ptr<V>)>;

impl<V: LeafValue> Tree<V> {
    /// Insert or replace; returns the value replaced.
    pub fn insert(&mut self, store: &Store, key: u64, value: V, superseded: &mut Vec<Pba>) -> Result<Option<V>> {
        let mut root = std::mem::replace(&mut self.root, Ptr::Clean { pba: Pba(0), crc: 0 });
        let result = self.insert_in(store, &mut root, self.height, Bounds::ALL, key, value, superseded);
        self.root = root;
        let (old, split) = result?;
        if let Some((k, right)) = split {
            assert!(self.height < MAX_LEVEL, "tree {:#x} deeper than {MAX_LEVEL} levels", self.id);
            let left = std::mem::replace(&mut self.root, Ptr::Clean { pba: Pba(0), crc: 0 });
            self.height += 1;
            let branch = Branch { level: self.height, keys: vec![0, k], children: vec![left, right] };
            self.root = Ptr::Dirty(Arc::new(Node::Branch(branch)));
            store.dirty_nodes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(old)
    }

    #[allow(clippy::too_many_arguments)]
    fn insert_in(
        &self,
        store: &Store,
        ptr: &mut Ptr<V>,
        level: u8,
        b: Bounds,
        key: u64,
        value: V,
        sup: &mut Vec<Pba>,
    ) -> Result<(Option<V>, Split<V>)> {
        match self.make_mut(store, ptr, level, b, sup)? {
            Node::Leaf(l) => Ok(leaf_insert(store, l, key, value)),
            Node::Branch(br) => {
                let i = route(&br.keys, key);
                let cb = b.child(&br.keys, i);
                let (old, split) = self.insert_in(store, &mut br.children[i], level - 1, cb, key, value, sup)?;
                if let Some((k, right)) = split {
                    br.keys.insert(i + 1, k);
                    br.children.insert(i + 1, right);
                }
                Ok((old, branch_split(store, br)))
            }
        }
    }

    /// Remove `key`; returns its value if it was there.
    pub fn remove(&mut self, store: &Store, key: u64, superseded: &mut Vec<Pba>) -> Result<Option<V>> {
        // Look first: removing an absent key must not dirty a path.
        if self.get_le(store, key)?.is_none_or(|(k, _)| k != key) {
            return Ok(None);
        }
        self.remove_present(store, key, superseded)
    }

    /// Remove a key the caller just found in the tree.
    pub fn remove_present(&mut self, store: &Store, key: u64, superseded: &mut Vec<Pba>) -> Result<Option<V>> {
        let mut root = std::mem::replace(&mut self.root, Ptr::Clean { pba: Pba(0), crc: 0 });
        let result = self.remove_in(store, &mut root, self.height, Bounds::ALL, key, superseded);
        self.root = root;
        let old = result?;
        self.collapse_root(store, superseded)?;
        Ok(old)
    }

    fn remove_in(
        &self,
        store: &Store,
        ptr: &mut Ptr<V>,
        level: u8,
        b: Bounds,
        key: u64,
        sup: &mut Vec<Pba>,
    ) -> Result<Option<V>> {
        match self.make_mut(store, ptr, level, b, sup)? {
            Node::Leaf(l) => Ok(l.remove(key)),
            Node::Branch(br) => {
                let i = route(&br.keys, key);
                let cb = b.child(&br.keys, i);
                let old = self.remove_in(store, &mut br.children[i], level - 1, cb, key, sup)?;
                self.rebalance(store, br, i, b, sup)?;
                Ok(old)
            }
        }
    }

    /// After child `i` shrank: drop it if empty, merge it with a neighbour
    /// if both fit in one node.
    fn rebalance(&self, store: &Store, br: &mut Branch<V>, i: usize, b: Bounds, sup: &mut Vec<Pba>) -> Result<()> {
        let level = br.level - 1;
        let child = self.load(store, &br.children[i], level, b.child(&br.keys, i))?;
        let (empty, low) = match &*child {
            Node::Leaf(l) => (l.is_empty(), l.payload_len() < LEAF_LOW),
            Node::Branch(c) => (c.children.is_empty(), c.children.len() < BRANCH_LOW),
        };
        if empty {
            // Even an only child: the parent then drops this branch.
            drop_child(br, i);
            return Ok(());
        }
        if !low || br.children.len() < 2 {
            return Ok(());
        }
        let left = if i + 1 < br.children.len() { i } else { i - 1 };
        self.try_merge(store, br, left, b, sup)
    }

    /// Merge children `left` and `left + 1` when they fit in one node.
    fn try_merge(&self, store: &Store, br: &mut Branch<V>, left: usize, b: Bounds, sup: &mut Vec<Pba>) -> Result<()> {
        let level = br.level - 1;
        let (lb, rb) = (b.child(&br.keys, left), b.child(&br.keys, left + 1));
        let a = self.load(store, &br.children[left], level, lb)?;
        let c = self.load(store, &br.children[left + 1], level, rb)?;
        let fits = match (&*a, &*c) {
            (Node::Leaf(x), Node::Leaf(y)) => x.payload_len() + y.payload_len() <= NODE_PAYLOAD_MAX * 3 / 4,
            (Node::Branch(x), Node::Branch(y)) => x.children.len() + y.children.len() <= BRANCH_MAX * 3 / 4,
            _ => false,
        };
        if !fits {
            return Ok(());
        }
        // Both are loaded: from here nothing reads a device, so the branch
        // is never left half-merged by an error.
        let right_key = br.keys.remove(left + 1);
        let right_ptr = br.children.remove(left + 1);
        let right = take_node(store, right_ptr, c, sup);
        match (dirty_with(store, &mut br.children[left], a, sup), right) {
            (Node::Leaf(x), Node::Leaf(y)) => x.append(y),
            (Node::Branch(x), Node::Branch(y)) => {
                x.keys.push(right_key);
                x.keys.extend(y.keys.into_iter().skip(1));
                x.children.extend(y.children);
            }
            _ => unreachable!("siblings are of one level"),
        }
        Ok(())
    }

    /// A root branch with one child gives way to it; an empty one to a leaf.
    fn collapse_root(&mut self, store: &Store, sup: &mut Vec<Pba>) -> Result<()> {
        while self.height > 0 {
            let node = self.load(store, &self.root, self.height, Bounds::ALL)?;
            let Node::Branch(br) = &*node else { break };
            if br.children.len() > 1 {
                break;
            }
            let only = br.children.first().cloned().unwrap_or_else(|| Ptr::Dirty(Arc::new(Node::empty_leaf())));
            let only_level = if br.children.is_empty() { 0 } else { self.height - 1 };
            if let Ptr::Clean { pba, .. } = self.root {
                sup.push(pba);
            }
            self.root = only;
            self.height = only_level;
        }
        Ok(())
    }

    /// The node behind `ptr`, dirty and uniquely ours to change.
    pub(crate) fn make_mut<'a>(
        &self,
        store: &Store,
        ptr: &'a mut Ptr<V>,
        level: u8,
        b: Bounds,
        sup: &mut Vec<Pba>,
    ) -> Result<&'a mut Node<V>> {
        if let Ptr::Clean { pba, crc } = *ptr {
            let node = self.load_clean(store, pba, crc, level, b)?;
            sup.push(pba);
            store.dirty_nodes.fetch_add(1, Ordering::Relaxed);
            *ptr = Ptr::Dirty(Arc::new((*node).clone()));
        }
        let Ptr::Dirty(arc) = ptr else { unreachable!("made dirty above") };
        if Arc::strong_count(arc) > 1 {
            // A checkpoint is writing this node: change a copy.
            store.dirty_nodes.fetch_add(1, Ordering::Relaxed);
        }
        Ok(Arc::make_mut(arc))
    }
}

fn leaf_insert<V: LeafValue>(store: &Store, l: &mut Leaf<V>, key: u64, value: V) -> (Option<V>, Split<V>) {
    let old = l.insert(key, value);
    (old, leaf_split(store, l, key))
}

fn leaf_split<V: LeafValue>(store: &Store, l: &mut Leaf<V>, key: u64) -> Split<V> {
    if l.payload_len() <= NODE_PAYLOAD_MAX {
        return None;
    }
    let appending = l.last().is_some_and(|(last, _)| last == key);
    let mut right = l.split(appending);
    if l.payload_len() > NODE_PAYLOAD_MAX || right.payload_len() > NODE_PAYLOAD_MAX {
        // An append that re-encoded more than its last group: halve instead.
        l.append(right);
        right = l.split(false);
    }
    assert!(l.payload_len() <= NODE_PAYLOAD_MAX && right.payload_len() <= NODE_PAYLOAD_MAX, "a split leaf fits");
    store.dirty_nodes.fetch_add(1, Ordering::Relaxed);
    let first = right.first().expect("the upper half has entries").0;
    Some((first, Ptr::Dirty(Arc::new(Node::Leaf(right)))))
}

fn branch_split<V: LeafValue>(store: &Store, br: &mut Branch<V>) -> Split<V> {
    if br.children.len() <= BRANCH_MAX {
        return None;
    }
    let at = br.children.len() / 2;
    let keys = br.keys.split_off(at);
    let children = br.children.split_off(at);
    let key = keys[0];
    store.dirty_nodes.fetch_add(1, Ordering::Relaxed);
    Some((key, Ptr::Dirty(Arc::new(Node::Branch(Branch { level: br.level, keys, children })))))
}

/// Remove child `i` (emptied) from its parent.
fn drop_child<V: LeafValue>(br: &mut Branch<V>, i: usize) {
    br.children.remove(i);
    let k = br.keys.remove(i);
    if i == 0 && !br.keys.is_empty() {
        // The first bound routes nothing; keep the parent's lower bound.
        br.keys[0] = k;
    }
}

/// The node behind `ptr`, made dirty from the copy already loaded.
fn dirty_with<'a, V: LeafValue>(
    store: &Store,
    ptr: &'a mut Ptr<V>,
    loaded: Arc<Node<V>>,
    sup: &mut Vec<Pba>,
) -> &'a mut Node<V> {
    if let Ptr::Clean { pba, .. } = *ptr {
        sup.push(pba);
        store.dirty_nodes.fetch_add(1, Ordering::Relaxed);
        *ptr = Ptr::Dirty(Arc::new((*loaded).clone()));
    }
    drop(loaded);
    let Ptr::Dirty(arc) = ptr else { unreachable!("made dirty above") };
    Arc::make_mut(arc)
}

/// Take a node out of the tree for good (merged away): its block, if it
/// had one, is superseded.
fn take_node<V: LeafValue>(store: &Store, ptr: Ptr<V>, loaded: Arc<Node<V>>, sup: &mut Vec<Pba>) -> Node<V> {
    let mut ptr = ptr;
    std::mem::replace(dirty_with(store, &mut ptr, loaded, sup), Node::empty_leaf())
}
