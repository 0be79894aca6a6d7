//! `tarn vol classify`, `tarn vol hint` and `tarn vol unhint`: find the
//! metadata of a volume's ext2/3/4 (from a snapshot) or take it from the
//! user, and move it together, onto a clustered run or a device set aside
//! for it, so fsck and metadata-heavy work seek less (seed 002); or move
//! it back where the volume's placement puts data.

use crate::guestfs::{fs_kind, open_ext, with_snapshot, ViewSource};
use serde_json::{json, Map, Value};
use tarn_engine::{blocks_covering, HintReport, HintTarget, Pool, View};
use tarn_extfs::{classify, MetaKind, MetadataMap};

const SNAPSHOT: &str = "tarn-hint";

/// Kinds worth moving: what fsck and directory walks read. Backups are
/// never read, the journal is one sequential run already.
const MOVED: [MetaKind; 5] =
    [MetaKind::Static, MetaKind::Directory, MetaKind::Tree, MetaKind::Xattr, MetaKind::Symlink];

/// The metadata of the file system on volume `name`, read from a snapshot.
fn infer(pool: &Pool, name: &str) -> Result<(&'static str, MetadataMap), String> {
    with_snapshot(pool, name, SNAPSHOT, |snap| {
        let mut src = ViewSource { pool, vol: snap.vol, view: View::Snapshot(snap.epoch), size: snap.size };
        let (sb, groups) = open_ext(&mut src, false)?;
        let map = classify(&mut src, &groups).map_err(|e| e.to_string())?;
        Ok((fs_kind(&sb), map))
    })
}

/// `tarn vol classify`: what the walk found, per kind.
/// With `runs`, also every run as [offset, length, kind] in bytes.
pub fn classify_volume(pool: &Pool, name: &str, runs: bool) -> Result<Value, String> {
    let (fs, map) = infer(pool, name)?;
    let bs = u64::from(map.block_size);
    let listed: Vec<Value> = if runs {
        map.runs.iter().map(|&(at, len, kind)| json!([at * bs, len * bs, kind.name()])).collect()
    } else {
        Vec::new()
    };
    let kinds: Map<String, Value> =
        MetaKind::ALL.iter().map(|k| (k.name().to_string(), json!(map.blocks_of(*k) * bs))).collect();
    Ok(json!({
        "volume": name, "file_system": fs, "block_size": bs, "inodes": map.inodes,
        "skipped": map.skipped, "bytes": kinds,
        "moved_bytes": MOVED.iter().map(|k| map.blocks_of(*k) * bs).sum::<u64>(),
        "runs": listed,
    }))
}

/// The 4 KiB blocks `vol hint` moves, as (first, count) runs: directory
/// blocks first, then the other kinds, each group in logical order. fsck
/// reads directories in a pass of their own (pass 2), in block order: in
/// a run of their own that pass is one sweep instead of a walk over the
/// inode tables between them.
fn movable_blocks(map: &MetadataMap) -> Vec<(u64, u64)> {
    let bs = u64::from(map.block_size);
    let group = |dirs: bool| {
        let mut r: Vec<(u64, u64)> = map
            .runs
            .iter()
            .filter(|r| MOVED.contains(&r.2) && (r.2 == MetaKind::Directory) == dirs)
            .map(|&(at, len, _)| (at * bs, len * bs))
            .collect();
        r.sort_unstable();
        blocks_covering(&r)
    };
    let dirs = group(true);
    let mut blocks = dirs.clone();
    blocks.extend(without(&group(false), &dirs));
    blocks
}

/// The runs of `runs` minus the blocks of `taken` (both sorted, each
/// disjoint): a block two kinds share (1 KiB file systems) moves once.
fn without(runs: &[(u64, u64)], taken: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut t = 0;
    for &(mut first, len) in runs {
        let end = first + len;
        while first < end {
            while t < taken.len() && taken[t].0 + taken[t].1 <= first {
                t += 1;
            }
            match taken.get(t) {
                Some(&(tf, tl)) if tf <= first => first = (tf + tl).min(end),
                Some(&(tf, _)) if tf < end => {
                    out.push((first, tf - first));
                    first = tf;
                }
                _ => {
                    out.push((first, end - first));
                    first = end;
                }
            }
        }
    }
    out
}

/// The device `spec` names: an index, or the path of a pool device.
pub fn device_index(pool: &Pool, spec: &str) -> Result<usize, String> {
    if let Ok(i) = spec.parse::<usize>() {
        return Ok(i);
    }
    let want = std::fs::canonicalize(spec).map_err(|e| format!("metadata device {spec}: {e}"))?;
    let devices = pool.status().devices;
    devices
        .iter()
        .find(|d| std::fs::canonicalize(&d.path).is_ok_and(|p| p == want))
        .map(|d| d.index)
        .ok_or_else(|| format!("{spec} is not a device of this pool (see `tarn pool status`)"))
}

/// `tarn vol hint` (to a cluster or device) and `tarn vol unhint`
/// (`natural`): move the given byte ranges, or the inferred metadata.
pub fn move_metadata(
    pool: &Pool,
    name: &str,
    ranges: &[(u64, u64)],
    target: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Value, String> {
    let target = match target {
        "cluster" => HintTarget::Cluster,
        "natural" => HintTarget::Natural,
        device => {
            let d = device_index(pool, device)?;
            pool.set_hint_device(Some(d)).map_err(|e| e.to_string())?;
            HintTarget::Device(d)
        }
    };
    let (source, blocks) = if ranges.is_empty() {
        let (fs, map) = infer(pool, name)?;
        (fs, movable_blocks(&map))
    } else {
        let mut r = ranges.to_vec();
        r.sort_unstable();
        ("explicit", blocks_covering(&r))
    };
    let r = pool.place_hinted(name, &blocks, target, progress).map_err(|e| e.to_string())?;
    let mut answer = report_json(name, source, &blocks, &r);
    // Inferred hints are the whole truth about the file system; explicit
    // ones add to earlier ones, so only the former send blocks back.
    if let (HintTarget::Device(d), true) = (target, ranges.is_empty()) {
        let back = return_strays(pool, name, d, &blocks, progress)?;
        answer["returned_bytes"] = json!(back * 4096);
    }
    Ok(answer)
}

/// Move the volume's blocks on metadata device `device` that are no
/// longer metadata (files grew into freed directory blocks, a reformat)
/// back where its placement puts data; returns how many moved.
fn return_strays(
    pool: &Pool,
    name: &str,
    device: usize,
    hinted: &[(u64, u64)],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, String> {
    let vol = pool.volume_id(name).ok_or_else(|| format!("no volume {name}"))?;
    let blocks = pool.view_size(vol, View::Head).ok_or("the volume went away")? / 4096;
    let mut on_device = Vec::new();
    let mut lba = 0;
    while lba < blocks {
        let n = STRAY_SCAN_BLOCKS.min(blocks - lba);
        let runs = pool.physical_runs(vol, View::Head, lba, n).map_err(|e| e.to_string())?;
        on_device.extend(runs.iter().filter(|r| usize::from(r.device) == device).map(|r| (r.lba, r.len)));
        lba += n;
    }
    // The hinted runs sorted and joined (as byte ranges, the one merge).
    let mut taken: Vec<(u64, u64)> = hinted.iter().map(|&(b, n)| (b * 4096, n * 4096)).collect();
    taken.sort_unstable();
    let strays = without(&on_device, &blocks_covering(&taken));
    if strays.is_empty() {
        return Ok(0);
    }
    let r = pool.place_hinted(name, &strays, HintTarget::Natural, progress).map_err(|e| e.to_string())?;
    Ok(r.blocks_moved)
}

/// Logical blocks looked at per `physical_runs` call.
const STRAY_SCAN_BLOCKS: u64 = 1 << 18;

fn report_json(name: &str, source: &str, blocks: &[(u64, u64)], r: &HintReport) -> Value {
    json!({
        "volume": name, "metadata_from": source,
        "hinted_bytes": blocks.iter().map(|b| b.1).sum::<u64>() * 4096,
        "moved_bytes": r.blocks_moved * 4096, "shared_bytes": r.blocks_shared * 4096,
        "in_place_bytes": r.blocks_in_place * 4096, "windows_skipped": r.windows_skipped,
        "stopped_full": r.stopped_full,
    })
}

#[cfg(test)]
mod tests {
    use super::without;

    #[test]
    fn blocks_taken_are_left_out() {
        assert_eq!(without(&[(0, 10)], &[]), vec![(0, 10)]);
        assert_eq!(without(&[(0, 10)], &[(0, 10)]), vec![]);
        assert_eq!(without(&[(0, 10), (20, 5)], &[(3, 2), (8, 14)]), vec![(0, 3), (5, 3), (22, 3)]);
        assert_eq!(without(&[(5, 5)], &[(0, 2), (12, 3)]), vec![(5, 5)]);
    }
}
