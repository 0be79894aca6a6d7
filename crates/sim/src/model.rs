//! The reference model: what each volume must contain now, what it must
//! contain after a crash, and which sector versions a crash may mix.

use std::collections::{BTreeMap, HashMap};

pub const BLOCK: usize = 4096;
const SECTOR: usize = 512;

#[derive(Debug, Clone, Default)]
pub struct VolModel {
    /// What reads must return now.
    pub current: Vec<u8>,
    /// What reads must return after a crash, at least (last answered flush).
    pub durable: Vec<u8>,
    /// Per block touched since that flush: every version it has held.
    pub since_flush: HashMap<usize, Vec<Vec<u8>>>,
}

impl VolModel {
    pub fn new(size: usize) -> Self {
        VolModel { current: vec![0; size], durable: vec![0; size], since_flush: HashMap::new() }
    }

    fn note_blocks(&mut self, offset: usize, len: usize) {
        for b in offset / BLOCK..(offset + len).div_ceil(BLOCK) {
            let version = self.current[b * BLOCK..(b + 1) * BLOCK].to_vec();
            self.since_flush.entry(b).or_default().push(version);
        }
    }

    pub fn write(&mut self, offset: usize, data: &[u8]) {
        self.current[offset..offset + data.len()].copy_from_slice(data);
        self.note_blocks(offset, data.len());
    }

    /// A range whose content is now whatever the pool says (failed writes).
    pub fn adopt(&mut self, offset: usize, data: &[u8]) {
        self.write(offset, data);
    }

    pub fn flushed(&mut self) {
        self.durable = self.current.clone();
        self.since_flush.clear();
    }

    /// Check an image read back after a crash; Err names the first bad sector.
    pub fn check_after_crash(&self, image: &[u8]) -> Result<(), String> {
        if image.len() != self.durable.len() {
            return Err(format!("size {} != {}", image.len(), self.durable.len()));
        }
        for b in 0..image.len() / BLOCK {
            let range = b * BLOCK..(b + 1) * BLOCK;
            let got = &image[range.clone()];
            let durable = &self.durable[range];
            let Some(versions) = self.since_flush.get(&b) else {
                if got != durable {
                    return Err(format!("block {b} lost flushed data"));
                }
                continue;
            };
            for s in 0..BLOCK / SECTOR {
                let sr = s * SECTOR..(s + 1) * SECTOR;
                let ok =
                    got[sr.clone()] == durable[sr.clone()] || versions.iter().any(|v| v[sr.clone()] == got[sr.clone()]);
                if !ok {
                    return Err(format!("block {b} sector {s} holds data never written there"));
                }
            }
        }
        Ok(())
    }
}

/// Every volume by name.
#[derive(Debug, Default, Clone)]
pub struct Model {
    pub vols: BTreeMap<String, VolModel>,
}

impl Model {
    pub fn flushed(&mut self) {
        self.vols.values_mut().for_each(VolModel::flushed);
    }
}
