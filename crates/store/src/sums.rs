//! Data checksums on a tree: one crc32c per physical block, in groups of
//! 16 blocks keyed by `pba / 16` (device bits included), so a run of
//! blocks written together is one or two entries.

use crate::buffer::{Buffered, FrozenChanges, Merged};
use crate::error::Result;
use crate::tree::RootRef;
use crate::Store;
use tarn_format::node::{SumsValue, SUMS_GROUP};
use tarn_format::Pba;

/// Buffered (`buffer.rs`) like the volume maps: an overwrite in place
/// renews the sums of a block anywhere on the device, so under random
/// overwrites nearly every write would otherwise dirty a leaf of its own.
pub struct SumsTree {
    pub tree: Buffered<SumsValue>,
}

impl SumsTree {
    pub fn new(store: &Store, id: u64) -> SumsTree {
        SumsTree { tree: Buffered::new(store, id) }
    }

    pub fn open(store: &Store, id: u64, root: RootRef) -> Result<SumsTree> {
        Ok(SumsTree { tree: Buffered::open(store, id, root)? })
    }

    /// The changes since the last freeze, for a checkpoint to merge (O(1)).
    pub fn freeze(&mut self) -> FrozenChanges<SumsValue> {
        self.tree.freeze()
    }

    /// The merged tree of a durable checkpoint becomes the base.
    pub fn adopt(&mut self, frozen: &FrozenChanges<SumsValue>, merged: &Merged) -> bool {
        self.tree.adopt(frozen, merged)
    }

    /// Record the sums of blocks `pba..pba+sums.len()`.
    pub fn set(&mut self, store: &Store, pba: Pba, sums: &[u32]) -> Result<()> {
        let mut i = 0;
        while i < sums.len() {
            let block = pba.0 + i as u64;
            let (key, first) = (block / SUMS_GROUP, (block % SUMS_GROUP) as usize);
            let n = (SUMS_GROUP as usize - first).min(sums.len() - i);
            let mut v = self.tree.get(store, key)?.unwrap_or(SumsValue { known: 0, crcs: [0; SUMS_GROUP as usize] });
            v.crcs[first..first + n].copy_from_slice(&sums[i..i + n]);
            v.known |= (((1u32 << n) - 1) << first) as u16;
            self.tree.insert(store, key, v)?;
            i += n;
        }
        Ok(())
    }

    /// The sums of `len` blocks from `pba` (None where a block has none).
    pub fn get_run(&self, store: &Store, pba: Pba, len: u64) -> Result<Vec<Option<u32>>> {
        let mut out = Vec::with_capacity(len as usize);
        let mut group: Option<(u64, Option<SumsValue>)> = None;
        for b in pba.0..pba.0 + len {
            let key = b / SUMS_GROUP;
            if group.as_ref().is_none_or(|g| g.0 != key) {
                let found = self.tree.get(store, key)?;
                group = Some((key, found));
            }
            let bit = (b % SUMS_GROUP) as usize;
            out.push(group.as_ref().and_then(|g| g.1).filter(|v| v.known & (1 << bit) != 0).map(|v| v.crcs[bit]));
        }
        Ok(out)
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
        t.set(&store, base, &sums).unwrap();
        t.set(&store, base.offset_by(50), &[7, 8]).unwrap();
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
