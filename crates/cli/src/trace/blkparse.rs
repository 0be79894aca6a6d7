//! Kernel block traces (blktrace + blkparse, default text output) turned
//! into tarn traces, so the request streams of real machines can be
//! replayed against tarn's placements. Only queue events (`Q`) are taken:
//! one per request as the file system issued it, before merging.

use anyhow::{bail, Context, Result};
use tarn_format::trace::{trace_flags, TraceCmd, TraceRecord};

/// One parsed `Q` line: device ("8,0"), time (ns), the requests it makes.
struct Queued {
    device: String,
    t_ns: u64,
    ops: Vec<(TraceCmd, u8, u64, u64)>,
}

/// Requests of a `Q` line (`dev cpu seq time pid Q rwbs [sector + n] [proc]`),
/// or None for the lines blkparse prints that are not queue events.
fn parse_line(line: &str) -> Result<Option<Queued>> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 7 || f[5] != "Q" || !f[0].contains(',') {
        return Ok(None);
    }
    let secs: f64 = f[3].parse().with_context(|| format!("time {:?}", f[3]))?;
    if !secs.is_finite() || secs < 0.0 {
        bail!("time {:?}", f[3]);
    }
    let rwbs = f[6];
    let extent = match (f.get(7), f.get(8), f.get(9)) {
        (Some(s), Some(&"+"), Some(n)) => {
            let sector: u64 = s.parse().with_context(|| format!("sector {s:?}"))?;
            let count: u64 = n.parse().with_context(|| format!("sector count {n:?}"))?;
            Some((sector.checked_mul(512).context("sector too large")?, count.checked_mul(512).context("count")?))
        }
        _ => None,
    };
    let mut ops = Vec::new();
    // rwbs: a leading F is a flush before the request, a later F is FUA.
    let (preflush, rest) = match rwbs.strip_prefix('F') {
        Some(rest) => (true, rest),
        None => (false, rwbs),
    };
    if preflush {
        ops.push((TraceCmd::Flush, 0, 0, 0));
    }
    let fua = if rest.contains('F') { trace_flags::FUA } else { 0 };
    if let Some((offset, length)) = extent.filter(|e| e.1 > 0) {
        let cmd = if rest.contains('D') {
            TraceCmd::Trim
        } else if rest.contains('W') {
            TraceCmd::Write
        } else if rest.contains('R') {
            TraceCmd::Read
        } else {
            return Ok(None);
        };
        ops.push((cmd, fua, offset, length));
    }
    Ok(Some(Queued { device: f[0].to_string(), t_ns: (secs * 1e9) as u64, ops }))
}

/// The records of a blkparse text; each device becomes an export, named
/// `export` if there is one device, else `dev<maj>-<min>`.
pub fn convert(text: &str, export: Option<&str>) -> Result<Vec<TraceRecord>> {
    let mut devices: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some(q) = parse_line(line).with_context(|| format!("blkparse line {}: {line:?}", i + 1))? else {
            continue;
        };
        let id = match devices.iter().position(|d| *d == q.device) {
            Some(id) => id as u32,
            None => {
                devices.push(q.device.clone());
                let name = format!("dev{}", q.device.replace(',', "-"));
                out.push(TraceRecord::Name { export: devices.len() as u32 - 1, name });
                devices.len() as u32 - 1
            }
        };
        for (cmd, flags, offset, length) in q.ops {
            out.push(TraceRecord::Request { t_ns: q.t_ns, export: id, cmd, flags, offset, length });
        }
    }
    if !out.iter().any(|r| matches!(r, TraceRecord::Request { .. })) {
        bail!("no queue (Q) events found: expected blkparse's default text output");
    }
    if let Some(name) = export {
        if devices.len() != 1 {
            bail!("--export names one device; the trace has {}", devices.len());
        }
        if let Some(TraceRecord::Name { name: n, .. }) = out.iter_mut().find(|r| matches!(r, TraceRecord::Name { .. }))
        {
            *n = name.to_string();
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
  8,0    3        1     0.000000000   697  Q  WS 223490 + 8 [kjournald]
  8,0    3        2     0.000001000   697  G  WS 223490 + 8 [kjournald]
  8,0    1        3     0.500000000   100  Q   R 16 + 16 [cat]
  8,0    1        4     0.600000000   100  Q FWFS 800 + 8 [jbd2/sda1-8]
  8,0    1        5     0.700000000   100  Q  DS 1024 + 2048 [fstrim]
  8,0    1        6     0.800000000   100  Q  FN [sync]
CPU0 (8,0):
 Reads Queued:           1,        8KiB\t Writes Queued:           2,        8KiB
";

    #[test]
    fn queue_events_become_requests() {
        let recs = convert(SAMPLE, Some("disk0")).unwrap();
        let req =
            |t_ns, cmd, flags, offset, length| TraceRecord::Request { t_ns, export: 0, cmd, flags, offset, length };
        assert_eq!(
            recs,
            vec![
                TraceRecord::Name { export: 0, name: "disk0".into() },
                req(0, TraceCmd::Write, 0, 223490 * 512, 4096),
                req(500_000_000, TraceCmd::Read, 0, 16 * 512, 8192),
                req(600_000_000, TraceCmd::Flush, 0, 0, 0),
                req(600_000_000, TraceCmd::Write, trace_flags::FUA, 800 * 512, 4096),
                req(700_000_000, TraceCmd::Trim, 0, 1024 * 512, 2048 * 512),
                req(800_000_000, TraceCmd::Flush, 0, 0, 0),
            ]
        );
    }

    #[test]
    fn garbage_is_an_error_naming_the_line() {
        let err = convert("  8,0 1 1 x.y 1 Q W 1 + 8 [a]\n", None).unwrap_err();
        assert!(format!("{err:#}").contains("line 1"), "{err:#}");
        assert!(convert("hello\n", None).is_err(), "no Q events at all");
        let bad_sector = "  8,0 1 1 0.1 1 Q W -5 + 8 [a]\n";
        assert!(convert(bad_sector, None).is_err());
    }
}
