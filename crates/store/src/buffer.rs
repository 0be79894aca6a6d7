//! A tree whose changes wait in memory (a Bε-tree's root buffer): a change
//! is a key set or removed in a sorted buffer, ~64 bytes, instead of a
//! leaf made dirty, 4 KiB. Under random writes nearly every change lands
//! in a leaf of its own, so a checkpoint that wrote dirty leaves wrote
//! about one node per 4 KiB written once a map outgrew the dirty bound;
//! buffered, a checkpoint merges many changes per leaf (docs/ARCHITECTURE.md
//! *Metadata store*).
//!
//! Three layers, newest first: `pending` (changes since the last freeze),
//! `frozen` (the changes the checkpoint in progress merges) and `base`
//! (the tree the last durable checkpoint wrote, never changed in place).
//! Reads look through the layers; a checkpoint merges `base` + `frozen`
//! into a new tree on its own copy, with no lock (`FrozenChanges::write`),
//! and `adopt` makes that tree the base once it is durable.

use crate::changes::Changes;
use crate::checkpoint::{NodeAlloc, Written};
use crate::error::{Result, StoreError};
use crate::node::Ptr;
use crate::tree::{RootRef, Tree};
use crate::Store;
use std::collections::BTreeMap;
use std::iter::Peekable;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tarn_format::node::LeafValue;
use tarn_format::Pba;

/// What one buffered change costs in memory beyond its key and value (the
/// B-tree's share), for the store's bound on memory held by buffers.
pub(crate) const CHANGE_OVERHEAD: usize = 24;

/// Changes a checkpoint merges before it writes the nodes they made dirty:
/// bounds the dirty nodes of a merge (each change dirties at most a path).
const CHUNK_CHANGES: usize = 2048;

pub struct Buffered<V: LeafValue> {
    pub base: Tree<V>,
    pending: Changes<V>,
    frozen: Option<Arc<Changes<V>>>,
    /// Keys lookups looked at and passed over (changed base keys, frozen
    /// keys `pending` changed): what a test bounds.
    #[cfg(test)]
    pub(crate) passed_over: AtomicU64,
    /// The store's bytes of buffered changes (all trees).
    counter: Arc<AtomicU64>,
}

/// The changes a checkpoint merges, and the base they go into.
pub struct FrozenChanges<V: LeafValue> {
    id: u64,
    root: Ptr<V>,
    height: u8,
    changes: Arc<Changes<V>>,
}

/// What a merge wrote.
#[derive(Debug, Default)]
pub struct Merged {
    pub root: RootRef,
    /// Blocks the new tree no longer uses (the base's nodes it replaced,
    /// nodes an earlier chunk wrote and a later one replaced): free once
    /// the checkpoint that records `root` is durable.
    pub superseded: Vec<Pba>,
    pub nodes: u64,
}

impl Default for RootRef {
    fn default() -> RootRef {
        RootRef::EMPTY
    }
}

/// Memory `n` buffered changes of `V` take (about).
fn bytes<V>(n: usize) -> u64 {
    (n * (CHANGE_OVERHEAD + std::mem::size_of::<(u64, Option<V>)>())) as u64
}

impl<V: LeafValue> Drop for Buffered<V> {
    fn drop(&mut self) {
        self.counter.fetch_sub(bytes::<V>(self.len()), Ordering::Relaxed);
    }
}

impl<V: LeafValue> Buffered<V> {
    pub fn new(store: &Store, id: u64) -> Buffered<V> {
        Buffered::over(store, Tree::new(id))
    }

    pub fn open(store: &Store, id: u64, root: RootRef) -> Result<Buffered<V>> {
        Ok(Buffered::over(store, Tree::open(id, root)?))
    }

    /// A small tree a checkpoint kept in its catalog (`FrozenChanges::small`):
    /// its entries in memory, no node on a device.
    pub fn open_in_memory(store: &Store, id: u64, entries: &[(u64, V)]) -> Buffered<V> {
        Buffered::over(store, Tree::in_memory(id, entries))
    }

    fn over(store: &Store, base: Tree<V>) -> Buffered<V> {
        Buffered {
            base,
            pending: Changes::default(),
            frozen: None,
            #[cfg(test)]
            passed_over: AtomicU64::new(0),
            counter: store.buffered.clone(),
        }
    }

    pub fn id(&self) -> u64 {
        self.base.id
    }

    /// Changes held (pending and frozen).
    pub fn len(&self) -> usize {
        self.pending.len() + self.frozen.as_ref().map_or(0, |f| f.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The base is a non-empty leaf in memory (`open_in_memory`,
    /// `adopt_in_memory`), not nodes on a device.
    pub fn base_in_memory(&self) -> bool {
        matches!(&self.base.root, Ptr::Dirty(n) if matches!(&**n, crate::node::Node::Leaf(l) if !l.is_empty()))
    }

    /// A checkpoint is merging this tree's frozen changes.
    pub fn is_merging(&self) -> bool {
        self.frozen.is_some()
    }

    /// The newest change to `key`: Some(None) if it was removed.
    fn changed(&self, key: u64) -> Option<Option<V>> {
        if let Some(c) = self.pending.get(key) {
            return Some(c);
        }
        self.frozen.as_ref().and_then(|f| f.get(key))
    }

    fn is_changed(&self, key: u64) -> bool {
        self.pending.contains(key) || self.frozen.as_ref().is_some_and(|f| f.contains(key))
    }

    pub fn get(&self, store: &Store, key: u64) -> Result<Option<V>> {
        if let Some(c) = self.changed(key) {
            return Ok(c);
        }
        Ok(self.base.get_le(store, key)?.filter(|(k, _)| *k == key).map(|(_, v)| v))
    }

    /// The entry with the greatest key <= `key`: the buffers' newest set
    /// key, unless the base has an unchanged key above it. Only base keys
    /// above the buffers' answer are scanned, so a run of removed keys
    /// below a set one (a compacted or overwritten range) costs nothing;
    /// a long run of removals alone (a large trim) is scanned, in leaves,
    /// until the next checkpoint merges it.
    pub fn get_le(&self, store: &Store, key: u64) -> Result<Option<(u64, V)>> {
        self.get_le_spanning(store, key, &|_| 1)
    }

    /// `get_le` in a tree whose entries cover `[key, key + span(value))`
    /// and never overlap (an extent map): no entry can start inside the
    /// span of the buffers' answer, so the base keys there (removed ones,
    /// when that entry grew over them by a merge) are not scanned.
    pub fn get_le_spanning(&self, store: &Store, key: u64, span: &dyn Fn(&V) -> u64) -> Result<Option<(u64, V)>> {
        let layered = self.layers_le(key);
        let lo = match layered {
            Some((k, v)) if k.saturating_add(span(&v)) > key => return Ok(layered),
            Some((k, v)) => k.saturating_add(span(&v).max(1)),
            None => 0,
        };
        let skip = |k: u64| self.passing_over(self.is_changed(k));
        Ok(self.base.get_le_except(store, lo, key, &skip)?.or(layered))
    }

    /// The greatest key <= `key` the buffers set (not removed): `pending`'s,
    /// or above it `frozen`'s unless `pending` changed it. Removed keys
    /// are kept apart (`Changes`), so none is walked.
    fn layers_le(&self, key: u64) -> Option<(u64, V)> {
        let newest = self.pending.sets_down(0, key).next();
        let floor = match newest {
            Some((k, _)) if k == key => return newest,
            Some((k, _)) => k + 1,
            None => 0,
        };
        let Some(frozen) = self.frozen.as_deref() else { return newest };
        let mut older = frozen.sets_down(floor, key);
        older.find(|(k, _)| !self.passing_over(self.pending.contains(*k))).or(newest)
    }

    /// Call `f` on every entry with `from <= key < to`, in order, until it
    /// returns false.
    pub fn range(&self, store: &Store, from: u64, to: u64, f: &mut dyn FnMut(u64, &V) -> bool) -> Result<()> {
        if from >= to {
            // `BTreeMap::range` panics on a reversed range.
            return Ok(());
        }
        let empty = Changes::default();
        let frozen = self.frozen.as_deref().unwrap_or(&empty);
        let mut layers = Layers::new(self.pending.range(from, to), frozen.range(from, to));
        let mut next = layers.next();
        let mut stopped = false;
        self.base.range(store, from, to, &mut |k, v| {
            while let Some((lk, c)) = next.filter(|(lk, _)| *lk <= k) {
                next = layers.next();
                if c.is_some_and(|lv| !f(lk, &lv)) {
                    stopped = true;
                    return false;
                }
                if lk == k {
                    return true;
                }
            }
            stopped = !f(k, v);
            !stopped
        })?;
        while let Some((lk, c)) = next.filter(|_| !stopped) {
            next = layers.next();
            stopped = c.is_some_and(|lv| !f(lk, &lv));
        }
        Ok(())
    }

    /// `skipped`, counted when true (in tests).
    fn passing_over(&self, skipped: bool) -> bool {
        #[cfg(test)]
        self.passed_over.fetch_add(skipped as u64, Ordering::Relaxed);
        skipped
    }

    /// Set `key`; returns the value it replaced.
    pub fn insert(&mut self, store: &Store, key: u64, value: V) -> Result<Option<V>> {
        let old = self.get(store, key)?;
        if self.pending.set(key, value) {
            self.counter.fetch_add(bytes::<V>(1), Ordering::Relaxed);
        }
        Ok(old)
    }

    /// Remove `key` (the caller just found it); returns its value.
    pub fn remove_present(&mut self, store: &Store, key: u64) -> Result<Option<V>> {
        // What the layers under `pending` hold at `key` (one lookup): a
        // tombstone is needed only if they hold something.
        let below = match self.frozen.as_ref().and_then(|f| f.get(key)) {
            Some(c) => c,
            None => self.base.get_le(store, key)?.filter(|(k, _)| *k == key).map(|(_, v)| v),
        };
        let old = self.pending.get(key).unwrap_or(below);
        let before = self.pending.len();
        if below.is_some() {
            self.pending.remove(key);
        } else {
            self.pending.forget(key);
        }
        let after = self.pending.len();
        self.counter.fetch_add(bytes::<V>(after), Ordering::Relaxed);
        self.counter.fetch_sub(bytes::<V>(before), Ordering::Relaxed);
        Ok(old)
    }

    /// Hand the pending changes to a checkpoint (O(1)). Changes a failed
    /// checkpoint never adopted are handed again, under the newer ones.
    pub fn freeze(&mut self) -> FrozenChanges<V> {
        let mut changes = std::mem::take(&mut self.pending);
        if let Some(old) = self.frozen.take() {
            let before = old.len() + changes.len();
            let mut all = Arc::unwrap_or_clone(old);
            all.append(changes);
            changes = all;
            self.counter.fetch_sub(bytes::<V>(before - changes.len()), Ordering::Relaxed);
        }
        let changes = Arc::new(changes);
        self.frozen = Some(changes.clone());
        FrozenChanges { id: self.base.id, root: self.base.root.clone(), height: self.base.height, changes }
    }

    /// Once the checkpoint that merged `frozen` into `root` is durable, that
    /// tree is the base. False (nothing changed) if these are not this
    /// tree's frozen changes.
    pub fn adopt(&mut self, frozen: &FrozenChanges<V>, merged: &Merged) -> bool {
        let ours = self.frozen.as_ref().is_some_and(|f| Arc::ptr_eq(f, &frozen.changes));
        if !ours {
            return false;
        }
        self.base = Tree::written(self.base.id, merged.root);
        let done = self.frozen.take().map_or(0, |f| f.len());
        self.counter.fetch_sub(bytes::<V>(done), Ordering::Relaxed);
        true
    }

    /// Once the checkpoint that kept `frozen` merged as `entries` in its
    /// catalog (`FrozenChanges::small`) is durable, those entries, in
    /// memory, are the base. False (nothing changed) if these are not this
    /// tree's frozen changes.
    pub fn adopt_in_memory(&mut self, frozen: &FrozenChanges<V>, entries: &[(u64, V)]) -> bool {
        let ours = self.frozen.as_ref().is_some_and(|f| Arc::ptr_eq(f, &frozen.changes));
        if !ours {
            return false;
        }
        // Under the engine's pool lock, once per inline list per
        // checkpoint: a list unchanged since the last one keeps its leaf.
        if !frozen.changes.is_empty() || !self.base_in_memory() {
            self.base = Tree::in_memory(self.base.id, entries);
        }
        let done = self.frozen.take().map_or(0, |f| f.len());
        self.counter.fetch_sub(bytes::<V>(done), Ordering::Relaxed);
        true
    }

    /// Make the base's nodes on `device` dirty (`Tree::rewrite_device`).
    /// Refused while a checkpoint merges the tree: the merged tree, not
    /// this base, is what the next checkpoint builds on.
    pub fn rewrite_device(&mut self, store: &Store, device: u16, sup: &mut Vec<Pba>) -> Result<u64> {
        if self.is_merging() {
            let what = "rewritten while a checkpoint merges it".to_string();
            return Err(StoreError::Invalid { pba: Pba(0), tree: self.base.id, what });
        }
        self.base.rewrite_device(store, device, sup)
    }

    /// Drop every entry; returns the base's node blocks (free once the next
    /// checkpoint is durable). Refused while a checkpoint merges the tree:
    /// the blocks to free are then the merged tree's.
    pub fn clear(&mut self, store: &Store) -> Result<Vec<Pba>> {
        if self.is_merging() {
            let what = "cleared while a checkpoint merges it".to_string();
            return Err(StoreError::Invalid { pba: Pba(0), tree: self.base.id, what });
        }
        let blocks = self.base.walk(store, &mut |_, _| {})?.blocks;
        self.counter.fetch_sub(bytes::<V>(self.pending.len()), Ordering::Relaxed);
        self.pending = Changes::default();
        self.base = Tree::new(self.base.id);
        Ok(blocks)
    }
}

/// `pending` over `frozen`, in key order; a key in both is `pending`'s.
struct Layers<V, I: Iterator<Item = (u64, Option<V>)>> {
    p: Peekable<I>,
    f: Peekable<I>,
}

impl<V, I: Iterator<Item = (u64, Option<V>)>> Layers<V, I> {
    fn new(p: I, f: I) -> Self {
        Layers { p: p.peekable(), f: f.peekable() }
    }

    fn next(&mut self) -> Option<(u64, Option<V>)> {
        match (self.p.peek(), self.f.peek()) {
            (None, None) => None,
            (Some(&(pk, _)), Some(&(fk, _))) if fk < pk => self.f.next(),
            (Some(&(pk, _)), Some(&(fk, _))) => {
                if fk == pk {
                    self.f.next();
                }
                self.p.next()
            }
            (Some(_), None) => self.p.next(),
            (None, Some(_)) => self.f.next(),
        }
    }
}

impl<V: LeafValue> FrozenChanges<V> {
    pub fn len(&self) -> usize {
        self.changes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The merged entries, when the base has no node on a device (empty or
    /// in memory: one leaf) and base and changes together hold at most
    /// `max` entries: a map small enough for the caller to keep in its
    /// catalog instead of a node (`Buffered::adopt_in_memory`). No I/O.
    pub fn small(&self, max: usize) -> Option<Vec<(u64, V)>> {
        let Ptr::Dirty(node) = &self.root else { return None };
        let crate::node::Node::Leaf(leaf) = &**node else { return None };
        // Past this many, the result cannot be small without removals
        // cancelling most of it: not worth the merge here.
        if self.height != 0 || leaf.len() > max || self.changes.len() > 4 * max {
            return None;
        }
        let mut all: BTreeMap<u64, V> = leaf.entries().into_iter().collect();
        for k in self.changes.removals() {
            all.remove(&k);
        }
        all.extend(self.changes.sets());
        (all.len() <= max).then(|| all.into_iter().collect())
    }

    /// Merge the changes into a copy of the base and write it, a chunk of
    /// changes at a time (each chunk's nodes written, then clean and
    /// cached, so a merge holds at most a chunk's dirty nodes). No lock:
    /// the live tree reads the old base and the buffers meanwhile.
    pub fn write(&self, store: &Store, alloc: &mut dyn NodeAlloc, generation: u64) -> Result<Merged> {
        let work = Tree { id: self.id, root: self.root.clone(), height: self.height };
        // Removals first: a set entry may reach over a key removed after
        // it (a merge of neighbours), and leaves hold entries that never
        // overlap. Then every set, in key order, meets only keys below it
        // already final and keys above it that start past its end.
        let removals = self.changes.removals().map(|k| (k, None));
        let sets = self.changes.sets().map(|(k, v)| (k, Some(v)));
        let apply = |work: &mut Tree<V>, (key, change): (u64, Option<V>), sup: &mut Vec<Pba>| match change {
            Some(v) => work.insert(store, key, v, sup).map(drop),
            None => work.remove(store, key, sup).map(drop),
        };
        merge_in_chunks(store, alloc, generation, work, removals.chain(sets), apply)
    }
}

/// Apply `changes` to `work` (a copy of a base tree) and write it, a chunk
/// of changes at a time: each chunk's nodes written, synced, then clean
/// and cached, so a merge holds at most a chunk's dirty nodes and a
/// client's FLUSH never waits for more than a chunk of node writeback.
pub(crate) fn merge_in_chunks<V: LeafValue, C>(
    store: &Store,
    alloc: &mut dyn NodeAlloc,
    generation: u64,
    mut work: Tree<V>,
    changes: impl Iterator<Item = C>,
    mut apply: impl FnMut(&mut Tree<V>, C, &mut Vec<Pba>) -> Result<()>,
) -> Result<Merged> {
    let mut merged = Merged::default();
    let mut since = 0;
    for change in changes {
        apply(&mut work, change, &mut merged.superseded)?;
        since += 1;
        if since == CHUNK_CHANGES {
            write_chunk(store, &mut work, alloc, generation, &mut merged.nodes)?;
            let device = || "the pool's devices".to_string();
            store.io.sync().map_err(|source| StoreError::Write { pba: Pba(0), device: device(), source })?;
            since = 0;
        }
    }
    merged.root = write_chunk(store, &mut work, alloc, generation, &mut merged.nodes)?;
    Ok(merged)
}

/// Write the work tree's dirty nodes and make them clean (cached).
fn write_chunk<V: LeafValue>(
    store: &Store,
    work: &mut Tree<V>,
    alloc: &mut dyn NodeAlloc,
    generation: u64,
    nodes: &mut u64,
) -> Result<RootRef> {
    let frozen = work.freeze();
    let mut written = Written::default();
    let root = frozen.write(store, alloc, generation, &mut written)?;
    *nodes += written.count;
    let replaced = work.adopt(store, frozen, &mut written);
    // Nothing changes the work tree between its freeze and its adopt.
    assert!(replaced.is_empty(), "a merge's nodes replaced while written");
    written.take_fills().apply(store);
    Ok(root)
}
