//! Recompute the checksums of structures the fuzzer changed, so mutations
//! reach the checks behind the checksum. Offsets are those of docs/FORMAT.md.

use tarn_format::checksum::{
    checksum, SALT_JOURNAL_HEADER, SALT_JOURNAL_PAYLOAD, SALT_SEGMENT_HEADER, SALT_SUPERBLOCK,
};

/// Superblock: `SUPB` checksum of bytes 0..4092 at 4092.
pub const SUPERBLOCK_CRC: usize = 4092;
/// Journal record and segment headers: checksum of bytes 0..60 at 60.
pub const HEADER_CRC: usize = 60;
pub const HEADER_LEN: usize = 64;
/// Journal record header fields.
pub const JOURNAL_PAYLOAD_LEN: usize = 32;
pub const JOURNAL_PAYLOAD_CRC: usize = 48;

fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn get_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

pub fn get_u64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

/// Reseal a superblock copy (the first 4096 bytes of `buf`).
pub fn superblock(buf: &mut [u8]) {
    if buf.len() >= SUPERBLOCK_CRC + 4 {
        let c = checksum(SALT_SUPERBLOCK, &buf[..SUPERBLOCK_CRC]);
        put_u32(buf, SUPERBLOCK_CRC, c);
    }
}

fn header(buf: &mut [u8], salt: u32) {
    if buf.len() >= HEADER_LEN {
        let c = checksum(salt, &buf[..HEADER_CRC]);
        put_u32(buf, HEADER_CRC, c);
    }
}

/// Reseal a checkpoint segment header.
pub fn segment_header(buf: &mut [u8]) {
    header(buf, SALT_SEGMENT_HEADER);
}

/// Reseal a journal record: the payload checksum (when the payload its
/// header announces fits in `buf`), then the header checksum.
pub fn journal_record(buf: &mut [u8]) {
    if buf.len() < HEADER_LEN {
        return;
    }
    let len = get_u32(buf, JOURNAL_PAYLOAD_LEN) as usize;
    if let Some(payload) = buf.get(HEADER_LEN..HEADER_LEN.saturating_add(len)) {
        let c = checksum(SALT_JOURNAL_PAYLOAD, payload);
        put_u32(buf, JOURNAL_PAYLOAD_CRC, c);
    }
    header(buf, SALT_JOURNAL_HEADER);
}
