//! A device's free space as a tree of free ranges (key: first block,
//! value: length), persisted copy-on-write like every other tree, with a
//! next-fit cursor (Virtual Allocation's linear allocation: writes that
//! arrive together land together).
//!
//! A checkpoint's own node blocks are allocated from the live map after
//! the freeze, so the frozen map does not show them used; the checkpoint
//! records them beside its roots, and opening claims them again (see
//! ARCHITECTURE.md *Metadata store*). Running out is a value (`Ok(0)`
//! taken), damage or a double free an error, never a panic.

use crate::error::{Result, StoreError};
use crate::tree::{RootRef, Tree};
use crate::Store;
use tarn_format::node::RangeValue;
use tarn_format::Pba;

pub struct SpaceMap {
    pub tree: Tree<RangeValue>,
    /// The device index its blocks are on (for `Pba`s).
    pub device: u16,
    pub free_blocks: u64,
    /// First block that may hold pool data, one past the last.
    pub data_start: u64,
    pub data_end: u64,
    pub cursor: u64,
}

fn invalid(tree: u64, what: String) -> StoreError {
    StoreError::Invalid { pba: Pba(0), tree, what }
}

impl SpaceMap {
    /// A device whose data area is all free.
    pub fn new(store: &Store, id: u64, device: u16, data_start: u64, data_end: u64) -> Result<SpaceMap> {
        let mut s = SpaceMap { tree: Tree::new(id), device, free_blocks: 0, data_start, data_end, cursor: data_start };
        if data_end > data_start {
            s.tree.insert(store, data_start, RangeValue { len: data_end - data_start }, &mut Vec::new())?;
            s.free_blocks = data_end - data_start;
        }
        Ok(s)
    }

    /// As a checkpoint recorded it (its figures are checked by `verify`).
    pub fn open(
        id: u64,
        device: u16,
        root: RootRef,
        free_blocks: u64,
        area: (u64, u64),
        cursor: u64,
    ) -> Result<SpaceMap> {
        if area.1 < area.0 || free_blocks > area.1 - area.0 {
            return Err(invalid(id, format!("space map of {free_blocks} free blocks in area {}..{}", area.0, area.1)));
        }
        let tree = Tree::open(id, root)?;
        Ok(SpaceMap {
            tree,
            device,
            free_blocks,
            data_start: area.0,
            data_end: area.1,
            cursor: cursor.clamp(area.0, area.1),
        })
    }

    fn pba(&self, block: u64) -> Pba {
        Pba::new(self.device, block)
    }

    /// Take up to `want` blocks next-fit from the cursor in at most
    /// `max_pieces` ranges; returns how many it took (less when full).
    pub fn take(
        &mut self,
        store: &Store,
        want: u64,
        max_pieces: usize,
        out: &mut Vec<(Pba, u64)>,
        sup: &mut Vec<Pba>,
    ) -> Result<u64> {
        let mut got = 0;
        for _pass in 0..2 {
            while got < want && out.len() < max_pieces {
                let Some((start, len)) = self.next_free(store)? else { break };
                let n = len.min(want - got);
                self.claim(store, start, n, sup)?;
                out.push((self.pba(start), n));
                got += n;
                self.cursor = start + n;
            }
            if got == want {
                break;
            }
            self.cursor = self.data_start;
        }
        Ok(got)
    }

    /// The free run at or after the cursor: the rest of a free range the
    /// cursor sits inside, else the next free range.
    fn next_free(&self, store: &Store) -> Result<Option<(u64, u64)>> {
        if let Some((s, v)) = self.tree.get_le(store, self.cursor)? {
            if s + v.len > self.cursor {
                return Ok(Some((self.cursor, s + v.len - self.cursor)));
            }
        }
        Ok(self.tree.get_ge(store, self.cursor)?.map(|(s, v)| (s, v.len)))
    }

    /// The first free run of `len` blocks aligned to `len` (counted from the
    /// data area's start) starting in `[from, until)`, within `max_ranges`
    /// free ranges; nothing taken, the cursor stays.
    pub fn aligned_between(
        &self,
        store: &Store,
        from: u64,
        until: u64,
        len: u64,
        max_ranges: usize,
    ) -> Result<Option<u64>> {
        assert!(len > 0, "empty aligned run");
        let data_start = self.data_start;
        self.first_free_run(store, from, until, max_ranges, |start, end| {
            let aligned = data_start + (start - data_start).div_ceil(len) * len;
            aligned.checked_add(len).is_some_and(|e| e <= end).then_some(aligned)
        })
    }

    /// The first answer `pick` gives for the free runs (start, end) that
    /// begin in `[from, until)` (the free range holding `from` counted from
    /// `from`), in order, looking at no more than `max_ranges` of them:
    /// one descent, then the leaves in order.
    fn first_free_run(
        &self,
        store: &Store,
        from: u64,
        until: u64,
        max_ranges: usize,
        pick: impl Fn(u64, u64) -> Option<u64>,
    ) -> Result<Option<u64>> {
        let from = from.max(self.data_start);
        let until = until.min(self.data_end);
        if from >= until || max_ranges == 0 {
            return Ok(None);
        }
        if let Some((s, v)) = self.tree.get_le(store, from)? {
            if s + v.len > from {
                if let Some(at) = pick(from, s + v.len) {
                    return Ok(Some(at));
                }
            }
        }
        let (mut found, mut seen) = (None, 1);
        self.tree.range(store, from + 1, until, &mut |s, v| {
            found = pick(s, s + v.len);
            seen += 1;
            found.is_none() && seen < max_ranges
        })?;
        Ok(found)
    }

    /// The first free run of `len` blocks aligned to `len` (counted from
    /// the data area's start) next-fit from the cursor, looking at no
    /// more than `max_ranges` free ranges; the cursor moves past it.
    /// `Ok(None)`: no such run within the bound (the space is fragmented
    /// or full).
    pub fn find_aligned(&mut self, store: &Store, len: u64, max_ranges: usize) -> Result<Option<u64>> {
        assert!(len > 0, "empty aligned run");
        let at = self.cursor.clamp(self.data_start, self.data_end);
        let found = match self.aligned_between(store, at, self.data_end, len, max_ranges)? {
            Some(b) => Some(b),
            // Wrapped around to the front.
            None => self.aligned_between(store, self.data_start, at, len, max_ranges)?,
        };
        if let Some(b) = found {
            self.cursor = b + len;
        }
        Ok(found)
    }

    /// Return `[start, start+len)`, coalescing with free neighbours. A
    /// range outside the data area or already (partly) free is an error.
    pub fn give_back(&mut self, store: &Store, start: u64, len: u64, sup: &mut Vec<Pba>) -> Result<()> {
        let id = self.tree.id;
        if len == 0 || start < self.data_start || start.checked_add(len).is_none_or(|e| e > self.data_end) {
            return Err(invalid(id, format!("free of {start}+{len} outside data area")));
        }
        let (mut s, mut l) = (start, len);
        if let Some((ps, p)) = self.tree.get_le(store, start)? {
            if ps + p.len > start {
                return Err(invalid(id, format!("double free: {start}+{len} overlaps free {ps}+{}", p.len)));
            }
            if ps + p.len == start {
                self.tree.remove(store, ps, sup)?;
                (s, l) = (ps, l + p.len);
            }
        }
        if let Some((ns, n)) = self.tree.get_ge(store, start)? {
            if ns < start + len {
                return Err(invalid(id, format!("double free: {start}+{len} overlaps free {ns}+{}", n.len)));
            }
            if ns == start + len {
                self.tree.remove(store, ns, sup)?;
                l += n.len;
            }
        }
        self.tree.insert(store, s, RangeValue { len: l }, sup)?;
        self.free_blocks += len;
        Ok(())
    }

    /// Mark `[start, start+len)` used; it must be entirely free (replaying a
    /// map, or claiming a checkpoint's own node blocks at open).
    pub fn claim(&mut self, store: &Store, start: u64, len: u64, sup: &mut Vec<Pba>) -> Result<()> {
        if self.try_claim(store, start, len, sup)? {
            return Ok(());
        }
        Err(invalid(self.tree.id, format!("claim of {start}+{len}: not free")))
    }

    /// [`SpaceMap::claim`] if `[start, start+len)` is entirely free (one
    /// lookup decides); false, changing nothing, if it is not.
    pub fn try_claim(&mut self, store: &Store, start: u64, len: u64, sup: &mut Vec<Pba>) -> Result<bool> {
        let found = self.tree.get_le(store, start)?;
        let Some((fs, f)) = found.filter(|(fs, f)| len > 0 && fs + f.len >= start.saturating_add(len)) else {
            return Ok(false);
        };
        self.tree.remove(store, fs, sup)?;
        if fs < start {
            self.tree.insert(store, fs, RangeValue { len: start - fs }, sup)?;
        }
        if start + len < fs + f.len {
            self.tree.insert(store, start + len, RangeValue { len: fs + f.len - start - len }, sup)?;
        }
        self.free_blocks -= len;
        Ok(true)
    }

    /// Walk the tree: ranges inside the data area, not touching, and adding
    /// up to `free_blocks`. Returns the free ranges.
    pub fn verify(&self, store: &Store) -> Result<Vec<(u64, u64)>> {
        let mut ranges = Vec::new();
        self.tree.walk(store, &mut |k, v| ranges.push((k, v.len)))?;
        let mut end = self.data_start;
        let mut total = 0u64;
        for (i, &(k, l)) in ranges.iter().enumerate() {
            if k < end || (i > 0 && k == end) || k + l > self.data_end {
                return Err(invalid(self.tree.id, format!("free range {k}+{l} overlaps, touches or leaves the area")));
            }
            end = k + l;
            total += l;
        }
        if total != self.free_blocks {
            return Err(invalid(self.tree.id, format!("free ranges add up to {total}, recorded {}", self.free_blocks)));
        }
        Ok(ranges)
    }
}

impl crate::checkpoint::NodeAlloc for (&mut SpaceMap, &Store, &mut Vec<Pba>) {
    fn alloc_node(&mut self) -> Option<Pba> {
        let mut out = Vec::with_capacity(1);
        match self.0.take(self.1, 1, 1, &mut out, self.2) {
            Ok(1) => out.first().map(|p| p.0),
            _ => None,
        }
    }
}
