//! `tarn vol reclaim`: give back the space of blocks a guest ext2/3/4 file
//! system freed but never discarded (gray-box reclaim, VA seed 000).
//!
//! The file system is read from a snapshot taken for the purpose, so a
//! live file system is never read half-written; blocks its bitmaps mark
//! free are unmapped in the head only where the head still holds what the
//! snapshot holds (written since: maybe a new file's, kept). The snapshot
//! goes at the end, and with it the space.

use crate::guestfs::{fs_kind, open_ext, with_snapshot, Snapshot, ViewSource};
use serde_json::{json, Value};
use tarn_engine::{EngineError, Pool, ReclaimCount, View};
use tarn_extfs::{free_byte_ranges, ExtError, FreeSummary};

/// The snapshot reclaim reads; a leftover one (a crash mid-reclaim) is
/// replaced.
const SNAPSHOT: &str = "tarn-reclaim";
/// Free ranges handed to the engine per call.
const BATCH: usize = 4096;

/// Reclaim the free blocks of the ext file system on volume `name`; with
/// `dry_run`, only count them. `progress` sees (4 KiB blocks scanned, of).
pub fn reclaim(pool: &Pool, name: &str, dry_run: bool, progress: &mut dyn FnMut(u64, u64)) -> Result<Value, String> {
    let vol = pool.volume_id(name).ok_or_else(|| EngineError::NoSuchVolume(name.to_string()).to_string())?;
    let before = pool.volume_info(vol).ok_or("volume vanished")?.allocated;
    let (fs, summary, count) = with_snapshot(pool, name, SNAPSHOT, |snap| reclaim_from(pool, snap, dry_run, progress))?;
    pool.flush().map_err(|e| e.to_string())?;
    let after = pool.volume_info(vol).ok_or("volume vanished")?.allocated;
    let bs = u64::from(summary.block_size);
    Ok(json!({
        "volume": name, "file_system": fs, "dry_run": dry_run, "block_size": bs,
        "fs_bytes": summary.fs_blocks * bs, "fs_free_bytes": summary.free_blocks * bs,
        "fs_used_bytes": (summary.fs_blocks - summary.free_blocks) * bs,
        "reclaimed_bytes": count.unmapped * 4096, "kept_changed_bytes": count.kept_changed * 4096,
        "allocated_before": before, "allocated_after": after,
    }))
}

type Found = (&'static str, FreeSummary, ReclaimCount);

fn reclaim_from(
    pool: &Pool,
    snap: &Snapshot,
    dry_run: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Found, String> {
    let (vol, epoch) = (snap.vol, snap.epoch);
    let mut src = ViewSource { pool, vol, view: View::Snapshot(epoch), size: snap.size };
    let (sb, groups) = open_ext(&mut src, true)?;
    let fs_bytes = sb.blocks_count * u64::from(sb.block_size);
    let mut count = ReclaimCount::default();
    let mut batch: Vec<(u64, u64)> = Vec::with_capacity(BATCH);
    let mut engine_error = None;
    let mut send = |batch: &mut Vec<(u64, u64)>, count: &mut ReclaimCount| -> Result<(), ExtError> {
        let c = pool.trim_unchanged_since(vol, epoch, batch, !dry_run).map_err(|e| {
            let message = e.to_string();
            engine_error = Some(message.clone());
            ExtError::Read { offset: batch[0].0, message }
        })?;
        count.unmapped += c.unmapped;
        count.kept_changed += c.kept_changed;
        batch.clear();
        Ok(())
    };
    let walked = free_byte_ranges(&mut src, &groups, &mut |offset, len| {
        batch.push((offset, len));
        if batch.len() == BATCH {
            send(&mut batch, &mut count)?;
            progress((offset + len) / 4096, fs_bytes / 4096);
        }
        Ok(())
    });
    let summary = match walked {
        Ok(s) if batch.is_empty() => s,
        Ok(s) => send(&mut batch, &mut count).map(|_| s).map_err(|e| e.to_string())?,
        Err(e) => return Err(engine_error.unwrap_or_else(|| e.to_string())),
    };
    progress(fs_bytes / 4096, fs_bytes / 4096);
    Ok((fs_kind(&sb), summary, count))
}
