//! `tarn dev`: member devices of a pool (opening one by path or URI is
//! `devices.rs`). `dev add` runs online through a
//! running server's control socket (the server opens the device), else
//! on the pool directly; the engine's `Pool::add_device` makes it durable
//! with one checkpoint before the command returns.

use crate::admin::Request;
use crate::PoolArg;
use anyhow::Result;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use tarn_engine::{Device, FileDevice};

/// `tarn dev add PATH|rados://CEPHPOOL/PREFIX`: create it (a sparse file
/// or a RADOS device of `size`) if it does not exist, then add it to the
/// pool. A device created here and then refused (too small, say) is
/// removed: a refusal changes nothing.
pub fn add(pool: &PoolArg, path: &Path, size: Option<u64>, spare: bool) -> Result<Value> {
    let dev = crate::devices::NewDevice::ensure(path, size)?;
    let added = crate::admin(pool, &Request::DevAdd { path: crate::absolute(path), spare });
    if added.is_err() {
        dev.discard();
    }
    added
}

/// Run on the pool (server side or local): open `path` (a file, a block
/// device or a RADOS URI) writable and add it (as a spare with `spare`).
pub fn execute_add(pool: &tarn_engine::Pool, path: &str, spare: bool) -> Result<Value, String> {
    let dev: Arc<dyn Device> = if crate::devices::is_rados(Path::new(path)) {
        crate::devices::open(Path::new(path), true).map_err(|e| format!("{e:#}"))?
    } else {
        Arc::new(FileDevice::open(Path::new(path), true).map_err(|e| match e.raw_os_error() {
            // EROFS, EACCES, EPERM: nothing can be written there.
            Some(30 | 13 | 1) => format!("device {path} is read-only ({e}): a member must be writable"),
            _ => format!("open {path}: {e}"),
        })?)
    };
    let r = if spare { pool.add_spare(dev, path) } else { pool.add_device(dev, path) };
    let r = r.map_err(|e| e.to_string())?;
    let what = if spare { "spare" } else { "member" };
    crate::logging::notice(&format!(
        "device {path} added as {what} {}: {} of {}space",
        r.index,
        crate::size::human(r.data_bytes),
        if spare { "spare " } else { "new " }
    ));
    Ok(json!({ "index": r.index, "path": r.path, "data_bytes": r.data_bytes, "spare": spare }))
}

/// `dev add`'s answer as text.
pub fn added(v: &Value) -> String {
    if v["spare"] == true {
        return format!(
            "added {} as spare device {}: {} taken when the pool expands past its growing member's limit\n",
            v["path"].as_str().unwrap_or("?"),
            v["index"],
            crate::size::human(v["data_bytes"].as_u64().unwrap_or(0))
        );
    }
    format!(
        "added {} as device {}: {} of new space, usable now\n",
        v["path"].as_str().unwrap_or("?"),
        v["index"],
        crate::size::human(v["data_bytes"].as_u64().unwrap_or(0))
    )
}

/// Run on the pool (server side or local): grow member `index` to `size`.
pub fn execute_grow(pool: &tarn_engine::Pool, index: usize, size: u64) -> Result<Value, String> {
    let r = pool.grow_device(index, size).map_err(|e| e.to_string())?;
    crate::logging::notice(&format!(
        "device {index} grew from {} to {}",
        crate::size::human(r.old_bytes),
        crate::size::human(r.new_bytes)
    ));
    Ok(json!({ "index": r.index, "old_size": r.old_bytes, "new_size": r.new_bytes }))
}

/// `dev grow`'s answer as text.
pub fn grown(v: &Value) -> String {
    format!(
        "device {} grew from {} to {}, usable now\n",
        v["index"],
        crate::size::human(v["old_size"].as_u64().unwrap_or(0)),
        crate::size::human(v["new_size"].as_u64().unwrap_or(0))
    )
}

/// Run on the pool (server side or local): evacuate member `index`, at
/// most `rate` bytes moved per second, or with `cancel` let allocation
/// use it again (a running evacuation sees that and stops after its
/// current step). Progress in blocks; stops early when the asker goes away.
pub fn execute_remove(
    pool: &tarn_engine::Pool,
    index: usize,
    rate: Option<u64>,
    cancel: bool,
    progress: &mut dyn FnMut(u64, u64),
    abandoned: &dyn Fn() -> bool,
) -> Result<Value, String> {
    if cancel {
        if !pool.is_draining(index) {
            return Err(format!("member {index} is not being removed: nothing to cancel"));
        }
        pool.undrain_device(index).map_err(|e| e.to_string())?;
        crate::logging::notice(&format!("removal of device {index} cancelled: it is a normal member again"));
        return Ok(json!({ "index": index, "cancelled": true }));
    }
    if let Some(path) = pool.removed_path(index) {
        return finish_removed(pool, index, &path);
    }
    if pool.is_spare(index) {
        let r = pool.drop_spare(index).map_err(|e| e.to_string())?;
        crate::logging::notice(&format!("spare {index} ({}) dropped from the pool", r.path));
        return Ok(
            json!({ "index": index, "spare": true, "removed": true, "path": r.path, "label_wiped": r.label_wiped }),
        );
    }
    let started = std::time::Instant::now();
    // At most `rate`, and yielding to clients at any rate (service::pace).
    let mut pace = tarn_engine::service::pace::Pace::new(pool, rate);
    let mut go_on = |moved: u64, live: u64| {
        progress(moved / 4096, live / 4096);
        pace.after_step(moved);
        // A cancel (`dev remove --cancel`) opened the member again.
        !abandoned() && pool.is_draining(index)
    };
    // A batch of at most a second's worth of windows at that rate.
    let batch = tarn_engine::volumes::relayout::batch_for_rate(rate);
    let r = pool.evacuate_device_batched(index, batch, &mut go_on).map_err(|e| e.to_string())?;
    let seconds = started.elapsed().as_secs_f64();
    let cancelled = r.stopped && !pool.is_draining(index);
    crate::logging::notice(&format!(
        "device {index}: {} of {} live data moved in {seconds:.1}s, {} left{}",
        crate::size::human(r.moved_bytes),
        crate::size::human(r.live_bytes),
        crate::size::human(r.remaining_bytes),
        if cancelled { " (cancelled)" } else { "" }
    ));
    Ok(json!({
        "index": index, "live_bytes": r.live_bytes, "moved_bytes": r.moved_bytes,
        "remaining_bytes": r.remaining_bytes, "stopped": r.stopped, "cancelled": cancelled,
        "seconds": seconds, "rate_mib_s": r.moved_bytes as f64 / 1048576.0 / seconds.max(1e-9),
        "client_yields": pace.yields, "rested_seconds": pace.rested.as_secs_f64(),
        "draining": pool.is_draining(index) && !pool.is_removed(index),
        "removed": r.detached.is_some(),
        "label_wiped": r.detached.as_ref().map(|d| d.label_wiped),
        "nodes_moved": r.detached.as_ref().map(|d| d.nodes_moved),
    }))
}

/// `dev remove` of a slot already removed: a crash may have come between
/// the removal's checkpoint and the wipe of the device's label; wipe it
/// now if the device at the recorded path still carries this slot's.
fn finish_removed(pool: &tarn_engine::Pool, index: usize, path: &str) -> Result<Value, String> {
    let wiped = match crate::devices::open(std::path::Path::new(path), true) {
        Ok(dev) => pool.wipe_removed_label(index, dev.as_ref()).map_err(|e| e.to_string())?,
        Err(_) => false,
    };
    if wiped {
        crate::logging::notice(&format!("member {index} was removed; the label left on {path} is wiped"));
    }
    Ok(json!({ "index": index, "removed": true, "already_removed": true, "label_wiped": wiped }))
}

/// `dev remove`'s answer as text.
pub fn removed(v: &Value) -> String {
    if v["spare"] == true {
        let wiped = if v["label_wiped"] == true { "its pool label is wiped" } else { "its label was NOT wiped" };
        return format!(
            "spare device {} ({}) dropped from the pool; {wiped}\n",
            v["index"],
            v["path"].as_str().unwrap_or("?")
        );
    }
    if v["cancelled"] == true && v["live_bytes"].is_null() {
        return format!("removal of device {} cancelled: it is a normal member again\n", v["index"]);
    }
    if v["already_removed"] == true {
        let wiped = if v["label_wiped"] == true { "; the label left on its device is wiped now" } else { "" };
        return format!("device {} is removed already (its slot is empty){wiped}\n", v["index"]);
    }
    let human = |k: &str| crate::size::human(v[k].as_u64().unwrap_or(0));
    let state = if v["cancelled"] == true {
        "cancelled: it is a normal member again".to_string()
    } else if v["removed"] == true {
        let wiped = if v["label_wiped"] == true {
            "its pool label is wiped"
        } else {
            "its label could NOT be wiped (see the log)"
        };
        format!("removed from the pool ({} metadata nodes moved off it); {wiped}", v["nodes_moved"])
    } else if v["remaining_bytes"] == 0 {
        "no live data left on it; it stays draining (new data avoids it)".to_string()
    } else {
        format!("{} of live data still on it", human("remaining_bytes"))
    };
    format!(
        "device {}: moved {} of {} live data at {:.1} MiB/s; {state}\n",
        v["index"],
        human("moved_bytes"),
        human("live_bytes"),
        v["rate_mib_s"].as_f64().unwrap_or(0.0)
    )
}

/// `--devices 0,2` (members by index) or `any`: a set, bit i for member
/// i. Indices are checked against the pool by the engine.
pub fn parse_device_list(s: &str) -> Result<u16, String> {
    if s == "any" {
        return Ok(0);
    }
    let mut set = 0u16;
    for part in s.split(',') {
        let i: usize = part.trim().parse().map_err(|_| format!("{part:?} is not a device index (say 0,2 or any)"))?;
        if i >= tarn_format::superblock::MAX_DEVICE_ENTRIES {
            return Err(format!(
                "device {i}: a pool has at most {} members",
                tarn_format::superblock::MAX_DEVICE_ENTRIES
            ));
        }
        set |= 1 << i;
    }
    Ok(set)
}

/// The answer of `dev set`: the pool status; say what member `index` has now.
pub fn placement_set(status: &Value, index: usize) -> String {
    let placement = status["devices"][index]["placement"].as_str().unwrap_or("none (the pool's default applies)");
    format!("device {index}: placement {placement}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists() {
        assert_eq!(parse_device_list("0,2"), Ok(0b101));
        assert_eq!(parse_device_list("any"), Ok(0));
        assert_eq!(parse_device_list("3"), Ok(8));
        assert!(parse_device_list("x").is_err());
        assert!(parse_device_list("16").is_err());
        assert!(parse_device_list("").is_err());
    }
}
