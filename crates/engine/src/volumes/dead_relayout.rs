//! Compacting what only snapshots hold (`tarn pool compact`, after each
//! volume's head): each 1 MiB window of a snapshot's dead list whose runs
//! lie in short, separate physical pieces is moved run by run, in logical
//! order, to where new data goes, by Relocate (op 17, as evacuation moves
//! them: same birth, so every view that shows a block follows it). A read
//! of the snapshot's own data is then sequential again, and the free
//! space the pieces cut up joins. Snapshots take no writes, so nothing
//! races but a snapshot delete or rollback, which `move_dead_run` checks
//! for under the pool lock.

use crate::error::{EngineError, Result};
use crate::integrity::verify::Wanted;
use crate::io::RELAYOUT_RUN_BLOCKS;
use crate::map::extent_map::{Killed, Segment};
use crate::map::view::View;
use crate::pool::Pool;
use crate::volumes::evacuate::{shows_run, LiveRun};
use crate::volumes::relayout::{Destination, RelayoutReport, BATCH_WINDOWS, WINDOW_BLOCKS};
use tarn_format::superblock::incompat;
use tarn_format::BLOCK_SIZE;

impl Pool {
    /// Compact the dead lists of volume `id`'s snapshots, window by window;
    /// stops when `go_on` answers false.
    pub(crate) fn relayout_dead_lists(
        &self,
        id: u32,
        report: &mut RelayoutReport,
        go_on: &mut dyn FnMut() -> bool,
    ) -> Result<()> {
        let epochs: Vec<u64> = self
            .read_inner()
            .state
            .volume(id)
            .map(|v| v.snapshots.iter().map(|s| s.epoch).collect())
            .unwrap_or_default();
        if epochs.is_empty() {
            return Ok(());
        }
        // Scattered windows of every snapshot, read together in device
        // order (see `Pool::move_windows`) up to a batch's worth of blocks:
        // a dead list holds a few blocks per window, its windows lie all
        // over the device, and several snapshots' lie between each other.
        let mut batch: Vec<Vec<LiveRun>> = Vec::new();
        let mut blocks = 0;
        for epoch in epochs {
            let Some(entries) = self.dead_entries(id, epoch)? else { continue };
            for window in windows(id, epoch, entries).into_iter().filter(|w| scattered(w)) {
                blocks += window.iter().map(|r| r.len).sum::<u64>();
                batch.push(window);
                if blocks >= BATCH_WINDOWS * WINDOW_BLOCKS && !self.move_dead_batch(&mut batch, report, go_on)? {
                    return Ok(());
                }
                blocks = if batch.is_empty() { 0 } else { blocks };
            }
        }
        if !batch.is_empty() {
            self.move_dead_batch(&mut batch, report, go_on)?;
        }
        Ok(())
    }

    /// Move one batch of dead-list windows (emptied); false when the
    /// compaction stops there (a full pool, or `go_on` said so).
    fn move_dead_batch(
        &self,
        batch: &mut Vec<Vec<LiveRun>>,
        report: &mut RelayoutReport,
        go_on: &mut dyn FnMut() -> bool,
    ) -> Result<bool> {
        // Moves are Relocates: older tarns must not replay them.
        self.enable_feature(&mut self.lock_commit(), incompat::RELOCATE)?;
        self.make_room()?;
        let (moved, room) = self.move_dead_windows(batch, &mut Destination::Placement)?;
        batch.clear();
        report.snapshot_windows_moved += moved.iter().filter(|&&n| n > 0).count() as u64;
        report.snapshot_blocks_moved += moved.iter().sum::<u64>();
        if !room {
            // A full pool: what moved stays moved, the rest where it is
            // (compaction never makes room, it needs some).
            report.windows_skipped += 1;
            return Ok(false);
        }
        if !go_on() {
            report.stopped = true;
            return Ok(false);
        }
        Ok(true)
    }

    /// Move windows' runs in order, their data read first in one sweep in
    /// device order: the blocks moved per window, and false if the pool
    /// had no room for the next run in `dest`.
    pub(crate) fn move_dead_windows(
        &self,
        windows: &[Vec<LiveRun>],
        dest: &mut Destination,
    ) -> Result<(Vec<u64>, bool)> {
        let data = self.read_dead_runs(windows)?;
        let mut moved = vec![0; windows.len()];
        for ((w, window), data) in windows.iter().enumerate().zip(data) {
            for (&run, data) in window.iter().zip(data) {
                // None: the run changed since (a snapshot delete, a rollback).
                let Some(data) = data else { continue };
                match self.place_dead_run(run, &data, dest) {
                    Ok(n) => moved[w] += n,
                    Err(EngineError::NoSpace) => return Ok((moved, false)),
                    Err(e) => return Err(e),
                }
            }
        }
        Ok((moved, true))
    }

    /// The data of every run of `windows` that its snapshot still shows
    /// there, read in device order and checked; a run whose read or check
    /// failed is read again through the snapshot's verified read.
    fn read_dead_runs(&self, windows: &[Vec<LiveRun>]) -> Result<Vec<Vec<Option<Vec<u8>>>>> {
        let runs: Vec<LiveRun> = windows.iter().flatten().copied().collect();
        let mut bufs: Vec<Vec<u8>> = Vec::with_capacity(runs.len());
        let (mut shown, mut wanted, mut whole) = (Vec::with_capacity(runs.len()), Vec::new(), Vec::new());
        for (k, run) in runs.iter().enumerate() {
            let view = View::Snapshot(run.snap);
            let ok = shows_run(&self.resolve(run.vol, view, run.lba, run.len)?, run);
            bufs.push(vec![0u8; if ok { (run.len * BLOCK_SIZE) as usize } else { 0 }]);
            shown.push(ok);
            if !ok {
                continue;
            }
            for (seg, sums) in self.resolve_summed(run.vol, view, run.lba, run.len)? {
                let Segment::Mapped { lba, pba, len, .. } = seg else { continue };
                if lba < run.lba || lba + len > run.lba + run.len {
                    whole.push(k); // not expected: the usual read takes it
                    continue;
                }
                let at = ((lba - run.lba) * BLOCK_SIZE) as usize;
                wanted.push(Wanted { buf: k, at, pba, len, sums });
            }
        }
        let mut sound = {
            let _gate = self.gate_shared();
            self.read_in_device_order(wanted, &mut bufs)
        };
        whole.into_iter().for_each(|k| sound[k] = false);
        let mut out: Vec<Vec<Option<Vec<u8>>>> = Vec::with_capacity(windows.len());
        let mut all = runs.iter().zip(bufs).zip(shown.into_iter().zip(sound));
        for window in windows {
            let mut datas = Vec::with_capacity(window.len());
            for ((run, mut buf), (ok, sound)) in all.by_ref().take(window.len()) {
                if ok && !sound {
                    self.read_view_mapped(run.vol, View::Snapshot(run.snap), run.lba * BLOCK_SIZE, &mut buf)?;
                }
                datas.push(ok.then_some(buf));
            }
            out.push(datas);
        }
        Ok(out)
    }

    /// The entries of a snapshot's dead list (None once it is gone).
    fn dead_entries(&self, id: u32, epoch: u64) -> Result<Option<Killed>> {
        let inner = self.read_inner();
        let dead = inner.state.volume(id).and_then(|v| v.snapshots.iter().find(|s| s.epoch == epoch)).map(|s| &s.dead);
        Ok(dead.map(|d| d.entries()).transpose()?)
    }
}

/// A dead list's runs grouped by 1 MiB window of the volume, cut at window
/// boundaries, in logical order.
fn windows(vol: u32, snap: u64, entries: Killed) -> Vec<Vec<LiveRun>> {
    let mut out: Vec<Vec<LiveRun>> = Vec::new();
    for (lba, e) in entries {
        let mut at = lba;
        while at < lba + e.len {
            let end = ((at / WINDOW_BLOCKS + 1) * WINDOW_BLOCKS).min(lba + e.len);
            let run = LiveRun { vol, snap, lba: at, len: end - at, pba: e.pba.offset_by(at - lba), birth: e.birth };
            match out.last_mut() {
                Some(w) if w[0].lba / WINDOW_BLOCKS == at / WINDOW_BLOCKS => w.push(run),
                _ => out.push(vec![run]),
            }
            at = end;
        }
    }
    out
}

/// Whether a window's runs read as random I/O: two or more physical
/// pieces (a run not right after the previous one on the device),
/// averaging under `RELAYOUT_RUN_BLOCKS`.
fn scattered(window: &[LiveRun]) -> bool {
    let pieces = 1 + window
        .windows(2)
        .filter(|w| w[1].pba.device() != w[0].pba.device() || w[1].pba != w[0].pba.offset_by(w[0].len))
        .count() as u64;
    let blocks: u64 = window.iter().map(|r| r.len).sum();
    pieces >= 2 && blocks / pieces < RELAYOUT_RUN_BLOCKS
}
