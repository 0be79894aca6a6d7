//! Metadata operations: the deltas a commit records in the journal.
//!
//! The engine applies an op to its in-memory state and appends the same op to
//! the pending commit, so replaying the journal goes through the exact code
//! path the live pool took.

use crate::codec::{Reader, Writer};
use crate::error::Result;
use crate::placement::PolicyCode;
use crate::role::VolumeRole;

pub const MAX_NAME_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Logical blocks [lba, lba+len) of `vol` now live at physical blocks
    /// starting at `pba`, written in epoch `birth`.
    Map {
        vol: u32,
        lba: u64,
        len: u64,
        pba: u64,
        birth: u64,
    },
    /// Logical blocks [lba, lba+len) of `vol` are holes again.
    Unmap {
        vol: u32,
        lba: u64,
        len: u64,
    },
    VolCreate {
        vol: u32,
        size: u64,
        name: String,
    },
    VolResize {
        vol: u32,
        size: u64,
    },
    /// Deletes the volume, its snapshots and every mapping they hold.
    VolDelete {
        vol: u32,
    },
    /// Snapshot `vol` as `name`: the snapshot's epoch is the current epoch,
    /// which then advances. `created` is seconds since the Unix epoch.
    SnapCreate {
        vol: u32,
        name: String,
        created: u64,
    },
    /// Delete the snapshot of `vol` taken at `epoch`.
    SnapDelete {
        vol: u32,
        epoch: u64,
    },
    /// Make `vol`'s head the contents of its newest snapshot, `epoch`.
    Rollback {
        vol: u32,
        epoch: u64,
    },
    /// A new volume `vol` whose contents are `origin_vol`'s snapshot at
    /// `origin_epoch` until written.
    CloneCreate {
        vol: u32,
        origin_vol: u32,
        origin_epoch: u64,
        name: String,
    },
    /// Replace a clone's origin marker over [lba, lba+len) in its head
    /// (`snap` = 0) or in the dead list of its snapshot `snap` by a copy at
    /// `pba` (0: the origin had a hole there), keeping the entry's birth.
    Materialize {
        vol: u32,
        snap: u64,
        lba: u64,
        len: u64,
        pba: u64,
    },
    /// The clone no longer reads through to its origin (no marker is left).
    CloneDetach {
        vol: u32,
    },
    /// Physical blocks [pba, pba + sums.len()) hold data whose crc32c are
    /// `sums`, one per block (pools with the DATA_CHECKSUMS feature). The
    /// op rides in the same record as the Map op that points at the blocks,
    /// or alone after an in-place overwrite.
    Sums {
        pba: u64,
        sums: Vec<u32>,
    },
    /// Coarse checksums (pools with the COARSE_SUMS feature): group `i`,
    /// physical blocks [pba + 16i, pba + 16i + 16) (`pba` a multiple of
    /// 16), holds 64 KiB whose crc32c is `crcs[i]`; the group's blocks have
    /// no per-block sum from then on. Rides like Sums.
    GroupSums {
        pba: u64,
        crcs: Vec<u32>,
    },
    /// Overwrite regions (`region_of`) that may now (`open`) or may no
    /// longer be overwritten in place. After a crash, blocks in open regions
    /// may hold data newer than their checksums: open resynchronizes them.
    Regions {
        open: bool,
        ids: Vec<u64>,
    },
    /// `vol` places its new data by `policy` from now on (None: the pool's
    /// default). Pools with the PLACEMENT feature.
    VolPlacement {
        vol: u32,
        policy: Option<PolicyCode>,
    },
    /// Move the blocks [lba, lba+len) of one map of `vol`, its head (`snap`
    /// = 0) or the dead list of its snapshot `snap`, from physical `from`
    /// to `to`, keeping their birth: every view that shares them (the
    /// head, its snapshots, clones reading through) sees them at `to`.
    /// `from` is freed. Pools with the RELOCATE feature.
    Relocate {
        vol: u32,
        snap: u64,
        lba: u64,
        len: u64,
        from: u64,
        to: u64,
    },
    /// `vol` (created in the same record) becomes a file volume or a file
    /// volume's object, hidden from block volume commands. Pools with the
    /// FILES feature.
    VolRole {
        vol: u32,
        role: VolumeRole,
    },
    /// `vol`'s head and snapshots may hold at most `quota` bytes of own
    /// space (None: no quota). Pools with the QUOTAS feature.
    VolQuota {
        vol: u32,
        quota: Option<u64>,
    },
    /// Creating or growing a volume past `milli`/1000 × the pool's size
    /// (sum of virtual sizes) is refused unless forced (None: no limit).
    /// Pools with the QUOTAS feature; `vol` is 0.
    PoolOvercommit {
        milli: Option<u32>,
    },
    /// `vol`'s new data goes only to the members in `devices` (bit i for
    /// member i; 0: any member) from now on. Pools with the
    /// DEVICE_PLACEMENT feature.
    VolDevices {
        vol: u32,
        devices: u16,
    },
    /// `vol`'s new data is striped (None: not): logical stripe unit k goes
    /// to the (k mod N)-th member of the set. Pools with the STRIPES
    /// feature.
    VolStripe {
        vol: u32,
        stripe: Option<crate::stripe::Stripe>,
    },
    /// `vol` keeps single parity over a set of N+1 members (None: not):
    /// every write is copy-on-write and maps its data and its rows' parity
    /// units (past the data rows, see crate::stripe::Parity) in one
    /// commit. Pools with the PARITY feature.
    VolParity {
        vol: u32,
        parity: Option<crate::stripe::Parity>,
    },
}

/// The largest overcommit ratio, in thousandths (1000×).
pub const MAX_OVERCOMMIT_MILLI: u32 = 1_000_000;

/// Blocks one Sums op covers at most (the largest write: 32 MiB).
pub const MAX_SUMS_PER_OP: usize = 8192;
/// Groups one GroupSums op covers at most (the largest write: 32 MiB).
pub const MAX_GROUPS_PER_OP: usize = MAX_SUMS_PER_OP / crate::node::SUMS_GROUP as usize;
/// Region ids one Regions op carries at most.
pub const MAX_REGIONS_PER_OP: usize = 1 << 16;
/// log2 of an overwrite region's size in blocks (64 MiB).
pub const REGION_SHIFT: u32 = 14;

/// The overwrite region a physical block address belongs to (the device
/// index stays in the high bits).
pub fn region_of(pba: u64) -> u64 {
    pba >> REGION_SHIFT
}

mod tag {
    pub const MAP: u8 = 1;
    pub const UNMAP: u8 = 2;
    pub const VOL_CREATE: u8 = 3;
    pub const VOL_RESIZE: u8 = 4;
    pub const VOL_DELETE: u8 = 5;
    pub const SNAP_CREATE: u8 = 6;
    pub const SNAP_DELETE: u8 = 7;
    pub const ROLLBACK: u8 = 8;
    pub const CLONE_CREATE: u8 = 9;
    pub const MATERIALIZE: u8 = 10;
    pub const CLONE_DETACH: u8 = 11;
    pub const SUMS: u8 = 12;
    pub const REGIONS_OPEN: u8 = 13;
    pub const REGIONS_CLOSE: u8 = 14;
    pub const VOL_PLACEMENT: u8 = 15;
    pub const VOL_ROLE: u8 = 16;
    pub const RELOCATE: u8 = 17;
    pub const GROUP_SUMS: u8 = 18;
    pub const VOL_QUOTA: u8 = 22;
    pub const POOL_OVERCOMMIT: u8 = 23;
    pub const VOL_DEVICES: u8 = 24;
    pub const VOL_STRIPE: u8 = 20;
    pub const VOL_PARITY: u8 = 21;
}

fn encode_name(w: &mut Writer, name: &str) {
    assert!(name.len() <= MAX_NAME_LEN);
    w.u8(name.len() as u8);
    w.bytes(name.as_bytes());
}

fn decode_name(r: &mut Reader<'_>) -> Result<String> {
    let n = usize::from(r.u8()?);
    if n > MAX_NAME_LEN {
        return Err(r.bad("name_len", n as u64));
    }
    String::from_utf8(r.take(n)?.to_vec()).map_err(|_| r.bad("name_utf8", 0))
}

impl Op {
    pub fn encode(&self, w: &mut Writer) {
        match self {
            Op::Map { vol, lba, len, pba, birth } => {
                w.u8(tag::MAP);
                w.u32(*vol);
                w.varint(*lba);
                w.varint(*len);
                w.u64(*pba);
                w.varint(*birth);
            }
            Op::Unmap { vol, lba, len } => {
                w.u8(tag::UNMAP);
                w.u32(*vol);
                w.varint(*lba);
                w.varint(*len);
            }
            Op::VolCreate { vol, size, name } => {
                w.u8(tag::VOL_CREATE);
                w.u32(*vol);
                w.u64(*size);
                encode_name(w, name);
            }
            Op::VolResize { vol, size } => {
                w.u8(tag::VOL_RESIZE);
                w.u32(*vol);
                w.u64(*size);
            }
            Op::VolDelete { vol } => {
                w.u8(tag::VOL_DELETE);
                w.u32(*vol);
            }
            Op::VolPlacement { vol, policy } => {
                w.u8(tag::VOL_PLACEMENT);
                w.u32(*vol);
                w.u8(policy.map_or(0, |p| p as u8));
            }
            Op::VolRole { vol, role } => {
                let (b, owner) = role.to_parts();
                w.u8(tag::VOL_ROLE);
                w.u32(*vol);
                w.u8(b);
                w.u32(owner);
            }
            Op::VolQuota { vol, quota } => {
                assert!(*quota != Some(0), "a zero quota is encoded as none");
                w.u8(tag::VOL_QUOTA);
                w.u32(*vol);
                w.u64(quota.unwrap_or(0));
            }
            Op::VolDevices { vol, devices } => {
                w.u8(tag::VOL_DEVICES);
                w.u32(*vol);
                w.u16(*devices);
            }
            Op::VolStripe { vol, stripe } => {
                w.u8(tag::VOL_STRIPE);
                w.u32(*vol);
                w.u16(stripe.map_or(0, |s| s.devices));
                w.u8(stripe.map_or(0, |s| s.shift));
            }
            Op::VolParity { vol, parity } => {
                w.u8(tag::VOL_PARITY);
                w.u32(*vol);
                w.u16(parity.map_or(0, |p| p.devices));
                w.u8(parity.map_or(0, |p| p.shift));
            }
            Op::PoolOvercommit { milli } => {
                assert!(*milli != Some(0), "a zero ratio is encoded as none");
                w.u8(tag::POOL_OVERCOMMIT);
                w.u32(0);
                w.u32(milli.unwrap_or(0));
            }
            Op::Sums { pba, sums } => {
                assert!(!sums.is_empty() && sums.len() <= MAX_SUMS_PER_OP);
                w.u8(tag::SUMS);
                w.u32(0);
                w.u64(*pba);
                w.varint(sums.len() as u64);
                sums.iter().for_each(|&s| w.u32(s));
            }
            Op::GroupSums { pba, crcs } => encode_group_sums(w, *pba, crcs),
            Op::Regions { open, ids } => {
                assert!(!ids.is_empty() && ids.len() <= MAX_REGIONS_PER_OP);
                w.u8(if *open { tag::REGIONS_OPEN } else { tag::REGIONS_CLOSE });
                w.u32(0);
                w.varint(ids.len() as u64);
                ids.iter().for_each(|&id| w.varint(id));
            }
            _ => self.encode_snapshot_op(w),
        }
    }

    fn encode_snapshot_op(&self, w: &mut Writer) {
        match self {
            Op::SnapCreate { vol, name, created } => {
                w.u8(tag::SNAP_CREATE);
                w.u32(*vol);
                w.u64(*created);
                encode_name(w, name);
            }
            Op::SnapDelete { vol, epoch } | Op::Rollback { vol, epoch } => {
                w.u8(if matches!(self, Op::SnapDelete { .. }) { tag::SNAP_DELETE } else { tag::ROLLBACK });
                w.u32(*vol);
                w.varint(*epoch);
            }
            Op::CloneCreate { vol, origin_vol, origin_epoch, name } => {
                w.u8(tag::CLONE_CREATE);
                w.u32(*vol);
                w.u32(*origin_vol);
                w.varint(*origin_epoch);
                encode_name(w, name);
            }
            Op::Materialize { vol, snap, lba, len, pba } => {
                w.u8(tag::MATERIALIZE);
                w.u32(*vol);
                w.varint(*snap);
                w.varint(*lba);
                w.varint(*len);
                w.u64(*pba);
            }
            Op::CloneDetach { vol } => {
                w.u8(tag::CLONE_DETACH);
                w.u32(*vol);
            }
            Op::Relocate { vol, snap, lba, len, from, to } => {
                w.u8(tag::RELOCATE);
                w.u32(*vol);
                w.varint(*snap);
                w.varint(*lba);
                w.varint(*len);
                w.u64(*from);
                w.u64(*to);
            }
            Op::Map { .. }
            | Op::Unmap { .. }
            | Op::VolCreate { .. }
            | Op::VolResize { .. }
            | Op::VolDelete { .. }
            | Op::VolPlacement { .. }
            | Op::VolRole { .. }
            | Op::VolQuota { .. }
            | Op::PoolOvercommit { .. }
            | Op::VolDevices { .. }
            | Op::VolStripe { .. }
            | Op::VolParity { .. }
            | Op::Sums { .. }
            | Op::GroupSums { .. }
            | Op::Regions { .. } => {
                unreachable!("volume and pool ops are encoded by Op::encode")
            }
        }
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Op> {
        let t = r.u8()?;
        let vol = r.u32()?;
        Ok(match t {
            tag::MAP => {
                let (lba, len, pba, birth) = (r.varint()?, r.varint()?, r.u64()?, r.varint()?);
                if len == 0 {
                    return Err(r.bad("map_len", 0));
                }
                Op::Map { vol, lba, len, pba, birth }
            }
            tag::UNMAP => {
                let (lba, len) = (r.varint()?, r.varint()?);
                Op::Unmap { vol, lba, len }
            }
            tag::VOL_CREATE => {
                let size = r.u64()?;
                Op::VolCreate { vol, size, name: decode_name(r)? }
            }
            tag::VOL_RESIZE => Op::VolResize { vol, size: r.u64()? },
            tag::VOL_DELETE => Op::VolDelete { vol },
            tag::VOL_PLACEMENT => {
                let b = r.u8()?;
                let policy = match b {
                    0 => None,
                    _ => Some(PolicyCode::from_byte(b).ok_or_else(|| r.bad("placement policy", u64::from(b)))?),
                };
                Op::VolPlacement { vol, policy }
            }
            tag::VOL_ROLE => {
                let (b, owner) = (r.u8()?, r.u32()?);
                let role = VolumeRole::from_parts(b, owner).ok_or_else(|| r.bad("volume role", u64::from(b)))?;
                Op::VolRole { vol, role }
            }
            tag::SNAP_CREATE => {
                let created = r.u64()?;
                Op::SnapCreate { vol, created, name: decode_name(r)? }
            }
            tag::SNAP_DELETE => Op::SnapDelete { vol, epoch: r.varint()? },
            tag::ROLLBACK => Op::Rollback { vol, epoch: r.varint()? },
            tag::CLONE_CREATE => {
                let (origin_vol, origin_epoch) = (r.u32()?, r.varint()?);
                Op::CloneCreate { vol, origin_vol, origin_epoch, name: decode_name(r)? }
            }
            tag::MATERIALIZE => {
                let (snap, lba, len, pba) = (r.varint()?, r.varint()?, r.varint()?, r.u64()?);
                if len == 0 {
                    return Err(r.bad("materialize_len", 0));
                }
                Op::Materialize { vol, snap, lba, len, pba }
            }
            tag::CLONE_DETACH => Op::CloneDetach { vol },
            tag::RELOCATE => {
                let (snap, lba, len, from, to) = (r.varint()?, r.varint()?, r.varint()?, r.u64()?, r.u64()?);
                if len == 0 {
                    return Err(r.bad("relocate_len", 0));
                }
                if from == to {
                    return Err(r.bad("relocate_to_itself", from));
                }
                Op::Relocate { vol, snap, lba, len, from, to }
            }
            tag::VOL_QUOTA => {
                let q = r.u64()?;
                if q % crate::BLOCK_SIZE != 0 {
                    return Err(r.bad("quota", q));
                }
                Op::VolQuota { vol, quota: (q != 0).then_some(q) }
            }
            tag::VOL_DEVICES => Op::VolDevices { vol, devices: r.u16()? },
            tag::VOL_STRIPE => {
                let (devices, shift) = (r.u16()?, r.u8()?);
                let stripe = crate::stripe::Stripe::from_parts(devices, shift);
                if stripe.is_none() && (devices, shift) != (0, 0) {
                    return Err(r.bad("stripe", u64::from(devices) << 8 | u64::from(shift)));
                }
                Op::VolStripe { vol, stripe }
            }
            tag::VOL_PARITY => {
                let (devices, shift) = (r.u16()?, r.u8()?);
                let parity = crate::stripe::Parity::from_parts(devices, shift);
                if parity.is_none() && (devices, shift) != (0, 0) {
                    return Err(r.bad("parity", u64::from(devices) << 8 | u64::from(shift)));
                }
                Op::VolParity { vol, parity }
            }
            tag::SUMS | tag::GROUP_SUMS | tag::REGIONS_OPEN | tag::REGIONS_CLOSE | tag::POOL_OVERCOMMIT if vol != 0 => {
                return Err(r.bad("pool_op_vol", u64::from(vol)));
            }
            tag::POOL_OVERCOMMIT => {
                let m = r.u32()?;
                if m > MAX_OVERCOMMIT_MILLI {
                    return Err(r.bad("overcommit", u64::from(m)));
                }
                Op::PoolOvercommit { milli: (m != 0).then_some(m) }
            }
            tag::SUMS => {
                let pba = r.u64()?;
                let n = r.varint()?;
                if n == 0 || n > MAX_SUMS_PER_OP as u64 || n > r.remaining() as u64 / 4 {
                    return Err(r.bad("sums_len", n));
                }
                let sums = (0..n).map(|_| r.u32()).collect::<Result<Vec<u32>>>()?;
                Op::Sums { pba, sums }
            }
            tag::GROUP_SUMS => decode_group_sums(r)?,
            tag::REGIONS_OPEN | tag::REGIONS_CLOSE => {
                let n = r.varint()?;
                if n == 0 || n > MAX_REGIONS_PER_OP as u64 || n > r.remaining() as u64 {
                    return Err(r.bad("regions_len", n));
                }
                let ids = (0..n).map(|_| r.varint()).collect::<Result<Vec<u64>>>()?;
                Op::Regions { open: t == tag::REGIONS_OPEN, ids }
            }
            other => return Err(r.bad("op_tag", u64::from(other))),
        })
    }
}

/// Op 18's fields after `tag` and `vol` (0).
fn encode_group_sums(w: &mut Writer, pba: u64, crcs: &[u32]) {
    assert!(!crcs.is_empty() && crcs.len() <= MAX_GROUPS_PER_OP);
    assert!(pba.is_multiple_of(crate::node::SUMS_GROUP), "a group starts at a multiple of 16");
    w.u8(tag::GROUP_SUMS);
    w.u32(0);
    w.u64(pba);
    w.varint(crcs.len() as u64);
    crcs.iter().for_each(|&s| w.u32(s));
}

fn decode_group_sums(r: &mut Reader<'_>) -> Result<Op> {
    let pba = r.u64()?;
    if !pba.is_multiple_of(crate::node::SUMS_GROUP) {
        return Err(r.bad("group_sums_pba", pba));
    }
    let n = r.varint()?;
    if n == 0 || n > MAX_GROUPS_PER_OP as u64 || n > r.remaining() as u64 / 4 {
        return Err(r.bad("group_sums_len", n));
    }
    let crcs = (0..n).map(|_| r.u32()).collect::<Result<Vec<u32>>>()?;
    Ok(Op::GroupSums { pba, crcs })
}

/// Encode a batch of ops as a journal payload.
pub fn encode_ops(ops: &[Op]) -> Vec<u8> {
    let mut w = Writer::with_capacity(ops.len() * 24);
    w.varint(ops.len() as u64);
    ops.iter().for_each(|op| op.encode(&mut w));
    w.buf
}

/// Decode a journal payload; the count is bounded by the payload length.
pub fn decode_ops(buf: &[u8]) -> Result<Vec<Op>> {
    let mut r = Reader::new(buf, "journal payload");
    let n = r.varint()?;
    if n > buf.len() as u64 {
        return Err(r.bad("op_count", n));
    }
    let mut ops = Vec::with_capacity(n as usize);
    for _ in 0..n {
        ops.push(Op::decode(&mut r)?);
    }
    if !r.is_empty() {
        return Err(r.bad("trailing_bytes", r.remaining() as u64));
    }
    Ok(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn sample_ops() -> Vec<Op> {
        vec![
            Op::VolCreate { vol: 1, size: 1 << 30, name: "disk0".into() },
            Op::Map { vol: 1, lba: 10, len: 256, pba: (1 << 48) | 77, birth: 1 },
            Op::Unmap { vol: 1, lba: 12, len: 1 },
            Op::VolResize { vol: 1, size: 1 << 31 },
            Op::VolDelete { vol: 1 },
            Op::SnapCreate { vol: 2, name: "monday".into(), created: 1_790_000_000 },
            Op::SnapDelete { vol: 2, epoch: 7 },
            Op::Rollback { vol: 2, epoch: 300 },
            Op::CloneCreate { vol: 3, origin_vol: 2, origin_epoch: 7, name: "c".into() },
            Op::Materialize { vol: 3, snap: 0, lba: 5, len: 9, pba: 77 },
            Op::Materialize { vol: 3, snap: 8, lba: 0, len: 1, pba: 0 },
            Op::CloneDetach { vol: 3 },
            Op::Sums { pba: (2 << 48) | 5, sums: vec![0, u32::MAX, 0xdead_beef] },
            Op::Regions { open: true, ids: vec![0, 1 << 34, 7] },
            Op::Regions { open: false, ids: vec![3] },
            Op::VolPlacement { vol: 4, policy: Some(PolicyCode::Append) },
            Op::VolPlacement { vol: 4, policy: None },
            Op::Relocate { vol: 5, snap: 0, lba: 3, len: 2, from: 100, to: (1 << 48) | 7 },
            Op::Relocate { vol: 5, snap: 9, lba: 0, len: 1, from: 8, to: 9 },
            Op::VolRole { vol: 5, role: VolumeRole::FileVolume },
            Op::VolRole { vol: 6, role: VolumeRole::Object { owner: 5 } },
            Op::VolQuota { vol: 7, quota: Some(1 << 30) },
            Op::VolQuota { vol: 7, quota: None },
            Op::PoolOvercommit { milli: Some(2500) },
            Op::PoolOvercommit { milli: None },
            Op::VolDevices { vol: 5, devices: 0b11 },
            Op::VolDevices { vol: 5, devices: 0 },
            Op::GroupSums { pba: (1 << 48) | 32, crcs: vec![7, u32::MAX] },
        ]
    }

    /// Op 18 (GroupSums, docs/FORMAT.md): bytes as the table says.
    #[test]
    fn golden_bytes_of_group_sums() {
        let op = Op::GroupSums { pba: (1 << 48) | 32, crcs: vec![0x98f9_4189, 0x0102_0304] };
        let bytes = encode_ops(std::slice::from_ref(&op));
        #[rustfmt::skip]
        let want = [
            1, 18, 0, 0, 0, 0,                  // count 1, tag 18, vol 0 (u32 LE)
            32, 0, 0, 0, 0, 0, 1, 0,            // pba (u64 LE): device 1, block 32
            2,                                  // n varint
            0x89, 0x41, 0xf9, 0x98, 4, 3, 2, 1, // crc u32 LE per group
        ];
        assert_eq!(bytes, want);
        assert_eq!(decode_ops(&bytes).unwrap(), vec![op]);
        let mut unaligned = want;
        unaligned[6] = 33;
        let mut vol = want;
        vol[2] = 1;
        let mut empty = want[..15].to_vec();
        empty[14] = 0;
        let mut short = want.to_vec();
        short.pop();
        for bad in [&unaligned[..], &vol, &empty, &short] {
            assert!(decode_ops(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn relocate_bytes_and_bad_lengths() {
        let bytes = encode_ops(&[Op::Relocate { vol: 2, snap: 3, lba: 4, len: 5, from: 6, to: 7 }]);
        // count 1, tag 17, vol 2 (u32 LE), snap 3, lba 4, len 5 (varints),
        // from 6, to 7 (u64 LE)
        let want = [[1, 17, 2, 0, 0, 0, 3, 4, 5].as_slice(), &6u64.to_le_bytes(), &7u64.to_le_bytes()].concat();
        assert_eq!(bytes, want);
        assert!(decode_ops(&encode_ops(&[Op::Relocate { vol: 2, snap: 0, lba: 0, len: 0, from: 1, to: 2 }])).is_err());
        assert!(decode_ops(&encode_ops(&[Op::Relocate { vol: 2, snap: 0, lba: 0, len: 1, from: 1, to: 1 }])).is_err());
    }

    #[test]
    fn vol_role_bytes_and_bad_roles() {
        let bytes = encode_ops(&[Op::VolRole { vol: 6, role: VolumeRole::Object { owner: 5 } }]);
        // count 1, tag 16, vol 6 (u32 LE), role 2 (object), owner 5 (u32 LE)
        assert_eq!(bytes, [1, 16, 6, 0, 0, 0, 2, 5, 0, 0, 0]);
        let fv = encode_ops(&[Op::VolRole { vol: 5, role: VolumeRole::FileVolume }]);
        assert_eq!(fv, [1, 16, 5, 0, 0, 0, 1, 0, 0, 0, 0]);
        // An object without an owner, a file volume with one, an unknown role.
        for bad in
            [[1, 16, 6, 0, 0, 0, 2, 0, 0, 0, 0], [1, 16, 5, 0, 0, 0, 1, 9, 0, 0, 0], [1, 16, 5, 0, 0, 0, 3, 1, 0, 0, 0]]
        {
            assert!(decode_ops(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn vol_placement_bytes_and_bad_policy() {
        let bytes = encode_ops(&[Op::VolPlacement { vol: 2, policy: Some(PolicyCode::Contiguous) }]);
        // count 1, tag 15, vol 2 (u32 LE), policy 4
        assert_eq!(bytes, [1, 15, 2, 0, 0, 0, 4]);
        let mut bad = bytes.clone();
        bad[6] = 9;
        assert!(decode_ops(&bad).is_err(), "an unknown policy byte must be refused");
    }

    /// Ops 22 and 23 (QUOTAS feature), byte for byte, and what decode refuses.
    #[test]
    fn quota_and_overcommit_bytes_and_bad_values() {
        let bytes = encode_ops(&[Op::VolQuota { vol: 3, quota: Some(1 << 20) }]);
        // count 1, tag 22, vol 3 (u32 LE), quota 1 MiB (u64 LE)
        assert_eq!(bytes, [1, 22, 3, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0]);
        let none = encode_ops(&[Op::VolQuota { vol: 3, quota: None }]);
        assert_eq!(none, [1, 22, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let ratio = encode_ops(&[Op::PoolOvercommit { milli: Some(2000) }]);
        // count 1, tag 23, vol 0, ratio 2.0 as 2000 thousandths (u32 LE)
        assert_eq!(ratio, [1, 23, 0, 0, 0, 0, 0xd0, 0x07, 0, 0]);
        let bad_quota = [1, 22, 3, 0, 0, 0, 1, 0, 0x10, 0, 0, 0, 0, 0];
        let ratio_on_a_volume = [1, 23, 1, 0, 0, 0, 0xd0, 0x07, 0, 0];
        let ratio_too_big = [1, 23, 0, 0, 0, 0, 0x41, 0x42, 0x0f, 0];
        for bad in [&bad_quota[..], &ratio_on_a_volume, &ratio_too_big] {
            assert!(decode_ops(bad).is_err(), "{bad:?}");
        }
    }

    /// Op 20 (STRIPES feature), byte for byte, and what decode refuses.
    #[test]
    fn golden_bytes_of_vol_stripe() {
        let stripe = crate::stripe::Stripe::from_parts(0b1101, 4);
        let bytes = encode_ops(&[Op::VolStripe { vol: 3, stripe }]);
        // count 1, tag 20, vol 3 (u32 LE), set (u16 LE): members 0, 2, 3, unit 2^4 blocks (64 KiB)
        assert_eq!(bytes, [1, 20, 3, 0, 0, 0, 0b1101, 0, 4]);
        assert_eq!(decode_ops(&bytes).unwrap(), vec![Op::VolStripe { vol: 3, stripe }]);
        let none = encode_ops(&[Op::VolStripe { vol: 3, stripe: None }]);
        assert_eq!(none, [1, 20, 3, 0, 0, 0, 0, 0, 0]);
        assert_eq!(decode_ops(&none).unwrap(), vec![Op::VolStripe { vol: 3, stripe: None }]);
        let one_member = [1, 20, 3, 0, 0, 0, 0b100, 0, 4];
        let unit_too_big = [1, 20, 3, 0, 0, 0, 0b11, 0, 15];
        let unit_without_set = [1, 20, 3, 0, 0, 0, 0, 0, 4];
        for bad in [&one_member[..], &unit_too_big, &unit_without_set] {
            assert!(decode_ops(bad).is_err(), "{bad:?}");
        }
    }

    /// Op 21 (PARITY feature), byte for byte, and what decode refuses.
    #[test]
    fn golden_bytes_of_vol_parity() {
        let parity = crate::stripe::Parity::from_parts(0b1111, 4);
        let bytes = encode_ops(&[Op::VolParity { vol: 3, parity }]);
        // count 1, tag 21, vol 3 (u32 LE), set (u16 LE): members 0-3 (3 data + parity), unit 2^4 blocks (64 KiB)
        assert_eq!(bytes, [1, 21, 3, 0, 0, 0, 0b1111, 0, 4]);
        assert_eq!(decode_ops(&bytes).unwrap(), vec![Op::VolParity { vol: 3, parity }]);
        let none = encode_ops(&[Op::VolParity { vol: 3, parity: None }]);
        assert_eq!(none, [1, 21, 3, 0, 0, 0, 0, 0, 0]);
        assert_eq!(decode_ops(&none).unwrap(), vec![Op::VolParity { vol: 3, parity: None }]);
        let two_members = [1, 21, 3, 0, 0, 0, 0b101, 0, 4];
        let unit_too_big = [1, 21, 3, 0, 0, 0, 0b111, 0, 5];
        let unit_without_set = [1, 21, 3, 0, 0, 0, 0, 0, 2];
        for bad in [&two_members[..], &unit_too_big, &unit_without_set] {
            assert!(decode_ops(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn golden_bytes_of_vol_devices() {
        let bytes = encode_ops(&[Op::VolDevices { vol: 3, devices: 0b110 }]);
        // count 1, tag 24, vol 3 (u32 LE), devices (u16 LE): members 1, 2
        assert_eq!(bytes, [1, 24, 3, 0, 0, 0, 6, 0]);
        assert_eq!(decode_ops(&bytes).unwrap(), vec![Op::VolDevices { vol: 3, devices: 6 }]);
        assert!(decode_ops(&bytes[..7]).is_err(), "truncated");
    }

    #[test]
    fn ops_round_trip() {
        let ops = sample_ops();
        assert_eq!(decode_ops(&encode_ops(&ops)).unwrap(), ops);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = encode_ops(&sample_ops());
        for n in 0..bytes.len() {
            assert!(decode_ops(&bytes[..n]).is_err(), "prefix {n} accepted");
        }
    }
}
