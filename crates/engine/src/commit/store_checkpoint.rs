//! Writing a checkpoint (see `meta/catalog.rs`) once a commit froze the
//! trees: with no pool lock and, usually, no commit lock (commits go on in
//! the next journal side), write the frozen trees' dirty nodes and the
//! catalog and flush; then, under the commit lock, point the superblock at
//! the catalog, and adopt the written nodes under the pool lock.

use super::coalesce;
use crate::error::{EngineError, Result};
use crate::map::extent_map::Freed;
use crate::meta::catalog;
use crate::meta::checkpoint;
use crate::pool::{CheckpointSlot, CommitCtl, FrozenCheckpoint, Pool, WrittenCheckpoint};
use crate::space::Space;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tarn_format::superblock::{incompat, Superblock, FORMAT_VERSION};
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
        let Some(dev) = space.metadata_device(NODE_BATCH) else { return Err(EngineError::NoSpace) };
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
    /// Write a frozen checkpoint's nodes and catalog and flush every
    /// device (no commit lock needed: commits go on in the next journal
    /// side). The superblock is `flip_checkpoint`'s.
    pub(super) fn write_checkpoint(
        &self,
        slot: &mut CheckpointSlot,
        ck: FrozenCheckpoint,
    ) -> Result<WrittenCheckpoint> {
        let started = std::time::Instant::now();
        let FrozenCheckpoint { frozen, record_frees, generation } = ck;
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
        // catalog; and (already free in the live pool, used in the frozen
        // space maps) the space its commit's ops released.
        let mut release: Freed = frozen.superseded.iter().map(|&p| (p, 1)).collect();
        release.extend(written.merge_superseded().map(|p| (p, 1)));
        // Cloned: until the superblock flips, the slot still lists them (the
        // checker counts them owned); the flip replaces the list.
        release.extend(slot.next_release.iter().copied());
        release.extend(slot.pieces.iter().copied());
        let mut deferred = release.clone();
        deferred.extend(record_frees.iter().copied());
        catalog.own_nodes = catalog::ranges(own.clone());
        catalog.deferred = catalog::ranges(deferred);
        catalog.inflight = catalog::ranges(frozen.inflight.clone());
        let payload = catalog.encode();
        let pieces = allocate_catalog(&mut self.write_inner().space, payload.len())?;
        let cref = checkpoint::write(&self.devices.to_vec(), &pieces, frozen.seq, &payload)?;
        for dev in self.devices.iter() {
            dev.flush().map_err(|e| EngineError::io("flush checkpoint", dev.name(), e))?;
        }
        let catalog_bytes = payload.len();
        Ok(WrittenCheckpoint {
            frozen,
            generation,
            written,
            catalog: cref,
            pieces,
            own,
            release,
            started,
            catalog_bytes,
        })
    }

    /// Point the superblock at a written checkpoint (durable when this
    /// returns), adopt its nodes and release the node blocks it made free.
    /// Returns the data space freed while it was written, to be released
    /// by the caller.
    pub(super) fn flip_checkpoint(
        &self,
        ctl: &mut CommitCtl,
        slot: &mut CheckpointSlot,
        w: WrittenCheckpoint,
    ) -> Result<Freed> {
        // One checkpoint at a time: the journal is still in its side.
        assert_eq!(ctl.journal.generation, w.generation, "the journal moved sides during a checkpoint");
        let written_at = w.started.elapsed();
        let mut sb = ctl.sb.clone();
        sb.version = FORMAT_VERSION;
        sb.txid += 1;
        sb.checkpoint = w.catalog;
        sb.journal_generation = w.generation;
        table_changes(ctl, &mut sb);
        sb.devices = self.device_table(&sb.devices);
        self.write_superblock(&sb)?;
        ctl.sb = sb;
        ctl.checkpoint_busy = false;
        let durable_at = w.started.elapsed();
        let store = self.read_inner().state.store.clone();
        let (leftovers, fills, retired) = {
            let mut inner = self.write_inner();
            let inner = &mut *inner;
            let adopted = catalog::adopt(&mut inner.state, &mut inner.space, w.frozen, w.written);
            self.merging.store(false, Ordering::SeqCst);
            adopted
        };
        // Writers wait on the pool lock: the cache inserts and the freeing of
        // the merged buffers come after it.
        drop(retired);
        fills.apply(&store);
        // Released node blocks may be reused by data: no stale cache entry.
        for &(pba, len) in &w.release {
            (0..len).for_each(|i| store.forget(pba.offset_by(i)));
        }
        slot.next_release = leftovers.into_iter().map(|p| (p, 1)).collect();
        slot.pieces = w.pieces;
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        log::info!(
            "checkpoint {}: {} nodes and a {} B catalog written in {:?}, durable at {:?}, adopted at {:?}",
            w.catalog.seq,
            w.own.iter().map(|r| r.1).sum::<u64>(),
            w.catalog_bytes,
            written_at,
            durable_at,
            w.started.elapsed()
        );
        // Node blocks are not punched: the next checkpoints reuse them, and
        // a punch takes the pool file's inode lock, which every data write
        // waits for (tens of punches per checkpoint stalled writes 150 ms).
        self.release_unpunched(coalesce(w.release))?;
        Ok(coalesce(std::mem::take(&mut ctl.held_frees)))
    }

    /// Bring the checkpoint in progress, if any, to durable: write it if
    /// nobody did, flip its superblock. Returns the space to release.
    pub(super) fn finish_checkpoint(&self, ctl: &mut CommitCtl) -> Result<Freed> {
        let mut slot = self.lock_checkpoint();
        self.write_frozen(&mut slot)?;
        match slot.written.take() {
            Some(w) => self.flip_checkpoint(ctl, &mut slot, *w),
            None => Ok(Freed::new()),
        }
    }

    /// Write the checkpoint a commit froze, with commits going on meanwhile
    /// (the service's checkpointer thread calls this; a commit that needs
    /// the journal side or memory it holds finishes it itself). The commit
    /// lock is taken only for the superblock.
    pub fn checkpoint_work(&self) -> Result<()> {
        if self.is_fenced() {
            return Ok(());
        }
        let result = self.checkpoint_steps();
        if let Err(e) = &result {
            log::error!("checkpoint failed, fencing the pool: {e}");
            self.fenced.store(true, Ordering::SeqCst);
        }
        result
    }

    fn checkpoint_steps(&self) -> Result<()> {
        if !self.write_frozen(&mut self.lock_checkpoint())? {
            return Ok(());
        }
        let mut ctl = self.lock_commit();
        let frees = self.finish_checkpoint(&mut ctl)?;
        self.release(frees)
    }

    /// Write the frozen checkpoint, if the slot holds one (false if not),
    /// leaving it written for its superblock.
    fn write_frozen(&self, slot: &mut CheckpointSlot) -> Result<bool> {
        let Some(ck) = slot.frozen.take() else { return Ok(false) };
        self.checkpoint_waiting.store(false, Ordering::SeqCst);
        let w = self.write_checkpoint(slot, *ck)?;
        slot.written = Some(Box::new(w));
        Ok(true)
    }

    /// A checkpoint is frozen and not yet durable.
    pub fn checkpoint_in_progress(&self) -> bool {
        self.lock_commit().checkpoint_busy
    }

    /// A frozen checkpoint waits to be written.
    pub fn checkpoint_waiting(&self) -> bool {
        self.checkpoint_waiting.load(Ordering::SeqCst)
    }

    /// Sleep until a commit freezes a checkpoint, [`Pool::wake_checkpointer`]
    /// is called, or `timeout` passes (spurious wake-ups too); whether a
    /// frozen checkpoint waits. `stopping` is looked at under the slot's
    /// lock, which the waker takes after setting it: no wake-up is lost.
    pub(crate) fn wait_checkpoint_frozen(&self, timeout: Duration, stopping: impl Fn() -> bool) -> bool {
        let slot = self.lock_checkpoint();
        if self.checkpoint_waiting() || stopping() {
            return self.checkpoint_waiting();
        }
        drop(self.checkpoint_frozen.wait_timeout(slot, timeout).unwrap_or_else(|p| p.into_inner()));
        self.checkpoint_waiting()
    }

    /// Wake the checkpointer from [`Pool::wait_checkpoint_frozen`], after
    /// its `stopping` became true (so it stops at once).
    pub(crate) fn wake_checkpointer(&self) {
        let _slot = self.lock_checkpoint();
        self.checkpoint_frozen.notify_all();
    }
}

/// Space for a catalog of `len` bytes, in at most 64 pieces, on the
/// primary while it has room, else the devices with the most free space
/// (metadata may use the reserve; `Space::metadata_device`).
fn allocate_catalog(space: &mut Space, len: usize) -> Result<Vec<(Pba, u64)>> {
    let need = checkpoint::blocks_needed(len);
    let mut pieces: Vec<(Pba, u64)> = Vec::new();
    for _ in 0..64 {
        if checkpoint::capacity(&pieces) >= len as u64 {
            break;
        }
        let Some(dev) = space.metadata_device(need) else { break };
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

/// The device table changes this checkpoint's catalog carries: a member
/// or spare added, a member grown, a slot removed, a spare taken.
fn table_changes(ctl: &mut CommitCtl, sb: &mut Superblock) {
    // A member being added: this checkpoint's catalog has its space map.
    if let Some(e) = ctl.adding.take() {
        if e.spare {
            sb.incompat |= incompat::EVACUATION | incompat::SPARES;
        }
        sb.devices.push(e);
    }
    if let Some(e) = ctl.taking.take().and_then(|i| sb.devices.get_mut(i)) {
        // This checkpoint's catalog has the spare's whole space map.
        e.spare = false;
    }
    if let Some((i, blocks)) = ctl.growing.take() {
        if let Some(e) = sb.devices.get_mut(i) {
            e.blocks = blocks;
        }
        if i == 0 {
            sb.device_blocks = blocks;
        }
    }
    if let Some(e) = ctl.removing.take().and_then(|i| sb.devices.get_mut(i)) {
        // This checkpoint's catalog has the slot's empty space map.
        e.removed = true;
        e.draining = false;
        sb.incompat |= incompat::EVACUATION | incompat::REMOVAL;
    }
}
