//! Free space: per device, a [`SpaceMap`] (free ranges on a tree of the
//! metadata store, persisted by every checkpoint) with a next-fit cursor.
//!
//! Opening a pool reads the space maps as the last checkpoint froze them
//! and puts them right with the catalog's block lists (see
//! `meta/catalog.rs`); it never walks the volume maps. Running out is a
//! value (`None`); a double free or a free outside the data area is a
//! typed error (damaged metadata), never a panic.

pub mod expansion;
pub mod placement;

use crate::map::extent_map::tree_id;
use std::collections::BTreeMap;
use std::sync::Arc;
use tarn_format::{Pba, BLOCK_SIZE};
use tarn_store::{SpaceMap, Store, StoreError};

type Result<T> = std::result::Result<T, StoreError>;

/// Where linear allocation starts on a new pool (Virtual Allocation
/// 2.3.3): at the front of each device's data area, or in its middle,
/// wrapping around to the front when it reaches the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllocationStart {
    #[default]
    Front,
    Middle,
}

/// The pool's free space over all its devices.
pub struct Space {
    pub store: Arc<Store>,
    pub devices: Vec<SpaceMap>,
    /// Blocks user writes may not take: kept for metadata (checkpoints) so
    /// that TRIM, deletes and commits still work when the pool is full.
    pub reserve_blocks: u64,
    /// What `reserve_blocks` was last computed from (extents of every map
    /// and dead list, an upper bound between exact counts) and how many
    /// placements ago it was counted: counting walks every volume, which
    /// with file volumes (an object per file) was most of a write's CPU.
    pub reserve_extents: usize,
    pub reserve_age: u32,
    /// Data blocks allocated to writes whose map entry is not applied yet
    /// (first block -> length): a checkpoint records them, since its frozen
    /// space maps show them used while its maps do not reference them.
    pub inflight: BTreeMap<u64, u64>,
    /// Space-map node blocks changes replaced (free after the next checkpoint).
    pub superseded: Vec<Pba>,
    /// Per device, where metadata allocation goes on (next-fit, apart
    /// from the data cursor: nodes written at a checkpoint do not cut
    /// into a sequential stream of data).
    meta_cursor: Vec<u64>,
    /// A device set aside for guest metadata moved there by hints
    /// (`tarn vol hint --metadata-device`): new data goes elsewhere while
    /// another device has room.
    pub hint_device: Option<usize>,
    /// Metadata goes to the roomiest member, not the primary first (the
    /// rule of pools written before; simulations set it).
    pub metadata_spread: bool,
    /// New homes of `contiguous` regions are searched from a start spread
    /// over the device (VC's random start) instead of the data cursor.
    pub random_region_start: bool,
    /// Devices nothing may be allocated on (bit i: device i): a member
    /// being added until the superblock that lists it is durable, so no
    /// journal record an older superblock replays can name it.
    pub avoid: u32,
}

impl std::fmt::Debug for Space {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Space({} devices, {} free)", self.devices.len(), self.free_blocks())
    }
}

impl Space {
    /// Devices whose data areas (first block, one past the last) are all free.
    pub fn new(store: Arc<Store>, areas: &[(u64, u64)]) -> Result<Space> {
        let mut devices = Vec::with_capacity(areas.len());
        for (i, &(start, end)) in areas.iter().enumerate() {
            devices.push(SpaceMap::new(&store, tree_id::space(i as u16), i as u16, start, end)?);
        }
        Ok(Space::with_maps(store, devices))
    }

    /// Over space maps opened from a checkpoint.
    pub fn with_maps(store: Arc<Store>, devices: Vec<SpaceMap>) -> Space {
        let meta_cursor = devices.iter().map(metadata_start).collect();
        Space {
            store,
            devices,
            reserve_blocks: 0,
            reserve_extents: 0,
            reserve_age: 0,
            inflight: BTreeMap::new(),
            superseded: Vec::new(),
            meta_cursor,
            hint_device: None,
            metadata_spread: false,
            random_region_start: false,
            avoid: 0,
        }
    }

    /// Each checkpoint takes its node blocks first-fit from the start of
    /// the metadata region, so the blocks the last checkpoints freed are
    /// taken again and metadata stays a compact, bounded area (next-fit
    /// would march across the device, and on a thin backing file leave
    /// every block it ever used allocated).
    pub fn restart_metadata_cursor(&mut self) {
        for (c, d) in self.meta_cursor.iter_mut().zip(&self.devices) {
            *c = metadata_start(d);
        }
    }

    pub fn free_blocks(&self) -> u64 {
        self.devices.iter().map(|d| d.free_blocks).sum()
    }

    pub fn data_blocks(&self) -> u64 {
        self.devices.iter().map(|d| d.data_end - d.data_start).sum()
    }

    /// Free blocks on the devices allocation may use (not on a member
    /// being added or evacuated): the reserve must be there, not on a
    /// draining member, or a checkpoint finds no room for its nodes.
    pub fn usable_free_blocks(&self) -> u64 {
        (0..self.devices.len()).filter(|&d| self.usable(d)).map(|d| self.devices[d].free_blocks).sum()
    }

    /// Free blocks user data may still take.
    pub fn available_blocks(&self) -> u64 {
        self.usable_free_blocks().saturating_sub(self.reserve_blocks)
    }

    /// Whether allocation may take space on `device`.
    pub fn usable(&self, device: usize) -> bool {
        device < 32 && self.avoid & (1 << device) == 0
    }

    /// The device with the most free space.
    pub fn roomiest(&self) -> Option<usize> {
        let usable = (0..self.devices.len()).filter(|&d| self.usable(d));
        let data_devices = usable.clone().filter(|&d| Some(d) != self.hint_device);
        data_devices
            .filter(|&d| self.devices[d].free_blocks > 0)
            .max_by_key(|&d| self.devices[d].free_blocks)
            .or_else(|| usable.max_by_key(|&d| self.devices[d].free_blocks))
    }

    /// Where the pool's own metadata (store nodes, catalog segments) goes:
    /// the primary while it has `want` blocks free, else the roomiest
    /// member. The primary holds the journal and the authoritative
    /// superblock, so its loss loses the pool anyway; keeping the trees
    /// with them means the loss of any other member loses no metadata, and
    /// a pool can open DEGRADED without it (parity volumes rebuild its
    /// blocks). Before this rule (the roomiest, ties to the highest index)
    /// the last member often held nodes every open needs.
    pub fn metadata_device(&self, want: u64) -> Option<usize> {
        let primary = !self.metadata_spread && self.usable(0) && self.hint_device != Some(0);
        if primary && self.devices.first().is_some_and(|d| d.free_blocks >= want.max(1)) {
            return Some(0);
        }
        self.roomiest()
    }

    /// The roomiest member among `devices` (bit i for member i) that
    /// allocation may use; with none named or none of them usable (all
    /// being removed), the roomiest of the pool. A named member that is
    /// full is not replaced by another: the volume is out of space there,
    /// as an LVM volume limited to some physical volumes is.
    pub fn roomiest_among(&self, devices: u16) -> Option<usize> {
        let named = |d: usize| d < 16 && devices & (1 << d) != 0 && self.usable(d);
        if !(0..self.devices.len()).any(named) {
            return self.roomiest();
        }
        (0..self.devices.len())
            .filter(|&d| named(d) && self.devices[d].free_blocks > 0)
            .max_by_key(|&d| self.devices[d].free_blocks)
    }

    /// A new member's data area `[start, end)`, all free; allocation
    /// avoids it until [`Space::open_device`]. Returns its index.
    pub fn add_device(&mut self, start: u64, end: u64) -> Result<usize> {
        let i = self.devices.len();
        self.devices.push(SpaceMap::new(&self.store, tree_id::space(i as u16), i as u16, start, end)?);
        self.meta_cursor.push(metadata_start(&self.devices[i]));
        self.avoid |= 1 << i;
        Ok(i)
    }

    /// Extend `device`'s data area to end at `end`: the new blocks join
    /// the space map as free and are held at once as in flight, so a
    /// checkpoint records them free (its `inflight` list) while nothing
    /// takes them before the superblock with the new size is durable;
    /// [`Space::release_growth`] lets them go. Returns the held range.
    pub fn grow_device(&mut self, device: usize, end: u64) -> Result<(Pba, u64)> {
        self.device_mut(Pba::new(device as u16, 0))?;
        let d = &mut self.devices[device];
        let old = d.data_end;
        if end <= old {
            return Ok((Pba::new(device as u16, old), 0));
        }
        d.data_end = end;
        d.give_back(&self.store, old, end - old, &mut self.superseded)?;
        d.claim(&self.store, old, end - old, &mut self.superseded)?;
        let pba = Pba::new(device as u16, old);
        self.inflight.insert(pba.0, end - old);
        Ok((pba, end - old))
    }

    /// The grown range of [`Space::grow_device`], usable now.
    pub fn release_growth(&mut self, pba: Pba, len: u64) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.settle(pba);
        self.give_back(pba, len)
    }

    /// Empty a removed member's slot (`dev remove`, last step): its whole
    /// data area, which must be free, is claimed, leaving an empty space
    /// map, and the area shrinks to nothing; allocation avoids it for good.
    /// A block still used there is an error and changes nothing.
    pub fn empty_device(&mut self, device: usize) -> Result<()> {
        self.device_mut(Pba::new(device as u16, 0))?;
        let d = &mut self.devices[device];
        let area = d.data_end - d.data_start;
        if d.free_blocks != area {
            let what = format!("{} of {area} blocks still used on a member being removed", area - d.free_blocks);
            return Err(StoreError::Invalid { pba: Pba::new(device as u16, 0), tree: d.tree.id, what });
        }
        if area > 0 {
            d.claim(&self.store, d.data_start, area, &mut self.superseded)?;
        }
        d.data_end = d.data_start;
        d.cursor = d.data_start;
        if device < 32 {
            self.avoid |= 1 << device;
        }
        Ok(())
    }

    /// Let allocation take space on `device` again.
    pub fn open_device(&mut self, device: usize) {
        if device < 32 {
            self.avoid &= !(1 << device);
        }
    }

    /// Take exactly `want` blocks from one device (user data respects the
    /// reserve, metadata may use it), or nothing (`Ok(None)`).
    pub fn allocate_on(&mut self, device: usize, want: u64, for_metadata: bool) -> Result<Option<Vec<(Pba, u64)>>> {
        let limit = if for_metadata { self.usable_free_blocks() } else { self.available_blocks() };
        if !self.usable(device) {
            return Ok(None);
        }
        let Some(dev) = self.devices.get_mut(device) else { return Ok(None) };
        if want > limit || dev.free_blocks < want {
            return Ok(None);
        }
        let mut out = Vec::new();
        let got = dev.take(&self.store, want, usize::MAX, &mut out, &mut self.superseded)?;
        if got != want {
            let what = format!("space map took {got} of {want} blocks it counted free");
            return Err(StoreError::Invalid { pba: Pba(0), tree: dev.tree.id, what });
        }
        Ok(Some(out))
    }

    /// Space for metadata (node blocks, catalog segments): may use the
    /// reserve, taken next-fit from the metadata cursor.
    pub fn allocate_metadata(&mut self, device: usize, want: u64) -> Result<Option<Vec<(Pba, u64)>>> {
        let Some(&at) = self.meta_cursor.get(device) else { return Ok(None) };
        let data_cursor = std::mem::replace(&mut self.devices[device].cursor, at);
        let got = self.allocate_on(device, want, true);
        self.meta_cursor[device] = std::mem::replace(&mut self.devices[device].cursor, data_cursor);
        got
    }

    /// Space for new data: recorded as in flight until [`Space::settle`].
    pub fn allocate_data(&mut self, device: usize, want: u64) -> Result<Option<Vec<(Pba, u64)>>> {
        let got = self.allocate_on(device, want, false)?;
        for &(pba, len) in got.iter().flatten() {
            self.inflight.insert(pba.0, len);
        }
        Ok(got)
    }

    /// Space for data a mover places itself: next-fit on `device` from
    /// `cursor` (the mover's, advanced past what it took), in flight
    /// until settled.
    pub fn allocate_data_from(
        &mut self,
        device: usize,
        cursor: &mut u64,
        want: u64,
    ) -> Result<Option<Vec<(Pba, u64)>>> {
        let Some(dev) = self.devices.get_mut(device) else { return Ok(None) };
        let data_cursor = std::mem::replace(&mut dev.cursor, *cursor);
        let got = self.allocate_data(device, want);
        *cursor = std::mem::replace(&mut self.devices[device].cursor, data_cursor);
        got
    }

    /// Take exactly `[pba, pba+len)` for new data if it is all free and
    /// user data may still take that much: in flight until settled.
    pub fn allocate_exact(&mut self, pba: Pba, len: u64) -> Result<bool> {
        if len > self.available_blocks() || !self.usable(usize::from(pba.device())) {
            return Ok(false);
        }
        let Some(dev) = self.devices.get_mut(usize::from(pba.device())) else { return Ok(false) };
        // Free ranges lie inside the data area: a claim outside it fails.
        if !dev.try_claim(&self.store, pba.block(), len, &mut self.superseded)? {
            return Ok(false);
        }
        self.inflight.insert(pba.0, len);
        Ok(true)
    }

    /// A free region of `len` blocks aligned to `len` on `device`, for a
    /// new home of data (nothing is taken: see `placement`). None when the
    /// search, bounded, finds none.
    pub fn find_region(&mut self, device: usize, len: u64) -> Result<Option<Pba>> {
        if !self.usable(device) {
            return Ok(None);
        }
        let Some(dev) = self.devices.get_mut(device) else { return Ok(None) };
        Ok(dev.find_aligned(&self.store, len, REGION_SEARCH_RANGES)?.map(|b| Pba::new(device as u16, b)))
    }

    /// [`Space::find_region`] searching from `start` (a fraction of the
    /// part of the device data fills first, as `start / 2^64`) instead of
    /// the cursor, which stays where it was.
    pub fn find_region_from(&mut self, device: usize, len: u64, start: u64) -> Result<Option<Pba>> {
        let Some(dev) = self.devices.get(device) else { return Ok(None) };
        let span = metadata_start(dev) - dev.data_start;
        let at = dev.data_start + ((u128::from(start) * u128::from(span)) >> 64) as u64;
        self.find_region_at(device, len, at)
    }

    /// [`Space::find_region`] searching forward from block `near` (copy-on-
    /// write's new home near the original), the cursor left where it was.
    /// The search is short: where free space near the original is cut up,
    /// the caller goes on from the cursor instead, which is cheap.
    pub fn find_region_near(&mut self, near: Pba, len: u64) -> Result<Option<Pba>> {
        let device = usize::from(near.device());
        if !self.usable(device) {
            return Ok(None);
        }
        let Some(dev) = self.devices.get(device) else { return Ok(None) };
        let found = dev.aligned_between(&self.store, near.block(), u64::MAX, len, NEAR_SEARCH_RANGES)?;
        Ok(found.map(|b| Pba::new(near.device(), b)))
    }

    pub(crate) fn find_region_at(&mut self, device: usize, len: u64, at: u64) -> Result<Option<Pba>> {
        let cursor = std::mem::replace(&mut self.devices[device].cursor, at);
        let found = self.find_region(device, len);
        self.devices[device].cursor = cursor;
        found
    }

    /// Move every device's data cursor to `start`. The cursor is kept in
    /// each checkpoint's space entries, so this lasts once committed.
    pub fn start_data_at(&mut self, start: AllocationStart) {
        for d in &mut self.devices {
            d.cursor = match start {
                AllocationStart::Front => d.data_start,
                AllocationStart::Middle => d.data_start + (metadata_start(d) - d.data_start) / 2,
            };
        }
    }

    /// Free blocks outside every whole free region of `len` aligned blocks:
    /// the space partly written regions hold (walks the space maps).
    pub fn free_in_partial_regions(&self, len: u64) -> Result<u64> {
        let mut partial = 0;
        for d in &self.devices {
            for (start, n) in d.verify(&self.store)? {
                let first = d.data_start + (start - d.data_start).div_ceil(len) * len;
                let whole = (start + n).saturating_sub(first) / len * len;
                partial += n - whole.min(n);
            }
        }
        Ok(partial)
    }

    /// A piece from [`Space::allocate_data`] is mapped or given back.
    pub fn settle(&mut self, pba: Pba) {
        self.inflight.remove(&pba.0);
    }

    pub fn give_back(&mut self, pba: Pba, len: u64) -> Result<()> {
        self.device_mut(pba)?;
        let dev = &mut self.devices[usize::from(pba.device())];
        dev.give_back(&self.store, pba.block(), len, &mut self.superseded)
    }

    /// Mark a range used that the space map shows free (opening: a
    /// checkpoint's own blocks, blocks replayed maps use).
    pub fn claim(&mut self, pba: Pba, len: u64) -> Result<()> {
        self.device_mut(pba)?;
        let dev = &mut self.devices[usize::from(pba.device())];
        dev.claim(&self.store, pba.block(), len, &mut self.superseded)
    }

    fn device_mut(&mut self, pba: Pba) -> Result<&mut SpaceMap> {
        let n = self.devices.len();
        self.devices.get_mut(usize::from(pba.device())).ok_or_else(|| StoreError::Invalid {
            pba,
            tree: tree_id::space(pba.device()),
            what: format!("block on device {} of a pool of {n}", pba.device()),
        })
    }

    /// Every device's free ranges (walks the space maps).
    pub fn free_ranges(&self, device: usize) -> Result<Vec<(u64, u64)>> {
        self.devices[device].verify(&self.store)
    }
}

/// Free ranges a search for room near a region's data looks at.
const NEAR_SEARCH_RANGES: usize = 64;

/// Free ranges a search for a whole free region looks at before it gives
/// up (the placement then takes any free space).
const REGION_SEARCH_RANGES: usize = 4096;

/// Where metadata allocation starts: seven eighths into the data area
/// (data fills from the front).
pub(crate) fn metadata_start(d: &SpaceMap) -> u64 {
    d.data_end - (d.data_end - d.data_start) / 8
}

/// Blocks kept free for metadata: room for three checkpoints of the
/// current map (the new one is written before the old one is freed) plus
/// slack of 1/32 of the pool, at most 4 MiB.
pub(crate) fn reserve_for(extents: usize, data_blocks: u64) -> u64 {
    let checkpoint_blocks = (extents as u64 * 24).div_ceil(BLOCK_SIZE) + 4;
    (data_blocks / 32).clamp(16, 1024) + 3 * checkpoint_blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(areas: &[(u64, u64)]) -> Space {
        Space::new(Arc::new(Store::memory()), areas).unwrap()
    }

    #[test]
    fn reserve_holds_back_user_writes_not_metadata() {
        let mut s = space(&[(0, 100)]);
        s.reserve_blocks = 20;
        assert!(s.allocate_on(0, 81, false).unwrap().is_none());
        assert!(s.allocate_on(0, 80, false).unwrap().is_some());
        assert!(s.allocate_on(0, 1, false).unwrap().is_none());
        assert!(s.allocate_on(0, 20, true).unwrap().is_some());
    }

    #[test]
    fn named_members_bound_allocation_unless_none_of_them_is_usable() {
        let mut s = space(&[(10, 110), (10, 50), (10, 80)]);
        assert_eq!(s.roomiest_among(0), Some(0), "any member: the roomiest");
        assert_eq!(s.roomiest_among(0b110), Some(2), "the roomiest of members 1 and 2");
        assert_eq!(s.roomiest_among(0b010), Some(1));
        // A named member that is full is not replaced by another.
        s.allocate_on(1, 40, false).unwrap().unwrap();
        assert_eq!(s.roomiest_among(0b010), None);
        // One being removed (avoided) does not count: the others do, and
        // with none usable, any member.
        s.avoid = 0b100;
        assert_eq!(s.roomiest_among(0b110), None, "member 1 full, member 2 avoided");
        assert_eq!(s.roomiest_among(0b100), Some(0));
    }

    #[test]
    fn data_in_flight_is_tracked_until_settled() {
        let mut s = space(&[(10, 110), (10, 50)]);
        assert_eq!(s.roomiest(), Some(0));
        let got = s.allocate_data(0, 30).unwrap().unwrap();
        assert_eq!(got, vec![(Pba::new(0, 10), 30)]);
        assert_eq!(s.inflight.len(), 1);
        s.settle(got[0].0);
        assert!(s.inflight.is_empty());
        s.give_back(Pba::new(0, 15), 5).unwrap();
        assert_eq!(s.free_blocks(), 75 + 40);
    }

    #[test]
    fn double_free_and_unknown_device_are_errors_not_panics() {
        let mut s = space(&[(0, 10)]);
        assert!(s.give_back(Pba::new(0, 3), 1).is_err(), "double free");
        assert!(s.give_back(Pba::new(5, 3), 1).is_err(), "unknown device");
        assert!(s.claim(Pba::new(0, 3), 2).is_ok());
        assert!(s.claim(Pba::new(0, 3), 2).is_err(), "claimed twice");
    }
}
