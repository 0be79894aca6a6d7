//! A small, deterministic pool image (one 2 MiB device) built from the
//! format's own encoders: two superblock copies, a checkpoint in two
//! segments, two journal records after it. `engine_open` damages copies of
//! it and opens them.

use std::io;
use std::sync::{Arc, Mutex};

use tarn_engine::{Device, OpenOptions, Pool};
use tarn_format::checkpoint::{SegmentHeader, SEGMENT_HEADER_LEN};
use tarn_format::checksum::{checksum, SALT_CHECKPOINT};
use tarn_format::journal::RecordHeader;
use tarn_format::ops::encode_ops;
use tarn_format::superblock::SUPERBLOCK_COPIES;
use tarn_format::BLOCK_SIZE;

use crate::samples;

pub const DEVICE_BYTES: usize = 2 << 20;
const BS: usize = BLOCK_SIZE as usize;
/// Blocks of the two checkpoint segments (device 0, so pba = block).
pub const SEGMENTS: [u64; 2] = [100, 110];

/// What the fuzz target needs to know about the image.
#[derive(Debug, Clone)]
pub struct Image {
    pub bytes: Vec<u8>,
    pub journal_start: u64,
    pub journal_blocks: u64,
    /// First journal block after the last record.
    pub journal_end: u64,
    pub generation: u64,
    /// Sequence number the next record must carry.
    pub next_seq: u64,
    /// The pool's epoch after the journal.
    pub epoch: u64,
}

/// Build the image.
pub fn build() -> Image {
    let mut bytes = vec![0u8; DEVICE_BYTES];
    let payload = samples::encode_checkpoint(&samples::checkpoint());
    let seq = samples::checkpoint().0.seq;
    // Two segments of one block each: half the payload in each.
    let half = payload.len() / 2;
    let parts = [&payload[..half], &payload[half..]];
    for (i, (&block, part)) in SEGMENTS.iter().zip(parts).enumerate() {
        let h = SegmentHeader {
            seq,
            index: i as u32,
            blocks: 1,
            self_pba: block,
            next_pba: SEGMENTS.get(i + 1).copied().unwrap_or(0),
            payload_len: part.len() as u32,
        };
        let at = block as usize * BS;
        bytes[at..at + SEGMENT_HEADER_LEN].copy_from_slice(&h.encode());
        bytes[at + SEGMENT_HEADER_LEN..at + SEGMENT_HEADER_LEN + part.len()].copy_from_slice(part);
    }
    let mut sb = samples::superblock();
    sb.checkpoint.first_segment = SEGMENTS[0];
    sb.checkpoint.segments = SEGMENTS.len() as u32;
    sb.checkpoint.payload_len = payload.len() as u64;
    sb.checkpoint.payload_crc = checksum(SALT_CHECKPOINT, &payload);
    sb.checkpoint.seq = seq;
    for &copy in &SUPERBLOCK_COPIES {
        let at = copy as usize * BS;
        bytes[at..at + BS].copy_from_slice(&sb.encode(copy));
    }
    let mut block = sb.journal_start;
    let mut next_seq = seq + 1;
    let mut epoch = 0;
    for (e, ops) in samples::journal() {
        let rec = RecordHeader::encode_record(sb.journal_generation, next_seq, block, e, &encode_ops(&ops));
        let at = block as usize * BS;
        bytes[at..at + rec.len()].copy_from_slice(&rec);
        block += (rec.len() / BS) as u64;
        next_seq += 1;
        epoch = e;
    }
    Image {
        bytes,
        journal_start: sb.journal_start,
        journal_blocks: sb.journal_blocks,
        journal_end: block,
        generation: sb.journal_generation,
        next_seq,
        epoch,
    }
}

/// A device over a byte vector.
pub struct MemDevice {
    data: Mutex<Vec<u8>>,
    size: u64,
}

impl MemDevice {
    pub fn new(data: Vec<u8>) -> MemDevice {
        let size = data.len() as u64;
        MemDevice { data: Mutex::new(data), size }
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
        let r = self.range(offset, buf.len())?;
        buf.copy_from_slice(&self.data.lock().unwrap_or_else(|p| p.into_inner())[r]);
        Ok(())
    }
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        let r = self.range(offset, data.len())?;
        self.data.lock().unwrap_or_else(|p| p.into_inner())[r].copy_from_slice(data);
        Ok(())
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
        "fuzz0".into()
    }
}

/// Open `bytes` read-only as a one-device pool.
pub fn open(bytes: Vec<u8>) -> tarn_engine::Result<Pool> {
    let dev: Arc<dyn Device> = Arc::new(MemDevice::new(bytes));
    Pool::open(vec![dev], OpenOptions { read_only: true, ..OpenOptions::default() })
}

/// Where an edit of `engine_open`'s input lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    SuperblockCopy0 = 0,
    SuperblockCopy1 = 1,
    Journal = 2,
    FirstSegment = 3,
    /// Anywhere: the offset is in units of 64 bytes.
    Device = 4,
}

/// Input flags of `engine_open` (first byte).
pub mod flags {
    /// Reseal every journal record (payload and header checksums).
    pub const RESEAL_JOURNAL: u8 = 1;
    /// Reseal the checkpoint's segment headers along the superblock's
    /// chain, record the payload's length and checksum in both superblock
    /// copies, and reseal them.
    pub const RESEAL_CHECKPOINT: u8 = 2;
    /// Reseal both superblock copies.
    pub const RESEAL_SUPERBLOCKS: u8 = 4;
    /// Append a journal record after the last one: epoch offset byte, then
    /// the rest of the input as its ops payload.
    pub const APPEND_RECORD: u8 = 8;
}

/// Encode an `engine_open` input: flags, edits `(area, offset, bytes)`,
/// then the appended record's epoch offset and payload (with APPEND_RECORD).
pub fn encode_input(flags: u8, edits: &[(Area, u16, &[u8])], append: Option<(u8, &[u8])>) -> Vec<u8> {
    let mut out = vec![flags, edits.len() as u8];
    for (area, off, bytes) in edits {
        out.push(*area as u8);
        out.extend_from_slice(&off.to_le_bytes());
        out.push(bytes.len() as u8);
        out.extend_from_slice(bytes);
    }
    if let Some((epoch, payload)) = append {
        out.push(epoch);
        out.extend_from_slice(payload);
    }
    out
}

/// Apply an `engine_open` input to a copy of the image: edits first, then
/// the appended record, then the reseals the flags ask for.
pub fn apply_input(img: &Image, data: &[u8]) -> Vec<u8> {
    let mut bytes = img.bytes.clone();
    let (flags, count, mut r) = match data {
        [f, n, rest @ ..] => (*f, *n, rest),
        [f] => (*f, 0, &[][..]),
        [] => (0, 0, &[][..]),
    };
    for _ in 0..count % 32 {
        let [area, lo, hi, len, rest @ ..] = r else {
            break;
        };
        let len = usize::from(*len).min(rest.len());
        let off = usize::from(u16::from_le_bytes([*lo, *hi]));
        let at = match area % 5 {
            0 => off,
            1 => 16 * BS + off,
            2 => img.journal_start as usize * BS + off,
            3 => SEGMENTS[0] as usize * BS + off,
            _ => off * 64,
        };
        if let Some(dst) = bytes.get_mut(at..at + len) {
            dst.copy_from_slice(&rest[..len]);
        }
        r = &rest[len..];
    }
    if flags & flags::APPEND_RECORD != 0 {
        if let Some((&e, payload)) = r.split_first() {
            let epoch = img.epoch + u64::from(e);
            let rec = RecordHeader::encode_record(img.generation, img.next_seq, img.journal_end, epoch, payload);
            let at = img.journal_end as usize * BS;
            let end = (img.journal_start + img.journal_blocks) as usize * BS;
            if at + rec.len() <= end {
                bytes[at..at + rec.len()].copy_from_slice(&rec);
            }
        }
    }
    if flags & flags::RESEAL_JOURNAL != 0 {
        reseal_journal(img, &mut bytes);
    }
    if flags & flags::RESEAL_CHECKPOINT != 0 {
        reseal_checkpoint(&mut bytes);
    }
    if flags & (flags::RESEAL_SUPERBLOCKS | flags::RESEAL_CHECKPOINT) != 0 {
        for &copy in &SUPERBLOCK_COPIES {
            crate::reseal::superblock(&mut bytes[copy as usize * BS..]);
        }
    }
    bytes
}

/// Reseal the records found in the journal region, walking by their
/// `blocks` fields.
fn reseal_journal(img: &Image, bytes: &mut [u8]) {
    let end = (img.journal_start + img.journal_blocks) as usize * BS;
    let mut at = img.journal_start as usize * BS;
    while at < end {
        if bytes[at..at + 8] != tarn_format::journal::JOURNAL_MAGIC {
            break;
        }
        crate::reseal::journal_record(&mut bytes[at..end]);
        let blocks = crate::reseal::get_u32(bytes, at + 36).max(1) as usize;
        at = at.saturating_add(blocks.saturating_mul(BS));
    }
}

/// Follow the chain copy 0 of the superblock names (device 0 only, at most
/// 8 segments), reseal each segment header, and store the payload's length
/// and checksum in both superblock copies.
fn reseal_checkpoint(bytes: &mut [u8]) {
    let mut next = crate::reseal::get_u64(bytes, 136);
    let count = crate::reseal::get_u32(bytes, 156).min(8);
    let mut payload = Vec::new();
    for _ in 0..count {
        let Some(at) = usize::try_from(next).ok().and_then(|b| b.checked_mul(BS)) else {
            break;
        };
        let Some(seg) = bytes.get_mut(at..at + BS) else {
            break;
        };
        crate::reseal::segment_header(seg);
        let len = (crate::reseal::get_u32(seg, 40) as usize).min(BS - SEGMENT_HEADER_LEN);
        payload.extend_from_slice(&seg[SEGMENT_HEADER_LEN..SEGMENT_HEADER_LEN + len]);
        next = crate::reseal::get_u64(seg, 32);
        if next == 0 {
            break;
        }
    }
    let crc = checksum(SALT_CHECKPOINT, &payload);
    for &copy in &SUPERBLOCK_COPIES {
        let at = copy as usize * BS;
        bytes[at + 144..at + 152].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        bytes[at + 152..at + 156].copy_from_slice(&crc.to_le_bytes());
    }
}
