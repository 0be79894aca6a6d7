//! File volumes and their objects (docs/ARCHITECTURE.md *File volumes*):
//! engine volumes with a role (op 16), hidden from the block volume
//! commands. tarn-fs builds files and directories on them; the engine
//! only keeps the roles and lists usage.

use crate::error::{EngineError, Result};
use crate::map::state::{validate_name, State, Volume};
use crate::pool::Pool;
use crate::space::placement::PlacementKind;
use crate::volumes::object_layout::{layout_ops, Resolved};
use tarn_format::ops::Op;
use tarn_format::role::VolumeRole;
use tarn_format::superblock::incompat;
use tarn_format::BLOCK_SIZE;

/// Names of objects start with this byte; user volume names may not, so
/// an object's name never collides with one (docs/FORMAT.md *File volumes*).
pub const OBJECT_NAME_PREFIX: char = '~';

/// A file volume as `tarn fs list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileVolumeInfo {
    pub id: u32,
    pub name: String,
    /// Bytes of the file volume's own map (its inode table).
    pub size: u64,
    /// Objects it owns (files, directories, long symlinks).
    pub objects: u64,
    /// Own space its inode table and objects map, in bytes.
    pub allocated: u64,
}

impl Pool {
    /// Set incompat bit 11 (FS_XATTRS) before a file volume's first
    /// extended attribute is written: one commit of its own, the first
    /// time only (`enable_fs_feature`).
    pub fn enable_fs_xattrs(&self) -> Result<()> {
        self.enable_fs_feature(incompat::FS_XATTRS)
    }

    /// Set incompat bit 20 (FS_SPECIAL_FILES) before a file volume's
    /// first fifo, socket or device node is written: one commit of its
    /// own, the first time only (`enable_fs_feature`).
    pub fn enable_fs_special_files(&self) -> Result<()> {
        self.enable_fs_feature(incompat::FS_SPECIAL_FILES)
    }

    /// Set incompat bit 21 (FS_DIR_BLOCKS) before a file volume's first
    /// directory block is written: one commit of its own, the first time
    /// only (`enable_fs_feature`).
    pub fn enable_fs_dir_blocks(&self) -> Result<()> {
        self.enable_fs_feature(incompat::FS_DIR_BLOCKS)
    }

    /// Set incompat bit 23 (FS_POSIX_ACLS) before a file volume's first
    /// access control list is written: one commit of its own, the first
    /// time only (`enable_fs_feature`).
    pub fn enable_fs_posix_acls(&self) -> Result<()> {
        self.enable_fs_feature(incompat::FS_POSIX_ACLS)
    }

    /// Set incompat bit 24 (FS_SPECIAL_SETS) before a fifo, socket or
    /// device node first gets an object for its attribute set: one commit
    /// of its own, the first time only (`enable_fs_feature`).
    pub fn enable_fs_special_sets(&self) -> Result<()> {
        self.enable_fs_feature(incompat::FS_SPECIAL_SETS)
    }

    /// Set incompat bit 17 (FS_VERSION_RECORDS) before a file volume's
    /// first close version record is written: one commit of its own, the
    /// first time only (`enable_fs_feature`).
    pub fn enable_fs_version_records(&self) -> Result<()> {
        self.enable_fs_feature(incompat::FS_VERSION_RECORDS)
    }

    /// Whether every bit of `bit` is on in the pool's incompat features
    /// (as opened, or enabled since): no commit lock.
    pub fn has_feature(&self, bit: u64) -> bool {
        self.enabled_features.load(std::sync::atomic::Ordering::Acquire) & bit == bit
    }

    /// A file volume feature `bit`, made durable by a commit of its own
    /// the first time; once on, checked without the commit lock.
    fn enable_fs_feature(&self, bit: u64) -> Result<()> {
        self.check_writable()?;
        if self.has_feature(bit) {
            return Ok(());
        }
        let mut ctl = self.lock_commit();
        self.enable_feature(&mut ctl, bit)
    }

    /// A new file volume whose own map (`size` bytes, thin) holds its
    /// inode table. Sets PLACEMENT, then FILES with what its snapshots
    /// need (FS_VERSIONS and the snapshot bits), each by a commit of its
    /// own; the volume itself is durable at the next flush, so the
    /// caller's first writes (tarn-fs: header and root) land in the same
    /// commit and a crash never leaves a file volume without them.
    pub fn create_file_volume(&self, name: &str, size: u64) -> Result<FileVolumeInfo> {
        check_user_name(name)?;
        if self.read_inner().state.by_name.contains_key(name) {
            return Err(EngineError::VolumeExists(name.to_string()));
        }
        {
            // Durable before the first record that uses them; objects
            // created later may then name a policy without a commit. The
            // snapshot bits now (as ZFS enables its features at pool
            // creation) rather than at the first snapshot: that one is
            // taken on a mount, under its namespace lock, and a commit
            // there stalled every request for as long as its device flush
            // (1.5 s in PostMark, whose file volume is new each run).
            let mut ctl = self.lock_commit();
            self.enable_feature(&mut ctl, incompat::PLACEMENT)?;
            let versions = incompat::FS_VERSIONS | self.snapshot_features();
            self.enable_feature(&mut ctl, incompat::FILES | versions)?;
        }
        let append = Resolved { placement: Some(PlacementKind::Append), ..Default::default() };
        let id = self.create_with_role(Some(name), size, &append, VolumeRole::FileVolume)?;
        self.file_volume_info(id).ok_or(EngineError::VolumeGone(id))
    }

    /// A writable file volume `name` whose inode table is file volume
    /// `origin`'s table snapshot at `epoch` until written (CloneCreate +
    /// VolRole): nothing copied. Queued, not flushed: tarn-fs clones the
    /// objects and rewrites the table in the same commit.
    pub fn clone_file_volume(&self, origin: u32, epoch: u64, name: &str) -> Result<u32> {
        check_user_name(name)?;
        self.clone_member(origin, epoch, Some(name), None)
    }

    /// A writable object of file volume `owner` showing object `origin`'s
    /// snapshot at `epoch` (CloneCreate + VolRole). Queued, not flushed.
    pub fn clone_object(&self, origin: u32, epoch: u64, owner: u32) -> Result<u32> {
        self.clone_member(origin, epoch, None, Some(owner))
    }

    fn clone_member(&self, origin: u32, epoch: u64, name: Option<&str>, owner: Option<u32>) -> Result<u32> {
        self.check_writable()?;
        let mut ctl = self.lock_commit();
        self.enable_feature(&mut ctl, self.snapshot_features())?;
        let mut inner = self.write_inner();
        let id = inner.state.next_volume_id;
        let name = name.map_or_else(|| format!("{OBJECT_NAME_PREFIX}{id}"), str::to_string);
        if inner.state.by_name.contains_key(&name) {
            return Err(EngineError::VolumeExists(name));
        }
        let role = owner.map_or(VolumeRole::FileVolume, |owner| VolumeRole::Object { owner });
        let ops = vec![
            Op::CloneCreate { vol: id, origin_vol: origin, origin_epoch: epoch, name },
            Op::VolRole { vol: id, role },
        ];
        self.apply_ops(&mut inner, ops)?;
        Ok(id)
    }

    /// A new object of file volume `owner`, `size` bytes thin. Not flushed:
    /// the caller's next flush makes it durable with whatever points at it.
    pub fn create_object(&self, owner: u32, size: u64, placement: Option<PlacementKind>) -> Result<u32> {
        self.create_object_resolved(owner, size, &Resolved { placement, ..Default::default() })
    }

    /// [`Pool::create_object`] with a checked layout (`object_layout.rs`).
    pub(crate) fn create_object_resolved(&self, owner: u32, size: u64, layout: &Resolved) -> Result<u32> {
        // The role only: file_volume_info sums every object's blocks
        // (O(objects); 12% of a 5,000-file PostMark's mount CPU here).
        let is_fv = self.read_inner().state.volume(owner).is_some_and(|v| v.role == Some(VolumeRole::FileVolume));
        if !is_fv {
            return Err(EngineError::InvalidArgument(format!("volume {owner} is not a file volume")));
        }
        self.create_with_role(None, size, layout, VolumeRole::Object { owner })
    }

    /// VolCreate + VolRole (+ the layout's ops) in one record; `name`
    /// None names an object by its id.
    fn create_with_role(&self, name: Option<&str>, size: u64, layout: &Resolved, role: VolumeRole) -> Result<u32> {
        self.check_writable()?;
        let size = super::round_size(size)?;
        let mut inner = self.write_inner();
        let id = inner.state.next_volume_id;
        let name = name.map_or_else(|| format!("{OBJECT_NAME_PREFIX}{id}"), str::to_string);
        if inner.state.by_name.contains_key(&name) {
            return Err(EngineError::VolumeExists(name));
        }
        let mut ops = vec![Op::VolCreate { vol: id, size, name }, Op::VolRole { vol: id, role }];
        ops.extend(layout_ops(id, layout));
        self.apply_ops(&mut inner, ops)?;
        Ok(id)
    }

    /// Delete object `id` (which must be an object); its space is free
    /// after the next commit. Not flushed.
    pub fn delete_object(&self, id: u32) -> Result<()> {
        self.check_writable()?;
        self.apply_clearing(|state| {
            object_of(state, id)?;
            Ok(vec![Op::VolDelete { vol: id }])
        })
    }

    /// Apply the ops `ops` makes from the state (checked there), which
    /// clear maps (a volume or snapshot delete). With no map merging into
    /// a checkpoint (read under the lock that sets it) they apply at
    /// once, without the commit lock: a commit holds it through its
    /// device flush, and tarn-fs deletes files under its namespace lock
    /// (an unlink, or a versioned file's last forget, held up every
    /// request of the mount for 0.3-1.9 s). Otherwise they wait for the
    /// merge, as a map being merged cannot be cleared.
    pub(crate) fn apply_clearing(&self, ops: impl Fn(&State) -> Result<Vec<Op>>) -> Result<()> {
        {
            let mut inner = self.write_inner();
            if !self.merging.load(std::sync::atomic::Ordering::SeqCst) {
                let list = ops(&inner.state)?;
                return self.apply_ops(&mut inner, list);
            }
        }
        let mut ctl = self.lock_commit();
        ops(&self.read_inner().state)?;
        self.settle_checkpoint(&mut ctl)?;
        let mut inner = self.write_inner();
        let list = ops(&inner.state)?;
        self.apply_ops(&mut inner, list)
    }

    /// Delete file volume `name` and every object it owns, in one record;
    /// durable when it returns.
    pub fn delete_file_volume(&self, name: &str) -> Result<()> {
        self.check_writable()?;
        {
            let mut ctl = self.lock_commit();
            file_volume_named(&self.read_inner().state, name)?;
            self.settle_checkpoint(&mut ctl)?;
            let mut inner = self.write_inner();
            let id = file_volume_named(&inner.state, name)?.id;
            refuse_if_cloned(&inner.state, id)?;
            let mut ops: Vec<Op> = inner.state.objects_of(id).into_iter().map(|vol| Op::VolDelete { vol }).collect();
            ops.push(Op::VolDelete { vol: id });
            self.apply_ops(&mut inner, ops)?;
        }
        self.flush()
    }

    /// Every file volume, by id.
    pub fn file_volumes(&self) -> Vec<FileVolumeInfo> {
        let inner = self.read_inner();
        let state = &inner.state;
        state.volumes.values().filter(|v| v.role == Some(VolumeRole::FileVolume)).map(|v| fv_info(state, v)).collect()
    }

    /// The file volume named `name`, if there is one.
    pub fn file_volume(&self, name: &str) -> Option<FileVolumeInfo> {
        let inner = self.read_inner();
        file_volume_named(&inner.state, name).ok().map(|v| fv_info(&inner.state, v))
    }

    fn file_volume_info(&self, id: u32) -> Option<FileVolumeInfo> {
        let inner = self.read_inner();
        let v = inner.state.volume(id).filter(|v| v.role == Some(VolumeRole::FileVolume))?;
        Some(fv_info(&inner.state, v))
    }

    /// Own space object `id` maps, in bytes (None: not an object).
    pub fn object_allocated(&self, id: u32) -> Option<u64> {
        let inner = self.read_inner();
        object_of(&inner.state, id).ok().map(|v| v.map.physical_blocks() * BLOCK_SIZE)
    }
}

/// Names a user gives a block or file volume: valid, and never an object's.
/// A file volume another one was cloned from (`tarn fs clone`) reads
/// through to it: refused naming the clone, which must go first.
fn refuse_if_cloned(state: &State, id: u32) -> Result<()> {
    let mut members: std::collections::HashSet<u32> = state.objects_of(id).into_iter().collect();
    members.insert(id);
    // One pass over the volumes (clones_of per member would be quadratic).
    let clone = state.volumes.values().find(|v| v.origin.is_some_and(|o| members.contains(&o.vol)));
    let Some(c) = clone else {
        return Ok(());
    };
    let owner = match c.role {
        Some(VolumeRole::Object { owner }) => state.volume(owner).map_or(c.name.clone(), |o| o.name.clone()),
        _ => c.name.clone(),
    };
    Err(EngineError::InvalidArgument(format!(
        "file volume {owner} is a clone of one of its snapshots: destroy {owner} first, \
         or make it independent with `tarn fs flatten {owner}` (copies what it shares)"
    )))
}

pub(crate) fn check_user_name(name: &str) -> Result<()> {
    validate_name(name).map_err(EngineError::InvalidArgument)?;
    if name.starts_with(OBJECT_NAME_PREFIX) {
        return Err(EngineError::InvalidArgument(format!("names starting with {OBJECT_NAME_PREFIX:?} are reserved")));
    }
    Ok(())
}

fn fv_info(state: &State, v: &Volume) -> FileVolumeInfo {
    let objects = state.objects_of(v.id);
    let blocks: u64 = objects.iter().filter_map(|&o| state.volume(o)).map(|o| o.map.physical_blocks()).sum();
    FileVolumeInfo {
        id: v.id,
        name: v.name.clone(),
        size: v.size,
        objects: objects.len() as u64,
        allocated: (blocks + v.map.physical_blocks()) * BLOCK_SIZE,
    }
}

impl Pool {
    /// Make file volume `name` (a clone) independent of the file volume
    /// it was cloned from: its inode table and every object still reading
    /// from the origin's are flattened (`flatten`: what they share is
    /// copied into their own space), so the origin and the snapshot it was
    /// cloned from can be destroyed. `progress(done, total)` in blocks over
    /// all of them. Returns the members flattened; durable when it returns.
    pub fn flatten_file_volume(&self, name: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<usize> {
        self.check_writable()?;
        let (members, total) = {
            let inner = self.read_inner();
            let id = file_volume_named(&inner.state, name)?.id;
            let mut ids = inner.state.objects_of(id);
            ids.push(id);
            let clones: Vec<&Volume> =
                ids.iter().filter_map(|m| inner.state.volume(*m)).filter(|v| v.origin.is_some()).collect();
            let total = clones.iter().map(|v| v.origin_blocks()).sum::<u64>();
            (clones.iter().map(|v| (v.id, v.name.clone())).collect::<Vec<_>>(), total)
        };
        let mut before = 0;
        for (id, member) in &members {
            let mut last = 0;
            self.flatten_member(*id, member, &mut |done, _| {
                last = done;
                progress(before + done, total.max(before + done));
            })?;
            before += last;
        }
        Ok(members.len())
    }
}

fn file_volume_named<'a>(state: &'a State, name: &str) -> Result<&'a Volume> {
    let v = state.by_name.get(name).and_then(|id| state.volume(*id));
    v.filter(|v| v.role == Some(VolumeRole::FileVolume)).ok_or_else(|| EngineError::NoSuchVolume(name.to_string()))
}

pub(crate) fn object_of(state: &State, id: u32) -> Result<&Volume> {
    let v = state.volume(id).filter(|v| matches!(v.role, Some(VolumeRole::Object { .. })));
    v.ok_or_else(|| EngineError::InvalidArgument(format!("volume {id} is not a file object")))
}

#[cfg(test)]
mod tests {
    use crate::device::mem_device::MemDevice;
    use crate::{create_pool, CreateOptions, Device, OpenOptions, Pool};
    use std::sync::mpsc::channel;
    use std::sync::Arc;
    use std::time::Duration;

    /// Once its bit is on, a file volume feature is checked without the
    /// commit lock: a setxattr does not wait for a commit in flight. The
    /// first time it is a commit, and waits for the lock.
    #[test]
    fn an_enabled_fs_feature_does_not_wait_for_the_commit_lock() {
        let dev: Vec<Arc<dyn Device>> = vec![Arc::new(MemDevice::new("m", 64 << 20, 1))];
        create_pool(&dev, &["m".into()], &CreateOptions::default()).unwrap();
        let pool = Arc::new(Pool::open(dev, OpenOptions::default()).unwrap());
        pool.enable_fs_xattrs().unwrap();
        let held = pool.lock_commit();
        let (done, finished) = channel();
        let p = pool.clone();
        let first = std::thread::spawn(move || {
            p.enable_fs_xattrs().unwrap();
            done.send("xattrs").unwrap();
            p.enable_fs_special_files().unwrap();
            done.send("special").unwrap();
        });
        assert_eq!(finished.recv_timeout(Duration::from_secs(10)), Ok("xattrs"), "an enabled bit waited for the lock");
        assert!(finished.recv_timeout(Duration::from_millis(200)).is_err(), "a new bit is a commit under the lock");
        drop(held);
        assert_eq!(finished.recv_timeout(Duration::from_secs(10)), Ok("special"));
        first.join().unwrap();
    }
}
