//! Data checksums (pools with the DATA_CHECKSUMS feature): one crc32c per
//! 4 KiB block, held by the metadata that points at the block — Sums ops in
//! the journal record that maps it, checksummed extent records in the
//! checkpoint — never next to the data, so a lost, misdirected or rotten
//! write cannot carry a matching checksum with it (Loris's parental
//! checksums; ZFS block pointers).
//!
//! In memory the sums sit in a table indexed by physical block: every
//! physical block is referenced by exactly one map entry (a head or one dead
//! list), and a clone's origin markers resolve to the origin's blocks, so a
//! block's sum is the same whatever view reads it.
//!
//! Overwriting a block in place cannot update data and checksum atomically.
//! Blocks are therefore overwritten in place only inside *open regions*
//! (64 MiB of physical space each): a region opens by a commit before the
//! first in-place write to it (until then writes there are redirected), and
//! closes, with every checksum of it durable, once idle. After a crash the
//! regions still open are resynchronized (`integrity/resync.rs`) — checksums
//! recomputed from whatever the blocks hold, copies made equal — like md's
//! write-intent bitmap. Everywhere else a mismatch is corruption.

use std::collections::{BTreeSet, HashMap};
use tarn_format::ops::region_of;
use tarn_format::{Pba, BLOCK_SIZE};

/// Blocks per table page (4 MiB of physical space).
const PAGE_SHIFT: u32 = 10;
const PAGE_BLOCKS: usize = 1 << PAGE_SHIFT;

/// The crc32c of one block of data (hardware-accelerated by the crc32c crate).
pub fn block_sum(block: &[u8]) -> u32 {
    debug_assert_eq!(block.len(), BLOCK_SIZE as usize);
    crc32c::crc32c(block)
}

/// The sums of consecutive blocks.
pub fn sums_of(data: &[u8]) -> Vec<u32> {
    data.chunks_exact(BLOCK_SIZE as usize).map(block_sum).collect()
}

struct Page {
    sums: [u32; PAGE_BLOCKS],
    known: [u64; PAGE_BLOCKS / 64],
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
/// a block is summed again whenever it is written).
#[derive(Default)]
pub struct BlockSums {
    pages: IntMap<Box<Page>>,
}

impl std::fmt::Debug for BlockSums {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockSums({} pages)", self.pages.len())
    }
}

impl Clone for BlockSums {
    fn clone(&self) -> Self {
        let pages = self.pages.iter().map(|(k, p)| (*k, Box::new(Page { sums: p.sums, known: p.known }))).collect();
        BlockSums { pages }
    }
}

impl BlockSums {
    /// Record the sums of blocks [pba, pba + sums.len()).
    pub fn set(&mut self, pba: Pba, sums: &[u32]) {
        for (i, &s) in sums.iter().enumerate() {
            let at = pba.0 + i as u64;
            let page = self
                .pages
                .entry(at >> PAGE_SHIFT)
                .or_insert_with(|| Box::new(Page { sums: [0; PAGE_BLOCKS], known: [0; PAGE_BLOCKS / 64] }));
            let slot = (at as usize) & (PAGE_BLOCKS - 1);
            page.sums[slot] = s;
            page.known[slot / 64] |= 1 << (slot % 64);
        }
    }

    pub fn get(&self, pba: Pba) -> Option<u32> {
        let page = self.pages.get(&(pba.0 >> PAGE_SHIFT))?;
        let slot = (pba.0 as usize) & (PAGE_BLOCKS - 1);
        (page.known[slot / 64] & (1 << (slot % 64)) != 0).then_some(page.sums[slot])
    }

    /// The sums of [pba, pba + len), None for blocks without one.
    pub fn get_run(&self, pba: Pba, len: u64) -> Vec<Option<u32>> {
        (0..len).map(|i| self.get(pba.offset_by(i))).collect()
    }

    /// All sums of [pba, pba + len), or None if any block lacks one.
    pub fn all(&self, pba: Pba, len: u64) -> Option<Vec<u32>> {
        (0..len).map(|i| self.get(pba.offset_by(i))).collect()
    }

    /// Memory the table holds, in bytes.
    pub fn bytes(&self) -> usize {
        self.pages.len() * std::mem::size_of::<Page>()
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

    #[test]
    fn table_keeps_sums_per_block_across_pages_and_devices() {
        let mut t = BlockSums::default();
        let a = Pba::new(0, PAGE_BLOCKS as u64 - 2);
        t.set(a, &[1, 2, 3, 4]);
        t.set(Pba::new(1, 5), &[9]);
        assert_eq!(t.get_run(a, 4), vec![Some(1), Some(2), Some(3), Some(4)]);
        assert_eq!(t.get(Pba::new(0, 5)), None);
        assert_eq!(t.get(Pba::new(1, 5)), Some(9));
        assert_eq!(t.all(a, 5), None);
        t.set(a.offset_by(1), &[0]);
        assert_eq!(t.all(a, 3), Some(vec![1, 0, 3]));
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
