//! Free space: per device, the free block ranges, and a next-fit cursor.
//!
//! The space map is not persisted: at open it is rebuilt from the map and the
//! checkpoint's own segments (everything not referenced is free), so it can
//! never disagree with the map it serves. Running out is a value (`None`).

pub mod placement;

use std::collections::BTreeMap;
use tarn_format::{Pba, BLOCK_SIZE};

#[derive(Debug, Clone, Default)]
pub struct DeviceSpace {
    /// start block -> length, non-overlapping, never adjacent (coalesced).
    free: BTreeMap<u64, u64>,
    free_blocks: u64,
    /// First block that holds pool data (after labels and journal).
    pub data_start: u64,
    /// One past the last usable block.
    pub data_end: u64,
    cursor: u64,
}

impl DeviceSpace {
    /// A device whose data area is entirely free.
    pub fn new(data_start: u64, data_end: u64) -> DeviceSpace {
        let mut s = DeviceSpace { data_start, data_end, cursor: data_start, ..Default::default() };
        if data_end > data_start {
            s.free.insert(data_start, data_end - data_start);
            s.free_blocks = data_end - data_start;
        }
        s
    }

    /// Build from the sorted-or-not list of used ranges.
    pub fn from_used(data_start: u64, data_end: u64, used: &mut [(u64, u64)]) -> Result<DeviceSpace, String> {
        if data_end < data_start {
            // Only a damaged superblock (device table) says so.
            return Err(format!("data area {data_start}..{data_end} ends before it starts"));
        }
        used.sort_unstable();
        let mut s = DeviceSpace { data_start, data_end, cursor: data_start, ..Default::default() };
        let mut pos = data_start;
        for &(start, len) in used.iter() {
            if start < pos || start + len > data_end {
                return Err(format!("blocks {start}+{len} overlap other data or lie outside {data_start}..{data_end}"));
            }
            if start > pos {
                s.free.insert(pos, start - pos);
                s.free_blocks += start - pos;
            }
            pos = start + len;
        }
        if pos < data_end {
            s.free.insert(pos, data_end - pos);
            s.free_blocks += data_end - pos;
        }
        Ok(s)
    }

    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    pub fn data_blocks(&self) -> u64 {
        self.data_end - self.data_start
    }

    pub fn free_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.free.iter().map(|(s, l)| (*s, *l))
    }

    /// Take up to `want` blocks, next-fit from the cursor, in at most
    /// `max_pieces` ranges. Returns what it took (possibly less than asked).
    pub fn take(&mut self, want: u64, max_pieces: usize, out: &mut Vec<(u64, u64)>) -> u64 {
        let mut got = 0;
        for _pass in 0..2 {
            while got < want && out.len() < max_pieces {
                let Some((&start, &len)) = self.free.range(self.cursor..).next() else {
                    break;
                };
                let n = len.min(want - got);
                self.free.remove(&start);
                if n < len {
                    self.free.insert(start + n, len - n);
                }
                self.free_blocks -= n;
                out.push((start, n));
                got += n;
                self.cursor = start + n;
            }
            if got == want {
                break;
            }
            self.cursor = self.data_start;
        }
        got
    }

    /// Return [start, start+len) to the free set, coalescing with neighbours.
    pub fn give_back(&mut self, start: u64, len: u64) {
        assert!(
            len > 0 && start >= self.data_start && start + len <= self.data_end,
            "free of {start}+{len} outside data area"
        );
        let mut s = start;
        let mut l = len;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            assert!(ps + pl <= start, "double free: {start}+{len} overlaps free {ps}+{pl}");
            if ps + pl == start {
                self.free.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some((&ns, &nl)) = self.free.range(start..).next() {
            assert!(ns >= start + len, "double free: {start}+{len} overlaps free {ns}+{nl}");
            if ns == start + len {
                self.free.remove(&ns);
                l += nl;
            }
        }
        self.free.insert(s, l);
        self.free_blocks += len;
    }
}

/// The pool's free space over all its devices.
#[derive(Debug, Clone, Default)]
pub struct Space {
    pub devices: Vec<DeviceSpace>,
    /// Blocks user writes may not take: kept for metadata (checkpoints) so
    /// that TRIM, deletes and commits still work when the pool is full.
    pub reserve_blocks: u64,
}

impl Space {
    pub fn free_blocks(&self) -> u64 {
        self.devices.iter().map(|d| d.free_blocks()).sum()
    }

    pub fn data_blocks(&self) -> u64 {
        self.devices.iter().map(|d| d.data_blocks()).sum()
    }

    /// Free blocks user data may still take.
    pub fn available_blocks(&self) -> u64 {
        self.free_blocks().saturating_sub(self.reserve_blocks)
    }

    /// Take exactly `want` blocks from one device (user data respects the
    /// reserve, metadata may use it), or nothing.
    pub fn allocate_on(&mut self, device: usize, want: u64, for_metadata: bool) -> Option<Vec<(Pba, u64)>> {
        let limit = if for_metadata { self.free_blocks() } else { self.available_blocks() };
        if want > limit || self.devices.get(device)?.free_blocks() < want {
            return None;
        }
        let mut out = Vec::new();
        let got = self.devices[device].take(want, usize::MAX, &mut out);
        assert_eq!(got, want, "device free count disagrees with its ranges");
        Some(out.into_iter().map(|(b, l)| (Pba::new(device as u16, b), l)).collect())
    }

    pub fn give_back(&mut self, pba: Pba, len: u64) {
        let dev = usize::from(pba.device());
        assert!(dev < self.devices.len(), "free on unknown device {dev}");
        self.devices[dev].give_back(pba.block(), len);
    }
}

/// Blocks kept free for metadata: room for two checkpoints of the current
/// map (the new one is written before the old one is freed) plus slack of
/// 1/32 of the pool, at most 4 MiB.
pub(crate) fn reserve_for(extents: usize, data_blocks: u64) -> u64 {
    let checkpoint_blocks = (extents as u64 * 24).div_ceil(BLOCK_SIZE) + 4;
    (data_blocks / 32).clamp(16, 1024) + 3 * checkpoint_blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzz/engine_open: a device table entry smaller than the
    /// data start gave a reversed data area, and `data_blocks` underflowed.
    #[test]
    fn reversed_data_area_is_an_error() {
        let err = DeviceSpace::from_used(48, 40, &mut []).err().unwrap();
        assert!(err.contains("ends before it starts"), "{err}");
        let empty = DeviceSpace::from_used(48, 48, &mut []).unwrap();
        assert_eq!(empty.data_blocks(), 0);
    }

    #[test]
    fn take_and_give_back_keep_counts_and_coalesce() {
        let mut d = DeviceSpace::new(10, 110);
        let mut out = vec![];
        assert_eq!(d.take(30, 10, &mut out), 30);
        assert_eq!(out, vec![(10, 30)]);
        d.give_back(15, 5);
        out.clear();
        assert_eq!(d.take(10, 10, &mut out), 10);
        assert_eq!(out, vec![(40, 10)], "next-fit continues after the cursor");
        d.give_back(10, 5);
        d.give_back(20, 20);
        d.give_back(40, 10);
        assert_eq!(d.free_blocks(), 100);
        assert_eq!(d.free_ranges().collect::<Vec<_>>(), vec![(10, 100)]);
    }

    #[test]
    fn take_wraps_around_and_reports_shortage() {
        let mut d = DeviceSpace::new(0, 10);
        let mut out = vec![];
        d.take(8, 10, &mut out);
        d.give_back(2, 2);
        out.clear();
        assert_eq!(d.take(5, 10, &mut out), 4);
        assert_eq!(out, vec![(8, 2), (2, 2)]);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_is_caught() {
        let mut d = DeviceSpace::new(0, 10);
        d.give_back(3, 1);
    }

    #[test]
    fn from_used_rejects_overlap() {
        assert!(DeviceSpace::from_used(0, 100, &mut [(5, 10), (10, 2)]).is_err());
        let s = DeviceSpace::from_used(0, 100, &mut [(50, 10), (5, 10)]).unwrap();
        assert_eq!(s.free_blocks(), 80);
    }

    #[test]
    fn reserve_holds_back_user_writes_not_metadata() {
        let mut s = Space { devices: vec![DeviceSpace::new(0, 100)], reserve_blocks: 20 };
        assert!(s.allocate_on(0, 81, false).is_none());
        assert!(s.allocate_on(0, 80, false).is_some());
        assert!(s.allocate_on(0, 1, false).is_none());
        assert!(s.allocate_on(0, 20, true).is_some());
    }
}
