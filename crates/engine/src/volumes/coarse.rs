//! Coarse checksums (COARSE_SUMS, docs/FORMAT.md *Data checksums*): one
//! crc32c per 64 KiB group of 16 physical blocks. Reads, scrub, heal and
//! resync verify them (`verify.rs`, `scrub.rs`, `resync.rs`); the writer
//! makes them for whole groups of new space (`io/mod.rs` `piece_sums`) and
//! splits them before a partial overwrite or free (`integrity/split.rs`).
//! [`Pool::coarsen_sums`] turns existing data coarse, for tests.

use crate::error::{EngineError, Result};
use crate::map::extent_map::Segment;
use crate::map::sums::{group_sum, GROUP_BYTES};
use crate::map::view::View;
use crate::pool::Pool;
use tarn_format::node::SUMS_GROUP;
use tarn_format::ops::{Op, MAX_GROUPS_PER_OP};
use tarn_format::{Pba, BLOCK_SIZE};

impl Pool {
    /// Test support: give the whole physical groups that blocks [lba, lba +
    /// len) of `vol`'s head map a coarse sum computed from their (verified)
    /// data, as the writer of a whole group will; sets COARSE_SUMS. Not for
    /// use with writes going on: returns how many groups became coarse.
    #[doc(hidden)]
    pub fn coarsen_sums(&self, vol: u32, lba: u64, len: u64) -> Result<u64> {
        if !self.checksums {
            return Err(EngineError::Inconsistent("coarse sums need data checksums".into()));
        }
        self.enable_coarse()?;
        let mut ops = Vec::new();
        for seg in self.resolve(vol, View::Head, lba, len)? {
            let Segment::Mapped { lba, len, pba, .. } = seg else { continue };
            if pba.is_origin() {
                continue;
            }
            let mut data = vec![0u8; (len * BLOCK_SIZE) as usize];
            self.read(vol, lba * BLOCK_SIZE, &mut data)?;
            let first = pba.0.div_ceil(SUMS_GROUP) * SUMS_GROUP;
            let end = (pba.0 + len) / SUMS_GROUP * SUMS_GROUP;
            let crcs: Vec<u32> = (first..end)
                .step_by(SUMS_GROUP as usize)
                .map(|g| {
                    let at = ((g - pba.0) * BLOCK_SIZE) as usize;
                    group_sum(&data[at..at + GROUP_BYTES])
                })
                .collect();
            for (i, chunk) in crcs.chunks(MAX_GROUPS_PER_OP).enumerate() {
                let at = Pba(first + (i * MAX_GROUPS_PER_OP) as u64 * SUMS_GROUP);
                ops.push(Op::GroupSums { pba: at.0, crcs: chunk.to_vec() });
            }
        }
        let groups = ops.iter().map(|op| if let Op::GroupSums { crcs, .. } = op { crcs.len() as u64 } else { 0 }).sum();
        // Durable with the next commit (the caller flushes).
        self.apply_ops(&mut self.write_inner(), ops)?;
        Ok(groups)
    }
}
