//! Which blocks of an ext2/3/4 file system are metadata (file-system
//! hints, seed 002), found by walking it from below: the static metadata
//! from the geometry and descriptors, then every inode in use for the
//! dynamic metadata: directory blocks, extent-tree and indirect blocks,
//! extended-attribute blocks, slow symlinks, the journal.
//!
//! What the walk reads is never trusted: a pointer outside the file system
//! or a node that does not decode is skipped and counted, never followed;
//! every loop is bounded by the validated geometry. A wrong answer costs
//! placement only: callers move blocks, they never drop them.

use crate::error::Result;
use crate::groups::Groups;
use crate::inode::{
    block_pointers, decode_extent_node, indirect_pointers, ExtentNode, Inode, FIRST_REGULAR_INODE, MAX_EXTENT_DEPTH,
};
use crate::source::{read_range, BlockSource};

/// `bg_flags`: the inode table and bitmap were never initialized.
const INODE_UNINIT: u16 = 0x1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MetaKind {
    /// The primary superblock and descriptors, bitmaps, inode tables.
    Static,
    /// Backup copies of the superblock and descriptors (and reserved
    /// descriptor blocks) in later groups: fsck reads none of them.
    Backup,
    /// The journal inode's blocks.
    Journal,
    /// Directory blocks.
    Directory,
    /// Extent-tree nodes and indirect blocks.
    Tree,
    /// Extended-attribute blocks.
    Xattr,
    /// Targets of symlinks too long for the inode.
    Symlink,
}

impl MetaKind {
    pub const ALL: [MetaKind; 7] = [
        MetaKind::Static,
        MetaKind::Backup,
        MetaKind::Journal,
        MetaKind::Directory,
        MetaKind::Tree,
        MetaKind::Xattr,
        MetaKind::Symlink,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MetaKind::Static => "static",
            MetaKind::Backup => "backup",
            MetaKind::Journal => "journal",
            MetaKind::Directory => "directory",
            MetaKind::Tree => "tree",
            MetaKind::Xattr => "xattr",
            MetaKind::Symlink => "symlink",
        }
    }
}

/// The metadata a walk found, in file-system blocks.
#[derive(Debug, Clone, Default)]
pub struct MetadataMap {
    pub block_size: u32,
    /// (first block, count, kind), sorted, adjacent runs of a kind merged.
    pub runs: Vec<(u64, u64, MetaKind)>,
    /// Inodes in use that were looked at.
    pub inodes: u64,
    /// Pointers or tree nodes ignored because they made no sense.
    pub skipped: u64,
}

impl MetadataMap {
    pub fn blocks_of(&self, kind: MetaKind) -> u64 {
        self.runs.iter().filter(|r| r.2 == kind).map(|r| r.1).sum()
    }
}

/// Walk the file system of `groups` on `src` and find its metadata.
pub fn classify(src: &mut dyn BlockSource, groups: &Groups) -> Result<MetadataMap> {
    let sb = &groups.sb;
    let mut walk = Walk {
        found: Vec::new(),
        skipped: 0,
        first: sb.first_data_block,
        end: sb.blocks_count,
        bs: sb.block_size,
        reads_left: sb.blocks_count,
    };
    for g in 0..sb.group_count() {
        let backups = groups.backup_copies_in(g);
        for (at, len) in groups.static_metadata_in(g) {
            let kind = if backups.contains(&(at, len)) { MetaKind::Backup } else { MetaKind::Static };
            walk.add(at, len, kind);
        }
    }
    let mut inodes = 0;
    for g in 0..sb.group_count() {
        inodes += walk.inodes_of_group(src, groups, g)?;
    }
    Ok(MetadataMap { block_size: sb.block_size, runs: merge(walk.found), inodes, skipped: walk.skipped })
}

struct Walk {
    found: Vec<(u64, u64, MetaKind)>,
    skipped: u64,
    first: u64,
    end: u64,
    bs: u32,
    /// Tree blocks the walk may still read: a sane file system has fewer
    /// than it has blocks, so trees that share or loop stop here.
    reads_left: u64,
}

impl Walk {
    /// Record a run if it lies inside the file system; else count it.
    fn add(&mut self, at: u64, len: u64, kind: MetaKind) -> bool {
        let inside = len > 0 && at >= self.first && at.checked_add(len).is_some_and(|e| e <= self.end);
        if inside {
            self.found.push((at, len, kind));
        } else {
            self.skipped += 1;
        }
        inside
    }

    /// One more tree block may be read (else it is counted as skipped).
    fn take_read(&mut self) -> bool {
        if self.reads_left == 0 {
            self.skipped += 1;
            return false;
        }
        self.reads_left -= 1;
        true
    }

    fn read_block(&mut self, src: &mut dyn BlockSource, block: u64) -> Result<Vec<u8>> {
        read_range(src, block * u64::from(self.bs), self.bs as usize)
    }

    /// Every inode in use in group `g`: returns how many.
    fn inodes_of_group(&mut self, src: &mut dyn BlockSource, groups: &Groups, g: u64) -> Result<u64> {
        let sb = &groups.sb;
        let desc = groups.descs[g as usize];
        if desc.flags & INODE_UNINIT != 0 {
            return Ok(0);
        }
        let bitmap = self.read_block(src, desc.inode_bitmap)?;
        let per_group = sb.inodes_per_group as usize;
        let used: Vec<usize> = (0..per_group).filter(|&i| bitmap[i / 8] & (1 << (i % 8)) != 0).collect();
        let Some(&last) = used.last() else { return Ok(0) };
        let isz = usize::from(sb.inode_size);
        let table_len = ((last + 1) * isz).div_ceil(sb.block_size as usize) * sb.block_size as usize;
        let table = read_range(src, desc.inode_table * u64::from(sb.block_size), table_len)?;
        let mut count = 0;
        for i in used {
            let ino = g * u64::from(sb.inodes_per_group) + i as u64 + 1;
            let inode = Inode::decode(&table[i * isz..(i + 1) * isz]);
            if inode.links == 0 && ino >= u64::from(FIRST_REGULAR_INODE) {
                continue;
            }
            count += 1;
            self.inode_blocks(src, &inode, ino == u64::from(sb.journal_inode))?;
        }
        Ok(count)
    }

    fn inode_blocks(&mut self, src: &mut dyn BlockSource, inode: &Inode, journal: bool) -> Result<()> {
        if inode.xattr_block != 0 {
            self.add(inode.xattr_block, 1, MetaKind::Xattr);
        }
        if inode.has_no_blocks() {
            return Ok(());
        }
        let data_kind = if journal {
            Some(MetaKind::Journal)
        } else if inode.is_dir() {
            Some(MetaKind::Directory)
        } else if inode.is_symlink() {
            Some(MetaKind::Symlink)
        } else {
            None
        };
        if inode.uses_extents() {
            self.extent_tree(src, &inode.i_block, None, data_kind, MAX_EXTENT_DEPTH + 1)
        } else {
            self.block_map(src, inode, data_kind)
        }
    }

    /// An extent node and everything under it; `budget` bounds the depth
    /// (a corrupt tree pointing at itself ends there).
    fn extent_tree(
        &mut self,
        src: &mut dyn BlockSource,
        raw: &[u8],
        depth: Option<u16>,
        data_kind: Option<MetaKind>,
        budget: u16,
    ) -> Result<()> {
        let Some((depth, node)) = decode_extent_node(raw, depth).filter(|_| budget > 0) else {
            self.skipped += 1;
            return Ok(());
        };
        match node {
            ExtentNode::Index(children) => {
                for child in children {
                    if self.add(child, 1, MetaKind::Tree) && self.take_read() {
                        let block = self.read_block(src, child)?;
                        self.extent_tree(src, &block, Some(depth - 1), data_kind, budget - 1)?;
                    }
                }
            }
            ExtentNode::Leaf(extents) => {
                for (at, len) in extents.into_iter().filter(|e| e.1 > 0) {
                    if let Some(kind) = data_kind {
                        self.add(at, len, kind);
                    }
                }
            }
        }
        Ok(())
    }

    /// A block-mapped inode: direct pointers, then the single, double and
    /// triple indirect trees.
    fn block_map(&mut self, src: &mut dyn BlockSource, inode: &Inode, data_kind: Option<MetaKind>) -> Result<()> {
        let ptrs = block_pointers(&inode.i_block);
        for &p in ptrs[..12].iter().filter(|&&p| p != 0) {
            if let Some(kind) = data_kind {
                self.add(p, 1, kind);
            }
        }
        for (level, &p) in ptrs[12..].iter().enumerate() {
            if p != 0 {
                self.indirect(src, p, level as u8, data_kind)?;
            }
        }
        Ok(())
    }

    /// An indirect block of `level` (0: points at data).
    fn indirect(
        &mut self,
        src: &mut dyn BlockSource,
        block: u64,
        level: u8,
        data_kind: Option<MetaKind>,
    ) -> Result<()> {
        if !self.add(block, 1, MetaKind::Tree) {
            return Ok(());
        }
        if (level == 0 && data_kind.is_none()) || !self.take_read() {
            return Ok(());
        }
        let raw = self.read_block(src, block)?;
        for p in indirect_pointers(&raw).filter(|&p| p != 0) {
            match (level, data_kind) {
                (0, Some(kind)) => {
                    self.add(p, 1, kind);
                }
                (0, None) => {}
                _ => self.indirect(src, p, level - 1, data_kind)?,
            }
        }
        Ok(())
    }
}

/// Sort and merge adjacent runs of one kind.
fn merge(mut runs: Vec<(u64, u64, MetaKind)>) -> Vec<(u64, u64, MetaKind)> {
    runs.sort_unstable();
    let mut out: Vec<(u64, u64, MetaKind)> = Vec::with_capacity(runs.len());
    for (at, len, kind) in runs {
        match out.last_mut() {
            Some(last) if last.2 == kind && last.0 + last.1 >= at => last.1 = last.1.max(at + len - last.0),
            _ => out.push((at, len, kind)),
        }
    }
    out
}
