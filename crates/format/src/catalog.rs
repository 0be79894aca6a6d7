//! The catalog: what a store checkpoint records besides its trees' nodes
//! (docs/FORMAT.md *Catalog*): the pool's volumes and snapshots with the
//! root of every tree and the counts that let a pool open without reading
//! a map, each device's space map, and the block lists a crash needs to
//! put the space maps right (the checkpoint's own node blocks, blocks
//! whose release waits for this checkpoint, blocks allocated to writes in
//! flight). Its size is that of the volume and snapshot lists plus what
//! changed, never that of the maps.

use crate::codec::{Reader, Writer};
use crate::error::{FormatError, Result};
use crate::node::{ExtentValue, LeafValue, MAX_LEVEL};
use crate::ops::{MAX_NAME_LEN, MAX_OVERCOMMIT_MILLI};
use crate::placement::PolicyCode;
use crate::role::VolumeRole;

pub const CATALOG_MAGIC: [u8; 8] = *b"TARNCTLG";
/// Bounds every decode loop (a damaged count is an error, not a hang).
pub const MAX_CATALOG_VOLUMES: u64 = 1 << 20;
pub const MAX_CATALOG_SNAPSHOTS: u64 = 1 << 16;
pub const MAX_CATALOG_DEVICES: u64 = 256;
pub const MAX_CATALOG_RANGES: u64 = 1 << 26;
/// A snapshot's dead list of at most this many extents may be kept in its
/// catalog entry instead of a tree of its own (INLINE_DEAD_LISTS, incompat
/// bit 19): a close version's one changed extent then costs about a dozen
/// catalog bytes, not a 4 KiB node. Bounds the catalog bytes a snapshot
/// adds (≤ 8 × 36 bytes of entries).
pub const MAX_INLINE_EXTENTS: u64 = 8;

/// Volume entry flags: an origin follows (a clone).
const VOLUME_ORIGIN: u8 = 1;
/// Volume entry flags: a placement policy byte follows (PLACEMENT feature).
const VOLUME_PLACEMENT: u8 = 2;
/// Volume entry flags: `role u8`, `owner u32` follow (FILES feature).
const VOLUME_ROLE: u8 = 4;
/// Volume entry flags: `quota u64` follows (QUOTAS feature).
const VOLUME_QUOTA: u8 = 8;
/// Volume entry flags: `devices u16` follows, the members its new data
/// may go to, bit i for member i (DEVICE_PLACEMENT feature).
const VOLUME_DEVICES: u8 = 16;
/// Striped (op 20): `devices u16`, `shift u8` (crate::stripe) follow, after the device set if any.
const VOLUME_STRIPE: u8 = 32;
/// Parity (op 21): `devices u16`, `shift u8` (crate::stripe::Parity) follow, after the stripe if any.
const VOLUME_PARITY: u8 = 64;
const VOLUME_FLAGS: u8 =
    VOLUME_ORIGIN | VOLUME_PLACEMENT | VOLUME_ROLE | VOLUME_QUOTA | VOLUME_DEVICES | VOLUME_STRIPE | VOLUME_PARITY;

/// A tree's root: block 0 means empty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Root {
    pub pba: u64,
    pub crc: u32,
    pub level: u8,
}

/// A volume map's (head or dead list) root and counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapRecord {
    pub root: Root,
    pub mapped_blocks: u64,
    pub origin_blocks: u64,
    pub extents: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    pub epoch: u64,
    pub size: u64,
    pub created: u64,
    pub referenced: u64,
    pub name: String,
    pub dead: MapRecord,
    /// The dead list's entries when the catalog holds them (INLINE_DEAD_LISTS):
    /// `dead.root` is then empty and `dead.extents` their count (1..=8),
    /// codec 1 entries in key order. Empty otherwise.
    pub inline: Vec<(u64, ExtentValue)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeEntry {
    pub id: u32,
    pub size: u64,
    pub name: String,
    /// (origin volume, origin snapshot epoch) of a clone.
    pub origin: Option<(u32, u64)>,
    /// The volume's own placement policy (None: the pool's default).
    pub placement: Option<PolicyCode>,
    /// File volume or file object (None: a block volume).
    pub role: Option<VolumeRole>,
    /// Bytes of own space head and snapshots may hold (op 22).
    pub quota: Option<u64>,
    /// Members its new data may go to, bit i for member i (op 24); 0: any.
    pub devices: u16,
    /// Its stripe layout (op 20); None: not striped.
    pub stripe: Option<crate::stripe::Stripe>,
    /// Its parity layout (op 21); None: no parity.
    pub parity: Option<crate::stripe::Parity>,
    pub head: MapRecord,
    /// Oldest first, epochs strictly ascending.
    pub snapshots: Vec<SnapshotEntry>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpaceEntry {
    pub root: Root,
    pub free_blocks: u64,
    pub cursor: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    /// Last commit sequence included.
    pub seq: u64,
    pub epoch: u64,
    pub next_volume_id: u32,
    /// Store generation that wrote this checkpoint's nodes.
    pub generation: u64,
    /// One per device, in device order.
    pub spaces: Vec<SpaceEntry>,
    /// Data checksums by physical block.
    pub sums: Root,
    pub volumes: Vec<VolumeEntry>,
    /// Node blocks this checkpoint wrote (allocated after its space maps
    /// were frozen): used, though the space maps show them free.
    pub own_nodes: Vec<(u64, u64)>,
    /// Blocks free once this checkpoint is durable (nodes it no longer
    /// reaches, space its ops released): free, though shown used.
    pub deferred: Vec<(u64, u64)>,
    /// Blocks allocated to writes not yet mapped at the freeze: free
    /// unless a later journal record maps them.
    pub inflight: Vec<(u64, u64)>,
    /// The overcommit ratio in thousandths (op 23); when set it ends the
    /// catalog (QUOTAS feature), absent otherwise.
    pub overcommit_milli: Option<u32>,
}

fn root(w: &mut Writer, r: &Root) {
    w.u64(r.pba);
    w.u32(r.crc);
    w.u8(r.level);
}

fn map(w: &mut Writer, m: &MapRecord) {
    root(w, &m.root);
    w.varint(m.mapped_blocks);
    w.varint(m.origin_blocks);
    w.varint(m.extents);
}

fn name(w: &mut Writer, n: &str) {
    assert!(!n.is_empty() && n.len() <= MAX_NAME_LEN, "names are validated before they reach a catalog");
    w.u8(n.len() as u8);
    w.bytes(n.as_bytes());
}

/// Ranges sorted by address, delta-encoded: gap from the previous end, length.
fn ranges(w: &mut Writer, list: &[(u64, u64)]) {
    let mut sorted = list.to_vec();
    sorted.sort_unstable();
    w.varint(sorted.len() as u64);
    let mut end = 0u64;
    for (start, len) in sorted {
        assert!(start >= end && len > 0, "catalog ranges never overlap");
        w.varint(start - end);
        w.varint(len);
        end = start + len;
    }
}

impl Catalog {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.bytes(&CATALOG_MAGIC);
        w.u64(self.seq);
        w.u64(self.epoch);
        w.u32(self.next_volume_id);
        w.u64(self.generation);
        w.varint(self.spaces.len() as u64);
        for s in &self.spaces {
            root(&mut w, &s.root);
            w.varint(s.free_blocks);
            w.varint(s.cursor);
        }
        root(&mut w, &self.sums);
        w.varint(self.volumes.len() as u64);
        self.volumes.iter().for_each(|v| volume(&mut w, v));
        ranges(&mut w, &self.own_nodes);
        ranges(&mut w, &self.deferred);
        ranges(&mut w, &self.inflight);
        if let Some(m) = self.overcommit_milli {
            assert!(m != 0, "a zero ratio is encoded as none");
            w.u32(m);
        }
        w.buf
    }

    pub fn decode(buf: &[u8]) -> Result<Catalog> {
        let mut r = Reader::new(buf, "catalog");
        if r.take(8)? != CATALOG_MAGIC {
            return Err(FormatError::BadMagic { what: "catalog" });
        }
        let mut c = Catalog {
            seq: r.u64()?,
            epoch: r.u64()?,
            next_volume_id: r.u32()?,
            generation: r.u64()?,
            ..Default::default()
        };
        for _ in 0..count(&mut r, MAX_CATALOG_DEVICES, "device count")? {
            c.spaces.push(SpaceEntry { root: read_root(&mut r)?, free_blocks: r.varint()?, cursor: r.varint()? });
        }
        c.sums = read_root(&mut r)?;
        for _ in 0..count(&mut r, MAX_CATALOG_VOLUMES, "volume count")? {
            let v = read_volume(&mut r, c.epoch)?;
            if v.id == 0 || v.id >= c.next_volume_id || c.volumes.iter().any(|o| o.id == v.id || o.name == v.name) {
                return Err(r.bad("volume id", u64::from(v.id)));
            }
            c.volumes.push(v);
        }
        c.own_nodes = read_ranges(&mut r)?;
        c.deferred = read_ranges(&mut r)?;
        c.inflight = read_ranges(&mut r)?;
        if !r.is_empty() {
            let m = r.u32()?;
            if m == 0 || m > MAX_OVERCOMMIT_MILLI {
                return Err(r.bad("overcommit", u64::from(m)));
            }
            c.overcommit_milli = Some(m);
        }
        if !r.is_empty() {
            return Err(r.bad("trailing bytes", r.remaining() as u64));
        }
        Ok(c)
    }
}

fn volume(w: &mut Writer, v: &VolumeEntry) {
    w.u32(v.id);
    w.u64(v.size);
    name(w, &v.name);
    let flags = if v.origin.is_some() { VOLUME_ORIGIN } else { 0 }
        | if v.placement.is_some() { VOLUME_PLACEMENT } else { 0 }
        | if v.role.is_some() { VOLUME_ROLE } else { 0 }
        | if v.quota.is_some() { VOLUME_QUOTA } else { 0 }
        | if v.devices != 0 { VOLUME_DEVICES } else { 0 }
        | if v.stripe.is_some() { VOLUME_STRIPE } else { 0 }
        | if v.parity.is_some() { VOLUME_PARITY } else { 0 };
    w.u8(flags);
    if let Some((vol, epoch)) = v.origin {
        w.u32(vol);
        w.varint(epoch);
    }
    if let Some(p) = v.placement {
        w.u8(p as u8);
    }
    if let Some(role) = v.role {
        let (b, owner) = role.to_parts();
        w.u8(b);
        w.u32(owner);
    }
    if let Some(q) = v.quota {
        w.u64(q);
    }
    if v.devices != 0 {
        w.u16(v.devices);
    }
    if let Some(s) = v.stripe {
        w.u16(s.devices);
        w.u8(s.shift);
    }
    if let Some(p) = v.parity {
        w.u16(p.devices);
        w.u8(p.shift);
    }
    map(w, &v.head);
    w.varint(v.snapshots.len() as u64);
    for s in &v.snapshots {
        w.varint(s.epoch);
        w.u64(s.size);
        w.u64(s.created);
        w.varint(s.referenced);
        name(w, &s.name);
        map(w, &s.dead);
        inline_entries(w, s);
    }
}

/// A dead list kept in the catalog: its entries after its map record,
/// encoded as in a codec 1 leaf (the first against zeros).
fn inline_entries(w: &mut Writer, s: &SnapshotEntry) {
    assert!(
        s.inline.is_empty() || (s.dead.root.pba == 0 && s.dead.extents == s.inline.len() as u64),
        "an inline dead list has no root and counts its entries"
    );
    let mut prev: Option<(u64, ExtentValue)> = None;
    for &(key, v) in &s.inline {
        ExtentValue::encode(prev.as_ref(), key, &v, w);
        prev = Some((key, v));
    }
}

/// The entries of an inline dead list (`m` has no root and counts them),
/// checked against the record's counts.
fn read_inline(r: &mut Reader, m: &MapRecord) -> Result<Vec<(u64, ExtentValue)>> {
    if m.root.pba != 0 || m.extents == 0 {
        return Ok(Vec::new());
    }
    if m.extents > MAX_INLINE_EXTENTS {
        return Err(r.bad("inline dead list extents", m.extents));
    }
    let mut out: Vec<(u64, ExtentValue)> = Vec::with_capacity(m.extents as usize);
    let (mut mapped, mut origin) = (0u64, 0u64);
    for _ in 0..m.extents {
        let e = ExtentValue::decode(out.last(), r)?;
        mapped = mapped.saturating_add(e.1.len);
        if crate::Pba(e.1.pba).is_origin() {
            origin = origin.saturating_add(e.1.len);
        }
        out.push(e);
    }
    if mapped != m.mapped_blocks || origin != m.origin_blocks {
        return Err(r.bad("inline dead list blocks", mapped));
    }
    Ok(out)
}

fn count(r: &mut Reader, max: u64, field: &'static str) -> Result<u64> {
    let n = r.varint()?;
    if n > max {
        return Err(r.bad(field, n));
    }
    Ok(n)
}

fn read_root(r: &mut Reader) -> Result<Root> {
    let root = Root { pba: r.u64()?, crc: r.u32()?, level: r.u8()? };
    if root.level > MAX_LEVEL || (root.pba == 0 && (root.crc != 0 || root.level != 0)) {
        return Err(r.bad("root level", u64::from(root.level)));
    }
    Ok(root)
}

/// A map record; `inline` (a snapshot's dead list): an empty root with
/// extents means the entries follow (`read_inline`).
fn read_map(r: &mut Reader, inline: bool) -> Result<MapRecord> {
    let m =
        MapRecord { root: read_root(r)?, mapped_blocks: r.varint()?, origin_blocks: r.varint()?, extents: r.varint()? };
    let empty_ok = m.extents == 0 && m.mapped_blocks == 0;
    let inline_ok = inline && m.extents > 0 && m.mapped_blocks >= m.extents;
    if m.origin_blocks > m.mapped_blocks || (m.root.pba == 0 && !empty_ok && !inline_ok) {
        return Err(r.bad("map counts", m.mapped_blocks));
    }
    Ok(m)
}

fn read_name(r: &mut Reader) -> Result<String> {
    let len = usize::from(r.u8()?);
    if len == 0 || len > MAX_NAME_LEN {
        return Err(r.bad("name length", len as u64));
    }
    String::from_utf8(r.take(len)?.to_vec()).map_err(|_| r.bad("name (not UTF-8)", len as u64))
}

fn read_volume(r: &mut Reader, epoch: u64) -> Result<VolumeEntry> {
    let (id, size, name) = (r.u32()?, r.u64()?, read_name(r)?);
    let flags = r.u8()?;
    if flags & !VOLUME_FLAGS != 0 {
        return Err(r.bad("volume flags", u64::from(flags)));
    }
    let origin = if flags & VOLUME_ORIGIN != 0 { Some((r.u32()?, r.varint()?)) } else { None };
    let placement = if flags & VOLUME_PLACEMENT != 0 {
        let b = r.u8()?;
        Some(PolicyCode::from_byte(b).ok_or_else(|| r.bad("placement policy", u64::from(b)))?)
    } else {
        None
    };
    let role = if flags & VOLUME_ROLE != 0 {
        let (b, owner) = (r.u8()?, r.u32()?);
        Some(VolumeRole::from_parts(b, owner).ok_or_else(|| r.bad("volume role", u64::from(b)))?)
    } else {
        None
    };
    let quota = if flags & VOLUME_QUOTA != 0 {
        let q = r.u64()?;
        if q == 0 || q % crate::BLOCK_SIZE != 0 {
            return Err(r.bad("quota", q));
        }
        Some(q)
    } else {
        None
    };
    let devices = if flags & VOLUME_DEVICES != 0 {
        match r.u16()? {
            0 => return Err(r.bad("volume devices", 0)),
            d => d,
        }
    } else {
        0
    };
    let stripe = if flags & VOLUME_STRIPE != 0 {
        let (d, shift) = (r.u16()?, r.u8()?);
        Some(
            crate::stripe::Stripe::from_parts(d, shift)
                .ok_or_else(|| r.bad("stripe", u64::from(d) << 8 | u64::from(shift)))?,
        )
    } else {
        None
    };
    let parity = if flags & VOLUME_PARITY != 0 {
        let (d, shift) = (r.u16()?, r.u8()?);
        Some(
            crate::stripe::Parity::from_parts(d, shift)
                .ok_or_else(|| r.bad("parity", u64::from(d) << 8 | u64::from(shift)))?,
        )
    } else {
        None
    };
    let head = read_map(r, false)?;
    let mut snapshots: Vec<SnapshotEntry> = Vec::new();
    for _ in 0..count(r, MAX_CATALOG_SNAPSHOTS, "snapshot count")? {
        let (snap, size, created, referenced, name) = (r.varint()?, r.u64()?, r.u64()?, r.varint()?, read_name(r)?);
        let dead = read_map(r, true)?;
        let inline = read_inline(r, &dead)?;
        let s = SnapshotEntry { epoch: snap, size, created, referenced, name, dead, inline };
        if s.epoch >= epoch || snapshots.last().is_some_and(|p| p.epoch >= s.epoch) {
            return Err(r.bad("snapshot epoch", s.epoch));
        }
        if snapshots.iter().any(|p| p.name == s.name) {
            return Err(r.bad("duplicate snapshot name", s.epoch));
        }
        snapshots.push(s);
    }
    Ok(VolumeEntry { id, size, name, origin, placement, role, quota, devices, stripe, parity, head, snapshots })
}

fn read_ranges(r: &mut Reader) -> Result<Vec<(u64, u64)>> {
    let n = count(r, MAX_CATALOG_RANGES, "range count")?;
    let mut out = Vec::with_capacity(n.min(1 << 12) as usize);
    let mut end = 0u64;
    for _ in 0..n {
        let gap = r.varint()?;
        let len = r.varint()?;
        let start = end.checked_add(gap).ok_or_else(|| r.bad("range gap", gap))?;
        end = start.checked_add(len).filter(|_| len > 0).ok_or_else(|| r.bad("range length", len))?;
        out.push((start, len));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Catalog {
        let m =
            |pba, n| MapRecord { root: Root { pba, crc: 7, level: 1 }, mapped_blocks: n, origin_blocks: 0, extents: 3 };
        Catalog {
            seq: 9,
            epoch: 5,
            next_volume_id: 3,
            generation: 4,
            spaces: vec![SpaceEntry { root: Root { pba: 40, crc: 1, level: 0 }, free_blocks: 900, cursor: 77 }],
            sums: Root::default(),
            volumes: vec![
                VolumeEntry {
                    id: 1,
                    size: 1 << 20,
                    name: "a".into(),
                    origin: None,
                    placement: Some(PolicyCode::Contiguous),
                    role: None,
                    quota: None,
                    devices: 0,
                    stripe: None,
                    parity: None,
                    head: m(50, 10),
                    snapshots: vec![SnapshotEntry {
                        epoch: 2,
                        size: 1 << 20,
                        created: 1,
                        referenced: 8,
                        name: "s".into(),
                        dead: m(60, 2),
                        inline: vec![],
                    }],
                },
                VolumeEntry {
                    id: 2,
                    size: 4096,
                    name: "c".into(),
                    origin: Some((1, 2)),
                    placement: None,
                    role: Some(VolumeRole::Object { owner: 1 }),
                    quota: None,
                    devices: 0,
                    stripe: None,
                    parity: None,
                    head: MapRecord::default(),
                    snapshots: vec![],
                },
            ],
            own_nodes: vec![(40, 1), (50, 2)],
            deferred: vec![(10, 4)],
            inflight: vec![],
            overcommit_milli: None,
        }
    }

    #[test]
    fn round_trips() {
        let c = sample();
        assert_eq!(Catalog::decode(&c.encode()).unwrap(), c);
    }

    /// Pins the encoding of the fixed part: a change is a format change.
    #[test]
    fn golden_bytes_of_the_head() {
        let b = sample().encode();
        let hex: Vec<String> = b[..44].iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(
            hex.join(" "),
            "54 41 52 4e 43 54 4c 47 09 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 03 00 00 00 \
             04 00 00 00 00 00 00 00 01 28 00 00 00 00 00 00"
        );
    }

    /// A volume entry's flags byte and the placement byte after it:
    /// id 1, size, name "a", flags PLACEMENT (2), policy contiguous (4).
    #[test]
    fn golden_bytes_of_a_volume_entry_with_a_placement() {
        let mut w = Writer::default();
        volume(&mut w, &sample().volumes[0]);
        let b = w.buf;
        assert_eq!(&b[..4 + 8 + 2], &[1, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 1, b'a']);
        assert_eq!(&b[14..16], &[2, 4]);
        let mut bad = sample();
        bad.volumes[0].placement = None;
        let mut bytes = bad.encode();
        // An unknown flag bit is refused, not skipped.
        let at = bytes.windows(2).position(|x| x == [1, b'a']).unwrap() + 2;
        bytes[at] = 8;
        assert!(Catalog::decode(&bytes).is_err());
    }

    /// A volume entry with the ROLE flag: id 2, size 4096, name "c", flags
    /// ORIGIN|ROLE (5), origin vol 1 epoch 2, role 2 (object), owner 1.
    #[test]
    fn golden_bytes_of_a_volume_entry_with_a_role() {
        let mut w = Writer::default();
        volume(&mut w, &sample().volumes[1]);
        let b = w.buf;
        assert_eq!(&b[..14], &[2, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 1, b'c']);
        assert_eq!(&b[14..25], &[5, 1, 0, 0, 0, 2, 2, 1, 0, 0, 0]);
        let mut bytes = sample().encode();
        // An object without an owner is refused.
        let at = bytes.windows(3).position(|x| x == [2, 2, 1]).unwrap() + 2;
        bytes[at] = 0;
        assert!(Catalog::decode(&bytes).is_err());
    }

    /// A snapshot whose dead list the catalog holds (INLINE_DEAD_LISTS,
    /// incompat bit 19): the map record has an empty root and counts 3
    /// blocks in 2 extents, then the 2 entries as in a codec 1 leaf:
    /// (5, len 1, pba 100, birth 2) against zeros, (9, len 2, pba 103,
    /// birth 3) against it.
    #[test]
    fn golden_bytes_of_an_inline_dead_list() {
        let mut c = sample();
        let dead = MapRecord { root: Root::default(), mapped_blocks: 3, origin_blocks: 0, extents: 2 };
        let ev = |len, pba, birth| ExtentValue { len, pba, birth };
        c.volumes[0].snapshots[0].dead = dead;
        c.volumes[0].snapshots[0].inline = vec![(5, ev(1, 100, 2)), (9, ev(2, 103, 3))];
        let mut w = Writer::default();
        volume(&mut w, &c.volumes[0]);
        let mut tail = vec![0u8; 13];
        tail.extend_from_slice(&[3, 0, 2, 5, 1, 0xc8, 1, 4, 3, 2, 4, 2]);
        assert_eq!(&w.buf[w.buf.len() - tail.len()..], &tail[..]);
        assert_eq!(Catalog::decode(&c.encode()).unwrap(), c);
        let at = |b: &[u8]| b.windows(tail.len()).position(|x| x == &tail[..]).unwrap();
        // Counts that disagree with the entries, more than 8 extents, or
        // entries missing: refused, not used.
        for (i, v) in [(13, 4u8), (15, 9), (15, 3)] {
            let mut bytes = c.encode();
            let p = at(&bytes) + i;
            bytes[p] = v;
            assert!(Catalog::decode(&bytes).is_err(), "byte {i} = {v}");
        }
        // A head never holds its entries inline.
        let mut h = sample();
        h.volumes[1].head = dead;
        assert!(Catalog::decode(&h.encode()).is_err());
    }

    /// A volume entry with the DEVICES flag (16): `devices u16` after the
    /// flags byte (members 0 and 2 here).
    #[test]
    fn golden_bytes_of_a_volume_device_set() {
        let mut c = sample();
        c.volumes[0].placement = None;
        c.volumes[0].devices = 0b101;
        let mut w = Writer::default();
        volume(&mut w, &c.volumes[0]);
        assert_eq!(&w.buf[14..17], &[16, 0b101, 0]);
        let bytes = c.encode();
        assert_eq!(Catalog::decode(&bytes).unwrap(), c);
        // An empty set is encoded as no flag, so a zero set is refused.
        let at = bytes.windows(2).position(|x| x == [b'a', 16]).unwrap() + 2;
        let mut bad = bytes.clone();
        bad[at] = 0;
        assert!(Catalog::decode(&bad).is_err());
    }

    /// A volume entry with the STRIPE flag (32): `devices u16`, `shift u8`
    /// after the flags byte (and after a device set, here members 0 and 1
    /// striped in 64 KiB units).
    #[test]
    fn golden_bytes_of_a_stripe() {
        let mut c = sample();
        c.volumes[0].placement = None;
        c.volumes[0].devices = 0b111;
        c.volumes[0].stripe = crate::stripe::Stripe::from_parts(0b11, 4);
        let mut w = Writer::default();
        volume(&mut w, &c.volumes[0]);
        assert_eq!(&w.buf[14..20], &[48, 0b111, 0, 0b11, 0, 4]);
        let bytes = c.encode();
        assert_eq!(Catalog::decode(&bytes).unwrap(), c);
        // A one-member set or a unit past 64 MiB is refused.
        let at = bytes.windows(2).position(|x| x == [b'a', 48]).unwrap() + 4;
        for (off, v) in [(0, 0b10), (2, 15)] {
            let mut bad = bytes.clone();
            bad[at + off] = v;
            assert!(Catalog::decode(&bad).is_err(), "{off} {v}");
        }
    }

    /// A volume entry with the PARITY flag (64): `devices u16`, `shift u8`
    /// after the flags byte (here members 0-3, 3 data + parity, in 16 KiB
    /// units).
    #[test]
    fn golden_bytes_of_a_parity_layout() {
        let mut c = sample();
        c.volumes[0].placement = None;
        c.volumes[0].parity = crate::stripe::Parity::from_parts(0b1111, 2);
        let mut w = Writer::default();
        volume(&mut w, &c.volumes[0]);
        assert_eq!(&w.buf[14..18], &[64, 0b1111, 0, 2]);
        let bytes = c.encode();
        assert_eq!(Catalog::decode(&bytes).unwrap(), c);
        // A two-member set or a unit past 64 KiB is refused.
        let at = bytes.windows(2).position(|x| x == [b'a', 64]).unwrap() + 2;
        for (off, v) in [(0, 0b11), (2, 5)] {
            let mut bad = bytes.clone();
            bad[at + off] = v;
            assert!(Catalog::decode(&bad).is_err(), "{off} {v}");
        }
    }

    /// A volume entry with the QUOTA flag (8): the quota after the flags
    /// byte; and the overcommit ratio ending the catalog.
    #[test]
    fn golden_bytes_of_a_quota_and_the_overcommit_ratio() {
        let mut c = sample();
        c.volumes[0].placement = None;
        c.volumes[0].quota = Some(1 << 20);
        let mut w = Writer::default();
        volume(&mut w, &c.volumes[0]);
        assert_eq!(&w.buf[14..23], &[8, 0, 0, 0x10, 0, 0, 0, 0, 0]);
        c.overcommit_milli = Some(1500);
        let bytes = c.encode();
        assert_eq!(&bytes[bytes.len() - 4..], &[0xdc, 0x05, 0, 0]);
        assert_eq!(Catalog::decode(&bytes).unwrap(), c);
        // A zero or unaligned quota, a zero or huge ratio: refused.
        // `at`: the quota's first byte.
        let at = bytes.windows(3).position(|x| x == [b'a', 8, 0]).unwrap() + 2;
        for (i, b) in [(at, 0x01u8), (at + 2, 0)] {
            let mut bad = bytes.clone();
            bad[i] = b;
            assert!(Catalog::decode(&bad).is_err(), "quota byte {i} = {b}");
        }
        let n = bytes.len();
        for tail in [[0u8, 0, 0, 0], [0x41, 0x42, 0x0f, 0]] {
            let mut bad = bytes.clone();
            bad[n - 4..].copy_from_slice(&tail);
            assert!(Catalog::decode(&bad).is_err(), "ratio {tail:?}");
        }
    }

    #[test]
    fn damage_is_an_error() {
        let good = sample().encode();
        for cut in 0..good.len() {
            assert!(Catalog::decode(&good[..cut]).is_err(), "truncated at {cut}");
        }
        let mut bad = sample();
        bad.volumes[1].id = 1;
        assert!(Catalog::decode(&bad.encode()).is_err(), "duplicate id");
        let mut bad = sample();
        bad.volumes[0].snapshots[0].epoch = 5;
        assert!(Catalog::decode(&bad.encode()).is_err(), "snapshot at the current epoch");
        let mut bad = sample();
        bad.spaces[0].root.level = 17;
        assert!(Catalog::decode(&bad.encode()).is_err(), "root too deep");
    }
}
