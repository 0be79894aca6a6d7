//! Block status descriptors: export extents turned into wire descriptors
//! for one metadata context (pure but for the export calls).

use crate::error::ExportError;
use crate::export::{BlockStatusExtent, Export};
use crate::meta::MetaContext;
use crate::protocol::*;

/// Most descriptors in one block status reply, all contexts together (the
/// protocol's recommendation for one chunk, so that several contexts do not
/// multiply the reply size).
pub(crate) const MAX_DESCRIPTORS: usize = 1 << 20;
/// Longest descriptor: the largest 512-aligned `u32`.
const MAX_DESCRIPTOR_LEN: u32 = 0xffff_fe00;

/// What a block status request asks for, as far as descriptors go.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StatusQuery {
    pub offset: u64,
    /// Effect length (64 bits with extended headers).
    pub length: u64,
    /// Export size.
    pub size: u64,
    pub req_one: bool,
    /// Most descriptors to return (REQ_ONE: one; zero is taken as one).
    pub max_descriptors: usize,
}

impl StatusQuery {
    /// Bytes the reply may cover: the request, clipped to the export end.
    pub(crate) fn span(&self) -> u64 {
        self.length.min(self.size.saturating_sub(self.offset))
    }
}

/// `base:allocation` flags of an export extent.
fn base_extent(e: &BlockStatusExtent) -> (u64, u32) {
    let status = if e.hole { NBD_STATE_HOLE } else { 0 } | if e.zero { NBD_STATE_ZERO } else { 0 };
    (e.length, status)
}

/// Turn `(length, status)` extents into wire descriptors (pure).
///
/// Zero-length extents are skipped, adjacent equal statuses are merged,
/// lengths are clipped to the requested range (and the export end) and to
/// 512-aligned `u32`s, the list stops once the range is covered or at
/// `max_descriptors`, and REQ_ONE yields at most one descriptor. Empty
/// only if the extents cover nothing.
pub(crate) fn build_descriptors(
    extents: impl IntoIterator<Item = (u64, u32)>,
    q: &StatusQuery,
) -> Vec<BlockDescriptor> {
    let span = q.span();
    let max = if q.req_one { 1 } else { q.max_descriptors.max(1) };
    let mut out: Vec<BlockDescriptor> = Vec::new();
    let mut covered: u64 = 0;
    for (length, status) in extents {
        if covered >= span {
            break;
        }
        if length == 0 {
            continue;
        }
        let want = length.min(span - covered);
        let len = want.min(MAX_DESCRIPTOR_LEN as u64);
        let full = out.len() >= max;
        match out.last_mut() {
            Some(last) if last.status == status && last.length as u64 + len <= MAX_DESCRIPTOR_LEN as u64 => {
                last.length += len as u32;
            }
            _ if full => break,
            _ => out.push(BlockDescriptor { length: len as u32, status }),
        }
        covered += len;
        if len < want {
            // Cut by the descriptor limit: what follows would be misplaced.
            break;
        }
    }
    out
}

/// Descriptors of one context for a request; fails on an export error or,
/// for an extra context, on an empty answer (a reply without a descriptor
/// would be invalid and could stall the client).
pub(crate) fn context_descriptors(
    e: &dyn Export,
    c: &MetaContext,
    q: &StatusQuery,
) -> Result<Vec<BlockDescriptor>, ExportError> {
    let (offset, length) = (q.offset, q.length);
    if c.is_base_allocation() {
        let d = build_descriptors(e.block_status(offset, length)?.iter().map(base_extent), q);
        if d.is_empty() {
            // Status 0 ("allocated, data") is always a safe answer for base:allocation.
            let length = q.span().clamp(1, MAX_DESCRIPTOR_LEN as u64) as u32;
            return Ok(vec![BlockDescriptor { length, status: 0 }]);
        }
        return Ok(d);
    }
    let d = build_descriptors(e.context_status(&c.name, offset, length)?.iter().map(|x| (x.length, x.flags)), q);
    if d.is_empty() {
        log::warn!("nbd: export returned no extent for {:?} at {offset} length {length}", c.name);
        return Err(ExportError::Io);
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(length: u64, hole: bool) -> (u64, u32) {
        base_extent(&BlockStatusExtent { length, hole, zero: hole })
    }

    fn query(offset: u64, length: u64, size: u64, req_one: bool) -> StatusQuery {
        StatusQuery { offset, length, size, req_one, max_descriptors: MAX_DESCRIPTORS }
    }

    #[test]
    fn descriptors() {
        let d = |l, s| BlockDescriptor { length: l, status: s };
        let hz = NBD_STATE_HOLE | NBD_STATE_ZERO;
        // Merge equal neighbours, skip empty extents.
        assert_eq!(
            build_descriptors(
                [ext(4096, false), ext(0, true), ext(4096, false), ext(8192, true)],
                &query(0, 16384, 1 << 20, false)
            ),
            vec![d(8192, 0), d(8192, hz)]
        );
        // Stop once the request is covered; the last one is clipped to it.
        assert_eq!(
            build_descriptors([ext(4096, false), ext(8192, true), ext(4096, false)], &query(0, 5000, 1 << 20, false)),
            vec![d(4096, 0), d(904, hz)]
        );
        // REQ_ONE: one descriptor, clipped to the request.
        assert_eq!(
            build_descriptors([ext(65536, true), ext(4096, false)], &query(0, 4096, 1 << 20, true)),
            vec![d(4096, hz)]
        );
        assert_eq!(
            build_descriptors([ext(100, true), ext(4096, false)], &query(0, 4096, 1 << 20, true)),
            vec![d(100, hz)]
        );
        // Clipped to the export end.
        assert_eq!(build_descriptors([ext(1 << 30, true)], &query(4096, 8192, 8192, false)), vec![d(4096, hz)]);
        // Nothing usable: empty (callers decide).
        assert!(build_descriptors([], &query(0, 4096, 1 << 20, false)).is_empty());
        assert!(build_descriptors([ext(0, true)], &query(0, 4096, 1 << 20, true)).is_empty());
        // Huge extents are clipped to a 512-aligned u32.
        let r = build_descriptors([ext(1 << 40, true), ext(1, false)], &query(0, u32::MAX as u64, 1 << 41, false));
        assert_eq!(r, vec![d(MAX_DESCRIPTOR_LEN, hz)]);
        // The descriptor budget.
        let mut q = query(0, 1 << 20, 1 << 20, false);
        q.max_descriptors = 2;
        let alternating = (0..100).map(|i| (512u64, i % 2));
        assert_eq!(build_descriptors(alternating, &q), vec![d(512, 0), d(512, 1)]);
        // Arbitrary flags (extra contexts) pass through.
        assert_eq!(
            build_descriptors([(4096, 1), (4096, 1), (8192, 0)], &query(1, 10000, 1 << 20, false)),
            vec![d(8192, 1), d(1808, 0)]
        );
    }
}
