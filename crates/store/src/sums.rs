//! Data checksums on a tree: one crc32c per physical block, in groups of
//! 16 blocks keyed by `pba / 16` (device bits included), so a run of
//! blocks written together is one or two entries.
//!
//! Changes wait in memory like the volume maps' (`buffer.rs`), but per
//! block, not per group: an overwrite in place renews the sum of one block
//! anywhere on the device, and buffered as a whole group (the group looked
//! up first) it cost a tree descent and ~104 bytes; as one block's sum it
//! costs neither descent nor more than ~40 bytes. A read lays the buffered
//! sums of its group over the tree's group; a checkpoint does the same
//! for every group it merges.

use crate::buffer::{merge_in_chunks, Merged, CHANGE_OVERHEAD};
use crate::error::Result;
use crate::node::Ptr;
use crate::tree::{RootRef, Tree};
use crate::{NodeAlloc, Store};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tarn_format::node::{SumsValue, SUMS_GROUP};
use tarn_format::Pba;

/// Sums set since a checkpoint: physical block number → crc32c.
type SumChanges = BTreeMap<u64, u32>;

/// Memory `n` buffered sums take (about).
fn bytes(n: usize) -> u64 {
    (n * (CHANGE_OVERHEAD + std::mem::size_of::<(u64, u32)>())) as u64
}

/// The blocks of group `key`.
fn group_blocks(key: u64) -> std::ops::Range<u64> {
    key * SUMS_GROUP..(key + 1) * SUMS_GROUP
}

/// `group` with the sums of `changes` laid over it (None if no block of
/// the group has a sum).
fn overlay<'a>(group: Option<SumsValue>, changes: impl Iterator<Item = (&'a u64, &'a u32)>) -> Option<SumsValue> {
    let mut v = group.unwrap_or(SumsValue { known: 0, crcs: [0; SUMS_GROUP as usize] });
    for (&block, &crc) in changes {
        let bit = (block % SUMS_GROUP) as usize;
        v.crcs[bit] = crc;
        v.known |= 1 << bit;
    }
    (v.known != 0).then_some(v)
}

pub struct SumsTree {
    /// The tree the last durable checkpoint wrote (never changed in place).
    pub base: Tree<SumsValue>,
    pending: SumChanges,
    /// The sums the checkpoint in progress merges.
    frozen: Option<Arc<SumChanges>>,
    /// The store's bytes of buffered changes (all trees).
    counter: Arc<AtomicU64>,
}

/// The sums a checkpoint merges, and the base they go into.
pub struct FrozenSums {
    id: u64,
    root: Ptr<SumsValue>,
    height: u8,
    changes: Arc<SumChanges>,
}

impl Drop for SumsTree {
    fn drop(&mut self) {
        self.counter.fetch_sub(bytes(self.len()), Ordering::Relaxed);
    }
}

impl SumsTree {
    pub fn new(store: &Store, id: u64) -> SumsTree {
        SumsTree::over(store, Tree::new(id))
    }

    pub fn open(store: &Store, id: u64, root: RootRef) -> Result<SumsTree> {
        Ok(SumsTree::over(store, Tree::open(id, root)?))
    }

    fn over(store: &Store, base: Tree<SumsValue>) -> SumsTree {
        SumsTree { base, pending: SumChanges::new(), frozen: None, counter: store.buffered.clone() }
    }

    pub fn id(&self) -> u64 {
        self.base.id
    }

    /// Sums held in memory (pending and frozen).
    pub fn len(&self) -> usize {
        self.pending.len() + self.frozen.as_ref().map_or(0, |f| f.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Record the sums of blocks `pba..pba+sums.len()` (no tree read).
    pub fn set(&mut self, pba: Pba, sums: &[u32]) {
        let added = (pba.0..).zip(sums).filter(|(block, &crc)| self.pending.insert(*block, crc).is_none()).count();
        self.counter.fetch_add(bytes(added), Ordering::Relaxed);
    }

    /// Group `key`: the tree's, with the frozen then the pending sums over it.
    pub fn get_group(&self, store: &Store, key: u64) -> Result<Option<SumsValue>> {
        let base = self.base.get_le(store, key)?.filter(|(k, _)| *k == key).map(|(_, v)| v);
        let frozen = self.frozen.iter().flat_map(|f| f.range(group_blocks(key)));
        Ok(overlay(base, frozen.chain(self.pending.range(group_blocks(key)))))
    }

    /// The sums of `len` blocks from `pba` (None where a block has none).
    pub fn get_run(&self, store: &Store, pba: Pba, len: u64) -> Result<Vec<Option<u32>>> {
        let mut out = Vec::with_capacity(len as usize);
        let mut group: Option<(u64, Option<SumsValue>)> = None;
        for b in pba.0..pba.0 + len {
            let key = b / SUMS_GROUP;
            if group.as_ref().is_none_or(|g| g.0 != key) {
                group = Some((key, self.get_group(store, key)?));
            }
            let bit = (b % SUMS_GROUP) as usize;
            out.push(group.as_ref().and_then(|g| g.1).filter(|v| v.known & (1 << bit) != 0).map(|v| v.crcs[bit]));
        }
        Ok(out)
    }

    /// Hand the pending sums to a checkpoint (O(1)). Sums a failed
    /// checkpoint never adopted are handed again, under the newer ones.
    pub fn freeze(&mut self) -> FrozenSums {
        let mut changes = std::mem::take(&mut self.pending);
        if let Some(old) = self.frozen.take() {
            let before = old.len() + changes.len();
            let mut all = Arc::unwrap_or_clone(old);
            all.append(&mut changes);
            changes = all;
            self.counter.fetch_sub(bytes(before - changes.len()), Ordering::Relaxed);
        }
        let changes = Arc::new(changes);
        self.frozen = Some(changes.clone());
        FrozenSums { id: self.base.id, root: self.base.root.clone(), height: self.base.height, changes }
    }

    /// Once the checkpoint that merged `frozen` into `merged.root` is
    /// durable, that tree is the base. False (nothing changed) if these are
    /// not this tree's frozen sums.
    pub fn adopt(&mut self, frozen: &FrozenSums, merged: &Merged) -> bool {
        if !self.frozen.as_ref().is_some_and(|f| Arc::ptr_eq(f, &frozen.changes)) {
            return false;
        }
        self.base = Tree::written(self.base.id, merged.root);
        let done = self.frozen.take().map_or(0, |f| f.len());
        self.counter.fetch_sub(bytes(done), Ordering::Relaxed);
        true
    }
}

impl FrozenSums {
    /// Sums frozen.
    pub fn len(&self) -> usize {
        self.changes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Lay the sums over a copy of the base, group by group in key order,
    /// and write it (`merge_in_chunks`). No lock: the live tree reads the
    /// old base and the buffers meanwhile.
    pub fn write(&self, store: &Store, alloc: &mut dyn NodeAlloc, generation: u64) -> Result<Merged> {
        let work = Tree { id: self.id, root: self.root.clone(), height: self.height };
        let mut keys: Vec<u64> = self.changes.keys().map(|b| b / SUMS_GROUP).collect();
        keys.dedup();
        let apply = |work: &mut Tree<SumsValue>, key: u64, sup: &mut Vec<Pba>| {
            let old = work.get_le(store, key)?.filter(|(k, _)| *k == key).map(|(_, v)| v);
            match overlay(old, self.changes.range(group_blocks(key))) {
                Some(v) => work.insert(store, key, v, sup).map(drop),
                None => Ok(()),
            }
        };
        merge_in_chunks(store, alloc, generation, work, keys.into_iter(), apply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::MIN_CACHE_BYTES;
    use crate::MemIo;
    use std::sync::Arc;

    #[test]
    fn runs_across_groups_read_back() {
        let store = Store::new(Arc::new(MemIo::default()), MIN_CACHE_BYTES).unwrap();
        let mut t = SumsTree::new(&store, 4);
        let base = Pba::new(2, 1000);
        let sums: Vec<u32> = (0..100).map(|i| i * 31 + 1).collect();
        t.set(base, &sums);
        t.set(base.offset_by(50), &[7, 8]);
        let got = t.get_run(&store, base, 101).unwrap();
        for (i, g) in got.iter().enumerate() {
            let want = match i {
                50 => Some(7),
                51 => Some(8),
                100 => None,
                _ => Some(sums[i]),
            };
            assert_eq!(*g, want, "block {i}");
        }
        assert_eq!(t.get_run(&store, Pba::new(1, 1000), 4).unwrap(), vec![None; 4], "other device");
    }
}
