//! The reference model: what each volume and snapshot must contain now,
//! what a volume must contain after a crash and which sector versions a
//! crash may mix, and which entry (version) each block shows, so that space
//! accounting and changed-block tracking can be predicted exactly.
//!
//! Entries: every write of a block creates a new entry id (a partial write
//! too: it is a read-modify-write of the whole block); a trim makes the
//! block a hole (id [`HOLE`]); a clone's unwritten block is a marker entry
//! that shows the origin snapshot's entry at the same block. Snapshots,
//! rollbacks and clones copy ids, so two views show the same physical block
//! exactly when they show the same id. Ids never move to another block.

use std::collections::{BTreeMap, HashMap};

pub const BLOCK: usize = 4096;
const SECTOR: usize = 512;

/// An entry: one version of one block.
pub type Id = u64;
/// No entry: the block is a hole.
pub const HOLE: Id = 0;
/// Longest chain of markers and ambiguous entries followed (clone depth is
/// at most 16 in the engine; ambiguity chains grow one per crash at most).
pub const MAX_CHAIN: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Hole,
    /// Own space of the volume whose views show it.
    Data,
    /// A clone's unwritten block: shows block `lba` of snapshot `snap` of
    /// volume `vol` (model uids), whatever entry that is now.
    Marker {
        vol: u64,
        snap: u64,
        lba: usize,
    },
    /// What a crash (or a partly failed operation) left ambiguous: either
    /// the same entry as `alt`, or an entry of its own (own space if
    /// `own_data`, else a hole). Both read the same and are equally
    /// allocated; only identity (space, changed blocks) is unknown.
    Maybe {
        alt: Id,
        own_data: bool,
    },
}

/// One version of a block written since the last flush.
#[derive(Debug, Clone)]
pub struct Version {
    pub data: Vec<u8>,
    /// Written (takes space) rather than trimmed.
    pub alloc: bool,
}

/// What one operation does to one block.
#[derive(Debug, Clone)]
pub struct Effect {
    pub lba: usize,
    pub data: Vec<u8>,
    pub alloc: bool,
}

#[derive(Debug, Clone)]
pub struct SnapModel {
    pub uid: u64,
    pub name: String,
    /// Exact contents: a snapshot op flushes, so nothing is ambiguous.
    pub data: Vec<u8>,
    pub ids: Vec<Id>,
}

#[derive(Debug, Clone, Default)]
pub struct VolModel {
    /// Distinguishes a volume from an earlier one of the same name.
    pub uid: u64,
    /// What reads must return now.
    pub current: Vec<u8>,
    /// What reads must return after a crash, at least (last answered flush).
    pub durable: Vec<u8>,
    /// Per block touched since that flush: every version it has held.
    pub since_flush: HashMap<usize, Vec<Version>>,
    /// Entry per block now, and at the last flush.
    pub ids: Vec<Id>,
    pub durable_ids: Vec<Id>,
    /// `current` changed beyond the blocks in `since_flush` (rollback, resize).
    reshaped: bool,
    /// Oldest first.
    pub snaps: Vec<SnapModel>,
    /// (volume uid, snapshot uid) a clone reads its unwritten blocks from.
    pub origin: Option<(u64, u64)>,
    /// Bytes of own space the volume may hold (op 22).
    pub quota: Option<u64>,
    /// Members its new data may go to (op 24; 0: any). A clone inherits.
    pub devices: u16,
    /// Keeps parity (op 21): its space holds parity units the model does
    /// not count (checked by rows after every crash instead). A clone inherits.
    pub parity: bool,
}

pub fn block(image: &[u8], b: usize) -> &[u8] {
    &image[b * BLOCK..(b + 1) * BLOCK]
}

impl VolModel {
    pub fn new(uid: u64, size: usize) -> Self {
        let ids = vec![HOLE; size / BLOCK];
        VolModel {
            uid,
            current: vec![0; size],
            durable: vec![0; size],
            durable_ids: ids.clone(),
            ids,
            ..Default::default()
        }
    }

    pub fn blocks(&self) -> usize {
        self.current.len() / BLOCK
    }

    pub fn snap(&self, name: &str) -> Option<&SnapModel> {
        self.snaps.iter().find(|s| s.name == name)
    }

    pub fn snap_index(&self, name: &str) -> Option<usize> {
        self.snaps.iter().position(|s| s.name == name)
    }

    pub fn flushed(&mut self) {
        // This runs after every flush and admin op: copy only what changed.
        if self.reshaped || self.durable.len() != self.current.len() {
            self.durable.clone_from(&self.current);
            self.durable_ids.clone_from(&self.ids);
        } else {
            for &b in self.since_flush.keys() {
                self.durable[b * BLOCK..(b + 1) * BLOCK].copy_from_slice(block(&self.current, b));
                self.durable_ids[b] = self.ids[b];
            }
        }
        self.reshaped = false;
        self.since_flush.clear();
    }

    /// A write of `data` at `off`: every block it touches gets a new
    /// version (partial blocks are read-modify-write).
    pub fn write_effects(&self, off: usize, data: &[u8]) -> Vec<Effect> {
        let end = off + data.len();
        (off / BLOCK..end.div_ceil(BLOCK))
            .map(|b| {
                let mut new = block(&self.current, b).to_vec();
                let (s, e) = ((b * BLOCK).max(off), ((b + 1) * BLOCK).min(end));
                new[s - b * BLOCK..e - b * BLOCK].copy_from_slice(&data[s - off..e - off]);
                Effect { lba: b, data: new, alloc: true }
            })
            .collect()
    }

    /// Only whole blocks inside the range are released.
    pub fn trim_effects(&self, off: usize, len: usize) -> Vec<Effect> {
        hole_effects(off.div_ceil(BLOCK), (off + len) / BLOCK)
    }

    /// Mirrors `Pool::write_zeroes`: whole blocks are unmapped unless
    /// `no_hole`, partial edges (or a range without a whole block) written.
    pub fn zero_effects(&self, off: usize, len: usize, no_hole: bool) -> Vec<Effect> {
        let end = off + len;
        let (first, last) = (off.div_ceil(BLOCK), end / BLOCK);
        if first >= last || no_hole {
            return self.write_effects(off, &vec![0; len]);
        }
        let mut out = Vec::new();
        if off < first * BLOCK {
            out.extend(self.write_effects(off, &vec![0; first * BLOCK - off]));
        }
        out.extend(hole_effects(first, last));
        if end > last * BLOCK {
            out.extend(self.write_effects(last * BLOCK, &vec![0; end - last * BLOCK]));
        }
        out
    }

    pub(crate) fn note(&mut self, e: &Effect, id: Id) {
        self.current[e.lba * BLOCK..(e.lba + 1) * BLOCK].copy_from_slice(&e.data);
        self.ids[e.lba] = id;
        self.since_flush.entry(e.lba).or_default().push(Version { data: e.data.clone(), alloc: e.alloc });
    }

    /// Check an image read back after a crash; Err names the first bad sector.
    pub fn check_after_crash(&self, image: &[u8]) -> Result<(), String> {
        if image.len() != self.durable.len() {
            return Err(format!("size {} != {}", image.len(), self.durable.len()));
        }
        for b in 0..image.len() / BLOCK {
            let got = block(image, b);
            let durable = block(&self.durable, b);
            let Some(versions) = self.since_flush.get(&b) else {
                if got != durable {
                    return Err(format!("block {b} lost flushed data"));
                }
                continue;
            };
            for s in 0..BLOCK / SECTOR {
                let sr = s * SECTOR..(s + 1) * SECTOR;
                let ok = got[sr.clone()] == durable[sr.clone()]
                    || versions.iter().any(|v| v.data[sr.clone()] == got[sr.clone()]);
                if !ok {
                    return Err(format!("block {b} sector {s} holds data never written there"));
                }
            }
        }
        Ok(())
    }

    /// Whether entry `id` at block `b` is shown by no snapshot of the volume.
    pub(crate) fn only_in_head(&self, b: usize, id: Id) -> bool {
        self.snaps.iter().all(|s| s.ids.get(b) != Some(&id))
    }
}

fn hole_effects(first: usize, end: usize) -> Vec<Effect> {
    (first..end).map(|lba| Effect { lba, data: vec![0; BLOCK], alloc: false }).collect()
}

/// Every volume by name, and every entry ever made.
#[derive(Debug, Clone)]
pub struct Model {
    pub vols: BTreeMap<String, VolModel>,
    /// The pool's overcommit ratio in thousandths (op 23).
    pub overcommit: Option<u32>,
    /// Each member's own default placement (the device table's policy
    /// byte), by index.
    pub device_placement: Vec<Option<&'static str>>,
    kinds: Vec<Kind>,
    next_uid: u64,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            vols: BTreeMap::new(),
            overcommit: None,
            device_placement: Vec::new(),
            kinds: vec![Kind::Hole],
            next_uid: 1,
        }
    }
}

impl Model {
    pub fn flushed(&mut self) {
        self.vols.values_mut().for_each(VolModel::flushed);
    }

    pub fn kind(&self, id: Id) -> Kind {
        self.kinds[id as usize]
    }

    pub(crate) fn new_id(&mut self, kind: Kind) -> Id {
        self.kinds.push(kind);
        (self.kinds.len() - 1) as Id
    }

    fn new_uid(&mut self) -> u64 {
        self.next_uid += 1;
        self.next_uid
    }

    pub fn vol(&self, name: &str) -> &VolModel {
        self.vols.get(name).expect("volume in the model")
    }

    pub(crate) fn vol_mut(&mut self, name: &str) -> &mut VolModel {
        self.vols.get_mut(name).expect("volume in the model")
    }

    pub fn by_uid(&self, uid: u64) -> Option<(&String, &VolModel)> {
        self.vols.iter().find(|(_, v)| v.uid == uid)
    }

    /// `VOL@SNAP` of a clone's origin, as the pool names it.
    pub fn origin_name(&self, v: &VolModel) -> Option<String> {
        let (vol, snap) = v.origin?;
        let (name, o) = self.by_uid(vol)?;
        Some(format!("{name}@{}", o.snaps.iter().find(|s| s.uid == snap)?.name))
    }

    /// Names of the clones whose origin is snapshot `snap` of `vol` (any
    /// snapshot if None).
    pub fn clones_of(&self, vol: u64, snap: Option<u64>) -> Vec<String> {
        let from = |o: (u64, u64)| o.0 == vol && snap.is_none_or(|s| s == o.1);
        self.vols.iter().filter(|(_, v)| v.origin.is_some_and(from)).map(|(n, _)| n.clone()).collect()
    }

    /// Generations of origins above `vol`.
    pub fn clone_depth(&self, name: &str) -> usize {
        let mut at = self.vols.get(name).and_then(|v| v.origin);
        let mut depth = 0;
        while let Some((vol, _)) = at {
            depth += 1;
            if depth > MAX_CHAIN {
                break;
            }
            at = self.by_uid(vol).and_then(|(_, v)| v.origin);
        }
        depth
    }

    /// The entry a marker shows now.
    fn marker_target(&self, vol: u64, snap: u64, lba: usize) -> Id {
        let snap = self.by_uid(vol).and_then(|(_, v)| v.snaps.iter().find(|s| s.uid == snap));
        snap.and_then(|s| s.ids.get(lba).copied()).unwrap_or(HOLE)
    }

    /// Whether the block takes space somewhere (block status "allocated").
    pub fn alloc(&self, id: Id) -> bool {
        let mut id = id;
        for _ in 0..MAX_CHAIN {
            match self.kind(id) {
                Kind::Hole => return false,
                Kind::Data => return true,
                Kind::Maybe { own_data, .. } => return own_data,
                Kind::Marker { vol, snap, lba } => id = self.marker_target(vol, snap, lba),
            }
        }
        panic!("marker chain longer than {MAX_CHAIN}")
    }

    pub fn new_volume(&mut self, name: &str, size: usize) {
        let uid = self.new_uid();
        self.vols.insert(name.to_string(), VolModel::new(uid, size));
    }

    /// An answered write, trim or zeroing: new entries, new versions.
    pub fn apply(&mut self, name: &str, effects: &[Effect]) {
        for e in effects {
            let id = if e.alloc { self.new_id(Kind::Data) } else { HOLE };
            self.vol_mut(name).note(e, id);
        }
    }

    pub fn resize(&mut self, name: &str, size: usize) {
        let v = self.vol_mut(name);
        v.current.resize(size, 0);
        v.ids.resize(size / BLOCK, HOLE);
        v.reshaped = true;
    }

    pub fn snapshot(&mut self, vol: &str, name: &str) {
        let uid = self.new_uid();
        let v = self.vol_mut(vol);
        let snap = SnapModel { uid, name: name.to_string(), data: v.current.clone(), ids: v.ids.clone() };
        v.snaps.push(snap);
    }

    pub fn delete_snapshot(&mut self, vol: &str, name: &str) {
        self.vol_mut(vol).snaps.retain(|s| s.name != name);
    }

    /// Head := the snapshot; newer snapshots are gone.
    pub fn rollback(&mut self, vol: &str, name: &str) {
        let v = self.vol_mut(vol);
        let i = v.snap_index(name).expect("snapshot in the model");
        v.snaps.truncate(i + 1);
        v.current = v.snaps[i].data.clone();
        v.ids = v.snaps[i].ids.clone();
        v.reshaped = true;
    }

    /// A clone shows the snapshot through one marker per block.
    pub fn clone_volume(&mut self, vol: &str, snap: &str, clone: &str) {
        let o = self.vol(vol);
        let s = o.snap(snap).expect("snapshot in the model");
        let (ouid, suid, data, devices, parity) = (o.uid, s.uid, s.data.clone(), o.devices, o.parity);
        let ids = (0..data.len() / BLOCK).map(|lba| self.new_id(Kind::Marker { vol: ouid, snap: suid, lba })).collect();
        let uid = self.new_uid();
        let v = VolModel {
            uid,
            current: data,
            ids,
            origin: Some((ouid, suid)),
            reshaped: true,
            devices,
            parity,
            ..Default::default()
        };
        self.vols.insert(clone.to_string(), v);
        self.vol_mut(clone).flushed();
    }

    /// Every marker becomes a private copy (a hole where the origin has
    /// none); contents stay; the clone is detached.
    pub fn flatten(&mut self, name: &str) {
        let markers: Vec<(Id, bool)> = self.markers(name).into_iter().map(|m| (m, self.alloc(m))).collect();
        let repl: HashMap<Id, Id> =
            markers.into_iter().map(|(m, data)| (m, if data { self.new_id(Kind::Data) } else { HOLE })).collect();
        self.replace(name, &repl);
        self.vol_mut(name).origin = None;
        self.settle_copies(name, &repl);
    }

    /// An ambiguous entry whose alternative is a new copy no view shows is
    /// private data either way (a flatten that ran out of space, then one
    /// that finished): plain data, so it no longer multiplies combinations.
    fn settle_copies(&mut self, name: &str, repl: &HashMap<Id, Id>) {
        let v = self.vol(name);
        let shown: std::collections::HashSet<Id> =
            v.ids.iter().chain(&v.durable_ids).chain(v.snaps.iter().flat_map(|s| &s.ids)).copied().collect();
        let copies: std::collections::HashSet<Id> = repl.values().copied().filter(|c| !shown.contains(c)).collect();
        for id in self.reachable(name) {
            if let Kind::Maybe { alt, own_data: true } = self.kind(id) {
                if alt != HOLE && copies.contains(&alt) {
                    self.kinds[id as usize] = Kind::Data;
                }
            }
        }
    }

    /// A flatten that ran out of space: each marker may or may not have
    /// been copied (now, and after a crash: a later commit may or may not
    /// have made the copies durable).
    pub fn flatten_partly(&mut self, name: &str) {
        let markers: Vec<(Id, bool)> = self.markers(name).into_iter().map(|m| (m, self.alloc(m))).collect();
        let repl: HashMap<Id, Id> =
            markers.into_iter().map(|(m, own_data)| (m, self.new_id(Kind::Maybe { alt: m, own_data }))).collect();
        self.replace(name, &repl);
    }

    /// A flatten that ran out of space, then committed: it copied markers
    /// in the order the engine walks them (the head by block, then each
    /// snapshot's dead list, oldest first; a marker the head no longer
    /// shows is in the dead list of the newest snapshot showing it) until
    /// `left` remained. Ok(false), changing nothing, if ambiguous entries
    /// hide where markers are.
    pub fn flatten_prefix(&mut self, name: &str, left: usize) -> Result<bool, String> {
        if self.reachable(name).iter().any(|&id| matches!(self.kind(id), Kind::Maybe { .. })) {
            return Ok(false);
        }
        let order = self.marker_order(name);
        let copied = order.len().checked_sub(left).ok_or(format!("{left} markers left of {}", order.len()))?;
        let copies: Vec<(Id, bool)> = order[..copied].iter().map(|&m| (m, self.alloc(m))).collect();
        let repl: HashMap<Id, Id> =
            copies.into_iter().map(|(m, data)| (m, if data { self.new_id(Kind::Data) } else { HOLE })).collect();
        self.replace(name, &repl);
        Ok(true)
    }

    fn marker_order(&self, name: &str) -> Vec<Id> {
        let v = self.vol(name);
        let is_marker = |id: Id| matches!(self.kind(id), Kind::Marker { .. });
        let mut seen = std::collections::HashSet::new();
        let mut order: Vec<(usize, usize, Id)> = Vec::new();
        let views = std::iter::once(&v.ids).chain(v.snaps.iter().rev().map(|s| &s.ids));
        // The head first, then snapshots newest first: where each marker is listed.
        for (k, ids) in views.enumerate() {
            let list = if k == 0 { 0 } else { v.snaps.len() + 1 - k };
            for (b, &id) in ids.iter().enumerate() {
                if is_marker(id) && seen.insert(id) {
                    order.push((list, b, id));
                }
            }
        }
        order.sort_unstable();
        order.into_iter().map(|(_, _, id)| id).collect()
    }

    fn markers(&self, name: &str) -> Vec<Id> {
        self.reachable(name).into_iter().filter(|&id| matches!(self.kind(id), Kind::Marker { .. })).collect()
    }

    /// Entries the volume's views show, directly or as an ambiguous entry's alternative.
    fn reachable(&self, name: &str) -> Vec<Id> {
        let v = self.vol(name);
        let mut out: Vec<Id> =
            v.ids.iter().chain(&v.durable_ids).chain(v.snaps.iter().flat_map(|s| &s.ids)).copied().collect();
        out.sort_unstable();
        out.dedup();
        let mut i = 0;
        while i < out.len() {
            if let Kind::Maybe { alt, .. } = self.kind(out[i]) {
                if !out.contains(&alt) {
                    out.push(alt);
                }
            }
            i += 1;
        }
        out
    }

    /// Substitute entries in every view of the volume and in ambiguous entries' alternatives.
    fn replace(&mut self, name: &str, repl: &HashMap<Id, Id>) {
        let mut repl = repl.clone();
        let ids = self.reachable(name);
        // An ambiguous entry that became a hole either way is a hole, which
        // may settle the entries whose alternative it is: repeat until none.
        for _ in 0..=ids.len() {
            let mut settled = false;
            for &id in &ids {
                let Kind::Maybe { alt, own_data } = self.kind(id) else { continue };
                match repl.get(&alt) {
                    Some(&HOLE) if !own_data => settled |= repl.insert(id, HOLE).is_none(),
                    Some(&r) => self.kinds[id as usize] = Kind::Maybe { alt: r, own_data },
                    None => {}
                }
            }
            if !settled {
                break;
            }
        }
        let v = self.vol_mut(name);
        let views = v.ids.iter_mut().chain(v.durable_ids.iter_mut()).chain(v.snaps.iter_mut().flat_map(|s| &mut s.ids));
        for id in views {
            if let Some(&r) = repl.get(id) {
                *id = r;
            }
        }
    }
}
