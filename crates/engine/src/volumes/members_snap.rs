//! Snapshots of file volumes and their objects (docs/ARCHITECTURE.md
//! *File volumes*, versioning): the same SnapCreate and SnapDelete ops as
//! block volumes, but never committed here. tarn-fs takes them inside a
//! namespace change (the lazy snapshot of an object before its first
//! change after a volume snapshot) and commits with the change.

use crate::error::{EngineError, Result};
use crate::map::state::{State, Volume};
use crate::pool::Pool;
use tarn_format::ops::Op;
use tarn_format::role::VolumeRole;
use tarn_format::superblock::incompat;

/// One snapshot of a member, as tarn-fs needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSnapshot {
    pub name: String,
    pub epoch: u64,
    /// Seconds since the Unix epoch.
    pub created: u64,
}

/// One object of a file volume with its head size and snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectSnapshots {
    pub id: u32,
    pub size: u64,
    pub snapshots: Vec<MemberSnapshot>,
}

impl Pool {
    /// Snapshot file volume or object `id` as `name`; returns the
    /// snapshot's epoch. Durable at the caller's next flush.
    pub fn snapshot_member(&self, id: u32, name: &str) -> Result<u64> {
        self.check_writable()?;
        let whole = member(&self.read_inner().state, id)?.role == Some(VolumeRole::FileVolume);
        // The bits it needs, set by one commit of their own the first
        // time only; a file volume's snapshot is the first record that
        // needs FS_VERSIONS, a file version (tarn-fs names them `~f...`,
        // `~c...`) FS_FILE_VERSIONS.
        let mut bits = self.snapshot_features();
        if whole {
            bits |= incompat::FS_VERSIONS;
            if name.starts_with('~') {
                bits |= incompat::FS_FILE_VERSIONS;
            }
        }
        // The commit lock only for that: a snapshot's op needs none (it
        // goes to the queue as a write's ops do), and a commit holds it
        // through its device flush (tarn-fs tags each object at its first
        // change after a volume snapshot, under its namespace lock).
        if !self.has_feature(bits) {
            self.enable_feature(&mut self.lock_commit(), bits)?;
        }
        // Drain writes planned against the old epoch (see create_snapshot),
        // unless none can be writing this member (`pool/gate.rs`).
        let (_quiet, mut inner) = self.write_inner_quiet_for(id);
        let v = member(&inner.state, id)?;
        if v.snapshot_named(name).is_some() {
            return Err(EngineError::SnapshotExists { volume: v.name.clone(), name: name.into() });
        }
        let epoch = inner.state.epoch;
        let op = Op::SnapCreate { vol: id, name: name.to_string(), created: super::snapshot::unix_now() };
        self.apply_ops(&mut inner, vec![op])?;
        Ok(epoch)
    }

    /// Snapshots of file volume or object `id`, oldest first.
    pub fn member_snapshots(&self, id: u32) -> Result<Vec<MemberSnapshot>> {
        let inner = self.read_inner();
        Ok(member(&inner.state, id)?.snapshots.iter().map(member_snapshot).collect())
    }

    /// Every object of file volume `owner` with its snapshots (from the
    /// catalog in memory: no I/O).
    pub fn objects_with_snapshots(&self, owner: u32) -> Vec<ObjectSnapshots> {
        let inner = self.read_inner();
        let state = &inner.state;
        state
            .objects_of(owner)
            .into_iter()
            .filter_map(|id| state.volume(id))
            .map(|v| ObjectSnapshots {
                id: v.id,
                size: v.size,
                snapshots: v.snapshots.iter().map(member_snapshot).collect(),
            })
            .collect()
    }

    /// Delete snapshots `(member, epoch)` in one change: each frees what
    /// only it held (its dead list). Durable at the caller's next flush.
    pub fn delete_member_snapshots(&self, gone: &[(u32, u64)]) -> Result<()> {
        self.check_writable()?;
        if gone.is_empty() {
            return Ok(());
        }
        self.apply_clearing(|state| {
            gone.iter()
                .map(|&(vol, epoch)| {
                    let v = member(state, vol)?;
                    v.snapshot_index(epoch).ok_or_else(|| EngineError::NoSuchSnapshot {
                        volume: v.name.clone(),
                        name: format!("epoch {epoch}"),
                    })?;
                    Ok(Op::SnapDelete { vol, epoch })
                })
                .collect()
        })
    }

    /// Shrink object `id` to `size` bytes (its tail's blocks go to the
    /// dead lists or are freed). tarn-fs marks a retired object this way.
    pub fn shrink_object(&self, id: u32, size: u64) -> Result<()> {
        self.check_writable()?;
        let size = super::round_size(size)?;
        // No commit lock: the tail goes as a trim's blocks do.
        // Writes planned against the tail it frees drain first, unless
        // none can be writing the object (a retired file's object: its
        // data written behind was settled before).
        let (_quiet, mut inner) = self.write_inner_quiet_for(id);
        let v = member(&inner.state, id)?;
        if !matches!(v.role, Some(VolumeRole::Object { .. })) || size > v.size {
            return Err(EngineError::InvalidArgument(format!("object {id} cannot shrink to {size} bytes")));
        }
        self.apply_ops(&mut inner, vec![Op::VolResize { vol: id, size }])
    }
}

fn member_snapshot(s: &crate::map::state::Snapshot) -> MemberSnapshot {
    MemberSnapshot { name: s.name.clone(), epoch: s.epoch, created: s.created }
}

fn member(state: &State, id: u32) -> Result<&Volume> {
    let v = state.volume(id).filter(|v| matches!(v.role, Some(VolumeRole::FileVolume | VolumeRole::Object { .. })));
    v.ok_or_else(|| EngineError::InvalidArgument(format!("volume {id} is not a file volume or object")))
}
