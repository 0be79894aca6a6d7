//! Valid structures: the fuzz targets' seeds and the pool image's parts.

use tarn_format::checkpoint::{
    CheckpointDecoder, CheckpointEncoder, CheckpointHeader, ExtentRecord, SnapshotRecord, VolumeRecord,
};
use tarn_format::ops::Op;
use tarn_format::superblock::{incompat, CheckpointRef, DeviceEntry, Superblock, FORMAT_VERSION};
use tarn_format::Pba;

/// A primary's superblock (the pool image's, before its checkpoint is known).
pub fn superblock() -> Superblock {
    Superblock {
        version: FORMAT_VERSION,
        incompat: incompat::SNAPSHOTS,
        ro_compat: 0,
        compat: 0,
        pool_uuid: [0x11; 16],
        device_uuid: [0x22; 16],
        device_index: 0,
        txid: 3,
        device_blocks: 512,
        data_start: 48,
        journal_start: 32,
        journal_blocks: 16,
        journal_generation: 0x1234_5678,
        checkpoint: CheckpointRef::default(),
        created_unix: 1_700_000_000,
        devices: vec![DeviceEntry { uuid: [0x22; 16], blocks: 512, path: "fuzz0".into(), ..Default::default() }],
        flags: 0,
    }
}

/// One op of every kind.
pub fn every_op() -> Vec<Op> {
    vec![
        Op::VolCreate { vol: 1, size: 1 << 20, name: "disk0".into() },
        Op::Map { vol: 1, lba: 10, len: 16, pba: 300, birth: 1 },
        Op::Unmap { vol: 1, lba: 12, len: 1 },
        Op::VolResize { vol: 1, size: 2 << 20 },
        Op::SnapCreate { vol: 1, name: "monday".into(), created: 1_790_000_000 },
        Op::CloneCreate { vol: 2, origin_vol: 1, origin_epoch: 1, name: "c".into() },
        Op::Materialize { vol: 2, snap: 0, lba: 5, len: 1, pba: 500 },
        Op::Map { vol: 1, lba: 10, len: 1, pba: 600, birth: 2 },
        Op::Rollback { vol: 1, epoch: 1 },
        Op::Materialize { vol: 2, snap: 0, lba: 0, len: 5, pba: 0 },
        Op::CloneDetach { vol: 2 },
        Op::VolDelete { vol: 2 },
        Op::SnapDelete { vol: 1, epoch: 1 },
        Op::Sums { pba: 300, sums: vec![0x1234_5678, 7] },
        Op::GroupSums { pba: 320, crcs: vec![0x9abc_def0] },
        Op::Regions { open: true, ids: vec![1, 9] },
        Op::Regions { open: false, ids: vec![1] },
        Op::VolPlacement { vol: 1, policy: Some(tarn_format::placement::PolicyCode::Append) },
        Op::VolRole { vol: 1, role: tarn_format::role::VolumeRole::FileVolume },
        Op::Relocate { vol: 1, snap: 0, lba: 10, len: 2, from: 300, to: 700 },
        Op::VolQuota { vol: 1, quota: Some(1 << 20) },
        Op::PoolOvercommit { milli: Some(2000) },
        Op::VolDevices { vol: 1, devices: 0b11 },
        Op::VolStripe { vol: 1, stripe: tarn_format::stripe::Stripe::from_parts(0b11, 4) },
        Op::VolParity { vol: 1, parity: tarn_format::stripe::Parity::from_parts(0b111, 2) },
        Op::VolDelete { vol: 1 },
    ]
}

/// Extents with their blocks' checksums (empty for volumes without sums
/// and for origin markers).
type Extents = Vec<(ExtentRecord, Vec<u32>)>;
/// A checkpoint as records: header, then per volume its record, head
/// extents and snapshots with their dead lists.
pub type Checkpoint = (CheckpointHeader, Vec<(VolumeRecord, Extents, Vec<(SnapshotRecord, Extents)>)>);

fn e(lba: u64, len: u64, pba: u64, birth: u64) -> (ExtentRecord, Vec<u32>) {
    (ExtentRecord { lba, len, pba, birth }, Vec::new())
}

/// The pool image's checkpoint (seq 5, epoch 3): volume "a" with two
/// snapshots and dead lists, clone "c" of a@s1 with an origin marker,
/// empty volume "b". Physical blocks 200..=300, all distinct.
pub fn checkpoint() -> Checkpoint {
    let h = CheckpointHeader { seq: 5, epoch: 3, next_volume_id: 4, volume_count: 3 };
    let vol = |id, name: &str, size, origin, snapshot_count, extent_count| VolumeRecord {
        id,
        size,
        name: name.into(),
        origin,
        snapshot_count,
        extent_count,
        sums: false,
    };
    let snap = |epoch, name: &str, referenced, dead_count| SnapshotRecord {
        epoch,
        size: 1 << 20,
        created: 1_700_000_100,
        referenced,
        name: name.into(),
        dead_count,
    };
    let a_head = vec![e(0, 4, 200, 1), e(4, 1, 210, 3), e(16, 8, 220, 2)];
    let a_snaps = vec![(snap(1, "s1", 5, 1), vec![e(4, 1, 300, 1)]), (snap(2, "s2", 13, 1), vec![e(4, 1, 205, 2)])];
    let c_head = vec![e(0, 2, 240, 3), e(2, 254, Pba::origin(2).0, 0)];
    (
        h,
        vec![
            (vol(1, "a", 1 << 20, None, 2, 3), a_head, a_snaps),
            (vol(2, "c", 1 << 20, Some((1, 1)), 0, 2), c_head, vec![]),
            (vol(3, "b", 64 << 10, None, 0, 0), vec![], vec![]),
        ],
    )
}

fn put_extent(enc: &mut CheckpointEncoder, (x, sums): &(ExtentRecord, Vec<u32>)) {
    if sums.is_empty() {
        enc.extent(x);
    } else {
        enc.extent_summed(x, sums);
    }
}

pub fn encode_checkpoint((h, vols): &Checkpoint) -> Vec<u8> {
    let mut enc = CheckpointEncoder::new(h);
    for (v, exts, snaps) in vols {
        enc.volume(v);
        exts.iter().for_each(|x| put_extent(&mut enc, x));
        for (s, dead) in snaps {
            enc.snapshot(s);
            dead.iter().for_each(|x| put_extent(&mut enc, x));
        }
    }
    enc.finish()
}

/// The pool image's journal: (epoch after the record, ops), seq 6 and 7.
pub fn journal() -> Vec<(u64, Vec<Op>)> {
    vec![
        (
            3,
            vec![
                Op::VolCreate { vol: 4, size: 128 << 10, name: "d".into() },
                Op::Map { vol: 4, lba: 0, len: 2, pba: 400, birth: 3 },
                Op::Unmap { vol: 1, lba: 16, len: 2 },
            ],
        ),
        (
            4,
            vec![
                Op::SnapCreate { vol: 4, name: "t".into(), created: 1_700_000_200 },
                Op::Map { vol: 4, lba: 1, len: 1, pba: 410, birth: 4 },
                Op::CloneCreate { vol: 5, origin_vol: 4, origin_epoch: 3, name: "e".into() },
                Op::Materialize { vol: 5, snap: 0, lba: 0, len: 1, pba: 420 },
            ],
        ),
    ]
}

/// Walk a checkpoint payload with [`CheckpointDecoder`] in the order the
/// encoder wrote it: every volume, its head extents, its snapshots and
/// their dead lists.
pub fn decode_checkpoint(payload: &[u8]) -> tarn_format::error::Result<Checkpoint> {
    fn extents(d: &mut CheckpointDecoder<'_>) -> tarn_format::error::Result<Extents> {
        let mut out = Vec::new();
        while let Some(x) = d.extent()? {
            out.push((x, d.sums().to_vec()));
        }
        Ok(out)
    }
    let (mut d, h) = CheckpointDecoder::new(payload)?;
    let mut vols = Vec::new();
    while let Some(v) = d.volume()? {
        let head = extents(&mut d)?;
        let mut snaps = Vec::new();
        while let Some(s) = d.snapshot()? {
            let dead = extents(&mut d)?;
            snaps.push((s, dead));
        }
        vols.push((v, head, snaps));
    }
    Ok((h, vols))
}
