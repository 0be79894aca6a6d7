//! Verified reads: every block of data checked against the checksum its
//! map entry holds (see `map/sums.rs`), and self-heal from other copies.

use crate::error::{EngineError, Result};
use crate::map::extent_map::Segment;
use crate::map::sums::{block_sum, group_sum, regions_of, BlockSum, GROUP_BYTES};
use crate::map::view::View;
use crate::pool::{resolve_in, Inner, Pool};
use std::sync::atomic::Ordering;
use tarn_format::node::SUMS_GROUP;
use tarn_format::{Pba, BLOCK_SIZE};

const BS: usize = BLOCK_SIZE as usize;

/// A piece of a read: a segment and, if mapped with checksums, its sums.
pub(crate) type Summed = (Segment, Vec<Option<BlockSum>>);

/// Whether `s` is a coarse group's sum.
fn is_group(s: Option<&Option<BlockSum>>) -> bool {
    matches!(s, Some(Some(BlockSum::Group(_))))
}

/// Forward gaps of up to this many blocks between two pieces of a read
/// on one device are read through (the bytes dropped) rather than sent as
/// another request: 32 KiB, ZFS's read gap limit.
const READ_GAP_BLOCKS: u64 = 8;

/// The most blocks one gathered request spans (gaps included).
const GATHER_MAX_BLOCKS: u64 = 1024;

/// Forward gaps of up to this many blocks between two pieces of a sweep
/// in device order (compaction's read of many windows) are read through:
/// 128 KiB, under a disk's cost of a seek and a half rotation.
const SWEEP_GAP_BLOCKS: u64 = 32;

/// Blocks of a view wanted in a buffer, for [`Pool::read_in_device_order`]:
/// which buffer, the byte there they go to, where they lie, their sums.
pub(crate) struct Wanted {
    pub buf: usize,
    pub at: usize,
    pub pba: Pba,
    pub len: u64,
    pub sums: Vec<Option<BlockSum>>,
}

/// How many of `segs` (from the first) one request can read: mapped
/// pieces of whole blocks inside `[offset, end)`, each starting on the
/// first's device at most [`READ_GAP_BLOCKS`] after the one before ends.
fn gathered(segs: &[Summed], offset: u64, end: u64) -> usize {
    let whole = |seg: &Segment| seg.lba() * BLOCK_SIZE >= offset && (seg.lba() + seg.len()) * BLOCK_SIZE <= end;
    let mut reach: Option<(Pba, Pba)> = None; // first block, block after the last
    let mut n = 0;
    for (seg, _) in segs {
        let Segment::Mapped { pba, len, .. } = *seg else { break };
        if !whole(seg) {
            break;
        }
        let fits = match reach {
            None => true,
            Some((start, after)) => {
                pba.device() == after.device()
                    && pba.block() >= after.block()
                    && pba.block() - after.block() <= READ_GAP_BLOCKS
                    && pba.block() + len - start.block() <= GATHER_MAX_BLOCKS
            }
        };
        if !fits {
            break;
        }
        reach = Some((reach.map_or(pba, |r| r.0), pba.offset_by(len)));
        n += 1;
    }
    n
}

/// The physical blocks `[start, end)` a gathered read of `pieces` reads:
/// from the first's first block to the last's end, widened to whole
/// groups where a piece at either end has a coarse group's sum there.
fn gather_span(pieces: &[(u64, Pba, u64)], segs: &[Summed]) -> (u64, u64) {
    let (mut start, mut end) = (pieces[0].1 .0, pieces[pieces.len() - 1].1.offset_by(pieces[pieces.len() - 1].2).0);
    if is_group(segs[0].1.first()) {
        start = start / SUMS_GROUP * SUMS_GROUP;
    }
    if is_group(segs[segs.len() - 1].1.last()) {
        end = end.div_ceil(SUMS_GROUP) * SUMS_GROUP;
    }
    (start, end)
}

/// Whether the blocks `data` holds from physical block `start` match the
/// sums of `pieces` (their runs in `segs`): a block its own crc, a coarse
/// group (whole in `data`: the span is widened at its ends and has no
/// holes inside) its crc once.
fn span_is_sound(data: &[u8], start: u64, pieces: &[(u64, Pba, u64)], segs: &[Summed]) -> bool {
    let mut groups_checked: Vec<u64> = Vec::new();
    for (&(_, pba, _), (_, sums)) in pieces.iter().zip(segs) {
        for (i, sum) in sums.iter().enumerate() {
            let b = pba.0 + i as u64;
            let ok = match *sum {
                Some(BlockSum::Block(crc)) => block_sum(&data[(b - start) as usize * BS..][..BS]) == crc,
                Some(BlockSum::Group(crc)) => {
                    let g = b / SUMS_GROUP * SUMS_GROUP;
                    groups_checked.contains(&g) || {
                        groups_checked.push(g);
                        // Not whole in the span (not expected): unsound,
                        // so the runs are read on their own.
                        let at = g.checked_sub(start).map(|d| d as usize * BS);
                        at.and_then(|at| data.get(at..at + GROUP_BYTES)).is_some_and(|d| group_sum(d) == crc)
                    }
                }
                None => true,
            };
            if !ok {
                return false;
            }
        }
    }
    true
}

impl Pool {
    /// Segments of a view and the sums of their blocks, under one lock so a
    /// completed write's data and sums are seen together.
    pub(crate) fn resolve_summed(&self, vol: u32, view: View, lba: u64, len: u64) -> Result<Vec<Summed>> {
        self.with_cached_nodes(|inner| self.resolve_summed_in(inner, vol, view, lba, len))
    }

    fn resolve_summed_in(&self, inner: &Inner, vol: u32, view: View, lba: u64, len: u64) -> Result<Vec<Summed>> {
        let segs = resolve_in(inner, vol, view, lba, len)?;
        segs.into_iter()
            .map(|seg| match seg {
                // Read-only after a crash, regions left open are not resynced:
                // their blocks may legitimately disagree with their sums.
                Segment::Mapped { pba, len, .. }
                    if self.checksums
                        && !(self.options.read_only
                            && regions_of(pba, len).any(|r| inner.state.open_regions.contains(&r))) =>
                {
                    Ok((seg, inner.state.sums.get_run(pba, len)?))
                }
                _ => Ok((seg, Vec::new())),
            })
            .collect()
    }

    /// Read `buf` at `offset` of a view, verifying every block. Without
    /// `heal` a mismatch returns false at once; with it (writes drained) a
    /// bad block is taken from a good copy or the read fails.
    pub(crate) fn read_verified(&self, vol: u32, view: View, offset: u64, buf: &mut [u8], heal: bool) -> Result<bool> {
        let first = offset / BLOCK_SIZE;
        let end = offset + buf.len() as u64;
        let segs = self.resolve_summed(vol, view, first, end.div_ceil(BLOCK_SIZE) - first)?;
        self.prefetch_members(&segs);
        let mut i = 0;
        while i < segs.len() {
            let n = gathered(&segs[i..], offset, end);
            if n > 1 {
                if !self.read_gathered(&segs[i..i + n], offset, buf, heal)? {
                    return Ok(false);
                }
                i += n;
                continue;
            }
            let (seg, sums) = &segs[i];
            let (seg, sums) = (*seg, sums.as_slice());
            i += 1;
            let s = (seg.lba() * BLOCK_SIZE).max(offset);
            let e = ((seg.lba() + seg.len()) * BLOCK_SIZE).min(end);
            let out = &mut buf[(s - offset) as usize..(e - offset) as usize];
            match seg {
                Segment::Hole { .. } => out.fill(0),
                Segment::Mapped { lba, pba, .. } if sums.is_empty() => {
                    self.read_data(pba.offset_by(0), out, pba.byte_offset() + (s - lba * BLOCK_SIZE))?;
                }
                Segment::Mapped { lba, pba, .. } => {
                    let (b0, b1) = (s / BLOCK_SIZE, e.div_ceil(BLOCK_SIZE));
                    let skip = (b0 - lba) as usize;
                    let at = pba.offset_by(b0 - lba);
                    let ok = if s.is_multiple_of(BLOCK_SIZE) && e.is_multiple_of(BLOCK_SIZE) {
                        self.read_blocks_checked(at, out, &sums[skip..], heal)?
                    } else {
                        let mut whole = vec![0u8; ((b1 - b0) as usize) * BS];
                        let ok = self.read_blocks_checked(at, &mut whole, &sums[skip..], heal)?;
                        let from = (s - b0 * BLOCK_SIZE) as usize;
                        out.copy_from_slice(&whole[from..from + out.len()]);
                        ok
                    };
                    if !ok {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }

    /// A read whose pieces lie on several members (a striped volume's
    /// units): hint each member's physically adjacent pieces as one range
    /// first, so the members read at once and in large I/Os while the
    /// pieces are then read one by one (measured: bench/stripe.sh).
    fn prefetch_members(&self, segs: &[Summed]) {
        let runs = device_runs(segs.iter().map(|(seg, _)| seg));
        if runs.iter().all(|(p, _)| p.device() == runs[0].0.device()) {
            return; // One member: its own readahead serves it.
        }
        self.prefetch_runs(&runs);
    }

    /// Hint each device to read its runs ahead (asynchronous, never fails).
    pub(crate) fn prefetch_runs(&self, runs: &[(Pba, u64)]) {
        for &(pba, len) in runs {
            self.devices[usize::from(pba.device())].prefetch(pba.byte_offset(), len * BLOCK_SIZE);
        }
    }

    /// Plain read of data at a byte address on `pba`'s device.
    fn read_data(&self, pba: Pba, out: &mut [u8], at: u64) -> Result<()> {
        let dev = &self.devices[usize::from(pba.device())];
        dev.read_at(out, at).map_err(|e| {
            // A missing or rebuilding member (the pool is DEGRADED, said at
            // open and in `pool status`) is no device error: neither
            // counted nor logged per block, which would flood the log.
            if !dev.degraded() {
                self.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                log::error!("read error on {} at byte {at}: {e}", dev.name());
            }
            EngineError::io("read data", dev.name(), e)
        })
    }

    /// Segments of one device that follow each other on it, read as one
    /// request (`gathered` chose them: whole blocks, short forward gaps),
    /// widened to whole coarse groups at the ends, then checked: each run
    /// against its own sums, each coarse group once over its 64 KiB. A
    /// disk then sees one request where a compacted window's pieces (split
    /// by their births, or around a snapshot's old blocks placed between
    /// them) would each be one; the gaps' bytes are read and dropped. A
    /// failed request or check goes run by run (which heals, or names the
    /// run that fails).
    fn read_gathered(&self, segs: &[Summed], offset: u64, buf: &mut [u8], heal: bool) -> Result<bool> {
        let pieces: Vec<(u64, Pba, u64)> = segs
            .iter()
            .filter_map(|(seg, _)| match *seg {
                Segment::Mapped { lba, pba, len, .. } => Some((lba, pba, len)),
                Segment::Hole { .. } => None,
            })
            .collect();
        let (lba0, _, _) = pieces[0];
        let lba_end = pieces.last().map_or(lba0, |&(l, _, n)| l + n);
        let out = &mut buf[(lba0 * BLOCK_SIZE - offset) as usize..(lba_end * BLOCK_SIZE - offset) as usize];
        let (start, end) = gather_span(&pieces, segs);
        let dev = &self.devices[usize::from(pieces[0].1.device())];
        let sound = if (end - start) as usize * BS == out.len() {
            // No gaps, nothing widened: the blocks land where they go.
            dev.read_at(out, Pba(start).byte_offset()).is_ok() && span_is_sound(out, start, &pieces, segs)
        } else {
            let mut whole = vec![0u8; (end - start) as usize * BS];
            let sound = dev.read_at(&mut whole, Pba(start).byte_offset()).is_ok()
                && span_is_sound(&whole, start, &pieces, segs);
            for &(lba, pba, len) in pieces.iter().filter(|_| sound) {
                let from = (pba.0 - start) as usize * BS;
                let to = ((lba - lba0) * BLOCK_SIZE) as usize;
                out[to..to + len as usize * BS].copy_from_slice(&whole[from..from + len as usize * BS]);
            }
            sound
        };
        if sound {
            return Ok(true);
        }
        for (&(lba, pba, len), (_, sums)) in pieces.iter().zip(segs) {
            let at = ((lba - lba0) * BLOCK_SIZE) as usize;
            let piece = &mut out[at..at + len as usize * BS];
            let ok = if sums.is_empty() {
                self.read_data(pba, piece, pba.byte_offset()).map(|()| true)?
            } else {
                self.read_blocks_checked(pba, piece, sums, heal)?
            };
            if !ok {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Read `wanted` in device order, as few requests as short forward
    /// gaps allow (the gaps read through, spans bounded), each checked
    /// against its sums; whether each buffer got all its pieces sound. A
    /// failed request or check marks its buffers, which the caller reads
    /// again the usual way (that heals, or names the bad block). For
    /// compaction: a window of a volume written at random lies all over
    /// the device, and its blocks read in logical order cost a seek each
    /// (0.3 MiB/s on the modeled disk); many windows' blocks in one sweep
    /// lie close together.
    pub(crate) fn read_in_device_order(&self, mut wanted: Vec<Wanted>, bufs: &mut [Vec<u8>]) -> Vec<bool> {
        let mut sound = vec![true; bufs.len()];
        wanted.sort_by_key(|w| (w.pba.device(), w.pba.block()));
        let mut i = 0;
        while i < wanted.len() {
            let first = &wanted[i];
            let mut end = first.pba.block() + first.len;
            let mut j = i + 1;
            while let Some(w) = wanted.get(j) {
                let (at, last) = (w.pba.block(), w.pba.block() + w.len);
                if w.pba.device() != first.pba.device()
                    || at < end
                    || at - end > SWEEP_GAP_BLOCKS
                    || last - first.pba.block() > GATHER_MAX_BLOCKS
                {
                    break;
                }
                end = last;
                j += 1;
            }
            if !self.read_sweep(&wanted[i..j], bufs) {
                wanted[i..j].iter().for_each(|w| sound[w.buf] = false);
            }
            i = j;
        }
        sound
    }

    /// One request of [`Pool::read_in_device_order`]: `group` follows on
    /// one device; false if the read or a check failed.
    fn read_sweep(&self, group: &[Wanted], bufs: &mut [Vec<u8>]) -> bool {
        let pieces: Vec<(u64, Pba, u64)> = group.iter().map(|w| (0, w.pba, w.len)).collect();
        let segs: Vec<Summed> = group
            .iter()
            .map(|w| (Segment::Mapped { lba: 0, len: w.len, pba: w.pba, birth: 0 }, w.sums.clone()))
            .collect();
        let (start, end) = gather_span(&pieces, &segs);
        let Some(dev) = self.devices.get(usize::from(group[0].pba.device())) else { return false };
        let mut data = vec![0u8; (end - start) as usize * BS];
        if dev.read_at(&mut data, Pba(start).byte_offset()).is_err() || !span_is_sound(&data, start, &pieces, &segs) {
            return false;
        }
        for w in group {
            let (from, n) = ((w.pba.0 - start) as usize * BS, w.len as usize * BS);
            match bufs.get_mut(w.buf).and_then(|b| b.get_mut(w.at..w.at + n)) {
                Some(out) => out.copy_from_slice(&data[from..from + n]),
                None => return false,
            }
        }
        true
    }

    /// Read whole blocks at `pba` into `out` and check them against `sums`.
    fn read_blocks_checked(&self, pba: Pba, out: &mut [u8], sums: &[Option<BlockSum>], heal: bool) -> Result<bool> {
        let n = out.len() / BS;
        if sums[..n].iter().any(|s| matches!(s, Some(BlockSum::Group(_)))) {
            return self.read_groups_checked(pba, out, &sums[..n], heal);
        }
        self.read_data(pba, out, pba.byte_offset())?;
        self.check_blocks(pba, out, sums, heal)
    }

    /// Check whole blocks read from `pba` against their per-block `sums`
    /// (none missing a group's); with `heal` a bad one is replaced from a
    /// good copy, else the first bad one returns false.
    fn check_blocks(&self, pba: Pba, out: &mut [u8], sums: &[Option<BlockSum>], heal: bool) -> Result<bool> {
        for (i, block) in out.chunks_exact_mut(BS).enumerate() {
            let Some(BlockSum::Block(want)) = sums[i] else { continue };
            if block_sum(block) == want {
                continue;
            }
            if !heal {
                return Ok(false);
            }
            let at = pba.offset_by(i as u64);
            let good = if self.is_suspect(at) { self.resync_block(at)?.0 } else { self.heal_block(at, want)? };
            block.copy_from_slice(&good);
        }
        Ok(true)
    }

    /// A read over coarse groups (`sums` has a group's sum): widened to
    /// whole groups at either end, each group checked against its crc,
    /// each other block against its own; `out` gets the blocks asked for.
    fn read_groups_checked(&self, pba: Pba, out: &mut [u8], sums: &[Option<BlockSum>], heal: bool) -> Result<bool> {
        let n = sums.len() as u64;
        let start = if is_group(sums.first()) { pba.0 / SUMS_GROUP * SUMS_GROUP } else { pba.0 };
        let end = if is_group(sums.last()) { (pba.0 + n).div_ceil(SUMS_GROUP) * SUMS_GROUP } else { pba.0 + n };
        if (start, end) == (pba.0, pba.0 + n) {
            // Whole groups asked for (a sequential read): checked where
            // they land, no second buffer and copy.
            self.read_data(pba, out, pba.byte_offset())?;
            return self.check_span(pba, out, sums, heal);
        }
        let mut buf = vec![0u8; ((end - start) as usize) * BS];
        self.read_data(Pba(start), &mut buf, Pba(start).byte_offset())?;
        let inner = Pba(start);
        let mut widened: Vec<Option<BlockSum>> = Vec::with_capacity((end - start) as usize);
        widened.extend((start..end).map(|b| sums[(b.max(pba.0) - pba.0).min(n - 1) as usize]));
        if !self.check_span(inner, &mut buf, &widened, heal)? {
            return Ok(false);
        }
        let from = ((pba.0 - start) as usize) * BS;
        out.copy_from_slice(&buf[from..from + out.len()]);
        Ok(true)
    }

    /// Check `buf`, read from `at`, against `sums` (one per block of
    /// `buf`; a coarse group's whole in it): each group's crc at its first
    /// block, each other block's own; with `heal` a bad span is replaced
    /// from a good copy (or resynced), else the first bad one returns false.
    fn check_span(&self, at: Pba, buf: &mut [u8], sums: &[Option<BlockSum>], heal: bool) -> Result<bool> {
        let (start, end) = (at.0, at.0 + sums.len() as u64);
        let mut b = start;
        while b < end {
            let sum = sums[(b - start) as usize];
            let at = ((b - start) as usize) * BS;
            let (len, want) = match sum {
                // A group's blocks are contiguous here and widened at the
                // ends, so a group's sum is met at the group's first block.
                Some(BlockSum::Group(crc)) => (GROUP_BYTES, crc),
                Some(BlockSum::Block(crc)) => (BS, crc),
                None => (BS, 0),
            };
            let data = &mut buf[at..at + len];
            if sum.is_some() && block_sum_of(data) != want {
                if !heal {
                    return Ok(false);
                }
                let good = if self.is_suspect(Pba(b)) {
                    self.resync_span(Pba(b), len)?.0
                } else {
                    self.heal_span(Pba(b), len, want)?
                };
                data.copy_from_slice(&good);
            }
            b += (len / BS) as u64;
        }
        Ok(true)
    }

    /// Read `len` bytes at `pba` (a block or a coarse group) on every copy
    /// and sort them by their crc32c against `want`.
    pub(crate) fn examine_span(&self, pba: Pba, len: usize, want: u32) -> Copies {
        let dev = &self.devices[usize::from(pba.device())];
        let mut c = Copies { good: None, bad: Vec::new(), found: 0 };
        for copy in 0..dev.copies() {
            let mut block = vec![0u8; len];
            match dev.read_copy(copy, &mut block, pba.byte_offset()) {
                Ok(()) if block_sum_of(&block) == want => c.good = c.good.or(Some(block)),
                Ok(()) => {
                    c.found = block_sum_of(&block);
                    c.bad.push(copy);
                }
                Err(e) => {
                    log::warn!("block {} copy {copy} on {}: read error {e}", pba.block(), dev.name());
                    c.bad.push(copy);
                }
            }
        }
        c
    }

    /// Rewrite copies `bad` of block `pba` with `data` (durable at the next flush).
    pub(crate) fn rewrite_copies(&self, pba: Pba, data: &[u8], bad: &[usize]) -> u64 {
        let i = usize::from(pba.device());
        let dev = &self.devices[i];
        let mut done = 0;
        for &copy in bad {
            match dev.write_copy(copy, data, pba.byte_offset()) {
                Ok(()) => {
                    done += 1;
                    self.dirty[i].store(true, Ordering::SeqCst);
                    log::warn!("rewrote block {} copy {copy} on {} from a good copy", pba.block(), dev.name());
                }
                Err(e) => log::error!("could not rewrite block {} copy {copy} on {}: {e}", pba.block(), dev.name()),
            }
        }
        self.counters.healed_blocks.fetch_add(done, Ordering::Relaxed);
        done
    }

    /// The data of block `pba` from a copy that matches `want`; the other
    /// copies are rewritten with it. Err (counted, logged) if none matches.
    pub(crate) fn heal_block(&self, pba: Pba, want: u32) -> Result<Vec<u8>> {
        self.heal_span(pba, BS, want)
    }

    /// [`Pool::heal_block`] of `len` bytes: a block or a coarse group.
    pub(crate) fn heal_span(&self, pba: Pba, len: usize, want: u32) -> Result<Vec<u8>> {
        let c = self.examine_span(pba, len, want);
        let dev = &self.devices[usize::from(pba.device())];
        let Some(good) = c.good else {
            self.counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
            log::error!(
                "checksum mismatch: block {} of {} on all {} copies (stored {want:#010x}, read {:#010x})",
                pba.block(),
                dev.name(),
                dev.copies(),
                c.found
            );
            return Err(EngineError::Checksum {
                device: dev.name(),
                block: pba.block(),
                expected: want,
                found: c.found,
            });
        };
        self.rewrite_copies(pba, &good, &c.bad);
        Ok(good)
    }
}

/// The crc32c of a block or of a coarse group.
pub(crate) fn block_sum_of(data: &[u8]) -> u32 {
    if data.len() == GROUP_BYTES {
        group_sum(data)
    } else {
        block_sum(data)
    }
}

/// Block contents by copy: a good one if any, the bad copies' indexes and
/// the checksum a bad copy had.
pub(crate) struct Copies {
    pub good: Option<Vec<u8>>,
    pub bad: Vec<usize>,
    pub found: u32,
}

/// The mapped segments' blocks as runs (start, blocks) that follow each
/// other on one device (a run joins one of the last 64 it continues, a
/// stripe's members interleaving): one
/// readahead hint per run instead of one per segment.
pub(crate) fn device_runs<'a>(segs: impl Iterator<Item = &'a Segment>) -> Vec<(Pba, u64)> {
    let mut runs: Vec<(Pba, u64)> = Vec::new();
    for seg in segs {
        let Segment::Mapped { pba, len, .. } = *seg else { continue };
        if pba.is_origin() {
            continue;
        }
        match runs.iter_mut().rev().take(64).find(|(p, l)| p.device() == pba.device() && p.offset_by(*l) == pba) {
            Some(run) => run.1 += len,
            None => runs.push((pba, len)),
        }
    }
    runs
}
