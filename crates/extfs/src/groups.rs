//! Block group descriptors, and where each group's own metadata lies.
//!
//! Field offsets are those of `struct ext4_group_desc`; with the 64bit
//! feature each address has a high half 0x20 bytes further.

use crate::error::{corrupt, Result};
use crate::source::{read_range, BlockSource};
use crate::superblock::{incompat, Superblock};

/// `bg_flags`: the block bitmap was never written (all free but the
/// group's own metadata).
pub const BLOCK_UNINIT: u16 = 0x2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupDesc {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub free_blocks: u64,
    pub flags: u16,
}

/// Every group's descriptor, with the superblock they were read against.
#[derive(Debug, Clone)]
pub struct Groups {
    pub sb: Superblock,
    pub descs: Vec<GroupDesc>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]))
}

impl GroupDesc {
    fn decode(raw: &[u8], bit64: bool) -> GroupDesc {
        let hi = |at: usize| if bit64 { u32_at(raw, at) << 32 } else { 0 };
        let hi16 = |at: usize| if bit64 { u64::from(u16_at(raw, at)) << 16 } else { 0 };
        GroupDesc {
            block_bitmap: u32_at(raw, 0x00) | hi(0x20),
            inode_bitmap: u32_at(raw, 0x04) | hi(0x24),
            inode_table: u32_at(raw, 0x08) | hi(0x28),
            free_blocks: u64::from(u16_at(raw, 0x0C)) | hi16(0x2C),
            flags: u16_at(raw, 0x12),
        }
    }
}

impl Groups {
    /// Read the primary descriptor table and validate every address in it.
    pub fn read(src: &mut dyn BlockSource, sb: &Superblock) -> Result<Groups> {
        let n = sb.group_count();
        let per_block = sb.descs_per_block();
        let bs = u64::from(sb.block_size);
        let ds = usize::from(sb.desc_size);
        let mut descs = Vec::with_capacity(n as usize);
        let mut table_block = None;
        let mut raw = Vec::new();
        for g in 0..n {
            let block = desc_block(sb, g);
            if table_block != Some(block) {
                raw = read_range(src, block * bs, bs as usize)?;
                table_block = Some(block);
            }
            let at = (g % per_block) as usize * ds;
            let d = GroupDesc::decode(&raw[at..at + ds], sb.has(incompat::BIT64));
            check_desc(sb, g, &d)?;
            descs.push(d);
        }
        Ok(Groups { sb: sb.clone(), descs })
    }

    /// Blocks of group `g` that hold file-system metadata known from the
    /// geometry and descriptors alone: superblock and descriptor copies,
    /// reserved descriptor blocks, and the bitmaps and inode tables (of
    /// any group, with flex_bg) that lie in it. As (first, count) runs.
    pub fn static_metadata_in(&self, g: u64) -> Vec<(u64, u64)> {
        let sb = &self.sb;
        let first = sb.group_first_block(g);
        let end = first + sb.group_blocks(g);
        let mut runs = Vec::new();
        if sb.has_super(g) {
            runs.push((first, 1 + classic_gdt_blocks(sb, g)));
        }
        if let Some(block) = meta_bg_desc_copy(sb, g) {
            runs.push((block, 1));
        }
        let itable = sb.inode_table_blocks();
        for d in &self.descs {
            for (at, len) in [(d.block_bitmap, 1), (d.inode_bitmap, 1), (d.inode_table, itable)] {
                let (lo, hi) = (at.max(first), (at + len).min(end));
                if lo < hi {
                    runs.push((lo, hi - lo));
                }
            }
        }
        runs.sort_unstable();
        runs
    }
}

impl Groups {
    /// The runs of [`Groups::static_metadata_in`] that are backup copies
    /// of the superblock and descriptors (never the primary, in group 0
    /// or, with meta_bg, the first group of each meta group).
    pub fn backup_copies_in(&self, g: u64) -> Vec<(u64, u64)> {
        let sb = &self.sb;
        let mut runs = Vec::new();
        if g > 0 && sb.has_super(g) {
            runs.push((sb.group_first_block(g), 1 + classic_gdt_blocks(sb, g)));
        }
        if let Some(block) = meta_bg_desc_copy(sb, g).filter(|_| !g.is_multiple_of(sb.descs_per_block())) {
            runs.push((block, 1));
        }
        runs
    }
}

/// Descriptor table blocks (plus reserved growth blocks) that follow the
/// superblock copy of group `g`, outside meta_bg's part of the table.
fn classic_gdt_blocks(sb: &Superblock, g: u64) -> u64 {
    let table =
        if sb.has(incompat::META_BG) { u64::from(sb.first_meta_bg).min(sb.gdt_blocks()) } else { sb.gdt_blocks() };
    let reserved = u64::from(sb.reserved_gdt_blocks);
    let room = sb.group_blocks(g).saturating_sub(1);
    (table + reserved).min(room)
}

/// With meta_bg, the descriptor block of a meta group is kept in its first,
/// second and last group, right after any superblock copy.
fn meta_bg_desc_copy(sb: &Superblock, g: u64) -> Option<u64> {
    if !sb.has(incompat::META_BG) {
        return None;
    }
    let per = sb.descs_per_block();
    let (meta, index) = (g / per, g % per);
    if meta < u64::from(sb.first_meta_bg) || !(index == 0 || index == 1 || index == per - 1) {
        return None;
    }
    Some(sb.group_first_block(g) + u64::from(sb.has_super(g)))
}

/// Block holding the primary descriptor of group `g`.
fn desc_block(sb: &Superblock, g: u64) -> u64 {
    let per = sb.descs_per_block();
    let meta = g / per;
    if sb.has(incompat::META_BG) && meta >= u64::from(sb.first_meta_bg) {
        let lead = meta * per;
        return sb.group_first_block(lead) + u64::from(sb.has_super(lead));
    }
    sb.first_data_block + 1 + meta
}

fn check_desc(sb: &Superblock, g: u64, d: &GroupDesc) -> Result<()> {
    let itable = sb.inode_table_blocks();
    let inside =
        |at: u64, len: u64| at >= sb.first_data_block && at.checked_add(len).is_some_and(|e| e <= sb.blocks_count);
    if !inside(d.block_bitmap, 1) || !inside(d.inode_bitmap, 1) || !inside(d.inode_table, itable) {
        return Err(corrupt(format!(
            "group {g}: bitmap at {}, inode bitmap at {}, inode table at {} (+{itable}) outside the {} blocks",
            d.block_bitmap, d.inode_bitmap, d.inode_table, sb.blocks_count
        )));
    }
    if d.free_blocks > sb.group_blocks(g) {
        return Err(corrupt(format!("group {g}: {} free blocks of {}", d.free_blocks, sb.group_blocks(g))));
    }
    Ok(())
}
