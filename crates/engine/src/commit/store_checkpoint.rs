//! The checkpoint step of a commit (format 2, see `meta/catalog.rs`):
//! with the commit lock held but not the pool lock, write the frozen
//! trees' dirty nodes and the catalog, flush, point the superblock at the
//! catalog, then adopt the written nodes under the pool lock.

use super::coalesce;
use crate::error::{EngineError, Result};
use crate::map::extent_map::Freed;
use crate::meta::catalog::{self, FrozenPool};
use crate::meta::checkpoint;
use crate::pool::{CommitCtl, Pool};
use crate::space::Space;
use std::sync::atomic::Ordering;
use tarn_format::superblock::FORMAT_VERSION;
use tarn_format::Pba;
use tarn_store::NodeAlloc;

/// Node blocks taken from the live space maps at a time.
const NODE_BATCH: u64 = 64;

/// Hands a checkpoint node blocks from the live space maps (after the
/// freeze: the frozen maps show them free, the catalog lists them).
struct PoolNodeAlloc<'a> {
    pool: &'a Pool,
    /// Taken, not yet handed out (popped from the end).
    batch: Vec<Pba>,
    used: Vec<(Pba, u64)>,
    error: Option<EngineError>,
}

impl NodeAlloc for PoolNodeAlloc<'_> {
    fn alloc_node(&mut self) -> Option<Pba> {
        if self.batch.is_empty() {
            self.refill().map_err(|e| self.error = Some(e)).ok()?;
        }
        let pba = self.batch.pop()?;
        self.used.push((pba, 1));
        Some(pba)
    }
}

impl PoolNodeAlloc<'_> {
    fn refill(&mut self) -> Result<()> {
        let mut inner = self.pool.write_inner();
        let space = &mut inner.space;
        let Some(dev) = space.roomiest() else { return Err(EngineError::NoSpace) };
        let want = NODE_BATCH.min(space.devices[dev].free_blocks);
        let pieces = space.allocate_metadata(dev, want)?.ok_or(EngineError::NoSpace)?;
        for (pba, len) in pieces.into_iter().rev() {
            self.batch.extend((0..len).rev().map(|i| pba.offset_by(i)));
        }
        Ok(())
    }

    /// Give back what was taken and not used; returns the blocks used.
    fn finish(self) -> Result<Vec<(Pba, u64)>> {
        let mut inner = self.pool.write_inner();
        for pba in self.batch {
            inner.space.give_back(pba, 1)?;
        }
        Ok(self.used)
    }
}

impl Pool {
    /// Step 3 for a checkpoint; returns the blocks to release once it is
    /// durable (and the caller released them after the superblock).
    pub(super) fn write_store_checkpoint(
        &self,
        ctl: &mut CommitCtl,
        frozen: FrozenPool,
        frees: &Freed,
    ) -> Result<Freed> {
        let started = std::time::Instant::now();
        let store = self.read_inner().state.store.clone();
        let mut alloc = PoolNodeAlloc { pool: self, batch: Vec::new(), used: Vec::new(), error: None };
        let wrote = frozen.write(&store, &mut alloc);
        if let Some(e) = alloc.error.take() {
            return Err(e);
        }
        let (mut catalog, written) = wrote?;
        let own = alloc.finish()?;
        // Everything this checkpoint makes free: nodes replaced before the
        // freeze, nodes the last checkpoint wrote and replaced, the last
        // catalog, the space the commit's ops released.
        let mut release: Freed = frozen.superseded.iter().map(|&p| (p, 1)).collect();
        release.extend(std::mem::take(&mut ctl.next_release));
        release.extend(ctl.checkpoint_pieces.iter().copied());
        let mut deferred = release.clone();
        deferred.extend(frees.iter().copied());
        catalog.own_nodes = catalog::ranges(own);
        catalog.deferred = catalog::ranges(deferred);
        catalog.inflight = catalog::ranges(frozen.inflight.clone());
        let payload = catalog.encode();
        let pieces = allocate_catalog(&mut self.write_inner().space, payload.len())?;
        let written_at = started.elapsed();
        self.flip_to(ctl, frozen.seq, &payload, &pieces)?;
        let durable_at = started.elapsed();
        let leftovers = {
            let mut inner = self.write_inner();
            let inner = &mut *inner;
            catalog::adopt(&mut inner.state, &mut inner.space, frozen, written)
        };
        // Released node blocks may be reused by data: no stale cache entry.
        for &(pba, len) in &release {
            (0..len).for_each(|i| store.forget(pba.offset_by(i)));
        }
        ctl.next_release = leftovers.into_iter().map(|p| (p, 1)).collect();
        ctl.checkpoint_pieces = pieces;
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        log::info!(
            "checkpoint {}: {} nodes and a {} B catalog written in {:?}, durable at {:?}, adopted at {:?}",
            ctl.journal.seq,
            catalog.own_nodes.iter().map(|r| r.1).sum::<u64>(),
            payload.len(),
            written_at,
            durable_at,
            started.elapsed()
        );
        Ok(coalesce(release))
    }

    /// Write the catalog, flush every device, then the superblock that
    /// points at it: the checkpoint is durable when this returns.
    fn flip_to(&self, ctl: &mut CommitCtl, seq: u64, payload: &[u8], pieces: &[(Pba, u64)]) -> Result<()> {
        let cref = checkpoint::write(&self.devices, pieces, seq, payload)?;
        for dev in &self.devices {
            dev.flush().map_err(|e| EngineError::io("flush checkpoint", dev.name(), e))?;
        }
        let mut sb = ctl.sb.clone();
        sb.version = FORMAT_VERSION;
        sb.txid += 1;
        sb.checkpoint = cref;
        sb.journal_generation += 1;
        sb.devices = self.device_table(&sb.devices);
        self.write_superblock(&sb)?;
        ctl.sb = sb;
        ctl.journal.generation = ctl.sb.journal_generation;
        ctl.journal.used = 0;
        ctl.journal.seq = seq;
        Ok(())
    }
}

/// Space for a catalog of `len` bytes, in at most 64 pieces from the
/// devices with the most free space (metadata may use the reserve).
fn allocate_catalog(space: &mut Space, len: usize) -> Result<Vec<(Pba, u64)>> {
    let need = checkpoint::blocks_needed(len);
    let mut pieces: Vec<(Pba, u64)> = Vec::new();
    for _ in 0..64 {
        if checkpoint::capacity(&pieces) >= len as u64 {
            break;
        }
        let Some(dev) = space.roomiest() else { break };
        let want = need.min(space.devices[dev].free_blocks);
        if want == 0 {
            break;
        }
        match space.allocate_metadata(dev, want)? {
            Some(more) => pieces.extend(more),
            None => break,
        }
    }
    if checkpoint::capacity(&pieces) < len as u64 {
        for &(pba, n) in &pieces {
            space.give_back(pba, n)?;
        }
        return Err(EngineError::NoSpace);
    }
    Ok(pieces)
}
