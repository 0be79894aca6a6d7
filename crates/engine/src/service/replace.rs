//! Replacing a present member by a new device (`tarn pool replace OLD NEW`
//! of a member still there, as `zpool replace` or `mdadm --replace`;
//! issue 12; format: device table state 5 with `copied`, the new uuid and
//! path, incompat bit 22 REPLACE, docs/FORMAT.md *Members being replaced*).
//!
//! Everything the pool uses on the member (every block its allocator does
//! not hold free: heads, snapshots' dead lists, clones of every volume
//! kind, store nodes, catalog segments) is copied to the new device at the
//! same address, in address order, in chunks, while clients write: the
//! member's slot (`device/rebuild_slot.rs`) writes both devices below the
//! cursor and only the old one past it, and a chunk's copy holds its gate
//! exclusively. Allocation avoids the member until the end, so nothing new
//! lands past the cursor. A chunk the old device cannot read is copied
//! block by block; a block that still fails is rebuilt from its parity
//! row when a parity volume maps it (else it is lost: counted, logged).
//! Each step is flushed on the new device before the superblock records
//! the cursor past it; at the end the entry takes the new device's uuid
//! and path (state 0), then the old device's label is wiped.

use crate::device::label::{wipe_label, write_both_labels};
use crate::device::rebuild_slot::RebuildSlot;
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::pool::Pool;
use crate::service::grow::member_label;
use crate::service::open::random_bytes;
use crate::service::rebuild::{refuse, refuse_unfit_device};
use crate::volumes::evacuate::{on_member, LiveRun};
use std::sync::Arc;
use tarn_format::superblock::{incompat, Replacement};
use tarn_format::BLOCK_SIZE;

/// Blocks copied per chunk (1 MiB: writes to the member wait at most one).
const CHUNK_BLOCKS: u64 = 256;
/// Blocks copied between two cursor records (4 MiB: a superblock rewrite
/// and two flushes per 4 MiB; a restart copies at most that again).
const STEP_BLOCKS: u64 = 1024;

/// What `Pool::copy_member` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyReport {
    pub index: usize,
    /// Blocks the pool used on the member from the cursor on.
    pub blocks: u64,
    /// Of them, copied from the old device.
    pub copied: u64,
    /// Of them, unreadable there and rebuilt from their parity rows.
    pub reconstructed: u64,
    /// Of them, unreadable and not rebuildable (no parity, or a second
    /// unit of the row lost).
    pub lost: u64,
    /// Stopped before the end (`go_on` said so); resumable.
    pub stopped: bool,
}

impl Pool {
    /// The slot of member `index` while it is being replaced.
    fn replace_slot_of(&self, index: usize) -> Option<&RebuildSlot> {
        self.devices.get(index).and_then(|d| d.rebuild_slot()).filter(|s| s.is_replacing())
    }

    /// The members being replaced (the service resumes them).
    pub fn replacing_members(&self) -> Vec<usize> {
        (0..self.devices.len()).filter(|&i| self.replace_slot_of(i).is_some()).collect()
    }

    /// The device member `index` is being copied onto, if it is.
    pub fn replacing_onto(&self, index: usize) -> Option<String> {
        // A replace whose new device was missing at open is over: a new
        // one may start.
        self.replace_slot_of(index)?;
        let ctl = self.lock_commit();
        ctl.sb.devices.get(index).and_then(|e| e.replacing.as_ref()).map(|r| r.path.clone())
    }

    /// The member `name` designates (its index, or its recorded path) if it
    /// is a plain member that is present (or being replaced): the one
    /// `pool replace` copies onto a new device (the primary is named so
    /// that its refusal says why).
    pub fn member_to_replace(&self, name: &str) -> Option<usize> {
        let ctl = self.lock_commit();
        let named = |i: usize| name == i.to_string() || ctl.sb.devices.get(i).is_some_and(|e| e.path == name);
        if named(0) && ctl.sb.devices.first().is_some_and(|e| e.legs.is_empty()) {
            // Refused by `replace_present`, by name.
            return Some(0);
        }
        (1..self.devices.len())
            .find(|&i| named(i) && ctl.sb.devices.get(i).is_some_and(|e| e.legs.is_empty() && !e.removed && !e.spare))
    }

    /// Every reason present member `index` cannot be replaced by `dev`.
    fn refuse_replace_present(&self, index: usize, dev: &dyn Device) -> Result<()> {
        let n = self.devices.len();
        if index == 0 {
            return refuse("member 0 is the primary (journal and superblock): it cannot be replaced".into());
        }
        let entry = self.lock_commit().sb.devices.get(index).cloned();
        let Some(entry) = entry.filter(|_| index < n) else {
            return refuse(format!("no member {index}: the pool has {n} (0..{})", n.saturating_sub(1)));
        };
        if entry.removed || entry.spare || !entry.legs.is_empty() || entry.draining {
            let what = match () {
                _ if entry.removed => "a removed slot",
                _ if entry.spare => "a spare",
                _ if entry.draining => "draining (`tarn dev remove` is moving its data)",
                _ => "a mirror (replace one of its legs: `pool replace OLD-LEG NEW`)",
            };
            return refuse(format!("member {index} is {what}: only a plain member is replaced"));
        }
        if let Some(r) = entry.replacing.as_ref().filter(|_| self.replace_slot_of(index).is_some()) {
            return refuse(format!("member {index} is being replaced by {} already", r.path));
        }
        if self.devices[index].rebuild_slot().is_none_or(|s| s.degraded()) {
            return refuse(format!("member {index} is missing or being rebuilt: see `tarn pool status`"));
        }
        refuse_unfit_device(index, entry.blocks, dev)?;
        Ok(())
    }

    /// Start copying present member `index` onto `dev` (at `path`), to be
    /// done by [`Pool::copy_member`]. Refused (nothing changed) for the
    /// primary, a mirror, a spare, a removed or draining slot, a member
    /// missing, rebuilt or replaced already, a device too small or
    /// carrying a tarn label.
    pub fn replace_present(&self, index: usize, dev: Arc<dyn Device>, path: &str) -> Result<()> {
        self.check_writable()?;
        self.refuse_replace_present(index, dev.as_ref())?;
        let Some(slot) = self.devices[index].rebuild_slot() else {
            return refuse(format!(
                "member {index} was a spare taken since the pool was opened: restart the server (or run \
                 `pool replace` offline) to replace it"
            ));
        };
        // Nothing new lands on the member from now on: what is copied is
        // what the allocator holds once the copy starts.
        self.write_inner().space.avoid |= 1 << index;
        let start = self.read_inner().space.devices[index].data_start;
        let mut ctl = self.lock_commit();
        let replacement = Replacement { copied: start, uuid: random_bytes::<16>()?, path: path.to_string() };
        let mut entry = ctl.sb.devices[index].clone();
        entry.uuid = replacement.uuid;
        let mut label = member_label(&ctl.sb, &entry, index);
        label.created_unix = ctl.sb.created_unix;
        label.incompat |= incompat::EVACUATION | incompat::REPLACE;
        // The label first: a crash before the table names the device
        // leaves it unknown to the pool.
        let started = write_both_labels(dev.as_ref(), &label)
            .and_then(|()| dev.flush().map_err(|e| EngineError::io("flush label", dev.name(), e)))
            .and_then(|()| {
                let bits = incompat::EVACUATION | incompat::REPLACE;
                self.rewrite_member_entry(&mut ctl, index, bits, |e| e.replacing = Some(replacement))
            });
        if let Err(e) = started {
            self.write_inner().space.avoid &= !(1 << index);
            return Err(e);
        }
        drop(ctl);
        slot.begin_replace(dev, start).map_err(|e| EngineError::io("replace", slot.name(), e))?;
        log::warn!("member {index}: being copied onto {path}");
        Ok(())
    }

    /// Copy everything the pool uses on member `index` onto its new
    /// device, from the cursor on. `go_on(done, total)` (blocks) is asked
    /// after every chunk; false stops (resumable). At the end the new
    /// device is the member and the old one carries no pool label.
    pub fn copy_member(&self, index: usize, go_on: &mut dyn FnMut(u64, u64) -> bool) -> Result<CopyReport> {
        self.copy_member_by(index, STEP_BLOCKS, go_on)
    }

    /// [`Pool::copy_member`] recording the cursor every `step` blocks (in
    /// chunks of at most `step`; the crash simulation takes small steps).
    pub fn copy_member_by(
        &self,
        index: usize,
        step_blocks: u64,
        go_on: &mut dyn FnMut(u64, u64) -> bool,
    ) -> Result<CopyReport> {
        self.check_writable()?;
        let Some(slot) = self.replace_slot_of(index) else {
            return refuse(format!("member {index} is not being replaced (`tarn pool replace` starts it)"));
        };
        let from = slot.rebuilt();
        let ranges: Vec<(u64, u64)> = self
            .used_ranges(index)
            .into_iter()
            .filter(|&(s, n)| s + n > from && s >= LABEL_END)
            .map(|(s, n)| if s < from { (from, s + n - from) } else { (s, n) })
            .collect();
        let mut report = CopyReport { index, blocks: ranges.iter().map(|r| r.1).sum(), ..Default::default() };
        // Chunks no larger than a step (the simulation takes small ones).
        let chunk = CHUNK_BLOCKS.min(step_blocks.max(1));
        let mut buf = vec![0u8; (chunk * BLOCK_SIZE) as usize];
        let mut runs = None;
        let mut since = 0;
        // Bounded by the ranges listed, each block once.
        for &(start, len) in &ranges {
            let mut at = start;
            while at < start + len {
                let n = chunk.min(start + len - at);
                self.copy_chunk(index, slot, at, &mut buf[..(n * BLOCK_SIZE) as usize], &mut runs, &mut report)?;
                at += n;
                since += n;
                if since >= step_blocks {
                    since = 0;
                    self.replace_step_done(index, slot, at)?;
                }
                if !go_on(report.copied + report.reconstructed + report.lost, report.blocks) {
                    self.replace_step_done(index, slot, at)?;
                    report.stopped = true;
                    return Ok(report);
                }
            }
        }
        self.finish_replace(index, slot)?;
        go_on(report.blocks, report.blocks);
        Ok(report)
    }

    /// Copy one chunk; one the old device cannot read block by block, and
    /// each block it still cannot read from its parity row.
    fn copy_chunk(
        &self,
        index: usize,
        slot: &RebuildSlot,
        at: u64,
        buf: &mut [u8],
        runs: &mut Option<Vec<LiveRun>>,
        report: &mut CopyReport,
    ) -> Result<()> {
        let n = buf.len() as u64 / BLOCK_SIZE;
        let io = |e| EngineError::io("copy onto the new device", slot.name(), e);
        if slot.copy(at, buf).map_err(io)? {
            report.copied += n;
            return Ok(());
        }
        for b in at..at + n {
            if slot.copy(b, &mut buf[..BLOCK_SIZE as usize]).map_err(io)? {
                report.copied += 1;
                continue;
            }
            if runs.is_none() {
                *runs = Some(self.live_runs_where(&on_member(index))?);
            }
            let pba = tarn_format::Pba::new(index as u16, b);
            let hit = runs.as_deref().unwrap_or_default().iter().find(|r| r.pba.0 <= pba.0 && pba.0 < r.pba.0 + r.len);
            let rebuilt = match hit {
                Some(r) => self.rebuild_block(slot, r, r.lba + (pba.0 - r.pba.0), pba),
                None => Ok(false),
            };
            match rebuilt {
                Ok(true) => report.reconstructed += 1,
                Ok(false)
                | Err(EngineError::Io { .. } | EngineError::Inconsistent(_) | EngineError::Checksum { .. }) => {
                    log::error!("member {index}: block {b} cannot be read nor rebuilt from a parity row: lost");
                    report.lost += 1;
                }
                Err(e) => return Err(e),
            }
            // Parity blocks are never written in place and nothing is
            // allocated here: no write can come between.
            slot.advance(b + 1);
        }
        Ok(())
    }

    /// Blocks below `upto` are copied: durable on the new device first,
    /// then the superblock records the cursor.
    fn replace_step_done(&self, index: usize, slot: &RebuildSlot, upto: u64) -> Result<()> {
        slot.flush().map_err(|e| EngineError::io("flush copied blocks", slot.name(), e))?;
        let mut ctl = self.lock_commit();
        let upto = upto.min(ctl.sb.devices[index].blocks);
        self.rewrite_member_entry(&mut ctl, index, 0, |e| {
            if let Some(r) = &mut e.replacing {
                r.copied = r.copied.max(upto);
            }
        })
    }

    /// The copy is over: the entry names the new device (state 0), the old
    /// one's label is wiped, allocation uses the member again.
    fn finish_replace(&self, index: usize, slot: &RebuildSlot) -> Result<()> {
        slot.flush().map_err(|e| EngineError::io("flush copied blocks", slot.name(), e))?;
        let mut ctl = self.lock_commit();
        let Some(r) = ctl.sb.devices.get(index).and_then(|e| e.replacing.clone()) else {
            return Err(EngineError::Inconsistent(format!("member {index}: its replace is not recorded")));
        };
        self.rewrite_member_entry(&mut ctl, index, 0, |e| {
            e.uuid = r.uuid;
            e.path = r.path.clone();
            e.replacing = None;
        })?;
        if ctl.sb.devices.iter().all(|d| d.replacing.is_none()) && ctl.sb.incompat & incompat::REPLACE != 0 {
            let mut sb = ctl.sb.clone();
            sb.txid += 1;
            sb.incompat &= !incompat::REPLACE;
            self.write_superblock(&sb)?;
            ctl.sb = sb;
        }
        let said = format!("member {index} (");
        ctl.notes.retain(|n| !n.starts_with(&said));
        drop(ctl);
        let old = slot.end_replace();
        self.write_inner().space.avoid &= !(1 << index);
        if let Some(old) = old {
            // After the superblock that drops it: a crash before leaves a
            // label no table names.
            if let Err(e) = wipe_label(old.as_ref()) {
                log::error!("member {index} replaced, but the old device's label could not be wiped: {e}");
            }
        }
        log::warn!("member {index}: replaced by {}", r.path);
        Ok(())
    }
}

/// Blocks of a member below its data area: its own label.
const LABEL_END: u64 = tarn_format::superblock::LABEL_BLOCKS;
