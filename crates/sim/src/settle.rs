//! Settling the model after a crash or a partly failed operation: which
//! version of each block survived, and which entry it is. Bytes decide
//! most blocks; where two versions read the same (zeros written over zeros,
//! a clone's trimmed block over an origin hole), the pool's block status
//! and changed blocks against a snapshot showing the old entry decide; what
//! nothing observable decides becomes an ambiguous entry ([`Kind::Maybe`]).

use crate::model::{block, Effect, Id, Kind, Model, VolModel, HOLE};

/// What the pool shows of a volume's head after a crash, per block.
pub struct Seen {
    /// Block status: allocated.
    pub alloc: Vec<bool>,
    /// Per snapshot of the volume (oldest first): the head differs from it.
    pub changed: Vec<Vec<bool>>,
}

/// How a block's entry is settled after a crash or a partly failed op.
enum Decision {
    Keep(Id),
    NewData,
    Maybe { alt: Id, own_data: bool },
}

impl Model {
    /// After a crash: check what the volume reads against what may have
    /// survived, then adopt it as flushed, naming the entry each block now
    /// shows. `seen` is what the pool says: block status, and changed
    /// blocks of the head against each snapshot (which entry a block shows,
    /// when two versions read the same).
    pub fn adopt_after_crash(&mut self, name: &str, image: Vec<u8>, seen: &Seen) -> Result<(), String> {
        let v = self.vol(name);
        v.check_after_crash(&image)?;
        let blocks = v.blocks();
        let covers = |flags: &Vec<bool>| flags.len() == blocks;
        if !covers(&seen.alloc) || seen.changed.len() != v.snaps.len() || !seen.changed.iter().all(covers) {
            return Err(format!("block status or changed blocks do not cover the {blocks} blocks"));
        }
        let mut touched: Vec<usize> = v.since_flush.keys().copied().collect();
        touched.sort_unstable();
        let mut decisions = Vec::with_capacity(touched.len());
        for b in touched {
            decisions.push((b, self.decide_after_crash(v, b, block(&image, b), seen)?));
        }
        let mut ids = v.durable_ids.clone();
        for (b, decision) in decisions {
            ids[b] = self.decided_entry(decision);
            if let Kind::Maybe { alt, .. } = self.kind(ids[b]) {
                trace!("  {name} block {b}: either entry {alt} ({:?}) or its own", self.kind(alt));
            }
        }
        let v = self.vol_mut(name);
        v.current = image;
        v.ids = ids;
        v.flushed();
        Ok(())
    }

    fn decided_entry(&mut self, decision: Decision) -> Id {
        match decision {
            Decision::Keep(id) => id,
            Decision::NewData => self.new_id(Kind::Data),
            Decision::Maybe { alt, own_data } => self.new_id(Kind::Maybe { alt, own_data }),
        }
    }

    fn decide_after_crash(&self, v: &VolModel, b: usize, got: &[u8], seen: &Seen) -> Result<Decision, String> {
        let a = seen.alloc[b];
        let d = v.durable_ids[b];
        let d_match = block(&v.durable, b) == got && self.alloc(d) == a;
        let cur_match = block(&v.current, b) == got && self.alloc(v.ids[b]) == a;
        let versions = v.since_flush.get(&b).map(Vec::as_slice).unwrap_or_default();
        let later_match = versions.iter().any(|x| x.data == got && x.alloc == a);
        Ok(match (d_match, later_match) {
            (true, false) => Decision::Keep(d),
            (false, true) if cur_match => Decision::Keep(v.ids[b]),
            // A later version, or a torn in-place write: private space either way.
            (false, _) if a => Decision::NewData,
            (false, true) => Decision::Keep(HOLE),
            (false, false) => return Err(format!("block {b} reads as a hole no operation made")),
            (true, true) => match v.snaps.iter().position(|s| s.ids.get(b) == Some(&d)) {
                // A snapshot shows the old entry: the pool says whether the head still does.
                Some(k) if seen.changed[k][b] => {
                    if a {
                        Decision::NewData
                    } else {
                        Decision::Keep(HOLE)
                    }
                }
                Some(_) => Decision::Keep(d),
                None => self.ambiguous(v, b, d, a),
            },
        })
    }

    /// The block reads like its old entry `old` and like a newer version.
    fn ambiguous(&self, v: &VolModel, b: usize, old: Id, alloc: bool) -> Decision {
        let private = self.kind(old) == Kind::Data && v.only_in_head(b, old);
        if old == HOLE || private {
            // Either way no other view shares it: the same for every count.
            return Decision::Keep(old);
        }
        Decision::Maybe { alt: old, own_data: alloc }
    }

    /// After a write that failed without a crash (no space): each block of
    /// `effects` holds its old or its new version; `got`/`alloc` are what
    /// the pool shows for those blocks, in order.
    pub fn adopt_partial(
        &mut self,
        name: &str,
        effects: &[Effect],
        got: &[Vec<u8>],
        alloc: &[bool],
    ) -> Result<(), String> {
        for (i, e) in effects.iter().enumerate() {
            let v = self.vol(name);
            let old = v.ids[e.lba];
            let old_match = block(&v.current, e.lba) == got[i].as_slice() && self.alloc(old) == alloc[i];
            let new_match = e.data == got[i] && e.alloc == alloc[i];
            let decision = match (old_match, new_match) {
                (true, false) => continue,
                (false, true) => Decision::NewData,
                (true, true) => self.ambiguous(v, e.lba, old, alloc[i]),
                (false, false) => return Err(format!("block {} holds neither its old nor its new version", e.lba)),
            };
            let id = match decision {
                Decision::Keep(_) => continue,
                Decision::NewData if !e.alloc => HOLE,
                decision => self.decided_entry(decision),
            };
            self.vol_mut(name).note(e, id);
        }
        Ok(())
    }
}
