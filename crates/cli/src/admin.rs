//! Administrative requests, executed on an open pool. The same requests run
//! locally (pool opened by the CLI) or inside `tarn serve` over its control
//! socket, so a running server never has to be stopped to manage volumes.

use crate::export::Clients;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tarn_engine::{EngineError, PlacementKind, Pool, PoolStatus, SnapshotInfo, View, VolumeInfo, VolumeOptions};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Status,
    Check,
    Flush,
    VolList,
    /// `tarn fs create`: a file volume with an empty root directory.
    FsCreate {
        name: String,
        /// Bytes it may allocate (0: no quota).
        #[serde(default)]
        quota: u64,
    },
    FsList,
    FsDestroy {
        name: String,
    },
    /// Where a volume's blocks lie: its mapped runs in logical order.
    VolMap {
        name: String,
    },
    /// Per device, blocks per kind of space in at most `cells` cells (`tarn map`).
    PoolMap {
        cells: u64,
    },
    VolCreate {
        name: String,
        size: u64,
        /// The volume's own placement policy (absent: the pool's default).
        #[serde(default)]
        placement: Option<String>,
        /// Bytes of own space it may hold (absent: no quota).
        #[serde(default)]
        quota: Option<u64>,
        /// Create it even past the overcommit ratio.
        #[serde(default)]
        force: bool,
        /// Members its new data may go to, bit i for member i (0: any).
        #[serde(default)]
        devices: u16,
        /// Stripe it over (members, unit bytes) (`--stripe N[:UNIT]`).
        #[serde(default)]
        stripe: Option<(u32, u64)>,
        /// Keep parity over (data members, unit bytes) (`--parity N[:UNIT]`).
        parity: Option<(u32, u64)>,
    },
    /// Change a volume's placement ("default": follow the pool's), its
    /// quota (0: remove it) and/or its members (0: any).
    VolSet {
        name: String,
        #[serde(default)]
        placement: Option<String>,
        #[serde(default)]
        quota: Option<u64>,
        #[serde(default)]
        devices: Option<u16>,
    },
    VolResize {
        name: String,
        size: u64,
        allow_shrink: bool,
        #[serde(default)]
        force: bool,
    },
    /// Set the overcommit ratio in thousandths (0: no limit).
    PoolSet {
        overcommit: u32,
    },
    VolDelete {
        name: String,
        /// Absent in requests of older clients: they never deleted snapshots.
        #[serde(default)]
        recursive: bool,
    },
    VolClone {
        volume: String,
        snapshot: String,
        clone: String,
        /// Create it even past the overcommit ratio.
        #[serde(default)]
        force: bool,
    },
    /// Free what the volume's ext file system freed without discarding
    /// it; streams progress lines (4 KiB blocks of the file system scanned).
    VolReclaim {
        name: String,
        #[serde(default)]
        dry_run: bool,
    },
    /// The metadata of the volume's ext file system, per kind.
    VolClassify {
        name: String,
        /// Also list every run (offset, length, kind).
        #[serde(default)]
        runs: bool,
    },
    /// Move metadata (byte ranges, or inferred when empty) to `target`:
    /// "cluster", "natural" (unhint) or a device (index or path).
    VolHint {
        name: String,
        #[serde(default)]
        ranges: Vec<(u64, u64)>,
        target: String,
    },
    /// Write `view` (VOL or VOL@SNAP) to `path` as a raw image; streams
    /// progress (4 KiB blocks).
    VolExport {
        view: String,
        path: String,
        #[serde(default)]
        force: bool,
    },
    /// A new volume `name` from the raw image at `path`; streams progress.
    VolImport {
        path: String,
        name: String,
        /// The image the user named, when `path` is a raw copy of it.
        #[serde(default)]
        source: Option<String>,
    },
    /// Streams `{"progress":[done,total]}` lines before its answer.
    VolFlatten {
        name: String,
    },
    SnapCreate {
        volume: String,
        name: String,
    },
    SnapList {
        volume: Option<String>,
    },
    SnapDelete {
        volume: String,
        name: String,
    },
    SnapRollback {
        volume: String,
        name: String,
        destroy_newer: bool,
    },
    /// Verify every copy of every block, heal from good copies; with
    /// `repair`, also rewrite damaged superblock copies. Streams progress.
    Scrub {
        /// Bytes per second at most.
        rate: Option<u64>,
        #[serde(default)]
        repair: bool,
    },
    /// Replace mirror leg `old` with device `new` and resilver, or a
    /// missing plain member (index or path) and rebuild it from parity
    /// rows; streams `{"progress":[done,total]}` lines (blocks) before its
    /// answer.
    PoolReplace {
        old: String,
        new: String,
        /// Bytes rebuilt per second at most (a parity rebuild).
        #[serde(default)]
        rate: Option<u64>,
    },
    /// Re-lay out one volume (or every one) so it reads sequentially;
    /// streams `{"progress":[done,total]}` lines (blocks) per volume.
    Compact {
        volume: Option<String>,
        /// Volume bytes looked at per second at most.
        #[serde(default)]
        rate: Option<u64>,
    },
    /// Add the device at `path` (absolute) as a new member, or as a
    /// spare (taken when the pool expands past its growing member's limit).
    DevAdd {
        path: String,
        #[serde(default)]
        spare: bool,
    },
    /// Give member `index` a default placement ("default": none).
    DevSet {
        index: usize,
        placement: String,
    },
    /// Grow member `index` to `size` bytes.
    DevGrow {
        index: usize,
        size: u64,
    },
    /// Evacuate member `index` (`dev remove`): streams
    /// `{"progress":[done,total]}` lines (blocks) before its answer; with
    /// `cancel`, stop a running one (the member becomes a normal one).
    DevRemove {
        index: usize,
        /// Bytes moved per second at most.
        #[serde(default)]
        rate: Option<u64>,
        #[serde(default)]
        cancel: bool,
    },
    /// Changed ranges from snapshot `from` to snapshot `to` (None: the head).
    Diff {
        volume: String,
        from: String,
        to: Option<String>,
    },
}

impl Request {
    /// Whether the request changes the pool (a local run must open it writable).
    pub fn writes(&self) -> bool {
        !matches!(
            self,
            Request::Status
                | Request::PoolMap { .. }
                | Request::Check
                | Request::VolList
                | Request::FsList
                | Request::SnapList { .. }
                | Request::Diff { .. }
        )
    }
}

/// What a request may use besides the pool.
pub struct Ctx<'a> {
    /// Called with (done, total) blocks by long requests (flatten).
    pub progress: &'a mut dyn FnMut(u64, u64),
    /// Whoever asked went away (a control socket client interrupted):
    /// requests that can stop early (compaction) do.
    pub abandoned: &'a dyn Fn() -> bool,
    /// NBD connections of a running server (None when run locally).
    pub clients: Option<&'a Clients>,
}

pub fn execute(pool: &Pool, req: &Request, ctx: &mut Ctx) -> Result<Value, String> {
    let r = match req {
        Request::Status => Ok(status_json(&pool.status())),
        Request::Check => Ok(check_json(pool, ctx)),
        Request::Flush => pool.flush().map(|_| json!({})),
        Request::VolList => Ok(Value::Array(pool.list_volumes().iter().map(volume_json).collect())),
        Request::VolMap { name } => vol_map(pool, name),
        Request::PoolMap { cells } => crate::layout::pool_map(pool, *cells),
        Request::FsCreate { name, quota } => return fs_create(pool, name, *quota),
        Request::FsList => Ok(Value::Array(pool.file_volumes().iter().map(file_volume_json).collect())),
        Request::FsDestroy { name } => pool.delete_file_volume(name).map(|()| json!({ "destroyed": name })),
        Request::VolCreate { name, size, placement, quota, force, devices, stripe, parity } => {
            let placement = match placement {
                Some(name) => placement_named(name)?,
                None => None,
            };
            let (quota, force, devices, stripe, parity) = (*quota, *force, *devices, *stripe, *parity);
            let opts = VolumeOptions { placement, quota, force, devices, stripe, parity };
            pool.create_volume_with(name, *size, &opts).map(|v| volume_json(&v))
        }
        Request::VolSet { name, placement, quota, devices } => {
            return vol_set(pool, name, placement.as_deref(), *quota, *devices)
        }
        Request::VolResize { name, size, allow_shrink, force } => {
            pool.resize_volume_forced(name, *size, *allow_shrink, *force).map(|v| volume_json(&v))
        }
        Request::PoolSet { overcommit } => {
            pool.set_overcommit((*overcommit != 0).then_some(*overcommit)).map(|()| status_json(&pool.status()))
        }
        Request::VolDelete { name, recursive } => vol_delete(pool, name, *recursive),
        Request::VolClone { volume, snapshot, clone, force } => {
            pool.create_clone_forced(volume, snapshot, clone, *force).map(|v| volume_json(&v))
        }
        Request::VolFlatten { name } => vol_flatten(pool, name, ctx),
        Request::VolClassify { name, runs } => return crate::hint::classify_volume(pool, name, *runs),
        Request::VolHint { name, ranges, target } => {
            return crate::hint::move_metadata(pool, name, ranges, target, ctx.progress)
        }
        Request::VolExport { view, path, force } => {
            return crate::image::export(pool, view, path, *force, ctx.progress)
        }
        Request::VolImport { path, name, source } => {
            return crate::image::import(pool, path, source.as_deref(), name, ctx.progress)
        }
        Request::VolReclaim { name, dry_run } => return crate::reclaim::reclaim(pool, name, *dry_run, ctx.progress),
        Request::SnapCreate { volume, name } => pool.create_snapshot(volume, name).map(|s| snapshot_json(&s)),
        Request::SnapList { volume } => {
            pool.list_snapshots(volume.as_deref()).map(|l| Value::Array(l.iter().map(snapshot_json).collect()))
        }
        Request::SnapDelete { volume, name } => pool
            .delete_snapshot(volume, name)
            .map(|freed| json!({ "deleted": format!("{volume}@{name}"), "freed": freed })),
        Request::SnapRollback { volume, name, destroy_newer } => rollback(pool, volume, name, *destroy_newer, ctx),
        Request::Diff { volume, from, to } => diff(pool, volume, from, to.as_deref()),
        Request::Compact { volume, rate } => compact(pool, volume.as_deref(), *rate, ctx),
        Request::Scrub { rate, repair } => scrub(pool, *rate, *repair, ctx),
        Request::PoolReplace { old, new, rate } => {
            return crate::mirror::execute_replace(pool, old, new, *rate, ctx.progress, ctx.abandoned)
        }
        Request::DevAdd { path, spare } => return crate::members::execute_add(pool, path, *spare),
        Request::DevGrow { index, size } => return crate::members::execute_grow(pool, *index, *size),
        Request::DevSet { index, placement } => {
            let p = placement_named(placement)?;
            pool.set_device_placement(*index, p).map(|()| status_json(&pool.status()))
        }
        Request::DevRemove { index, rate, cancel } => {
            return crate::members::execute_remove(pool, *index, *rate, *cancel, ctx.progress, ctx.abandoned)
        }
    };
    r.map_err(|e| e.to_string())
}

fn check_json(pool: &Pool, ctx: &mut Ctx) -> Value {
    let r = pool.check_with_progress(ctx.progress);
    json!({
        "clean": r.is_clean(), "problems": r.problems, "notes": r.notes,
        "volumes": r.volumes, "extents": r.extents,
        "mapped_bytes": r.mapped_blocks * 4096, "free_bytes": r.free_blocks * 4096,
        "checkpoint_bytes": r.metadata_blocks * 4096,
    })
}

fn scrub(pool: &Pool, rate: Option<u64>, repair: bool, ctx: &mut Ctx) -> Result<Value, EngineError> {
    let labels = if repair { pool.repair_labels()? } else { Vec::new() };
    let opts = tarn_engine::scrub::ScrubOptions { rate };
    // Parity rows first: a unit they rebuild goes to new space, so the
    // block pass below does not count the rotted copy as lost.
    let parity = pool.scrub_parity(true)?;
    // Progress in blocks, like flatten's.
    let r = pool.scrub(&opts, &mut |done, total| (ctx.progress)(done / 4096, total / 4096))?;
    let lost: Vec<Value> = r
        .lost
        .iter()
        .map(|l| json!({ "volume": l.volume, "snapshot": l.snapshot, "offset": l.offset, "length": l.len }))
        .collect();
    Ok(json!({
        "bytes": r.bytes, "blocks": r.blocks, "bad_copies": r.bad_copies, "repaired": r.repaired,
        "lost_blocks": r.lost_blocks, "lost": lost, "unsummed_blocks": r.unsummed_blocks,
        "seconds": r.elapsed.as_secs_f64(), "labels_repaired": labels,
        "parity_rows": parity.rows, "parity_mismatched": parity.mismatched,
        "parity_rebuilt": parity.rebuilt, "parity_healed": parity.healed,
        "parity_snapshot_rows": parity.snapshot_rows,
    }))
}

fn vol_delete(pool: &Pool, name: &str, recursive: bool) -> Result<Value, EngineError> {
    // Named before they go, for the report.
    let snapshots: Vec<String> =
        if recursive { pool.list_snapshots(Some(name))?.into_iter().map(|s| s.name).collect() } else { Vec::new() };
    pool.delete_volume(name, recursive)?;
    Ok(json!({ "deleted": name, "snapshots_deleted": snapshots }))
}

/// Compact one volume or all, at most `rate` volume bytes looked at per
/// second; stops (durably, resumable by running it again) when the caller
/// goes away.
fn compact(pool: &Pool, volume: Option<&str>, rate: Option<u64>, ctx: &mut Ctx) -> Result<Value, EngineError> {
    let names: Vec<String> = match volume {
        Some(v) => vec![v.to_string()],
        None => pool.list_volumes().into_iter().map(|v| v.name).collect(),
    };
    let started = std::time::Instant::now();
    let (mut done, mut looked) = (Vec::new(), 0);
    let batch = tarn_engine::volumes::relayout::batch_for_rate(rate);
    for name in names {
        let mut go_on = |d: u64, t: u64| {
            (ctx.progress)(d, t);
            tarn_engine::scrub::throttle(rate, looked + d * 4096, started);
            !(ctx.abandoned)()
        };
        let r = pool.relayout_until(&name, batch, &mut go_on)?;
        looked += pool.volume_id(&name).and_then(|id| pool.volume_info(id)).map_or(0, |v| v.size);
        done.push(json!({
            "volume": name, "extents_before": r.extents_before, "extents_after": r.extents_after,
            "windows_moved": r.windows_moved, "moved_bytes": r.blocks_moved * 4096,
            "windows_skipped": r.windows_skipped, "stopped": r.stopped,
            "snapshot_windows_moved": r.snapshot_windows_moved, "snapshot_moved_bytes": r.snapshot_blocks_moved * 4096,
            "cleared_bytes": r.blocks_cleared * 4096,
        }));
        if r.stopped {
            log::warn!("compaction stopped at volume {name}: the client went away; run it again to go on");
            return Ok(json!({ "volumes": done }));
        }
    }
    // The whole pool: partly used regions left behind are cleaned too.
    let regions = match volume {
        Some(_) => Value::Null,
        None => {
            let r = pool.clean_regions(&mut |d, t| {
                (ctx.progress)(d, t);
                tarn_engine::scrub::throttle(rate, looked + d * 4096, started);
                !(ctx.abandoned)()
            })?;
            json!({
                "region_bytes": tarn_engine::volumes::clean::CLEAN_REGION_BLOCKS * 4096,
                "free_regions_before": r.free_regions_before, "free_regions_after": r.free_regions_after,
                "cleaned": r.candidates, "freed": r.regions_freed, "moved_bytes": r.blocks_moved * 4096,
                "stopped": r.stopped,
            })
        }
    };
    Ok(json!({ "volumes": done, "regions": regions }))
}

fn vol_flatten(pool: &Pool, name: &str, ctx: &mut Ctx) -> Result<Value, EngineError> {
    let id = pool.volume_id(name).ok_or_else(|| EngineError::NoSuchVolume(name.to_string()))?;
    let origin = pool.volume_info(id).and_then(|v| v.origin);
    pool.flatten(name, ctx.progress)?;
    let after = pool.volume_info(id).ok_or(EngineError::VolumeGone(id))?;
    Ok(json!({ "volume": volume_json(&after), "detached_from": origin }))
}

fn rollback(pool: &Pool, volume: &str, name: &str, destroy_newer: bool, ctx: &Ctx) -> Result<Value, EngineError> {
    let target = pool.snapshot_info(volume, name)?;
    // Only what the rollback will destroy (newer snapshots), named for the report.
    let newer: Vec<String> =
        pool.list_snapshots(Some(volume))?.into_iter().filter(|s| s.epoch > target.epoch).map(|s| s.name).collect();
    pool.rollback(volume, name, destroy_newer)?;
    let id = pool.volume_id(volume);
    let connected = match (ctx.clients, id) {
        (Some(c), Some(id)) => c.connected(id, View::Head),
        _ => 0,
    };
    Ok(json!({ "volume": volume, "snapshot": name, "destroyed": newer, "connected": connected }))
}

/// Bytes changed between two views of a volume, as merged (offset, length)
/// ranges: the same answer the NBD dirty-bitmap context gives.
fn diff(pool: &Pool, volume: &str, from: &str, to: Option<&str>) -> Result<Value, EngineError> {
    let (id, since) = snapshot_epoch(pool, volume, from)?;
    let (view, to_name) = match to {
        None => (View::Head, volume.to_string()),
        Some(snap) => (View::Snapshot(snapshot_epoch(pool, volume, snap)?.1), format!("{volume}@{snap}")),
    };
    if let View::Snapshot(e) = view {
        if e < since {
            return Err(EngineError::InvalidArgument(format!("{to_name} is older than {volume}@{from}; swap them")));
        }
    }
    let size = pool.view_size(id, view).ok_or(EngineError::VolumeGone(id))?;
    let ranges = changed_ranges(pool, id, view, since, size)?;
    let changed: u64 = ranges.iter().map(|r| r.1).sum();
    let from = format!("{volume}@{from}");
    Ok(json!({ "from": from, "to": to_name, "size": size, "ranges": ranges, "changed_bytes": changed }))
}

/// The volume id and epoch of `volume@snap`, or the engine's error naming
/// what is missing.
fn snapshot_epoch(pool: &Pool, volume: &str, snap: &str) -> Result<(u32, u64), EngineError> {
    match pool.lookup_view(&format!("{volume}@{snap}")) {
        Some((id, View::Snapshot(epoch))) => Ok((id, epoch)),
        _ => pool
            .snapshot_info(volume, snap)
            .and(Err(EngineError::NoSuchSnapshot { volume: volume.to_string(), name: snap.to_string() })),
    }
}

fn changed_ranges(pool: &Pool, id: u32, view: View, since: u64, size: u64) -> Result<Vec<(u64, u64)>, EngineError> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut offset = 0;
    // Each answer covers at most 1 GiB (and may stop earlier): ask again from where it ended.
    while offset < size {
        let start = offset;
        for r in pool.changed_runs(id, view, since, offset, size - offset)? {
            if r.changed {
                push_range(&mut ranges, offset, r.length);
            }
            offset += r.length;
        }
        if offset == start {
            return Err(EngineError::Inconsistent(format!("changed-block answer at offset {offset} covers nothing")));
        }
    }
    Ok(ranges)
}

/// Append a range, merged with the last one when they touch (answers split at call boundaries).
fn push_range(ranges: &mut Vec<(u64, u64)>, offset: u64, length: u64) {
    match ranges.last_mut() {
        Some(last) if last.0 + last.1 == offset => last.1 += length,
        _ => ranges.push((offset, length)),
    }
}

/// `vol set`: the placement, then the quota (each refused by name before
/// anything changes when it is wrong; nothing given is an error).
fn vol_set(
    pool: &Pool,
    name: &str,
    placement: Option<&str>,
    quota: Option<u64>,
    devices: Option<u16>,
) -> Result<Value, String> {
    let placement = placement.map(placement_named).transpose()?;
    if placement.is_none() && quota.is_none() && devices.is_none() {
        return Err("vol set needs --placement, --quota or --devices".into());
    }
    if let Some(q) = quota.filter(|&q| q != 0) {
        // Checked before the placement changes, so a refused quota changes
        // nothing (the engine checks again under its lock).
        let v = pool.list_volumes().into_iter().find(|v| v.name == name);
        let v = v.ok_or_else(|| EngineError::NoSuchVolume(name.to_string()).to_string())?;
        let used = v.allocated + v.snapshot_bytes;
        if q < used {
            return Err(EngineError::QuotaBelowUse { volume: name.to_string(), quota: q, used }.to_string());
        }
    }
    let mut v = None;
    if let Some(p) = placement {
        v = Some(pool.set_placement(name, p).map_err(|e| e.to_string())?);
    }
    if let Some(q) = quota {
        v = Some(pool.set_quota(name, (q != 0).then_some(q)).map_err(|e| e.to_string())?);
    }
    if let Some(d) = devices {
        v = Some(pool.set_volume_devices(name, d).map_err(|e| e.to_string())?);
    }
    v.map(|v| volume_json(&v)).ok_or_else(|| format!("volume {name} vanished"))
}

/// A volume; `used` is its own space (head + only-in-snapshots, what its
/// quota counts), `shared` what a clone still reads from its origin.
pub fn volume_json(v: &VolumeInfo) -> Value {
    json!({
        "name": v.name, "id": v.id, "size": v.size, "allocated": v.allocated, "extents": v.extents,
        "snapshots": v.snapshots, "snapshot_bytes": v.snapshot_bytes,
        "origin": v.origin, "origin_bytes": v.origin_bytes,
        "used": v.allocated + v.snapshot_bytes, "exclusive": v.allocated + v.snapshot_bytes,
        "shared": v.origin_bytes, "quota": v.quota,
        "placement": v.placement, "placement_default": !v.placement_own,
        "devices": (0..16).filter(|d| v.devices & (1 << d) != 0).collect::<Vec<u16>>(),
        "stripe": v.stripe.map(|s| json!({
            "width": s.width(), "unit": s.unit_blocks() * 4096,
            "members": (0..16).filter(|d| s.devices & (1 << d) != 0).collect::<Vec<u16>>(),
        })),
        "parity": v.parity.map(|p| json!({
            "data": p.data_units(), "unit": p.unit_blocks() * 4096,
            "members": (0..16).filter(|d| p.devices & (1 << d) != 0).collect::<Vec<u16>>(),
        })),
    })
}

/// Blocks of a volume `vol_map` resolves per call: each call reads the
/// map under the pool lock (shared), so a writer waits for at most one
/// window's runs (16,384 at most), not a whole fragmented volume's.
const MAP_WINDOW: u64 = 16384;

/// Every mapped run of a volume's head: `[lba, len, device, block]` in
/// blocks, logical order.
fn vol_map(pool: &Pool, name: &str) -> Result<Value, EngineError> {
    let (id, view) = pool.lookup_view(name).ok_or_else(|| EngineError::NoSuchVolume(name.to_string()))?;
    let blocks = pool.view_size(id, view).unwrap_or(0) / tarn_format::BLOCK_SIZE;
    let mut out: Vec<Value> = Vec::new();
    for lba in (0..blocks).step_by(MAP_WINDOW as usize) {
        for r in pool.physical_runs(id, view, lba, MAP_WINDOW.min(blocks - lba))? {
            // A run cut by a window edge is joined again, so the listing
            // is the same as one call over the whole volume.
            match out.last_mut().and_then(Value::as_array_mut) {
                Some(last) if r.lba == lba && joins(last, r.lba, r.device, r.block) => {
                    last[1] = json!(num(&last[1]) + r.len)
                }
                _ => out.push(json!([r.lba, r.len, r.device, r.block])),
            }
        }
    }
    Ok(Value::Array(out))
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Whether the run `[lba, len, device, block]` goes on where `last` ends,
/// logically and physically.
fn joins(last: &[Value], lba: u64, device: u16, block: u64) -> bool {
    let (l, n, d, b) = (num(&last[0]), num(&last[1]), num(&last[2]), num(&last[3]));
    l + n == lba && d == u64::from(device) && b + n == block
}

/// A placement policy by name; "default" is None (the pool's default).
fn placement_named(name: &str) -> Result<Option<PlacementKind>, String> {
    if name == "default" {
        return Ok(None);
    }
    PlacementKind::parse(name)
        .map(Some)
        .ok_or_else(|| format!("unknown placement {name:?}: one of {}, or default", PlacementKind::NAMES.join(", ")))
}

pub fn snapshot_json(s: &SnapshotInfo) -> Value {
    json!({
        "volume": s.volume, "name": s.name, "epoch": s.epoch, "size": s.size, "created": s.created,
        "exclusive": s.exclusive, "shared": s.shared, "referenced": s.referenced, "clones": s.clones,
    })
}

fn cache_json(s: &PoolStatus) -> Value {
    let c = &s.metadata_cache;
    json!({
        "budget": s.metadata_budget, "capacity": c.capacity, "bytes": c.bytes, "nodes": c.nodes,
        "hits": c.hits, "misses": c.misses, "evictions": c.evictions,
        "hit_rate": s.metadata_cache_hit_rate(), "dirty_nodes": s.dirty_nodes, "healed_nodes": s.healed_nodes,
        "fetched_unlocked": s.node_fetches,
    })
}

fn device_json(d: &tarn_engine::DeviceStatus) -> Value {
    json!({
        "index": d.index, "path": d.path, "size": d.size, "data": d.data_bytes, "free": d.free_bytes,
        "state": d.state, "placement": d.placement, "legs": d.legs.iter().map(|l| json!({
            "index": l.index, "path": l.path, "uuid": l.uuid, "state": l.state,
            "read_errors": l.read_errors, "write_errors": l.write_errors, "healed_blocks": l.healed_blocks,
        })).collect::<Vec<_>>(),
    })
}

pub fn status_json(s: &PoolStatus) -> Value {
    let mut v = json!({
        "uuid": s.uuid, "state": s.state,
        "size": s.size, "used": s.used, "free": s.free, "reserved": s.reserved, "freeing": s.freeing,
        "free_outside_regions": s.free_outside_regions,
        "metadata": s.metadata, "journal_size": s.journal_size,
        "volumes": s.volumes, "virtual_size": s.virtual_size, "overcommit_ratio": s.overcommit_ratio,
        "epoch": s.epoch, "commit_seq": s.commit_seq, "placement": s.placement, "strict": s.strict,
        "notes": s.notes,
        "fenced": s.fenced, "checksums": s.checksums, "checksum_errors": s.checksum_errors, "read_errors": s.read_errors,
        "healed_blocks": s.healed_blocks, "reconstructed_blocks": s.reconstructed_blocks,
        "resynced_blocks": s.resynced_blocks,
        "coarse_sums": s.coarse_sums, "coarse_groups": s.coarse_groups, "split_groups": s.split_groups,
    });
    v["devices"] = s.devices.iter().map(device_json).collect();
    v["format"] = json!(s.format);
    v["expansion"] = s.expansion.map_or(Value::Null, |e| {
        json!({"at_percent": e.at_percent, "step": e.step, "max": e.max, "device": e.device, "expansions": s.expansions})
    });
    v["file_volumes"] = json!(s.file_volumes);
    v["overcommit_limit"] = json!(s.overcommit_limit);
    v["metadata_cache"] = cache_json(s);
    v["inline_dead_lists"] = json!(s.inline_dead_lists);
    v
}

fn fs_create(pool: &Pool, name: &str, quota: u64) -> Result<Value, String> {
    // The root directory belongs to whoever ran the command.
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    tarn_fs::FileVolume::format(pool, name, quota, uid, gid).map_err(|e| e.to_string())?;
    let fv = pool.file_volume(name).ok_or_else(|| format!("file volume {name} vanished"))?;
    Ok(json!({ "name": fv.name, "quota": quota, "objects": fv.objects, "used": fv.allocated }))
}

fn file_volume_json(f: &tarn_engine::FileVolumeInfo) -> Value {
    json!({ "name": f.name, "id": f.id, "objects": f.objects, "used": f.allocated })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_across_answers() {
        let mut r = Vec::new();
        push_range(&mut r, 0, 4096);
        push_range(&mut r, 4096, 4096);
        push_range(&mut r, 16384, 4096);
        assert_eq!(r, vec![(0, 8192), (16384, 4096)]);
    }

    #[test]
    fn old_vol_delete_requests_still_parse() {
        let r: Request = serde_json::from_str(r#"{"op":"vol_delete","name":"v"}"#).expect("parse");
        assert!(matches!(r, Request::VolDelete { recursive: false, .. }));
    }
}
