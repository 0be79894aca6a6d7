//! One layer of a `Buffered` tree's changes: keys set and keys removed,
//! kept apart. Kept in one map (`Option<V>`, `None` removed), the greatest
//! set key under a lookup was found by walking back over every removal
//! between: after a merge grew one entry over many removed ones (a
//! compaction moving a volume's scattered blocks into a run), each lookup
//! behind it walked them all until the next checkpoint, and the compaction
//! of 32,689 extents took 96 s (docs/ARCHITECTURE.md *Metadata store*).
//! Apart, that key is one lookup in `sets`, and a set costs no more
//! memory than before.

use std::collections::{BTreeMap, BTreeSet};
use std::iter::Peekable;

#[derive(Clone, Debug)]
pub struct Changes<V> {
    sets: BTreeMap<u64, V>,
    /// Never a key of `sets`.
    removed: BTreeSet<u64>,
}

impl<V> Default for Changes<V> {
    fn default() -> Self {
        Changes { sets: BTreeMap::new(), removed: BTreeSet::new() }
    }
}

impl<V: Copy> Changes<V> {
    pub fn len(&self) -> usize {
        self.sets.len() + self.removed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sets.is_empty() && self.removed.is_empty()
    }

    /// The change to `key`: Some(None) if it was removed.
    pub fn get(&self, key: u64) -> Option<Option<V>> {
        match self.sets.get(&key) {
            Some(v) => Some(Some(*v)),
            None => self.removed.contains(&key).then_some(None),
        }
    }

    pub fn contains(&self, key: u64) -> bool {
        self.sets.contains_key(&key) || self.removed.contains(&key)
    }

    /// Set `key`; whether the layer had no change to it before.
    pub fn set(&mut self, key: u64, value: V) -> bool {
        let had = self.sets.insert(key, value).is_some();
        let was_removed = !self.removed.is_empty() && self.removed.remove(&key);
        !had && !was_removed
    }

    /// Record `key` as removed.
    pub fn remove(&mut self, key: u64) {
        self.sets.remove(&key);
        self.removed.insert(key);
    }

    /// Drop any change to `key`.
    pub fn forget(&mut self, key: u64) {
        self.sets.remove(&key);
        self.removed.remove(&key);
    }

    /// The set keys in `[lo, hi]`, greatest first.
    pub fn sets_down(&self, lo: u64, hi: u64) -> impl Iterator<Item = (u64, V)> + '_ {
        let keys = if lo <= hi { Some(self.sets.range(lo..=hi).rev()) } else { None };
        keys.into_iter().flatten().map(|(k, v)| (*k, *v))
    }

    pub fn sets(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.sets.iter().map(|(k, v)| (*k, *v))
    }

    pub fn removals(&self) -> impl Iterator<Item = u64> + '_ {
        self.removed.iter().copied()
    }

    /// Every change with `from <= key < to`, in key order.
    pub fn range(&self, from: u64, to: u64) -> impl Iterator<Item = (u64, Option<V>)> + '_ {
        let (s, r) = if from < to {
            (Some(self.sets.range(from..to)), Some(self.removed.range(from..to)))
        } else {
            (None, None)
        };
        let sets = s.into_iter().flatten().map(|(k, v)| (*k, Some(*v)));
        let removed = r.into_iter().flatten().map(|k| (*k, None));
        InOrder { a: sets.peekable(), b: removed.peekable() }
    }

    /// Lay `newer` over these changes.
    pub fn append(&mut self, newer: Changes<V>) {
        for k in newer.removed {
            self.remove(k);
        }
        for (k, v) in newer.sets {
            self.set(k, v);
        }
    }
}

/// Two iterators of distinct keys, each in key order, merged in key order.
struct InOrder<V, A: Iterator<Item = (u64, V)>, B: Iterator<Item = (u64, V)>> {
    a: Peekable<A>,
    b: Peekable<B>,
}

impl<V, A: Iterator<Item = (u64, V)>, B: Iterator<Item = (u64, V)>> Iterator for InOrder<V, A, B> {
    type Item = (u64, V);

    fn next(&mut self) -> Option<(u64, V)> {
        match (self.a.peek(), self.b.peek()) {
            (Some((ka, _)), Some((kb, _))) if kb < ka => self.b.next(),
            (Some(_), _) => self.a.next(),
            (None, _) => self.b.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against one map of `Option`s: the same answers after any mix of
    /// sets, removals, forgets and an append.
    #[test]
    fn sets_and_removals_apart_answer_as_one_map() {
        let (mut c, mut model) = (Changes::<u32>::default(), BTreeMap::<u64, Option<u32>>::new());
        let mut x = 0x9e37_79b9_u64;
        let mut step = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..5_000u32 {
            let k = step() % 300;
            match step() % 3 {
                0 => assert_eq!(c.set(k, i), model.insert(k, Some(i)).is_none(), "set {k}"),
                1 => {
                    c.remove(k);
                    model.insert(k, None);
                }
                _ => {
                    c.forget(k);
                    model.remove(&k);
                }
            }
        }
        let mut newer = Changes::default();
        for i in 0..200u32 {
            let k = step() % 400;
            if step() % 2 == 0 {
                newer.set(k, 10_000 + i);
                model.insert(k, Some(10_000 + i));
            } else {
                newer.remove(k);
                model.insert(k, None);
            }
        }
        c.append(newer);
        assert_eq!(c.len(), model.len());
        assert_eq!(c.range(0, u64::MAX).collect::<Vec<_>>(), model.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>());
        assert_eq!(
            c.range(100, 200).collect::<Vec<_>>(),
            model.range(100..200).map(|(k, v)| (*k, *v)).collect::<Vec<_>>()
        );
        for k in 0..400 {
            assert_eq!(c.get(k), model.get(&k).copied(), "key {k}");
            let want = model.range(..=k).rev().find_map(|(k, v)| v.map(|v| (*k, v)));
            assert_eq!(c.sets_down(0, k).next(), want, "greatest set key <= {k}");
        }
        assert_eq!(c.sets_down(5, 4).count(), 0);
        assert_eq!(c.range(7, 7).count(), 0);
    }
}
