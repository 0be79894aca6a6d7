//! Assembling a pool's members at open: which superblock is current, which
//! device is which mirror leg, which legs are usable. Every check runs before
//! anything is written, so a refused device (foreign, wrong member, another
//! pool's leg) leaves every device as it was.

use crate::device::label::{read_label, write_both_labels, LabelRead};
use crate::device::rebuild_slot::RebuildSlot;
use crate::device::vacant::{Absent, Vacant};
use crate::device::Device;
use crate::error::{EngineError, Result};
use crate::members::mirror::{Leg, LegHealth, MirrorDevice};
use std::sync::Arc;
use tarn_format::leg::{LegLabel, LEG_LABEL_BLOCK};
use tarn_format::superblock::{DeviceEntry, LegState, Superblock, LABEL_BLOCKS};
use tarn_format::BLOCK_SIZE;

/// The members, ready for the pool.
pub(crate) struct Assembled {
    /// One device per slot (a mirrored slot's is its MirrorDevice).
    pub devices: Vec<Arc<dyn Device>>,
    pub mirrors: Vec<Option<Arc<MirrorDevice>>>,
    /// The primary's current superblock and how it was read.
    pub label: LabelRead,
    /// Degraded slots, stale legs, healed superblocks: for status and check.
    pub notes: Vec<String>,
}

/// A leg superblock to rewrite once every check passed.
struct LabelHeal {
    dev: Arc<dyn Device>,
    sb: Option<Superblock>,
    why: String,
    /// The leg label to rewrite (it was damaged; the leg was deduced).
    leg: Option<LegLabel>,
}

pub(crate) fn write_leg_label(dev: &dyn Device, label: &LegLabel) -> Result<()> {
    dev.write_at(&label.encode(), LEG_LABEL_BLOCK * BLOCK_SIZE)
        .map_err(|e| EngineError::io("write leg label", dev.name(), e))
}

pub(crate) fn read_leg_label(dev: &dyn Device) -> std::result::Result<LegLabel, String> {
    let mut buf = vec![0u8; BLOCK_SIZE as usize];
    dev.read_at(&mut buf, LEG_LABEL_BLOCK * BLOCK_SIZE).map_err(|e| e.to_string())?;
    LegLabel::decode(&buf).map_err(|e| e.to_string())
}

/// `slots[i]` holds the devices found for member `i`: one for a plain
/// member, any subset (in any order) of the legs of a mirrored one.
pub(crate) fn assemble(slots: Vec<Vec<Arc<dyn Device>>>, writable: bool) -> Result<Assembled> {
    let label = primary_label(slots.first().map(Vec::as_slice).unwrap_or_default())?;
    let sb = label.current.clone();
    if slots.len() != sb.devices.len() {
        return Err(EngineError::InvalidArgument(format!(
            "pool has {} devices, {} given",
            sb.devices.len(),
            slots.len()
        )));
    }
    let mut out = Assembled { devices: Vec::new(), mirrors: Vec::new(), label, notes: Vec::new() };
    let mut heals = Vec::new();
    for (i, (found, entry)) in slots.into_iter().zip(&sb.devices).enumerate() {
        if entry.removed {
            // A removed slot: whatever was given for it is not opened.
            out.devices.push(Arc::new(Vacant { index: i, why: Absent::Removed }));
            out.mirrors.push(None);
            continue;
        }
        if entry.spare {
            // A spare holds no data: missing, foreign or too small, the pool
            // opens without it (said in notes and `pool status`), and it is
            // never taken.
            let (dev, note) = crate::members::spare::assemble_spare(&sb, i, entry, found);
            out.notes.extend(note);
            out.devices.push(dev);
            out.mirrors.push(None);
            continue;
        }
        if entry.legs.is_empty() {
            out.devices.push(assemble_plain(i, entry, found, &mut out.notes)?);
            out.mirrors.push(None);
            continue;
        }
        let mirror = assemble_mirror(&sb, i, entry, found, writable, &mut out.notes, &mut heals)?;
        out.devices.push(mirror.clone());
        out.mirrors.push(Some(mirror));
    }
    for h in heals {
        if !writable {
            out.notes.push(format!("{} (not rewritten: opened read-only)", h.why));
            continue;
        }
        if let Some(leg) = &h.leg {
            write_leg_label(h.dev.as_ref(), leg)?;
        }
        if let Some(sb) = &h.sb {
            write_both_labels(h.dev.as_ref(), sb)?;
        }
        h.dev.flush().map_err(|e| EngineError::io("flush superblock", h.dev.name(), e))?;
        log::warn!("{}; rewritten", h.why);
        out.notes.push(format!("{}; rewritten from an in-sync leg", h.why));
    }
    Ok(out)
}

/// The primary's superblock: of every device given for member 0 (legs of a
/// mirrored primary), the valid one with the highest txid.
fn primary_label(candidates: &[Arc<dyn Device>]) -> Result<LabelRead> {
    let mut best: Option<LabelRead> = None;
    let mut first_err = None;
    // The pool is the one the first device (the one named) belongs to.
    let mut pool_uuid = None;
    for dev in candidates {
        match read_label(dev.as_ref()) {
            Ok(l) if *pool_uuid.get_or_insert(l.current.pool_uuid) != l.current.pool_uuid => {
                return Err(EngineError::ForeignDevice {
                    device: dev.name(),
                    detail: format!("it belongs to pool {}", crate::device::label::uuid_string(&l.current.pool_uuid)),
                });
            }
            Ok(l) if best.as_ref().is_none_or(|b| l.current.txid > b.current.txid) => best = Some(l),
            Ok(_) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let label = match (best, first_err) {
        (Some(l), _) => l,
        (None, Some(e)) => return Err(e),
        (None, None) => return Err(EngineError::InvalidArgument("no devices".into())),
    };
    if !label.current.is_primary() {
        return Err(EngineError::InvalidArgument(format!(
            "device {} is member {} of a pool, not its primary",
            candidates.first().map(|d| d.name()).unwrap_or_default(),
            label.current.device_index
        )));
    }
    Ok(label)
}

/// The device of plain member `i` from what was found for it: none (its
/// device could not be opened: the pool opens DEGRADED, parity volumes
/// read through it by reconstruction, other blocks on it fail with EIO,
/// nothing is written there), or one (a member being rebuilt from parity
/// rows is wrapped: the service resumes it, `service/rebuild.rs`).
fn assemble_plain(
    i: usize,
    entry: &DeviceEntry,
    found: Vec<Arc<dyn Device>>,
    notes: &mut Vec<String>,
) -> Result<Arc<dyn Device>> {
    if found.is_empty() && i > 0 {
        log::warn!("member {i} ({}) is missing; opening DEGRADED", entry.path);
        notes.push(format!(
            "member {i} ({}) is MISSING: the pool is DEGRADED; parity volumes read through it by \
             reconstruction, other data on it fails with EIO; `tarn pool replace` rebuilds it",
            entry.path
        ));
        return Ok(Arc::new(RebuildSlot::missing(i, &entry.path)));
    }
    if entry.replacing.is_some() {
        return assemble_replacing(i, entry, found, notes);
    }
    let [dev] = <[_; 1]>::try_from(found).map_err(|f: Vec<_>| {
        EngineError::InvalidArgument(format!("member {i} is not a mirror: one device, not {}", f.len()))
    })?;
    let Some(n) = entry.rebuilt else {
        // The primary stays bare (it is never replaced: its journal);
        // any other member may be replaced online (`service/replace.rs`).
        return Ok(if i == 0 { dev } else { Arc::new(RebuildSlot::whole(i, dev)) });
    };
    let note = format!("member {i} ({}) is being rebuilt from parity rows: done below block {n}", dev.name());
    log::warn!("{note}");
    notes.push(note);
    Ok(Arc::new(RebuildSlot::rebuilding(i, dev, n)))
}

/// A present member being copied onto a new device: the devices found
/// (the recorded old and new paths) told apart by their labels' uuids.
/// Without the new device the member opens whole on the old one (a `pool
/// replace` starts the copy again); without the old one, as being rebuilt
/// from parity rows on the new one past what was copied.
fn assemble_replacing(
    i: usize,
    entry: &DeviceEntry,
    found: Vec<Arc<dyn Device>>,
    notes: &mut Vec<String>,
) -> Result<Arc<dyn Device>> {
    let Some(r) = &entry.replacing else { return Err(EngineError::Inconsistent(format!("member {i}: no replace"))) };
    let uuid_of = |d: &Arc<dyn Device>| read_label(d.as_ref()).ok().map(|l| l.current.device_uuid);
    let old = found.iter().find(|d| uuid_of(d) == Some(entry.uuid)).cloned();
    let new = found.iter().find(|d| uuid_of(d) == Some(r.uuid)).cloned();
    let note = match (old, new) {
        (Some(old), Some(new)) => {
            let note = format!(
                "member {i} ({}) is being replaced by {}: copied below block {}",
                old.name(),
                new.name(),
                r.copied
            );
            log::warn!("{note}");
            notes.push(note);
            return Ok(Arc::new(RebuildSlot::replacing(i, old, new, LABEL_BLOCKS, r.copied)));
        }
        (Some(old), None) => {
            notes.push(format!(
                "member {i} ({}) was being replaced by {}, which is missing: `tarn pool replace {i} NEW` starts again",
                old.name(),
                r.path
            ));
            return Ok(Arc::new(RebuildSlot::whole(i, old)));
        }
        (None, Some(new)) => {
            let note = format!(
                "member {i} ({}) is missing while being replaced: the rest is rebuilt from parity rows onto {} (from block {})",
                entry.path,
                new.name(),
                r.copied
            );
            (note, new)
        }
        (None, None) => {
            notes.push(format!(
                "member {i} ({}) and its replacement {} are MISSING: the pool is DEGRADED",
                entry.path, r.path
            ));
            return Ok(Arc::new(RebuildSlot::missing(i, &entry.path)));
        }
    };
    log::warn!("{}", note.0);
    notes.push(note.0);
    Ok(Arc::new(RebuildSlot::replacing_without_old(i, note.1, LABEL_BLOCKS, r.copied)))
}

/// Match the devices found to the slot's legs by their leg labels.
fn assemble_mirror(
    sb: &Superblock,
    index: usize,
    entry: &DeviceEntry,
    found: Vec<Arc<dyn Device>>,
    writable: bool,
    notes: &mut Vec<String>,
    heals: &mut Vec<LabelHeal>,
) -> Result<Arc<MirrorDevice>> {
    let mut devs: Vec<Option<Arc<dyn Device>>> = vec![None; entry.legs.len()];
    let mut damaged = Vec::new();
    for dev in found {
        let pos = match identify_leg(sb, index, entry, dev.as_ref(), notes)? {
            Identified::Leg(pos) => pos,
            Identified::Dead => continue,
            Identified::DamagedLabel => {
                damaged.push(dev);
                continue;
            }
        };
        if devs[pos].is_some() {
            return Err(EngineError::InvalidArgument(format!(
                "leg {pos} of member {index} given twice ({})",
                dev.name()
            )));
        }
        devs[pos] = Some(dev);
    }
    let relabel = deduce_damaged_leg(sb, index, entry, &mut devs, damaged, notes);
    let mut legs = Vec::new();
    for (pos, (dev, rec)) in devs.into_iter().zip(&entry.legs).enumerate() {
        let health = match (&dev, rec.state) {
            (None, _) => {
                log::warn!("member {index}: leg {pos} ({}) is missing; opening DEGRADED", rec.path);
                notes.push(format!("member {index} is DEGRADED: leg {pos} ({}) is missing", rec.path));
                LegHealth::Missing
            }
            (Some(_), LegState::InSync) => LegHealth::Online,
            (Some(d), LegState::NeedsResilver) => {
                notes.push(format!(
                    "member {index}: leg {pos} ({}) did not finish its resilver; it is resumed",
                    d.name()
                ));
                LegHealth::Resilvering
            }
            (Some(d), state) => {
                log::warn!("member {index}: leg {} is stale ({state:?}); not used until replaced", d.name());
                notes.push(format!(
                    "member {index} is DEGRADED: leg {pos} ({}) is stale ({state:?}); `tarn pool replace` resilvers it",
                    d.name()
                ));
                LegHealth::Faulted
            }
        };
        legs.push(Leg::new(dev, rec.uuid, rec.path.clone(), health));
    }
    plan_label_heals(sb, index, &legs, heals)?;
    if let Some((dev, leg)) = relabel {
        let why = format!("member {index}: the leg label of {} was damaged", dev.name());
        heals.push(LabelHeal { dev, sb: None, why, leg: Some(leg) });
    }
    Ok(Arc::new(MirrorDevice::new(legs, entry.blocks * BLOCK_SIZE, writable)))
}

/// A device of this member whose leg label is damaged is the leg no other
/// device claimed, if exactly one is left: use it and plan a new label.
fn deduce_damaged_leg(
    sb: &Superblock,
    index: usize,
    entry: &DeviceEntry,
    devs: &mut [Option<Arc<dyn Device>>],
    damaged: Vec<Arc<dyn Device>>,
    notes: &mut Vec<String>,
) -> Option<(Arc<dyn Device>, LegLabel)> {
    let free: Vec<usize> = (0..devs.len()).filter(|&p| devs[p].is_none()).collect();
    if damaged.len() != 1 || free.len() != 1 {
        for d in &damaged {
            notes.push(format!("member {index} is DEGRADED: {} has a damaged leg label; left out", d.name()));
        }
        return None;
    }
    let dev = damaged.into_iter().next()?;
    let pos = free[0];
    log::warn!("member {index}: {} has a damaged leg label; it is leg {pos}, the only one unclaimed", dev.name());
    devs[pos] = Some(dev.clone());
    let label = LegLabel {
        pool_uuid: sb.pool_uuid,
        slot_uuid: entry.uuid,
        slot_index: index as u16,
        leg_uuid: entry.legs[pos].uuid,
    };
    Some((dev, label))
}

/// What a device given for a mirrored member is.
enum Identified {
    Leg(usize),
    /// Reads as nothing of ours (blank, truncated, I/O errors): left out.
    Dead,
    /// Carries this member's superblock but its leg label is damaged.
    DamagedLabel,
}

/// Which leg of member `index` `dev` is. A device that reads as nothing
/// (truncated, zeroed, I/O errors) is a dead leg: None, and the mirror runs
/// without it. One that carries tarn labels of anything else is refused by name.
fn identify_leg(
    sb: &Superblock,
    index: usize,
    entry: &DeviceEntry,
    dev: &dyn Device,
    notes: &mut Vec<String>,
) -> Result<Identified> {
    let foreign = |detail: String| EngineError::ForeignDevice { device: dev.name(), detail };
    let label = match read_leg_label(dev) {
        Ok(l) => l,
        Err(e) => match read_label(dev) {
            Ok(l) if l.current.pool_uuid == sb.pool_uuid && l.current.device_uuid == entry.uuid => {
                return Ok(Identified::DamagedLabel);
            }
            Ok(_) => return Err(foreign(format!("it holds a tarn superblock but no mirror leg label ({e})"))),
            Err(_) => {
                log::warn!("member {index}: {} does not read as a mirror leg ({e}); left out", dev.name());
                notes
                    .push(format!("member {index} is DEGRADED: {} does not read as a leg ({e}); left out", dev.name()));
                return Ok(Identified::Dead);
            }
        },
    };
    if label.pool_uuid != sb.pool_uuid {
        return Err(foreign("it is a mirror leg of another pool".into()));
    }
    if label.slot_uuid != entry.uuid || usize::from(label.slot_index) != index {
        return Err(foreign(format!("it is a leg of member {}, not of member {index}", label.slot_index)));
    }
    let pos = entry.legs.iter().position(|l| l.uuid == label.leg_uuid).ok_or_else(|| {
        foreign(format!(
            "its leg {} is no longer in member {index} (replaced)",
            crate::device::label::uuid_string(&label.leg_uuid)
        ))
    })?;
    if dev.size() / BLOCK_SIZE < entry.blocks {
        return Err(foreign(format!(
            "device shrank: {} blocks, pool expects {}",
            dev.size() / BLOCK_SIZE,
            entry.blocks
        )));
    }
    Ok(Identified::Leg(pos))
}

/// Every in-sync leg must carry the slot's newest superblock in both copies;
/// plan rewriting the ones that do not (rot, a torn write on one leg).
fn plan_label_heals(sb: &Superblock, index: usize, legs: &[Leg], heals: &mut Vec<LabelHeal>) -> Result<()> {
    let online: Vec<(&Leg, &Arc<dyn Device>)> =
        legs.iter().filter(|l| l.health() == LegHealth::Online).filter_map(|l| Some((l, l.dev.as_ref()?))).collect();
    let reads: Vec<Result<LabelRead>> = online.iter().map(|(_, d)| read_label(d.as_ref())).collect();
    let best = if index == 0 {
        sb.clone()
    } else {
        let best = reads.iter().filter_map(|r| r.as_ref().ok()).max_by_key(|l| l.current.txid).ok_or_else(|| {
            EngineError::MemberUnavailable { member: index, detail: "no in-sync leg has a valid superblock".into() }
        })?;
        best.current.clone()
    };
    if online.is_empty() {
        return Err(EngineError::MemberUnavailable {
            member: index,
            detail: "no in-sync leg of the mirror is present".into(),
        });
    }
    for ((_, dev), read) in online.iter().zip(reads) {
        let why = match read {
            Err(e) => format!("superblock of leg {} (member {index}) unreadable: {e}", dev.name()),
            Ok(l) if l.current.pool_uuid != sb.pool_uuid || usize::from(l.current.device_index) != index => {
                return Err(EngineError::ForeignDevice {
                    device: dev.name(),
                    detail: format!(
                        "its superblock is member {} of pool {}",
                        l.current.device_index,
                        crate::device::label::uuid_string(&l.current.pool_uuid)
                    ),
                });
            }
            Ok(l) if l.current.txid < best.txid => {
                format!(
                    "superblock of leg {} (member {index}) is stale (txid {} < {})",
                    dev.name(),
                    l.current.txid,
                    best.txid
                )
            }
            Ok(l) => match l.other_invalid {
                Some(bad) => {
                    format!("superblock copy {} of leg {} (member {index}) invalid ({bad})", 1 - l.copy, dev.name())
                }
                None => continue,
            },
        };
        heals.push(LabelHeal { dev: (*dev).clone(), sb: Some(best.clone()), why, leg: None });
    }
    Ok(())
}
