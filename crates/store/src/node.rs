//! Nodes in memory. A clean node came from (or went to) a block and is
//! shared through the cache; a dirty node is owned by its parent (or the
//! tree's root) and changed in place while nobody else holds it. A
//! checkpoint in progress holds the dirty nodes it writes, so a writer that
//! touches one then gets a copy (`Arc::make_mut`): copy-on-write in memory
//! as on disk.

pub use crate::leaf::Leaf;
use std::sync::Arc;
use tarn_format::node::{LeafValue, NodeBody};
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
        Node::Leaf(Leaf::empty())
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
            Node::Leaf(l) => l.mem_bytes(),
            Node::Branch(b) => {
                b.keys.capacity() * std::mem::size_of::<u64>() + b.children.capacity() * std::mem::size_of::<Ptr<V>>()
            }
        };
        std::mem::size_of::<Self>() + body
    }

    /// A clean node from a decoded block (children all on disk).
    pub fn from_body(level: u8, body: NodeBody) -> tarn_format::error::Result<Node<V>> {
        Ok(match body {
            NodeBody::Leaf(packed) => Node::Leaf(Leaf::from_packed(packed)?),
            NodeBody::Branch(children) => Node::Branch(Branch {
                level,
                keys: children.iter().map(|c| c.key).collect(),
                children: children.iter().map(|c| Ptr::Clean { pba: c.pba, crc: c.crc }).collect(),
            }),
        })
    }
}
