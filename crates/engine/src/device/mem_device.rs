//! A device in memory, for tests and tools that need a `Device` without a
//! file: one byte vector per copy; `write_at` writes every copy,
//! `write_copy` one (what a mirror does), reads and writes past the end are
//! errors.

use super::Device;
use std::io;
use std::sync::{Mutex, MutexGuard};
use tarn_format::BLOCK_SIZE;

pub struct MemDevice {
    name: String,
    size: u64,
    copies: Vec<Mutex<Vec<u8>>>,
}

impl MemDevice {
    /// `copies` zeroed copies of `size` bytes.
    pub fn new(name: &str, size: u64, copies: usize) -> MemDevice {
        let copies = (0..copies.max(1)).map(|_| Mutex::new(vec![0; size as usize])).collect();
        MemDevice { name: name.to_string(), size, copies }
    }

    /// One copy holding `bytes`.
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> MemDevice {
        MemDevice { name: name.to_string(), size: bytes.len() as u64, copies: vec![Mutex::new(bytes)] }
    }

    /// The bytes of copy `copy` (to inspect or damage them).
    pub fn bytes(&self, copy: usize) -> io::Result<MutexGuard<'_, Vec<u8>>> {
        let c = self.copies.get(copy).ok_or_else(|| io::Error::other("no such copy"))?;
        Ok(c.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Block `block` of copy `copy` (empty when out of range).
    pub fn block(&self, copy: usize, block: u64) -> Vec<u8> {
        let Ok(r) = self.range(block.saturating_mul(BLOCK_SIZE), BLOCK_SIZE as usize) else { return Vec::new() };
        self.bytes(copy).map(|b| b[r].to_vec()).unwrap_or_default()
    }

    fn range(&self, offset: u64, len: usize) -> io::Result<std::ops::Range<usize>> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(offset as usize..end as usize),
            _ => Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("I/O at {offset}+{len} past the end"))),
        }
    }
}

impl Device for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_copy(0, buf, offset)
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        (0..self.copies.len()).try_for_each(|c| self.write_copy(c, data, offset))
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn name(&self) -> String {
        self.name.clone()
    }
    fn copies(&self) -> usize {
        self.copies.len()
    }
    fn read_copy(&self, copy: usize, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let r = self.range(offset, buf.len())?;
        buf.copy_from_slice(&self.bytes(copy)?[r]);
        Ok(())
    }
    fn write_copy(&self, copy: usize, data: &[u8], offset: u64) -> io::Result<()> {
        let r = self.range(offset, data.len())?;
        self.bytes(copy)?[r].copy_from_slice(data);
        Ok(())
    }
}
