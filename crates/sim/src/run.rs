//! One seeded simulation run: random operations against a pool on simulated
//! devices and against the model, power cuts at random device calls,
//! reopen, compare, check. Any failure names its seed; `TARN_SEED=N`
//! replays it exactly. The data operations, crash handling and the basic
//! workload live here; the snapshot workload in `workload.rs`, admin
//! outcomes in `admin.rs`, settling after a crash in `settle.rs`, the
//! comparisons in `verify.rs`, space accounting in `accounting.rs`.

use crate::admin::Pending;
use crate::device::SimDevice;
use crate::model::{Effect, Model, BLOCK};
use crate::settle::Seen;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tarn_engine::{create_mirrored_pool, CreateOptions, Device, EngineError, OpenOptions, PlacementKind, Pool, View};

/// Which operations a run mixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Writes, trims, flushes, volume create/resize/delete, crashes.
    Basic,
    /// The same on small volumes, plus snapshots, rollbacks, clones,
    /// flatten, deletes with and without snapshots.
    Snapshots,
}

/// Knobs of a run (small sizes keep hundreds of seeds within seconds).
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub steps: usize,
    pub device_bytes: u64,
    pub max_devices: usize,
    pub journal_bytes: u64,
    pub workload: Workload,
    /// A quarter of the runs use devices this small instead, so that space
    /// runs out (snapshots hold old versions).
    pub tight_bytes: Option<u64>,
    /// The primary is a mirror of two devices (a power cut on one leg then
    /// faults it and the pool goes on, until the crash of all devices).
    pub mirror: bool,
    /// Negative controls: break what the simulation must catch.
    pub control: Option<Control>,
    /// A fifth of the writes are long aligned runs (coarse checksum groups
    /// to write and split). (Parity seed 15 failed with them on a clone's
    /// changed blocks before the parity rebuild work was merged; on the
    /// merged code 800 parity seeds pass with them, so they are on there
    /// too.)
    pub long_writes: bool,
}

/// A deliberate defect for a negative control: the simulation must fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// The devices answer flushes without making anything durable.
    IgnoreFlushes,
    /// Replay stops at the end of the superblock's journal side: commits
    /// answered while a checkpoint was written are lost at a crash.
    ReplayOneSide,
    /// Devices added mid-run answer flushes without making anything
    /// durable: a crash after an add loses the member's label and nodes.
    AddedDeviceIgnoresFlushes,
    /// A coarse checksum group freed in part is split in the record after
    /// the free: a crash between leaves the group coarse with blocks free,
    /// and new data there fails the blocks still referenced.
    SplitLate,
    /// A checkpoint that keeps a dead list in its catalog drops the list's
    /// last entry (INLINE_DEAD_LISTS): snapshots lose a version.
    InlineDropsEntry,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            steps: 300,
            device_bytes: 6 << 20,
            max_devices: 2,
            journal_bytes: 64 << 10,
            workload: Workload::Basic,
            tight_bytes: None,
            mirror: false,
            control: None,
            long_writes: true,
        }
    }
}

impl SimConfig {
    /// The snapshot workload on up to 4 members (1 to 4 at the start), so
    /// parity volumes (3 members) are created in most runs.
    pub fn parity() -> Self {
        SimConfig { max_devices: 4, device_bytes: 6 << 20, ..SimConfig::snapshots() }
    }

    /// The snapshot workload's defaults.
    pub fn snapshots() -> Self {
        SimConfig {
            steps: 250,
            device_bytes: 8 << 20,
            workload: Workload::Snapshots,
            tight_bytes: Some(2 << 20),
            ..SimConfig::default()
        }
    }
}

/// Admin operations, as counted in [`RunStats::done`].
pub const OP_NAMES: [&str; 22] = [
    "vol create",
    "vol resize",
    "vol delete",
    "snapshot",
    "snap delete",
    "rollback",
    "clone",
    "flatten",
    "compact",
    "hint",
    "dev add",
    "dev grow",
    "vol quota",
    "overcommit",
    "dev remove",
    "dev placement",
    "vol devices",
    "spare add",
    "spare take",
    "spare drop",
    "vol create striped",
    "vol create parity",
];

#[derive(Debug, Clone, Copy, Default)]
pub struct RunStats {
    pub crashes: usize,
    /// Admin operations (volume and snapshot) that happened.
    pub admin: usize,
    /// The same by operation, in the order of [`OP_NAMES`].
    pub done: [usize; OP_NAMES.len()],
    /// Admin operations refused as the model predicted.
    pub refused: usize,
    /// Admin operations cut by a crash, settled after reopen: done, not done.
    pub cut_done: usize,
    pub cut_undone: usize,
    /// Writes or flattens that ran out of space.
    pub enospc: usize,
    /// Writes refused (in part or whole) by a volume's quota.
    pub quota_refusals: usize,
    /// Accounting checks skipped (too many ambiguous entries).
    pub space_skipped: usize,
    /// Metadata nodes evicted from the (minimal) cache and read again.
    pub node_evictions: u64,
    pub node_misses: u64,
    /// Of those, read by lookups with the pool lock released.
    pub node_fetches: u64,
    /// Checkpoints a commit froze and the checkpointer wrote later.
    pub background_checkpoints: usize,
    /// Crashes while a checkpoint was frozen and not yet durable (commits
    /// after it went to the journal's other side).
    pub crashes_mid_checkpoint: usize,
    /// Blocks compactions moved (`Pool::relayout`).
    pub blocks_relaid: usize,
    /// Blocks compactions moved out of the span they then gathered a
    /// volume's windows into (`RelayoutReport::blocks_cleared`).
    pub blocks_cleared_for_gathering: usize,
    /// Blocks cleaning passes moved out of partly used regions
    /// (`Pool::clean_regions`).
    pub blocks_cleaned: usize,
    /// Blocks file-system hints moved (`Pool::place_hinted`).
    pub blocks_hinted: usize,
    /// Device adds a crash cut, settled after reopen (done or not).
    pub dev_adds_cut: usize,
    /// Device growths a crash cut, settled after reopen.
    pub dev_grows_cut: usize,
    /// Member evacuations (`dev remove`) a crash cut, settled after reopen.
    pub dev_removes_cut: usize,
    /// Spare adds, takes and drops a crash cut, settled after reopen.
    pub spares_cut: usize,
    /// Live blocks evacuations moved off a member.
    pub blocks_evacuated: usize,
    /// Members taken out of the pool (`dev remove`'s last step) uncut.
    pub devices_removed: usize,
    /// Cut removals that reopened with the slot removed.
    pub removals_cut_done: usize,
    /// Store nodes a removal's last step found on the member and rewrote.
    pub nodes_rewritten: usize,
    /// Rows of parity volumes verified after crashes (XOR of data = parity).
    pub parity_rows: usize,
    /// 64 KiB groups written with one coarse checksum, and coarse groups
    /// split (a partial overwrite or free).
    pub coarse_groups: u64,
    pub groups_split: u64,
    /// Snapshots whose dead list a crashed pool reopened from its catalog
    /// (INLINE_DEAD_LISTS), then verified against the model.
    pub inline_dead_lists: u64,
}

impl RunStats {
    pub fn add(&mut self, o: &RunStats) {
        self.crashes += o.crashes;
        self.background_checkpoints += o.background_checkpoints;
        self.crashes_mid_checkpoint += o.crashes_mid_checkpoint;
        self.blocks_relaid += o.blocks_relaid;
        self.blocks_cleared_for_gathering += o.blocks_cleared_for_gathering;
        self.blocks_cleaned += o.blocks_cleaned;
        self.blocks_hinted += o.blocks_hinted;
        self.dev_adds_cut += o.dev_adds_cut;
        self.dev_grows_cut += o.dev_grows_cut;
        self.dev_removes_cut += o.dev_removes_cut;
        self.spares_cut += o.spares_cut;
        self.blocks_evacuated += o.blocks_evacuated;
        self.devices_removed += o.devices_removed;
        self.removals_cut_done += o.removals_cut_done;
        self.nodes_rewritten += o.nodes_rewritten;
        self.parity_rows += o.parity_rows;
        self.coarse_groups += o.coarse_groups;
        self.groups_split += o.groups_split;
        self.inline_dead_lists += o.inline_dead_lists;
        self.admin += o.admin;
        self.done.iter_mut().zip(o.done).for_each(|(a, b)| *a += b);
        self.refused += o.refused;
        self.cut_done += o.cut_done;
        self.cut_undone += o.cut_undone;
        self.enospc += o.enospc;
        self.quota_refusals += o.quota_refusals;
        self.space_skipped += o.space_skipped;
        self.node_evictions += o.node_evictions;
        self.node_misses += o.node_misses;
        self.node_fetches += o.node_fetches;
    }
}

pub(crate) struct Run {
    pub(crate) rng: ChaCha8Rng,
    pub(crate) devs: Vec<Arc<SimDevice>>,
    pub(crate) pool: Option<Pool>,
    pub(crate) model: Model,
    /// An admin operation cut by a crash: settled after reopen.
    pub(crate) pending: Option<Pending>,
    pub(crate) stats: RunStats,
    strict: bool,
    workload: Workload,
    /// Writes so far: stamped into the data so that versions differ.
    serial: u64,
    /// The last of `devs` is the primary's second mirror leg.
    pub(crate) mirrored: bool,
    pub(crate) control: Option<Control>,
    placement: PlacementKind,
    long_writes: bool,
}

/// Devices per member; with `mirrored`, the last device is a second leg of
/// the primary.
fn slots_of(devs: &[Arc<SimDevice>], mirrored: bool) -> Vec<Vec<Arc<dyn Device>>> {
    let dyns: Vec<Arc<dyn Device>> = devs.iter().map(|d| d.clone() as Arc<dyn Device>).collect();
    let plain = dyns.len() - usize::from(mirrored);
    let mut slots: Vec<Vec<Arc<dyn Device>>> = dyns[..plain].iter().map(|d| vec![d.clone()]).collect();
    if mirrored {
        slots[0].push(dyns[plain].clone());
    }
    slots
}

/// Run one seed; Err describes the first divergence.
pub fn run_seed(seed: u64, cfg: &SimConfig) -> Result<RunStats, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ndev = rng.random_range(1..=cfg.max_devices);
    let bytes = match cfg.tight_bytes {
        Some(tight) if rng.random_bool(0.25) => tight,
        _ => cfg.device_bytes,
    };
    let total = ndev + usize::from(cfg.mirror);
    let devs: Vec<Arc<SimDevice>> = (0..total).map(|i| Arc::new(SimDevice::new(&format!("sim{i}"), bytes))).collect();
    if cfg.control == Some(Control::IgnoreFlushes) {
        devs.iter().for_each(|d| d.ignore_flushes());
    }
    let opts = CreateOptions { journal_bytes: Some(cfg.journal_bytes), ..Default::default() };
    let slots: Vec<Vec<(Arc<dyn Device>, String)>> = slots_of(&devs, cfg.mirror)
        .into_iter()
        .map(|s| s.into_iter().map(|d| (d.clone(), d.name())).collect())
        .collect();
    create_mirrored_pool(&slots, &opts).map_err(|e| e.to_string())?;
    let strict = rng.random_bool(0.2);
    // Both placements, so the crash simulation covers the write path of each.
    let placement = if rng.random_bool(0.5) { PlacementKind::Contiguous } else { PlacementKind::Linear };
    let mut run = Run {
        rng,
        devs,
        pool: None,
        model: Model::default(),
        pending: None,
        stats: RunStats::default(),
        strict,
        workload: cfg.workload,
        serial: 0,
        mirrored: cfg.mirror,
        control: cfg.control,
        placement,
        long_writes: cfg.long_writes,
    };
    run.reopen()?;
    for step in 0..cfg.steps {
        trace!("-- step {step}");
        run.step().and_then(|()| run.after_step()).map_err(|e| format!("seed {seed} step {step}: {e}"))?;
    }
    run.crash_and_verify().map_err(|e| format!("seed {seed} final crash: {e}"))?;
    Ok(run.stats)
}

impl Run {
    pub(crate) fn pool(&self) -> &Pool {
        self.pool.as_ref().expect("pool open")
    }

    pub(crate) fn any_dead(&self) -> bool {
        self.devs.iter().any(|d| d.is_dead())
    }

    fn reopen(&mut self) -> Result<(), String> {
        // The members the primary's table lists: a device whose add a
        // crash cut short is left out (and added again later).
        let members = if self.mirrored {
            self.devs.len()
        } else {
            Pool::member_paths(self.devs[0].as_ref()).map_err(|e| format!("reopen: {e}"))?.len()
        };
        let slots = slots_of(&self.devs[..members.min(self.devs.len())], self.mirrored);
        // A metadata cache of 8 to 64 KiB: the simulated pools are small,
        // so only a cache this small evicts nodes and reads them again
        // from the devices all through the run. (Its dirty bound, a
        // quarter, also makes checkpoints frequent.)
        let cache = self.rng.random_range(2..=16) * 4096;
        let options = OpenOptions {
            strict: self.strict,
            metadata_cache: cache,
            tiny_metadata_cache: true,
            // Half the reopens spread metadata as pools written before it
            // went to the primary did (no draw: seeds replay unchanged),
            // so removals still find nodes to move off a member.
            metadata_spread: (cache / 4096) % 2 == 0,
            control_replay_one_side: self.control == Some(Control::ReplayOneSide),
            control_split_late: self.control == Some(Control::SplitLate),
            // Writers, trims and deletes split the groups they free in
            // part ahead of their commit; a third of the reopens (and the
            // control that splits late) leave that to the commit, so its
            // split stays covered.
            control_no_presplit: self.control == Some(Control::SplitLate) || (cache / 4096) % 3 == 0,
            control_inline_drops_entry: self.control == Some(Control::InlineDropsEntry),
            placement: self.placement,
            ..Default::default()
        };
        let pool = Pool::open_slots(slots, options).map_err(|e| format!("reopen: {e}"))?;
        if pool.needs_resync() {
            // After a crash the mirror legs may differ where writes were cut.
            let bytes = pool.resync_legs(&mut |_, _| {}).map_err(|e| format!("resync after reopen: {e}"))?;
            trace!("resynced {bytes} bytes");
        }
        let report = pool.check();
        if !report.is_clean() {
            return Err(format!("checker after reopen: {:?}", report.problems));
        }
        self.pool = Some(pool);
        Ok(())
    }

    fn step(&mut self) -> Result<(), String> {
        if self.workload == Workload::Snapshots {
            return self.step_snapshots();
        }
        if self.model.vols.is_empty() || self.rng.random_bool(0.02) {
            return self.volume_op();
        }
        let roll = self.rng.random_range(0..100);
        match roll {
            0..=44 => self.write(),
            45..=54 => self.trim_or_zero(),
            55..=69 => self.flush(),
            70..=84 => self.read_compare(),
            85..=91 => self.crash_and_verify(),
            92 => self.clean_reopen(),
            93 => match self.rng.random_range(0..4) {
                0 => self.dev_add(),
                1 => self.dev_grow(),
                2 => self.spare_op(),
                _ => self.dev_remove(),
            },
            _ => self.arm_crash(),
        }
    }

    /// A cut that an operation survived (an ignored discard hint after its
    /// commit) is applied at once; then the space accounting must hold.
    fn after_step(&mut self) -> Result<(), String> {
        if self.any_dead() {
            self.crash_and_verify()?;
        }
        self.verify_space().map_err(|e| format!("after the step: {e}"))
    }

    pub(crate) fn any_volume(&mut self) -> (String, u32, usize) {
        let names: Vec<&String> = self.model.vols.keys().collect();
        let name = names[self.rng.random_range(0..names.len())].clone();
        let id = self.pool().volume_id(&name).expect("model volume exists in pool");
        let size = self.model.vol(&name).current.len();
        (name, id, size)
    }

    /// A random byte range, block-aligned most of the time.
    pub(crate) fn range(&mut self, size: usize, max: usize) -> (usize, usize) {
        if self.rng.random_bool(0.7) {
            let blocks = size / BLOCK;
            let b = self.rng.random_range(0..blocks);
            let n = self.rng.random_range(1..=(blocks - b).min(max / BLOCK));
            (b * BLOCK, n * BLOCK)
        } else {
            let off = self.rng.random_range(0..size - 1);
            let len = self.rng.random_range(1..=(size - off).min(max));
            (off, len)
        }
    }

    /// A block-aligned run of 16 to 64 blocks (less on a small volume),
    /// starting on a 16-block boundary of the volume half the time.
    fn long_run(&mut self, size: usize) -> (usize, usize) {
        let blocks = size / BLOCK;
        let n = self.rng.random_range(16..=64).min(blocks);
        let mut b = self.rng.random_range(0..=blocks - n);
        if self.rng.random_bool(0.5) {
            b = b / 16 * 16;
        }
        (b * BLOCK, n * BLOCK)
    }

    /// Data for a write: a pattern, with the write's serial in every sector
    /// so that no two writes leave the same block (fewer ambiguous entries).
    fn stamped(&mut self, fill: u8, len: usize) -> Vec<u8> {
        self.serial += 1;
        let mut data: Vec<u8> = (0..len).map(|i| fill.wrapping_add((i / 512) as u8)).collect();
        let tag = self.serial.to_le_bytes();
        for sector in data.chunks_mut(512) {
            let n = sector.len().min(tag.len());
            sector[..n].copy_from_slice(&tag[..n]);
        }
        data
    }

    pub(crate) fn write(&mut self) -> Result<(), String> {
        let (name, id, size) = self.any_volume();
        // A fifth are long aligned runs: whole 64 KiB groups get one
        // coarse checksum, which later overwrites, trims and frees split.
        let long = self.long_writes && self.rng.random_bool(0.2);
        let (off, len) = if long { self.long_run(size) } else { self.range(size, 64 << 10) };
        let fill: u8 = self.rng.random();
        let data = self.stamped(fill, len);
        let fua = self.rng.random_bool(0.05);
        let effects = self.model.vol(&name).write_effects(off, &data);
        let r = self.pool().write(id, off as u64, &data, fua);
        trace!("write {name} {off}+{len} serial {} fua {fua}: {r:?}", self.serial);
        match r {
            Ok(()) => {
                self.model.apply(&name, &effects);
                if fua {
                    // A FUA write answers after a full commit of the pool.
                    self.model.flushed();
                }
                Ok(())
            }
            Err(e) => self.after_failed_write(&name, id, &effects, e),
        }
    }

    /// A failed write leaves each block of its range old or new.
    fn after_failed_write(&mut self, name: &str, id: u32, effects: &[Effect], e: EngineError) -> Result<(), String> {
        if self.any_dead() {
            // Cut mid-write: any sector of the range may hold old or new data.
            self.model.apply(name, effects);
            return self.crash_and_verify();
        }
        let quota = self.model.vol(name).quota.is_some();
        match e {
            EngineError::NoSpace => self.stats.enospc += 1,
            // Like a full pool: earlier pieces of the write may be done.
            EngineError::QuotaExceeded { .. } if quota => self.stats.quota_refusals += 1,
            e => return Err(format!("write failed without a crash: {e}")),
        }
        let blocks = self.model.vol(name).blocks();
        let alloc = self.alloc_map(id, View::Head, blocks)?;
        let mut got = Vec::with_capacity(effects.len());
        for e in effects {
            let mut buf = vec![0u8; BLOCK];
            self.pool().read(id, (e.lba * BLOCK) as u64, &mut buf).map_err(|e| format!("read after ENOSPC: {e}"))?;
            got.push(buf);
        }
        let alloc: Vec<bool> = effects.iter().map(|e| alloc[e.lba]).collect();
        self.model.adopt_partial(name, effects, &got, &alloc).map_err(|e| format!("after ENOSPC, {name}: {e}"))
    }

    pub(crate) fn trim_or_zero(&mut self) -> Result<(), String> {
        let (name, id, size) = self.any_volume();
        let (off, len) = self.range(size, 256 << 10);
        let zero = self.rng.random_bool(0.5);
        let no_hole = zero && self.rng.random_bool(0.3);
        let m = self.model.vol(&name);
        let effects = if zero { m.zero_effects(off, len, no_hole) } else { m.trim_effects(off, len) };
        let r = if zero {
            self.pool().write_zeroes(id, off as u64, len as u64, no_hole, false)
        } else {
            self.pool().trim(id, off as u64, len as u64)
        };
        trace!("{} {name} {off}+{len} no_hole {no_hole}: {r:?}", if zero { "zero" } else { "trim" });
        match r {
            Ok(()) => {
                self.model.apply(&name, &effects);
                Ok(())
            }
            Err(e) => self.after_failed_write(&name, id, &effects, e),
        }
    }

    pub(crate) fn flush(&mut self) -> Result<(), String> {
        let r = self.pool().flush();
        trace!("flush: {r:?}");
        match r {
            Ok(()) => {
                self.model.flushed();
                self.checkpointer()
            }
            Err(_) if self.any_dead() => self.crash_and_verify(),
            Err(e) => Err(format!("flush failed without a crash: {e}")),
        }
    }

    /// What the service's checkpointer thread does, at chosen points: a
    /// checkpoint a commit froze is written half the time here, else the
    /// commits go on in the journal's other side until one finishes it
    /// (a full side, a forced checkpoint) or the next look here.
    fn checkpointer(&mut self) -> Result<(), String> {
        if !self.pool().checkpoint_waiting() || self.rng.random_bool(0.5) {
            return Ok(());
        }
        let r = self.pool().checkpoint_work();
        trace!("checkpoint work: {r:?}");
        self.stats.background_checkpoints += 1;
        match r {
            Ok(()) => Ok(()),
            Err(_) if self.any_dead() => self.crash_and_verify(),
            Err(e) => Err(format!("checkpoint failed without a crash: {e}")),
        }
    }

    fn read_compare(&mut self) -> Result<(), String> {
        let (name, id, size) = self.any_volume();
        let (off, len) = self.range(size, 128 << 10);
        let mut buf = vec![0u8; len];
        if let Err(e) = self.pool().read(id, off as u64, &mut buf) {
            if self.any_dead() {
                return self.crash_and_verify();
            }
            return Err(format!("read failed: {e}"));
        }
        let m = self.model.vol(&name);
        if buf != m.current[off..off + len] {
            return Err(format!("live read of {name} at {off}+{len} differs from the model"));
        }
        self.check_block_status(id, View::Head, &m.ids, off, len).map_err(|e| format!("{name} head: {e}"))
    }

    pub(crate) fn arm_crash(&mut self) -> Result<(), String> {
        let i = self.rng.random_range(0..self.devs.len());
        let calls = self.rng.random_range(0..20);
        self.devs[i].crash_after(calls);
        trace!("arm crash on dev {i} after {calls} calls");
        Ok(())
    }

    /// Count the cache's evictions and misses before a pool goes away.
    fn note_cache(&mut self) {
        if let Some(pool) = &self.pool {
            let st = pool.status();
            self.stats.node_evictions += st.metadata_cache.evictions;
            self.stats.node_misses += st.metadata_cache.misses;
            self.stats.node_fetches += st.node_fetches;
            self.stats.coarse_groups += st.coarse_groups;
            self.stats.groups_split += st.split_groups;
        }
    }

    pub(crate) fn clean_reopen(&mut self) -> Result<(), String> {
        trace!("clean reopen");
        self.note_cache();
        let pool = self.pool.take().expect("pool open");
        if let Err(e) = pool.close() {
            if self.any_dead() {
                self.pool = Some(pool);
                return self.crash_and_verify();
            }
            return Err(format!("close: {e}"));
        }
        drop(pool);
        self.model.flushed();
        if self.any_dead() {
            // The cut hit an ignored discard hint after the commit.
            return self.crash_and_verify();
        }
        // Opening a pool with mirrors writes (the superblock's open flag):
        // an armed cut can hit it.
        if let Err(e) = self.reopen() {
            return if self.any_dead() { self.crash_and_verify() } else { Err(e) };
        }
        self.verify_all("after clean reopen")
    }

    /// A volume's own placement, or None (the pool's default): the crash
    /// simulation covers the write path of every policy.
    pub(crate) fn any_placement(&mut self) -> Option<PlacementKind> {
        const KINDS: [PlacementKind; 4] =
            [PlacementKind::Linear, PlacementKind::Inplace, PlacementKind::Append, PlacementKind::Contiguous];
        let i = self.rng.random_range(0..=KINDS.len());
        KINDS.get(i).copied()
    }

    fn volume_op(&mut self) -> Result<(), String> {
        let roll = self.rng.random_range(0..10);
        if self.model.vols.len() < 3 && (roll < 6 || self.model.vols.is_empty()) {
            let name = format!("v{}", self.rng.random_range(0..5));
            if self.model.vols.contains_key(&name) {
                return Ok(());
            }
            let size = self.rng.random_range(1..=(3 << 20) / BLOCK) * BLOCK;
            let placement = self.any_placement();
            let r = self.pool().create_volume_placed(&name, size as u64, placement);
            return self.admin_outcome(Pending::VolCreate { name, size }, Ok(()), r).map(drop);
        }
        let (name, _, size) = self.any_volume();
        if roll < 8 {
            let to = self.rng.random_range(1..=(3 << 20) / BLOCK) * BLOCK;
            let r = self.pool().resize_volume(&name, to as u64, true);
            self.admin_outcome(Pending::VolResize { name, from: size, to }, Ok(()), r).map(drop)
        } else {
            let r = self.pool().delete_volume(&name, true);
            self.admin_outcome(Pending::VolDelete { name }, Ok(()), r).map(drop)
        }
    }

    /// Power cut now: drop the pool without closing, crash the devices,
    /// reopen, settle a cut admin operation, check every volume against
    /// what the model allows, adopt what survived, and compare everything.
    pub(crate) fn crash_and_verify(&mut self) -> Result<(), String> {
        trace!("CRASH");
        self.stats.crashes += 1;
        if self.pool.as_ref().is_some_and(|p| p.checkpoint_in_progress()) {
            self.stats.crashes_mid_checkpoint += 1;
        }
        self.note_cache();
        drop(self.pool.take());
        for d in &self.devs {
            d.crash(&mut self.rng);
        }
        self.reopen()?;
        self.stats.inline_dead_lists += self.pool().status().inline_dead_lists;
        self.settle_pending()?;
        self.verify_names().map_err(|e| format!("after crash: {e}"))?;
        let names: Vec<String> = self.model.vols.keys().cloned().collect();
        for name in names {
            let (id, image) = self.read_volume(&name)?;
            let seen = self.seen_head(&name, id, image.len() / BLOCK)?;
            self.model
                .adopt_after_crash(&name, image, &seen)
                .map_err(|e| format!("after crash, volume {name}: {e}"))?;
        }
        self.verify_all("after crash")?;
        self.verify_parity_rows()
    }

    /// Every mapped row of every parity volume's head XORs to zero and no
    /// unit fails its checksum: the commit that maps a row's data maps
    /// its parity, both flushed before its record (no write hole).
    pub(crate) fn verify_parity_rows(&mut self) -> Result<(), String> {
        let names: Vec<String> = self.model.vols.keys().cloned().collect();
        for name in names {
            let pool = self.pool();
            let Some(id) = pool.volume_id(&name) else { continue };
            if pool.volume_info(id).is_none_or(|i| i.parity.is_none()) {
                continue;
            }
            let r = pool.check_parity(id, false).map_err(|e| format!("after crash, parity of {name}: {e}"))?;
            if r.mismatched != 0 || r.rebuilt != 0 {
                return Err(format!("after crash, volume {name}: rows whose parity is not their data's XOR: {r:?}"));
            }
            self.stats.parity_rows += r.rows as usize;
        }
        Ok(())
    }

    /// Block status of a head, and its changed blocks against each snapshot.
    fn seen_head(&self, name: &str, id: u32, blocks: usize) -> Result<Seen, String> {
        let alloc = self.alloc_map(id, View::Head, blocks)?;
        let mut changed = Vec::new();
        for s in &self.model.vol(name).snaps {
            let what = format!("{name}@{}", s.name);
            let Some((_, View::Snapshot(epoch))) = self.pool().lookup_view(&what) else {
                return Err(format!("after crash, {what} missing"));
            };
            changed.push(self.changed_map(id, View::Head, epoch, blocks)?);
        }
        Ok(Seen { alloc, changed })
    }

    pub(crate) fn read_volume(&self, name: &str) -> Result<(u32, Vec<u8>), String> {
        let pool = self.pool();
        let id = pool.volume_id(name).ok_or(format!("volume {name} missing after reopen"))?;
        let size = pool.volume_info(id).map(|v| v.size as usize).unwrap_or(0);
        let mut image = vec![0u8; size];
        pool.read(id, 0, &mut image).map_err(|e| format!("read {name}: {e}"))?;
        Ok((id, image))
    }
}
