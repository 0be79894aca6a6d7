//! A small, deterministic pool image of the current format (one 2 MiB
//! device; a 6 MiB flavour has branch nodes) written by the engine itself:
//! `create_pool`, then volumes, writes, snapshots, a clone, a checkpoint (a
//! catalog and copy-on-write tree nodes), then more writes, a snapshot and
//! flushes without a close, so the journal holds records after the
//! checkpoint. `engine_open` damages copies of it and opens them.
//!
//! The engine draws uuids and the journal generation at random and stamps
//! snapshots with the clock: [`generate`] replaces them with fixed values
//! (and reseals what it changed), so the image is the same in every process
//! and a crash input replays anywhere. Whatever the fuzz target needs to
//! know about the image (journal region, checkpoint chain, the next record's
//! sequence and epoch) is read back from the image by [`Image::from_bytes`].

use std::sync::Arc;

use tarn_engine::{create_pool, CreateOptions, Device, OpenOptions, Pool, View};
use tarn_format::catalog::Catalog;
use tarn_format::checkpoint::SEGMENT_HEADER_LEN;
use tarn_format::checksum::{checksum, SALT_CHECKPOINT};
use tarn_format::journal::RecordHeader;
use tarn_format::superblock::{Superblock, SUPERBLOCK_COPIES};
use tarn_format::BLOCK_SIZE;

/// Device size of the small flavour.
pub const DEVICE_BYTES: usize = 2 << 20;
/// Journal region of the image: 32 blocks.
pub const JOURNAL_BYTES: u64 = 128 << 10;
const BS: usize = BLOCK_SIZE as usize;
const MIB: u64 = 1 << 20;

/// The two images: [`Flavour::Small`] has one-leaf trees and opens fast;
/// [`Flavour::Branches`] adds a volume of 1,100 one-block extents, so its
/// map has branch nodes, and keeps no data checksums (no DATA_CHECKSUMS
/// feature, no sums tree: checking 1,100 extents' sums would make every run
/// eight times slower).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    Small,
    Branches,
}

impl Flavour {
    fn device_bytes(self) -> usize {
        match self {
            Flavour::Small => DEVICE_BYTES,
            Flavour::Branches => 6 << 20,
        }
    }
    /// One-block extents of volume "e" (0: no such volume).
    fn sparse_extents(self) -> u64 {
        match self {
            Flavour::Small => 0,
            Flavour::Branches => 1100,
        }
    }
}

/// The fixed values [`generate`] puts in place of random and clock ones.
pub const POOL_UUID: [u8; 16] = [0x11; 16];
pub const DEVICE_UUID: [u8; 16] = [0x22; 16];
pub const JOURNAL_GENERATION: u64 = 0x1234_5678;
pub const CREATED_UNIX: u64 = 1_700_000_000;
pub const SNAPSHOT_CREATED: u64 = 1_700_000_100;

/// What the fuzz target needs to know about the image, read from it.
#[derive(Debug, Clone)]
pub struct Image {
    pub bytes: Vec<u8>,
    pub journal_start: u64,
    pub journal_blocks: u64,
    /// First journal block after the last record.
    pub journal_end: u64,
    /// End of the journal side that record is in.
    pub side_end: u64,
    /// Generation of that side.
    pub generation: u64,
    /// Sequence number the next record must carry.
    pub next_seq: u64,
    /// The pool's epoch after the journal.
    pub epoch: u64,
    /// Block of the current checkpoint's first segment (device 0).
    pub first_segment: u64,
    /// Records in the journal after the checkpoint.
    pub records: usize,
}

/// Build the small image.
pub fn build() -> Image {
    build_flavour(Flavour::Small)
}

/// Build an image of `flavour`.
pub fn build_flavour(flavour: Flavour) -> Image {
    Image::from_bytes(generate(flavour))
}

fn block(tag: u8) -> Vec<u8> {
    (0..BS).map(|i| tag.wrapping_add((i / 512) as u8)).collect()
}

fn engine<T>(what: &str, r: tarn_engine::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("pool image: {what}: {e}"))
}

/// Let the engine write a pool on a memory device; return its bytes.
/// Panics if the engine fails (a bug to fix before fuzzing).
pub fn generate(flavour: Flavour) -> Vec<u8> {
    let mem = Arc::new(device(vec![0u8; flavour.device_bytes()]));
    let dev: Arc<dyn Device> = mem.clone();
    let no_checksums = flavour == Flavour::Branches;
    let opts = CreateOptions { journal_bytes: Some(JOURNAL_BYTES), force: true, no_checksums };
    engine("create", create_pool(std::slice::from_ref(&dev), &["fuzz0".into()], &opts));
    // Fixed uuids, journal generation and creation time in both copies.
    {
        let mut bytes = locked(&mem);
        for &copy in &SUPERBLOCK_COPIES {
            let at = copy as usize * BS;
            let mut sb = Superblock::decode(&bytes[at..at + BS], copy).expect("new superblock decodes");
            sb.pool_uuid = POOL_UUID;
            sb.device_uuid = DEVICE_UUID;
            sb.devices[0].uuid = DEVICE_UUID;
            sb.journal_generation = JOURNAL_GENERATION;
            sb.created_unix = CREATED_UNIX;
            bytes[at..at + BS].copy_from_slice(&sb.encode(copy));
        }
    }
    let clock = now();
    let pool = engine("open", Pool::open(vec![dev.clone()], OpenOptions::default()));
    let bs = BS as u64;
    let a = engine("create a", pool.create_volume("a", MIB)).id;
    let b = engine("create b", pool.create_volume("b", 256 << 10)).id;
    for lba in 0..8 {
        engine("write a", pool.write(a, lba * bs, &block(lba as u8 + 1), false));
    }
    engine("write b", pool.write(b, 0, &block(0x40), false));
    engine("write b", pool.write(b, 3 * bs, &block(0x43), false));
    engine("flush", pool.flush());
    if flavour.sparse_extents() > 0 {
        // "e": enough separate extents for branch nodes.
        let e = engine("create e", pool.create_volume("e", 16 * MIB)).id;
        for lba in 0..flavour.sparse_extents() {
            engine("write e", pool.write(e, 2 * lba * bs, &block(lba as u8), false));
        }
    }
    engine("snapshot s1", pool.create_snapshot("a", "s1"));
    engine("overwrite a", pool.write(a, 2 * bs, &[0x21; 2 * BS], false));
    engine("trim a", pool.trim(a, 6 * bs, bs));
    engine("clone c", pool.create_clone("a", "s1", "c"));
    let c = engine("clone id", pool.volume_id("c").ok_or(tarn_engine::EngineError::InvalidArgument("no c".into())));
    engine("write c", pool.write(c, bs, &block(0x61), false));
    engine("snapshot s2", pool.create_snapshot("a", "s2"));
    engine("overwrite a", pool.write(a, 0, &block(0x30), false));
    // The checkpoint: a catalog, the trees' nodes.
    engine("checkpoint", pool.checkpoint());
    // After it, journal records only.
    engine("write a", pool.write(a, 10 * bs, &block(0x50), false));
    engine("write c", pool.write(c, 3 * bs, &block(0x63), false));
    engine("flush", pool.flush());
    engine("snapshot s3", pool.create_snapshot("a", "s3"));
    engine("overwrite a", pool.write(a, 2 * bs, &block(0x22), false));
    engine("trim b", pool.trim(b, 0, bs));
    engine("create d", pool.create_volume("d", 128 << 10));
    let d = engine("d id", pool.volume_id("d").ok_or(tarn_engine::EngineError::InvalidArgument("no d".into())));
    engine("write d", pool.write(d, 0, &block(0x70), false));
    engine("flush", pool.flush());
    let mut seen = [0u8; BS];
    engine(
        "read s1",
        pool.read_view(a, View::Snapshot(pool.snapshot_info("a", "s1").unwrap().epoch), 2 * bs, &mut seen),
    );
    assert_eq!(seen, block(3)[..], "pool image: s1 keeps the old block");
    let clock = clock..=now();
    // No close: the superblock stays marked open and the journal holds
    // the last flushes.
    drop(pool);
    let mut bytes = locked(&mem).clone();
    // Snapshot creation times (catalog and SnapCreate ops): fixed.
    let mut changed = false;
    for at in 0..bytes.len() - 8 {
        let v = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        if clock.contains(&v) {
            bytes[at..at + 8].copy_from_slice(&SNAPSHOT_CREATED.to_le_bytes());
            changed = true;
        }
    }
    assert!(changed, "pool image: no snapshot time found");
    let sb = current_superblock(&bytes).expect("pool image has a valid superblock");
    reseal_journal(&mut bytes, sb.journal_start, sb.journal_blocks);
    for &copy in &SUPERBLOCK_COPIES {
        reseal_checkpoint(&mut bytes, copy, &[copy]);
        crate::reseal::superblock(&mut bytes[copy as usize * BS..]);
    }
    bytes
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The valid superblock copy with the highest txid, as the engine picks it.
pub fn current_superblock(bytes: &[u8]) -> Option<Superblock> {
    SUPERBLOCK_COPIES
        .iter()
        .filter_map(|&copy| Superblock::decode(bytes.get(copy as usize * BS..(copy as usize + 1) * BS)?, copy).ok())
        .max_by_key(|sb| sb.txid)
}

/// The checkpoint payload along `sb`'s chain (device 0), if whole.
pub fn checkpoint_payload(bytes: &[u8], sb: &Superblock) -> Option<Vec<u8>> {
    let mut next = sb.checkpoint.first_segment;
    let mut payload = Vec::new();
    for _ in 0..sb.checkpoint.segments {
        let at = usize::try_from(next).ok()?.checked_mul(BS)?;
        let seg = bytes.get(at..at + BS)?;
        let h = tarn_format::checkpoint::SegmentHeader::decode(seg, next).ok()?;
        let end = at + SEGMENT_HEADER_LEN + h.payload_len as usize;
        payload.extend_from_slice(bytes.get(at + SEGMENT_HEADER_LEN..end)?);
        next = h.next_pba;
    }
    (payload.len() as u64 == sb.checkpoint.payload_len).then_some(payload)
}

impl Image {
    /// Read what the fuzz target needs from a valid image: the current
    /// superblock's journal region and checkpoint, and the records after it.
    pub fn from_bytes(bytes: Vec<u8>) -> Image {
        let sb = current_superblock(&bytes).expect("pool image has a valid superblock");
        let payload = checkpoint_payload(&bytes, &sb).expect("pool image has a whole checkpoint");
        let catalog = Catalog::decode(&payload).expect("pool image's catalog decodes");
        // The superblock's side, then the next one if the records go on
        // there (FORMAT.md *Journal*).
        let side = sb.journal_blocks / 2;
        let (mut seq, mut epoch, mut records) = (sb.checkpoint.seq, catalog.epoch, 0);
        let (mut block, mut generation, mut side_end) = (0, sb.journal_generation, 0);
        for g in [sb.journal_generation, sb.journal_generation + 1] {
            let start = sb.journal_start + (g % 2) * side;
            let (mut at_block, end, before) = (start, start + side, records);
            while at_block < end {
                let at = at_block as usize * BS;
                let Ok(h) = RecordHeader::decode(&bytes[at..at + BS], at_block) else {
                    break;
                };
                if h.generation != g || h.seq != seq + 1 || at_block + u64::from(h.blocks) > end {
                    break;
                }
                at_block += u64::from(h.blocks);
                seq = h.seq;
                epoch = h.epoch;
                records += 1;
            }
            if g == sb.journal_generation || records > before {
                (block, generation, side_end) = (at_block, g, end);
            }
        }
        Image {
            journal_start: sb.journal_start,
            journal_blocks: sb.journal_blocks,
            journal_end: block,
            side_end,
            generation,
            next_seq: seq + 1,
            epoch,
            first_segment: sb.checkpoint.first_segment,
            records,
            bytes,
        }
    }
}
pub use tarn_engine::device::mem_device::MemDevice;

/// The image's device over `bytes` (named as the pool's errors show it).
pub fn device(bytes: Vec<u8>) -> MemDevice {
    MemDevice::from_bytes("fuzz0", bytes)
}

/// The device's bytes, locked.
pub fn locked(dev: &MemDevice) -> std::sync::MutexGuard<'_, Vec<u8>> {
    dev.bytes(0).expect("a memory device has copy 0")
}

/// Open `bytes` read-only as a one-device pool.
pub fn open(bytes: Vec<u8>) -> tarn_engine::Result<Pool> {
    open_device(Arc::new(device(bytes)))
}

/// Open `dev` read-only as a one-device pool.
pub fn open_device(dev: Arc<MemDevice>) -> tarn_engine::Result<Pool> {
    Pool::open(vec![dev as Arc<dyn Device>], OpenOptions { read_only: true, ..OpenOptions::default() })
}

/// Where an edit of `engine_open`'s input lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    SuperblockCopy0 = 0,
    SuperblockCopy1 = 1,
    Journal = 2,
    FirstSegment = 3,
    /// Anywhere: the offset is in units of [`DEVICE_UNIT`] bytes.
    Device = 4,
}

/// Unit of an [`Area::Device`] edit's offset: 128 bytes reach 8 MiB.
pub const DEVICE_UNIT: usize = 128;

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
    /// Damage the [`Flavour::Branches`] image instead of the small one.
    pub const BRANCHES: u8 = 16;
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

/// The image an `engine_open` input damages (flag [`flags::BRANCHES`]).
pub fn flavour_of(data: &[u8]) -> Flavour {
    match data.first() {
        Some(f) if f & flags::BRANCHES != 0 => Flavour::Branches,
        _ => Flavour::Small,
    }
}

/// Apply an `engine_open` input to a copy of the image: edits first, then
/// the appended record, then the reseals the flags ask for.
pub fn apply_input(img: &Image, data: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    apply_input_into(img, data, &mut bytes);
    bytes
}

/// [`apply_input`] into `bytes` (resized to the image): a buffer reused
/// across runs saves the fuzz target mapping and faulting in a fresh copy
/// of the image every time.
pub fn apply_input_into(img: &Image, data: &[u8], bytes: &mut Vec<u8>) {
    bytes.resize(img.bytes.len(), 0);
    bytes.copy_from_slice(&img.bytes);
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
            1 => SUPERBLOCK_COPIES[1] as usize * BS + off,
            2 => img.journal_start as usize * BS + off,
            3 => (img.first_segment as usize).saturating_mul(BS).saturating_add(off),
            _ => off * DEVICE_UNIT,
        };
        if let Some(dst) = bytes.get_mut(at..at.saturating_add(len)) {
            dst.copy_from_slice(&rest[..len]);
        }
        r = &rest[len..];
    }
    if flags & flags::APPEND_RECORD != 0 {
        if let Some((&e, payload)) = r.split_first() {
            let epoch = img.epoch + u64::from(e);
            let rec = RecordHeader::encode_record(img.generation, img.next_seq, img.journal_end, epoch, payload);
            let at = img.journal_end as usize * BS;
            let end = img.side_end as usize * BS;
            if at + rec.len() <= end {
                bytes[at..at + rec.len()].copy_from_slice(&rec);
            }
        }
    }
    if flags & flags::RESEAL_JOURNAL != 0 {
        reseal_journal(bytes, img.journal_start, img.journal_blocks);
    }
    if flags & flags::RESEAL_CHECKPOINT != 0 {
        reseal_checkpoint(bytes, SUPERBLOCK_COPIES[0], &SUPERBLOCK_COPIES);
    }
    if flags & (flags::RESEAL_SUPERBLOCKS | flags::RESEAL_CHECKPOINT) != 0 {
        for &copy in &SUPERBLOCK_COPIES {
            crate::reseal::superblock(&mut bytes[copy as usize * BS..]);
        }
    }
}

/// Reseal the records found in the journal region `start..start+blocks`,
/// walking by their `blocks` fields.
fn reseal_journal(bytes: &mut [u8], start: u64, blocks: u64) {
    // Two sides, each a chain of records from its start (FORMAT.md *Journal*).
    let side = blocks / 2;
    for first in [start, start + side] {
        reseal_journal_side(bytes, first, side);
    }
}

fn reseal_journal_side(bytes: &mut [u8], start: u64, blocks: u64) {
    let end = ((start + blocks) as usize * BS).min(bytes.len());
    let mut at = start as usize * BS;
    while at + BS <= end {
        if bytes[at..at + 8] != tarn_format::journal::JOURNAL_MAGIC {
            break;
        }
        crate::reseal::journal_record(&mut bytes[at..end]);
        let blocks = crate::reseal::get_u32(bytes, at + 36).max(1) as usize;
        at = at.saturating_add(blocks.saturating_mul(BS));
    }
}

/// Follow the chain the superblock copy at block `from` names (device 0,
/// at most 8 segments), reseal each segment header, and store the
/// payload's length and checksum in the copies at blocks `to` (not
/// resealed: the caller does).
fn reseal_checkpoint(bytes: &mut [u8], from: u64, to: &[u64]) {
    let sb = from as usize * BS;
    let mut next = crate::reseal::get_u64(bytes, sb + 136);
    let count = crate::reseal::get_u32(bytes, sb + 156).min(8);
    let mut payload = Vec::new();
    for _ in 0..count {
        let Some(at) = usize::try_from(next).ok().and_then(|b| b.checked_mul(BS)) else {
            break;
        };
        let Some(head) = bytes.get_mut(at..at.saturating_add(BS)) else {
            break;
        };
        crate::reseal::segment_header(head);
        let seg_blocks = (crate::reseal::get_u32(head, 20) as usize).clamp(1, 64);
        let len = (crate::reseal::get_u32(head, 40) as usize).min(seg_blocks * BS - SEGMENT_HEADER_LEN);
        next = crate::reseal::get_u64(head, 32);
        let Some(part) = bytes.get(at + SEGMENT_HEADER_LEN..at + SEGMENT_HEADER_LEN + len) else {
            break;
        };
        payload.extend_from_slice(part);
        if next == 0 {
            break;
        }
    }
    let crc = checksum(SALT_CHECKPOINT, &payload);
    for &copy in to {
        let at = copy as usize * BS;
        bytes[at + 144..at + 152].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        bytes[at + 152..at + 156].copy_from_slice(&crc.to_le_bytes());
    }
}
