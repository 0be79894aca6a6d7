//! Admin operations as the model sees them: the outcome it predicts for
//! each (done, or refused with a given error), applying one that happened,
//! and settling one a crash cut: done or not, the reopened pool says which.

use crate::model::BLOCK;
use crate::run::Run;
use tarn_engine::{EngineError, View};

/// An admin operation, as the model applies it.
#[derive(Debug, Clone)]
pub(crate) enum Pending {
    VolCreate {
        name: String,
        size: usize,
    },
    VolResize {
        name: String,
        from: usize,
        to: usize,
    },
    VolDelete {
        name: String,
    },
    SnapCreate {
        vol: String,
        snap: String,
    },
    SnapDelete {
        vol: String,
        snap: String,
    },
    /// Newer snapshots go too (the model only predicts success when allowed).
    Rollback {
        vol: String,
        snap: String,
    },
    CloneCreate {
        vol: String,
        snap: String,
        clone: String,
    },
    Flatten {
        vol: String,
    },
    /// Moves data, changes no content: the model only learns that what
    /// was answered before it is durable.
    Compact {
        vol: String,
    },
    /// File-system hints moving blocks to a cluster or back: like a
    /// compaction, data moves and no content changes.
    Hint {
        vol: String,
    },
    /// A member device added (`Pool::add_device`): no content changes;
    /// its forced checkpoint makes everything answered before durable.
    DevAdd {
        index: usize,
    },
    /// A member grown (`Pool::grow_device`) from `from` data bytes:
    /// like an add, no content changes.
    DevGrow {
        index: usize,
        from: u64,
    },
    /// A volume's quota changed (op 22).
    VolQuota {
        vol: String,
        from: Option<u64>,
        to: Option<u64>,
    },
    /// The pool's overcommit ratio changed (op 23).
    Overcommit {
        from: Option<u32>,
        to: Option<u32>,
    },
    /// A member evacuated (`Pool::evacuate_device`): data moves, no
    /// content changes; its final flush makes everything before durable.
    DevRemove {
        index: usize,
    },
    /// A member's default placement changed (the device table).
    DevPlacement {
        index: usize,
        from: Option<&'static str>,
        to: Option<&'static str>,
    },
    /// The members a volume's new data may go to changed (op 24).
    VolDevices {
        vol: String,
        from: u16,
        to: u16,
    },
    /// A spare added at slot `index` (`Pool::add_spare`): like a member's add.
    SpareAdd {
        index: usize,
    },
    /// Spare `index` taken as a member (`Pool::take_spare`): no content changes.
    SpareTake {
        index: usize,
    },
    /// Spare `index` dropped (`Pool::drop_spare`): its slot removed.
    SpareDrop {
        index: usize,
    },
    /// A volume created striped (ops 3 and 20): as a create for the model.
    StripedCreate {
        name: String,
        size: usize,
    },
    /// A volume created with parity (ops 3 and 21): as a create for the model.
    ParityCreate {
        name: String,
        size: usize,
    },
}

impl Pending {
    /// Index into `RunStats::done` (see `run::OP_NAMES`).
    pub(crate) fn index(&self) -> usize {
        match self {
            Pending::VolCreate { .. } => 0,
            Pending::VolResize { .. } => 1,
            Pending::VolDelete { .. } => 2,
            Pending::SnapCreate { .. } => 3,
            Pending::SnapDelete { .. } => 4,
            Pending::Rollback { .. } => 5,
            Pending::CloneCreate { .. } => 6,
            Pending::Flatten { .. } => 7,
            Pending::Compact { .. } => 8,
            Pending::Hint { .. } => 9,
            Pending::DevAdd { .. } => 10,
            Pending::DevGrow { .. } => 11,
            Pending::VolQuota { .. } => 12,
            Pending::Overcommit { .. } => 13,
            Pending::DevRemove { .. } => 14,
            Pending::DevPlacement { .. } => 15,
            Pending::VolDevices { .. } => 16,
            Pending::SpareAdd { .. } => 17,
            Pending::SpareTake { .. } => 18,
            Pending::SpareDrop { .. } => 19,
            Pending::StripedCreate { .. } => 20,
            Pending::ParityCreate { .. } => 21,
        }
    }
}

/// What the reopened pool shows of an admin operation a crash cut.
#[derive(Debug)]
enum Cut {
    /// Done, so its commit landed: everything before it is durable.
    Done,
    NotDone,
    /// A rollback to the newest snapshot, done or not: the same state.
    HeadIsSnapshot {
        vol: String,
        snap: String,
    },
}

/// What the model predicts: done, or refused with this error.
pub(crate) type Expect = Result<(), &'static str>;

fn error_name(e: &EngineError) -> &'static str {
    match e {
        EngineError::InvalidArgument(_) => "InvalidArgument",
        EngineError::SnapshotExists { .. } => "SnapshotExists",
        EngineError::NoSuchSnapshot { .. } => "NoSuchSnapshot",
        EngineError::InUse { .. } => "InUse",
        EngineError::VolumeExists(_) => "VolumeExists",
        EngineError::NoSuchVolume(_) => "NoSuchVolume",
        EngineError::NoSpace => "NoSpace",
        EngineError::QuotaBelowUse { .. } => "QuotaBelowUse",
        EngineError::Overcommit { .. } => "Overcommit",
        _ => "other",
    }
}

impl Run {
    /// Hold an admin operation's result to the model's prediction. A crash
    /// during it leaves it pending, settled after the reopen.
    pub(crate) fn admin_outcome<T>(
        &mut self,
        p: Pending,
        expect: Expect,
        r: Result<T, EngineError>,
    ) -> Result<Option<T>, String> {
        match (r, expect) {
            (Ok(t), Ok(())) => {
                self.apply_admin(&p);
                self.stats.admin += 1;
                Ok(Some(t))
            }
            (Err(e), Err(want)) if error_name(&e) == want => {
                self.stats.refused += 1;
                Ok(None)
            }
            (Err(_), Ok(())) if self.any_dead() => {
                self.pending = Some(p);
                self.crash_and_verify().map(|()| None)
            }
            (Ok(_), Err(want)) => Err(format!("{p:?} succeeded; the model expected {want}")),
            (Err(e), expect) => Err(format!("{p:?} failed: {e} (the model expected {expect:?})")),
        }
    }

    /// The model's side of an admin operation that happened: it committed,
    /// so everything answered before it is durable too.
    fn apply_admin(&mut self, p: &Pending) {
        self.stats.done[p.index()] += 1;
        let m = &mut self.model;
        match p {
            Pending::VolCreate { name, size } | Pending::StripedCreate { name, size } => m.new_volume(name, *size),
            Pending::ParityCreate { name, size } => {
                m.new_volume(name, *size);
                m.vol_mut(name).parity = true;
            }
            Pending::VolResize { name, to, .. } => m.resize(name, *to),
            Pending::VolDelete { name } => {
                m.vols.remove(name);
            }
            Pending::SnapCreate { vol, snap } => m.snapshot(vol, snap),
            Pending::SnapDelete { vol, snap } => m.delete_snapshot(vol, snap),
            Pending::Rollback { vol, snap } => m.rollback(vol, snap),
            Pending::CloneCreate { vol, snap, clone } => m.clone_volume(vol, snap, clone),
            Pending::Flatten { vol } => m.flatten(vol),
            Pending::VolQuota { vol, to, .. } => m.vol_mut(vol).quota = *to,
            Pending::Overcommit { to, .. } => m.overcommit = *to,
            Pending::DevPlacement { index, to, .. } => {
                if m.device_placement.len() <= *index {
                    m.device_placement.resize(index + 1, None);
                }
                m.device_placement[*index] = *to;
            }
            Pending::VolDevices { vol, to, .. } => m.vol_mut(vol).devices = *to,
            Pending::Compact { .. }
            | Pending::Hint { .. }
            | Pending::DevAdd { .. }
            | Pending::DevGrow { .. }
            | Pending::DevRemove { .. }
            | Pending::SpareAdd { .. }
            | Pending::SpareTake { .. }
            | Pending::SpareDrop { .. } => {}
        }
        m.flushed();
    }

    /// An admin operation cut by the crash happened or not: apply it to the
    /// model if the reopened pool shows it done.
    pub(crate) fn settle_pending(&mut self) -> Result<(), String> {
        let Some(p) = self.pending.take() else {
            return Ok(());
        };
        let seen = self.observe_cut(&p).map_err(|e| format!("after a crash during {p:?}: {e}"))?;
        trace!("cut {p:?}: {seen:?}");
        match p {
            Pending::DevAdd { .. } => self.stats.dev_adds_cut += 1,
            Pending::DevGrow { .. } => self.stats.dev_grows_cut += 1,
            Pending::SpareAdd { .. } | Pending::SpareTake { .. } | Pending::SpareDrop { .. } => {
                self.stats.spares_cut += 1
            }
            Pending::DevRemove { index } => {
                self.stats.dev_removes_cut += 1;
                let st = self.pool().status();
                self.stats.removals_cut_done +=
                    usize::from(st.devices.get(index).is_some_and(|d| d.state == "REMOVED"));
            }
            _ => {}
        }
        match seen {
            Cut::Done => {
                self.stats.cut_done += 1;
                self.apply_admin(&p);
            }
            Cut::NotDone => self.stats.cut_undone += 1,
            Cut::HeadIsSnapshot { vol, snap } => {
                self.stats.cut_done += 1;
                self.stats.done[p.index()] += 1;
                self.model.rollback(&vol, &snap);
                self.model.vols.get_mut(&vol).expect("rolled back volume").flushed();
            }
        }
        Ok(())
    }

    fn observe_cut(&self, p: &Pending) -> Result<Cut, String> {
        let pool = self.pool();
        let size_of = |name: &str| pool.volume_id(name).and_then(|id| pool.volume_info(id)).map(|i| i.size as usize);
        let done = match p {
            // A striped volume reopens striped (op 20 in the same commit as its create).
            Pending::StripedCreate { name, .. }
                if pool.volume_id(name).and_then(|id| pool.volume_info(id)).is_some_and(|i| i.stripe.is_none()) =>
            {
                return Err(format!("volume {name} created striped reopened without its stripe"))
            }
            // A parity volume reopens with its parity (op 21 in the same commit as its create).
            Pending::ParityCreate { name, .. }
                if pool.volume_id(name).and_then(|id| pool.volume_info(id)).is_some_and(|i| i.parity.is_none()) =>
            {
                return Err(format!("volume {name} created with parity reopened without it"))
            }
            Pending::VolCreate { name, size }
            | Pending::StripedCreate { name, size }
            | Pending::ParityCreate { name, size } => match size_of(name) {
                None => false,
                Some(s) if s == *size => true,
                Some(s) => return Err(format!("volume {name} has size {s}, created with {size}")),
            },
            // To the same size, whether the commit landed is not observable.
            Pending::VolResize { name, from, to } => match size_of(name) {
                Some(s) if s == *from => false,
                Some(s) if s == *to => true,
                s => return Err(format!("volume {name} has size {s:?} after a resize from {from} to {to}")),
            },
            Pending::VolDelete { name } => size_of(name).is_none(),
            Pending::SnapCreate { vol, snap } => pool.lookup_view(&format!("{vol}@{snap}")).is_some(),
            Pending::SnapDelete { vol, snap } => pool.lookup_view(&format!("{vol}@{snap}")).is_none(),
            Pending::Rollback { vol, snap } => return self.rolled_back(vol, snap),
            Pending::CloneCreate { clone, .. } => size_of(clone).is_some(),
            Pending::Flatten { vol } => {
                let info = pool.volume_id(vol).and_then(|id| pool.volume_info(id));
                info.ok_or(format!("clone {vol} missing"))?.origin.is_none()
            }
            // Its last commit cannot be told apart: assume it did not land
            // (the model then keeps allowing the older contents too).
            // Its superblock lists the member, or the pool is as before.
            Pending::DevAdd { index } => pool.devices().len() > *index,
            Pending::SpareAdd { index } => match pool.status().devices.get(*index).map(|d| d.state) {
                None => false,
                Some("SPARE") => true,
                s => return Err(format!("slot {index} is {s:?} after a spare's add")),
            },
            Pending::SpareTake { index } => match pool.status().devices.get(*index).map(|d| d.state) {
                Some("SPARE") => false,
                Some("ONLINE") => true,
                s => return Err(format!("slot {index} is {s:?} after a spare's take")),
            },
            Pending::SpareDrop { index } => match pool.status().devices.get(*index).map(|d| d.state) {
                Some("SPARE") => false,
                Some("REMOVED") => true,
                s => return Err(format!("slot {index} is {s:?} after a spare's drop")),
            },
            Pending::DevGrow { index, from } => match pool.status().devices.get(*index).map(|d| d.data_bytes) {
                Some(b) if b == *from => false,
                Some(b) if b > *from => true,
                b => return Err(format!("device {index} has {b:?} data bytes after growing from {from}")),
            },
            // From and to the same value, whether the commit landed is
            // not observable: not done (the model allows both anyway).
            Pending::VolQuota { vol, from, to } => match size_of(vol).and(pool.volume_id(vol)) {
                Some(id) => match pool.volume_info(id).map(|i| i.quota) {
                    Some(q) if q == *from => false,
                    Some(q) if q == *to => true,
                    q => return Err(format!("volume {vol} has quota {q:?} after a change from {from:?} to {to:?}")),
                },
                None => return Err(format!("volume {vol} missing after a quota change")),
            },
            Pending::Overcommit { from, to } => match pool.overcommit() {
                r if r == *from => false,
                r if r == *to => true,
                r => return Err(format!("overcommit {r:?} after a change from {from:?} to {to:?}")),
            },
            Pending::DevPlacement { index, from, to } => match pool.device_placements().get(*index) {
                Some(p) if p.map(|k| k.name()) == *from => false,
                Some(p) if p.map(|k| k.name()) == *to => true,
                p => return Err(format!("member {index} placement {p:?} after a change from {from:?} to {to:?}")),
            },
            Pending::VolDevices { vol, from, to } => match pool.volume_id(vol).and_then(|id| pool.volume_info(id)) {
                Some(i) if i.devices == *from => false,
                Some(i) if i.devices == *to => true,
                i => {
                    return Err(format!(
                        "volume {vol} devices {:?} after a change from {from} to {to}",
                        i.map(|i| i.devices)
                    ))
                }
            },
            // Moves that landed or not show the same contents; whether its
            // last commit did is not observable (as a compaction's).
            // The slot reopens as it was (cut before the draining state was
            // durable), draining (resumable) or removed (its space map
            // empty); never gone.
            Pending::DevRemove { index } => match pool.status().devices.get(*index).map(|d| d.state) {
                Some("REMOVED" | "DRAINING" | "ONLINE") => false,
                s => return Err(format!("member {index} is {s:?} after a cut removal")),
            },
            Pending::Compact { vol } | Pending::Hint { vol } => {
                size_of(vol).ok_or(format!("volume {vol} missing after a compaction or hint move"))?;
                false
            }
        };
        Ok(if done { Cut::Done } else { Cut::NotDone })
    }

    /// A rollback happened if the newer snapshots are gone. Without newer
    /// ones the pool cannot tell: if the head shows exactly the snapshot's
    /// entries, the volume is the snapshot either way, but whether the
    /// commit (and so other volumes' writes) landed stays open.
    fn rolled_back(&self, vol: &str, snap: &str) -> Result<Cut, String> {
        let pool = self.pool();
        let v = self.model.vol(vol);
        let i = v.snap_index(snap).expect("rollback target in the model");
        if let Some(newest) = v.snaps.last().filter(|_| i + 1 < v.snaps.len()) {
            let gone = pool.lookup_view(&format!("{vol}@{}", newest.name)).is_none();
            return Ok(if gone { Cut::Done } else { Cut::NotDone });
        }
        let Some((id, View::Snapshot(epoch))) = pool.lookup_view(&format!("{vol}@{snap}")) else {
            return Err(format!("rollback target {vol}@{snap} missing"));
        };
        let size = pool.volume_info(id).map_or(0, |i| i.size as usize);
        if size != v.snaps[i].data.len() || self.changed_map(id, View::Head, epoch, size / BLOCK)?.contains(&true) {
            return Ok(Cut::NotDone);
        }
        Ok(Cut::HeadIsSnapshot { vol: vol.to_string(), snap: snap.to_string() })
    }
}
