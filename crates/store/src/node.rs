//! Nodes in memory. A clean node came from (or went to) a block and is
//! shared through the cache; a dirty node is owned by its parent (or the
//! tree's root) and changed in place while nobody else holds it. A
//! checkpoint in progress holds the dirty nodes it writes, so a writer that
//! touches one then gets a copy (`Arc::make_mut`): copy-on-write in memory
//! as on disk.

use std::sync::Arc;
use tarn_format::node::{leaf_bytes, LeafValue, NodeBody};
use tarn_format::Pba;

/// A branch's link to a child.
#[derive(Debug)]
pub enum Ptr<V: LeafValue> {
    /// On a device: read through the cache.
    Clean { pba: Pba, crc: u32 },
    /// Changed since the last checkpoint: only in memory.
    Dirty(Arc<Node<V>>),
}

impl<V: LeafValue> Clone for Ptr<V> {
    fn clone(&self) -> Self {
        match self {
            Ptr::Clean { pba, crc } => Ptr::Clean { pba: *pba, crc: *crc },
            Ptr::Dirty(n) => Ptr::Dirty(n.clone()),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Leaf<V> {
    pub entries: Vec<(u64, V)>,
    /// Encoded size of `entries` (kept exact as they change).
    pub bytes: usize,
}

#[derive(Debug, Clone)]
pub struct Branch<V: LeafValue> {
    /// Levels above the leaves (1 for a parent of leaves).
    pub level: u8,
    /// `keys[i]` is a lower bound of child i's keys and an upper bound
    /// (exclusive) of child i-1's. `keys[0]` routes nothing.
    pub keys: Vec<u64>,
    pub children: Vec<Ptr<V>>,
}

#[derive(Debug, Clone)]
pub enum Node<V: LeafValue> {
    Leaf(Leaf<V>),
    Branch(Branch<V>),
}

impl<V: LeafValue> Node<V> {
    pub fn empty_leaf() -> Node<V> {
        Node::Leaf(Leaf { entries: Vec::new(), bytes: 0 })
    }

    pub fn level(&self) -> u8 {
        match self {
            Node::Leaf(_) => 0,
            Node::Branch(b) => b.level,
        }
    }

    /// Bytes this node takes in memory, for the cache's budget.
    pub fn mem_bytes(&self) -> usize {
        let body = match self {
            Node::Leaf(l) => l.entries.capacity() * std::mem::size_of::<(u64, V)>(),
            Node::Branch(b) => {
                b.keys.capacity() * std::mem::size_of::<u64>() + b.children.capacity() * std::mem::size_of::<Ptr<V>>()
            }
        };
        std::mem::size_of::<Self>() + body
    }

    /// A clean node from a decoded block (children all on disk).
    pub fn from_body(level: u8, body: NodeBody<V>) -> Node<V> {
        match body {
            NodeBody::Leaf(entries) => {
                let bytes = leaf_bytes(&entries);
                Node::Leaf(Leaf { entries, bytes })
            }
            NodeBody::Branch(children) => Node::Branch(Branch {
                level,
                keys: children.iter().map(|c| c.key).collect(),
                children: children.iter().map(|c| Ptr::Clean { pba: c.pba, crc: c.crc }).collect(),
            }),
        }
    }
}

impl<V: LeafValue> Leaf<V> {
    fn size_at(&self, i: usize) -> usize {
        match self.entries.get(i) {
            Some(e) => V::encoded_len(i.checked_sub(1).map(|p| &self.entries[p]), e.0, &e.1),
            None => 0,
        }
    }

    /// Insert at index `i` (keys stay ascending: the caller found `i`).
    pub fn insert_at(&mut self, i: usize, key: u64, value: V) {
        self.bytes -= self.size_at(i);
        self.entries.insert(i, (key, value));
        self.bytes += self.size_at(i) + self.size_at(i + 1);
        debug_assert_eq!(self.bytes, leaf_bytes(&self.entries));
    }

    pub fn remove_at(&mut self, i: usize) -> (u64, V) {
        self.bytes -= self.size_at(i) + self.size_at(i + 1);
        let e = self.entries.remove(i);
        self.bytes += self.size_at(i);
        debug_assert_eq!(self.bytes, leaf_bytes(&self.entries));
        e
    }

    pub fn replace_at(&mut self, i: usize, value: V) -> V {
        self.bytes -= self.size_at(i) + self.size_at(i + 1);
        let old = std::mem::replace(&mut self.entries[i].1, value);
        self.bytes += self.size_at(i) + self.size_at(i + 1);
        old
    }

    /// Split off the upper half by encoded size.
    pub fn split(&mut self) -> Leaf<V> {
        let mut acc = 0;
        let mut at = self.entries.len() / 2;
        for i in 0..self.entries.len() {
            acc += self.size_at(i);
            if acc * 2 >= self.bytes {
                at = (i + 1).clamp(1, self.entries.len() - 1);
                break;
            }
        }
        let right = self.entries.split_off(at);
        self.bytes = leaf_bytes(&self.entries);
        let bytes = leaf_bytes(&right);
        Leaf { entries: right, bytes }
    }
}
