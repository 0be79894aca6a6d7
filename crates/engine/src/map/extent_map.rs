//! A volume's map: logical 4 KiB blocks to physical blocks, as ranges, on
//! a copy-on-write B-tree of the metadata store (`tarn_store::ExtentTree`:
//! leaves kept as stored, ~9 bytes an extent).
//!
//! Entries never overlap; sequential writes merge into one entry when they
//! are also physically contiguous and born in the same epoch, so a large
//! sequential fill costs a handful of entries. Every read can fail (a node
//! read from a device may be damaged), so every method returns a `Result`.

use std::sync::Arc;
use tarn_format::node::ExtentValue;
use tarn_format::Pba;
pub use tarn_store::extents::{Extent, Killed, MapCounts, Segment};
use tarn_store::{ExtentTree, FrozenChanges, Merged, RootRef, Store, StoreError};

/// Physical ranges: (first block, count).
pub type Ranges = Vec<(Pba, u64)>;
/// Physical blocks a map change released.
pub type Freed = Ranges;

type Result<T> = std::result::Result<T, StoreError>;

/// What a map's tree is, in its nodes' headers: the kind in the top byte.
pub mod tree_id {
    pub const HEAD: u64 = 1 << 56;
    pub const DEAD_LIST: u64 = 2 << 56;
    pub const SUMS: u64 = 3 << 56;
    pub const SPACE: u64 = 4 << 56;
    pub fn head(vol: u32) -> u64 {
        HEAD | u64::from(vol)
    }
    pub fn dead_list(epoch: u64) -> u64 {
        DEAD_LIST | (epoch & ((1 << 56) - 1))
    }
    /// Device `device`'s free space.
    pub fn space(device: u16) -> u64 {
        SPACE | u64::from(device)
    }
}

/// Entries may point at real space or, in a clone, at the origin device
/// (`Pba::is_origin`): those count as mapped but hold no space.
pub struct ExtentMap {
    map: ExtentTree,
    store: Arc<Store>,
    /// Node blocks changes replaced: free once a checkpoint that no longer
    /// reaches them is durable.
    superseded: Vec<Pba>,
}

impl std::fmt::Debug for ExtentMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ExtentMap({:#x}, {:?})", self.map.id(), self.map.counts)
    }
}

impl ExtentMap {
    pub fn new(store: Arc<Store>, id: u64) -> ExtentMap {
        ExtentMap { map: ExtentTree::new(&store, id), store, superseded: Vec::new() }
    }

    /// A map a checkpoint recorded (its nodes are read on demand).
    pub fn open(store: Arc<Store>, id: u64, root: RootRef, counts: MapCounts) -> Result<ExtentMap> {
        Ok(ExtentMap { map: ExtentTree::open(&store, id, root, counts)?, store, superseded: Vec::new() })
    }

    /// A map a checkpoint kept in its catalog (an inline dead list).
    pub fn open_in_memory(store: Arc<Store>, id: u64, entries: &[(u64, ExtentValue)], counts: MapCounts) -> ExtentMap {
        ExtentMap { map: ExtentTree::open_in_memory(&store, id, entries, counts), store, superseded: Vec::new() }
    }

    pub fn tree_id(&self) -> u64 {
        self.map.id()
    }

    pub fn counts(&self) -> MapCounts {
        self.map.counts
    }

    /// The map's buffered changes, for a checkpoint to merge (O(1); see
    /// `tarn_store::buffer`).
    pub fn freeze(&mut self) -> FrozenChanges<ExtentValue> {
        self.map.freeze()
    }

    /// After the checkpoint that merged `frozen` is durable: its merged tree
    /// is the map's base. False if `frozen` is not this map's.
    pub fn adopt(&mut self, frozen: &FrozenChanges<ExtentValue>, merged: &Merged) -> bool {
        self.map.tree.adopt(frozen, merged)
    }

    /// After the checkpoint that kept `frozen` merged as `entries` in its
    /// catalog is durable: those entries, in memory, are the map's base.
    pub fn adopt_in_memory(&mut self, frozen: &FrozenChanges<ExtentValue>, entries: &[(u64, ExtentValue)]) -> bool {
        self.map.tree.adopt_in_memory(frozen, entries)
    }

    /// The map's entries live in memory only (a dead list the catalog
    /// holds), none in a node on a device.
    pub fn is_in_memory(&self) -> bool {
        self.map.tree.base_in_memory()
    }

    /// Blocks that are not holes (real data or origin markers).
    pub fn mapped_blocks(&self) -> u64 {
        self.map.counts.mapped_blocks
    }

    /// Blocks backed by real space.
    pub fn physical_blocks(&self) -> u64 {
        self.map.counts.mapped_blocks - self.map.counts.origin_blocks
    }

    /// Blocks still reading through to a clone's origin.
    pub fn origin_blocks(&self) -> u64 {
        self.map.counts.origin_blocks
    }

    pub fn extent_count(&self) -> usize {
        self.map.counts.extents as usize
    }

    /// Call `f` on entries in lba order, from the one covering `lba`, until
    /// it returns false.
    pub fn for_each_from(&self, lba: u64, f: &mut dyn FnMut(u64, Extent) -> bool) -> Result<()> {
        self.map.for_each_from(&self.store, lba, f)
    }

    /// Every entry, in lba order.
    pub fn entries(&self) -> Result<Killed> {
        let mut out = Vec::with_capacity(self.extent_count());
        self.for_each_from(0, &mut |lba, e| {
            out.push((lba, e));
            true
        })?;
        Ok(out)
    }

    /// Entries overlapping [lba, lba+len), clipped to it.
    pub fn entries_in(&self, lba: u64, len: u64) -> Result<Killed> {
        let segs = self.lookup(lba, len, usize::MAX)?;
        Ok(segs
            .into_iter()
            .filter_map(|s| match s {
                Segment::Mapped { lba, len, pba, birth } => Some((lba, Extent { len, pba, birth })),
                Segment::Hole { .. } => None,
            })
            .collect())
    }

    /// Segments covering exactly [lba, lba+len), in order, at most
    /// `max_segments` (the last one then ends early).
    pub fn lookup(&self, lba: u64, len: u64, max_segments: usize) -> Result<Vec<Segment>> {
        let out = self.map.lookup(&self.store, lba, len, max_segments)?;
        debug_assert!(out.windows(2).all(|w| w[0].lba() + w[0].len() == w[1].lba()));
        Ok(out)
    }

    /// Whether any block of [lba, lba+len) is mapped.
    pub fn any_mapped(&self, lba: u64, len: u64) -> Result<bool> {
        Ok(!self.map.overlapping(&self.store, lba, len)?.is_empty())
    }

    /// Make [lba, lba+len) a hole; returns the pieces it removed.
    pub fn remove(&mut self, lba: u64, len: u64) -> Result<Killed> {
        self.map.remove(&self.store, lba, len)
    }

    /// Map [lba, lba+len) to `pba`..; returns what the range used to map.
    pub fn insert(&mut self, lba: u64, len: u64, pba: Pba, birth: u64) -> Result<Killed> {
        self.map.insert(&self.store, lba, Extent { len, pba, birth })
    }

    /// Drop every entry; returns them all. Refused while a checkpoint
    /// merges the map (callers that clear hold the commit lock and finish
    /// the checkpoint first).
    pub fn clear(&mut self) -> Result<Killed> {
        let all = self.entries()?;
        let blocks = self.map.tree.clear(&self.store)?;
        self.superseded.extend(blocks);
        self.map.counts = MapCounts::default();
        Ok(all)
    }

    /// Blocks of the map's nodes on devices (walks the tree the last
    /// checkpoint wrote; changes since wait in memory).
    pub fn node_blocks(&self) -> Result<Vec<Pba>> {
        Ok(self.map.tree.base.walk(&self.store, &mut |_, _| {})?.blocks)
    }

    /// Node blocks replaced and not yet taken by a checkpoint.
    pub fn superseded(&self) -> &[Pba] {
        &self.superseded
    }

    /// Node blocks changes replaced since the last call.
    /// Make every node of this map stored on `device` dirty (`dev
    /// remove`'s last step): the next checkpoint writes them elsewhere.
    pub fn rewrite_device(&mut self, device: u16) -> Result<u64> {
        self.map.tree.rewrite_device(&self.store, device, &mut self.superseded)
    }

    pub fn take_superseded(&mut self) -> Vec<Pba> {
        std::mem::take(&mut self.superseded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(b: u64) -> Pba {
        Pba::new(0, b)
    }

    fn map() -> ExtentMap {
        ExtentMap::new(Arc::new(Store::memory()), tree_id::head(1))
    }

    /// Reference: one optional physical block per logical block.
    fn flatten(m: &ExtentMap, n: u64) -> Vec<Option<u64>> {
        let mut v = vec![None; n as usize];
        for (k, e) in m.entries().unwrap() {
            for i in 0..e.len {
                assert!(v[(k + i) as usize].is_none(), "overlap at {}", k + i);
                v[(k + i) as usize] = Some(e.pba.block() + i);
            }
        }
        v
    }

    #[test]
    fn sequential_inserts_merge_into_one_entry() {
        let mut m = map();
        for i in 0..100 {
            assert!(m.insert(i * 8, 8, p(1000 + i * 8), 1).unwrap().is_empty());
        }
        assert_eq!(m.extent_count(), 1);
        assert_eq!(m.mapped_blocks(), 800);
    }

    #[test]
    fn overwrite_in_the_middle_splits_and_frees_exactly() {
        let mut m = map();
        m.insert(0, 100, p(1000), 1).unwrap();
        let freed = m.insert(10, 5, p(5000), 1).unwrap();
        assert_eq!(freed, vec![(10, Extent { len: 5, pba: p(1010), birth: 1 })]);
        assert_eq!(m.extent_count(), 3);
        let freed = m.remove(0, 12).unwrap();
        assert_eq!(freed.iter().map(|f| f.1.len).sum::<u64>(), 12);
        assert_eq!(m.mapped_blocks(), 88);
        let segs = m.lookup(0, 20, 100).unwrap();
        assert_eq!(segs[0], Segment::Hole { lba: 0, len: 12 });
        assert_eq!(segs[1], Segment::Mapped { lba: 12, len: 3, pba: p(5002), birth: 1 });
        assert_eq!(segs[2], Segment::Mapped { lba: 15, len: 5, pba: p(1015), birth: 1 });
    }

    #[test]
    fn random_operations_match_a_flat_model() {
        let mut m = map();
        let mut model = vec![None; 256];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut phys = 10_000;
        for _ in 0..5000 {
            let lba = next() % 250;
            let len = 1 + next() % (256 - lba).min(9);
            if next() % 3 == 0 {
                let freed = m.remove(lba, len).unwrap();
                let n: u64 = freed.iter().map(|f| f.1.len).sum();
                let expect = (lba..lba + len).filter(|i| model[*i as usize].is_some()).count() as u64;
                assert_eq!(n, expect);
                (lba..lba + len).for_each(|i| model[i as usize] = None);
            } else {
                m.insert(lba, len, p(phys), 1).unwrap();
                (0..len).for_each(|i| model[(lba + i) as usize] = Some(phys + i));
                phys += len + next() % 2;
            }
            assert_eq!(flatten(&m, 256), model);
            assert_eq!(m.mapped_blocks(), model.iter().filter(|b| b.is_some()).count() as u64);
        }
        let segs = m.lookup(0, 256, usize::MAX).unwrap();
        assert_eq!(segs.iter().map(|s| s.len()).sum::<u64>(), 256);
        let mapped = m.mapped_blocks();
        assert_eq!(m.clear().unwrap().iter().map(|k| k.1.len).sum::<u64>(), mapped);
        assert_eq!((m.mapped_blocks(), m.extent_count()), (0, 0));
    }

    #[test]
    fn lookup_respects_max_segments() {
        let mut m = map();
        for i in 0..10 {
            m.insert(i * 2 + 1, 1, p(100 + i * 7), 1).unwrap();
        }
        for max in 2..25 {
            let segs = m.lookup(0, 20, max).unwrap();
            assert!(segs.len() <= max && !segs.is_empty());
            assert_eq!(segs[0].lba(), 0);
            // Regression: a truncated answer once ended with a hole covering
            // the rest of the range, reporting mapped blocks as holes.
            for s in &segs {
                let mapped = (s.lba()..s.lba() + s.len()).any(|b| m.any_mapped(b, 1).unwrap());
                if let Segment::Hole { .. } = s {
                    assert!(!mapped, "hole segment {s:?} covers mapped blocks (max {max})");
                }
            }
        }
    }
}
