//! Flattening a clone: copy what it still reads from its origin into its own
//! space, then cut the link, so the origin snapshot can go and reads stop
//! walking up the chain. Runs online, a chunk at a time; client writes may
//! race with it (a chunk the client overwrote meanwhile is simply redone or
//! skipped).

use crate::error::{EngineError, Result};
use crate::map::extent_map::{ExtentMap, Segment};
use crate::map::state::Volume;
use crate::map::view::View;
use crate::pool::Pool;
use tarn_format::ops::Op;
use tarn_format::BLOCK_SIZE;

/// Blocks copied per step (1 MiB): one read, one write, one small op batch.
const CHUNK_BLOCKS: u64 = 256;
/// Full passes over the clone's lists before giving up (a pass only misses
/// markers that a concurrent snapshot deletion moved behind the cursor).
const MAX_PASSES: usize = 64;

/// An origin marker to copy: in the head (`snap` 0) or a snapshot's dead list.
#[derive(Debug, Clone, Copy)]
struct Marker {
    snap: u64,
    lba: u64,
    len: u64,
}

impl Pool {
    /// Make clone `vol` independent of its origin. `progress(done, total)`
    /// is called after every chunk, in blocks. Durable when it returns.
    pub fn flatten(&self, vol: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<()> {
        self.check_writable()?;
        let id = crate::pool::volume_named(&self.read_inner().state, vol)?.id;
        self.flatten_member(id, vol, progress)
    }

    /// `flatten` of volume `id` of any role (a file volume's table or
    /// object: `flatten_file_volume`), named `vol` in errors.
    pub(crate) fn flatten_member(&self, id: u32, vol: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<()> {
        let total = {
            let inner = self.read_inner();
            let v = inner.state.volume(id).ok_or(EngineError::VolumeGone(id))?;
            if v.origin.is_none() {
                return Err(EngineError::InvalidArgument(format!("volume {vol} is not a clone")));
            }
            v.origin_blocks()
        };
        for _ in 0..MAX_PASSES {
            if self.flatten_pass(id, total, progress)? == 0 {
                break;
            }
        }
        {
            let mut inner = self.write_inner();
            let left = inner.state.volume(id).ok_or(EngineError::VolumeGone(id))?.origin_blocks();
            if left != 0 {
                return Err(EngineError::Inconsistent(format!("{left} blocks of {vol} still read from the origin")));
            }
            self.apply_ops(&mut inner, vec![Op::CloneDetach { vol: id }])?;
        }
        progress(total, total);
        self.flush()
    }

    /// One pass over the head and every dead list; returns the blocks copied.
    fn flatten_pass(&self, id: u32, total: u64, progress: &mut dyn FnMut(u64, u64)) -> Result<u64> {
        let mut copied = 0;
        let mut cursor = (0u64, 0u64);
        while let Some(m) = self.next_marker(id, cursor)? {
            cursor = (m.snap, m.lba);
            self.make_room()?;
            if let Some(done) = self.materialize(id, m)? {
                copied += done;
                cursor.1 = m.lba + done;
            }
            let left = self.read_inner().state.volume(id).map_or(0, Volume::origin_blocks);
            progress(total.saturating_sub(left), total);
        }
        Ok(copied)
    }

    /// The first marker at or after `cursor` (list, lba), lists in the order
    /// head, then snapshots oldest first; at most one chunk long.
    fn next_marker(&self, id: u32, cursor: (u64, u64)) -> Result<Option<Marker>> {
        let inner = self.read_inner();
        let v = inner.state.volume(id).ok_or(EngineError::VolumeGone(id))?;
        let lists = std::iter::once((0, &v.map)).chain(v.snapshots.iter().map(|s| (s.epoch, &s.dead)));
        let start = if cursor.0 == 0 { 0 } else { v.snapshot_index(cursor.0).map_or(0, |i| i + 1) };
        for (n, (snap, map)) in lists.enumerate().skip(start) {
            let from = if n == start { cursor.1 } else { 0 };
            if let Some((lba, len)) = first_marker(map, from)? {
                return Ok(Some(Marker { snap, lba, len }));
            }
        }
        Ok(None)
    }

    /// Copy the start of a marker's data from the origin (one chunk, or
    /// the hole the origin has there, however long: a file volume's table
    /// spans terabytes, nearly all holes) and swap it in; the blocks done,
    /// None if the marker changed meanwhile (nothing is kept then).
    fn materialize(&self, id: u32, m: Marker) -> Result<Option<u64>> {
        let origin = {
            let inner = self.read_inner();
            inner.state.volume(id).and_then(|v| v.origin).ok_or(EngineError::VolumeGone(id))?
        };
        let up = View::Snapshot(origin.epoch);
        let chunk = m.len.min(CHUNK_BLOCKS);
        let mut segs = self.resolve(origin.vol, up, m.lba, chunk)?;
        // A chunk all hole: look further, doubling, for where the hole
        // ends (what is looked at stays within twice the hole's length).
        let mut probe = chunk;
        while probe < m.len && matches!(segs.as_slice(), [Segment::Hole { .. }]) {
            probe = probe.saturating_mul(2).min(m.len);
            segs = self.resolve(origin.vol, up, m.lba, probe)?;
        }
        let m = match segs.first() {
            Some(&Segment::Hole { lba, len }) if probe > chunk => {
                segs = vec![Segment::Hole { lba, len }];
                Marker { len, ..m }
            }
            _ => {
                if probe > chunk {
                    // Not reached (a longer look starts with the hole the
                    // shorter one found); the chunk's own segments if so.
                    segs = self.resolve(origin.vol, up, m.lba, chunk)?;
                }
                Marker { len: chunk, ..m }
            }
        };
        let mapped = segs.iter().any(|s| matches!(s, Segment::Mapped { .. }));
        debug_assert!(!mapped || m.len <= CHUNK_BLOCKS, "a hole's marker is dropped without reading");
        let mut data = vec![0u8; if mapped { (m.len * BLOCK_SIZE) as usize } else { 0 }];
        // Unchecked: a parity volume's markers cover its parity area too.
        if mapped {
            self.read_view_mapped(origin.vol, up, m.lba * BLOCK_SIZE, &mut data)?;
        }
        // Only the origin's data needs space; its holes stay holes.
        let wanted: Vec<Segment> = segs
            .iter()
            .filter(|s| matches!(s, Segment::Mapped { .. }))
            .map(|s| Segment::Hole { lba: s.lba(), len: s.len() })
            .collect();
        let fresh = self.allocate_holes(id, &wanted, &Vec::new())?;
        let bs = BLOCK_SIZE as usize;
        for p in &fresh {
            let at = ((p.lba - m.lba) as usize) * bs;
            if let Err(e) = self.write_device(p.pba, &data[at..at + p.len as usize * bs]) {
                self.give_back_unmapped(&fresh);
                return Err(e);
            }
        }
        let mut inner = self.write_inner();
        let still = match inner.state.volume(id) {
            Some(v) => is_marker(v, m)?,
            None => false,
        };
        if !still {
            drop(inner);
            self.give_back_unmapped(&fresh);
            return Ok(None);
        }
        let mut ops = Vec::new();
        for p in &fresh {
            inner.space.settle(p.pba);
            ops.push(Op::Materialize { vol: id, snap: m.snap, lba: p.lba, len: p.len, pba: p.pba.0 });
            let at = ((p.lba - m.lba) as usize) * bs;
            ops.extend(self.sums_op(p.pba, &data[at..at + p.len as usize * bs]));
        }
        for s in &segs {
            if let Segment::Hole { lba, len } = *s {
                ops.push(Op::Materialize { vol: id, snap: m.snap, lba, len, pba: 0 });
            }
        }
        self.apply_ops(&mut inner, ops)?;
        Ok(Some(m.len))
    }
}

/// First origin marker in `map` ending after `from`: (lba, len), clipped to start at `from`.
fn first_marker(map: &ExtentMap, from: u64) -> Result<Option<(u64, u64)>> {
    let mut found = None;
    map.for_each_from(from, &mut |lba, e| {
        if e.pba.is_origin() {
            let start = lba.max(from);
            found = Some((start, e.len - (start - lba)));
        }
        found.is_none()
    })?;
    Ok(found)
}

/// Whether [m.lba, +m.len) in the marker's list is still one origin marker.
fn is_marker(v: &Volume, m: Marker) -> Result<bool> {
    let map = if m.snap == 0 { Some(&v.map) } else { v.snapshot_index(m.snap).map(|i| &v.snapshots[i].dead) };
    let Some(map) = map else {
        return Ok(false);
    };
    Ok(matches!(map.lookup(m.lba, m.len, 2)?.as_slice(),
        [Segment::Mapped { len, pba, .. }] if *len == m.len && pba.is_origin() && pba.block() == m.lba))
}
