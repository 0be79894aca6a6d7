//! Single parity per volume (RAID-5, `tarn vol create --parity N[:UNIT]`;
//! format: op 21 VolParity, catalog volume flag PARITY, incompat bit 16
//! PARITY; layout in `tarn_format::stripe::Parity`). The parity is logical:
//! row k is the volume's data units kN..kN+N-1 and one parity unit, their
//! XOR, mapped in the volume's own map past its data rows. Every write is
//! copy-on-write and maps its new data and its rows' new parity in one
//! commit (io/parity.rs), so a mapped row always XORs to zero: no write
//! hole. Each unit of a row is placed on its own member of the set, so a
//! row loses at most one unit with one member.

use crate::error::{EngineError, Result};
use crate::map::extent_map::Segment;
use crate::map::view::View;
use crate::pool::Pool;
use tarn_format::stripe::{Parity, MAX_PARITY_SHIFT, MIN_PARITY_MEMBERS};
use tarn_format::BLOCK_SIZE;

/// The default parity unit: 16 KiB (a partial-row write reads the rest of
/// its row, N x unit).
pub const DEFAULT_PARITY_UNIT: u64 = 16 << 10;

impl Pool {
    /// The parity set for a new volume with `data` data members plus one,
    /// in units of `unit` bytes: the data+1 usable members (not spares,
    /// removed or draining; among `devices` when that names any) with the
    /// most free space. Refuses a unit that is not a power of two from 4
    /// KiB to 64 KiB, fewer than 2 data members, and more members than
    /// the pool (or the volume's device set) has usable.
    pub(crate) fn parity_for(&self, data: u32, unit: u64, devices: u16) -> Result<Parity> {
        let bad = |why: String| Err(EngineError::InvalidArgument(why));
        let max = BLOCK_SIZE << MAX_PARITY_SHIFT;
        if !unit.is_power_of_two() || !(BLOCK_SIZE..=max).contains(&unit) {
            return bad(format!("a parity unit of {unit} bytes: give a power of two from 4 KiB to 64 KiB"));
        }
        if data + 1 < MIN_PARITY_MEMBERS {
            return bad(format!(
                "parity over {data} data member(s): give 2 or more (one data member and parity is a mirror)"
            ));
        }
        let width = data as usize + 1;
        let set =
            self.roomiest_set(width, devices, &format!("parity over {data} data members needs {width} members"))?;
        let shift = (unit / BLOCK_SIZE).trailing_zeros() as u8;
        Parity::from_parts(set, shift).ok_or(EngineError::InvalidArgument(format!("a parity set {set:#b}")))
    }
}

/// What verifying parity volumes' rows found (`Pool::scrub_parity`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParityReport {
    /// Rows with anything mapped, verified (heads', and snapshots' that
    /// differ from their head's).
    pub rows: u64,
    /// Of them, snapshots' rows.
    pub snapshot_rows: u64,
    /// Rows whose parity unit was not the XOR of their data units.
    pub mismatched: u64,
    /// Rows a unit of which had to be rebuilt from the others (a read
    /// error or a block failing its checksum).
    pub rebuilt: u64,
    /// Rows rewritten (a rebuilt unit to new space, or the parity alone).
    pub healed: u64,
}

impl ParityReport {
    fn add(&mut self, o: &ParityReport) {
        self.rows += o.rows;
        self.snapshot_rows += o.snapshot_rows;
        self.mismatched += o.mismatched;
        self.rebuilt += o.rebuilt;
        self.healed += o.healed;
    }
}

impl Pool {
    /// Verify every row of every parity volume's head (parity = XOR of the
    /// data units, every unit against its checksum) and, with `heal`,
    /// rewrite what is wrong: a row with a unit rebuilt from the others is
    /// written again to new space, a row whose parity alone is wrong gets
    /// new parity. Snapshots' rows that differ from their head's are
    /// verified too, not rewritten.
    pub fn scrub_parity(&self, heal: bool) -> Result<ParityReport> {
        let vols: Vec<u32> = {
            let inner = self.read_inner();
            inner.state.volumes.values().filter(|v| v.parity.is_some()).map(|v| v.id).collect()
        };
        let mut total = ParityReport::default();
        for vol in vols {
            match self.check_parity(vol, heal) {
                Ok(r) => total.add(&r),
                // Deleted meanwhile: nothing to verify.
                Err(EngineError::VolumeGone(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if total.rows > 0 {
            log::info!(
                "parity scrub: {} rows ({} in snapshots), {} mismatched, {} rebuilt, {} rewritten",
                total.rows,
                total.snapshot_rows,
                total.mismatched,
                total.rebuilt,
                total.healed
            );
        }
        Ok(total)
    }

    /// [`Pool::scrub_parity`] of one volume: its head's rows (healed with
    /// `heal`), then each snapshot's rows that differ from the head's
    /// (verified only: a snapshot is never rewritten; what they share was
    /// verified as the head's).
    pub fn check_parity(&self, vol: u32, heal: bool) -> Result<ParityReport> {
        let mut r = self.check_parity_view(vol, View::Head, heal)?;
        let epochs: Vec<u64> = {
            let inner = self.read_inner();
            let v = inner.state.volume(vol).ok_or(EngineError::VolumeGone(vol))?;
            v.snapshots.iter().map(|s| s.epoch).collect()
        };
        for epoch in epochs {
            match self.check_parity_view(vol, View::Snapshot(epoch), false) {
                Ok(s) => {
                    r.snapshot_rows += s.rows;
                    r.add(&s);
                }
                // Deleted meanwhile: nothing to verify.
                Err(EngineError::NoSuchSnapshot { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(r)
    }

    /// Where each block of a row (data, then parity unit) is mapped in
    /// `view`: what tells a snapshot's row from the head's.
    fn row_blocks_in(&self, vol: u32, view: View, (p, blocks): (Parity, u64), row: u64) -> Result<Vec<Option<u64>>> {
        let first = row * p.row_blocks();
        let mut out = Vec::new();
        for (lba, len) in [(first, p.row_blocks()), (p.parity_block(blocks, first), p.unit_blocks())] {
            for seg in self.resolve(vol, view, lba, len)? {
                match seg {
                    Segment::Mapped { pba, len, .. } => out.extend((0..len).map(|i| Some(pba.offset_by(i).0))),
                    Segment::Hole { len, .. } => out.extend((0..len).map(|_| None)),
                }
            }
        }
        Ok(out)
    }

    /// Verify the rows of one view of a parity volume; with `heal` (the
    /// head only), rewrite what is wrong.
    fn check_parity_view(&self, vol: u32, view: View, heal: bool) -> Result<ParityReport> {
        let (p, blocks) = self.parity_of(vol).ok_or(EngineError::VolumeGone(vol))?;
        let mut r = ParityReport::default();
        // Bounded by the volume's rows; each row is read under its lock.
        for row in 0..p.rows(blocks) {
            let _row = self.lock_row(vol, row);
            let first = row * p.row_blocks();
            let pb = p.parity_block(blocks, first);
            let here = self.row_blocks_in(vol, view, (p, blocks), row)?;
            if here.iter().all(Option::is_none) {
                continue;
            }
            if view != View::Head && here == self.row_blocks_in(vol, View::Head, (p, blocks), row)? {
                continue; // The head's row, verified as such.
            }
            r.rows += 1;
            let mut data = vec![0u8; (p.row_blocks() * BLOCK_SIZE) as usize];
            let mut parity = vec![0u8; (p.unit_blocks() * BLOCK_SIZE) as usize];
            let rebuilt = self.read_row_part((vol, view), (p, blocks), first, &mut data)?
                | self.read_row_part((vol, view), (p, blocks), pb, &mut parity)?;
            let want = crate::io::parity_of_row(p, &data);
            let mismatched = want != parity;
            r.mismatched += u64::from(mismatched);
            r.rebuilt += u64::from(rebuilt);
            if (mismatched || rebuilt) && view != View::Head {
                log::warn!(
                    "volume {vol} {view:?} row {row}: a unit {}; snapshots are not rewritten",
                    if rebuilt { "had to be rebuilt from its row" } else { "does not match the row's parity" }
                );
            }
            if !heal || view != View::Head || !(mismatched || rebuilt) {
                continue;
            }
            if rebuilt {
                let readable = (blocks.min(first + p.row_blocks()) - first) * BLOCK_SIZE;
                self.rewrite_row_locked(vol, p, blocks, row, (first, &data[..readable as usize]))?;
            } else {
                log::warn!("volume {vol} row {row}: parity does not match its data; rewritten");
                self.rewrite_parity_locked(vol, pb, &want)?;
            }
            r.healed += 1;
        }
        Ok(r)
    }
}
