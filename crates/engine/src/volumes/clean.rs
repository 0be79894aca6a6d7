//! Cleaning physical regions (`tarn pool compact`, AoDI's reclamation of
//! the space behind an append head): free space left behind by
//! overwrites, trims and deletions is cut into holes that a sequential
//! writer cannot use whole. A pass looks at each device in regions of
//! [`CLEAN_REGION_BLOCKS`], takes those at most half used (emptiest
//! first, never the one the allocation cursor is in), and moves their
//! live blocks, in the order the maps list them, into whole free regions
//! of the same device (so per-volume device sets and stripes keep their
//! members). Each move is the evacuation's: a head window by the
//! compaction's swap (blocks the head owns are mapped anew, shared ones
//! relocated for every sharer), a snapshot's dead run by Relocate; so
//! sharing is kept and no snapshot grows. A region is freed once the
//! commit after the moves frees what they replaced.

use crate::error::{EngineError, Result};
use crate::map::state::Volume;
use crate::pool::Pool;
use crate::space::metadata_start;
use crate::space::placement::PlacementKind;
use crate::volumes::evacuate::LiveRun;
use crate::volumes::relayout::Destination;
use std::collections::{BTreeMap, BTreeSet};
use tarn_format::superblock::incompat;
use tarn_format::Pba;

/// The cleaner's region: 4 MiB, long enough that a sequential writer
/// given one runs at device speed.
pub const CLEAN_REGION_BLOCKS: u64 = 1024;

/// Regions looked at per device and pass (a pass walks every map once).
const MAX_CANDIDATES: usize = 4096;

/// What a cleaning pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanReport {
    /// Whole free regions on the devices before and after.
    pub free_regions_before: u64,
    pub free_regions_after: u64,
    /// Regions chosen (at most half used), and those of them now free.
    pub candidates: u64,
    pub regions_freed: u64,
    pub blocks_moved: u64,
    /// Stopped because the caller asked; what moved is durable.
    pub stopped: bool,
}

/// One device's free blocks per region of its data area.
struct Occupancy {
    device: usize,
    data_start: u64,
    /// Blocks per region.
    region: u64,
    free: Vec<u64>,
    /// The region the allocation cursor is in (the append head).
    head: u64,
}

impl Occupancy {
    fn whole_free(&self) -> u64 {
        self.free.iter().filter(|&&f| f == self.region).count() as u64
    }

    /// Regions at most half used, not empty, not the head's: emptiest
    /// first; none unless there are two. Moving k such regions fills at
    /// most ceil(k/2) whole ones, so two or more free at least one net,
    /// while a lone one (the last region a pass filled, say) would only
    /// move from one partly used region to another.
    fn candidates(&self) -> Vec<u64> {
        let mut c: Vec<(u64, u64)> = (0..self.free.len() as u64)
            .filter(|&r| r != self.head)
            .map(|r| (self.region - self.free[r as usize], r))
            .filter(|&(used, _)| used > 0 && used <= self.region / 2)
            .collect();
        if c.len() < 2 {
            return Vec::new();
        }
        c.sort_unstable();
        c.into_iter().take(MAX_CANDIDATES).map(|(_, r)| r).collect()
    }

    fn region_of(&self, block: u64) -> Option<u64> {
        block.checked_sub(self.data_start).map(|b| b / self.region)
    }

    fn region_end(&self, r: u64) -> u64 {
        self.data_start + (r + 1) * self.region
    }
}

/// Where a device's moved blocks go: next-fit from a whole free region.
struct Target {
    cursor: u64,
    /// Blocks left in the current whole free region.
    left: u64,
    /// Blocks moved here since the last commit: the regions they left
    /// become whole free once it is durable.
    uncommitted: u64,
}

/// A cleaning pass in progress: the regions chosen and the live runs in
/// them when it started, moved a few at a time (the idle compactor's
/// steps; a run changed since is found changed by its move and left).
pub struct CleanPass {
    region: u64,
    before: Vec<Occupancy>,
    chosen: BTreeMap<usize, BTreeSet<u64>>,
    runs: Vec<LiveRun>,
    next: usize,
    /// Per device, where moved blocks go; None once it has no whole free
    /// region left (its remaining runs stay).
    targets: BTreeMap<usize, Option<Target>>,
    pub report: CleanReport,
}

impl CleanPass {
    /// Blocks the pass set out to move.
    pub fn total_blocks(&self) -> u64 {
        self.runs.iter().map(|r| r.len).sum()
    }

    pub fn done(&self) -> bool {
        self.next >= self.runs.len()
    }
}

impl Pool {
    /// One cleaning pass over every usable device (see the module docs).
    /// `go_on(moved, total)` in blocks is asked after every move; false
    /// stops. Durable (committed) when it returns.
    pub fn clean_regions(&self, go_on: &mut dyn FnMut(u64, u64) -> bool) -> Result<CleanReport> {
        self.clean_regions_of(CLEAN_REGION_BLOCKS, go_on)
    }

    /// [`Pool::clean_regions`] with regions of `region` blocks (a power of
    /// two; the crash simulation's small pools use small ones).
    pub fn clean_regions_of(&self, region: u64, go_on: &mut dyn FnMut(u64, u64) -> bool) -> Result<CleanReport> {
        let mut pass = self.start_cleaning(region, &|_| true)?;
        let total = pass.total_blocks();
        while !pass.done() {
            self.clean_step(&mut pass, 1)?;
            if !go_on(pass.report.blocks_moved, total) {
                pass.report.stopped = !pass.done();
                break;
            }
        }
        self.finish_cleaning(pass)
    }

    /// Choose the regions to clean and list the live runs in them (walks
    /// the space maps and every map), those of volumes `volume_ok` takes.
    pub fn start_cleaning(&self, region: u64, volume_ok: &dyn Fn(u32) -> bool) -> Result<CleanPass> {
        if region == 0 || !region.is_power_of_two() {
            return Err(EngineError::InvalidArgument(format!("a cleaning region of {region} blocks")));
        }
        self.check_writable()?;
        let before = self.occupancy(region)?;
        let report =
            CleanReport { free_regions_before: before.iter().map(Occupancy::whole_free).sum(), ..Default::default() };
        let chosen: BTreeMap<usize, BTreeSet<u64>> =
            before.iter().map(|o| (o.device, o.candidates().into_iter().collect())).collect();
        let mut pass =
            CleanPass { region, before, chosen, runs: Vec::new(), next: 0, targets: BTreeMap::new(), report };
        pass.report.candidates = pass.chosen.values().map(|c| c.len() as u64).sum();
        if pass.report.candidates == 0 {
            return Ok(pass);
        }
        if self.read_inner().state.volumes.values().any(|v| !v.snapshots.is_empty() || v.origin.is_some()) {
            // Shared blocks move by Relocate: older tarns must not replay it.
            self.enable_feature(&mut self.lock_commit(), incompat::RELOCATE)?;
        }
        let keep = |pba: Pba, len: u64| in_chosen(&pass.before, &pass.chosen, pba, len);
        let runs = self.live_runs_where(&keep)?;
        pass.runs = runs.into_iter().filter(|r| volume_ok(r.vol)).collect();
        emptiest_regions_first(&pass.before, &mut pass.runs);
        Ok(pass)
    }

    /// The idle compactor's pass: 4 MiB regions; `inplace` volumes' data
    /// stays where their first writes put it.
    pub fn start_idle_cleaning(&self) -> Result<CleanPass> {
        let inplace: BTreeSet<u32> = {
            let inner = self.read_inner();
            let placed = |v: &&Volume| inner.placement_of(v) == PlacementKind::Inplace;
            inner.state.volumes.values().filter(placed).map(|v| v.id).collect()
        };
        self.start_cleaning(CLEAN_REGION_BLOCKS, &|v| !inplace.contains(&v))
    }

    /// Move up to `runs` more runs of `pass` into whole free regions of
    /// their devices. Not flushed: the committer commits the moves.
    pub fn clean_step(&self, pass: &mut CleanPass, runs: usize) -> Result<()> {
        self.check_writable()?;
        let CleanPass { before, chosen, targets, report, .. } = pass;
        let keep = |pba: Pba, len: u64| in_chosen(before, chosen, pba, len);
        for run in pass.runs.iter().skip(pass.next).take(runs) {
            pass.next += 1;
            let device = usize::from(run.pba.device());
            let Some(o) = before.iter().find(|o| o.device == device) else { continue };
            let fresh = || Some(Target { cursor: o.data_start, left: 0, uncommitted: 0 });
            let target = targets.entry(device).or_insert_with(fresh);
            let Some(t) = target.as_mut() else { continue };
            if t.left < run.len && !self.next_target(device, o.region, t)? {
                *target = None;
                continue;
            }
            self.make_room()?;
            let start = t.cursor;
            let result = self.move_run_where(*run, &keep, &mut Destination::Cursor { device, cursor: &mut t.cursor });
            t.left = t.left.saturating_sub(t.cursor.saturating_sub(start));
            match result {
                Ok(n) => {
                    report.blocks_moved += n;
                    t.uncommitted += n;
                }
                Err(EngineError::NoSpace) => *target = None,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Checkpoint what `pass` moved and count the regions it freed (a
    /// commit alone would hold them while a checkpoint is under way).
    pub fn finish_cleaning(&self, mut pass: CleanPass) -> Result<CleanReport> {
        self.checkpoint()?;
        let after = self.occupancy(pass.region)?;
        pass.report.free_regions_after = after.iter().map(Occupancy::whole_free).sum();
        pass.report.regions_freed = after
            .iter()
            .map(|o| {
                let freed = |r: &&u64| o.free.get(**r as usize) == Some(&pass.region);
                pass.chosen.get(&o.device).map_or(0, |c| c.iter().filter(freed).count())
            })
            .sum::<usize>() as u64;
        Ok(pass.report)
    }

    /// Point `t` at a whole free region of `device`; false if none. The
    /// search from the cursor is bounded; where it fails (free space cut
    /// into many holes, or only a few whole regions at the start), the
    /// moves so far are checkpointed, which frees the regions they emptied
    /// (a commit alone holds what it frees while a checkpoint is under
    /// way), and the space maps are walked whole for the first free region.
    fn next_target(&self, device: usize, region: u64, t: &mut Target) -> Result<bool> {
        if self.next_free_region(device, region, t)? {
            return Ok(true);
        }
        if t.uncommitted > 0 {
            self.checkpoint()?;
            t.uncommitted = 0;
        }
        let occupancy = self.occupancy(region)?;
        let Some(o) = occupancy.iter().find(|o| o.device == device) else { return Ok(false) };
        let Some(r) = o.free.iter().position(|&f| f == region) else { return Ok(false) };
        t.cursor = o.data_start + r as u64 * region;
        self.next_free_region(device, region, t)
    }

    /// Point `t` at the next whole free region of `device` after its
    /// cursor (the device's own cursor left alone); false if none.
    fn next_free_region(&self, device: usize, region: u64, t: &mut Target) -> Result<bool> {
        let mut inner = self.write_inner();
        let Some(found) = inner.space.find_region_at(device, region, t.cursor)? else { return Ok(false) };
        t.cursor = found.block();
        t.left = region;
        Ok(true)
    }

    /// Free blocks per cleaning region of every usable device's data area
    /// (below where metadata goes); walks the space maps.
    fn occupancy(&self, region: u64) -> Result<Vec<Occupancy>> {
        let inner = self.read_inner();
        let sp = &inner.space;
        let mut out = Vec::new();
        for (device, d) in sp.devices.iter().enumerate().filter(|(i, _)| sp.usable(*i)) {
            let end = metadata_start(d);
            let regions = end.saturating_sub(d.data_start) / region;
            let mut o =
                Occupancy { device, data_start: d.data_start, region, free: vec![0; regions as usize], head: 0 };
            o.head = o.region_of(d.cursor).unwrap_or(0);
            for (start, len) in sp.free_ranges(device)? {
                count_free(&mut o, start, start + len);
            }
            out.push(o);
        }
        Ok(out)
    }
}

/// Order `runs` by their regions, emptiest first (map order kept within
/// one): each whole region filled with them empties at least two, so a
/// pass that starts with one free region can go on after a commit.
fn emptiest_regions_first(occupancy: &[Occupancy], runs: &mut [LiveRun]) {
    let used = |run: &LiveRun| {
        let device = usize::from(run.pba.device());
        let o = occupancy.iter().find(|o| o.device == device);
        let r = o.and_then(|o| o.region_of(run.pba.block()));
        let used = o.zip(r).and_then(|(o, r)| o.free.get(r as usize).map(|f| o.region - f));
        (used.unwrap_or(u64::MAX), device, r)
    };
    runs.sort_by_cached_key(used); // stable
}

/// Add the free blocks [start, end) to the regions they fall in.
fn count_free(o: &mut Occupancy, start: u64, end: u64) {
    let mut at = start.max(o.data_start);
    while at < end {
        let Some(r) = o.region_of(at).filter(|&r| (r as usize) < o.free.len()) else { return };
        let n = o.region_end(r).min(end) - at;
        o.free[r as usize] += n;
        at += n;
    }
}

/// Whether `pba` lies in a chosen region, and for how many of `len`
/// blocks the answer holds.
fn in_chosen(occupancy: &[Occupancy], chosen: &BTreeMap<usize, BTreeSet<u64>>, pba: Pba, len: u64) -> (bool, u64) {
    let device = usize::from(pba.device());
    let Some(o) = occupancy.iter().find(|o| o.device == device) else { return (false, len) };
    let Some(r) = o.region_of(pba.block()) else { return (false, len) };
    let to_region_end = o.region_end(r) - pba.block();
    let taken = chosen.get(&device).is_some_and(|c| c.contains(&r));
    (taken, len.min(to_region_end))
}
