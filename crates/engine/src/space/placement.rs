//! Placement policies decide where new extents go. The engine asks the
//! policy; the policy asks the space map. Only `linear` exists today; the
//! append, in-place and virtual-contiguity policies plug in here.

use crate::space::Space;
use tarn_format::Pba;
use tarn_store::StoreError;

pub trait Placement: Send + Sync {
    fn name(&self) -> &'static str;
    /// Choose `len` new physical blocks for logical blocks [lba, lba+len) of
    /// `volume`. `Ok(None)` means the pool cannot hold them.
    fn place(
        &mut self,
        space: &mut Space,
        volume: u32,
        lba: u64,
        len: u64,
    ) -> Result<Option<Vec<(Pba, u64)>>, StoreError>;
}

/// Next-fit from a moving cursor on the device with the most free space
/// (Virtual Allocation's linear allocation): writes that arrive together land
/// together, so random writes become mostly sequential on the device and a
/// sequential stream stays contiguous.
#[derive(Debug, Default)]
pub struct Linear;

impl Placement for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn place(
        &mut self,
        space: &mut Space,
        _volume: u32,
        _lba: u64,
        len: u64,
    ) -> Result<Option<Vec<(Pba, u64)>>, StoreError> {
        let Some(device) = space.roomiest() else { return Ok(None) };
        space.allocate_data(device, len)
    }
}
