//! `tarn fs snap ...` and `tarn mount NAME@SNAP`: volume snapshots of
//! file volumes (tarn-fs `snap`), on an offline pool.

use crate::{open_file_volume, open_file_volume_with, print, PoolArg};
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
        /// File and close versions too (with their kind and inode), those
        /// of deleted files included.
        #[arg(long)]
        all: bool,
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

/// `tarn fs version-policy FS add|remove|list|keep ...`.
#[derive(clap::Args)]
pub struct FsPolicyArgs {
    volume: String,
    #[command(subcommand)]
    action: FsPolicyCmd,
}

#[derive(Subcommand)]
pub enum FsPolicyCmd {
    /// Add a rule at the end (first match wins): `*.c` a name pattern,
    /// `src/` a subtree, `!*.o` excludes.
    Add {
        rule: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Remove a rule, written as it was added.
    Remove {
        rule: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// The rules in order, and the close versions kept per file.
    List {
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
    /// Close versions kept per file (1 to 1024; default 16): older ones
    /// are deleted at the file's next close.
    Keep {
        count: u32,
        #[command(flatten)]
        pool: PoolArg,
    },
}

/// `tarn fs version-policy ...`: the open-close versioning policy, stored
/// in the volume (one commit per change).
pub fn policy(args: FsPolicyArgs) -> Result<i32> {
    let volume = args.volume;
    match args.action {
        FsPolicyCmd::Add { rule, pool } => {
            with_volume(&pool, &volume, |fv| Ok(fv.policy_add(&rule)?))
                .with_context(|| format!("add version rule {rule:?} to {volume}"))?;
            println!("added version rule {rule:?} to {volume}");
        }
        FsPolicyCmd::Remove { rule, pool } => {
            with_volume(&pool, &volume, |fv| Ok(fv.policy_remove(&rule)?))
                .with_context(|| format!("remove version rule {rule:?} from {volume}"))?;
            println!("removed version rule {rule:?} from {volume}");
        }
        FsPolicyCmd::List { pool, json } => {
            let (rules, keep, slots) =
                with_volume(&pool, &volume, |fv| Ok((fv.policy()?, fv.keep(), fv.version_log_slots())))?;
            let rules: Vec<String> = rules.iter().map(|r| r.text()).collect();
            let v = json!({"rules": rules, "keep": keep, "log_slots": slots});
            print(json, &v, |v| {
                let mut out =
                    format!("keep {} close versions per file (version log: {} slots)\n", v["keep"], v["log_slots"]);
                for r in v["rules"].as_array().into_iter().flatten() {
                    out.push_str(&format!("{}\n", r.as_str().unwrap_or("")));
                }
                out
            });
        }
        FsPolicyCmd::Keep { count, pool } => {
            with_volume(&pool, &volume, |fv| Ok(fv.set_keep(count)?))
                .with_context(|| format!("keep {count} close versions per file in {volume}"))?;
            println!("{volume} keeps {count} close versions per file");
        }
    }
    Ok(0)
}

pub fn snap(cmd: FsSnapCmd) -> Result<i32> {
    match cmd {
        FsSnapCmd::Create { volume, name, pool } => {
            let s = with_volume(&pool, &volume, |fv| Ok(fv.snap_create(&name)?))
                .with_context(|| format!("snapshot {volume} as {name}"))?;
            println!("created snapshot {volume}@{name} (number {})", s.number);
        }
        FsSnapCmd::List { volume, pool, json, all } => {
            let list = with_volume(&pool, &volume, |fv| Ok(if all { fv.versions()? } else { fv.snap_list()? }))?;
            let v: Vec<Value> = list
                .iter()
                .map(|s| {
                    let mut e = json!({"name": s.name, "number": s.number, "created": s.created});
                    if all {
                        e["kind"] = json!(s.kind.as_str());
                        e["inode"] = json!(s.owner);
                    }
                    e
                })
                .collect();
            print(json, &Value::Array(v), |v| {
                // Rows carry a kind only when --all asked for it.
                let all = v.as_array().and_then(|l| l.first()).is_some_and(|e| e.get("kind").is_some());
                let mut out =
                    String::from(if all { "NUMBER  KIND  INODE  NAME  CREATED\n" } else { "NUMBER  NAME  CREATED\n" });
                for s in v.as_array().into_iter().flatten() {
                    let kind = if all {
                        format!("{}  {}  ", s["kind"].as_str().unwrap_or(""), s["inode"])
                    } else {
                        String::new()
                    };
                    let name = s["name"].as_str().unwrap_or("");
                    out.push_str(&format!("{}  {kind}{name}  {}\n", s["number"], s["created"]));
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
pub(crate) fn with_volume<T>(p: &PoolArg, name: &str, f: impl FnOnce(&tarn_fs::FileVolume) -> Result<T>) -> Result<T> {
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
    options: tarn_engine::OpenOptions,
) -> Result<(Arc<tarn_engine::Pool>, crate::poolfile::PoolLock, tarn_fs::FileVolume)> {
    let Some((volume, snap)) = name.split_once('@') else {
        return open_file_volume_with(p, name, options);
    };
    let (pool, lock, live) = open_file_volume_with(p, volume, options)?;
    drop(live);
    let fv = tarn_fs::FileVolume::open_snapshot(pool.clone(), volume, snap)
        .with_context(|| format!("open snapshot {snap} of file volume {volume}"))?;
    Ok((pool, lock, fv))
}
