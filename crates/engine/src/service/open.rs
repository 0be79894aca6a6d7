//! Creating a pool on devices, and opening one: pick the current superblock,
//! open the trees the catalog names (no map is read), put the space maps
//! right, replay the journal. A pool of format 1 (whole-state checkpoints)
//! opens only to be upgraded: read whole, free space rebuilt from its map.

use crate::device::disk_model::{DiskModel, ModeledDisk};
use crate::device::label::{read_label, write_both_labels};
use crate::device::members::Members;
use crate::device::node_io::DeviceNodeIo;
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::map::extent_map::{Freed, Ranges};
use crate::map::state::State;
use crate::members::mirror::{Leg, LegHealth, MirrorDevice};
use crate::meta::journal::{self, JournalCursor};
use crate::meta::{catalog, checkpoint};
use crate::pool::{CheckpointSlot, CommitCtl, Counters, Inner, OpenOptions, Pool, DEFAULT_METADATA_CACHE, STRIPES};
use crate::space::placement::PlacementKind;
use crate::space::{reserve_for, Space};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use tarn_format::catalog::Catalog;
use tarn_format::leg::LegLabel;
use tarn_format::ops::Op;
use tarn_format::superblock::{
    incompat, DeviceEntry, LegEntry, LegState, Superblock, FORMAT_VERSION, LABEL_BLOCKS, MAX_DEVICE_ENTRIES, MAX_LEGS,
};
use tarn_format::{Pba, BLOCK_SIZE};
use tarn_store::Store;

/// Journal records a replay reads at most (bounds the loop).
const MAX_REPLAY_RECORDS: usize = 1 << 24;
/// Smallest data area worth a pool.
pub(crate) const MIN_DATA_BLOCKS: u64 = 256;

#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// Journal size in bytes (default: 1/64 of the primary, 1 to 64 MiB).
    pub journal_bytes: Option<u64>,
    /// Overwrite devices that already hold a tarn label.
    pub force: bool,
    /// Keep no data checksums (like btrfs nodatasum): data errors go
    /// undetected; for comparisons and for data checksummed above.
    pub no_checksums: bool,
}

pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| EngineError::InvalidArgument(format!("no randomness for uuids: {e}")))?;
    Ok(b)
}

fn default_journal_blocks(primary_blocks: u64) -> u64 {
    (primary_blocks / 64).clamp(256, 16384)
}

/// Write a new, empty pool on `devices` (the first is the primary).
pub fn create_pool(devices: &[Arc<dyn Device>], paths: &[String], opts: &CreateOptions) -> Result<()> {
    if paths.len() != devices.len() {
        return Err(EngineError::InvalidArgument("one path per device".into()));
    }
    let slots: Vec<Vec<(Arc<dyn Device>, String)>> =
        devices.iter().zip(paths).map(|(d, p)| vec![(d.clone(), p.clone())]).collect();
    create_mirrored_pool(&slots, opts)
}

/// Write a new, empty pool on `slots` (the first is the primary); a slot of
/// two or more (device, path) legs is a mirror (docs/FORMAT.md §Mirrors).
pub fn create_mirrored_pool(slots: &[Vec<(Arc<dyn Device>, String)>], opts: &CreateOptions) -> Result<()> {
    if slots.is_empty() || slots.len() > MAX_DEVICE_ENTRIES {
        return Err(EngineError::InvalidArgument(format!("a pool takes 1 to {MAX_DEVICE_ENTRIES} devices")));
    }
    if let Some(s) = slots.iter().find(|s| s.is_empty() || s.len() > MAX_LEGS) {
        return Err(EngineError::InvalidArgument(format!("a mirror takes 2 to {MAX_LEGS} devices, not {}", s.len())));
    }
    let mirrored = slots.iter().any(|s| s.len() > 1);
    let devices: Vec<Arc<dyn Device>> = slots.iter().map(|s| slot_device(s)).collect::<Result<_>>()?;
    let primary_blocks = devices[0].size() / BLOCK_SIZE;
    let journal_blocks = match opts.journal_bytes {
        Some(b) => b.div_ceil(BLOCK_SIZE).max(16),
        None => default_journal_blocks(primary_blocks),
    };
    let mut features = incompat::SNAPSHOTS;
    if !opts.no_checksums {
        // New pools write coarse sums from the start; older pools get the
        // bit with their first long write (`Pool::enable_coarse`).
        features |= incompat::DATA_CHECKSUMS | incompat::COARSE_SUMS;
    }
    if mirrored {
        features |= incompat::MIRRORS;
    }
    let new = NewPool {
        pool_uuid: random_bytes::<16>()?,
        generation: u64::from_le_bytes(random_bytes::<8>()?) >> 1 | 1,
        features,
        journal_blocks,
    };
    let mut entries = Vec::new();
    let mut labels = Vec::new();
    for (i, (dev, slot)) in devices.iter().zip(slots).enumerate() {
        refuse_labelled(slot, opts.force)?;
        let (entry, label) = new.member(i, dev.as_ref(), slot)?;
        entries.push(entry);
        labels.push(label);
    }
    labels[0].devices = entries;
    if !labels[0].fits() {
        return Err(EngineError::InvalidArgument("too many devices or paths too long for the device table".into()));
    }
    write_new_labels(&devices, slots, &labels, new.pool_uuid)
}

/// What every member of a new pool shares.
struct NewPool {
    pool_uuid: [u8; 16],
    generation: u64,
    features: u64,
    journal_blocks: u64,
}

impl NewPool {
    /// Member `i`'s device table entry and superblock (without the table).
    fn member(
        &self,
        i: usize,
        dev: &dyn Device,
        slot: &[(Arc<dyn Device>, String)],
    ) -> Result<(DeviceEntry, Superblock)> {
        let blocks = dev.size() / BLOCK_SIZE;
        let data_start = LABEL_BLOCKS + if i == 0 { self.journal_blocks } else { 0 };
        if blocks < data_start + MIN_DATA_BLOCKS {
            return Err(EngineError::InvalidArgument(format!(
                "device {} is too small: {} bytes, need at least {}",
                dev.name(),
                dev.size(),
                (data_start + MIN_DATA_BLOCKS) * BLOCK_SIZE
            )));
        }
        let device_uuid = random_bytes::<16>()?;
        let legs = if slot.len() > 1 {
            slot.iter()
                .map(|(_, p)| Ok(LegEntry { uuid: random_bytes::<16>()?, state: LegState::InSync, path: p.clone() }))
                .collect::<Result<Vec<_>>>()?
        } else {
            Vec::new()
        };
        let entry = DeviceEntry {
            uuid: device_uuid,
            blocks,
            path: slot[0].1.clone(),
            legs,
            draining: false,
            removed: false,
            placement: None,
            spare: false,
            rebuilt: None,
            replacing: None,
        };
        let label = Superblock {
            version: FORMAT_VERSION,
            incompat: self.features,
            ro_compat: 0,
            compat: 0,
            pool_uuid: self.pool_uuid,
            device_uuid,
            device_index: i as u16,
            flags: 0,
            txid: 1,
            device_blocks: blocks,
            data_start,
            journal_start: if i == 0 { LABEL_BLOCKS } else { 0 },
            journal_blocks: if i == 0 { self.journal_blocks } else { 0 },
            journal_generation: self.generation,
            checkpoint: Default::default(),
            created_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            devices: Vec::new(),
        };
        Ok((entry, label))
    }
}

/// Refuse devices that already hold a tarn label, unless forced.
fn refuse_labelled(slot: &[(Arc<dyn Device>, String)], force: bool) -> Result<()> {
    for (leg, _) in slot {
        if !force && read_label(leg.as_ref()).is_ok() {
            return Err(EngineError::InvalidArgument(format!(
                "device {} already holds a tarn pool (use --force to overwrite)",
                leg.name()
            )));
        }
    }
    Ok(())
}

/// Write leg labels and superblocks: secondaries first, primary last, so a
/// crash midway leaves no valid pool.
fn write_new_labels(
    devices: &[Arc<dyn Device>],
    slots: &[Vec<(Arc<dyn Device>, String)>],
    labels: &[Superblock],
    pool_uuid: [u8; 16],
) -> Result<()> {
    for (i, dev) in devices.iter().enumerate().rev() {
        for (leg_index, leg) in labels[0].devices[i].legs.iter().enumerate() {
            let label =
                LegLabel { pool_uuid, slot_uuid: labels[i].device_uuid, slot_index: i as u16, leg_uuid: leg.uuid };
            crate::members::assemble::write_leg_label(slots[i][leg_index].0.as_ref(), &label)?;
        }
        if i == 0 {
            let zero = vec![0u8; BLOCK_SIZE as usize];
            dev.write_at(&zero, LABEL_BLOCKS * BLOCK_SIZE)
                .map_err(|e| EngineError::io("clear journal", dev.name(), e))?;
        }
        write_both_labels(dev.as_ref(), &labels[i])?;
        dev.flush().map_err(|e| EngineError::io("flush", dev.name(), e))?;
    }
    Ok(())
}

/// One device for a slot: itself, or a mirror of its legs (as small as the smallest).
fn slot_device(slot: &[(Arc<dyn Device>, String)]) -> Result<Arc<dyn Device>> {
    if slot.len() == 1 {
        return Ok(slot[0].0.clone());
    }
    let size = slot.iter().map(|l| l.0.size()).min().unwrap_or(0) / BLOCK_SIZE * BLOCK_SIZE;
    let legs = slot.iter().map(|(d, p)| Leg::new(Some(d.clone()), [0; 16], p.clone(), LegHealth::Online)).collect();
    Ok(Arc::new(MirrorDevice::new(legs, size, true)))
}

/// What an open found wrong with the superblock copies it did not use
/// (logged, and kept for `pool status`).
fn label_notes(label: &crate::device::label::LabelRead, primary: &str, sb: &Superblock) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(why) = &label.other_invalid {
        log::warn!("device {primary}: superblock copy {} invalid ({why}); using copy {}", 1 - label.copy, label.copy);
        notes.push(format!(
            "superblock copy {} of {primary} is invalid ({why}); copy {} is in use",
            1 - label.copy,
            label.copy
        ));
    }
    if let Some(older) = label.other_older {
        let note = format!(
            "superblock copy {} of {primary} is older (txid {older}, copy {} has {}): a checkpoint was cut short \
             or a write of that copy was lost; the next checkpoint rewrites both",
            1 - label.copy,
            label.copy,
            sb.txid
        );
        log::warn!("{note}");
        notes.push(note);
    }
    notes
}

/// A member being evacuated (`dev remove`) stays avoided across a
/// restart, so the next `dev remove` goes on with what is left; a removed
/// slot (empty) is avoided for good.
fn avoid_leaving(sb: &Superblock, space: &mut Space) {
    // A spare's area is empty until it is taken; the bit says so too.
    for (i, d) in sb.devices.iter().enumerate().filter(|(i, d)| (d.draining || d.removed || d.spare) && *i < 32) {
        if d.draining {
            log::warn!("member {i} ({}) is being removed: no new data goes there", d.path);
        }
        space.avoid |= 1 << i;
    }
}

/// Check that `dev` is member `index` of the pool the primary describes
/// (not for a spare: `assemble` checks its label, and a wrong one only
/// leaves it missing).
fn verify_member(primary: &Superblock, index: usize, dev: &dyn Device) -> Result<()> {
    let label = read_label(dev)?.current;
    let entry = &primary.devices[index];
    let foreign = |detail: String| EngineError::ForeignDevice { device: dev.name(), detail };
    if label.pool_uuid != primary.pool_uuid {
        return Err(foreign("it carries another pool's uuid".into()));
    }
    if label.device_uuid != entry.uuid || usize::from(label.device_index) != index {
        return Err(foreign(format!("expected member {index}, found member {}", label.device_index)));
    }
    if dev.size() / BLOCK_SIZE < entry.blocks {
        return Err(foreign(format!(
            "device shrank: {} blocks, pool expects {}",
            dev.size() / BLOCK_SIZE,
            entry.blocks
        )));
    }
    Ok(())
}

impl Pool {
    /// Open the pool whose primary is `devices[0]`; the others must be its
    /// members in order (see [`Pool::member_paths`]).
    pub fn open(devices: Vec<Arc<dyn Device>>, options: OpenOptions) -> Result<Pool> {
        Self::open_slots(devices.into_iter().map(|d| vec![d]).collect(), options)
    }

    /// Open from the devices found per member: `slots[i]` is one device for
    /// a plain member, or the legs found (any order, some may be missing)
    /// for a mirrored one. A mirror missing legs opens DEGRADED.
    pub fn open_slots(slots: Vec<Vec<Arc<dyn Device>>>, options: OpenOptions) -> Result<Pool> {
        let slots = match options.disk_model {
            Some(model) => modeled(slots, model),
            None => slots,
        };
        let asm = crate::members::assemble::assemble(slots, !options.read_only)?;
        let (devices, mirrors, label) = (asm.devices, asm.mirrors, asm.label);
        let primary = &devices[0];
        let sb = label.current.clone();
        for (i, dev) in devices.iter().enumerate().skip(1).filter(|(i, _)| !sb.devices[*i].spare) {
            // A member being replaced had its two devices told apart by
            // their labels at assembly.
            let replacing = sb.devices[i].replacing.is_some();
            if mirrors[i].is_none() && !sb.devices[i].removed && !dev.missing_member() && !replacing {
                verify_member(&sb, i, dev.as_ref())?;
            }
        }
        let members = Arc::new(Members::new(devices.clone()));
        let loaded = load(&devices, &members, &sb, &options)?;
        let (state, mut space, pieces, cursor, replayed) = loaded;
        space.random_region_start = options.random_region_start;
        space.metadata_spread = options.metadata_spread;
        if options.region_blocks != 0 {
            let smallest = space.devices.iter().map(|d| d.data_end - d.data_start).min().unwrap_or(0);
            crate::space::placement::check_region_blocks(options.region_blocks, smallest)
                .map_err(EngineError::InvalidArgument)?;
        }
        space.reserve_blocks = reserve_for(state.extent_count(), space.data_blocks());
        avoid_leaving(&sb, &mut space);
        // Nothing new goes to a missing member or one being rebuilt: no
        // data, no metadata (a rebuilt one is usable again at the end).
        for (i, _) in devices.iter().enumerate().filter(|(i, d)| d.degraded() && *i < 32) {
            space.avoid |= 1 << i;
        }
        let mut notes = asm.notes;
        notes.extend(label_notes(&label, &primary.name(), &sb));
        log::info!(
            "opened pool on {}: {} volumes, commit {}, {replayed} journal records replayed",
            primary.name(),
            state.volumes.len(),
            cursor.seq,
        );
        let crashed_regions = state.open_regions.clone();
        let read_only = options.read_only;
        let ctl = CommitCtl::new(sb, cursor, notes);
        let slot = CheckpointSlot { pieces, ..Default::default() };
        let pool = Pool::new(members, mirrors, state, space, (ctl, slot), options);
        let notes = pool.mark_open()?;
        pool.lock_commit().notes.extend(notes);
        if !read_only && !crashed_regions.is_empty() {
            log::warn!("{} overwrite regions were open at a crash: resync pending", crashed_regions.len());
            pool.write_inner().regions.suspect = crashed_regions;
        }
        Ok(pool)
    }

    /// The pool object over opened devices and loaded state; nothing pending.
    fn new(
        devices: Arc<Members>,
        mut mirrors: Vec<Option<Arc<MirrorDevice>>>,
        state: State,
        space: Space,
        (ctl, slot): (CommitCtl, CheckpointSlot),
        options: OpenOptions,
    ) -> Pool {
        // Room for members added online (`dev add`): never mirrored.
        mirrors.resize(MAX_DEVICE_ENTRIES, None);
        let checksums = ctl.sb.incompat & incompat::DATA_CHECKSUMS != 0;
        let coarse = checksums && ctl.sb.incompat & incompat::COARSE_SUMS != 0;
        let pending_limit = journal::pending_limit(ctl.sb.journal_blocks);
        let device_placement = ctl.sb.devices.iter().map(|d| d.placement.map(PlacementKind::from)).collect();
        Pool {
            inner: RwLock::new(Inner {
                state,
                space,
                placement: options.placement,
                device_placement,
                region_blocks: if options.region_blocks == 0 {
                    crate::space::placement::DEFAULT_REGION_BLOCKS
                } else {
                    options.region_blocks
                },
                pending_ops: Vec::new(),
                pending_frees: Vec::new(),
                pending_bytes: 0,
                regions: Default::default(),
                moving: Vec::new(),
                quota_pending: Default::default(),
            }),
            enabled_features: AtomicU64::new(ctl.sb.incompat),
            commit: Mutex::new(ctl),
            merging: AtomicBool::new(false),
            checkpoint: Mutex::new(slot),
            checkpoint_waiting: AtomicBool::new(false),
            changes: Default::default(),
            checkpoint_frozen: Condvar::new(),
            devices,
            mirrors,
            io_gate: RwLock::new(()),
            gate_counts: Default::default(),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            write_gen: AtomicU64::new(0),
            client_ops: AtomicU64::new(0),
            committed_gen: AtomicU64::new(0),
            dirty: (0..MAX_DEVICE_ENTRIES).map(|_| AtomicBool::new(false)).collect(),
            fenced: AtomicBool::new(false),
            checksums,
            coarse: AtomicBool::new(coarse),
            group_locks: (0..crate::integrity::split::GROUP_LOCKS).map(|_| Mutex::new(())).collect(),
            pending_limit,
            fresh_writes: AtomicU64::new(0),
            reserved: std::sync::atomic::AtomicUsize::new(0),
            parity_rows: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            options,
            counters: Counters::default(),
        }
    }

    /// The pool uuid a device carries (primary or member), without opening.
    pub fn pool_uuid(dev: &dyn Device) -> Result<String> {
        Ok(crate::device::label::uuid_string(&read_label(dev)?.current.pool_uuid))
    }

    /// The member paths recorded in a primary's superblock (index order).
    pub fn member_paths(primary: &dyn Device) -> Result<Vec<String>> {
        Ok(read_label(primary)?.current.devices.into_iter().map(|d| d.path).collect())
    }

    /// Which members are removed slots (`dev remove`): nothing is opened
    /// for them.
    pub fn removed_members(primary: &dyn Device) -> Result<Vec<bool>> {
        Ok(read_label(primary)?.current.devices.into_iter().map(|d| d.removed).collect())
    }

    /// Which members are spares (`dev add --spare`): a spare that cannot be
    /// opened leaves the pool without it, not unopenable.
    pub fn spare_members(primary: &dyn Device) -> Result<Vec<bool>> {
        Ok(read_label(primary)?.current.devices.into_iter().map(|d| d.spare).collect())
    }

    /// Per member, the paths of its devices as recorded: one for a plain
    /// member, every leg's for a mirrored one.
    pub fn member_legs(primary: &dyn Device) -> Result<Vec<Vec<String>>> {
        let devices = read_label(primary)?.current.devices;
        Ok(devices
            .into_iter()
            .map(|d| match () {
                // Nothing to open for a removed slot.
                _ if d.removed => Vec::new(),
                // A member being replaced: the old device, then the new.
                _ if d.legs.is_empty() => match d.replacing {
                    Some(r) => vec![d.path, r.path],
                    None => vec![d.path],
                },
                _ => d.legs.into_iter().map(|l| l.path).collect(),
            })
            .collect())
    }
}

/// What opening loads: state, space, the catalog's (or format 1
/// checkpoint's) blocks, the journal cursor, records replayed.
type Loaded = (State, Space, Ranges, JournalCursor, usize);

/// How the journal is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replay {
    /// Format 3: the superblock's side, then the next if records go on there.
    Sides,
    /// Formats 1 and 2, for an upgrade: one side, the whole region; the
    /// journal is then full for the writer, so the first commit is a
    /// checkpoint that starts the two-sided journal.
    WholeRegion,
    /// A negative control's defect (`OpenOptions::control_replay_one_side`).
    OneSide,
}

/// Read the pool's metadata as its format says.
fn load(devices: &[Arc<dyn Device>], members: &Arc<Members>, sb: &Superblock, options: &OpenOptions) -> Result<Loaded> {
    let total = if options.metadata_cache == 0 { DEFAULT_METADATA_CACHE } else { options.metadata_cache };
    // Dirty nodes (at most an eighth of the budget: `commit/`'s dirty
    // bound, plus their frozen copies while a checkpoint writes) live
    // beside the clean-node cache; the budget covers both.
    let cache = total - total / 4;
    let io = Arc::new(DeviceNodeIo::new(members.clone()));
    let store = if options.tiny_metadata_cache {
        Store::with_cache(io, tarn_store::Cache::tiny(cache))
    } else {
        Store::new(io, cache.max(tarn_store::cache::MIN_CACHE_BYTES))
            .map_err(|e| EngineError::InvalidArgument(format!("metadata cache: {e}")))?
    };
    let store = Arc::new(store);
    let areas = data_areas(devices, sb)?;
    match sb.version {
        FORMAT_VERSION if options.control_replay_one_side => load_catalog(devices, sb, store, &areas, Replay::OneSide),
        FORMAT_VERSION => load_catalog(devices, sb, store, &areas, Replay::Sides),
        // Format 2 differs only in its journal: one side, the whole region.
        2 if options.upgrade && !options.read_only => load_catalog(devices, sb, store, &areas, Replay::WholeRegion),
        1 if options.upgrade && !options.read_only => load_format1(devices, sb, store, &areas),
        version => Err(EngineError::NeedsUpgrade { device: devices[0].name(), version }),
    }
}

/// Per device, its data area: first block, one past the last.
fn data_areas(devices: &[Arc<dyn Device>], sb: &Superblock) -> Result<Vec<(u64, u64)>> {
    let mut areas = Vec::with_capacity(devices.len());
    for (i, dev) in devices.iter().enumerate() {
        let start = if i == 0 { sb.data_start } else { LABEL_BLOCKS };
        // A removed slot's or a spare's data area is empty (its catalog space map too).
        let end = sb.devices.get(i).map_or(0, |d| if d.removed || d.spare { start } else { d.blocks });
        if end < start {
            // Only a damaged superblock (device table) says so.
            let detail = format!("data area {start}..{end} ends before it starts");
            return Err(EngineError::NotAPool { device: dev.name(), detail });
        }
        areas.push((start, end));
    }
    Ok(areas)
}

/// Format 3 (and 2): the catalog, the trees opened at their roots, the
/// space maps put right, the journal replayed on top.
fn load_catalog(
    devices: &[Arc<dyn Device>],
    sb: &Superblock,
    store: Arc<Store>,
    areas: &[(u64, u64)],
    replay: Replay,
) -> Result<Loaded> {
    let primary = devices[0].name();
    let not_a_pool = |detail: String| EngineError::NotAPool { device: primary.clone(), detail };
    let (mut state, mut space, pieces) = if sb.first_segment().is_none() {
        (State::new(store.clone()), Space::new(store, areas)?, Vec::new())
    } else {
        let (payload, pieces) = checkpoint::read(devices, &sb.checkpoint)?;
        let c = Catalog::decode(&payload).map_err(|source| EngineError::Corrupt {
            what: "catalog",
            device: primary.clone(),
            source,
        })?;
        if c.seq != sb.checkpoint.seq {
            return Err(not_a_pool(format!("catalog seq {} != superblock's {}", c.seq, sb.checkpoint.seq)));
        }
        let state = catalog::open_state(&c, store.clone()).map_err(|e| not_a_pool(e.to_string()))?;
        let space = catalog::open_space(&c, store, areas, &pieces).map_err(|e| not_a_pool(e.to_string()))?;
        (state, space, pieces)
    };
    let seq = sb.checkpoint.seq;
    let (cursor, replayed) = replay_journal(devices[0].as_ref(), sb, (seq, replay), &mut state, Some(&mut space))?;
    Ok((state, space, pieces, cursor, replayed))
}

/// Format 1, for an upgrade: the whole state, free space rebuilt from it.
fn load_format1(
    devices: &[Arc<dyn Device>],
    sb: &Superblock,
    store: Arc<Store>,
    areas: &[(u64, u64)],
) -> Result<Loaded> {
    let (mut state, pieces, seq) = load_checkpoint(devices, sb, store.clone())?;
    let (cursor, replayed) = replay_journal(devices[0].as_ref(), sb, (seq, Replay::WholeRegion), &mut state, None)?;
    let mut used = state.physical_extents()?;
    used.extend(pieces.iter().copied());
    used.sort_unstable();
    let mut space = Space::new(store, areas)?;
    for (pba, len) in used {
        space.claim(pba, len).map_err(|e| EngineError::Inconsistent(format!("format 1 pool: {e}")))?;
    }
    Ok((state, space, pieces, cursor, replayed))
}

/// Apply the journal's records after the checkpoint (`seq`) to `state`;
/// returns the cursor after the last valid record and how many there were.
/// With `space` (formats 2, 3), new space the records map is claimed and
/// what they release is given back, record by record as the live pool did.
fn replay_journal(
    primary: &dyn Device,
    sb: &Superblock,
    (seq, replay): (u64, Replay),
    state: &mut State,
    mut space: Option<&mut Space>,
) -> Result<(JournalCursor, usize)> {
    let mut cursor = JournalCursor::at_side(sb.journal_start, sb.journal_blocks, sb.journal_generation, seq);
    cursor.whole_region = replay == Replay::WholeRegion;
    let records = journal::replay(primary, &mut cursor, MAX_REPLAY_RECORDS, replay == Replay::OneSide)?;
    if cursor.whole_region {
        cursor.used = cursor.side_blocks();
    }
    for rec in &records {
        let bad = |detail: String| EngineError::NotAPool {
            device: primary.name(),
            detail: format!("journal record {} does not apply: {detail}", rec.seq),
        };
        let mut freed = Freed::new();
        for op in &rec.ops {
            if let Some(space) = space.as_deref_mut() {
                claim_new_space(space, op).map_err(|e| bad(e.to_string()))?;
            }
            state.apply(op, &mut freed).map_err(|e| bad(e.to_string()))?;
        }
        // Only snapshot ops move the epoch; the record states where it ended.
        if state.epoch != rec.epoch {
            return Err(bad(format!("epoch {} after replay, record says {}", state.epoch, rec.epoch)));
        }
        if let Some(space) = space.as_deref_mut() {
            for (pba, len) in freed {
                space.give_back(pba, len).map_err(|e| bad(e.to_string()))?;
            }
        }
    }
    Ok((cursor, records.len()))
}

/// The new space an op maps, marked used.
fn claim_new_space(space: &mut Space, op: &Op) -> std::result::Result<(), tarn_store::StoreError> {
    match *op {
        Op::Map { pba, len, .. } if !Pba(pba).is_origin() => space.claim(Pba(pba), len),
        Op::Materialize { pba, len, .. } if pba != 0 => space.claim(Pba(pba), len),
        Op::Relocate { to, len, .. } => space.claim(Pba(to), len),
        _ => Ok(()),
    }
}

/// A format 1 checkpoint: the whole state in its payload.
fn load_checkpoint(devices: &[Arc<dyn Device>], sb: &Superblock, store: Arc<Store>) -> Result<(State, Ranges, u64)> {
    if sb.first_segment().is_none() {
        return Ok((State::new(store), Vec::new(), sb.checkpoint.seq));
    }
    let (payload, pieces) = checkpoint::read(devices, &sb.checkpoint)?;
    let (state, seq) = checkpoint::decode_state(&payload, store).map_err(|detail| EngineError::NotAPool {
        device: devices[0].name(),
        detail: format!("checkpoint: {detail}"),
    })?;
    if seq != sb.checkpoint.seq {
        return Err(EngineError::NotAPool {
            device: devices[0].name(),
            detail: format!("checkpoint seq {seq} != superblock's {}", sb.checkpoint.seq),
        });
    }
    Ok((state, pieces, seq))
}

/// Every device of `slots` behind a modeled disk (benchmarks only).
fn modeled(slots: Vec<Vec<Arc<dyn Device>>>, model: DiskModel) -> Vec<Vec<Arc<dyn Device>>> {
    let wrap = |dev: Arc<dyn Device>| -> Arc<dyn Device> { Arc::new(ModeledDisk::new(dev, model)) };
    slots.into_iter().map(|legs| legs.into_iter().map(wrap).collect()).collect()
}
