//! The pool checker: every metadata invariant, verified against the live
//! state (with I/O quiesced) or a read-only open. Checksums of every
//! structure were verified when the pool was opened; this walks the rest.

use crate::map::extent_map::ExtentMap;
use crate::map::state::{State, Volume, MAX_CLONE_DEPTH};
use crate::pool::Pool;
use crate::pool::{CheckpointSlot, Inner};
use tarn_format::{Pba, BLOCK_SIZE};
use tarn_store::{SpaceMap, Store};

#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Violated invariants: a clean pool has none.
    pub problems: Vec<String>,
    /// Things worth knowing that are not damage (an old superblock copy
    /// torn by a crash, say).
    pub notes: Vec<String>,
    pub volumes: usize,
    pub extents: usize,
    pub mapped_blocks: u64,
    pub free_blocks: u64,
    pub metadata_blocks: u64,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Who holds a physical range (for overlap messages).
#[derive(Debug, Clone)]
struct Owner {
    start: u64,
    len: u64,
    what: String,
}

/// At most this many problems are listed (the count is still exact).
const MAX_LISTED: usize = 100;

impl Pool {
    pub fn check(&self) -> CheckReport {
        self.check_with_progress(&mut |_, _| {})
    }

    /// [`Pool::check`], calling `progress(done, total)` in map entries as
    /// it walks the maps (most of its time; the space maps, checksum and
    /// node walks follow). Time and memory are proportional to metadata.
    pub fn check_with_progress(&self, progress: &mut dyn FnMut(u64, u64)) -> CheckReport {
        // Lock order everywhere: commit, then I/O gate, then pool state (the
        // committer holds the commit lock while it drains the gate).
        let ctl = self.lock_commit();
        let slot = self.lock_checkpoint();
        let _quiet = self.io_gate.write().unwrap_or_else(|p| p.into_inner());
        let inner = self.read_inner();
        let mut r = CheckReport { notes: ctl.notes.clone(), volumes: inner.state.volumes.len(), ..Default::default() };
        let mut owners: Vec<Vec<Owner>> = vec![Vec::new(); self.devices.len()];
        let total = inner.state.extent_count() as u64;
        progress(0, total);
        for v in inner.state.volumes.values() {
            check_volume_links(&inner.state, v, &mut r);
            if let Err(e) = crate::meta::checkpoint::check_versions(v) {
                problem(&mut r, e.to_string());
            }
            let lists = std::iter::once(("head".to_string(), &v.map, v.blocks(), inner.state.epoch)).chain(
                v.snapshots.iter().map(|s| {
                    (format!("snapshot {}", s.name), &s.dead, crate::map::state::map_blocks(s.size, v.parity), s.epoch)
                }),
            );
            for (list, map, blocks, max_birth) in lists {
                let what = format!("volume {} {list}", v.name);
                r.mapped_blocks += check_map(&what, map, blocks, max_birth, v.origin.is_some(), &mut owners, &mut r);
                progress((r.extents as u64).min(total), total);
            }
        }
        for msg in inner.state.index_problems() {
            problem(&mut r, msg);
        }
        metadata_owners(&inner, &slot, &mut owners, &mut r);
        for &(pba, len) in &ctl.held_frees {
            push_owner(&mut owners, pba, len, "space awaiting a checkpoint".into(), &mut r.problems);
        }
        for &(pba, len) in &inner.pending_frees {
            push_owner(&mut owners, pba, len, "space awaiting commit".into(), &mut r.problems);
        }
        for (i, ds) in inner.space.devices.iter().enumerate() {
            r.free_blocks += ds.free_blocks;
            for msg in compare_space(i, ds, &inner.space.store, &mut owners[i]) {
                problem(&mut r, msg);
            }
        }
        if self.checksums {
            check_sums(&inner.state, &mut r);
        }
        if ctl.journal.used > ctl.journal.side_blocks() {
            problem(&mut r, format!("journal uses {} of {} blocks", ctl.journal.used, ctl.journal.side_blocks()));
        }
        let data = inner.space.data_blocks();
        let pending: u64 = inner.pending_frees.iter().chain(&ctl.held_frees).map(|f| f.1).sum();
        if r.mapped_blocks + r.metadata_blocks + pending + r.free_blocks != data {
            let msg = format!(
                "space accounting: mapped {} + metadata {} + pending {} + free {} != {} data blocks",
                r.mapped_blocks, r.metadata_blocks, pending, r.free_blocks, data
            );
            problem(&mut r, msg);
        }
        r
    }
}

impl Pool {
    /// The blocks of live metadata in the data area: every tree's nodes on
    /// the devices and the catalog's segments (for fault-injection tests
    /// and tools; walks every tree).
    pub fn metadata_blocks(&self) -> crate::error::Result<Vec<(Pba, u64)>> {
        let pieces = self.lock_checkpoint().pieces.clone();
        let inner = self.read_inner();
        let mut out: Vec<(Pba, u64)> = pieces;
        let mut add = |blocks: Vec<Pba>| out.extend(blocks.into_iter().map(|p| (p, 1)));
        for v in inner.state.volumes.values() {
            add(v.map.node_blocks()?);
            for s in &v.snapshots {
                add(s.dead.node_blocks()?);
            }
        }
        add(inner.state.sums.node_blocks()?);
        for d in &inner.space.devices {
            add(d.tree.walk(&inner.space.store, &mut |_, _| {})?.blocks);
        }
        Ok(out)
    }
}

/// Blocks metadata holds: every tree's nodes, nodes replaced but not yet
/// free, the catalog; each owned once like data.
fn metadata_owners(inner: &Inner, slot: &CheckpointSlot, owners: &mut [Vec<Owner>], r: &mut CheckReport) {
    let mut own = |blocks: &[(Pba, u64)], what: &str, r: &mut CheckReport| {
        for &(pba, len) in blocks {
            r.metadata_blocks += len;
            push_owner(owners, pba, len, what.to_string(), &mut r.problems);
        }
    };
    let single = |v: &[Pba]| v.iter().map(|&p| (p, 1)).collect::<Vec<_>>();
    for (what, blocks) in slot.owned() {
        own(&blocks, what, r);
    }
    own(&single(&inner.state.retired_nodes), "node of a deleted map", r);
    own(&single(&inner.space.superseded), "replaced space-map node", r);
    own(&single(inner.state.sums.superseded()), "replaced checksum node", r);
    for v in inner.state.volumes.values() {
        let maps = std::iter::once((format!("volume {} head", v.name), &v.map))
            .chain(v.snapshots.iter().map(|s| (format!("volume {} snapshot {}", v.name, s.name), &s.dead)));
        for (what, map) in maps {
            own(&single(map.superseded()), &format!("replaced {what} node"), r);
            match map.node_blocks() {
                Ok(blocks) => own(&single(&blocks), &format!("{what} node"), r),
                Err(e) => problem(r, format!("{what}: {e}")),
            }
        }
    }
    match inner.state.sums.node_blocks() {
        Ok(blocks) => own(&single(&blocks), "checksum node", r),
        Err(e) => problem(r, format!("checksums: {e}")),
    }
    for (i, d) in inner.space.devices.iter().enumerate() {
        match d.tree.walk(&inner.space.store, &mut |_, _| {}) {
            Ok(stats) => own(&single(&stats.blocks), &format!("device {i} space-map node"), r),
            Err(e) => problem(r, format!("device {i} space map: {e}")),
        }
    }
    let inflight: Vec<(Pba, u64)> = inner.space.inflight.iter().map(|(&p, &l)| (Pba(p), l)).collect();
    own(&inflight, "data being written", r);
}

/// With data checksums, every block a map references has one.
fn check_sums(state: &State, r: &mut CheckReport) {
    let mut missing = 0u64;
    let mut first = None;
    let extents = match state.physical_extents() {
        Ok(extents) => extents,
        Err(e) => return problem(r, format!("reading the maps: {e}")),
    };
    // In runs: one tree descent per group of sums, not per block.
    const RUN: u64 = 4096;
    for (pba, len) in extents {
        for start in (0..len).step_by(RUN as usize) {
            let at = pba.offset_by(start);
            let sums = match state.sums.get_run(at, RUN.min(len - start)) {
                Ok(sums) => sums,
                Err(e) => return problem(r, format!("reading the checksums at {at}: {e}")),
            };
            for (i, _) in sums.iter().enumerate().filter(|(_, s)| s.is_none()) {
                missing += 1;
                first = first.or(Some(at.offset_by(i as u64)));
            }
        }
    }
    if let Some(at) = first {
        problem(r, format!("{missing} mapped blocks have no data checksum (first at {at})"));
    }
}

/// Snapshots in epoch order before the current epoch; a clone's origin
/// exists and its chain is not too deep.
fn check_volume_links(state: &State, v: &Volume, r: &mut CheckReport) {
    let epochs: Vec<u64> = v.snapshots.iter().map(|s| s.epoch).collect();
    if epochs.windows(2).any(|w| w[0] >= w[1]) || epochs.last().is_some_and(|&e| e >= state.epoch) {
        problem(r, format!("volume {}: snapshot epochs {epochs:?} not ascending below {}", v.name, state.epoch));
    }
    if let Some(o) = v.origin {
        let found = state.volume(o.vol).is_some_and(|ov| ov.snapshot_index(o.epoch).is_some());
        if !found || state.clone_depth(v.id) > MAX_CLONE_DEPTH {
            problem(r, format!("volume {}: origin {}@{} missing or chain too deep", v.name, o.vol, o.epoch));
        }
    }
}

/// One extent list (a head or a dead list): ordered, inside its size, born
/// in range, origin markers only in clones; returns its real blocks and
/// records their owners.
fn check_map(
    what: &str,
    map: &ExtentMap,
    blocks: u64,
    max_birth: u64,
    clone: bool,
    owners: &mut [Vec<Owner>],
    r: &mut CheckReport,
) -> u64 {
    let (mut physical, mut sum, mut prev_end) = (0, 0, 0);
    let entries = match map.entries() {
        Ok(entries) => entries,
        Err(e) => {
            problem(r, format!("{what}: {e}"));
            return 0;
        }
    };
    for (lba, e) in entries {
        r.extents += 1;
        sum += e.len;
        if e.len == 0 || lba < prev_end || lba + e.len > blocks {
            problem(r, format!("{what}: extent {lba}+{} overlaps or exceeds {blocks} blocks", e.len));
        }
        // Birth 0 marks origin markers and their copies (flattened clones).
        if e.birth > max_birth {
            problem(r, format!("{what}: extent at {lba} born in epoch {} (at most {max_birth})", e.birth));
        }
        prev_end = lba + e.len;
        if e.pba.is_origin() {
            if !clone || e.pba.block() != lba || e.birth != 0 {
                problem(r, format!("{what}: misplaced origin marker at {lba}"));
            }
            continue;
        }
        physical += e.len;
        push_owner(owners, e.pba, e.len, format!("{what} block {lba}"), &mut r.problems);
    }
    if sum != map.mapped_blocks() || physical != map.physical_blocks() {
        let msg = format!(
            "{what}: counters {}/{} != {sum}/{physical} blocks mapped",
            map.mapped_blocks(),
            map.physical_blocks()
        );
        problem(r, msg);
    }
    physical
}

fn problem(r: &mut CheckReport, msg: String) {
    if r.problems.len() < MAX_LISTED {
        r.problems.push(msg);
    }
}

fn push_owner(owners: &mut [Vec<Owner>], pba: Pba, len: u64, what: String, problems: &mut Vec<String>) {
    match owners.get_mut(usize::from(pba.device())) {
        Some(list) => list.push(Owner { start: pba.block(), len, what }),
        None => problems.push(format!("{what}: physical {pba} on a device the pool does not have")),
    }
}

/// Used ranges must not overlap each other, must lie in the data area, and
/// the free ranges must be exactly what is left.
fn compare_space(device: usize, ds: &SpaceMap, store: &Store, owners: &mut [Owner]) -> Vec<String> {
    let mut out = Vec::new();
    owners.sort_by_key(|o| o.start);
    let mut expected_free = Vec::new();
    let mut pos = ds.data_start;
    let mut last: Option<&Owner> = None;
    for o in owners.iter() {
        if o.start < ds.data_start || o.start + o.len > ds.data_end {
            out.push(format!("device {device}: {} at block {}+{} lies outside the data area", o.what, o.start, o.len));
        }
        if o.start < pos {
            let other = last.map(|l| l.what.as_str()).unwrap_or("the label area");
            out.push(format!("device {device}: {} at block {} shares space with {other}", o.what, o.start));
        } else if o.start > pos {
            expected_free.push((pos, o.start - pos));
        }
        if o.start + o.len > pos {
            pos = o.start + o.len;
            last = Some(o);
        }
    }
    if pos < ds.data_end {
        expected_free.push((pos, ds.data_end - pos));
    }
    let actual = match ds.verify(store) {
        Ok(ranges) => ranges,
        Err(e) => {
            out.push(format!("device {device}: space map: {e}"));
            return out;
        }
    };
    if out.is_empty() && actual != expected_free {
        let first = actual.iter().zip(&expected_free).find(|(a, b)| a != b);
        out.push(format!(
            "device {device}: free space disagrees with the map ({} free ranges, {} expected; first difference {:?}; {} bytes per block)",
            actual.len(),
            expected_free.len(),
            first,
            BLOCK_SIZE
        ));
    }
    out
}
