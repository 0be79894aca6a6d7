//! Per-type salted crc32c. A block checksummed as one type never validates as
//! another, so a misdirected or stale structure of the wrong kind is caught.

use crate::codec::{Reader, Writer};
use crate::error::{FormatError, Result};

/// Salts, one per structure type (arbitrary constants, fixed by the format).
pub const SALT_SUPERBLOCK: u32 = 0x5355_5042; // "SUPB"
pub const SALT_JOURNAL_HEADER: u32 = 0x4a48_4452; // "JHDR"
pub const SALT_JOURNAL_PAYLOAD: u32 = 0x4a50_4c44; // "JPLD"
pub const SALT_SEGMENT_HEADER: u32 = 0x5348_4452; // "SHDR"
pub const SALT_CHECKPOINT: u32 = 0x434b_5054; // "CKPT"

/// crc32c of `data`, seeded with the type's salt (hardware-accelerated where
/// the CPU has SSE4.2 or ARMv8 CRC, by the `crc32c` crate).
pub fn checksum(salt: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(salt, data)
}

/// Finish a fixed-size header: zero-pad to `crc_offset`, then append the
/// salted checksum of everything before it.
pub fn seal(w: &mut Writer, salt: u32, crc_offset: usize) {
    assert!(w.len() <= crc_offset, "header fields overflow into the checksum");
    w.buf.resize(crc_offset, 0);
    let crc = checksum(salt, &w.buf);
    w.u32(crc);
}

/// Check a sealed header's length, magic and checksum; on success return a
/// reader over the fields between the magic and the checksum.
pub fn unseal<'a>(
    buf: &'a [u8],
    magic: &[u8; 8],
    salt: u32,
    crc_offset: usize,
    what: &'static str,
) -> Result<Reader<'a>> {
    let len = crc_offset + 4;
    if buf.len() < len {
        return Err(FormatError::Truncated { what, needed: len, had: buf.len() });
    }
    if buf[..8] != magic[..] {
        return Err(FormatError::BadMagic { what });
    }
    let stored = u32::from_le_bytes(buf[crc_offset..len].try_into().expect("4 bytes"));
    let computed = checksum(salt, &buf[..crc_offset]);
    if stored != computed {
        return Err(FormatError::BadChecksum { what, stored, computed });
    }
    Ok(Reader::new(&buf[8..crc_offset], what))
}

/// Continue a running checksum.
pub fn checksum_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}
