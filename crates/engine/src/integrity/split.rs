//! Splitting coarse checksum groups (COARSE_SUMS, docs/FORMAT.md *Data
//! checksums*): a group's one crc32c over 64 KiB becomes 16 block sums, read
//! from the group's data and checked against the crc first. A group must be
//! split before any of its blocks is written while another stays referenced:
//! before a partial in-place overwrite ([`Pool::split_overwritten`], under
//! the group's lock), and in the same journal record as the op that frees
//! part of it ([`Pool::split_freed`], called by the commit): a split in a
//! later record loses to a crash (replay frees the blocks, the group stays
//! coarse, new data there breaks the crc of the blocks still referenced).
//! Snapshot deletes, trims and redirected overwrites split the groups they
//! will free in part ahead of their commit ([`Pool::presplit`]), so the
//! commit's split under the pool lock is left for what they miss.

use crate::error::{EngineError, Result};
use crate::map::extent_map::{Freed, Segment};
use crate::map::sums::{block_sum, sums_of, BlockSum, GROUP_BYTES};
use crate::pool::{Inner, Pool};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use tarn_format::node::SUMS_GROUP;
use tarn_format::ops::Op;
use tarn_format::Pba;

/// Stripes of the group locks (a group's lock is `group % GROUP_LOCKS`).
pub(crate) const GROUP_LOCKS: usize = 64;
/// Groups looked up under one hold of the pool lock by [`Pool::presplit`].
const PRESPLIT_CHUNK: usize = 256;
/// Most groups one snapshot deletion splits ahead of its commit (32 MiB
/// of group numbers at most); the commit splits any others, as before.
pub(crate) const PRESPLIT_MAX: usize = 1 << 20;

/// The first block of `pba`'s group (device bits kept).
fn group_of(pba: u64) -> u64 {
    pba / SUMS_GROUP * SUMS_GROUP
}

impl Pool {
    /// Lock the groups that in-place pieces among `segs` touch, in stripe
    /// order (no two writers wait on each other's stripes crosswise). Held
    /// by a writer from the split check until its sums are recorded, so two
    /// partial writers of one group never each check it after the other
    /// wrote. Taken inside the I/O gate, before the pool lock; the commit
    /// takes none.
    pub(crate) fn lock_groups(&self, segs: &[Segment]) -> Vec<MutexGuard<'_, ()>> {
        let mut stripes = BTreeSet::new();
        for seg in segs {
            let Segment::Mapped { pba, len, .. } = *seg else { continue };
            let (first, end) = (pba.0 / SUMS_GROUP, (pba.0 + len).div_ceil(SUMS_GROUP));
            // Bounded: a write is at most 32 MiB (512 groups), and once
            // every stripe is in the set there is nothing more to add.
            for g in first..end.min(first + GROUP_LOCKS as u64) {
                stripes.insert((g % GROUP_LOCKS as u64) as usize);
            }
        }
        stripes.into_iter().map(|s| self.group_locks[s].lock().unwrap_or_else(|p| p.into_inner())).collect()
    }

    /// Split the coarse groups that in-place pieces among `segs` cover only
    /// in part (whole groups get 16 new block sums from the write itself).
    /// The caller holds their locks ([`Pool::lock_groups`]) and writes the
    /// data only after this returned.
    pub(crate) fn split_overwritten(&self, segs: &[Segment]) -> Result<()> {
        if !self.coarse.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut ends = BTreeSet::new();
        for seg in segs {
            let Segment::Mapped { pba, len, .. } = *seg else { continue };
            if !pba.0.is_multiple_of(SUMS_GROUP) {
                ends.insert(group_of(pba.0));
            }
            if !(pba.0 + len).is_multiple_of(SUMS_GROUP) {
                ends.insert(group_of(pba.0 + len));
            }
        }
        if ends.is_empty() {
            return Ok(());
        }
        let coarse = self.with_cached_nodes(|inner| coarse_among(inner, &ends))?;
        for (g, crc) in coarse {
            let sums = self.group_block_sums(Pba(g), crc);
            let mut inner = self.write_inner();
            // Split meanwhile by a commit that freed part of it: done.
            if coarse_among(&inner, &BTreeSet::from([g]))?.is_empty() {
                continue;
            }
            self.split_in(&mut inner, Pba(g), sums, None)?;
        }
        Ok(())
    }

    /// Step 1 of a commit, under the pool lock: split every coarse group the
    /// ops taken (`ops`) free only in part, appending the Sums ops to
    /// `ops`, so the split is in the same record as the free. Reads 64 KiB
    /// per such group under the lock (see docs/ARCHITECTURE.md *Coarse
    /// checksums*): only groups no early split took care of.
    pub(crate) fn split_freed(&self, inner: &mut Inner, frees: &Freed, ops: &mut Vec<Op>) -> Result<()> {
        if !self.coarse.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut ends = BTreeSet::new();
        for &(pba, len) in frees {
            partly_covered(pba, len, &mut ends);
        }
        for (g, crc) in coarse_among(inner, &ends)? {
            let sums = self.group_block_sums(Pba(g), crc);
            self.split_in(inner, Pba(g), sums, Some(ops))?;
            self.counters.commit_splits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Split the coarse groups among `groups` (first blocks) ahead of an op
    /// that will free them in part, each read with no pool lock held, and
    /// queue the splits before that op: they reach the journal in its
    /// record or an earlier one, and the commit's [`Pool::split_freed`]
    /// finds nothing left to read under the pool lock. A group whose data
    /// matches its crc on no copy here is left to the commit (which splits
    /// it into failing sums and says so). Called without the commit lock,
    /// so neither writers nor other commits wait for these reads.
    pub(crate) fn presplit(&self, groups: &BTreeSet<u64>) -> Result<()> {
        self.presplit_each(groups, true)
    }

    /// [`Pool::presplit`] for a writer that holds the I/O gate (shared)
    /// already and none of the group locks: the groups its redirected
    /// blocks free in part.
    pub(crate) fn presplit_in_gate(&self, groups: &BTreeSet<u64>) -> Result<()> {
        self.presplit_each(groups, false)
    }

    fn presplit_each(&self, groups: &BTreeSet<u64>, take_gate: bool) -> Result<()> {
        if groups.is_empty() || !self.coarse.load(Ordering::SeqCst) || self.options.control_no_presplit {
            return Ok(());
        }
        let groups: Vec<u64> = groups.iter().copied().collect();
        // Looked up a chunk at a time: a miss re-runs one chunk, not all.
        for chunk in groups.chunks(PRESPLIT_CHUNK) {
            let chunk: BTreeSet<u64> = chunk.iter().copied().collect();
            for (g, crc) in self.with_cached_nodes(|inner| coarse_among(inner, &chunk))? {
                self.presplit_group(g, crc, take_gate)?;
            }
        }
        Ok(())
    }

    /// [`Pool::presplit`] of one group, under its group lock (as a writer's
    /// split: no in-place write of the group meanwhile), and under the I/O
    /// gate (`take_gate`, or the caller holds it: a second shared hold
    /// could wait behind a queued exclusive one and deadlock).
    fn presplit_group(&self, g: u64, crc: u32, take_gate: bool) -> Result<()> {
        let _gate = take_gate.then(|| self.gate_shared());
        let stripe = (g / SUMS_GROUP % GROUP_LOCKS as u64) as usize;
        let _group = self.group_locks[stripe].lock().unwrap_or_else(|p| p.into_inner());
        let Some(good) = self.examine_span(Pba(g), GROUP_BYTES, crc).good else {
            return Ok(());
        };
        let mut inner = self.write_inner();
        // Split (or rewritten whole, with another crc) meanwhile: not ours.
        if coarse_among(&inner, &BTreeSet::from([g]))? != [(g, crc)] {
            return Ok(());
        }
        self.split_in(&mut inner, Pba(g), sums_of(&good), None)
    }

    /// Apply the split of group `g`: queued for the next commit, or (`ops`)
    /// straight into the ops a commit took.
    fn split_in(&self, inner: &mut Inner, g: Pba, sums: Vec<u32>, ops: Option<&mut Vec<Op>>) -> Result<()> {
        let op = Op::Sums { pba: g.0, sums };
        let mut freed = Freed::new();
        if let Err(broken) = inner.state.apply(&op, &mut freed) {
            self.fenced.store(true, Ordering::SeqCst);
            return Err(broken.into());
        }
        self.counters.split_groups.fetch_add(1, Ordering::Relaxed);
        match ops {
            Some(ops) if !self.options.control_split_late => ops.push(op),
            _ => inner.queue(op, freed),
        }
        Ok(())
    }

    /// The 16 block sums of coarse group `g` (crc `crc`), from a copy whose
    /// group matches. If none does (corruption, or a torn write of an open
    /// region a crash left), the sums of copy 0's blocks inverted: every
    /// block keeps failing its check, as the group did (never wrong data
    /// from a split), and a resync of its open region replaces them.
    fn group_block_sums(&self, g: Pba, crc: u32) -> Vec<u32> {
        let copies = self.examine_span(g, GROUP_BYTES, crc);
        if let Some(good) = copies.good {
            return sums_of(&good);
        }
        let dev = &self.devices[usize::from(g.device())];
        let mut data = vec![0u8; GROUP_BYTES];
        if let Err(e) = dev.read_at(&mut data, g.byte_offset()) {
            log::error!("splitting group at block {} of {}: read error {e}", g.block(), dev.name());
        }
        log::error!(
            "coarse group at block {} of {} matches on no copy: split into failing sums",
            g.block(),
            dev.name()
        );
        self.counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
        data.chunks_exact(GROUP_BYTES / SUMS_GROUP as usize).map(|b| !block_sum(b)).collect()
    }
}

/// Add to `out` the groups (first blocks) that the run of `len` blocks at
/// `pba` covers only in part; a group it covers whole is not added (once
/// freed, nothing of it is left to keep a sum for).
pub(crate) fn partly_covered(pba: Pba, len: u64, out: &mut BTreeSet<u64>) {
    if !pba.0.is_multiple_of(SUMS_GROUP) || len < SUMS_GROUP {
        out.insert(group_of(pba.0));
    }
    if !(pba.0 + len).is_multiple_of(SUMS_GROUP) {
        out.insert(group_of(pba.0 + len));
    }
}

/// The groups among `groups` (first blocks) whose sum is coarse, with it.
fn coarse_among(inner: &Inner, groups: &BTreeSet<u64>) -> Result<Vec<(u64, u32)>> {
    let mut out = Vec::new();
    for &g in groups {
        if let Some(BlockSum::Group(crc)) = inner.state.sums.get(Pba(g)).map_err(EngineError::from)? {
            out.push((g, crc));
        }
    }
    Ok(out)
}
