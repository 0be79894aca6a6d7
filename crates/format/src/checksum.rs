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

/// crc32c of `data`, seeded with the type's salt (hardware-accelerated by
/// the `crc-fast` crate).
pub fn checksum(salt: u32, data: &[u8]) -> u32 {
    checksum_append(salt, data)
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

/// Continue a running checksum: the crc32c of the bytes it covered
/// followed by `data` (the convention of the `crc32c` crate's
/// `crc32c_append`, which format 1 to 3 were written with).
pub fn checksum_append(crc: u32, data: &[u8]) -> u32 {
    let mut digest = crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    digest.update(data);
    digest.finalize() as u32
}

/// The crc32c of `data` (a block of data: the hot path, no salt).
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_is_castagnoli() {
        // The CRC catalogue's check value of CRC-32/ISCSI.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(checksum_append(0, b"123456789"), 0xe306_9283);
        // A 4 KiB block takes the vector path: it must agree with the bytewise one.
        let block: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
        let bytewise = block.iter().fold(0, |crc, b| checksum_append(crc, std::slice::from_ref(b)));
        assert_eq!(crc32c(&block), bytewise);
    }

    #[test]
    fn appending_continues_a_checksum() {
        let (a, b) = (b"tarn pool ".as_slice(), b"metadata".as_slice());
        let whole = [a, b].concat();
        assert_eq!(checksum_append(checksum_append(0, a), b), crc32c(&whole));
        assert_eq!(checksum(SALT_SUPERBLOCK, &whole), checksum_append(checksum(SALT_SUPERBLOCK, a), b));
    }
}
