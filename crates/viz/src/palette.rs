//! Colours: one per volume, distinct from each other and from the colours
//! of free, metadata and reserved space (greys and slate), and from the
//! lighter shades snapshots' space is drawn in.

use crate::Rgb;

/// Well-separated hues first (Tableau 10 without its grey); more volumes
/// get hues stepped by the golden angle.
const FIRST: [Rgb; 9] = [
    Rgb(0x1f, 0x77, 0xb4),
    Rgb(0xff, 0x7f, 0x0e),
    Rgb(0x2c, 0xa0, 0x2c),
    Rgb(0xd6, 0x27, 0x28),
    Rgb(0x94, 0x67, 0xbd),
    Rgb(0x8c, 0x56, 0x4b),
    Rgb(0xe3, 0x77, 0xc2),
    Rgb(0xbc, 0xbd, 0x22),
    Rgb(0x17, 0xbe, 0xcf),
];

/// The colour of the `i`th volume (in the order the legend lists them).
pub fn volume_colour(i: usize) -> Rgb {
    if let Some(c) = FIRST.get(i) {
        return *c;
    }
    let hue = ((i - FIRST.len()) as f64 * 137.507_764 + 15.0) % 360.0;
    // Alternate the lightness so neighbours in hue still differ.
    let l = if i.is_multiple_of(2) { 0.42 } else { 0.55 };
    hsl(hue, 0.65, l)
}

fn hsl(h: f64, s: f64, l: f64) -> Rgb {
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let x = c * (1.0 - ((h / 60.0) % 2.0 - 1.0).abs());
    let (r, g, b) = match (h / 60.0) as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let to = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    Rgb(to(r), to(g), to(b))
}

pub const BACKGROUND: Rgb = Rgb(0xff, 0xff, 0xff);
pub const TEXT: Rgb = Rgb(0x20, 0x20, 0x20);
/// The lines between cells of a device's grid.
pub const GRID: Rgb = Rgb(0xd8, 0xd8, 0xd8);
/// The grid line where a 256 KiB placement region starts.
pub const REGION_EDGE: Rgb = Rgb(0x90, 0x90, 0x90);
pub const FREE: Rgb = Rgb(0xf4, 0xf4, 0xf4);
/// Used blocks no volume holds: checkpoint nodes, the catalog, space
/// being freed or in flight.
pub const METADATA: Rgb = Rgb(0x70, 0x70, 0x70);
pub const LABELS: Rgb = Rgb(0x10, 0x10, 0x10);
pub const JOURNAL: Rgb = Rgb(0x3b, 0x4a, 0x5e);
/// Blocks past the pool's data area (a device larger than its member).
pub const OUTSIDE: Rgb = Rgb(0xc8, 0xc8, 0xc8);
/// How far toward white a snapshot-only block's colour is, and the hatch
/// of a block the head shares with a snapshot.
pub const SNAPSHOT_SHADE: f64 = 0.55;
pub const HATCH_SHADE: f64 = 0.7;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_hundred_volumes_have_distinct_colours_and_shades() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..100 {
            let c = volume_colour(i);
            for shade in [c, c.lighten(SNAPSHOT_SHADE), c.lighten(HATCH_SHADE)] {
                assert!(seen.insert(shade), "volume {i}: {shade} twice");
            }
        }
        for fixed in [BACKGROUND, TEXT, GRID, REGION_EDGE, FREE, METADATA, LABELS, JOURNAL, OUTSIDE] {
            assert!(!seen.contains(&fixed), "{fixed} is a volume's");
        }
    }
}
