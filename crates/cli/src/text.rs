//! Text renderings of admin answers (the `--json` forms are the values).

use crate::size::human;
use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

fn b(v: &Value) -> String {
    human(v.as_u64().unwrap_or(0))
}

/// A volume answer's name and human-readable size.
pub fn name_and_size(v: &Value) -> (String, String) {
    (v["name"].as_str().unwrap_or("?").to_string(), b(&v["size"]))
}

pub fn status(v: &Value) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "pool {}  {}", v["uuid"].as_str().unwrap_or("?"), v["state"].as_str().unwrap_or("ONLINE"));
    if v["fenced"] == true {
        let _ = writeln!(s, "  state      FENCED: a commit failed; changes are refused until a restart");
    }
    let _ = writeln!(s, "  size       {} ({} bytes)", b(&v["size"]), v["size"]);
    let _ = writeln!(s, "  used       {} ({} bytes)", b(&v["used"]), v["used"]);
    let _ = writeln!(
        s,
        "  free       {} ({} bytes; {} outside whole regions)",
        b(&v["free"]),
        v["free"],
        b(&v["free_outside_regions"])
    );
    let _ = writeln!(s, "  reserved   {} (kept for metadata)", b(&v["reserved"]));
    let e = &v["expansion"];
    if !e.is_null() {
        let _ = writeln!(
            s,
            "  expansion  at {}% used: device {} grows by {} up to {} ({} so far)",
            e["at_percent"],
            e["device"],
            b(&e["step"]),
            b(&e["max"]),
            e["expansions"]
        );
    }
    let _ = writeln!(s, "  metadata   {} ({} bytes), format {}", b(&v["metadata"]), v["metadata"], v["format"]);
    let c = &v["metadata_cache"];
    let _ = writeln!(
        s,
        "  md cache   {} of {} (budget {}; {} nodes, {} dirty), hit rate {:.1}%, {} misses, {} evictions",
        b(&c["bytes"]),
        b(&c["capacity"]),
        b(&c["budget"]),
        c["nodes"],
        c["dirty_nodes"],
        c["hit_rate"].as_f64().unwrap_or(0.0) * 100.0,
        c["misses"],
        c["evictions"]
    );
    let _ = writeln!(
        s,
        "  volumes    {} ({} virtual, overcommit {:.2}x, limit {}){}",
        v["volumes"],
        b(&v["virtual_size"]),
        v["overcommit_ratio"].as_f64().unwrap_or(0.0),
        overcommit_limit(v),
        match v["file_volumes"].as_u64() {
            Some(n) if n > 0 => format!("; {n} file volumes (`tarn fs list`)"),
            _ => String::new(),
        }
    );
    let _ = writeln!(
        s,
        "  placement  {}{}",
        v["placement"].as_str().unwrap_or("?"),
        if v["strict"] == true { ", strict" } else { "" }
    );
    for d in v["devices"].as_array().into_iter().flatten() {
        if d["state"] == "REMOVED" {
            // `dev remove` took it out; the slot stays so indices keep meaning.
            let _ = writeln!(
                s,
                "  device {}  REMOVED  (was {}; empty slot)",
                d["index"],
                d["path"].as_str().unwrap_or("?")
            );
            continue;
        }
        if matches!(d["state"].as_str(), Some("SPARE" | "MISSING" | "UNAVAIL")) {
            let what = match d["state"].as_str() {
                Some("SPARE") => format!("{}, taken when the pool expands", b(&d["size"])),
                Some("UNAVAIL") => "its device was not found at open: parity volumes read through it by \
                    reconstruction, other data on it fails with EIO, nothing is written there"
                    .to_string(),
                _ => "its device was not found at open: it will not be taken".to_string(),
            };
            let _ = writeln!(
                s,
                "  device {}  {}  {}  ({what})",
                d["index"],
                d["state"].as_str().unwrap_or("?"),
                d["path"].as_str().unwrap_or("?")
            );
            continue;
        }
        let mirrored = d["legs"].as_array().is_some_and(|l| !l.is_empty());
        let _ = writeln!(
            s,
            "  device {}  {}{}  {} data, {} free{}",
            d["index"],
            // A draining member (`dev remove`) says so like a mirror's state.
            if mirrored || d["state"] == "DRAINING" || d["state"] == "REBUILDING" {
                format!("{}  ", d["state"].as_str().unwrap_or("?"))
            } else {
                String::new()
            },
            d["path"].as_str().unwrap_or("?"),
            b(&d["data"]),
            b(&d["free"]),
            d["placement"].as_str().map(|p| format!(", placement {p}")).unwrap_or_default()
        );
        for l in d["legs"].as_array().into_iter().flatten() {
            let _ = writeln!(
                s,
                "    leg {}  {:<11} {}  errors: {} read, {} write; {} blocks healed",
                l["index"],
                l["state"].as_str().unwrap_or("?"),
                l["path"].as_str().unwrap_or("?"),
                l["read_errors"],
                l["write_errors"],
                l["healed_blocks"]
            );
        }
    }
    let _ = writeln!(
        s,
        "  checksums  {}: {} errors, {} read errors, {} healed, {} reconstructed, {} resynced",
        if v["checksums"] == true { "crc32c" } else { "off" },
        v["checksum_errors"],
        v["read_errors"],
        v["healed_blocks"],
        v["reconstructed_blocks"],
        v["resynced_blocks"]
    );
    if v["coarse_sums"] == true {
        let _ = writeln!(
            s,
            "  coarse     one crc32c per whole 64 KiB group written: {} groups written, {} split since open",
            v["coarse_groups"], v["split_groups"]
        );
    }
    for n in v["notes"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "  note: {}", n.as_str().unwrap_or(""));
    }
    s
}

pub fn scrub(v: &Value) -> String {
    let mut s = String::new();
    for l in v["labels_repaired"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "repaired: {}", l.as_str().unwrap_or(""));
    }
    let secs = v["seconds"].as_f64().unwrap_or(0.0);
    let bytes = v["bytes"].as_u64().unwrap_or(0);
    let _ = writeln!(
        s,
        "scrubbed {} in {secs:.1}s ({}/s): {} bad copies, {} repaired, {} blocks lost",
        b(&v["bytes"]),
        human((bytes as f64 / secs.max(1e-6)) as u64),
        v["bad_copies"],
        v["repaired"],
        v["lost_blocks"]
    );
    if v["parity_rows"].as_u64().unwrap_or(0) > 0 {
        let _ = writeln!(
            s,
            "parity: {} rows verified, {} mismatched, {} rebuilt from their row, {} rewritten ({} of the rows in \
             snapshots, verified only)",
            v["parity_rows"],
            v["parity_mismatched"],
            v["parity_rebuilt"],
            v["parity_healed"],
            v["parity_snapshot_rows"].as_u64().unwrap_or(0)
        );
    }
    if v["unsummed_blocks"].as_u64().unwrap_or(0) > 0 {
        let _ = writeln!(s, "{} blocks carry no checksum (written before checksums)", v["unsummed_blocks"]);
    }
    for l in v["lost"].as_array().into_iter().flatten() {
        let view = match l["snapshot"].as_str() {
            Some(snap) => format!("{}@{snap}", l["volume"].as_str().unwrap_or("?")),
            None => l["volume"].as_str().unwrap_or("?").to_string(),
        };
        let _ = writeln!(s, "lost: {view} bytes {}+{}", l["offset"], l["length"]);
    }
    s
}

/// `pool replace`'s answer.
pub fn replaced(v: &Value) -> String {
    if v.get("rebuilt_bytes").is_some() {
        let lost = v["lost_blocks"].as_u64().unwrap_or(0);
        return format!(
            "member {} rebuilt onto {} from parity rows: {} in {:.1}s ({:.0} MiB/s){}{}\n",
            v["member"],
            v["new"].as_str().unwrap_or("?"),
            b(&v["rebuilt_bytes"]),
            v["seconds"].as_f64().unwrap_or(0.0),
            v["mib_per_second"].as_f64().unwrap_or(0.0),
            if lost > 0 {
                format!("; {lost} blocks could not be rebuilt (another unit of their row is lost)")
            } else {
                String::new()
            },
            if v["stopped"] == true { "; stopped, `pool replace` again resumes it" } else { "" }
        );
    }
    if v.get("reconstructed_blocks").is_some() {
        let (rec, lost) = (v["reconstructed_blocks"].as_u64().unwrap_or(0), v["lost_blocks"].as_u64().unwrap_or(0));
        return format!(
            "member {} ({}) {} {}: {} copied in {:.1}s ({:.0} MiB/s){}{}{}\n",
            v["member"],
            v["old"].as_str().unwrap_or("?"),
            if v["stopped"] == true { "being replaced by" } else { "replaced by" },
            v["new"].as_str().unwrap_or("?"),
            b(&v["copied_bytes"]),
            v["seconds"].as_f64().unwrap_or(0.0),
            v["mib_per_second"].as_f64().unwrap_or(0.0),
            if rec > 0 { format!("; {rec} unreadable blocks rebuilt from their parity rows") } else { String::new() },
            if lost > 0 { format!("; {lost} unreadable blocks lost") } else { String::new() },
            if v["stopped"] == true { "; stopped, `pool replace` again resumes it" } else { "" }
        );
    }
    format!(
        "replaced {} with {} (member {} leg {}): resilvered {} in {:.1}s ({:.0} MiB/s)\n",
        v["old"].as_str().unwrap_or("?"),
        v["new"].as_str().unwrap_or("?"),
        v["member"],
        v["leg"],
        b(&v["copied_bytes"]),
        v["seconds"].as_f64().unwrap_or(0.0),
        v["mib_per_second"].as_f64().unwrap_or(0.0)
    )
}

pub fn compacted(v: &Value) -> String {
    let mut s = String::new();
    for c in v["volumes"].as_array().into_iter().flatten() {
        s += &format!(
            "{}: {} -> {} extents, moved {} in {} windows ({} moved out of their way first), {} skipped \
             (written meanwhile or no room); snapshots' own data: moved {} in {} windows\n",
            c["volume"].as_str().unwrap_or("?"),
            c["extents_before"],
            c["extents_after"],
            b(&c["moved_bytes"]),
            c["windows_moved"],
            b(&c["cleared_bytes"]),
            c["windows_skipped"],
            b(&c["snapshot_moved_bytes"]),
            c["snapshot_windows_moved"]
        );
    }
    let r = &v["regions"];
    if !r.is_null() {
        s += &format!(
            "free space: {} whole {} regions free before, {} after; {} partly used regions cleaned \
             ({} freed), moved {}\n",
            r["free_regions_before"],
            b(&r["region_bytes"]),
            r["free_regions_after"],
            r["cleaned"],
            r["freed"],
            b(&r["moved_bytes"])
        );
    }
    s
}

pub fn check(v: &Value) -> String {
    let mut s = String::new();
    for n in v["notes"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "note: {}", n.as_str().unwrap_or(""));
    }
    for p in v["problems"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "PROBLEM: {}", p.as_str().unwrap_or(""));
    }
    let verdict = if v["clean"] == true { "clean" } else { "PROBLEMS FOUND" };
    let _ = writeln!(
        s,
        "{verdict}: {} volumes, {} extents, {} mapped, {} free",
        v["volumes"],
        v["extents"],
        b(&v["mapped_bytes"]),
        b(&v["free_bytes"])
    );
    s
}

/// USED is the volume's own space (head + only in snapshots: what QUOTA
/// counts); SHARED what a clone still reads from its origin.
pub fn volumes(v: &Value) -> String {
    let mut s = format!(
        "{:<24} {:>12} {:>12} {:>8} {:>6} {:>12} {:>12} {:>12} {:>12}  {:<20} {:<12} {}\n",
        "NAME",
        "SIZE",
        "ALLOCATED",
        "EXTENTS",
        "SNAPS",
        "SNAP-BYTES",
        "USED",
        "SHARED",
        "QUOTA",
        "PLACEMENT",
        "ORIGIN",
        "STRIPE"
    );
    for vol in v.as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "{:<24} {:>12} {:>12} {:>8} {:>6} {:>12} {:>12} {:>12} {:>12}  {:<20} {:<12} {}",
            vol["name"].as_str().unwrap_or("?"),
            b(&vol["size"]),
            b(&vol["allocated"]),
            vol["extents"].as_u64().unwrap_or(0),
            vol["snapshots"].as_u64().unwrap_or(0),
            b(&vol["snapshot_bytes"]),
            b(&vol["used"]),
            b(&vol["shared"]),
            quota(vol),
            placement(vol),
            origin(vol),
            stripe(vol)
        );
    }
    s
}

/// A striped volume's layout: `N x UNIT on members`; a parity volume's:
/// `N+1 x UNIT on members`; or "-".
pub fn stripe(vol: &Value) -> String {
    let (s, width) = match &vol["parity"] {
        p if p.is_object() => (p, format!("{}+1", p["data"])),
        _ => (&vol["stripe"], vol["stripe"]["width"].to_string()),
    };
    match s["members"].as_array() {
        Some(m) => {
            format!("{}x{} on {}", width, b(&s["unit"]), m.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","))
        }
        None => "-".into(),
    }
}

/// A volume's quota, or "none".
pub fn quota(vol: &Value) -> String {
    if vol["quota"].is_u64() {
        b(&vol["quota"])
    } else {
        "none".to_string()
    }
}

/// The pool's overcommit limit as a ratio, or "none".
pub fn overcommit_limit(v: &Value) -> String {
    v["overcommit_limit"].as_f64().map_or("none".to_string(), |r| format!("{r:.3}x"))
}

pub fn file_volumes(v: &Value) -> String {
    let mut s = format!("{:<24} {:>10} {:>12}\n", "NAME", "OBJECTS", "USED");
    for f in v.as_array().into_iter().flatten() {
        let (name, objects) = (f["name"].as_str().unwrap_or("?"), f["objects"].as_u64().unwrap_or(0));
        let _ = writeln!(s, "{name:<24} {objects:>10} {:>12}", b(&f["used"]));
    }
    s
}

/// A volume's placement, marked when it is the pool's default.
pub fn placement(vol: &Value) -> String {
    let name = vol["placement"].as_str().unwrap_or("?");
    if vol["placement_default"].as_bool().unwrap_or(false) {
        format!("{name} (default)")
    } else {
        name.to_string()
    }
}

/// The members a volume's new data goes to, or "any".
pub fn devices(vol: &Value) -> String {
    match vol["devices"].as_array() {
        Some(d) if !d.is_empty() => d.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","),
        _ => "any".into(),
    }
}

/// A clone's origin and how much it still reads from it, or "-".
fn origin(vol: &Value) -> String {
    match vol["origin"].as_str() {
        Some(o) if vol["origin_bytes"].as_u64().unwrap_or(0) > 0 => format!("{o} ({} shared)", b(&vol["origin_bytes"])),
        Some(o) => o.to_string(),
        None => "-".to_string(),
    }
}

/// One snapshot in a sentence (create's answer).
pub fn snapshot(v: &Value) -> String {
    format!(
        "created snapshot {}@{} ({}, {} referenced)\n",
        v["volume"].as_str().unwrap_or("?"),
        v["name"].as_str().unwrap_or("?"),
        b(&v["size"]),
        b(&v["referenced"])
    )
}

/// The snapshot table, then per volume what its head and its snapshots hold
/// (head + snapshots = the volume's share of the pool).
pub fn snapshots(snaps: &Value, vols: &Value, only: Option<&str>) -> String {
    let mut s = format!(
        "{:<32} {:<19} {:>11} {:>11} {:>11} {:>11}  {}\n",
        "SNAPSHOT", "CREATED", "SIZE", "EXCLUSIVE", "SHARED", "REFERENCED", "CLONES"
    );
    let list = snaps.as_array().map(Vec::as_slice).unwrap_or_default();
    for snap in list {
        let clones: Vec<&str> = snap["clones"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let _ = writeln!(
            s,
            "{:<32} {:<19} {:>11} {:>11} {:>11} {:>11}  {}",
            format!("{}@{}", snap["volume"].as_str().unwrap_or("?"), snap["name"].as_str().unwrap_or("?")),
            local_time(snap["created"].as_u64().unwrap_or(0)),
            b(&snap["size"]),
            b(&snap["exclusive"]),
            b(&snap["shared"]),
            b(&snap["referenced"]),
            if clones.is_empty() { "-".to_string() } else { clones.join(",") }
        );
    }
    for vol in vols.as_array().into_iter().flatten() {
        let name = vol["name"].as_str().unwrap_or("?");
        if only.is_some_and(|o| o != name) || (only.is_none() && vol["snapshots"].as_u64().unwrap_or(0) == 0) {
            continue;
        }
        let (head, snap) = (vol["allocated"].as_u64().unwrap_or(0), vol["snapshot_bytes"].as_u64().unwrap_or(0));
        let _ = writeln!(
            s,
            "{name}: {} in the head + {} only in {} snapshot(s) = {}",
            human(head),
            human(snap),
            vol["snapshots"],
            human(head + snap)
        );
    }
    s
}

/// A diff as `offset length` lines in bytes, then a total line.
pub fn diff(v: &Value) -> String {
    let mut s = String::new();
    let ranges = v["ranges"].as_array().map(Vec::as_slice).unwrap_or_default();
    for r in ranges {
        let _ = writeln!(s, "{} {}", r[0], r[1]);
    }
    let _ = writeln!(
        s,
        "total {} bytes changed in {} ranges from {} to {}",
        v["changed_bytes"],
        ranges.len(),
        v["from"].as_str().unwrap_or("?"),
        v["to"].as_str().unwrap_or("?")
    );
    s
}

/// `YYYY-MM-DD HH:MM:SS` in the local time zone (the seconds if it has none).
pub fn local_time(secs: u64) -> String {
    let Ok(t) = libc::time_t::try_from(secs) else {
        return secs.to_string();
    };
    // SAFETY: tm is plain data; localtime_r only writes into it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return secs.to_string();
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

pub fn connect_hints(addr: &str, volume: &str, socket: &Path) -> String {
    let uri = format!("nbd://{addr}/{volume}");
    format!(
        "tarn: serving thin volume {volume}\n\
         \x20 NBD over TCP:   {uri}\n\
         \x20 NBD over unix:  nbd+unix:///{volume}?socket={sock}\n\
         Try:\n\
         \x20 nbdinfo {uri}\n\
         \x20 qemu-img info {uri}\n\
         \x20 qemu-io -f raw {uri} -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M'\n\
         \x20 mkdir -p /mnt/tarn && nbdfuse /mnt/tarn {uri} &   # exposes /mnt/tarn/nbd\n\
         \x20 losetup -f --show /mnt/tarn/nbd && mkfs.ext4 /dev/loopN && mount /dev/loopN /mnt/x\n\
         \x20 nbd-client 127.0.0.1 {port} /dev/nbd0 -N {volume}   # where the kernel has nbd\n\
         Stop with Ctrl-C or SIGTERM: connections drain and the pool is committed.",
        sock = socket.display(),
        port = addr.rsplit(':').next().unwrap_or("10809"),
    )
}

/// `tarn trace replay`: one line per volume.
pub fn replay(v: &Value) -> String {
    let mut s = format!(
        "placement {}, {} requests replayed ({} skipped), {} written, {} snapshots; regions of {}\n",
        v["placement"].as_str().unwrap_or("?"),
        v["requests"].as_u64().unwrap_or(0),
        v["skipped"].as_u64().unwrap_or(0),
        b(&v["written"]),
        v["snapshots"].as_u64().unwrap_or(0),
        b(&v["region"]),
    );
    if let Some(p) = v["pool"].as_str() {
        let _ = writeln!(s, "scratch pool kept: {p}");
    }
    let _ = writeln!(
        s,
        "{:<20} {:>12} {:>10} {:>10} {:>8} {:>8} {:>10} {:>8} {:>8} {:>10}",
        "VOLUME", "MAPPED", "RUNS/GiB", "REGIONS", "SEEKS", "DENSITY", "REWRITTEN", "SEEKS", "DENSITY", "READ (s)"
    );
    for vol in v["volumes"].as_array().into_iter().flatten() {
        let (all, cow) = (&vol["all"], &vol["rewritten_after_snapshot"]);
        let _ = writeln!(
            s,
            "{:<20} {:>12} {:>10.0} {:>10} {:>8.2} {:>7.1}% {:>10} {:>8.2} {:>7.1}% {:>10.2}",
            vol["name"].as_str().unwrap_or("?"),
            b(&vol["mapped"]),
            vol["runs_per_gib"].as_f64().unwrap_or(0.0),
            all["regions"].as_u64().unwrap_or(0),
            all["seeks_per_region"].as_f64().unwrap_or(0.0),
            all["density"].as_f64().unwrap_or(0.0) * 100.0,
            cow["regions"].as_u64().unwrap_or(0),
            cow["seeks_per_region"].as_f64().unwrap_or(0.0),
            cow["density"].as_f64().unwrap_or(0.0) * 100.0,
            vol["est_read_s"].as_f64().unwrap_or(0.0),
        );
    }
    let f = &v["files"];
    if !f.is_null() {
        let (all, cow) = (&f["all"], &f["rewritten_after_snapshot"]);
        let _ = writeln!(
            s,
            "files: {} ({:.2} seeks, {:.1}% dense); rewritten after a snapshot: {} ({:.2} seeks, {:.1}% dense); \
             internal fragmentation {:.2}% (4 KiB blocks), {:.2}% (region-sized blocks)",
            all["files"].as_u64().unwrap_or(0),
            all["seeks_per_file"].as_f64().unwrap_or(0.0),
            all["density"].as_f64().unwrap_or(0.0) * 100.0,
            cow["files"].as_u64().unwrap_or(0),
            cow["seeks_per_file"].as_f64().unwrap_or(0.0),
            cow["density"].as_f64().unwrap_or(0.0) * 100.0,
            f["internal_fragmentation"].as_f64().unwrap_or(0.0) * 100.0,
            f["internal_fragmentation_large_blocks"].as_f64().unwrap_or(0.0) * 100.0,
        );
    }
    s
}

/// `tarn vol map`: `lba len device block` per run.
pub fn runs(v: &Value) -> String {
    let mut s = String::new();
    for r in v.as_array().into_iter().flatten() {
        let f: Vec<String> = r.as_array().into_iter().flatten().map(|x| x.as_u64().unwrap_or(0).to_string()).collect();
        let _ = writeln!(s, "{}", f.join(" "));
    }
    s
}

/// `tarn vol reclaim`: what the file system uses and what came back.
pub fn reclaim(v: &Value) -> String {
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let verb = if v["dry_run"].as_bool() == Some(true) { "would reclaim" } else { "reclaimed" };
    let mut s = format!(
        "{}: {} of {} used by the file system ({}, {}-byte blocks)\n",
        v["volume"].as_str().unwrap_or("?"),
        human(n("fs_used_bytes")),
        human(n("fs_bytes")),
        v["file_system"].as_str().unwrap_or("?"),
        n("block_size"),
    );
    let _ = writeln!(
        s,
        "{verb} {}; kept {} written since the scan began",
        human(n("reclaimed_bytes")),
        human(n("kept_changed_bytes"))
    );
    let _ = writeln!(s, "allocated: {} before, {} after", human(n("allocated_before")), human(n("allocated_after")));
    s
}

/// `tarn vol classify`: bytes of metadata per kind.
pub fn classified(v: &Value) -> String {
    let mut s = format!(
        "{}: {} with {}-byte blocks, {} inodes in use\n",
        v["volume"].as_str().unwrap_or("?"),
        v["file_system"].as_str().unwrap_or("?"),
        v["block_size"].as_u64().unwrap_or(0),
        v["inodes"].as_u64().unwrap_or(0)
    );
    for (kind, bytes) in v["bytes"].as_object().into_iter().flatten() {
        let _ = writeln!(s, "  {kind:<10} {}", human(bytes.as_u64().unwrap_or(0)));
    }
    let _ = writeln!(s, "vol hint would move {}", human(v["moved_bytes"].as_u64().unwrap_or(0)));
    if v["skipped"].as_u64().unwrap_or(0) > 0 {
        let _ = writeln!(s, "{} pointers or tree nodes made no sense and were ignored", v["skipped"]);
    }
    s
}

/// `tarn vol hint` / `unhint`: what moved.
pub fn hinted(v: &Value) -> String {
    let n = |k: &str| human(v[k].as_u64().unwrap_or(0));
    format!(
        "{}: {} of metadata ({}): moved {}, {} already in place, {} of the moved shared with snapshots (moved for them too)\n",
        v["volume"].as_str().unwrap_or("?"),
        n("hinted_bytes"),
        v["metadata_from"].as_str().unwrap_or("?"),
        n("moved_bytes"),
        n("in_place_bytes"),
        n("shared_bytes")
    ) + if v["stopped_full"] == true { "stopped: no room left where the metadata goes; the rest stays where it was\n" } else { "" }
}

/// `vol export` / `vol import`: what was copied.
pub fn image(v: &Value) -> String {
    let n = |k: &str| human(v[k].as_u64().unwrap_or(0));
    format!(
        "{} <-> {}: {} volume, {} of data copied\n",
        v["volume"].as_str().unwrap_or("?"),
        v["path"].as_str().unwrap_or("?"),
        n("size"),
        n("data_bytes")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn diff_lines_then_total() {
        let v = json!({ "from": "v@a", "to": "v", "ranges": [[0, 8192], [1048576, 4096]], "changed_bytes": 12288 });
        assert_eq!(diff(&v), "0 8192\n1048576 4096\ntotal 12288 bytes changed in 2 ranges from v@a to v\n");
    }

    #[test]
    fn snapshot_table_has_a_total_per_volume() {
        let snaps = json!([{ "volume": "v", "name": "a", "created": 0, "size": 4096, "exclusive": 4096,
            "shared": 0, "referenced": 4096, "clones": ["c"] }]);
        let vols = json!([{ "name": "v", "allocated": 8192, "snapshot_bytes": 4096, "snapshots": 1 },
            { "name": "w", "allocated": 0, "snapshot_bytes": 0, "snapshots": 0 }]);
        let t = snapshots(&snaps, &vols, None);
        assert!(t.lines().nth(1).is_some_and(|l| l.starts_with("v@a ") && l.ends_with(" c")), "{t}");
        assert!(t.contains("v: 8.00 KiB in the head + 4.00 KiB only in 1 snapshot(s) = 12.00 KiB"), "{t}");
        assert!(!t.contains("w:"), "{t}");
    }

    #[test]
    fn local_time_shape() {
        assert_eq!(local_time(1_700_000_000).len(), "2023-11-14 22:13:20".len());
    }
}
