//! A display list (rectangles, hatching, lines, text) and its two
//! renderings: a PNG raster and an SVG document. Pictures are built once
//! as a [`Scene`], so the PNG and the SVG of one map always agree.

use crate::VizError;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

/// A colour; `Display` gives `#rrggbb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    /// This colour moved `t` (0..1) of the way to white: lighter shades of
    /// a volume's colour for space that snapshots hold.
    pub fn lighten(self, t: f64) -> Rgb {
        let f = |c: u8| (f64::from(c) + (255.0 - f64::from(c)) * t).round() as u8;
        Rgb(f(self.0), f(self.1), f(self.2))
    }
}

impl std::fmt::Display for Rgb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{:02x}{:02x}{:02x}", self.0, self.1, self.2)
    }
}

/// Pixel size of one glyph of the built-in 8x8 font at scale 1.
pub const GLYPH: u32 = 8;

#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// A filled rectangle; with `hatch`, diagonal stripes of that colour
    /// over the fill (space shared between a head and its snapshots).
    Rect { x: u32, y: u32, w: u32, h: u32, fill: Rgb, hatch: Option<Rgb> },
    /// A line `width` pixels thick.
    Line { from: (f64, f64), to: (f64, f64), color: Rgb, width: u32 },
    /// Text from its top-left corner, glyphs `GLYPH * scale` pixels square.
    Text { x: u32, y: u32, scale: u32, text: String, color: Rgb },
}

/// Shapes drawn together: in SVG one `<g>` with the class and name, so a
/// reader (or a test) finds each volume's shapes in one place.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub class: &'static str,
    pub name: String,
    pub shapes: Vec<Shape>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Scene {
    pub width: u32,
    pub height: u32,
    pub background: Rgb,
    pub groups: Vec<Group>,
}

/// Stripe period of hatching, in pixels (stripes are a third of it).
const HATCH_PERIOD: u32 = 6;

impl Scene {
    /// Write the scene as an 8-bit RGB PNG.
    pub fn write_png(&self, path: &Path) -> Result<(), VizError> {
        let pixels = self.raster();
        let file = std::fs::File::create(path).map_err(|e| VizError::io(path, e))?;
        let mut enc = png::Encoder::new(std::io::BufWriter::new(file), self.width, self.height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(|e| VizError::png(path, e))?;
        w.write_image_data(&pixels).map_err(|e| VizError::png(path, e))?;
        w.finish().map_err(|e| VizError::png(path, e))
    }

    /// Write the scene as an SVG document.
    pub fn write_svg(&self, path: &Path) -> Result<(), VizError> {
        let mut f = std::fs::File::create(path).map_err(|e| VizError::io(path, e))?;
        f.write_all(self.svg().as_bytes()).map_err(|e| VizError::io(path, e))
    }

    /// Row-major RGB bytes.
    pub fn raster(&self) -> Vec<u8> {
        let mut r = Raster { w: self.width, h: self.height, px: Vec::new() };
        r.px = [self.background.0, self.background.1, self.background.2].repeat((self.width * self.height) as usize);
        for shape in self.groups.iter().flat_map(|g| &g.shapes) {
            match shape {
                Shape::Rect { x, y, w, h, fill, hatch } => r.rect(*x, *y, *w, *h, *fill, *hatch),
                Shape::Line { from, to, color, width } => r.line(*from, *to, *color, *width),
                Shape::Text { x, y, scale, text, color } => r.text(*x, *y, *scale, text, *color),
            }
        }
        r.px
    }

    pub fn svg(&self) -> String {
        let mut s = String::new();
        let (w, h) = (self.width, self.height);
        let _ =
            writeln!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}">"#);
        s.push_str(&self.hatch_patterns());
        let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="{}"/>"#, self.background);
        for g in &self.groups {
            let _ = writeln!(s, r#"<g class="{}" data-name="{}">"#, g.class, escape(&g.name));
            for shape in &g.shapes {
                svg_shape(&mut s, shape);
            }
            s.push_str("</g>\n");
        }
        s.push_str("</svg>\n");
        s
    }

    /// One `<pattern>` per hatch colour used.
    fn hatch_patterns(&self) -> String {
        let mut colours: Vec<Rgb> = Vec::new();
        for shape in self.groups.iter().flat_map(|g| &g.shapes) {
            if let Shape::Rect { hatch: Some(c), .. } = shape {
                if !colours.contains(c) {
                    colours.push(*c);
                }
            }
        }
        let mut s = String::from("<defs>\n");
        for c in colours {
            let _ = writeln!(
                s,
                r#"<pattern id="hatch-{}" width="{HATCH_PERIOD}" height="{HATCH_PERIOD}" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="2" height="{HATCH_PERIOD}" fill="{c}"/></pattern>"#,
                hex(c)
            );
        }
        s.push_str("</defs>\n");
        s
    }
}

/// `text` cut at spaces into lines of at most `max` characters (a word
/// longer than that stands alone on its line).
pub fn wrap(text: &str, max: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split(' ') {
        match lines.last_mut() {
            Some(l) if l.chars().count() + 1 + word.chars().count() <= max => {
                l.push(' ');
                l.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

/// How many glyphs at `scale` fit in `pixels`.
pub fn fits(pixels: u32, scale: u32) -> usize {
    (pixels / (GLYPH * scale)).max(1) as usize
}

fn hex(c: Rgb) -> String {
    c.to_string()[1..].to_string()
}

fn svg_shape(s: &mut String, shape: &Shape) {
    match shape {
        Shape::Rect { x, y, w, h, fill, hatch } => {
            let _ = writeln!(s, r#"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{fill}"/>"#);
            if let Some(c) = hatch {
                let _ =
                    writeln!(s, r#"<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="url(#hatch-{})"/>"#, hex(*c));
            }
        }
        Shape::Line { from, to, color, width } => {
            let _ = writeln!(
                s,
                r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="{width}" stroke-linecap="square"/>"#,
                from.0, from.1, to.0, to.1
            );
        }
        Shape::Text { x, y, scale, text, color } => {
            // The raster font is 8 px wide per glyph; a monospace face is
            // about 0.6 em wide, so the text is stretched (spacing only)
            // to the same width and the legend lines up as in the PNG.
            let (size, width) = (10 * scale, GLYPH * scale * text.chars().count() as u32);
            let _ = writeln!(
                s,
                r#"<text x="{x}" y="{}" font-family="monospace" font-size="{size}" textLength="{width}" lengthAdjust="spacing" fill="{color}">{}</text>"#,
                y + GLYPH * scale,
                escape(text)
            );
        }
    }
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

struct Raster {
    w: u32,
    h: u32,
    px: Vec<u8>,
}

impl Raster {
    fn set(&mut self, x: i64, y: i64, c: Rgb) {
        if x < 0 || y < 0 || x >= i64::from(self.w) || y >= i64::from(self.h) {
            return;
        }
        let i = ((y as usize) * self.w as usize + x as usize) * 3;
        self.px[i..i + 3].copy_from_slice(&[c.0, c.1, c.2]);
    }

    fn rect(&mut self, x: u32, y: u32, w: u32, h: u32, fill: Rgb, hatch: Option<Rgb>) {
        for yy in y..y.saturating_add(h).min(self.h) {
            for xx in x..x.saturating_add(w).min(self.w) {
                // Stripes by absolute position, so neighbouring cells line up.
                let stripe = hatch.filter(|_| (xx + yy) % HATCH_PERIOD < 2);
                self.set(i64::from(xx), i64::from(yy), stripe.unwrap_or(fill));
            }
        }
    }

    fn line(&mut self, from: (f64, f64), to: (f64, f64), c: Rgb, width: u32) {
        let steps = (to.0 - from.0).abs().max((to.1 - from.1).abs()).ceil().max(1.0) as u64;
        let half = i64::from(width / 2);
        for i in 0..=steps {
            let t = i as f64 / steps as f64;
            // Rounded, not truncated: 228.9999 must not skip pixel 229.
            let (x, y) = ((from.0 + (to.0 - from.0) * t).round() as i64, (from.1 + (to.1 - from.1) * t).round() as i64);
            for dy in -half..(i64::from(width) - half) {
                for dx in -half..(i64::from(width) - half) {
                    self.set(x + dx, y + dy, c);
                }
            }
        }
    }

    fn text(&mut self, x: u32, y: u32, scale: u32, text: &str, c: Rgb) {
        use font8x8::UnicodeFonts;
        for (i, ch) in text.chars().enumerate() {
            let glyph = font8x8::BASIC_FONTS.get(ch).or_else(|| font8x8::BASIC_FONTS.get('?')).unwrap_or([0; 8]);
            let gx = i64::from(x) + (i as i64) * i64::from(GLYPH * scale);
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) == 0 {
                        continue;
                    }
                    for s in 0..i64::from(scale * scale) {
                        let (sx, sy) = (s % i64::from(scale), s / i64::from(scale));
                        let px = gx + col * i64::from(scale) + sx;
                        self.set(px, i64::from(y) + row as i64 * i64::from(scale) + sy, c);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scene(shapes: Vec<Shape>) -> Scene {
        Scene {
            width: 20,
            height: 10,
            background: Rgb(255, 255, 255),
            groups: vec![Group { class: "t", name: "a<b".into(), shapes }],
        }
    }

    #[test]
    fn rect_fills_its_pixels_only() {
        let s = scene(vec![Shape::Rect { x: 2, y: 3, w: 4, h: 2, fill: Rgb(1, 2, 3), hatch: None }]);
        let px = s.raster();
        let at = |x: usize, y: usize| &px[(y * 20 + x) * 3..(y * 20 + x) * 3 + 3];
        assert_eq!(at(2, 3), [1, 2, 3]);
        assert_eq!(at(5, 4), [1, 2, 3]);
        assert_eq!(at(6, 4), [255, 255, 255]);
        assert_eq!(px.len(), 20 * 10 * 3);
    }

    #[test]
    fn svg_escapes_names_and_defines_hatches() {
        let s = scene(vec![Shape::Rect { x: 0, y: 0, w: 4, h: 4, fill: Rgb(0, 0, 0), hatch: Some(Rgb(9, 9, 9)) }]);
        let svg = s.svg();
        assert!(svg.contains(r#"data-name="a&lt;b""#));
        assert!(svg.contains(r#"id="hatch-090909""#) && svg.contains("url(#hatch-090909)"));
    }

    #[test]
    fn a_line_has_no_gaps() {
        let s = Scene {
            width: 3,
            height: 800,
            background: Rgb(255, 255, 255),
            groups: vec![Group {
                class: "t",
                name: "l".into(),
                shapes: vec![Shape::Line { from: (1.0, 44.0), to: (1.0, 764.0), color: Rgb(0, 0, 0), width: 1 }],
            }],
        };
        let px = s.raster();
        let gaps: Vec<usize> = (44..=764).filter(|y| px[(y * 3 + 1) * 3] != 0).collect();
        assert!(gaps.is_empty(), "unpainted rows {gaps:?}");
    }

    #[test]
    fn wrap_cuts_at_spaces() {
        assert_eq!(wrap("aa bb cc", 5), vec!["aa bb", "cc"]);
        assert_eq!(wrap("toolongword x", 4), vec!["toolongword", "x"]);
    }

    #[test]
    fn lighten_goes_to_white() {
        assert_eq!(Rgb(0, 100, 255).lighten(1.0), Rgb(255, 255, 255));
        assert_eq!(Rgb(0, 100, 255).lighten(0.0), Rgb(0, 100, 255));
    }
}
