//! A volume map on a tree: logical block ranges to physical extents, with
//! the rules of the engine's in-memory map. Entries never overlap; a range
//! that continues its left or right neighbour logically and physically, in
//! the same epoch, merges with it, so a sequential fill is a few entries.

use crate::buffer::{Buffered, FrozenChanges};
use crate::error::{Result, StoreError};
use crate::tree::RootRef;
use crate::Store;
use tarn_format::node::ExtentValue;
use tarn_format::Pba;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    pub pba: Pba,
    pub birth: u64,
}

/// A piece of a looked-up range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    Mapped { lba: u64, len: u64, pba: Pba, birth: u64 },
    Hole { lba: u64, len: u64 },
}

impl Segment {
    pub fn lba(&self) -> u64 {
        match *self {
            Segment::Mapped { lba, .. } | Segment::Hole { lba, .. } => lba,
        }
    }
    pub fn len(&self) -> u64 {
        match *self {
            Segment::Mapped { len, .. } | Segment::Hole { len, .. } => len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Entries (or pieces) a change removed: (lba, extent).
pub type Killed = Vec<(u64, Extent)>;

fn value(e: Extent) -> ExtentValue {
    ExtentValue { len: e.len, pba: e.pba.0, birth: e.birth }
}

fn extent(v: &ExtentValue) -> Extent {
    Extent { len: v.len, pba: Pba(v.pba), birth: v.birth }
}

/// The blocks an entry covers: entries never overlap, which lets a lookup
/// skip the removed keys under the span of an entry the buffers hold.
fn span(v: &ExtentValue) -> u64 {
    v.len
}

/// Counts a checkpoint records beside the root, so opening reads no map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapCounts {
    pub mapped_blocks: u64,
    pub origin_blocks: u64,
    pub extents: u64,
}

/// The map's changes wait in a buffer until a checkpoint merges them
/// (`buffer.rs`): a random 4 KiB write costs a buffered change, not a
/// dirty leaf.
pub struct ExtentTree {
    pub tree: Buffered<ExtentValue>,
    pub counts: MapCounts,
}

impl ExtentTree {
    pub fn new(store: &Store, id: u64) -> ExtentTree {
        ExtentTree { tree: Buffered::new(store, id), counts: MapCounts::default() }
    }

    /// A map a checkpoint kept in its catalog: `entries` in memory.
    pub fn open_in_memory(store: &Store, id: u64, entries: &[(u64, ExtentValue)], counts: MapCounts) -> ExtentTree {
        ExtentTree { tree: Buffered::open_in_memory(store, id, entries), counts }
    }

    pub fn open(store: &Store, id: u64, root: RootRef, counts: MapCounts) -> Result<ExtentTree> {
        Ok(ExtentTree { tree: Buffered::open(store, id, root)?, counts })
    }

    pub fn id(&self) -> u64 {
        self.tree.id()
    }

    /// The map as it is now, for a checkpoint (O(1)).
    pub fn freeze(&mut self) -> FrozenChanges<ExtentValue> {
        self.tree.freeze()
    }

    /// Follow an extent added or removed in the counts; counts from disk
    /// that a change would take out of range are an error, never a panic.
    fn count(&mut self, e: Extent, add: bool) -> Result<()> {
        let origin = if e.pba.is_origin() { e.len } else { 0 };
        let c = &mut self.counts;
        let step = |n: u64, by: u64| if add { n.checked_add(by) } else { n.checked_sub(by) };
        let bad = |what| StoreError::Counts { tree: self.tree.id(), what };
        c.mapped_blocks = step(c.mapped_blocks, e.len).ok_or_else(|| bad("mapped blocks"))?;
        c.origin_blocks = step(c.origin_blocks, origin).ok_or_else(|| bad("origin blocks"))?;
        if c.origin_blocks > c.mapped_blocks {
            return Err(bad("more origin blocks than mapped ones"));
        }
        Ok(())
    }

    fn put(&mut self, store: &Store, lba: u64, e: Extent) -> Result<()> {
        if self.tree.insert(store, lba, value(e))?.is_none() {
            let more = self.counts.extents.checked_add(1);
            self.counts.extents = more.ok_or(StoreError::Counts { tree: self.tree.id(), what: "extents" })?;
        }
        Ok(())
    }

    /// Remove the entry at `lba`, which the caller just found.
    fn take(&mut self, store: &Store, lba: u64) -> Result<()> {
        if self.tree.remove_present(store, lba)?.is_some() {
            let fewer = self.counts.extents.checked_sub(1);
            self.counts.extents = fewer.ok_or(StoreError::Counts { tree: self.tree.id(), what: "extents" })?;
        }
        Ok(())
    }

    /// Entries overlapping `[lba, lba+len)`, unclipped, in order.
    pub fn overlapping(&self, store: &Store, lba: u64, len: u64) -> Result<Vec<(u64, Extent)>> {
        let end = lba.saturating_add(len);
        let mut out = Vec::new();
        if let Some((k, v)) = self.tree.get_le_spanning(store, lba, &span)? {
            if k < lba && k + v.len > lba {
                out.push((k, extent(&v)));
            }
        }
        self.tree.range(store, lba, end, &mut |k, v| {
            out.push((k, extent(v)));
            true
        })?;
        Ok(out)
    }

    /// Call `f` on every entry from the one covering `lba` on, in order,
    /// until it returns false.
    pub fn for_each_from(&self, store: &Store, lba: u64, f: &mut dyn FnMut(u64, Extent) -> bool) -> Result<()> {
        let mut from = lba;
        if let Some((k, v)) = self.tree.get_le_spanning(store, lba, &span)? {
            if k < lba && k + v.len > lba {
                if !f(k, extent(&v)) {
                    return Ok(());
                }
                from = k + v.len;
            }
        }
        self.tree.range(store, from, u64::MAX, &mut |k, v| f(k, extent(v)))
    }

    /// Segments covering exactly `[lba, lba+len)`, at most `max_segments`
    /// (the answer then ends early, never with a made-up hole).
    pub fn lookup(&self, store: &Store, lba: u64, len: u64, max_segments: usize) -> Result<Vec<Segment>> {
        let end = lba + len;
        let mut out = Vec::new();
        let mut pos = lba;
        for (k, e) in self.overlapping(store, lba, len)? {
            if out.len() + 2 > max_segments {
                return Ok(out);
            }
            if k > pos {
                out.push(Segment::Hole { lba: pos, len: k - pos });
            }
            let s = k.max(pos);
            let e_end = (k + e.len).min(end);
            out.push(Segment::Mapped { lba: s, len: e_end - s, pba: e.pba.offset_by(s - k), birth: e.birth });
            pos = e_end;
        }
        if pos < end && out.len() < max_segments {
            out.push(Segment::Hole { lba: pos, len: end - pos });
        }
        Ok(out)
    }

    /// Make `[lba, lba+len)` a hole; returns the pieces removed.
    pub fn remove(&mut self, store: &Store, lba: u64, len: u64) -> Result<Killed> {
        let end = lba + len;
        let mut killed = Vec::new();
        for (k, e) in self.overlapping(store, lba, len)? {
            let (s, t) = (k.max(lba), (k + e.len).min(end));
            self.take(store, k)?;
            if k < s {
                self.put(store, k, Extent { len: s - k, ..e })?;
            }
            if t < k + e.len {
                self.put(store, t, Extent { len: k + e.len - t, pba: e.pba.offset_by(t - k), birth: e.birth })?;
            }
            let piece = Extent { len: t - s, pba: e.pba.offset_by(s - k), birth: e.birth };
            self.count(piece, false)?;
            killed.push((s, piece));
        }
        Ok(killed)
    }

    /// Map `[lba, lba+len)` to `pba..`; returns what the range mapped before.
    /// Reads the neighbourhood once (the left neighbour, what the range
    /// overlaps, the right neighbour), then changes only what it must.
    pub fn insert(&mut self, store: &Store, lba: u64, new: Extent) -> Result<Killed> {
        assert!(new.len > 0, "empty extent");
        let end = lba + new.len;
        let mut near: Vec<(u64, Extent)> = Vec::new();
        // The left neighbour, then from `lba` on: no key lies between, and
        // a range from the neighbour would walk the removals there.
        if let Some((k, v)) = self.tree.get_le_spanning(store, lba.saturating_sub(1), &span)? {
            if k < lba {
                near.push((k, extent(&v)));
            }
        }
        self.tree.range(store, lba, end.saturating_add(1), &mut |k, v| {
            near.push((k, extent(v)));
            true
        })?;
        let mut killed = Vec::new();
        let (mut start, mut ext) = (lba, new);
        for (k, e) in near {
            let e_end = k + e.len;
            if e_end < lba || (e_end == lba && !joins(e, new)) || (k == end && !joins(new, e)) {
                continue;
            }
            self.take(store, k)?;
            if e_end == lba {
                (start, ext) = (k, Extent { len: e.len + ext.len, ..e });
                continue;
            }
            if k == end {
                ext.len += e.len;
                continue;
            }
            let (s, t) = (k.max(lba), e_end.min(end));
            if k < s {
                self.put(store, k, Extent { len: s - k, ..e })?;
            }
            if t < e_end {
                self.put(store, t, Extent { len: e_end - t, pba: e.pba.offset_by(t - k), birth: e.birth })?;
            }
            let piece = Extent { len: t - s, pba: e.pba.offset_by(s - k), birth: e.birth };
            self.count(piece, false)?;
            killed.push((s, piece));
        }
        self.put(store, start, ext)?;
        self.count(new, true)?;
        Ok(killed)
    }
}

/// Whether `b` continues `a` physically on the same device, same epoch.
fn joins(a: Extent, b: Extent) -> bool {
    a.pba.device() == b.pba.device() && a.pba.block() + a.len == b.pba.block() && a.birth == b.birth
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::MIN_CACHE_BYTES;
    use crate::{MemIo, NodeAlloc};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    struct Counter(u64);

    impl NodeAlloc for Counter {
        fn alloc_node(&mut self) -> Option<Pba> {
            self.0 += 1;
            Some(Pba::new(0, 1_000 + self.0))
        }
    }

    fn checkpoint(map: &mut ExtentTree, store: &Store, alloc: &mut Counter) {
        let (f, generation) = (map.freeze(), alloc.0);
        let merged = f.write(store, alloc, generation).unwrap();
        assert!(map.tree.adopt(&f, &merged));
    }

    /// A compaction's chain: each of many scattered blocks (checkpointed)
    /// is looked up, removed and mapped again right after the one before,
    /// so one entry grows over all their removed keys, half of them
    /// behind a checkpoint in progress. Every lookup must pass over a
    /// bounded number of keys, not the whole run behind it.
    #[test]
    fn a_run_grown_over_removed_keys_is_not_walked_by_later_lookups() {
        const N: u64 = 4_096;
        let store = Store::new(Arc::new(MemIo::default()), MIN_CACHE_BYTES).unwrap();
        let mut map = ExtentTree::new(&store, 7);
        let mut alloc = Counter(0);
        for b in 0..N {
            map.insert(&store, b, Extent { len: 1, pba: Pba::new(0, 100_000 + 2 * b), birth: 1 }).unwrap();
        }
        checkpoint(&mut map, &store, &mut alloc);
        assert_eq!(map.counts.extents, N);
        let mut frozen = None;
        for b in 0..N {
            let was = Segment::Mapped { lba: b, len: 1, pba: Pba::new(0, 100_000 + 2 * b), birth: 1 };
            assert_eq!(map.lookup(&store, b, 1, 2).unwrap(), vec![was]);
            map.remove(&store, b, 1).unwrap();
            map.insert(&store, b, Extent { len: 1, pba: Pba::new(0, 500_000 + b), birth: 1 }).unwrap();
            if b == N / 2 {
                frozen = Some(map.freeze());
            }
        }
        let moved = Segment::Mapped { lba: 0, len: N, pba: Pba::new(0, 500_000), birth: 1 };
        assert_eq!(map.lookup(&store, 0, N, 4).unwrap(), vec![moved]);
        assert_eq!(map.counts.extents, 1);
        let passed = map.tree.passed_over.load(Ordering::Relaxed);
        assert!(passed <= 4 * N, "lookups passed over {passed} keys for {N} moves");
        let f = frozen.unwrap();
        let merged = f.write(&store, &mut alloc, 99).unwrap();
        assert!(map.tree.adopt(&f, &merged));
        checkpoint(&mut map, &store, &mut alloc);
        assert_eq!(map.lookup(&store, N / 3, 5, 4).unwrap()[0].len(), 5);
        assert_eq!(map.counts.extents, 1);
    }
}
