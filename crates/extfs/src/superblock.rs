//! The ext2/3/4 superblock: geometry, features and state, validated.
//!
//! Byte offsets are those of the kernel's `struct ext4_super_block`
//! (fs/ext4/ext4.h); all fields are little-endian.

use crate::error::{corrupt, ExtError, Result};
use crate::source::{read_range, BlockSource};

/// The primary superblock lies 1024 bytes into the volume, whatever the
/// block size.
pub const SUPERBLOCK_OFFSET: u64 = 1024;
const SUPERBLOCK_LEN: usize = 1024;
const MAGIC: u16 = 0xEF53;

/// Most groups a volume may have here: 2^24 groups of 32768 4 KiB blocks
/// is 2 PiB, and bounds the descriptor table read into memory (1 GiB).
pub const MAX_GROUPS: u64 = 1 << 24;

pub mod compat {
    pub const HAS_JOURNAL: u32 = 0x4;
    pub const SPARSE_SUPER2: u32 = 0x200;
}

pub mod incompat {
    pub const FILETYPE: u32 = 0x2;
    pub const RECOVER: u32 = 0x4;
    pub const JOURNAL_DEV: u32 = 0x8;
    pub const META_BG: u32 = 0x10;
    pub const EXTENTS: u32 = 0x40;
    pub const BIT64: u32 = 0x80;
    pub const MMP: u32 = 0x100;
    pub const FLEX_BG: u32 = 0x200;
    pub const EA_INODE: u32 = 0x400;
    pub const DIRDATA: u32 = 0x1000;
    pub const CSUM_SEED: u32 = 0x2000;
    pub const LARGEDIR: u32 = 0x4000;
    pub const INLINE_DATA: u32 = 0x8000;
    pub const ENCRYPT: u32 = 0x10000;
    pub const CASEFOLD: u32 = 0x20000;
    /// Every feature whose effect on block usage is understood: none of
    /// them changes what a set bit in a block bitmap means.
    pub const KNOWN: u32 = FILETYPE
        | RECOVER
        | META_BG
        | EXTENTS
        | BIT64
        | MMP
        | FLEX_BG
        | EA_INODE
        | DIRDATA
        | CSUM_SEED
        | LARGEDIR
        | INLINE_DATA
        | ENCRYPT
        | CASEFOLD;
}

pub mod ro_compat {
    pub const SPARSE_SUPER: u32 = 0x1;
    pub const BIGALLOC: u32 = 0x200;
}

/// State bits of `s_state`.
const STATE_VALID: u16 = 0x1;
const STATE_ERROR: u16 = 0x2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub inodes_count: u32,
    pub blocks_count: u64,
    pub free_blocks: u64,
    pub first_data_block: u64,
    pub block_size: u32,
    pub blocks_per_group: u32,
    pub inodes_per_group: u32,
    pub inode_size: u16,
    pub state: u16,
    pub compat: u32,
    pub incompat: u32,
    pub ro_compat: u32,
    pub reserved_gdt_blocks: u16,
    pub journal_inode: u32,
    pub desc_size: u16,
    pub first_meta_bg: u32,
    pub log_groups_per_flex: u8,
    pub backup_groups: [u32; 2],
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Superblock {
    /// Read and validate the primary superblock of `src`.
    pub fn read(src: &mut dyn BlockSource) -> Result<Superblock> {
        if src.size() < SUPERBLOCK_OFFSET + SUPERBLOCK_LEN as u64 {
            return Err(ExtError::NotExt { found: 0 });
        }
        let raw = read_range(src, SUPERBLOCK_OFFSET, SUPERBLOCK_LEN)?;
        let sb = Superblock::decode(&raw)?;
        sb.check_fits(src.size())?;
        Ok(sb)
    }

    /// Decode 1024 superblock bytes; geometry is validated, features not
    /// (see [`Superblock::check_readable`]).
    pub fn decode(raw: &[u8]) -> Result<Superblock> {
        if raw.len() < SUPERBLOCK_LEN {
            return Err(corrupt(format!("superblock of {} bytes", raw.len())));
        }
        let magic = u16_at(raw, 0x38);
        if magic != MAGIC {
            return Err(ExtError::NotExt { found: magic });
        }
        let incompat = u32_at(raw, 0x60);
        let bit64 = incompat & incompat::BIT64 != 0;
        let log_block = u32_at(raw, 0x18);
        if log_block > 6 {
            return Err(corrupt(format!("block size 1024 << {log_block}")));
        }
        let rev = u32_at(raw, 0x4C);
        let sb = Superblock {
            inodes_count: u32_at(raw, 0x00),
            blocks_count: u64::from(u32_at(raw, 0x04)) | if bit64 { u64::from(u32_at(raw, 0x150)) << 32 } else { 0 },
            free_blocks: u64::from(u32_at(raw, 0x0C)) | if bit64 { u64::from(u32_at(raw, 0x158)) << 32 } else { 0 },
            first_data_block: u64::from(u32_at(raw, 0x14)),
            block_size: 1024 << log_block,
            blocks_per_group: u32_at(raw, 0x20),
            inodes_per_group: u32_at(raw, 0x28),
            inode_size: if rev == 0 { 128 } else { u16_at(raw, 0x58) },
            state: u16_at(raw, 0x3A),
            compat: u32_at(raw, 0x5C),
            incompat,
            ro_compat: u32_at(raw, 0x64),
            reserved_gdt_blocks: u16_at(raw, 0xCE),
            journal_inode: u32_at(raw, 0xE0),
            desc_size: if bit64 { u16_at(raw, 0xFE) } else { 32 },
            first_meta_bg: u32_at(raw, 0x104),
            log_groups_per_flex: raw[0x174],
            backup_groups: [u32_at(raw, 0x24C), u32_at(raw, 0x250)],
        };
        sb.check_geometry()?;
        Ok(sb)
    }

    fn check_geometry(&self) -> Result<()> {
        let bs = u64::from(self.block_size);
        let expected_first = u64::from(self.block_size == 1024);
        if self.first_data_block != expected_first {
            return Err(corrupt(format!("first data block {} with {bs}-byte blocks", self.first_data_block)));
        }
        if self.blocks_per_group == 0 || u64::from(self.blocks_per_group) > bs * 8 {
            return Err(corrupt(format!(
                "{} blocks per group (a bitmap block holds {})",
                self.blocks_per_group,
                bs * 8
            )));
        }
        if self.inodes_per_group == 0 || u64::from(self.inodes_per_group) > bs * 8 {
            return Err(corrupt(format!("{} inodes per group", self.inodes_per_group)));
        }
        if self.inode_size < 128 || !self.inode_size.is_power_of_two() || u32::from(self.inode_size) > self.block_size {
            return Err(corrupt(format!("inode size {}", self.inode_size)));
        }
        // With 64bit the descriptor's high halves live at 0x20..0x40.
        let min_desc = if self.has(incompat::BIT64) { 64 } else { 32 };
        if self.desc_size < min_desc || !self.desc_size.is_power_of_two() || u32::from(self.desc_size) > self.block_size
        {
            return Err(corrupt(format!("group descriptor size {}", self.desc_size)));
        }
        if self.blocks_count <= self.first_data_block {
            return Err(corrupt(format!("{} blocks", self.blocks_count)));
        }
        if self.group_count() > MAX_GROUPS {
            return Err(corrupt(format!("{} block groups (at most {MAX_GROUPS})", self.group_count())));
        }
        Ok(())
    }

    /// The file system must lie inside the volume: a superblock claiming
    /// more is corrupt or belongs to a larger disk (a truncated image).
    fn check_fits(&self, volume_bytes: u64) -> Result<()> {
        let fs_bytes = self.blocks_count.checked_mul(u64::from(self.block_size));
        if fs_bytes.is_none_or(|b| b > volume_bytes) {
            return Err(corrupt(format!(
                "{} blocks of {} bytes do not fit the volume's {volume_bytes} bytes",
                self.blocks_count, self.block_size
            )));
        }
        Ok(())
    }

    /// Refuse features that change what the bitmaps mean.
    pub fn check_readable(&self) -> Result<()> {
        if self.incompat & incompat::JOURNAL_DEV != 0 {
            return Err(ExtError::Unsupported("this is an external journal device, not a file system".into()));
        }
        let unknown = self.incompat & !incompat::KNOWN;
        if unknown != 0 {
            return Err(ExtError::Unsupported(format!("incompatible feature bits {unknown:#x}")));
        }
        if self.ro_compat & ro_compat::BIGALLOC != 0 {
            return Err(ExtError::Unsupported("bigalloc (bitmaps count clusters)".into()));
        }
        Ok(())
    }

    /// The on-disk bitmaps are the truth only when the file system was
    /// cleanly unmounted (or frozen) and has no journal left to replay.
    pub fn check_clean(&self) -> Result<()> {
        if self.state & STATE_ERROR != 0 {
            return Err(ExtError::NotClean("it recorded errors; run e2fsck first".into()));
        }
        if self.incompat & incompat::RECOVER != 0 {
            return Err(ExtError::NotClean(
                "its journal needs recovery (mounted, or not cleanly unmounted): unmount it, \
                 or freeze it (fsfreeze -f) while reclaiming"
                    .into(),
            ));
        }
        if self.state & STATE_VALID == 0 {
            return Err(ExtError::NotClean("it is mounted or was not cleanly unmounted (run e2fsck)".into()));
        }
        Ok(())
    }

    /// Block groups: the last one may be short.
    pub fn group_count(&self) -> u64 {
        (self.blocks_count - self.first_data_block).div_ceil(u64::from(self.blocks_per_group))
    }

    /// First block of group `g`.
    pub fn group_first_block(&self, g: u64) -> u64 {
        self.first_data_block + g * u64::from(self.blocks_per_group)
    }

    /// Blocks group `g` spans (the last one may be short).
    pub fn group_blocks(&self, g: u64) -> u64 {
        let first = self.group_first_block(g);
        u64::from(self.blocks_per_group).min(self.blocks_count - first)
    }

    /// Whether group `g` carries a copy of the superblock (and of the
    /// descriptor table, outside meta_bg).
    pub fn has_super(&self, g: u64) -> bool {
        if g == 0 {
            return true;
        }
        if self.compat & compat::SPARSE_SUPER2 != 0 {
            return self.backup_groups.iter().any(|&b| u64::from(b) == g);
        }
        if self.ro_compat & ro_compat::SPARSE_SUPER == 0 || g == 1 {
            return true;
        }
        [3u64, 5, 7].iter().any(|&base| is_power_of(g, base))
    }

    pub fn descs_per_block(&self) -> u64 {
        u64::from(self.block_size / u32::from(self.desc_size))
    }

    /// Blocks of the whole descriptor table (outside meta_bg).
    pub fn gdt_blocks(&self) -> u64 {
        self.group_count().div_ceil(self.descs_per_block())
    }

    pub fn inode_table_blocks(&self) -> u64 {
        (u64::from(self.inodes_per_group) * u64::from(self.inode_size)).div_ceil(u64::from(self.block_size))
    }

    pub fn has(&self, incompat_bit: u32) -> bool {
        self.incompat & incompat_bit != 0
    }
}

fn is_power_of(mut n: u64, base: u64) -> bool {
    while n > 1 && n.is_multiple_of(base) {
        n /= base;
    }
    n == 1
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal valid superblock: 4 KiB blocks, `blocks` blocks.
    pub fn raw_superblock(blocks: u32) -> Vec<u8> {
        let mut raw = vec![0u8; SUPERBLOCK_LEN];
        raw[0x00..0x04].copy_from_slice(&8192u32.to_le_bytes());
        raw[0x04..0x08].copy_from_slice(&blocks.to_le_bytes());
        raw[0x18..0x1C].copy_from_slice(&2u32.to_le_bytes());
        raw[0x20..0x24].copy_from_slice(&32768u32.to_le_bytes());
        raw[0x28..0x2C].copy_from_slice(&8192u32.to_le_bytes());
        raw[0x38..0x3A].copy_from_slice(&MAGIC.to_le_bytes());
        raw[0x3A..0x3C].copy_from_slice(&STATE_VALID.to_le_bytes());
        raw[0x4C..0x50].copy_from_slice(&1u32.to_le_bytes());
        raw[0x58..0x5A].copy_from_slice(&256u16.to_le_bytes());
        raw[0x64..0x68].copy_from_slice(&ro_compat::SPARSE_SUPER.to_le_bytes());
        raw
    }

    #[test]
    fn decodes_geometry() {
        let sb = Superblock::decode(&raw_superblock(100_000)).unwrap();
        assert_eq!(sb.block_size, 4096);
        assert_eq!(sb.group_count(), 4);
        assert_eq!(sb.group_blocks(3), 100_000 - 3 * 32768);
        assert_eq!(sb.inode_table_blocks(), 512);
        sb.check_clean().unwrap();
        sb.check_readable().unwrap();
    }

    #[test]
    fn sparse_super_backups() {
        let sb = Superblock::decode(&raw_superblock(100_000)).unwrap();
        let with: Vec<u64> = (0..100).filter(|&g| sb.has_super(g)).collect();
        assert_eq!(with, vec![0, 1, 3, 5, 7, 9, 25, 27, 49, 81]);
    }

    #[test]
    fn rejects_bad_fields() {
        let mut raw = raw_superblock(100_000);
        raw[0x38] = 0;
        assert!(matches!(Superblock::decode(&raw), Err(ExtError::NotExt { .. })));
        let mut raw = raw_superblock(100_000);
        raw[0x18] = 9;
        assert!(matches!(Superblock::decode(&raw), Err(ExtError::Corrupt(_))));
        let mut raw = raw_superblock(100_000);
        raw[0x20..0x24].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(Superblock::decode(&raw), Err(ExtError::Corrupt(_))));
        // Found by fuzzing: 64bit with 32-byte descriptors (high halves past the end).
        let mut raw = raw_superblock(100_000);
        raw[0x60..0x64].copy_from_slice(&incompat::BIT64.to_le_bytes());
        raw[0xFE..0x100].copy_from_slice(&32u16.to_le_bytes());
        assert!(matches!(Superblock::decode(&raw), Err(ExtError::Corrupt(_))));
        let mut raw = raw_superblock(100_000);
        raw[0x60..0x64].copy_from_slice(&incompat::RECOVER.to_le_bytes());
        assert!(matches!(Superblock::decode(&raw).unwrap().check_clean(), Err(ExtError::NotClean(_))));
        let mut raw = raw_superblock(100_000);
        raw[0x60..0x64].copy_from_slice(&0x8000_0000u32.to_le_bytes());
        assert!(matches!(Superblock::decode(&raw).unwrap().check_readable(), Err(ExtError::Unsupported(_))));
    }
}
