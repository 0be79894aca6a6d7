//! Spares at open (`tarn dev add --spare`; the pool side is
//! `commit/spare.rs`). A spare holds no data and no metadata, so the pool
//! never needs it to open: a spare that is missing, carries another label,
//! or shrank is replaced by a `Vacant` stand-in, noted, and never taken.

use crate::device::label::read_label;
use crate::device::vacant::{Absent, Vacant};
use crate::device::Device;
use std::sync::Arc;
use tarn_format::superblock::{DeviceEntry, Superblock};
use tarn_format::BLOCK_SIZE;

/// The device for spare slot `index` from what was found for it (none or
/// one), and a note when it cannot be used.
pub(crate) fn assemble_spare(
    sb: &Superblock,
    index: usize,
    entry: &DeviceEntry,
    found: Vec<Arc<dyn Device>>,
) -> (Arc<dyn Device>, Option<String>) {
    let missing = |why: String| -> (Arc<dyn Device>, Option<String>) {
        log::warn!("spare {index} ({}) is not usable: {why}; it will not be taken", entry.path);
        (Arc::new(Vacant { index, why: Absent::Spare }), Some(format!("spare {index} ({}) missing: {why}", entry.path)))
    };
    let mut found = found.into_iter();
    let (Some(dev), None) = (found.next(), found.next()) else {
        return missing("no device (or more than one) given for it".into());
    };
    match read_label(dev.as_ref()) {
        Err(e) => missing(format!("{}: {e}", dev.name())),
        Ok(l) if l.current.pool_uuid != sb.pool_uuid || l.current.device_uuid != entry.uuid => {
            missing(format!("{} carries another label", dev.name()))
        }
        Ok(_) if dev.size() / BLOCK_SIZE < entry.blocks => missing(format!(
            "{} shrank: {} blocks, the pool expects {}",
            dev.name(),
            dev.size() / BLOCK_SIZE,
            entry.blocks
        )),
        Ok(_) => (dev, None),
    }
}
