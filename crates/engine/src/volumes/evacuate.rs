//! Evacuating a member device (`tarn dev remove`): allocation stops
//! taking space there (the draining member's bit in `Space::avoid`), then
//! every live block on it (mapped by some volume's head or held by a
//! snapshot's dead list; free and dead space is never read) is copied to
//! the other members. A block only the head holds is mapped anew, as a
//! compaction does; a block snapshots or clones share moves by Relocate
//! (op 17), keeping its birth, so every view that showed it follows it
//! and the pool's used bytes do not change. Clients keep writing: a head
//! window they touch while it moves is left for the next pass.

use crate::error::{EngineError, Result};
use crate::map::extent_map::Segment;
use crate::map::state::Volume;
use crate::map::view::View;
use crate::pool::Pool;
use crate::volumes::relayout::{Destination, Window, BATCH_WINDOWS, WINDOW_BLOCKS};
use tarn_format::ops::Op;
use tarn_format::superblock::incompat;
use tarn_format::{Pba, BLOCK_SIZE};

/// Passes over the pool before giving up on blocks clients keep touching
/// (each pass moves what it finds; writes go elsewhere meanwhile).
const MAX_PASSES: usize = 8;

/// What an evacuation did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvacuateReport {
    pub index: usize,
    /// Live bytes on the member when the evacuation started.
    pub live_bytes: u64,
    pub moved_bytes: u64,
    /// Live bytes still on the member (0 when done).
    pub remaining_bytes: u64,
    /// Stopped because the caller asked (a cancel); what moved is durable.
    pub stopped: bool,
    /// Done: the member was taken out of the pool (`detach_device`).
    pub detached: Option<crate::volumes::detach::DetachReport>,
}

/// Where one live run on the draining member is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LiveRun {
    pub vol: u32,
    /// 0: the head; else the snapshot (epoch) whose dead list holds it.
    pub snap: u64,
    pub lba: u64,
    pub len: u64,
    pub pba: Pba,
    pub birth: u64,
}

impl Pool {
    /// Every reason member `index` cannot be evacuated, before anything
    /// changes: an unknown index, the primary (it holds the journal and the
    /// authoritative superblock; with one member it is also the last), a
    /// mirrored member (a leg is not a device of its own here: it would be
    /// detached, not evacuated), live data the other members cannot hold.
    pub fn refuse_removal(&self, index: usize) -> Result<u64> {
        let bad = |why: String| Err(EngineError::InvalidArgument(why));
        let n = self.devices.len();
        if index >= n {
            return bad(format!("no member {index}: the pool has {n} (0..{})", n.saturating_sub(1)));
        }
        if n == 1 {
            return bad("member 0 is the pool's last device: a pool needs one".into());
        }
        if index == 0 {
            return bad("member 0 is the primary (journal and superblock): it cannot be removed".into());
        }
        if self.is_removed(index) {
            return bad(format!("member {index} is removed already: its slot is empty"));
        }
        if self.is_spare(index) {
            return bad(format!("device {index} is a spare: it holds no data (dev remove drops it)"));
        }
        if self.mirrors.get(index).is_some_and(Option::is_some) {
            return bad(format!("member {index} is a mirror: removing a mirrored member is not supported"));
        }
        let live = self.live_blocks_on(index)?;
        let inner = self.read_inner();
        let sp = &inner.space;
        let others: u64 =
            (0..sp.devices.len()).filter(|&d| d != index && sp.usable(d)).map(|d| sp.devices[d].free_blocks).sum();
        let room = others.saturating_sub(sp.reserve_blocks);
        if live > room {
            return bad(format!(
                "member {index} holds {} MiB of live data; the other members have room for {} MiB",
                (live * BLOCK_SIZE) >> 20,
                (room * BLOCK_SIZE) >> 20
            ));
        }
        Ok(live)
    }

    /// Live blocks on member `index`: heads and snapshots' dead lists.
    pub fn live_blocks_on(&self, index: usize) -> Result<u64> {
        Ok(self.live_runs(index)?.iter().map(|r| r.len).sum())
    }

    /// Mark member `index` draining (allocation avoids it) and move every
    /// live block off it. `go_on(moved_bytes, live_bytes)` is asked after
    /// every step; false stops (the member stays draining: `undrain` or a
    /// later call). Durable (flushed) when it returns.
    pub fn evacuate_device(&self, index: usize, go_on: &mut dyn FnMut(u64, u64) -> bool) -> Result<EvacuateReport> {
        self.evacuate_device_batched(index, BATCH_WINDOWS, go_on)
    }

    /// [`Pool::evacuate_device`] moving up to `batch` head runs of one
    /// volume per step (1 to [`BATCH_WINDOWS`]; a `--rate` takes
    /// `relayout::batch_for_rate`): announced together, so client writes
    /// planned before are waited for once per batch, not once per window
    /// (each wait holds new client I/O back until the ones in flight end),
    /// and their blocks read in one sweep in device order.
    pub fn evacuate_device_batched(
        &self,
        index: usize,
        batch: u64,
        go_on: &mut dyn FnMut(u64, u64) -> bool,
    ) -> Result<EvacuateReport> {
        self.check_writable()?;
        let live = self.refuse_removal(index)?;
        self.write_inner().space.avoid |= 1 << index;
        self.record_draining(index, true)?;
        let mut report = EvacuateReport { index, live_bytes: live * BLOCK_SIZE, ..Default::default() };
        if self.read_inner().state.volumes.values().any(|v| !v.snapshots.is_empty() || v.origin.is_some()) {
            // Shared blocks move by Relocate: older tarns must not replay it.
            self.enable_feature(&mut self.lock_commit(), incompat::RELOCATE)?;
        }
        for _ in 0..MAX_PASSES {
            let runs = self.live_runs(index)?;
            if runs.is_empty() || report.stopped {
                break;
            }
            for group in batches(&runs, batch) {
                self.make_room()?;
                report.moved_bytes += self.move_live_runs(index, group)? * BLOCK_SIZE;
                if !go_on(report.moved_bytes, report.live_bytes) {
                    report.stopped = true;
                    break;
                }
            }
        }
        self.flush()?;
        report.remaining_bytes = self.live_blocks_on(index)? * BLOCK_SIZE;
        if report.remaining_bytes == 0 && !report.stopped && self.is_draining(index) {
            report.detached = Some(self.detach_device(index)?);
        }
        Ok(report)
    }

    /// Let allocation use member `index` again (a cancelled removal).
    pub fn undrain_device(&self, index: usize) -> Result<()> {
        if index >= self.devices.len() || self.is_removed(index) {
            return Err(EngineError::InvalidArgument(format!("no member {index}")));
        }
        self.record_draining(index, false)?;
        self.write_inner().space.open_device(index);
        Ok(())
    }

    /// Record member `index` as draining (or not) in the device table:
    /// the superblock is rewritten (txid + 1, checkpoint and journal
    /// unchanged, as for mirror leg states) with incompat EVACUATION, so a
    /// restart keeps allocation off it. Durable when it returns.
    fn record_draining(&self, index: usize, draining: bool) -> Result<()> {
        let mut ctl = self.lock_commit();
        if ctl.sb.devices.get(index).is_none_or(|d| d.draining == draining) {
            return Ok(());
        }
        self.rewrite_member_entry(&mut ctl, index, incompat::EVACUATION, |e| e.draining = draining)
    }

    /// The members recorded draining (being evacuated) in the device table.
    pub fn draining_members(&self) -> Vec<usize> {
        let ctl = self.lock_commit();
        ctl.sb.devices.iter().enumerate().filter(|(_, d)| d.draining).map(|(i, _)| i).collect()
    }

    /// Whether member `index` is draining (allocation avoids it).
    pub fn is_draining(&self, index: usize) -> bool {
        // A removed slot and a spare are avoided too, but not being removed.
        let other = self.lock_commit().sb.devices.get(index).is_some_and(|e| e.removed || e.spare);
        !other && !self.read_inner().space.usable(index)
    }

    /// The live runs on member `index`, at most one window long each.
    fn live_runs(&self, index: usize) -> Result<Vec<LiveRun>> {
        self.live_runs_where(&on_member(index))
    }

    /// The live runs (heads and dead lists) on blocks `keep` chooses, cut
    /// at window boundaries and where `keep` changes its answer (origin
    /// markers are never chosen). Walks every map.
    pub(crate) fn live_runs_where(&self, keep: &Keep) -> Result<Vec<LiveRun>> {
        let inner = self.read_inner();
        let mut out = Vec::new();
        for v in inner.state.volumes.values() {
            collect_runs(v, 0, v.map.entries()?, keep, &mut out);
            for s in &v.snapshots {
                collect_runs(v, s.epoch, s.dead.entries()?, keep, &mut out);
            }
        }
        Ok(out)
    }

    /// Move one batch of [`batches`]: a dead-list run alone, or head runs
    /// of one volume together; the blocks moved (0 for a run that changed
    /// meanwhile). `NoSpace` when placement finds no room.
    fn move_live_runs(&self, index: usize, group: &[LiveRun]) -> Result<u64> {
        self.move_live_runs_where(group, &on_member(index), &mut Destination::Placement)
    }

    /// Move one batch of [`batches`] to `dest`: of head runs, the segments
    /// on blocks `keep` chooses. The blocks moved; `NoSpace` when `dest`
    /// has no room.
    pub(crate) fn move_live_runs_where(&self, group: &[LiveRun], keep: &Keep, dest: &mut Destination) -> Result<u64> {
        let Some(first) = group.first() else { return Ok(0) };
        if first.snap != 0 || group.len() == 1 {
            return self.move_run_where(*first, keep, dest);
        }
        let chosen = |_: &Volume, segs: &[Segment]| -> Vec<Segment> {
            segs.iter().copied().filter(|s| matches!(*s, Segment::Mapped { pba, .. } if real(pba, keep))).collect()
        };
        let windows: Vec<(u64, u64)> = group.iter().map(|r| (r.lba, r.len)).collect();
        let mut moved = 0;
        for outcome in self.move_windows(first.vol, &windows, &chosen, dest)? {
            match outcome {
                Window::Moved(n) => moved += n,
                Window::NoRoom => return Err(EngineError::NoSpace),
                Window::Fine | Window::Skipped => {}
            }
        }
        Ok(moved)
    }

    /// Move one run of [`Pool::live_runs_where`] to `dest`: of a head
    /// window, the segments on blocks `keep` chooses. The blocks moved (0
    /// if it changed meanwhile); `NoSpace` when `dest` has no room.
    pub(crate) fn move_run_where(&self, run: LiveRun, keep: &Keep, dest: &mut Destination) -> Result<u64> {
        if run.snap == 0 {
            let chosen = |_: &Volume, segs: &[Segment]| -> Vec<Segment> {
                segs.iter().copied().filter(|s| matches!(*s, Segment::Mapped { pba, .. } if real(pba, keep))).collect()
            };
            return match self.move_window(run.vol, (run.lba, run.len), &chosen, dest)? {
                Window::Moved(n) => Ok(n),
                Window::NoRoom => Err(EngineError::NoSpace),
                Window::Fine | Window::Skipped => Ok(0),
            };
        }
        self.move_dead_run(run, dest)
    }

    /// Move a run of a snapshot's dead list: no client writes there, but a
    /// snapshot delete or rollback may change it, so the run is looked up
    /// again under the pool lock before the Relocate is applied.
    pub(crate) fn move_dead_run(&self, run: LiveRun, dest: &mut Destination) -> Result<u64> {
        // The snapshot's view shows exactly this run there (a dead list
        // holds what its snapshot saw and the head no longer does); read
        // through it so the data is verified against its checksums.
        if !shows_run(&self.resolve(run.vol, View::Snapshot(run.snap), run.lba, run.len)?, &run) {
            return Ok(0);
        }
        let mut data = vec![0u8; (run.len * BLOCK_SIZE) as usize];
        self.read_view_mapped(run.vol, View::Snapshot(run.snap), run.lba * BLOCK_SIZE, &mut data)?;
        self.place_dead_run(run, &data, dest)
    }

    /// The second half of [`Pool::move_dead_run`]: `data` (the run's, read
    /// and verified through its snapshot) written to new space from `dest`
    /// and relocated there if the run is still the snapshot's.
    pub(crate) fn place_dead_run(&self, run: LiveRun, data: &[u8], dest: &mut Destination) -> Result<u64> {
        let seg = Segment::Mapped { lba: run.lba, len: run.len, pba: run.pba, birth: run.birth };
        let head_blocks = self.read_inner().state.volume(run.vol).map_or(0, Volume::blocks);
        if run.lba + run.len > head_blocks {
            // Past a shrunk head: older tarns bound a Relocate by it.
            self.enable_feature(&mut self.lock_commit(), incompat::EVACUATION)?;
        }
        let fresh = dest.allocate(self, run.vol, &[Segment::Hole { lba: run.lba, len: run.len }])?;
        let bs = BLOCK_SIZE as usize;
        let piece = |at: u64, n: u64| &data[(at - run.lba) as usize * bs..(at - run.lba + n) as usize * bs];
        for p in &fresh {
            if let Err(e) = self.write_device(p.pba, piece(p.lba, p.len)) {
                self.give_back_unmapped(&fresh);
                return Err(e);
            }
        }
        let mut inner = self.write_inner();
        let still = inner
            .state
            .volume(run.vol)
            .and_then(|v| v.snapshots.iter().find(|s| s.epoch == run.snap))
            .map(|s| s.dead.lookup(run.lba, run.len, 2))
            .transpose()?;
        if still != Some(vec![seg]) {
            drop(inner);
            self.give_back_unmapped(&fresh);
            return Ok(0);
        }
        let mut ops = Vec::new();
        for p in &fresh {
            inner.space.settle(p.pba);
            let from = run.pba.0 + (p.lba - run.lba);
            ops.push(Op::Relocate { vol: run.vol, snap: run.snap, lba: p.lba, len: p.len, from, to: p.pba.0 });
            ops.extend(self.sums_op(p.pba, piece(p.lba, p.len)));
        }
        self.apply_ops(&mut inner, ops)?;
        Ok(run.len)
    }
}

/// `runs` in steps: head runs of one volume, consecutive in the list (in
/// volume order), up to `batch` at a time; a dead-list run alone.
fn batches(runs: &[LiveRun], batch: u64) -> Vec<&[LiveRun]> {
    let batch = batch.clamp(1, BATCH_WINDOWS) as usize;
    let mut out = Vec::new();
    let mut rest = runs;
    while let Some(first) = rest.first() {
        let n = if first.snap != 0 {
            1
        } else {
            rest.iter().take(batch).take_while(|r| r.snap == 0 && r.vol == first.vol).count()
        };
        let (step, tail) = rest.split_at(n);
        out.push(step);
        rest = tail;
    }
    out
}

/// Whether `segs` (a view, which may cut a run in pieces) show exactly
/// `run`'s blocks, in order.
pub(crate) fn shows_run(segs: &[Segment], run: &LiveRun) -> bool {
    let mut at = run.lba;
    for s in segs {
        match *s {
            Segment::Mapped { lba, len, pba, birth }
                if lba == at && birth == run.birth && pba == run.pba.offset_by(lba - run.lba) =>
            {
                at += len
            }
            _ => return false,
        }
    }
    at == run.lba + run.len
}

/// Which blocks a mover takes: for the run of `len` blocks at `pba`,
/// whether its first block is taken and how many blocks from there (at
/// least one, at most `len`) get the same answer.
pub(crate) type Keep<'a> = dyn Fn(Pba, u64) -> (bool, u64) + 'a;

/// Blocks on member `index`.
pub(crate) fn on_member(index: usize) -> impl Fn(Pba, u64) -> (bool, u64) {
    move |pba, len| (usize::from(pba.device()) == index, len)
}

/// Whether `pba` is a real block (not an origin marker) `keep` takes.
fn real(pba: Pba, keep: &Keep) -> bool {
    !pba.is_origin() && keep(pba, 1).0
}

/// The entries of one map on blocks `keep` takes, cut at window
/// boundaries and where `keep`'s answer changes.
fn collect_runs(v: &Volume, snap: u64, entries: crate::map::extent_map::Killed, keep: &Keep, out: &mut Vec<LiveRun>) {
    for (lba, e) in entries {
        if e.pba.is_origin() {
            continue;
        }
        let mut at = lba;
        while at < lba + e.len {
            let end = ((at / WINDOW_BLOCKS + 1) * WINDOW_BLOCKS).min(lba + e.len);
            let pba = e.pba.offset_by(at - lba);
            let (taken, same) = keep(pba, end - at);
            let len = same.clamp(1, end - at);
            if taken {
                out.push(LiveRun { vol: v.id, snap, lba: at, len, pba, birth: e.birth });
            }
            at += len;
        }
    }
}
