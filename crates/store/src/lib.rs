//! tarn's metadata store: paged copy-on-write B-trees whose nodes live on
//! the pool's own devices (docs/FORMAT.md *Store nodes*, docs/ARCHITECTURE.md
//! *Metadata store*).
//!
//! - [`Tree`]: an ordered map of u64 keys to compact leaf values, read on
//!   demand through a bounded [`Cache`]; changes copy the path they touch.
//! - [`Frozen`] / [`Written`]: incremental checkpoints that write only the
//!   nodes changed since the last one, while writers go on.
//! - [`ExtentTree`]: a volume map (logical ranges to physical extents) on
//!   a tree, with the merge and split rules of the engine's maps.
//! - [`check`]: walk a tree from its root, validating every node.

pub mod cache;
pub mod check;
pub mod checkpoint;
pub mod error;
pub mod extents;
pub mod io;
mod mutate;
pub mod node;
pub mod space;
pub mod sums;
pub mod tree;

pub use cache::{Cache, CacheStats};
pub use checkpoint::{Frozen, NodeAlloc, Written};
pub use error::{Result, StoreError};
pub use extents::ExtentTree;
pub use io::{MemIo, NodeIo};
pub use space::SpaceMap;
pub use sums::SumsTree;
pub use tree::{RootRef, Tree};

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
}

impl Store {
    pub fn new(io: Arc<dyn NodeIo>, cache_bytes: usize) -> Result<Store> {
        Ok(Store { io, cache: Cache::new(cache_bytes)?, dirty_nodes: AtomicU64::new(0) })
    }

    pub fn dirty_nodes(&self) -> u64 {
        self.dirty_nodes.load(Ordering::Relaxed)
    }

    /// A node block is being freed: it may be reused, so forget it.
    pub fn forget(&self, pba: Pba) {
        self.cache.remove(pba);
    }
}
