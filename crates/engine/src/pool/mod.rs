//! The pool core: devices, the state and space behind the main lock, the
//! queue of pending ops and its bound, the commit control block, the lock
//! helpers, status and listings. The operations live in the folders above
//! (`integrity/`, `commit/`, `io/`, `volumes/`, `service/`), each in its
//! own `impl Pool`; docs/ARCHITECTURE.md (*Locks*) has the lock order.

pub mod changes;
mod gate;

use crate::device::Device;
use crate::error::{EngineError, Result, StateError};
use crate::map::extent_map::Freed;
use crate::map::extent_map::Segment;
use crate::map::state::{State, Volume};
use crate::map::sums::RegionTracker;
use crate::map::view::View;
use crate::meta::catalog::{FrozenPool, WrittenTrees};
use crate::meta::journal::{op_bytes_bound, JournalCursor};
use crate::space::placement::PlacementKind;
use crate::space::Space;
use changes::Closed;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::panic::Location;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};
use tarn_format::ops::Op;
use tarn_format::role::VolumeRole;
use tarn_format::superblock::{CheckpointRef, Superblock};
use tarn_format::{Pba, BLOCK_SIZE};

/// How a pool is opened.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Refuse every change and write nothing to the devices (the checker).
    pub read_only: bool,
    /// Commit before acknowledging any write that allocated (VA's
    /// extent-based hardening) for clients that never flush.
    pub strict: bool,
    /// Skip punching holes in devices for freed space.
    pub no_discard: bool,
    /// Bytes of metadata nodes kept in memory (0: [`DEFAULT_METADATA_CACHE`]).
    pub metadata_cache: usize,
    /// Open a pool of an older format to convert it (`tarn pool upgrade`).
    pub upgrade: bool,
    /// Where new data goes for volumes that name no placement of their own.
    pub placement: PlacementKind,
    /// Blocks per region of `contiguous` placement (0: 64, 256 KiB; a
    /// power of two, checked by [`crate::space::placement::check_region_blocks`]).
    pub region_blocks: u64,
    /// Search new `contiguous` homes from a start spread over the device
    /// (Virtual Contiguity's random start) rather than the data cursor.
    pub random_region_start: bool,
    /// Grow a member when usage crosses a threshold, and when a write
    /// finds the pool full (`commit/grow.rs`); None: never.
    pub expansion: Option<crate::space::expansion::Expansion>,
    /// Benchmarks only: every device delays its requests like a modeled
    /// spinning disk (`device/disk_model.rs`).
    #[doc(hidden)]
    pub disk_model: Option<crate::device::disk_model::DiskModel>,
    /// Simulations only: take `metadata_cache` even below a root-to-leaf
    /// path (slow, never wrong), so that small pools evict nodes.
    #[doc(hidden)]
    pub tiny_metadata_cache: bool,
    /// Simulations only: put store nodes and catalog segments on the
    /// roomiest member, as pools written before metadata went to the
    /// primary did (`Space::metadata_device`), so that removals still
    /// find nodes to move off a member.
    #[doc(hidden)]
    pub metadata_spread: bool,
    /// Negative control of the crash simulation only: replay stops at the
    /// end of the superblock's journal side (a defect the simulation must
    /// catch).
    #[doc(hidden)]
    pub control_replay_one_side: bool,
    /// Negative control of the crash simulation only: a coarse group freed
    /// in part is split in the next record, not the freeing one.
    #[doc(hidden)]
    pub control_split_late: bool,
    /// Negative control of tests only: a snapshot deletion does not split
    /// the groups it frees in part ahead of its commit (the commit reads
    /// them under the pool lock instead).
    #[doc(hidden)]
    pub control_no_presplit: bool,
    /// Negative control of the crash simulation only: a checkpoint that
    /// keeps a dead list in its catalog drops its last entry (counts
    /// agreeing, so only the data tells).
    #[doc(hidden)]
    pub control_inline_drops_entry: bool,
    /// Tests only: act as a build from before INLINE_DEAD_LISTS (the bit
    /// is never set, every dead list is written as a tree), so a test can
    /// make the pool an older build would have left.
    #[doc(hidden)]
    pub compat_no_inline_dead_lists: bool,
}

/// The metadata cache when none is asked for: 256 MiB.
pub const DEFAULT_METADATA_CACHE: usize = 256 << 20;

/// Mutable state behind the pool's main lock.
pub(crate) struct Inner {
    pub state: State,
    pub space: Space,
    /// The placement of volumes that name none (`OpenOptions::placement`).
    pub placement: PlacementKind,
    /// Each member's own default, for data on it of volumes that name no
    /// policy (`tarn dev set --placement`; the superblock's device table).
    pub device_placement: Vec<Option<PlacementKind>>,
    /// Blocks per region of `contiguous` placement (`OpenOptions::region_blocks`).
    pub region_blocks: u64,
    /// Ops applied since the last commit took its snapshot (change only
    /// through `queue`, `take_queue`, `requeue`).
    pub pending_ops: Vec<Op>,
    /// Space released by those ops: reusable only once they are durable.
    pub pending_frees: Freed,
    /// Weight of the two queues: a bound on the ops' encoded size plus 16
    /// bytes per freed range (see `PendingStatus`).
    pub pending_bytes: usize,
    /// Overwrite regions wanted open and their last in-place writes.
    pub regions: RegionTracker,
    /// Windows a compaction is moving (`volumes/relayout.rs`).
    pub moving: Vec<Arc<MovingWindow>>,
    /// Per volume with a quota, blocks allocated to writes not mapped yet:
    /// charged against the quota with what the volume maps (see
    /// `volumes/quota.rs`); entries at 0 are removed.
    pub quota_pending: HashMap<u32, u64>,
}

/// A window being moved: writes planned over it mark it touched (see
/// `Pool::plan_write_in`), and the move is then dropped
/// (`volumes/relayout.rs`).
#[derive(Debug)]
pub(crate) struct MovingWindow {
    pub vol: u32,
    pub lba: u64,
    pub len: u64,
    pub touched: AtomicBool,
}

impl MovingWindow {
    /// Note a write of [lba, lba+len) of `vol` planned while this window moves.
    pub fn note_write(&self, vol: u32, lba: u64, len: u64) {
        if vol == self.vol && lba < self.lba + self.len && self.lba < lba + len {
            self.touched.store(true, Ordering::Relaxed);
        }
    }
}

/// Bytes a freed range weighs in the pending queue (its size in memory).
const FREED_RANGE_BYTES: usize = 16;

impl Inner {
    /// The placement `v` follows as a whole (re-layout, compaction,
    /// listings): its own; else that of the first member it names that
    /// has one; else the pool's default.
    pub fn placement_of(&self, v: &Volume) -> PlacementKind {
        let named = (0..16).filter(|d| v.devices & (1 << d) != 0);
        let device = named.filter_map(|d| self.device_default(d)).next();
        v.placement.map(PlacementKind::from).or(device).unwrap_or(self.placement)
    }

    /// The placement of `v`'s data on member `device` (per-device layout,
    /// Loris): its own policy; else the member's default; else the pool's.
    pub fn placement_on(&self, v: &Volume, device: usize) -> PlacementKind {
        v.placement.map(PlacementKind::from).or(self.device_default(device)).unwrap_or(self.placement)
    }

    fn device_default(&self, device: usize) -> Option<PlacementKind> {
        self.device_placement.get(device).copied().flatten()
    }

    /// Queue an applied op and the space it released for the next commit.
    pub fn queue(&mut self, op: Op, freed: Freed) {
        self.pending_bytes += op_bytes_bound(&op) + freed.len() * FREED_RANGE_BYTES;
        self.pending_frees.extend(freed);
        self.pending_ops.push(op);
    }

    /// Everything queued, for a commit; the queue is empty after.
    pub fn take_queue(&mut self) -> (Vec<Op>, Freed) {
        self.pending_bytes = 0;
        (std::mem::take(&mut self.pending_ops), std::mem::take(&mut self.pending_frees))
    }

    /// Put back what a commit took and did not write (the queue was empty
    /// since: the commit held the lock).
    pub fn requeue(&mut self, ops: Vec<Op>, frees: Freed) {
        debug_assert!(self.pending_ops.is_empty() && self.pending_frees.is_empty());
        self.pending_bytes = ops.iter().map(op_bytes_bound).sum::<usize>() + frees.len() * FREED_RANGE_BYTES;
        self.pending_ops = ops;
        self.pending_frees = frees;
    }
}

/// The queue of changes waiting for a commit, and its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingStatus {
    pub ops: usize,
    pub freed_ranges: usize,
    /// Upper bound of the ops' encoded size plus 16 bytes per freed range.
    pub bytes: usize,
    /// A writer that finds `bytes` over this commits before it adds more,
    /// so the queue holds at most this plus the ops of the requests in flight.
    pub limit: usize,
}

/// What only the committer touches.
pub(crate) struct CommitCtl {
    pub sb: Superblock,
    pub journal: JournalCursor,
    /// A checkpoint is frozen and its superblock not yet written: the
    /// journal is in the side after the superblock's, and no other
    /// checkpoint may freeze (`commit/`).
    pub checkpoint_busy: bool,
    /// Space commits released while a checkpoint was in progress: given
    /// back only once it is durable, so its nodes never take space its
    /// frozen space maps show used (a reopen could not put them right).
    pub held_frees: Freed,
    /// Notes from open (an invalid superblock copy, say) for status/check.
    pub notes: Vec<String>,
    /// A member being added (`members/add.rs`): the next checkpoint's
    /// superblock lists it, and only that one (its catalog is the first
    /// with the member's space map).
    pub adding: Option<tarn_format::superblock::DeviceEntry>,
    /// A member growing (`commit/grow.rs`): (index, blocks) the next
    /// checkpoint's superblock records, with the catalog that has the
    /// larger space map.
    pub growing: Option<(usize, u64)>,
    /// A member being removed (`volumes/detach.rs`): the next checkpoint's
    /// superblock marks its slot removed, with the catalog whose space
    /// map for it is empty.
    pub removing: Option<usize>,
    /// A spare being taken (`members/spare.rs`): the next checkpoint's
    /// superblock makes it a member, with the catalog whose space map for
    /// it covers its whole data area.
    pub taking: Option<usize>,
}

impl CommitCtl {
    /// At open: the superblock read, the journal's cursor, open's notes;
    /// nothing in progress.
    pub fn new(sb: Superblock, journal: JournalCursor, notes: Vec<String>) -> CommitCtl {
        let (adding, growing, removing, taking) = (None, None, None, None);
        CommitCtl {
            sb,
            journal,
            checkpoint_busy: false,
            held_frees: Vec::new(),
            notes,
            adding,
            growing,
            removing,
            taking,
        }
    }
}

/// The checkpoint in progress and what the last one left (behind
/// `Pool::checkpoint`, after `commit` in the lock order).
#[derive(Default)]
pub(crate) struct CheckpointSlot {
    /// Frozen at a commit whose record is durable; nobody writes it yet.
    pub frozen: Option<Box<FrozenCheckpoint>>,
    /// Nodes and catalog written and flushed; the superblock is next.
    pub written: Option<Box<WrittenCheckpoint>>,
    /// Where the last durable checkpoint's catalog is (freed by the next one).
    pub pieces: Vec<(Pba, u64)>,
    /// Node blocks the last checkpoint wrote that the trees replaced
    /// before it was adopted: free once the next checkpoint is durable.
    pub next_release: Freed,
}

/// A checkpoint's trees frozen at commit `frozen.seq`, with the space the
/// ops of that commit released (the frozen space maps show it used).
pub(crate) struct FrozenCheckpoint {
    pub frozen: FrozenPool,
    pub record_frees: Freed,
    /// The journal generation (side) the commits after it go to.
    pub generation: u64,
}

/// A checkpoint whose nodes and catalog are durable; its superblock is not.
pub(crate) struct WrittenCheckpoint {
    pub frozen: FrozenPool,
    pub generation: u64,
    pub written: WrittenTrees,
    pub catalog: CheckpointRef,
    /// Where its catalog is.
    pub pieces: Vec<(Pba, u64)>,
    /// Node blocks it wrote.
    pub own: Vec<(Pba, u64)>,
    /// What becomes free once it is durable.
    pub release: Freed,
    pub started: std::time::Instant,
    pub catalog_bytes: usize,
}

impl CheckpointSlot {
    /// Blocks the slot holds for metadata, by what they are (the checker
    /// counts them as owned).
    pub fn owned(&self) -> Vec<(&'static str, Vec<(Pba, u64)>)> {
        let mut out = vec![("catalog", self.pieces.clone()), ("node awaiting release", self.next_release.clone())];
        let superseded = |f: &FrozenPool| f.superseded.iter().map(|&p| (p, 1)).collect::<Vec<_>>();
        if let Some(f) = &self.frozen {
            out.push(("node replaced before a checkpoint", superseded(&f.frozen)));
        }
        if let Some(w) = &self.written {
            // Its release list holds the superseded nodes, the last
            // catalog and next_release, all already listed above or here.
            out.push(("node replaced before a checkpoint", superseded(&w.frozen)));
            out.push(("node of a checkpoint awaiting its superblock", w.own.clone()));
            out.push(("catalog awaiting its superblock", w.pieces.clone()));
        }
        out
    }
}

#[derive(Debug, Default)]
pub struct Counters {
    pub commits: AtomicU64,
    /// Growths by the expansion policy.
    pub expansions: AtomicU64,
    pub checkpoints: AtomicU64,
    /// Commits that had to finish the checkpoint in progress themselves
    /// (a full journal side, a forced checkpoint, dirty nodes piling up).
    pub checkpoint_waits: AtomicU64,
    pub journal_bytes: AtomicU64,
    /// Blocks read whose data matched no copy's checksum (returned as EIO).
    pub checksum_errors: AtomicU64,
    /// Reads that failed with an I/O error on every copy.
    pub read_errors: AtomicU64,
    /// Bad copies rewritten from a good one (self-heal, scrub, resync).
    pub healed_blocks: AtomicU64,
    /// Coarse checksum groups split into block sums (a partial overwrite
    /// or free; `integrity/split.rs`).
    pub split_groups: AtomicU64,
    /// Of those, the ones a commit split (read under the pool lock): a
    /// group freed in part that nothing split ahead of the free.
    pub commit_splits: AtomicU64,
    /// 64 KiB groups written with one coarse checksum (GroupSums).
    pub coarse_groups: AtomicU64,
    /// Blocks of parity volumes read by reconstruction from the rest of
    /// their row (a missing, failing or rotted unit).
    pub reconstructed_blocks: AtomicU64,
    /// Members whose reconstruction was logged (bit i: member i): logged
    /// once per member, not once per block.
    pub reconstruct_logged: std::sync::atomic::AtomicU32,
    /// Blocks in regions open at a crash whose checksums were recomputed.
    pub resynced_blocks: AtomicU64,
    /// Metadata nodes a lookup read with the pool lock released.
    pub node_fetches: AtomicU64,
    /// How long successful commits took (metrics).
    pub commit_times: DurationHistogram,
}

/// Upper bounds (seconds) of [`DurationHistogram`]'s buckets but the last
/// (+Inf): 100 us to 6.6 s, times 4.
pub const COMMIT_BUCKETS: [f64; 9] = [1e-4, 4e-4, 1.6e-3, 6.4e-3, 0.0256, 0.1024, 0.4096, 1.6384, 6.5536];

/// A histogram of durations in plain atomics: recording is a few relaxed
/// adds, with no lock anything else waits on (a commit records its own
/// time while holding the commit lock it already had).
#[derive(Debug, Default)]
pub struct DurationHistogram {
    /// Per bucket of [`COMMIT_BUCKETS`], then +Inf: observations in it (not cumulative).
    buckets: [AtomicU64; COMMIT_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl DurationHistogram {
    pub fn record(&self, d: std::time::Duration) {
        let secs = d.as_secs_f64();
        let i = COMMIT_BUCKETS.iter().position(|&b| secs <= b).unwrap_or(COMMIT_BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// (sum in seconds, count, per bucket (upper bound, observations)) with
    /// +Inf last. Read without a lock: a scrape racing a commit may see its
    /// count before its bucket, never a torn value.
    pub fn get(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let bounds = COMMIT_BUCKETS.iter().copied().chain([f64::INFINITY]);
        let buckets = bounds.zip(&self.buckets).map(|(b, n)| (b, n.load(Ordering::Relaxed))).collect();
        (self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9, self.count.load(Ordering::Relaxed), buckets)
    }
}

/// Lock order: a stripe, then `commit`, then `checkpoint`, then `io_gate`, then
/// `inner`; the committer never takes a stripe (docs/ARCHITECTURE.md, *Locks*).
pub struct Pool {
    /// Shared with the store's node I/O; appended by `dev add`.
    pub(crate) devices: Arc<crate::device::members::Members>,
    /// Per slot, its mirror when mirrored (the same object as in `devices`).
    pub(crate) mirrors: Vec<Option<Arc<crate::members::mirror::MirrorDevice>>>,
    pub(crate) inner: RwLock<Inner>,
    /// Incompat bits found at open or made durable by `enable_feature`
    /// since: a set bit stays set, so the file volumes' `enable_fs_*`
    /// calls return without the commit lock (which waits for a commit in
    /// flight) once their bit is on. Bits a superblock rewrite clears
    /// again (REPLACE, REBUILD) are never asked of it.
    pub(crate) enabled_features: AtomicU64,
    pub(crate) commit: Mutex<CommitCtl>,
    /// A checkpoint has frozen the maps and not adopted its nodes yet, so
    /// a map may be merging: set and cleared under `inner` held for
    /// writing (at the freeze, after the adopt), so an op that clears a
    /// map (`apply_clearing`) reads it under `inner` and waits for the
    /// commit lock only while it is set, instead of at every call.
    pub(crate) merging: AtomicBool,
    /// The checkpoint being written while commits go on (`commit/`).
    pub(crate) checkpoint: Mutex<CheckpointSlot>,
    /// A frozen checkpoint waits for `Pool::checkpoint_work`.
    pub(crate) checkpoint_waiting: AtomicBool,
    /// Keeps commits out of callers' multi-write changes (`pool/changes.rs`).
    pub(crate) changes: changes::ChangeGate,
    /// Signalled (with `checkpoint` held when set) when a commit freezes a
    /// checkpoint: the checkpointer sleeps on it rather than polling.
    pub(crate) checkpoint_frozen: Condvar,
    /// Held shared by every data I/O from planning to completion; the
    /// committer takes it exclusively once before freed space is reused, so
    /// no I/O planned against the old map can touch reused space.
    pub(crate) io_gate: RwLock<()>,
    /// Who holds `io_gate` shared, by kind (`pool/gate.rs`).
    pub(crate) gate_counts: gate::GateCounts,
    /// Serialize read-modify-write of partial blocks.
    pub(crate) stripes: Vec<Mutex<()>>,
    /// Bumped after every completed change (data or map).
    pub(crate) write_gen: AtomicU64,
    /// Bumped by every client request (read, write, trim, zeroes) through
    /// the public I/O calls, never by the pool's own movers: background
    /// copies (evacuation, rebuild, replace) yield while it moves
    /// (`service::pace`).
    pub(crate) client_ops: AtomicU64,
    /// The highest write_gen a durable commit covers.
    pub(crate) committed_gen: AtomicU64,
    /// Bound of the pending queue's weight (`Inner::pending_bytes`).
    pub(crate) pending_limit: usize,
    /// Queue weight held by `OpsRoom`s for writes made later without
    /// back-pressure commits (`commit/room.rs`): counted as pending.
    pub(crate) reserved: AtomicUsize,
    /// Devices written since their last flush.
    pub(crate) dirty: Vec<AtomicBool>,
    pub(crate) fenced: AtomicBool,
    pub(crate) options: OpenOptions,
    /// The pool keeps data checksums (DATA_CHECKSUMS feature).
    pub(crate) checksums: bool,
    /// Whole 64 KiB groups written at once get one checksum (COARSE_SUMS
    /// in the superblock: set by a commit of its own before the first).
    pub(crate) coarse: AtomicBool,
    /// Locks of coarse groups by stripe (`integrity/split.rs`): an
    /// in-place writer holds those of the groups it touches from its split
    /// check until its sums are recorded.
    pub(crate) group_locks: Vec<Mutex<()>>,
    /// Writes in flight over uncommitted new data in closed regions.
    pub(crate) fresh_writes: AtomicU64,
    /// Parity volumes' row locks (hashed by volume and row): a write of a
    /// row reads the rest of it, computes its parity and maps both; two
    /// writes of one row must not interleave (io/parity.rs).
    pub(crate) parity_rows: Vec<Mutex<()>>,
    pub counters: Counters,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    pub id: u32,
    pub name: String,
    pub size: u64,
    /// Bytes of own space the head maps.
    pub allocated: u64,
    pub extents: u64,
    pub snapshots: usize,
    /// Bytes of own space only snapshots hold (freed by deleting them all).
    pub snapshot_bytes: u64,
    /// `VOL@SNAP` a clone reads its unwritten blocks from.
    pub origin: Option<String>,
    /// Bytes a clone still reads from its origin (0 once flattened).
    pub origin_bytes: u64,
    /// The placement policy the volume's new data follows.
    pub placement: &'static str,
    /// Whether that is the volume's own (else the pool's default).
    pub placement_own: bool,
    /// Bytes of own space the volume and its snapshots may hold.
    pub quota: Option<u64>,
    /// Members its new data may go to, bit i for member i (0: any).
    pub devices: u16,
    /// Its stripe layout (set, unit), None when not striped.
    pub stripe: Option<tarn_format::stripe::Stripe>,
    /// Its parity layout (set of N+1 members, unit), None without parity.
    pub parity: Option<tarn_format::stripe::Parity>,
}

#[derive(Debug, Clone)]
pub struct DeviceStatus {
    pub index: usize,
    pub path: String,
    /// ONLINE, or for a mirror DEGRADED / RESILVERING.
    pub state: &'static str,
    /// A mirror's legs (empty for a plain device).
    pub legs: Vec<crate::members::mirror::LegStatus>,
    pub size: u64,
    pub data_bytes: u64,
    pub free_bytes: u64,
    /// The member's own default placement (`tarn dev set --placement`).
    pub placement: Option<&'static str>,
}

#[derive(Debug, Clone)]
pub struct PoolStatus {
    pub uuid: String,
    /// ONLINE, or DEGRADED when a mirror runs without a leg.
    pub state: &'static str,
    pub devices: Vec<DeviceStatus>,
    /// Bytes volumes can use in all (devices' data areas).
    pub size: u64,
    /// Bytes mapped by volumes.
    pub used: u64,
    /// Bytes free for new writes (reserve excluded).
    pub free: u64,
    /// Bytes held back for metadata so deletes and TRIM work when full.
    pub reserved: u64,
    /// Bytes released but not yet reusable (awaiting commit).
    pub freeing: u64,
    /// Of `free`, bytes outside every whole free region of the
    /// `contiguous` placement (256 KiB): what partly written regions hold
    /// (and other fragments). New regions do not take it; writes into holes
    /// do once no whole region is left, so a full pool still fills up.
    pub free_outside_regions: u64,
    /// The expansion policy (`serve --expand-at`), and growths so far.
    pub expansion: Option<crate::space::expansion::Expansion>,
    pub expansions: u64,
    /// Bytes of metadata on the devices: labels, live journal, checkpoint.
    pub metadata: u64,
    pub journal_size: u64,
    /// Block volumes (file volumes and their objects are not counted).
    pub volumes: usize,
    pub file_volumes: usize,
    pub virtual_size: u64,
    pub overcommit_ratio: f64,
    /// Creating or growing past this ratio needs force (None: no limit).
    pub overcommit_limit: Option<f64>,
    pub epoch: u64,
    pub commit_seq: u64,
    pub placement: &'static str,
    pub strict: bool,
    pub notes: Vec<String>,
    /// A commit failed: changes are refused until a restart.
    pub fenced: bool,
    /// Whether data blocks carry checksums.
    pub checksums: bool,
    pub checksum_errors: u64,
    pub read_errors: u64,
    pub healed_blocks: u64,
    /// Whether whole 64 KiB groups get one checksum (COARSE_SUMS).
    pub coarse_sums: bool,
    /// Coarse groups split into block sums since open.
    pub split_groups: u64,
    /// Groups written with one checksum since open.
    pub coarse_groups: u64,
    pub reconstructed_blocks: u64,
    pub resynced_blocks: u64,
    /// The on-disk format version of the pool.
    pub format: u32,
    pub metadata_cache: tarn_store::CacheStats,
    /// Memory for metadata nodes, clean and dirty (`--metadata-cache`):
    /// the clean-node cache gets three quarters.
    pub metadata_budget: u64,
    /// Metadata nodes changed since the last checkpoint (in memory).
    pub dirty_nodes: u64,
    /// Metadata node copies rewritten from a good copy.
    pub healed_nodes: u64,
    /// Nodes lookups read with the pool lock released (cache misses on
    /// the I/O path).
    pub node_fetches: u64,
    /// Snapshots whose dead list the catalog holds (INLINE_DEAD_LISTS),
    /// not a tree of nodes.
    pub inline_dead_lists: u64,
}

impl PoolStatus {
    /// Share of node reads the cache answered (0 before any read).
    pub fn metadata_cache_hit_rate(&self) -> f64 {
        let c = &self.metadata_cache;
        let total = c.hits + c.misses;
        if total == 0 {
            0.0
        } else {
            c.hits as f64 / total as f64
        }
    }
}

pub(crate) const STRIPES: usize = 64;

/// A hold of the pool lock this long is logged: writers wait on it.
const LONG_POOL_HOLD: Duration = Duration::from_millis(20);
/// A hold of the commit lock this long is logged: FLUSH waits on it (and a
/// commit's device flush alone often takes tens of milliseconds).
const LONG_COMMIT_HOLD: Duration = Duration::from_millis(100);

/// A lock guard timed from acquisition to release; a long hold is logged
/// with the place that took it (the aging benchmark greps these lines).
pub(crate) struct Held<G> {
    guard: G,
    since: Instant,
    lock: &'static str,
    long: Duration,
    site: &'static Location<'static>,
}

impl<G> Held<G> {
    #[track_caller]
    fn new(guard: G, lock: &'static str, long: Duration) -> Self {
        Held { guard, since: Instant::now(), lock, long, site: Location::caller() }
    }
}

impl<G: Deref> Deref for Held<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: DerefMut> DerefMut for Held<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

/// Times `lock_commit` waits for the commit lock with the gate open.
const CLOSE_TRIES: usize = 8;

/// The commit lock and the change gate it closed (None: the holder holds
/// a share). Fields drop in order: the lock first, then the gate opens.
pub(crate) struct Gated<'a> {
    ctl: MutexGuard<'a, CommitCtl>,
    closed: Option<Closed<'a>>,
}

impl Deref for Gated<'_> {
    type Target = CommitCtl;
    fn deref(&self) -> &CommitCtl {
        &self.ctl
    }
}

impl DerefMut for Gated<'_> {
    fn deref_mut(&mut self) -> &mut CommitCtl {
        &mut self.ctl
    }
}

impl<'a> Held<Gated<'a>> {
    /// The closed gate, to open once a commit has taken its ops (before
    /// its device flush) while the commit lock stays held: only for a
    /// hold that commits once, as a second commit would find it open.
    pub(crate) fn take_closed(&mut self) -> Option<Closed<'a>> {
        self.guard.closed.take()
    }
}

impl<G> Drop for Held<G> {
    fn drop(&mut self) {
        let held = self.since.elapsed();
        if held >= self.long {
            log::info!("{} held {held:?} at {}", self.lock, self.site);
        }
    }
}

/// Nodes a lookup may fetch with the pool lock released before it reads
/// the rest under the lock (a path is at most 17 nodes; more means nodes
/// are evicted as fast as they are fetched).
const MAX_FETCHES: usize = 64;

/// Member states of a pool that is whole (not DEGRADED): a spare, even
/// one missing, holds no data; a member being replaced is all there.
const WHOLE_STATES: [&str; 6] = ["ONLINE", "DRAINING", "REMOVED", "SPARE", "MISSING", "REPLACING"];

impl Pool {
    pub(crate) fn read_inner(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The pool lock, exclusive (a long hold is logged: writers wait).
    #[track_caller]
    pub(crate) fn write_inner(&self) -> Held<RwLockWriteGuard<'_, Inner>> {
        Held::new(self.inner.write().unwrap_or_else(|p| p.into_inner()), "pool lock", LONG_POOL_HOLD)
    }

    /// The commit lock, first closing the change gate unless this thread
    /// holds a share (`pool/changes.rs`): no commit falls inside a
    /// caller's change.
    #[track_caller]
    pub(crate) fn lock_commit(&self) -> Held<Gated<'_>> {
        let (ctl, closed) = self.commit_lock_between_changes();
        Held::new(Gated { ctl, closed }, "commit lock", LONG_COMMIT_HOLD)
    }

    /// Close the gate, then take the commit lock; while another holds it
    /// (a commit in its device flush), wait for it with the gate open,
    /// so changes go on meanwhile, and try again (a few times; then the
    /// gate stays closed while the lock is waited for).
    fn commit_lock_between_changes(&self) -> (MutexGuard<'_, CommitCtl>, Option<Closed<'_>>) {
        use std::sync::TryLockError;
        for _ in 0..CLOSE_TRIES {
            let closed = self.changes.close();
            if closed.is_none() {
                break;
            }
            match self.commit.try_lock() {
                Ok(ctl) => return (ctl, closed),
                Err(TryLockError::Poisoned(p)) => return (p.into_inner(), closed),
                Err(TryLockError::WouldBlock) => {
                    drop(closed);
                    drop(self.commit.lock().unwrap_or_else(|p| p.into_inner()));
                }
            }
        }
        let closed = self.changes.close();
        (self.commit.lock().unwrap_or_else(|p| p.into_inner()), closed)
    }

    /// After `commit` (if held) and before `io_gate` and `inner`.
    pub(crate) fn lock_checkpoint(&self) -> MutexGuard<'_, CheckpointSlot> {
        self.checkpoint.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run `f` under the pool lock (shared) without any device I/O: a
    /// metadata node the cache lacks fails it with a miss, the node is read
    /// with the lock released, and `f` runs again. So writers never wait
    /// on the lock for a node read (docs/ARCHITECTURE.md, *Locks*).
    pub(crate) fn with_cached_nodes<T>(&self, f: impl Fn(&Inner) -> Result<T>) -> Result<T> {
        for _ in 0..MAX_FETCHES {
            let (miss, store) = {
                let inner = self.read_inner();
                match tarn_store::without_io(|| f(&inner)) {
                    Err(EngineError::State(StateError::Store(tarn_store::StoreError::Miss(m)))) => {
                        (m, inner.state.store.clone())
                    }
                    done => return done,
                }
            };
            fetch_node(&store, &miss)?;
            self.counters.node_fetches.fetch_add(1, Ordering::Relaxed);
        }
        f(&self.read_inner())
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.options.read_only {
            return Err(EngineError::ReadOnly);
        }
        if self.fenced.load(Ordering::SeqCst) {
            return Err(EngineError::Fenced);
        }
        Ok(())
    }

    /// Memory for metadata nodes, as opened (`--metadata-cache`).
    pub fn metadata_budget(&self) -> usize {
        if self.options.metadata_cache == 0 {
            DEFAULT_METADATA_CACHE
        } else {
            self.options.metadata_cache
        }
    }

    /// The format version the pool's superblock carries (an older one
    /// only while a `tarn pool upgrade` runs).
    pub fn format_version(&self) -> u32 {
        self.lock_commit().sb.version
    }

    pub fn devices(&self) -> Vec<Arc<dyn Device>> {
        self.devices.to_vec()
    }

    pub fn is_read_only(&self) -> bool {
        self.options.read_only
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// Whether a commit is wanted soon: writes asked overwrite regions open
    /// (until a commit opens them, writes there are redirected).
    pub fn wants_commit(&self) -> bool {
        self.read_inner().regions.urgent > 0
    }

    /// The queue of changes waiting for the next commit.
    pub fn pending(&self) -> PendingStatus {
        let inner = self.read_inner();
        PendingStatus {
            ops: inner.pending_ops.len(),
            freed_ranges: inner.pending_frees.len(),
            bytes: inner.pending_bytes,
            limit: self.pending_limit,
        }
    }

    /// Whether the pending queue is over its bound (writers then commit first).
    pub(crate) fn pending_over_limit(&self) -> bool {
        self.queued_weight() > self.pending_limit
    }

    /// The pending queue's weight plus the room reserved for writes to come.
    pub(crate) fn queued_weight(&self) -> usize {
        self.read_inner().pending_bytes.saturating_add(self.reserved.load(Ordering::SeqCst))
    }

    /// Whether anything changed since the last durable commit.
    pub fn is_dirty(&self) -> bool {
        self.write_gen.load(Ordering::SeqCst) > self.committed_gen.load(Ordering::SeqCst)
    }

    /// Apply ops as one change: either all apply or none is recorded (they
    /// are validated against a scratch copy first only when several).
    pub(crate) fn apply_ops(&self, inner: &mut Inner, ops: Vec<Op>) -> Result<()> {
        for op in ops {
            let mut freed = Freed::new();
            inner.state.apply(&op, &mut freed).map_err(|e| match e {
                StateError::Refused(why) => EngineError::InvalidArgument(why),
                broken => {
                    // Damaged metadata, possibly half applied: commit nothing more.
                    self.fenced.store(true, Ordering::SeqCst);
                    EngineError::State(broken)
                }
            })?;
            inner.queue(op, freed);
        }
        self.write_gen.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    pub fn volume_id(&self, name: &str) -> Option<u32> {
        volume_named(&self.read_inner().state, name).ok().map(|v| v.id)
    }

    pub fn volume_info(&self, id: u32) -> Option<VolumeInfo> {
        let inner = self.read_inner();
        inner.state.volume(id).map(|v| info(&inner, v))
    }

    pub fn list_volumes(&self) -> Vec<VolumeInfo> {
        let inner = self.read_inner();
        inner.state.volumes.values().filter(|v| v.role.is_none()).map(|v| info(&inner, v)).collect()
    }

    pub fn status(&self) -> PoolStatus {
        let ctl = self.lock_commit();
        // A read lock: status never holds what writers wait for longer than
        // a read; the reserve the next commit will set is computed here.
        let inner = self.read_inner();
        let reserve = crate::space::reserve_for(inner.state.extent_count(), inner.space.data_blocks());
        let used = inner.state.mapped_blocks() * BLOCK_SIZE;
        let size = inner.space.data_blocks() * BLOCK_SIZE;
        // Block volumes only: a file object is 16 TiB thin, and its file's
        // size is what counts (file volumes are counted apart).
        let blocks = || inner.state.volumes.values().filter(|v| v.role.is_none());
        let virtual_size: u64 = blocks().map(|v| v.size).sum();
        let file_volumes = inner.state.volumes.values().filter(|v| v.role == Some(VolumeRole::FileVolume)).count();
        let labels = self.devices.len() as u64 * 2 * BLOCK_SIZE;
        // Blocks neither free nor mapped nor on their way back are metadata
        // (nodes, the catalog): what the checker counts by walking.
        let freeing: u64 = inner.pending_frees.iter().chain(&ctl.held_frees).map(|f| f.1).sum();
        let inflight: u64 = inner.space.inflight.values().sum();
        let used_blocks = inner.space.data_blocks() - inner.space.free_blocks();
        let nodes = used_blocks.saturating_sub(inner.state.mapped_blocks() + freeing + inflight) * BLOCK_SIZE;
        let devices = self.device_statuses(&ctl, &inner);
        // A spare, even one missing, holds no data: the pool is whole without it.
        let whole = devices.iter().all(|d| WHOLE_STATES.contains(&d.state));
        let state = if whole { "ONLINE" } else { "DEGRADED" };
        // Walks the free ranges under the read lock: O(fragments).
        let outside = inner.space.free_in_partial_regions(inner.region_blocks).unwrap_or(0);
        PoolStatus {
            uuid: crate::device::label::uuid_string(&ctl.sb.pool_uuid),
            state,
            devices,
            size,
            used,
            // Free where allocation may go: not on a member being removed.
            free: inner.space.usable_free_blocks().saturating_sub(reserve) * BLOCK_SIZE,
            reserved: reserve.min(inner.space.usable_free_blocks()) * BLOCK_SIZE,
            freeing: freeing * BLOCK_SIZE,
            free_outside_regions: outside * BLOCK_SIZE,
            expansion: self.options.expansion,
            expansions: self.counters.expansions.load(Ordering::Relaxed),
            metadata: labels + nodes + ctl.journal.used * BLOCK_SIZE,
            journal_size: ctl.journal.blocks * BLOCK_SIZE,
            volumes: blocks().count(),
            file_volumes,
            virtual_size,
            overcommit_ratio: if size == 0 { 0.0 } else { virtual_size as f64 / size as f64 },
            overcommit_limit: inner.state.overcommit_milli.map(|m| f64::from(m) / 1000.0),
            epoch: inner.state.epoch,
            commit_seq: ctl.journal.seq,
            placement: inner.placement.name(),
            strict: self.options.strict,
            notes: ctl.notes.clone(),
            fenced: self.is_fenced(),
            checksums: self.checksums,
            checksum_errors: self.counters.checksum_errors.load(Ordering::Relaxed),
            read_errors: self.counters.read_errors.load(Ordering::Relaxed),
            healed_blocks: self.counters.healed_blocks.load(Ordering::Relaxed),
            coarse_sums: self.coarse.load(Ordering::SeqCst),
            split_groups: self.counters.split_groups.load(Ordering::Relaxed),
            coarse_groups: self.counters.coarse_groups.load(Ordering::Relaxed),
            reconstructed_blocks: self.counters.reconstructed_blocks.load(Ordering::Relaxed),
            resynced_blocks: self.counters.resynced_blocks.load(Ordering::Relaxed),
            format: ctl.sb.version,
            metadata_cache: inner.state.store.cache.stats(),
            metadata_budget: self.metadata_budget() as u64,
            dirty_nodes: inner.state.store.dirty_nodes(),
            healed_nodes: inner.state.store.healed_nodes(),
            node_fetches: self.counters.node_fetches.load(Ordering::Relaxed),
            inline_dead_lists: inner.state.inline_dead_lists(),
        }
    }
}

/// Read and cache the node a miss named, by the kind of its tree.
fn fetch_node(store: &tarn_store::Store, miss: &tarn_store::Miss) -> Result<()> {
    use crate::map::extent_map::tree_id;
    use tarn_format::node::{ExtentValue, RangeValue, SumsValue};
    let kind = miss.tree & (0xff << 56);
    match kind {
        tree_id::HEAD | tree_id::DEAD_LIST => tarn_store::fetch::<ExtentValue>(store, miss)?,
        tree_id::SUMS => tarn_store::fetch::<SumsValue>(store, miss)?,
        tree_id::SPACE => tarn_store::fetch::<RangeValue>(store, miss)?,
        _ => return Err(EngineError::Inconsistent(format!("a node of unknown tree {:#x} missed", miss.tree))),
    }
    Ok(())
}

/// The volume called `name`.
impl Pool {
    /// Per member, its status line (a removed slot by its recorded path).
    fn device_statuses(&self, ctl: &CommitCtl, inner: &Inner) -> Vec<DeviceStatus> {
        self.devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                // A removed slot's device is not the pool's any more: its
                // recorded path says which it was.
                // So is a missing spare's (`Vacant`).
                let entry = ctl.sb.devices.get(i);
                let removed = entry.filter(|e| e.removed || (e.spare && !d.present()) || d.missing_member());
                let state = match entry {
                    Some(e) if e.removed => "REMOVED",
                    Some(e) if e.spare && d.present() => "SPARE",
                    Some(e) if e.spare => "MISSING",
                    // A member holding data whose device was not found.
                    _ if d.missing_member() => "UNAVAIL",
                    // A new device being rebuilt from parity rows.
                    _ if d.rebuild_slot().is_some_and(|s| s.is_replacing()) => "REPLACING",
                    _ if d.degraded() => "REBUILDING",
                    _ => self.member_state(inner, i),
                };
                DeviceStatus {
                    index: i,
                    path: removed.map_or_else(|| d.name(), |e| e.path.clone()),
                    state,
                    legs: self.mirrors[i].as_ref().map(|m| m.status().1).unwrap_or_default(),
                    size: if removed.is_some() { 0 } else { d.size() },
                    data_bytes: (inner.space.devices[i].data_end - inner.space.devices[i].data_start) * BLOCK_SIZE,
                    free_bytes: inner.space.devices[i].free_blocks * BLOCK_SIZE,
                    placement: inner.device_placement.get(i).copied().flatten().map(PlacementKind::name),
                }
            })
            .collect()
    }

    /// A member's state for `status`: a mirror's own, else DRAINING when
    /// allocation avoids it outside `dev add` (which holds the commit
    /// lock, as `status` does): a member being evacuated (`dev remove`).
    fn member_state(&self, inner: &Inner, i: usize) -> &'static str {
        match &self.mirrors[i] {
            Some(m) => m.status().0,
            None if !inner.space.usable(i) => "DRAINING",
            None => "ONLINE",
        }
    }
}

pub(crate) fn volume_named<'a>(state: &'a State, name: &str) -> Result<&'a Volume> {
    // File volumes and their objects are not block volumes: hidden here.
    let v = state.by_name.get(name).and_then(|id| state.volume(*id)).filter(|v| v.role.is_none());
    v.ok_or_else(|| EngineError::NoSuchVolume(name.to_string()))
}

/// Segments of a view with clones' origin markers resolved, under a lock
/// the caller holds.
pub(crate) fn resolve_in(inner: &Inner, vol: u32, view: View, lba: u64, len: u64) -> Result<Vec<Segment>> {
    let v = inner.state.volume(vol).ok_or(EngineError::VolumeGone(vol))?;
    if view == View::Head && v.origin.is_none() {
        return Ok(v.map.lookup(lba, len, usize::MAX)?);
    }
    Ok(inner.state.resolve(vol, view, lba, len)?)
}

fn info(inner: &Inner, v: &Volume) -> VolumeInfo {
    let state = &inner.state;
    let origin = v.origin.and_then(|o| {
        let ov = state.volume(o.vol)?;
        let snap = ov.snapshots.iter().find(|s| s.epoch == o.epoch)?;
        Some(format!("{}@{}", ov.name, snap.name))
    });
    VolumeInfo {
        id: v.id,
        name: v.name.clone(),
        size: v.size,
        allocated: v.map.physical_blocks() * BLOCK_SIZE,
        extents: v.map.extent_count() as u64,
        snapshots: v.snapshots.len(),
        snapshot_bytes: v.snapshot_blocks() * BLOCK_SIZE,
        origin,
        origin_bytes: v.origin_blocks() * BLOCK_SIZE,
        placement: inner.placement_of(v).name(),
        placement_own: v.placement.is_some(),
        quota: v.quota,
        devices: v.devices,
        stripe: v.stripe,
        parity: v.parity,
    }
}
