//! Replacing a mirror leg and resilvering it: the new device is put in the
//! old leg's place as RESILVERING (written by every write from then on, read
//! by nobody), every range the pool uses is copied to it from an in-sync leg
//! while I/O continues, and a checkpoint then records it in sync.

use crate::device::label::uuid_string;
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::members::assemble::write_leg_label;
use crate::members::mirror::{Leg, LegHealth, MirrorDevice};
use crate::pool::Pool;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tarn_format::leg::{LegLabel, LEG_LABEL_BLOCK};
use tarn_format::superblock::LABEL_BLOCKS;
use tarn_format::BLOCK_SIZE;

/// Blocks copied per step (writes to the mirror wait at most one step).
const CHUNK_BLOCKS: u64 = 256;

/// What a replace did.
#[derive(Debug, Clone)]
pub struct ReplaceReport {
    pub member: usize,
    pub leg: usize,
    pub old: String,
    pub new: String,
    pub copied_bytes: u64,
    pub seconds: f64,
}

impl Pool {
    /// Replace the mirror leg `old` (its recorded path, device name or leg
    /// uuid) with `new` and resilver it; `progress(done, total)` in blocks.
    /// Durable (checkpointed) when it returns.
    pub fn replace_leg(
        &self,
        old: &str,
        new: Arc<dyn Device>,
        new_path: &str,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ReplaceReport> {
        self.check_writable()?;
        let (member, leg) = self.find_leg(old)?;
        let mirror = self.mirrors[member]
            .clone()
            .ok_or_else(|| EngineError::InvalidArgument(format!("{old} is not a mirror leg")))?;
        let slot_bytes = mirror.size();
        if new.size() < slot_bytes {
            return Err(EngineError::InvalidArgument(format!(
                "{} is too small: {} bytes, the mirror needs {slot_bytes}",
                new.name(),
                new.size()
            )));
        }
        let legs = mirror.legs();
        if legs.iter().enumerate().any(|(i, l)| i != leg && l.dev.as_ref().is_some_and(|d| d.name() == new.name())) {
            return Err(EngineError::InvalidArgument(format!("{} is already a leg of member {member}", new.name())));
        }
        let source = (0..legs.len()).find(|&i| i != leg && legs[i].health() == LegHealth::Online).ok_or_else(|| {
            EngineError::MemberUnavailable { member, detail: "no other in-sync leg to copy from".into() }
        })?;
        if mirror.resilvering.swap(true, Ordering::SeqCst) {
            return Err(EngineError::InUse {
                what: format!("member {member}"),
                detail: "a resilver is running".into(),
            });
        }
        let result = self.resilver(member, leg, source, &mirror, new, new_path, progress);
        mirror.resilvering.store(false, Ordering::SeqCst);
        let (copied_bytes, seconds) = result?;
        Ok(ReplaceReport { member, leg, old: old.to_string(), new: new_path.to_string(), copied_bytes, seconds })
    }

    /// Which (member, leg) `name` designates.
    fn find_leg(&self, name: &str) -> Result<(usize, usize)> {
        for (member, m) in self.mirrors.iter().enumerate() {
            let Some(m) = m else { continue };
            for (i, l) in m.legs().iter().enumerate() {
                let dev_name = l.dev.as_ref().map(|d| d.name());
                if l.path == name || dev_name.as_deref() == Some(name) || uuid_string(&l.uuid) == name {
                    return Ok((member, i));
                }
            }
        }
        Err(EngineError::InvalidArgument(format!("no mirror leg named {name} in this pool (see `tarn pool status`)")))
    }

    #[allow(clippy::too_many_arguments)]
    fn resilver(
        &self,
        member: usize,
        leg: usize,
        source: usize,
        mirror: &MirrorDevice,
        new: Arc<dyn Device>,
        new_path: &str,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(u64, f64)> {
        let started = Instant::now();
        let (pool_uuid, slot_uuid) = {
            let ctl = self.lock_commit();
            (ctl.sb.pool_uuid, ctl.sb.devices[member].uuid)
        };
        let leg_uuid = random_uuid()?;
        let label = LegLabel { pool_uuid, slot_uuid, slot_index: member as u16, leg_uuid };
        write_leg_label(new.as_ref(), &label)?;
        mirror
            .install(leg, Leg::new(Some(new.clone()), leg_uuid, new_path.to_string(), LegHealth::Resilvering))
            .map_err(|e| EngineError::io("install leg", new.name(), e))?;
        // Recorded at once (as needing a resilver), so after a crash the
        // new device is known and the old leg's copy is not trusted.
        {
            let mut ctl = self.lock_commit();
            self.check_writable()?;
            self.record_leg_states(&mut ctl)?;
        }
        // Installed before the ranges are taken: anything allocated later is
        // written with the new leg in place.
        let ranges = self.used_ranges(member);
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        log::info!("resilver of member {member} leg {leg} onto {}: {total} blocks from leg {source}", new.name());
        copy_ranges(mirror, (source, leg), &ranges, progress, &|| false)
            .map_err(|e| EngineError::io("resilver", new.name(), e))?;
        new.flush().map_err(|e| EngineError::io("flush", new.name(), e))?;
        mirror.set_health(leg, LegHealth::Online).map_err(|e| EngineError::io("resilver", new.name(), e))?;
        // The checkpoint writes the table with the new leg in sync.
        self.checkpoint()?;
        let seconds = started.elapsed().as_secs_f64();
        log::info!("resilver of member {member} done: {} MiB in {seconds:.1}s", (total * BLOCK_SIZE) >> 20);
        Ok((total * BLOCK_SIZE, seconds))
    }

    /// Block ranges of member `member` worth copying: the label area (but
    /// the leg label, which is the new leg's own), the journal, and every
    /// block the allocator does not hold free (data, checkpoints, space
    /// freed but not yet reusable).
    pub fn used_ranges(&self, member: usize) -> Vec<(u64, u64)> {
        let inner = self.read_inner();
        let ds = &inner.space.devices[member];
        let mut out = vec![(0, LEG_LABEL_BLOCK), (LEG_LABEL_BLOCK + 1, ds.data_start - LEG_LABEL_BLOCK - 1)];
        debug_assert!(ds.data_start >= LABEL_BLOCKS);
        let mut pos = ds.data_start;
        // Unreadable free space: copy everything (slower, never wrong).
        let free = inner.space.free_ranges(member).unwrap_or_else(|e| {
            log::warn!("reading member {member}'s free space failed ({e}): copying all of it");
            Vec::new()
        });
        for (start, len) in free {
            if start > pos {
                out.push((pos, start - pos));
            }
            pos = start + len;
        }
        if pos < ds.data_end {
            out.push((pos, ds.data_end - pos));
        }
        out
    }
}

/// Copy `ranges` (blocks) from leg `src` to leg `dst` in chunks; false if
/// `stop` said so between two chunks.
fn copy_ranges(
    mirror: &MirrorDevice,
    (src, dst): (usize, usize),
    ranges: &[(u64, u64)],
    progress: &mut dyn FnMut(u64, u64),
    stop: &dyn Fn() -> bool,
) -> std::io::Result<bool> {
    let total: u64 = ranges.iter().map(|r| r.1).sum();
    let mut done = 0;
    let mut buf = vec![0u8; (CHUNK_BLOCKS * BLOCK_SIZE) as usize];
    progress(0, total);
    for &(start, len) in ranges {
        let mut at = start;
        while at < start + len {
            if stop() {
                return Ok(false);
            }
            let n = CHUNK_BLOCKS.min(start + len - at);
            mirror.copy_leg(src, dst, at * BLOCK_SIZE, &mut buf[..(n * BLOCK_SIZE) as usize])?;
            at += n;
            done += n;
            progress(done, total);
        }
    }
    Ok(true)
}

impl Pool {
    /// Whether a mirror has a leg to resync (after an unclean shutdown, or
    /// a resilver that did not finish) and no resilver is running.
    pub fn needs_resync(&self) -> bool {
        self.mirrors.iter().flatten().any(|m| {
            !m.resilvering.load(Ordering::SeqCst) && m.legs().iter().any(|l| l.health() == LegHealth::Resilvering)
        })
    }

    /// Bring every RESILVERING leg in sync from its mirror's first in-sync
    /// leg, while I/O continues; checkpoint. Returns the bytes copied.
    pub fn resync_legs(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<u64> {
        self.resync_legs_until(progress, &|| false)
    }

    /// [`Pool::resync_legs`], checking `stop` between 1 MiB chunks: a leg
    /// not finished stays RESILVERING (the next start resyncs it again).
    pub fn resync_legs_until(&self, progress: &mut dyn FnMut(u64, u64), stop: &dyn Fn() -> bool) -> Result<u64> {
        self.check_writable()?;
        let mut copied = 0;
        for (member, m) in self.mirrors.iter().enumerate() {
            let Some(m) = m else { continue };
            if m.resilvering.swap(true, Ordering::SeqCst) {
                continue;
            }
            let result = self.resync_member(member, m, progress, stop);
            m.resilvering.store(false, Ordering::SeqCst);
            copied += result?;
        }
        if copied > 0 {
            self.checkpoint()?;
        }
        Ok(copied)
    }

    fn resync_member(
        &self,
        member: usize,
        m: &MirrorDevice,
        progress: &mut dyn FnMut(u64, u64),
        stop: &dyn Fn() -> bool,
    ) -> Result<u64> {
        let legs = m.legs();
        let Some(src) = legs.iter().position(|l| l.health() == LegHealth::Online) else { return Ok(0) };
        let mut copied = 0;
        for dst in (0..legs.len()).filter(|&i| legs[i].health() == LegHealth::Resilvering) {
            let ranges = self.used_ranges(member);
            log::info!("member {member}: resync of leg {dst} from leg {src}");
            let io = |e| EngineError::io("resync", m.name(), e);
            if !copy_ranges(m, (src, dst), &ranges, progress, stop).map_err(io)? {
                log::info!("member {member}: resync of leg {dst} stopped; it stays RESILVERING");
                break;
            }
            if let Some(dev) = &legs[dst].dev {
                dev.flush().map_err(|e| EngineError::io("flush", dev.name(), e))?;
            }
            m.set_health(dst, LegHealth::Online).map_err(|e| EngineError::io("resync", m.name(), e))?;
            copied += ranges.iter().map(|r| r.1).sum::<u64>() * BLOCK_SIZE;
        }
        Ok(copied)
    }
}

fn random_uuid() -> Result<[u8; 16]> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| EngineError::InvalidArgument(format!("no randomness for a uuid: {e}")))?;
    Ok(b)
}
