//! An in-memory, sparse [`Export`] (test helper, also used by the
//! `memserve` example) and a simple [`Backend`] over fixed exports.
//!
//! Memory is kept in 4 KiB blocks, each behind its own `RwLock`; an
//! unallocated block is a hole (reads as zeroes, reported as
//! `hole|zero` by block status). Trim and write-zeroes without `NO_HOLE`
//! deallocate fully covered blocks and zero partial ones.
//!
//! Optionally ([`MemoryExport::with_dirty_bitmap`]) the export tracks the
//! ranges changed since its creation at [`DIRTY_GRANULARITY`] and offers
//! them as qemu's `qemu:dirty-bitmap:NAME` metadata context, the way an
//! engine would offer changed-block tracking.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::error::ExportError;
use crate::export::{Backend, BlockStatusExtent, ContextExtent, Export, ExportDescription};
use crate::protocol::{NBD_STATE_DIRTY, QEMU_DIRTY_BITMAP_PREFIX};

/// Allocation granularity.
pub const MEMORY_BLOCK: usize = 4096;
/// Granularity of the dirty bitmap (qemu's default bitmap granularity).
pub const DIRTY_GRANULARITY: u64 = 64 * 1024;

/// One bit per [`DIRTY_GRANULARITY`] chunk, set when anything in the chunk
/// is written, trimmed or zeroed; atomic so that writers need no lock.
struct DirtyBitmap {
    /// Full context name, `qemu:dirty-bitmap:NAME`.
    context: String,
    bits: Vec<AtomicU64>,
}

impl DirtyBitmap {
    fn new(name: &str, size: u64) -> DirtyBitmap {
        let chunks = size.div_ceil(DIRTY_GRANULARITY);
        let words = chunks.div_ceil(64) as usize;
        let context = format!("{QEMU_DIRTY_BITMAP_PREFIX}{name}");
        DirtyBitmap { context, bits: (0..words).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Mark the chunks touching `[offset, offset+len)` (a valid range).
    fn mark(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (first, last) = (offset / DIRTY_GRANULARITY, (offset + len - 1) / DIRTY_GRANULARITY);
        for chunk in first..=last {
            if let Some(w) = self.bits.get((chunk / 64) as usize) {
                w.fetch_or(1 << (chunk % 64), Ordering::Relaxed);
            }
        }
    }

    fn is_dirty(&self, chunk: u64) -> bool {
        self.bits.get((chunk / 64) as usize).is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (chunk % 64)) != 0)
    }

    /// Extents of `[offset, offset+len)` (a valid range), equal neighbours merged.
    fn status(&self, offset: u64, len: u64) -> Vec<ContextExtent> {
        let end = offset + len;
        let mut out: Vec<ContextExtent> = Vec::new();
        let mut pos = offset;
        while pos < end {
            let chunk = pos / DIRTY_GRANULARITY;
            let n = ((chunk + 1) * DIRTY_GRANULARITY).min(end) - pos;
            let flags = if self.is_dirty(chunk) { NBD_STATE_DIRTY } else { 0 };
            match out.last_mut() {
                Some(last) if last.flags == flags => last.length += n,
                _ => out.push(ContextExtent { length: n, flags }),
            }
            pos += n;
        }
        out
    }
}

type Block = Option<Box<[u8; MEMORY_BLOCK]>>;

/// A sparse in-memory block device.
pub struct MemoryExport {
    size: u64,
    read_only: bool,
    blocks: Vec<RwLock<Block>>,
    dirty: Option<DirtyBitmap>,
}

impl MemoryExport {
    /// A writable export of `size` bytes, all holes.
    pub fn new(size: u64) -> MemoryExport {
        let n = size.div_ceil(MEMORY_BLOCK as u64) as usize;
        MemoryExport { size, read_only: false, blocks: (0..n).map(|_| RwLock::new(None)).collect(), dirty: None }
    }

    /// Track changes from now on and offer them as the metadata context
    /// `qemu:dirty-bitmap:<name>` (flag [`NBD_STATE_DIRTY`] for a
    /// [`DIRTY_GRANULARITY`] chunk written, trimmed or zeroed since). The
    /// server ignores the context if the resulting name is not a valid
    /// context name (e.g. an empty `name`).
    pub fn with_dirty_bitmap(mut self, name: &str) -> MemoryExport {
        self.dirty = Some(DirtyBitmap::new(name, self.size));
        self
    }

    /// Same, but refusing writes.
    pub fn new_read_only(size: u64) -> MemoryExport {
        MemoryExport { read_only: true, ..MemoryExport::new(size) }
    }

    /// Number of allocated 4 KiB blocks.
    pub fn allocated_blocks(&self) -> usize {
        self.blocks.iter().filter(|b| read_lock(b).is_some()).count()
    }

    /// Whether the block containing `offset` is allocated.
    pub fn is_allocated(&self, offset: u64) -> bool {
        self.blocks.get((offset / MEMORY_BLOCK as u64) as usize).is_some_and(|b| read_lock(b).is_some())
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(ExportError::Invalid),
        }
    }

    /// Validate a mutation of the range and, as it is about to change, mark it dirty.
    fn check_write(&self, offset: u64, len: u64) -> Result<(), ExportError> {
        if self.read_only {
            return Err(ExportError::Perm);
        }
        self.check(offset, len)?;
        if let Some(d) = &self.dirty {
            d.mark(offset, len);
        }
        Ok(())
    }

    /// Call `f(block index, offset in block, length, byte offset in range)`
    /// for each piece of `[offset, offset+len)`.
    fn for_each_piece(offset: u64, len: u64, mut f: impl FnMut(usize, usize, usize, usize)) {
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let idx = (pos / MEMORY_BLOCK as u64) as usize;
            let within = (pos % MEMORY_BLOCK as u64) as usize;
            let n = ((MEMORY_BLOCK - within) as u64).min(end - pos) as usize;
            f(idx, within, n, (pos - offset) as usize);
            pos += n as u64;
        }
    }

    /// Zero a range; deallocate fully covered blocks unless `keep`.
    fn zero_range(&self, offset: u64, len: u64, keep: bool) {
        Self::for_each_piece(offset, len, |idx, within, n, _| {
            let mut b = write_lock(&self.blocks[idx]);
            if n == MEMORY_BLOCK && !keep {
                *b = None;
            } else if let Some(data) = b.as_mut() {
                data[within..within + n].fill(0);
            } else if keep {
                *b = Some(Box::new([0u8; MEMORY_BLOCK]));
            }
        });
    }
}

fn read_lock(l: &RwLock<Block>) -> std::sync::RwLockReadGuard<'_, Block> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write_lock(l: &RwLock<Block>) -> std::sync::RwLockWriteGuard<'_, Block> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

impl Export for MemoryExport {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.check(offset, buf.len() as u64)?;
        Self::for_each_piece(offset, buf.len() as u64, |idx, within, n, at| {
            let out = &mut buf[at..at + n];
            match &*read_lock(&self.blocks[idx]) {
                Some(data) => out.copy_from_slice(&data[within..within + n]),
                None => out.fill(0),
            }
        });
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        self.check_write(offset, data.len() as u64)?;
        Self::for_each_piece(offset, data.len() as u64, |idx, within, n, at| {
            let mut b = write_lock(&self.blocks[idx]);
            let block = b.get_or_insert_with(|| Box::new([0u8; MEMORY_BLOCK]));
            block[within..within + n].copy_from_slice(&data[at..at + n]);
        });
        Ok(())
    }

    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }

    fn trim(&self, offset: u64, length: u64, _fua: bool) -> Result<(), ExportError> {
        self.check_write(offset, length)?;
        self.zero_range(offset, length, false);
        Ok(())
    }

    fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        no_hole: bool,
        _fast: bool,
        _fua: bool,
    ) -> Result<(), ExportError> {
        self.check_write(offset, length)?;
        self.zero_range(offset, length, no_hole);
        Ok(())
    }

    fn block_status(&self, offset: u64, length: u64) -> Result<Vec<BlockStatusExtent>, ExportError> {
        self.check(offset, length)?;
        let mut out: Vec<BlockStatusExtent> = Vec::new();
        Self::for_each_piece(offset, length, |idx, _, n, _| {
            let hole = read_lock(&self.blocks[idx]).is_none();
            match out.last_mut() {
                Some(last) if last.hole == hole => last.length += n as u64,
                _ => out.push(BlockStatusExtent { length: n as u64, hole, zero: hole }),
            }
        });
        Ok(out)
    }

    fn meta_contexts(&self) -> Vec<String> {
        self.dirty.iter().map(|d| d.context.clone()).collect()
    }

    fn context_status(&self, name: &str, offset: u64, length: u64) -> Result<Vec<ContextExtent>, ExportError> {
        let Some(d) = self.dirty.as_ref().filter(|d| d.context == name) else {
            return Err(ExportError::NotSupported);
        };
        self.check(offset, length)?;
        Ok(d.status(offset, length))
    }
}

/// A [`Backend`] over a fixed list of exports; the first one is the default.
#[derive(Clone, Default)]
pub struct MemoryBackend {
    exports: Vec<(ExportDescription, Arc<dyn Export>)>,
}

impl MemoryBackend {
    pub fn new() -> MemoryBackend {
        MemoryBackend::default()
    }

    /// Add an export.
    pub fn with_export(mut self, name: &str, description: &str, export: Arc<dyn Export>) -> MemoryBackend {
        self.exports.push((ExportDescription { name: name.into(), description: description.into() }, export));
        self
    }
}

impl Backend for MemoryBackend {
    fn list(&self) -> Vec<ExportDescription> {
        self.exports.iter().map(|(d, _)| d.clone()).collect()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        self.exports.iter().find(|(d, _)| d.name == name).map(|(_, e)| Arc::clone(e))
    }

    fn default_export(&self) -> Option<String> {
        self.exports.first().map(|(d, _)| d.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_trim_status() {
        let m = MemoryExport::new(5 * 4096 + 100);
        let mut buf = vec![1u8; 9000];
        m.read(100, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        let data: Vec<u8> = (0..9000).map(|i| i as u8).collect();
        m.write(100, &data, false).unwrap();
        m.read(100, &mut buf).unwrap();
        assert_eq!(buf, data);
        assert_eq!(m.allocated_blocks(), 3);
        // Tail block (partial) works.
        m.write(5 * 4096 + 90, &[7u8; 10], false).unwrap();
        assert!(m.write(5 * 4096 + 91, &[7u8; 10], false).is_err());
        assert_eq!(
            m.block_status(0, 5 * 4096 + 100).unwrap(),
            vec![
                BlockStatusExtent { length: 3 * 4096, hole: false, zero: false },
                BlockStatusExtent { length: 2 * 4096, hole: true, zero: true },
                BlockStatusExtent { length: 100, hole: false, zero: false },
            ]
        );
        m.trim(0, 8192, false).unwrap();
        assert!(!m.is_allocated(0) && !m.is_allocated(4096) && m.is_allocated(8192));
        // Partial trim zeroes but keeps the block.
        m.trim(8192, 100, false).unwrap();
        let mut b = [9u8; 100];
        m.read(8192, &mut b).unwrap();
        assert_eq!(b, [0u8; 100]);
        m.write_zeroes(0, 4096, true, false, false).unwrap();
        assert!(m.is_allocated(0));
        let ro = MemoryExport::new_read_only(4096);
        assert_eq!(ro.write(0, &[1], false), Err(ExportError::Perm));
        assert_eq!(m.read(u64::MAX, &mut [0u8; 2]), Err(ExportError::Invalid));
        // No dirty bitmap unless asked for.
        assert!(m.meta_contexts().is_empty());
        assert_eq!(m.context_status("qemu:dirty-bitmap:x", 0, 1), Err(ExportError::NotSupported));
    }

    #[test]
    fn dirty_bitmap() {
        let g = DIRTY_GRANULARITY;
        let m = MemoryExport::new(10 * g + 100).with_dirty_bitmap("b");
        assert_eq!(m.meta_contexts(), ["qemu:dirty-bitmap:b"]);
        let name = "qemu:dirty-bitmap:b";
        let ext = |length, flags| ContextExtent { length, flags };
        assert_eq!(m.context_status(name, 0, 10 * g + 100).unwrap(), [ext(10 * g + 100, 0)]);
        m.write(g + 1, &[1; 10], false).unwrap();
        m.trim(3 * g - 1, 2, false).unwrap();
        m.write_zeroes(10 * g, 100, false, false, false).unwrap();
        // Failed writes change nothing.
        assert!(m.write(10 * g + 99, &[1; 2], false).is_err());
        assert_eq!(
            m.context_status(name, 0, 10 * g + 100).unwrap(),
            [ext(g, 0), ext(3 * g, 1), ext(6 * g, 0), ext(100, 1)]
        );
        // Unaligned query, clipped to the range.
        assert_eq!(m.context_status(name, g + 5, g).unwrap(), [ext(g, 1)]);
        assert_eq!(m.context_status(name, 4 * g - 5, 10).unwrap(), [ext(5, 1), ext(5, 0)]);
        assert_eq!(m.context_status("qemu:dirty-bitmap:c", 0, 1), Err(ExportError::NotSupported));
        assert_eq!(m.context_status(name, 10 * g, 101), Err(ExportError::Invalid));
        // Reads do not dirty anything.
        m.read(5 * g, &mut [0u8; 100]).unwrap();
        assert_eq!(m.context_status(name, 5 * g, g).unwrap(), [ext(g, 0)]);
    }
}
