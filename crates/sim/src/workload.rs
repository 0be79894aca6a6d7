//! The snapshot workload: writes, trims, flushes, reads of heads and
//! snapshots, crashes and reopens, mixed with snapshot create and delete,
//! rollbacks, clones (of clones too), flatten, and volume create, resize
//! and delete, each sometimes in a way the pool must refuse (bad or taken
//! names, snapshots with clones, newer snapshots in the way).

use crate::admin::{Expect, Pending};
use crate::model::BLOCK;
use crate::run::Run;
use rand::Rng;
use tarn_engine::{EngineError, HintTarget};

/// Volumes (clones included) the snapshot workload keeps at most.
const MAX_VOLUMES: usize = 7;
/// Volume sizes of the snapshot workload, in blocks: small, so snapshots overlap a lot.
const MIN_BLOCKS: usize = 8;
const MAX_BLOCKS: usize = 256;
/// The engine's limit on generations of clones.
const MAX_CLONE_DEPTH: usize = 16;

/// Cleaning regions of the simulation's pools: 16 blocks, small enough
/// that volumes of 8-256 blocks leave partly used ones behind.
const CLEAN_BLOCKS: u64 = 16;

/// Names every operation must refuse.
fn bad_name(pick: usize) -> String {
    match pick % 6 {
        0 => String::new(),
        1 => "a@b".into(),
        2 => "x/y".into(),
        3 => "has space".into(),
        4 => "tab\there".into(),
        _ => "n".repeat(129),
    }
}

impl Run {
    pub(crate) fn step_snapshots(&mut self) -> Result<(), String> {
        if self.model.vols.is_empty() {
            return self.snap_volume_op();
        }
        match self.rng.random_range(0..103) {
            0..=29 => self.write(),
            30..=37 => self.trim_or_zero(),
            38..=44 => self.flush(),
            45..=50 => self.read_view_compare(),
            51..=56 => self.crash_and_verify(),
            57..=58 => self.clean_reopen(),
            59..=64 => self.arm_crash(),
            65..=72 => self.snapshot_create(),
            73..=77 => self.snapshot_delete(),
            78..=81 => self.rollback(),
            82..=85 => self.clone_create(),
            86..=88 => self.flatten(),
            89..=92 => self.snap_volume_op(),
            93 => self.compact(),
            94 => self.hint(),
            95 => self.dev_add(),
            96 => self.dev_grow(),
            97 => self.set_quota(),
            98 => self.set_overcommit(),
            99 => self.dev_remove(),
            100 => self.device_placement_op(),
            101 => self.spare_op(),
            _ => self.verify_all("periodic check"),
        }
    }

    /// A name from `prefix0..prefix{n-1}`, or (sometimes) an invalid one.
    fn pick_name(&mut self, prefix: &str, n: usize) -> (String, bool) {
        if self.rng.random_bool(0.06) {
            return (bad_name(self.rng.random_range(0..6)), true);
        }
        (format!("{prefix}{}", self.rng.random_range(0..n)), false)
    }

    /// A random (volume, snapshot) of the model.
    fn pick_snapshot(&mut self) -> Option<(String, String)> {
        let all: Vec<(String, String)> = self
            .model
            .vols
            .iter()
            .flat_map(|(v, m)| m.snaps.iter().map(move |s| (v.clone(), s.name.clone())))
            .collect();
        if all.is_empty() {
            return None;
        }
        Some(all[self.rng.random_range(0..all.len())].clone())
    }

    fn snapshot_create(&mut self) -> Result<(), String> {
        let (vol, _, size) = self.any_volume();
        let (snap, bad) = self.pick_name("s", 6);
        let expect = match () {
            _ if bad => Err("InvalidArgument"),
            _ if self.model.vol(&vol).snap(&snap).is_some() => Err("SnapshotExists"),
            _ => Ok(()),
        };
        let r = self.pool().create_snapshot(&vol, &snap);
        trace!("snapshot {vol}@{snap:?}: {:?}", r.as_ref().map(|i| (i.epoch, i.referenced)));
        if let Ok(info) = &r {
            if info.size != size as u64 || info.exclusive != 0 || !info.clones.is_empty() {
                return Err(format!("new snapshot {vol}@{snap}: {info:?} (volume size {size})"));
            }
        }
        self.admin_outcome(Pending::SnapCreate { vol, snap }, expect, r).map(drop)
    }

    fn snapshot_delete(&mut self) -> Result<(), String> {
        let Some((vol, mut snap)) = self.pick_snapshot() else {
            return self.snapshot_create();
        };
        if self.rng.random_bool(0.06) {
            snap = "nope".into();
        }
        let v = self.model.vol(&vol);
        let expect = match v.snap(&snap) {
            None => Err("NoSuchSnapshot"),
            Some(s) if !self.model.clones_of(v.uid, Some(s.uid)).is_empty() => Err("InUse"),
            Some(_) => Ok(()),
        };
        let before = self.pool().snapshot_info(&vol, &snap).ok();
        let r = self.pool().delete_snapshot(&vol, &snap);
        trace!("delete snapshot {vol}@{snap}: {r:?}");
        if let (Ok(freed), Some(info)) = (&r, &before) {
            if *freed != info.exclusive {
                return Err(format!(
                    "deleting {vol}@{snap} freed {freed} bytes; it held {} exclusively",
                    info.exclusive
                ));
            }
            self.check_freed(&vol, &snap, *freed)?;
        }
        self.admin_outcome(Pending::SnapDelete { vol, snap }, expect, r).map(drop)
    }

    /// Bytes a snapshot delete freed must be what the model says only it held.
    fn check_freed(&mut self, vol: &str, snap: &str, freed: u64) -> Result<(), String> {
        let v = self.model.vol(vol);
        let i = v.snap_index(snap).expect("deleted snapshot in the model");
        let Some(options) = crate::accounting::possible(&self.model, v) else {
            self.stats.space_skipped += 1;
            return Ok(());
        };
        if options.iter().any(|o| o.snaps[i].0 * BLOCK as u64 == freed) {
            return Ok(());
        }
        let model: Vec<u64> = options.iter().map(|o| o.snaps[i].0 * BLOCK as u64).collect();
        Err(format!("deleting {vol}@{snap} freed {freed} bytes; the model says {model:?}"))
    }

    fn rollback(&mut self) -> Result<(), String> {
        let Some((vol, mut snap)) = self.pick_snapshot() else {
            return self.snapshot_create();
        };
        if self.rng.random_bool(0.5) {
            snap = self.model.vol(&vol).snaps.last().expect("picked volume has snapshots").name.clone();
        }
        if self.rng.random_bool(0.04) {
            snap = "nope".into();
        }
        let destroy_newer = self.rng.random_bool(0.5);
        let expect = self.rollback_expect(&vol, &snap, destroy_newer);
        let r = self.pool().rollback(&vol, &snap, destroy_newer);
        trace!("rollback {vol}@{snap} destroy_newer {destroy_newer}: {r:?}");
        self.admin_outcome(Pending::Rollback { vol, snap }, expect, r).map(drop)
    }

    /// Newer snapshots are in the way unless destroyed, and cannot be if cloned.
    fn rollback_expect(&self, vol: &str, snap: &str, destroy_newer: bool) -> Expect {
        let v = self.model.vol(vol);
        let Some(i) = v.snap_index(snap) else {
            return Err("NoSuchSnapshot");
        };
        let newer = &v.snaps[i + 1..];
        let cloned = newer.iter().any(|s| !self.model.clones_of(v.uid, Some(s.uid)).is_empty());
        if (!newer.is_empty() && !destroy_newer) || cloned {
            return Err("InUse");
        }
        Ok(())
    }

    fn clone_create(&mut self) -> Result<(), String> {
        if self.model.vols.len() >= MAX_VOLUMES {
            return self.flatten();
        }
        let Some((vol, mut snap)) = self.pick_snapshot() else {
            return self.snapshot_create();
        };
        if self.rng.random_bool(0.04) {
            snap = "nope".into();
        }
        let (mut clone, bad) = self.pick_name("c", 6);
        if !bad && self.rng.random_bool(0.05) {
            clone = vol.clone();
        }
        let expect = match () {
            _ if bad => Err("InvalidArgument"),
            _ if self.model.vols.contains_key(&clone) => Err("VolumeExists"),
            _ if self.model.vol(&vol).snap(&snap).is_none() => Err("NoSuchSnapshot"),
            _ if self.over_ratio(0, self.model.vol(&vol).snap(&snap).map_or(0, |s| s.data.len())) => Err("Overcommit"),
            _ if self.model.clone_depth(&vol) + 1 > MAX_CLONE_DEPTH => Err("InvalidArgument"),
            _ => Ok(()),
        };
        let r = self.pool().create_clone(&vol, &snap, &clone);
        trace!("clone {vol}@{snap} as {clone:?}: {:?}", r.as_ref().map(|i| i.id));
        if let Ok(info) = &r {
            let size = self.model.vol(&vol).snap(&snap).map_or(0, |s| s.data.len() as u64);
            if info.origin.as_deref() != Some(format!("{vol}@{snap}").as_str()) || info.size != size {
                return Err(format!("new clone {clone}: {info:?}, expected origin {vol}@{snap}, size {size}"));
            }
        }
        self.admin_outcome(Pending::CloneCreate { vol, snap, clone }, expect, r).map(drop)
    }

    fn flatten(&mut self) -> Result<(), String> {
        let clones: Vec<String> =
            self.model.vols.iter().filter(|(_, v)| v.origin.is_some()).map(|(n, _)| n.clone()).collect();
        if clones.is_empty() && self.model.vols.len() < MAX_VOLUMES && self.rng.random_bool(0.7) {
            return self.clone_create();
        }
        let vol = if !clones.is_empty() && self.rng.random_bool(0.85) {
            clones[self.rng.random_range(0..clones.len())].clone()
        } else {
            self.any_volume().0
        };
        let expect = if self.model.vol(&vol).origin.is_some() { Ok(()) } else { Err("InvalidArgument") };
        let mut progress: Vec<(u64, u64)> = Vec::new();
        let r = self.pool().flatten(&vol, &mut |done, total| progress.push((done, total)));
        trace!("flatten {vol}: {r:?} after {} progress calls", progress.len());
        check_progress(&progress, r.is_ok()).map_err(|e| format!("flatten {vol}: {e}"))?;
        if matches!(r, Err(EngineError::NoSpace)) && !self.any_dead() && expect.is_ok() {
            self.stats.enospc += 1;
            return self.after_flatten_enospc(&vol);
        }
        self.admin_outcome(Pending::Flatten { vol }, expect, r).map(drop)
    }

    /// Re-lay out a volume, and half the time clean the pool's partly
    /// used regions after it (`pool compact`): its contents, its
    /// snapshots' and its clones' stay the same (checked by the next
    /// verification).
    fn compact(&mut self) -> Result<(), String> {
        let (vol, _, _) = self.any_volume();
        let clean = self.rng.random_bool(0.5);
        let mut progress: Vec<(u64, u64)> = Vec::new();
        let r = self.pool().relayout(&vol, &mut |done, total| progress.push((done, total)));
        trace!("compact {vol}: {r:?}");
        check_progress(&progress, r.is_ok()).map_err(|e| format!("compact {vol}: {e}"))?;
        let r = match r {
            Ok(report) if clean => self.pool().clean_regions_of(CLEAN_BLOCKS, &mut |_, _| true).map(|c| {
                trace!("clean: {c:?}");
                self.stats.blocks_cleaned += c.blocks_moved as usize;
                report
            }),
            other => other,
        };
        if let Ok(report) = &r {
            self.stats.blocks_relaid += report.blocks_moved as usize;
            self.stats.blocks_cleared_for_gathering += report.blocks_cleared as usize;
        }
        self.admin_outcome(Pending::Compact { vol }, Ok(()), r).map(drop)
    }

    /// File-system hints: a few random block ranges of a volume moved to
    /// a cluster, to the device or back (`vol unhint`); contents of the
    /// volume, its snapshots and clones stay (checked by the next
    /// verification), a crash mid-move loses nothing.
    fn hint(&mut self) -> Result<(), String> {
        let (vol, _, size) = self.any_volume();
        let blocks = (size / BLOCK) as u64;
        let mut ranges = Vec::new();
        let mut at = 0;
        for _ in 0..self.rng.random_range(1..4) {
            if at >= blocks {
                break;
            }
            let first = self.rng.random_range(at..blocks);
            let len = self.rng.random_range(1..=(blocks - first).min(64));
            ranges.push((first, len));
            at = first + len;
        }
        let target = [HintTarget::Cluster, HintTarget::Device(0), HintTarget::Natural][self.rng.random_range(0..3)];
        let r = self.pool().place_hinted(&vol, &ranges, target, &mut |_, _| {});
        trace!("hint {vol} {ranges:?} to {target:?}: {r:?}");
        if let Ok(report) = &r {
            self.stats.blocks_hinted += report.blocks_moved as usize;
        }
        self.admin_outcome(Pending::Hint { vol }, Ok(()), r).map(drop)
    }

    /// A flatten that ran out of space copied some markers. Commit them, so
    /// that what is copied is also what is durable, and count what is left.
    fn after_flatten_enospc(&mut self, vol: &str) -> Result<(), String> {
        let r = self.pool().flush();
        trace!("flush after the flatten ran out of space: {r:?}");
        if let Err(e) = r {
            self.model.flatten_partly(vol);
            return if self.any_dead() { self.crash_and_verify() } else { Err(format!("flush: {e}")) };
        }
        let info = self.pool().volume_id(vol).and_then(|id| self.pool().volume_info(id)).ok_or("clone gone")?;
        let left = info.origin_bytes as usize / BLOCK;
        // A parity clone's origin marker also covers its parity area,
        // which the model does not keep: what is left says nothing exact
        // about the data's markers.
        let exact = info.parity.is_none()
            && self.model.flatten_prefix(vol, left).map_err(|e| format!("flatten {vol} out of space: {e}"))?;
        if !exact {
            self.model.flatten_partly(vol);
        }
        self.model.flushed();
        Ok(())
    }

    /// Create, resize or delete (with or without snapshots) a volume.
    fn snap_volume_op(&mut self) -> Result<(), String> {
        let roll = self.rng.random_range(0..10);
        let bases = self.model.vols.keys().filter(|n| n.starts_with('v')).count();
        let room = self.model.vols.len() < MAX_VOLUMES && bases < 4;
        if self.model.vols.is_empty() || (roll < 4 && room) {
            return self.volume_create();
        }
        let (name, _, from) = self.any_volume();
        if roll < 7 {
            let to = self.rng.random_range(MIN_BLOCKS..=MAX_BLOCKS) * BLOCK;
            // Shrinking discards the tail: refused unless allowed.
            let allow_shrink = self.rng.random_bool(0.8);
            let parity = self.pool().volume_id(&name).and_then(|id| self.pool().volume_info(id)).and_then(|i| i.parity);
            let expect = match () {
                // A parity volume's size is fixed (its parity area follows its data rows).
                _ if parity.is_some() => Err("InvalidArgument"),
                _ if to < from && !allow_shrink => Err("InvalidArgument"),
                _ if self.over_ratio(from, to) => Err("Overcommit"),
                _ => Ok(()),
            };
            let r = self.pool().resize_volume(&name, to as u64, allow_shrink);
            trace!("resize {name} {from} -> {to} allow_shrink {allow_shrink}: {:?}", r.as_ref().map(|i| i.size));
            return self.admin_outcome(Pending::VolResize { name, from, to }, expect, r).map(drop);
        }
        self.volume_delete(name)
    }

    fn volume_create(&mut self) -> Result<(), String> {
        let name = format!("v{}", self.rng.random_range(0..4));
        let size = self.rng.random_range(MIN_BLOCKS..=MAX_BLOCKS) * BLOCK;
        let expect = match () {
            _ if self.model.vols.contains_key(&name) => Err("VolumeExists"),
            _ if self.over_ratio(0, size) => Err("Overcommit"),
            _ => Ok(()),
        };
        let placement = self.any_placement();
        if self.rng.random_bool(0.3) {
            return self.striped_create(name, size, placement, expect);
        }
        if self.rng.random_bool(0.25) {
            return self.parity_create(name, size, placement, expect);
        }
        let r = self.pool().create_volume_placed(&name, size as u64, placement);
        trace!("create volume {name} {size} {placement:?}: {:?}", r.as_ref().map(|i| i.id));
        self.admin_outcome(Pending::VolCreate { name, size }, expect, r).map(drop)
    }

    /// A volume striped (op 20) over 2 or 3 members in units of 4 to 64
    /// KiB: refused when fewer members are usable; its layout recorded.
    fn striped_create(
        &mut self,
        name: String,
        size: usize,
        placement: Option<tarn_engine::PlacementKind>,
        expect: crate::admin::Expect,
    ) -> Result<(), String> {
        let width = self.rng.random_range(2..=3u32);
        let unit = 4096u64 << self.rng.random_range(0..5);
        let usable = self.usable_members();
        let expect = expect.and(if usable < width as usize { Err("InvalidArgument") } else { Ok(()) });
        let opts = tarn_engine::VolumeOptions { placement, stripe: Some((width, unit)), ..Default::default() };
        let r = self.pool().create_volume_with(&name, size as u64, &opts);
        trace!("create volume {name} {size} striped {width}x{unit}: {:?}", r.as_ref().map(|i| (i.id, i.stripe)));
        let Some(info) = self.admin_outcome(Pending::StripedCreate { name, size }, expect, r)? else { return Ok(()) };
        match info.stripe {
            Some(s) if s.width() == width && s.unit_blocks() * 4096 == unit => Ok(()),
            s => Err(format!("volume {} created striped {width}x{unit}: {s:?}", info.name)),
        }
    }

    /// Members new data can go to (not spare, missing, removed or
    /// draining; a mirrored member may be DEGRADED and still takes data).
    fn usable_members(&self) -> usize {
        let devices = self.pool().status().devices;
        devices.iter().filter(|d| !matches!(d.state, "SPARE" | "MISSING" | "REMOVED" | "DRAINING")).count()
    }

    /// A volume with parity (op 21) over 2 data members and one, in units
    /// of 4 to 64 KiB: refused when fewer than 3 members are usable.
    fn parity_create(
        &mut self,
        name: String,
        size: usize,
        placement: Option<tarn_engine::PlacementKind>,
        expect: crate::admin::Expect,
    ) -> Result<(), String> {
        let unit = 4096u64 << self.rng.random_range(0..5);
        let usable = self.usable_members();
        let expect = expect.and(if usable < 3 { Err("InvalidArgument") } else { Ok(()) });
        let opts = tarn_engine::VolumeOptions { placement, parity: Some((2, unit)), ..Default::default() };
        let r = self.pool().create_volume_with(&name, size as u64, &opts);
        trace!("create volume {name} {size} parity 2+1x{unit}: {:?}", r.as_ref().map(|i| (i.id, i.parity)));
        let Some(info) = self.admin_outcome(Pending::ParityCreate { name, size }, expect, r)? else { return Ok(()) };
        match info.parity {
            Some(p) if p.data_units() == 2 && p.unit_blocks() * 4096 == unit => Ok(()),
            p => Err(format!("volume {} created with parity 2+1x{unit}: {p:?}", info.name)),
        }
    }

    fn volume_delete(&mut self, name: String) -> Result<(), String> {
        let with_snapshots = self.rng.random_bool(0.5);
        let v = self.model.vol(&name);
        let expect = match () {
            _ if !self.model.clones_of(v.uid, None).is_empty() => Err("InUse"),
            _ if !v.snaps.is_empty() && !with_snapshots => Err("InUse"),
            _ => Ok(()),
        };
        let r = self.pool().delete_volume(&name, with_snapshots);
        trace!("delete volume {name} with_snapshots {with_snapshots}: {r:?}");
        self.admin_outcome(Pending::VolDelete { name }, expect, r).map(drop)
    }

    /// Read a random range of a random view (head or snapshot) and compare.
    fn read_view_compare(&mut self) -> Result<(), String> {
        let (name, id, _) = self.any_volume();
        let nsnaps = self.model.vol(&name).snaps.len();
        let snap = self.rng.random_range(0..=nsnaps).checked_sub(1);
        let m = self.model.vol(&name);
        let (data, what) = match snap {
            None => (&m.current, name.clone()),
            Some(i) => (&m.snaps[i].data, format!("{name}@{}", m.snaps[i].name)),
        };
        let size = data.len();
        let (off, len) = self.range(size, 128 << 10);
        let view = self.pool().lookup_view(&what).ok_or(format!("{what} missing"))?.1;
        let mut buf = vec![0u8; len];
        self.pool().read_view(id, view, off as u64, &mut buf).map_err(|e| format!("read {what}: {e}"))?;
        trace!("read {what} {off}+{len}");
        let m = self.model.vol(&name);
        let (data, ids) = match snap {
            None => (&m.current, &m.ids),
            Some(i) => (&m.snaps[i].data, &m.snaps[i].ids),
        };
        if buf != data[off..off + len] {
            return Err(format!("read of {what} at {off}+{len} differs from the model"));
        }
        self.check_block_status(id, view, ids, off, len).map_err(|e| format!("{what}: {e}"))
    }
}

/// Progress never passes the total, which stays the same, and a finished
/// flatten reports done == total last.
fn check_progress(calls: &[(u64, u64)], finished: bool) -> Result<(), String> {
    if calls.iter().any(|&(d, t)| d > t || t != calls[0].1) {
        return Err(format!("progress calls {calls:?}"));
    }
    match calls.last() {
        Some((d, t)) if finished && d != t => Err(format!("finished with progress {d} of {t}")),
        None if finished => Err("finished without a progress call".into()),
        _ => Ok(()),
    }
}
