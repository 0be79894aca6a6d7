//! The traits the engine implements: an [`Export`] (one block device) and a
//! [`Backend`] (the set of exports a server offers).

use std::sync::Arc;

use crate::error::ExportError;

/// One extent of `base:allocation` block status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockStatusExtent {
    /// Length in bytes (extents of length 0 are ignored by the server).
    pub length: u64,
    /// Not allocated (`NBD_STATE_HOLE`).
    pub hole: bool,
    /// Reads as zeroes (`NBD_STATE_ZERO`).
    pub zero: bool,
}

/// One extent of a non-base metadata context: length in bytes and the
/// context-defined flags (for `qemu:dirty-bitmap:*`, bit 0 = dirty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextExtent {
    /// Length in bytes (extents of length 0 are ignored by the server).
    pub length: u64,
    /// Status flags as defined by the context (sent as-is on the wire).
    pub flags: u32,
}

/// A block device served over NBD. All methods may be called concurrently
/// from several worker threads and several connections.
///
/// The server validates ranges before calling: `offset + length` never
/// exceeds [`Export::size`], lengths are never zero, and mutating calls are
/// never made on a read-only export.
pub trait Export: Send + Sync {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Whether the export refuses writes (advertised as `NBD_FLAG_READ_ONLY`).
    fn read_only(&self) -> bool;
    /// Fill all of `buf` with the contents at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError>;
    /// Write `data` at `offset`; with `fua`, durable when this returns.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;
    /// Durable: every write answered before this call was received is on stable storage when it returns.
    fn flush(&self) -> Result<(), ExportError>;
    /// Discard a range (a hint; reads of it are unspecified afterwards).
    fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError>;
    /// Zero a range. no_hole: keep the range allocated; fast: fail with NotSupported unless it is fast.
    fn write_zeroes(&self, offset: u64, length: u64, no_hole: bool, fast: bool, fua: bool) -> Result<(), ExportError>;
    /// Extents covering [offset, offset+length) from offset, in order; may stop early (at least one extent).
    fn block_status(&self, offset: u64, length: u64) -> Result<Vec<BlockStatusExtent>, ExportError>;
    /// Prefetch hint.
    fn cache(&self, offset: u64, length: u64) -> Result<(), ExportError> {
        let _ = (offset, length);
        Ok(())
    }
    /// Block sizes for NBD_INFO_BLOCK_SIZE, as `(minimum, preferred, maximum)`
    /// (the wire order of NBD_INFO_BLOCK_SIZE, and the order of the default
    /// values `(1, 4096, 32 MiB)`). The server sanitises
    /// the values (powers of two, minimum <= 64 KiB, maximum capped by
    /// [`crate::ServerConfig::max_request_bytes`]) and falls back to the
    /// protocol defaults if they are inconsistent.
    fn block_sizes(&self) -> (u32, u32, u32) {
        (1, 4096, 32 * 1024 * 1024)
    }
    /// Extra metadata contexts this export offers besides base:allocation,
    /// full names such as "qemu:dirty-bitmap:snap1". Default: none.
    ///
    /// Asked once per `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
    /// The server ignores (with a warning) names that are not valid context
    /// names (`namespace:leaf`, leaf not empty and not ending in `:`, at most
    /// 4096 bytes, no NUL), names in the `base:` namespace, duplicates, and
    /// any beyond the first 1024.
    fn meta_contexts(&self) -> Vec<String> {
        Vec::new()
    }
    /// Status of [offset, offset+length) in the extra context `name` (one of
    /// meta_contexts()); in order from offset, may stop early, at least one extent.
    ///
    /// An error, or an empty list, fails the whole `NBD_CMD_BLOCK_STATUS`
    /// request (an empty list as `NBD_EIO`).
    fn context_status(&self, name: &str, offset: u64, length: u64) -> Result<Vec<ContextExtent>, ExportError> {
        let _ = (name, offset, length);
        Err(ExportError::NotSupported)
    }
}

/// An entry of `NBD_OPT_LIST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportDescription {
    pub name: String,
    pub description: String,
}

/// The set of exports a [`crate::Server`] offers.
pub trait Backend: Send + Sync {
    /// Exports listed by `NBD_OPT_LIST`.
    fn list(&self) -> Vec<ExportDescription>;
    /// Open the export for a new connection; None if no such export.
    fn open(&self, name: &str) -> Option<Arc<dyn Export>>;
    /// Export used for the empty name "" (NBD default export), if any.
    fn default_export(&self) -> Option<String> {
        None
    }
}
