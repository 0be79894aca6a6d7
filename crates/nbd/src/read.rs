//! Replies to NBD_CMD_READ: a simple reply with the data, or structured
//! (or extended) chunks in which the parts of the range that read as
//! zeroes are sent as `NBD_REPLY_TYPE_OFFSET_HOLE` instead of zero bytes.
//!
//! Which parts read as zeroes comes from [`Export::block_status`] (its
//! `zero` flag: "reads as zeroes" is exactly what OFFSET_HOLE promises).
//! A fully allocated range is read into one buffer and sent as a single
//! OFFSET_DATA chunk, the payload that the [`crate::writer`] sends on its
//! own; a range that is all zeroes is one OFFSET_HOLE chunk and no read.
//! Status and data are looked up one after the other, not atomically: a
//! write racing with the read may or may not be seen, as with any read
//! overlapping a write in flight (proto.md leaves their order open).

use crate::error::ExportError;
use crate::export::Export;
use crate::protocol::{ChunkFraming, HOLE_PAYLOAD_LEN, MAX_READ_HEAD_LEN};
use crate::writer::{BufPool, Reply};

/// Zero extents shorter than this are sent as data: a hole chunk header
/// and a split data chunk cost more than the bytes they save, and proto.md
/// asks for 512-aligned chunks where possible.
pub(crate) const MIN_HOLE: u64 = 4096;
/// Most content chunks in one reply (bounds the reply's headers whatever
/// the export answers); the tail after them is sent as data.
pub(crate) const MAX_CHUNKS: usize = 64;

/// One content chunk of a read reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub offset: u64,
    pub length: u64,
    /// Reads as zeroes: sent as OFFSET_HOLE.
    pub hole: bool,
}

/// Split `[offset, offset + length)` into data and hole pieces from
/// `(length, reads_as_zero)` extents starting at `offset` (pure).
///
/// The pieces cover the range exactly, in order, alternate between data
/// and hole, and number at most [`MAX_CHUNKS`]. Holes shorter than
/// [`MIN_HOLE`] count as data; whatever the extents do not cover (an
/// export may stop early) is data; zero-length extents are skipped.
pub(crate) fn plan(extents: impl IntoIterator<Item = (u64, bool)>, offset: u64, length: u64) -> Vec<Piece> {
    let end = offset.saturating_add(length);
    let mut out: Vec<Piece> = Vec::new();
    let mut pos = offset;
    for (len, zero) in extents {
        if pos >= end || out.len() >= MAX_CHUNKS {
            break;
        }
        let n = len.min(end - pos);
        if n == 0 {
            continue;
        }
        push_piece(&mut out, pos, n, zero && n >= MIN_HOLE);
        pos += n;
    }
    if pos < end {
        push_piece(&mut out, pos, end - pos, false);
    }
    if out.len() > MAX_CHUNKS {
        // The tail pushed past the limit: the last two pieces become data.
        let tail = out.split_off(MAX_CHUNKS - 1);
        let start = tail.first().map_or(pos, |p| p.offset);
        push_piece(&mut out, start, end - start, false);
    }
    out
}

/// Append a piece, merging it with the previous one of the same kind.
fn push_piece(out: &mut Vec<Piece>, offset: u64, length: u64, hole: bool) {
    match out.last_mut() {
        Some(last) if last.hole == hole => last.length += length,
        _ => out.push(Piece { offset, length, hole }),
    }
}

/// How the reply is sent.
pub(crate) enum Style {
    /// Simple reply: the data in full, holes included.
    Simple { handle: u64 },
    /// Structured or extended chunks.
    Chunks(ChunkFraming),
}

/// The reply to a validated read of `length` bytes at `offset`; `df`
/// (NBD_CMD_FLAG_DF) asks for one content chunk, holes included. On an
/// export error, the error and a buffer to recycle.
pub(crate) fn reply(
    e: &dyn Export,
    pool: &BufPool,
    style: Style,
    offset: u64,
    length: u32,
    df: bool,
) -> Result<Reply, (ExportError, Vec<u8>)> {
    let framing = match style {
        Style::Simple { handle } => return read_whole(e, pool, offset, length).map(|b| Reply::simple_read(handle, b)),
        Style::Chunks(f) => f,
    };
    let pieces = if df {
        Vec::new()
    } else {
        match e.block_status(offset, length as u64) {
            Ok(x) => plan(x.iter().map(|x| (x.length, x.zero)), offset, length as u64),
            Err(err) => {
                // Holes only save bandwidth: read it all instead.
                log::debug!("nbd: block status for a read at {offset} length {length} failed: {err}");
                Vec::new()
            }
        }
    };
    match pieces.as_slice() {
        [] => read_whole(e, pool, offset, length).map(|b| Reply::read_chunk(&framing, offset, b)),
        [p] if !p.hole => read_whole(e, pool, offset, length).map(|b| Reply::read_chunk(&framing, offset, b)),
        [p] => {
            let mut out = Vec::with_capacity(MAX_READ_HEAD_LEN + HOLE_PAYLOAD_LEN);
            framing.push_hole(&mut out, p.offset, length, true);
            Ok(Reply::encoded(out))
        }
        _ => read_pieces(e, pool, &framing, &pieces).map(Reply::encoded),
    }
}

/// The whole range in one pooled buffer.
fn read_whole(e: &dyn Export, pool: &BufPool, offset: u64, length: u32) -> Result<Vec<u8>, (ExportError, Vec<u8>)> {
    let mut buf = pool.get(length as usize);
    match e.read(offset, &mut buf) {
        Ok(()) => Ok(buf),
        Err(err) => Err((err, buf)),
    }
}

/// Several chunks encoded into one buffer, each data piece read straight
/// into its place after its header; only the last chunk is flagged DONE.
/// Piece lengths are bounded by the request's (a validated `u32`).
fn read_pieces(
    e: &dyn Export,
    pool: &BufPool,
    framing: &ChunkFraming,
    pieces: &[Piece],
) -> Result<Vec<u8>, (ExportError, Vec<u8>)> {
    let per_chunk = MAX_READ_HEAD_LEN + HOLE_PAYLOAD_LEN;
    let data: u64 = pieces.iter().filter(|p| !p.hole).map(|p| p.length).sum();
    let mut out = pool.get(0);
    out.reserve(per_chunk * pieces.len() + data as usize);
    for (i, p) in pieces.iter().enumerate() {
        let done = i + 1 == pieces.len();
        if p.hole {
            framing.push_hole(&mut out, p.offset, p.length as u32, done);
            continue;
        }
        let (head, n) = framing.read_data_head(p.offset, p.length, done);
        out.extend_from_slice(&head[..n]);
        let start = out.len();
        out.resize(start + p.length as usize, 0);
        if let Err(err) = e.read(p.offset, &mut out[start..]) {
            return Err((err, out));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(offset: u64, length: u64, hole: bool) -> Piece {
        Piece { offset, length, hole }
    }

    #[test]
    fn plan_splits_merges_and_bounds() {
        let k = 4096u64;
        // All data, all hole.
        assert_eq!(plan([(8 * k, false)], 0, 8 * k), vec![piece(0, 8 * k, false)]);
        assert_eq!(plan([(1 << 30, true)], k, 8 * k), vec![piece(k, 8 * k, true)]);
        // Mixed, clipped to the range, neighbours of one kind merged.
        assert_eq!(
            plan([(k, false), (k, false), (2 * k, true), (k, false), (100 * k, true)], 0, 6 * k),
            vec![piece(0, 2 * k, false), piece(2 * k, 2 * k, true), piece(4 * k, k, false), piece(5 * k, k, true)]
        );
        // Short holes count as data, zero-length extents are skipped.
        assert_eq!(
            plan([(k, false), (0, true), (512, true), (k, false)], 0, 2 * k + 512),
            vec![piece(0, 2 * k + 512, false)]
        );
        // What the export does not cover is data.
        assert_eq!(plan([(k, true)], 0, 3 * k), vec![piece(0, k, true), piece(k, 2 * k, false)]);
        assert_eq!(plan([], 0, k), vec![piece(0, k, false)]);
        // A hole clipped below MIN_HOLE by the range end is data.
        assert_eq!(plan([(k, false), (k, true)], 0, k + 100), vec![piece(0, k + 100, false)]);
        // At most MAX_CHUNKS pieces, still covering the range.
        let alternating = (0..1000).map(|i| (k, i % 2 == 1));
        let p = plan(alternating, 0, 1000 * k);
        assert!(p.len() <= MAX_CHUNKS && p.len() >= MAX_CHUNKS - 1, "{}", p.len());
        assert_eq!(p.last().map(|x| (x.offset + x.length, x.hole)), Some((1000 * k, false)));
        assert!(p.windows(2).all(|w| w[0].offset + w[0].length == w[1].offset && w[0].hole != w[1].hole));
    }
}
