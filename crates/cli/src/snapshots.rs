//! The snapshot commands: `tarn snap ...`, `tarn diff`, and the volume
//! commands that involve snapshots (clone, flatten, recursive delete).

use crate::admin::Request;
use crate::progress::Progress;
use crate::size::human;
use crate::spec::{SnapSpec, ViewSpec};
use crate::{admin, admin_progress, print, print_json, text, DiffCmd, PoolArg, SnapCmd};
use anyhow::{bail, Result};
use serde_json::Value;

pub fn snap(cmd: SnapCmd) -> Result<i32> {
    match cmd {
        SnapCmd::Create { snap, pool, json } => {
            let v = admin(&pool, &Request::SnapCreate { volume: snap.volume, name: snap.name })?;
            print(json, &v, text::snapshot);
        }
        SnapCmd::List { volume, pool, json } => {
            let v = admin(&pool, &Request::SnapList { volume: volume.clone() })?;
            if json {
                print_json(&v);
            } else {
                let vols = admin(&pool, &Request::VolList)?;
                print!("{}", text::snapshots(&v, &vols, volume.as_deref()));
            }
        }
        SnapCmd::Delete { snap, pool, json } => {
            let v = admin(&pool, &Request::SnapDelete { volume: snap.volume.clone(), name: snap.name.clone() })?;
            let freed = v["freed"].as_u64().unwrap_or(0);
            if json {
                print_json(&v);
            } else {
                println!("deleted snapshot {snap}: freed {freed} bytes ({})", human(freed));
            }
        }
        SnapCmd::Rollback { snap, destroy_newer, pool } => rollback(&pool, &snap, destroy_newer)?,
    }
    Ok(0)
}

fn rollback(pool: &PoolArg, snap: &SnapSpec, destroy_newer: bool) -> Result<()> {
    let req = Request::SnapRollback { volume: snap.volume.clone(), name: snap.name.clone(), destroy_newer };
    let v = admin(pool, &req)?;
    println!("volume {} rolled back to {snap}", snap.volume);
    let destroyed = names(&v["destroyed"]);
    if !destroyed.is_empty() {
        println!("destroyed newer snapshots: {}", destroyed.join(", "));
    }
    let connected = v["connected"].as_u64().unwrap_or(0);
    if connected > 0 {
        // Like zfs rollback: allowed, but a client's cached view is now stale.
        eprintln!(
            "tarn: warning: {connected} NBD connection(s) to {} saw its contents change under them; \
             reconnect them (file systems should be remounted)",
            snap.volume
        );
    }
    Ok(())
}

pub fn vol_delete(pool: &PoolArg, name: String, recursive: bool) -> Result<i32> {
    let v = admin(pool, &Request::VolDelete { name: name.clone(), recursive })?;
    let snaps = names(&v["snapshots_deleted"]);
    if snaps.is_empty() {
        println!("deleted volume {name}");
    } else {
        println!("deleted volume {name} and its snapshots {}", snaps.join(", "));
    }
    Ok(0)
}

pub fn vol_clone(pool: &PoolArg, origin: SnapSpec, name: String, force: bool, json: bool) -> Result<i32> {
    let req = Request::VolClone { volume: origin.volume.clone(), snapshot: origin.name.clone(), clone: name, force };
    let v = admin(pool, &req)?;
    print(json, &v, |v| {
        let (name, size) = text::name_and_size(v);
        format!("created volume {name} ({size}) as a clone of {}\n", v["origin"].as_str().unwrap_or("?"))
    });
    Ok(0)
}

pub fn vol_flatten(pool: &PoolArg, name: String) -> Result<i32> {
    let mut bar = Progress::new(&format!("flatten {name}"));
    let result = admin_progress(pool, &Request::VolFlatten { name: name.clone() }, &mut |d, t| bar.update(d, t));
    bar.finish();
    let v = result?;
    let allocated = v["volume"]["allocated"].as_u64().unwrap_or(0);
    match v["detached_from"].as_str() {
        Some(o) => println!("volume {name} flattened: independent of {o}, {} allocated", human(allocated)),
        None => println!("volume {name} flattened: {} allocated", human(allocated)),
    }
    Ok(0)
}

pub fn diff(d: DiffCmd) -> Result<i32> {
    let to = match d.to {
        None => None,
        Some(ViewSpec::Head(v)) if v == d.from.volume => None,
        Some(ViewSpec::Snapshot(s)) if s.volume == d.from.volume => Some(s.name),
        Some(other) => bail!(
            "diff compares two views of one volume: {} is of volume {}, {} of volume {}",
            d.from,
            d.from.volume,
            view_name(&other),
            other.volume()
        ),
    };
    let v = admin(&d.pool, &Request::Diff { volume: d.from.volume, from: d.from.name, to })?;
    print(d.json, &v, text::diff);
    Ok(0)
}

fn view_name(v: &ViewSpec) -> String {
    match v {
        ViewSpec::Head(name) => name.clone(),
        ViewSpec::Snapshot(s) => s.to_string(),
    }
}

fn names(v: &Value) -> Vec<&str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str).collect()
}
