//! The store's seam to the pool: where node blocks are read and written.
//! The engine implements it over its devices (mirrored or not); tests use
//! [`MemIo`], which can damage what it holds.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use tarn_format::node::NODE_SIZE;
use tarn_format::Pba;

/// Node-sized block I/O at physical addresses.
pub trait NodeIo: Send + Sync {
    fn read_node(&self, pba: Pba, buf: &mut [u8]) -> io::Result<()>;
    fn write_node(&self, pba: Pba, data: &[u8]) -> io::Result<()>;
    /// A name for errors (the device path).
    fn device_name(&self, pba: Pba) -> String;
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

/// Node blocks in memory, for tests and tools.
#[derive(Default)]
pub struct MemIo {
    blocks: Mutex<HashMap<u64, Vec<u8>>>,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
}

impl MemIo {
    /// Flip one bit of a stored block (a fault a test injects).
    pub fn flip(&self, pba: Pba, byte: usize, bit: u8) -> bool {
        let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        blocks.get_mut(&pba.0).map(|b| b[byte % NODE_SIZE] ^= 1 << (bit % 8)).is_some()
    }

    /// Copy block `from` over block `to` (a misdirected write).
    pub fn copy_block(&self, from: Pba, to: Pba) {
        let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = blocks.get(&from.0).cloned() {
            blocks.insert(to.0, b);
        }
    }

    pub fn block_count(&self) -> usize {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn addresses(&self) -> Vec<Pba> {
        let blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<Pba> = blocks.keys().map(|k| Pba(*k)).collect();
        v.sort();
        v
    }
}

impl NodeIo for MemIo {
    fn read_node(&self, pba: Pba, buf: &mut [u8]) -> io::Result<()> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        match blocks.get(&pba.0) {
            Some(b) => {
                buf.copy_from_slice(b);
                Ok(())
            }
            None => Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("block {pba} never written"))),
        }
    }

    fn write_node(&self, pba: Pba, data: &[u8]) -> io::Result<()> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.blocks.lock().unwrap_or_else(|p| p.into_inner()).insert(pba.0, data.to_vec());
        Ok(())
    }

    fn device_name(&self, _pba: Pba) -> String {
        "memory".into()
    }
}
