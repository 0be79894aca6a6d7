//! Resynchronizing the overwrite regions a crash left open (see `map/sums.rs`):
//! their blocks may hold data newer than their checksums (an in-place
//! write reached the disk, the commit with its sum did not), torn at sector
//! granularity, and mirror copies may differ. Any of those contents is a
//! valid outcome of unflushed writes, so for each block: keep a copy that
//! matches its sum, else copy 0's content with a new sum; make every copy
//! equal. Like md's resync after an unclean shutdown, it runs after open,
//! in the background (`tarn serve`), so opening never scans data; until a
//! region is done, reads there resync the blocks they touch first.

use crate::error::{EngineError, Result};
use crate::map::sums::{regions_of, sums_of, BlockSum, GROUP_BYTES};
use crate::pool::Pool;
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use tarn_format::node::SUMS_GROUP;
use tarn_format::ops::{region_of, Op, MAX_REGIONS_PER_OP};
use tarn_format::{Pba, BLOCK_SIZE};

const BS: usize = BLOCK_SIZE as usize;
/// Blocks resynced per hold of the I/O gate (1 MiB): short stalls.
const CHUNK_BLOCKS: u64 = 256;

impl Pool {
    /// Overwrite regions still waiting for their resync.
    pub fn resync_pending(&self) -> usize {
        self.read_inner().regions.suspect.len()
    }

    /// Whether `pba` lies in a region left open by a crash, not yet resynced.
    pub(crate) fn is_suspect(&self, pba: Pba) -> bool {
        let inner = self.read_inner();
        !inner.regions.suspect.is_empty() && inner.regions.suspect.contains(&region_of(pba.0))
    }

    /// Resync the suspect regions and queue their sums and their closing
    /// for the next commit. Called with the commit lock held.
    pub(crate) fn resync_suspects(&self) -> Result<u64> {
        Ok(self.resync_suspects_until(&|| false)?.unwrap_or(0))
    }

    /// [`Pool::resync_suspects`], checking `stop` between chunks: None if it
    /// stopped early (the regions stay suspect; the sums renewed so far are
    /// queued, and a checkpoint resyncs the rest).
    pub(crate) fn resync_suspects_until(&self, stop: &dyn Fn() -> bool) -> Result<Option<u64>> {
        let regions = self.read_inner().regions.suspect.clone();
        if regions.is_empty() {
            return Ok(Some(0));
        }
        let owned = self.owned_extents(|o| regions_of(o.pba, o.len).any(|r| regions.contains(&r)))?;
        let mut renewed = 0;
        for o in &owned {
            let mut at = 0;
            while at < o.len {
                if stop() {
                    return Ok(None);
                }
                let n = CHUNK_BLOCKS.min(o.len - at);
                renewed += self.resync_chunk(o.pba.offset_by(at), n, &regions)?;
                at += n;
            }
        }
        self.close_resynced(&regions, renewed)?;
        Ok(Some(renewed))
    }

    /// Resync the blocks of [pba, pba + n) in `regions`, I/O drained;
    /// returns how many sums were renewed.
    fn resync_chunk(&self, pba: Pba, n: u64, regions: &BTreeSet<u64>) -> Result<u64> {
        let _quiet = self.io_gate.write().unwrap_or_else(|p| p.into_inner());
        let mut renewed = 0;
        for pba in (0..n).map(|i| pba.offset_by(i)).filter(|p| regions.contains(&region_of(p.0))) {
            if self.resync_block(pba)?.1 {
                renewed += 1;
            }
        }
        Ok(renewed)
    }

    /// Every block of `regions` is resynced: they are no longer suspect,
    /// and the next commit closes them.
    fn close_resynced(&self, regions: &BTreeSet<u64>, renewed: u64) -> Result<()> {
        let mut inner = self.write_inner();
        inner.regions.suspect.clear();
        let ids: Vec<u64> = regions.iter().copied().collect();
        let ops = ids.chunks(MAX_REGIONS_PER_OP).map(|c| Op::Regions { open: false, ids: c.to_vec() }).collect();
        self.apply_ops(&mut inner, ops).map_err(|e| EngineError::Inconsistent(e.to_string()))?;
        log::warn!("resynchronized {} overwrite regions left open by a crash: {renewed} checksums renewed", ids.len());
        Ok(())
    }

    /// The first copy of `len` bytes at `pba` (a block or a coarse group)
    /// that can be read (a faulted or missing mirror leg cannot), and which
    /// copy it was.
    fn first_readable_copy(&self, pba: Pba, len: usize) -> Result<(Vec<u8>, usize)> {
        let dev = &self.devices[usize::from(pba.device())];
        let mut block = vec![0u8; len];
        let mut last = None;
        for copy in 0..dev.copies() {
            match dev.read_copy(copy, &mut block, pba.byte_offset()) {
                Ok(()) => return Ok((block, copy)),
                Err(e) => last = Some(e),
            }
        }
        let e = last.unwrap_or_else(|| std::io::Error::other("no copies"));
        Err(EngineError::io("resync read", dev.name(), e))
    }

    /// One block of a suspect region, I/O drained: its data (a copy matching
    /// the stored sum, else copy 0's), every copy made equal; true if its
    /// sum was renewed (the Sums op is queued). A block of a coarse group
    /// is resynced with its whole group.
    pub(crate) fn resync_block(&self, pba: Pba) -> Result<(Vec<u8>, bool)> {
        // Bound first: an `if let` scrutinee's lock guard would live through
        // the body, and `resync_span` takes the lock for writing.
        let sum = self.read_inner().state.sums.get(pba)?;
        if let Some(BlockSum::Group(_)) = sum {
            let first = Pba(pba.0 / SUMS_GROUP * SUMS_GROUP);
            let (group, renewed) = self.resync_span(first, GROUP_BYTES)?;
            let at = ((pba.0 - first.0) as usize) * BS;
            return Ok((group[at..at + BS].to_vec(), renewed));
        }
        self.resync_span(pba, BS)
    }

    /// [`Pool::resync_block`] of `len` bytes at `pba`: a block, or a whole
    /// coarse group (`pba` its first block), checked against the group's
    /// crc; a group that does not match gets a sum per block (a split).
    pub(crate) fn resync_span(&self, pba: Pba, len: usize) -> Result<(Vec<u8>, bool)> {
        let want = match self.read_inner().state.sums.get(pba)? {
            Some(BlockSum::Block(c)) if len == BS => c,
            Some(BlockSum::Group(c)) if len == GROUP_BYTES => c,
            _ => 0,
        };
        let c = self.examine_span(pba, len, want);
        if let Some(good) = c.good {
            self.rewrite_copies(pba, &good, &c.bad);
            return Ok((good, false));
        }
        let (block, source) = self.first_readable_copy(pba, len)?;
        let dev = &self.devices[usize::from(pba.device())];
        let others: Vec<usize> = (0..dev.copies()).filter(|&c| c != source).collect();
        self.rewrite_copies(pba, &block, &others);
        let op = Op::Sums { pba: pba.0, sums: sums_of(&block) };
        let mut inner = self.write_inner();
        self.apply_ops(&mut inner, vec![op]).map_err(|e| EngineError::Inconsistent(e.to_string()))?;
        self.counters.resynced_blocks.fetch_add((len / BS) as u64, Ordering::Relaxed);
        Ok((block, true))
    }
}
