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
use crate::io::RELAYOUT_RUN_BLOCKS;
use crate::map::extent_map::Killed;
use crate::pool::Pool;
use crate::volumes::evacuate::LiveRun;
use crate::volumes::relayout::{Destination, RelayoutReport, WINDOW_BLOCKS};
use tarn_format::superblock::incompat;

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
        let mut relocate_ready = false;
        for epoch in epochs {
            let Some(entries) = self.dead_entries(id, epoch)? else { continue };
            for window in windows(id, epoch, entries) {
                if !scattered(&window) {
                    continue;
                }
                if !relocate_ready {
                    // Moves are Relocates: older tarns must not replay them.
                    self.enable_feature(&mut self.lock_commit(), incompat::RELOCATE)?;
                    relocate_ready = true;
                }
                self.make_room()?;
                let (moved, room) = self.move_dead_window(window)?;
                if moved > 0 {
                    report.snapshot_windows_moved += 1;
                    report.snapshot_blocks_moved += moved;
                }
                if !room {
                    // A full pool: what moved stays moved, the rest where
                    // it is (compaction never makes room, it needs some).
                    report.windows_skipped += 1;
                    return Ok(());
                }
                if !go_on() {
                    report.stopped = true;
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Move a window's runs in order; the blocks moved, and false if the
    /// pool had no room for the next one.
    fn move_dead_window(&self, window: Vec<LiveRun>) -> Result<(u64, bool)> {
        let mut moved = 0;
        for run in window {
            match self.move_dead_run(run, &mut Destination::Placement) {
                Ok(n) => moved += n,
                Err(EngineError::NoSpace) => return Ok((moved, false)),
                Err(e) => return Err(e),
            }
        }
        Ok((moved, true))
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
