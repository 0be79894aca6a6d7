//! Metadata operations: the deltas a commit records in the journal.
//!
//! The engine applies an op to its in-memory state and appends the same op to
//! the pending commit, so replaying the journal goes through the exact code
//! path the live pool took.

use crate::codec::{Reader, Writer};
use crate::error::Result;

pub const MAX_NAME_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Logical blocks [lba, lba+len) of `vol` now live at physical blocks
    /// starting at `pba`, written in epoch `birth`.
    Map {
        vol: u32,
        lba: u64,
        len: u64,
        pba: u64,
        birth: u64,
    },
    /// Logical blocks [lba, lba+len) of `vol` are holes again.
    Unmap {
        vol: u32,
        lba: u64,
        len: u64,
    },
    VolCreate {
        vol: u32,
        size: u64,
        name: String,
    },
    VolResize {
        vol: u32,
        size: u64,
    },
    /// Deletes the volume and every mapping it holds.
    VolDelete {
        vol: u32,
    },
}

mod tag {
    pub const MAP: u8 = 1;
    pub const UNMAP: u8 = 2;
    pub const VOL_CREATE: u8 = 3;
    pub const VOL_RESIZE: u8 = 4;
    pub const VOL_DELETE: u8 = 5;
}

impl Op {
    pub fn encode(&self, w: &mut Writer) {
        match self {
            Op::Map { vol, lba, len, pba, birth } => {
                w.u8(tag::MAP);
                w.u32(*vol);
                w.varint(*lba);
                w.varint(*len);
                w.u64(*pba);
                w.varint(*birth);
            }
            Op::Unmap { vol, lba, len } => {
                w.u8(tag::UNMAP);
                w.u32(*vol);
                w.varint(*lba);
                w.varint(*len);
            }
            Op::VolCreate { vol, size, name } => {
                assert!(name.len() <= MAX_NAME_LEN);
                w.u8(tag::VOL_CREATE);
                w.u32(*vol);
                w.u64(*size);
                w.u8(name.len() as u8);
                w.bytes(name.as_bytes());
            }
            Op::VolResize { vol, size } => {
                w.u8(tag::VOL_RESIZE);
                w.u32(*vol);
                w.u64(*size);
            }
            Op::VolDelete { vol } => {
                w.u8(tag::VOL_DELETE);
                w.u32(*vol);
            }
        }
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Op> {
        let t = r.u8()?;
        let vol = r.u32()?;
        Ok(match t {
            tag::MAP => {
                let (lba, len, pba, birth) = (r.varint()?, r.varint()?, r.u64()?, r.varint()?);
                if len == 0 {
                    return Err(r.bad("map_len", 0));
                }
                Op::Map { vol, lba, len, pba, birth }
            }
            tag::UNMAP => {
                let (lba, len) = (r.varint()?, r.varint()?);
                Op::Unmap { vol, lba, len }
            }
            tag::VOL_CREATE => {
                let size = r.u64()?;
                let n = usize::from(r.u8()?);
                if n > MAX_NAME_LEN {
                    return Err(r.bad("name_len", n as u64));
                }
                let name = String::from_utf8(r.take(n)?.to_vec()).map_err(|_| r.bad("name_utf8", 0))?;
                Op::VolCreate { vol, size, name }
            }
            tag::VOL_RESIZE => Op::VolResize { vol, size: r.u64()? },
            tag::VOL_DELETE => Op::VolDelete { vol },
            other => return Err(r.bad("op_tag", u64::from(other))),
        })
    }
}

/// Encode a batch of ops as a journal payload.
pub fn encode_ops(ops: &[Op]) -> Vec<u8> {
    let mut w = Writer::with_capacity(ops.len() * 24);
    w.varint(ops.len() as u64);
    ops.iter().for_each(|op| op.encode(&mut w));
    w.buf
}

/// Decode a journal payload; the count is bounded by the payload length.
pub fn decode_ops(buf: &[u8]) -> Result<Vec<Op>> {
    let mut r = Reader::new(buf, "journal payload");
    let n = r.varint()?;
    if n > buf.len() as u64 {
        return Err(r.bad("op_count", n));
    }
    let mut ops = Vec::with_capacity(n as usize);
    for _ in 0..n {
        ops.push(Op::decode(&mut r)?);
    }
    if !r.is_empty() {
        return Err(r.bad("trailing_bytes", r.remaining() as u64));
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn sample_ops() -> Vec<Op> {
        vec![
            Op::VolCreate { vol: 1, size: 1 << 30, name: "disk0".into() },
            Op::Map { vol: 1, lba: 10, len: 256, pba: (1 << 48) | 77, birth: 1 },
            Op::Unmap { vol: 1, lba: 12, len: 1 },
            Op::VolResize { vol: 1, size: 1 << 31 },
            Op::VolDelete { vol: 1 },
        ]
    }

    #[test]
    fn ops_round_trip() {
        let ops = sample_ops();
        assert_eq!(decode_ops(&encode_ops(&ops)).unwrap(), ops);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = encode_ops(&sample_ops());
        for n in 0..bytes.len() {
            assert!(decode_ops(&bytes[..n]).is_err(), "prefix {n} accepted");
        }
    }
}
