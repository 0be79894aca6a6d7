//! A directory object's bytes (docs/FORMAT.md *File volumes*): 4 KiB
//! directory blocks (FS_DIR_BLOCKS), and the whole format of version 1
//! that older pools hold, read and rewritten blocked at its first change.

use crate::error::{FsError, Result};
use crate::namespace::inode::Kind;
use tarn_format::checksum::crc32c;

/// POSIX NAME_MAX.
pub const MAX_NAME: usize = 255;
/// Bounds a directory (and every decode loop): 256 Ki entries, 16 MiB.
pub const MAX_ENTRIES: usize = 1 << 18;
pub const MAX_BYTES: usize = 16 << 20;
pub const BLOCK: usize = 4096;
pub const MAX_BLOCKS: usize = MAX_BYTES / BLOCK;
/// Blocks a directory may have when read: a whole-format directory of up
/// to 16 MiB takes more than MAX_BLOCKS once blocked (each block's header
/// and crc, and room too small for the next entry), at most 16 MiB /
/// (BLOCK_ROOM - the longest entry) < 4,608; such a directory reads and
/// shrinks but takes no new entry past MAX_BLOCKS.
pub const MAX_READ_BLOCKS: usize = MAX_BLOCKS + MAX_BLOCKS / 8;
const MAGIC: &[u8; 4] = b"TFDB";
const VERSION: u8 = 2;
const HEAD: usize = 24;
const CRC_AT: usize = BLOCK - 4;
/// Bytes of entries a block holds.
pub const BLOCK_ROOM: usize = CRC_AT - HEAD;
/// An entry: cookie u64, ino u64, kind u8, name_len u8, then the name.
pub const ENTRY_HEAD: usize = 18;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub cookie: u64,
    pub ino: u64,
    pub kind: Kind,
    pub name: Vec<u8>,
}

impl Entry {
    pub fn encoded_len(&self) -> usize {
        ENTRY_HEAD + self.name.len()
    }
}

/// A name a directory may hold: 1..=255 bytes, no '/' or NUL, not . or ..
pub fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > MAX_NAME {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(FsError::Invalid("bad file name"));
    }
    Ok(())
}

const WHOLE_MAGIC: &[u8; 4] = b"TFSD";
const WHOLE_VERSION: u8 = 1;
/// The whole format's header; also what a reader reads first to learn
/// an object's length (`stored_len`).
pub const PROBE: usize = 32;

/// Append entry `e` to a block's entry bytes (the caller made room).
pub fn push_entry(image: &mut Vec<u8>, e: &Entry) {
    image.extend_from_slice(&e.cookie.to_le_bytes());
    image.extend_from_slice(&e.ino.to_le_bytes());
    image.extend_from_slice(&[e.kind as u8, e.name.len() as u8]);
    image.extend_from_slice(&e.name);
}

/// Where the entry with `cookie` lies in a block's entry bytes (as
/// `push_entry` wrote them): its offset and length.
pub fn entry_at(image: &[u8], cookie: u64) -> Option<(usize, usize)> {
    let mut at = 0;
    while at + ENTRY_HEAD <= image.len() {
        let len = ENTRY_HEAD + usize::from(image[at + 17]);
        if image[at..at + 8] == cookie.to_le_bytes() {
            return Some((at, len));
        }
        at += len;
    }
    None
}

/// Block `index` of a directory from its `count` entries' bytes
/// (`push_entry`'s, ascending cookies, fitting): `blocks` is the
/// directory's block count in block 0 and zero in the others.
pub fn encode(index: u32, blocks: u32, next_cookie: u64, count: u16, image: &[u8]) -> Vec<u8> {
    assert!(image.len() <= BLOCK_ROOM, "entries overflow their directory block");
    let mut b = vec![0u8; BLOCK];
    b[..4].copy_from_slice(MAGIC);
    b[4] = VERSION;
    b[6..8].copy_from_slice(&count.to_le_bytes());
    b[8..12].copy_from_slice(&index.to_le_bytes());
    b[12..16].copy_from_slice(&blocks.to_le_bytes());
    b[16..24].copy_from_slice(&next_cookie.to_le_bytes());
    b[HEAD..HEAD + image.len()].copy_from_slice(image);
    let crc = crc32c(&b[..CRC_AT]);
    b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// How many bytes of the object the directory takes, from its first
/// `PROBE` bytes (checked again in full by `decode`).
pub fn stored_len(head: &[u8; PROBE], ino: u64) -> Result<usize> {
    let word = |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]) as usize;
    let len = match &head[..4] {
        m if m == MAGIC => word(12).checked_mul(BLOCK).filter(|&l| l >= BLOCK),
        m if m == WHOLE_MAGIC => Some(PROBE + word(20)),
        _ => None,
    };
    len.filter(|&l| l <= MAX_READ_BLOCKS * BLOCK)
        .ok_or_else(|| FsError::corrupt("directory", ino, format!("first bytes {:?}", &head[..16])))
}

/// A directory object's content as stored, each block checked on its
/// own (what holds across blocks, `Dir::decode` checks).
pub enum Stored {
    /// Per block: the directory's next cookie when it was written, and
    /// its entries.
    Blocks(Vec<(u64, Vec<Entry>)>),
    /// The whole format: its next cookie and every entry.
    Whole(u64, Vec<Entry>),
}

/// Decode a directory object (either format).
pub fn decode(b: &[u8], ino: u64) -> Result<Stored> {
    match b.get(..4) {
        Some(m) if m == MAGIC => decode_blocks(b, ino),
        _ => decode_whole(b, ino),
    }
}

fn decode_blocks(b: &[u8], ino: u64) -> Result<Stored> {
    let blocks = b.len() / BLOCK;
    if !b.len().is_multiple_of(BLOCK) || !(1..=MAX_READ_BLOCKS).contains(&blocks) {
        return Err(FsError::corrupt("directory", ino, format!("{} bytes of blocks", b.len())));
    }
    let mut loaded = Vec::with_capacity(blocks);
    for (i, block) in b.chunks_exact(BLOCK).enumerate() {
        let counted = if i == 0 { blocks } else { 0 };
        let l = decode_block(block, i, counted)
            .map_err(|d| FsError::corrupt("directory", ino, format!("block {i}: {d}")))?;
        loaded.push(l);
    }
    Ok(Stored::Blocks(loaded))
}

/// Block `index`, whose block count field must read `counted`.
fn decode_block(b: &[u8], index: usize, counted: usize) -> std::result::Result<(u64, Vec<Entry>), String> {
    let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize;
    let crc = u32::from_le_bytes([b[CRC_AT], b[CRC_AT + 1], b[CRC_AT + 2], b[CRC_AT + 3]]);
    if &b[..4] != MAGIC || b[4] != VERSION || b[5] != 0 || crc32c(&b[..CRC_AT]) != crc {
        return Err("header or checksum".into());
    }
    if word(8) != index || word(12) != counted {
        return Err(format!("says it is block {} of {}", word(8), word(12)));
    }
    let count = usize::from(u16::from_le_bytes([b[6], b[7]]));
    let next_cookie = u64::from_le_bytes(b[16..24].try_into().map_err(|_| "cookie")?);
    let mut r = &b[HEAD..CRC_AT];
    let mut entries: Vec<Entry> = Vec::with_capacity(count.min(BLOCK_ROOM / (ENTRY_HEAD + 1)));
    for _ in 0..count {
        let e = decode_entry(&mut r).ok_or("truncated entry")?;
        let after = entries.last().map_or(2, |p| p.cookie);
        if e.cookie <= after || e.ino < 2 || check_name(&e.name).is_err() {
            return Err(format!("entry cookie {} inode {}", e.cookie, e.ino));
        }
        entries.push(e);
    }
    if r.iter().any(|&x| x != 0) {
        return Err("bytes after the entries".into());
    }
    Ok((next_cookie, entries))
}

/// The whole format (version 1): a checksummed header, then every entry.
fn decode_whole(b: &[u8], ino: u64) -> Result<Stored> {
    let bad = |d: String| FsError::corrupt("directory", ino, d);
    if b.len() < PROBE || &b[..4] != WHOLE_MAGIC || b[4] != WHOLE_VERSION || b[5..8] != [0; 3] || b[28..32] != [0; 4] {
        return Err(bad(format!("header of {} bytes", b.len())));
    }
    let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let count = word(8) as usize;
    let next_cookie = u64::from_le_bytes(b[12..20].try_into().map_err(|_| bad("cookie".into()))?);
    let len = word(20) as usize;
    if count > MAX_ENTRIES || len != b.len() - PROBE || whole_sum(b) != word(24) {
        return Err(bad(format!("{count} entries, body {len} of {} bytes, or checksum", b.len() - PROBE)));
    }
    // A name twice and a cookie past next_cookie are refused by
    // `Dir::decode`, as for blocks.
    let mut entries: Vec<Entry> = Vec::with_capacity(count);
    let mut r = &b[PROBE..];
    for _ in 0..count {
        let e = decode_entry(&mut r).ok_or_else(|| bad("truncated entry".into()))?;
        let after = entries.last().map_or(2, |p| p.cookie);
        if e.cookie <= after || e.ino < 2 || check_name(&e.name).is_err() {
            return Err(bad(format!("entry cookie {} inode {}", e.cookie, e.ino)));
        }
        entries.push(e);
    }
    if !r.is_empty() {
        return Err(bad(format!("{} trailing bytes", r.len())));
    }
    Ok(Stored::Whole(next_cookie, entries))
}

/// A directory in the whole format of version 1, as a tarn before
/// FS_DIR_BLOCKS wrote it (tarn now writes blocks; tests build older
/// pools' directories with it, and `seeds.rs` pins it to the spec).
pub fn encode_whole(next_cookie: u64, entries: &[Entry]) -> Vec<u8> {
    let mut body = Vec::new();
    for e in entries {
        push_entry(&mut body, e);
    }
    let mut b = WHOLE_MAGIC.to_vec();
    b.extend_from_slice(&[WHOLE_VERSION, 0, 0, 0]);
    b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    b.extend_from_slice(&next_cookie.to_le_bytes());
    b.extend_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&body);
    let crc = whole_sum(&b);
    b[24..28].copy_from_slice(&crc.to_le_bytes());
    b
}

/// crc32c of a whole-format encoding with its crc field (24..28) as zeros.
fn whole_sum(b: &[u8]) -> u32 {
    let mut copy = b.to_vec();
    copy[24..28].fill(0);
    crc32c(&copy)
}

fn decode_entry(r: &mut &[u8]) -> Option<Entry> {
    let head = r.get(..ENTRY_HEAD)?;
    let cookie = u64::from_le_bytes(head[..8].try_into().ok()?);
    let ino = u64::from_le_bytes(head[8..16].try_into().ok()?);
    let kind = Kind::from_byte(head[16])?;
    let n = usize::from(head[17]);
    let name = r.get(ENTRY_HEAD..ENTRY_HEAD + n)?.to_vec();
    *r = &r[ENTRY_HEAD + n..];
    Some(Entry { cookie, ino, kind, name })
}
