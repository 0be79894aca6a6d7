//! Per-file placement and protection (Loris: a layout per file; issue 15
//! item 6, docs/ARCHITECTURE.md *File volumes*, per-file layout): what a
//! layout says, its text (`placement=append mirrored devices=0,2
//! stripe=2:64K`, as `user.tarn.layout` takes it and `tarn fs
//! layout-policy list` shows it), and the layout policy object: rules in
//! the close-version policy's syntax, each with a layout (docs/FORMAT.md
//! *File volumes*, layout policy).

use crate::error::{FsError, Result};
use crate::history::policy::{self, Rule, MAX_RULE, MAX_RULES, POLICY_HEADER};
use tarn_engine::PlacementKind;

const LAYOUT_MAGIC: &[u8; 4] = b"TFSL";
/// A layout's bytes after its rule's text.
const SPEC_BYTES: usize = 16;
/// The longest layout policy object: every rule at its longest.
pub const MAX_LAYOUT_BYTES: usize = POLICY_HEADER + MAX_RULES * (1 + MAX_RULE + SPEC_BYTES);
/// Placement codes kept in a layout (0: none): fixed here, not the
/// engine's numbering, so the bytes mean the same whatever it adds.
const PLACEMENTS: [&str; 4] = ["linear", "inplace", "append", "contiguous"];
/// Stripe units accepted: 4 KiB to 64 MiB (the engine checks the power of two).
const MAX_UNIT: u64 = 64 << 20;
const MIRRORED: u8 = 1;
const WHAT: &str = "layout policy";

/// Where a file's data goes: what a rule or `user.tarn.layout` sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayoutSpec {
    /// Its own placement (None: the member's or the pool's default).
    pub placement: Option<PlacementKind>,
    /// Only mirrored members (of `devices`, when that names any).
    pub mirrored: bool,
    /// Members its new data may go to, bit i for member i (0: any).
    pub devices: u16,
    /// Striped over this many members, in units of this many bytes.
    pub stripe: Option<(u32, u64)>,
}

impl LayoutSpec {
    /// Sets nothing: the default layout.
    pub fn is_default(&self) -> bool {
        *self == LayoutSpec::default()
    }

    /// Parse `placement=P`, `mirrored`, `devices=0,2`, `stripe=N[:UNIT]`
    /// separated by spaces; anything else is refused naming it.
    pub fn parse(text: &str) -> Result<LayoutSpec> {
        let mut spec = LayoutSpec::default();
        for token in text.split_ascii_whitespace() {
            match token.split_once('=') {
                None if token == "mirrored" => spec.mirrored = true,
                // What `user.tarn.layout` reads back for a file with none.
                None if token == "default" => {}
                Some(("placement", p)) => spec.placement = Some(parse_placement(p)?),
                Some(("devices", d)) => spec.devices = parse_devices(d)?,
                Some(("stripe", s)) => spec.stripe = Some(parse_stripe(s)?),
                _ => return Err(FsError::Invalid(
                    "layout: say placement=linear|inplace|append|contiguous, mirrored, devices=0,2, stripe=N[:UNIT]",
                )),
            }
        }
        Ok(spec)
    }

    /// The layout as `parse` takes it back ("" for the default).
    pub fn text(&self) -> String {
        let mut t = Vec::new();
        if let Some(p) = self.placement {
            t.push(format!("placement={}", p.name()));
        }
        if self.mirrored {
            t.push("mirrored".to_string());
        }
        if self.devices != 0 {
            t.push(format!("devices={}", devices_text(self.devices)));
        }
        if let Some((n, unit)) = self.stripe {
            t.push(format!("stripe={n}:{}K", unit >> 10));
        }
        t.join(" ")
    }

    /// 16 bytes: placement code u8, flags u8 (bit 0 mirrored), devices
    /// u16, stripe width u32 (0: none), stripe unit u64.
    fn put(&self, out: &mut Vec<u8>) {
        let code = self.placement.map_or(0, |p| PLACEMENTS.iter().position(|n| *n == p.name()).map_or(0, |i| i + 1));
        out.push(code as u8);
        out.push(if self.mirrored { MIRRORED } else { 0 });
        out.extend_from_slice(&self.devices.to_le_bytes());
        let (n, unit) = self.stripe.unwrap_or((0, 0));
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&unit.to_le_bytes());
    }

    fn take(b: &[u8]) -> Result<LayoutSpec> {
        let bad = |d: String| FsError::corrupt(WHAT, 0, d);
        let placement = match b[0] {
            0 => None,
            c => Some(PLACEMENTS.get(usize::from(c) - 1).and_then(|n| PlacementKind::parse(n)))
                .flatten()
                .map(Some)
                .ok_or_else(|| bad(format!("placement code {c}")))?,
        };
        if b[1] & !MIRRORED != 0 {
            return Err(bad(format!("flags {:#x}", b[1])));
        }
        let n = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let mut unit = [0u8; 8];
        unit.copy_from_slice(&b[8..16]);
        let unit = u64::from_le_bytes(unit);
        let stripe = match (n, unit) {
            (0, 0) => None,
            (n, u) if n >= 2 && (4096..=MAX_UNIT).contains(&u) => Some((n, u)),
            _ => return Err(bad(format!("stripe {n}:{unit}"))),
        };
        let devices = u16::from_le_bytes([b[2], b[3]]);
        Ok(LayoutSpec { placement, mirrored: b[1] & MIRRORED != 0, devices, stripe })
    }
}

/// `0,2` as the bit set of those members.
pub fn devices_text(devices: u16) -> String {
    let named: Vec<String> = (0..16).filter(|d| devices & (1 << d) != 0).map(|d| d.to_string()).collect();
    named.join(",")
}

fn parse_placement(p: &str) -> Result<PlacementKind> {
    PlacementKind::parse(p).ok_or(FsError::Invalid("layout: placement is linear, inplace, append or contiguous"))
}

fn parse_devices(d: &str) -> Result<u16> {
    d.split(',').try_fold(0u16, |set, i| match i.parse::<u32>() {
        Ok(i) if i < 16 => Ok(set | 1 << i),
        _ => Err(FsError::Invalid("layout: devices are member indexes 0 to 15, as 0,2")),
    })
}

/// `N` or `N:UNIT`, UNIT in bytes or with a K or M suffix (default 64K).
fn parse_stripe(s: &str) -> Result<(u32, u64)> {
    let bad = || FsError::Invalid("layout: stripe is N[:UNIT], N members from 2, UNIT 4K to 64M");
    let (n, unit) = s.split_once(':').unwrap_or((s, "64K"));
    let (digits, shift) = match unit.as_bytes().last() {
        Some(b'K' | b'k') => (&unit[..unit.len() - 1], 10),
        Some(b'M' | b'm') => (&unit[..unit.len() - 1], 20),
        _ => (unit, 0),
    };
    let unit = digits.parse::<u64>().ok().and_then(|u| u.checked_shl(shift)).filter(|u| u >> shift > 0);
    match (n.parse::<u32>(), unit) {
        (Ok(n), Some(u)) if n >= 2 && (4096..=MAX_UNIT).contains(&u) => Ok((n, u)),
        _ => Err(bad()),
    }
}

/// One rule of a layout policy: files it matches get `spec` (an
/// exclude rule `!x` sets nothing: its files keep the default layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutRule {
    pub rule: Rule,
    pub spec: LayoutSpec,
}

impl LayoutRule {
    /// A rule and what it sets; refused when a rule sets nothing, or an
    /// exclude rule sets something.
    pub fn new(text: &str, spec: LayoutSpec) -> Result<LayoutRule> {
        let rule = Rule::parse(text)?;
        match (rule.exclude, spec.is_default()) {
            (false, true) => {
                Err(FsError::Invalid("a layout rule sets nothing: give --placement, --mirrored, --devices or --stripe"))
            }
            (true, false) => Err(FsError::Invalid("an exclude rule (!) keeps the default layout: it sets nothing")),
            _ => Ok(LayoutRule { rule, spec }),
        }
    }
}

/// The first matching rule's layout (None: no rule, or an exclude rule).
pub fn layout_for<'a>(rules: &'a [LayoutRule], path: &str) -> Option<&'a LayoutSpec> {
    rules.iter().find(|r| r.rule.matches(path)).filter(|r| !r.rule.exclude).map(|r| &r.spec)
}

/// The layout policy object's bytes: the close-version policy's header
/// (magic `TFSL`), then each rule as `len u8`, its text, its 16-byte layout.
pub fn encode(rules: &[LayoutRule]) -> Vec<u8> {
    let mut body = Vec::new();
    for r in rules {
        policy::put_rule(&mut body, &r.rule);
        r.spec.put(&mut body);
    }
    policy::frame(LAYOUT_MAGIC, rules.len(), &body)
}

/// The body length a layout policy header says (bounded), to read the rest.
pub fn body_len(head: &[u8]) -> Result<usize> {
    policy::body_len_within(head, MAX_LAYOUT_BYTES, WHAT)
}

/// Decode a layout policy object with every check (never trusted).
pub fn decode(b: &[u8]) -> Result<Vec<LayoutRule>> {
    let count = policy::unframe(b, LAYOUT_MAGIC, MAX_LAYOUT_BYTES, WHAT)?;
    let (mut at, mut rules) = (POLICY_HEADER, Vec::with_capacity(count));
    for _ in 0..count {
        let (rule, next) = policy::take_rule(b, at, WHAT)?;
        let spec = b.get(next..next + SPEC_BYTES).ok_or_else(|| FsError::corrupt(WHAT, 0, "truncated"))?;
        let spec = LayoutSpec::take(spec)?;
        let r =
            LayoutRule::new(&rule.text(), spec).map_err(|_| FsError::corrupt(WHAT, 0, "a rule that sets nothing"))?;
        rules.push(r);
        at = next + SPEC_BYTES;
    }
    if at != b.len() {
        return Err(FsError::corrupt(WHAT, 0, "bytes after the last rule"));
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str, spec: &str) -> LayoutRule {
        LayoutRule::new(text, LayoutSpec::parse(spec).unwrap()).unwrap()
    }

    /// Pins the layout policy object (docs/FORMAT.md *File volumes*).
    #[test]
    fn golden_layout_object_and_damage() {
        let rules = vec![rule("*.db", "mirrored"), rule("*.log", "placement=append devices=1 stripe=2:64K")];
        let b = encode(&rules);
        assert_eq!(&b[..16], &[b'T', b'F', b'S', b'L', 1, 0, 0, 0, 2, 0, 0, 0, 43, 0, 0, 0]);
        assert_eq!(&b[20..29], &[0, 0, 0, 0, 4, b'*', b'.', b'd', b'b']);
        assert_eq!(&b[29..45], &[0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[45..51], &[5, b'*', b'.', b'l', b'o', b'g']);
        assert_eq!(&b[51..67], &[3, 0, 2, 0, 2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]);
        assert_eq!(decode(&b).unwrap(), rules);
        for at in 0..b.len() {
            let mut d = b.clone();
            d[at] ^= 0x40;
            assert!(decode(&d).is_err(), "byte {at}");
        }
        assert!(decode(&b[..b.len() - 1]).is_err());
        assert!(decode(&policy::encode(&[Rule::parse("*.c").unwrap()])).is_err(), "a version policy is not one");
    }

    #[test]
    fn text_round_trips_and_first_match_wins() {
        let s = LayoutSpec::parse("stripe=3:1M devices=0,2 placement=inplace mirrored").unwrap();
        assert_eq!(s.text(), "placement=inplace mirrored devices=0,2 stripe=3:1024K");
        assert_eq!(LayoutSpec::parse(&s.text()).unwrap(), s);
        assert_eq!(LayoutSpec::parse("stripe=2").unwrap().stripe, Some((2, 64 << 10)));
        let rules = vec![rule("!tmp/", ""), rule("*.db", "mirrored"), rule("data/", "devices=1")];
        assert_eq!(layout_for(&rules, "a/x.db").map(|s| s.mirrored), Some(true));
        assert_eq!(layout_for(&rules, "data/x.db").map(|s| s.devices), Some(0), "the first match decides");
        assert_eq!(layout_for(&rules, "data/y").map(|s| s.devices), Some(2));
        assert_eq!(layout_for(&rules, "tmp/x.db"), None, "excluded");
        assert_eq!(layout_for(&rules, "x.log"), None);
    }

    #[test]
    fn bad_layouts_are_refused_with_their_cause() {
        for (text, cause) in [
            ("placement=fast", "placement is"),
            ("devices=16", "devices are"),
            ("devices=", "devices are"),
            ("stripe=1", "stripe is"),
            ("stripe=2:1K", "stripe is"),
            ("stripe=2:128M", "stripe is"),
            ("mirror", "say placement"),
            ("blocks=0:1", "say placement"),
        ] {
            match LayoutSpec::parse(text) {
                Err(FsError::Invalid(m)) => assert!(m.contains(cause), "{text:?}: {m}"),
                other => panic!("{text:?} accepted: {other:?}"),
            }
        }
        let nothing = LayoutRule::new("*.db", LayoutSpec::default());
        assert!(matches!(nothing, Err(FsError::Invalid(m)) if m.contains("sets nothing")));
        let excluded = LayoutRule::new("!*.db", LayoutSpec { mirrored: true, ..Default::default() });
        assert!(matches!(excluded, Err(FsError::Invalid(m)) if m.contains("exclude")));
    }
}
