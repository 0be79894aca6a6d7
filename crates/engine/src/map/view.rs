//! What a volume's head or one of its snapshots shows, block by block, and
//! which blocks changed between two of them (changed-block tracking).
//!
//! A snapshot taken at epoch E shows, at each block, the version alive at E:
//! the head's entry if it was born at or before E; otherwise the entry in the
//! dead list of E's snapshot or of a later one that was born at or before E
//! (each block has at most one such version). So a snapshot read costs one
//! head lookup plus at most one lookup per later snapshot, only for the
//! blocks not yet found. A clone's origin markers resolve in the origin
//! snapshot, at most [`MAX_CLONE_DEPTH`] generations up.

use crate::map::extent_map::Segment;
use crate::map::state::{State, StateError, Volume, MAX_CLONE_DEPTH};
use tarn_store::StoreError;

/// Which contents of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum View {
    Head,
    /// The snapshot taken at this epoch.
    Snapshot(u64),
}

impl Volume {
    /// Size in bytes of the view, if it exists.
    pub fn view_size(&self, view: View) -> Option<u64> {
        match view {
            View::Head => Some(self.size),
            View::Snapshot(e) => self.snapshot_index(e).map(|i| self.snapshots[i].size),
        }
    }

    /// Segments of [lba, lba+len) as the view shows them, in order: holes,
    /// real extents and (in clones) origin markers, each with its birth.
    pub fn view_segments(&self, view: View, lba: u64, len: u64) -> Result<Vec<Segment>, StoreError> {
        let head = self.map.lookup(lba, len, usize::MAX)?;
        let View::Snapshot(epoch) = view else {
            return Ok(head);
        };
        let Some(k) = self.snapshot_index(epoch) else {
            return Ok(vec![Segment::Hole { lba, len }]);
        };
        let mut found = Vec::new();
        let mut pending = Vec::new();
        sort_by_birth(head, epoch, &mut found, &mut pending);
        for snap in &self.snapshots[k..] {
            if pending.is_empty() {
                break;
            }
            for (at, n) in std::mem::take(&mut pending) {
                sort_by_birth(snap.dead.lookup(at, n, usize::MAX)?, epoch, &mut found, &mut pending);
            }
        }
        found.extend(pending.into_iter().map(|(lba, len)| Segment::Hole { lba, len }));
        found.sort_by_key(|s| s.lba());
        Ok(merge_holes(found))
    }

    /// Ranges (lba, len) inside [lba, lba+len) where `view` may differ from
    /// the snapshot taken at `since`: entries the view shows born after it,
    /// and entries it showed that died before the view. Exact from epochs
    /// alone, so it survives any crash. None if `since` is not an older
    /// snapshot of this volume.
    pub fn changed_since(
        &self,
        view: View,
        since: u64,
        lba: u64,
        len: u64,
    ) -> Result<Option<Vec<(u64, u64)>>, StoreError> {
        let Some(k) = self.snapshot_index(since) else { return Ok(None) };
        let upto = match view {
            View::Head => self.snapshots.len(),
            View::Snapshot(e) => match self.snapshot_index(e).filter(|&m| m >= k) {
                Some(m) => m,
                None => return Ok(None),
            },
        };
        let mut changed: Vec<(u64, u64)> = Vec::new();
        for seg in self.view_segments(view, lba, len)? {
            if let Segment::Mapped { lba, len, birth, .. } = seg {
                if birth > since {
                    changed.push((lba, len));
                }
            }
        }
        for snap in &self.snapshots[k..upto] {
            for (at, e) in snap.dead.entries_in(lba, len)? {
                if e.birth <= since {
                    changed.push((at, e.len));
                }
            }
        }
        changed.sort_unstable();
        Ok(Some(merge_ranges(changed)))
    }
}

/// Mapped segments born at or before `epoch` are found; the rest (holes,
/// later births) are still pending.
fn sort_by_birth(segs: Vec<Segment>, epoch: u64, found: &mut Vec<Segment>, pending: &mut Vec<(u64, u64)>) {
    for seg in segs {
        match seg {
            Segment::Mapped { birth, .. } if birth <= epoch => found.push(seg),
            _ => pending.push((seg.lba(), seg.len())),
        }
    }
}

fn merge_holes(segs: Vec<Segment>) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::with_capacity(segs.len());
    for seg in segs {
        if let (Some(Segment::Hole { len, .. }), Segment::Hole { len: more, .. }) = (out.last_mut(), seg) {
            *len += more;
            continue;
        }
        out.push(seg);
    }
    debug_assert!(out.windows(2).all(|w| w[0].lba() + w[0].len() == w[1].lba()));
    out
}

fn merge_ranges(sorted: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
    for (lba, len) in sorted {
        match out.last_mut() {
            Some(last) if last.0 + last.1 >= lba => last.1 = last.1.max(lba + len - last.0),
            _ => out.push((lba, len)),
        }
    }
    out
}

impl State {
    /// Segments of the view with every origin marker resolved: holes and
    /// real extents only. Errors only on a broken origin chain.
    pub fn resolve(&self, vol: u32, view: View, lba: u64, len: u64) -> Result<Vec<Segment>, StateError> {
        self.resolve_at(vol, view, lba, len, 0)
    }

    fn resolve_at(&self, vol: u32, view: View, lba: u64, len: u64, depth: usize) -> Result<Vec<Segment>, StateError> {
        if depth > MAX_CLONE_DEPTH {
            return Err(StateError::Invariant(format!("origin chain of volume {vol} deeper than {MAX_CLONE_DEPTH}")));
        }
        let gone = || StateError::Invariant(format!("origin volume {vol} is gone"));
        let v = self.volume(vol).ok_or_else(gone)?;
        let segs = v.view_segments(view, lba, len)?;
        let Some(origin) = v.origin else {
            return Ok(segs);
        };
        let mut out = Vec::with_capacity(segs.len());
        for seg in segs {
            match seg {
                // Markers name the same block in the origin (clones keep
                // their origin's block numbers), so segments carry over as is.
                Segment::Mapped { len, pba, .. } if pba.is_origin() => {
                    debug_assert_eq!(pba.block(), seg.lba());
                    out.extend(self.resolve_at(
                        origin.vol,
                        View::Snapshot(origin.epoch),
                        pba.block(),
                        len,
                        depth + 1,
                    )?);
                }
                _ => out.push(seg),
            }
        }
        Ok(out)
    }
}
