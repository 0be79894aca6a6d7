//! `tarn map` and `tarn vol map --png/--svg`: ask for the figures (through
//! a running server or on the pool), draw them with `tarn-viz`, write the
//! files, and describe the picture (its legend colours, where each
//! device's grid lies) so a reader or a test can check the pixels.

pub mod layout;

use crate::admin::Request;
use crate::layout::{FREE, JOURNAL, LABELS, METADATA, OUTSIDE, REGION_BLOCKS, VOLUME_BASE};
use crate::size::human;
use crate::PoolArg;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::PathBuf;
use tarn_viz::{palette, pool, Fill, Holder, Rgb, Scene};

/// Where to write a picture, and how wide.
#[derive(clap::Args, Clone)]
pub struct Output {
    /// Write the picture as PNG to FILE.
    #[arg(long, value_name = "FILE")]
    pub png: Option<PathBuf>,
    /// Write the picture as SVG to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Picture width in pixels (the height follows).
    #[arg(long, default_value_t = 1200)]
    pub width: u32,
}

impl Output {
    pub fn wanted(&self) -> bool {
        self.png.is_some() || self.svg.is_some()
    }

    /// Write the scene to every file asked for; their paths.
    fn write(&self, scene: &Scene) -> Result<Vec<String>> {
        let mut files = Vec::new();
        if let Some(p) = &self.png {
            scene.write_png(p)?;
            files.push(p.display().to_string());
        }
        if let Some(p) = &self.svg {
            scene.write_svg(p)?;
            files.push(p.display().to_string());
        }
        Ok(files)
    }
}

/// Rows of cells per device the picture aims at (cells are a power of
/// two of blocks, so a device gets between half and all of them).
const ROWS_PER_DEVICE: u64 = 40;

/// `tarn map`: the pool's devices, block by block.
pub fn pool_map(p: &PoolArg, out: &Output) -> Result<Value> {
    let width = tarn_viz::check_width(out.width)?;
    let cells = u64::from(pool::columns(width)) * ROWS_PER_DEVICE;
    let v = crate::admin(p, &Request::PoolMap { cells })?;
    let map = pool_picture(&v, &p.pool.display().to_string())?;
    let (scene, placed) = pool::draw(&map, width)?;
    let files = out.write(&scene)?;
    let devices: Vec<Value> = v["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(&placed.areas)
        .map(|(d, area)| {
            json!({ "index": d["index"], "path": d["path"], "area": area, "cell_bytes": num(&d["cell_blocks"]) * block(&v),
                    "runs_per_gib": runs_per_gib(d), "regions": d["regions"], "summary": device_stats(d, &v) })
        })
        .collect();
    Ok(
        json!({ "files": files, "width": scene.width, "height": scene.height, "legend": legend(&v), "devices": devices }),
    )
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn block(v: &Value) -> u64 {
    v["block_size"].as_u64().unwrap_or(4096)
}

/// Held runs per GiB of data the device holds: 1 for data in one piece
/// per GiB, 262144 for every 4 KiB block on its own.
fn runs_per_gib(d: &Value) -> f64 {
    let gib = (num(&d["held_blocks"]) * tarn_format::BLOCK_SIZE) as f64 / f64::from(1u32 << 30);
    if gib == 0.0 {
        0.0
    } else {
        num(&d["held_runs"]) as f64 / gib
    }
}

fn device_stats(d: &Value, v: &Value) -> String {
    let r = &d["regions"];
    format!(
        "data {} in {} runs ({:.0} runs/GiB); free {}; 256 KiB regions: {} full, {} partly used, {} free",
        human(num(&d["held_blocks"]) * block(v)),
        num(&d["held_runs"]),
        runs_per_gib(d),
        human(num(&d["free_blocks"]) * block(v)),
        num(&r["full"]),
        num(&r["partial"]),
        num(&r["free"])
    )
}

/// The answer of `Request::PoolMap` as a picture to draw.
fn pool_picture(v: &Value, pool_path: &str) -> Result<pool::PoolMap> {
    let volumes: Vec<String> =
        v["volumes"].as_array().into_iter().flatten().map(|x| x["name"].as_str().unwrap_or("?").to_string()).collect();
    let mut devices = Vec::new();
    for d in v["devices"].as_array().into_iter().flatten() {
        let label = format!(
            "device {}  {}  {}",
            d["index"],
            d["path"].as_str().unwrap_or("?"),
            human(num(&d["blocks"]) * block(v))
        );
        let cells: Result<Vec<pool::Cell>> = d["cells"].as_array().into_iter().flatten().map(cell).collect();
        devices.push(pool::DeviceMap { label, stats: device_stats(d, v), cells: cells?, regions: regions(d) });
    }
    let cell_bytes = v["devices"][0]["cell_blocks"].as_u64().unwrap_or(1) * block(v);
    let notes = vec![
        format!("one cell = {} (device 0); bands in a cell in proportion to its blocks", human(cell_bytes)),
        format!("reserve kept free for metadata: {}", human(num(&v["reserve_blocks"]) * block(v))),
    ];
    Ok(pool::PoolMap { title: format!("tarn pool {pool_path}"), volumes, devices, notes })
}

/// Region starts to mark when a 256 KiB region spans several cells
/// (regions count from the data area's start, as the engine places them).
fn regions(d: &Value) -> Option<(usize, usize, usize)> {
    let cell = num(&d["cell_blocks"]).max(1);
    let per = REGION_BLOCKS / cell;
    (per > 1).then(|| {
        let first = num(&d["data_start"]) / cell;
        (per as usize, first as usize, (num(&d["data_end"]) / cell) as usize)
    })
}

fn cell(c: &Value) -> Result<pool::Cell> {
    let mut out = Vec::new();
    for part in c.as_array().into_iter().flatten() {
        let (code, blocks) = (num(&part[0]) as u32, num(&part[1]));
        out.push((fill(code)?, blocks));
    }
    Ok(out)
}

fn fill(code: u32) -> Result<Fill> {
    Ok(match code {
        LABELS => Fill::Labels,
        JOURNAL => Fill::Journal,
        METADATA => Fill::Metadata,
        FREE => Fill::Free,
        OUTSIDE => Fill::Outside,
        c if c >= VOLUME_BASE => {
            let holder = [Holder::Head, Holder::Shared, Holder::Snapshots][((c - VOLUME_BASE) % 3) as usize];
            Fill::Volume(((c - VOLUME_BASE) / 3) as usize, holder)
        }
        c => bail!("the server sent an unknown kind of space ({c}): is it a newer tarn?"),
    })
}

/// Every colour the picture uses, by what it means.
fn legend(v: &Value) -> Value {
    let volumes: Vec<Value> = v["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, x)| {
            let (head, _) = Fill::Volume(i, Holder::Head).colour();
            let (_, hatch) = Fill::Volume(i, Holder::Shared).colour();
            let (snap, _) = Fill::Volume(i, Holder::Snapshots).colour();
            json!({ "name": x["name"], "colour": hex(head), "shared_hatch": hatch.map(hex), "snapshot_colour": hex(snap) })
        })
        .collect();
    json!({
        "volumes": volumes, "free": hex(palette::FREE), "metadata": hex(palette::METADATA),
        "journal": hex(palette::JOURNAL), "labels": hex(palette::LABELS), "outside": hex(palette::OUTSIDE),
        "grid": hex(palette::GRID), "background": hex(palette::BACKGROUND),
    })
}

fn hex(c: Rgb) -> String {
    c.to_string()
}

/// `tarn vol map VOL --png/--svg`: its runs, logical against physical.
pub fn vol_map(p: &PoolArg, name: &str, out: &Output) -> Result<Value> {
    let width = tarn_viz::check_width(out.width)?;
    let runs = crate::admin(p, &Request::VolMap { name: name.to_string() })?;
    let status = crate::admin(p, &Request::Status)?;
    let size = view_size(p, name)?;
    let bs = tarn_format::BLOCK_SIZE;
    let runs: Vec<tarn_viz::VolumeRun> = runs
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| tarn_viz::VolumeRun {
            lba: num(&r[0]),
            len: num(&r[1]),
            device: num(&r[2]) as usize,
            block: num(&r[3]),
        })
        .collect();
    let devices: Vec<(String, u64)> = status["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| (format!("device {}  {}", d["index"], d["path"].as_str().unwrap_or("?")), num(&d["size"]) / bs))
        .collect();
    let mapped: u64 = runs.iter().map(|r| r.len).sum();
    let title = format!("{name}: {} runs, {} mapped of {}", runs.len(), human(mapped * bs), human(size));
    let label = |blocks: u64| human(blocks * bs);
    let map = tarn_viz::VolumeMap { title, blocks: size / bs, devices, runs, size_label: &label };
    let scene = tarn_viz::volume::draw(&map, width)?;
    let colours: Vec<String> = (0..map.devices.len()).map(|i| hex(tarn_viz::volume_colour(i))).collect();
    let files = out.write(&scene)?;
    Ok(json!({ "files": files, "width": scene.width, "height": scene.height, "runs": map.runs.len(),
               "mapped_bytes": mapped * bs, "device_colours": colours }))
}

/// The size of a volume or of a snapshot (`VOL@SNAP`), from the listings.
fn view_size(p: &PoolArg, name: &str) -> Result<u64> {
    let (vol, snap) = match name.split_once('@') {
        Some((v, s)) => (v, Some(s)),
        None => (name, None),
    };
    let list = match snap {
        None => crate::admin(p, &Request::VolList)?,
        Some(_) => crate::admin(p, &Request::SnapList { volume: Some(vol.to_string()) })?,
    };
    let want = snap.unwrap_or(vol);
    let found = list.as_array().into_iter().flatten().find(|x| x["name"] == want);
    found.and_then(|x| x["size"].as_u64()).with_context(|| format!("no volume or snapshot {name}"))
}

/// Text form of a picture's description.
pub fn text(v: &Value) -> String {
    let files: Vec<&str> = v["files"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let mut s = if files.is_empty() {
        "no picture written (give --png FILE and/or --svg FILE)\n".to_string()
    } else {
        format!("wrote {} ({}x{})\n", files.join(" and "), v["width"], v["height"])
    };
    for x in v["legend"]["volumes"].as_array().into_iter().flatten() {
        s += &format!("  {}  {}\n", x["colour"].as_str().unwrap_or("?"), x["name"].as_str().unwrap_or("?"));
    }
    for d in v["devices"].as_array().into_iter().flatten() {
        s += &format!("  device {}: {}\n", d["index"], d["summary"].as_str().unwrap_or(""));
    }
    s
}
