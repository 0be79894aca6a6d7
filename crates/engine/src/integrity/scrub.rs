//! Scrub: read every block the pool references, on every copy, verify it
//! against its checksum, rewrite bad copies from a good one, and name the
//! volume ranges no copy can give back.

use crate::device::label::{read_label, write_label_copy};
use crate::error::{EngineError, Result};
use crate::map::extent_map::ExtentMap;
use crate::map::sums::{block_sum, group_sum, BlockSum, GROUP_BYTES};
use crate::pool::Pool;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tarn_format::node::SUMS_GROUP;

use tarn_format::{Pba, BLOCK_SIZE};

const BS: usize = BLOCK_SIZE as usize;
/// Blocks read per step (1 MiB): large sequential reads, short gate holds.
const CHUNK_BLOCKS: u64 = 256;

#[derive(Debug, Clone, Default)]
pub struct ScrubOptions {
    /// Bytes per second at most (None: as fast as the devices go).
    pub rate: Option<u64>,
}

/// A range of a volume no copy could give back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostRange {
    pub volume: String,
    /// None: the head (and the snapshots sharing the block); Some: data
    /// only snapshots hold (this one and older ones back to its birth).
    pub snapshot: Option<String>,
    pub offset: u64,
    pub len: u64,
}

#[derive(Debug, Clone, Default)]
pub struct ScrubReport {
    /// Bytes of data verified, all copies counted once.
    pub bytes: u64,
    pub blocks: u64,
    /// Copies of blocks that failed their checksum or could not be read.
    pub bad_copies: u64,
    /// Of those, copies rewritten from a good one.
    pub repaired: u64,
    /// Blocks without a good copy: listed in `lost` by volume range.
    pub lost_blocks: u64,
    pub lost: Vec<LostRange>,
    /// Blocks without a checksum (pools created before checksums).
    pub unsummed_blocks: u64,
    pub elapsed: Duration,
}

/// A piece of physical space and who maps it.
#[derive(Debug, Clone)]
pub(crate) struct Owned {
    pub pba: Pba,
    pub len: u64,
    vol: u32,
    snapshot: Option<u64>,
    lba: u64,
}

/// What checking one block on all its copies found.
enum BlockVerdict {
    Good,
    /// Some copies bad, rewritten from a good one (count).
    Repaired(u64),
    /// No copy good.
    Lost(u64),
}

impl Pool {
    /// Scrub the whole pool online. `progress(done, total)` in bytes.
    pub fn scrub(&self, opts: &ScrubOptions, progress: &mut dyn FnMut(u64, u64)) -> Result<ScrubReport> {
        let started = Instant::now();
        let mut owned = self.owned_extents(|_| true)?;
        owned.sort_by_key(|o| o.pba.0);
        let total: u64 = owned.iter().map(|o| o.len * BLOCK_SIZE).sum();
        let mut report = ScrubReport::default();
        let mut lost: Vec<(Owned, u64)> = Vec::new();
        for o in &owned {
            let mut at = 0;
            while at < o.len {
                let n = CHUNK_BLOCKS.min(o.len - at);
                self.scrub_chunk(o.pba.offset_by(at), n, &mut report, |i| lost.push((o.clone(), at + i)))?;
                at += n;
                report.bytes += n * BLOCK_SIZE;
                progress(report.bytes, total);
                throttle(opts.rate, report.bytes, started);
            }
        }
        report.lost = self.lost_ranges(&lost);
        report.elapsed = started.elapsed();
        log::info!(
            "scrub: {} blocks, {} bad copies, {} repaired, {} lost in {:.1}s",
            report.blocks,
            report.bad_copies,
            report.repaired,
            report.lost_blocks,
            report.elapsed.as_secs_f64()
        );
        Ok(report)
    }

    /// Every mapped physical extent with its owner, filtered by `keep`.
    pub(crate) fn owned_extents(&self, keep: impl Fn(&Owned) -> bool) -> Result<Vec<Owned>> {
        let inner = self.read_inner();
        let mut out = Vec::new();
        for v in inner.state.volumes.values() {
            let lists = std::iter::once((None, &v.map)).chain(v.snapshots.iter().map(|s| (Some(s.epoch), &s.dead)));
            for (snapshot, map) in lists {
                collect_owned(map, v.id, snapshot, &keep, &mut out)?;
            }
        }
        Ok(out)
    }

    /// Verify `n` blocks at `pba` on every copy; `lost(i)` for each block i
    /// no copy holds.
    fn scrub_chunk(&self, pba: Pba, n: u64, r: &mut ScrubReport, mut lost: impl FnMut(u64)) -> Result<()> {
        let dev = &self.devices[usize::from(pba.device())];
        let copies = dev.copies();
        let mut suspects: BTreeSet<u64> = BTreeSet::new();
        {
            let _gate = self.gate_shared();
            let sums = self.read_inner().state.sums.get_run(pba, n)?;
            let mut buf = vec![0u8; n as usize * BS];
            for copy in 0..copies {
                if dev.read_copy(copy, &mut buf, pba.byte_offset()).is_err() {
                    suspects.extend(0..n); // find which blocks, one by one
                    continue;
                }
                for (i, block) in buf.chunks_exact(BS).enumerate() {
                    match sums[i] {
                        Some(BlockSum::Block(want)) if block_sum(block) != want => {
                            suspects.insert(i as u64);
                        }
                        // A coarse group: checked whole, at its first block
                        // (one cut by the chunk's ends is checked alone).
                        Some(BlockSum::Group(want)) => {
                            let first = (pba.0 + i as u64).is_multiple_of(SUMS_GROUP);
                            let whole = first && i + SUMS_GROUP as usize <= n as usize;
                            let at = i * BS;
                            let cut = !whole && (first || i == 0);
                            if cut || (whole && group_sum(&buf[at..at + GROUP_BYTES]) != want) {
                                suspects.insert(i as u64);
                            }
                        }
                        None if copy == 0 => r.unsummed_blocks += 1,
                        _ => {}
                    }
                }
            }
        }
        r.blocks += n;
        for i in suspects {
            // Writes drained: a racing overwrite is not corruption.
            let _quiet = self.io_gate.write().unwrap_or_else(|p| p.into_inner());
            let Some(sum) = self.read_inner().state.sums.get(pba.offset_by(i))? else { continue };
            let (at, len, want, blocks) = match sum {
                BlockSum::Block(want) => (pba.offset_by(i), BS, want, i..i + 1),
                BlockSum::Group(want) => {
                    // The group's blocks in this chunk share its verdict.
                    let first = (pba.0 + i) / SUMS_GROUP * SUMS_GROUP;
                    let blocks = first.max(pba.0) - pba.0..(first + SUMS_GROUP).min(pba.0 + n) - pba.0;
                    (Pba(first), GROUP_BYTES, want, blocks)
                }
            };
            match self.check_span_copies(at, len, want) {
                BlockVerdict::Good => {}
                BlockVerdict::Repaired(k) => {
                    r.bad_copies += k;
                    r.repaired += k;
                }
                BlockVerdict::Lost(k) => {
                    r.bad_copies += k;
                    r.lost_blocks += blocks.end - blocks.start;
                    blocks.for_each(&mut lost);
                }
            }
        }
        Ok(())
    }

    /// Check one block or coarse group (`len` bytes) on every copy against
    /// `want`, healing bad copies.
    fn check_span_copies(&self, pba: Pba, len: usize, want: u32) -> BlockVerdict {
        if self.is_suspect(pba) {
            // Left open by a crash: whatever is there is valid; resync it.
            return match self.resync_span(pba, len) {
                Ok(_) => BlockVerdict::Good,
                Err(_) => BlockVerdict::Lost(1),
            };
        }
        let c = self.examine_span(pba, len, want);
        let bad = c.bad.len() as u64;
        match c.good {
            _ if bad == 0 => BlockVerdict::Good,
            Some(good) => {
                self.rewrite_copies(pba, &good, &c.bad);
                BlockVerdict::Repaired(bad)
            }
            None => {
                // heal_block counts and logs it the same way a read would.
                let _ = self.heal_span(pba, len, want);
                BlockVerdict::Lost(bad)
            }
        }
    }

    /// Rewrite every invalid superblock copy from its device's current one
    /// (the repair of a torn or rotten label); says what it fixed.
    pub fn repair_labels(&self) -> Result<Vec<String>> {
        self.check_writable()?;
        let mut ctl = self.lock_commit();
        let mut fixed = Vec::new();
        for (i, dev) in self.devices.iter().enumerate() {
            if ctl.sb.devices.get(i).is_some_and(|e| e.removed) {
                continue; // No label: the device left the pool.
            }
            let label = read_label(dev.as_ref())?;
            let Some(why) = label.other_invalid else { continue };
            let copy = 1 - label.copy;
            write_label_copy(dev.as_ref(), &label.current, copy)?;
            dev.flush().map_err(|e| EngineError::io("flush superblock", dev.name(), e))?;
            log::warn!("rewrote superblock copy {copy} of {} ({why})", dev.name());
            fixed.push(format!("superblock copy {copy} of {} rewritten (was: {why})", dev.name()));
        }
        if !fixed.is_empty() {
            ctl.notes.retain(|n| !n.starts_with("superblock copy"));
        }
        Ok(fixed)
    }

    /// Lost blocks as merged volume ranges, with names.
    fn lost_ranges(&self, lost: &[(Owned, u64)]) -> Vec<LostRange> {
        let inner = self.read_inner();
        let mut out: Vec<LostRange> = Vec::new();
        for (o, i) in lost {
            let Some(v) = inner.state.volume(o.vol) else { continue };
            let snapshot = o.snapshot.and_then(|e| v.snapshots.iter().find(|s| s.epoch == e)).map(|s| s.name.clone());
            let offset = (o.lba + i) * BLOCK_SIZE;
            match out.last_mut() {
                Some(l) if l.volume == v.name && l.snapshot == snapshot && l.offset + l.len == offset => {
                    l.len += BLOCK_SIZE
                }
                _ => out.push(LostRange { volume: v.name.clone(), snapshot, offset, len: BLOCK_SIZE }),
            }
        }
        out
    }
}

fn collect_owned(
    map: &ExtentMap,
    vol: u32,
    snapshot: Option<u64>,
    keep: &impl Fn(&Owned) -> bool,
    out: &mut Vec<Owned>,
) -> Result<()> {
    for (lba, e) in map.entries()? {
        if e.pba.is_origin() {
            continue;
        }
        let o = Owned { pba: e.pba, len: e.len, vol, snapshot, lba };
        if keep(&o) {
            out.push(o);
        }
    }
    Ok(())
}

/// Sleep so that `done` bytes since `started` stay under `rate` per second.
pub fn throttle(rate: Option<u64>, done: u64, started: Instant) {
    let Some(rate) = rate.filter(|&r| r > 0) else { return };
    let due = Duration::from_secs_f64(done as f64 / rate as f64);
    if let Some(wait) = due.checked_sub(started.elapsed()) {
        std::thread::sleep(wait.min(Duration::from_secs(1)));
    }
}
