//! A leaf in memory, kept as it is stored: groups of delta-encoded entries
//! (`PackedLeaf`), about 9 bytes an extent instead of 32 decoded, so the
//! cache holds 3-4 times more of a map and dirty leaves cost little. A
//! read decodes one group (at most `GROUP_MAX` entries); a change
//! re-encodes one group and moves the bytes after it.

use std::marker::PhantomData;
use tarn_format::codec::Writer;
use tarn_format::error::Result;
use tarn_format::node::{encode_group, LeafValue, PackedLeaf, GROUP_MAX};

#[derive(Debug, Clone)]
pub struct Leaf<V> {
    sizes: Vec<u8>,
    /// Byte offset of each group in `data`.
    offs: Vec<u16>,
    /// Each group's first key (searched without decoding).
    firsts: Vec<u64>,
    data: Vec<u8>,
    count: usize,
    _v: PhantomData<V>,
}

/// One group decoded on the stack: its entries plus room for the one an
/// insert adds before the group is split (no allocation per read).
struct Group<V> {
    items: [(u64, V); GROUP_MAX + 1],
    n: usize,
}

impl<V: LeafValue> Group<V> {
    fn new() -> Group<V> {
        Group { items: [(0, V::default()); GROUP_MAX + 1], n: 0 }
    }
    fn push(&mut self, e: (u64, V)) {
        self.items[self.n] = e;
        self.n += 1;
    }
    fn insert(&mut self, i: usize, e: (u64, V)) {
        self.items.copy_within(i..self.n, i + 1);
        self.items[i] = e;
        self.n += 1;
    }
    fn remove(&mut self, i: usize) -> (u64, V) {
        let e = self.items[i];
        self.items.copy_within(i + 1..self.n, i);
        self.n -= 1;
        e
    }
}

impl<V> std::ops::Deref for Group<V> {
    type Target = [(u64, V)];
    fn deref(&self) -> &[(u64, V)] {
        &self.items[..self.n]
    }
}

impl<V> std::ops::DerefMut for Group<V> {
    fn deref_mut(&mut self) -> &mut [(u64, V)] {
        &mut self.items[..self.n]
    }
}

impl<V: LeafValue> Leaf<V> {
    pub fn empty() -> Leaf<V> {
        Leaf { sizes: Vec::new(), offs: Vec::new(), firsts: Vec::new(), data: Vec::new(), count: 0, _v: PhantomData }
    }

    /// From a node's validated payload.
    pub fn from_packed(p: PackedLeaf) -> Result<Leaf<V>> {
        let (entries, offs) = p.unpack::<V>()?;
        let mut firsts = Vec::with_capacity(p.sizes.len());
        let mut at = 0;
        for s in &p.sizes {
            firsts.push(entries[at].0);
            at += usize::from(*s);
        }
        Ok(Leaf { count: entries.len(), sizes: p.sizes, offs, firsts, data: p.data, _v: PhantomData })
    }

    pub fn to_packed(&self) -> PackedLeaf {
        PackedLeaf { sizes: self.sizes.clone(), data: self.data.clone() }
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes this leaf takes in a node's payload.
    pub fn payload_len(&self) -> usize {
        2 + self.sizes.len() + self.data.len()
    }

    pub fn mem_bytes(&self) -> usize {
        self.data.capacity() + self.sizes.capacity() + 2 * self.offs.capacity() + 8 * self.firsts.capacity()
    }

    fn group_range(&self, g: usize) -> std::ops::Range<usize> {
        let end = self.offs.get(g + 1).map_or(self.data.len(), |o| usize::from(*o));
        usize::from(self.offs[g])..end
    }

    fn decode_group(&self, g: usize) -> Group<V> {
        let bytes = &self.data[self.group_range(g)];
        let mut pos = 0;
        let mut out: Group<V> = Group::new();
        for _ in 0..self.sizes[g] {
            // Validated when read from a device, written by us otherwise.
            let e = V::decode_trusted(out.last(), bytes, &mut pos);
            out.push(e);
        }
        debug_assert_eq!(pos, bytes.len());
        out
    }

    /// The last group whose first key is <= `key`.
    fn group_for(&self, key: u64) -> Option<usize> {
        self.firsts.partition_point(|f| *f <= key).checked_sub(1)
    }

    pub fn get_le(&self, key: u64) -> Option<(u64, V)> {
        let g = self.group_for(key)?;
        self.decode_group(g).iter().rev().find(|e| e.0 <= key).copied()
    }

    pub fn get_ge(&self, key: u64) -> Option<(u64, V)> {
        let g = self.group_for(key).unwrap_or(0);
        if g >= self.sizes.len() {
            return None;
        }
        let found = self.decode_group(g).iter().find(|e| e.0 >= key).copied();
        found.or_else(|| (g + 1 < self.sizes.len()).then(|| self.decode_group(g + 1)[0]))
    }

    pub fn first(&self) -> Option<(u64, V)> {
        (!self.sizes.is_empty()).then(|| self.decode_group(0)[0])
    }

    pub fn last(&self) -> Option<(u64, V)> {
        self.sizes.len().checked_sub(1).and_then(|g| self.decode_group(g).last().copied())
    }

    /// Call `f` on entries with `from <= key < to` until it returns false;
    /// returns false if it stopped early.
    pub fn for_each_in(&self, from: u64, to: u64, f: &mut dyn FnMut(u64, &V) -> bool) -> bool {
        for g in self.group_for(from).unwrap_or(0)..self.sizes.len() {
            for &(k, v) in self.decode_group(g).iter() {
                if k >= to {
                    return true;
                }
                if k >= from && !f(k, &v) {
                    return false;
                }
            }
        }
        true
    }

    /// Insert or replace; returns the value replaced.
    pub fn insert(&mut self, key: u64, value: V) -> Option<V> {
        if self.sizes.is_empty() {
            self.replace_groups(0, 0, &[(key, value)]);
            self.count = 1;
            return None;
        }
        let g = self.group_for(key).unwrap_or(0);
        let mut entries = self.decode_group(g);
        let i = entries.partition_point(|e| e.0 < key);
        let old = if entries.get(i).is_some_and(|e| e.0 == key) {
            Some(std::mem::replace(&mut entries[i].1, value))
        } else {
            entries.insert(i, (key, value));
            self.count += 1;
            None
        };
        self.replace_groups(g, 1, &entries);
        debug_assert_eq!(self.count, self.sizes.iter().map(|s| usize::from(*s)).sum::<usize>());
        old
    }

    pub fn remove(&mut self, key: u64) -> Option<V> {
        let g = self.group_for(key)?;
        let mut entries = self.decode_group(g);
        let i = entries.iter().position(|e| e.0 == key)?;
        let (_, old) = entries.remove(i);
        self.count -= 1;
        self.replace_groups(g, 1, &entries);
        Some(old)
    }

    /// Replace `n` groups from `g` by `entries` (0, 1 or 2 groups).
    fn replace_groups(&mut self, g: usize, n: usize, entries: &[(u64, V)]) {
        debug_assert!(entries.len() <= 2 * GROUP_MAX);
        let mut w = Writer::default();
        let mut sizes: Vec<u8> = Vec::with_capacity(2);
        let mut firsts: Vec<u64> = Vec::with_capacity(2);
        let halves: Vec<&[(u64, V)]> =
            if entries.len() > GROUP_MAX { entries.chunks(entries.len().div_ceil(2)).collect() } else { vec![entries] };
        let mut starts = Vec::with_capacity(2);
        for half in halves.into_iter().filter(|h| !h.is_empty()) {
            starts.push(w.len());
            sizes.push(half.len() as u8);
            firsts.push(half[0].0);
            encode_group(half, &mut w);
        }
        let at = self.offs.get(g).map_or(self.data.len(), |o| usize::from(*o));
        let end = if n == 0 { at } else { self.group_range(g + n - 1).end };
        self.data.splice(at..end, w.buf.iter().copied());
        let delta = w.len() as isize - (end - at) as isize;
        self.sizes.splice(g..g + n, sizes.iter().copied());
        self.firsts.splice(g..g + n, firsts.iter().copied());
        let new_offs: Vec<u16> = starts.iter().map(|s| (at + s) as u16).collect();
        self.offs.splice(g..g + n, new_offs.iter().copied());
        for o in &mut self.offs[g + new_offs.len()..] {
            *o = (*o as isize + delta) as u16;
        }
    }

    /// Move the upper half (by bytes, at a group boundary) to a new leaf;
    /// with `appending` (the entry just added is the last), only the last
    /// group, so a tree filled in key order keeps full leaves.
    pub fn split(&mut self, appending: bool) -> Leaf<V> {
        assert!(self.sizes.len() >= 2, "a leaf too big for a node has several groups");
        let half = self.data.len() / 2;
        let at = if appending {
            self.sizes.len() - 1
        } else {
            self.offs.partition_point(|o| usize::from(*o) <= half).clamp(1, self.sizes.len() - 1)
        };
        let base = usize::from(self.offs[at]);
        let right = Leaf {
            sizes: self.sizes.split_off(at),
            offs: self.offs.split_off(at).into_iter().map(|o| o - base as u16).collect(),
            firsts: self.firsts.split_off(at),
            data: self.data.split_off(base),
            count: 0,
            _v: PhantomData,
        };
        let moved: usize = right.sizes.iter().map(|s| usize::from(*s)).sum();
        self.count -= moved;
        Leaf { count: moved, ..right }
    }

    /// Append a leaf whose keys all follow this one's.
    pub fn append(&mut self, other: Leaf<V>) {
        let base = self.data.len() as u16;
        self.offs.extend(other.offs.iter().map(|o| o + base));
        self.sizes.extend(other.sizes);
        self.firsts.extend(other.firsts);
        self.data.extend(other.data);
        self.count += other.count;
    }

    /// Every entry, in order.
    pub fn entries(&self) -> Vec<(u64, V)> {
        (0..self.sizes.len()).flat_map(|g| self.decode_group(g).to_vec()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tarn_format::node::RangeValue;

    /// Random inserts, removes, splits and appends against a BTreeMap; every
    /// query form agrees, and the packed form reloads to the same leaf.
    #[test]
    fn matches_a_model() {
        let (mut leaf, mut model) = (Leaf::<RangeValue>::empty(), BTreeMap::new());
        let mut x: u64 = 12345;
        for step in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = (x % 2000) * 3;
            if x.is_multiple_of(3) {
                assert_eq!(leaf.remove(key).map(|v| v.len), model.remove(&key));
            } else {
                assert_eq!(
                    leaf.insert(key, RangeValue { len: 1 + x % 2 }).map(|v| v.len),
                    model.insert(key, 1 + x % 2)
                );
            }
            let probe = (x >> 20) % 6100;
            let le = model.range(..=probe).next_back().map(|(k, v)| (*k, *v));
            let ge = model.range(probe..).next().map(|(k, v)| (*k, *v));
            assert_eq!(leaf.get_le(probe).map(|(k, v)| (k, v.len)), le, "step {step}");
            assert_eq!(leaf.get_ge(probe).map(|(k, v)| (k, v.len)), ge, "step {step}");
            assert_eq!(leaf.len(), model.len());
            if step % 1000 == 999 && leaf.sizes.len() >= 2 {
                let right = leaf.split(false);
                assert!(leaf.last().unwrap().0 < right.first().unwrap().0);
                leaf.append(right);
                let again = Leaf::<RangeValue>::from_packed(leaf.to_packed()).unwrap();
                assert_eq!(again.entries(), leaf.entries());
                assert_eq!(again.offs, leaf.offs);
                assert_eq!(again.firsts, leaf.firsts);
            }
        }
        let all: Vec<(u64, u64)> = leaf.entries().iter().map(|(k, v)| (*k, v.len)).collect();
        assert_eq!(all, model.into_iter().collect::<Vec<_>>());
        assert!(leaf.sizes.iter().all(|s| usize::from(*s) <= GROUP_MAX));
    }
}
