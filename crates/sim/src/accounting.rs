//! Space accounting predicted from the model's entries: what the pool must
//! report for a volume and its snapshots, for every way its ambiguous
//! entries ([`Kind::Maybe`]) may have gone.
//!
//! Counted in blocks, per volume: own space is the distinct `Data` entries
//! its views (head and snapshots) show; a clone's markers hold no space
//! (their blocks are the origin's, counted there). A snapshot's `exclusive`
//! is its own entries no other view of the same volume shows (clones of it
//! are not counted: a snapshot with clones cannot be deleted, and its
//! blocks stay the origin volume's own space either way); `referenced` is
//! all its own entries. Ids never move between blocks, so entries are
//! grouped block by block.
//!
//! Ambiguous entries that hold data are tried both ways. Those shown by
//! the same views whose alternatives no view shows are interchangeable, so
//! only how many of them are their alternative matters (k+1 cases, not
//! 2^k). Those that are holes either way (a clone's trimmed block whose
//! origin has a hole: the marker, or nothing) only change `origin_blocks`,
//! by at most one each and independently, so they give a range instead.

use crate::model::{Id, Kind, Model, VolModel, MAX_CHAIN};
use std::collections::HashMap;

/// Most combinations of ambiguous entries tried per volume; beyond that the
/// volume's accounting is not checked.
const MAX_COMBINATIONS: usize = 1024;

/// What the pool reports for one volume, in blocks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolSpace {
    /// Own blocks the head maps (`VolumeInfo::allocated`).
    pub allocated: u64,
    /// Own blocks only snapshots hold (`VolumeInfo::snapshot_bytes`).
    pub snapshot_blocks: u64,
    /// Blocks still reading through to the origin, head and snapshots: at
    /// most this, at least this minus `origin_slack`.
    pub origin_blocks: u64,
    pub origin_slack: u64,
    /// (exclusive, referenced) per snapshot, oldest first.
    pub snaps: Vec<(u64, u64)>,
    /// Own blocks of head and snapshots together (the volume's share of
    /// `PoolStatus::used`; not reported per volume).
    pub used: u64,
}

impl VolSpace {
    /// Whether the pool's report `seen` fits this prediction.
    pub fn fits(&self, seen: &VolSpace) -> bool {
        let origin = self.origin_blocks - self.origin_slack..=self.origin_blocks;
        (self.allocated, self.snapshot_blocks, &self.snaps) == (seen.allocated, seen.snapshot_blocks, &seen.snaps)
            && origin.contains(&seen.origin_blocks)
    }
}

/// A block's entry with ambiguity decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resolved {
    Hole,
    Data(Id),
    Marker(Id),
}

/// Every distinct accounting the volume may show, one per combination of
/// its ambiguous entries; None if there are too many to try.
pub fn possible(model: &Model, v: &VolModel) -> Option<Vec<VolSpace>> {
    // A parity volume's rows hold parity units besides its data: not counted.
    if v.parity {
        return None;
    }
    let dims = dimensions(model, v);
    let combinations =
        dims.iter().try_fold(1usize, |n, d| n.checked_mul(d.len() + 1)).filter(|&n| n <= MAX_COMBINATIONS);
    let Some(combinations) = combinations else {
        let sizes: Vec<usize> = dims.iter().map(Vec::len).collect();
        let kinds: Vec<Kind> = dims.iter().filter(|d| d.len() == 1).take(4).map(|d| model.kind(d[0])).collect();
        trace!("  accounting not checked: ambiguous groups {sizes:?}, first singles {kinds:?}");
        return None;
    };
    let views = || v.ids.iter().chain(v.snaps.iter().flat_map(|s| &s.ids));
    let hole_either_way = views().any(|&id| matches!(model.kind(id), Kind::Maybe { own_data: false, .. }));
    let mut out: Vec<VolSpace> = Vec::new();
    let mut taken = vec![0usize; dims.len()];
    for _ in 0..combinations {
        let mut alts: Vec<Id> = dims.iter().zip(&taken).flat_map(|(d, &n)| d[..n].iter().copied()).collect();
        alts.sort_unstable();
        let mut space = count(v, |id| resolve(model, id, &alts, true));
        if hole_either_way {
            let fewest = count(v, |id| resolve(model, id, &alts, false));
            space.origin_slack = space.origin_blocks - fewest.origin_blocks;
        }
        if !out.contains(&space) {
            out.push(space);
        }
        next_combination(&mut taken, &dims);
    }
    Some(out)
}

/// Count up in mixed radix: dimension i takes 0..=len of its entries.
fn next_combination(taken: &mut [usize], dims: &[Vec<Id>]) {
    for (t, d) in taken.iter_mut().zip(dims) {
        if *t < d.len() {
            *t += 1;
            return;
        }
        *t = 0;
    }
}

/// The ambiguous data entries in groups: the first n of a group are their
/// alternatives, for every n. A group is interchangeable entries (shown by
/// the same views, in no chain, alternatives of one kind no view shows),
/// or a single entry.
fn dimensions(model: &Model, v: &VolModel) -> Vec<Vec<Id>> {
    let ambiguous = ambiguous_entries(model, v);
    let mut shown: HashMap<Id, u64> = HashMap::new();
    for (k, ids) in std::iter::once(&v.ids).chain(v.snaps.iter().map(|s| &s.ids)).enumerate() {
        for id in ids {
            *shown.entry(*id).or_default() |= 1 << k;
        }
    }
    let alt_of = |m: Id| match model.kind(m) {
        Kind::Maybe { alt, .. } => alt,
        _ => unreachable!("ambiguous entries are Maybe"),
    };
    let mut groups: HashMap<(u64, bool), Vec<Id>> = HashMap::new();
    let mut dims = Vec::new();
    for &m in &ambiguous {
        let alt = alt_of(m);
        let chained = ambiguous.iter().any(|&o| o != m && (alt_of(o) == m || alt_of(o) == alt));
        let plain_alt = matches!(model.kind(alt), Kind::Marker { .. } | Kind::Data);
        match shown.get(&m) {
            Some(&mask) if plain_alt && !chained && !shown.contains_key(&alt) => {
                let marker = matches!(model.kind(alt), Kind::Marker { .. });
                groups.entry((mask, marker)).or_default().push(m);
            }
            _ => dims.push(vec![m]),
        }
    }
    let mut keyed: Vec<((u64, bool), Vec<Id>)> = groups.into_iter().collect();
    keyed.sort_unstable();
    dims.extend(keyed.into_iter().map(|(_, g)| g));
    dims
}

/// Ambiguous data entries the volume's views show, and those their
/// alternatives are (an alternative is as allocated as the entry).
fn ambiguous_entries(model: &Model, v: &VolModel) -> Vec<Id> {
    let mut out: Vec<Id> = Vec::new();
    let views = v.ids.iter().chain(v.snaps.iter().flat_map(|s| &s.ids));
    for &id in views {
        let mut at = id;
        // Each step moves to an older entry; the chain ends at a non-ambiguous one.
        while let Kind::Maybe { alt, own_data: true } = model.kind(at) {
            if out.contains(&at) {
                break;
            }
            out.push(at);
            at = alt;
        }
    }
    out
}

/// The entry `id` is when the ambiguous data entries in `alts` (sorted)
/// are their alternatives and the others their own; ambiguous holes are
/// their alternatives if `markers`.
fn resolve(model: &Model, id: Id, alts: &[Id], markers: bool) -> Resolved {
    let mut at = id;
    for _ in 0..MAX_CHAIN {
        match model.kind(at) {
            Kind::Hole => return Resolved::Hole,
            Kind::Data => return Resolved::Data(at),
            Kind::Marker { .. } => return Resolved::Marker(at),
            Kind::Maybe { alt, own_data: false } if markers => at = alt,
            Kind::Maybe { own_data: false, .. } => return Resolved::Hole,
            Kind::Maybe { alt, own_data: true } if alts.binary_search(&at).is_ok() => at = alt,
            Kind::Maybe { own_data: true, .. } => return Resolved::Data(at),
        }
    }
    panic!("ambiguous entries chain longer than {MAX_CHAIN}")
}

/// Count one combination: per block, group the views showing the same entry.
fn count(v: &VolModel, resolve: impl Fn(Id) -> Resolved) -> VolSpace {
    let views: Vec<&[Id]> = std::iter::once(v.ids.as_slice()).chain(v.snaps.iter().map(|s| s.ids.as_slice())).collect();
    assert!(views.len() <= 64, "a view mask is a u64");
    let blocks = views.iter().map(|ids| ids.len()).max().unwrap_or(0);
    let mut space = VolSpace { snaps: vec![(0, 0); v.snaps.len()], ..Default::default() };
    let mut groups: Vec<(Resolved, u64)> = Vec::with_capacity(views.len());
    for b in 0..blocks {
        groups.clear();
        for (k, ids) in views.iter().enumerate() {
            let Some(&id) = ids.get(b) else { continue };
            let r = resolve(id);
            match groups.iter_mut().find(|g| g.0 == r) {
                Some(g) => g.1 |= 1 << k,
                None => groups.push((r, 1 << k)),
            }
        }
        for &(r, mask) in &groups {
            add_entry(&mut space, r, mask);
        }
    }
    space
}

/// One entry shown by the views in `mask` (bit 0: head, bit i+1: snapshot i).
fn add_entry(space: &mut VolSpace, r: Resolved, mask: u64) {
    match r {
        Resolved::Hole => {}
        Resolved::Marker(_) => space.origin_blocks += 1,
        Resolved::Data(_) => {
            space.used += 1;
            if mask & 1 != 0 {
                space.allocated += 1;
            } else {
                space.snapshot_blocks += 1;
            }
            for (i, s) in space.snaps.iter_mut().enumerate() {
                let bit = 1 << (i + 1);
                if mask & bit != 0 {
                    s.1 += 1;
                    if mask == bit {
                        s.0 += 1;
                    }
                }
            }
        }
    }
}
