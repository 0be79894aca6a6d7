//! Physical block addresses: which device, which 4 KiB block on it.
//!
//! A `Pba` packs the device index into the top 16 bits and the block number
//! into the low 48 bits (1 EiB per device at 4 KiB blocks), so a map entry
//! names its device without a separate field and extents never straddle
//! devices.

pub const BLOCK_SIZE: u64 = 4096;
pub const BLOCK_SHIFT: u32 = 12;
pub const DEVICE_BITS: u32 = 16;
pub const BLOCK_BITS: u32 = 48;
pub const MAX_DEVICES: usize = 256;
pub const BLOCK_MASK: u64 = (1 << BLOCK_BITS) - 1;
/// The device index of the virtual "origin" device: a clone's map entry on it
/// means "read the origin snapshot at block `pba.block()`". No real device
/// has this index (at most [`MAX_DEVICES`]), and it holds no space.
pub const ORIGIN_DEVICE: u16 = u16::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pba(pub u64);

impl Pba {
    pub fn new(device: u16, block: u64) -> Pba {
        assert!(block <= BLOCK_MASK, "block number {block} exceeds 48 bits");
        Pba((u64::from(device) << BLOCK_BITS) | block)
    }
    pub fn device(self) -> u16 {
        (self.0 >> BLOCK_BITS) as u16
    }
    pub fn block(self) -> u64 {
        self.0 & BLOCK_MASK
    }
    /// Byte offset on its device.
    pub fn byte_offset(self) -> u64 {
        self.block() << BLOCK_SHIFT
    }
    /// The origin marker for logical block `lba` of a clone.
    pub fn origin(lba: u64) -> Pba {
        Pba::new(ORIGIN_DEVICE, lba)
    }
    /// Whether this names the clone's origin rather than real space.
    pub fn is_origin(self) -> bool {
        self.device() == ORIGIN_DEVICE
    }
    pub fn offset_by(self, blocks: u64) -> Pba {
        Pba::new(self.device(), self.block() + blocks)
    }
}

impl std::fmt::Display for Pba {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.device(), self.block())
    }
}
