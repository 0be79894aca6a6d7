//! Snapshots, rollback and clones of volumes: the administrative side. The
//! rules live in `map/state.rs` (what each op does to the maps) and `map/view.rs`
//! (what a snapshot shows); here are the locking and the commits.
//!
//! Taking a snapshot waits for in-flight writes (the I/O gate), records the
//! op, and commits: it copies nothing, so it costs one commit whatever the
//! volume holds.

use crate::error::{EngineError, Result};
use crate::integrity::split::{partly_covered, PRESPLIT_MAX};
use crate::map::state::{validate_name, State, Volume};
use crate::map::view::View;
use crate::pool::{volume_named, Pool, VolumeInfo};
use std::collections::BTreeSet;
use tarn_format::ops::Op;
use tarn_format::BLOCK_SIZE;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub volume: String,
    pub name: String,
    pub epoch: u64,
    pub size: u64,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// Bytes only this snapshot holds: what deleting it frees.
    pub exclusive: u64,
    /// Bytes of the volume's own space the snapshot shows.
    pub referenced: u64,
    /// `referenced - exclusive`: held with the head or other snapshots.
    pub shared: u64,
    /// Volumes cloned from it.
    pub clones: Vec<String>,
}

impl Pool {
    /// Snapshot `vol` as `name`. The snapshot holds every write answered
    /// before the call, and is durable when it returns.
    pub fn create_snapshot(&self, vol: &str, name: &str) -> Result<SnapshotInfo> {
        self.check_writable()?;
        validate_name(name).map_err(EngineError::InvalidArgument)?;
        let mut ctl = self.lock_commit();
        self.enable_feature(&mut ctl, self.snapshot_features())?;
        {
            // Drain writes planned against the old epoch: one of them could
            // otherwise overwrite in place a block the snapshot now shows.
            let _quiet = self.io_gate.write().unwrap_or_else(|p| p.into_inner());
            let mut inner = self.write_inner();
            let v = volume_named(&inner.state, vol)?;
            if v.snapshot_named(name).is_some() {
                return Err(EngineError::SnapshotExists { volume: vol.into(), name: name.into() });
            }
            let op = Op::SnapCreate { vol: v.id, name: name.to_string(), created: unix_now() };
            self.apply_ops(&mut inner, vec![op])?;
        }
        self.commit_locked(&mut ctl, false)?;
        drop(ctl);
        self.snapshot_info(vol, name)
    }

    pub fn snapshot_info(&self, vol: &str, name: &str) -> Result<SnapshotInfo> {
        let inner = self.read_inner();
        let v = volume_named(&inner.state, vol)?;
        let i = snapshot_index(v, name)?;
        snapshot_info(&inner.state, v, i)
    }

    /// Snapshots of one volume, or of all, oldest first.
    pub fn list_snapshots(&self, vol: Option<&str>) -> Result<Vec<SnapshotInfo>> {
        let inner = self.read_inner();
        let state = &inner.state;
        let vols: Vec<&Volume> = match vol {
            Some(name) => vec![volume_named(state, name)?],
            None => state.volumes.values().filter(|v| v.role.is_none()).collect(),
        };
        vols.into_iter().flat_map(|v| (0..v.snapshots.len()).map(move |i| snapshot_info(state, v, i))).collect()
    }

    /// Delete a snapshot; returns the bytes freed, back in the pool when
    /// this returns. Refused while clones depend on it.
    pub fn delete_snapshot(&self, vol: &str, name: &str) -> Result<u64> {
        self.check_writable()?;
        let plan = |state: &State| -> Result<(Op, u64)> {
            let v = volume_named(state, vol)?;
            let i = snapshot_index(v, name)?;
            refuse_if_cloned(state, v, i)?;
            Ok((Op::SnapDelete { vol: v.id, epoch: v.snapshots[i].epoch }, v.exclusive_blocks(i)?))
        };
        // Refused before any I/O; then the groups it frees in part are
        // split with no lock held, and the map it clears must not be merging.
        plan(&self.read_inner().state)?;
        self.presplit(&self.partly_freed_by_delete(vol, name)?)?;
        let mut ctl = self.lock_commit();
        self.settle_checkpoint(&mut ctl)?;
        let freed = {
            let mut inner = self.write_inner();
            let (op, exclusive) = plan(&inner.state)?;
            self.apply_ops(&mut inner, vec![op])?;
            exclusive * BLOCK_SIZE
        };
        self.commit_locked(&mut ctl, false)?;
        Ok(freed)
    }

    /// The 64 KiB checksum groups deleting `vol@name` would free in part
    /// (at most [`PRESPLIT_MAX`]), walking its dead list a chunk of entries
    /// per hold of the pool lock.
    fn partly_freed_by_delete(&self, vol: &str, name: &str) -> Result<BTreeSet<u64>> {
        let mut groups = BTreeSet::new();
        let mut from = Some(0);
        // Bounded: each pass moves `from` past up to 4,096 entries, and the
        // walk stops once the set is full.
        while let Some(at) = from.filter(|_| groups.len() < PRESPLIT_MAX) {
            let (runs, next) = self.with_cached_nodes(|inner| {
                let v = volume_named(&inner.state, vol)?;
                Ok(v.exclusive_runs(snapshot_index(v, name)?, at, 4096)?)
            })?;
            for (pba, len) in runs {
                partly_covered(pba, len, &mut groups);
            }
            from = next;
        }
        Ok(groups)
    }

    /// Make the volume's contents those of snapshot `name`. Newer snapshots
    /// are in the way (the head would jump back past them): they are
    /// deleted only with `destroy_newer`, and never if cloned.
    pub fn rollback(&self, vol: &str, name: &str, destroy_newer: bool) -> Result<()> {
        self.check_writable()?;
        let mut ctl = self.lock_commit();
        rollback_ops(&self.read_inner().state, vol, name, destroy_newer)?;
        self.settle_checkpoint(&mut ctl)?;
        {
            let _quiet = self.io_gate.write().unwrap_or_else(|p| p.into_inner());
            let mut inner = self.write_inner();
            let ops = rollback_ops(&inner.state, vol, name, destroy_newer)?;
            self.apply_ops(&mut inner, ops)?;
        }
        self.commit_locked(&mut ctl, false)
    }

    /// A writable volume `clone` showing `vol@snap`; nothing is copied.
    pub fn create_clone(&self, vol: &str, snap: &str, clone: &str) -> Result<VolumeInfo> {
        self.create_clone_forced(vol, snap, clone, false)
    }

    /// [`Pool::create_clone`]; past the overcommit ratio only with `force`
    /// (a clone's size counts as any volume's).
    pub fn create_clone_forced(&self, vol: &str, snap: &str, clone: &str, force: bool) -> Result<VolumeInfo> {
        self.check_writable()?;
        super::files::check_user_name(clone)?;
        let mut ctl = self.lock_commit();
        self.enable_feature(&mut ctl, self.snapshot_features())?;
        let id = {
            let mut inner = self.write_inner();
            if inner.state.by_name.contains_key(clone) {
                return Err(EngineError::VolumeExists(clone.to_string()));
            }
            let v = volume_named(&inner.state, vol)?;
            let i = snapshot_index(v, snap)?;
            super::quota::check_overcommit(&inner, 0, v.snapshots[i].size, force)?;
            let id = inner.state.next_volume_id;
            let op =
                Op::CloneCreate { vol: id, origin_vol: v.id, origin_epoch: v.snapshots[i].epoch, name: clone.into() };
            self.apply_ops(&mut inner, vec![op])?;
            id
        };
        self.commit_locked(&mut ctl, false)?;
        drop(ctl);
        self.volume_info(id).ok_or(EngineError::VolumeGone(id))
    }

    /// Resolve an export name `VOL` or `VOL@SNAP` to a volume and view.
    pub fn lookup_view(&self, name: &str) -> Option<(u32, View)> {
        let inner = self.read_inner();
        match name.split_once('@') {
            None => volume_named(&inner.state, name).ok().map(|v| (v.id, View::Head)),
            Some((vol, snap)) => {
                let v = volume_named(&inner.state, vol).ok()?;
                v.snapshot_named(snap).map(|s| (v.id, View::Snapshot(s.epoch)))
            }
        }
    }

    /// Size of a view in bytes, None once it is gone.
    pub fn view_size(&self, vol: u32, view: View) -> Option<u64> {
        self.read_inner().state.volume(vol).and_then(|v| v.view_size(view))
    }

    /// Older snapshots of the view, as (name, epoch): what changed-block
    /// tracking can compare it with.
    pub fn older_snapshots(&self, vol: u32, view: View) -> Vec<(String, u64)> {
        let inner = self.read_inner();
        let Some(v) = inner.state.volume(vol) else {
            return Vec::new();
        };
        let limit = match view {
            View::Head => u64::MAX,
            View::Snapshot(e) => e,
        };
        v.snapshots.iter().filter(|s| s.epoch < limit).map(|s| (s.name.clone(), s.epoch)).collect()
    }
}

fn snapshot_index(v: &Volume, name: &str) -> Result<usize> {
    v.snapshots
        .iter()
        .position(|s| s.name == name)
        .ok_or_else(|| EngineError::NoSuchSnapshot { volume: v.name.clone(), name: name.to_string() })
}

fn refuse_if_cloned(state: &State, v: &Volume, i: usize) -> Result<()> {
    let clones: Vec<String> =
        state.clones_of(v.id, Some(v.snapshots[i].epoch)).iter().map(|c| c.name.clone()).collect();
    if clones.is_empty() {
        return Ok(());
    }
    Err(EngineError::InUse {
        what: format!("snapshot {}@{}", v.name, v.snapshots[i].name),
        detail: format!("clones {} depend on it; flatten or delete them first", clones.join(", ")),
    })
}

fn snapshot_info(state: &State, v: &Volume, i: usize) -> Result<SnapshotInfo> {
    let s = &v.snapshots[i];
    let exclusive = v.exclusive_blocks(i)? * BLOCK_SIZE;
    let referenced = s.referenced * BLOCK_SIZE;
    Ok(SnapshotInfo {
        volume: v.name.clone(),
        name: s.name.clone(),
        epoch: s.epoch,
        size: s.size,
        created: s.created,
        exclusive,
        referenced,
        shared: referenced.saturating_sub(exclusive),
        clones: state.clones_of(v.id, Some(s.epoch)).iter().map(|c| c.name.clone()).collect(),
    })
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The ops of a rollback of `vol` to `name`, or why it is refused.
fn rollback_ops(state: &State, vol: &str, name: &str, destroy_newer: bool) -> Result<Vec<Op>> {
    let v = volume_named(state, vol)?;
    let i = snapshot_index(v, name)?;
    let newer: Vec<String> = v.snapshots[i + 1..].iter().map(|s| s.name.clone()).collect();
    if !newer.is_empty() && !destroy_newer {
        return Err(EngineError::InUse {
            what: format!("snapshot {vol}@{name}"),
            detail: format!("newer snapshots {} would be destroyed; pass --destroy-newer", newer.join(", ")),
        });
    }
    for j in i + 1..v.snapshots.len() {
        refuse_if_cloned(state, v, j)?;
    }
    let mut ops: Vec<Op> =
        v.snapshots[i + 1..].iter().rev().map(|s| Op::SnapDelete { vol: v.id, epoch: s.epoch }).collect();
    ops.push(Op::Rollback { vol: v.id, epoch: v.snapshots[i].epoch });
    Ok(ops)
}
