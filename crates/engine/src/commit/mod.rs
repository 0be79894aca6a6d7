//! Group commit. Every map and space change since the last commit reaches
//! stable storage in one atomic step: a journal record. The order is what
//! makes it crash-safe:
//!
//! 1. under the pool lock, take the pending ops — all their data is
//!    already written;
//! 2. flush the data devices;
//! 3. write the journal record;
//! 4. flush the primary: the commit is durable;
//! 5. wait until no I/O planned against the old map is in flight, then
//!    return the freed space to the allocator.
//!
//! When the journal side fills or the store holds many dirty nodes, the
//! commit also *freezes* every tree in step 1 (O(trees)) and, after its
//! record is durable, moves the journal to its other side: the checkpoint
//! is written by `Pool::checkpoint_work` while later commits go on in that
//! side (`store_checkpoint.rs`). Only a forced checkpoint (clean close), a
//! full side or a pile of dirty nodes makes a commit write (or wait for)
//! a checkpoint itself.

pub mod grow;
pub mod room;
pub mod spare;
mod store_checkpoint;
mod superblock;

use crate::error::{EngineError, Result};
use crate::map::extent_map::Freed;
use crate::meta::catalog::{self, FrozenPool};
use crate::meta::journal;
use crate::pool::{CommitCtl, FrozenCheckpoint, Gated, Held, Inner, Pool};
use crate::space::reserve_for;
use std::sync::atomic::Ordering;
use tarn_format::journal::RecordHeader;
use tarn_format::node::NODE_SIZE;
use tarn_format::node::SUMS_GROUP;
use tarn_format::ops::{encode_ops, Op, MAX_REGIONS_PER_OP};
use tarn_format::superblock::incompat;
use tarn_format::{Pba, BLOCK_SIZE};

enum Plan {
    /// Only data changed: flushing the devices is the whole commit.
    DataOnly,
    Journal {
        payload: Vec<u8>,
        /// The epoch after the ops (replay checks it).
        epoch: u64,
        /// Overwrite regions the record opens.
        opened: Vec<u64>,
    },
    /// A journal record, and the trees frozen after its ops: the
    /// checkpoint is written after it, while later commits go on.
    JournalThenCheckpoint { payload: Vec<u8>, epoch: u64, frozen: Box<FrozenPool> },
    /// A checkpoint written by this commit; no record.
    Checkpoint(Box<FrozenPool>),
}

/// What step 1 found.
enum Step {
    Take(Taken),
    /// Overwrite regions are open with I/O not drained (or await their
    /// resync after a crash): drain and ask again.
    Drain,
    /// The checkpoint in progress must be durable first (why).
    FinishCheckpoint(&'static str),
}

impl Pool {
    /// Make every write answered before this call durable (NBD FLUSH).
    /// Concurrent callers share one commit.
    pub fn flush(&self) -> Result<()> {
        self.flush_then(|| {})
    }

    /// `flush`, calling `on_taken` as soon as the commit has taken the
    /// queued ops (its point in time), before it flushes the devices and
    /// writes its journal record. A caller that holds its writers back
    /// until then (tarn-fs holds its namespace lock: the commit falls
    /// between two namespace changes, never inside one) lets them go on
    /// through the slow part. Called at once when nothing is left to
    /// commit; never called (only dropped) when the commit fails first.
    pub fn flush_then(&self, on_taken: impl FnOnce()) -> Result<()> {
        self.check_writable()?;
        let target = self.write_gen.load(Ordering::SeqCst);
        let mut ctl = self.lock_commit();
        if self.committed_gen.load(Ordering::SeqCst) >= target {
            on_taken();
            return Ok(());
        }
        // A commit that failed while we waited fenced the pool: do not retry.
        self.check_writable()?;
        let mut once = Some(on_taken);
        self.commit_opening_gate(&mut ctl, &mut || once.take().into_iter().for_each(|f| f()))
    }

    /// One commit under `ctl`, opening the change gate `ctl` closed as
    /// soon as the ops are taken: changes go on through the device flush
    /// and the journal write, as tarn-fs's own do (`flush_then`).
    fn commit_opening_gate(&self, ctl: &mut Held<Gated<'_>>, on_taken: &mut dyn FnMut()) -> Result<()> {
        let mut closed = ctl.take_closed();
        self.commit_locked_then(ctl, false, &mut || {
            drop(closed.take());
            on_taken();
        })
    }

    /// Enter the change gate (`changes.rs`): while the share is held, no
    /// commit by a thread without one takes the queued ops, and once room
    /// was made (`make_room_for`) this thread's writes make no
    /// back-pressure commit. tarn-fs holds one with its namespace lock;
    /// `helper`: a thread a share holder may wait for (write-behind),
    /// which enters past closers waiting.
    pub fn enter_changes(&self, helper: bool) -> crate::pool::changes::ChangeShare<'_> {
        self.changes.enter(!helper)
    }

    /// Whether a commit (or anything else holding the commit lock) is in
    /// flight now. A hint only: one may start right after.
    pub fn commit_in_flight(&self) -> bool {
        matches!(self.commit.try_lock(), Err(std::sync::TryLockError::WouldBlock))
    }

    /// Wait until the commit in flight, if any, is done. tarn-fs waits
    /// here without its namespace lock before a commit of its own, rather
    /// than in `flush_then` with the lock held (every request takes it).
    pub fn await_commit_in_flight(&self) {
        drop(self.lock_commit());
    }

    /// Back-pressure on the queue of pending ops: a writer that finds it over
    /// its bound commits it, or waits for the commit already taking it,
    /// instead of growing it. Takes the commit lock, first in the lock
    /// order: call it holding no other pool lock (nor a stripe lock).
    pub(crate) fn make_room(&self) -> Result<()> {
        if !self.pending_over_limit() || self.changes.changing_here() {
            return Ok(());
        }
        let mut ctl = self.lock_commit();
        // The commit we may have waited for took the queue.
        if !self.pending_over_limit() {
            return Ok(());
        }
        self.check_writable()?;
        self.commit_opening_gate(&mut ctl, &mut || {})
    }

    /// Make room for a batch of writes whose ops weigh at most `bytes`
    /// (journal size bound plus 16 per freed range): commit the queue now
    /// if the batch would push it over its bound. Returns whether the batch
    /// fits under the bound at all. A caller holding a change share
    /// (tarn-fs) is then inside a change: its writes make no back-pressure
    /// commit until the share ends, and other threads' commits wait for
    /// it (`pool/changes.rs`), so a crash keeps all of the batch or none.
    pub fn make_room_for(&self, bytes: usize) -> Result<bool> {
        let fits = bytes <= self.pending_limit;
        // Marked first: the commit below is this thread's own, between its
        // changes (a share holder's commit lock does not close the gate).
        if self.changes.mark_changing() {
            // Room was made when the change began; a commit now splits it.
            return Ok(fits);
        }
        if self.queued_weight().saturating_add(bytes) > self.pending_limit {
            let mut ctl = self.lock_commit();
            if self.queued_weight().saturating_add(bytes) > self.pending_limit {
                self.check_writable()?;
                self.commit_opening_gate(&mut ctl, &mut || {})?;
            }
        }
        Ok(fits)
    }

    /// Finish the checkpoint in progress, if any: an op that clears a map
    /// (volume or snapshot delete, rollback) waits for its merge, because a
    /// map being merged cannot be cleared. Call it holding the commit lock
    /// (no checkpoint starts meanwhile) and no other pool lock.
    pub(crate) fn settle_checkpoint(&self, ctl: &mut CommitCtl) -> Result<()> {
        if !ctl.checkpoint_busy {
            return Ok(());
        }
        let frees = self.finish_checkpoint(ctl)?;
        self.release(frees)
    }

    /// Write a checkpoint now (clean shutdown), so the journal starts empty.
    pub fn checkpoint(&self) -> Result<()> {
        self.check_writable()?;
        let mut ctl = self.lock_commit();
        self.commit_locked(&mut ctl, true)
    }

    /// Make linear allocation go on from `start` (`tarn pool create
    /// --start`), with a checkpoint so that it lasts: the cursors are kept
    /// in the checkpoint's space entries (no format change).
    pub fn start_allocation_at(&self, start: crate::space::AllocationStart) -> Result<()> {
        self.check_writable()?;
        let mut ctl = self.lock_commit();
        self.write_inner().space.start_data_at(start);
        self.commit_locked(&mut ctl, true)
    }

    /// Resync every region a crash left open and commit; returns the
    /// checksums renewed.
    pub fn resync(&self) -> Result<u64> {
        Ok(self.resync_until(&|| false)?.unwrap_or(0))
    }

    /// [`Pool::resync`], checking `stop` between 1 MiB chunks: None if it
    /// stopped early (what is left waits for the next start or checkpoint).
    pub fn resync_until(&self, stop: &dyn Fn() -> bool) -> Result<Option<u64>> {
        self.check_writable()?;
        let mut ctl = self.lock_commit();
        let Some(renewed) = self.resync_suspects_until(stop)? else {
            return Ok(None);
        };
        self.commit_locked(&mut ctl, false)?;
        Ok(Some(renewed))
    }

    /// Checkpoint and stop accepting changes: what a clean shutdown does.
    pub fn close(&self) -> Result<()> {
        if self.options.read_only {
            return Ok(());
        }
        self.checkpoint()?;
        self.mark_closed()?;
        self.fenced.store(true, Ordering::SeqCst);
        Ok(())
    }

    pub(crate) fn commit_locked(&self, ctl: &mut CommitCtl, force_checkpoint: bool) -> Result<()> {
        self.commit_locked_then(ctl, force_checkpoint, &mut || {})
    }

    /// `commit_locked`, calling `on_taken` once the ops are taken (`flush_then`).
    fn commit_locked_then(
        &self,
        ctl: &mut CommitCtl,
        force_checkpoint: bool,
        on_taken: &mut dyn FnMut(),
    ) -> Result<()> {
        let started = std::time::Instant::now();
        let result = self.commit_steps(ctl, force_checkpoint, on_taken);
        match &result {
            Ok(()) => self.counters.commit_times.record(started.elapsed()),
            Err(e) => {
                log::error!("commit failed, fencing the pool: {e}");
                self.fenced.store(true, Ordering::SeqCst);
            }
        }
        result
    }

    fn commit_steps(&self, ctl: &mut CommitCtl, force_checkpoint: bool, on_taken: &mut dyn FnMut()) -> Result<()> {
        if force_checkpoint || self.checkpoint_due(ctl) {
            // A checkpoint closes every region: resync what a crash left open.
            self.resync_suspects()?;
        }
        let (plan, mut frees, gen) = self.take_step(ctl, force_checkpoint)?;
        on_taken();
        self.flush_dirty_devices()?;
        // A mirror leg that dropped out is recorded before anything this
        // commit makes durable, and again if it dropped out during it.
        self.record_leg_states(ctl)?;
        match plan {
            Plan::DataOnly => {}
            Plan::Journal { payload, epoch, opened } => {
                self.write_journal(ctl, &payload, epoch)?;
                // Only now may writes go in place there: the record is durable.
                let mut inner = self.write_inner();
                let now = self.counters.commits.load(Ordering::Relaxed);
                for r in &opened {
                    inner.regions.last_write.entry(*r).or_insert(now);
                }
                inner.state.open_regions.extend(opened);
            }
            Plan::JournalThenCheckpoint { payload, epoch, frozen } => {
                self.write_journal(ctl, &payload, epoch)?;
                let ck = start_checkpoint(ctl, *frozen, &frees);
                // The flag is set under the slot's lock, which the
                // checkpointer holds from its look at the flag until it
                // sleeps: the wake-up below cannot fall between the two.
                let mut slot = self.lock_checkpoint();
                slot.frozen = Some(Box::new(ck));
                self.checkpoint_waiting.store(true, Ordering::SeqCst);
                drop(slot);
                self.checkpoint_frozen.notify_one();
            }
            Plan::Checkpoint(frozen) => {
                let ck = start_checkpoint(ctl, *frozen, &frees);
                let mut slot = self.lock_checkpoint();
                let written = self.write_checkpoint(&mut slot, ck)?;
                frees.extend(self.flip_checkpoint(ctl, &mut slot, written)?);
            }
        }
        self.record_leg_states(ctl)?;
        self.committed_gen.fetch_max(gen, Ordering::SeqCst);
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        if ctl.checkpoint_busy {
            ctl.held_frees.append(&mut frees);
        }
        self.release(frees)
    }

    /// Step 1, draining in-flight I/O or finishing the checkpoint in
    /// progress first when it must.
    fn take_step(&self, ctl: &mut CommitCtl, force_checkpoint: bool) -> Result<Taken> {
        let mut drained = self.needs_drain(ctl, force_checkpoint);
        let (mut drains, mut finishes) = (0, 0);
        loop {
            // Closing an overwrite region needs every in-place write to it
            // recorded: hold the I/O gate while the commit takes its ops.
            let quiet = drained.then(|| self.io_gate.write().unwrap_or_else(|p| p.into_inner()));
            match self.take_pending(ctl, force_checkpoint, drained)? {
                Step::Take(taken) => return Ok(taken),
                Step::Drain => {
                    // A checkpoint it must be: drain, and resync what a crash left open.
                    drop(quiet);
                    drains += 1;
                    assert!(drains < 3, "a drained commit with every region resynced takes its ops");
                    self.resync_suspects()?;
                    drained = true;
                }
                Step::FinishCheckpoint(why) => {
                    // The gate comes after the checkpoint lock.
                    drop(quiet);
                    log::info!("a commit finishes the checkpoint in progress first: {why}");
                    self.counters.checkpoint_waits.fetch_add(1, Ordering::Relaxed);
                    finishes += 1;
                    assert!(finishes < 2, "a finished checkpoint leaves none in progress");
                    let frees = self.finish_checkpoint(ctl)?;
                    self.release(frees)?;
                }
            }
        }
    }

    /// Whether this commit should drain in-flight I/O: it closes idle
    /// overwrite regions, or it may well be a checkpoint (which closes all).
    fn needs_drain(&self, ctl: &CommitCtl, force_checkpoint: bool) -> bool {
        let inner = self.read_inner();
        if inner.state.open_regions.is_empty() {
            return false;
        }
        let now = self.counters.commits.load(Ordering::Relaxed);
        let due = !ctl.checkpoint_busy && (ctl.journal.low() || self.store_over_dirty_bound(&inner.state.store, 1));
        force_checkpoint || due || !inner.regions.idle(&inner.state.open_regions, now).is_empty()
    }

    /// Step 1: snapshot what this commit covers.
    fn take_pending(&self, ctl: &CommitCtl, force_checkpoint: bool, drained: bool) -> Result<Step> {
        let mut inner = self.write_inner();
        let inner = &mut *inner;
        if !drained && self.fresh_writes.load(Ordering::SeqCst) > 0 {
            // A write is overwriting new data in place in a closed region: a
            // commit must not make that data's map durable before the write
            // recorded its new sums. Drain it first.
            return Ok(Step::Drain);
        }
        let gen = self.write_gen.load(Ordering::SeqCst);
        let (mut ops, frees) = self.take_queue_split(inner)?;
        if drained {
            let now = self.counters.commits.load(Ordering::Relaxed);
            let idle = inner.regions.idle(&inner.state.open_regions, now);
            close_regions(inner, &idle, &mut ops);
        }
        inner.regions.urgent = 0;
        // From here a commit may make their maps durable: no longer fresh.
        inner.regions.fresh.clear();
        let opened = open_wanted(inner, &mut ops);
        if ops.is_empty() && !force_checkpoint {
            return Ok(Step::Take((Plan::DataOnly, frees, gen)));
        }
        let payload = encode_ops(&ops);
        let fits = ctl.journal.fits(RecordHeader::blocks_for(payload.len()));
        let store = &inner.state.store;
        let wanted = force_checkpoint || !fits || ctl.journal.low() || self.store_over_dirty_bound(store, 1);
        if !wanted {
            return Ok(Step::Take((Plan::Journal { payload, epoch: inner.state.epoch, opened }, frees, gen)));
        }
        if ctl.checkpoint_busy {
            // One checkpoint at a time: commits go on meanwhile unless the
            // journal side is full, the checkpoint is forced, or dirty
            // nodes piled up to twice their bound (memory).
            let Some(why) = self.checkpoint_cannot_wait(store, force_checkpoint, fits) else {
                return Ok(Step::Take((Plan::Journal { payload, epoch: inner.state.epoch, opened }, frees, gen)));
            };
            put_back(inner, ops, frees, opened);
            return Ok(Step::FinishCheckpoint(why));
        }
        if (!drained && !inner.state.open_regions.is_empty()) || !inner.regions.suspect.is_empty() {
            // The caller drains and asks again.
            put_back(inner, ops, frees, opened);
            return Ok(Step::Drain);
        }
        // A checkpoint records no open region: all close (their sums are all
        // recorded, I/O is drained); the wanted ones open with a later record.
        ops.retain(|op| !matches!(op, Op::Regions { open: true, .. }));
        inner.regions.wanted.extend(opened);
        let all: Vec<u64> = inner.state.open_regions.iter().copied().collect();
        close_regions(inner, &all, &mut ops);
        inner.space.reserve_blocks = reserve_for(inner.state.extent_count(), inner.space.data_blocks());
        log::info!(
            "checkpoint {} frozen: {}; {} B of buffered changes, {} dirty nodes",
            ctl.journal.seq + 1,
            checkpoint_cause(ctl, force_checkpoint, fits),
            inner.state.store.buffered_bytes(),
            inner.state.store.dirty_nodes()
        );
        let frozen = self.freeze_pool(ctl, inner);
        let payload = encode_ops(&ops);
        // The journal's other side must be free: it is unless a crash cut
        // the last checkpoint short after commits went on there.
        let other_side_free = ctl.journal.generation == ctl.sb.journal_generation;
        if !force_checkpoint && other_side_free && ctl.journal.fits(RecordHeader::blocks_for(payload.len())) {
            let epoch = inner.state.epoch;
            return Ok(Step::Take((Plan::JournalThenCheckpoint { payload, epoch, frozen }, frees, gen)));
        }
        Ok(Step::Take((Plan::Checkpoint(frozen), frees, gen)))
    }

    /// The pending ops and frees, with the split of every coarse group the
    /// ops free in part (in the same record: see `integrity/split.rs`).
    fn take_queue_split(&self, inner: &mut Inner) -> Result<(Vec<Op>, Freed)> {
        let (mut ops, frees) = inner.take_queue();
        self.split_freed(inner, &frees, &mut ops)?;
        Ok((ops, frees))
    }

    /// Set COARSE_SUMS by a commit of its own (a checkpoint: the
    /// superblock carries it) before the first GroupSums op; a no-op once
    /// set. A pool gets it with its first write of 16 blocks or more.
    pub(crate) fn enable_coarse(&self) -> Result<()> {
        if self.coarse.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut ctl = self.lock_commit();
        if ctl.sb.incompat & incompat::COARSE_SUMS == 0 {
            ctl.sb.incompat |= incompat::COARSE_SUMS;
            self.commit_locked(&mut ctl, true)?;
        }
        self.coarse.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Why a commit must wait for the checkpoint in progress rather than
    /// go to the journal beside it (None: it need not).
    fn checkpoint_cannot_wait(
        &self,
        store: &tarn_store::Store,
        force_checkpoint: bool,
        fits: bool,
    ) -> Option<&'static str> {
        match () {
            _ if force_checkpoint => Some("a checkpoint is forced"),
            _ if !fits => Some("the journal side is full"),
            _ if self.store_over_dirty_bound(store, 2) => Some("dirty nodes reached twice their bound"),
            _ => None,
        }
    }

    /// Step 2: data the new metadata points at must be durable first.
    fn flush_dirty_devices(&self) -> Result<()> {
        for (i, dev) in self.devices.iter().enumerate() {
            if self.dirty[i].swap(false, Ordering::SeqCst) {
                dev.flush().map_err(|e| EngineError::io("flush", dev.name(), e))?;
            }
        }
        Ok(())
    }

    fn write_journal(&self, ctl: &mut CommitCtl, payload: &[u8], epoch: u64) -> Result<()> {
        let primary = &self.devices[0];
        let blocks = journal::append(primary.as_ref(), &ctl.journal, epoch, payload)?;
        primary.flush().map_err(|e| EngineError::io("flush journal", primary.name(), e))?;
        ctl.journal.used += blocks;
        ctl.journal.seq += 1;
        self.counters.journal_bytes.fetch_add(blocks * BLOCK_SIZE, Ordering::Relaxed);
        Ok(())
    }

    /// Step 5: reuse freed space only after in-flight I/O drained. The
    /// discard hint goes out before the space is handed back, so it can
    /// never punch a hole in data a new owner just wrote.
    fn release(&self, frees: Freed) -> Result<()> {
        self.release_with(frees, !self.options.no_discard)
    }

    /// `release` without discarding anything (metadata blocks, soon reused).
    pub(super) fn release_unpunched(&self, frees: Freed) -> Result<()> {
        self.release_with(frees, false)
    }

    fn release_with(&self, frees: Freed, discard: bool) -> Result<()> {
        if frees.is_empty() {
            return Ok(());
        }
        // Freed pieces come in logical order; after redirected random writes
        // they are physically scattered piece by piece but adjacent as a set.
        // Coalesced, a snapshot delete of 1 GiB of 4K pieces is a handful of
        // discards instead of 262,144.
        let frees = coalesce(frees);
        drop(self.io_gate.write().unwrap_or_else(|p| p.into_inner()));
        if discard {
            // Like a device's discard granularity: only whole 64 KiB groups
            // are punched (each punch costs ~0.1 ms under the commit lock and
            // a snapshot delete can free 100,000s of scattered 4 KiB pieces;
            // and see `punchable`); the rest is free in the pool all the
            // same and gets reused.
            for (pba, len) in frees.iter().filter_map(|&(pba, len)| punchable(pba, len)) {
                let dev = &self.devices[usize::from(pba.device())];
                if let Err(e) = dev.discard(pba.byte_offset(), len * BLOCK_SIZE) {
                    log::debug!("discard on {} failed (ignored, a hint): {e}", dev.name());
                }
            }
        }
        let mut inner = self.write_inner();
        for &(pba, len) in &frees {
            inner.space.give_back(pba, len)?;
        }
        Ok(())
    }

    /// Step 1 of a checkpoint (`catalog::freeze`). Small dead lists stay
    /// in its catalog only once the superblock has INLINE_DEAD_LISTS.
    fn freeze_pool(&self, ctl: &CommitCtl, inner: &mut Inner) -> Box<FrozenPool> {
        let inline = match () {
            _ if ctl.sb.incompat & incompat::INLINE_DEAD_LISTS == 0 => catalog::InlineDead::Off,
            _ if self.options.control_inline_drops_entry => catalog::InlineDead::ControlDropLast,
            _ => catalog::InlineDead::On,
        };
        // Under `inner`, as the delete that reads it (`apply_clearing`).
        self.merging.store(true, Ordering::SeqCst);
        Box::new(catalog::freeze(&mut inner.state, &mut inner.space, ctl.journal.seq + 1, inline))
    }

    /// A checkpoint is due and none is in progress: the journal side is
    /// three quarters full, or the store's dirty nodes passed their bound.
    fn checkpoint_due(&self, ctl: &CommitCtl) -> bool {
        !ctl.checkpoint_busy && (ctl.journal.low() || self.store_over_dirty_bound(&self.read_inner().state.store, 1))
    }

    /// Dirty nodes and buffered map changes stay in memory until a
    /// checkpoint writes them: bound them to a sixth of the clean cache (an
    /// eighth of the metadata budget, which gives the clean cache three
    /// quarters: see `service/open.rs`), so resident memory stays near the
    /// budget. `times` the bound: while a checkpoint is written, changes
    /// made meanwhile wait up to twice it.
    fn store_over_dirty_bound(&self, store: &tarn_store::Store, times: u64) -> bool {
        let held = store.dirty_nodes() * NODE_SIZE as u64 + store.buffered_bytes();
        held > store.cache.stats().capacity / 6 * times
    }
}

/// Why a commit writes a checkpoint (for the log).
fn checkpoint_cause(ctl: &CommitCtl, forced: bool, fits: bool) -> &'static str {
    match () {
        _ if forced => "forced",
        _ if !fits => "the journal side is full",
        _ if ctl.journal.low() => "the journal side is three quarters full",
        _ => "buffered changes and dirty nodes reached their memory bound",
    }
}

/// A frozen checkpoint is under way: the commits after it go to the
/// journal's other side (a new generation) until its superblock names it.
fn start_checkpoint(ctl: &mut CommitCtl, frozen: FrozenPool, frees: &Freed) -> FrozenCheckpoint {
    ctl.journal.switch_side(frozen.seq);
    ctl.checkpoint_busy = true;
    FrozenCheckpoint { frozen, record_frees: frees.clone(), generation: ctl.journal.generation }
}

/// Put back what a commit took and will not write now.
fn put_back(inner: &mut Inner, mut ops: Vec<Op>, frees: Freed, opened: Vec<u64>) {
    ops.retain(|op| !matches!(op, Op::Regions { open: true, .. }));
    inner.requeue(ops, frees);
    inner.regions.wanted.extend(opened);
}

/// What a commit takes: its plan, the space it frees, the write generation it covers.
type Taken = (Plan, Freed, u64);

/// Close overwrite regions now (writes there redirect from here on) and
/// record it in `ops`. Only with I/O drained: every in-place write to them
/// has its checksums among the pending ops.
fn close_regions(inner: &mut Inner, ids: &[u64], ops: &mut Vec<Op>) {
    for id in ids {
        inner.state.open_regions.remove(id);
        inner.regions.last_write.remove(id);
    }
    for chunk in ids.chunks(MAX_REGIONS_PER_OP) {
        ops.push(Op::Regions { open: false, ids: chunk.to_vec() });
    }
}

/// Freed ranges shorter than this are not discarded on the device.
const MIN_DISCARD_BLOCKS: u64 = SUMS_GROUP;

/// The part of a freed range to discard: its whole 64 KiB groups (block
/// addresses a multiple of 16), None if none. A punch of part of a group
/// would zero blocks of a coarse checksum group (COARSE_SUMS) whose other
/// blocks may still be referenced, and fail their reads.
fn punchable(pba: Pba, len: u64) -> Option<(Pba, u64)> {
    let start = pba.0.div_ceil(SUMS_GROUP) * SUMS_GROUP;
    let end = (pba.0 + len) / SUMS_GROUP * SUMS_GROUP;
    (end >= start + MIN_DISCARD_BLOCKS).then(|| (Pba(start), end - start))
}

/// Sort physical ranges and merge the adjacent ones (they never overlap).
fn coalesce(mut frees: Freed) -> Freed {
    frees.sort_unstable_by_key(|f| f.0);
    let mut out: Freed = Vec::with_capacity(frees.len());
    for (pba, len) in frees {
        match out.last_mut() {
            Some(last) if last.0.device() == pba.device() && last.0.offset_by(last.1) == pba => last.1 += len,
            _ => out.push((pba, len)),
        }
    }
    out
}

/// The regions writes asked to open that are not open yet, as Regions ops
/// appended to `ops`; returns their ids.
fn open_wanted(inner: &mut Inner, ops: &mut Vec<Op>) -> Vec<u64> {
    let opened: Vec<u64> = std::mem::take(&mut inner.regions.wanted)
        .into_iter()
        .filter(|r| !inner.state.open_regions.contains(r))
        .collect();
    for chunk in opened.chunks(MAX_REGIONS_PER_OP) {
        ops.push(Op::Regions { open: true, ids: chunk.to_vec() });
    }
    opened
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only whole groups are punched: never a block of a group that keeps
    /// referenced blocks (a coarse checksum would fail), nothing under 16.
    #[test]
    fn discards_cover_whole_groups_only() {
        let p = |d, b| Pba::new(d, b);
        assert_eq!(punchable(p(1, 32), 16), Some((p(1, 32), 16)));
        assert_eq!(punchable(p(1, 30), 40), Some((p(1, 32), 32)), "ragged ends stay");
        assert_eq!(punchable(p(1, 33), 30), None, "no whole group");
        assert_eq!(punchable(p(1, 17), 15), None);
        assert_eq!(punchable(p(0, 0), 1 << 20), Some((p(0, 0), 1 << 20)));
    }

    #[test]
    fn coalesce_merges_adjacent_ranges_per_device() {
        let p = |d, b| Pba::new(d, b);
        let frees = vec![(p(0, 20), 2), (p(0, 10), 5), (p(1, 15), 1), (p(0, 15), 5), (p(0, 30), 1), (p(1, 16), 4)];
        assert_eq!(coalesce(frees), vec![(p(0, 10), 12), (p(0, 30), 1), (p(1, 15), 5)]);
    }
}
