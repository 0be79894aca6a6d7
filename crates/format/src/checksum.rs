//! Per-type salted crc32c. A block checksummed as one type never validates as
//! another, so a misdirected or stale structure of the wrong kind is caught.

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

/// Continue a running checksum.
pub fn checksum_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}
