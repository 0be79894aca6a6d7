//! Metadata store nodes: one 4 KiB block of a paged copy-on-write B-tree
//! (docs/FORMAT.md, *Store nodes*).
//!
//! A node knows its own address (a misdirected or stale write is caught),
//! the tree it belongs to (a node of another tree is caught), its level
//! (children are exactly one level lower, so no path can loop) and carries
//! a salted crc32c. A branch holds, per child, the child's first key, its
//! address and its checksum: parents hash-chain their children.

use crate::checksum::checksum;
use crate::codec::{Reader, Writer};
use crate::error::{FormatError, Result};
use crate::{Pba, BLOCK_SIZE};

pub const NODE_MAGIC: &[u8; 8] = b"TARNNODE";
pub const SALT_NODE: u32 = 0x4e4f_4445; // "NODE"
pub const NODE_SIZE: usize = BLOCK_SIZE as usize;
/// Bytes before the payload.
pub const NODE_HEADER: usize = 40;
/// Where the checksum sits (the last 4 bytes of the block).
pub const NODE_CRC_OFFSET: usize = NODE_SIZE - 4;
/// Room for entries in one node.
pub const NODE_PAYLOAD_MAX: usize = NODE_CRC_OFFSET - NODE_HEADER;
/// One branch entry: first key u64, child address u64, child crc u32.
pub const BRANCH_ENTRY: usize = 20;
pub const BRANCH_MAX: usize = NODE_PAYLOAD_MAX / BRANCH_ENTRY;
/// Levels above the leaves a tree may have: 202^16 children is far past
/// any device, so a deeper claim is damage.
pub const MAX_LEVEL: u8 = 16;

const KIND_LEAF: u8 = 0;
const KIND_BRANCH: u8 = 1;

/// What every node says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeHeader {
    /// The block it was written to.
    pub self_pba: Pba,
    /// The store generation (checkpoint) that wrote it.
    pub generation: u64,
    /// The tree it belongs to.
    pub tree: u64,
    /// 0 for a leaf.
    pub level: u8,
    /// The leaf value codec of its tree ([`LeafValue::CODEC`]).
    pub codec: u8,
}

/// A branch's reference to a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildRef {
    /// The smallest key the child may hold.
    pub key: u64,
    pub pba: Pba,
    pub crc: u32,
}

/// A node's contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeBody {
    Leaf(PackedLeaf),
    Branch(Vec<ChildRef>),
}

/// Entries in one group at most: a reader decodes at most this many to
/// reach any entry, a change re-encodes one group.
pub const GROUP_MAX: usize = 8;

/// A leaf's entries as stored, and as the store keeps them in memory:
/// groups of consecutive entries, each group's first entry encoded on its
/// own (against no predecessor), the others against the entry before.
/// Finding an entry decodes one group; changing one re-encodes one group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackedLeaf {
    /// Entries per group (1..=GROUP_MAX).
    pub sizes: Vec<u8>,
    pub data: Vec<u8>,
}

impl PackedLeaf {
    /// Pack entries (keys ascending) in groups of `GROUP_MAX`.
    pub fn pack<V: LeafValue>(entries: &[(u64, V)]) -> PackedLeaf {
        let mut w = Writer::default();
        let mut sizes = Vec::new();
        for group in entries.chunks(GROUP_MAX) {
            sizes.push(group.len() as u8);
            encode_group(group, &mut w);
        }
        PackedLeaf { sizes, data: w.buf }
    }

    /// Bytes in a node's payload.
    pub fn payload_len(&self) -> usize {
        2 + self.sizes.len() + self.data.len()
    }

    pub fn count(&self) -> usize {
        self.sizes.iter().map(|s| usize::from(*s)).sum()
    }

    /// Decode and validate every entry; returns them and each group's
    /// byte offset in `data`.
    pub fn unpack<V: LeafValue>(&self) -> Result<Unpacked<V>> {
        let mut r = Reader::new(&self.data, "store leaf");
        let mut out: Vec<(u64, V)> = Vec::with_capacity(self.count());
        let mut offsets = Vec::with_capacity(self.sizes.len());
        for &size in &self.sizes {
            if size == 0 || usize::from(size) > GROUP_MAX {
                return Err(r.bad("group size", u64::from(size)));
            }
            offsets.push(r.position() as u16);
            let first = V::decode(None, &mut r)?;
            if out.last().is_some_and(|p| first.0 < V::key_end(p.0, &p.1)) {
                return Err(r.bad("group key order", first.0));
            }
            out.push(first);
            for _ in 1..size {
                let e = V::decode(out.last(), &mut r)?;
                out.push(e);
            }
        }
        if !r.is_empty() {
            return Err(r.bad("leaf trailing bytes", r.remaining() as u64));
        }
        Ok((out, offsets))
    }
}

/// A leaf's entries and each group's byte offset.
pub type Unpacked<V> = (Vec<(u64, V)>, Vec<u16>);

/// Encode one group: the first entry alone, the rest as deltas.
pub fn encode_group<V: LeafValue>(group: &[(u64, V)], w: &mut Writer) {
    let mut prev = None;
    for e in group {
        V::encode(prev, e.0, &e.1, w);
        prev = Some(e);
    }
}

/// A leaf value type and its compact encoding. Keys ascend; entries are
/// delta-encoded against the previous one (its key and value), so a leaf
/// of neighbouring ranges costs a few bytes an entry.
pub trait LeafValue: Copy + Default + std::fmt::Debug + PartialEq + Send + Sync + 'static {
    /// Written in the header; a tree's nodes all carry the same codec.
    const CODEC: u8;
    fn encode(prev: Option<&(u64, Self)>, key: u64, value: &Self, w: &mut Writer);
    fn decode(prev: Option<&(u64, Self)>, r: &mut Reader) -> Result<(u64, Self)>;
    /// Bytes `encode` writes (must agree exactly).
    fn encoded_len(prev: Option<&(u64, Self)>, key: u64, value: &Self) -> usize;
    /// The smallest key the next entry may have.
    fn key_end(key: u64, value: &Self) -> u64;
    /// Decode an entry this process encoded (or validated) itself, at
    /// `*pos` in `buf`: no checks, no error path.
    fn decode_trusted(prev: Option<&(u64, Self)>, buf: &[u8], pos: &mut usize) -> (u64, Self) {
        let mut r = Reader::new(&buf[*pos..], "store leaf");
        let e = Self::decode(prev, &mut r).expect("an entry encoded in memory decodes");
        *pos += r.position();
        e
    }
}

/// A volume map entry: logical blocks `[key, key+len)` at `pba`, born in
/// epoch `birth`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtentValue {
    pub len: u64,
    pub pba: u64,
    pub birth: u64,
}

/// Blocks a range may span: keys and addresses are 48-bit block numbers
/// plus a device tag, and `key + len` must not overflow.
fn check_len(key: u64, len: u64, r: &Reader) -> Result<()> {
    if len == 0 || key.checked_add(len).is_none() {
        return Err(r.bad("len", len));
    }
    Ok(())
}

fn end_of(prev: Option<&(u64, ExtentValue)>) -> (u64, u64, u64) {
    prev.map_or((0, 0, 0), |(k, v)| (k + v.len, v.pba.wrapping_add(v.len), v.birth))
}

impl LeafValue for ExtentValue {
    const CODEC: u8 = 1;
    fn encode(prev: Option<&(u64, Self)>, key: u64, v: &Self, w: &mut Writer) {
        let (key_end, pba_end, birth) = end_of(prev);
        w.varint(key - key_end);
        w.varint(v.len);
        w.varint_signed(v.pba.wrapping_sub(pba_end) as i64);
        w.varint_signed(v.birth.wrapping_sub(birth) as i64);
    }
    fn decode(prev: Option<&(u64, Self)>, r: &mut Reader) -> Result<(u64, Self)> {
        let (key_end, pba_end, birth) = end_of(prev);
        let gap = r.varint()?;
        let key = key_end.checked_add(gap).ok_or_else(|| r.bad("key", gap))?;
        let len = r.varint()?;
        check_len(key, len, r)?;
        let pba = pba_end.wrapping_add(r.varint_signed()? as u64);
        let block = pba & crate::address::BLOCK_MASK;
        if block.checked_add(len).is_none_or(|end| end > crate::address::BLOCK_MASK) {
            return Err(r.bad("pba", pba));
        }
        let birth = birth.wrapping_add(r.varint_signed()? as u64);
        Ok((key, ExtentValue { len, pba, birth }))
    }
    fn encoded_len(prev: Option<&(u64, Self)>, key: u64, v: &Self) -> usize {
        let (key_end, pba_end, birth) = end_of(prev);
        varint_len(key - key_end)
            + varint_len(v.len)
            + signed_len(v.pba.wrapping_sub(pba_end) as i64)
            + signed_len(v.birth.wrapping_sub(birth) as i64)
    }
    fn key_end(key: u64, v: &Self) -> u64 {
        key + v.len
    }
    fn decode_trusted(prev: Option<&(u64, Self)>, buf: &[u8], pos: &mut usize) -> (u64, Self) {
        use crate::codec::{trusted_varint, trusted_varint_signed};
        let (key_end, pba_end, birth) = end_of(prev);
        let key = key_end + trusted_varint(buf, pos);
        let len = trusted_varint(buf, pos);
        let pba = pba_end.wrapping_add(trusted_varint_signed(buf, pos) as u64);
        let birth = birth.wrapping_add(trusted_varint_signed(buf, pos) as u64);
        (key, ExtentValue { len, pba, birth })
    }
}

/// A free (or otherwise plain) range: blocks `[key, key+len)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RangeValue {
    pub len: u64,
}

impl LeafValue for RangeValue {
    const CODEC: u8 = 2;
    fn encode(prev: Option<&(u64, Self)>, key: u64, v: &Self, w: &mut Writer) {
        w.varint(key - prev.map_or(0, |(k, p)| k + p.len));
        w.varint(v.len);
    }
    fn decode(prev: Option<&(u64, Self)>, r: &mut Reader) -> Result<(u64, Self)> {
        let gap = r.varint()?;
        let key = prev.map_or(0, |(k, p)| k + p.len).checked_add(gap).ok_or_else(|| r.bad("key", gap))?;
        let len = r.varint()?;
        check_len(key, len, r)?;
        Ok((key, RangeValue { len }))
    }
    fn encoded_len(prev: Option<&(u64, Self)>, key: u64, v: &Self) -> usize {
        varint_len(key - prev.map_or(0, |(k, p)| k + p.len)) + varint_len(v.len)
    }
    fn key_end(key: u64, v: &Self) -> u64 {
        key + v.len
    }
}

/// Blocks one checksum entry covers.
pub const SUMS_GROUP: u64 = 16;

/// Data checksums of a group of 16 physical blocks (key: first block's
/// address / 16): which blocks have one, and the crc32c of each; or, a
/// coarse group (`coarse`, pools with COARSE_SUMS), one crc32c of all 64
/// KiB (`known` 0, `crcs` unused).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SumsValue {
    pub known: u16,
    pub crcs: [u32; SUMS_GROUP as usize],
    pub coarse: Option<u32>,
}

impl SumsValue {
    /// A coarse group whose 64 KiB have crc32c `crc`.
    pub const fn group(crc: u32) -> SumsValue {
        SumsValue { known: 0, crcs: [0; SUMS_GROUP as usize], coarse: Some(crc) }
    }
}

impl LeafValue for SumsValue {
    const CODEC: u8 = 3;
    fn encode(prev: Option<&(u64, Self)>, key: u64, v: &Self, w: &mut Writer) {
        w.varint(key - prev.map_or(0, |p| p.0 + 1));
        if let Some(crc) = v.coarse {
            w.u16(0);
            w.u32(crc);
            return;
        }
        assert!(v.known != 0, "a sums entry holds at least one sum");
        w.u16(v.known);
        (0..16).filter(|i| v.known & (1 << i) != 0).for_each(|i| w.u32(v.crcs[i]));
    }
    fn decode(prev: Option<&(u64, Self)>, r: &mut Reader) -> Result<(u64, Self)> {
        let gap = r.varint()?;
        let base = match prev {
            Some(p) => p.0.checked_add(1).ok_or_else(|| r.bad("key after the last one", p.0))?,
            None => 0,
        };
        let key = base.checked_add(gap).ok_or_else(|| r.bad("key", gap))?;
        let known = r.u16()?;
        if known == 0 {
            return Ok((key, SumsValue::group(r.u32()?)));
        }
        let mut crcs = [0u32; SUMS_GROUP as usize];
        for (i, c) in crcs.iter_mut().enumerate() {
            if known & (1 << i) != 0 {
                *c = r.u32()?;
            }
        }
        Ok((key, SumsValue { known, crcs, coarse: None }))
    }
    fn encoded_len(prev: Option<&(u64, Self)>, key: u64, v: &Self) -> usize {
        let sums = if v.coarse.is_some() { 1 } else { v.known.count_ones() as usize };
        varint_len(key - prev.map_or(0, |p| p.0 + 1)) + 2 + 4 * sums
    }
    fn key_end(key: u64, _: &Self) -> u64 {
        key.saturating_add(1)
    }
}

pub fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn signed_len(v: i64) -> usize {
    varint_len(((v << 1) ^ (v >> 63)) as u64)
}

/// Bytes a group of entries takes encoded.
pub fn group_bytes<V: LeafValue>(entries: &[(u64, V)]) -> usize {
    let mut prev = None;
    let mut n = 0;
    for e in entries {
        n += V::encoded_len(prev, e.0, &e.1);
        prev = Some(e);
    }
    n
}

/// Encode a node into one block. Panics if the body does not fit: the tree
/// splits nodes before that (a programming error, not a disk error).
pub fn encode_node(h: &NodeHeader, body: &NodeBody) -> Vec<u8> {
    let mut w = Writer::with_capacity(NODE_SIZE);
    w.bytes(NODE_MAGIC);
    w.u64(h.self_pba.0);
    w.u64(h.generation);
    w.u64(h.tree);
    let (kind, count) = match body {
        NodeBody::Leaf(l) => (KIND_LEAF, l.count()),
        NodeBody::Branch(c) => (KIND_BRANCH, c.len()),
    };
    assert_eq!(kind == KIND_LEAF, h.level == 0, "leaves are level 0, branches above");
    w.u8(kind);
    w.u8(h.level);
    w.u8(h.codec);
    w.u8(0);
    w.u16(u16::try_from(count).expect("node entry count fits u16"));
    let len_at = w.len();
    w.u16(0);
    assert_eq!(w.len(), NODE_HEADER);
    match body {
        NodeBody::Leaf(l) => {
            w.u16(l.sizes.len() as u16);
            w.bytes(&l.sizes);
            w.bytes(&l.data);
        }
        NodeBody::Branch(children) => children.iter().for_each(|c| {
            w.u64(c.key);
            w.u64(c.pba.0);
            w.u32(c.crc);
        }),
    }
    let payload = w.len() - NODE_HEADER;
    assert!(payload <= NODE_PAYLOAD_MAX, "node payload {payload} exceeds {NODE_PAYLOAD_MAX}");
    w.buf[len_at..len_at + 2].copy_from_slice(&(payload as u16).to_le_bytes());
    w.buf.resize(NODE_CRC_OFFSET, 0);
    let crc = checksum(SALT_NODE, &w.buf);
    w.u32(crc);
    w.buf
}

/// The node's checksum as its parent records it.
pub fn node_crc(block: &[u8]) -> u32 {
    checksum(SALT_NODE, &block[..NODE_CRC_OFFSET])
}

/// What the reader expects of a node, from its parent (or the root record).
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    pub pba: Pba,
    pub crc: u32,
    pub tree: u64,
    pub level: u8,
}

/// Decode and validate a node read from `expect.pba`: checksum (and the
/// parent's record of it), magic, address, tree, level, codec, counts,
/// ascending keys. Every violation is an error naming the field.
pub fn decode_node<V: LeafValue>(block: &[u8], expect: &Expect) -> Result<(NodeHeader, NodeBody)> {
    const WHAT: &str = "store node";
    if block.len() != NODE_SIZE {
        return Err(FormatError::Truncated { what: WHAT, needed: NODE_SIZE, had: block.len() });
    }
    let computed = node_crc(block);
    let stored = u32::from_le_bytes(block[NODE_CRC_OFFSET..].try_into().expect("4 bytes"));
    if stored != computed || stored != expect.crc {
        let stored = if stored != computed { stored } else { expect.crc };
        return Err(FormatError::BadChecksum { what: WHAT, stored, computed });
    }
    if &block[..8] != NODE_MAGIC {
        return Err(FormatError::BadMagic { what: WHAT });
    }
    let mut r = Reader::new(&block[8..NODE_CRC_OFFSET], WHAT);
    let h = decode_header(&mut r, expect)?;
    let count = usize::from(r.u16()?);
    let payload = usize::from(r.u16()?);
    if payload > NODE_PAYLOAD_MAX {
        return Err(r.bad("payload_len", payload as u64));
    }
    let mut p = Reader::new(r.take(payload)?, WHAT);
    let body =
        if h.level == 0 { NodeBody::Leaf(decode_leaf::<V>(&mut p, count)?) } else { decode_branch(&mut p, count)? };
    if !p.is_empty() || r.take(r.remaining())?.iter().any(|b| *b != 0) {
        return Err(FormatError::BadField { what: WHAT, field: "trailing bytes", value: p.remaining() as u64 });
    }
    Ok((h, body))
}

fn decode_header(r: &mut Reader, expect: &Expect) -> Result<NodeHeader> {
    let self_pba = Pba(r.u64()?);
    if self_pba != expect.pba {
        return Err(FormatError::Misplaced { what: "store node", stored: self_pba.0, actual: expect.pba.0 });
    }
    let generation = r.u64()?;
    let tree = r.u64()?;
    if tree != expect.tree {
        return Err(r.bad("tree", tree));
    }
    let kind = r.u8()?;
    let level = r.u8()?;
    let codec = r.u8()?;
    let reserved = r.u8()?;
    if level != expect.level || level > MAX_LEVEL {
        return Err(r.bad("level", u64::from(level)));
    }
    if kind != if level == 0 { KIND_LEAF } else { KIND_BRANCH } {
        return Err(r.bad("kind", u64::from(kind)));
    }
    if reserved != 0 {
        return Err(r.bad("reserved", u64::from(reserved)));
    }
    Ok(NodeHeader { self_pba, generation, tree, level, codec })
}

fn decode_leaf<V: LeafValue>(r: &mut Reader, count: usize) -> Result<PackedLeaf> {
    let groups = usize::from(r.u16()?);
    let sizes = r.take(groups)?.to_vec();
    let data = r.take(r.remaining())?.to_vec();
    let leaf = PackedLeaf { sizes, data };
    if leaf.count() != count {
        return Err(r.bad("leaf count", count as u64));
    }
    leaf.unpack::<V>()?;
    Ok(leaf)
}

fn decode_branch(r: &mut Reader, count: usize) -> Result<NodeBody> {
    if count == 0 || count > BRANCH_MAX {
        return Err(r.bad("branch count", count as u64));
    }
    let mut children: Vec<ChildRef> = Vec::with_capacity(count);
    for _ in 0..count {
        let c = ChildRef { key: r.u64()?, pba: Pba(r.u64()?), crc: r.u32()? };
        if children.last().is_some_and(|p| p.key >= c.key) {
            return Err(r.bad("branch key order", c.key));
        }
        children.push(c);
    }
    Ok(NodeBody::Branch(children))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzz/format_node: a sums entry after one keyed u64::MAX
    /// overflowed computing its base key (a panic in debug builds).
    #[test]
    fn a_sums_key_past_the_largest_is_an_error() {
        let v = SumsValue { known: 1, crcs: [7; SUMS_GROUP as usize], coarse: None };
        let mut w = Writer::default();
        w.varint(0);
        w.u16(1);
        w.u32(9);
        let mut r = Reader::new(&w.buf, "node");
        assert!(SumsValue::decode(Some(&(u64::MAX, v)), &mut r).is_err());
        assert_eq!(SumsValue::key_end(u64::MAX, &v), u64::MAX);
    }

    fn header(level: u8) -> NodeHeader {
        NodeHeader { self_pba: Pba::new(0, 77), generation: 5, tree: 0x1_0000_0002, level, codec: ExtentValue::CODEC }
    }

    fn expect(block: &[u8], level: u8) -> Expect {
        Expect { pba: Pba::new(0, 77), crc: node_crc(block), tree: 0x1_0000_0002, level }
    }

    fn sample_leaf() -> Vec<(u64, ExtentValue)> {
        vec![
            (10, ExtentValue { len: 4, pba: Pba::new(0, 1000).0, birth: 3 }),
            (14, ExtentValue { len: 1, pba: Pba::new(0, 1004).0, birth: 3 }),
            (900, ExtentValue { len: 2, pba: Pba::new(1, 5).0, birth: 1 }),
        ]
    }

    #[test]
    fn leaf_round_trips_and_its_size_is_exact() {
        let entries: Vec<(u64, ExtentValue)> =
            (0..100).map(|i| (i * 5, ExtentValue { len: 2, pba: 1000 + i * 3, birth: i % 3 })).collect();
        let packed = PackedLeaf::pack(&entries);
        assert_eq!(packed.sizes, [vec![8; 12], vec![4]].concat());
        let block = encode_node(&header(0), &NodeBody::Leaf(packed.clone()));
        assert_eq!(block.len(), NODE_SIZE);
        let payload = u16::from_le_bytes([block[38], block[39]]) as usize;
        assert_eq!(payload, packed.payload_len());
        let (h, body) = decode_node::<ExtentValue>(&block, &expect(&block, 0)).unwrap();
        assert_eq!(h, header(0));
        assert_eq!(body, NodeBody::Leaf(packed.clone()));
        assert_eq!(packed.unpack::<ExtentValue>().unwrap().0, entries);
    }

    #[test]
    fn branch_round_trips() {
        let children =
            vec![ChildRef { key: 0, pba: Pba::new(0, 5), crc: 1 }, ChildRef { key: 500, pba: Pba::new(2, 9), crc: 2 }];
        let block = encode_node(&header(1), &NodeBody::Branch(children.clone()));
        let (_, body) = decode_node::<ExtentValue>(&block, &expect(&block, 1)).unwrap();
        assert_eq!(body, NodeBody::Branch(children));
    }

    /// Pins the encoding: a change here is a format change (docs/FORMAT.md).
    #[test]
    fn golden_bytes_of_a_leaf() {
        let packed = PackedLeaf::pack(&sample_leaf());
        let block = encode_node(&header(0), &NodeBody::Leaf(packed));
        let head = "54 41 52 4e 4e 4f 44 45 4d 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 \
                    02 00 00 00 01 00 00 00 00 00 01 00 03 00 17 00";
        assert_eq!(hex(&block[..NODE_HEADER]), head);
        // 1 group of 3 | key 10, len 4, pba +1000, birth +3 | gap 0, len 1,
        // pba +0, birth +0 | gap 885, len 2, pba +(1:5 - 0:1005) (zig-zag,
        // 7 bytes), birth -2
        let payload = "01 00 03 0a 04 d0 0f 06 00 01 00 00 f5 06 02 b0 f0 ff ff ff ff 7f 03";
        assert_eq!(hex(&block[NODE_HEADER..NODE_HEADER + 23]), payload);
        assert!(block[NODE_HEADER + 23..NODE_CRC_OFFSET].iter().all(|b| *b == 0));
        assert_eq!(hex(&block[NODE_CRC_OFFSET..]), hex(&node_crc(&block).to_le_bytes()));
    }

    /// Pins the sums entries (codec 3) of both kinds: per block, and a
    /// coarse group (`known` 0 and one crc; docs/FORMAT.md, COARSE_SUMS).
    #[test]
    fn golden_bytes_of_sums_entries() {
        let mut a = SumsValue { known: 0b10, crcs: [0; 16], coarse: None };
        a.crcs[1] = 0x0a0b_0c0d;
        let entries = vec![(3u64, a), (5, SumsValue::group(0x98f9_4189))];
        let h = NodeHeader { codec: SumsValue::CODEC, ..header(0) };
        let block = encode_node(&h, &NodeBody::Leaf(PackedLeaf::pack(&entries)));
        // 1 group of 2 | gap 3, known 0x0002, crc of block 1 | gap 1 (key
        // 5 after 3 + 1), known 0: coarse, the group's crc
        let payload = "01 00 02 03 02 00 0d 0c 0b 0a 01 00 00 89 41 f9 98";
        assert_eq!(hex(&block[NODE_HEADER..NODE_HEADER + 17]), payload);
        let (_, body) = decode_node::<SumsValue>(&block, &expect(&block, 0)).unwrap();
        let NodeBody::Leaf(packed) = body else { panic!("a leaf") };
        assert_eq!(packed.unpack::<SumsValue>().unwrap().0, entries);
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn damage_is_named() {
        let block = encode_node(&header(0), &NodeBody::Leaf(PackedLeaf::pack(&sample_leaf())));
        let e = expect(&block, 0);
        let mut flipped = block.clone();
        flipped[50] ^= 1;
        assert!(matches!(decode_node::<ExtentValue>(&flipped, &e), Err(FormatError::BadChecksum { .. })));
        let elsewhere = Expect { pba: Pba::new(0, 78), ..e };
        assert!(matches!(decode_node::<ExtentValue>(&block, &elsewhere), Err(FormatError::Misplaced { .. })));
        let other_tree = Expect { tree: 9, ..e };
        assert!(decode_node::<ExtentValue>(&block, &other_tree).is_err());
        let wrong_level = Expect { level: 1, ..e };
        assert!(decode_node::<ExtentValue>(&block, &wrong_level).is_err());
        let stale = Expect { crc: e.crc ^ 1, ..e };
        assert!(matches!(decode_node::<ExtentValue>(&block, &stale), Err(FormatError::BadChecksum { .. })));
        assert!(decode_node::<ExtentValue>(&block[..100], &e).is_err());
    }

    /// Each group's first entry stands alone, so order across groups is
    /// checked on its own: overlapping groups are damage.
    #[test]
    fn groups_out_of_order_are_refused() {
        let a = PackedLeaf::pack(&[(100u64, RangeValue { len: 10 })]);
        let b = PackedLeaf::pack(&[(105u64, RangeValue { len: 1 })]);
        let joined = PackedLeaf { sizes: vec![1, 1], data: [a.data, b.data].concat() };
        assert!(joined.unpack::<RangeValue>().is_err());
        let bad_size = PackedLeaf { sizes: vec![0], data: vec![] };
        assert!(bad_size.unpack::<RangeValue>().is_err());
    }

    #[test]
    fn sums_group_round_trips_with_exact_size() {
        let mut a = SumsValue { known: 0b101, crcs: [0; 16], coarse: None };
        a.crcs[0] = 0xdead_beef;
        a.crcs[2] = 7;
        let full = SumsValue { known: 0xffff, crcs: [9; 16], coarse: None };
        let entries = vec![(4, a), (5, full), (7, SumsValue::group(0x0102_0304))];
        assert_eq!(group_bytes(&entries), (1 + 2 + 8) + (1 + 2 + 64) + (1 + 2 + 4));
        let packed = PackedLeaf::pack(&entries);
        assert_eq!(packed.data.len(), group_bytes(&entries));
        let h = NodeHeader { codec: SumsValue::CODEC, ..header(0) };
        let block = encode_node(&h, &NodeBody::Leaf(packed.clone()));
        let (_, body) = decode_node::<SumsValue>(&block, &expect(&block, 0)).unwrap();
        assert_eq!(body, NodeBody::Leaf(packed.clone()));
        assert_eq!(packed.unpack::<SumsValue>().unwrap().0, entries);
    }

    #[test]
    fn varint_len_matches_the_writer() {
        for v in [0u64, 1, 127, 128, 16383, 16384, u32::MAX as u64, u64::MAX] {
            let mut w = Writer::default();
            w.varint(v);
            assert_eq!(varint_len(v), w.len(), "{v}");
        }
    }
}
