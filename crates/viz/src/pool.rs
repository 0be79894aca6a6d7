//! The pool map: per device a grid of cells in block order (left to
//! right, top to bottom), each cell a fixed number of blocks; a cell
//! holding several kinds of space is split into horizontal bands in
//! proportion, so a volume's colour shows wherever it has a block.

use crate::palette::{self, volume_colour};
use crate::scene::{fits, wrap, Group, Rgb, Scene, Shape, GLYPH};
use crate::{check_width, VizError, MAX_WIDTH};

/// Which views of its volume hold a block (as the engine tells it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Holder {
    Head,
    Shared,
    Snapshots,
}

/// What a part of a cell holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fill {
    Labels,
    Journal,
    /// The `n`th volume of [`PoolMap::volumes`].
    Volume(usize, Holder),
    Metadata,
    Free,
    Outside,
}

impl Fill {
    /// Its colour, and the hatch over it.
    pub fn colour(self) -> (Rgb, Option<Rgb>) {
        match self {
            Fill::Volume(i, Holder::Head) => (volume_colour(i), None),
            Fill::Volume(i, Holder::Shared) => (volume_colour(i), Some(volume_colour(i).lighten(palette::HATCH_SHADE))),
            Fill::Volume(i, Holder::Snapshots) => (volume_colour(i).lighten(palette::SNAPSHOT_SHADE), None),
            Fill::Labels => (palette::LABELS, None),
            Fill::Journal => (palette::JOURNAL, None),
            Fill::Metadata => (palette::METADATA, None),
            Fill::Free => (palette::FREE, None),
            Fill::Outside => (palette::OUTSIDE, None),
        }
    }
}

/// Blocks per kind of space in one cell.
pub type Cell = Vec<(Fill, u64)>;

#[derive(Debug, Clone, Default)]
pub struct DeviceMap {
    /// First header line (device index, path, size).
    pub label: String,
    /// Second header line (use, fragmentation).
    pub stats: String,
    pub cells: Vec<Cell>,
    /// Where placement regions start, when a region spans several cells:
    /// (cells per region, the cell of the first region, the cell past the
    /// last). A darker grid line marks each start.
    pub regions: Option<(usize, usize, usize)>,
}

#[derive(Debug, Clone, Default)]
pub struct PoolMap {
    pub title: String,
    /// Legend text per volume, in palette order.
    pub volumes: Vec<String>,
    pub devices: Vec<DeviceMap>,
    /// Lines under the legend (cell size, the reserve).
    pub notes: Vec<String>,
}

/// Where things landed, for `--json` and the tests.
#[derive(Debug, Clone, Default)]
pub struct Placed {
    /// Each device's grid: x, y, width, height.
    pub areas: Vec<[u32; 4]>,
    /// Grid columns (cells per row).
    pub columns: u32,
}

/// Pixels per cell, the last one a grid line.
pub const CELL: u32 = 8;
const MARGIN: u32 = 16;
const LINE: u32 = 12;
const SWATCH: u32 = 12;

/// Cells per device row at this width: what the caller sizes cells by.
pub fn columns(width: u32) -> u32 {
    (width.saturating_sub(2 * MARGIN) / CELL).max(1)
}

/// Draw the map `width` pixels wide (the height follows from the cells).
pub fn draw(map: &PoolMap, width: u32) -> Result<(Scene, Placed), VizError> {
    check_width(width)?;
    if map.devices.is_empty() {
        return Err(VizError::Empty("the pool has no devices"));
    }
    let cols = columns(width);
    let chars = fits(width - 2 * MARGIN, 1);
    let title = wrap(&map.title, fits(width - 2 * MARGIN, 2));
    let title_lines = (0..).zip(title).map(|(i, t)| (MARGIN, MARGIN + i * (2 * GLYPH + 4), 2, t)).collect::<Vec<_>>();
    let mut y = MARGIN + title_lines.len() as u32 * (2 * GLYPH + 4) + LINE;
    let mut groups = vec![text_group("title", title_lines)];
    let mut placed = Placed { areas: Vec::new(), columns: cols };
    let mut fills: Vec<Vec<Shape>> = vec![Vec::new(); map.volumes.len()];
    let mut other = Vec::new();
    for (i, d) in map.devices.iter().enumerate() {
        let lines = wrap(&d.label, chars).into_iter().chain(wrap(&d.stats, chars));
        let header: Vec<_> = (y..).step_by(LINE as usize).zip(lines).map(|(ly, t)| (MARGIN, ly, 1, t)).collect();
        y += header.len() as u32 * LINE + 4;
        groups.push(Group { name: format!("device {i}"), ..text_group("device-label", header) });
        let rows = (d.cells.len() as u32).div_ceil(cols);
        let area = [MARGIN, y, cols * CELL, rows * CELL];
        // Grid lines under the cells only: the last row may be short.
        let (full, rest) = (d.cells.len() as u32 / cols, d.cells.len() as u32 % cols);
        other.push(Shape::Rect {
            x: area[0],
            y: area[1],
            w: area[2],
            h: full * CELL,
            fill: palette::GRID,
            hatch: None,
        });
        if rest > 0 {
            let g = Shape::Rect {
                x: area[0],
                y: area[1] + full * CELL,
                w: rest * CELL,
                h: CELL,
                fill: palette::GRID,
                hatch: None,
            };
            other.push(g);
        }
        for (n, cell) in d.cells.iter().enumerate() {
            let (cx, cy) = (MARGIN + (n as u32 % cols) * CELL, y + (n as u32 / cols) * CELL);
            cell_bands(cell, cx, cy, &mut fills, &mut other);
        }
        if let Some((per, first, end)) = d.regions.filter(|r| r.0 > 1) {
            for n in (first..end.min(d.cells.len())).step_by(per).filter(|n| !(*n as u32).is_multiple_of(cols)) {
                let (cx, cy) = (MARGIN + (n as u32 % cols) * CELL, y + (n as u32 / cols) * CELL);
                other.push(Shape::Rect {
                    x: cx - 1,
                    y: cy,
                    w: 1,
                    h: CELL - 1,
                    fill: palette::REGION_EDGE,
                    hatch: None,
                });
            }
        }
        placed.areas.push(area);
        y += rows * CELL + LINE;
    }
    groups.push(Group { class: "space", name: "free, metadata, reserved".into(), shapes: other });
    for (i, shapes) in fills.into_iter().enumerate() {
        groups.push(Group { class: "volume", name: map.volumes[i].clone(), shapes });
    }
    let (legend, height) = legend(map, width, y);
    groups.extend(legend);
    if height > u64::from(MAX_WIDTH) {
        return Err(VizError::Height(height));
    }
    Ok((Scene { width, height: height as u32, background: palette::BACKGROUND, groups }, placed))
}

/// Split a cell into bands, heights in proportion to blocks (cumulative
/// rounding; a kind with any block gets at least one pixel row while
/// rows are left). Volumes' bands go to their own group.
fn cell_bands(cell: &Cell, x: u32, y: u32, fills: &mut [Vec<Shape>], other: &mut Vec<Shape>) {
    let total: u64 = cell.iter().map(|c| c.1).sum();
    let inner = CELL - 1;
    let mut parts: Vec<(Fill, u64)> = cell.iter().filter(|c| c.1 > 0).copied().collect();
    parts.sort_by_key(|p| p.0);
    let (mut top, mut cum) = (0u32, 0u64);
    for (fill, blocks) in parts {
        cum += blocks;
        let bottom = ((cum * u64::from(inner)).div_ceil(total.max(1)) as u32).max(top + 1).min(inner);
        if bottom <= top {
            continue;
        }
        let (colour, hatch) = fill.colour();
        let rect = Shape::Rect { x, y: y + top, w: inner, h: bottom - top, fill: colour, hatch };
        match fill {
            Fill::Volume(v, _) => fills[v].push(rect),
            _ => other.push(rect),
        }
        top = bottom;
    }
}

fn text_group(class: &'static str, lines: Vec<(u32, u32, u32, String)>) -> Group {
    let shapes =
        lines.into_iter().map(|(x, y, scale, text)| Shape::Text { x, y, scale, text, color: palette::TEXT }).collect();
    Group { class, name: class.into(), shapes }
}

/// The legend under the grids: a swatch and text per entry, flowed into
/// rows; then the notes. Returns its groups and the picture's height.
fn legend(map: &PoolMap, width: u32, top: u32) -> (Vec<Group>, u64) {
    let mut entries: Vec<((Rgb, Option<Rgb>), String)> = map
        .volumes
        .iter()
        .enumerate()
        .map(|(i, name)| (Fill::Volume(i, Holder::Head).colour(), name.clone()))
        .collect();
    let sample = Rgb(0x60, 0x60, 0x60);
    entries.push(((sample, Some(sample.lighten(palette::HATCH_SHADE))), "hatched: head + snapshots".into()));
    entries.push(((sample.lighten(palette::SNAPSHOT_SHADE), None), "light: snapshots only".into()));
    if map.devices.iter().any(|d| d.regions.is_some_and(|r| r.0 > 1)) {
        entries.push(((palette::REGION_EDGE, None), "256 KiB region edge".into()));
    }
    for (fill, what) in [
        (Fill::Free, "free"),
        (Fill::Metadata, "metadata (nodes, in flight)"),
        (Fill::Journal, "journal"),
        (Fill::Labels, "labels"),
        (Fill::Outside, "outside the pool"),
    ] {
        entries.push((fill.colour(), what.into()));
    }
    let mut shapes = Vec::new();
    let (mut x, mut y) = (MARGIN, top);
    for ((fill, hatch), text) in entries {
        let w = SWATCH + 6 + text.chars().count() as u32 * GLYPH + 18;
        if x > MARGIN && x + w > width - MARGIN {
            (x, y) = (MARGIN, y + LINE + 6);
        }
        shapes.push(Shape::Rect { x, y, w: SWATCH, h: SWATCH, fill, hatch });
        shapes.push(Shape::Text { x: x + SWATCH + 6, y: y + 2, scale: 1, text, color: palette::TEXT });
        x += w;
    }
    y += LINE + 10;
    for note in map.notes.iter().flat_map(|n| wrap(n, fits(width - 2 * MARGIN, 1))) {
        shapes.push(Shape::Text { x: MARGIN, y, scale: 1, text: note, color: palette::TEXT });
        y += LINE;
    }
    (vec![Group { class: "legend", name: "legend".into(), shapes }], u64::from(y + MARGIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(cells: Vec<Cell>) -> PoolMap {
        PoolMap {
            title: "t".into(),
            volumes: vec!["a".into(), "b".into()],
            devices: vec![DeviceMap { label: "d0".into(), stats: "s".into(), cells, regions: Some((4, 1, 100)) }],
            notes: vec!["n".into()],
        }
    }

    fn has(px: &[u8], c: Rgb, area: [u32; 4], width: u32) -> bool {
        (area[1]..area[1] + area[3]).any(|y| {
            (area[0]..area[0] + area[2]).any(|x| {
                let i = ((y * width + x) * 3) as usize;
                px[i..i + 3] == [c.0, c.1, c.2]
            })
        })
    }

    #[test]
    fn a_small_share_of_a_cell_still_shows() {
        let cells = vec![vec![(Fill::Free, 1000), (Fill::Volume(1, Holder::Head), 1)]];
        let (scene, placed) = draw(&map(cells), 400).unwrap();
        let px = scene.raster();
        assert!(has(&px, volume_colour(1), placed.areas[0], 400));
        assert!(!has(&px, volume_colour(0), placed.areas[0], 400));
        assert_eq!(scene.width, 400);
    }

    #[test]
    fn bad_widths_are_refused() {
        assert!(matches!(draw(&map(vec![]), 0), Err(VizError::Width(0))));
        assert!(matches!(draw(&map(vec![]), 100_000), Err(VizError::Width(_))));
    }

    #[test]
    fn too_many_cells_for_the_height_is_an_error() {
        let cells = vec![vec![(Fill::Free, 1)]; 40 * 2000];
        assert!(matches!(draw(&map(cells), 400), Err(VizError::Height(_))));
    }
}
