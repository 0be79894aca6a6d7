//! Where the parsers read from: a volume view, an image file, a byte slice.

use crate::error::{ExtError, Result};

/// Random-access reads of a volume of fixed size.
pub trait BlockSource {
    /// Bytes the volume holds.
    fn size(&self) -> u64;
    /// Fill `buf` from byte `offset`; the range is inside `size()`.
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()>;
}

/// Read `len` bytes at `offset`, checking the range against the size first
/// (offsets come from the file system, so they may point anywhere).
pub fn read_range(src: &mut dyn BlockSource, offset: u64, len: usize) -> Result<Vec<u8>> {
    let end = offset.checked_add(len as u64);
    if end.is_none_or(|e| e > src.size()) {
        return Err(ExtError::Corrupt(format!(
            "read of {len} bytes at {offset} past the end of the volume ({} bytes)",
            src.size()
        )));
    }
    let mut buf = vec![0u8; len];
    src.read_at(offset, &mut buf)?;
    Ok(buf)
}

/// An in-memory volume (tests, fuzzing).
pub struct SliceSource<'a>(pub &'a [u8]);

impl BlockSource for SliceSource<'_> {
    fn size(&self) -> u64 {
        self.0.len() as u64
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let start = usize::try_from(offset).map_err(|_| read_error(offset))?;
        let piece =
            start.checked_add(buf.len()).and_then(|end| self.0.get(start..end)).ok_or_else(|| read_error(offset))?;
        buf.copy_from_slice(piece);
        Ok(())
    }
}

fn read_error(offset: u64) -> ExtError {
    ExtError::Read { offset, message: "outside the image".into() }
}
