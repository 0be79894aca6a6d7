//! Writable clones of a file volume's snapshot (`tarn fs clone FS@SNAP
//! NEW`): the new volume's inode table is an engine clone of the
//! snapshot's table, each object an engine clone of the object as the
//! snapshot reads it (its tag, or a tag taken now when it has not
//! changed since), and the table's records are rewritten to name the
//! clones. Nothing of the data is copied; all of it in one commit.

use crate::error::{FsError, Result};
use crate::history::snap::{tag_name, SnapView};
use crate::namespace::inode::RECORD;
use crate::namespace::ns::FileVolume;
use std::collections::BTreeMap;
use std::sync::Arc;
use tarn_engine::{EngineError, Pool, View};

/// Journal bytes one cloned object may queue: CloneCreate, VolRole,
/// perhaps a tag's SnapCreate, and its share of a rewritten table block.
const PER_OBJECT: usize = 512;

impl FileVolume {
    /// Clone volume snapshot `snap` of file volume `name` as file volume
    /// `new`: durable when it returns. Refused, changing nothing, when
    /// the change is larger than the journal takes in one commit.
    pub fn clone_snapshot(pool: Arc<Pool>, name: &str, snap: &str, new: &str) -> Result<()> {
        let live = FileVolume::open_view(pool.clone(), name, None)?;
        live.writable()?;
        let s = live
            .snap_list()?
            .into_iter()
            .find(|s| s.name == snap)
            .ok_or_else(|| FsError::NoSuchSnapshot { volume: name.to_string(), name: snap.to_string() })?;
        if pool.file_volume(new).is_some() {
            return Err(FsError::Engine(EngineError::VolumeExists(new.to_string())));
        }
        let view =
            FileVolume::open_view(pool.clone(), name, Some(SnapView { epoch: s.engine_epoch, number: s.number }))?;
        let (inodes, damaged) = view.table()?;
        if let Some(d) = damaged.first() {
            return Err(FsError::corrupt("inode table", 0, d.clone()));
        }
        let mut header = view.lock().header.clone();
        let objects = inodes.values().filter(|i| i.object != 0).count()
            + usize::from(header.policy != 0)
            + usize::from(header.layout != 0);
        // Everything below in one commit: a crash never leaves a clone
        // whose records still name the origin's objects.
        if !pool.make_room_for((objects + 1) * PER_OBJECT)? {
            return Err(FsError::Invalid("too many files to clone in one commit (a larger journal takes more)"));
        }
        let current = live.lock().header.epoch;
        let id = pool.clone_file_volume(live.id, s.engine_epoch, new)?;
        let mut clones = BTreeMap::new();
        let mut clone_of = |object: u32| -> Result<u32> {
            if let Some(c) = clones.get(&object) {
                return Ok(*c);
            }
            let epoch = view.frozen_epoch(object, current)?;
            let c = pool.clone_object(object, epoch, id)?;
            clones.insert(object, c);
            Ok(c)
        };
        for mut i in inodes.into_values() {
            if i.object != 0 {
                i.object = clone_of(i.object)?;
                pool.write(id, i.ino * RECORD as u64, &i.encode(), false)?;
            }
        }
        if header.policy != 0 {
            header.policy = clone_of(header.policy)?;
        }
        if header.layout != 0 {
            header.layout = clone_of(header.layout)?;
        }
        // The origin's version log is not the clone's: its `foo@` starts
        // empty (the log object belongs to the origin volume).
        (header.vlog, header.vlog_slots) = (0, 0);
        pool.write(id, 0, &header.encode(), false)?;
        Ok(pool.flush()?)
    }

    /// The engine epoch of a snapshot of `object` holding it as this
    /// snapshot view reads it: its tag, or (unchanged since) a tag taken
    /// now, named by the live volume's epoch `current` as the object's
    /// next change would name it.
    fn frozen_epoch(&self, object: u32, current: u64) -> Result<u64> {
        let number = self.view.map_or(0, |v| v.number);
        if let View::Snapshot(epoch) = self.object_view(object, number)? {
            return Ok(epoch);
        }
        let name = tag_name(current);
        match self.pool.snapshot_member(object, &name) {
            Ok(epoch) => Ok(epoch),
            Err(EngineError::SnapshotExists { .. }) => {
                let snaps = self.pool.member_snapshots(object)?;
                Ok(snaps.iter().find(|s| s.name == name).map(|s| s.epoch).ok_or(FsError::NotFound)?)
            }
            Err(e) => Err(e.into()),
        }
    }
}
