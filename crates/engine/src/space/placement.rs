//! Placement policies decide where new extents go, and whether an
//! overwrite goes in place. The engine asks the policy; the policy asks
//! the space map. Each volume may name its own (`vol create --placement`,
//! `vol set`, recorded by op 15); the others follow the pool's default
//! (`tarn serve --placement`, `linear` unless given).

use crate::space::Space;
use tarn_format::placement::PolicyCode;
use tarn_format::Pba;
use tarn_store::StoreError;

type Placed = Result<Option<Vec<(Pba, u64)>>, StoreError>;

/// The placement policies there are, by name. `linear` stays the default
/// until `contiguous` no longer costs random first writes half their rate
/// (docs/ARCHITECTURE.md *Placement*).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PlacementKind {
    /// [`Linear`]: next-fit, new data in arrival order; overwrites in
    /// place, a sequential write over scattered data re-laid whole.
    #[default]
    Linear,
    /// Next-fit like `linear`, every overwrite in place, never re-laid
    /// (Virtual Allocation's allocate-once, update-in-place); the idle
    /// compactor leaves it alone (`pool compact` asked for still runs).
    Inplace,
    /// Every write, new data or overwrite, at the allocation cursor
    /// (AoDI's append-only): random writes become sequential on the
    /// device; what an overwrite replaces is freed at the next commit.
    Append,
    /// [`Contiguous`]: dense regions, sequential data stays sequential.
    Contiguous,
}

impl PlacementKind {
    pub const NAMES: [&'static str; 4] = ["linear", "inplace", "append", "contiguous"];

    pub fn parse(name: &str) -> Option<PlacementKind> {
        PolicyCode::parse(name).map(PlacementKind::from)
    }

    pub fn name(self) -> &'static str {
        PolicyCode::from(self).name()
    }

    pub fn policy(self) -> &'static dyn Placement {
        match self {
            PlacementKind::Contiguous => &Contiguous,
            PlacementKind::Linear | PlacementKind::Inplace | PlacementKind::Append => &Linear,
        }
    }

    /// Whether a block the head owns alone is overwritten where it is.
    pub fn overwrites_in_place(self) -> bool {
        self != PlacementKind::Append
    }

    /// Whether a sequential write over scattered data goes to new space
    /// whole (re-layout, `volumes/relayout.rs`).
    pub fn relays_out(self) -> bool {
        matches!(self, PlacementKind::Linear | PlacementKind::Contiguous)
    }
}

impl From<PolicyCode> for PlacementKind {
    fn from(p: PolicyCode) -> PlacementKind {
        match p {
            PolicyCode::Linear => PlacementKind::Linear,
            PolicyCode::Inplace => PlacementKind::Inplace,
            PolicyCode::Append => PlacementKind::Append,
            PolicyCode::Contiguous => PlacementKind::Contiguous,
        }
    }
}

impl From<PlacementKind> for PolicyCode {
    fn from(k: PlacementKind) -> PolicyCode {
        match k {
            PlacementKind::Linear => PolicyCode::Linear,
            PlacementKind::Inplace => PolicyCode::Inplace,
            PlacementKind::Append => PolicyCode::Append,
            PlacementKind::Contiguous => PolicyCode::Contiguous,
        }
    }
}

/// Logical blocks per region of `contiguous` placement unless the pool
/// is opened with another size (`tarn serve --region-size`): 256 KiB, the
/// Virtual Contiguity paper's segment.
pub const DEFAULT_REGION_BLOCKS: u64 = 64;

/// The largest region: 64 MiB (a home is searched for as one free run).
pub const MAX_REGION_BLOCKS: u64 = 16384;

/// Whether `blocks` can be a region size on devices whose smallest data
/// area is `smallest_area` blocks: a power of two from one block to
/// [`MAX_REGION_BLOCKS`], no larger than a device. The error says why not.
pub fn check_region_blocks(blocks: u64, smallest_area: u64) -> Result<(), String> {
    if blocks == 0 || !blocks.is_power_of_two() || blocks > MAX_REGION_BLOCKS {
        return Err(format!(
            "a region of {blocks} blocks: it must be a power of two of 4 KiB blocks, from 4 KiB to {} MiB",
            MAX_REGION_BLOCKS / 256
        ));
    }
    if blocks > smallest_area {
        return Err(format!("a region of {blocks} blocks is larger than a device ({smallest_area} blocks of data)"));
    }
    Ok(())
}

/// Where a logical region of a volume already has data: the physical
/// blocks its first block maps to, or would map to, in each place its
/// data lies (best first), then the block after the previous region's
/// last one. Built from the volume's map by the write path.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Near {
    pub bases: Vec<Pba>,
    /// The region's own home holding most of its data (the first of
    /// `bases` when the region has data): a new home is searched for
    /// from there, so copy-on-write lands near the original (VC's rule).
    pub home: Option<Pba>,
    /// The block after the region's copies: its data outside `home`
    /// (copied on write since a snapshot), whose next copy packs on
    /// there, so a region's copies are read as one dense run.
    pub tail: Option<Pba>,
    /// Where the region's pieces lie (first block, block after each),
    /// in map order: a copy with no room after the others goes right
    /// after or before one of them, still read with the region.
    pub edges: Vec<(Pba, Pba)>,
}

impl Near {
    /// Note pieces just placed for logical blocks from `lba` (one
    /// region of `region` blocks): those off their home's offsets are
    /// copies, and the next copy follows the last of them.
    pub fn note_placed(&mut self, lba: u64, pieces: &[(Pba, u64)], region: u64) {
        let mut at = lba;
        for &(pba, len) in pieces {
            let at_home = self.home.and_then(|h| h.block().checked_add(at % region)).map(|b| Pba::new(pba.device(), b));
            if self.home.is_some() && at_home != Some(pba) {
                self.tail = Some(pba.offset_by(len));
            }
            at += len;
        }
    }
}

/// Whose data is placed: the volume, and the members its new data may
/// go to (bit i for member i; 0: any; see [`Space::roomiest_among`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Owner {
    pub volume: u32,
    pub devices: u16,
}

pub trait Placement: Send + Sync {
    fn name(&self) -> &'static str;
    /// Whether `place` looks at [`Near`] (the write path reads the map
    /// around each hole for it only then).
    fn wants_near(&self) -> bool {
        false
    }
    /// Choose `len` new physical blocks for logical blocks [lba, lba+len) of
    /// `owner`'s volume, all in one region of `region` blocks, on its
    /// members. `Ok(None)` means they cannot hold them.
    fn place(&self, space: &mut Space, owner: Owner, lba: u64, len: u64, near: &Near, region: u64) -> Placed;
}

/// Next-fit from a moving cursor on the device with the most free space
/// (Virtual Allocation's linear allocation): writes that arrive together land
/// together, so random writes become mostly sequential on the device and a
/// sequential stream stays contiguous. A volume first written at random
/// keeps that scattered layout for life.
#[derive(Debug, Default)]
pub struct Linear;

impl Placement for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn place(&self, space: &mut Space, owner: Owner, _lba: u64, len: u64, _near: &Near, _region: u64) -> Placed {
        let Some(device) = space.roomiest_among(owner.devices) else { return Ok(None) };
        space.allocate_data(device, len)
    }
}

/// Dense regions (Virtual Contiguity's): each logical region of a volume
/// (256 KiB unless configured) has a physical home of its size, and a
/// block goes at its own offset there, whatever order the blocks are
/// written in. A region's first write takes a whole free region as home:
/// the one right after the previous logical region's data when that is
/// free, so a sequential stream stays one run; else the next free one
/// from the data cursor (regions first written together lie together), or
/// with [`Space::random_region_start`] from a start spread uniformly over
/// the device (the paper's random start; derived from volume and region,
/// so a replay places the same). A block whose place at home is taken (a
/// snapshot holds the old version) is a copy: on after the region's
/// earlier copies, else right beside a piece of the region, else packed
/// from the start of a new run near the home (docs/ARCHITECTURE.md
/// *Placement*). When no whole
/// region is free the space partly written regions hold is used like
/// `linear`'s: ENOSPC only when no block is left.
#[derive(Debug, Default)]
pub struct Contiguous;

impl Placement for Contiguous {
    fn name(&self) -> &'static str {
        "contiguous"
    }

    fn wants_near(&self) -> bool {
        true
    }

    fn place(&self, space: &mut Space, owner: Owner, lba: u64, len: u64, near: &Near, region: u64) -> Placed {
        let off = lba % region;
        assert!(off + len <= region, "a placement request crosses a region");
        let named = |d: usize| owner.devices == 0 || (d < 16 && owner.devices & (1 << d) != 0);
        let (home, others) = near.bases.split_at(usize::from(near.home.is_some()).min(near.bases.len()));
        if let Some(at) = at_offset(space, off, len, home, named)? {
            return Ok(Some(at));
        }
        // A copy on write (its place at home is taken: a snapshot holds
        // the old block) packs on after the region's earlier copies.
        // (Free blocks inside the home were tried as well: the copy is
        // then read with the home, but a read of one file's blocks spans
        // the other files' blocks of the region to reach it: 81% dense
        // against 86% on the web-server replay.)
        if let Some(tail) = near.tail.filter(|t| named(usize::from(t.device()))) {
            if space.allocate_exact(tail, len)? {
                return Ok(Some(vec![(tail, len)]));
            }
        }
        // The block after the copies is taken: right beside any piece of
        // the region, so its read goes on through (a gap is read through
        // as chaff under a region) rather than to a new run of copies
        // (web-server replay: 2.90 -> 2.79 reads per rewritten file,
        // density after copy-on-write 89.0 -> 85.6%). Only for a region
        // that has copies: the first copy of a region goes after its home.
        if near.tail.is_some() {
            if let Some(at) = beside(space, &near.edges, len, named)? {
                return Ok(Some(at));
            }
        }
        // A region with no data yet continues the previous region's run
        // (`others` is then the block after it). One with data is read
        // from its home and its copies: a copy at its offset in another
        // place of it (its base computed from a packed run of copies, an
        // arbitrary block) would add a place to read (web-server replay:
        // 2.97 -> 2.98 reads per rewritten file, 87.5 -> 89.9% dense).
        if near.home.is_none() {
            if let Some(at) = at_offset(space, off, len, others, named)? {
                return Ok(Some(at));
            }
        }
        if let Some(original) = near.home.filter(|h| named(usize::from(h.device()))) {
            // The region's first copies: packed from the start of the
            // first whole free region after the original.
            if let Some(at) = copies_near(space, original, len, region)? {
                return Ok(Some(at));
            }
        }
        if let Some(device) = space.roomiest_among(owner.devices) {
            let home = if space.random_region_start {
                space.find_region_from(device, region, spread(owner.volume, lba / region))?
            } else {
                space.find_region(device, region)?
            };
            if let Some(home) = home {
                // A copy (the region has data) packs from the start of
                // the new run, as near the home: at its offset it would
                // leave the run's front free for others to fill, a third
                // place to read (web-server replay: 2.98 -> 2.90 reads per
                // rewritten file; 1,661 copies went this way when the
                // short search near the home found no whole free region).
                let at = if near.home.is_some() { home } else { home.offset_by(off) };
                if space.allocate_exact(at, len)? {
                    return Ok(Some(vec![(at, len)]));
                }
            }
        }
        Linear.place(space, owner, lba, len, near, region)
    }
}

/// Blocks [off, off+len) of a region at their offsets in one of its
/// places (`bases` on the members `named`), if free there.
fn at_offset(space: &mut Space, off: u64, len: u64, bases: &[Pba], named: impl Fn(usize) -> bool) -> Placed {
    for &base in bases.iter().filter(|b| named(usize::from(b.device()))) {
        if let Some(at) = base.block().checked_add(off).map(|b| Pba::new(base.device(), b)) {
            if space.allocate_exact(at, len)? {
                return Ok(Some(vec![(at, len)]));
            }
        }
    }
    Ok(None)
}

/// `len` free blocks right after or right before one of a region's
/// pieces (`edges`, on the members `named`), the first that has room.
fn beside(space: &mut Space, edges: &[(Pba, Pba)], len: u64, named: impl Fn(usize) -> bool) -> Placed {
    for &(start, end) in edges.iter().filter(|e| named(usize::from(e.0.device()))) {
        if space.allocate_exact(end, len)? {
            return Ok(Some(vec![(end, len)]));
        }
        if let Some(before) = start.block().checked_sub(len).map(|b| Pba::new(start.device(), b)) {
            if space.allocate_exact(before, len)? {
                return Ok(Some(vec![(before, len)]));
            }
        }
    }
    Ok(None)
}

/// `len` blocks at the start of the first whole free region after
/// `original` a short search finds: where a region's copies begin.
/// Packed rather than at their offsets, so a region rewritten in part
/// (a tenth of it, say) is read as its home plus one short dense run,
/// not plus a second home's span of mostly free blocks.
fn copies_near(space: &mut Space, original: Pba, len: u64, region: u64) -> Placed {
    let Some(start) = space.find_region_near(original, region)? else { return Ok(None) };
    Ok(space.allocate_exact(start, len)?.then(|| vec![(start, len)]))
}

/// A number uniformly spread over u64 for a volume's logical region
/// (splitmix64 of both): where the search for its home starts, as a
/// fraction of the device. Deterministic, so the crash simulation and
/// `tarn trace replay` place as a live run does.
fn spread(volume: u32, region: u64) -> u64 {
    let mut z = (u64::from(volume) << 40 ^ region).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tarn_store::Store;

    const R: u64 = DEFAULT_REGION_BLOCKS;

    fn vol(volume: u32) -> Owner {
        Owner { volume, devices: 0 }
    }

    fn space(blocks: u64) -> Space {
        Space::new(Arc::new(Store::memory()), &[(0, blocks)]).unwrap()
    }

    fn place(s: &mut Space, lba: u64, len: u64, bases: &[Pba]) -> Vec<(Pba, u64)> {
        Contiguous
            .place(s, vol(1), lba, len, &Near { bases: bases.to_vec(), ..Near::default() }, R)
            .unwrap()
            .expect("room")
    }

    #[test]
    fn blocks_of_a_region_go_at_their_offsets_in_its_home() {
        let mut s = space(16 * R);
        let first = place(&mut s, 3 * R + R - 8, 1, &[]);
        let home = Pba::new(0, first[0].0.block() - (R - 8));
        assert_eq!(home.block() % R, 0, "a new home is a whole aligned region");
        for off in [7, R - 9, 0, R - 7, R - 1] {
            assert_eq!(place(&mut s, 3 * R + off, 1, &[home]), vec![(home.offset_by(off), 1)]);
        }
    }

    #[test]
    fn a_new_region_follows_the_previous_one() {
        let mut s = space(16 * R);
        let a = place(&mut s, 0, R, &[]);
        let after = a[0].0.offset_by(R);
        assert_eq!(place(&mut s, R, 16, &[after]), vec![(after, 16)]);
    }

    #[test]
    fn copies_pack_from_a_whole_free_region_after_the_home() {
        let mut s = space(16 * R);
        let home = place(&mut s, 10, 1, &[])[0].0;
        let home = Pba::new(0, home.block() - 10);
        place(&mut s, 40, 1, &[home]);
        // Offsets 10 and 40 are still taken (a snapshot holds them): each
        // copy packs on after the one before, not at its offset.
        let mut near = Near { bases: vec![home], home: Some(home), ..Near::default() };
        let first = Contiguous.place(&mut s, vol(1), 40, 1, &near, R).unwrap().expect("room");
        assert!(first[0].0.block() > home.block(), "after the home");
        assert_eq!(first[0].0.block() % R, 0, "at the start of a whole free region");
        near.note_placed(40, &first, R);
        assert_eq!(near.tail, Some(first[0].0.offset_by(1)));
        let second = Contiguous.place(&mut s, vol(1), 10, 1, &near, R).unwrap().expect("room");
        assert_eq!(second, vec![(first[0].0.offset_by(1), 1)], "packed after the first copy");
        // Never at its offset in another place of the region.
        let other = Pba::new(0, 8 * R);
        near.bases.push(other);
        near.tail = Some(Pba::new(0, home.block() + 10)); // taken: no packing on there
        let third = Contiguous.place(&mut s, vol(1), 10, 1, &near, R).unwrap().expect("room");
        assert_ne!(third, vec![(other.offset_by(10), 1)], "not at its offset elsewhere");
        assert_eq!(third[0].0.block() % R, 0, "a new run of copies near the home");
        // A hole of the region still goes at its offset at home.
        assert_eq!(Contiguous.place(&mut s, vol(1), 20, 1, &near, R).unwrap(), Some(vec![(home.offset_by(20), 1)]));
    }

    /// Bug guarded: when the block after a region's copies was taken,
    /// the next copy opened a new run of copies far away, a second read
    /// of the region (web-server replay: 647 regions read in two
    /// pieces); it must go right beside a piece of the region.
    #[test]
    fn a_copy_with_no_room_after_the_copies_goes_beside_the_region() {
        let mut s = space(16 * R);
        let home = Pba::new(0, 5 * R);
        assert!(s.allocate_exact(home.offset_by(10), 1).unwrap());
        // Five copies of the region at 8R+1.., the block after them taken.
        let copies = Pba::new(0, 8 * R + 1);
        assert!(s.allocate_exact(copies, 6).unwrap());
        let near = Near {
            bases: vec![home],
            home: Some(home),
            tail: Some(copies.offset_by(5)),
            edges: vec![(copies, copies.offset_by(5))],
        };
        let got = Contiguous.place(&mut s, vol(1), 10, 1, &near, R).unwrap();
        assert_eq!(got, Some(vec![(Pba::new(0, 8 * R), 1)]), "right before the copies");
        // Room after a piece: there.
        let near = Near { edges: vec![(home.offset_by(10), home.offset_by(11))], ..near };
        let got = Contiguous.place(&mut s, vol(1), 10, 1, &near, R).unwrap();
        assert_eq!(got, Some(vec![(home.offset_by(11), 1)]), "right after a piece");
    }

    /// Bug guarded: a copy whose search near the home found no whole free
    /// region took one from the cursor at its offset, leaving the run's
    /// front for others; it packs from the start.
    #[test]
    fn a_copy_given_a_new_run_packs_from_its_start() {
        let mut s = space(16 * R);
        let home = Pba::new(0, 5 * R);
        assert!(s.allocate_exact(home.offset_by(10), 1).unwrap());
        // No whole free region after the home: the cursor's search (from
        // the device's start) gives region 0.
        for k in 6..16 {
            let _ = s.allocate_exact(Pba::new(0, k * R + 3), 1).unwrap();
        }
        let near = Near { bases: vec![home], home: Some(home), ..Near::default() };
        let got = Contiguous.place(&mut s, vol(1), 10, 1, &near, R).unwrap();
        assert_eq!(got, Some(vec![(Pba::new(0, 0), 1)]));
    }

    #[test]
    fn without_a_whole_free_region_any_free_block_is_used_until_none_is_left() {
        let mut s = space(2 * R);
        // One block taken in each region: no whole region is free.
        place(&mut s, 5, 1, &[]);
        place(&mut s, R + 5, 1, &[]);
        let mut got = 0;
        while let Some(p) = Contiguous.place(&mut s, vol(1), 7 * R, 1, &Near::default(), R).unwrap() {
            got += p.iter().map(|x| x.1).sum::<u64>();
        }
        assert_eq!(got, 2 * R - 2, "every block left was handed out");
        assert_eq!(s.free_blocks(), 0);
    }

    #[test]
    fn first_homes_start_uniformly_over_the_device() {
        let regions = 8192 * R;
        let mut s = space(regions);
        s.random_region_start = true;
        let data_part = regions - regions / 8;
        let mut quarters = [0u32; 4];
        for region in 0..400u64 {
            // Every fourth logical region: no neighbour's data to follow.
            let got = place(&mut s, region * 4 * R, 1, &[]);
            quarters[(got[0].0.block() * 4 / data_part).min(3) as usize] += 1;
        }
        // 100 expected per quarter; a start at the cursor would put all in the first.
        assert!(quarters.iter().all(|&q| (60..=140).contains(&q)), "{quarters:?}");
    }

    #[test]
    fn a_region_size_of_other_than_a_power_of_two_or_beyond_a_device_is_refused() {
        assert!(check_region_blocks(64, 1000).is_ok());
        assert!(check_region_blocks(1, 1000).is_ok());
        for bad in [0, 3, 96, MAX_REGION_BLOCKS * 2] {
            assert!(check_region_blocks(bad, u64::MAX).unwrap_err().contains("power of two"), "{bad}");
        }
        assert!(check_region_blocks(2048, 1000).unwrap_err().contains("larger than a device"));
    }

    #[test]
    fn a_larger_region_keeps_offsets_in_its_larger_home() {
        let mut s = space(64 * R);
        let r = 4 * R;
        let first = Contiguous.place(&mut s, vol(2), 5 * r + 100, 1, &Near::default(), r).unwrap().unwrap();
        let home = Pba::new(0, first[0].0.block() - 100);
        assert_eq!(home.block() % r, 0, "aligned to the region size");
        let next = Contiguous
            .place(&mut s, vol(2), 5 * r + 200, 1, &Near { bases: vec![home], ..Near::default() }, r)
            .unwrap()
            .unwrap();
        assert_eq!(next, vec![(home.offset_by(200), 1)]);
    }
}
