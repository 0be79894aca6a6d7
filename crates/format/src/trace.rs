//! The request trace `tarn serve --trace FILE` records and `tarn trace`
//! reads (docs/FORMAT.md *Request trace*): a 32-byte header, then records
//! of 32 bytes (a request) or 8 bytes plus a name padded to 32-byte
//! multiples (an export's name, before its first request). Little-endian.
//! Fixed-size request records keep the recorder's cost to one copy per
//! request and let a reader resynchronize nowhere: a bad byte is an error
//! that names its offset.

use crate::error::{FormatError, Result};

pub const TRACE_MAGIC: [u8; 8] = *b"TARNTRC1";
pub const TRACE_VERSION: u32 = 1;
pub const TRACE_HEADER_LEN: usize = 32;
pub const TRACE_RECORD_LEN: usize = 32;
/// Longest export name (`VOL@SNAP`, each part up to 128 bytes).
pub const MAX_EXPORT_NAME: usize = 257;
/// Exports one trace may name.
pub const MAX_TRACE_EXPORTS: u32 = 1 << 16;

const KIND_REQUEST: u8 = 1;
const KIND_NAME: u8 = 2;

/// What a request asked (NBD commands at the export level).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TraceCmd {
    Read = 0,
    Write = 1,
    Flush = 2,
    Trim = 3,
    WriteZeroes = 4,
    Cache = 5,
}

impl TraceCmd {
    pub const ALL: [TraceCmd; 6] =
        [TraceCmd::Read, TraceCmd::Write, TraceCmd::Flush, TraceCmd::Trim, TraceCmd::WriteZeroes, TraceCmd::Cache];

    pub fn name(self) -> &'static str {
        match self {
            TraceCmd::Read => "read",
            TraceCmd::Write => "write",
            TraceCmd::Flush => "flush",
            TraceCmd::Trim => "trim",
            TraceCmd::WriteZeroes => "zero",
            TraceCmd::Cache => "cache",
        }
    }

    fn from_byte(b: u8) -> Option<TraceCmd> {
        TraceCmd::ALL.into_iter().find(|c| *c as u8 == b)
    }
}

/// Request flags.
pub mod trace_flags {
    /// The request asked for FUA.
    pub const FUA: u8 = 1;
    /// A write-zeroes that must allocate (NBD_CMD_FLAG_NO_HOLE).
    pub const NO_HOLE: u8 = 2;
    /// The request failed.
    pub const FAILED: u8 = 4;
    pub const ALL: u8 = FUA | NO_HOLE | FAILED;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceRecord {
    /// Export `export` is called `name` in the requests that follow.
    Name {
        export: u32,
        name: String,
    },
    Request {
        t_ns: u64,
        export: u32,
        cmd: TraceCmd,
        flags: u8,
        offset: u64,
        length: u64,
    },
}

/// The header: magic, version, the wall-clock start (Unix ns).
pub fn encode_header(start_unix_ns: u64) -> [u8; TRACE_HEADER_LEN] {
    let mut h = [0u8; TRACE_HEADER_LEN];
    h[..8].copy_from_slice(&TRACE_MAGIC);
    h[8..12].copy_from_slice(&TRACE_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&start_unix_ns.to_le_bytes());
    h
}

/// Decode a header; returns the start time (Unix ns).
pub fn decode_header(h: &[u8]) -> Result<u64> {
    if h.len() < TRACE_HEADER_LEN || h[..8] != TRACE_MAGIC {
        return Err(FormatError::BadMagic { what: "trace" });
    }
    let version = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if version != TRACE_VERSION {
        return Err(FormatError::UnsupportedVersion(version));
    }
    Ok(u64::from_le_bytes(h[16..24].try_into().expect("8 bytes")))
}

impl TraceRecord {
    /// Append the record's bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            TraceRecord::Request { t_ns, export, cmd, flags, offset, length } => {
                out.extend_from_slice(&[KIND_REQUEST, *cmd as u8, *flags, 0]);
                out.extend_from_slice(&export.to_le_bytes());
                out.extend_from_slice(&t_ns.to_le_bytes());
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&length.to_le_bytes());
            }
            TraceRecord::Name { export, name } => {
                assert!(!name.is_empty() && name.len() <= MAX_EXPORT_NAME, "export names are bounded");
                let start = out.len();
                out.push(KIND_NAME);
                out.push(0);
                out.extend_from_slice(&(name.len() as u16).to_le_bytes());
                out.extend_from_slice(&export.to_le_bytes());
                out.extend_from_slice(name.as_bytes());
                let len = out.len() - start;
                out.resize(start + len.div_ceil(TRACE_RECORD_LEN) * TRACE_RECORD_LEN, 0);
            }
        }
    }

    /// Decode the record at the start of `buf` (which is at byte `at` of
    /// the file, for errors); returns it and its length.
    pub fn decode(buf: &[u8], at: u64) -> Result<(TraceRecord, usize)> {
        let bad = |field: &'static str, value: u64| FormatError::BadField { what: "trace record", field, value };
        // A recorder killed mid-write leaves a cut last record: say where.
        let truncated = FormatError::BadField { what: "trace (truncated)", field: "last record at byte", value: at };
        if buf.len() < TRACE_RECORD_LEN {
            return Err(truncated);
        }
        let u32_at = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
        match buf[0] {
            KIND_REQUEST => {
                let cmd = TraceCmd::from_byte(buf[1]).ok_or(bad("command", u64::from(buf[1])))?;
                let flags = buf[2];
                if flags & !trace_flags::ALL != 0 || buf[3] != 0 {
                    return Err(bad("flags", u64::from(flags)));
                }
                let export = u32_at(4);
                let (t_ns, offset, length) = (u64_at(8), u64_at(16), u64_at(24));
                if offset.checked_add(length).is_none() {
                    return Err(bad("offset + length", offset));
                }
                Ok((TraceRecord::Request { t_ns, export, cmd, flags, offset, length }, TRACE_RECORD_LEN))
            }
            KIND_NAME => {
                let len = usize::from(u16::from_le_bytes([buf[2], buf[3]]));
                let total = (8 + len).div_ceil(TRACE_RECORD_LEN) * TRACE_RECORD_LEN;
                if len == 0 || len > MAX_EXPORT_NAME || buf[1] != 0 {
                    return Err(bad("export name length", len as u64));
                }
                if buf.len() < total {
                    return Err(truncated);
                }
                let name = std::str::from_utf8(&buf[8..8 + len]).map_err(|_| bad("export name (not UTF-8)", at))?;
                Ok((TraceRecord::Name { export: u32_at(4), name: name.to_string() }, total))
            }
            k => Err(bad("record kind", u64::from(k))),
        }
    }
}

/// Every record of a trace file's bytes, checked: names defined once and
/// before use, times never going back more than the recorder's threads
/// can reorder them (requests are stamped before they queue).
pub fn decode_trace(bytes: &[u8]) -> Result<(u64, Vec<TraceRecord>)> {
    let start = decode_header(bytes)?;
    let mut out = Vec::new();
    let mut named: Vec<u32> = Vec::new();
    let mut pos = TRACE_HEADER_LEN;
    while pos < bytes.len() {
        let (rec, len) = TraceRecord::decode(&bytes[pos..], pos as u64)?;
        match &rec {
            TraceRecord::Name { export, .. } if *export >= MAX_TRACE_EXPORTS || named.contains(export) => {
                return Err(FormatError::BadField {
                    what: "trace",
                    field: "export redefined",
                    value: u64::from(*export),
                })
            }
            TraceRecord::Name { export, .. } => named.push(*export),
            TraceRecord::Request { export, .. } if !named.contains(export) => {
                return Err(FormatError::BadField {
                    what: "trace",
                    field: "export not named",
                    value: u64::from(*export),
                })
            }
            TraceRecord::Request { .. } => {}
        }
        out.push(rec);
        pos += len;
    }
    Ok((start, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<TraceRecord> {
        vec![
            TraceRecord::Name { export: 0, name: "disk0".into() },
            TraceRecord::Request { t_ns: 5, export: 0, cmd: TraceCmd::Write, flags: 1, offset: 4096, length: 8192 },
            TraceRecord::Name { export: 1, name: "x".repeat(MAX_EXPORT_NAME) },
            TraceRecord::Request { t_ns: 9, export: 1, cmd: TraceCmd::Flush, flags: 0, offset: 0, length: 0 },
        ]
    }

    fn file(records: &[TraceRecord]) -> Vec<u8> {
        let mut b = encode_header(77).to_vec();
        records.iter().for_each(|r| r.encode(&mut b));
        b
    }

    #[test]
    fn round_trips_and_pins_the_request_bytes() {
        let b = file(&sample());
        assert_eq!(decode_trace(&b).unwrap(), (77, sample()));
        // Header 32, name record 32 ("disk0" fits), then the write.
        let w = &b[64..96];
        assert_eq!(&w[..8], &[1, 1, 1, 0, 0, 0, 0, 0]);
        assert_eq!(&w[8..16], &5u64.to_le_bytes());
        assert_eq!(&w[16..24], &4096u64.to_le_bytes());
        assert_eq!(&w[24..32], &8192u64.to_le_bytes());
    }

    #[test]
    fn truncation_and_damage_are_errors() {
        let good = file(&sample());
        for cut in TRACE_HEADER_LEN + 1..good.len() {
            if (cut - TRACE_HEADER_LEN).is_multiple_of(TRACE_RECORD_LEN) && decode_trace(&good[..cut]).is_ok() {
                continue; // a whole-record prefix is a shorter, valid trace
            }
            assert!(decode_trace(&good[..cut]).is_err(), "cut at {cut} accepted");
        }
        for (at, byte) in [(0usize, b'X'), (8, 2), (64, 9), (65, 6), (66, 8)] {
            let mut bad = good.clone();
            bad[at] = byte;
            assert!(decode_trace(&bad).is_err(), "byte {at} = {byte} accepted");
        }
        // A request for an export never named.
        let mut orphan = encode_header(0).to_vec();
        TraceRecord::Request { t_ns: 0, export: 3, cmd: TraceCmd::Read, flags: 0, offset: 0, length: 1 }
            .encode(&mut orphan);
        assert!(decode_trace(&orphan).is_err());
    }
}
