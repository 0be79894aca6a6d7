//! The figures of a pool map (`Request::PoolMap`), gathered where the pool
//! is open (inside `tarn serve`, or locally): per device, a grid of cells
//! of a fixed number of blocks, each with its blocks per kind of space.
//! The answer's size follows the picture, not the pool: a map of millions
//! of extents is read in chunks (`Pool::held_runs`) and summed into at
//! most `cells` cells per device.

use serde_json::{json, Value};
use tarn_engine::{DeviceLayout, EngineError, HeldRun, Holder, Pool};

/// Codes of the kinds of space in the answer; a volume's are
/// `VOLUME_BASE + 3 * index + holder` (holder: 0 head, 1 shared, 2 snapshots).
pub const LABELS: u32 = 0;
pub const JOURNAL: u32 = 1;
pub const METADATA: u32 = 2;
pub const FREE: u32 = 3;
pub const OUTSIDE: u32 = 4;
pub const VOLUME_BASE: u32 = 8;
/// Blocks per placement region (256 KiB): the unit fragmentation is counted in.
pub const REGION_BLOCKS: u64 = 64;
/// Most cells per device a request may ask for: bounds the server's memory
/// and the answer whatever a client sends (a picture 8192 pixels wide has
/// about 41,000 per device).
const MAX_CELLS: u64 = 1 << 18;

/// One device's cells: blocks per code.
struct Grid {
    cell_blocks: u64,
    cells: Vec<Vec<(u32, u64)>>,
}

impl Grid {
    /// Cells of a power-of-two number of blocks (so cells and 256 KiB
    /// regions line up), at most `max_cells` of them.
    fn new(blocks: u64, max_cells: u64) -> Grid {
        let cell_blocks = blocks.div_ceil(max_cells.max(1)).max(1).next_power_of_two();
        Grid { cell_blocks, cells: vec![Vec::new(); blocks.div_ceil(cell_blocks) as usize] }
    }

    /// Count `[start, start+len)` as `code`, taken from `from` if given.
    fn add(&mut self, code: u32, start: u64, len: u64, from: Option<u32>) {
        let end = start + len;
        let mut at = start;
        while at < end {
            let i = (at / self.cell_blocks) as usize;
            let Some(cell) = self.cells.get_mut(i) else { return };
            let n = end.min((i as u64 + 1) * self.cell_blocks) - at;
            bump(cell, code, n as i64);
            if let Some(f) = from {
                bump(cell, f, -(n as i64));
            }
            at += n;
        }
    }
}

fn bump(cell: &mut Vec<(u32, u64)>, code: u32, n: i64) {
    match cell.iter_mut().find(|c| c.0 == code) {
        Some(c) => c.1 = c.1.saturating_add_signed(n),
        None if n > 0 => cell.push((code, n as u64)),
        None => {}
    }
}

/// Fragmentation figures of one device.
#[derive(Default)]
struct Stats {
    held_runs: u64,
    held_blocks: u64,
    free_blocks: u64,
    free_regions: u64,
    partial_regions: u64,
}

pub fn pool_map(pool: &Pool, cells: u64) -> Result<Value, EngineError> {
    let layouts = pool.device_layouts();
    let names: Vec<(u32, String)> = pool.list_volumes().into_iter().map(|v| (v.id, v.name)).collect();
    let mut grids: Vec<Grid> = layouts.iter().map(|d| base_grid(d, cells.min(MAX_CELLS))).collect();
    let mut stats: Vec<Stats> = layouts.iter().map(|_| Stats::default()).collect();
    for (i, d) in layouts.iter().enumerate() {
        free_space(pool, i, d, &mut grids[i], &mut stats[i])?;
    }
    for (index, (id, _)) in names.iter().enumerate() {
        pool.held_runs(*id, &mut |runs| {
            for r in runs {
                held(r, index, &mut grids, &mut stats);
            }
        })?;
    }
    let paths: Vec<String> = pool.devices().iter().map(|d| d.name()).collect();
    let devices: Vec<Value> = layouts
        .iter()
        .zip(grids)
        .zip(stats)
        .enumerate()
        .map(|(i, ((d, g), s))| device_json(i, &paths[i], d, g, s))
        .collect();
    let volumes: Vec<Value> = names.iter().map(|(id, name)| json!({ "id": id, "name": name })).collect();
    Ok(json!({
        "block_size": tarn_format::BLOCK_SIZE, "reserve_blocks": pool.reserve_blocks(),
        "volumes": volumes, "devices": devices,
    }))
}

/// Labels, journal, the data area as metadata until free space and
/// volumes' runs are taken out of it, and what lies past it.
fn base_grid(d: &DeviceLayout, cells: u64) -> Grid {
    let mut g = Grid::new(d.blocks, cells);
    g.add(LABELS, 0, d.labels.min(d.blocks), None);
    g.add(JOURNAL, d.labels, d.data_start.saturating_sub(d.labels), None);
    g.add(METADATA, d.data_start, d.data_end.saturating_sub(d.data_start), None);
    g.add(OUTSIDE, d.data_end, d.blocks.saturating_sub(d.data_end), None);
    g
}

fn free_space(pool: &Pool, i: usize, d: &DeviceLayout, g: &mut Grid, s: &mut Stats) -> Result<(), EngineError> {
    // The last region partly free, so one region split by two free runs counts once.
    let mut last_partial = None;
    pool.free_runs(i, &mut |runs| {
        for &(start, len) in runs {
            g.add(FREE, start, len, Some(METADATA));
            s.free_blocks += len;
            let first = start.saturating_sub(d.data_start);
            let end = first + len;
            let whole = (end / REGION_BLOCKS).saturating_sub(first.div_ceil(REGION_BLOCKS));
            s.free_regions += whole;
            for edge in [
                (first % REGION_BLOCKS != 0).then_some(first / REGION_BLOCKS),
                (end % REGION_BLOCKS != 0).then_some(end / REGION_BLOCKS),
            ] {
                if edge.is_some() && edge != last_partial {
                    s.partial_regions += 1;
                    last_partial = edge;
                }
            }
        }
    })
}

fn held(r: &HeldRun, index: usize, grids: &mut [Grid], stats: &mut [Stats]) {
    let d = usize::from(r.device);
    let Some(g) = grids.get_mut(d) else { return };
    let holder = match r.holder {
        Holder::Head => 0,
        Holder::Shared => 1,
        Holder::Snapshots => 2,
    };
    g.add(VOLUME_BASE + 3 * index as u32 + holder, r.block, r.len, Some(METADATA));
    stats[d].held_runs += 1;
    stats[d].held_blocks += r.len;
}

fn device_json(i: usize, path: &str, d: &DeviceLayout, g: Grid, s: Stats) -> Value {
    let regions = (d.data_end - d.data_start) / REGION_BLOCKS;
    json!({
        "index": i, "path": path, "blocks": d.blocks, "labels": d.labels, "data_start": d.data_start,
        "data_end": d.data_end, "metadata_start": d.metadata_start, "cell_blocks": g.cell_blocks,
        "cells": g.cells, "held_runs": s.held_runs, "held_blocks": s.held_blocks, "free_blocks": s.free_blocks,
        "regions": { "total": regions, "free": s.free_regions, "partial": s.partial_regions,
                     "full": regions.saturating_sub(s.free_regions + s.partial_regions) },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_across_cells_and_take_from_metadata() {
        let mut g = Grid::new(1000, 100);
        assert_eq!(g.cell_blocks, 16);
        g.add(METADATA, 0, 1000, None);
        g.add(FREE, 10, 20, Some(METADATA));
        assert_eq!(g.cells[0], vec![(METADATA, 10), (FREE, 6)]);
        assert_eq!(g.cells[1], vec![(METADATA, 2), (FREE, 14)]);
        g.add(FREE, 990, 100, None);
        assert_eq!(g.cells.len(), 63);
    }
}
