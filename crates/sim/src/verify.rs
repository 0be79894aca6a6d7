//! Comparisons of the pool with the model: every view's bytes and block
//! status, changed-block tracking between views, names and origins, space
//! accounting, and the checker.

use crate::accounting::{self, VolSpace};
use crate::model::{block, Id, Kind, SnapModel, HOLE};
use crate::model::{VolModel, BLOCK};
use crate::run::Run;
use std::collections::BTreeSet;
use tarn_engine::{EngineError, SnapshotInfo, View};

/// Runs of one block-status or changed-blocks answer, as (bytes, flag).
type Runs = Vec<(u64, bool)>;

impl Run {
    /// Everything, exactly: volumes, snapshots, clones, space, checker.
    pub(crate) fn verify_all(&mut self, what: &str) -> Result<(), String> {
        self.verify_names().map_err(|e| format!("{what}: {e}"))?;
        let names: Vec<String> = self.model.vols.keys().cloned().collect();
        for name in &names {
            self.verify_volume(name).map_err(|e| format!("{what}: volume {name}: {e}"))?;
        }
        self.verify_space().map_err(|e| format!("{what}: {e}"))?;
        self.verify_quotas().map_err(|e| format!("{what}: {e}"))?;
        self.verify_device_placement().map_err(|e| format!("{what}: {e}"))?;
        let report = self.pool().check();
        if !report.is_clean() {
            return Err(format!("{what}: checker: {:?}", report.problems));
        }
        trace!("verified {what}: {} volumes", names.len());
        Ok(())
    }

    pub(crate) fn verify_names(&self) -> Result<(), String> {
        let mut listed: Vec<String> = self.pool().list_volumes().into_iter().map(|v| v.name).collect();
        listed.sort();
        let expected: Vec<&String> = self.model.vols.keys().collect();
        if listed.iter().collect::<Vec<_>>() != expected {
            return Err(format!("the pool lists volumes {listed:?}, the model {expected:?}"));
        }
        let all = self.pool().list_snapshots(None).map_err(|e| format!("list all snapshots: {e}"))?;
        let snapshots: usize = self.model.vols.values().map(|v| v.snaps.len()).sum();
        if all.len() != snapshots {
            return Err(format!("the pool lists {} snapshots in all, the model {snapshots}", all.len()));
        }
        Ok(())
    }

    fn verify_volume(&self, name: &str) -> Result<(), String> {
        let pool = self.pool();
        let v = self.model.vol(name);
        let id = pool.volume_id(name).ok_or("missing")?;
        let info = pool.volume_info(id).ok_or("no info")?;
        let origin = self.model.origin_name(v);
        if (info.size as usize, &info.origin, info.snapshots) != (v.current.len(), &origin, v.snaps.len()) {
            let want = (v.current.len(), origin, v.snaps.len());
            return Err(format!("pool says {info:?}; the model (size, origin, snapshots) {want:?}"));
        }
        self.verify_view(id, View::Head, &v.current, &v.ids).map_err(|e| format!("head: {e}"))?;
        self.verify_older(id, View::Head, v.snaps.iter())?;
        let listed = self.listed_snapshots(name, v)?;
        for (s, info) in v.snaps.iter().zip(&listed) {
            self.verify_snapshot(name, id, v, s, info).map_err(|e| format!("snapshot {}: {e}", s.name))?;
        }
        self.verify_changes(id, v, &listed)
    }

    /// The pool's snapshots of the volume, same names in the same order.
    fn listed_snapshots(&self, name: &str, v: &VolModel) -> Result<Vec<SnapshotInfo>, String> {
        let listed = self.pool().list_snapshots(Some(name)).map_err(|e| format!("list snapshots: {e}"))?;
        let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
        let expected: Vec<&str> = v.snaps.iter().map(|s| s.name.as_str()).collect();
        if names != expected {
            return Err(format!("the pool lists snapshots {names:?}, the model {expected:?}"));
        }
        Ok(listed)
    }

    fn verify_snapshot(
        &self,
        name: &str,
        id: u32,
        v: &VolModel,
        s: &SnapModel,
        info: &SnapshotInfo,
    ) -> Result<(), String> {
        let mut clones = self.model.clones_of(v.uid, Some(s.uid));
        clones.sort();
        let mut listed = info.clones.clone();
        listed.sort();
        if info.size as usize != s.data.len() || listed != clones {
            return Err(format!("pool says {info:?}; the model: size {}, clones {clones:?}", s.data.len()));
        }
        let view = View::Snapshot(info.epoch);
        let found = self.pool().lookup_view(&format!("{name}@{}", s.name));
        if found != Some((id, view)) {
            return Err(format!("lookup_view gives {found:?}, the listing epoch {}", info.epoch));
        }
        self.verify_older(id, view, v.snaps.iter().take_while(|o| o.uid != s.uid))?;
        self.verify_view(id, view, &s.data, &s.ids)
    }

    /// What changed-block tracking may compare a view with: the snapshots
    /// older than it, oldest first; and the view's size.
    fn verify_older<'a>(&self, id: u32, view: View, older: impl Iterator<Item = &'a SnapModel>) -> Result<(), String> {
        let listed: Vec<String> = self.pool().older_snapshots(id, view).into_iter().map(|(n, _)| n).collect();
        let expected: Vec<&String> = older.map(|s| &s.name).collect();
        if listed.iter().collect::<Vec<_>>() != expected {
            return Err(format!("older snapshots of {view:?}: the pool {listed:?}, the model {expected:?}"));
        }
        Ok(())
    }

    /// A whole view: size, bytes, and block status block by block.
    fn verify_view(&self, id: u32, view: View, data: &[u8], ids: &[Id]) -> Result<(), String> {
        let size = self.pool().view_size(id, view);
        if size != Some(data.len() as u64) {
            return Err(format!("view size {size:?}, the model {}", data.len()));
        }
        let mut buf = vec![0u8; data.len()];
        self.pool().read_view(id, view, 0, &mut buf).map_err(|e| format!("read: {e}"))?;
        if buf != data {
            let b = (0..ids.len()).find(|&b| block(&buf, b) != block(data, b)).unwrap_or(0);
            return Err(format!("block {b} differs from the model"));
        }
        self.check_block_status(id, view, ids, 0, data.len())
    }

    /// Block status of [off, off+len) of a view: runs tile the range from
    /// its start; a block is allocated exactly when its entry takes space
    /// (so a hole never hides data).
    pub(crate) fn check_block_status(
        &self,
        id: u32,
        view: View,
        ids: &[Id],
        off: usize,
        len: usize,
    ) -> Result<(), String> {
        let runs = self
            .pool()
            .block_status_view(id, view, off as u64, len as u64)
            .map_err(|e| format!("block status: {e}"))?;
        let runs: Runs = runs.iter().map(|r| (r.length, r.allocated)).collect();
        let mut pos = off;
        for (length, allocated) in tiles(&runs, off, len).map_err(|e| format!("block status: {e}"))? {
            let first = pos / BLOCK;
            let covered = &ids[first..(pos + length).div_ceil(BLOCK)];
            if let Some(i) = covered.iter().position(|&id| self.model.alloc(id) != allocated) {
                let b = first + i;
                return Err(format!("block status calls block {b} allocated={allocated}, the model says otherwise"));
            }
            pos += length;
        }
        Ok(())
    }

    /// Block status of a whole view, per block (several calls if it must).
    pub(crate) fn alloc_map(&self, id: u32, view: View, blocks: usize) -> Result<Vec<bool>, String> {
        self.block_flags(blocks, |pos, len| {
            let runs = self.pool().block_status_view(id, view, pos, len).map_err(|e| format!("block status: {e}"))?;
            Ok(runs.iter().map(|r| (r.length, r.allocated)).collect())
        })
    }

    /// Changed blocks of a view against the older snapshot at `since`, per block.
    pub(crate) fn changed_map(&self, id: u32, view: View, since: u64, blocks: usize) -> Result<Vec<bool>, String> {
        self.block_flags(blocks, |pos, len| {
            let runs = self.pool().changed_runs(id, view, since, pos, len).map_err(|e| format!("changed runs: {e}"))?;
            Ok(runs.iter().map(|r| (r.length, r.changed)).collect())
        })
    }

    /// Ask for runs from where the last answer stopped until all blocks are covered.
    fn block_flags(&self, blocks: usize, ask: impl Fn(u64, u64) -> Result<Runs, String>) -> Result<Vec<bool>, String> {
        let mut out = Vec::with_capacity(blocks);
        for _ in 0..=blocks {
            if out.len() == blocks {
                return Ok(out);
            }
            let pos = out.len() * BLOCK;
            let len = blocks * BLOCK - pos;
            for (length, flag) in tiles(&ask(pos as u64, len as u64)?, pos, len)? {
                if length % BLOCK != 0 {
                    return Err(format!("run of {length} bytes at {pos} is not whole blocks"));
                }
                out.extend(std::iter::repeat_n(flag, length / BLOCK));
            }
        }
        Err(format!("answers never covered {blocks} blocks"))
    }

    /// Changed-block tracking of the head and every snapshot against every
    /// older snapshot: a block is changed exactly when the two views show
    /// different entries (when ambiguity leaves that open, at least where
    /// the bytes differ).
    fn verify_changes(&self, id: u32, v: &VolModel, listed: &[SnapshotInfo]) -> Result<(), String> {
        let snaps = v.snaps.iter().zip(listed);
        let views: Vec<(View, &[u8], &[Id], &str)> = std::iter::once((View::Head, &v.current[..], &v.ids[..], "head"))
            .chain(snaps.map(|(s, i)| (View::Snapshot(i.epoch), &s.data[..], &s.ids[..], s.name.as_str())))
            .collect();
        for (k, since) in v.snaps.iter().enumerate() {
            let epoch = listed[k].epoch;
            let newer = views
                .iter()
                .filter(|(view, ..)| *view == View::Head || matches!(*view, View::Snapshot(e) if e > epoch));
            for &(view, data, ids, what) in newer {
                let changed = self.changed_map(id, view, epoch, ids.len())?;
                self.compare_changes(data, ids, since, &changed)
                    .map_err(|e| format!("changes of {what} since {}: {e}", since.name))?;
            }
        }
        self.refuses_newer_base(id, listed)
    }

    /// Changes of a snapshot since a newer one are refused.
    fn refuses_newer_base(&self, id: u32, listed: &[SnapshotInfo]) -> Result<(), String> {
        let [older, newer] = match listed {
            [a, .., b] => [a, b],
            _ => return Ok(()),
        };
        let r = self.pool().changed_runs(id, View::Snapshot(older.epoch), newer.epoch, 0, older.size);
        if !matches!(r, Err(EngineError::InvalidArgument(_))) {
            return Err(format!("changes of {} since the newer {}: {r:?}", older.name, newer.name));
        }
        Ok(())
    }

    fn compare_changes(&self, data: &[u8], ids: &[Id], since: &SnapModel, changed: &[bool]) -> Result<(), String> {
        let zeros = vec![0u8; BLOCK];
        for (b, &reported) in changed.iter().enumerate() {
            match self.certainly_changed(ids[b], since.ids.get(b).copied().unwrap_or(HOLE)) {
                Some(expected) if expected != reported => {
                    return Err(format!("block {b} reported changed={reported}, the model says {expected}"));
                }
                Some(_) => {}
                // Ambiguous entries: at least where the bytes differ.
                None => {
                    let old = if b < since.ids.len() { block(&since.data, b) } else { &zeros };
                    if block(data, b) != old && !reported {
                        return Err(format!("block {b} differs but is not reported changed"));
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether two views showing these entries at a block differ; None if
    /// ambiguity leaves it open.
    fn certainly_changed(&self, a: Id, b: Id) -> Option<bool> {
        if a == b {
            return Some(false);
        }
        let maybe = |id| matches!(self.model.kind(id), Kind::Maybe { .. });
        if maybe(a) || maybe(b) {
            return None;
        }
        Some(true)
    }

    /// The pool's space accounting against every combination the model
    /// allows: per volume (head, snapshots, origin blocks, each snapshot's
    /// exclusive and referenced bytes), and the pool's used bytes.
    pub(crate) fn verify_space(&mut self) -> Result<(), String> {
        let mut totals: Option<BTreeSet<u64>> = Some(BTreeSet::from([0]));
        for (name, v) in &self.model.vols {
            let Some(options) = accounting::possible(&self.model, v) else {
                self.stats.space_skipped += 1;
                totals = None;
                continue;
            };
            let seen = self.reported_space(name, v).map_err(|e| format!("volume {name}: {e}"))?;
            let fits: Vec<u64> = options.iter().filter(|o| o.fits(&seen)).map(|o| o.used).collect();
            if fits.is_empty() {
                return Err(format!("space of volume {name} in blocks: the pool says {seen:?}, the model {options:?}"));
            }
            totals = totals.map(|t| t.iter().flat_map(|a| fits.iter().map(move |u| a + u)).collect());
        }
        let used = self.pool().status().used;
        match totals {
            Some(t) if !used.is_multiple_of(BLOCK as u64) || !t.contains(&(used / BLOCK as u64)) => {
                Err(format!("pool used {used} bytes = {} blocks; the model {t:?} blocks", used / BLOCK as u64))
            }
            _ => Ok(()),
        }
    }

    /// What the pool reports for one volume, in blocks.
    fn reported_space(&self, name: &str, v: &VolModel) -> Result<VolSpace, String> {
        let pool = self.pool();
        let info = pool.volume_id(name).and_then(|id| pool.volume_info(id)).ok_or("missing")?;
        let listed = self.listed_snapshots(name, v)?;
        let mut snaps = Vec::with_capacity(listed.len());
        for s in &listed {
            if s.shared != s.referenced.saturating_sub(s.exclusive) {
                return Err(format!("snapshot {}: shared {} != referenced - exclusive", s.name, s.shared));
            }
            snaps.push((blocks(s.exclusive)?, blocks(s.referenced)?));
        }
        Ok(VolSpace {
            allocated: blocks(info.allocated)?,
            snapshot_blocks: blocks(info.snapshot_bytes)?,
            origin_blocks: blocks(info.origin_bytes)?,
            origin_slack: 0,
            snaps,
            used: 0,
        })
    }
}

fn blocks(bytes: u64) -> Result<u64, String> {
    if !bytes.is_multiple_of(BLOCK as u64) {
        return Err(format!("{bytes} bytes is not whole blocks"));
    }
    Ok(bytes / BLOCK as u64)
}

/// Runs must be non-empty, each non-empty, and stay inside [off, off+len);
/// returns them as (bytes, flag) with lengths in usize.
fn tiles(runs: &Runs, off: usize, len: usize) -> Result<Vec<(usize, bool)>, String> {
    if runs.is_empty() {
        return Err(format!("no runs for {off}+{len}"));
    }
    let mut pos = off;
    let mut out = Vec::with_capacity(runs.len());
    for &(length, flag) in runs {
        let end = pos + length as usize;
        if length == 0 || end > off + len {
            return Err(format!("run of {length} bytes at {pos} leaves {off}+{len}"));
        }
        out.push((length as usize, flag));
        pos = end;
    }
    Ok(out)
}
