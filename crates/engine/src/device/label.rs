//! Reading and writing the two superblock copies of a device.

use crate::device::Device;
use crate::error::{EngineError, Result};
use tarn_format::superblock::{Superblock, SUPERBLOCK_COPIES};
use tarn_format::BLOCK_SIZE;

/// What reading both copies found.
#[derive(Debug)]
pub struct LabelRead {
    pub current: Superblock,
    /// Which copy (index into SUPERBLOCK_COPIES) is current.
    pub copy: usize,
    /// Why the other copy was not used, if it was invalid.
    pub other_invalid: Option<String>,
    /// The other copy's txid, if it is valid but older: a checkpoint cut
    /// short by a crash, or a lost or misdirected write of that copy.
    pub other_older: Option<u64>,
}

/// Read both copies; the valid one with the highest txid wins.
pub fn read_label(dev: &dyn Device) -> Result<LabelRead> {
    if dev.size() < (SUPERBLOCK_COPIES[1] + 1) * BLOCK_SIZE {
        return Err(EngineError::NotAPool {
            device: dev.name(),
            detail: format!("device is only {} bytes", dev.size()),
        });
    }
    let mut found: Vec<std::result::Result<Superblock, String>> = Vec::new();
    for &block in &SUPERBLOCK_COPIES {
        let mut buf = vec![0u8; BLOCK_SIZE as usize];
        // A copy that cannot be read is an invalid copy: the other may do.
        let read = dev.read_at(&mut buf, block * BLOCK_SIZE).map_err(|e| format!("read error: {e}"));
        found.push(read.and_then(|()| Superblock::decode(&buf, block).map_err(|e| e.to_string())));
    }
    let best = (0..2).filter(|&i| found[i].is_ok()).max_by_key(|&i| found[i].as_ref().map(|s| s.txid).unwrap_or(0));
    let Some(copy) = best else {
        let why = found.iter().map(|f| f.as_ref().err().cloned().unwrap_or_default()).collect::<Vec<_>>().join("; ");
        return Err(EngineError::NotAPool { device: dev.name(), detail: format!("no valid superblock copy ({why})") });
    };
    let other_invalid = found[1 - copy].as_ref().err().cloned();
    let current = found.swap_remove(copy).expect("chosen copy is valid");
    let other_older = found[0].as_ref().ok().map(|o| o.txid).filter(|t| *t < current.txid);
    Ok(LabelRead { current, copy, other_invalid, other_older })
}

/// Write one copy (index into SUPERBLOCK_COPIES) and nothing else.
pub fn write_label_copy(dev: &dyn Device, sb: &Superblock, copy: usize) -> Result<()> {
    let block = SUPERBLOCK_COPIES[copy];
    dev.write_at(&sb.encode(block), block * BLOCK_SIZE).map_err(|e| EngineError::io("write superblock", dev.name(), e))
}

/// Write both copies (pool creation only: there is no older state to keep).
pub fn write_both_labels(dev: &dyn Device, sb: &Superblock) -> Result<()> {
    for &block in &SUPERBLOCK_COPIES {
        dev.write_at(&sb.encode(block), block * BLOCK_SIZE)
            .map_err(|e| EngineError::io("write superblock", dev.name(), e))?;
    }
    Ok(())
}

/// A pool, slot or leg uuid as text (8-4-4-4-12 hex digits).
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// Zero both superblock copies of `dev` and flush: it holds no pool.
pub fn wipe_label(dev: &dyn Device) -> Result<()> {
    let zero = vec![0u8; BLOCK_SIZE as usize];
    for &block in &SUPERBLOCK_COPIES {
        dev.write_at(&zero, block * BLOCK_SIZE).map_err(|e| EngineError::io("wipe superblock", dev.name(), e))?;
    }
    dev.flush().map_err(|e| EngineError::io("flush", dev.name(), e))
}
