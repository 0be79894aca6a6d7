//! The bounded node cache: clean nodes by address, evicted by CLOCK when
//! their bytes pass the capacity. Dirty nodes are owned by their trees and
//! never here, so eviction never loses a change. Readers keep the `Arc` of
//! a node they are using; eviction only drops the cache's reference.

use crate::error::{Result, StoreError};
use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tarn_format::node::MAX_LEVEL;
use tarn_format::Pba;

/// Largest in-memory size of one decoded node (a leaf of 1-byte-ish
/// entries decodes to ~1,000 entries of 32 bytes).
pub const MAX_NODE_BYTES: usize = 8 << 10;
/// A cache must hold a whole root-to-leaf path while an operation runs.
pub const MIN_CACHE_BYTES: usize = (MAX_LEVEL as usize + 1) * MAX_NODE_BYTES;

pub type AnyNode = Arc<dyn Any + Send + Sync>;

struct Slot {
    node: AnyNode,
    /// What the node was validated as (tree, checksum, level): a lookup
    /// expecting anything else is a miss, so a damaged pointer to a cached
    /// block is validated from the device like any other read.
    tag: Tag,
    bytes: usize,
    referenced: bool,
}

/// A node's identity as its parent states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tag {
    pub tree: u64,
    pub crc: u32,
    pub level: u8,
}

#[derive(Default)]
struct Slots {
    map: HashMap<u64, Slot>,
    clock: VecDeque<u64>,
    bytes: usize,
}

/// Figures for `pool status --json`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub capacity: u64,
    pub bytes: u64,
    pub nodes: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

pub struct Cache {
    slots: Mutex<Slots>,
    capacity: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

impl Cache {
    pub fn new(capacity: usize) -> Result<Cache> {
        if capacity < MIN_CACHE_BYTES {
            return Err(StoreError::CacheTooSmall { bytes: capacity, needed: MIN_CACHE_BYTES });
        }
        Ok(Cache::tiny(capacity))
    }

    /// A cache of any size, even below a root-to-leaf path (a reader holds
    /// the nodes of its path itself, so this is slow, never wrong): for
    /// simulations that want evictions on small pools.
    pub fn tiny(capacity: usize) -> Cache {
        Cache {
            slots: Mutex::default(),
            capacity,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node cached at `pba`, if any, of type `T` and validated as `tag`.
    pub fn get<T: Any + Send + Sync>(&self, pba: Pba, tag: Tag) -> Option<Arc<T>> {
        let found = {
            let mut slots = self.lock();
            slots.map.get_mut(&pba.0).filter(|s| s.tag == tag).map(|s| {
                s.referenced = true;
                s.node.clone()
            })
        };
        match found.and_then(|n| n.downcast::<T>().ok()) {
            Some(n) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(n)
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Cache a clean node, evicting others until it fits.
    pub fn insert<T: Any + Send + Sync>(&self, pba: Pba, tag: Tag, node: Arc<T>, bytes: usize) {
        self.insert_any(pba, tag, node, bytes);
    }

    /// [`Cache::insert`] of a node of any kind.
    pub fn insert_any(&self, pba: Pba, tag: Tag, node: AnyNode, bytes: usize) {
        let mut slots = self.lock();
        if let Some(old) = slots.map.insert(pba.0, Slot { node, tag, bytes, referenced: false }) {
            slots.bytes -= old.bytes;
        } else {
            slots.clock.push_back(pba.0);
        }
        slots.bytes += bytes;
        self.evict(&mut slots);
    }

    /// Forget a node whose block is being freed (it may be reused).
    pub fn remove(&self, pba: Pba) {
        let mut slots = self.lock();
        if let Some(old) = slots.map.remove(&pba.0) {
            slots.bytes -= old.bytes;
        }
    }

    fn evict(&self, slots: &mut Slots) {
        // Each pass either evicts or clears a reference bit, so two turns
        // of the clock always make room.
        let mut budget = 2 * slots.clock.len() + 2;
        while slots.bytes > self.capacity && budget > 0 {
            budget -= 1;
            let Some(pba) = slots.clock.pop_front() else { break };
            let Some(slot) = slots.map.get_mut(&pba) else { continue };
            if slot.referenced {
                slot.referenced = false;
                slots.clock.push_back(pba);
                continue;
            }
            let bytes = slot.bytes;
            slots.map.remove(&pba);
            slots.bytes -= bytes;
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        // Entries removed out of band leave stale keys in the clock.
        if slots.clock.len() > 2 * slots.map.len() + 64 {
            let live: Vec<u64> = slots.clock.iter().copied().filter(|p| slots.map.contains_key(p)).collect();
            slots.clock = live.into();
        }
    }

    pub fn stats(&self) -> CacheStats {
        let slots = self.lock();
        CacheStats {
            capacity: self.capacity as u64,
            bytes: slots.bytes as u64,
            nodes: slots.map.len() as u64,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_to_capacity_and_counts() {
        let cache = Cache::new(MIN_CACHE_BYTES).unwrap();
        for i in 0..100u64 {
            cache.insert(Pba(i + 1), Tag::default(), Arc::new(i), MAX_NODE_BYTES);
        }
        let s = cache.stats();
        assert!(s.bytes <= MIN_CACHE_BYTES as u64, "{s:?}");
        assert!(s.evictions >= 100 - (MAX_LEVEL as u64 + 1), "{s:?}");
        assert_eq!(cache.get::<u64>(Pba(100), Tag::default()).as_deref(), Some(&99));
        assert!(cache.get::<u64>(Pba(1), Tag::default()).is_none());
        assert!(cache.get::<String>(Pba(100), Tag::default()).is_none(), "wrong type is a miss");
        let other = Tag { tree: 7, crc: 1, level: 0 };
        assert!(cache.get::<u64>(Pba(100), other).is_none(), "another tree, checksum or level is a miss");
    }

    #[test]
    fn too_small_is_refused() {
        assert!(matches!(Cache::new(1 << 10), Err(StoreError::CacheTooSmall { .. })));
    }
}
