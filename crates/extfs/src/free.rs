//! Which bytes of a volume a clean ext file system leaves unused: the
//! free bits of its block bitmaps (gray-box reclaim, VA seed 000).

use crate::error::{corrupt, Result};
use crate::groups::{Groups, BLOCK_UNINIT};
use crate::source::{read_range, BlockSource};

/// What a free-space walk found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FreeSummary {
    pub block_size: u32,
    /// Blocks the file system spans.
    pub fs_blocks: u64,
    /// Blocks its bitmaps mark free.
    pub free_blocks: u64,
    /// Groups whose bitmap was never initialized (free but for metadata).
    pub uninit_groups: u64,
}

/// Call `sink(offset, len)` with every byte range of free blocks, in order
/// and merged. A group whose bitmap disagrees with its descriptor's free
/// count is corrupt (e2fsck would fix it): nothing is reported for a file
/// system whose accounting cannot be trusted, so the walk stops there.
pub fn free_byte_ranges(
    src: &mut dyn BlockSource,
    groups: &Groups,
    sink: &mut dyn FnMut(u64, u64) -> Result<()>,
) -> Result<FreeSummary> {
    let sb = &groups.sb;
    let bs = u64::from(sb.block_size);
    let mut summary = FreeSummary { block_size: sb.block_size, fs_blocks: sb.blocks_count, ..FreeSummary::default() };
    let mut pending: Option<(u64, u64)> = None;
    for (g, desc) in groups.descs.iter().enumerate() {
        let g = g as u64;
        let used = if desc.flags & BLOCK_UNINIT != 0 {
            summary.uninit_groups += 1;
            UsedMap::from_runs(sb.group_blocks(g), sb.group_first_block(g), &groups.static_metadata_in(g))
        } else {
            let bitmap = read_range(src, desc.block_bitmap * bs, bs as usize)?;
            let mut used = UsedMap::from_bitmap(&bitmap, sb.group_blocks(g));
            let free = used.free_count();
            if free != desc.free_blocks {
                return Err(corrupt(format!(
                    "group {g}: the block bitmap shows {free} free blocks, the descriptor {}; run e2fsck",
                    desc.free_blocks
                )));
            }
            // Belt and braces: metadata is never reported free, whatever a bitmap says.
            used.mark_runs(sb.group_first_block(g), &groups.static_metadata_in(g));
            used
        };
        for (at, len) in used.free_runs(sb.group_first_block(g)) {
            summary.free_blocks += len;
            pending = match pending {
                Some((s, l)) if s + l == at => Some((s, l + len)),
                Some((s, l)) => {
                    sink(s * bs, l * bs)?;
                    Some((at, len))
                }
                None => Some((at, len)),
            };
        }
    }
    if let Some((s, l)) = pending {
        sink(s * bs, l * bs)?;
    }
    Ok(summary)
}

/// One group's used blocks, one bool per block.
struct UsedMap(Vec<bool>);

impl UsedMap {
    fn from_bitmap(bitmap: &[u8], blocks: u64) -> UsedMap {
        UsedMap((0..blocks as usize).map(|i| bitmap[i / 8] & (1 << (i % 8)) != 0).collect())
    }

    fn from_runs(blocks: u64, first: u64, runs: &[(u64, u64)]) -> UsedMap {
        let mut used = UsedMap(vec![false; blocks as usize]);
        used.mark_runs(first, runs);
        used
    }

    fn mark_runs(&mut self, first: u64, runs: &[(u64, u64)]) {
        for &(at, len) in runs {
            let lo = at.saturating_sub(first) as usize;
            let hi = ((at + len).saturating_sub(first) as usize).min(self.0.len());
            for slot in self.0.iter_mut().take(hi).skip(lo) {
                *slot = true;
            }
        }
    }

    fn free_count(&self) -> u64 {
        self.0.iter().filter(|u| !**u).count() as u64
    }

    /// Runs (absolute block, count) of free blocks.
    fn free_runs(&self, first: u64) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (i, used) in self.0.iter().enumerate() {
            if *used {
                continue;
            }
            let at = first + i as u64;
            match runs.last_mut() {
                Some((s, l)) if *s + *l == at => *l += 1,
                _ => runs.push((at, 1)),
            }
        }
        runs
    }
}
