//! The pool's logical state: volumes and their maps. Changed only through
//! [`State::apply`], by the live pool and by journal replay alike.

use crate::extent_map::{ExtentMap, Freed};
use std::collections::{BTreeMap, HashMap};
use tarn_format::ops::{Op, MAX_NAME_LEN};
use tarn_format::{Pba, BLOCK_SIZE};

#[derive(Debug, Clone)]
pub struct Volume {
    pub id: u32,
    pub name: String,
    /// Visible size in bytes (a multiple of the block size).
    pub size: u64,
    pub map: ExtentMap,
}

impl Volume {
    pub fn blocks(&self) -> u64 {
        self.size / BLOCK_SIZE
    }
}

#[derive(Debug, Clone)]
pub struct State {
    pub volumes: BTreeMap<u32, Volume>,
    pub by_name: HashMap<String, u32>,
    pub next_volume_id: u32,
    /// The current epoch: new data is born in it.
    pub epoch: u64,
}

impl Default for State {
    fn default() -> Self {
        State { volumes: BTreeMap::new(), by_name: HashMap::new(), next_volume_id: 1, epoch: 1 }
    }
}

/// Checks a volume name: what `vol create` accepts and replay expects.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!("volume name must be 1 to {MAX_NAME_LEN} bytes"));
    }
    if name.contains(['@', '/']) || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!("volume name {name:?} may not contain '@', '/', spaces or control characters"));
    }
    Ok(())
}

impl State {
    pub fn volume(&self, id: u32) -> Option<&Volume> {
        self.volumes.get(&id)
    }

    pub fn mapped_blocks(&self) -> u64 {
        self.volumes.values().map(|v| v.map.mapped_blocks()).sum()
    }

    pub fn extent_count(&self) -> usize {
        self.volumes.values().map(|v| v.map.extent_count()).sum()
    }

    /// Apply one op; physical blocks it releases are appended to `freed`.
    /// An op that does not fit the state (replay of a damaged journal, or a
    /// bug) is refused with a reason and changes nothing.
    pub fn apply(&mut self, op: &Op, freed: &mut Freed) -> Result<(), String> {
        match op {
            Op::Map { vol, lba, len, pba, birth } => {
                let v = self.volumes.get_mut(vol).ok_or(format!("map on unknown volume {vol}"))?;
                check_range(v, *lba, *len)?;
                if *birth > self.epoch {
                    return Err(format!("map born in future epoch {birth} > {}", self.epoch));
                }
                freed.extend(v.map.insert(*lba, *len, Pba(*pba), *birth));
            }
            Op::Unmap { vol, lba, len } => {
                let v = self.volumes.get_mut(vol).ok_or(format!("unmap on unknown volume {vol}"))?;
                check_range(v, *lba, *len)?;
                freed.extend(v.map.remove(*lba, *len));
            }
            Op::VolCreate { vol, size, name } => {
                validate_name(name)?;
                if self.volumes.contains_key(vol) || self.by_name.contains_key(name) || *vol == 0 {
                    return Err(format!("volume {vol} ({name}) already exists"));
                }
                if size % BLOCK_SIZE != 0 {
                    return Err(format!("volume size {size} not a multiple of {BLOCK_SIZE}"));
                }
                self.volumes
                    .insert(*vol, Volume { id: *vol, name: name.clone(), size: *size, map: ExtentMap::default() });
                self.by_name.insert(name.clone(), *vol);
                self.next_volume_id = self.next_volume_id.max(vol + 1);
            }
            Op::VolResize { vol, size } => {
                let v = self.volumes.get_mut(vol).ok_or(format!("resize of unknown volume {vol}"))?;
                if size % BLOCK_SIZE != 0 {
                    return Err(format!("volume size {size} not a multiple of {BLOCK_SIZE}"));
                }
                let new_blocks = size / BLOCK_SIZE;
                if new_blocks < v.blocks() {
                    freed.extend(v.map.remove(new_blocks, v.blocks() - new_blocks));
                }
                v.size = *size;
            }
            Op::VolDelete { vol } => {
                let mut v = self.volumes.remove(vol).ok_or(format!("delete of unknown volume {vol}"))?;
                self.by_name.remove(&v.name);
                freed.extend(v.map.clear());
            }
        }
        Ok(())
    }
}

fn check_range(v: &Volume, lba: u64, len: u64) -> Result<(), String> {
    match lba.checked_add(len) {
        Some(end) if len > 0 && end <= v.blocks() => Ok(()),
        _ => Err(format!("blocks {lba}+{len} outside volume {} of {} blocks", v.id, v.blocks())),
    }
}
