//! The pool's member devices, indexed by `Pba::device()`, as one list the
//! pool and its metadata store share. Members are only ever appended
//! (`tarn dev add`, under the commit lock), so readers go without a lock:
//! a slot is filled before the length that shows it is published.

use crate::device::Device;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use tarn_format::superblock::MAX_DEVICE_ENTRIES;

/// At most [`MAX_DEVICE_ENTRIES`] devices, append-only.
pub struct Members {
    slots: [OnceLock<Arc<dyn Device>>; MAX_DEVICE_ENTRIES],
    len: AtomicUsize,
}

impl Members {
    /// The members of an opened pool (at most [`MAX_DEVICE_ENTRIES`]; the
    /// superblock decoder bounds the table, so more is a caller's bug).
    pub fn new(devices: Vec<Arc<dyn Device>>) -> Members {
        let m = Members { slots: [const { OnceLock::new() }; MAX_DEVICE_ENTRIES], len: AtomicUsize::new(0) };
        for d in devices {
            m.push(d).expect("a pool has at most MAX_DEVICE_ENTRIES members");
        }
        m
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Option<&Arc<dyn Device>> {
        if i < self.len() {
            self.slots[i].get()
        } else {
            None
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Device>> + '_ {
        self.slots[..self.len()].iter().filter_map(OnceLock::get)
    }

    pub fn to_vec(&self) -> Vec<Arc<dyn Device>> {
        self.iter().cloned().collect()
    }

    /// Append a member; its index, or None when the table is full. One
    /// writer at a time (the caller holds the pool's commit lock).
    pub(crate) fn push(&self, dev: Arc<dyn Device>) -> Option<usize> {
        let i = self.len();
        let slot = self.slots.get(i)?;
        slot.set(dev).ok()?;
        self.len.store(i + 1, Ordering::Release);
        Some(i)
    }
}

impl std::ops::Index<usize> for Members {
    type Output = Arc<dyn Device>;

    fn index(&self, i: usize) -> &Arc<dyn Device> {
        self.get(i).expect("member index checked by the caller")
    }
}

impl<'a> IntoIterator for &'a Members {
    type Item = &'a Arc<dyn Device>;
    type IntoIter = Box<dyn Iterator<Item = &'a Arc<dyn Device>> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}
