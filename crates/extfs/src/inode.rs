//! Inodes, and the blocks their mapping structures occupy: extent trees
//! (ext4) and indirect blocks (ext2/3). Offsets as in `struct ext4_inode`.

/// `i_mode` file types.
pub const S_IFMT: u16 = 0xF000;
pub const S_IFDIR: u16 = 0x4000;
pub const S_IFLNK: u16 = 0xA000;
/// `i_flags`.
pub const EXTENTS_FL: u32 = 0x80000;
pub const INLINE_DATA_FL: u32 = 0x1000_0000;
/// Inodes below this number are reserved (root, journal, resize...).
pub const FIRST_REGULAR_INODE: u32 = 11;
pub const RESIZE_INODE: u32 = 7;
/// `i_block` holds 15 block pointers or an extent tree root: 60 bytes.
pub const I_BLOCK_LEN: usize = 60;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub mode: u16,
    pub size: u64,
    pub links: u16,
    pub flags: u32,
    /// The extended-attribute block, 0 if none.
    pub xattr_block: u64,
    pub i_block: [u8; I_BLOCK_LEN],
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Inode {
    /// Decode the first 128 bytes of an inode record (every inode size
    /// has them; the caller slices records of the superblock's size).
    pub fn decode(raw: &[u8]) -> Inode {
        debug_assert!(raw.len() >= 128, "callers slice whole inode records");
        let mut i_block = [0u8; I_BLOCK_LEN];
        i_block.copy_from_slice(&raw[0x28..0x28 + I_BLOCK_LEN]);
        Inode {
            mode: u16_at(raw, 0x00),
            size: u64::from(u32_at(raw, 0x04)) | u64::from(u32_at(raw, 0x6C)) << 32,
            links: u16_at(raw, 0x1A),
            flags: u32_at(raw, 0x20),
            xattr_block: u64::from(u32_at(raw, 0x68)) | u64::from(u16_at(raw, 0x76)) << 32,
            i_block,
        }
    }

    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }

    pub fn is_symlink(&self) -> bool {
        self.mode & S_IFMT == S_IFLNK
    }

    /// No blocks at all: data inline in the inode, or a fast symlink
    /// (its target in `i_block`, never an extent tree).
    pub fn has_no_blocks(&self) -> bool {
        self.flags & INLINE_DATA_FL != 0
            || (self.is_symlink() && self.flags & EXTENTS_FL == 0 && self.size < I_BLOCK_LEN as u64)
    }

    pub fn uses_extents(&self) -> bool {
        self.flags & EXTENTS_FL != 0
    }
}

/// One node of an extent tree, decoded: index entries point at child
/// nodes, leaf entries at data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtentNode {
    /// Child node blocks.
    Index(Vec<u64>),
    /// (first physical block, length) of each extent.
    Leaf(Vec<(u64, u64)>),
}

const EXTENT_MAGIC: u16 = 0xF30A;
/// Deepest tree ext4 builds (the kernel's limit is 5).
pub const MAX_EXTENT_DEPTH: u16 = 5;

/// Decode an extent node (the 60-byte root in the inode or a tree block):
/// `None` when its header is not one (a wrong guess costs placement only).
pub fn decode_extent_node(raw: &[u8], expected_depth: Option<u16>) -> Option<(u16, ExtentNode)> {
    if raw.len() < 12 || u16_at(raw, 0) != EXTENT_MAGIC {
        return None;
    }
    let entries = usize::from(u16_at(raw, 2));
    let max = usize::from(u16_at(raw, 4));
    let depth = u16_at(raw, 6);
    if entries > max
        || 12 + max * 12 > raw.len()
        || depth > MAX_EXTENT_DEPTH
        || expected_depth.is_some_and(|d| d != depth)
    {
        return None;
    }
    let entry = |i: usize| &raw[12 + i * 12..24 + i * 12];
    let node = if depth > 0 {
        ExtentNode::Index(
            (0..entries).map(|i| u64::from(u32_at(entry(i), 4)) | u64::from(u16_at(entry(i), 8)) << 32).collect(),
        )
    } else {
        ExtentNode::Leaf(
            (0..entries)
                .map(|i| {
                    let e = entry(i);
                    let raw_len = u64::from(u16_at(e, 4));
                    // Lengths over 32768 mark unwritten extents.
                    let len = if raw_len > 32768 { raw_len - 32768 } else { raw_len };
                    (u64::from(u32_at(e, 8)) | u64::from(u16_at(e, 6)) << 32, len)
                })
                .collect(),
        )
    };
    Some((depth, node))
}

/// The 15 block pointers of a block-mapped inode: 12 direct, then the
/// single, double and triple indirect block.
pub fn block_pointers(i_block: &[u8; I_BLOCK_LEN]) -> [u64; 15] {
    std::array::from_fn(|i| u64::from(u32_at(i_block, i * 4)))
}

/// Pointers stored in an indirect block.
pub fn indirect_pointers(raw: &[u8]) -> impl Iterator<Item = u64> + '_ {
    raw.chunks_exact(4).map(|c| u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
}
