//! The pool's logical state: volumes, their maps and snapshots. Changed only
//! through [`State::apply`], by the live pool and by journal replay alike.
//!
//! Snapshots follow the dead-list rule (Loris epochs, ZFS dead lists): a
//! snapshot is the epoch it was taken in; every map entry carries the epoch
//! its data was born in. An entry killed (overwritten, trimmed) while born at
//! or before the newest snapshot is still visible there, so it moves to that
//! snapshot's dead list instead of being freed. See `view.rs` for reads.

pub use crate::error::StateError;
use crate::map::extent_map::{tree_id, Extent, ExtentMap, Freed, Killed, Ranges, Segment};
use crate::map::sums::BlockSums;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use tarn_format::address::BLOCK_MASK;
use tarn_format::checkpoint::MAX_SNAPSHOTS;
use tarn_format::node::SUMS_GROUP;
use tarn_format::ops::{Op, MAX_NAME_LEN};
use tarn_format::placement::PolicyCode;
use tarn_format::role::VolumeRole;
use tarn_format::{Pba, BLOCK_SIZE};
use tarn_store::Store;

/// A clone reads through to at most this many generations of origins, so a
/// read costs at most this many map lookups per level (`flatten` cuts it).
pub const MAX_CLONE_DEPTH: usize = 16;

#[derive(Debug)]
pub struct Snapshot {
    pub name: String,
    /// Data born in this epoch or before is in the snapshot (if alive then).
    pub epoch: u64,
    pub size: u64,
    pub created: u64,
    /// Blocks of the volume's own space the snapshot shows.
    pub referenced: u64,
    /// Entries visible in this snapshot killed while it was the newest:
    /// born at or before `epoch`, dead before the next snapshot.
    pub dead: ExtentMap,
}

/// Where a clone's unwritten blocks come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    pub vol: u32,
    pub epoch: u64,
}

#[derive(Debug)]
pub struct Volume {
    pub id: u32,
    pub name: String,
    /// Visible size in bytes (a multiple of the block size).
    pub size: u64,
    /// The head: what the volume reads now.
    pub map: ExtentMap,
    /// Oldest first; epochs strictly ascending.
    pub snapshots: Vec<Snapshot>,
    pub origin: Option<Origin>,
    /// The volume's own placement policy (None: the pool's default).
    pub placement: Option<PolicyCode>,
    /// File volume or file object, hidden from block commands (None: a
    /// block volume).
    pub role: Option<VolumeRole>,
    /// Bytes of own space the head and its snapshots may hold (op 22).
    pub quota: Option<u64>,
    /// Members its new data may go to, bit i for member i (op 24); 0: any.
    pub devices: u16,
    /// Its stripe layout (op 20): unit k of new data goes to the set's
    /// (k mod N)-th member (None: not striped).
    pub stripe: Option<tarn_format::stripe::Stripe>,
    /// Its parity layout (op 21): its map holds its data rows, then one
    /// parity unit per row (None: no parity; `volumes/parity.rs`).
    pub parity: Option<tarn_format::stripe::Parity>,
}

/// Logical blocks a volume of `size` bytes maps at most: its data, and with
/// parity whole data rows then the parity units.
pub fn map_blocks(size: u64, parity: Option<tarn_format::stripe::Parity>) -> u64 {
    parity.map_or(size / BLOCK_SIZE, |p| p.map_blocks(size / BLOCK_SIZE))
}

/// The volume whose maps an op may change (None: it changes none).
fn op_volume(op: &Op) -> Option<u32> {
    match op {
        Op::Map { vol, .. }
        | Op::Unmap { vol, .. }
        | Op::VolCreate { vol, .. }
        | Op::VolResize { vol, .. }
        | Op::VolDelete { vol }
        | Op::SnapCreate { vol, .. }
        | Op::SnapDelete { vol, .. }
        | Op::Rollback { vol, .. }
        | Op::CloneCreate { vol, .. }
        | Op::Materialize { vol, .. }
        | Op::CloneDetach { vol }
        | Op::Relocate { vol, .. } => Some(*vol),
        Op::Sums { .. }
        | Op::GroupSums { .. }
        | Op::Regions { .. }
        | Op::VolPlacement { .. }
        | Op::VolRole { .. }
        | Op::VolQuota { .. }
        | Op::PoolOvercommit { .. }
        | Op::VolDevices { .. }
        | Op::VolStripe { .. }
        | Op::VolParity { .. } => None,
    }
}

impl Volume {
    /// Entries of its head and of its snapshots' dead lists.
    pub fn extent_count(&self) -> usize {
        self.map.extent_count() + self.snapshots.iter().map(|s| s.dead.extent_count()).sum::<usize>()
    }

    /// Entries of its head and of the newest snapshot's dead list: what a
    /// Map or Unmap may change.
    fn head_and_newest_dead_count(&self) -> usize {
        self.map.extent_count() + self.snapshots.last().map_or(0, |s| s.dead.extent_count())
    }

    fn new(store: &Arc<Store>, id: u32, name: String, size: u64) -> Volume {
        let map = ExtentMap::new(store.clone(), tree_id::head(id));
        Volume {
            id,
            name,
            size,
            map,
            snapshots: Vec::new(),
            origin: None,
            placement: None,
            role: None,
            quota: None,
            devices: 0,
            stripe: None,
            parity: None,
        }
    }

    /// Logical blocks the map may hold: the size, plus the parity area of
    /// a parity volume.
    pub fn blocks(&self) -> u64 {
        map_blocks(self.size, self.parity)
    }

    /// Epoch of the newest snapshot: head entries born after it are the
    /// head's alone and may be overwritten in place.
    pub fn shared_epoch(&self) -> Option<u64> {
        self.snapshots.last().map(|s| s.epoch)
    }

    /// Whether a head entry born in `birth` at `pba` may be overwritten in place.
    pub fn owns_alone(&self, pba: Pba, birth: u64) -> bool {
        !pba.is_origin() && self.shared_epoch().is_none_or(|e| birth > e)
    }

    pub fn snapshot_index(&self, epoch: u64) -> Option<usize> {
        self.snapshots.binary_search_by_key(&epoch, |s| s.epoch).ok()
    }

    pub fn snapshot_named(&self, name: &str) -> Option<&Snapshot> {
        self.snapshots.iter().find(|s| s.name == name)
    }

    /// Blocks of own space held only by snapshots (dead lists).
    pub fn snapshot_blocks(&self) -> u64 {
        self.snapshots.iter().map(|s| s.dead.physical_blocks()).sum()
    }

    /// Blocks of own space charged to the volume's quota: what its head
    /// maps plus what only its snapshots hold (a clone's origin markers
    /// count to the origin). Counters, no scan.
    pub fn used_blocks(&self) -> u64 {
        self.map.physical_blocks() + self.snapshot_blocks()
    }

    /// Whether `more` new blocks (plus `pending` allocated, not yet
    /// mapped) would take the volume past its quota.
    pub fn over_quota(&self, pending: u64, more: u64) -> bool {
        self.quota.is_some_and(|q| (self.used_blocks() + pending + more) * BLOCK_SIZE > q)
    }

    /// Blocks still reading through to the origin, head and dead lists.
    pub fn origin_blocks(&self) -> u64 {
        self.map.origin_blocks() + self.snapshots.iter().map(|s| s.dead.origin_blocks()).sum::<u64>()
    }

    /// Blocks deleting snapshot `i` would free: its dead list's entries born
    /// after the previous snapshot (no other view can see them).
    pub fn exclusive_blocks(&self, i: usize) -> Result<u64, StateError> {
        let owns = self.owned_by_snapshot(i);
        let mut sum = 0;
        self.snapshots[i].dead.for_each_from(0, &mut |_, e| {
            if owns(&e) {
                sum += e.len;
            }
            true
        })?;
        Ok(sum)
    }

    /// The physical runs deleting snapshot `i` would free (as
    /// [`Volume::exclusive_blocks`] counts them), from its dead list's
    /// entries at logical block `from` on, at most `max` of them; with the
    /// block to go on from, None once the list is done.
    pub fn exclusive_runs(&self, i: usize, from: u64, max: usize) -> Result<(Ranges, Option<u64>), StateError> {
        let owns = self.owned_by_snapshot(i);
        let (mut runs, mut next) = (Ranges::new(), None);
        self.snapshots[i].dead.for_each_from(from, &mut |lba, e| {
            if runs.len() >= max {
                next = Some(lba);
                return false;
            }
            if owns(&e) {
                runs.push((e.pba, e.len));
            }
            true
        })?;
        Ok((runs, next))
    }

    /// Whether a dead-list entry of snapshot `i` is its own: born after the
    /// snapshot before it, and not read through to an origin.
    fn owned_by_snapshot(&self, i: usize) -> impl Fn(&Extent) -> bool {
        let after = if i == 0 { None } else { Some(self.snapshots[i - 1].epoch) };
        move |e| !e.pba.is_origin() && after.is_none_or(|a| e.birth > a)
    }

    /// Send entries the head no longer shows to the newest snapshot's dead
    /// list if that snapshot still shows them; free the rest.
    fn retire(&mut self, killed: Killed, freed: &mut Freed) -> Result<(), StateError> {
        for (lba, e) in killed {
            match self.snapshots.last_mut() {
                Some(s) if e.birth <= s.epoch => {
                    // Only damaged metadata (a head overlapping its dead
                    // list) gets here twice for one block.
                    let twice = s.dead.insert(lba, e.len, e.pba, e.birth)?;
                    if !twice.is_empty() {
                        let what = format!("volume {}: two versions of block {lba} died in one interval", self.id);
                        return Err(StateError::Invariant(what));
                    }
                }
                _ => free(lba, e, freed),
            }
        }
        Ok(())
    }
}

fn free(_lba: u64, e: Extent, freed: &mut Freed) {
    if !e.pba.is_origin() {
        freed.push((e.pba, e.len));
    }
}

#[derive(Debug)]
pub struct State {
    /// Where every map's nodes live.
    pub store: Arc<Store>,
    pub volumes: BTreeMap<u32, Volume>,
    pub by_name: HashMap<String, u32>,
    pub next_volume_id: u32,
    /// The current epoch: new data is born in it.
    pub epoch: u64,
    /// Data checksums by physical block (pools with DATA_CHECKSUMS).
    pub sums: BlockSums,
    /// Overwrite regions durably open (see `sums.rs`).
    pub open_regions: BTreeSet<u64>,
    /// Node blocks of maps deleted since the last checkpoint (free once
    /// the next checkpoint, which no longer reaches them, is durable).
    pub retired_nodes: Vec<Pba>,
    /// Creating or growing a volume past this many thousandths of the
    /// pool's size (sum of virtual sizes) needs force (op 23).
    pub overcommit_milli: Option<u32>,
    /// (origin volume, origin epoch, clone) for every volume with an
    /// origin, kept in step with `volumes` (`add_volume`, clone detach,
    /// volume delete): a delete finds a volume's clones without scanning
    /// every volume (a file volume's objects are volumes: a versioned
    /// file's unlink scanned all of them, 6% of a versioned PostMark).
    pub(crate) clones: BTreeSet<(u32, u64, u32)>,
    /// Entries of every head and dead list, kept by `apply` and
    /// `add_volume` (a sum over every volume at each reserve refresh was
    /// 3-7% of a PostMark mount: a file volume's objects are volumes).
    pub(crate) extents: usize,
}

impl Default for State {
    fn default() -> Self {
        State::new(Arc::new(Store::memory()))
    }
}

impl State {
    pub fn new(store: Arc<Store>) -> State {
        State {
            sums: BlockSums::new(store.clone()),
            store,
            volumes: BTreeMap::new(),
            by_name: HashMap::new(),
            next_volume_id: 1,
            epoch: 1,
            open_regions: BTreeSet::new(),
            retired_nodes: Vec::new(),
            overcommit_milli: None,
            clones: BTreeSet::new(),
            extents: 0,
        }
    }
}

/// Checks a volume or snapshot name: what the CLI accepts and replay expects.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!("name must be 1 to {MAX_NAME_LEN} bytes"));
    }
    if name.contains(['@', '/']) || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!("name {name:?} may not contain '@', '/', spaces or control characters"));
    }
    Ok(())
}

impl State {
    pub fn volume(&self, id: u32) -> Option<&Volume> {
        self.volumes.get(&id)
    }

    fn volume_mut(&mut self, id: u32, what: &str) -> Result<&mut Volume, String> {
        self.volumes.get_mut(&id).ok_or(format!("{what} on unknown volume {id}"))
    }

    /// Blocks of real space referenced by every volume, head and snapshots.
    pub fn mapped_blocks(&self) -> u64 {
        self.volumes.values().map(|v| v.map.physical_blocks() + v.snapshot_blocks()).sum()
    }

    /// Every piece of real space the volumes reference: heads and dead lists.
    pub fn physical_extents(&self) -> Result<Vec<(Pba, u64)>, StateError> {
        let mut out = Vec::new();
        for m in self.volumes.values().flat_map(|v| std::iter::once(&v.map).chain(v.snapshots.iter().map(|s| &s.dead)))
        {
            m.for_each_from(0, &mut |_, e| {
                if !e.pba.is_origin() {
                    out.push((e.pba, e.len));
                }
                true
            })?;
        }
        Ok(out)
    }

    /// Entries of every head and dead list (the metadata reserve's measure).
    pub fn extent_count(&self) -> usize {
        self.extents
    }

    /// Where the kept clone index or entry count differs from a scan of
    /// every volume (the pool check reports it).
    pub fn index_problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let scanned: usize = self.volumes.values().map(Volume::extent_count).sum();
        if scanned != self.extents {
            out.push(format!("the maps hold {scanned} entries, the pool counts {}", self.extents));
        }
        let clones: BTreeSet<(u32, u64, u32)> =
            self.volumes.values().filter_map(|v| v.origin.map(|o| (o.vol, o.epoch, v.id))).collect();
        if clones != self.clones {
            out.push(format!("{} volumes are clones, the clone index lists {}", clones.len(), self.clones.len()));
        }
        out
    }

    /// Volumes cloned from `vol`'s snapshot at `epoch` (any epoch if None).
    pub fn clones_of(&self, vol: u32, epoch: Option<u64>) -> Vec<&Volume> {
        let (from, to) = match epoch {
            Some(e) => ((vol, e, 0), (vol, e, u32::MAX)),
            None => ((vol, 0, 0), (vol, u64::MAX, u32::MAX)),
        };
        self.clones.range(from..=to).filter_map(|&(_, _, c)| self.volumes.get(&c)).collect()
    }

    /// Add a volume built elsewhere (a checkpoint or catalog load): its
    /// name, its entries in the count, its origin in the clone index.
    pub fn add_volume(&mut self, v: Volume) {
        self.extents += v.extent_count();
        self.insert_volume(v);
    }

    /// Its name and its origin in the clone index (`apply` counts the
    /// entries of a volume an op creates).
    fn insert_volume(&mut self, v: Volume) {
        if let Some(o) = v.origin {
            self.clones.insert((o.vol, o.epoch, v.id));
        }
        self.by_name.insert(v.name.clone(), v.id);
        self.volumes.insert(v.id, v);
    }

    /// Generations of origins above `vol` (0 for a plain volume).
    pub fn clone_depth(&self, vol: u32) -> usize {
        let mut depth = 0;
        let mut at = self.volume(vol).and_then(|v| v.origin);
        while let Some(o) = at {
            depth += 1;
            if depth > MAX_CLONE_DEPTH {
                break;
            }
            at = self.volume(o.vol).and_then(|v| v.origin);
        }
        depth
    }

    /// Snapshots whose dead list the catalog holds (INLINE_DEAD_LISTS).
    pub fn inline_dead_lists(&self) -> u64 {
        self.volumes.values().flat_map(|v| &v.snapshots).filter(|s| s.dead.is_in_memory()).count() as u64
    }

    /// Apply one op; physical blocks it releases are appended to `freed`.
    /// An op that does not fit the state (replay of a damaged journal, or a
    /// bug) is refused with a reason and changes nothing.
    pub fn apply(&mut self, op: &Op, freed: &mut Freed) -> Result<(), StateError> {
        // An op changes the entries of the volume it names only: count
        // that volume's before and after (also after a failed op, which may
        // have changed some), not every volume's.
        // A write (Map, Unmap) changes only the head and the newest
        // snapshot's dead list (`Volume::retire`): count those two, not
        // every snapshot's, on the hot path.
        let vol = op_volume(op);
        let write = matches!(op, Op::Map { .. } | Op::Unmap { .. });
        let count = |s: &State| {
            let v = vol.and_then(|id| s.volume(id));
            v.map_or(0, |v| if write { v.head_and_newest_dead_count() } else { v.extent_count() })
        };
        let before = count(self);
        let result = self.apply_op(op, freed);
        self.extents = self.extents.saturating_sub(before) + count(self);
        result
    }

    fn apply_op(&mut self, op: &Op, freed: &mut Freed) -> Result<(), StateError> {
        match op {
            Op::Map { vol, lba, len, pba, birth } => {
                let epoch = self.epoch;
                let v = self.volume_mut(*vol, "map")?;
                check_range(v, *lba, *len)?;
                // New data is born now: an older birth would let a head entry
                // hide behind a snapshot it was never in (found by fuzzing:
                // a rollback then met the block twice and panicked).
                if *birth != epoch || Pba(*pba).is_origin() {
                    return Err(format!("map to {} born in epoch {birth} (current {epoch})", Pba(*pba)).into());
                }
                check_physical(*pba, *len)?;
                let killed = v.map.insert(*lba, *len, Pba(*pba), *birth)?;
                v.retire(killed, freed)?;
            }
            Op::Unmap { vol, lba, len } => {
                let v = self.volume_mut(*vol, "unmap")?;
                check_range(v, *lba, *len)?;
                let killed = v.map.remove(*lba, *len)?;
                v.retire(killed, freed)?;
            }
            Op::VolCreate { vol, size, name } => {
                self.check_new_volume(*vol, name, *size)?;
                self.volumes.insert(*vol, Volume::new(&self.store, *vol, name.clone(), *size));
                self.by_name.insert(name.clone(), *vol);
                self.next_volume_id = self.next_volume_id.max(vol + 1);
            }
            Op::VolPlacement { vol, policy } => {
                self.volume_mut(*vol, "placement")?.placement = *policy;
            }
            Op::VolRole { vol, role } => self.set_role(*vol, *role)?,
            Op::VolQuota { .. } | Op::PoolOvercommit { .. } | Op::VolStripe { .. } | Op::VolParity { .. } => {
                self.apply_setting(op)?
            }
            Op::VolDevices { vol, devices } => self.volume_mut(*vol, "devices")?.devices = *devices,
            Op::VolResize { vol, size } => self.resize_volume(*vol, *size, freed)?,
            Op::VolDelete { vol } => self.drop_volume(*vol, freed)?,
            Op::Sums { pba, sums } => {
                if Pba(*pba).is_origin() || sums.is_empty() {
                    return Err(format!("checksums for {} blocks at {}", sums.len(), Pba(*pba)).into());
                }
                self.sums.set(Pba(*pba), sums);
            }
            Op::GroupSums { pba, crcs } => {
                if Pba(*pba).is_origin() || crcs.is_empty() || !pba.is_multiple_of(SUMS_GROUP) {
                    return Err(format!("coarse checksums for {} groups at {}", crcs.len(), Pba(*pba)).into());
                }
                self.sums.set_groups(Pba(*pba), crcs);
            }
            Op::Regions { open: true, ids } => self.open_regions.extend(ids.iter().copied()),
            Op::Regions { open: false, ids } => ids.iter().for_each(|id| {
                self.open_regions.remove(id);
            }),
            _ => return self.apply_snapshot_op(op, freed),
        }
        Ok(())
    }

    /// Op VolResize: a shrink releases what lies past the new end.
    fn resize_volume(&mut self, vol: u32, size: u64, freed: &mut Freed) -> Result<(), StateError> {
        let v = self.volume_mut(vol, "resize")?;
        if v.parity.is_some() {
            return Err(format!("volume {vol} keeps parity: its size is fixed").into());
        }
        if !size.is_multiple_of(BLOCK_SIZE) {
            return Err(format!("volume size {size} not a multiple of {BLOCK_SIZE}").into());
        }
        let new_blocks = size / BLOCK_SIZE;
        if new_blocks < v.blocks() {
            let killed = v.map.remove(new_blocks, v.blocks() - new_blocks)?;
            v.retire(killed, freed)?;
        }
        v.size = size;
        Ok(())
    }

    /// Op VolDelete: refused while a clone or an object depends on the
    /// volume; else its map and every snapshot's dead list are released.
    fn drop_volume(&mut self, vol: u32, freed: &mut Freed) -> Result<(), StateError> {
        // The objects check scans every volume (O(volumes): a file
        // volume's objects are volumes, and a PostMark unlink deletes one);
        // the clones check reads the clone index. Both are skipped where
        // they cannot find anything: a clone's origin is a snapshot of
        // `vol` (checked at clone creation and checkpoint load, and a
        // snapshot delete is refused while a clone depends on it), and
        // only a file volume owns objects (`set_role`).
        let (snapshots, role) = self.volume(vol).map_or((true, None), |v| (!v.snapshots.is_empty(), v.role));
        if snapshots {
            if let Some(c) = self.clones_of(vol, None).first() {
                return Err(format!("volume {vol} has clone {}", c.name).into());
            }
        }
        if !matches!(role, Some(VolumeRole::Object { .. })) {
            if let Some(o) = self.objects_of(vol).first() {
                return Err(format!("file volume {vol} still owns object {o}").into());
            }
        }
        let mut v = self.volumes.remove(&vol).ok_or(format!("delete of unknown volume {vol}"))?;
        self.by_name.remove(&v.name);
        if let Some(o) = v.origin {
            self.clones.remove(&(o.vol, o.epoch, vol));
        }
        v.map.clear()?.into_iter().for_each(|(l, e)| free(l, e, freed));
        self.retired_nodes.extend(v.map.take_superseded());
        for mut s in v.snapshots {
            s.dead.clear()?.into_iter().for_each(|(l, e)| free(l, e, freed));
            self.retired_nodes.extend(s.dead.take_superseded());
        }
        Ok(())
    }

    /// A role is given once, to a volume that has none; an object's owner
    /// must be a file volume.
    pub fn set_role(&mut self, vol: u32, role: VolumeRole) -> Result<(), StateError> {
        if let VolumeRole::Object { owner } = role {
            if self.volume(owner).and_then(|o| o.role) != Some(VolumeRole::FileVolume) {
                return Err(format!("object {vol}: owner {owner} is not a file volume").into());
            }
        }
        let v = self.volume_mut(vol, "role")?;
        if v.role.is_some() {
            return Err(format!("volume {vol} already has a role").into());
        }
        v.role = Some(role);
        Ok(())
    }

    /// A volume's quota (a positive number of whole blocks, or None) or
    /// the pool's overcommit ratio: settings, no space changes.
    fn apply_setting(&mut self, op: &Op) -> Result<(), StateError> {
        match *op {
            Op::VolQuota { vol, quota } => {
                if quota.is_some_and(|q| q == 0 || !q.is_multiple_of(BLOCK_SIZE)) {
                    return Err(
                        format!("quota {quota:?} of volume {vol} not a positive multiple of {BLOCK_SIZE}").into()
                    );
                }
                self.volume_mut(vol, "quota")?.quota = quota;
            }
            Op::PoolOvercommit { milli } => self.overcommit_milli = milli,
            Op::VolStripe { vol, stripe } => self.volume_mut(vol, "stripe")?.stripe = stripe,
            Op::VolParity { vol, parity } => {
                // The parity area lies past the data rows: a layout change
                // would move it under mapped blocks. Set once, on an empty map.
                let v = self.volume_mut(vol, "parity")?;
                if v.map.mapped_blocks() != 0 || !v.snapshots.is_empty() || v.parity.is_some() {
                    return Err(format!("volume {vol}: parity is set only on a new, empty volume").into());
                }
                v.parity = parity;
            }
            _ => return Err(format!("{op:?} is not a setting").into()),
        }
        Ok(())
    }

    /// Ids of the objects file volume `owner` holds, ascending.
    pub fn objects_of(&self, owner: u32) -> Vec<u32> {
        let owned = |v: &&Volume| v.role == Some(VolumeRole::Object { owner });
        self.volumes.values().filter(owned).map(|v| v.id).collect()
    }

    fn check_new_volume(&self, vol: u32, name: &str, size: u64) -> Result<(), StateError> {
        validate_name(name)?;
        if self.volumes.contains_key(&vol) || self.by_name.contains_key(name) || vol == 0 {
            return Err(format!("volume {vol} ({name}) already exists").into());
        }
        if vol == u32::MAX {
            // next_volume_id (vol + 1) would overflow.
            return Err(format!("volume id {vol} out of range").into());
        }
        if !size.is_multiple_of(BLOCK_SIZE) {
            return Err(format!("volume size {size} not a multiple of {BLOCK_SIZE}").into());
        }
        Ok(())
    }

    fn apply_snapshot_op(&mut self, op: &Op, freed: &mut Freed) -> Result<(), StateError> {
        match op {
            Op::SnapCreate { vol, name, created } => self.snap_create(*vol, name, *created),
            Op::SnapDelete { vol, epoch } => self.snap_delete(*vol, *epoch, freed),
            Op::Rollback { vol, epoch } => self.rollback(*vol, *epoch, freed),
            Op::CloneCreate { vol, origin_vol, origin_epoch, name } => {
                self.clone_create(*vol, Origin { vol: *origin_vol, epoch: *origin_epoch }, name)
            }
            Op::Materialize { vol, snap, lba, len, pba } => self.materialize(*vol, *snap, *lba, *len, *pba),
            Op::Relocate { vol, snap, lba, len, from, to } => {
                self.relocate(*vol, *snap, (*lba, *len), (*from, *to), freed)
            }
            Op::CloneDetach { vol } => {
                let v = self.volume_mut(*vol, "detach")?;
                if v.origin.is_none() || v.origin_blocks() != 0 {
                    return Err(format!("volume {vol} is not a fully materialized clone").into());
                }
                if let Some(o) = v.origin.take() {
                    self.clones.remove(&(o.vol, o.epoch, *vol));
                }
                Ok(())
            }
            Op::Map { .. }
            | Op::Unmap { .. }
            | Op::VolCreate { .. }
            | Op::VolResize { .. }
            | Op::VolDelete { .. }
            | Op::VolPlacement { .. }
            | Op::VolRole { .. }
            | Op::VolQuota { .. }
            | Op::PoolOvercommit { .. }
            | Op::VolDevices { .. }
            | Op::VolStripe { .. }
            | Op::VolParity { .. }
            | Op::Sums { .. }
            | Op::GroupSums { .. }
            | Op::Regions { .. } => {
                unreachable!("volume and pool ops are applied by State::apply")
            }
        }
    }

    fn snap_create(&mut self, vol: u32, name: &str, created: u64) -> Result<(), StateError> {
        validate_name(name)?;
        let epoch = self.epoch;
        let v = self.volume_mut(vol, "snapshot")?;
        if v.snapshot_named(name).is_some() {
            return Err(format!("volume {} already has a snapshot {name}", v.name).into());
        }
        if v.snapshots.len() >= MAX_SNAPSHOTS as usize {
            return Err(format!("volume {} has {MAX_SNAPSHOTS} snapshots already", v.name).into());
        }
        let referenced = v.map.physical_blocks();
        let dead = ExtentMap::new(self.store.clone(), tree_id::dead_list(epoch));
        let v = self.volumes.get_mut(&vol).ok_or(format!("snapshot on unknown volume {vol}"))?;
        let snap = Snapshot { name: name.to_string(), epoch, size: v.size, created, referenced, dead };
        v.snapshots.push(snap);
        self.epoch += 1;
        Ok(())
    }

    /// Delete snapshot `epoch` of `vol`: its dead list's entries born after
    /// the previous snapshot are seen by no one and freed; the others are
    /// still seen by the previous snapshot and join its dead list. Cost: the
    /// size of that dead list, not of the volume.
    fn snap_delete(&mut self, vol: u32, epoch: u64, freed: &mut Freed) -> Result<(), StateError> {
        if let Some(c) = self.clones_of(vol, Some(epoch)).first() {
            return Err(format!("snapshot {epoch} of volume {vol} has clone {}", c.name).into());
        }
        let v = self.volume_mut(vol, "snapshot delete")?;
        let i = v.snapshot_index(epoch).ok_or(format!("volume {vol} has no snapshot at epoch {epoch}"))?;
        let mut gone = v.snapshots.remove(i);
        let mut prev = i.checked_sub(1).map(|p| &mut v.snapshots[p]);
        for (lba, e) in gone.dead.clear()? {
            match prev {
                Some(ref mut p) if e.birth <= p.epoch => {
                    let twice = p.dead.insert(lba, e.len, e.pba, e.birth)?;
                    if !twice.is_empty() {
                        return Err(StateError::Invariant(format!("block {lba} alive twice at epoch {}", p.epoch)));
                    }
                }
                _ => free(lba, e, freed),
            }
        }
        let nodes = gone.dead.take_superseded();
        self.retired_nodes.extend(nodes);
        Ok(())
    }

    /// Roll the head back to the newest snapshot: what was born since is
    /// freed, what died since comes back. Cost: a scan of the head.
    fn rollback(&mut self, vol: u32, epoch: u64, freed: &mut Freed) -> Result<(), StateError> {
        let v = self.volume_mut(vol, "rollback")?;
        if v.shared_epoch() != Some(epoch) {
            let what = format!("rollback of volume {vol} to epoch {epoch}, which is not its newest snapshot");
            return Err(what.into());
        }
        let mut newer: Vec<(u64, u64)> = Vec::new();
        v.map.for_each_from(0, &mut |lba, e| {
            if e.birth > epoch {
                newer.push((lba, e.len));
            }
            true
        })?;
        for (lba, len) in newer {
            v.map.remove(lba, len)?.into_iter().for_each(|(l, e)| free(l, e, freed));
        }
        let snap = v.snapshots.last_mut().ok_or("no snapshot")?;
        let back = snap.dead.clear()?;
        v.size = snap.size;
        let tail = v.map.remove(v.blocks(), u64::MAX - v.blocks())?;
        if !tail.is_empty() {
            return Err(StateError::Invariant(format!("volume {vol}: head mapped past its snapshot's size")));
        }
        for (lba, e) in back {
            let twice = v.map.insert(lba, e.len, e.pba, e.birth)?;
            if !twice.is_empty() {
                return Err(StateError::Invariant(format!("volume {vol}: rollback found block {lba} mapped twice")));
            }
        }
        Ok(())
    }

    fn clone_create(&mut self, vol: u32, origin: Origin, name: &str) -> Result<(), StateError> {
        let o = self.volume(origin.vol).ok_or(format!("clone of unknown volume {}", origin.vol))?;
        let snap = o.snapshots.iter().find(|s| s.epoch == origin.epoch);
        let size = snap.ok_or(format!("clone of unknown snapshot {} of volume {}", origin.epoch, o.name))?.size;
        if self.clone_depth(origin.vol) + 1 > MAX_CLONE_DEPTH {
            return Err(format!(
                "clone of {} would be {} generations deep (at most {MAX_CLONE_DEPTH})",
                o.name,
                MAX_CLONE_DEPTH + 1
            )
            .into());
        }
        self.check_new_volume(vol, name, size)?;
        // A clone places its data as its origin volume does, on the same
        // members.
        let (placement, devices, stripe, parity) = (o.placement, o.devices, o.stripe, o.parity);
        let mut v = Volume::new(&self.store, vol, name.to_string(), size);
        v.origin = Some(origin);
        v.placement = placement;
        v.devices = devices;
        v.stripe = stripe;
        // A clone keeps its origin's parity: its parity area shows the
        // origin's too, so every row stays whole.
        v.parity = parity;
        if size > 0 {
            v.map.insert(0, v.blocks(), Pba::origin(0), 0)?;
        }
        self.insert_volume(v);
        self.next_volume_id = self.next_volume_id.max(vol + 1);
        Ok(())
    }

    /// Move blocks [lba, lba+len) of the head (`snap` = 0) or of snapshot
    /// `snap`'s dead list from physical `from` to `to`, same birth. They
    /// must be exactly one run at `from`: a block is held by one entry of
    /// one map (sharing is by epochs, clones read through markers), so
    /// every view that shows it now finds it at `to`.
    fn relocate(
        &mut self,
        vol: u32,
        snap: u64,
        (lba, len): (u64, u64),
        (from, to): (u64, u64),
        freed: &mut Freed,
    ) -> Result<(), StateError> {
        check_physical(from, len)?;
        check_physical(to, len)?;
        if Pba(from).is_origin() || Pba(to).is_origin() || from == to {
            return Err(format!("relocate of {len} blocks from {} to {}", Pba(from), Pba(to)).into());
        }
        let v = self.volume_mut(vol, "relocate")?;
        let map = if snap == 0 {
            check_range(v, lba, len)?;
            &mut v.map
        } else {
            let i = v.snapshot_index(snap).ok_or(format!("volume {vol} has no snapshot at epoch {snap}"))?;
            // A dead list holds what its snapshot saw: inside the
            // snapshot's size, which a shrunk head may no longer cover
            // (such a Relocate needs incompat EVACUATION, see FORMAT.md).
            // (A parity volume's parity area follows its data rows.)
            let blocks = map_blocks(v.snapshots[i].size.div_ceil(BLOCK_SIZE) * BLOCK_SIZE, v.parity);
            if lba.checked_add(len).is_none_or(|end| len == 0 || end > blocks) {
                return Err(
                    format!("blocks {lba}+{len} outside snapshot {snap} of volume {vol} ({blocks} blocks)").into()
                );
            }
            &mut v.snapshots[i].dead
        };
        let birth = match map.lookup(lba, len, 2)?.as_slice() {
            [Segment::Mapped { pba, birth, len: l, .. }] if *l == len && *pba == Pba(from) => *birth,
            _ => return Err(format!("volume {vol}: blocks {lba}+{len} are not one run at {}", Pba(from)).into()),
        };
        map.remove(lba, len)?;
        let twice = map.insert(lba, len, Pba(to), birth)?;
        if !twice.is_empty() {
            return Err(StateError::Invariant(format!("volume {vol}: block {lba} mapped twice after a relocate")));
        }
        freed.push((Pba(from), len));
        Ok(())
    }

    /// Replace an origin marker (in the head, or in snapshot `snap`'s dead
    /// list) by a private copy of the origin's data, same birth.
    fn materialize(&mut self, vol: u32, snap: u64, lba: u64, len: u64, pba: u64) -> Result<(), StateError> {
        let v = self.volume_mut(vol, "materialize")?;
        // Origin markers and copies are block ranges of 48-bit block numbers.
        if lba > BLOCK_MASK {
            return Err(format!("volume {vol}: origin marker at block {lba} exceeds 48-bit block numbers").into());
        }
        check_physical(lba, len)?;
        if pba != 0 {
            check_physical(pba, len)?;
        }
        let upto = if snap == 0 { v.snapshots.len() } else { v.snapshot_index(snap).ok_or("unknown snapshot")? + 1 };
        let map = if snap == 0 { &mut v.map } else { &mut v.snapshots[upto - 1].dead };
        let here = map.lookup(lba, len, 2)?;
        let birth = match here.as_slice() {
            [Segment::Mapped { pba: p, birth, len: l, .. }] if *l == len && *p == Pba::origin(lba) => *birth,
            _ => return Err(format!("volume {vol}: blocks {lba}+{len} are not an origin marker").into()),
        };
        map.remove(lba, len)?;
        if pba != 0 {
            map.insert(lba, len, Pba(pba), birth)?;
            // The copy is now own space every snapshot up to there shows.
            v.snapshots[..upto].iter_mut().for_each(|s| s.referenced += len);
        }
        Ok(())
    }
}

/// A physical range `[pba, pba+len)` stays within its device's 48-bit
/// block numbers (`Pba` arithmetic relies on it); only damaged metadata
/// names one that does not.
pub(crate) fn check_physical(pba: u64, len: u64) -> Result<(), String> {
    let p = Pba(pba & !BLOCK_MASK);
    match (pba & BLOCK_MASK).checked_add(len) {
        // The end itself must be a valid block number: merging computes it.
        Some(end) if end <= BLOCK_MASK => Ok(()),
        _ => Err(format!("physical range {}:{}+{len} exceeds 48-bit block numbers", p.device(), pba & BLOCK_MASK)),
    }
}

fn check_range(v: &Volume, lba: u64, len: u64) -> Result<(), String> {
    match lba.checked_add(len) {
        Some(end) if len > 0 && end <= v.blocks() => Ok(()),
        _ => Err(format!("blocks {lba}+{len} outside volume {} of {} blocks", v.id, v.blocks())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply_all(ops: &[Op]) -> Result<State, String> {
        let mut state = State::default();
        let mut freed = Freed::new();
        for op in ops {
            state.apply(op, &mut freed).map_err(|e| e.to_string())?;
        }
        Ok(state)
    }

    /// The clone index and the kept entry count follow every op that
    /// changes them (a refused one too) and agree with a scan of every
    /// volume.
    #[test]
    fn clone_index_and_entry_count_follow_the_ops() {
        let mut state = State::default();
        let mut freed = Freed::new();
        let mut step = |state: &mut State, op: Op| {
            let r = state.apply(&op, &mut freed).map_err(|e| e.to_string());
            assert_eq!(state.index_problems(), Vec::<String>::new(), "after {op:?}");
            r
        };
        let clones = |state: &State, epoch| state.clones_of(1, epoch).iter().map(|c| c.id).collect::<Vec<_>>();
        step(&mut state, Op::VolCreate { vol: 1, size: 1 << 20, name: "v".into() }).unwrap();
        step(&mut state, Op::Map { vol: 1, lba: 0, len: 4, pba: 100, birth: 1 }).unwrap();
        step(&mut state, Op::SnapCreate { vol: 1, name: "s".into(), created: 0 }).unwrap();
        step(&mut state, Op::Map { vol: 1, lba: 2, len: 1, pba: 200, birth: 2 }).unwrap();
        // Head: [0,2) [2,3) [3,4); dead list of s: [2,3).
        assert_eq!(state.extent_count(), 4);
        // A second snapshot: a write's replaced block goes to its dead list.
        step(&mut state, Op::SnapCreate { vol: 1, name: "t".into(), created: 0 }).unwrap();
        step(&mut state, Op::Map { vol: 1, lba: 0, len: 1, pba: 201, birth: 3 }).unwrap();
        step(&mut state, Op::Unmap { vol: 1, lba: 3, len: 1 }).unwrap();
        step(&mut state, Op::CloneCreate { vol: 2, origin_vol: 1, origin_epoch: 1, name: "c".into() }).unwrap();
        step(&mut state, Op::CloneCreate { vol: 3, origin_vol: 1, origin_epoch: 1, name: "d".into() }).unwrap();
        assert_eq!(
            (clones(&state, None), clones(&state, Some(1)), clones(&state, Some(2))),
            (vec![2, 3], vec![2, 3], vec![])
        );
        let refused = step(&mut state, Op::VolDelete { vol: 1 }).unwrap_err();
        assert!(refused.contains("has clone c"), "{refused}");
        step(&mut state, Op::Materialize { vol: 2, snap: 0, lba: 0, len: 256, pba: 300 }).unwrap();
        step(&mut state, Op::CloneDetach { vol: 2 }).unwrap();
        assert_eq!(clones(&state, None), vec![3]);
        step(&mut state, Op::VolDelete { vol: 3 }).unwrap();
        assert!(clones(&state, None).is_empty());
        step(&mut state, Op::SnapDelete { vol: 1, epoch: 1 }).unwrap();
        step(&mut state, Op::VolDelete { vol: 1 }).unwrap();
        assert_eq!(state.extent_count(), state.volume(2).map_or(0, Volume::extent_count));
    }

    /// Found by fuzz/format_ops: a Map born before the current epoch (no
    /// live pool writes one) moved the block it replaced to a snapshot's
    /// dead list while the new entry stayed in the head as if the snapshot
    /// had seen it; a rollback then met the block twice and panicked.
    /// Replay now refuses the Map.
    /// Found by fuzz/format_ops: a Map or Materialize whose physical range
    /// runs past 48-bit block numbers panicked in `Pba::offset_by` when the
    /// extent map tried to merge it with a neighbour.
    #[test]
    fn physical_range_past_48_bits_is_refused() {
        let mut ops = vec![
            Op::VolCreate { vol: 1, size: 1 << 20, name: "v".into() },
            Op::Map { vol: 1, lba: 0, len: 2, pba: BLOCK_MASK - 2, birth: 1 },
        ];
        assert!(apply_all(&ops).is_ok());
        ops[1] = Op::Map { vol: 1, lba: 0, len: 2, pba: BLOCK_MASK - 1, birth: 1 };
        let err = apply_all(&ops).unwrap_err();
        assert!(err.contains("48-bit"), "{err}");
        let ops = [
            Op::VolCreate { vol: 1, size: 1 << 20, name: "v".into() },
            Op::SnapCreate { vol: 1, name: "s".into(), created: 0 },
            Op::CloneCreate { vol: 2, origin_vol: 1, origin_epoch: 1, name: "c".into() },
            Op::Materialize { vol: 2, snap: 0, lba: 0, len: 1, pba: BLOCK_MASK },
        ];
        let err = apply_all(&ops).unwrap_err();
        assert!(err.contains("48-bit"), "{err}");
        assert!(apply_all(&ops[..3]).is_ok());
    }

    /// VolDelete skips its O(volumes) scans where they cannot find
    /// anything (`drop_volume`); the refusals they exist for still hold:
    /// a volume whose snapshot has a clone, a file volume owning an
    /// object; an object and a plain volume without snapshots go.
    #[test]
    fn vol_delete_refusals_survive_the_skipped_scans() {
        let file_and_object = [
            Op::VolCreate { vol: 1, size: 1 << 20, name: "fs".into() },
            Op::VolRole { vol: 1, role: VolumeRole::FileVolume },
            Op::VolCreate { vol: 2, size: 1 << 20, name: "obj".into() },
            Op::VolRole { vol: 2, role: VolumeRole::Object { owner: 1 } },
        ];
        let mut ops = file_and_object.to_vec();
        ops.push(Op::VolDelete { vol: 1 });
        let err = apply_all(&ops).unwrap_err();
        assert!(err.contains("still owns object 2"), "{err}");
        ops.pop();
        ops.extend([Op::VolDelete { vol: 2 }, Op::VolDelete { vol: 1 }]);
        let state = apply_all(&ops).expect("the object, then its file volume");
        assert!(state.volumes.is_empty());

        let mut ops = vec![
            Op::VolCreate { vol: 1, size: 1 << 20, name: "v".into() },
            Op::SnapCreate { vol: 1, name: "s".into(), created: 0 },
            Op::CloneCreate { vol: 2, origin_vol: 1, origin_epoch: 1, name: "c".into() },
            Op::VolDelete { vol: 1 },
        ];
        let err = apply_all(&ops).unwrap_err();
        assert!(err.contains("has clone c"), "{err}");
        ops.pop();
        ops.extend([Op::VolDelete { vol: 2 }, Op::VolDelete { vol: 1 }]);
        assert!(apply_all(&ops).expect("the clone, then its origin").volumes.is_empty());
    }

    /// Found by fuzz/format_ops: VolCreate (or CloneCreate) of id u32::MAX
    /// overflowed `next_volume_id = vol + 1`.
    #[test]
    fn volume_id_u32_max_is_refused() {
        let err = apply_all(&[Op::VolCreate { vol: u32::MAX, size: 0, name: "v".into() }]).unwrap_err();
        assert!(err.contains("out of range"), "{err}");
        let ops = [
            Op::VolCreate { vol: 1, size: 1 << 20, name: "v".into() },
            Op::SnapCreate { vol: 1, name: "s".into(), created: 0 },
            Op::CloneCreate { vol: u32::MAX, origin_vol: 1, origin_epoch: 1, name: "c".into() },
        ];
        assert!(apply_all(&ops).unwrap_err().contains("out of range"));
    }

    #[test]
    fn map_born_in_an_older_epoch_is_refused() {
        let mut ops = vec![
            Op::VolCreate { vol: 1, size: 1 << 20, name: "v".into() },
            Op::Map { vol: 1, lba: 10, len: 16, pba: 300, birth: 1 },
            Op::SnapCreate { vol: 1, name: "s".into(), created: 0 },
        ];
        let state = apply_all(&ops).unwrap();
        assert_eq!(state.epoch, 2);
        ops.push(Op::Map { vol: 1, lba: 10, len: 1, pba: 500, birth: 0 });
        let err = apply_all(&ops).unwrap_err();
        assert!(err.contains("born in epoch 0"), "{err}");
        // The same write born now is fine, and so is rolling it back.
        ops.pop();
        ops.push(Op::Map { vol: 1, lba: 10, len: 1, pba: 500, birth: 2 });
        ops.push(Op::Rollback { vol: 1, epoch: 1 });
        let state = apply_all(&ops).unwrap();
        assert_eq!(state.volume(1).unwrap().map.extent_count(), 1);
    }
}
