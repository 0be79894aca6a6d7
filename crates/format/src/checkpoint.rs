//! Checkpoints: the whole pool state, written to freshly allocated extents
//! (segments) and pointed to by the superblock. See docs/FORMAT.md §Checkpoint.

use crate::address::BLOCK_SIZE;
use crate::checksum::{seal, unseal, SALT_SEGMENT_HEADER};
use crate::codec::{Reader, Writer};
use crate::error::{FormatError, Result};
use crate::ops::MAX_NAME_LEN;

pub const CHECKPOINT_MAGIC: [u8; 8] = *b"TARNCKPT";
pub const SEGMENT_MAGIC: [u8; 8] = *b"TARNSEGM";
pub const SEGMENT_HEADER_LEN: usize = 64;
const SEGMENT_CRC_OFFSET: usize = 60;
/// Upper bound on volumes in one pool (bounds every decode loop).
pub const MAX_VOLUMES: u32 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub seq: u64,
    pub index: u32,
    pub blocks: u32,
    pub self_pba: u64,
    /// Next segment's address; 0 for the last one.
    pub next_pba: u64,
    pub payload_len: u32,
}

impl SegmentHeader {
    /// Payload bytes a segment of `blocks` blocks can hold.
    pub fn capacity(blocks: u64) -> u64 {
        blocks * BLOCK_SIZE - SEGMENT_HEADER_LEN as u64
    }

    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN] {
        let mut w = Writer::with_capacity(SEGMENT_HEADER_LEN);
        w.bytes(&SEGMENT_MAGIC);
        w.u64(self.seq);
        w.u32(self.index);
        w.u32(self.blocks);
        w.u64(self.self_pba);
        w.u64(self.next_pba);
        w.u32(self.payload_len);
        seal(&mut w, SALT_SEGMENT_HEADER, SEGMENT_CRC_OFFSET);
        w.buf.try_into().expect("64-byte header")
    }

    pub fn decode(buf: &[u8], read_at: u64) -> Result<SegmentHeader> {
        const WHAT: &str = "checkpoint segment";
        let mut r = unseal(buf, &SEGMENT_MAGIC, SALT_SEGMENT_HEADER, SEGMENT_CRC_OFFSET, WHAT)?;
        let h = SegmentHeader {
            seq: r.u64()?,
            index: r.u32()?,
            blocks: r.u32()?,
            self_pba: r.u64()?,
            next_pba: r.u64()?,
            payload_len: r.u32()?,
        };
        if h.self_pba != read_at {
            return Err(FormatError::Misplaced { what: WHAT, stored: h.self_pba, actual: read_at });
        }
        if h.blocks == 0 || u64::from(h.payload_len) > Self::capacity(u64::from(h.blocks)) {
            return Err(r.bad("payload_len", u64::from(h.payload_len)));
        }
        Ok(h)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointHeader {
    pub seq: u64,
    pub epoch: u64,
    pub next_volume_id: u32,
    pub volume_count: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRecord {
    pub id: u32,
    pub size: u64,
    pub name: String,
    /// The clone's origin: (volume id, snapshot epoch).
    pub origin: Option<(u32, u64)>,
    /// Snapshot records following the head's extents.
    pub snapshot_count: u32,
    pub extent_count: u64,
    /// Every extent on real space (head and dead lists) carries its blocks'
    /// data checksums.
    pub sums: bool,
}

/// Volume record flags.
pub mod volume_flags {
    /// An origin (volume u32, epoch varint) follows the flags.
    pub const CLONE: u32 = 1 << 0;
    /// A snapshot count (varint) follows; after the head's extents come that
    /// many snapshot records, each followed by its dead list's extents.
    pub const SNAPSHOTS: u32 = 1 << 1;
    /// Each extent record not on the origin device is followed by one u32
    /// crc32c per block (head and dead lists alike).
    pub const SUMS: u32 = 1 << 2;
    pub const KNOWN: u32 = CLONE | SNAPSHOTS | SUMS;
}

/// Upper bound on snapshots of one volume (bounds decode loops).
pub const MAX_SNAPSHOTS: u32 = 1 << 16;

/// A snapshot of the volume whose record precedes it: taken at `epoch`,
/// its size, creation time, the blocks it referenced when taken (own data,
/// plus materialized origin data since) and the extents killed while it was
/// the volume's newest snapshot (its dead list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    pub epoch: u64,
    pub size: u64,
    pub created: u64,
    pub referenced: u64,
    pub name: String,
    pub dead_count: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentRecord {
    pub lba: u64,
    pub len: u64,
    pub pba: u64,
    pub birth: u64,
}

/// Streams a checkpoint payload: header, then per volume its record and its
/// extents in ascending lba order (delta-encoded: ~6-10 bytes per extent).
pub struct CheckpointEncoder {
    w: Writer,
    sums: bool,
    prev_end: u64,
    prev_pba_end: u64,
    extents_left: u64,
    volumes_left: u32,
    snapshots_left: u32,
}

impl CheckpointEncoder {
    pub fn new(h: &CheckpointHeader) -> Self {
        let mut w = Writer::with_capacity(4096);
        w.bytes(&CHECKPOINT_MAGIC);
        w.u64(h.seq);
        w.u64(h.epoch);
        w.u32(h.next_volume_id);
        w.u32(h.volume_count);
        CheckpointEncoder {
            w,
            sums: false,
            prev_end: 0,
            prev_pba_end: 0,
            extents_left: 0,
            volumes_left: h.volume_count,
            snapshots_left: 0,
        }
    }

    pub fn volume(&mut self, v: &VolumeRecord) {
        assert!(self.extents_left == 0 && self.snapshots_left == 0, "previous volume incomplete");
        assert!(self.volumes_left > 0, "more volumes than the header announced");
        assert!(v.name.len() <= MAX_NAME_LEN && v.snapshot_count <= MAX_SNAPSHOTS);
        self.volumes_left -= 1;
        self.w.u32(v.id);
        self.w.u64(v.size);
        self.w.u8(v.name.len() as u8);
        self.w.bytes(v.name.as_bytes());
        let mut flags = 0;
        if v.origin.is_some() {
            flags |= volume_flags::CLONE;
        }
        if v.snapshot_count > 0 {
            flags |= volume_flags::SNAPSHOTS;
        }
        if v.sums {
            flags |= volume_flags::SUMS;
        }
        self.sums = v.sums;
        self.w.u32(flags);
        if let Some((vol, epoch)) = v.origin {
            self.w.u32(vol);
            self.w.varint(epoch);
        }
        if v.snapshot_count > 0 {
            self.w.varint(u64::from(v.snapshot_count));
        }
        self.w.varint(v.extent_count);
        self.snapshots_left = v.snapshot_count;
        self.start_extents(v.extent_count);
    }

    /// The next snapshot of the current volume, after the previous list's extents.
    pub fn snapshot(&mut self, s: &SnapshotRecord) {
        assert!(self.extents_left == 0, "previous extent list incomplete");
        assert!(self.snapshots_left > 0, "more snapshots than the volume announced");
        assert!(s.name.len() <= MAX_NAME_LEN);
        self.snapshots_left -= 1;
        self.w.varint(s.epoch);
        self.w.u64(s.size);
        self.w.u64(s.created);
        self.w.varint(s.referenced);
        self.w.u8(s.name.len() as u8);
        self.w.bytes(s.name.as_bytes());
        self.w.varint(s.dead_count);
        self.start_extents(s.dead_count);
    }

    fn start_extents(&mut self, count: u64) {
        self.extents_left = count;
        self.prev_end = 0;
        self.prev_pba_end = 0;
    }

    /// Whether the current volume's extents carry checksums.
    pub fn with_sums(&self) -> bool {
        self.sums
    }

    /// An extent of a volume without checksums, or an origin marker.
    pub fn extent(&mut self, e: &ExtentRecord) {
        assert!(!self.sums || crate::Pba(e.pba).is_origin(), "extent needs its checksums");
        self.put_extent(e);
    }

    /// An extent on real space of a volume with checksums: one per block.
    pub fn extent_summed(&mut self, e: &ExtentRecord, sums: &[u32]) {
        assert!(self.sums && sums.len() as u64 == e.len, "checksums do not match the extent");
        self.put_extent(e);
        sums.iter().for_each(|&s| self.w.u32(s));
    }

    fn put_extent(&mut self, e: &ExtentRecord) {
        assert!(self.extents_left > 0, "more extents than the volume announced");
        assert!(e.lba >= self.prev_end && e.len > 0, "extents must ascend and not overlap");
        self.extents_left -= 1;
        self.w.varint(e.lba - self.prev_end);
        self.w.varint(e.len);
        self.w.varint_signed(e.pba.wrapping_sub(self.prev_pba_end) as i64);
        self.w.varint(e.birth);
        self.prev_end = e.lba + e.len;
        self.prev_pba_end = e.pba.wrapping_add(e.len);
    }

    pub fn finish(self) -> Vec<u8> {
        assert!(self.extents_left == 0 && self.volumes_left == 0 && self.snapshots_left == 0, "checkpoint incomplete");
        self.w.buf
    }
}

/// Pulls a checkpoint payload apart in the order the encoder wrote it.
pub struct CheckpointDecoder<'a> {
    r: Reader<'a>,
    sums: bool,
    /// Checksums of the last extent returned (empty without SUMS).
    last_sums: Vec<u32>,
    prev_end: u64,
    prev_pba_end: u64,
    extents_left: u64,
    volumes_left: u32,
    snapshots_left: u32,
}

impl<'a> CheckpointDecoder<'a> {
    pub fn new(buf: &'a [u8]) -> Result<(Self, CheckpointHeader)> {
        let mut r = Reader::new(buf, "checkpoint");
        if r.take(8)? != CHECKPOINT_MAGIC {
            return Err(FormatError::BadMagic { what: "checkpoint" });
        }
        let h = CheckpointHeader { seq: r.u64()?, epoch: r.u64()?, next_volume_id: r.u32()?, volume_count: r.u32()? };
        if h.volume_count > MAX_VOLUMES {
            return Err(r.bad("volume_count", u64::from(h.volume_count)));
        }
        let d = CheckpointDecoder {
            r,
            sums: false,
            last_sums: Vec::new(),
            prev_end: 0,
            prev_pba_end: 0,
            extents_left: 0,
            volumes_left: h.volume_count,
            snapshots_left: 0,
        };
        Ok((d, h))
    }

    /// The next volume record, or None after the last one.
    pub fn volume(&mut self) -> Result<Option<VolumeRecord>> {
        if self.extents_left != 0 || self.snapshots_left != 0 {
            return Err(self.r.bad("extents_left", self.extents_left + u64::from(self.snapshots_left)));
        }
        if self.volumes_left == 0 {
            if !self.r.is_empty() {
                return Err(self.r.bad("trailing_bytes", self.r.remaining() as u64));
            }
            return Ok(None);
        }
        self.volumes_left -= 1;
        let id = self.r.u32()?;
        let size = self.r.u64()?;
        let name = self.name()?;
        let flags = self.r.u32()?;
        if flags & !volume_flags::KNOWN != 0 {
            return Err(self.r.bad("volume_flags", u64::from(flags)));
        }
        let origin = if flags & volume_flags::CLONE != 0 { Some((self.r.u32()?, self.r.varint()?)) } else { None };
        let mut snapshot_count = 0;
        if flags & volume_flags::SNAPSHOTS != 0 {
            let n = self.r.varint()?;
            if n == 0 || n > u64::from(MAX_SNAPSHOTS) {
                return Err(self.r.bad("snapshot_count", n));
            }
            snapshot_count = n as u32;
        }
        let extent_count = self.extent_count()?;
        self.snapshots_left = snapshot_count;
        self.sums = flags & volume_flags::SUMS != 0;
        Ok(Some(VolumeRecord { id, size, name, origin, snapshot_count, extent_count, sums: self.sums }))
    }

    /// The next snapshot of the current volume (after the previous extent
    /// list is consumed), or None after its last.
    pub fn snapshot(&mut self) -> Result<Option<SnapshotRecord>> {
        if self.extents_left != 0 {
            return Err(self.r.bad("extents_left", self.extents_left));
        }
        if self.snapshots_left == 0 {
            return Ok(None);
        }
        self.snapshots_left -= 1;
        let (epoch, size, created, referenced) = (self.r.varint()?, self.r.u64()?, self.r.u64()?, self.r.varint()?);
        let name = self.name()?;
        let dead_count = self.extent_count()?;
        Ok(Some(SnapshotRecord { epoch, size, created, referenced, name, dead_count }))
    }

    fn name(&mut self) -> Result<String> {
        let n = usize::from(self.r.u8()?);
        if n > MAX_NAME_LEN {
            return Err(self.r.bad("name_len", n as u64));
        }
        String::from_utf8(self.r.take(n)?.to_vec()).map_err(|_| self.r.bad("name_utf8", 0))
    }

    /// Read an extent count and start that list.
    fn extent_count(&mut self) -> Result<u64> {
        let count = self.r.varint()?;
        // Each extent takes at least 4 bytes: a count beyond that is corrupt.
        if count > self.r.remaining() as u64 / 4 {
            return Err(self.r.bad("extent_count", count));
        }
        self.extents_left = count;
        self.prev_end = 0;
        self.prev_pba_end = 0;
        Ok(count)
    }

    /// The next extent of the current volume, or None after its last.
    pub fn extent(&mut self) -> Result<Option<ExtentRecord>> {
        if self.extents_left == 0 {
            return Ok(None);
        }
        self.extents_left -= 1;
        let gap = self.r.varint()?;
        let len = self.r.varint()?;
        let delta = self.r.varint_signed()?;
        let birth = self.r.varint()?;
        let lba = self.prev_end.checked_add(gap).ok_or(self.r.bad("lba", gap))?;
        let end = lba.checked_add(len).ok_or(self.r.bad("len", len))?;
        if len == 0 {
            return Err(self.r.bad("len", 0));
        }
        let pba = self.prev_pba_end.wrapping_add(delta as u64);
        self.prev_end = end;
        self.prev_pba_end = pba.wrapping_add(len);
        self.last_sums.clear();
        if self.sums && !crate::Pba(pba).is_origin() {
            if len > self.r.remaining() as u64 / 4 {
                return Err(self.r.bad("sums_len", len));
            }
            for _ in 0..len {
                self.last_sums.push(self.r.u32()?);
            }
        }
        Ok(Some(ExtentRecord { lba, len, pba, birth }))
    }

    /// The data checksums of the extent `extent` returned last (one per
    /// block; empty if its volume carries none or it is an origin marker).
    pub fn sums(&self) -> &[u32] {
        &self.last_sums
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the encoding of a checkpoint segment header, every byte. A
    /// change here is a format change (docs/FORMAT.md, version log). The
    /// hex was not copied from the encoder: scripts/golden_format.py builds
    /// it from the table of docs/FORMAT.md §Segment (and its own CRC-32C).
    #[test]
    fn golden_segment_header_bytes() {
        let h =
            SegmentHeader { seq: 41, index: 1, blocks: 3, self_pba: 5000, next_pba: (1 << 48) | 77, payload_len: 9000 };
        let bytes = h.encode();
        let fields = [
            "54 41 52 4e 53 45 47 4d",                         // 0 magic "TARNSEGM"
            "29 00 00 00 00 00 00 00",                         // 8 seq 41
            "01 00 00 00",                                     // 16 index 1
            "03 00 00 00",                                     // 20 blocks 3
            "88 13 00 00 00 00 00 00",                         // 24 self_pba 5000
            "4d 00 00 00 00 00 01 00",                         // 32 next_pba: device 1, block 77
            "28 23 00 00",                                     // 40 payload_len 9000
            "00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00", // 44 reserved
            "31 aa 97 6b",                                     // 60 header crc (SHDR, bytes 0..60)
        ]
        .join(" ");
        let hex: Vec<String> = bytes.iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(hex.join(" "), fields);
        assert_eq!(SegmentHeader::decode(&bytes, 5000).unwrap(), h);
    }

    type Snaps = Vec<(SnapshotRecord, Vec<ExtentRecord>)>;
    type Decoded = (CheckpointHeader, Vec<(VolumeRecord, Vec<ExtentRecord>, Snaps)>);

    fn sample() -> Decoded {
        let h = CheckpointHeader { seq: 9, epoch: 3, next_volume_id: 4, volume_count: 3 };
        let e = |lba, len, pba, birth| ExtentRecord { lba, len, pba, birth };
        let vol = |id, name: &str, origin: Option<(u32, u64)>, snapshot_count, extent_count| VolumeRecord {
            id,
            size: 1 << 30,
            name: name.into(),
            origin,
            snapshot_count,
            extent_count,
            sums: id != 2,
        };
        let snap = |epoch, name: &str, dead_count| SnapshotRecord {
            epoch,
            size: 1 << 30,
            created: 1_790_000_000,
            referenced: 5,
            name: name.into(),
            dead_count,
        };
        let v1 = vol(1, "a", None, 2, 3);
        let v1_snaps = vec![(snap(1, "s1", 1), vec![e(4, 1, 60, 1)]), (snap(2, "s2", 0), vec![])];
        let v2 = vol(2, "b", None, 0, 0);
        let v3 = vol(3, "c", Some((1, 2)), 0, 1);
        (
            h,
            vec![
                (v1, vec![e(0, 4, 100, 1), e(4, 1, 50, 2), e(1000, 7, (1 << 48) | 3, 3)], v1_snaps),
                (v2, vec![], vec![]),
                (v3, vec![e(0, 9, 0xffff << 48, 0)], vec![]),
            ],
        )
    }

    /// Made-up checksums for an extent's blocks.
    fn sums_of(e: &ExtentRecord) -> Vec<u32> {
        (0..e.len).map(|i| (e.pba ^ i.wrapping_mul(0x9e37_79b9)) as u32).collect()
    }

    fn summed(v: &VolumeRecord, e: &ExtentRecord) -> bool {
        v.sums && !crate::Pba(e.pba).is_origin()
    }

    fn encode(h: &CheckpointHeader, vols: &[(VolumeRecord, Vec<ExtentRecord>, Snaps)]) -> Vec<u8> {
        let mut enc = CheckpointEncoder::new(h);
        for (v, exts, snaps) in vols {
            enc.volume(v);
            let put = |enc: &mut CheckpointEncoder, e: &ExtentRecord| match summed(v, e) {
                true => enc.extent_summed(e, &sums_of(e)),
                false => enc.extent(e),
            };
            exts.iter().for_each(|e| put(&mut enc, e));
            for (s, dead) in snaps {
                enc.snapshot(s);
                dead.iter().for_each(|e| put(&mut enc, e));
            }
        }
        enc.finish()
    }

    fn extents(d: &mut CheckpointDecoder<'_>, v: &VolumeRecord) -> Result<Vec<ExtentRecord>> {
        let mut exts = vec![];
        while let Some(e) = d.extent()? {
            let want = if summed(v, &e) { sums_of(&e) } else { vec![] };
            assert_eq!(d.sums(), want.as_slice());
            exts.push(e);
        }
        Ok(exts)
    }

    fn decode(buf: &[u8]) -> Result<Decoded> {
        let (mut d, h) = CheckpointDecoder::new(buf)?;
        let mut out = vec![];
        while let Some(v) = d.volume()? {
            let exts = extents(&mut d, &v)?;
            let mut snaps = vec![];
            while let Some(s) = d.snapshot()? {
                snaps.push((s, extents(&mut d, &v)?));
            }
            out.push((v, exts, snaps));
        }
        Ok((h, out))
    }

    #[test]
    fn checkpoint_round_trips() {
        let (h, vols) = sample();
        let buf = encode(&h, &vols);
        assert_eq!(decode(&buf).unwrap(), (h, vols));
    }

    #[test]
    fn truncations_are_errors() {
        let (h, vols) = sample();
        let buf = encode(&h, &vols);
        for n in 0..buf.len() {
            assert!(decode(&buf[..n]).is_err(), "prefix {n} accepted");
        }
    }

    #[test]
    fn segment_header_round_trips() {
        let s = SegmentHeader { seq: 1, index: 0, blocks: 3, self_pba: 77, next_pba: 99, payload_len: 100 };
        assert_eq!(SegmentHeader::decode(&s.encode(), 77).unwrap(), s);
        assert!(SegmentHeader::decode(&s.encode(), 78).is_err());
    }
}
