//! Re-laying out a volume online (`tarn pool compact`): each 1 MiB window
//! of the head whose data lies in short physical runs is copied, in
//! logical order, to one new run, and the map swapped, so a volume first
//! written at random (or made before sequential overwrites re-laid data
//! out) reads sequentially again. Clients keep writing meanwhile: a window
//! they touch while it moves is left as it is (the next pass takes it).
//!
//! Blocks the head owns alone are mapped anew; blocks snapshots share
//! move by Relocate (op 17) for every sharer at once, so no snapshot grows
//! and sharing is kept. Then the snapshots' own data (their dead lists)
//! is compacted the same way (`dead_relayout`).

use crate::error::{EngineError, Result};
use crate::integrity::verify::Wanted;
use crate::io::{physical_runs, NewPiece, RELAYOUT_RUN_BLOCKS};
use crate::map::extent_map::Segment;
use crate::map::state::Volume;
use crate::map::view::View;
use crate::pool::{Inner, MovingWindow, Pool};
use crate::space::placement::PlacementKind;
use crate::volumes::gather::Span;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tarn_format::ops::Op;
use tarn_format::superblock::incompat;
use tarn_format::{Pba, BLOCK_SIZE};

/// Blocks moved per step: 1 MiB, one read, one write.
pub(crate) const WINDOW_BLOCKS: u64 = 256;

/// Windows `pool compact` moves together: their blocks are read in one
/// sweep in device order (16 MiB of volume, 16 MiB of buffers), so a
/// volume written at random is read back in long requests, not a seek per
/// block (see [`Pool::read_in_device_order`]).
pub(crate) const BATCH_WINDOWS: u64 = 16;

/// Windows per batch for `pool compact` at `rate` bytes per second (None:
/// unthrottled): at most a second's worth at that rate, at least one, so
/// its throttle and a cancel act between batches about once a second.
pub fn batch_for_rate(rate: Option<u64>) -> u64 {
    rate.map_or(BATCH_WINDOWS, |r| (r / (WINDOW_BLOCKS * BLOCK_SIZE)).clamp(1, BATCH_WINDOWS))
}

/// A window about to move: its head segments, the ones chosen, and its
/// announcement.
struct Plan {
    at: usize,
    lba: u64,
    len: u64,
    segs: Vec<Segment>,
    chosen: Vec<Segment>,
    moving: Arc<MovingWindow>,
}

/// What a compaction of one volume did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayoutReport {
    /// Map entries of the head before and after.
    pub extents_before: u64,
    pub extents_after: u64,
    pub windows_moved: u64,
    pub blocks_moved: u64,
    /// Windows clients wrote to while they moved, or that found no room.
    pub windows_skipped: u64,
    /// Windows of the snapshots' dead lists (data only snapshots hold)
    /// moved, and their blocks (see `dead_relayout`).
    pub snapshot_windows_moved: u64,
    pub snapshot_blocks_moved: u64,
    /// Live blocks moved out of the span the head's windows were gathered
    /// into, before they moved there (see `gather`).
    pub blocks_cleared: u64,
    /// Stopped before the end because the caller asked (`relayout_until`);
    /// what moved is durable, and a later run goes on from there (windows
    /// already in long runs are left alone).
    pub stopped: bool,
}

/// Where idle-time compaction goes on: the volume and block it looks at next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayoutCursor {
    pub vol: u32,
    pub lba: u64,
}

/// What one bounded step of idle-time compaction did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayoutStep {
    pub windows_moved: u64,
    /// The cursor went past the last volume: a whole pass is done.
    pub wrapped: bool,
}

/// How one window went.
pub(crate) enum Window {
    /// Already in long runs, shared, or empty: nothing to do.
    Fine,
    Moved(u64),
    /// Written meanwhile.
    Skipped,
    /// No room for the copy where it should go.
    NoRoom,
}

impl Pool {
    /// Re-lay out volume `name`'s head; `progress(done, total)` in blocks.
    /// Durable when it returns.
    pub fn relayout(&self, name: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<RelayoutReport> {
        self.relayout_until(name, BATCH_WINDOWS, &mut |done, total| {
            progress(done, total);
            true
        })
    }

    /// [`Pool::relayout`] moving `batch` windows at a time (1 to
    /// [`BATCH_WINDOWS`]; see [`batch_for_rate`]) that stops after the batch
    /// at which `go_on(done, total)` answers false (a cancel, or a
    /// throttle's caller going away).
    pub fn relayout_until(
        &self,
        name: &str,
        batch: u64,
        go_on: &mut dyn FnMut(u64, u64) -> bool,
    ) -> Result<RelayoutReport> {
        let batch = batch.clamp(1, BATCH_WINDOWS);
        self.check_writable()?;
        let (id, blocks) = {
            let inner = self.read_inner();
            let v = crate::pool::volume_named(&inner.state, name)?;
            (v.id, v.size / BLOCK_SIZE)
        };
        let extents = |pool: &Pool| pool.volume_info(id).map(|v| v.extents).ok_or(EngineError::VolumeGone(id));
        let mut report = RelayoutReport { extents_before: extents(self)?, ..Default::default() };
        let mut gather = self.prepare_gather(id, blocks, &mut report.stopped, &mut || go_on(0, blocks))?;
        report.blocks_cleared = gather.as_ref().map_or(0, |g| g.cleared);
        for first in (0..blocks).step_by((WINDOW_BLOCKS * batch) as usize) {
            if report.stopped {
                break;
            }
            self.make_room()?;
            let end = (first + WINDOW_BLOCKS * batch).min(blocks);
            let windows: Vec<(u64, u64)> =
                (first..end).step_by(WINDOW_BLOCKS as usize).map(|lba| (lba, WINDOW_BLOCKS.min(end - lba))).collect();
            let mut dest = match gather.as_mut() {
                Some(g) => Destination::Cursor { device: g.device, cursor: &mut g.cursor },
                None => Destination::Placement,
            };
            for outcome in self.move_windows(id, &windows, &relayout_pick, &mut dest)? {
                match outcome {
                    Window::Fine => {}
                    Window::Moved(n) => {
                        report.windows_moved += 1;
                        report.blocks_moved += n;
                    }
                    Window::Skipped | Window::NoRoom => report.windows_skipped += 1,
                }
            }
            if !go_on(end, blocks) {
                report.stopped = true;
                break;
            }
        }
        if !report.stopped {
            self.relayout_dead_lists(id, &mut report, &mut || go_on(blocks, blocks))?;
        }
        self.flush()?;
        report.extents_after = extents(self)?;
        Ok(report)
    }

    /// Look at up to `windows` windows from `cursor` on (volumes by id),
    /// moving the scattered ones, and advance the cursor: the background
    /// compactor's step while clients are idle. Not flushed: the
    /// committer commits the moves like writes.
    pub fn relayout_step(&self, cursor: &mut RelayoutCursor, windows: usize) -> Result<RelayoutStep> {
        self.check_writable()?;
        let mut step = RelayoutStep::default();
        for _ in 0..windows {
            let next = {
                let inner = self.read_inner();
                let mut after = inner.state.volumes.range(cursor.vol..);
                // `inplace` volumes keep the layout of their first writes.
                after
                    .find(|(_, v)| {
                        (v.id > cursor.vol || cursor.lba < v.size / BLOCK_SIZE)
                            && inner.placement_of(v) != PlacementKind::Inplace
                    })
                    .map(|(&id, v)| (id, v.size))
            };
            let Some((id, size)) = next else {
                *cursor = RelayoutCursor::default();
                step.wrapped = true;
                break;
            };
            let lba = if id == cursor.vol { cursor.lba } else { 0 };
            let len = WINDOW_BLOCKS.min(size / BLOCK_SIZE - lba);
            self.make_room()?;
            if len > 0 && matches!(self.relayout_window(id, lba, len)?, Window::Moved(_)) {
                step.windows_moved += 1;
            }
            *cursor = RelayoutCursor { vol: id, lba: lba + len };
        }
        Ok(step)
    }

    /// Move one window if it is scattered (see [`Pool::move_window`]).
    fn relayout_window(&self, id: u32, lba: u64, len: u64) -> Result<Window> {
        self.move_window(id, (lba, len), &relayout_pick, &mut Destination::Placement)
    }

    /// Move the blocks `pick` chooses among a window's head segments to new
    /// space from `dest`: announce the window, let writes planned before
    /// drain, copy the data, and swap the map only if nothing changed it
    /// meanwhile (and `pick` still chooses the same blocks).
    pub(crate) fn move_window(
        &self,
        id: u32,
        (lba, len): (u64, u64),
        pick: &Pick,
        dest: &mut Destination,
    ) -> Result<Window> {
        Ok(self.move_windows(id, &[(lba, len)], pick, dest)?.pop().unwrap_or(Window::Fine))
    }

    /// [`Pool::move_window`] for several windows of one volume at once:
    /// announced together, their blocks read in one sweep in device order,
    /// then each copied and swapped in on its own. An outcome per window.
    pub(crate) fn move_windows(
        &self,
        id: u32,
        windows: &[(u64, u64)],
        pick: &Pick,
        dest: &mut Destination,
    ) -> Result<Vec<Window>> {
        let mut outcomes: Vec<Window> = windows.iter().map(|_| Window::Fine).collect();
        let mut todo = Vec::new();
        for (at, &(lba, len)) in windows.iter().enumerate() {
            if self.blocks_to_move(id, lba, len, pick)?.is_some() {
                let moving = Arc::new(MovingWindow { vol: id, lba, len, touched: AtomicBool::new(false) });
                todo.push((at, moving));
            }
        }
        if todo.is_empty() {
            return Ok(outcomes);
        }
        let _announced: Vec<Announced> = todo.iter().map(|(_, m)| Announced::new(self, m.clone())).collect();
        // Writes planned before the announcement may still write in place:
        // wait for them (they hold the gate shared until they recorded).
        drop(self.io_gate.write().unwrap_or_else(|p| p.into_inner()));
        let mut plans = Vec::new();
        for (at, moving) in todo {
            if let Some((segs, chosen)) = self.blocks_to_move(id, moving.lba, moving.len, pick)? {
                plans.push(Plan { at, lba: moving.lba, len: moving.len, segs, chosen, moving });
            }
        }
        let relocate_ready = plans.iter().any(|p| self.any_shared(id, &p.chosen));
        if relocate_ready {
            // Shared blocks move by Relocate: older tarns must not replay it.
            self.enable_feature(&mut self.lock_commit(), incompat::RELOCATE)?;
        }
        let data = self.read_windows(id, &plans)?;
        for (plan, data) in plans.iter().zip(&data) {
            outcomes[plan.at] = self.swap_window(id, plan, data, pick, dest, relocate_ready)?;
        }
        Ok(outcomes)
    }

    /// The head's data over each planned window, read in device order;
    /// a window with a bad block or a failed request read again through
    /// the verified read, which heals or fails naming the block.
    fn read_windows(&self, id: u32, plans: &[Plan]) -> Result<Vec<Vec<u8>>> {
        let mut bufs: Vec<Vec<u8>> = plans.iter().map(|p| vec![0u8; (p.len * BLOCK_SIZE) as usize]).collect();
        let sound = {
            let _gate = self.gate_shared();
            let mut wanted = Vec::new();
            let mut whole = vec![true; plans.len()];
            for (k, p) in plans.iter().enumerate() {
                for (seg, sums) in self.resolve_summed(id, View::Head, p.lba, p.len)? {
                    let Segment::Mapped { lba, pba, len, .. } = seg else { continue };
                    if lba < p.lba || lba + len > p.lba + p.len || pba.is_origin() {
                        whole[k] = false; // not expected: the usual read takes it
                        continue;
                    }
                    wanted.push(Wanted { buf: k, at: ((lba - p.lba) * BLOCK_SIZE) as usize, pba, len, sums });
                }
            }
            let sound = self.read_in_device_order(wanted, &mut bufs);
            sound.into_iter().zip(whole).map(|(a, b)| a && b).collect::<Vec<bool>>()
        };
        for ((p, buf), sound) in plans.iter().zip(bufs.iter_mut()).zip(sound) {
            if !sound {
                // Unchecked: evacuation moves a parity volume's parity area too.
                self.read_view_mapped(id, View::Head, p.lba * BLOCK_SIZE, buf)?;
            }
        }
        Ok(bufs)
    }

    /// Copy one planned window's chosen blocks (`data`: the window) to new
    /// space from `dest` and swap the map, only if nothing changed it
    /// meanwhile (and `pick` still chooses the same blocks).
    fn swap_window(
        &self,
        id: u32,
        plan: &Plan,
        data: &[u8],
        pick: &Pick,
        dest: &mut Destination,
        relocate_ready: bool,
    ) -> Result<Window> {
        let (lba, len) = (plan.lba, plan.len);
        let wanted: Vec<Segment> = plan.chosen.iter().map(|s| Segment::Hole { lba: s.lba(), len: s.len() }).collect();
        let fresh = match dest.allocate(self, id, &wanted) {
            Err(EngineError::NoSpace) => return Ok(Window::NoRoom),
            other => other?,
        };
        let bs = BLOCK_SIZE as usize;
        let piece = |at: u64, n: u64| &data[(at - lba) as usize * bs..(at - lba + n) as usize * bs];
        // New pieces that follow each other both in the volume and on the
        // device (a window's holes, placed one after the other) go as one
        // write, not a request per hole.
        for (pba, at, n) in write_runs(&fresh) {
            if let Err(e) = self.write_device(pba, piece(at, n)) {
                self.give_back_unmapped(&fresh);
                return Err(e);
            }
        }
        let mut inner = self.write_inner();
        // Unchanged by writes, trims and resizes, and still chosen (a
        // snapshot taken meanwhile shares the blocks now).
        let unchanged = !plan.moving.touched.load(Ordering::Relaxed)
            && window_segments(&inner, id, lba, len)?.is_some_and(|now| now == plan.segs)
            && inner.state.volume(id).is_some_and(|v| pick(v, &plan.segs) == plan.chosen);
        if !unchanged {
            drop(inner);
            self.give_back_unmapped(&fresh);
            return Ok(Window::Skipped);
        }
        let v = inner.state.volume(id).ok_or(EngineError::VolumeGone(id))?;
        let mut ops = move_ops(v, id, &plan.chosen, &fresh, inner.state.epoch);
        if !relocate_ready && ops.iter().any(|op| matches!(op, Op::Relocate { .. })) {
            // A snapshot came meanwhile and the feature bit may not be set
            // yet: the next pass sets it first.
            drop(inner);
            self.give_back_unmapped(&fresh);
            return Ok(Window::Skipped);
        }
        for p in &fresh {
            inner.space.settle(p.pba);
            ops.extend(self.sums_op(p.pba, piece(p.lba, p.len)));
        }
        self.apply_ops(&mut inner, ops)?;
        Ok(Window::Moved(wanted.iter().map(Segment::len).sum()))
    }

    /// Whether any of `segs` is held by a snapshot too.
    fn any_shared(&self, id: u32, segs: &[Segment]) -> bool {
        let inner = self.read_inner();
        let Some(v) = inner.state.volume(id) else { return false };
        segs.iter().any(|s| matches!(*s, Segment::Mapped { pba, birth, .. } if !v.owns_alone(pba, birth)))
    }

    /// The window's segments and the mapped ones `pick` moves, if any.
    pub(crate) fn blocks_to_move(
        &self,
        id: u32,
        lba: u64,
        len: u64,
        pick: &Pick,
    ) -> Result<Option<(Vec<Segment>, Vec<Segment>)>> {
        self.with_cached_nodes(|inner| {
            let Some(segs) = window_segments(inner, id, lba, len)? else { return Ok(None) };
            let v = inner.state.volume(id).ok_or(EngineError::VolumeGone(id))?;
            let chosen = pick(v, &segs);
            Ok((!chosen.is_empty()).then_some((segs, chosen)))
        })
    }
}

/// Chooses, among a window's head segments, the mapped ones to move.
pub(crate) type Pick<'a> = dyn Fn(&Volume, &[Segment]) -> Vec<Segment> + 'a;

/// Where moved blocks go.
pub(crate) enum Destination<'a> {
    /// Where the volume's placement policy puts new data.
    Placement,
    /// Next-fit on one device from a cursor the mover keeps.
    Cursor { device: usize, cursor: &'a mut u64 },
    /// Next-fit from a cursor the mover keeps, outside a span being
    /// cleared for a volume's windows (see `gather`).
    Around { span: Span, cursor: &'a mut u64 },
}

impl Destination<'_> {
    pub(crate) fn allocate(&mut self, pool: &Pool, id: u32, wanted: &[Segment]) -> Result<Vec<NewPiece>> {
        match self {
            Destination::Placement => pool.allocate_holes(id, wanted, &Vec::new()),
            Destination::Cursor { device, cursor } => pool.allocate_at_cursor(wanted, *device, cursor),
            Destination::Around { span, cursor } => pool.allocate_around(wanted, *span, cursor),
        }
    }
}

/// The head's segments over the window (None if the volume went away).
fn window_segments(inner: &Inner, id: u32, lba: u64, len: u64) -> Result<Option<Vec<Segment>>> {
    match inner.state.volume(id) {
        Some(v) => Ok(Some(v.map.lookup(lba, len, usize::MAX)?)),
        None => Ok(None),
    }
}

/// `fresh` as runs to write: (device block, first lba, blocks), pieces
/// joined where the next follows the last both logically and physically.
fn write_runs(fresh: &[NewPiece]) -> Vec<(Pba, u64, u64)> {
    let mut runs: Vec<(Pba, u64, u64)> = Vec::new();
    for p in fresh {
        match runs.last_mut() {
            Some((pba, at, n)) if pba.offset_by(*n) == p.pba && *at + *n == p.lba => *n += p.len,
            _ => runs.push((p.pba, p.lba, p.len)),
        }
    }
    runs
}

/// `pool compact`'s choice: every mapped block of a scattered window.
pub(crate) fn relayout_pick(_: &Volume, segs: &[Segment]) -> Vec<Segment> {
    if scattered(segs) {
        segs.iter().copied().filter(|s| matches!(s, Segment::Mapped { .. })).collect()
    } else {
        Vec::new()
    }
}

/// Whether the window's mapped blocks lie in two or more physical runs
/// averaging under [`RELAYOUT_RUN_BLOCKS`], all of them real blocks (a
/// clone's origin markers read through to its origin: nothing to move).
/// Blocks snapshots share move too, by Relocate (see [`move_ops`]).
fn scattered(segs: &[Segment]) -> bool {
    let (runs, mapped) = physical_runs(segs);
    let real = segs.iter().all(|s| match *s {
        Segment::Mapped { pba, .. } => !pba.is_origin(),
        Segment::Hole { .. } => true,
    });
    runs >= 2 && mapped / runs < RELAYOUT_RUN_BLOCKS && real
}

/// The map ops that swap moved blocks in: a block the head owns alone is
/// mapped anew (born now, the old copy freed as an overwrite would); a
/// block snapshots share is relocated with its birth kept, so every
/// snapshot and clone that shows it follows it and none grows.
fn move_ops(v: &Volume, id: u32, chosen: &[Segment], fresh: &[NewPiece], epoch: u64) -> Vec<Op> {
    let mut ops = Vec::new();
    for p in fresh {
        let mut owned_run: Option<(u64, u64)> = None;
        for s in chosen {
            let Segment::Mapped { lba, len, pba, birth } = *s else { continue };
            let (lo, hi) = (lba.max(p.lba), (lba + len).min(p.lba + p.len));
            if lo >= hi {
                continue;
            }
            let to = p.pba.0 + (lo - p.lba);
            if v.owns_alone(pba, birth) {
                owned_run = Some(owned_run.map_or((lo, hi - lo), |(at, n)| (at, n + hi - lo)));
                continue;
            }
            flush_owned(&mut ops, id, p, owned_run.take(), epoch);
            ops.push(Op::Relocate { vol: id, snap: 0, lba: lo, len: hi - lo, from: pba.0 + (lo - lba), to });
        }
        flush_owned(&mut ops, id, p, owned_run, epoch);
    }
    ops
}

/// A Map op for a run of owned blocks `(lba, len)` inside fresh piece `p`.
fn flush_owned(ops: &mut Vec<Op>, id: u32, p: &NewPiece, run: Option<(u64, u64)>, epoch: u64) {
    if let Some((lba, len)) = run {
        ops.push(Op::Map { vol: id, lba, len, pba: p.pba.0 + (lba - p.lba), birth: epoch });
    }
}

/// A window listed in `Inner::moving` for as long as this lives.
struct Announced<'a> {
    pool: &'a Pool,
    window: Arc<MovingWindow>,
}

impl<'a> Announced<'a> {
    fn new(pool: &'a Pool, window: Arc<MovingWindow>) -> Self {
        pool.write_inner().moving.push(window.clone());
        Announced { pool, window }
    }
}

impl Drop for Announced<'_> {
    fn drop(&mut self) {
        self.pool.write_inner().moving.retain(|w| !Arc::ptr_eq(w, &self.window));
    }
}
