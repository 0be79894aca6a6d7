//! File-system hints (seed 002): moving the blocks a guest file system
//! uses as metadata together, onto a clustered run of a device or onto a
//! device set aside for them, and back ("unhint": no lock-in).
//!
//! The volume's own map is the remap table: a hinted block is a block
//! whose map entry points into the cluster, so hints cost no metadata
//! beyond the map (the thesis kept an inverted page table and a bitmap,
//! ~0.5% of the remapped space). Moves copy data to new space and swap
//! the map like compaction does (`relayout.rs`), so they are as crash-safe
//! as a write; a block a snapshot shares moves for the snapshot too
//! (Relocate keeps its birth), so sharing is kept.

use crate::error::{EngineError, Result};
use crate::io::NewPiece;
use crate::map::extent_map::Segment;
use crate::map::state::Volume;
use crate::pool::Pool;
use crate::volumes::relayout::{Destination, Window, WINDOW_BLOCKS};
use tarn_format::{Pba, BLOCK_SIZE};

/// Where hinted blocks go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HintTarget {
    /// One run on the device with the most room, in logical order.
    Cluster,
    /// The device set aside for metadata (a faster one, say).
    Device(usize),
    /// Back where the volume's placement puts new data (`vol unhint`).
    Natural,
}

/// What a hint move did, in 4 KiB blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HintReport {
    pub blocks_moved: u64,
    /// Of the blocks moved, those snapshots share: they moved for every
    /// snapshot and clone at once (no copy, no snapshot grows).
    pub blocks_shared: u64,
    /// Mapped blocks already where the target wants them.
    pub blocks_in_place: u64,
    /// Windows written by clients while they moved (left as they are).
    pub windows_skipped: u64,
    /// The target ran out of room: the blocks moved so far stay there,
    /// the rest where they were (a metadata device too small).
    pub stopped_full: bool,
}

/// Largest cluster searched for as one aligned free run: 64 MiB.
const CLUSTER_SEARCH_BLOCKS: u64 = 1 << 14;

impl Pool {
    /// Set aside `device` for hinted metadata: new data avoids it while
    /// another device has room. Not persistent (give it at every open).
    pub fn set_hint_device(&self, device: Option<usize>) -> Result<()> {
        if let Some(d) = device.filter(|&d| d >= self.devices().len()) {
            return Err(EngineError::InvalidArgument(format!("no device {d} in the pool")));
        }
        self.write_inner().space.hint_device = device;
        Ok(())
    }

    /// Move the mapped blocks of `ranges` ((first block, count) in 4 KiB
    /// blocks, disjoint) of volume `name`'s head to `target`, in the order
    /// given; `progress(done, total)` in blocks. Durable when it returns.
    pub fn place_hinted(
        &self,
        name: &str,
        ranges: &[(u64, u64)],
        target: HintTarget,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<HintReport> {
        self.check_writable()?;
        let id = self.volume_id(name).ok_or_else(|| EngineError::NoSuchVolume(name.to_string()))?;
        for &(first, len) in ranges {
            let bytes = |b: u64| b.saturating_mul(BLOCK_SIZE);
            self.check_view_range("hint", id, crate::View::Head, bytes(first), bytes(len), u64::MAX)?;
        }
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        let (device, mut cursor) = self.hint_start(target, total)?;
        let mut report = HintReport::default();
        let mut done = 0;
        for &(first, len) in ranges {
            let mut lba = first;
            while lba < first + len && !report.stopped_full {
                let n = WINDOW_BLOCKS.min(first + len - lba);
                self.make_room()?;
                self.place_window(id, (lba, n), target, (device, &mut cursor), &mut report)?;
                lba += n;
                done += n;
                progress(done, total);
            }
        }
        if report.stopped_full {
            log::warn!(
                "hints for volume {name}: no room left on {} after {} blocks moved; the rest stays where it is",
                self.devices()[device].name(),
                report.blocks_moved
            );
        }
        self.flush()?;
        Ok(report)
    }

    /// The device and first block the moved blocks start from.
    fn hint_start(&self, target: HintTarget, total: u64) -> Result<(usize, u64)> {
        let mut inner = self.write_inner();
        let space = &mut inner.space;
        match target {
            HintTarget::Device(d) if d >= space.devices.len() => {
                Err(EngineError::InvalidArgument(format!("no device {d} in the pool")))
            }
            HintTarget::Natural => Ok((0, 0)),
            // One free run if there is one, so the moved blocks lie in the
            // order given (fsck's), not around what the device held.
            HintTarget::Device(d) => Ok((d, cluster_start(space, d, total)?.unwrap_or(0))),
            HintTarget::Cluster => {
                let device = space.roomiest().ok_or(EngineError::NoSpace)?;
                let start = cluster_start(space, device, total)?.unwrap_or(space.devices[device].cursor);
                Ok((device, start))
            }
        }
    }

    fn place_window(
        &self,
        id: u32,
        (lba, len): (u64, u64),
        target: HintTarget,
        (device, cursor): (usize, &mut u64),
        report: &mut HintReport,
    ) -> Result<()> {
        let at_cursor = *cursor;
        let pick = |_: &Volume, segs: &[Segment]| pick_for(segs, target, device, at_cursor);
        let (shared, in_place) = self.with_cached_nodes(|inner| {
            let v = inner.state.volume(id).ok_or(EngineError::VolumeGone(id))?;
            Ok(count_unmoved(v, &v.map.lookup(lba, len, usize::MAX)?, target, device, at_cursor))
        })?;
        report.blocks_shared += shared;
        report.blocks_in_place += in_place;
        if target == HintTarget::Cluster && in_place > 0 {
            // Already the cluster's next run: the cursor moves past it.
            *cursor += in_place;
        }
        let mut dest = match target {
            HintTarget::Natural => Destination::Placement,
            _ => Destination::Cursor { device, cursor },
        };
        match self.move_window(id, (lba, len), &pick, &mut dest)? {
            Window::Moved(n) => report.blocks_moved += n,
            Window::Skipped => report.windows_skipped += 1,
            Window::NoRoom => report.stopped_full = true,
            Window::Fine => {}
        }
        Ok(())
    }

    /// New space for `wanted` holes next-fit from `cursor` on `device`.
    pub(crate) fn allocate_at_cursor(
        &self,
        wanted: &[Segment],
        device: usize,
        cursor: &mut u64,
    ) -> Result<Vec<NewPiece>> {
        let mut inner = self.write_inner();
        let mut fresh = Vec::new();
        for seg in wanted {
            let got = inner.space.allocate_data_from(device, cursor, seg.len());
            let Ok(Some(pieces)) = got else {
                crate::io::release_unmapped(&mut inner.space, &fresh)?;
                return Err(got.err().map_or(EngineError::NoSpace, EngineError::from));
            };
            let mut at = seg.lba();
            for (pba, n) in pieces {
                fresh.push(NewPiece { lba: at, len: n, pba });
                at += n;
            }
        }
        Ok(fresh)
    }
}

/// The first block of an aligned free run on `device` for `total` blocks
/// (at most [`CLUSTER_SEARCH_BLOCKS`] searched for), if the device has one.
fn cluster_start(space: &mut crate::space::Space, device: usize, total: u64) -> Result<Option<u64>> {
    let want = total.clamp(1, CLUSTER_SEARCH_BLOCKS).next_power_of_two();
    Ok(space.find_region(device, want)?.map(Pba::block))
}

/// The mapped segments not yet where `target` wants them. Blocks
/// snapshots share move too, once for all of them (Relocate, see
/// `relayout.rs`); a clone's origin markers are not blocks of its own.
fn pick_for(segs: &[Segment], target: HintTarget, device: usize, cursor: u64) -> Vec<Segment> {
    segs.iter()
        .copied()
        .filter(|s| match *s {
            Segment::Mapped { pba, .. } => !pba.is_origin() && !in_place(s, target, device, cursor),
            Segment::Hole { .. } => false,
        })
        .collect()
}

/// (blocks snapshots share, blocks already in place) of a window.
fn count_unmoved(v: &Volume, segs: &[Segment], target: HintTarget, device: usize, cursor: u64) -> (u64, u64) {
    let mut counts = (0, 0);
    for s in segs {
        if let Segment::Mapped { pba, birth, len, .. } = *s {
            if in_place(s, target, device, cursor) {
                counts.1 += len;
            } else if !pba.is_origin() && !v.owns_alone(pba, birth) {
                counts.0 += len;
            }
        }
    }
    counts
}

/// Whether a mapped segment already lies where `target` puts it: on the
/// metadata device; or, for a cluster, exactly at its cursor (a second
/// `vol hint` then moves nothing).
fn in_place(seg: &Segment, target: HintTarget, device: usize, cursor: u64) -> bool {
    let Segment::Mapped { pba, .. } = *seg else { return false };
    match target {
        HintTarget::Device(_) => usize::from(pba.device()) == device,
        HintTarget::Cluster => usize::from(pba.device()) == device && pba.block() == cursor,
        HintTarget::Natural => false,
    }
}

/// 4 KiB blocks covering byte ranges (offset, len): the tarn blocks a
/// file system's metadata touches (a 1 KiB-block file system shares some
/// with data; moving those costs placement only).
pub fn blocks_covering(byte_ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(off, len) in byte_ranges {
        let (first, end) = (off / BLOCK_SIZE, (off + len).div_ceil(BLOCK_SIZE));
        match out.last_mut() {
            Some(last) if last.0 + last.1 >= first => last.1 = last.1.max(end - last.0),
            _ => out.push((first, end - first)),
        }
    }
    out
}
