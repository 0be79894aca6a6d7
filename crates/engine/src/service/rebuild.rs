//! Rebuilding a lost member of parity volumes onto a new device (`tarn
//! pool replace`; issue 12 item 7; format: device table state 4 with its
//! `rebuilt` count, incompat bit 18 REBUILD, docs/FORMAT.md).
//!
//! The new device takes the member's place at the same index and the same
//! block addresses: every block a parity volume maps there (head,
//! snapshots' dead lists, clones) is rebuilt in place, in address order, as
//! the XOR of the rest of its row, checked against its own checksum, so no
//! map changes. The member's slot (`device/rebuild_slot.rs`) serves reads of
//! blocks below the cursor from the new device and fails the rest, which
//! parity reads rebuild from their rows. Allocation avoids the member
//! until the end, so its blocks only ever go from mapped to free while it
//! is rebuilt: a block rebuilt after its row moved lands on free space,
//! harmless. Each step (at most `STEP_BLOCKS` of work) is flushed on the
//! new device before the superblock records the cursor past it: a crash
//! leaves a cursor below which everything is durable, and a restart goes
//! on from there.

use crate::device::label::{read_label, uuid_string, write_both_labels};
use crate::device::rebuild_slot::{RebuildSlot, WHOLE};
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::io::{xor_into, BS};
use crate::map::extent_map::Segment;
use crate::map::sums::{block_sum, BlockSum};
use crate::map::view::View;
use crate::pool::Pool;
use crate::service::grow::member_label;
use crate::service::open::random_bytes;
use crate::volumes::evacuate::{on_member, LiveRun};
use std::sync::Arc;
use tarn_format::stripe::Parity;
use tarn_format::superblock::incompat;
use tarn_format::BLOCK_SIZE;

/// Blocks rebuilt between two cursor records (4 MiB).
const STEP_BLOCKS: u64 = 1024;
/// Pieces (units on the member) whose rows are read ahead at once.
const PREFETCH_PIECES: usize = 256;
/// Most blocks of a volume's data (or parity) area one read-ahead spans.
const PREFETCH_SPAN: u64 = 16384;

/// What `Pool::rebuild_member` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebuildReport {
    pub index: usize,
    /// Blocks of parity volumes mapped on the member when it started.
    pub blocks: u64,
    /// Of them, rebuilt onto the new device.
    pub rebuilt: u64,
    /// Of them, unmapped or moved meanwhile (nothing to rebuild).
    pub gone: u64,
    /// Of them, not rebuildable: another unit of the row is lost too.
    pub lost: u64,
    /// Stopped before the end (`go_on` said so); resumable.
    pub stopped: bool,
}

/// `runs` (in address order) from block `from` on, cut where a parity
/// unit ends (`unit(vol)`: its unit in blocks; a volume gone: whole), so
/// that each piece's blocks share one row.
fn unit_pieces(runs: &[LiveRun], from: u64, unit: impl Fn(u32) -> Option<u64>) -> Vec<LiveRun> {
    let mut out = Vec::new();
    for r in runs {
        let skip = from.saturating_sub(r.pba.block()).min(r.len);
        let (mut lba, mut pba, mut left) = (r.lba + skip, r.pba.offset_by(skip), r.len - skip);
        let u = unit(r.vol).unwrap_or(u64::MAX).max(1);
        // Bounded by the run's length: each pass takes at least a block.
        while left > 0 {
            let n = left.min(u - lba % u);
            out.push(LiveRun { lba, pba, len: n, ..*r });
            (lba, pba, left) = (lba + n, pba.offset_by(n), left - n);
        }
    }
    out
}

/// The named refusal.
pub(crate) fn refuse<T>(why: String) -> Result<T> {
    Err(EngineError::InvalidArgument(why))
}

/// Refuse `dev` as the new device of member `index` (`blocks` long) if it
/// is smaller or carries a tarn label (of this pool or another).
pub(crate) fn refuse_unfit_device(index: usize, blocks: u64, dev: &dyn Device) -> Result<()> {
    if dev.size() / BLOCK_SIZE < blocks {
        let have = dev.size() / BLOCK_SIZE;
        return refuse(format!("device {} is too small: {have} blocks, member {index} has {blocks}", dev.name()));
    }
    if let Ok(l) = read_label(dev) {
        return Err(EngineError::ForeignDevice {
            device: dev.name(),
            detail: format!(
                "it carries a tarn label (member {} of pool {}): wipe it first",
                l.current.device_index,
                uuid_string(&l.current.pool_uuid)
            ),
        });
    }
    Ok(())
}

impl Pool {
    /// The slot of member `index` if it is missing or being rebuilt (a
    /// slot whose rebuild ended is a whole member: not returned).
    fn rebuild_slot_of(&self, index: usize) -> Option<&RebuildSlot> {
        self.devices.get(index).and_then(|d| d.rebuild_slot()).filter(|s| s.degraded() && !s.is_replacing())
    }

    /// Whether member `index` is being rebuilt (a new device in place).
    pub fn is_rebuilding(&self, index: usize) -> bool {
        self.rebuild_slot_of(index).is_some_and(RebuildSlot::is_rebuilding)
    }

    /// The member `name` designates (its index, or its recorded path) if it
    /// is a plain member that is missing or being rebuilt: the one `pool
    /// replace` rebuilds from parity rows rather than resilvering a leg.
    pub fn member_to_rebuild(&self, name: &str) -> Option<usize> {
        let ctl = self.lock_commit();
        let named = |i: usize| name == i.to_string() || ctl.sb.devices.get(i).is_some_and(|e| e.path == name);
        (1..self.devices.len()).find(|&i| named(i) && self.rebuild_slot_of(i).is_some())
    }

    /// The device member `index` is being rebuilt onto, if it is.
    pub fn rebuilding_onto(&self, index: usize) -> Option<String> {
        self.rebuild_slot_of(index).filter(|s| s.is_rebuilding()).map(|s| s.name())
    }

    /// The members being rebuilt (the service resumes them).
    pub fn rebuilding_members(&self) -> Vec<usize> {
        (0..self.devices.len()).filter(|&i| self.is_rebuilding(i)).collect()
    }

    /// Every reason member `index` cannot be replaced by `dev` and rebuilt
    /// from parity rows, before anything changes.
    fn refuse_replace(&self, index: usize, dev: &dyn Device) -> Result<()> {
        let n = self.devices.len();
        if index == 0 {
            return refuse("member 0 is the primary (journal and superblock): it cannot be rebuilt from parity".into());
        }
        let entry = self.lock_commit().sb.devices.get(index).cloned();
        let Some(entry) = entry.filter(|_| index < n) else {
            return refuse(format!("no member {index}: the pool has {n} (0..{})", n.saturating_sub(1)));
        };
        if entry.removed || entry.spare || !entry.legs.is_empty() {
            return refuse(format!(
                "member {index} is {}: only a plain member is rebuilt from parity (a mirror leg is \
                 replaced by `pool replace OLD-LEG NEW`)",
                if entry.removed {
                    "a removed slot"
                } else if entry.spare {
                    "a spare"
                } else {
                    "a mirror"
                }
            ));
        }
        match self.rebuild_slot_of(index) {
            Some(s) if s.is_rebuilding() => {
                return refuse(format!("member {index} is being rebuilt onto {} already", s.name()));
            }
            Some(_) => {}
            None => {
                return refuse(format!(
                    "member {index} ({}) is present: `pool replace` rebuilds a member that is missing \
                     (UNAVAIL in `pool status`); `tarn dev remove {index}` moves a present member's data",
                    self.devices[index].name()
                ));
            }
        }
        refuse_unfit_device(index, entry.blocks, dev)?;
        let lost = self.unrebuildable(index)?;
        if !lost.is_empty() {
            return refuse(format!(
                "member {index} holds blocks of volumes without parity, which cannot be rebuilt: {}; \
                 delete them (or bring the member back and `tarn dev remove {index}`) first",
                lost.join(", ")
            ));
        }
        Ok(())
    }

    /// The volumes without parity with blocks on member `index`, by name
    /// with their block counts.
    fn unrebuildable(&self, index: usize) -> Result<Vec<String>> {
        let runs = self.live_runs_where(&on_member(index))?;
        let inner = self.read_inner();
        let mut lost: std::collections::BTreeMap<String, u64> = Default::default();
        for r in runs {
            let Some(v) = inner.state.volume(r.vol).filter(|v| v.parity.is_none()) else { continue };
            *lost.entry(v.name.clone()).or_default() += r.len;
        }
        Ok(lost.into_iter().map(|(name, n)| format!("{name} ({n} blocks)")).collect())
    }

    /// Put `dev` (at `path`) in the place of member `index`, missing, to
    /// be rebuilt from parity rows by [`Pool::rebuild_member`]. Refused
    /// (nothing changed) for the primary, a mirror, a spare, a removed
    /// slot, a present member, a device too small or carrying a tarn
    /// label, and a member holding blocks of volumes without parity.
    pub fn replace_member(&self, index: usize, dev: Arc<dyn Device>, path: &str) -> Result<()> {
        self.check_writable()?;
        self.refuse_replace(index, dev.as_ref())?;
        let start = self.read_inner().space.devices[index].data_start;
        let mut ctl = self.lock_commit();
        let mut entry = ctl.sb.devices[index].clone();
        entry.uuid = random_bytes::<16>()?;
        entry.path = path.to_string();
        entry.rebuilt = Some(start);
        // The label first: a crash before the table names the device
        // leaves it unknown to the pool (the member is still missing).
        let mut label = member_label(&ctl.sb, &entry, index);
        label.created_unix = ctl.sb.created_unix;
        label.incompat |= incompat::EVACUATION | incompat::REBUILD;
        write_both_labels(dev.as_ref(), &label)?;
        dev.flush().map_err(|e| EngineError::io("flush label", dev.name(), e))?;
        let bits = incompat::EVACUATION | incompat::REBUILD;
        self.rewrite_member_entry(&mut ctl, index, bits, |e| *e = entry)?;
        drop(ctl);
        if let Some(slot) = self.rebuild_slot_of(index) {
            slot.install(dev, start);
        }
        log::warn!("member {index}: {path} takes its place; rebuilding it from parity rows");
        Ok(())
    }

    /// Record in the superblock that member `index` holds its first `n`
    /// blocks (`None`: all of it, the rebuild is over; the REBUILD bit is
    /// cleared when no member is rebuilt any more).
    fn record_rebuilt(&self, index: usize, n: Option<u64>) -> Result<()> {
        let mut ctl = self.lock_commit();
        if ctl.sb.devices.get(index).is_none_or(|e| e.rebuilt.is_none()) {
            // Ended already (a second rebuild of the member ran at once:
            // `pool replace` resuming while the service does): nothing to
            // record, and a cursor must not bring the rebuild back.
            return Ok(());
        }
        let bit = if n.is_some() { incompat::REBUILD } else { 0 };
        self.rewrite_member_entry(&mut ctl, index, bit, |e| e.rebuilt = n)?;
        if n.is_none() && ctl.sb.devices.iter().all(|d| d.rebuilt.is_none()) && ctl.sb.incompat & incompat::REBUILD != 0
        {
            let mut sb = ctl.sb.clone();
            sb.txid += 1;
            sb.incompat &= !incompat::REBUILD;
            self.write_superblock(&sb)?;
            ctl.sb = sb;
        }
        Ok(())
    }

    /// Rebuild every block parity volumes map on member `index` onto its
    /// new device, from the cursor on. `go_on(done, total)` (blocks) is
    /// asked after every step; false stops (resumable). At the end the
    /// member is whole and allocation uses it again.
    pub fn rebuild_member(&self, index: usize, go_on: &mut dyn FnMut(u64, u64) -> bool) -> Result<RebuildReport> {
        self.rebuild_member_by(index, STEP_BLOCKS, go_on)
    }

    /// [`Pool::rebuild_member`] recording the cursor every `step` blocks
    /// of work (at least 1; the crash simulation takes small steps).
    pub fn rebuild_member_by(
        &self,
        index: usize,
        step_blocks: u64,
        go_on: &mut dyn FnMut(u64, u64) -> bool,
    ) -> Result<RebuildReport> {
        self.check_writable()?;
        let Some(slot) = self.rebuild_slot_of(index).filter(|s| s.is_rebuilding()) else {
            return refuse(format!("member {index} is not being rebuilt (`tarn pool replace` starts it)"));
        };
        let from = slot.rebuilt();
        let runs = self.runs_to_rebuild(index, from)?;
        let blocks = runs.iter().map(|r| r.len - from.saturating_sub(r.pba.block()).min(r.len)).sum();
        let mut report = RebuildReport { index, blocks, ..Default::default() };
        let mut step = 0;
        // Bounded by the runs listed (each block once), cut at unit ends.
        let pieces = unit_pieces(&runs, from, |v| self.parity_of(v).map(|(p, _)| p.unit_blocks()));
        for (i, piece) in pieces.iter().enumerate() {
            if i % PREFETCH_PIECES == 0 {
                self.prefetch_rows(index, &pieces[i..(i + PREFETCH_PIECES).min(pieces.len())]);
            }
            let (counts, lost) = self.rebuild_piece(slot, piece)?;
            report.rebuilt += counts.0;
            report.gone += counts.1;
            for lba in lost {
                log::error!("member {index}: volume {} block {lba} cannot be rebuilt", piece.vol);
                report.lost += 1;
            }
            // Reads may use what is written (durable or not: a crash
            // forgets this cursor too); a later block's row may need it.
            let end = piece.pba.block() + piece.len;
            slot.advance(end);
            step += piece.len;
            if step >= step_blocks {
                step = 0;
                self.rebuild_step_done(index, slot, end)?;
                if !go_on(report.rebuilt + report.gone + report.lost, report.blocks) {
                    report.stopped = true;
                    return Ok(report);
                }
            }
        }
        self.finish_rebuild(index, slot)?;
        go_on(report.blocks, report.blocks);
        Ok(report)
    }

    /// Everything parity volumes map on member `index` at or past block
    /// `from`, in address order (runs cut to start there).
    fn runs_to_rebuild(&self, index: usize, from: u64) -> Result<Vec<LiveRun>> {
        let mut runs = self.live_runs_where(&on_member(index))?;
        let inner = self.read_inner();
        runs.retain(|r| inner.state.volume(r.vol).is_some_and(|v| v.parity.is_some()));
        runs.retain(|r| r.pba.block() + r.len > from);
        runs.sort_by_key(|r| r.pba.0);
        Ok(runs)
    }

    /// Rebuild block `lba` of `run`'s view, mapped at `pba` on the slot's
    /// new device, under its row's lock; false when no view maps it there
    /// any more (rewritten or moved since the list was taken). A head
    /// block overwritten since then may live on in a snapshot's dead list
    /// at the same address: the snapshots are looked at too.
    pub(crate) fn rebuild_block(
        &self,
        slot: &RebuildSlot,
        run: &LiveRun,
        lba: u64,
        pba: tarn_format::Pba,
    ) -> Result<bool> {
        let Some(layout) = self.parity_of(run.vol) else { return Ok(false) };
        let _row = self.lock_row(run.vol, crate::io::row_of(layout.0, layout.1, lba));
        let _gate = self.gate_shared();
        let mut views = vec![if run.snap == 0 { View::Head } else { View::Snapshot(run.snap) }];
        if run.snap == 0 {
            let inner = self.read_inner();
            let snaps: Option<Vec<u64>> =
                inner.state.volume(run.vol).map(|v| v.snapshots.iter().rev().map(|s| s.epoch).collect());
            views.extend(snaps.unwrap_or_default().into_iter().map(View::Snapshot));
        }
        for view in views {
            let still = match self.resolve_summed(run.vol, view, lba, 1) {
                Ok(s) => matches!(s.first(), Some((Segment::Mapped { pba: now, .. }, _)) if *now == pba),
                // Deleted meanwhile: nothing to rebuild there.
                Err(
                    EngineError::VolumeGone(_) | EngineError::NoSuchSnapshot { .. } | EngineError::OutOfRange { .. },
                ) => false,
                Err(e) => return Err(e),
            };
            if still {
                let (data, _) = self.block_from_row(run.vol, view, layout, lba)?;
                // A member being replaced: the new device only (the old one
                // could not read it; `service/replace.rs`).
                let written = match slot.is_replacing() {
                    true => slot.write_new(&data, pba.byte_offset()),
                    false => slot.write_at(&data, pba.byte_offset()),
                };
                written.map_err(|e| EngineError::io("rebuild", slot.name(), e))?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Start reading, on every other member, the rows `pieces` lie in: per
    /// volume and view, the data and parity areas of those rows are looked
    /// up at once and each member's adjacent blocks hinted as one range, so
    /// the rows' units are then read from the page cache. A hint: a span
    /// too wide (rows far apart) or a failed lookup just skips it.
    fn prefetch_rows(&self, index: usize, pieces: &[LiveRun]) {
        let mut groups: std::collections::BTreeMap<(u32, u64), (u64, u64)> = Default::default();
        for piece in pieces {
            let Some((p, blocks)) = self.parity_of(piece.vol) else { continue };
            let row = crate::io::row_of(p, blocks, piece.lba);
            let e = groups.entry((piece.vol, piece.snap)).or_insert((row, row));
            *e = (e.0.min(row), e.1.max(row));
        }
        let mut ranges: Vec<(tarn_format::Pba, u64)> = Vec::new();
        for ((vol, snap), (first, last)) in groups {
            let Some((p, blocks)) = self.parity_of(vol) else { continue };
            let view = if snap == 0 { View::Head } else { View::Snapshot(snap) };
            let rows = last - first + 1;
            let data = (first * p.row_blocks(), rows * p.row_blocks());
            let parity = (p.parity_start(blocks) + first * p.unit_blocks(), rows * p.unit_blocks());
            for (lba, len) in [data, parity].into_iter().filter(|r| r.1 <= PREFETCH_SPAN) {
                let Ok(segs) = self.resolve(vol, view, lba, len) else { continue };
                for seg in segs {
                    let Segment::Mapped { pba, len, .. } = seg else { continue };
                    if usize::from(pba.device()) == index {
                        continue;
                    }
                    match ranges.iter_mut().find(|(p, l)| p.device() == pba.device() && p.offset_by(*l) == pba) {
                        Some(r) => r.1 += len,
                        None => ranges.push((pba, len)),
                    }
                }
            }
        }
        for (pba, len) in ranges {
            self.devices[usize::from(pba.device())].prefetch(pba.byte_offset(), len * BLOCK_SIZE);
        }
    }

    /// Rebuild `piece` (blocks of one unit of one row, consecutive on the
    /// member) under its row's lock: each of the row's other units read
    /// once for the whole piece, XORed, every block checked against its
    /// checksum, written with one write. Returns (rebuilt, gone) and the
    /// blocks that could not be rebuilt. Anything unusual (the piece
    /// mapped in part, a peer unreadable, a coarse checksum) goes block by
    /// block ([`Pool::rebuild_block`]), which says what each block is.
    fn rebuild_piece(&self, slot: &RebuildSlot, piece: &LiveRun) -> Result<((u64, u64), Vec<u64>)> {
        let Some(layout) = self.parity_of(piece.vol) else { return Ok(((0, piece.len), Vec::new())) };
        let fast = {
            let _row = self.lock_row(piece.vol, crate::io::row_of(layout.0, layout.1, piece.lba));
            let _gate = self.gate_shared();
            self.piece_from_row(piece, layout)?
        };
        if let Some(data) = fast {
            let written = match slot.is_replacing() {
                true => slot.write_new(&data, piece.pba.byte_offset()),
                false => slot.write_at(&data, piece.pba.byte_offset()),
            };
            written.map_err(|e| EngineError::io("rebuild", slot.name(), e))?;
            return Ok(((piece.len, 0), Vec::new()));
        }
        let (mut counts, mut lost) = ((0, 0), Vec::new());
        for i in 0..piece.len {
            match self.rebuild_block(slot, piece, piece.lba + i, piece.pba.offset_by(i)) {
                Ok(true) => counts.0 += 1,
                Ok(false) => counts.1 += 1,
                // Another unit of its row is lost too (a row placed with
                // two units on this member): it stays unreadable (its
                // checksum fails on the new device: EIO).
                Err(EngineError::Io { .. } | EngineError::Inconsistent(_) | EngineError::Checksum { .. }) => {
                    lost.push(piece.lba + i)
                }
                Err(e) => return Err(e),
            }
        }
        Ok((counts, lost))
    }

    /// The piece's blocks from the rest of their row, if the view named
    /// maps the whole piece where it was listed, every peer unit reads
    /// and every block matches its own (per-block) checksum; else None.
    fn piece_from_row(&self, piece: &LiveRun, (p, blocks): (Parity, u64)) -> Result<Option<Vec<u8>>> {
        let view = if piece.snap == 0 { View::Head } else { View::Snapshot(piece.snap) };
        let summed = match self.resolve_summed(piece.vol, view, piece.lba, piece.len) {
            Ok(s) => s,
            Err(EngineError::VolumeGone(_) | EngineError::NoSuchSnapshot { .. } | EngineError::OutOfRange { .. }) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let [(Segment::Mapped { pba, len, .. }, sums)] = summed.as_slice() else { return Ok(None) };
        if *pba != piece.pba || *len != piece.len {
            return Ok(None);
        }
        let n = piece.len as usize * BS;
        let mut out = vec![0u8; n];
        let mut peer = vec![0u8; n];
        let last = crate::io::row_peers(p, blocks, piece.lba + piece.len - 1);
        for (k, first) in crate::io::row_peers(p, blocks, piece.lba).into_iter().enumerate() {
            // Peers of a unit's consecutive blocks are consecutive.
            if last.get(k) != Some(&(first + piece.len - 1)) {
                return Ok(None);
            }
            match self.read_verified(piece.vol, view, first * BLOCK_SIZE, &mut peer, false) {
                Ok(true) => xor_into(&mut out, &peer),
                Ok(false) | Err(EngineError::Io { .. } | EngineError::Checksum { .. }) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        let checked = out.chunks(BS).enumerate().all(|(i, b)| match sums.get(i) {
            Some(Some(BlockSum::Block(want))) => block_sum(b) == *want,
            Some(Some(BlockSum::Group(_))) => false,
            _ => true,
        });
        Ok(checked.then_some(out))
    }

    /// Blocks below `upto` are rebuilt: durable on the new device first,
    /// then the superblock records the cursor.
    fn rebuild_step_done(&self, index: usize, slot: &RebuildSlot, upto: u64) -> Result<()> {
        slot.flush().map_err(|e| EngineError::io("flush rebuilt blocks", slot.name(), e))?;
        self.record_rebuilt(index, Some(upto))
    }

    /// The member is whole: recorded, read in full, allocated from again.
    fn finish_rebuild(&self, index: usize, slot: &RebuildSlot) -> Result<()> {
        slot.flush().map_err(|e| EngineError::io("flush rebuilt blocks", slot.name(), e))?;
        self.record_rebuilt(index, None)?;
        slot.advance(WHOLE);
        // What open noted of the member (missing, half rebuilt) is over.
        let said = format!("member {index} (");
        self.lock_commit().notes.retain(|n| !n.starts_with(&said));
        self.write_inner().space.avoid &= !(1 << index);
        log::warn!("member {index} ({}): rebuilt from parity rows; the pool is whole", slot.name());
        Ok(())
    }
}
