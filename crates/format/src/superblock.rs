//! The superblock: one per device, two copies, the root of everything.
//!
//! Layout (little-endian, 4096 bytes; offsets in bytes):
//! see docs/FORMAT.md §Superblock, which is normative. Field offsets here
//! mirror it.

use crate::address::{Pba, BLOCK_MASK, BLOCK_SIZE};
use crate::checksum::{seal, unseal, SALT_SUPERBLOCK};
use crate::codec::Writer;
use crate::error::{FormatError, Result};
use crate::placement::PolicyCode;

pub const SUPERBLOCK_MAGIC: [u8; 8] = *b"TARNPOOL";
/// 2: store checkpoints (trees + catalog); 1: whole-state checkpoints,
/// still read so `tarn pool upgrade` can convert a pool.
pub const FORMAT_VERSION: u32 = 3;
/// The oldest format a superblock may carry.
pub const OLDEST_READ_VERSION: u32 = 1;
/// Block addresses of the two superblock copies on every device.
pub const SUPERBLOCK_COPIES: [u64; 2] = [0, 16];
/// First block after the reserved label area on every device.
pub const LABEL_BLOCKS: u64 = 32;
pub const MAX_PATH_LEN: usize = 200;
pub const MAX_DEVICE_ENTRIES: usize = 16;
const CRC_OFFSET: usize = 4092;

/// Incompatible features: a reader that does not know a set bit must refuse.
pub mod incompat {
    /// Every block of data has a crc32c held by the metadata that points at
    /// it: Sums ops in the journal, checksummed extents in the checkpoint.
    pub const DATA_CHECKSUMS: u64 = 1 << 0;
    /// Volumes may have snapshots and clones: checkpoint volume records may
    /// carry snapshot sections and origins, the journal ops 6-11.
    pub const SNAPSHOTS: u64 = 1 << 1;
    /// Pool members may be mirrors of 2+ legs: each device table entry
    /// carries a leg list (docs/FORMAT.md §Mirrors).
    pub const MIRRORS: u64 = 1 << 2;
    /// Volumes may name a placement policy: op 15 (VolPlacement) in the
    /// journal, the PLACEMENT flag of catalog volume entries.
    pub const PLACEMENT: u64 = 1 << 3;
    /// Volumes may have a role (file volume, file object): op 16 (VolRole)
    /// in the journal, the ROLE flag of catalog volume entries.
    pub const FILES: u64 = 1 << 4;
    /// Blocks may be moved keeping their birth: op 17 (Relocate) in the
    /// journal (compaction that keeps snapshot sharing).
    pub const RELOCATE: u64 = 1 << 5;
    /// File volumes are versioned: header and inode epochs, object tags
    /// `gN`, retired objects (docs/FORMAT.md *File volumes*). An older
    /// tarn-fs would change objects without tagging them or delete what
    /// a snapshot still reads, so it must not open the pool.
    pub const FS_VERSIONS: u64 = 1 << 6;
    /// Member evacuation (`tarn dev remove`): each device table entry is
    /// followed by a state byte (0 member, 1 draining: allocation avoids
    /// it), and a Relocate (op 17) of a snapshot's dead list may lie past
    /// its volume's current size, inside the snapshot's. A reader without
    /// it would misread the table and refuse such a journal record.
    pub const EVACUATION: u64 = 1 << 7;
    /// Volumes may have quotas and the pool an overcommit ratio: ops 22
    /// (VolQuota) and 23 (PoolOvercommit), the QUOTA flag of catalog volume
    /// entries and the ratio ending the catalog.
    pub const QUOTAS: u64 = 1 << 8;
    /// File volumes have versions of single files: table snapshots named
    /// `~f...`/`~c...`, the header's policy and keep fields, the policy
    /// object (docs/FORMAT.md *File volumes*). An older tarn would list
    /// them as volume snapshots and delete them by name.
    pub const FS_FILE_VERSIONS: u64 = 1 << 9;
    /// Device table entries may be removed slots (state byte 2, with
    /// EVACUATION): `tarn dev remove` took the member out of the pool;
    /// its data area is empty and no device is opened for it. An older
    /// reader would refuse the state byte or look for the device.
    pub const REMOVAL: u64 = 1 << 10;
    /// File volumes keep user extended attributes in two slots at the end
    /// of an inode's object, past the largest file (docs/FORMAT.md *File
    /// volumes*, *Extended attributes*). An older tarn would let a file
    /// grow over them and its truncate would zero them.
    pub const FS_XATTRS: u64 = 1 << 11;
    /// Per-device placement (`tarn dev set --placement`, `vol create
    /// --devices`): each device table entry ends with a policy byte (0
    /// none, else a placement code), op 24 (VolDevices) in the journal and
    /// the DEVICES flag of catalog volume entries. A reader without it
    /// would misread the table and place data on devices a volume excludes.
    pub const DEVICE_PLACEMENT: u64 = 1 << 12;
    /// Data checksums may be coarse: one crc32c per 64 KiB group of 16
    /// physical blocks written whole (op 18 GroupSums, sums entries with
    /// `known` 0; docs/FORMAT.md *Data checksums*). An older reader would
    /// refuse the op and the entries, or read the group unverified.
    pub const COARSE_SUMS: u64 = 1 << 13;
    /// Device table entries may be spares (state byte 3, with EVACUATION):
    /// a labelled device of the pool with an empty data area, taken as a
    /// member when the pool must expand (`tarn dev add --spare`). An older
    /// reader would refuse the state byte or count the device as a member.
    pub const SPARES: u64 = 1 << 14;
    /// Volumes may be striped over members (RAID-0 per volume, `tarn vol
    /// create --stripe`): op 20 (VolStripe), the STRIPE flag of catalog
    /// volume entries. A reader without it would place the volume's new
    /// data anywhere and refuse the op.
    pub const STRIPES: u64 = 1 << 15;
    /// Volumes may keep single parity over members (RAID-5 per volume,
    /// `tarn vol create --parity`): op 21 (VolParity), the PARITY flag of
    /// catalog volume entries, parity units mapped past a volume's data
    /// rows. A reader without it would overwrite in place (a write hole)
    /// and refuse the op.
    pub const PARITY: u64 = 1 << 16;
    /// File volumes keep close versions as 64-byte records in a version
    /// log object named by the header (docs/FORMAT.md *File volumes*,
    /// version records), each reading its object's tag `gN`. An older
    /// tarn would not see them and would delete the tags they read.
    pub const FS_VERSION_RECORDS: u64 = 1 << 17;
    /// A member is being rebuilt from parity rows (`tarn pool replace` of
    /// a parity member): its device table entry has state byte 4 (with
    /// EVACUATION) followed by `rebuilt u64`, the blocks from its start
    /// that its new device holds; the rest of what the pool maps there is
    /// still to be rebuilt. An older reader would read the new device's
    /// unrebuilt blocks as data. Set by the superblock rewrite that starts
    /// a rebuild, cleared by the one that ends the last.
    pub const REBUILD: u64 = 1 << 18;
    /// A snapshot's dead list of at most 8 extents may be kept in its
    /// catalog entry instead of a tree of its own (docs/FORMAT.md
    /// *Catalog*, inline dead lists). An older tarn would refuse the
    /// catalog (an empty root with extents).
    pub const INLINE_DEAD_LISTS: u64 = 1 << 19;
    /// File volumes may hold fifos, sockets and character and block
    /// device nodes: inode and directory entry kinds 4 to 7, a device
    /// number in the inode record (docs/FORMAT.md *File volumes*). An
    /// older tarn would refuse such an inode and the whole directory that
    /// names it as damage.
    pub const FS_SPECIAL_FILES: u64 = 1 << 20;
    /// File volumes' directories are 4 KiB directory blocks, each
    /// checksummed on its own (docs/FORMAT.md *File volumes*, directory
    /// blocks), so a change rewrites the block it touches. An older tarn
    /// would refuse every such directory as damage.
    pub const FS_DIR_BLOCKS: u64 = 1 << 21;
    /// A present member is being copied onto a new device (`tarn pool
    /// replace` of a member that is still there): its device table entry
    /// has state byte 5 (with EVACUATION) followed by `copied u64`, the new
    /// device's `uuid[16]` and its `path` (u16 length, UTF-8), docs/FORMAT.md
    /// *Members being replaced*. An older reader would not know that the
    /// new device, not the old one, is the member once the copy ends, nor
    /// find it. Set by the superblock rewrite that starts a replace,
    /// cleared by the one that ends the last.
    pub const REPLACE: u64 = 1 << 22;
    /// File volumes may keep POSIX access control lists: extended
    /// attribute sets may hold `system.posix_acl_access` and
    /// `system.posix_acl_default`, and inode byte 6 says which an inode
    /// has (docs/FORMAT.md *File volumes*, access control lists). An
    /// older tarn would refuse such a set as damage, and without the
    /// lists it would grant what they deny.
    pub const FS_POSIX_ACLS: u64 = 1 << 23;
    /// Fifos, sockets and device nodes of file volumes may hold an
    /// object (inode bytes 56..60) for their attribute set, and name an
    /// access list in byte 6 (docs/FORMAT.md *File volumes*, access
    /// control lists). An older tarn would refuse such a record as damage.
    pub const FS_SPECIAL_SETS: u64 = 1 << 24;
    /// Features this build understands.
    pub const KNOWN: u64 = SNAPSHOTS
        | DATA_CHECKSUMS
        | MIRRORS
        | PLACEMENT
        | FILES
        | RELOCATE
        | FS_VERSIONS
        | EVACUATION
        | QUOTAS
        | FS_FILE_VERSIONS
        | REMOVAL
        | FS_XATTRS
        | DEVICE_PLACEMENT
        | COARSE_SUMS
        | SPARES
        | STRIPES
        | PARITY
        | FS_VERSION_RECORDS
        | REBUILD
        | INLINE_DEAD_LISTS
        | FS_SPECIAL_FILES
        | FS_DIR_BLOCKS
        | REPLACE
        | FS_POSIX_ACLS
        | FS_SPECIAL_SETS;
}

/// Superblock flag: a pool with mirrors is open for writing (set before its
/// first write, cleared by a clean close). Found set at open, the legs may
/// differ in blocks whose writes a crash cut, so they are resynced.
pub const FLAG_OPEN: u32 = 1;

/// Most legs a mirrored slot may have.
pub const MAX_LEGS: usize = 4;

/// One member device ("slot") as the primary's superblock records it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceEntry {
    pub uuid: [u8; 16],
    pub blocks: u64,
    /// Where the device was last seen (a hint; identity is the uuid).
    pub path: String,
    /// Mirror legs (empty: a single device). Encoded only with MIRRORS.
    pub legs: Vec<LegEntry>,
    /// Being evacuated (`tarn dev remove`): allocation avoids it. Encoded
    /// only with EVACUATION (one byte after the entry); without it, false.
    pub draining: bool,
    /// Taken out of the pool (`tarn dev remove`, last step): an empty
    /// slot kept so that no device index changes meaning. Encoded as state
    /// byte 2, only with REMOVAL; never together with `draining`.
    pub removed: bool,
    /// The device's default placement policy for data on it (volumes
    /// without a policy of their own). Encoded only with DEVICE_PLACEMENT
    /// (one byte, after the state byte); without it, none.
    pub placement: Option<PolicyCode>,
    /// A spare (`tarn dev add --spare`): labelled, data area empty, never
    /// allocated from until taken. Encoded as state byte 3, only with
    /// SPARES; never together with `draining` or `removed`.
    pub spare: bool,
    /// Being rebuilt from parity rows onto a new device (`tarn pool
    /// replace`): blocks [0, n) of the device hold what the member held,
    /// the rest is rebuilt yet. Encoded as state byte 4 followed by `n
    /// u64`, only with REBUILD; never with `draining`, `removed`, `spare`.
    pub rebuilt: Option<u64>,
    /// Being copied onto a new device while still present (`tarn pool
    /// replace` of a present member). Encoded as state byte 5 followed by
    /// the [`Replacement`], only with REPLACE; never with `draining`,
    /// `removed`, `spare`, `rebuilt` nor a leg list, never entry 0.
    pub replacing: Option<Replacement>,
}

/// The new device a present member is being copied onto.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Replacement {
    /// Blocks [0, copied) of the new device hold what the member holds
    /// (the label area is the new device's own).
    pub copied: u64,
    /// The uuid the new device's member label carries; the entry's once
    /// the copy ends.
    pub uuid: [u8; 16],
    /// Where the new device was given (a hint; identity is the uuid).
    pub path: String,
}

/// Whether a mirror leg holds every byte of its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LegState {
    /// Identical to the other in-sync legs: readable.
    #[default]
    InSync = 0,
    /// An I/O error or absence took it out; its content is stale.
    Faulted = 1,
    /// A replacement whose copy did not finish; its content is partial.
    NeedsResilver = 2,
}

impl LegState {
    fn from_u8(v: u8) -> Option<LegState> {
        match v {
            0 => Some(LegState::InSync),
            1 => Some(LegState::Faulted),
            2 => Some(LegState::NeedsResilver),
            _ => None,
        }
    }
}

/// One leg of a mirrored slot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LegEntry {
    /// Matches the leg label on the leg's own device.
    pub uuid: [u8; 16],
    pub state: LegState,
    /// Where the leg was last seen (a hint).
    pub path: String,
}

/// Where the current checkpoint lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckpointRef {
    /// First segment (0 = no checkpoint yet: the pool is empty).
    pub first_segment: u64,
    pub segments: u32,
    pub payload_len: u64,
    pub payload_crc: u32,
    /// Last commit sequence the checkpoint includes.
    pub seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub version: u32,
    pub incompat: u64,
    pub ro_compat: u64,
    pub compat: u64,
    pub pool_uuid: [u8; 16],
    pub device_uuid: [u8; 16],
    pub device_index: u16,
    /// State flags (offset 76, was reserved zero): see [`FLAG_OPEN`].
    pub flags: u32,
    /// Generation: the valid copy with the highest txid is current.
    pub txid: u64,
    pub device_blocks: u64,
    pub data_start: u64,
    pub journal_start: u64,
    pub journal_blocks: u64,
    pub journal_generation: u64,
    pub checkpoint: CheckpointRef,
    pub created_unix: u64,
    /// Only on the primary (index 0): every member, index = position.
    pub devices: Vec<DeviceEntry>,
}

impl Superblock {
    /// Encode for the copy at `copy_block`; the copy records its own address.
    pub fn encode(&self, copy_block: u64) -> Vec<u8> {
        assert!(self.devices.len() <= MAX_DEVICE_ENTRIES);
        let mut w = Writer::with_capacity(BLOCK_SIZE as usize);
        w.bytes(&SUPERBLOCK_MAGIC);
        w.u32(self.version);
        w.u32(BLOCK_SIZE as u32);
        w.u64(self.incompat);
        w.u64(self.ro_compat);
        w.u64(self.compat);
        w.bytes(&self.pool_uuid);
        w.bytes(&self.device_uuid);
        w.u16(self.device_index);
        w.u16(self.devices.len() as u16);
        w.u32(self.flags);
        w.u64(self.txid);
        w.u64(copy_block);
        w.u64(self.device_blocks);
        w.u64(self.data_start);
        w.u64(self.journal_start);
        w.u64(self.journal_blocks);
        w.u64(self.journal_generation);
        w.u64(self.checkpoint.first_segment);
        w.u64(self.checkpoint.payload_len);
        w.u32(self.checkpoint.payload_crc);
        w.u32(self.checkpoint.segments);
        w.u64(self.checkpoint.seq);
        w.u64(self.created_unix);
        debug_assert_eq!(w.len(), 176);
        let mirrors = self.incompat & incompat::MIRRORS != 0;
        for d in &self.devices {
            assert!(d.path.len() <= MAX_PATH_LEN);
            assert!(mirrors || d.legs.is_empty(), "mirror legs need the MIRRORS feature");
            w.bytes(&d.uuid);
            w.u64(d.blocks);
            w.u16(d.path.len() as u16);
            w.bytes(d.path.as_bytes());
            if mirrors {
                encode_legs(&mut w, &d.legs);
            }
            assert!(!d.removed || self.incompat & incompat::REMOVAL != 0, "a removed slot needs REMOVAL");
            assert!(!d.spare || self.incompat & incompat::SPARES != 0, "a spare needs SPARES");
            assert!(d.rebuilt.is_none() || self.incompat & incompat::REBUILD != 0, "a rebuild needs REBUILD");
            if self.incompat & incompat::EVACUATION != 0 {
                w.u8(match () {
                    _ if d.removed => 2,
                    _ if d.spare => 3,
                    _ if d.rebuilt.is_some() => 4,
                    _ if d.replacing.is_some() => 5,
                    _ => u8::from(d.draining),
                });
                if let Some(n) = d.rebuilt {
                    w.u64(n);
                }
                if let Some(r) = &d.replacing {
                    assert!(self.incompat & incompat::REPLACE != 0, "a replace needs REPLACE");
                    assert!(r.path.len() <= MAX_PATH_LEN);
                    w.u64(r.copied);
                    w.bytes(&r.uuid);
                    w.u16(r.path.len() as u16);
                    w.bytes(r.path.as_bytes());
                }
            } else {
                assert!(
                    !d.draining && !d.removed && !d.spare && d.rebuilt.is_none() && d.replacing.is_none(),
                    "a draining member needs the EVACUATION feature"
                );
            }
            if self.incompat & incompat::DEVICE_PLACEMENT != 0 {
                w.u8(d.placement.map_or(0, |p| p as u8));
            } else {
                assert!(d.placement.is_none(), "a device policy needs the DEVICE_PLACEMENT feature");
            }
        }
        seal(&mut w, SALT_SUPERBLOCK, CRC_OFFSET);
        w.buf
    }

    /// Decode and validate the copy read from `copy_block`.
    pub fn decode(buf: &[u8], copy_block: u64) -> Result<Superblock> {
        const WHAT: &str = "superblock";
        let mut r = unseal(buf, &SUPERBLOCK_MAGIC, SALT_SUPERBLOCK, CRC_OFFSET, WHAT)?;
        let version = r.u32()?;
        if !(OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(FormatError::UnsupportedVersion(version));
        }
        let block_size = r.u32()?;
        if u64::from(block_size) != BLOCK_SIZE {
            return Err(r.bad("block_size", u64::from(block_size)));
        }
        let incompat = r.u64()?;
        if incompat & !incompat::KNOWN != 0 {
            return Err(FormatError::UnsupportedFeatures(incompat & !incompat::KNOWN));
        }
        let ro_compat = r.u64()?;
        let compat = r.u64()?;
        let pool_uuid = r.array()?;
        let device_uuid = r.array()?;
        let device_index = r.u16()?;
        let device_count = usize::from(r.u16()?);
        let flags = r.u32()?;
        let txid = r.u64()?;
        let self_block = r.u64()?;
        if self_block != copy_block {
            return Err(FormatError::Misplaced { what: WHAT, stored: self_block, actual: copy_block });
        }
        let mut sb = Superblock {
            version,
            incompat,
            ro_compat,
            compat,
            pool_uuid,
            device_uuid,
            device_index,
            flags,
            txid,
            device_blocks: r.u64()?,
            data_start: r.u64()?,
            journal_start: r.u64()?,
            journal_blocks: r.u64()?,
            journal_generation: r.u64()?,
            checkpoint: CheckpointRef::default(),
            created_unix: 0,
            devices: Vec::new(),
        };
        sb.checkpoint.first_segment = r.u64()?;
        sb.checkpoint.payload_len = r.u64()?;
        sb.checkpoint.payload_crc = r.u32()?;
        sb.checkpoint.segments = r.u32()?;
        sb.checkpoint.seq = r.u64()?;
        sb.created_unix = r.u64()?;
        if device_count > MAX_DEVICE_ENTRIES {
            return Err(r.bad("device_count", device_count as u64));
        }
        for _ in 0..device_count {
            let uuid = r.array()?;
            let blocks = r.u64()?;
            let len = usize::from(r.u16()?);
            if len > MAX_PATH_LEN {
                return Err(r.bad("path_len", len as u64));
            }
            // Strictly UTF-8: a lossy decode could grow past MAX_PATH_LEN
            // and make the next `encode` of this superblock panic.
            let path = String::from_utf8(r.take(len)?.to_vec()).map_err(|_| r.bad("path_utf8", 0))?;
            let legs = if incompat & incompat::MIRRORS != 0 { decode_legs(&mut r)? } else { Vec::new() };
            let mut rebuilt = None;
            let mut replacing = None;
            let (draining, removed, spare) = match incompat & incompat::EVACUATION != 0 {
                false => (false, false, false),
                true => match r.u8()? {
                    0 => (false, false, false),
                    1 => (true, false, false),
                    2 if incompat & incompat::REMOVAL != 0 => (false, true, false),
                    3 if incompat & incompat::SPARES != 0 => (false, false, true),
                    4 if incompat & incompat::REBUILD != 0 => {
                        let n = r.u64()?;
                        if n > blocks {
                            return Err(r.bad("rebuilt", n));
                        }
                        rebuilt = Some(n);
                        (false, false, false)
                    }
                    5 if incompat & incompat::REPLACE != 0 => {
                        replacing = Some(decode_replacement(&mut r, blocks)?);
                        (false, false, false)
                    }
                    v => return Err(r.bad("member_state", u64::from(v))),
                },
            };
            let placement = match incompat & incompat::DEVICE_PLACEMENT != 0 {
                false => None,
                true => match r.u8()? {
                    0 => None,
                    b => Some(PolicyCode::from_byte(b).ok_or_else(|| r.bad("device placement", u64::from(b)))?),
                },
            };
            sb.devices.push(DeviceEntry {
                uuid,
                blocks,
                path,
                legs,
                draining,
                removed,
                placement,
                spare,
                rebuilt,
                replacing,
            });
        }
        sb.validate()?;
        Ok(sb)
    }

    /// Cross-field checks that hold for every valid superblock.
    fn validate(&self) -> Result<()> {
        let bad = |field, value| FormatError::BadField { what: "superblock", field, value };
        // Block numbers are 48 bits (see address.rs): a larger device cannot
        // be addressed, and its byte offsets would overflow.
        if self.device_blocks > BLOCK_MASK + 1 {
            return Err(bad("device_blocks", self.device_blocks));
        }
        if let Some(d) = self.devices.iter().find(|d| d.blocks > BLOCK_MASK + 1) {
            return Err(bad("device_table_blocks", d.blocks));
        }
        if self.data_start < crate::superblock::LABEL_BLOCKS || self.data_start > self.device_blocks {
            return Err(bad("data_start", self.data_start));
        }
        if self.journal_blocks > 0 {
            let end = self
                .journal_start
                .checked_add(self.journal_blocks)
                .ok_or(bad("journal_blocks", self.journal_blocks))?;
            if self.journal_start < LABEL_BLOCKS || end > self.data_start {
                return Err(bad("journal_start", self.journal_start));
            }
        }
        if self.checkpoint.first_segment != 0 && self.checkpoint.segments == 0 {
            return Err(bad("checkpoint_segments", 0));
        }
        if self.device_index == 0 && self.devices.is_empty() {
            return Err(bad("device_count", 0));
        }
        // Removed slots, spares and rebuilds are a state byte, which only
        // EVACUATION encodes.
        let states = incompat::REMOVAL | incompat::SPARES | incompat::REBUILD | incompat::REPLACE;
        if self.incompat & states != 0 && self.incompat & incompat::EVACUATION == 0 {
            return Err(bad("incompat", self.incompat));
        }
        // The primary holds the journal: its slot is never removed nor a spare.
        if let Some(d) = self.devices.first().filter(|d| d.removed || d.spare) {
            return Err(bad("member_state", if d.removed { 2 } else { 3 }));
        }
        // Nor rebuilt: the pool cannot open without its journal.
        if self.devices.first().is_some_and(|d| d.rebuilt.is_some()) {
            return Err(bad("member_state", 4));
        }
        // A rebuilt member is one plain device.
        if self.devices.iter().any(|d| d.rebuilt.is_some() && !d.legs.is_empty()) {
            return Err(bad("member_state", 4));
        }
        // Nor replaced (its journal is not copied), and a replaced member
        // is one plain device.
        if self.devices.iter().enumerate().any(|(i, d)| d.replacing.is_some() && (i == 0 || !d.legs.is_empty())) {
            return Err(bad("member_state", 5));
        }
        // A spare holds no leg list: it is one device.
        if self.devices.iter().any(|d| d.spare && !d.legs.is_empty()) {
            return Err(bad("member_state", 3));
        }
        Ok(())
    }

    /// Bytes the encoding takes before the crc; at most 4092 fits.
    pub fn encoded_len(&self) -> usize {
        let legs = |d: &DeviceEntry| 1 + d.legs.iter().map(|l| 19 + l.path.len()).sum::<usize>();
        let mirrors = self.incompat & incompat::MIRRORS != 0;
        let state = usize::from(self.incompat & incompat::EVACUATION != 0)
            + usize::from(self.incompat & incompat::DEVICE_PLACEMENT != 0);
        let cursor = |d: &DeviceEntry| {
            if d.rebuilt.is_some() {
                8
            } else {
                d.replacing.as_ref().map_or(0, |r| 8 + 16 + 2 + r.path.len())
            }
        };
        176 + self
            .devices
            .iter()
            .map(|d| 26 + d.path.len() + state + cursor(d) + if mirrors { legs(d) } else { 0 })
            .sum::<usize>()
    }

    /// Whether the device table fits in the superblock.
    pub fn fits(&self) -> bool {
        self.encoded_len() <= CRC_OFFSET && self.devices.len() <= MAX_DEVICE_ENTRIES
    }

    pub fn is_primary(&self) -> bool {
        self.device_index == 0
    }

    pub fn first_segment(&self) -> Option<Pba> {
        (self.checkpoint.first_segment != 0).then_some(Pba(self.checkpoint.first_segment))
    }
}

/// State 5's tail: `copied u64` (at most the member's `blocks`), the new
/// device's `uuid[16]`, `path_len u16` and its UTF-8 path.
fn decode_replacement(r: &mut crate::codec::Reader<'_>, blocks: u64) -> Result<Replacement> {
    let copied = r.u64()?;
    if copied > blocks {
        return Err(r.bad("copied", copied));
    }
    let uuid = r.array()?;
    let len = usize::from(r.u16()?);
    if len > MAX_PATH_LEN {
        return Err(r.bad("replacement path_len", len as u64));
    }
    let path = String::from_utf8(r.take(len)?.to_vec()).map_err(|_| r.bad("replacement path_utf8", 0))?;
    Ok(Replacement { copied, uuid, path })
}

/// `leg_count u8` (0 or 2..=MAX_LEGS), then per leg `uuid[16]`, `state u8`,
/// `path_len u16`, `path`.
fn encode_legs(w: &mut Writer, legs: &[LegEntry]) {
    assert!(legs.is_empty() || (2..=MAX_LEGS).contains(&legs.len()));
    w.u8(legs.len() as u8);
    for l in legs {
        assert!(l.path.len() <= MAX_PATH_LEN);
        w.bytes(&l.uuid);
        w.u8(l.state as u8);
        w.u16(l.path.len() as u16);
        w.bytes(l.path.as_bytes());
    }
}

fn decode_legs(r: &mut crate::codec::Reader<'_>) -> Result<Vec<LegEntry>> {
    let count = usize::from(r.u8()?);
    if count == 1 || count > MAX_LEGS {
        return Err(r.bad("leg_count", count as u64));
    }
    let mut legs = Vec::with_capacity(count);
    for _ in 0..count {
        let uuid = r.array()?;
        let raw = r.u8()?;
        let state = LegState::from_u8(raw).ok_or_else(|| r.bad("leg_state", u64::from(raw)))?;
        let len = usize::from(r.u16()?);
        if len > MAX_PATH_LEN {
            return Err(r.bad("leg path_len", len as u64));
        }
        let path = String::from_utf8(r.take(len)?.to_vec()).map_err(|_| r.bad("leg_path_utf8", 0))?;
        legs.push(LegEntry { uuid, state, path });
    }
    Ok(legs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A superblock image changed by a test, its checksum made right
    /// again so that decode reaches the check under test.
    fn reseal(mut bad: Vec<u8>) -> Vec<u8> {
        let crc = crate::checksum::checksum(SALT_SUPERBLOCK, &bad[..CRC_OFFSET]);
        bad[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        bad
    }

    pub fn sample() -> Superblock {
        Superblock {
            version: FORMAT_VERSION,
            incompat: 0,
            ro_compat: 0,
            compat: 0,
            pool_uuid: [1; 16],
            device_uuid: [2; 16],
            device_index: 0,
            flags: 0,
            txid: 7,
            device_blocks: 1 << 20,
            data_start: 1000,
            journal_start: 32,
            journal_blocks: 900,
            journal_generation: 3,
            checkpoint: CheckpointRef {
                first_segment: 5000,
                segments: 2,
                payload_len: 9000,
                payload_crc: 0xabcd,
                seq: 41,
            },
            created_unix: 1_700_000_000,
            devices: vec![DeviceEntry {
                uuid: [2; 16],
                blocks: 1 << 20,
                path: "/tmp/pool.img".into(),
                legs: Vec::new(),
                draining: false,
                removed: false,
                placement: None,
                spare: false,
                rebuilt: None,
                replacing: None,
            }],
        }
    }

    #[test]
    fn round_trips_and_knows_its_copy() {
        let sb = sample();
        let bytes = sb.encode(16);
        assert_eq!(bytes.len(), 4096);
        assert_eq!(Superblock::decode(&bytes, 16).unwrap(), sb);
        assert!(matches!(Superblock::decode(&bytes, 0), Err(FormatError::Misplaced { .. })));
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(" ")
    }

    /// Pins the whole encoding of a superblock (copy 16 of the primary of a
    /// pool with SNAPSHOTS and DATA_CHECKSUMS, one device): every field,
    /// the device table, the zero fill and the crc. A change here is a
    /// format change (docs/FORMAT.md, version log). The hex was not copied
    /// from the encoder: scripts/golden_format.py builds it from the field
    /// tables of docs/FORMAT.md (and its own CRC-32C) and prints it.
    #[test]
    fn golden_superblock_bytes() {
        let sb = Superblock {
            version: FORMAT_VERSION,
            incompat: incompat::DATA_CHECKSUMS | incompat::SNAPSHOTS,
            ro_compat: 0,
            compat: 0,
            pool_uuid: [0x11; 16],
            device_uuid: [0x22; 16],
            device_index: 0,
            flags: 0,
            txid: 9,
            device_blocks: 0x40000,
            data_start: 96,
            journal_start: 32,
            journal_blocks: 64,
            journal_generation: 5,
            checkpoint: CheckpointRef {
                first_segment: 700,
                segments: 2,
                payload_len: 5000,
                payload_crc: 0xdead_beef,
                seq: 41,
            },
            created_unix: 1_700_000_000,
            devices: vec![DeviceEntry {
                uuid: [0x22; 16],
                blocks: 0x40000,
                path: "/dev/sdb1".into(),
                legs: Vec::new(),
                draining: false,
                removed: false,
                placement: None,
                spare: false,
                rebuilt: None,
                replacing: None,
            }],
        };
        let bytes = sb.encode(16);
        let fields = [
            "54 41 52 4e 50 4f 4f 4c",                         // 0 magic "TARNPOOL"
            "03 00 00 00",                                     // 8 version 3
            "00 10 00 00",                                     // 12 block_size 4096
            "03 00 00 00 00 00 00 00",                         // 16 incompat: DATA_CHECKSUMS | SNAPSHOTS
            "00 00 00 00 00 00 00 00",                         // 24 ro_compat
            "00 00 00 00 00 00 00 00",                         // 32 compat
            "11 11 11 11 11 11 11 11 11 11 11 11 11 11 11 11", // 40 pool_uuid
            "22 22 22 22 22 22 22 22 22 22 22 22 22 22 22 22", // 56 device_uuid
            "00 00",                                           // 72 device_index 0 (primary)
            "01 00",                                           // 74 device_count 1
            "00 00 00 00",                                     // 76 flags
            "09 00 00 00 00 00 00 00",                         // 80 txid 9
            "10 00 00 00 00 00 00 00",                         // 88 self_block 16
            "00 00 04 00 00 00 00 00",                         // 96 device_blocks 2^18
            "60 00 00 00 00 00 00 00",                         // 104 data_start 96
            "20 00 00 00 00 00 00 00",                         // 112 journal_start 32
            "40 00 00 00 00 00 00 00",                         // 120 journal_blocks 64
            "05 00 00 00 00 00 00 00",                         // 128 journal_generation 5
            "bc 02 00 00 00 00 00 00",                         // 136 checkpoint_pba 700
            "88 13 00 00 00 00 00 00",                         // 144 checkpoint_len 5000
            "ef be ad de",                                     // 152 checkpoint_crc
            "02 00 00 00",                                     // 156 checkpoint_segments 2
            "29 00 00 00 00 00 00 00",                         // 160 checkpoint_seq 41
            "00 f1 53 65 00 00 00 00",                         // 168 created_unix 1.7e9
            "22 22 22 22 22 22 22 22 22 22 22 22 22 22 22 22", // 176 table[0].uuid
            "00 00 04 00 00 00 00 00",                         // 192 table[0].blocks 2^18
            "09 00",                                           // 200 table[0].path_len 9
            "2f 64 65 76 2f 73 64 62 31",                      // 202 table[0].path "/dev/sdb1"
        ]
        .join(" ");
        assert_eq!(hex(&bytes[..211]), fields);
        assert!(bytes[211..4092].iter().all(|&b| b == 0), "zero up to the crc");
        assert_eq!(hex(&bytes[4092..]), "bc 95 be f2", "SUPB crc32c of bytes 0..4092");
        assert_eq!(Superblock::decode(&bytes, 16).unwrap(), sb);
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let bytes = sample().encode(0);
        for i in (0..4096).step_by(7) {
            let mut b = bytes.clone();
            b[i] ^= 0x10;
            assert!(Superblock::decode(&b, 0).is_err(), "flip at byte {i} not detected");
        }
    }

    /// Found by fuzz/format_superblock: a 200-byte path of invalid UTF-8
    /// was decoded lossily into 600 bytes, and encoding it again panicked.
    #[test]
    fn path_that_is_not_utf8_is_refused() {
        let mut sb = sample();
        sb.devices[0].path = "x".repeat(MAX_PATH_LEN);
        let mut bytes = sb.encode(0);
        let path_at = 176 + 16 + 8 + 2;
        bytes[path_at..path_at + MAX_PATH_LEN].fill(0xff);
        let crc = crate::checksum::checksum(SALT_SUPERBLOCK, &bytes[..CRC_OFFSET]);
        bytes[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        let err = Superblock::decode(&bytes, 0).unwrap_err();
        assert!(matches!(err, FormatError::BadField { field: "path_utf8", .. }), "{err}");
    }

    /// Found by fuzz/engine_open: a checksummed superblock with a journal
    /// start near 2^60 blocks passed validation, and the engine's byte
    /// offset `block * 4096` overflowed.
    #[test]
    fn device_beyond_48_bit_block_numbers_is_refused() {
        let mut sb = sample();
        sb.device_blocks = 1 << 60;
        sb.data_start = 1 << 59;
        sb.journal_start = 1 << 58;
        let err = Superblock::decode(&sb.encode(0), 0).unwrap_err();
        assert!(matches!(err, FormatError::BadField { field: "device_blocks", .. }), "{err}");
        let mut sb = sample();
        sb.devices[0].blocks = u64::MAX;
        let err = Superblock::decode(&sb.encode(0), 0).unwrap_err();
        assert!(matches!(err, FormatError::BadField { field: "device_table_blocks", .. }), "{err}");
        let mut sb = sample();
        sb.device_blocks = BLOCK_MASK + 1;
        assert!(Superblock::decode(&sb.encode(0), 0).is_ok());
    }

    #[test]
    fn mirror_legs_round_trip_only_with_the_feature() {
        let mut sb = sample();
        let legs = vec![
            LegEntry { uuid: [3; 16], state: LegState::InSync, path: "/a.img".into() },
            LegEntry { uuid: [4; 16], state: LegState::Faulted, path: "/b.img".into() },
        ];
        sb.devices[0].legs = legs;
        sb.incompat = incompat::SNAPSHOTS | incompat::MIRRORS;
        let bytes = sb.encode(0);
        assert_eq!(sb.encoded_len(), 176 + 26 + 13 + 1 + 2 * 19 + 12);
        let back = Superblock::decode(&bytes, 0).unwrap();
        assert_eq!(back, sb);
        // leg_count right after the entry's path: a single-leg mirror is invalid.
        let mut bad = bytes.clone();
        bad[176 + 26 + 13] = 1;
        assert!(Superblock::decode(&bad, 0).is_err());
        // Without the feature the same pool encodes exactly as before.
        let mut plain = sample();
        plain.incompat = incompat::SNAPSHOTS;
        assert_eq!(plain.encoded_len(), 176 + 26 + 13);
        assert_eq!(Superblock::decode(&plain.encode(0), 0).unwrap().devices[0].legs, vec![]);
    }

    #[test]
    fn unknown_incompatible_feature_is_refused() {
        let mut sb = sample();
        sb.incompat = 1 << 40;
        assert!(matches!(Superblock::decode(&sb.encode(0), 0), Err(FormatError::UnsupportedFeatures(_))));
        // Bits 0-24 are known here; bit 25 is not.
        sb.incompat = 1 << 25;
        assert!(matches!(Superblock::decode(&sb.encode(0), 0), Err(FormatError::UnsupportedFeatures(_))));
        assert_eq!(incompat::KNOWN, (1 << 25) - 1);
        assert_eq!(incompat::REPLACE, 1 << 22);
        assert_eq!(incompat::COARSE_SUMS, 1 << 13);
        sb.incompat = incompat::COARSE_SUMS;
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0, 0x20, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Superblock::decode(&b, 0).unwrap().incompat, 1 << 13);
        sb.incompat = incompat::PARITY;
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0, 0, 1, 0, 0, 0, 0, 0]);
        assert_eq!(Superblock::decode(&b, 0).unwrap().incompat, 1 << 16);
        assert_eq!(incompat::SPARES, 1 << 14);
        sb.incompat = incompat::STRIPES;
        assert_eq!(incompat::STRIPES, 1 << 15);
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0, 0x80, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Superblock::decode(&b, 0).unwrap().incompat, 1 << 15);
        assert_eq!(incompat::REMOVAL, 1 << 10);
        sb.incompat = incompat::QUOTAS;
        assert_eq!(Superblock::decode(&sb.encode(0), 0).unwrap().incompat, 1 << 8);
        sb.incompat = incompat::FS_VERSIONS;
        assert_eq!(incompat::FS_VERSIONS, 1 << 6);
        assert_eq!(Superblock::decode(&sb.encode(0), 0).unwrap().incompat, 1 << 6);
        sb.incompat = incompat::FS_FILE_VERSIONS;
        assert_eq!(incompat::FS_FILE_VERSIONS, 1 << 9);
        assert_eq!(Superblock::decode(&sb.encode(0), 0).unwrap().incompat, 1 << 9);
        sb.incompat = incompat::FS_XATTRS;
        assert_eq!(incompat::FS_XATTRS, 1 << 11);
        assert_eq!(Superblock::decode(&sb.encode(0), 0).unwrap().incompat, 1 << 11);
    }

    /// Incompat bit 17 (FS_VERSION_RECORDS, docs/FORMAT.md): byte 18 of
    /// the superblock is 0x02, and this build opens it.
    #[test]
    fn golden_fs_version_records_bit() {
        let mut sb = sample();
        sb.incompat = incompat::FS_VERSION_RECORDS;
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0, 0, 0x02, 0, 0, 0, 0, 0]);
        assert_eq!(Superblock::decode(&b, 0).unwrap().incompat, incompat::FS_VERSION_RECORDS);
    }

    /// Incompat bit 19 (INLINE_DEAD_LISTS, docs/FORMAT.md): byte 18 of
    /// the superblock is 0x08, and this build opens it.
    #[test]
    fn golden_inline_dead_lists_bit() {
        let mut sb = sample();
        sb.incompat = incompat::INLINE_DEAD_LISTS;
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0, 0, 0x08, 0, 0, 0, 0, 0]);
        assert_eq!(Superblock::decode(&b, 0).unwrap().incompat, incompat::INLINE_DEAD_LISTS);
    }

    /// Incompat bit 11 (FS_XATTRS, docs/FORMAT.md): byte 17 of the
    /// superblock is 0x08, and this build opens it.
    #[test]
    fn golden_fs_xattrs_bit() {
        let mut sb = sample();
        sb.incompat = incompat::FS_XATTRS;
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0, 0x08, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Superblock::decode(&b, 0).unwrap().incompat, incompat::FS_XATTRS);
    }

    /// Incompat bit 20 (FS_SPECIAL_FILES, docs/FORMAT.md): byte 18 of the
    /// superblock is 0x10, and this build opens it.
    #[test]
    fn golden_fs_special_files_bit() {
        let mut sb = sample();
        sb.incompat = incompat::FS_SPECIAL_FILES;
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0, 0, 0x10, 0, 0, 0, 0, 0]);
        assert_eq!(Superblock::decode(&b, 0).unwrap().incompat, incompat::FS_SPECIAL_FILES);
    }

    /// Incompat bit 21 (FS_DIR_BLOCKS, docs/FORMAT.md): byte 18 of the
    /// superblock is 0x20, and this build opens it.
    #[test]
    fn golden_fs_dir_blocks_bit() {
        let mut sb = sample();
        sb.incompat = incompat::FS_DIR_BLOCKS;
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0, 0, 0x20, 0, 0, 0, 0, 0]);
        assert_eq!(Superblock::decode(&b, 0).unwrap().incompat, incompat::FS_DIR_BLOCKS);
    }

    /// Incompat bit 23 (FS_POSIX_ACLS, docs/FORMAT.md): byte 18 of the
    /// superblock is 0x80, and this build opens it.
    #[test]
    fn golden_fs_posix_acls_bit() {
        let mut sb = sample();
        sb.incompat = incompat::FS_POSIX_ACLS;
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0, 0, 0x80, 0, 0, 0, 0, 0]);
        assert_eq!(Superblock::decode(&b, 0).unwrap().incompat, incompat::FS_POSIX_ACLS);
    }

    /// Incompat bit 24 (FS_SPECIAL_SETS, docs/FORMAT.md): byte 19 of the
    /// superblock is 0x01, and this build opens it.
    #[test]
    fn golden_fs_special_sets_bit() {
        let mut sb = sample();
        sb.incompat = incompat::FS_SPECIAL_SETS;
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0, 0, 0, 0x01, 0, 0, 0, 0]);
        assert_eq!(Superblock::decode(&b, 0).unwrap().incompat, incompat::FS_SPECIAL_SETS);
    }

    /// Incompat bit 12 (DEVICE_PLACEMENT, docs/FORMAT.md): a policy byte
    /// ends each device entry, after the state byte when EVACUATION is on.
    #[test]
    fn golden_device_placement_byte() {
        let mut sb = sample();
        sb.incompat = incompat::DEVICE_PLACEMENT | incompat::EVACUATION;
        sb.devices[0].placement = Some(PolicyCode::Append);
        sb.devices.push(DeviceEntry { uuid: [3; 16], blocks: 4096, path: "d1".into(), ..Default::default() });
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0x80, 0x10, 0, 0, 0, 0, 0, 0]);
        // Entry 0: uuid, blocks, path_len 13, "/tmp/pool.img", state 0,
        // policy 3 (append); entry 1: ..., "d1", state 0, policy 0 (none).
        let e0 = 176 + 16 + 8 + 2 + 13;
        assert_eq!(&b[e0..e0 + 2], &[0, 3]);
        let e1 = e0 + 2;
        assert_eq!(&b[e1 + 24..e1 + 30], &[2, 0, b'd', b'1', 0, 0]);
        assert_eq!(sb.encoded_len(), e1 + 30);
        assert_eq!(Superblock::decode(&b, 0).unwrap(), sb);
        // An unknown policy byte is refused.
        let mut raw = b.clone();
        raw[e0 + 1] = 9;
        let crc = crate::checksum::checksum(SALT_SUPERBLOCK, &raw[..CRC_OFFSET]);
        raw[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        assert!(Superblock::decode(&raw, 0).is_err());
        // Without the feature the entries have no policy byte.
        let mut plain = sample();
        plain.incompat = incompat::EVACUATION;
        assert_eq!(plain.encoded_len(), 176 + 26 + 13 + 1);
    }

    /// Incompat bit 7 (EVACUATION, docs/FORMAT.md): byte 16 of the
    /// superblock is 0x80, and this build opens it.
    #[test]
    fn golden_evacuation_bit() {
        let mut sb = sample();
        sb.incompat = incompat::EVACUATION | incompat::RELOCATE;
        sb.devices.push(DeviceEntry {
            uuid: [3; 16],
            blocks: 4096,
            path: "d1".into(),
            legs: Vec::new(),
            draining: true,
            removed: false,
            placement: None,
            spare: false,
            rebuilt: None,
            replacing: None,
        });
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0xA0, 0, 0, 0, 0, 0, 0, 0]);
        // Entry 0: uuid, blocks, path_len 13, "/tmp/pool.img", state 0;
        // entry 1: uuid, blocks, path_len 2, "d1", state 1; then zeros.
        let e0 = 176 + 16 + 8 + 2 + 13;
        assert_eq!(b[e0], 0);
        let e1 = e0 + 1;
        assert_eq!(&b[e1..e1 + 16], &[3; 16]);
        assert_eq!(&b[e1 + 16..e1 + 24], &4096u64.to_le_bytes());
        assert_eq!(&b[e1 + 24..e1 + 28], &[2, 0, b'd', b'1']);
        assert_eq!(b[e1 + 28], 1);
        assert_eq!(b[e1 + 29], 0);
        assert_eq!(sb.encoded_len(), e1 + 29);
        let back = Superblock::decode(&b, 0).unwrap();
        assert_eq!(back, sb);
        // Any other state byte is refused.
        let mut bad = b.clone();
        bad[e1 + 28] = 2;
        let crc = crate::checksum::checksum(SALT_SUPERBLOCK, &bad[..CRC_OFFSET]);
        bad[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        assert!(Superblock::decode(&bad, 0).is_err());
        // Without the feature the table has no state bytes.
        sb.incompat = incompat::RELOCATE;
        sb.devices[1].draining = false;
        assert_eq!(sb.encoded_len(), e1 + 27);
    }

    /// Incompat bit 10 (REMOVAL, docs/FORMAT.md): byte 17 of the
    /// superblock is 0x04 and a removed slot's state byte is 2.
    #[test]
    fn golden_removal_state() {
        let mut sb = sample();
        sb.incompat = incompat::EVACUATION | incompat::REMOVAL;
        sb.devices.push(DeviceEntry {
            uuid: [3; 16],
            blocks: 4096,
            path: "d1".into(),
            removed: true,
            ..Default::default()
        });
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0x80, 0x04, 0, 0, 0, 0, 0, 0]);
        let e1 = 176 + 16 + 8 + 2 + 13 + 1;
        assert_eq!(&b[e1..e1 + 16], &[3; 16]);
        assert_eq!(&b[e1 + 24..e1 + 28], &[2, 0, b'd', b'1']);
        assert_eq!(b[e1 + 28], 2);
        assert_eq!(b[e1 + 29], 0);
        assert_eq!(Superblock::decode(&b, 0).unwrap(), sb);
        // State 2 without REMOVAL is refused (an EVACUATION-only reader's view).
        let mut bad = b.clone();
        bad[17] = 0;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // State 3 is no state.
        let mut bad = b.clone();
        bad[e1 + 28] = 3;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // REMOVAL without EVACUATION is refused (no state bytes to carry it).
        let mut bad = b.clone();
        bad[16] = 0;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // The primary's slot is never removed.
        let mut p = sb.clone();
        p.devices[0].removed = true;
        assert!(Superblock::decode(&p.encode(0), 0).is_err());
    }

    /// Incompat bit 14 (SPARES, docs/FORMAT.md): byte 17 of the
    /// superblock is 0x40 and a spare's state byte is 3.
    #[test]
    fn golden_spare_state() {
        let mut sb = sample();
        sb.incompat = incompat::EVACUATION | incompat::SPARES;
        sb.devices.push(DeviceEntry {
            uuid: [3; 16],
            blocks: 4096,
            path: "d1".into(),
            spare: true,
            ..Default::default()
        });
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0x80, 0x40, 0, 0, 0, 0, 0, 0]);
        let e1 = 176 + 16 + 8 + 2 + 13 + 1;
        assert_eq!(&b[e1..e1 + 16], &[3; 16]);
        assert_eq!(&b[e1 + 16..e1 + 24], &4096u64.to_le_bytes());
        assert_eq!(&b[e1 + 24..e1 + 28], &[2, 0, b'd', b'1']);
        assert_eq!(b[e1 + 28], 3);
        assert_eq!(b[e1 + 29], 0);
        assert_eq!(Superblock::decode(&b, 0).unwrap(), sb);
        // State 3 without SPARES is refused (an EVACUATION-only reader's view).
        let mut bad = b.clone();
        bad[17] = 0;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // SPARES without EVACUATION is refused (no state bytes to carry it).
        let mut bad = b.clone();
        bad[16] = 0;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // State 4 is no state.
        let mut bad = b.clone();
        bad[e1 + 28] = 4;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // The primary is never a spare.
        let mut p = sb.clone();
        p.devices[0].spare = true;
        assert!(Superblock::decode(&p.encode(0), 0).is_err());
    }

    /// Incompat bit 18 (REBUILD, docs/FORMAT.md): byte 18 of the
    /// superblock is 0x04 and a member being rebuilt has state byte 4 and
    /// then its `rebuilt` count, u64 little-endian.
    #[test]
    fn golden_rebuild_state() {
        let mut sb = sample();
        sb.incompat = incompat::EVACUATION | incompat::REBUILD;
        sb.devices.push(DeviceEntry {
            uuid: [3; 16],
            blocks: 4096,
            path: "d1".into(),
            rebuilt: Some(0x0123),
            ..Default::default()
        });
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0x80, 0, 0x04, 0, 0, 0, 0, 0]);
        let e1 = 176 + 16 + 8 + 2 + 13 + 1;
        assert_eq!(&b[e1..e1 + 16], &[3; 16]);
        assert_eq!(&b[e1 + 24..e1 + 28], &[2, 0, b'd', b'1']);
        assert_eq!(b[e1 + 28], 4);
        assert_eq!(&b[e1 + 29..e1 + 37], &[0x23, 0x01, 0, 0, 0, 0, 0, 0]);
        assert_eq!(b[e1 + 37], 0);
        assert_eq!(sb.encoded_len(), e1 + 37);
        assert_eq!(Superblock::decode(&b, 0).unwrap(), sb);
        // State 4 without REBUILD is refused (an older reader's view).
        let mut bad = b.clone();
        bad[18] = 0;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // REBUILD without EVACUATION is refused (no state bytes to carry it).
        let mut bad = b.clone();
        bad[16] = 0;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // A count past the device's blocks is refused.
        let mut bad = b.clone();
        bad[e1 + 30] = 0x20;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // The primary is never rebuilt.
        let mut p = sb.clone();
        p.devices[0].rebuilt = Some(0);
        assert!(Superblock::decode(&p.encode(0), 0).is_err());
    }

    /// Incompat bit 22 (REPLACE, docs/FORMAT.md): byte 18 of the
    /// superblock is 0x40 and a member being replaced has state byte 5,
    /// then `copied` (u64 little-endian), the new device's uuid and its
    /// path (u16 length, bytes).
    #[test]
    fn golden_replace_state() {
        let mut sb = sample();
        sb.incompat = incompat::EVACUATION | incompat::REPLACE;
        let replacing = Replacement { copied: 0x0123, uuid: [7; 16], path: "n1".into() };
        sb.devices.push(DeviceEntry {
            uuid: [3; 16],
            blocks: 4096,
            path: "d1".into(),
            replacing: Some(replacing),
            ..Default::default()
        });
        let b = sb.encode(0);
        assert_eq!(&b[16..24], &[0x80, 0, 0x40, 0, 0, 0, 0, 0]);
        let e1 = 176 + 16 + 8 + 2 + 13 + 1;
        assert_eq!(&b[e1..e1 + 16], &[3; 16]);
        assert_eq!(&b[e1 + 24..e1 + 28], &[2, 0, b'd', b'1']);
        assert_eq!(b[e1 + 28], 5);
        assert_eq!(&b[e1 + 29..e1 + 37], &[0x23, 0x01, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[e1 + 37..e1 + 53], &[7; 16]);
        assert_eq!(&b[e1 + 53..e1 + 57], &[2, 0, b'n', b'1']);
        assert_eq!(b[e1 + 57], 0);
        assert_eq!(sb.encoded_len(), e1 + 57);
        assert_eq!(Superblock::decode(&b, 0).unwrap(), sb);
        // State 5 without REPLACE is refused (an older reader's view).
        let mut bad = b.clone();
        bad[18] = 0;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // REPLACE without EVACUATION is refused (no state bytes to carry it).
        let mut bad = b.clone();
        bad[16] = 0;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // A count past the device's blocks is refused.
        let mut bad = b.clone();
        bad[e1 + 30] = 0x20;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // A path longer than the rest of the superblock is refused.
        let mut bad = b.clone();
        bad[e1 + 54] = 0x10;
        assert!(Superblock::decode(&reseal(bad), 0).is_err());
        // The primary is never replaced this way.
        let mut p = sb.clone();
        p.devices[0].replacing = p.devices[1].replacing.clone();
        assert!(Superblock::decode(&p.encode(0), 0).is_err());
    }
}
