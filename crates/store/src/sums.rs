//! Data checksums on a tree: one crc32c per physical block, in groups of
//! 16 blocks keyed by `pba / 16` (device bits included), so a run of
//! blocks written together is one or two entries.
//!
//! Changes wait in memory like the volume maps' (`buffer.rs`), without a
//! tree read per change: a sum set is laid over the group when read or
//! merged. An overwrite in place renews the sum of one block anywhere on
//! the device: kept per block, it costs ~40 bytes (as a whole group ~104,
//! and a tree descent to fill in the rest); a run of new data fills whole
//! groups, kept per group (16 blocks at ~104 bytes, not 640). A group
//! with three blocks set in a layer moves from the one to the other.

use crate::buffer::{merge_in_chunks, Merged, CHANGE_OVERHEAD};
use crate::error::{Result, StoreError};
use crate::node::Ptr;
use crate::tree::{RootRef, Tree};
use crate::{NodeAlloc, Store};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tarn_format::node::{SumsValue, SUMS_GROUP};
use tarn_format::Pba;

/// Blocks of one group set in a layer that make it a group entry.
const PROMOTE: usize = 3;

/// The blocks of group `key`.
fn group_blocks(key: u64) -> std::ops::Range<u64> {
    key * SUMS_GROUP..(key + 1) * SUMS_GROUP
}

/// Set one block's sum; a coarse group's crc goes (its other blocks have
/// no sum until set: the engine splits a group before that, see
/// `BlockSums`).
fn set_bit(v: &mut SumsValue, block: u64, crc: u32) {
    if v.coarse.is_some() {
        *v = NO_SUMS;
    }
    let bit = (block % SUMS_GROUP) as usize;
    v.crcs[bit] = crc;
    v.known |= 1 << bit;
}

const NO_SUMS: SumsValue = SumsValue { known: 0, crcs: [0; SUMS_GROUP as usize], coarse: None };

/// A block's checksum: its own, or its coarse group's (crc32c of the 64
/// KiB group the block is in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockSum {
    Block(u32),
    Group(u32),
}

/// Sums set in one layer (since a freeze): whole groups and single blocks;
/// a block is in at most one of the two.
#[derive(Debug, Default, Clone)]
struct SumChanges {
    groups: BTreeMap<u64, SumsValue>,
    blocks: BTreeMap<u64, u32>,
    /// Coarse groups this layer turned into sums per block: the sums below
    /// this layer no longer count (the group entry says all there is).
    cleared: std::collections::BTreeSet<u64>,
}

impl SumChanges {
    /// Memory held (about), for the store's bound on buffered changes.
    fn bytes(&self) -> u64 {
        let group = CHANGE_OVERHEAD + std::mem::size_of::<(u64, SumsValue)>();
        let block = CHANGE_OVERHEAD + std::mem::size_of::<(u64, u32)>();
        let cleared = CHANGE_OVERHEAD + std::mem::size_of::<u64>();
        (self.groups.len() * group + self.blocks.len() * block + self.cleared.len() * cleared) as u64
    }

    fn len(&self) -> usize {
        self.groups.len() + self.blocks.len()
    }

    fn set(&mut self, block: u64, crc: u32) {
        let key = block / SUMS_GROUP;
        if let Some(v) = self.groups.get_mut(&key) {
            if v.coarse.is_some() {
                self.cleared.insert(key);
            }
            set_bit(v, block, crc);
            return;
        }
        self.blocks.insert(block, crc);
        if self.blocks.range(group_blocks(key)).nth(PROMOTE - 1).is_some() {
            let mut v = NO_SUMS;
            let moved: Vec<(u64, u32)> = self.blocks.range(group_blocks(key)).map(|(&b, &c)| (b, c)).collect();
            for (b, c) in moved {
                set_bit(&mut v, b, c);
                self.blocks.remove(&b);
            }
            self.groups.insert(key, v);
        }
    }

    /// Set the sums of blocks `start..start + sums.len()`: whole groups as
    /// one entry each (what 16 `set` calls leave, without 16 map inserts
    /// per group: a 1 MiB write sets 16 groups), the ragged ends per block.
    fn set_run(&mut self, start: u64, sums: &[u32]) {
        let end = start + sums.len() as u64;
        let mut block = start;
        while block < end {
            let key = block / SUMS_GROUP;
            let whole = block.is_multiple_of(SUMS_GROUP) && end - block >= SUMS_GROUP;
            if !whole {
                self.set(block, sums[(block - start) as usize]);
                block += 1;
                continue;
            }
            let at = (block - start) as usize;
            let mut v = SumsValue { known: u16::MAX, crcs: [0; SUMS_GROUP as usize], coarse: None };
            v.crcs.copy_from_slice(&sums[at..at + SUMS_GROUP as usize]);
            // A block is in at most one of the two maps.
            let singles: Vec<u64> = self.blocks.range(group_blocks(key)).map(|(&b, _)| b).collect();
            for b in singles {
                self.blocks.remove(&b);
            }
            self.groups.insert(key, v);
            block += SUMS_GROUP;
        }
    }

    /// Set coarse groups `key..key + crcs.len()` (their single blocks go).
    fn set_groups(&mut self, key: u64, crcs: &[u32]) {
        for (k, &crc) in (key..).zip(crcs) {
            let singles: Vec<u64> = self.blocks.range(group_blocks(k)).map(|(&b, _)| b).collect();
            for b in singles {
                self.blocks.remove(&b);
            }
            self.groups.insert(k, SumsValue::group(crc));
        }
    }

    /// Lay this layer's sums of group `key` over `v`.
    fn overlay(&self, key: u64, v: &mut SumsValue) {
        if self.cleared.contains(&key) {
            *v = NO_SUMS;
        }
        if let Some(g) = self.groups.get(&key) {
            newer_over(v, g);
        }
        self.blocks.range(group_blocks(key)).for_each(|(&b, &c)| set_bit(v, b, c));
    }

    /// Take `newer`'s sums over these (a freeze that was never adopted
    /// under the sums set since).
    fn absorb(&mut self, newer: SumChanges) {
        for &key in &newer.cleared {
            let singles: Vec<u64> = self.blocks.range(group_blocks(key)).map(|(&b, _)| b).collect();
            for b in singles {
                self.blocks.remove(&b);
            }
            self.groups.remove(&key);
            self.cleared.insert(key);
        }
        for (key, g) in newer.groups {
            let covers = |b: &u64| g.coarse.is_some() || g.known & (1 << (b % SUMS_GROUP)) != 0;
            for b in group_blocks(key).filter(covers) {
                self.blocks.remove(&b);
            }
            let mut v = self.groups.get(&key).copied().unwrap_or(NO_SUMS);
            newer_over(&mut v, &g);
            self.groups.insert(key, v);
        }
        newer.blocks.into_iter().for_each(|(b, c)| self.set(b, c));
    }

    /// The groups with a sum set, in key order.
    fn group_keys(&self) -> Vec<u64> {
        let mut keys: Vec<u64> = self.groups.keys().copied().collect();
        keys.extend(self.blocks.keys().map(|b| b / SUMS_GROUP));
        keys.sort_unstable();
        keys.dedup();
        keys
    }
}

/// `newer`'s known sums over `v`: a coarse group replaces all; sums per
/// block replace a coarse group (see `set_bit`).
fn newer_over(v: &mut SumsValue, newer: &SumsValue) {
    if newer.coarse.is_some() || v.coarse.is_some() {
        *v = if newer.coarse.is_some() { *newer } else { NO_SUMS };
        if newer.coarse.is_some() {
            return;
        }
    }
    (0..SUMS_GROUP as usize).filter(|i| newer.known & (1 << i) != 0).for_each(|i| v.crcs[i] = newer.crcs[i]);
    v.known |= newer.known;
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
        self.counter.fetch_sub(self.bytes(), Ordering::Relaxed);
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
        SumsTree { base, pending: SumChanges::default(), frozen: None, counter: store.buffered.clone() }
    }

    pub fn id(&self) -> u64 {
        self.base.id
    }

    /// Make the base's nodes on `device` dirty (`Tree::rewrite_device`);
    /// refused while a checkpoint merges the tree.
    pub fn rewrite_device(&mut self, store: &Store, device: u16, sup: &mut Vec<Pba>) -> Result<u64> {
        if self.frozen.is_some() {
            let what = "rewritten while a checkpoint merges it".to_string();
            return Err(StoreError::Invalid { pba: Pba(0), tree: self.base.id, what });
        }
        self.base.rewrite_device(store, device, sup)
    }

    /// Changes held in memory (pending and frozen: groups and blocks).
    pub fn len(&self) -> usize {
        self.pending.len() + self.frozen.as_ref().map_or(0, |f| f.len())
    }

    fn bytes(&self) -> u64 {
        self.pending.bytes() + self.frozen.as_ref().map_or(0, |f| f.bytes())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Record the sums of blocks `pba..pba+sums.len()` (no tree read).
    pub fn set(&mut self, pba: Pba, sums: &[u32]) {
        let before = self.pending.bytes();
        self.pending.set_run(pba.0, sums);
        self.counter.fetch_add(self.pending.bytes(), Ordering::Relaxed);
        self.counter.fetch_sub(before, Ordering::Relaxed);
    }

    /// Record coarse sums: group `pba / 16 + i` has crc32c `crcs[i]` (`pba`
    /// a multiple of 16).
    pub fn set_groups(&mut self, pba: Pba, crcs: &[u32]) {
        debug_assert!(pba.0.is_multiple_of(SUMS_GROUP));
        let before = self.pending.bytes();
        self.pending.set_groups(pba.0 / SUMS_GROUP, crcs);
        self.counter.fetch_add(self.pending.bytes(), Ordering::Relaxed);
        self.counter.fetch_sub(before, Ordering::Relaxed);
    }

    /// Group `key`: the tree's, with the frozen then the pending sums over it.
    pub fn get_group(&self, store: &Store, key: u64) -> Result<Option<SumsValue>> {
        let base = self.base.get_le(store, key)?.filter(|(k, _)| *k == key).map(|(_, v)| v);
        let mut v = base.unwrap_or(NO_SUMS);
        self.frozen.iter().for_each(|f| f.overlay(key, &mut v));
        self.pending.overlay(key, &mut v);
        Ok((v.known != 0 || v.coarse.is_some()).then_some(v))
    }

    /// The sums of `len` blocks from `pba` (None where a block has none).
    pub fn get_run(&self, store: &Store, pba: Pba, len: u64) -> Result<Vec<Option<BlockSum>>> {
        let mut out = Vec::with_capacity(len as usize);
        let mut group: Option<(u64, Option<SumsValue>)> = None;
        for b in pba.0..pba.0 + len {
            let key = b / SUMS_GROUP;
            if group.as_ref().is_none_or(|g| g.0 != key) {
                group = Some((key, self.get_group(store, key)?));
            }
            let bit = (b % SUMS_GROUP) as usize;
            out.push(group.as_ref().and_then(|g| g.1).and_then(|v| match v.coarse {
                Some(crc) => Some(BlockSum::Group(crc)),
                None => (v.known & (1 << bit) != 0).then_some(BlockSum::Block(v.crcs[bit])),
            }));
        }
        Ok(out)
    }

    /// Hand the pending sums to a checkpoint (O(1)). Sums a failed
    /// checkpoint never adopted are handed again, under the newer ones.
    pub fn freeze(&mut self) -> FrozenSums {
        let mut changes = std::mem::take(&mut self.pending);
        if let Some(old) = self.frozen.take() {
            let before = old.bytes() + changes.bytes();
            let mut all = Arc::unwrap_or_clone(old);
            all.absorb(changes);
            changes = all;
            self.counter.fetch_add(changes.bytes(), Ordering::Relaxed);
            self.counter.fetch_sub(before, Ordering::Relaxed);
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
        let done = self.frozen.take().map_or(0, |f| f.bytes());
        self.counter.fetch_sub(done, Ordering::Relaxed);
        true
    }
}

impl FrozenSums {
    /// Sums frozen.
    pub fn len(&self) -> usize {
        self.changes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.changes.len() == 0
    }

    /// Lay the sums over a copy of the base, group by group in key order,
    /// and write it (`merge_in_chunks`). No lock: the live tree reads the
    /// old base and the buffers meanwhile.
    pub fn write(&self, store: &Store, alloc: &mut dyn NodeAlloc, generation: u64) -> Result<Merged> {
        let work = Tree { id: self.id, root: self.root.clone(), height: self.height };
        let apply = |work: &mut Tree<SumsValue>, key: u64, sup: &mut Vec<Pba>| {
            let old = work.get_le(store, key)?.filter(|(k, _)| *k == key).map(|(_, v)| v);
            let mut v = old.unwrap_or(NO_SUMS);
            self.changes.overlay(key, &mut v);
            work.insert(store, key, v, sup).map(drop)
        };
        merge_in_chunks(store, alloc, generation, work, self.changes.group_keys().into_iter(), apply)
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
                50 => Some(BlockSum::Block(7)),
                51 => Some(BlockSum::Block(8)),
                100 => None,
                _ => Some(BlockSum::Block(sums[i])),
            };
            assert_eq!(*g, want, "block {i}");
        }
        assert_eq!(t.get_run(&store, Pba::new(1, 1000), 4).unwrap(), vec![None; 4], "other device");
    }

    /// `set_run` leaves exactly what one `set` per block leaves: the same
    /// groups and single blocks, whatever was set before and however the
    /// run is aligned.
    #[test]
    fn runs_set_whole_groups_like_single_blocks() {
        let runs: [(u64, u64); 6] = [(3, 2), (16, 16), (5, 40), (32, 3), (40, 100), (0, 1)];
        for (i, &(start, len)) in runs.iter().enumerate() {
            let (mut fast, mut slow) = (SumChanges::default(), SumChanges::default());
            for &(s, l) in &runs[..i] {
                let before: Vec<u32> = (0..l).map(|k| (s + k) as u32 ^ 0x55).collect();
                fast.set_run(s, &before);
                (s..s + l).zip(&before).for_each(|(b, &c)| slow.set(b, c));
            }
            let sums: Vec<u32> = (0..len).map(|k| (k * 7 + start) as u32).collect();
            fast.set_run(start, &sums);
            (start..start + len).zip(&sums).for_each(|(b, &c)| slow.set(b, c));
            assert_eq!(fast.blocks, slow.blocks, "single blocks after run {i}");
            let groups = |c: &SumChanges| c.groups.iter().map(|(k, v)| (*k, v.known, v.crcs)).collect::<Vec<_>>();
            assert_eq!(groups(&fast), groups(&slow), "groups after run {i}");
        }
    }
}
