//! The live inode table's 4 KiB blocks kept in memory. Every change to
//! the table (inode saves, the header) goes through here and is written
//! through as a whole block, so it costs the engine no read-modify-write
//! (a 256-byte record written alone made the engine read and verify its
//! block first), and an inode read costs no engine read once its block is
//! cached. The engine always holds what the cache holds: a block is
//! cached only as read from the head or as last written there, and one
//! whose write failed is dropped. The namespace mutex serializes all of
//! it, and the mount holds the pool lock, so nothing else writes the
//! table meanwhile. Snapshot views read the engine directly.

use crate::error::Result;
use crate::ns::{FileVolume, Ns};
use std::collections::HashMap;
use tarn_engine::View;

const BLOCK: u64 = 4096;
/// Blocks kept (16 MiB, 65,536 inodes), cleared whole past this.
const BLOCKS: usize = 4096;

/// Cached blocks of the live table by block number.
#[derive(Default)]
pub(crate) struct TableCache {
    blocks: HashMap<u64, Box<[u8]>>,
}

impl FileVolume {
    /// Write `bytes` at `offset` of the live table (within one block).
    pub(crate) fn write_table(&self, ns: &mut Ns, offset: u64, bytes: &[u8]) -> Result<()> {
        let block = offset / BLOCK;
        let at = (offset % BLOCK) as usize;
        let mut b = self.take_block(ns, block)?;
        b[at..at + bytes.len()].copy_from_slice(bytes);
        self.pool.write(self.id, block * BLOCK, &b, false)?;
        put_block(ns, block, b);
        Ok(())
    }

    /// Read `buf.len()` bytes at `offset` of the live table (within one block).
    pub(crate) fn read_table(&self, ns: &mut Ns, offset: u64, buf: &mut [u8]) -> Result<()> {
        let block = offset / BLOCK;
        let at = (offset % BLOCK) as usize;
        let b = self.take_block(ns, block)?;
        buf.copy_from_slice(&b[at..at + buf.len()]);
        put_block(ns, block, b);
        Ok(())
    }

    /// Block `block` taken out of the cache, or read from the head: a
    /// caller that fails before putting it back leaves it uncached.
    fn take_block(&self, ns: &mut Ns, block: u64) -> Result<Box<[u8]>> {
        if let Some(b) = ns.table.blocks.remove(&block) {
            return Ok(b);
        }
        let mut b = vec![0u8; BLOCK as usize].into_boxed_slice();
        self.pool.read_view(self.id, View::Head, block * BLOCK, &mut b)?;
        Ok(b)
    }
}

fn put_block(ns: &mut Ns, block: u64, b: Box<[u8]>) {
    if ns.table.blocks.len() >= BLOCKS {
        ns.table.blocks.clear();
    }
    ns.table.blocks.insert(block, b);
}
