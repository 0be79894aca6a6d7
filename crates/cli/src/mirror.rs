//! Mirrors on the command line: `mirror:A,B` member specs, finding the legs
//! of an existing pool (a missing leg is left out: the engine opens the
//! mirror DEGRADED), and `tarn pool replace`.

use crate::admin::Request;
use crate::progress::Progress;
use crate::PoolArg;
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tarn_engine::{Device, Pool};

/// A `--device` value: `PATH`, or `mirror:PATH,PATH[,...]`.
pub fn parse_member(s: &str) -> Result<Vec<PathBuf>, String> {
    let Some(list) = s.strip_prefix("mirror:") else {
        return Ok(vec![PathBuf::from(s)]);
    };
    let legs: Vec<PathBuf> = list.split(',').map(PathBuf::from).collect();
    if legs.len() < 2 || legs.iter().any(|p| p.as_os_str().is_empty()) {
        return Err(format!("{s:?}: a mirror takes two or more comma-separated paths, none empty"));
    }
    Ok(legs)
}

/// Same file? (Paths recorded absolute; the user may give them relative.)
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// The devices of every member: `primary` (opened) plus what the primary's
/// superblock records, with `overrides` for moved plain members. A mirror
/// leg that cannot be opened is left out with a warning; a plain member that
/// cannot be opened is an error.
pub fn open_members(
    primary: &Path,
    first: Arc<dyn Device>,
    overrides: &[PathBuf],
    writable: bool,
) -> Result<Vec<Vec<Arc<dyn Device>>>> {
    let recorded = Pool::member_legs(first.as_ref())?;
    let first_dev = first.clone();
    let mut slots: Vec<Vec<Arc<dyn Device>>> = vec![vec![first]];
    // A mirrored primary: its other legs too (a plain one is `primary` itself,
    // even when it moved or is a copy of the recorded path).
    let primary_legs = recorded.first().filter(|legs| legs.len() > 1).into_iter().flatten();
    for leg in primary_legs.filter(|p| !same_file(Path::new(p), primary)) {
        if let Some(dev) = open_leg(0, Path::new(leg), writable) {
            slots[0].push(dev);
        }
    }
    let spares = Pool::spare_members(first_dev.as_ref())?;
    for (i, legs) in recorded.iter().enumerate().skip(1) {
        if spares.get(i) == Some(&true) {
            // A spare holds no data: the pool opens without it (the engine
            // notes it MISSING and never takes it).
            slots.push(open_or_none(
                &PathBuf::from(&legs[0]),
                writable,
                &format!("spare device {i}"),
                "it will not be taken",
            ));
            continue;
        }
        if legs.len() == 1 {
            let path = overrides.get(i - 1).cloned().unwrap_or_else(|| PathBuf::from(&legs[0]));
            // A member that cannot be opened: the engine opens the pool
            // DEGRADED without it (parity volumes rebuild its blocks, other
            // blocks on it fail with EIO) and says so in `pool status`.
            slots.push(open_or_none(&path, writable, &format!("member device {i}"), "continuing DEGRADED"));
            continue;
        }
        slots.push(legs.iter().filter_map(|p| open_leg(i, Path::new(p), writable)).collect());
    }
    Ok(slots)
}

/// The device at `path` as a slot of one, or an empty slot (the pool
/// opens without it) with a warning naming `what` and `then`.
fn open_or_none(path: &Path, writable: bool, what: &str, then: &str) -> Vec<Arc<dyn Device>> {
    match crate::devices::open(path, writable) {
        Ok(dev) => vec![dev],
        Err(e) => {
            eprintln!("tarn: warning: {what} at {} cannot be opened ({e:#}); {then}", path.display());
            Vec::new()
        }
    }
}

fn open_leg(member: usize, path: &Path, writable: bool) -> Option<Arc<dyn Device>> {
    match crate::devices::open(path, writable) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!(
                "tarn: warning: mirror leg {} of member {member} cannot be opened ({e}); continuing DEGRADED",
                path.display()
            );
            None
        }
    }
}

/// `tarn pool replace OLD NEW`: online through a running server, else on
/// the pool directly; a progress bar (or lines) while it resilvers a leg
/// or rebuilds a missing member from parity rows.
pub fn replace(
    pool: &PoolArg,
    old: &str,
    new: &Path,
    size: Option<u64>,
    rate: Option<u64>,
) -> Result<serde_json::Value> {
    let dev = crate::devices::NewDevice::ensure(new, size)?;
    // A leg is named by its uuid or by its path (recorded absolute); a
    // member by its index or its path.
    let is_uuid = old.len() == 36 && old.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    let is_index = !old.is_empty() && old.chars().all(|c| c.is_ascii_digit());
    let old = if is_uuid || is_index { old.to_string() } else { crate::absolute(Path::new(old)) };
    let req = Request::PoolReplace { old, new: crate::absolute(new), rate };
    // The bar's name: a member named by index is rebuilt from parity rows
    // (a path may name either; the name is only the bar's).
    let mut bar = Progress::new(if is_index { "replace" } else { "resilver" });
    let mut started = false;
    let v = crate::admin_progress(pool, &req, &mut |done, total| {
        started = true;
        bar.update(done, total);
    });
    bar.finish();
    // A refusal leaves nothing behind; once progress came, the pool names
    // the device (a server killed mid-rebuild resumes onto it): kept.
    if v.is_err() && !started {
        dev.discard();
    }
    v
}

/// Run on the pool (server side or local): open `new` and resilver onto
/// it, or rebuild a missing member onto it from parity rows.
pub fn execute_replace(
    pool: &Pool,
    old: &str,
    new: &str,
    rate: Option<u64>,
    progress: &mut dyn FnMut(u64, u64),
    abandoned: &dyn Fn() -> bool,
) -> Result<serde_json::Value, String> {
    if let Some(index) = pool.member_to_rebuild(old) {
        return execute_rebuild(pool, index, new, rate, progress, abandoned);
    }
    if let Some(index) = pool.member_to_replace(old) {
        return execute_copy(pool, index, new, rate, progress, abandoned);
    }
    let dev = crate::devices::open(Path::new(new), true).map_err(|e| format!("{e:#}"))?;
    let r = pool.replace_leg(old, dev, new, progress).map_err(|e| e.to_string())?;
    let mib_s = if r.seconds > 0.0 { r.copied_bytes as f64 / r.seconds / (1 << 20) as f64 } else { 0.0 };
    Ok(serde_json::json!({
        "member": r.member, "leg": r.leg, "old": r.old, "new": r.new,
        "copied_bytes": r.copied_bytes, "seconds": r.seconds, "mib_per_second": mib_s,
    }))
}

/// Run `work` with a callback that reports progress, holds the pace to
/// `rate` bytes per second, yields to clients (`service::pace`) and stops
/// once `abandoned`; its result and the seconds it took.
fn throttled<R>(
    pool: &Pool,
    rate: Option<u64>,
    progress: &mut dyn FnMut(u64, u64),
    abandoned: &dyn Fn() -> bool,
    work: impl FnOnce(&mut dyn FnMut(u64, u64) -> bool) -> tarn_engine::Result<R>,
) -> Result<(R, f64), String> {
    let started = std::time::Instant::now();
    let mut pace = tarn_engine::service::pace::Pace::new(pool, rate);
    let mut go_on = |done: u64, total: u64| {
        progress(done, total);
        pace.after_step(done * 4096);
        !abandoned()
    };
    let r = work(&mut go_on).map_err(|e| e.to_string())?;
    Ok((r, started.elapsed().as_secs_f64()))
}

/// Put `new` in the place of missing member `index` (unless it is there
/// already: a rebuild cut by a stop or a crash goes on) and rebuild every
/// block parity volumes hold there, at most `rate` bytes per second.
fn execute_rebuild(
    pool: &Pool,
    index: usize,
    new: &str,
    rate: Option<u64>,
    progress: &mut dyn FnMut(u64, u64),
    abandoned: &dyn Fn() -> bool,
) -> Result<serde_json::Value, String> {
    let onto = pool.rebuilding_onto(index);
    let resumed = onto.is_some();
    if let Some(onto) = onto.filter(|o| o.as_str() != new) {
        return Err(format!("member {index} is being rebuilt onto {onto}: give that device to resume it"));
    }
    if !resumed {
        let dev = crate::devices::open(Path::new(new), true).map_err(|e| format!("{e:#}"))?;
        pool.replace_member(index, dev, new).map_err(|e| e.to_string())?;
        crate::logging::notice(&format!("member {index}: {new} takes its place; rebuilding from parity rows"));
    }
    let (r, seconds) = throttled(pool, rate, progress, abandoned, |go_on| pool.rebuild_member(index, go_on))?;
    let bytes = r.rebuilt * 4096;
    crate::logging::notice(&format!(
        "member {index}: {} rebuilt from parity rows in {seconds:.1}s{}",
        crate::size::human(bytes),
        if r.stopped { " (stopped: `pool replace` again resumes it)" } else { "" }
    ));
    Ok(serde_json::json!({
        "member": index, "new": new, "rebuilt_bytes": bytes, "gone_blocks": r.gone, "lost_blocks": r.lost,
        "blocks": r.blocks, "stopped": r.stopped, "resumed": resumed, "seconds": seconds,
        "mib_per_second": bytes as f64 / 1048576.0 / seconds.max(1e-9),
    }))
}

/// Copy present member `index` onto `new` (unless that copy is under way
/// already: a copy cut by a stop or a crash goes on), at most `rate` bytes
/// per second; `new` then takes its index and the old device its label off.
fn execute_copy(
    pool: &Pool,
    index: usize,
    new: &str,
    rate: Option<u64>,
    progress: &mut dyn FnMut(u64, u64),
    abandoned: &dyn Fn() -> bool,
) -> Result<serde_json::Value, String> {
    let onto = pool.replacing_onto(index);
    let resumed = onto.is_some();
    if let Some(onto) = onto.filter(|o| o.as_str() != new) {
        return Err(format!("member {index} is being replaced by {onto}: give that device to resume it"));
    }
    let old = pool.devices().get(index).map(|d| d.name()).unwrap_or_default();
    if !resumed {
        let dev = crate::devices::open(Path::new(new), true).map_err(|e| format!("{e:#}"))?;
        pool.replace_present(index, dev, new).map_err(|e| e.to_string())?;
        crate::logging::notice(&format!("member {index} ({old}): being copied onto {new}"));
    }
    let (r, seconds) = throttled(pool, rate, progress, abandoned, |go_on| pool.copy_member(index, go_on))?;
    let bytes = (r.copied + r.reconstructed) * 4096;
    crate::logging::notice(&format!(
        "member {index}: {} copied onto {new} in {seconds:.1}s{}",
        crate::size::human(bytes),
        if r.stopped { " (stopped: `pool replace` again resumes it)" } else { "" }
    ));
    Ok(serde_json::json!({
        "member": index, "old": old, "new": new, "copied_bytes": r.copied * 4096,
        "reconstructed_blocks": r.reconstructed, "lost_blocks": r.lost, "blocks": r.blocks,
        "stopped": r.stopped, "resumed": resumed, "seconds": seconds,
        "mib_per_second": bytes as f64 / 1048576.0 / seconds.max(1e-9),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_specs() {
        assert_eq!(parse_member("a.img"), Ok(vec![PathBuf::from("a.img")]));
        assert_eq!(parse_member("mirror:a,b"), Ok(vec![PathBuf::from("a"), PathBuf::from("b")]));
        assert!(parse_member("mirror:a").is_err());
        assert!(parse_member("mirror:a,").is_err());
    }
}
