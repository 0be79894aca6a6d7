//! `tarn fs layout-policy VOL add|remove|list`: per-file placement and
//! protection rules (tarn-fs `layout.rs`), on an offline pool.

use crate::fs_versions::with_volume;
use crate::{print, PoolArg};
use anyhow::{Context, Result};
use clap::Subcommand;
use serde_json::json;
use tarn_fs::LayoutSpec;

/// `tarn fs layout-policy FS add|remove|list ...`.
#[derive(clap::Args)]
pub struct FsLayoutArgs {
    volume: String,
    #[command(subcommand)]
    action: FsLayoutCmd,
}

#[derive(Subcommand)]
pub enum FsLayoutCmd {
    /// Add a rule at the end (first match wins; `*.db` a name pattern,
    /// `db/` a subtree, `!*.tmp` keeps the default): a regular file it
    /// matches gets this layout when its data object is made (its first
    /// open for writing with no data yet). Give at least one setting.
    Add {
        rule: String,
        /// Its files' own placement.
        #[arg(long, value_parser = crate::parse_placement)]
        placement: Option<tarn_engine::PlacementKind>,
        /// Its files' data goes only to mirrored members (of --devices, if given).
        #[arg(long)]
        mirrored: bool,
        /// Members its files' data goes to, by index (`0,2`).
        #[arg(long, value_parser = crate::members::parse_device_list)]
        devices: Option<u16>,
        /// Stripe its files over N members in units of UNIT bytes (default 64K).
        #[arg(long, value_name = "N[:UNIT]", value_parser = crate::parse_stripe)]
        stripe: Option<(u32, u64)>,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// Remove a rule, written as it was added.
    Remove {
        rule: String,
        #[command(flatten)]
        pool: PoolArg,
    },
    /// The rules in order, each with its layout.
    List {
        #[command(flatten)]
        pool: PoolArg,
        #[arg(long)]
        json: bool,
    },
}

/// `tarn fs layout-policy ...`: stored in the volume, one commit per change.
pub fn layout_policy(args: FsLayoutArgs) -> Result<i32> {
    let volume = args.volume;
    match args.action {
        FsLayoutCmd::Add { rule, placement, mirrored, devices, stripe, pool } => {
            let spec = LayoutSpec { placement, mirrored, devices: devices.unwrap_or(0), stripe };
            with_volume(&pool, &volume, |fv| Ok(fv.layout_add(&rule, spec)?))
                .with_context(|| format!("add layout rule {rule:?} to {volume}"))?;
            println!("added layout rule {rule:?} ({}) to {volume}", spec.text());
        }
        FsLayoutCmd::Remove { rule, pool } => {
            with_volume(&pool, &volume, |fv| Ok(fv.layout_remove(&rule)?))
                .with_context(|| format!("remove layout rule {rule:?} from {volume}"))?;
            println!("removed layout rule {rule:?} from {volume}");
        }
        FsLayoutCmd::List { pool, json } => {
            let rules = with_volume(&pool, &volume, |fv| Ok(fv.layout_policy()?))?;
            let list: Vec<_> = rules.iter().map(|r| json!({"rule": r.rule.text(), "layout": r.spec.text()})).collect();
            print(json, &json!({ "rules": list }), |v| {
                let mut out = String::new();
                for r in v["rules"].as_array().into_iter().flatten() {
                    let layout = r["layout"].as_str().filter(|l| !l.is_empty()).unwrap_or("default");
                    out.push_str(&format!("{}  {layout}\n", r["rule"].as_str().unwrap_or("")));
                }
                out
            });
        }
    }
    Ok(0)
}
