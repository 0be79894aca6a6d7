//! The store's seam to the pool: where node blocks are read and written.
//! The engine implements it over its devices (mirrored or not); tests use
//! [`MemIo`], which can damage what it holds.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use tarn_format::node::NODE_SIZE;
use tarn_format::Pba;

/// Node-sized block I/O at physical addresses.
///
/// A block may be kept in several copies (a mirrored device): `write_node`
/// writes all of them, `read_node` reads copy 0, and the `_copy` methods
/// let the store fall back to another copy when one is damaged and rewrite
/// the damaged one (self-heal). Implementations with one copy need only the
/// first three methods.
pub trait NodeIo: Send + Sync {
    /// Read copy 0 of the block at `pba`.
    fn read_node(&self, pba: Pba, buf: &mut [u8]) -> io::Result<()>;
    /// Write every copy of the block at `pba`.
    fn write_node(&self, pba: Pba, data: &[u8]) -> io::Result<()>;
    /// Write consecutive nodes from `first` (`data` is whole blocks): a
    /// checkpoint's nodes in one device write where the backend can.
    fn write_nodes(&self, first: Pba, data: &[u8]) -> io::Result<()> {
        for (i, block) in data.chunks(tarn_format::BLOCK_SIZE as usize).enumerate() {
            self.write_node(first.offset_by(i as u64), block)?;
        }
        Ok(())
    }
    /// Make the nodes written so far durable. A long checkpoint calls it
    /// between chunks, so the nodes leave the host's page cache a chunk at
    /// a time instead of all in the next FLUSH's sync (which a client
    /// waits for). Nothing to do where writes are not cached.
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    /// A name for errors (the device path).
    fn device_name(&self, pba: Pba) -> String;
    /// Independent copies of the block at `pba` (1 unless mirrored).
    fn copies(&self, _pba: Pba) -> usize {
        1
    }
    /// Read copy `copy` (0..copies) only; Err if that copy is unavailable.
    fn read_node_copy(&self, pba: Pba, copy: usize, buf: &mut [u8]) -> io::Result<()> {
        match copy {
            0 => self.read_node(pba, buf),
            _ => Err(no_such_copy(pba, copy)),
        }
    }
    /// Rewrite copy `copy` only (self-heal).
    fn write_node_copy(&self, pba: Pba, copy: usize, data: &[u8]) -> io::Result<()> {
        match copy {
            0 => self.write_node(pba, data),
            _ => Err(no_such_copy(pba, copy)),
        }
    }
}

fn no_such_copy(pba: Pba, copy: usize) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("block {pba} has no copy {copy}"))
}

/// Node blocks in a plain file at their block addresses (device bits
/// ignored): for benchmarks and tools; the engine goes through its devices.
pub struct FileIo {
    pub file: std::fs::File,
    pub writes: AtomicU64,
}

impl FileIo {
    pub fn new(file: std::fs::File) -> FileIo {
        FileIo { file, writes: AtomicU64::new(0) }
    }
}

impl NodeIo for FileIo {
    fn read_node(&self, pba: Pba, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, pba.byte_offset())
    }
    fn write_node(&self, pba: Pba, data: &[u8]) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        std::os::unix::fs::FileExt::write_all_at(&self.file, data, pba.byte_offset())
    }
    fn device_name(&self, _pba: Pba) -> String {
        "node file".into()
    }
}

/// Node blocks in memory, for tests and tools: one or more copies of each
/// block (a mirror), any of which a test can damage or lose.
pub struct MemIo {
    /// Per address, one entry per copy (None: that copy is lost).
    blocks: Mutex<HashMap<u64, Vec<Option<Vec<u8>>>>>,
    copies: usize,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    /// Make `write_node_copy` fail (a copy that cannot be healed).
    pub refuse_copy_writes: AtomicBool,
}

impl Default for MemIo {
    fn default() -> MemIo {
        MemIo::with_copies(1)
    }
}

impl MemIo {
    /// Every block kept `copies` times (at least once).
    pub fn with_copies(copies: usize) -> MemIo {
        MemIo {
            blocks: Mutex::default(),
            copies: copies.max(1),
            reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            refuse_copy_writes: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<Option<Vec<u8>>>>> {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Flip one bit of every copy of a stored block (a fault a test injects).
    pub fn flip(&self, pba: Pba, byte: usize, bit: u8) -> bool {
        let mut any = false;
        for copy in 0..self.copies {
            any |= self.flip_copy(pba, copy, byte, bit);
        }
        any
    }

    /// Flip one bit of copy `copy` of a stored block only.
    pub fn flip_copy(&self, pba: Pba, copy: usize, byte: usize, bit: u8) -> bool {
        let mut blocks = self.lock();
        let b = blocks.get_mut(&pba.0).and_then(|c| c.get_mut(copy)).and_then(|b| b.as_mut());
        b.map(|b| b[byte % NODE_SIZE] ^= 1 << (bit % 8)).is_some()
    }

    /// Lose copy `copy` of a block: reading it fails until it is rewritten.
    pub fn lose_copy(&self, pba: Pba, copy: usize) -> bool {
        let mut blocks = self.lock();
        blocks.get_mut(&pba.0).and_then(|c| c.get_mut(copy)).and_then(Option::take).is_some()
    }

    /// Copy block `from` over block `to`, every copy (a misdirected write).
    pub fn copy_block(&self, from: Pba, to: Pba) {
        let mut blocks = self.lock();
        if let Some(b) = blocks.get(&from.0).cloned() {
            blocks.insert(to.0, b);
        }
    }

    pub fn block_count(&self) -> usize {
        self.lock().len()
    }

    pub fn addresses(&self) -> Vec<Pba> {
        let mut v: Vec<Pba> = self.lock().keys().map(|k| Pba(*k)).collect();
        v.sort();
        v
    }
}

impl NodeIo for MemIo {
    fn read_node(&self, pba: Pba, buf: &mut [u8]) -> io::Result<()> {
        self.read_node_copy(pba, 0, buf)
    }

    fn write_node(&self, pba: Pba, data: &[u8]) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(pba.0, vec![Some(data.to_vec()); self.copies]);
        Ok(())
    }

    fn device_name(&self, _pba: Pba) -> String {
        "memory".into()
    }

    fn copies(&self, _pba: Pba) -> usize {
        self.copies
    }

    fn read_node_copy(&self, pba: Pba, copy: usize, buf: &mut [u8]) -> io::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if copy >= self.copies {
            return Err(no_such_copy(pba, copy));
        }
        let blocks = self.lock();
        match blocks.get(&pba.0).and_then(|c| c.get(copy)).and_then(Option::as_ref) {
            Some(b) => {
                buf.copy_from_slice(b);
                Ok(())
            }
            None => Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("block {pba} copy {copy} never written"))),
        }
    }

    fn write_node_copy(&self, pba: Pba, copy: usize, data: &[u8]) -> io::Result<()> {
        if copy >= self.copies || self.refuse_copy_writes.load(Ordering::Relaxed) {
            return Err(io::Error::other(format!("copy {copy} of block {pba} refused the write")));
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        let mut blocks = self.lock();
        let copies = blocks.entry(pba.0).or_insert_with(|| vec![None; self.copies]);
        copies[copy] = Some(data.to_vec());
        Ok(())
    }
}
