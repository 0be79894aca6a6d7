//! Data checksums (pools with the DATA_CHECKSUMS feature): one crc32c per
//! 4 KiB block, held by the metadata that points at the block — Sums ops in
//! the journal record that maps it, checksummed extent records in the
//! checkpoint — never next to the data, so a lost, misdirected or rotten
//! write cannot carry a matching checksum with it (Loris's parental
//! checksums; ZFS block pointers).
//!
//! The sums sit in a tree of the metadata store (`tarn_store::SumsTree`:
//! groups of 16 blocks keyed by physical block / 16) indexed by physical
//! block: every physical block is referenced by exactly one map entry (a
//! head or one dead list), and a clone's origin markers resolve to the
//! origin's blocks, so a block's sum is the same whatever view reads it.
//!
//! Overwriting a block in place cannot update data and checksum atomically.
//! Blocks are therefore overwritten in place only inside *open regions*
//! (64 MiB of physical space each): a region opens by a commit before the
//! first in-place write to it (until then writes there are redirected), and
//! closes, with every checksum of it durable, once idle. After a crash the
//! regions still open are resynchronized (`integrity/resync.rs`) — checksums
//! recomputed from whatever the blocks hold, copies made equal — like md's
//! write-intent bitmap. Everywhere else a mismatch is corruption.

use crate::map::extent_map::tree_id;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use tarn_format::node::SUMS_GROUP;
use tarn_format::ops::region_of;
use tarn_format::{Pba, BLOCK_SIZE};
pub use tarn_store::BlockSum;
use tarn_store::{FrozenSums, Merged, RootRef, Store, StoreError, SumsTree};

type Result<T> = std::result::Result<T, StoreError>;

/// The crc32c of one block of data.
pub fn block_sum(block: &[u8]) -> u32 {
    debug_assert_eq!(block.len(), BLOCK_SIZE as usize);
    tarn_format::checksum::crc32c(block)
}

/// Bytes a coarse checksum covers: one group of 16 blocks (64 KiB).
pub const GROUP_BYTES: usize = (SUMS_GROUP * BLOCK_SIZE) as usize;

/// The crc32c of one group's 64 KiB (a coarse checksum).
pub fn group_sum(group: &[u8]) -> u32 {
    debug_assert_eq!(group.len(), GROUP_BYTES);
    tarn_format::checksum::crc32c(group)
}

/// The sums of consecutive blocks.
pub fn sums_of(data: &[u8]) -> Vec<u32> {
    data.chunks_exact(BLOCK_SIZE as usize).map(block_sum).collect()
}

/// A hasher for integer keys: one multiply (the std SipHash showed up at
/// ~5% of a 4K write's instructions under callgrind).
#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl std::hash::Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A HashMap keyed by integers, hashed by [`IntHasher`].
pub type IntMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<IntHasher>>;

/// Checksums by physical block. Entries of freed blocks linger (harmless:
/// a block is summed again whenever it is written). Every read can fail (a
/// node read from a device may be damaged), so every method returns a
/// `Result`.
pub struct BlockSums {
    sums: SumsTree,
    store: Arc<Store>,
    /// Node blocks changes replaced: free once a checkpoint that no longer
    /// reaches them is durable.
    superseded: Vec<Pba>,
}

impl std::fmt::Debug for BlockSums {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockSums({:#x})", self.sums.id())
    }
}

impl BlockSums {
    /// An empty table on `store`.
    pub fn new(store: Arc<Store>) -> BlockSums {
        BlockSums { sums: SumsTree::new(&store, tree_id::SUMS), store, superseded: Vec::new() }
    }

    /// The table a checkpoint left at `root`.
    pub fn open(store: Arc<Store>, root: RootRef) -> Result<BlockSums> {
        Ok(BlockSums { sums: SumsTree::open(&store, tree_id::SUMS, root)?, store, superseded: Vec::new() })
    }

    /// Record the sums of blocks [pba, pba + sums.len()).
    pub fn set(&mut self, pba: Pba, sums: &[u32]) {
        self.sums.set(pba, sums);
    }

    /// Record coarse sums: group i at `pba + 16i` (`pba` a multiple of 16)
    /// has crc32c `crcs[i]`.
    pub fn set_groups(&mut self, pba: Pba, crcs: &[u32]) {
        self.sums.set_groups(pba, crcs);
    }

    /// The sum of block `pba` (its own or its group's), None if it has none.
    pub fn get(&self, pba: Pba) -> Result<Option<BlockSum>> {
        Ok(self.get_run(pba, 1)?.pop().flatten())
    }

    /// The sums of [pba, pba + len), None for blocks without one.
    pub fn get_run(&self, pba: Pba, len: u64) -> Result<Vec<Option<BlockSum>>> {
        self.sums.get_run(&self.store, pba, len)
    }

    /// All sums of [pba, pba + len) per block, or None if any block lacks
    /// one or has only its group's.
    pub fn all(&self, pba: Pba, len: u64) -> Result<Option<Vec<u32>>> {
        let per_block = |s: Option<BlockSum>| match s {
            Some(BlockSum::Block(c)) => Some(c),
            _ => None,
        };
        Ok(self.get_run(pba, len)?.into_iter().map(per_block).collect())
    }

    /// Node blocks replaced and not yet taken by a checkpoint.
    pub fn superseded(&self) -> &[Pba] {
        &self.superseded
    }

    /// Blocks of the tree's nodes on devices (walks the tree the last
    /// checkpoint wrote; changes since wait in memory).
    pub fn node_blocks(&self) -> Result<Vec<Pba>> {
        Ok(self.sums.base.walk(&self.store, &mut |_, _| {})?.blocks)
    }

    /// Node blocks changes replaced since the last call.
    /// Make every node of the sums tree stored on `device` dirty.
    pub fn rewrite_device(&mut self, device: u16) -> Result<u64> {
        self.sums.rewrite_device(&self.store, device, &mut self.superseded)
    }

    pub fn take_superseded(&mut self) -> Vec<Pba> {
        std::mem::take(&mut self.superseded)
    }

    /// The changes since the last freeze, for a checkpoint to merge.
    pub fn freeze(&mut self) -> FrozenSums {
        self.sums.freeze()
    }

    /// The merged tree of a durable checkpoint becomes the base; false if
    /// `frozen` is not this table's.
    pub fn adopt(&mut self, frozen: &FrozenSums, merged: &Merged) -> bool {
        self.sums.adopt(frozen, merged)
    }
}

/// Regions [pba, pba + len) touches.
pub fn regions_of(pba: Pba, len: u64) -> impl Iterator<Item = u64> {
    region_of(pba.0)..=region_of(pba.0 + len.max(1) - 1)
}

/// Commits a region may go without an in-place write before it closes: a
/// region closed too eagerly makes the next pass over it redirect again
/// (seen as 1M sequential overwrites at half speed with 8).
pub const IDLE_COMMITS: u64 = 64;

/// The live side of overwrite regions (the durable set is in the state).
#[derive(Debug, Default)]
pub struct RegionTracker {
    /// Regions writes wanted open; the next commit opens them.
    pub wanted: BTreeSet<u64>,
    /// Of those, how many were asked by redirected writes (a commit soon
    /// helps them); the others hold new data and can wait for any commit.
    pub urgent: usize,
    /// Commit count at the last in-place write, per open region.
    pub last_write: IntMap<u64>,
    /// Regions a crash left open, not yet resynced (`integrity/resync.rs`).
    pub suspect: BTreeSet<u64>,
    /// Physical ranges (start -> end) written to new space since the last
    /// commit took its ops: no durable map entry points at them, so they
    /// may be overwritten in place whatever their region (a crash forgets
    /// them). Allocation is next-fit, so these are few ranges.
    pub fresh: std::collections::BTreeMap<u64, u64>,
}

impl RegionTracker {
    /// Note new data at [pba, pba + len).
    pub fn add_fresh(&mut self, pba: Pba, len: u64) {
        let (start, end) = (pba.0, pba.0 + len);
        if let Some((_, e)) = self.fresh.range_mut(..=start).next_back().filter(|(_, e)| **e == start) {
            *e = end;
        } else {
            self.fresh.insert(start, end);
        }
    }

    /// Whether all of [pba, pba + len) is new data no commit has taken.
    pub fn is_fresh(&self, pba: Pba, len: u64) -> bool {
        self.fresh.range(..=pba.0).next_back().is_some_and(|(_, &e)| e >= pba.0 + len)
    }

    /// Open regions idle for `IDLE_COMMITS` commits as of commit `now`
    /// (not those awaiting resync: they close when resynced).
    pub fn idle(&self, open: &BTreeSet<u64>, now: u64) -> Vec<u64> {
        open.iter()
            .copied()
            .filter(|r| !self.suspect.contains(r))
            .filter(|r| self.last_write.get(r).is_none_or(|&t| t + IDLE_COMMITS <= now))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_block(s: Option<BlockSum>) -> Option<u32> {
        match s {
            Some(BlockSum::Block(c)) => Some(c),
            _ => None,
        }
    }

    /// A coarse group reads as its crc for each of its 16 blocks, is not
    /// per-block (`all`), and a sum per block set over it leaves only that
    /// block summed (the writer splits the group before, see *Data
    /// checksums* in docs/FORMAT.md).
    #[test]
    fn coarse_groups_read_per_block_and_give_way_to_block_sums() {
        let mut t = table();
        t.set_groups(Pba::new(1, 32), &[5, 6]);
        let run = t.get_run(Pba::new(1, 30), 36).unwrap();
        assert_eq!(run[..2], [None, None]);
        assert!(run[2..18].iter().all(|s| *s == Some(BlockSum::Group(5))));
        assert!(run[18..34].iter().all(|s| *s == Some(BlockSum::Group(6))));
        assert_eq!(t.all(Pba::new(1, 32), 1).unwrap(), None);
        t.set(Pba::new(1, 50), &[9]);
        assert_eq!(t.get(Pba::new(1, 50)).unwrap(), Some(BlockSum::Block(9)));
        assert_eq!(t.get(Pba::new(1, 51)).unwrap(), None);
        assert_eq!(t.get(Pba::new(1, 32)).unwrap(), Some(BlockSum::Group(5)));
    }

    fn table() -> BlockSums {
        BlockSums::new(Arc::new(Store::memory()))
    }

    #[test]
    fn table_keeps_sums_per_block_across_groups_and_devices() {
        let mut t = table();
        let group = SUMS_GROUP;
        let a = Pba::new(0, group - 2);
        t.set(a, &[1, 2, 3, 4]);
        t.set(Pba::new(1, 5), &[9]);
        let b = |c| Some(BlockSum::Block(c));
        assert_eq!(t.get_run(a, 4).unwrap(), vec![b(1), b(2), b(3), b(4)]);
        assert_eq!(t.get(Pba::new(0, 5)).unwrap(), None);
        assert_eq!(t.get(Pba::new(1, 5)).unwrap(), b(9));
        assert_eq!(t.all(a, 5).unwrap(), None);
        t.set(a.offset_by(1), &[0]);
        assert_eq!(t.all(a, 3).unwrap(), Some(vec![1, 0, 3]));
        assert!(t.take_superseded().is_empty(), "nothing was checkpointed, so no node block was replaced");
    }

    #[test]
    fn random_sets_match_a_model() {
        let mut t = table();
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // A few thousand blocks on two devices, runs crossing groups.
        let span = 4000;
        for round in 0..3000 {
            let dev = (next() % 2) as u16;
            let at = next() % span;
            let n = 1 + next() % 40;
            let sums: Vec<u32> = (0..n).map(|_| next() as u32).collect();
            let pba = Pba::new(dev, at);
            t.set(pba, &sums);
            for (i, &s) in sums.iter().enumerate() {
                model.insert(pba.0 + i as u64, s);
            }
            if round % 100 == 0 {
                let from = Pba::new(dev, next() % span);
                let len = 1 + next() % 100;
                let want: Vec<Option<u32>> = (0..len).map(|i| model.get(&(from.0 + i)).copied()).collect();
                let got: Vec<Option<u32>> = t.get_run(from, len).unwrap().into_iter().map(per_block).collect();
                assert_eq!(got, want, "run of {len} at {from}");
                let all: Option<Vec<u32>> = want.iter().copied().collect();
                assert_eq!(t.all(from, len).unwrap(), all);
            }
        }
        for dev in 0..2u16 {
            for b in 0..span + 50 {
                let pba = Pba::new(dev, b);
                assert_eq!(per_block(t.get(pba).unwrap()), model.get(&pba.0).copied(), "block {pba}");
            }
        }
    }

    #[test]
    fn regions_cover_the_range() {
        let r: Vec<u64> = regions_of(Pba::new(0, (1 << 14) - 1), 2).collect();
        assert_eq!(r, vec![0, 1]);
        assert_eq!(regions_of(Pba::new(2, 0), 1).next(), Some(2 << (48 - 14)));
    }

    #[test]
    fn sums_match_known_crc32c() {
        // crc32c of 4096 zero bytes.
        assert_eq!(block_sum(&[0u8; 4096]), 0x98f9_4189);
    }
}
