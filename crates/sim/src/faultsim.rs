//! Seeded device-fault runs: a workload of writes, trims, flushes,
//! snapshots and clean reopens against the reference model, then one kind
//! of device fault aimed at data or at live metadata (superblock copies,
//! journal records, checkpoint segments, the store nodes the checkpoint's
//! catalog reaches) while the workload goes on, then a full comparison, a
//! scrub and a reopen. The device records which blocks a
//! fault left wrong and what they should hold ([`SimDevice::damage`]), so
//! every damaged live block is known and must be detected:
//!
//! - a read never returns bytes other than the model's: it returns them,
//!   or fails with `EngineError::Checksum` / `EngineError::Io`;
//! - a damaged live data block fails its read (one copy) or is healed
//!   (a mirror), and scrub lists it as lost (or repairs it);
//! - a read error is never invented: without a fault that fired, every
//!   read succeeds and scrub finds nothing;
//! - damaged live metadata makes the reopen fail with a typed error naming
//!   the device, or the pool opens from the other superblock copy and says
//!   so, or (a mirror) from the other copy of the structure;
//! - store nodes are read lazily: a damaged one fails the operation that
//!   first reads it with a typed store error naming a node a fault hit (the
//!   run ends there), and after a reopen the checker must find it.
//!
//! What the design cannot see is classified, not excused silently: see
//! [`Gap`]. `TARN_SEED=N` replays one run.

use crate::device::{FaultEvent, SimDevice, WriteFault, WriteTarget};
use crate::model::{block, Model, BLOCK};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use tarn_engine::error::StateError;
use tarn_engine::extent_map::tree_id;
use tarn_engine::scrub::ScrubOptions;
use tarn_engine::{create_mirrored_pool, CreateOptions, Device, EngineError, OpenOptions, Pool, View};
use tarn_format::catalog::{Catalog, Root};
use tarn_format::checkpoint::{SegmentHeader, SEGMENT_HEADER_LEN};
use tarn_format::checksum::{checksum, SALT_CHECKPOINT};
use tarn_format::journal::{RecordHeader, HEADER_LEN};
use tarn_format::node::{decode_node, Expect, ExtentValue, LeafValue, NodeBody, RangeValue, SumsValue, MAX_LEVEL};
use tarn_format::superblock::{Superblock, LABEL_BLOCKS, SUPERBLOCK_COPIES};
use tarn_format::Pba;
use tarn_store::StoreError;

/// The device faults a run injects (one kind per run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// A bit of stored bytes flips (persistent rot).
    Rot,
    /// A bit flips in what one read returns; the stored bytes are good.
    ReadFlipOnce,
    /// A bit flips in what every read of one byte returns (a bad path).
    ReadFlipSticky,
    /// Reads of a range fail with an I/O error.
    ReadErrors,
    /// Writes fail with an I/O error: at a rate (data) or in the journal.
    WriteErrors,
    /// A write lands at another block; its own block keeps the old bytes.
    Misdirect,
    /// A write succeeds but never reaches the medium.
    Lost,
}

pub const ALL_KINDS: [FaultKind; 7] = [
    FaultKind::Rot,
    FaultKind::ReadFlipOnce,
    FaultKind::ReadFlipSticky,
    FaultKind::ReadErrors,
    FaultKind::WriteErrors,
    FaultKind::Misdirect,
    FaultKind::Lost,
];

#[derive(Debug, Clone)]
pub struct FaultConfig {
    pub kind: FaultKind,
    /// Data checksums on (off only in negative controls).
    pub checksums: bool,
    /// The pool's one member is a mirror of two devices.
    pub mirror: bool,
    /// Negative control: the devices hide the damage they hold (reads
    /// return what a block should hold), so nothing can be detected.
    pub hide_damage: bool,
    /// Operations before and after the fault is armed.
    pub warmup: usize,
    pub steps: usize,
}

impl FaultConfig {
    pub fn new(kind: FaultKind) -> Self {
        FaultConfig { kind, checksums: true, mirror: false, hide_damage: false, warmup: 40, steps: 30 }
    }
}

/// Damage the current design cannot detect, found by a run (the run
/// succeeds and says so; tests pin each with a seed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gap {
    /// A live journal record of the single copy was damaged (rot, lost or
    /// misdirected write) and the pool crashed before a checkpoint: replay
    /// takes the bad record for a commit that never completed and stops
    /// there, so answered flushes are silently lost.
    JournalRecordAfterCrash,
    /// A data block of an overwrite region that was open at a crash was
    /// damaged (rot, lost or misdirected write): the resync after the crash
    /// cannot tell damage from an in-place write cut by the crash, keeps
    /// the bytes and gives them a new checksum, and reads then return them
    /// as good. This includes blocks a snapshot shares, which are never
    /// written in place and so never need the resync.
    OpenRegionAfterCrash,
    /// A write of one superblock copy was lost (or went elsewhere): the
    /// copy stays valid with an older txid, the pool opens from the newer
    /// one and nothing notes the stale copy (a crash mid-checkpoint leaves
    /// the same picture). Not wrong data today; should the newer copy rot
    /// later, the open would fall back to a checkpoint whose space may
    /// have been reused.
    StaleSuperblockCopy,
}

/// What one run (or many, added up) saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultStats {
    pub runs: usize,
    /// Runs where the fault fired at least once.
    pub fired: usize,
    /// Damaged live data blocks (by view block), every one detected.
    pub damaged_data: usize,
    /// Reads that failed (checksum or I/O), never wrong bytes.
    pub read_errors: usize,
    /// Blocks a mirror healed (reads and scrub).
    pub healed: u64,
    /// Blocks scrub listed as lost.
    pub scrub_lost: u64,
    /// Writes or flushes that failed (and fenced the pool, for a commit).
    pub write_errors: usize,
    /// Runs whose live metadata was damaged at the reopen.
    pub damaged_meta: usize,
    /// Reopens refused with a typed error.
    pub open_refused: usize,
    /// Reopens from the other superblock copy (a note says so).
    pub other_copy: usize,
    /// Runs ended by a damaged or unreadable store node, detected with a
    /// typed store error (or by the checker) where a fault hit the node.
    pub node_errors: usize,
    /// Undetectable damage, by [`Gap`].
    pub journal_gaps: usize,
    pub region_gaps: usize,
    pub stale_superblocks: usize,
    /// The gap of a single run.
    pub gap: Option<Gap>,
}

impl FaultStats {
    pub fn add(&mut self, o: &FaultStats) {
        self.runs += o.runs;
        self.fired += o.fired;
        self.damaged_data += o.damaged_data;
        self.read_errors += o.read_errors;
        self.healed += o.healed;
        self.scrub_lost += o.scrub_lost;
        self.write_errors += o.write_errors;
        self.damaged_meta += o.damaged_meta;
        self.open_refused += o.open_refused;
        self.other_copy += o.other_copy;
        self.node_errors += o.node_errors;
        self.journal_gaps += o.journal_gaps;
        self.region_gaps += o.region_gaps;
        self.stale_superblocks += o.stale_superblocks;
        self.gap = self.gap.or(o.gap);
    }
}

/// View blocks: (volume, 0 for the head or 1 + snapshot index, block).
type Blocks = HashSet<(String, usize, usize)>;

const VOLS: [(&str, usize); 2] = [("a", 256), ("b", 128)];
const DEVICE_BYTES: u64 = 8 << 20;
const BS: u64 = BLOCK as u64;

/// Where the fault is aimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Data,
    Meta,
}

struct FaultRun {
    rng: ChaCha8Rng,
    seed: u64,
    cfg: FaultConfig,
    devs: Vec<Arc<SimDevice>>,
    pool: Option<Pool>,
    model: Model,
    serial: u64,
    snaps: usize,
    /// A snapshot whose create failed: it may exist after the reopen.
    maybe_snap: Option<(String, String)>,
    /// The fault is armed (errors may happen from now on).
    armed: bool,
    /// The run ended early (a refused reopen, or damaged metadata met by
    /// an operation; checked).
    ended: bool,
    /// The first store error a read of the final checks met (detected
    /// metadata damage; see [`FaultRun::node_damage`]).
    node_error: Option<(String, Pba)>,
    place: Place,
    stats: FaultStats,
}

/// Run one seed; Err describes the first failure.
pub fn run_fault_seed(seed: u64, cfg: &FaultConfig) -> Result<FaultStats, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let place = if rng.random_bool(0.5) { Place::Data } else { Place::Meta };
    let ndev = if cfg.mirror { 2 } else { 1 };
    let devs: Vec<Arc<SimDevice>> =
        (0..ndev).map(|i| Arc::new(SimDevice::new(&format!("sim{i}"), DEVICE_BYTES))).collect();
    let slot: Vec<(Arc<dyn Device>, String)> = devs.iter().map(|d| (d.clone() as Arc<dyn Device>, d.name())).collect();
    let opts = CreateOptions { journal_bytes: Some(64 << 10), no_checksums: !cfg.checksums, ..Default::default() };
    create_mirrored_pool(&[slot], &opts).map_err(|e| format!("create: {e}"))?;
    devs.iter().for_each(|d| d.repair_reads(cfg.hide_damage));
    let mut run = FaultRun {
        rng,
        seed,
        cfg: cfg.clone(),
        devs,
        pool: None,
        model: Model::default(),
        serial: 0,
        snaps: 0,
        maybe_snap: None,
        armed: false,
        ended: false,
        node_error: None,
        place,
        stats: FaultStats { runs: 1, ..Default::default() },
    };
    run.go().map_err(|e| format!("seed {seed} ({:?} at {:?}): {e}", cfg.kind, run.place))?;
    run.stats.fired = usize::from(run.fired());
    Ok(run.stats)
}

fn is_typed_read_error(e: &EngineError) -> bool {
    matches!(e, EngineError::Checksum { .. } | EngineError::Io { .. })
}

/// The node a store error names, for the errors a device fault can cause:
/// a node that could not be read or written, or that failed validation.
fn store_error_node(e: &EngineError) -> Option<Pba> {
    let EngineError::State(StateError::Store(s)) = e else { return None };
    match s {
        StoreError::Read { pba, .. }
        | StoreError::Write { pba, .. }
        | StoreError::Corrupt { pba, .. }
        | StoreError::Invalid { pba, .. } => Some(*pba),
        _ => None,
    }
}

impl FaultRun {
    fn pool(&self) -> &Pool {
        self.pool.as_ref().expect("pool open")
    }

    fn open(&self) -> Result<Pool, EngineError> {
        let legs: Vec<Arc<dyn Device>> = self.devs.iter().map(|d| d.clone() as Arc<dyn Device>).collect();
        Pool::open_slots(vec![legs], OpenOptions::default())
    }

    fn fired(&self) -> bool {
        self.devs.iter().any(|d| !d.events().is_empty())
    }

    fn go(&mut self) -> Result<(), String> {
        self.pool = Some(self.open().map_err(|e| format!("first open: {e}"))?);
        for (name, blocks) in VOLS {
            self.pool().create_volume(name, (blocks * BLOCK) as u64).map_err(|e| format!("create volume: {e}"))?;
            self.model.new_volume(name, blocks * BLOCK);
        }
        for _ in 0..self.cfg.warmup {
            if !self.step()? {
                return Err("the workload stopped before any fault".into());
            }
        }
        // Rot and read faults on metadata are armed just before the last
        // open: a checkpoint (every close) rewrites the superblocks and
        // leaves the journal and the old segments behind, so damage there
        // earlier would mostly meet nothing.
        if !self.late_meta() {
            self.arm()?;
            self.armed = true;
        }
        for _ in 0..self.cfg.steps {
            if !self.step()? {
                return if self.ended { Ok(()) } else { self.after_fence() };
            }
        }
        let (bad, failed) = self.verify_views("after the faults")?;
        if let Some((msg, pba)) = self.node_error.take() {
            return self.node_damage(&msg, pba);
        }
        self.verify_scrub(&bad, &failed)?;
        if self.ended {
            return Ok(());
        }
        // The cache may hold a node whose block a fault damaged since: the
        // checker need not see it yet (the reopen must).
        self.checked("checker", false)?;
        if self.ended {
            return Ok(());
        }
        self.final_reopen()
    }

    // ---- the workload ----

    /// One operation; false when a failed commit fenced the pool.
    fn step(&mut self) -> Result<bool, String> {
        match self.rng.random_range(0..100) {
            0..=49 => self.write(),
            50..=54 => self.trim(),
            55..=69 => self.flush(),
            70..=84 => self.read_compare(),
            85..=91 => self.snapshot(),
            _ => self.clean_reopen(),
        }
    }

    fn any_volume(&mut self) -> (String, u32, usize) {
        let (name, blocks) = VOLS[self.rng.random_range(0..VOLS.len())];
        (name.to_string(), self.pool().volume_id(name).expect("volume exists"), blocks)
    }

    /// Block-aligned data no other write produces: every sector carries the
    /// seed, the write's serial and its block.
    fn stamped(&mut self, lba: usize, blocks: usize) -> Vec<u8> {
        self.serial += 1;
        let mut data = vec![0u8; blocks * BLOCK];
        for (i, sector) in data.chunks_mut(512).enumerate() {
            sector[..8].copy_from_slice(&self.seed.to_le_bytes());
            sector[8..16].copy_from_slice(&self.serial.to_le_bytes());
            sector[16..24].copy_from_slice(&((lba * 8 + i) as u64).to_le_bytes());
            sector[24..].fill(self.serial as u8 ^ i as u8);
        }
        data
    }

    fn write(&mut self) -> Result<bool, String> {
        let (name, id, blocks) = self.any_volume();
        let lba = self.rng.random_range(0..blocks);
        let n = self.rng.random_range(1..=(blocks - lba).min(8));
        let data = self.stamped(lba, n);
        let effects = self.model.vol(&name).write_effects(lba * BLOCK, &data);
        match self.pool().write(id, (lba * BLOCK) as u64, &data, false) {
            Ok(()) => {
                self.model.apply(&name, &effects);
                Ok(true)
            }
            Err(e) => {
                // Each block may now hold the old or the new data.
                self.model.apply(&name, &effects);
                self.failed_update(&format!("write {name} {lba}+{n}"), e)
            }
        }
    }

    fn trim(&mut self) -> Result<bool, String> {
        let (name, id, blocks) = self.any_volume();
        let lba = self.rng.random_range(0..blocks);
        let n = self.rng.random_range(1..=(blocks - lba).min(16));
        let effects = self.model.vol(&name).trim_effects(lba * BLOCK, n * BLOCK);
        match self.pool().trim(id, (lba * BLOCK) as u64, (n * BLOCK) as u64) {
            Ok(()) => {
                self.model.apply(&name, &effects);
                Ok(true)
            }
            Err(e) => {
                self.model.apply(&name, &effects);
                self.failed_update(&format!("trim {name} {lba}+{n}"), e)
            }
        }
    }

    fn flush(&mut self) -> Result<bool, String> {
        match self.pool().flush() {
            Ok(()) => self.model.flushed(),
            Err(e) => return self.failed_update("flush", e),
        }
        // The checkpointer thread's work, half the time here (see run.rs).
        if !self.pool().checkpoint_waiting() || self.rng.random_bool(0.5) {
            return Ok(true);
        }
        match self.pool().checkpoint_work() {
            Ok(()) => Ok(true),
            Err(e) => self.failed_update("checkpoint", e),
        }
    }

    /// A failed write, trim or commit: only with an injected error that
    /// fired; the run goes on only if the pool is not fenced.
    fn failed_update(&mut self, what: &str, e: EngineError) -> Result<bool, String> {
        if let Some(pba) = self.fault_explains_store_error(&e) {
            if let EngineError::State(StateError::Store(StoreError::Write { .. })) = e {
                // A node write of a checkpoint failed: the commit failed
                // and fenced, like any failed write.
                self.stats.write_errors += 1;
                return Ok(false);
            }
            self.node_damage(&format!("{what}: {e}"), pba)?;
            return Ok(false);
        }
        let injected = self.devs.iter().flat_map(|d| d.events()).any(|ev| {
            matches!(ev, FaultEvent::WriteError { .. } | FaultEvent::ReadError { .. } | FaultEvent::ReadFlip { .. })
        });
        if !self.armed || !injected || !matches!(e, EngineError::Io { .. } | EngineError::Checksum { .. }) {
            return Err(format!("{what} failed: {e}"));
        }
        self.stats.write_errors += 1;
        // Whatever failed may or may not have happened: stop the workload
        // here and let the reopen (or the checks) settle it.
        Ok(false)
    }

    fn snapshot(&mut self) -> Result<bool, String> {
        if self.snaps >= 6 {
            return self.flush();
        }
        let (name, ..) = self.any_volume();
        let snap = format!("s{}", self.snaps);
        self.snaps += 1;
        match self.pool().create_snapshot(&name, &snap) {
            Ok(_) => {
                self.model.snapshot(&name, &snap);
                self.model.flushed();
                Ok(true)
            }
            Err(e) => {
                self.maybe_snap = Some((name, snap));
                self.failed_update("snapshot", e)
            }
        }
    }

    fn clean_reopen(&mut self) -> Result<bool, String> {
        let pool = self.pool.take().expect("pool open");
        if let Err(e) = pool.close() {
            self.pool = Some(pool);
            return self.failed_update("close", e);
        }
        drop(pool);
        self.model.flushed();
        match self.open() {
            Ok(p) => {
                self.pool = Some(p);
                Ok(true)
            }
            // Damaged metadata (or a read fault on it) met the open.
            Err(e) if self.armed => {
                self.refused(e)?;
                self.ended = true;
                Ok(false)
            }
            Err(e) => Err(format!("reopen: {e}")),
        }
    }

    /// A random range of a random view (head or snapshot), compared; false
    /// when it met damaged metadata (the run ends).
    fn read_compare(&mut self) -> Result<bool, String> {
        let (name, id, blocks) = self.any_volume();
        let v = self.model.vol(&name);
        let pick = self.rng.random_range(0..=v.snaps.len());
        let lba = self.rng.random_range(0..blocks);
        let n = self.rng.random_range(1..=(blocks - lba).min(32));
        let (view, _) = self.view_of(&name, pick)?;
        let mut buf = vec![0u8; n * BLOCK];
        match self.pool().read_view(id, view, (lba * BLOCK) as u64, &mut buf) {
            Ok(()) => {
                let want = &self.view_data(&name, pick)[lba * BLOCK..(lba + n) * BLOCK];
                if buf != want {
                    return Err(format!("read of {name} view {pick} at block {lba}+{n} differs from the model"));
                }
                Ok(true)
            }
            Err(e) if self.armed && self.fired() && is_typed_read_error(&e) => {
                self.stats.read_errors += 1;
                Ok(true)
            }
            Err(e) if self.fault_explains_store_error(&e).is_some() => {
                let pba = self.fault_explains_store_error(&e).expect("just checked");
                self.node_damage(&format!("read of {name} view {pick} at block {lba}+{n}: {e}"), pba)?;
                Ok(false)
            }
            Err(e) => Err(format!("read of {name} view {pick} at block {lba}+{n}: {e}")),
        }
    }

    /// View `pick` of a volume: 0 the head, i the model's i-th snapshot.
    fn view_of(&self, name: &str, pick: usize) -> Result<(View, String), String> {
        if pick == 0 {
            return Ok((View::Head, name.to_string()));
        }
        let what = format!("{name}@{}", self.model.vol(name).snaps[pick - 1].name);
        let (_, view) = self.pool().lookup_view(&what).ok_or(format!("{what} missing"))?;
        Ok((view, what))
    }

    fn view_data(&self, name: &str, pick: usize) -> &[u8] {
        let v = self.model.vol(name);
        if pick == 0 {
            &v.current
        } else {
            &v.snaps[pick - 1].data
        }
    }

    // ---- the fault ----

    /// Arm this run's fault, at data or at live metadata.
    fn arm(&mut self) -> Result<(), String> {
        let leg = self.rng.random_range(0..self.devs.len());
        let dev = self.devs[leg].clone();
        let place = self.place;
        let target_block = match place {
            Place::Data => self.live_data_block(&dev),
            Place::Meta => None,
        };
        if target_block.is_none() {
            self.place = Place::Meta;
        }
        let meta = live_metadata(&dev);
        // A data block, or a metadata block (only the bytes a checksum
        // covers: the zero padding after a record's or segment's payload
        // is read by nothing).
        let pick_block = |rng: &mut ChaCha8Rng| match target_block {
            Some(b) => (b, 0, BLOCK),
            None => {
                let m = &meta[rng.random_range(0..meta.len())];
                (m.block, m.lo, m.hi)
            }
        };
        let byte = |rng: &mut ChaCha8Rng, (b, lo, hi): (u64, usize, usize)| b * BS + rng.random_range(lo..hi) as u64;
        trace!("arm {:?} at {place:?} on {} (data block {target_block:?})", self.cfg.kind, dev.name());
        match self.cfg.kind {
            FaultKind::Rot => {
                let b = pick_block(&mut self.rng);
                let at = byte(&mut self.rng, b);
                dev.flip_bit(at, self.rng.random_range(0..8));
            }
            FaultKind::ReadFlipOnce | FaultKind::ReadFlipSticky => {
                let b = pick_block(&mut self.rng);
                let at = byte(&mut self.rng, b);
                let times = (self.cfg.kind == FaultKind::ReadFlipOnce).then_some(1);
                dev.flip_on_read(at, self.rng.random_range(0..8), times);
            }
            FaultKind::ReadErrors => {
                let (b, ..) = pick_block(&mut self.rng);
                dev.fail_range(b * BS, BS, true, false);
            }
            FaultKind::WriteErrors => match place {
                Place::Data => dev.fail_at_rate(0.0, 0.05, self.seed),
                Place::Meta => {
                    let (lo, hi) = journal_range(&dev);
                    dev.fail_range(lo, hi - lo, false, true);
                }
            },
            FaultKind::Misdirect | FaultKind::Lost => {
                let (lo, hi) = match place {
                    Place::Data => (data_start(&dev) * BS, dev.size()),
                    Place::Meta if self.rng.random_bool(0.7) => journal_range(&dev),
                    Place::Meta => (0, LABEL_BLOCKS * BS),
                };
                let target = WriteTarget { lo, hi, skip: self.rng.random_range(0..4) };
                let fault = if self.cfg.kind == FaultKind::Lost {
                    WriteFault::Lost
                } else {
                    WriteFault::Misdirect { to: self.rng.random_range(0..dev.size() / BS) * BS }
                };
                dev.fault_write(target, fault);
            }
        }
        Ok(())
    }

    /// Rot or a read fault aimed at metadata: armed after the final close
    /// (or crash), so it meets the open.
    fn late_meta(&self) -> bool {
        self.place == Place::Meta
            && matches!(
                self.cfg.kind,
                FaultKind::Rot | FaultKind::ReadFlipOnce | FaultKind::ReadFlipSticky | FaultKind::ReadErrors
            )
    }

    /// A block of the device holding live data of some view (by content:
    /// every written block is unique); None if nothing is written.
    fn live_data_block(&mut self, dev: &SimDevice) -> Option<u64> {
        let index = self.content_index();
        let mut blocks: Vec<u64> = Vec::new();
        let mut buf = vec![0u8; BLOCK];
        for b in data_start(dev)..dev.size() / BS {
            if dev.read_intended(&mut buf, b * BS).is_ok() && index.contains_key(&buf) {
                blocks.push(b);
            }
        }
        (!blocks.is_empty()).then(|| blocks[self.rng.random_range(0..blocks.len())])
    }

    /// Every non-zero block of every view of the model, by content.
    fn content_index(&self) -> HashMap<Vec<u8>, Vec<(String, usize, usize)>> {
        let mut index: HashMap<Vec<u8>, Vec<(String, usize, usize)>> = HashMap::new();
        for (name, v) in &self.model.vols {
            for pick in 0..=v.snaps.len() {
                let data = self.view_data(name, pick);
                for b in 0..data.len() / BLOCK {
                    let blk = block(data, b);
                    if blk.iter().any(|&x| x != 0) {
                        index.entry(blk.to_vec()).or_default().push((name.clone(), pick, b));
                    }
                }
            }
        }
        index
    }

    /// View blocks whose data sits in a damaged block (on every leg, for
    /// a mirror: one good copy heals).
    fn damaged_view_blocks(&self) -> Blocks {
        let index = self.content_index();
        let mut per_leg: Vec<HashSet<(String, usize, usize)>> = Vec::new();
        for d in &self.devs {
            let mut set = HashSet::new();
            for (_, want) in d.damage() {
                if let Some(blocks) = index.get(&want) {
                    set.extend(blocks.iter().cloned());
                }
            }
            per_leg.push(set);
        }
        let first = per_leg[0].clone();
        first.into_iter().filter(|k| per_leg.iter().all(|s| s.contains(k))).collect()
    }

    // ---- the checks ----

    /// Read every block of every view: the model's bytes or a typed error.
    /// Returns the damaged view blocks and those whose read failed.
    fn verify_views(&mut self, what: &str) -> Result<(Blocks, Blocks), String> {
        let (bad, failed, wrong) = self.read_views(what)?;
        if let Some((name, pick, b)) = wrong.iter().next() {
            return Err(format!("{what}: {name} view {pick} block {b} read wrong bytes, not an error"));
        }
        Ok((bad, failed))
    }

    /// [`FaultRun::verify_views`], also returning the blocks that read
    /// wrong bytes (for classifying a known gap).
    fn read_views(&mut self, what: &str) -> Result<(Blocks, Blocks, Blocks), String> {
        let bad = self.damaged_view_blocks();
        let (mut failed, mut wrong) = (HashSet::new(), HashSet::new());
        let names: Vec<String> = self.model.vols.keys().cloned().collect();
        let mut buf = vec![0u8; BLOCK];
        for name in names {
            let id = self.pool().volume_id(&name).ok_or(format!("{what}: volume {name} missing"))?;
            for pick in 0..=self.model.vol(&name).snaps.len() {
                let (view, label) = self.view_of(&name, pick)?;
                let data = self.view_data(&name, pick).to_vec();
                for b in 0..data.len() / BLOCK {
                    let key = (name.clone(), pick, b);
                    match self.pool().read_view(id, view, b as u64 * BS, &mut buf) {
                        Ok(()) if buf == block(&data, b) => {
                            if bad.contains(&key) && !self.cfg.mirror {
                                return Err(format!(
                                    "{what}: {label} block {b} is damaged on the device yet read fine"
                                ));
                            }
                        }
                        Ok(()) => {
                            wrong.insert(key);
                        }
                        // A map or checksum node a fault hit: detected
                        // metadata damage; the other blocks are read on.
                        Err(e) if self.fault_explains_store_error(&e).is_some() => {
                            let pba = self.fault_explains_store_error(&e).expect("just checked");
                            self.node_error.get_or_insert((format!("{what}: {label} block {b}: {e}"), pba));
                        }
                        // An error must be explained: the block is damaged, a
                        // read fault fired (its view block is not known), or a
                        // write failed midway.
                        Err(e) if is_typed_read_error(&e) && self.explains(&bad, &key) => {
                            if self.cfg.mirror && bad.is_empty() {
                                return Err(format!("{what}: {label} block {b} failed with a good copy: {e}"));
                            }
                            failed.insert(key);
                        }
                        Err(e) => return Err(format!("{what}: {label} block {b}: {e}")),
                    }
                }
            }
        }
        self.stats.damaged_data += bad.len();
        self.stats.read_errors += failed.len();
        Ok((bad, failed, wrong))
    }

    fn explains(&self, bad: &Blocks, key: &(String, usize, usize)) -> bool {
        bad.contains(key)
            || self.read_fault_fired()
            || self.devs.iter().flat_map(|d| d.events()).any(|e| matches!(e, FaultEvent::WriteError { .. }))
    }

    fn read_fault_fired(&self) -> bool {
        self.devs
            .iter()
            .flat_map(|d| d.events())
            .any(|e| matches!(e, FaultEvent::ReadError { .. } | FaultEvent::ReadFlip { .. }))
    }

    /// Scrub finds what the reads found: every head block that failed (one
    /// copy) is listed lost; nothing without a fault.
    fn verify_scrub(&mut self, bad: &Blocks, failed: &Blocks) -> Result<(), String> {
        let r = match self.pool().scrub(&ScrubOptions::default(), &mut |_, _| {}) {
            Ok(r) => r,
            Err(e) => {
                let pba = self.fault_explains_store_error(&e).ok_or(format!("scrub: {e}"))?;
                return self.node_damage(&format!("scrub: {e}"), pba);
            }
        };
        self.stats.scrub_lost += r.lost_blocks;
        self.stats.healed += r.repaired + self.pool().status().healed_blocks;
        if !self.fired() && (r.bad_copies, r.lost_blocks) != (0, 0) {
            return Err(format!("scrub without any fault: {r:?}"));
        }
        if !self.cfg.checksums {
            return Ok(());
        }
        let sticky = self.cfg.kind != FaultKind::ReadFlipOnce;
        for (name, pick, b) in bad.iter().chain(failed.iter().filter(|_| sticky)) {
            // A mirror heals; a read fault on one leg is read past.
            if self.cfg.mirror {
                continue;
            }
            let off = *b as u64 * BS;
            let listed = r.lost.iter().any(|l| &l.volume == name && l.offset <= off && off < l.offset + l.len);
            if !listed {
                return Err(format!("scrub does not list {name} view {pick} block {b} as lost: {:?}", r.lost));
            }
        }
        if self.cfg.mirror && r.lost_blocks != 0 {
            return Err(format!("scrub lost blocks on a mirror with one bad copy: {r:?}"));
        }
        Ok(())
    }

    /// Flush, close (or crash), reopen: a refusal must be typed and due to
    /// damaged or unreadable live metadata; an open pool must match.
    fn final_reopen(&mut self) -> Result<(), String> {
        if let Err(e) = self.pool().flush() {
            self.failed_update("final flush", e)?;
            return if self.ended { Ok(()) } else { self.after_fence() };
        }
        self.model.flushed();
        let crash = matches!(self.cfg.kind, FaultKind::Rot | FaultKind::Misdirect | FaultKind::Lost)
            && self.rng.random_bool(0.5);
        trace!("final: crash {crash}; events {:?}", self.devs.iter().map(|d| d.events()).collect::<Vec<_>>());
        let pool = self.pool.take().expect("pool open");
        if crash {
            drop(pool);
            for d in &self.devs {
                d.crash(&mut self.rng);
            }
        } else if let Err(e) = pool.close() {
            self.pool = Some(pool);
            self.failed_update("close", e)?;
            return if self.ended { Ok(()) } else { self.after_fence() };
        }
        // Data faults end here; faults on metadata meet the open.
        if self.place == Place::Data {
            self.devs.iter().for_each(|d| d.clear_faults());
        }
        if self.late_meta() {
            self.arm()?;
            self.armed = true;
        }
        let meta_damage = self.meta_damage();
        trace!(
            "meta damage {meta_damage:?}, damaged blocks {:?}",
            self.devs.iter().map(|d| d.damage().iter().map(|x| x.0 / BS).collect::<Vec<_>>()).collect::<Vec<_>>()
        );
        if meta_damage.is_some() {
            self.stats.damaged_meta = 1;
        }
        match self.open() {
            Err(e) => self.refused(e),
            Ok(pool) => {
                self.pool = Some(pool);
                let resync = self.pool().resync_pending() > 0;
                let notes = self.pool().status().notes;
                let noted = notes.iter().any(|n| n.contains("superblock copy"));
                // A transient flip may be read past without a note.
                let persistent = self.cfg.kind != FaultKind::ReadFlipOnce;
                if meta_damage == Some("superblock") && persistent && !self.cfg.mirror && !noted {
                    if !self.stale_superblock_copy() {
                        return Err(format!("opened over a damaged superblock copy without a note: {notes:?}"));
                    }
                    trace!("known gap {:?}", Gap::StaleSuperblockCopy);
                    self.stats.gap = Some(Gap::StaleSuperblockCopy);
                    self.stats.stale_superblocks += 1;
                }
                if meta_damage == Some("checkpoint segment") && persistent && !self.cfg.mirror {
                    return Err("opened over a damaged checkpoint segment".into());
                }
                if noted {
                    self.stats.other_copy = 1;
                }
                let journal_gap = crash && !self.cfg.mirror && meta_damage == Some("journal record");
                let (bad, _, wrong) = match self.read_views("after the reopen") {
                    // A snapshot (or volume) the lost commit created is missing.
                    Err(e) if journal_gap => {
                        trace!("known gap {:?}: {e}", Gap::JournalRecordAfterCrash);
                        self.stats.gap = Some(Gap::JournalRecordAfterCrash);
                        self.stats.journal_gaps += 1;
                        return Ok(());
                    }
                    other => other?,
                };
                if !wrong.is_empty() {
                    let gap = match () {
                        _ if journal_gap => Some(Gap::JournalRecordAfterCrash),
                        _ if !crash || self.cfg.mirror => None,
                        _ if resync && wrong.is_subset(&bad) => Some(Gap::OpenRegionAfterCrash),
                        _ => None,
                    };
                    let Some(gap) = gap else {
                        let (name, pick, b) = wrong.iter().next().expect("not empty");
                        return Err(format!("after the reopen: {name} view {pick} block {b} read wrong bytes"));
                    };
                    trace!("known gap {gap:?}: {} blocks read wrong", wrong.len());
                    self.stats.gap = Some(gap);
                    match gap {
                        Gap::JournalRecordAfterCrash => self.stats.journal_gaps += 1,
                        Gap::OpenRegionAfterCrash => self.stats.region_gaps += 1,
                        Gap::StaleSuperblockCopy => unreachable!("classified at open"),
                    }
                }
                if let Some((msg, pba)) = self.node_error.take() {
                    return self.node_damage(&msg, pba);
                }
                // Nodes are read lazily: the pool opens over a damaged
                // one, and every view read back; the checker reads them all.
                self.checked("checker after the reopen", true)
            }
        }
    }

    /// A superblock copy of the primary is valid but older than the other
    /// after a clean close (its last write was lost or went elsewhere).
    fn stale_superblock_copy(&self) -> bool {
        let dev = &self.devs[0];
        let copies: Vec<Option<Superblock>> =
            SUPERBLOCK_COPIES.iter().map(|&b| Superblock::decode(&read_block(dev, b, false), b).ok()).collect();
        matches!((&copies[0], &copies[1]), (Some(a), Some(b)) if a.txid != b.txid)
    }

    /// Which live metadata structure (as the fault-free image has it) is
    /// damaged on every leg or meets a read fault, if any.
    fn meta_damage(&self) -> Option<&'static str> {
        self.meta_hits().first().map(|m| m.what)
    }

    /// Every live metadata structure damaged or met by a read fault, by
    /// leg (on a mirror: none unless every leg has one).
    fn meta_hits(&self) -> Vec<Meta> {
        let mut found = Vec::new();
        for d in &self.devs {
            let live = live_metadata_intended(d);
            let covered = |b: u64| live.iter().find(|m| m.block == b);
            let mut stored = vec![0u8; BLOCK];
            let damaged = d.damage().into_iter().filter_map(|(off, want)| {
                let m = covered(off / BS)?;
                d.read_stored(&mut stored, off).ok()?;
                (stored[m.lo..m.hi] != want[m.lo..m.hi]).then_some(*m)
            });
            let read_faults = d.events().into_iter().filter_map(|e| match e {
                FaultEvent::ReadFlip { offset, .. } => {
                    covered(offset / BS).filter(|m| (m.lo..m.hi).contains(&((offset % BS) as usize))).copied()
                }
                FaultEvent::ReadError { offset, len } => {
                    (offset / BS..(offset + len as u64).div_ceil(BS)).find_map(|b| covered(b).copied())
                }
                _ => None,
            });
            let hits: Vec<Meta> = damaged.chain(read_faults).collect();
            if self.cfg.mirror && hits.is_empty() {
                return Vec::new();
            }
            found.extend(hits);
        }
        found
    }

    /// The open failed: only over damaged or unreadable live metadata (or
    /// a read fault armed on it), with a typed error naming the device (a
    /// store error too, should replaying the journal read a node a fault hit).
    fn refused(&mut self, e: EngineError) -> Result<(), String> {
        let typed = matches!(
            e,
            EngineError::Corrupt { .. }
                | EngineError::NotAPool { .. }
                | EngineError::Io { .. }
                | EngineError::Inconsistent(_)
                | EngineError::MemberUnavailable { .. }
        ) || self.fault_explains_store_error(&e).is_some();
        let named = self.devs.iter().any(|d| e.to_string().contains(&d.name()));
        if !typed || !named {
            return Err(format!("open refused with an untyped or unnamed error: {e}"));
        }
        // An open writes too (the superblock's OPEN flag on a mirror): a
        // device failing writes may refuse it.
        let write_error = self.devs.iter().flat_map(|d| d.events()).any(|e| matches!(e, FaultEvent::WriteError { .. }));
        if !self.armed || (self.meta_damage().is_none() && !self.read_fault_fired() && !write_error) {
            return Err(format!("open refused without damaged metadata: {e}"));
        }
        self.stats.open_refused = 1;
        self.stats.damaged_meta = 1;
        Ok(())
    }

    /// A failed commit fenced the pool: drop it, power-cycle, clear the
    /// faults, reopen; every head holds its flushed data or newer.
    fn after_fence(&mut self) -> Result<(), String> {
        drop(self.pool.take());
        for d in &self.devs {
            d.crash(&mut self.rng);
            d.clear_faults();
        }
        let pool = match self.open() {
            Ok(p) => p,
            Err(e) => return self.refused(e),
        };
        self.pool = Some(pool);
        if let Some((vol, snap)) = self.maybe_snap.take() {
            if self.pool().lookup_view(&format!("{vol}@{snap}")).is_some() {
                self.model.snapshot(&vol, &snap);
            }
        }
        let names: Vec<String> = self.model.vols.keys().cloned().collect();
        for name in names {
            let id = self.pool().volume_id(&name).ok_or(format!("volume {name} missing"))?;
            let mut image = vec![0u8; self.model.vol(&name).current.len()];
            if let Err(e) = self.pool().read(id, 0, &mut image) {
                let pba = self.fault_explains_store_error(&e).ok_or(format!("read {name} after the fence: {e}"))?;
                return self.node_damage(&format!("read {name} after the fence: {e}"), pba);
            }
            self.model.vol(&name).check_after_crash(&image).map_err(|e| format!("{name} after the fence: {e}"))?;
        }
        self.checked("checker after the fence", true)
    }

    /// Which node a store error names, if a fault explains it: armed and
    /// fired, on one copy (a mirror heals from the other), and the node's
    /// block is damaged or a fault touched it. Any other store error is
    /// not explained (a failure).
    fn fault_explains_store_error(&self, e: &EngineError) -> Option<Pba> {
        let pba = store_error_node(e)?;
        if !self.armed || !self.fired() || self.cfg.mirror || pba.device() != 0 {
            return None;
        }
        let (lo, hi) = (pba.block() * BS, (pba.block() + 1) * BS);
        let hits = |off: u64, len: usize| off < hi && lo < off + len as u64;
        let touched = |d: &Arc<SimDevice>| {
            d.damage().iter().any(|(off, _)| *off == lo)
                || d.events().iter().any(|ev| match *ev {
                    FaultEvent::Rot { offset, .. } | FaultEvent::ReadFlip { offset, .. } => hits(offset, 1),
                    FaultEvent::ReadError { offset, len }
                    | FaultEvent::WriteError { offset, len }
                    | FaultEvent::Lost { offset, len } => hits(offset, len),
                    FaultEvent::Misdirected { offset, len, to } => hits(offset, len) || hits(to, len),
                })
        };
        self.devs.iter().any(touched).then_some(pba)
    }

    /// A store error a fault explains ends the run: the damage was
    /// detected with a typed error naming the node. While the node's block
    /// stays damaged the checker (which walks every tree) must find it too.
    fn node_damage(&mut self, msg: &str, pba: Pba) -> Result<(), String> {
        trace!("detected store node damage: {msg}");
        self.stats.damaged_meta = 1;
        self.stats.node_errors = 1;
        self.ended = true;
        let damaged = self.devs.iter().all(|d| d.damage().iter().any(|(off, _)| *off == pba.block() * BS));
        if damaged && self.pool.is_some() && self.pool().check().is_clean() {
            return Err(format!("{msg}; yet the checker finds nothing wrong"));
        }
        Ok(())
    }

    /// The checker: problems only where a fault hit a live store node (the
    /// damage was detected: the run ends), none otherwise. With a cold
    /// cache (just opened), a damaged live node must be found.
    fn checked(&mut self, what: &str, cold: bool) -> Result<(), String> {
        let report = self.pool().check();
        // After the check: a read fault on a node fires when it is read.
        let hits = self.meta_hits();
        let nodes: Vec<String> = hits
            .iter()
            .filter(|m| m.what == "store node" && !self.cfg.mirror)
            .map(|m| format!("store node {} of", Pba::new(0, m.block)))
            .collect();
        // A flip on the way (not on the medium) is read past: a node read
        // that fails is read again, so only a lasting fault must be found.
        let lasting = self.cfg.kind != FaultKind::ReadFlipOnce;
        if report.is_clean() {
            if cold && lasting && !nodes.is_empty() {
                return Err(format!(
                    "{what}: opened over a damaged store node, yet the checker finds it clean: {nodes:?}"
                ));
            }
            return Ok(());
        }
        // Every problem may follow from the damage, but one names a node hit.
        let named = report.problems.iter().any(|p| nodes.iter().any(|n| p.contains(n.as_str())));
        if !named || !self.armed {
            return Err(format!("{what}: {:?}", report.problems));
        }
        trace!("{what}: store node damage found: {:?}", report.problems);
        self.stats.damaged_meta = 1;
        self.stats.node_errors = 1;
        self.ended = true;
        Ok(())
    }
}

fn read_block(dev: &SimDevice, b: u64, intended: bool) -> Vec<u8> {
    let mut buf = vec![0u8; BLOCK];
    let r = if intended { dev.read_intended(&mut buf, b * BS) } else { dev.read_at(&mut buf, b * BS) };
    r.map(|()| buf).unwrap_or_default()
}

/// `count` blocks from block `b` (empty if they cannot be read).
fn read_blocks(dev: &SimDevice, b: u64, count: usize, intended: bool) -> Vec<u8> {
    let mut buf = vec![0u8; count * BLOCK];
    let r = if intended { dev.read_intended(&mut buf, b * BS) } else { dev.read_at(&mut buf, b * BS) };
    r.map(|()| buf).unwrap_or_default()
}

/// The newest valid superblock of a device image.
fn superblock(dev: &SimDevice, intended: bool) -> Option<Superblock> {
    SUPERBLOCK_COPIES
        .iter()
        .filter_map(|&b| Superblock::decode(&read_block(dev, b, intended), b).ok())
        .max_by_key(|sb| sb.txid)
}

fn data_start(dev: &SimDevice) -> u64 {
    superblock(dev, true).map_or(LABEL_BLOCKS, |sb| sb.data_start)
}

/// The journal region in bytes.
fn journal_range(dev: &SimDevice) -> (u64, u64) {
    superblock(dev, true).map_or((LABEL_BLOCKS * BS, LABEL_BLOCKS * BS + BS), |sb| {
        (sb.journal_start * BS, (sb.journal_start + sb.journal_blocks) * BS)
    })
}

/// One block of live metadata and the bytes of it a checksum covers.
#[derive(Debug, Clone, Copy)]
struct Meta {
    block: u64,
    lo: usize,
    hi: usize,
    what: &'static str,
}

/// Live metadata as the device holds it now.
fn live_metadata(dev: &SimDevice) -> Vec<Meta> {
    metadata_of(dev, false)
}

/// Live metadata as the device would hold it without faults.
fn live_metadata_intended(dev: &SimDevice) -> Vec<Meta> {
    metadata_of(dev, true)
}

/// The blocks of the store nodes the current checkpoint's catalog reaches
/// on `dev` (as it would hold them without faults): live metadata, though
/// in the data area and read only when a tree is used.
pub fn live_store_nodes(dev: &SimDevice) -> Vec<u64> {
    metadata_of(dev, true).into_iter().filter(|m| m.what == "store node").map(|m| m.block).collect()
}

/// Blocks of a structure of `bytes` covered bytes starting at `start`.
fn covered(start: u64, bytes: usize, what: &'static str) -> impl Iterator<Item = Meta> {
    (0..bytes.div_ceil(BLOCK)).map(move |i| Meta {
        block: start + i as u64,
        lo: 0,
        hi: (bytes - i * BLOCK).min(BLOCK),
        what,
    })
}

/// Both superblock copies, the journal records replay would apply, the
/// segments of the current checkpoint.
fn metadata_of(dev: &SimDevice, intended: bool) -> Vec<Meta> {
    let mut out: Vec<Meta> = SUPERBLOCK_COPIES.iter().flat_map(|&b| covered(b, BLOCK, "superblock")).collect();
    let Some(sb) = superblock(dev, intended) else {
        return out;
    };
    // The side of the superblock's generation, then the other side if
    // the records go on there (docs/FORMAT.md *Journal*).
    let side = sb.journal_blocks / 2;
    let mut seq = sb.checkpoint.seq;
    for generation in [sb.journal_generation, sb.journal_generation + 1] {
        let start = sb.journal_start + (generation % 2) * side;
        let mut at = start;
        while at < start + side {
            let head = read_block(dev, at, intended);
            let Ok(h) = RecordHeader::decode(&head, at) else { break };
            if h.generation != generation || h.seq != seq + 1 {
                break;
            }
            out.extend(covered(at, HEADER_LEN + h.payload_len as usize, "journal record"));
            at += u64::from(h.blocks);
            seq = h.seq;
        }
    }
    let mut pba = sb.checkpoint.first_segment;
    // The catalog: the segments' payloads in chain order (only if the
    // whole chain is on this device and reads back as the superblock says).
    let mut payload = Some(Vec::new());
    for _ in 0..sb.checkpoint.segments {
        let b = Pba(pba).block();
        let Ok(h) = SegmentHeader::decode(&read_block(dev, b, intended), pba) else {
            payload = None;
            break;
        };
        let len = SEGMENT_HEADER_LEN + h.payload_len as usize;
        out.extend(covered(b, len, "checkpoint segment"));
        if Pba(pba).device() != sb.device_index {
            payload = None;
        }
        if let Some(p) = payload.as_mut() {
            let bytes = read_blocks(dev, b, len.div_ceil(BLOCK), intended);
            match bytes.get(SEGMENT_HEADER_LEN..len) {
                Some(part) => p.extend_from_slice(part),
                None => payload = None,
            }
        }
        pba = h.next_pba;
    }
    let catalog = payload
        .filter(|p| {
            p.len() as u64 == sb.checkpoint.payload_len && checksum(SALT_CHECKPOINT, p) == sb.checkpoint.payload_crc
        })
        .and_then(|p| Catalog::decode(&p).ok());
    if let Some(c) = catalog {
        let mut walk =
            NodeWalk { dev, intended, device: sb.device_index, data_start: sb.data_start, seen: HashSet::new() };
        for v in &c.volumes {
            walk.tree::<ExtentValue>(tree_id::head(v.id), &v.head.root, &mut out);
            for s in &v.snapshots {
                walk.tree::<ExtentValue>(tree_id::dead_list(s.epoch), &s.dead.root, &mut out);
            }
        }
        walk.tree::<SumsValue>(tree_id::SUMS, &c.sums, &mut out);
        for (i, s) in c.spaces.iter().enumerate() {
            walk.tree::<RangeValue>(tree_id::space(i as u16), &s.root, &mut out);
        }
    }
    out
}

/// Walks the trees a catalog names over one device image: every node
/// block a parent (or the catalog) points at on this device is live
/// metadata, whole (the crc covers the block); descends only through
/// nodes that decode, bounded by the level each parent gives and a set of
/// blocks seen.
struct NodeWalk<'a> {
    dev: &'a SimDevice,
    intended: bool,
    /// This device's index in the pool (a node's address names its device).
    device: u16,
    data_start: u64,
    seen: HashSet<u64>,
}

impl NodeWalk<'_> {
    fn tree<V: LeafValue>(&mut self, tree: u64, root: &Root, out: &mut Vec<Meta>) {
        if root.pba == 0 || root.level > MAX_LEVEL {
            return;
        }
        let mut stack = vec![Expect { pba: Pba(root.pba), crc: root.crc, tree, level: root.level }];
        while let Some(at) = stack.pop() {
            // Nodes on other devices are not on this image.
            let b = at.pba.block();
            if at.pba.device() != self.device || b < self.data_start || b >= self.dev.size() / BS {
                continue;
            }
            if !self.seen.insert(b) {
                continue;
            }
            out.push(Meta { block: b, lo: 0, hi: BLOCK, what: "store node" });
            let Ok((h, body)) = decode_node::<V>(&read_block(self.dev, b, self.intended), &at) else { continue };
            if let (NodeBody::Branch(children), 1..) = (body, h.level) {
                let level = h.level - 1;
                stack.extend(children.iter().map(|c| Expect { pba: c.pba, crc: c.crc, tree, level }));
            }
        }
    }
}
