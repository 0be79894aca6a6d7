//! Request traces: recorded by `tarn serve --trace`, read, converted from
//! kernel block traces, and replayed against a placement (`tarn trace`).

pub mod blkparse;
pub mod recorder;
pub mod replay;

use anyhow::{Context, Result};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use tarn_format::trace::{decode_trace, encode_header, trace_flags, TraceRecord};

/// Every record of the trace file at `path`, checked.
pub fn load(path: &Path) -> Result<Vec<TraceRecord>> {
    let bytes = std::fs::read(path).with_context(|| format!("read trace {}", path.display()))?;
    let (_, records) = decode_trace(&bytes).with_context(|| format!("trace {}", path.display()))?;
    Ok(records)
}

/// Write `records` as a trace file (`tarn trace convert`).
pub fn save(path: &Path, records: &[TraceRecord]) -> Result<()> {
    let mut out = encode_header(0).to_vec();
    records.iter().for_each(|r| r.encode(&mut out));
    std::fs::write(path, out).with_context(|| format!("write trace {}", path.display()))
}

/// One line per request: seconds, export, command, offset, length, flags.
pub fn text(records: &[TraceRecord], limit: Option<usize>) -> String {
    let mut names: HashMap<u32, &str> = HashMap::new();
    let mut out = String::new();
    let mut left = limit.unwrap_or(usize::MAX);
    for r in records {
        let TraceRecord::Request { t_ns, export, cmd, flags, offset, length } = r else {
            if let TraceRecord::Name { export, name } = r {
                names.insert(*export, name);
            }
            continue;
        };
        if left == 0 {
            break;
        }
        left -= 1;
        let name = names.get(export).copied().unwrap_or("?");
        let mut f = Vec::new();
        for (bit, word) in
            [(trace_flags::FUA, "fua"), (trace_flags::NO_HOLE, "no-hole"), (trace_flags::FAILED, "failed")]
        {
            if flags & bit != 0 {
                f.push(word);
            }
        }
        let secs = *t_ns as f64 / 1e9;
        let _ = writeln!(out, "{secs:.6} {name} {} {offset} {length} {}", cmd.name(), f.join(","));
    }
    out
}
