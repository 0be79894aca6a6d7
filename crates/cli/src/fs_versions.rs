//! `tarn fs snap ...` and `tarn mount NAME@SNAP`: volume snapshots of
//! file volumes (tarn-fs `snap`), on an offline pool.

use crate::{open_file_volume, print, PoolArg};
use anyhow::{Context, Result};
use clap::Subcommand;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Subcommand)]
pub enum FsSnapCmd {
    /// Snapshot a whole file volume: nothing is copied, one commit.
    Create {
        volume: String,
        name: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// A file volume's snapshots, oldest first, with their numbers.
    List {
        volume: String,
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot: frees what only it held.
    Delete {
        volume: String,
        name: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Snapshot one regular file: a version of it alone, listed in `PATH@`
    /// (numbered from the volume snapshots' counter); nothing is copied.
    File {
        volume: String,
        /// The file's path in the volume (from its root).
        path: String,
        /// An optional label (at most 64 bytes).
        name: Option<String>,
        #[command(flatten)]
        pool: PoolArg,
    },
}

pub fn snap(cmd: FsSnapCmd) -> Result<i32> {
    match cmd {
        FsSnapCmd::Create { volume, name, pool } => {
            let s = with_volume(&pool, &volume, |fv| Ok(fv.snap_create(&name)?))
                .with_context(|| format!("snapshot {volume} as {name}"))?;
            println!("created snapshot {volume}@{name} (number {})", s.number);
        }
        FsSnapCmd::List { volume, pool, json } => {
            let list = with_volume(&pool, &volume, |fv| Ok(fv.snap_list()?))?;
            let v: Vec<Value> =
                list.iter().map(|s| json!({"name": s.name, "number": s.number, "created": s.created})).collect();
            print(json, &Value::Array(v), |v| {
                let mut out = String::from("NUMBER  NAME  CREATED\n");
                for s in v.as_array().into_iter().flatten() {
                    out.push_str(&format!("{}  {}  {}\n", s["number"], s["name"].as_str().unwrap_or(""), s["created"]));
                }
                out
            });
        }
        FsSnapCmd::Delete { volume, name, pool } => {
            with_volume(&pool, &volume, |fv| Ok(fv.snap_delete(&name)?))
                .with_context(|| format!("delete snapshot {volume}@{name}"))?;
            println!("deleted snapshot {volume}@{name}");
        }
        FsSnapCmd::File { volume, path, name, pool } => {
            let label = name.unwrap_or_default();
            let s = with_volume(&pool, &volume, |fv| Ok(fv.snap_file(fv.resolve(&path)?, &label)?))
                .with_context(|| format!("snapshot file {path} of {volume}"))?;
            println!("created file version {path}@{} in {volume}", s.number);
        }
    }
    Ok(0)
}

/// Run `f` on the live file volume, then commit and close the pool.
fn with_volume<T>(p: &PoolArg, name: &str, f: impl FnOnce(&tarn_fs::FileVolume) -> Result<T>) -> Result<T> {
    let (pool, lock, fv) = open_file_volume(p, name)?;
    let out = f(&fv);
    drop(fv);
    pool.close().context("close the pool")?;
    drop(lock);
    out
}

/// `tarn mount NAME` (live, writable) or `NAME@SNAP` (read-only).
pub fn open_for_mount(
    p: &PoolArg,
    name: &str,
) -> Result<(Arc<tarn_engine::Pool>, crate::poolfile::PoolLock, tarn_fs::FileVolume)> {
    let Some((volume, snap)) = name.split_once('@') else {
        return open_file_volume(p, name);
    };
    let (pool, lock, live) = open_file_volume(p, volume)?;
    drop(live);
    let fv = tarn_fs::FileVolume::open_snapshot(pool.clone(), volume, snap)
        .with_context(|| format!("open snapshot {snap} of file volume {volume}"))?;
    Ok((pool, lock, fv))
}
