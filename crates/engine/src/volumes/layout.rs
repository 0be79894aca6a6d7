//! Who holds which physical blocks, for pictures of a pool (`tarn map`):
//! read-only, in chunks. Each chunk is read under the pool lock shared,
//! with no device I/O (`with_cached_nodes`), and the lock is dropped
//! between chunks, so a map of millions of extents never makes a writer
//! wait for more than one chunk (docs/ARCHITECTURE.md, *Locks*). Between
//! chunks the maps may change: the answer is a picture, not a check.

use crate::error::Result;
use crate::map::extent_map::ExtentMap;
use crate::map::state::Volume;
use crate::pool::Pool;
use tarn_format::superblock::LABEL_BLOCKS;

/// Map entries (or free ranges) read per hold of the pool lock.
const CHUNK: usize = 4096;

/// Which views of its volume a physical run is seen by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Holder {
    /// The head alone (born after the newest snapshot).
    Head,
    /// The head and at least one snapshot.
    Shared,
    /// Snapshots only (overwritten or trimmed in the head since).
    Snapshots,
}

/// A run of physical blocks one volume holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldRun {
    pub device: u16,
    pub block: u64,
    pub len: u64,
    pub holder: Holder,
}

/// Where a device's areas lie, in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLayout {
    /// The device's size in blocks.
    pub blocks: u64,
    /// Labels (superblock copies): `[0, labels)`.
    pub labels: u64,
    /// The journal follows the labels (device 0 only): `[labels, data_start)`.
    pub data_start: u64,
    pub data_end: u64,
    /// Where checkpoints start looking for node blocks (data fills from the front).
    pub metadata_start: u64,
}

/// Free ranges of a device, `(first block, length)`, in block order.
pub type FreeRanges<'a> = &'a [(u64, u64)];

/// Which of a volume's maps a chunk reads: the head, or a snapshot's dead
/// list (by epoch, so a snapshot deleted between chunks is skipped).
#[derive(Clone, Copy)]
enum MapOf {
    Head,
    Dead(u64),
}

impl Pool {
    /// Every device's areas.
    pub fn device_layouts(&self) -> Vec<DeviceLayout> {
        let inner = self.read_inner();
        let sizes = self.devices.iter().map(|d| d.size() / tarn_format::BLOCK_SIZE);
        inner
            .space
            .devices
            .iter()
            .zip(sizes)
            .map(|(s, blocks)| DeviceLayout {
                blocks,
                labels: LABEL_BLOCKS,
                data_start: s.data_start,
                data_end: s.data_end,
                metadata_start: crate::space::metadata_start(s),
            })
            .collect()
    }

    /// Blocks kept free for metadata: user writes may not take them.
    pub fn reserve_blocks(&self) -> u64 {
        self.read_inner().space.reserve_blocks
    }

    /// Call `f` with chunks of the physical runs volume `vol` holds (its
    /// head, then each snapshot's dead list); origin markers of a clone
    /// are not its space and are left out. A volume gone stops the walk.
    pub fn held_runs(&self, vol: u32, f: &mut dyn FnMut(&[HeldRun])) -> Result<()> {
        let epochs: Vec<u64> = match self.read_inner().state.volume(vol) {
            Some(v) => v.snapshots.iter().map(|s| s.epoch).collect(),
            None => return Ok(()),
        };
        for map in std::iter::once(MapOf::Head).chain(epochs.into_iter().map(MapOf::Dead)) {
            let mut from = Some(0);
            while let Some(lba) = from {
                let (runs, next) = self.with_cached_nodes(|inner| match inner.state.volume(vol) {
                    Some(v) => chunk_of(v, map, lba),
                    None => Ok((Vec::new(), None)),
                })?;
                f(&runs);
                from = next;
            }
        }
        Ok(())
    }

    /// Call `f` with chunks of device `device`'s free ranges `(block, len)`
    /// in block order.
    pub fn free_runs(&self, device: usize, f: &mut dyn FnMut(FreeRanges<'_>)) -> Result<()> {
        let mut from = Some(0);
        while let Some(block) = from {
            let (ranges, next) = self.with_cached_nodes(|inner| {
                let Some(map) = inner.space.devices.get(device) else { return Ok((Vec::new(), None)) };
                let mut out = Vec::new();
                map.tree.range(&inner.state.store, block, u64::MAX, &mut |k, v| {
                    out.push((k, v.len));
                    out.len() < CHUNK
                })?;
                let next = (out.len() == CHUNK).then(|| out.last().map_or(0, |r| r.0 + r.1));
                Ok((out, next))
            })?;
            f(&ranges);
            from = next;
        }
        Ok(())
    }
}

/// Up to `CHUNK` runs of one map from `lba`, and where the next chunk starts.
fn chunk_of(v: &Volume, map: MapOf, lba: u64) -> Result<(Vec<HeldRun>, Option<u64>)> {
    let (entries, holder_of): (&ExtentMap, Box<dyn Fn(u64) -> Holder>) = match map {
        MapOf::Head => {
            let shared = v.shared_epoch();
            (
                &v.map,
                Box::new(move |birth| if shared.is_some_and(|e| birth <= e) { Holder::Shared } else { Holder::Head }),
            )
        }
        MapOf::Dead(epoch) => match v.snapshots.iter().find(|s| s.epoch == epoch) {
            Some(s) => (&s.dead, Box::new(|_| Holder::Snapshots)),
            None => return Ok((Vec::new(), None)),
        },
    };
    let (mut out, mut seen, mut next) = (Vec::new(), 0, None);
    // Counted by entries seen, not kept: a clone's origin markers cost lock time too.
    entries.for_each_from(lba, &mut |k, e| {
        if !e.pba.is_origin() {
            out.push(HeldRun { device: e.pba.device(), block: e.pba.block(), len: e.len, holder: holder_of(e.birth) });
        }
        seen += 1;
        next = Some(k + e.len);
        seen < CHUNK
    })?;
    Ok((out, if seen == CHUNK { next } else { None }))
}
