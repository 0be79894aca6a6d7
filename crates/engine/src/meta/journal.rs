//! The journal region on the primary device, in two halves (*sides*): one
//! record per commit, appended to the side of the current generation
//! (`generation % 2`). Every checkpoint moves the writer to the other side
//! with the next generation, at the freeze; the records written there while
//! the checkpoint is still being written are replayed after the side the
//! durable superblock names (docs/FORMAT.md *Journal*). A format 2 pool
//! (opened for its upgrade) used the whole region as one side.

use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::members::mirror::read_validated;
use tarn_format::journal::{RecordHeader, HEADER_LEN};
use tarn_format::ops::{decode_ops, Op};
use tarn_format::BLOCK_SIZE;

/// Where the journal lives and how far the current side is filled.
#[derive(Debug, Clone)]
pub struct JournalCursor {
    /// The whole region.
    pub start: u64,
    pub blocks: u64,
    pub generation: u64,
    /// Blocks used in the current side.
    pub used: u64,
    /// Sequence number of the last durable commit.
    pub seq: u64,
    /// Format 2: one side, the whole region (replay for an upgrade only).
    pub whole_region: bool,
}

impl JournalCursor {
    /// The cursor at the start of the side of `generation`.
    pub fn at_side(start: u64, blocks: u64, generation: u64, seq: u64) -> JournalCursor {
        JournalCursor { start, blocks, generation, used: 0, seq, whole_region: false }
    }

    pub fn side_blocks(&self) -> u64 {
        if self.whole_region {
            self.blocks
        } else {
            self.blocks / 2
        }
    }

    /// First block of the current side.
    pub fn side_start(&self) -> u64 {
        if self.whole_region {
            self.start
        } else {
            self.start + (self.generation % 2) * self.side_blocks()
        }
    }

    pub fn fits(&self, record_blocks: u64) -> bool {
        self.used + record_blocks <= self.side_blocks()
    }

    /// Three quarters of the side are used: time for a checkpoint.
    pub fn low(&self) -> bool {
        self.used * 4 > self.side_blocks() * 3
    }

    /// Move to the other side with the next generation, after commit `seq`.
    pub fn switch_side(&mut self, seq: u64) {
        *self = JournalCursor::at_side(self.start, self.blocks, self.generation + 1, seq);
    }
}

/// One replayed commit.
pub struct Replayed {
    pub seq: u64,
    pub epoch: u64,
    pub ops: Vec<Op>,
}

/// Append one record; the caller flushes. Returns the blocks it took.
pub fn append(dev: &dyn Device, cur: &JournalCursor, epoch: u64, payload: &[u8]) -> Result<u64> {
    assert!(!cur.whole_region, "format 2 journals are only replayed");
    let block = cur.side_start() + cur.used;
    let rec = RecordHeader::encode_record(cur.generation, cur.seq + 1, block, epoch, payload);
    let blocks = rec.len() as u64 / BLOCK_SIZE;
    assert!(cur.fits(blocks), "journal record written past the region");
    dev.write_at(&rec, block * BLOCK_SIZE).map_err(|e| EngineError::io("write journal", dev.name(), e))?;
    Ok(blocks)
}

/// Replay the side of `cur.generation` from its start, then the other
/// side if it goes on there (records written while a checkpoint that
/// never became durable was being written: the next generation, the next
/// sequence number). Records are read while they are valid, of the
/// side's generation and consecutive; the first that is not ends a side:
/// it is a commit that never completed (torn, or never written).
/// (`one_side`: a negative control's defect, see `OpenOptions`.)
pub fn replay(dev: &dyn Device, cur: &mut JournalCursor, max_records: usize, one_side: bool) -> Result<Vec<Replayed>> {
    let mut out = Vec::new();
    replay_side(dev, cur, max_records, &mut out)?;
    let mut next = cur.clone();
    if !cur.whole_region && !one_side && out.len() < max_records {
        next.switch_side(cur.seq);
        let before = out.len();
        replay_side(dev, &mut next, max_records, &mut out)?;
        if out.len() > before {
            *cur = next.clone();
        }
    }
    if out.len() < max_records {
        refuse_if_a_record_follows(dev, cur, cur.side_start() + cur.used + 1)?;
        if next.generation != cur.generation && !one_side {
            // Replay did not go on in the next side: it must not hold a
            // later record either.
            let next = JournalCursor { seq: cur.seq, ..next };
            refuse_if_a_record_follows(dev, &next, next.side_start())?;
        }
    }
    Ok(out)
}

fn replay_side(dev: &dyn Device, cur: &mut JournalCursor, max_records: usize, out: &mut Vec<Replayed>) -> Result<()> {
    let mut head = vec![0u8; BLOCK_SIZE as usize];
    while cur.used < cur.side_blocks() && out.len() < max_records {
        let block = cur.side_start() + cur.used;
        // On a mirror, a copy failing these checks where another passes is
        // rewritten from the good one (read_validated).
        let header_ok = |b: &[u8]| {
            RecordHeader::decode(b, block)
                .is_ok_and(|h| h.generation == cur.generation && h.seq == cur.seq + 1 && cur.fits(u64::from(h.blocks)))
        };
        let io = |e| EngineError::io("read journal", dev.name(), e);
        if !read_validated(dev, &mut head, block * BLOCK_SIZE, header_ok).map_err(io)? {
            break;
        }
        let Ok(h) = RecordHeader::decode(&head, block) else {
            break;
        };
        let mut rec = vec![0u8; h.blocks as usize * BLOCK_SIZE as usize];
        let payload_range = HEADER_LEN..HEADER_LEN + h.payload_len as usize;
        let record_ok = |b: &[u8]| header_ok(b) && h.verify_payload(&b[payload_range.clone()]).is_ok();
        if !read_validated(dev, &mut rec, block * BLOCK_SIZE, record_ok).map_err(io)? {
            break;
        }
        let payload = &rec[payload_range.clone()];
        let ops = decode_ops(payload).map_err(|source| EngineError::Corrupt {
            what: "journal record",
            device: dev.name(),
            source,
        })?;
        cur.used += u64::from(h.blocks);
        cur.seq = h.seq;
        out.push(Replayed { seq: h.seq, epoch: h.epoch, ops });
    }
    Ok(())
}

/// Blocks after the end of replay searched for a later record: more than
/// one record can take (the pending-ops bound keeps records under 4 MiB).
const FOLLOWING_SCAN_BLOCKS: u64 = 2048;

/// Replay ended at `cur`: the record there is torn, damaged or was never
/// written. Records of one side are written one after another, each
/// only once the one before is durable, so a valid record of this
/// generation with a later sequence number beyond it means the record
/// here was complete and is now damaged (rot, a lost or misdirected
/// write): replaying past it is impossible and stopping would silently
/// drop committed changes. Found by the device-fault simulation.
fn refuse_if_a_record_follows(dev: &dyn Device, cur: &JournalCursor, first: u64) -> Result<()> {
    let end = (cur.side_start() + cur.side_blocks()).min(first + FOLLOWING_SCAN_BLOCKS);
    let mut buf = vec![0u8; BLOCK_SIZE as usize];
    for block in first..end {
        // A block that cannot be read proves nothing either way.
        if dev.read_at(&mut buf, block * BLOCK_SIZE).is_err() {
            continue;
        }
        let Ok(h) = RecordHeader::decode(&buf, block) else { continue };
        if h.generation == cur.generation && h.seq > cur.seq + 1 {
            let detail = format!(
                "journal record {} at block {} is damaged, but record {} follows at block {block}: \
                 committed changes would be lost; refusing to open",
                cur.seq + 1,
                cur.side_start() + cur.used,
                h.seq
            );
            return Err(EngineError::NotAPool { device: dev.name(), detail });
        }
    }
    Ok(())
}

/// An upper bound of `op`'s encoded size in a journal record (every varint
/// at its longest), cheap enough to count on every write.
pub fn op_bytes_bound(op: &Op) -> usize {
    const V: usize = 10; // a varint at its longest
    const HEAD: usize = 1 + 4; // tag, volume
    match op {
        Op::Map { .. } => HEAD + V + V + 8 + V,
        Op::Unmap { .. } => HEAD + V + V,
        Op::VolCreate { name, .. } | Op::SnapCreate { name, .. } => HEAD + 8 + 1 + name.len(),
        Op::VolResize { .. } => HEAD + 8,
        Op::VolDelete { .. } | Op::CloneDetach { .. } => HEAD,
        Op::VolPlacement { .. } => HEAD + 1,
        Op::VolRole { .. } => HEAD + 5,
        Op::VolQuota { .. } => HEAD + 8,
        Op::PoolOvercommit { .. } => HEAD + 4,
        Op::VolDevices { .. } => HEAD + 2,
        Op::VolStripe { .. } | Op::VolParity { .. } => HEAD + 3,
        Op::Sums { sums, .. } => HEAD + 8 + V + 4 * sums.len(),
        Op::GroupSums { crcs, .. } => HEAD + 8 + V + 4 * crcs.len(),
        Op::Regions { ids, .. } => HEAD + V + V * ids.len(),
        Op::SnapDelete { .. } | Op::Rollback { .. } => HEAD + V,
        Op::CloneCreate { name, .. } => HEAD + 4 + V + 1 + name.len(),
        Op::Materialize { .. } => HEAD + V + V + V + 8,
        Op::Relocate { .. } => HEAD + V + V + V + 8 + 8,
    }
}

/// The bound of the queue of pending ops (`Pool::pending`): a quarter of
/// a journal side, between 16 KiB and 4 MiB. A commit of a full queue is
/// then a record well inside the side (a checkpoint comes at three
/// quarters full, see `commit/`), and its encoding, write and replay stay
/// short.
pub fn pending_limit(journal_blocks: u64) -> usize {
    let quarter = journal_blocks.saturating_mul(BLOCK_SIZE) / 8;
    quarter.clamp(16 << 10, 4 << 20) as usize
}
