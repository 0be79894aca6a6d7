//! The 4 KiB blocks of the live volume's small-record objects kept in
//! memory: the inode table (inode saves, the header) and the version log
//! (a 64-byte record per close version). Every change to them goes
//! through here and is written through as a whole block, so it costs the
//! engine no read-modify-write (a record written alone made the engine
//! read and verify its block first), and an inode read costs no engine
//! read once its block is cached. The engine always holds what the cache
//! holds: a block is cached only as read from the head or as last
//! written there, one whose write failed is dropped, and one unmapped
//! (`unmap_cached`) too. The namespace mutex serializes all of it, and
//! the mount holds the pool lock, so nothing else writes these objects
//! meanwhile. Snapshot views read the engine directly.

use crate::error::Result;
use crate::ns::{FileVolume, Ns};
use std::collections::HashMap;
use tarn_engine::View;

const BLOCK: u64 = 4096;
/// Blocks kept (16 MiB, 65,536 inodes), cleared whole past this.
const BLOCKS: usize = 4096;

/// Cached blocks by volume (the table or the version log) and block number.
#[derive(Default)]
pub(crate) struct TableCache {
    blocks: HashMap<(u32, u64), Box<[u8]>>,
}

impl FileVolume {
    /// Write `bytes` at `offset` of the live table (within one block).
    pub(crate) fn write_table(&self, ns: &mut Ns, offset: u64, bytes: &[u8]) -> Result<()> {
        self.write_cached(ns, self.id, offset, bytes)
    }

    /// Read `buf.len()` bytes at `offset` of the live table (within one block).
    pub(crate) fn read_table(&self, ns: &mut Ns, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_cached(ns, self.id, offset, buf)
    }

    /// Write `bytes` at `offset` of `vol`'s head (within one block).
    pub(crate) fn write_cached(&self, ns: &mut Ns, vol: u32, offset: u64, bytes: &[u8]) -> Result<()> {
        let key = (vol, offset / BLOCK);
        let at = (offset % BLOCK) as usize;
        let mut b = self.take_block(ns, key)?;
        b[at..at + bytes.len()].copy_from_slice(bytes);
        self.pool.write(vol, key.1 * BLOCK, &b, false)?;
        put_block(ns, key, b);
        Ok(())
    }

    /// Read `buf.len()` bytes at `offset` of `vol`'s head (within one block).
    pub(crate) fn read_cached(&self, ns: &mut Ns, vol: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        let key = (vol, offset / BLOCK);
        let at = (offset % BLOCK) as usize;
        let b = self.take_block(ns, key)?;
        buf.copy_from_slice(&b[at..at + buf.len()]);
        put_block(ns, key, b);
        Ok(())
    }

    /// Block `block` of `vol` unmapped: queued, and no longer cached.
    pub(crate) fn unmap_cached(&self, ns: &mut Ns, vol: u32, block: u64) -> Result<()> {
        ns.table.blocks.remove(&(vol, block));
        Ok(self.pool.write_zeroes(vol, block * BLOCK, BLOCK, false, false)?)
    }

    /// The block taken out of the cache, or read from the head: a caller
    /// that fails before putting it back leaves it uncached.
    fn take_block(&self, ns: &mut Ns, key: (u32, u64)) -> Result<Box<[u8]>> {
        if let Some(b) = ns.table.blocks.remove(&key) {
            return Ok(b);
        }
        let mut b = vec![0u8; BLOCK as usize].into_boxed_slice();
        self.pool.read_view(key.0, View::Head, key.1 * BLOCK, &mut b)?;
        Ok(b)
    }
}

fn put_block(ns: &mut Ns, key: (u32, u64), b: Box<[u8]>) {
    if ns.table.blocks.len() >= BLOCKS {
        ns.table.blocks.clear();
    }
    ns.table.blocks.insert(key, b);
}
