//! Store checkpoints (format 2): every tree of the pool (volume heads,
//! snapshot dead lists, data checksums, each device's free space) is
//! written copy-on-write, only the nodes changed since the last
//! checkpoint, and a catalog (docs/FORMAT.md *Catalog*) records their
//! roots beside the volume and snapshot lists. Three steps, so writers
//! wait only for the first and the last, each O(trees):
//!
//! 1. [`freeze`] under the pool lock: a second reference to every root,
//!    and the node blocks changes replaced since the last freeze;
//! 2. [`FrozenPool::write`] with no pool lock: the dirty nodes, children
//!    first, to blocks the commit allocates from the live space maps;
//! 3. [`adopt`] under the pool lock once the superblock is durable: the
//!    nodes written become clean in the live trees.
//!
//! Opening reads the catalog, opens each tree at its root (nodes are read
//! on demand), and puts the space maps right ([`open_space`]).

use crate::error::StateError;
use crate::map::extent_map::{tree_id, ExtentMap, MapCounts};
use crate::map::state::{validate_name, Origin, Snapshot, State, Volume, MAX_CLONE_DEPTH};
use crate::map::sums::BlockSums;
use crate::space::Space;
use std::collections::HashMap;
use std::sync::Arc;
use tarn_format::catalog::{Catalog, MapRecord, Root, SnapshotEntry, SpaceEntry, VolumeEntry, MAX_INLINE_EXTENTS};
use tarn_format::node::{ExtentValue, LeafValue, RangeValue};
use tarn_format::placement::PolicyCode;
use tarn_format::role::VolumeRole;
use tarn_format::{Pba, BLOCK_SIZE};
use tarn_store::{
    Fills, Frozen, FrozenChanges, FrozenSums, Merged, NodeAlloc, RootRef, SpaceMap, Store, StoreError, Written,
};

type Result<T> = std::result::Result<T, StateError>;

/// A volume map as frozen, with the counts the catalog records.
pub(crate) struct FrozenMap {
    tree: u64,
    frozen: FrozenChanges<ExtentValue>,
    counts: MapCounts,
    /// At most this many extents are kept in the catalog instead of a tree
    /// (a snapshot's dead list in a pool with INLINE_DEAD_LISTS; 0: never).
    inline_max: usize,
    /// Negative control of the crash simulation: an inline list loses its
    /// last entry (`OpenOptions::control_inline_drops_entry`).
    control_drop: bool,
}

/// Whether a checkpoint keeps small dead lists in its catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InlineDead {
    /// The pool lacks INLINE_DEAD_LISTS: every dead list is a tree.
    Off,
    On,
    /// A negative control's defect: each inline list drops its last entry.
    ControlDropLast,
}

struct FrozenSnapshot {
    epoch: u64,
    size: u64,
    created: u64,
    referenced: u64,
    name: String,
    dead: FrozenMap,
}

struct FrozenVolume {
    id: u32,
    size: u64,
    name: String,
    origin: Option<(u32, u64)>,
    placement: Option<PolicyCode>,
    role: Option<VolumeRole>,
    quota: Option<u64>,
    devices: u16,
    stripe: Option<tarn_format::stripe::Stripe>,
    parity: Option<tarn_format::stripe::Parity>,
    head: FrozenMap,
    snapshots: Vec<FrozenSnapshot>,
}

struct FrozenSpace {
    frozen: Frozen<RangeValue>,
    free_blocks: u64,
    cursor: u64,
}

/// The pool's trees as they were at one instant (step 1).
pub(crate) struct FrozenPool {
    pub seq: u64,
    epoch: u64,
    next_volume_id: u32,
    overcommit_milli: Option<u32>,
    volumes: Vec<FrozenVolume>,
    sums: FrozenSums,
    spaces: Vec<FrozenSpace>,
    /// Node blocks replaced before the freeze: free once this checkpoint is durable.
    pub superseded: Vec<Pba>,
    /// Data blocks allocated to writes not mapped at the freeze.
    pub inflight: Vec<(Pba, u64)>,
}

fn freeze_map(map: &mut ExtentMap, superseded: &mut Vec<Pba>, taken: Vec<Pba>, inline: InlineDead) -> FrozenMap {
    superseded.extend(taken);
    let inline_max = if inline == InlineDead::Off { 0 } else { MAX_INLINE_EXTENTS as usize };
    let control_drop = inline == InlineDead::ControlDropLast;
    FrozenMap { tree: map.tree_id(), frozen: map.freeze(), counts: map.counts(), inline_max, control_drop }
}

/// Step 1, under the pool lock (O(trees)). `inline`: whether small dead
/// lists stay in the catalog (the pool has INLINE_DEAD_LISTS).
pub(crate) fn freeze(state: &mut State, space: &mut Space, seq: u64, inline: InlineDead) -> FrozenPool {
    let mut superseded = Vec::new();
    let mut volumes = Vec::with_capacity(state.volumes.len());
    for v in state.volumes.values_mut() {
        let taken = v.map.take_superseded();
        let head = freeze_map(&mut v.map, &mut superseded, taken, InlineDead::Off);
        let mut snapshots = Vec::with_capacity(v.snapshots.len());
        for s in v.snapshots.iter_mut() {
            let taken = s.dead.take_superseded();
            let dead = freeze_map(&mut s.dead, &mut superseded, taken, inline);
            let (epoch, size, created, referenced, name) = (s.epoch, s.size, s.created, s.referenced, s.name.clone());
            snapshots.push(FrozenSnapshot { epoch, size, created, referenced, name, dead });
        }
        let origin = v.origin.map(|o| (o.vol, o.epoch));
        let (id, size, name, placement, role, quota) = (v.id, v.size, v.name.clone(), v.placement, v.role, v.quota);
        let (devices, stripe, parity) = (v.devices, v.stripe, v.parity);
        volumes.push(FrozenVolume {
            id,
            size,
            name,
            origin,
            placement,
            role,
            quota,
            devices,
            stripe,
            parity,
            head,
            snapshots,
        });
    }
    superseded.append(&mut state.retired_nodes);
    superseded.extend(state.sums.take_superseded());
    superseded.append(&mut space.superseded);
    space.restart_metadata_cursor();
    let spaces = space
        .devices
        .iter()
        .map(|d| FrozenSpace { frozen: d.tree.freeze(), free_blocks: d.free_blocks, cursor: d.cursor })
        .collect();
    FrozenPool {
        seq,
        epoch: state.epoch,
        next_volume_id: state.next_volume_id,
        overcommit_milli: state.overcommit_milli,
        volumes,
        sums: state.sums.freeze(),
        spaces,
        superseded,
        inflight: space.inflight.iter().map(|(&pba, &len)| (Pba(pba), len)).collect(),
    }
}

/// What step 2 wrote.
#[derive(Default)]
pub(crate) struct WrittenTrees {
    /// Trees written as frozen (checksums, space maps), by tree id.
    trees: HashMap<u64, Written>,
    /// Volume maps merged with their buffered changes, by tree id.
    merged: HashMap<u64, Merged>,
    /// Dead lists kept in the catalog (no node written), by tree id.
    inline: HashMap<u64, Vec<(u64, ExtentValue)>>,
}

impl WrittenTrees {
    /// Node blocks the merges replaced: free once this checkpoint is durable.
    pub fn merge_superseded(&self) -> impl Iterator<Item = Pba> + '_ {
        self.merged.values().flat_map(|m| m.superseded.iter().copied())
    }
}

fn root(r: RootRef) -> Root {
    Root { pba: r.pba.0, crc: r.crc, level: r.level }
}

fn write_tree<V: LeafValue>(
    store: &Store,
    alloc: &mut dyn NodeAlloc,
    frozen: &Frozen<V>,
    tree: u64,
    generation: u64,
    out: &mut WrittenTrees,
) -> std::result::Result<Root, StoreError> {
    let written = out.trees.entry(tree).or_default();
    Ok(root(frozen.write(store, alloc, generation, written)?))
}

impl FrozenPool {
    /// Step 2, with no pool lock: write every dirty node; returns the
    /// catalog (block lists left for the caller) and what was written.
    pub fn write(&self, store: &Store, alloc: &mut dyn NodeAlloc) -> Result<(Catalog, WrittenTrees)> {
        let generation = self.seq;
        let mut out = WrittenTrees::default();
        let mut map = |m: &FrozenMap, out: &mut WrittenTrees| -> std::result::Result<MapRecord, StoreError> {
            let record = |root, c: MapCounts| MapRecord {
                root,
                mapped_blocks: c.mapped_blocks,
                origin_blocks: c.origin_blocks,
                extents: c.extents,
            };
            if let Some((entries, counts)) = inline_entries(m) {
                out.inline.insert(m.tree, entries);
                return Ok(record(Root::default(), counts));
            }
            let merged = m.frozen.write(store, alloc, generation)?;
            let root = root(merged.root);
            out.merged.insert(m.tree, merged);
            Ok(record(root, m.counts))
        };
        let mut volumes = Vec::with_capacity(self.volumes.len());
        for v in &self.volumes {
            let head = map(&v.head, &mut out)?;
            let mut snapshots = Vec::with_capacity(v.snapshots.len());
            for s in &v.snapshots {
                let dead = map(&s.dead, &mut out)?;
                let (epoch, size, created, referenced) = (s.epoch, s.size, s.created, s.referenced);
                let inline = out.inline.get(&s.dead.tree).cloned().unwrap_or_default();
                snapshots.push(SnapshotEntry { epoch, size, created, referenced, name: s.name.clone(), dead, inline });
            }
            volumes.push(VolumeEntry {
                id: v.id,
                size: v.size,
                name: v.name.clone(),
                origin: v.origin,
                placement: v.placement,
                role: v.role,
                quota: v.quota,
                devices: v.devices,
                stripe: v.stripe,
                parity: v.parity,
                head,
                snapshots,
            });
        }
        let merged = self.sums.write(store, alloc, generation)?;
        let sums = root(merged.root);
        out.merged.insert(tree_id::SUMS, merged);
        let mut spaces = Vec::with_capacity(self.spaces.len());
        for (i, s) in self.spaces.iter().enumerate() {
            let root = write_tree(store, alloc, &s.frozen, tree_id::space(i as u16), generation, &mut out)?;
            spaces.push(SpaceEntry { root, free_blocks: s.free_blocks, cursor: s.cursor });
        }
        let catalog = Catalog {
            seq: self.seq,
            epoch: self.epoch,
            next_volume_id: self.next_volume_id,
            generation,
            spaces,
            sums,
            volumes,
            overcommit_milli: self.overcommit_milli,
            ..Default::default()
        };
        Ok((catalog, out))
    }
}

/// A dead list small enough to stay in the catalog: its entries, which
/// must agree with the counts frozen with it (else it is written as a tree,
/// as any map is). None for an empty list: an empty root says it.
fn inline_entries(m: &FrozenMap) -> Option<(Vec<(u64, ExtentValue)>, MapCounts)> {
    let mut entries = m.frozen.small(m.inline_max).filter(|e| !e.is_empty())?;
    let counts = |e: &[(u64, ExtentValue)]| MapCounts {
        mapped_blocks: e.iter().map(|x| x.1.len).sum(),
        origin_blocks: e.iter().filter(|x| Pba(x.1.pba).is_origin()).map(|x| x.1.len).sum(),
        extents: e.len() as u64,
    };
    if counts(&entries) != m.counts {
        let c = counts(&entries);
        log::error!("dead list {:#x}: entries {c:?} against counts {:?}: written as a tree", m.tree, m.counts);
        return None;
    }
    if m.control_drop {
        entries.pop();
        if entries.is_empty() {
            return None;
        }
    }
    let c = counts(&entries);
    Some((entries, c))
}

/// Step 3, under the pool lock, once the checkpoint is durable. Returns
/// the blocks written that no live tree uses (replaced meanwhile, or
/// their tree is gone): free once the *next* checkpoint is durable; and
/// the clean nodes for the cache, to insert once the lock is released.
pub(crate) fn adopt(
    state: &mut State,
    space: &mut Space,
    frozen: FrozenPool,
    mut written: WrittenTrees,
) -> (Vec<Pba>, Fills, Retired) {
    let mut left = Vec::new();
    let mut fills = Fills::default();
    let FrozenPool { volumes, sums, spaces, .. } = frozen;
    for v in &volumes {
        let live = state.volumes.get_mut(&v.id).filter(|lv| lv.map.tree_id() == v.head.tree);
        adopt_map(live.map(|lv| &mut lv.map), &v.head, &mut written);
        for s in &v.snapshots {
            let snap = state.volumes.get_mut(&v.id).and_then(|lv| lv.snapshots.iter_mut().find(|x| x.epoch == s.epoch));
            adopt_map(snap.map(|ls| &mut ls.dead), &s.dead, &mut written);
        }
    }
    let mut take = |tree: u64| written.trees.remove(&tree).unwrap_or_default();
    let merged = written.merged.remove(&tree_id::SUMS).unwrap_or_default();
    if !state.sums.adopt(&sums, &merged) {
        log::error!("the checksum tree changed during its checkpoint: {} node blocks leaked", merged.nodes);
    }
    let store = state.store.clone();
    for (i, s) in spaces.into_iter().enumerate() {
        let mut w = take(tree_id::space(i as u16));
        left.extend(space.devices[i].tree.adopt(&store, s.frozen, &mut w));
        fills.extend(w.take_fills());
    }
    // Trees that vanished between freeze and adopt (none expected beyond the above).
    written.trees.into_values().for_each(|w| left.extend(w.into_blocks()));
    (left, fills, Retired { _volumes: volumes, _sums: sums })
}

/// The merged buffers, last references: dropped by the caller after the
/// pool lock (freeing a few hundred thousand buffered changes took 20-27 ms,
/// which every writer waited for).
pub(crate) struct Retired {
    _volumes: Vec<FrozenVolume>,
    _sums: FrozenSums,
}

/// The merged tree becomes the live map's base. A map cannot vanish or be
/// cleared while its merge is under way (`ExtentMap::clear` refuses, the
/// callers finish the checkpoint first); if one did, its merged nodes are
/// leaked (`pool check` reports them), never freed twice.
fn adopt_map(live: Option<&mut ExtentMap>, frozen: &FrozenMap, written: &mut WrittenTrees) {
    if let Some(entries) = written.inline.remove(&frozen.tree) {
        // Nothing was written: a map gone meanwhile leaks nothing.
        if let Some(m) = live {
            if !m.adopt_in_memory(&frozen.frozen, &entries) {
                log::error!("dead list {:#x} changed during its checkpoint", frozen.tree);
            }
        }
        return;
    }
    let Some(merged) = written.merged.remove(&frozen.tree) else { return };
    if !live.is_some_and(|m| m.adopt(&frozen.frozen, &merged)) {
        log::error!("map tree {:#x} changed during its checkpoint: {} node blocks leaked", frozen.tree, merged.nodes);
    }
}

fn bad(detail: impl std::fmt::Display) -> StateError {
    StateError::Invariant(format!("catalog: {detail}"))
}

fn open_map(store: &Arc<Store>, id: u64, m: &MapRecord) -> Result<ExtentMap> {
    let counts = MapCounts { mapped_blocks: m.mapped_blocks, origin_blocks: m.origin_blocks, extents: m.extents };
    Ok(ExtentMap::open(store.clone(), id, root_ref(m.root), counts)?)
}

/// A snapshot's dead list: a tree at its root, or kept in the catalog.
fn open_dead(store: &Arc<Store>, s: &SnapshotEntry) -> Result<ExtentMap> {
    let id = tree_id::dead_list(s.epoch);
    if s.inline.is_empty() {
        return open_map(store, id, &s.dead);
    }
    let m = &s.dead;
    let counts = MapCounts { mapped_blocks: m.mapped_blocks, origin_blocks: m.origin_blocks, extents: m.extents };
    Ok(ExtentMap::open_in_memory(store.clone(), id, &s.inline, counts))
}

pub(crate) fn root_ref(r: Root) -> RootRef {
    RootRef { pba: Pba(r.pba), crc: r.crc, level: r.level }
}

/// The pool state a catalog records: every tree opened at its root (no
/// map is read), each record checked against what replay would check.
pub(crate) fn open_state(c: &Catalog, store: Arc<Store>) -> Result<State> {
    let sums = BlockSums::open(store.clone(), root_ref(c.sums))?;
    let mut state = State {
        epoch: c.epoch,
        next_volume_id: c.next_volume_id,
        sums,
        overcommit_milli: c.overcommit_milli,
        ..State::new(store.clone())
    };
    for v in &c.volumes {
        validate_name(&v.name).map_err(bad)?;
        if v.size % BLOCK_SIZE != 0 || state.by_name.contains_key(&v.name) {
            return Err(bad(format!("volume {} ({}): size {} or name repeated", v.id, v.name, v.size)));
        }
        let mut vol = Volume {
            id: v.id,
            name: v.name.clone(),
            size: v.size,
            map: open_map(&store, tree_id::head(v.id), &v.head)?,
            snapshots: Vec::with_capacity(v.snapshots.len()),
            origin: v.origin.map(|(vol, epoch)| Origin { vol, epoch }),
            placement: v.placement,
            role: None,
            quota: v.quota,
            devices: v.devices,
            stripe: v.stripe,
            parity: v.parity,
        };
        for s in &v.snapshots {
            validate_name(&s.name).map_err(bad)?;
            vol.snapshots.push(Snapshot {
                name: s.name.clone(),
                epoch: s.epoch,
                size: s.size,
                created: s.created,
                referenced: s.referenced,
                dead: open_dead(&store, s)?,
            });
        }
        state.add_volume(vol);
    }
    // Roles after every volume is in: an object's owner may have any id.
    for v in c.volumes.iter().filter(|v| v.role.is_some()) {
        let role = v.role.ok_or_else(|| bad(format!("volume {}: role vanished", v.id)))?;
        state.set_role(v.id, role).map_err(|e| bad(e.to_string()))?;
    }
    for v in state.volumes.values() {
        if let Some(o) = v.origin {
            let ok = state.volume(o.vol).is_some_and(|ov| ov.snapshot_index(o.epoch).is_some());
            if !ok || state.clone_depth(v.id) > MAX_CLONE_DEPTH {
                return Err(bad(format!("volume {}: origin {}@{} missing or too deep", v.name, o.vol, o.epoch)));
            }
        }
    }
    Ok(state)
}

/// The space maps as the checkpoint froze them, put right: its own node
/// blocks and catalog segments (allocated after the freeze) claimed, the
/// blocks it released and those in flight at the freeze given back.
pub(crate) fn open_space(
    c: &Catalog,
    store: Arc<Store>,
    areas: &[(u64, u64)],
    catalog_pieces: &[(Pba, u64)],
) -> Result<Space> {
    if c.spaces.len() != areas.len() {
        return Err(bad(format!("{} space maps for {} devices", c.spaces.len(), areas.len())));
    }
    let mut maps = Vec::with_capacity(areas.len());
    for (i, (s, &area)) in c.spaces.iter().zip(areas).enumerate() {
        let id = tree_id::space(i as u16);
        maps.push(SpaceMap::open(id, i as u16, root_ref(s.root), s.free_blocks, area, s.cursor)?);
    }
    let mut space = Space::with_maps(store, maps);
    for &(start, len) in c.own_nodes.iter() {
        space.claim(Pba(start), len)?;
    }
    for &(pba, len) in catalog_pieces {
        space.claim(pba, len)?;
    }
    for &(start, len) in c.deferred.iter().chain(&c.inflight) {
        space.give_back(Pba(start), len)?;
    }
    Ok(space)
}

/// Blocks as sorted, coalesced ranges (catalog lists).
pub(crate) fn ranges(mut blocks: Vec<(Pba, u64)>) -> Vec<(u64, u64)> {
    blocks.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(blocks.len());
    for (pba, len) in blocks {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == pba.0 && Pba(last.0).device() == pba.device() => last.1 += len,
            _ => out.push((pba.0, len)),
        }
    }
    out
}
