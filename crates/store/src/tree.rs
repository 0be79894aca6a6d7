//! One B-tree: an ordered map from u64 keys to leaf values, paged through
//! the store's cache. Reads take `&self`; changes take `&mut self` and make
//! the path they touch dirty (copy-on-write: a clean node is copied and its
//! block recorded as superseded, freed once the next checkpoint is durable).

use crate::error::{Result, StoreError};
use crate::node::{Node, Ptr};
use crate::Store;
use std::sync::Arc;
use tarn_format::node::{decode_node, Expect, LeafValue, MAX_LEVEL, NODE_SIZE};
use tarn_format::Pba;

/// Where a tree's root is, as a checkpoint records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootRef {
    /// `Pba(0)` (a superblock, never a node): the tree is empty.
    pub pba: Pba,
    pub crc: u32,
    pub level: u8,
}

impl RootRef {
    pub const EMPTY: RootRef = RootRef { pba: Pba(0), crc: 0, level: 0 };
    pub fn is_empty(&self) -> bool {
        self.pba == Pba(0)
    }
}

/// At most this many copies of a node are tried (a bound on the work one
/// damaged node can cost, whatever an I/O layer reports).
const MAX_COPIES: usize = 8;

/// Key bounds a node's keys must keep: `[lo, hi)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub lo: u64,
    pub hi: u64,
}

impl Bounds {
    pub const ALL: Bounds = Bounds { lo: 0, hi: u64::MAX };

    /// The bounds of child `i` of a branch with `keys`, inside `self`.
    pub fn child(&self, keys: &[u64], i: usize) -> Bounds {
        let lo = if i == 0 { self.lo } else { keys[i] };
        let hi = keys.get(i + 1).copied().unwrap_or(self.hi);
        Bounds { lo, hi }
    }
}

pub struct Tree<V: LeafValue> {
    /// Written in every node header: a node of another tree is damage.
    pub id: u64,
    pub(crate) root: Ptr<V>,
    /// Levels above the leaves at the root (a clean root's `Ptr` has none).
    pub(crate) height: u8,
}

/// Which child of a branch routes `key`: the last whose bound is <= key.
pub(crate) fn route(keys: &[u64], key: u64) -> usize {
    keys.partition_point(|k| *k <= key).saturating_sub(1)
}

impl<V: LeafValue> Tree<V> {
    pub fn new(id: u64) -> Tree<V> {
        Tree { id, root: Ptr::Dirty(Arc::new(Node::empty_leaf())), height: 0 }
    }

    /// A tree whose root a checkpoint recorded.
    pub fn open(id: u64, root: RootRef) -> Result<Tree<V>> {
        if root.is_empty() {
            return Ok(Tree::new(id));
        }
        if root.level > MAX_LEVEL {
            let what = format!("root level {} exceeds {MAX_LEVEL}", root.level);
            return Err(StoreError::Invalid { pba: root.pba, tree: id, what });
        }
        Ok(Tree { id, root: Ptr::Clean { pba: root.pba, crc: root.crc }, height: root.level })
    }

    /// A one-leaf tree held in memory only, never written as a node: a
    /// small map a checkpoint keeps in its catalog (the engine's inline
    /// dead lists). `entries` ascending and not overlapping (validated at
    /// decode); a handful, so they fit one leaf.
    pub(crate) fn in_memory(id: u64, entries: &[(u64, V)]) -> Tree<V> {
        let mut leaf = crate::leaf::Leaf::empty();
        for &(k, v) in entries {
            leaf.insert(k, v);
        }
        Tree { id, root: Ptr::Dirty(Arc::new(Node::Leaf(leaf))), height: 0 }
    }

    /// A tree this process just wrote, at `root` (no check: not from a device).
    pub(crate) fn written(id: u64, root: RootRef) -> Tree<V> {
        if root.is_empty() {
            return Tree::new(id);
        }
        Tree { id, root: Ptr::Clean { pba: root.pba, crc: root.crc }, height: root.level }
    }

    /// The node behind `ptr`, read and validated on a cache miss.
    pub(crate) fn load(&self, store: &Store, ptr: &Ptr<V>, level: u8, b: Bounds) -> Result<Arc<Node<V>>> {
        match ptr {
            Ptr::Dirty(n) => Ok(n.clone()),
            Ptr::Clean { pba, crc } => self.load_clean(store, *pba, *crc, level, b),
        }
    }

    pub(crate) fn load_clean(&self, store: &Store, pba: Pba, crc: u32, level: u8, b: Bounds) -> Result<Arc<Node<V>>> {
        let tag = crate::cache::Tag { tree: self.id, crc, level };
        // A cached node was validated when read (or written) as exactly
        // this tree, checksum and level: the pointer's parent, itself
        // validated, names that checksum, so it is the node meant.
        if let Some(n) = store.cache.get::<Node<V>>(pba, tag) {
            return Ok(n);
        }
        let tree = self.id;
        if crate::io_forbidden() {
            return Err(StoreError::Miss(crate::Miss { pba, crc, tree, level, lo: b.lo, hi: b.hi }));
        }
        let node = Arc::new(self.read_valid(store, &Expect { pba, crc, tree, level }, b)?);
        store.cache.insert(pba, tag, node.clone(), node.mem_bytes());
        Ok(node)
    }

    /// Copy 0 of the node, or on a mirror the first copy that validates;
    /// the copies before it are rewritten from it. If none validates, the
    /// error is copy 0's (the one a single-copy device would give).
    fn read_valid(&self, store: &Store, at: &Expect, b: Bounds) -> Result<Node<V>> {
        let mut buf = vec![0u8; NODE_SIZE];
        let read = store.io.read_node(at.pba, &mut buf);
        let first = match self.parse(store, at, b, read, &buf) {
            Ok(node) => return Ok(node),
            Err(e) => e,
        };
        // Read copy 0 once more, as data reads do: a flip on the way (not
        // on the medium) is read past.
        let again = store.io.read_node(at.pba, &mut buf);
        if let Ok(node) = self.parse(store, at, b, again, &buf) {
            return Ok(node);
        }
        let copies = store.io.copies(at.pba).min(MAX_COPIES);
        let mut bad = vec![0];
        for copy in 1..copies {
            let read = store.io.read_node_copy(at.pba, copy, &mut buf);
            match self.parse(store, at, b, read, &buf) {
                Ok(node) => {
                    store.heal(at.pba, &bad, &buf);
                    return Ok(node);
                }
                Err(_) => bad.push(copy),
            }
        }
        Err(first)
    }

    /// Validate one copy as read: checksum (against the parent's), address,
    /// tree, level, codec, encoding, key bounds.
    fn parse(&self, store: &Store, at: &Expect, b: Bounds, read: std::io::Result<()>, buf: &[u8]) -> Result<Node<V>> {
        let Expect { pba, tree, level, .. } = *at;
        let device = || store.io.device_name(pba);
        read.map_err(|source| StoreError::Read { pba, tree, device: device(), source })?;
        let corrupt = |source| StoreError::Corrupt { pba, tree, level, device: device(), source };
        let (h, body) = decode_node::<V>(buf, at).map_err(corrupt)?;
        if h.codec != V::CODEC {
            let what = format!("value codec {} in a tree of {}", h.codec, V::CODEC);
            return Err(StoreError::Invalid { pba, tree, what });
        }
        let node = Node::from_body(level, body).map_err(corrupt)?;
        check_bounds(&node, b).map_err(|what| StoreError::Invalid { pba, tree, what })?;
        Ok(node)
    }

    /// Where the root is, if it is clean (nothing changed since a checkpoint).
    pub fn clean_root(&self) -> Option<RootRef> {
        match self.root {
            Ptr::Clean { pba, crc } => Some(RootRef { pba, crc, level: self.height }),
            Ptr::Dirty(_) => None,
        }
    }

    /// The entry with the greatest key <= `key`.
    pub fn get_le(&self, store: &Store, key: u64) -> Result<Option<(u64, V)>> {
        self.le_in(store, &self.root, self.height, Bounds::ALL, key)
    }

    fn le_in(&self, store: &Store, ptr: &Ptr<V>, level: u8, b: Bounds, key: u64) -> Result<Option<(u64, V)>> {
        let node = self.load(store, ptr, level, b)?;
        match &*node {
            Node::Leaf(l) => Ok(l.get_le(key)),
            Node::Branch(br) => {
                let i = route(&br.keys, key);
                if let Some(found) = self.le_in(store, &br.children[i], level - 1, b.child(&br.keys, i), key)? {
                    return Ok(Some(found));
                }
                // Bounds are only bounds: the previous child holds the answer.
                match i.checked_sub(1) {
                    Some(p) => self.edge(store, &br.children[p], level - 1, b.child(&br.keys, p), true),
                    None => Ok(None),
                }
            }
        }
    }

    /// The entry with the greatest key in `[lo, key]` that `skip` does not
    /// reject (keys a buffered view changed): the skipped entries are
    /// visited in leaves already read, so a run of them costs leaf scans,
    /// not a descent each, and the scan stops at `lo`.
    pub fn get_le_except(
        &self,
        store: &Store,
        lo: u64,
        key: u64,
        skip: &dyn Fn(u64) -> bool,
    ) -> Result<Option<(u64, V)>> {
        if lo > key {
            return Ok(None);
        }
        self.le_except_in(store, &self.root, self.height, Bounds::ALL, (lo, key), skip)
    }

    fn le_except_in(
        &self,
        store: &Store,
        ptr: &Ptr<V>,
        level: u8,
        b: Bounds,
        (lo, key): (u64, u64),
        skip: &dyn Fn(u64) -> bool,
    ) -> Result<Option<(u64, V)>> {
        let node = self.load(store, ptr, level, b)?;
        match &*node {
            Node::Leaf(l) => {
                let Some((k, v)) = l.get_le(key).filter(|(k, _)| *k >= lo) else { return Ok(None) };
                if !skip(k) {
                    return Ok(Some((k, v)));
                }
                let mut best = None;
                l.for_each_in(lo, k, &mut |k, v| {
                    if !skip(k) {
                        best = Some((k, *v));
                    }
                    true
                });
                Ok(best)
            }
            Node::Branch(br) => {
                let i = route(&br.keys, key);
                for c in (0..=i).rev() {
                    let cb = b.child(&br.keys, c);
                    if cb.hi <= lo {
                        break;
                    }
                    let below = if c == i { key } else { u64::MAX };
                    if let Some(found) = self.le_except_in(store, &br.children[c], level - 1, cb, (lo, below), skip)? {
                        return Ok(Some(found));
                    }
                }
                Ok(None)
            }
        }
    }

    /// The entry with the smallest key >= `key`.
    pub fn get_ge(&self, store: &Store, key: u64) -> Result<Option<(u64, V)>> {
        self.ge_in(store, &self.root, self.height, Bounds::ALL, key)
    }

    fn ge_in(&self, store: &Store, ptr: &Ptr<V>, level: u8, b: Bounds, key: u64) -> Result<Option<(u64, V)>> {
        let node = self.load(store, ptr, level, b)?;
        match &*node {
            Node::Leaf(l) => Ok(l.get_ge(key)),
            Node::Branch(br) => {
                let i = route(&br.keys, key);
                if let Some(found) = self.ge_in(store, &br.children[i], level - 1, b.child(&br.keys, i), key)? {
                    return Ok(Some(found));
                }
                match br.children.get(i + 1) {
                    Some(next) => self.edge(store, next, level - 1, b.child(&br.keys, i + 1), false),
                    None => Ok(None),
                }
            }
        }
    }

    /// The last (or first) entry under `ptr`.
    fn edge(&self, store: &Store, ptr: &Ptr<V>, level: u8, b: Bounds, last: bool) -> Result<Option<(u64, V)>> {
        let node = self.load(store, ptr, level, b)?;
        match &*node {
            Node::Leaf(l) => Ok(if last { l.last() } else { l.first() }),
            Node::Branch(br) => {
                let i = if last { br.children.len() - 1 } else { 0 };
                self.edge(store, &br.children[i], level - 1, b.child(&br.keys, i), last)
            }
        }
    }

    /// Call `f` on every entry with `from <= key < to`, in order, until it
    /// returns false.
    pub fn range(&self, store: &Store, from: u64, to: u64, f: &mut dyn FnMut(u64, &V) -> bool) -> Result<()> {
        self.range_in(store, &self.root, self.height, Bounds::ALL, from, to, f).map(|_| ())
    }

    #[allow(clippy::too_many_arguments)]
    fn range_in(
        &self,
        store: &Store,
        ptr: &Ptr<V>,
        level: u8,
        b: Bounds,
        from: u64,
        to: u64,
        f: &mut dyn FnMut(u64, &V) -> bool,
    ) -> Result<bool> {
        let node = self.load(store, ptr, level, b)?;
        match &*node {
            Node::Leaf(l) => Ok(l.for_each_in(from, to, f)),
            Node::Branch(br) => {
                let first = route(&br.keys, from);
                for i in first..br.children.len() {
                    if i > first && br.keys[i] >= to {
                        break;
                    }
                    if !self.range_in(store, &br.children[i], level - 1, b.child(&br.keys, i), from, to, f)? {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
        }
    }
}

/// A node read from a device must keep the keys its parent promised.
fn check_bounds<V: LeafValue>(node: &Node<V>, b: Bounds) -> std::result::Result<(), String> {
    let (first, last) = match node {
        Node::Leaf(l) => (l.first().map(|e| e.0), l.last().map(|e| e.0)),
        Node::Branch(br) => (br.keys.get(1).copied(), br.keys.last().copied().filter(|_| br.keys.len() > 1)),
    };
    let (Some(first), Some(last)) = (first, last) else { return Ok(()) };
    if first < b.lo || last >= b.hi {
        return Err(format!("keys {first}..={last} outside the parent's bounds {}..{}", b.lo, b.hi));
    }
    if let Node::Branch(br) = node {
        if br.children.is_empty() {
            return Err("branch without children".into());
        }
    }
    Ok(())
}
