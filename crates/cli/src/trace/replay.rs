//! `tarn trace replay`: a recorded request stream played against a
//! scratch pool with a given placement, then the layout it left measured
//! the way the Virtual Contiguity paper does (seed 001): per logical
//! region, the seeks needed to read it in order and its density on disk,
//! over all regions and over those rewritten after a snapshot, and the
//! time to read each volume front to back with a simple disk model
//! (the paper's equation 1: per run, a seek plus its bytes at the read
//! rate). Reads are not replayed: they do not move data.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tarn_engine::device::disk_model::DiskModel;
use tarn_engine::{
    create_pool, CreateOptions, Device, FileDevice, OpenOptions, PhysicalRun, PlacementKind, Pool, View,
};
use tarn_format::trace::{trace_flags, TraceCmd, TraceRecord};
use tarn_format::BLOCK_SIZE;

pub struct ReplayOptions {
    pub placement: PlacementKind,
    /// Scratch pool size; None: what the exports span plus twice what
    /// the trace writes (snapshots may hold every version), plus 64 MiB.
    pub pool_size: Option<u64>,
    /// Where the scratch pool goes (removed afterwards unless `keep`).
    pub dir: PathBuf,
    pub keep: bool,
    /// Snapshot every volume each time this much trace time passes.
    pub snapshot_every_ns: Option<u64>,
    /// Logical region size for the layout figures (bytes).
    pub region: u64,
    /// `contiguous` homes searched from a random start (`--region-start random`).
    pub random_region_start: bool,
    /// Files laid over the volumes (from the workload generator): then
    /// the figures are also given per file, as the paper gives them.
    pub files: Vec<FileExtents>,
}

/// One file of a workload: where its bytes are in an export, in order.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct FileExtents {
    pub export: String,
    /// (offset, length) in bytes, in the file's order.
    pub extents: Vec<(u64, u64)>,
    /// Written again after a snapshot had it (copy-on-write).
    #[serde(default)]
    pub rewritten: bool,
}

/// The disk model of the estimated read time: the one `serve
/// --bench-disk-model hdd` delays requests by.
const DISK: DiskModel = DiskModel::HDD;

/// Milliseconds to move the head `distance` blocks on a device of `blocks`.
fn seek_ms(distance: u64, blocks: u64) -> f64 {
    DISK.seek_secs(distance * BLOCK_SIZE, blocks * BLOCK_SIZE) * 1e3
}

struct Export {
    name: String,
    /// End of the furthest request (bytes).
    end: u64,
    vol: Option<u32>,
}

pub fn replay(records: &[TraceRecord], opts: &ReplayOptions) -> Result<Value> {
    if opts.region < BLOCK_SIZE || !opts.region.is_power_of_two() {
        bail!("--region {} must be a power of two of at least 4 KiB", opts.region);
    }
    let mut exports = exports_of(records);
    let span: u64 = exports.values().map(|e| e.end).sum();
    let written: u64 = records
        .iter()
        .map(|r| match r {
            TraceRecord::Request { cmd: TraceCmd::Write | TraceCmd::WriteZeroes, length, .. } => *length,
            _ => 0,
        })
        .sum();
    let size = opts.pool_size.unwrap_or_else(|| (span + 2 * written + (64 << 20)).div_ceil(1 << 20) << 20);
    std::fs::create_dir_all(&opts.dir).with_context(|| format!("create {}", opts.dir.display()))?;
    let path = opts.dir.join("replay-pool.img");
    let result = replay_in(&path, size, records, &mut exports, opts);
    if !opts.keep {
        let _ = std::fs::remove_file(&path);
    }
    result
}

fn exports_of(records: &[TraceRecord]) -> BTreeMap<u32, Export> {
    let mut exports = BTreeMap::new();
    for r in records {
        match r {
            TraceRecord::Name { export, name } => {
                exports.insert(*export, Export { name: name.clone(), end: 0, vol: None });
            }
            TraceRecord::Request { export, offset, length, .. } => {
                if let Some(e) = exports.get_mut(export) {
                    e.end = e.end.max(offset + length);
                }
            }
        }
    }
    exports
}

fn replay_in(
    path: &Path,
    size: u64,
    records: &[TraceRecord],
    exports: &mut BTreeMap<u32, Export>,
    opts: &ReplayOptions,
) -> Result<Value> {
    let file = std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
    file.set_len(size)?;
    drop(file);
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(path, true)?);
    create_pool(std::slice::from_ref(&dev), &[path.display().to_string()], &CreateOptions::default())?;
    let pool = Pool::open(
        vec![dev.clone()],
        OpenOptions {
            placement: opts.placement,
            region_blocks: opts.region / BLOCK_SIZE,
            random_region_start: opts.random_region_start,
            ..Default::default()
        },
    )?;
    for e in exports.values_mut().filter(|e| !e.name.contains('@') && e.end > 0) {
        let vol_size = e.end.div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        e.vol = Some(pool.create_volume(&e.name, vol_size).with_context(|| format!("volume {}", e.name))?.id);
    }
    let stats = play(&pool, records, exports, opts)?;
    let blocks = dev.size() / BLOCK_SIZE;
    let ids: Vec<(u32, String)> = exports.values().filter_map(|e| Some((e.vol?, e.name.clone()))).collect();
    let used = occupancy(&pool, &ids, opts.region / BLOCK_SIZE)?;
    let mut vols = Vec::new();
    for e in exports.values() {
        if let Some(id) = e.vol {
            vols.push(layout(&pool, id, &e.name, opts.region, blocks, &used)?);
        }
    }
    let files = if opts.files.is_empty() { Value::Null } else { file_figures(&pool, exports, opts, &used)? };
    pool.close()?;
    Ok(json!({
        "placement": opts.placement.name(), "pool_size": size, "region": opts.region,
        "requests": stats.requests, "skipped": stats.skipped, "written": stats.written,
        "snapshots": stats.snapshots, "volumes": vols, "files": files,
        "pool": if opts.keep { Some(path.display().to_string()) } else { None },
    }))
}

#[derive(Default)]
struct PlayStats {
    requests: u64,
    skipped: u64,
    written: u64,
    snapshots: u64,
}

fn play(
    pool: &Pool,
    records: &[TraceRecord],
    exports: &BTreeMap<u32, Export>,
    opts: &ReplayOptions,
) -> Result<PlayStats> {
    let mut st = PlayStats::default();
    let mut next_snap = opts.snapshot_every_ns;
    let mut data = Vec::new();
    for r in records {
        let TraceRecord::Request { t_ns, export, cmd, flags, offset, length } = *r else { continue };
        if let Some(at) = next_snap.filter(|&at| t_ns >= at) {
            st.snapshots += 1;
            for vol in exports.values().filter(|e| e.vol.is_some()) {
                pool.create_snapshot(&vol.name, &format!("t{}", st.snapshots))
                    .with_context(|| format!("snapshot {} of {}", st.snapshots, vol.name))?;
            }
            next_snap = Some(at + opts.snapshot_every_ns.unwrap_or(u64::MAX));
        }
        let vol = exports.get(&export).and_then(|e| e.vol);
        let Some(vol) = vol.filter(|_| flags & trace_flags::FAILED == 0) else {
            st.skipped += 1;
            continue;
        };
        st.requests += 1;
        apply(pool, vol, cmd, flags, offset, length, &mut data)
            .with_context(|| format!("request {} ({} at {offset}, {length} bytes)", st.requests, cmd.name()))
            .with_context(|| {
                format!("replay on a scratch pool of {} (--pool-size)", crate::size::human(pool.status().size))
            })?;
        if cmd == TraceCmd::Write {
            st.written += length;
        }
    }
    pool.flush()?;
    Ok(st)
}

/// Play one request on volume `vol`.
fn apply(pool: &Pool, vol: u32, cmd: TraceCmd, flags: u8, offset: u64, length: u64, data: &mut Vec<u8>) -> Result<()> {
    match cmd {
        TraceCmd::Write => {
            // Whole pieces of at most 32 MiB (the engine's largest write).
            let mut done = 0;
            while done < length {
                let n = (length - done).min(32 << 20) as usize;
                data.resize(n, 0x5a);
                pool.write(vol, offset + done, &data[..n], flags & trace_flags::FUA != 0)?;
                done += n as u64;
            }
        }
        TraceCmd::Trim => pool.trim(vol, offset, length)?,
        TraceCmd::WriteZeroes => pool.write_zeroes(vol, offset, length, flags & trace_flags::NO_HOLE != 0, false)?,
        TraceCmd::Flush => pool.flush()?,
        TraceCmd::Read | TraceCmd::Cache => {}
    }
    Ok(())
}

/// Whether the head reads on from `head` to `at` (a short skip forward
/// on the same device: the gap is read through, as the paper's density
/// term counts it) rather than seeking.
fn reads_on(head: Option<(u16, u64)>, device: u16, at: u64, region_blocks: u64) -> bool {
    head.is_some_and(|(d, b)| d == device && at >= b && at - b < region_blocks)
}

/// Blocks in use per physical region (device, aligned window of
/// `region_blocks`): data any head or snapshot of the volumes holds.
type Occupancy = HashMap<(u16, u64), u64>;

fn occupancy(pool: &Pool, vols: &[(u32, String)], region_blocks: u64) -> Result<Occupancy> {
    // Every view's runs, as (device, start, end); views share blocks, so
    // the union is taken before counting.
    let mut runs: Vec<(u16, u64, u64)> = Vec::new();
    for (vol, name) in vols {
        let snaps = pool.list_snapshots(Some(name))?;
        let views = std::iter::once(View::Head).chain(snaps.iter().map(|s| View::Snapshot(s.epoch)));
        for view in views {
            let blocks = pool.view_size(*vol, view).unwrap_or(0) / BLOCK_SIZE;
            runs.extend(
                pool.physical_runs(*vol, view, 0, blocks)?.iter().map(|r| (r.device, r.block, r.block + r.len)),
            );
        }
    }
    runs.sort_unstable();
    let mut used = Occupancy::new();
    let mut covered: Option<(u16, u64)> = None; // device and end of what was counted
    for (device, start, end) in runs {
        let from = match covered {
            Some((d, e)) if d == device => start.max(e),
            _ => start,
        };
        let mut at = from;
        while at < end {
            let w = at / region_blocks;
            let n = ((w + 1) * region_blocks).min(end) - at;
            *used.entry((device, w)).or_insert(0) += n;
            at += n;
        }
        covered = Some((device, covered.filter(|c| c.0 == device).map_or(end, |c| c.1.max(end))));
    }
    Ok(used)
}

/// Seeks and density of a file's or region's runs, in logical order:
/// every physical discontiguity is a seek (the paper's count); density is
/// how full the physical regions a read visits are, with everyone's data
/// (the paper's density of a region, `used`). (The read time estimate
/// reads short forward gaps through instead: `layout`.)
fn region_figures(runs: &[PhysicalRun], region_blocks: u64, used: &Occupancy) -> (u64, f64) {
    let mut seeks = 0;
    let mut prev: Option<(u16, u64)> = None;
    let mut visited: BTreeSet<(u16, u64)> = BTreeSet::new();
    for r in runs {
        if prev != Some((r.device, r.block)) {
            seeks += 1;
        }
        prev = Some((r.device, r.block + r.len));
        visited.extend((r.block / region_blocks..=(r.block + r.len - 1) / region_blocks).map(|w| (r.device, w)));
    }
    let full: u64 = visited.iter().map(|w| used.get(w).copied().unwrap_or(0)).sum();
    let room = visited.len() as u64 * region_blocks;
    (seeks, if room == 0 { 1.0 } else { full as f64 / room as f64 })
}

/// The paper's density (seed 001, section 2: "the fraction of all
/// blocks in the allocated region that contain data for the file to be
/// read"): each logical region of the runs is read as few physical
/// reads as its pieces allow, in physical order, a gap shorter than a
/// region read through (chaff: others' blocks, old versions, free
/// space). Returns the blocks wanted, the blocks read and the reads
/// that do not start where the one before ended (the paper's seeks for
/// virtual contiguity: one per dense region read).
fn read_span(runs: &[PhysicalRun], region_blocks: u64, keep: impl Fn(u64) -> bool) -> (u64, u64, u64) {
    let mut pieces: BTreeMap<u64, Vec<(u16, u64, u64)>> = BTreeMap::new();
    for r in runs {
        let (mut lba, mut block, end) = (r.lba, r.block, r.lba + r.len);
        while lba < end {
            let n = ((lba / region_blocks + 1) * region_blocks).min(end) - lba;
            if keep(lba / region_blocks) {
                pieces.entry(lba / region_blocks).or_default().push((r.device, block, block + n));
            }
            (lba, block) = (lba + n, block + n);
        }
    }
    let (mut wanted, mut read, mut seeks) = (0, 0, 0);
    let mut head = None;
    let mut finish = |r: Option<(u16, u64, u64)>, read: &mut u64| {
        if let Some((d, s, e)) = r {
            *read += e - s;
            seeks += u64::from(head != Some((d, s)));
            head = Some((d, e));
        }
    };
    for mut region in pieces.into_values() {
        region.sort_unstable();
        let mut reading: Option<(u16, u64, u64)> = None;
        for (device, start, end) in region {
            wanted += end - start;
            reading = match reading {
                Some((d, s, e)) if d == device && start < e + region_blocks => Some((d, s, e.max(end))),
                other => {
                    finish(other, &mut read);
                    Some((device, start, end))
                }
            };
        }
        finish(reading, &mut read);
    }
    (wanted, read, seeks)
}

/// The paper's density and seeks of reading `runs` (see [`read_span`]).
fn region_reads(runs: &[PhysicalRun], region_blocks: u64) -> (f64, u64) {
    match read_span(runs, region_blocks, |_| true) {
        (_, 0, _) => (1.0, 0),
        (wanted, read, seeks) => (wanted as f64 / read as f64, seeks),
    }
}

/// The logical regions of `head` (a file's runs) holding a block that
/// some snapshot maps elsewhere: copied on write since (the paper's
/// "COWed segments").
fn copied_regions(pool: &Pool, vol: u32, epochs: &[u64], head: &[PhysicalRun], rb: u64) -> Result<BTreeSet<u64>> {
    let mut regions = BTreeSet::new();
    for &epoch in epochs {
        for r in head {
            for s in pool.physical_runs(vol, View::Snapshot(epoch), r.lba, r.len)? {
                // Same place iff the snapshot's run is the head's, shifted.
                if s.device != r.device || s.block + r.lba != r.block + s.lba {
                    regions.extend(s.lba / rb..=(s.lba + s.len - 1) / rb);
                }
            }
        }
    }
    Ok(regions)
}

#[derive(Default)]
struct Tally {
    regions: u64,
    seeks: u64,
    density: f64,
    read_density: f64,
    read_seeks: u64,
}

impl Tally {
    fn add(&mut self, seeks: u64, density: f64, (read_density, read_seeks): (f64, u64)) {
        self.regions += 1;
        self.seeks += seeks;
        self.density += density;
        self.read_density += read_density;
        self.read_seeks += read_seeks;
    }

    fn json(&self) -> Value {
        self.json_as("regions", "seeks_per_region")
    }

    fn json_as(&self, count: &str, seeks: &str) -> Value {
        let n = self.regions.max(1) as f64;
        json!({
            count: self.regions, seeks: self.seeks as f64 / n, "density": self.density / n,
            "read_density": self.read_density / n, "read_seeks": self.read_seeks as f64 / n,
        })
    }
}

/// Seeks and density per file (all, and those rewritten after a
/// snapshot), and internal fragmentation with 4 KiB blocks and with
/// blocks of a whole region (the paper's large-block policy, whose seeks
/// are by definition those of virtual contiguity).
fn file_figures(pool: &Pool, exports: &BTreeMap<u32, Export>, opts: &ReplayOptions, used: &Occupancy) -> Result<Value> {
    let rb = opts.region / BLOCK_SIZE;
    let (mut all, mut cow) = (Tally::default(), Tally::default());
    let (mut bytes, mut small, mut large) = (0u64, 0u64, 0u64);
    let (mut copied_files, mut copied_density) = (0u64, 0.0);
    for f in &opts.files {
        let Some(vol) = exports.values().find(|e| e.name == f.export).and_then(|e| e.vol) else {
            bail!("the file list names export {:?}, which the trace does not write", f.export);
        };
        let epochs: Vec<u64> = pool.list_snapshots(Some(&f.export))?.iter().map(|s| s.epoch).collect();
        let mut runs = Vec::new();
        for &(offset, length) in &f.extents {
            let (first, end) = (offset / BLOCK_SIZE, (offset + length).div_ceil(BLOCK_SIZE));
            runs.extend(pool.physical_runs(vol, View::Head, first, end - first)?);
        }
        let size: u64 = f.extents.iter().map(|e| e.1).sum();
        if runs.is_empty() || size == 0 {
            continue;
        }
        let (seeks, density) = region_figures(&runs, rb, used);
        let reads = region_reads(&runs, rb);
        all.add(seeks, density, reads);
        if f.rewritten {
            cow.add(seeks, density, reads);
            let copied = copied_regions(pool, vol, &epochs, &runs, rb)?;
            if let (wanted @ 1.., read, _) = read_span(&runs, rb, |r| copied.contains(&r)) {
                copied_files += 1;
                copied_density += wanted as f64 / read as f64;
            }
        }
        bytes += size;
        small += size.div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        large += size.div_ceil(opts.region) * opts.region;
    }
    let frag = |alloc: u64| if alloc == 0 { 0.0 } else { (alloc - bytes) as f64 / alloc as f64 };
    Ok(json!({
        "all": all.json_as("files", "seeks_per_file"),
        "rewritten_after_snapshot": cow.json_as("files", "seeks_per_file"),
        "copied_regions": json!({
            "files": copied_files, "read_density": copied_density / copied_files.max(1) as f64,
        }),
        "internal_fragmentation": frag(small), "internal_fragmentation_large_blocks": frag(large),
    }))
}

fn layout(pool: &Pool, vol: u32, name: &str, region: u64, device_blocks: u64, used: &Occupancy) -> Result<Value> {
    let size = pool.view_size(vol, View::Head).unwrap_or(0);
    let first_snap = pool.list_snapshots(Some(name))?.first().map(|s| s.epoch);
    let rb = region / BLOCK_SIZE;
    let (mut all, mut cow) = (Tally::default(), Tally::default());
    let (mut read_ms, mut head, mut extents, mut mapped) = (0.0, None::<(u16, u64)>, 0u64, 0u64);
    for lba in (0..size / BLOCK_SIZE).step_by(rb as usize) {
        let runs = pool.physical_runs(vol, View::Head, lba, rb.min(size / BLOCK_SIZE - lba))?;
        if runs.is_empty() {
            continue;
        }
        let (seeks, density) = region_figures(&runs, rb, used);
        let reads = region_reads(&runs, rb);
        all.add(seeks, density, reads);
        if let Some(epoch) = first_snap {
            let len = rb.min(size / BLOCK_SIZE - lba) * BLOCK_SIZE;
            let changed = pool.changed_runs(vol, View::Head, epoch, lba * BLOCK_SIZE, len)?;
            if changed.iter().any(|c| c.changed) {
                cow.add(seeks, density, reads);
            }
        }
        for r in &runs {
            let moved = match head {
                Some((_, b)) if reads_on(head, r.device, r.block, rb) => (r.block - b) * BLOCK_SIZE,
                Some((d, b)) if d == r.device => {
                    read_ms += seek_ms(b.abs_diff(r.block), device_blocks);
                    0
                }
                _ => {
                    read_ms += seek_ms(device_blocks / 3, device_blocks);
                    0
                }
            };
            // The gap read through, then the run.
            read_ms += (moved + r.len * BLOCK_SIZE) as f64 / DISK.bytes_per_sec as f64 * 1e3;
            head = Some((r.device, r.block + r.len));
            extents += 1;
            mapped += r.len * BLOCK_SIZE;
        }
    }
    let gib = mapped as f64 / f64::from(1u32 << 30);
    Ok(json!({
        "name": name, "size": size, "mapped": mapped, "runs": extents,
        "runs_per_gib": if gib > 0.0 { extents as f64 / gib } else { 0.0 },
        "all": all.json(), "rewritten_after_snapshot": cow.json(), "est_read_s": read_ms / 1e3,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(lba: u64, len: u64, block: u64) -> PhysicalRun {
        PhysicalRun { lba, len, device: 0, block }
    }

    #[test]
    fn adjacent_runs_are_one_seek_and_gaps_lower_density() {
        // Regions of 8 blocks: 13 is 104..112, 14 is 112..120.
        let used: Occupancy = [((0, 13), 8), ((0, 14), 4)].into_iter().collect();
        assert_eq!(region_figures(&[run(0, 4, 104), run(4, 4, 108)], 8, &used), (1, 1.0));
        let (seeks, density) = region_figures(&[run(0, 4, 104), run(4, 4, 112)], 8, &used);
        assert_eq!(seeks, 2);
        assert!((density - 12.0 / 16.0).abs() < 1e-9, "two regions visited, 12 of 16 blocks in use");
        assert_eq!(region_figures(&[run(0, 2, 10), run(2, 2, 8)], 8, &used).0, 2, "backwards is a seek");
        assert!(reads_on(Some((0, 104)), 0, 112, 64), "a short gap forward is read through");
        assert!(!reads_on(Some((0, 104)), 0, 200, 64) && !reads_on(Some((0, 104)), 0, 100, 64));
    }

    #[test]
    fn a_read_spans_chaff_within_a_region_and_not_beyond() {
        // Regions of 8 blocks. Contiguous: all wanted.
        assert_eq!(read_span(&[run(0, 8, 100)], 8, |_| true), (8, 8, 1));
        // Two blocks copied next to the original (old versions left at
        // 102, 103): one read of 100..110, 8 of 10 wanted.
        assert_eq!(read_span(&[run(0, 2, 100), run(2, 2, 108), run(4, 4, 104)], 8, |_| true), (8, 10, 1));
        // A copy a region or more away is a read of its own, no chaff.
        assert_eq!(read_span(&[run(0, 4, 100), run(4, 4, 200)], 8, |_| true), (8, 8, 2));
        // Logical regions are read apart: a run crossing one is split.
        assert_eq!(read_span(&[run(6, 4, 100)], 8, |_| true), (4, 4, 1));
        assert_eq!(read_span(&[run(0, 1, 100), run(8, 1, 105)], 8, |_| true), (2, 2, 2));
        assert_eq!(read_span(&[run(0, 1, 100), run(8, 3, 105)], 8, |r| r == 1), (3, 3, 1), "only region 1");
        let (density, seeks) = region_reads(&[run(0, 2, 100), run(2, 2, 108), run(4, 4, 104)], 8);
        assert!((density - 0.8).abs() < 1e-9 && seeks == 1);
        // A read that starts where the last one ended is no seek.
        assert_eq!(region_reads(&[run(0, 8, 100), run(8, 8, 108)], 8).1, 1);
        assert_eq!(region_reads(&[run(0, 8, 100), run(8, 8, 300)], 8).1, 2);
    }

    #[test]
    fn seeks_cost_more_with_distance() {
        assert_eq!(seek_ms(0, 1000), 0.0);
        assert!(seek_ms(1, 1000) < seek_ms(500, 1000));
        assert!((seek_ms(1000, 1000) - (8.0 + 4.17)).abs() < 1e-9);
    }
}
