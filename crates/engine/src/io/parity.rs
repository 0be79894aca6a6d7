//! Writes and reads of parity volumes (RAID-5 per volume; layout in
//! `tarn_format::stripe::Parity`, creation in `volumes/parity.rs`).
//!
//! A write goes row by row under the row's lock: the rest of the row is
//! read, the row's parity computed in memory, and the new data and the new
//! parity unit are written to fresh space (copy-on-write, never in place)
//! and mapped under one hold of the pool lock, so one commit maps both.
//! The commit protocol flushes data before the journal record: a crash
//! before the record leaves the old data and old parity mapped (untouched,
//! consistent); after it, the new ones. No mapped row ever mixes them: no
//! write hole. A read that fails (I/O error, checksum) rebuilds each block
//! from the rest of its row, checked against the block's own checksum.

use super::{uncharge, NewPiece, BS, MAX_WRITE_ATTEMPTS};
use crate::error::{EngineError, Result};
use crate::map::extent_map::Segment;
use crate::map::sums::{block_sum, sums_of, BlockSum};
use crate::map::view::View;
use crate::pool::Pool;
use std::sync::atomic::Ordering;
use tarn_format::stripe::Parity;
use tarn_format::{Pba, BLOCK_SIZE};

/// XOR `src` into `dst` (same length).
pub(crate) fn xor_into(dst: &mut [u8], src: &[u8]) {
    dst.iter_mut().zip(src).for_each(|(d, s)| *d ^= s);
}

/// The parity unit of a row's data (`row`: N units back to back).
pub(crate) fn parity_of_row(p: Parity, row: &[u8]) -> Vec<u8> {
    let unit = (p.unit_blocks() as usize) * BS;
    let mut parity = vec![0u8; unit];
    row.chunks(unit).for_each(|u| xor_into(&mut parity, u));
    parity
}

impl Pool {
    /// A volume's parity layout and data blocks, if it keeps parity.
    pub(crate) fn parity_of(&self, vol: u32) -> Option<(Parity, u64)> {
        let inner = self.read_inner();
        let v = inner.state.volume(vol)?;
        v.parity.map(|p| (p, v.size / BLOCK_SIZE))
    }

    /// Write whole blocks of a parity volume, row by row. Every block
    /// goes to new space, so every write allocates.
    pub(super) fn write_parity(&self, vol: u32, p: Parity, blocks: u64, lba: u64, data: &[u8]) -> Result<bool> {
        let end = lba + (data.len() / BS) as u64;
        let mut at = lba;
        // Bounded: one pass per row the write touches (at most 32 MiB).
        while at < end {
            let row = at / p.row_blocks();
            let row_end = ((row + 1) * p.row_blocks()).min(end);
            let piece = &data[((at - lba) as usize) * BS..((row_end - lba) as usize) * BS];
            // The row's lock is taken inside (a piece never spans rows).
            self.write_parity_row(vol, p, blocks, row, at, piece)?;
            at = row_end;
        }
        Ok(true)
    }

    /// The lock of row `row` of volume `vol`.
    pub(crate) fn lock_row(&self, vol: u32, row: u64) -> std::sync::MutexGuard<'_, ()> {
        let lock = (row as usize ^ (vol as usize).wrapping_mul(0x9e37)) % self.parity_rows.len();
        self.parity_rows[lock].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Write `piece` at block `at` of row `row` and the row's new parity.
    pub(crate) fn write_parity_row(
        &self,
        vol: u32,
        p: Parity,
        blocks: u64,
        row: u64,
        at: u64,
        piece: &[u8],
    ) -> Result<()> {
        let _row = self.lock_row(vol, row);
        self.rewrite_row(vol, p, blocks, row, (at, piece), false)
    }

    /// With the row locked: the row's data with `piece` over it, as new
    /// data (or, with `unmap`, the piece's blocks unmapped: it is zeros)
    /// and the row's new parity, mapped in one commit.
    fn rewrite_row(
        &self,
        vol: u32,
        p: Parity,
        blocks: u64,
        row: u64,
        (at, piece): (u64, &[u8]),
        unmap: bool,
    ) -> Result<()> {
        let first = row * p.row_blocks();
        let mut data = vec![0u8; (p.row_blocks() as usize) * BS];
        let (skip, n) = ((at - first) as usize * BS, piece.len());
        if n < data.len() {
            // The rest of the row as it is; blocks past the volume's end
            // are never written and stay zero.
            let readable = (blocks.min(first + p.row_blocks()) - first) as usize * BS;
            self.read(vol, first * BLOCK_SIZE, &mut data[..readable])?;
        }
        data[skip..skip + n].copy_from_slice(piece);
        let parity = parity_of_row(p, &data);
        let parity = (p.parity_block(blocks, first), &parity[..]);
        if unmap {
            let gone = (at, (n / BS) as u64);
            self.write_fresh_runs(vol, &[parity], Some(gone))
        } else {
            self.write_fresh_runs(vol, &[(at, piece), parity], None)
        }
    }

    /// Unmap whole blocks [lba, lba+n) of a parity volume (TRIM, zeroes),
    /// row by row, each row's parity rewritten in the same commit.
    pub(super) fn unmap_parity(&self, vol: u32, p: Parity, blocks: u64, lba: u64, n: u64) -> Result<()> {
        let end = lba + n;
        let mut at = lba;
        let zeros = vec![0u8; (p.row_blocks() as usize) * BS];
        // Bounded: one pass per row of the range.
        while at < end {
            let row = at / p.row_blocks();
            let row_end = ((row + 1) * p.row_blocks()).min(end);
            let _row = self.lock_row(vol, row);
            let mapped = {
                let inner = self.read_inner();
                let v = inner.state.volume(vol).ok_or(EngineError::VolumeGone(vol))?;
                v.map.any_mapped(at, row_end - at)?
            };
            if mapped {
                let piece = &zeros[..((row_end - at) as usize) * BS];
                self.rewrite_row(vol, p, blocks, row, (at, piece), true)?;
            }
            at = row_end;
        }
        Ok(())
    }

    /// Write runs of a volume (a row's new data and its new parity) to new
    /// space and map them, after unmapping `unmap` (lba, len) if given,
    /// under one hold of the pool lock: one commit takes all of it.
    fn write_fresh_runs(&self, vol: u32, runs: &[(u64, &[u8])], unmap: Option<(u64, u64)>) -> Result<()> {
        let sums: Vec<Vec<u32>> =
            runs.iter().map(|(_, d)| if self.checksums { sums_of(d) } else { Vec::new() }).collect();
        let segs: Vec<Segment> =
            runs.iter().map(|&(lba, d)| Segment::Hole { lba, len: (d.len() / BS) as u64 }).collect();
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let gate = self.gate_shared();
            let charge = self.with_cached_nodes(|inner| {
                let v = inner.state.volume(vol).ok_or(EngineError::VolumeGone(vol))?;
                let mut owned = 0;
                for s in &segs {
                    owned += super::owned_blocks(v, &v.map.lookup(s.lba(), s.len(), usize::MAX)?);
                }
                Ok(segs.iter().map(|s| s.len()).sum::<u64>() - owned)
            })?;
            let (fresh, charged) = match self.allocate_charged(vol, &segs, &Vec::new(), charge) {
                Err(EngineError::NoSpace) if self.options.expansion.is_some() => {
                    drop(gate);
                    if self.expand_if_needed(true)? {
                        continue;
                    }
                    return Err(EngineError::NoSpace);
                }
                other => other?,
            };
            // The new pieces of each run (runs do not overlap).
            let mut by_run: Vec<Vec<NewPiece>> = runs.iter().map(|_| Vec::new()).collect();
            for f in fresh {
                let i = runs.iter().position(|&(lba, d)| (lba..lba + (d.len() / BS) as u64).contains(&f.lba));
                by_run[i.unwrap_or(0)].push(f);
            }
            let mut written = Ok(());
            for (&(lba, d), pieces) in runs.iter().zip(&by_run) {
                written = written.and_then(|()| self.write_planned(&[], pieces, lba, d));
                written = written.and_then(|()| self.prefetch_sums(pieces));
            }
            if let Err(e) = written {
                by_run.iter().for_each(|pieces| self.give_back_unmapped(pieces));
                uncharge(&mut self.write_inner(), vol, charged);
                return Err(e);
            }
            // One lock hold: no commit can take the data's map without
            // the parity's.
            let mut inner = self.write_inner();
            uncharge(&mut inner, vol, charged);
            if let Some((lba, len)) = unmap {
                self.apply_ops(&mut inner, vec![tarn_format::ops::Op::Unmap { vol, lba, len }])?;
            }
            for ((&(lba, _), pieces), sums) in runs.iter().zip(by_run).zip(&sums) {
                self.map_fresh(&mut inner, vol, lba, pieces, sums)?;
            }
            return Ok(());
        }
        Err(EngineError::NoSpace)
    }

    /// With row `row` locked: write `piece` (from the row's first block
    /// on) again to new space with the row's parity (scrub's heal).
    pub(crate) fn rewrite_row_locked(
        &self,
        vol: u32,
        p: Parity,
        blocks: u64,
        row: u64,
        piece: (u64, &[u8]),
    ) -> Result<()> {
        self.rewrite_row(vol, p, blocks, row, piece, false)
    }

    /// With its row locked: map `parity` as the row's new parity unit at
    /// logical block `lba`.
    pub(crate) fn rewrite_parity_locked(&self, vol: u32, lba: u64, parity: &[u8]) -> Result<()> {
        self.write_fresh_runs(vol, &[(lba, parity)], None)
    }

    /// Read logical blocks of a view of a parity volume from `lba` (data
    /// or parity area, no size check), rebuilding what fails from the rest
    /// of the row; returns whether anything was rebuilt.
    pub(crate) fn read_row_part(
        &self,
        (vol, view): (u32, View),
        layout: (Parity, u64),
        lba: u64,
        buf: &mut [u8],
    ) -> Result<bool> {
        let failed = {
            let _gate = self.gate_shared();
            match self.read_verified(vol, view, lba * BLOCK_SIZE, buf, false) {
                Ok(true) => return Ok(false),
                Ok(false) => EngineError::Inconsistent(format!("volume {vol} block {lba}+: checksum mismatch")),
                Err(e @ (EngineError::Io { .. } | EngineError::Checksum { .. })) => e,
                Err(e) => return Err(e),
            }
        };
        self.read_reconstructing(vol, view, layout, lba * BLOCK_SIZE, buf, failed)?;
        Ok(true)
    }

    /// After a read of a parity volume failed with `err` (an I/O error or
    /// a checksum no copy matched): read it block by block, rebuilding
    /// each block that fails from the rest of its row. The caller holds
    /// no I/O gate.
    pub(crate) fn read_reconstructing(
        &self,
        vol: u32,
        view: View,
        (p, blocks): (Parity, u64),
        offset: u64,
        buf: &mut [u8],
        err: EngineError,
    ) -> Result<()> {
        let _gate = self.gate_shared();
        let end = offset + buf.len() as u64;
        let mut block = vec![0u8; BS];
        // Bounded by the request's blocks (at most 32 MiB).
        for b in offset / BLOCK_SIZE..end.div_ceil(BLOCK_SIZE) {
            if !matches!(self.read_verified(vol, view, b * BLOCK_SIZE, &mut block, false), Ok(true)) {
                match self.reconstruct_block(vol, view, p, blocks, b) {
                    Ok(good) => block.copy_from_slice(&good),
                    Err(why) => {
                        log::error!("volume {vol} block {b}: cannot rebuild from its row: {why}");
                        return Err(err);
                    }
                }
            }
            let (s, e) = ((b * BLOCK_SIZE).max(offset), ((b + 1) * BLOCK_SIZE).min(end));
            let from = (s - b * BLOCK_SIZE) as usize;
            buf[(s - offset) as usize..(e - offset) as usize].copy_from_slice(&block[from..from + (e - s) as usize]);
        }
        Ok(())
    }

    /// Logical block `b` of a parity volume (data or parity) rebuilt as
    /// the XOR of the other blocks at its offset in its row, checked
    /// against its own checksum; counted and logged (once per member).
    pub(crate) fn reconstruct_block(&self, vol: u32, view: View, p: Parity, blocks: u64, b: u64) -> Result<Vec<u8>> {
        let (out, pba) = self.block_from_row(vol, view, (p, blocks), b)?;
        let Some(pba) = pba else { return Ok(out) };
        self.counters.reconstructed_blocks.fetch_add(1, Ordering::Relaxed);
        let member = u32::from(pba.device()).min(31);
        if self.counters.reconstruct_logged.fetch_or(1 << member, Ordering::Relaxed) & (1 << member) == 0 {
            log::warn!(
                "parity volume {vol}: reading through member {member} by reconstruction (first at block {b}); \
                 the volume is degraded"
            );
        }
        Ok(out)
    }

    /// Block `b` of a view of a parity volume as the XOR of the rest of its
    /// row, checked against its own checksum, and where it is mapped
    /// (None: a hole, zeros). Not counted: the caller says what it is for.
    pub(crate) fn block_from_row(
        &self,
        vol: u32,
        view: View,
        (p, blocks): (Parity, u64),
        b: u64,
    ) -> Result<(Vec<u8>, Option<Pba>)> {
        let mut out = vec![0u8; BS];
        let mut peer = vec![0u8; BS];
        for other in row_peers(p, blocks, b) {
            if !self.read_verified(vol, view, other * BLOCK_SIZE, &mut peer, false)? {
                return Err(EngineError::Inconsistent(format!("block {other} of its row fails its checksum too")));
            }
            xor_into(&mut out, &peer);
        }
        let summed = self.resolve_summed(vol, view, b, 1)?;
        let Some((Segment::Mapped { pba, .. }, sums)) = summed.into_iter().next() else {
            return Ok((vec![0u8; BS], None)); // A hole reads as zeros.
        };
        match sums.first() {
            Some(Some(BlockSum::Block(want))) if block_sum(&out) != *want => {
                return Err(EngineError::Inconsistent(format!(
                    "block {b} rebuilt from its row does not match its checksum"
                )));
            }
            // One crc over a 64 KiB group cannot vouch for one block.
            Some(Some(BlockSum::Group(_))) => {
                return Err(EngineError::Inconsistent(format!(
                    "block {b} lies in a coarse checksum group: rebuilt alone, it cannot be verified"
                )));
            }
            _ => {}
        }
        Ok((out, Some(pba)))
    }
}

/// The row logical block `b` (data or parity area) belongs to.
pub(crate) fn row_of(p: Parity, blocks: u64, b: u64) -> u64 {
    let start = p.parity_start(blocks);
    if b >= start {
        (b - start) / p.unit_blocks()
    } else {
        b / p.row_blocks()
    }
}

/// The other logical blocks of `b`'s row at its offset in a unit: the
/// row's data blocks and its parity block, less `b` itself.
pub(crate) fn row_peers(p: Parity, blocks: u64, b: u64) -> Vec<u64> {
    let (start, unit) = (p.parity_start(blocks), p.unit_blocks());
    let (row, off) = if b >= start { ((b - start) / unit, (b - start) % unit) } else { (b / p.row_blocks(), b % unit) };
    let first = row * p.row_blocks() + off;
    (0..p.data_units())
        .map(|j| first + j * unit)
        .chain(std::iter::once(p.parity_block(blocks, first)))
        .filter(|&x| x != b)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_s_row_peers_are_the_rest_of_its_row() {
        // 3 data + parity, 4-block units, 30 blocks: 3 rows, parity from 36.
        let p = Parity::from_parts(0b1111, 2).unwrap();
        assert_eq!(row_peers(p, 30, 13), vec![17, 21, 41]);
        assert_eq!(row_peers(p, 30, 41), vec![13, 17, 21]);
        assert_eq!(row_peers(p, 30, 0), vec![4, 8, 36]);
        assert_eq!((row_of(p, 30, 13), row_of(p, 30, 41), row_of(p, 30, 0), row_of(p, 30, 47)), (1, 1, 0, 2));
        let row = [[1u8, 2].repeat(BS / 2), [7u8].repeat(BS)].concat();
        let parity = parity_of_row(Parity::from_parts(0b111, 0).unwrap(), &row);
        assert_eq!(parity, [1u8 ^ 7, 2 ^ 7].repeat(BS / 2));
    }
}
