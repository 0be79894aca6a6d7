//! tarn's own store (crates/store) with the durability shape the engine will
//! have: every commit appends its inserts as one log record (the op journal,
//! the same 32-byte records as src/map_store.rs; pwrite + fdatasync), and the
//! map, one `ExtentTree` keyed by lba, is checkpointed incrementally when its
//! dirty nodes pass `dirty_max` or the log passes `checkpoint_bytes`:
//! freeze / write the dirty nodes to the node file / fdatasync / write the
//! root record (root pba, crc, level, counts, where the log resumes) to a
//! fixed slot + fdatasync / adopt / free the superseded blocks, as
//! crates/store/examples/store_aging.rs does (blocks superseded since the
//! last checkpoint are freed once this one is durable; blocks this one wrote
//! that the live tree replaced meanwhile, one checkpoint later).
//!
//! Files: DIR/nodes (blocks 0 and 1: the two root-record slots, written
//! alternately, the valid one of the higher sequence wins; node blocks from
//! 17 on, a bump pointer then a free list) and DIR/log. Log records:
//! [count u32][log generation u32][count * 32 bytes][fnv u64]; a checkpoint
//! taken when the log passed `checkpoint_bytes` starts a new generation at
//! offset 0, so stale records after a restart are never replayed.
//! Open = read the root record, `ExtentTree::open`, replay the log records
//! of its generation from its offset. Not done (the bench never writes after
//! a reopen): the free list is not persisted, so a reopened store would leak
//! the blocks that were free.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use tarn_format::Pba;
use tarn_store::extents::{Extent as TExtent, MapCounts};
use tarn_store::{ExtentTree, FileIo, NodeAlloc, RootRef, Store, Written};

use crate::store::{Extent, MetaStore};

const REC: usize = 32; // vol u32, lba u64, len u32, pba u64, birth u64
const TREE_ID: u64 = 1;
/// The only volume of the workload (the tree is keyed by lba alone).
const VOL: u32 = 1;
/// Data blocks are named on device 1 (the node file is device 0).
const DATA_DEV: u16 = 1;
const FIRST_NODE: u64 = 16; // blocks 0..=16 reserved (root slots), nodes from 17
const MAGIC: u64 = 0x7461_726e_726f_6f74; // "tarnroot"
const ROOT_LEN: usize = 96;

fn fnv(b: &[u8]) -> u64 {
    let mut h = 0xcbf29ce484222325u64;
    for x in b {
        h = (h ^ *x as u64).wrapping_mul(0x100000001b3);
    }
    h
}

/// Node blocks: a free list (reused) then a bump pointer (store_aging's).
struct Alloc {
    next: u64,
    free: Vec<Pba>,
}

impl NodeAlloc for Alloc {
    fn alloc_node(&mut self) -> Option<Pba> {
        Some(self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            Pba::new(0, self.next)
        }))
    }
}

/// What a checkpoint records at a fixed place.
#[derive(Clone, Copy, Debug, Default)]
struct RootRecord {
    seq: u64,
    root_pba: u64,
    root_crc: u32,
    level: u8,
    mapped_blocks: u64,
    origin_blocks: u64,
    extents: u64,
    /// The log resumes here, in generation `log_gen`.
    log_off: u64,
    log_gen: u32,
    alloc_next: u64,
}

impl RootRecord {
    fn encode(&self) -> [u8; ROOT_LEN] {
        let mut b = [0u8; ROOT_LEN];
        let mut at = 0;
        let mut put = |v: &[u8]| {
            b[at..at + v.len()].copy_from_slice(v);
            at += v.len();
        };
        put(&MAGIC.to_le_bytes());
        put(&self.seq.to_le_bytes());
        put(&self.root_pba.to_le_bytes());
        put(&self.root_crc.to_le_bytes());
        put(&(self.level as u32).to_le_bytes());
        put(&self.mapped_blocks.to_le_bytes());
        put(&self.origin_blocks.to_le_bytes());
        put(&self.extents.to_le_bytes());
        put(&self.log_off.to_le_bytes());
        put(&(self.log_gen as u64).to_le_bytes());
        put(&self.alloc_next.to_le_bytes());
        debug_assert_eq!(at, ROOT_LEN - 8);
        let sum = fnv(&b[..ROOT_LEN - 8]);
        b[ROOT_LEN - 8..].copy_from_slice(&sum.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<RootRecord> {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        if u64_at(0) != MAGIC || fnv(&b[..ROOT_LEN - 8]) != u64_at(ROOT_LEN - 8) {
            return None;
        }
        Some(RootRecord {
            seq: u64_at(8),
            root_pba: u64_at(16),
            root_crc: u32::from_le_bytes(b[24..28].try_into().unwrap()),
            level: u32::from_le_bytes(b[28..32].try_into().unwrap()) as u8,
            mapped_blocks: u64_at(32),
            origin_blocks: u64_at(40),
            extents: u64_at(48),
            log_off: u64_at(56),
            log_gen: u64_at(64) as u32,
            alloc_next: u64_at(72),
        })
    }
}

pub struct TarnStore {
    store: Store,
    io: Arc<FileIo>,
    map: ExtentTree,
    alloc: Alloc,
    /// Blocks superseded since the last checkpoint (free once the next is durable).
    sup: Vec<Pba>,
    /// Blocks the last checkpoint wrote that the live tree replaced meanwhile.
    pending_left: Vec<Pba>,
    rec: RootRecord,
    log: File,
    log_len: u64,
    pending: Vec<u8>,
    checkpoint_bytes: u64,
    dirty_max: u64,
    pub checkpoints: u64,
    ckpt_ms: Vec<f64>,
    nodes_written: u64,
    replayed: u64,
}

fn io_err<T, E: std::fmt::Debug>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("tarn store: {what}: {e:?}"))
}

impl TarnStore {
    pub fn open(dir: &Path, checkpoint_bytes: u64, dirty_max: u64, cache_bytes: usize) -> TarnStore {
        let file = io_err(
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join("nodes")),
            "open node file",
        );
        // the root record: the valid slot of the higher sequence
        let mut rec: Option<RootRecord> = None;
        for slot in 0..2u64 {
            let mut b = [0u8; ROOT_LEN];
            if file.read_exact_at(&mut b, slot * 4096).is_ok() {
                if let Some(r) = RootRecord::decode(&b) {
                    if rec.is_none_or(|c| r.seq > c.seq) {
                        rec = Some(r);
                    }
                }
            }
        }
        let rec = rec.unwrap_or(RootRecord { alloc_next: FIRST_NODE, ..Default::default() });
        let io = Arc::new(FileIo::new(file));
        let store = io_err(Store::new(io.clone(), cache_bytes), "store");
        let root = if rec.root_pba == 0 {
            RootRef::EMPTY
        } else {
            RootRef { pba: Pba(rec.root_pba), crc: rec.root_crc, level: rec.level }
        };
        let counts = MapCounts {
            mapped_blocks: rec.mapped_blocks,
            origin_blocks: rec.origin_blocks,
            extents: rec.extents,
        };
        let map = io_err(ExtentTree::open(TREE_ID, root, counts), "open tree");
        let log = io_err(
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join("log")),
            "open log",
        );
        let mut s = TarnStore {
            store,
            io,
            map,
            alloc: Alloc { next: rec.alloc_next, free: Vec::new() },
            sup: Vec::new(),
            pending_left: Vec::new(),
            rec,
            log,
            log_len: rec.log_off,
            pending: Vec::new(),
            checkpoint_bytes,
            dirty_max,
            checkpoints: 0,
            ckpt_ms: Vec::new(),
            nodes_written: 0,
            replayed: 0,
        };
        s.replay();
        s
    }

    /// Apply the log records of the checkpoint's generation after its offset;
    /// stops at the first bad one or one of another generation.
    fn replay(&mut self) {
        let mut b = Vec::new();
        let mut f = &self.log;
        io_err(f.read_to_end(&mut b), "read log");
        let mut at = self.rec.log_off as usize;
        while at + 8 <= b.len() {
            let n = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
            let gen = u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap());
            let end = at + 8 + n * REC;
            if n == 0
                || gen != self.rec.log_gen
                || end + 8 > b.len()
                || fnv(&b[at..end]) != u64::from_le_bytes(b[end..end + 8].try_into().unwrap())
            {
                break;
            }
            for r in b[at + 8..end].chunks_exact(REC) {
                let vol = u32::from_le_bytes(r[0..4].try_into().unwrap());
                let lba = u64::from_le_bytes(r[4..12].try_into().unwrap());
                let len = u32::from_le_bytes(r[12..16].try_into().unwrap());
                let pba = u64::from_le_bytes(r[16..24].try_into().unwrap());
                let birth = u64::from_le_bytes(r[24..32].try_into().unwrap());
                self.apply(vol, lba, len, pba, birth);
                self.replayed += 1;
            }
            at = end + 8;
        }
        self.log_len = at as u64;
    }

    fn apply(&mut self, vol: u32, lba: u64, len: u32, pba: u64, birth: u64) {
        assert_eq!(vol, VOL, "backend tarn keys its one tree by lba: the workload's volume is always {VOL}");
        let e = TExtent { len: len as u64, pba: Pba::new(DATA_DEV, pba), birth };
        io_err(self.map.insert(&self.store, lba, e, &mut self.sup), "insert");
    }

    /// freeze / write dirty nodes / fdatasync / root record + fdatasync /
    /// adopt / free superseded blocks.
    fn checkpoint(&mut self) {
        let t = std::time::Instant::now();
        let frozen = self.map.tree.freeze();
        let pending = std::mem::take(&mut self.sup);
        let mut written = Written::default();
        let seq = self.rec.seq + 1;
        let root = io_err(frozen.write(&self.store, &mut self.alloc, seq, &mut written), "write nodes");
        self.nodes_written += written.count;
        io_err(self.io.file.sync_data(), "fdatasync node file");
        // a new log generation from offset 0 once the log passed its bound
        let reset = self.log_len >= self.checkpoint_bytes;
        let (log_gen, log_off) = if reset { (self.rec.log_gen + 1, 0) } else { (self.rec.log_gen, self.log_len) };
        let c = self.map.counts;
        let rec = RootRecord {
            seq,
            root_pba: root.pba.0,
            root_crc: root.crc,
            level: root.level,
            mapped_blocks: c.mapped_blocks,
            origin_blocks: c.origin_blocks,
            extents: c.extents,
            log_off,
            log_gen,
            alloc_next: self.alloc.next,
        };
        io_err(self.io.file.write_all_at(&rec.encode(), (seq % 2) * 4096), "write root record");
        io_err(self.io.file.sync_data(), "fdatasync root record");
        self.rec = rec;
        let left = self.map.tree.adopt(&self.store, frozen, &mut written);
        written.take_fills().apply(&self.store);
        for pba in pending.into_iter().chain(std::mem::replace(&mut self.pending_left, left)) {
            self.store.forget(pba);
            self.alloc.free.push(pba);
        }
        if reset {
            // the old generation is dead: give its bytes back (no sync needed,
            // its records are of another generation)
            io_err(self.log.set_len(0), "truncate log");
            self.log_len = 0;
        }
        self.checkpoints += 1;
        self.ckpt_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
}

impl Drop for TarnStore {
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.ckpt_ms);
        v.sort_by(f64::total_cmp);
        let p = |q: f64| v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
        let s = self.store.cache.stats();
        eprintln!(
            "tarn: {} checkpoints (dirty bound {}, log bound {} B): median {:.1} ms, p99 {:.1} ms, max {:.1} ms; \
             {} nodes written; {} inserts replayed at open; cache hits {} misses {} evictions {}, {} MiB",
            self.checkpoints,
            self.dirty_max,
            self.checkpoint_bytes,
            p(0.5),
            p(0.99),
            p(1.0),
            self.nodes_written,
            self.replayed,
            s.hits,
            s.misses,
            s.evictions,
            s.bytes >> 20
        );
    }
}

impl MetaStore for TarnStore {
    fn insert_extent(&mut self, vol: u32, lba: u64, len: u32, pba: u64, birth: u64) {
        self.apply(vol, lba, len, pba, birth);
        crate::store::push_record(&mut self.pending, 8, vol, lba, len, pba, birth);
    }

    fn lookup(&self, vol: u32, lba: u64) -> Option<Extent> {
        assert_eq!(vol, VOL, "backend tarn holds volume {VOL} only");
        // predecessor search: the entry with the greatest lba <= lba, if it covers lba
        let (k, v) = io_err(self.map.tree.get_le(&self.store, lba), "lookup")?;
        (k + v.len > lba).then(|| Extent { lba: k, len: v.len as u32, pba: Pba(v.pba).block(), birth: v.birth })
    }

    fn commit(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let n = ((self.pending.len() - 8) / REC) as u32;
        self.pending[0..4].copy_from_slice(&n.to_le_bytes());
        self.pending[4..8].copy_from_slice(&self.rec.log_gen.to_le_bytes());
        let sum = fnv(&self.pending);
        self.pending.extend_from_slice(&sum.to_le_bytes());
        io_err(self.log.write_all_at(&self.pending, self.log_len), "append log record");
        io_err(self.log.sync_data(), "fdatasync log");
        self.log_len += self.pending.len() as u64;
        self.pending.clear();
        if self.store.dirty_nodes() >= self.dirty_max || self.log_len >= self.checkpoint_bytes {
            self.checkpoint();
        }
    }

    fn device_bytes(&self) -> u64 {
        (self.alloc.next - FIRST_NODE - self.alloc.free.len() as u64) * 4096 + self.log_len
    }

    fn entries(&self) -> u64 {
        self.map.counts.extents
    }
}
