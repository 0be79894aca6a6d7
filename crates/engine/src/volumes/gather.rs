//! Gathering a volume's compaction into one free span (`pool compact`):
//! windows placed next-fit from the allocation cursor thread through the
//! blocks in use there (the volume's own old copies, its snapshots'
//! blocks), so a compacted volume read in logical order met a gap of a
//! few blocks every ten (docs/ARCHITECTURE.md, *What differs from a fresh
//! volume after compaction*). Instead, before the moves, the span of the
//! device as long as the blocks to move that holds the fewest live blocks
//! is found by a walk of the space map, its live blocks (any volume's,
//! heads and dead lists) are moved out by the evacuation's moves, a
//! checkpoint frees them, and the windows are then written into the span
//! one after the other, in logical order.
//!
//! Only where one span can hold the volume: a pool of one usable device,
//! a volume neither striped nor with parity. Elsewhere, and when clearing
//! the span would move more than it gathers, the placement decides as
//! before. Every move is one the compaction or the evacuation already
//! makes (checked swap, Relocate for shared blocks): no new op, and a
//! crash leaves each run at its old or its new place.

use crate::error::{EngineError, Result};
use crate::io::NewPiece;
use crate::map::extent_map::Segment;
use crate::pool::Pool;
use crate::space::metadata_start;
use crate::volumes::evacuate::LiveRun;
use crate::volumes::relayout::{relayout_pick, Destination, BATCH_WINDOWS, WINDOW_BLOCKS};
use tarn_format::superblock::incompat;
use tarn_format::Pba;

/// Where a volume's windows go: next-fit from `cursor` on `device`.
pub(crate) struct Gather {
    pub device: usize,
    pub cursor: u64,
    /// Live blocks moved out of the span first.
    pub cleared: u64,
}

/// Blocks `[start, end)` of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub device: usize,
    pub start: u64,
    pub end: u64,
}

impl Span {
    /// For the evacuation's walk: whether `pba` lies in the span, and for
    /// how many of `len` blocks the answer holds.
    fn holds(&self, pba: Pba, len: u64) -> (bool, u64) {
        let b = pba.block();
        if usize::from(pba.device()) != self.device || b >= self.end {
            (false, len)
        } else if b < self.start {
            (false, len.min(self.start - b))
        } else {
            (true, len.min(self.end - b))
        }
    }

    fn overlaps(&self, p: &NewPiece) -> bool {
        usize::from(p.pba.device()) == self.device && p.pba.block() < self.end && self.start < p.pba.block() + p.len
    }
}

impl Pool {
    /// Prepare the compaction of volume `id` (`blocks` long) into one span
    /// (see the module docs): None where the placement decides instead.
    /// `go_on` is asked while the span is cleared; false stops (Ok(None),
    /// `stopped` set), what moved durable.
    pub(crate) fn prepare_gather(
        &self,
        id: u32,
        blocks: u64,
        stopped: &mut bool,
        go_on: &mut dyn FnMut() -> bool,
    ) -> Result<Option<Gather>> {
        let Some(device) = self.single_device_for(id) else { return Ok(None) };
        let need = self.blocks_to_gather(id, blocks)?;
        if need == 0 {
            return Ok(None);
        }
        let Some((span, free)) = self.emptiest_span(device, need)? else { return Ok(None) };
        let live = need - free;
        // Clearing costs a move per live block there: worth it only while
        // it moves less than the compaction itself.
        if live > need / 2 {
            return Ok(None);
        }
        let mut gather = Gather { device, cursor: span.start, cleared: 0 };
        if live > 0 {
            gather.cleared = self.clear_span(span, stopped, go_on)?;
            // A commit alone holds what it frees while a checkpoint is
            // under way: the span is free once this is durable.
            self.checkpoint()?;
        }
        Ok((!*stopped).then_some(gather))
    }

    /// The one usable device the volume's new blocks may go to, if the
    /// pool has one and the volume is neither striped nor with parity.
    fn single_device_for(&self, id: u32) -> Option<usize> {
        let inner = self.read_inner();
        let v = inner.state.volume(id)?;
        if v.stripe.is_some() || v.parity.is_some() {
            return None;
        }
        let sp = &inner.space;
        let mut usable = (0..sp.devices.len()).filter(|&d| sp.usable(d));
        let device = usable.next()?;
        usable.next().is_none().then_some(device)
    }

    /// Blocks of the windows compaction would move (a lookup per window).
    fn blocks_to_gather(&self, id: u32, blocks: u64) -> Result<u64> {
        let mut need = 0;
        for lba in (0..blocks).step_by(WINDOW_BLOCKS as usize) {
            let len = WINDOW_BLOCKS.min(blocks - lba);
            if let Some((_, chosen)) = self.blocks_to_move(id, lba, len, &relayout_pick)? {
                need += chosen.iter().map(Segment::len).sum::<u64>();
            }
        }
        Ok(need)
    }

    /// The span of `need` blocks of the device's data part with the most
    /// free blocks, and how many (a walk of the space map).
    fn emptiest_span(&self, device: usize, need: u64) -> Result<Option<(Span, u64)>> {
        let inner = self.read_inner();
        let Some(d) = inner.space.devices.get(device) else { return Ok(None) };
        let (lo, hi) = (d.data_start, metadata_start(d));
        if hi.saturating_sub(lo) < need {
            return Ok(None);
        }
        let ranges = inner.space.free_ranges(device)?;
        let best = emptiest_window(&ranges, lo, hi, need);
        Ok(Some((Span { device, start: best.0, end: best.0 + need }, best.1)))
    }

    /// Move every live run in `span` out of it (next-fit from the data
    /// part's start, stepping over the span), in batches read in device
    /// order as compaction's; the blocks moved.
    fn clear_span(&self, span: Span, stopped: &mut bool, go_on: &mut dyn FnMut() -> bool) -> Result<u64> {
        let keep = |pba: Pba, len: u64| span.holds(pba, len);
        let runs = self.live_runs_where(&keep)?;
        if runs.iter().any(|r| r.snap != 0) {
            // Dead runs move by Relocate: older tarns must not replay it.
            self.enable_feature(&mut self.lock_commit(), incompat::RELOCATE)?;
        }
        let mut cursor = self.read_inner().space.devices.get(span.device).map_or(0, |d| d.data_start);
        let mut moved = 0;
        for step in clear_steps(&runs) {
            self.make_room()?;
            let mut dest = Destination::Around { span, cursor: &mut cursor };
            let (n, room) = if step.iter().all(|r| r.snap == 0) {
                match self.move_live_runs_where(step, &keep, &mut dest) {
                    Err(EngineError::NoSpace) => (0, false),
                    other => (other?, true),
                }
            } else {
                let windows: Vec<Vec<LiveRun>> = step.iter().map(|r| vec![*r]).collect();
                let (n, room) = self.move_dead_windows(&windows, &mut dest)?;
                (n.iter().sum(), room)
            };
            moved += n;
            // No room outside the span: the rest stays, the windows
            // thread around it.
            if !room {
                break;
            }
            if !go_on() {
                *stopped = true;
                break;
            }
        }
        Ok(moved)
    }

    /// New space for `wanted` next-fit from `cursor`, none of it in `span`
    /// (the cursor steps over it once; `NoSpace` if it still lands there).
    pub(crate) fn allocate_around(&self, wanted: &[Segment], span: Span, cursor: &mut u64) -> Result<Vec<NewPiece>> {
        for _ in 0..2 {
            let fresh = self.allocate_at_cursor(wanted, span.device, cursor)?;
            if !fresh.iter().any(|p| span.overlaps(p)) {
                return Ok(fresh);
            }
            self.give_back_unmapped(&fresh);
            *cursor = span.end;
        }
        Err(EngineError::NoSpace)
    }
}

/// The start of the `need` blocks in `[lo, hi)` with the most free blocks
/// among `ranges` (sorted free ranges `(start, len)`), and that count. A
/// best window starts at a free range's start or ends at `hi` (moving a
/// window's start to the next range start loses nothing).
fn emptiest_window(ranges: &[(u64, u64)], lo: u64, hi: u64, need: u64) -> (u64, u64) {
    let mut prefix = Vec::with_capacity(ranges.len() + 1);
    prefix.push(0);
    for r in ranges {
        prefix.push(prefix[prefix.len() - 1] + r.1);
    }
    let last = hi - need;
    let starts = ranges.iter().map(|r| r.0.max(lo)).filter(|&s| s <= last).chain(std::iter::once(last));
    let mut best = (last, free_between(ranges, &prefix, last, hi));
    for s in starts {
        let free = free_between(ranges, &prefix, s, s + need);
        if free > best.1 || (free == best.1 && s < best.0) {
            best = (s, free);
        }
    }
    best
}

/// Free blocks of `ranges` in `[s, e)`; `prefix[i]`: blocks of the first i ranges.
fn free_between(ranges: &[(u64, u64)], prefix: &[u64], s: u64, e: u64) -> u64 {
    let first = ranges.partition_point(|r| r.0 + r.1 <= s);
    let end = ranges.partition_point(|r| r.0 < e);
    if first >= end {
        return 0;
    }
    let (a, b) = (ranges[first], ranges[end - 1]);
    prefix[end] - prefix[first] - s.saturating_sub(a.0) - (b.0 + b.1).saturating_sub(e)
}

/// Runs read together per step of clearing a span: a span's live runs
/// are mostly a block or a few (random overwrites), and a step of 16 runs
/// (the evacuation's, whose runs are up to a window long) cost a seek a
/// run on a disk.
const CLEAR_STEP_RUNS: usize = 1024;

/// `runs` in steps of one volume's head runs or dead runs (as listed, a
/// volume's together), each at most [`CLEAR_STEP_RUNS`] runs and a
/// compaction batch's blocks, so a step's data is read in one sweep in
/// device order and its buffers stay small.
fn clear_steps(runs: &[LiveRun]) -> Vec<&[LiveRun]> {
    let mut out = Vec::new();
    let mut rest = runs;
    while let Some(first) = rest.first() {
        let mut blocks = 0;
        let same = |r: &&LiveRun| r.vol == first.vol && (r.snap == 0) == (first.snap == 0);
        let n = rest
            .iter()
            .take(CLEAR_STEP_RUNS)
            .take_while(same)
            .take_while(|r| {
                blocks += r.len;
                blocks <= BATCH_WINDOWS * WINDOW_BLOCKS
            })
            .count()
            .max(1);
        let (step, tail) = rest.split_at(n);
        out.push(step);
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_emptiest_window_is_found_and_counted() {
        // Free: [10, 20), [30, 60), [70, 75) of [0, 100).
        let ranges = [(10, 10), (30, 30), (70, 5)];
        assert_eq!(emptiest_window(&ranges, 0, 100, 30), (30, 30));
        assert_eq!(emptiest_window(&ranges, 0, 100, 50), (10, 40));
        assert_eq!(emptiest_window(&ranges, 0, 100, 5), (10, 5));
        // Bounded by [lo, hi): the window may not pass hi.
        assert_eq!(emptiest_window(&ranges, 0, 50, 30), (10, 20));
        assert_eq!(emptiest_window(&[], 0, 100, 10), (90, 0));
    }
}
