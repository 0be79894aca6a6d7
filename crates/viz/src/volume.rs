//! One volume's logical-to-physical map: x is the offset in the volume,
//! y the place on the pool's devices (stacked, device 0 at the bottom).
//! Every run is a segment of slope one, so data laid out in order is one
//! straight diagonal, and scattering shows as short dashes all over.

use crate::palette::{self, volume_colour};
use crate::scene::{fits, Group, Scene, Shape, GLYPH};
use crate::{check_width, VizError};

/// A mapped run, in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeRun {
    pub lba: u64,
    pub len: u64,
    pub device: usize,
    pub block: u64,
}

pub struct VolumeMap<'a> {
    pub title: String,
    /// The volume's size in blocks.
    pub blocks: u64,
    /// Per device: its legend text and its size in blocks.
    pub devices: Vec<(String, u64)>,
    pub runs: Vec<VolumeRun>,
    /// Axis labels from a number of blocks.
    pub size_label: &'a dyn Fn(u64) -> String,
}

const LEFT: u32 = 96;
const RIGHT: u32 = 16;
const TOP: u32 = 44;
const BOTTOM: u32 = 40;
const TICKS: u64 = 4;

/// Draw the map `width` pixels wide; the plot is about 3:5.
pub fn draw(map: &VolumeMap, width: u32) -> Result<Scene, VizError> {
    check_width(width)?;
    let physical: u64 = map.devices.iter().map(|d| d.1).sum();
    if map.blocks == 0 || physical == 0 {
        return Err(VizError::Empty("the volume or the pool has no blocks"));
    }
    let (pw, ph) = (width - LEFT - RIGHT, (width * 3 / 5).max(120));
    let legend_rows = map.devices.len() as u32;
    let height = TOP + ph + BOTTOM + legend_rows * 14 + 16;
    let sx = f64::from(pw) / map.blocks as f64;
    let sy = f64::from(ph) / physical as f64;
    let x_of = |lba: u64| f64::from(LEFT) + lba as f64 * sx;
    let y_of = |p: u64| f64::from(TOP + ph) - p as f64 * sy;
    let bases: Vec<u64> = map.devices.iter().scan(0, |acc, d| Some(std::mem::replace(acc, *acc + d.1))).collect();
    // The title large when it fits, else small.
    let scale = if map.title.chars().count() <= fits(width - 2 * RIGHT, 2) { 2 } else { 1 };
    let mut frame = vec![Shape::Text { x: RIGHT, y: 10, scale, text: map.title.clone(), color: palette::TEXT }];
    axes(&mut frame, map, (pw, ph), physical);
    for (i, &base) in bases.iter().enumerate() {
        let y = y_of(base);
        if i > 0 {
            frame.push(line((f64::from(LEFT), y), (f64::from(LEFT + pw), y), palette::GRID));
        }
        // Inside the band, just above its bottom line.
        frame.push(text(LEFT + pw - 9 * GLYPH, (y as u32).saturating_sub(GLYPH + 3), format!("device {i}")));
    }
    let mut runs = Vec::new();
    // Runs that land on the same pixels are drawn once: a map of millions
    // of runs makes a picture (and an SVG) of at most a few per pixel.
    let mut drawn = std::collections::HashSet::new();
    for r in &map.runs {
        let Some(&base) = bases.get(r.device) else { continue };
        let p = base + r.block;
        let from = (x_of(r.lba), y_of(p));
        let to = (x_of(r.lba + r.len).max(from.0 + 1.0), y_of(p + r.len).min(from.1 - 1.0));
        if drawn.insert([from.0 as i64, from.1 as i64, to.0 as i64, to.1 as i64, r.device as i64]) {
            runs.push(Shape::Line { from, to, color: volume_colour(r.device), width: 2 });
        }
    }
    let mut legend = Vec::new();
    for (i, (label, _)) in map.devices.iter().enumerate() {
        let y = TOP + ph + BOTTOM + i as u32 * 14;
        legend.push(Shape::Rect { x: LEFT, y, w: 12, h: 12, fill: volume_colour(i), hatch: None });
        legend.push(text(LEFT + 18, y + 2, label.clone()));
    }
    let groups = vec![
        Group { class: "frame", name: "axes".into(), shapes: frame },
        Group { class: "runs", name: "runs".into(), shapes: runs },
        Group { class: "legend", name: "devices".into(), shapes: legend },
    ];
    Ok(Scene { width, height, background: palette::BACKGROUND, groups })
}

/// The plot's box with ticks and labels on both axes.
fn axes(out: &mut Vec<Shape>, map: &VolumeMap, (pw, ph): (u32, u32), physical: u64) {
    let (l, t, r, b) = (f64::from(LEFT), f64::from(TOP), f64::from(LEFT + pw), f64::from(TOP + ph));
    for (from, to) in [((l, t), (r, t)), ((r, t), (r, b)), ((r, b), (l, b)), ((l, b), (l, t))] {
        out.push(line(from, to, palette::TEXT));
    }
    for i in 0..=TICKS {
        let x = LEFT + (u64::from(pw) * i / TICKS) as u32;
        let label = (map.size_label)(map.blocks * i / TICKS);
        let w = label.chars().count() as u32 * GLYPH;
        out.push(line((f64::from(x), b), (f64::from(x), b + 4.0), palette::TEXT));
        out.push(text(x.saturating_sub(w / 2).min(LEFT + pw - w.min(pw)), TOP + ph + 8, label));
        let y = TOP + ph - (u64::from(ph) * i / TICKS) as u32;
        let label = (map.size_label)(physical * i / TICKS);
        let w = label.chars().count() as u32 * GLYPH;
        out.push(line((l - 4.0, f64::from(y)), (l, f64::from(y)), palette::TEXT));
        out.push(text(LEFT.saturating_sub(w + 6), y.saturating_sub(4), label));
    }
    out.push(text(LEFT + pw / 2 - 60, TOP + ph + 22, "offset in the volume".into()));
    out.push(text(4, TOP - 14, "place on the devices".into()));
}

fn line(from: (f64, f64), to: (f64, f64), color: crate::Rgb) -> Shape {
    Shape::Line { from, to, color, width: 1 }
}

fn text(x: u32, y: u32, text: String) -> Shape {
    Shape::Text { x, y, scale: 1, text, color: palette::TEXT }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_land_in_the_plot_in_their_device_colour() {
        let label = |b: u64| format!("{b}");
        let map = VolumeMap {
            title: "v".into(),
            blocks: 1000,
            devices: vec![("d0".into(), 1000), ("d1".into(), 1000)],
            runs: vec![VolumeRun { lba: 0, len: 500, device: 1, block: 0 }],
            size_label: &label,
        };
        let scene = draw(&map, 400).unwrap();
        let px = scene.raster();
        let c = volume_colour(1);
        let found = px.chunks(3).enumerate().any(|(i, p)| p == [c.0, c.1, c.2] && (i as u32 / 400) < TOP + 240);
        assert!(found);
        assert!(draw(&VolumeMap { blocks: 0, ..map }, 400).is_err());
    }
}
