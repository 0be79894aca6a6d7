//! Administrative requests, executed on an open pool. The same requests run
//! locally (pool opened by the CLI) or inside `tarn serve` over its control
//! socket, so a running server never has to be stopped to manage volumes.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tarn_engine::{Pool, PoolStatus, VolumeInfo};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Status,
    Check,
    Flush,
    VolList,
    VolCreate { name: String, size: u64 },
    VolResize { name: String, size: u64, allow_shrink: bool },
    VolDelete { name: String },
}

impl Request {
    /// Whether the request changes the pool (a local run must open it writable).
    pub fn writes(&self) -> bool {
        matches!(
            self,
            Request::Flush | Request::VolCreate { .. } | Request::VolResize { .. } | Request::VolDelete { .. }
        )
    }
}

pub fn execute(pool: &Pool, req: &Request) -> Result<Value, String> {
    let e = |e: tarn_engine::EngineError| e.to_string();
    Ok(match req {
        Request::Status => status_json(&pool.status()),
        Request::Check => {
            let r = pool.check();
            json!({
                "clean": r.is_clean(), "problems": r.problems, "notes": r.notes,
                "volumes": r.volumes, "extents": r.extents,
                "mapped_bytes": r.mapped_blocks * 4096, "free_bytes": r.free_blocks * 4096,
                "checkpoint_bytes": r.metadata_blocks * 4096,
            })
        }
        Request::Flush => {
            pool.flush().map_err(e)?;
            json!({})
        }
        Request::VolList => Value::Array(pool.list_volumes().iter().map(volume_json).collect()),
        Request::VolCreate { name, size } => volume_json(&pool.create_volume(name, *size).map_err(e)?),
        Request::VolResize { name, size, allow_shrink } => {
            volume_json(&pool.resize_volume(name, *size, *allow_shrink).map_err(e)?)
        }
        Request::VolDelete { name } => {
            pool.delete_volume(name, false).map_err(e)?;
            json!({ "deleted": name })
        }
    })
}

pub fn volume_json(v: &VolumeInfo) -> Value {
    json!({ "name": v.name, "id": v.id, "size": v.size, "allocated": v.allocated, "extents": v.extents })
}

pub fn status_json(s: &PoolStatus) -> Value {
    json!({
        "uuid": s.uuid,
        "size": s.size, "used": s.used, "free": s.free, "reserved": s.reserved, "freeing": s.freeing,
        "metadata": s.metadata, "journal_size": s.journal_size,
        "volumes": s.volumes, "virtual_size": s.virtual_size, "overcommit_ratio": s.overcommit_ratio,
        "epoch": s.epoch, "commit_seq": s.commit_seq, "placement": s.placement, "strict": s.strict,
        "notes": s.notes,
        "devices": s.devices.iter().map(|d| json!({
            "index": d.index, "path": d.path, "size": d.size, "data": d.data_bytes, "free": d.free_bytes,
        })).collect::<Vec<_>>(),
    })
}
