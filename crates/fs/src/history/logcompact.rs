//! Compaction of the version log (docs/FORMAT.md *File volumes*, version
//! records). A deleted close version's slot is zeroed and never handed
//! out again, so a volume that prunes its close versions (the keep bound)
//! walks its log towards the 2^26-slot bound, past which close versions
//! are refused, and every listing reads the log whole, freed slots too.
//! Once at least half of the log's slots (and `MIN_FREE` of them) are
//! free, each change that takes close versions also moves up to `STEP`
//! records down, until the log is packed: the first records above the
//! first free slot go to the free slots from there on, in slot order, so
//! slot order stays number order; their old slots are zeroed (a block
//! left all zeros is unmapped) and the header's slot count drops to the
//! last record. The moves, the zeroing and the header are queued in the
//! change that carries the versions (one commit): after a crash the log
//! is as before the step or as after it. No format change: a packed log
//! reads as a log whose deleted versions were never taken.

use crate::error::{FsError, Result};
use crate::history::vrecord::{VersionRecord, LEN};
use crate::namespace::ns::{FileVolume, Ns};
use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use tarn_engine::View;

/// Free slots a log must have before it is compacted (64 KiB of log).
pub const MIN_FREE: u64 = 1024;
/// Records moved by one step (what one change carries: at most 512
/// block rewrites, 32 KiB of records).
pub const STEP: usize = 512;
const BLOCK: u64 = 4096;
const PER_BLOCK: u64 = BLOCK / LEN as u64;

/// One record to move: from, to, and what it is.
struct Move {
    from: u64,
    to: u64,
    record: VersionRecord,
}

impl FileVolume {
    /// Slots of the version log in use or freed (the header's count): what
    /// a listing reads.
    pub fn version_log_slots(&self) -> u32 {
        self.lock().header.vlog_slots
    }

    /// One step of compaction when the log is due (see the module
    /// comment); queued, the caller's change commits it.
    pub(crate) fn compact_log_step(&self, ns: &mut Ns) -> Result<()> {
        let used = u64::from(ns.header.vlog_slots);
        if ns.header.vlog == 0 || self.view.is_some() {
            return Ok(());
        }
        let ix = self.index(ns)?;
        let live = ix.slots.len() as u64;
        if ix.slots.last().is_some_and(|&s| s >= used) {
            // Versions indexed whose records a failed write never put in
            // the log: the index is rebuilt from the log at its next use.
            ns.index = None;
            return Ok(());
        }
        if !ix.compacting && used - live < live.max(MIN_FREE) {
            return Ok(());
        }
        ix.compacting = true;
        let mut first_free = ix.packed;
        while ix.slots.contains(&first_free) {
            first_free += 1;
        }
        ix.packed = first_free;
        let from: Vec<u64> = ix.slots.range(first_free..).take(STEP).copied().collect();
        if from.is_empty() {
            ix.compacting = false;
            return self.lower_slot_count(ns);
        }
        self.pool.make_room_for(4096 + 2 * 128 * from.len())?;
        let mut blocks = self.read_blocks(ns, &from, first_free)?;
        let moves = plan_moves(&blocks, &from, first_free)?;
        self.write_moves(ns, &mut blocks, &moves)?;
        let ix = self.index(ns)?;
        for m in &moves {
            ix.moved(m.record.ino, m.record.number, m.from, m.to);
        }
        ix.packed = first_free + moves.len() as u64;
        ix.compacting = ix.slots.range(ix.packed..).next().is_some();
        self.lower_slot_count(ns)
    }

    /// The log's blocks holding slots `from` and the `from.len()` slots
    /// from `to` on, as the head has them.
    fn read_blocks(&self, ns: &Ns, from: &[u64], to: u64) -> Result<BTreeMap<u64, Vec<u8>>> {
        let mut blocks = BTreeMap::new();
        let dest = to..to + from.len() as u64;
        for block in from.iter().copied().chain(dest).map(|s| s / PER_BLOCK) {
            if let Entry::Vacant(e) = blocks.entry(block) {
                let mut b = vec![0u8; BLOCK as usize];
                self.pool.read_view(ns.header.vlog, View::Head, block * BLOCK, &mut b)?;
                e.insert(b);
            }
        }
        Ok(blocks)
    }

    /// Each block the moves touch rewritten once: old slots zeroed first,
    /// then the records placed (a record may land where another left).
    fn write_moves(&self, ns: &Ns, blocks: &mut BTreeMap<u64, Vec<u8>>, moves: &[Move]) -> Result<()> {
        for m in moves {
            let (block, at) = place(m.from);
            blocks.get_mut(&block).expect("read with the step")[at..at + LEN].fill(0);
        }
        for m in moves {
            let (block, at) = place(m.to);
            blocks.get_mut(&block).expect("read with the step")[at..at + LEN].copy_from_slice(&m.record.encode());
        }
        for (block, b) in blocks.iter() {
            if b.iter().all(|&x| x == 0) {
                self.pool.write_zeroes(ns.header.vlog, block * BLOCK, BLOCK, false, false)?;
            } else {
                self.pool.write(ns.header.vlog, block * BLOCK, b, false)?;
            }
        }
        Ok(())
    }

    /// The header's slot count lowered to just past the last record
    /// (slots past it are all zeros), queued with the step.
    fn lower_slot_count(&self, ns: &mut Ns) -> Result<()> {
        let last = self.index(ns)?.slots.last().map_or(0, |s| s + 1);
        if last < u64::from(ns.header.vlog_slots) {
            ns.header.vlog_slots = last as u32;
            self.write_header(ns)?;
        }
        Ok(())
    }
}

/// Block and byte offset of `slot` in the log.
fn place(slot: u64) -> (u64, usize) {
    (slot / PER_BLOCK, (slot % PER_BLOCK) as usize * LEN)
}

/// The records at `from` (slot order) decoded from `blocks`, each bound
/// for the next slot from `to` on; a slot the index names that holds no
/// record is damage (nothing is queued then).
fn plan_moves(blocks: &BTreeMap<u64, Vec<u8>>, from: &[u64], to: u64) -> Result<Vec<Move>> {
    let mut moves = Vec::with_capacity(from.len());
    for (k, &slot) in from.iter().enumerate() {
        let (block, at) = place(slot);
        let mut b = [0u8; LEN];
        b.copy_from_slice(&blocks[&block][at..at + LEN]);
        let record = VersionRecord::decode(&b, slot)?
            .ok_or_else(|| FsError::corrupt("version record", slot, "a listed record is gone"))?;
        moves.push(Move { from: slot, to: to + k as u64, record });
    }
    Ok(moves)
}
