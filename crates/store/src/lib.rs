//! tarn's metadata store: paged copy-on-write B-trees whose nodes live on
//! the pool's own devices (docs/FORMAT.md *Store nodes*, docs/ARCHITECTURE.md
//! *Metadata store*).
//!
//! - [`Tree`]: an ordered map of u64 keys to compact leaf values, read on
//!   demand through a bounded [`Cache`]; changes copy the path they touch.
//! - [`Frozen`] / [`Written`]: incremental checkpoints that write only the
//!   nodes changed since the last one, while writers go on.
//! - [`Buffered`]: a tree whose changes wait in a sorted buffer in memory
//!   until a checkpoint merges them (many changes per leaf written).
//! - [`ExtentTree`]: a volume map (logical ranges to physical extents) on
//!   a tree, with the merge and split rules of the engine's maps.
//! - [`check`]: walk a tree from its root, validating every node.

pub mod buffer;
pub mod cache;
mod changes;
pub mod check;
pub mod checkpoint;
pub mod error;
pub mod extents;
pub mod io;
pub mod leaf;
mod mutate;
pub mod node;
mod rewrite;
pub mod space;
pub mod sums;
pub mod tree;

pub use buffer::{Buffered, FrozenChanges, Merged};
pub use cache::{Cache, CacheStats};
pub use checkpoint::{Fills, Frozen, NodeAlloc, Written};
pub use error::{Result, StoreError};
pub use extents::ExtentTree;
pub use io::{FileIo, MemIo, NodeIo};
pub use space::SpaceMap;
pub use sums::{BlockSum, FrozenSums, SumsTree};
pub use tree::{RootRef, Tree};

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tarn_format::Pba;

/// What every tree of a pool shares: the node I/O and the cache.
pub struct Store {
    pub io: Arc<dyn NodeIo>,
    pub cache: Cache,
    /// Nodes changed since their last checkpoint (about: a checkpoint is
    /// due when they grow large).
    pub(crate) dirty_nodes: AtomicU64,
    /// Bytes of changes buffered in memory by every [`Buffered`] tree
    /// (pending and frozen): a checkpoint is due when they grow large.
    pub(crate) buffered: Arc<AtomicU64>,
    /// Node copies rewritten from a good copy after they read damaged.
    healed_nodes: AtomicU64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({:?}, {} dirty)", self.cache.stats(), self.dirty_nodes())
    }
}

impl Store {
    pub fn new(io: Arc<dyn NodeIo>, cache_bytes: usize) -> Result<Store> {
        Ok(Store::with_cache(io, Cache::new(cache_bytes)?))
    }

    pub fn with_cache(io: Arc<dyn NodeIo>, cache: Cache) -> Store {
        Store { io, cache, dirty_nodes: AtomicU64::new(0), buffered: Arc::default(), healed_nodes: AtomicU64::new(0) }
    }

    /// A store whose trees live in memory only (nothing is written until
    /// the engine checkpoints trees; tests and tools).
    pub fn memory() -> Store {
        Store::new(Arc::new(MemIo::default()), 64 << 20).expect("64 MiB is above the minimum cache")
    }

    pub fn dirty_nodes(&self) -> u64 {
        self.dirty_nodes.load(Ordering::Relaxed)
    }

    /// Bytes of changes waiting in buffered trees' memory for a checkpoint.
    pub fn buffered_bytes(&self) -> u64 {
        self.buffered.load(Ordering::Relaxed)
    }

    /// Node copies rewritten from a good copy since this store was opened.
    pub fn healed_nodes(&self) -> u64 {
        self.healed_nodes.load(Ordering::Relaxed)
    }

    /// Rewrite copies `bad` of the node at `pba` with `good`, a copy that
    /// validated. Best effort: the read already has its node, and a copy
    /// that cannot be rewritten now (a faulted leg) is the resilver's job.
    pub(crate) fn heal(&self, pba: Pba, bad: &[usize], good: &[u8]) {
        for &copy in bad {
            match self.io.write_node_copy(pba, copy, good) {
                Ok(()) => {
                    self.healed_nodes.fetch_add(1, Ordering::Relaxed);
                    log::warn!("store node {pba} copy {copy} on {} was damaged; rewritten", self.io.device_name(pba));
                }
                Err(e) => {
                    log::warn!(
                        "store node {pba} copy {copy} on {} is damaged, not rewritten: {e}",
                        self.io.device_name(pba)
                    )
                }
            }
        }
    }

    /// A node block is being freed: it may be reused, so forget it.
    pub fn forget(&self, pba: Pba) {
        self.cache.remove(pba);
    }
}

thread_local! {
    static NO_IO: Cell<bool> = const { Cell::new(false) };
}

fn io_forbidden() -> bool {
    NO_IO.with(|f| f.get())
}

/// Run `f` (tree reads under a lock that writers wait on) without device
/// I/O: a node that is not cached fails the read with
/// [`StoreError::Miss`], which the caller answers by dropping its lock,
/// calling [`fetch`] and retrying. So no lock is held across a read.
pub fn without_io<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            NO_IO.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(NO_IO.with(|c| c.replace(true)));
    f()
}

/// A node a read under [`without_io`] needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Miss {
    pub pba: Pba,
    pub crc: u32,
    pub tree: u64,
    pub level: u8,
    lo: u64,
    hi: u64,
}

/// Read and cache the node a [`Miss`] named (no lock needed).
pub fn fetch<V: tarn_format::node::LeafValue>(store: &Store, miss: &Miss) -> Result<()> {
    let probe: Tree<V> = Tree::new(miss.tree);
    let bounds = tree::Bounds { lo: miss.lo, hi: miss.hi };
    probe.load_clean(store, miss.pba, miss.crc, miss.level, bounds).map(|_| ())
}
