//! The inode table: fixed 256-byte records at `ino * 256` of the file
//! volume's own map (docs/FORMAT.md *File volumes*). Record 0 is the
//! file volume's header; a record of zeros (a hole) is a free inode.
//! Every record carries a crc32c: what is read is never trusted.

use crate::error::{FsError, Result};
use crate::namespace::acl::{HAS_ACCESS, HAS_DEFAULT};
use tarn_format::checksum::crc32c;

pub const RECORD: usize = 256;
const CRC_AT: usize = RECORD - 4;
const INODE_MAGIC: &[u8; 4] = b"TFSI";
const HEADER_MAGIC: &[u8; 4] = b"TFSH";
pub const VERSION: u8 = 1;
/// Longest symlink target kept in the record itself; longer ones get an object.
pub const INLINE_TARGET: usize = 160;
const TARGET_AT: usize = 82;

/// What an inode is (the `kind` byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File = 1,
    Dir = 2,
    Symlink = 3,
    /// Special files (FS_SPECIAL_FILES): no data, no object; the kernel
    /// serves their opens itself.
    Fifo = 4,
    Socket = 5,
    CharDev = 6,
    BlockDev = 7,
}

impl Kind {
    const ALL: [Kind; 7] =
        [Kind::File, Kind::Dir, Kind::Symlink, Kind::Fifo, Kind::Socket, Kind::CharDev, Kind::BlockDev];

    pub(crate) fn from_byte(b: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| *k as u8 == b)
    }

    /// The S_IFMT bits of st_mode.
    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => libc::S_IFREG,
            Kind::Dir => libc::S_IFDIR,
            Kind::Symlink => libc::S_IFLNK,
            Kind::Fifo => libc::S_IFIFO,
            Kind::Socket => libc::S_IFSOCK,
            Kind::CharDev => libc::S_IFCHR,
            Kind::BlockDev => libc::S_IFBLK,
        }
    }

    /// The kind of st_mode's S_IFMT bits (None: not a kind kept here).
    pub fn of_mode(mode: u32) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.mode_bits() == mode & libc::S_IFMT)
    }

    /// A fifo, socket or device node (FS_SPECIAL_FILES).
    pub fn is_special(self) -> bool {
        self as u8 >= Kind::Fifo as u8
    }

    /// A node that carries a device number.
    pub fn is_device(self) -> bool {
        matches!(self, Kind::CharDev | Kind::BlockDev)
    }
}

/// One inode as stored. Times are nanoseconds since the Unix epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    pub ino: u64,
    pub kind: Kind,
    /// Permission bits (07777); the type is `kind`.
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    /// The engine object holding the data (0: none yet, or an inline symlink).
    pub object: u32,
    /// The volume epoch the inode was last changed in (versioning, later
    /// slices: the first change after epoch E snapshots the object).
    pub epoch: u64,
    /// A directory's parent (its `..`); 0 for other kinds.
    pub parent: u64,
    /// A symlink target of at most INLINE_TARGET bytes (else in `object`).
    pub target: Vec<u8>,
    /// A device node's number (the kernel's encoding, as FUSE carries
    /// it); 0 for other kinds.
    pub rdev: u32,
    /// The access control lists in its attribute set (`acl.rs`
    /// HAS_ACCESS, HAS_DEFAULT; FS_POSIX_ACLS): a check of a list needs
    /// no read of the set when the inode has none.
    pub acl: u8,
}

/// The file volume's header, record 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The next inode number to hand out (numbers are never reused).
    pub next_ino: u64,
    /// Bytes the volume may allocate (0: no quota).
    pub quota: u64,
    /// The volume's current epoch (no volume snapshots yet: 0): the
    /// number of the latest volume snapshot or file version.
    pub epoch: u64,
    /// The object holding the close-version policy (0: no policy).
    pub policy: u32,
    /// Close versions kept per file (0: the default, `DEFAULT_KEEP`).
    pub keep: u32,
    /// The version log object holding close version records (0: none
    /// yet; FS_VERSION_RECORDS, `vrecord.rs`).
    pub vlog: u32,
    /// Record slots of the version log used so far: the next record goes
    /// at this slot (slots are not reused; a freed one is zeros).
    pub vlog_slots: u32,
    /// The object holding the layout policy (0: none; an older volume's
    /// spare bytes read as 0, `layoutrules.rs`).
    pub layout: u32,
}

/// Close versions kept per file when the header says 0.
pub const DEFAULT_KEEP: u32 = 16;
/// Most close versions kept per file (the engine allows 2^16 snapshots
/// per volume, shared by every file's versions).
pub const MAX_KEEP: u32 = 1024;

fn seal(b: &mut [u8; RECORD]) {
    let crc = crc32c(&b[..CRC_AT]);
    b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
}

fn check(b: &[u8; RECORD], ino: u64, magic: &[u8; 4]) -> Result<()> {
    if &b[..4] != magic || b[4] != VERSION {
        return Err(FsError::corrupt("inode record", ino, format!("magic {:02x?} version {}", &b[..4], b[4])));
    }
    let crc = u32::from_le_bytes(b[CRC_AT..].try_into().unwrap_or_default());
    if crc != crc32c(&b[..CRC_AT]) {
        return Err(FsError::corrupt("inode record", ino, "checksum mismatch"));
    }
    Ok(())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

impl Header {
    pub fn encode(&self) -> [u8; RECORD] {
        let mut b = [0u8; RECORD];
        b[..4].copy_from_slice(HEADER_MAGIC);
        b[4] = VERSION;
        b[8..16].copy_from_slice(&self.next_ino.to_le_bytes());
        b[16..24].copy_from_slice(&self.quota.to_le_bytes());
        b[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        b[32..36].copy_from_slice(&self.policy.to_le_bytes());
        b[36..40].copy_from_slice(&self.keep.to_le_bytes());
        b[40..44].copy_from_slice(&self.vlog.to_le_bytes());
        b[44..48].copy_from_slice(&self.vlog_slots.to_le_bytes());
        b[48..52].copy_from_slice(&self.layout.to_le_bytes());
        seal(&mut b);
        b
    }

    pub fn decode(b: &[u8; RECORD]) -> Result<Header> {
        check(b, 0, HEADER_MAGIC)?;
        let h = Header {
            next_ino: u64_at(b, 8),
            quota: u64_at(b, 16),
            epoch: u64_at(b, 24),
            policy: u32_at(b, 32),
            keep: u32_at(b, 36),
            vlog: u32_at(b, 40),
            vlog_slots: u32_at(b, 44),
            layout: u32_at(b, 48),
        };
        if h.vlog_slots > crate::history::vrecord::MAX_SLOTS || (h.vlog == 0 && h.vlog_slots != 0) {
            return Err(FsError::corrupt(
                "volume header",
                0,
                format!("version log {} with {} slots", h.vlog, h.vlog_slots),
            ));
        }
        if h.keep > MAX_KEEP {
            return Err(FsError::corrupt("volume header", 0, format!("keep {} close versions", h.keep)));
        }
        if h.next_ino < 2 || h.next_ino > crate::MAX_INODES {
            return Err(FsError::corrupt("volume header", 0, format!("next inode {}", h.next_ino)));
        }
        Ok(h)
    }
}

impl Inode {
    pub fn encode(&self) -> [u8; RECORD] {
        let mut b = [0u8; RECORD];
        b[..4].copy_from_slice(INODE_MAGIC);
        b[4] = VERSION;
        b[5] = self.kind as u8;
        b[6] = self.acl;
        b[8..12].copy_from_slice(&self.perm.to_le_bytes());
        b[12..16].copy_from_slice(&self.uid.to_le_bytes());
        b[16..20].copy_from_slice(&self.gid.to_le_bytes());
        b[20..24].copy_from_slice(&self.nlink.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..40].copy_from_slice(&self.atime.to_le_bytes());
        b[40..48].copy_from_slice(&self.mtime.to_le_bytes());
        b[48..56].copy_from_slice(&self.ctime.to_le_bytes());
        b[56..60].copy_from_slice(&self.object.to_le_bytes());
        b[60..68].copy_from_slice(&self.epoch.to_le_bytes());
        b[68..76].copy_from_slice(&self.ino.to_le_bytes());
        b[76..80].copy_from_slice(&self.rdev.to_le_bytes());
        let n = self.target.len().min(INLINE_TARGET);
        b[80..82].copy_from_slice(&(n as u16).to_le_bytes());
        b[TARGET_AT..TARGET_AT + n].copy_from_slice(&self.target[..n]);
        b[TARGET_AT + INLINE_TARGET..TARGET_AT + INLINE_TARGET + 8].copy_from_slice(&self.parent.to_le_bytes());
        seal(&mut b);
        b
    }

    /// None for a free record (all zeros); an error for anything damaged.
    pub fn decode(b: &[u8; RECORD], ino: u64) -> Result<Option<Inode>> {
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        check(b, ino, INODE_MAGIC)?;
        let bad = |d: String| FsError::corrupt("inode record", ino, d);
        let kind = Kind::from_byte(b[5]).ok_or_else(|| bad(format!("kind {}", b[5])))?;
        if u64_at(b, 68) != ino {
            return Err(bad(format!("record names inode {}", u64_at(b, 68))));
        }
        let n = usize::from(u16::from_le_bytes([b[80], b[81]]));
        let perm = u32_at(b, 8);
        let size = u64_at(b, 24);
        if n > INLINE_TARGET || perm & !0o7777 != 0 || size > crate::OBJECT_SIZE {
            return Err(bad(format!("target length {n}, mode {perm:o} or size {size}")));
        }
        let rdev = u32_at(b, 76);
        // A special file's object holds its attribute set only
        // (FS_SPECIAL_SETS): it has no size.
        if (rdev != 0 && !kind.is_device()) || (kind.is_special() && size != 0) {
            return Err(bad(format!("a {kind:?} with device {rdev:#x}, size {size}")));
        }
        let acl = b[6];
        let lists = match kind {
            Kind::Dir => HAS_ACCESS | HAS_DEFAULT,
            Kind::Symlink => 0,
            _ => HAS_ACCESS,
        };
        if acl & !lists != 0 || b[7] != 0 {
            return Err(bad(format!("a {kind:?} with access control list bits {acl:#x}, byte 7 {}", b[7])));
        }
        let at = TARGET_AT + INLINE_TARGET;
        Ok(Some(Inode {
            ino,
            kind,
            perm,
            uid: u32_at(b, 12),
            gid: u32_at(b, 16),
            nlink: u32_at(b, 20),
            size,
            atime: u64_at(b, 32) as i64,
            mtime: u64_at(b, 40) as i64,
            ctime: u64_at(b, 48) as i64,
            object: u32_at(b, 56),
            epoch: u64_at(b, 60),
            target: b[TARGET_AT..TARGET_AT + n].to_vec(),
            parent: u64_at(b, at),
            rdev,
            acl,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Inode {
        Inode {
            ino: 7,
            kind: Kind::Symlink,
            perm: 0o755,
            uid: 1000,
            gid: 100,
            nlink: 1,
            size: 3,
            atime: 1,
            mtime: -2,
            ctime: 3,
            object: 0,
            epoch: 0,
            parent: 0,
            target: b"abc".to_vec(),
            rdev: 0,
            acl: 0,
        }
    }

    #[test]
    fn round_trip_and_zeros_are_free() {
        let i = sample();
        assert_eq!(Inode::decode(&i.encode(), 7).unwrap(), Some(i));
        assert_eq!(Inode::decode(&[0; RECORD], 9).unwrap(), None);
        let h = Header { next_ino: 5, quota: 1 << 30, epoch: 0, policy: 9, keep: 3, vlog: 4, vlog_slots: 5, layout: 0 };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
    }

    /// Pins the layout: magic, version, kind, perm, uid at their offsets.
    #[test]
    fn golden_bytes() {
        let b = sample().encode();
        assert_eq!(&b[..16], &[b'T', b'F', b'S', b'I', 1, 3, 0, 0, 0xed, 1, 0, 0, 0xe8, 3, 0, 0]);
        assert_eq!(&b[80..85], &[3, 0, b'a', b'b', b'c']);
    }

    /// Pins the versioning fields: the header's epoch (snapshot count) at
    /// 24, an inode's epoch at 60 (docs/FORMAT.md *File volumes*).
    #[test]
    fn golden_epoch_bytes() {
        let h =
            Header { next_ino: 2, quota: 0, epoch: 3, policy: 0, keep: 0, vlog: 0, vlog_slots: 0, layout: 0 }.encode();
        assert_eq!(&h[24..32], &[3, 0, 0, 0, 0, 0, 0, 0]);
        let mut i = sample();
        i.epoch = 0x0102;
        assert_eq!(&i.encode()[60..68], &[2, 1, 0, 0, 0, 0, 0, 0]);
    }

    /// Pins the close-version fields (FS_FILE_VERSIONS): the policy
    /// object at 32, close versions kept per file at 36.
    #[test]
    fn golden_policy_bytes() {
        let h = Header { next_ino: 2, quota: 0, epoch: 0, policy: 0x0304, keep: 5, vlog: 0, vlog_slots: 0, layout: 0 }
            .encode();
        assert_eq!(&h[32..40], &[4, 3, 0, 0, 5, 0, 0, 0]);
        let mut bad = Header {
            next_ino: 2,
            quota: 0,
            epoch: 0,
            policy: 0,
            keep: MAX_KEEP + 1,
            vlog: 0,
            vlog_slots: 0,
            layout: 0,
        }
        .encode();
        assert!(Header::decode(&bad).is_err(), "keep over its bound");
        bad[36..40].copy_from_slice(&MAX_KEEP.to_le_bytes());
        seal(&mut bad);
        assert_eq!(Header::decode(&bad).unwrap().keep, MAX_KEEP);
    }

    /// Pins the version log fields (FS_VERSION_RECORDS): the log object
    /// at 40, slots used at 44; slots without a log are damage.
    #[test]
    fn golden_version_log_bytes() {
        let h =
            Header { next_ino: 2, quota: 0, epoch: 0, policy: 0, keep: 0, vlog: 0x0506, vlog_slots: 0x0708, layout: 0 };
        assert_eq!(&h.encode()[40..48], &[6, 5, 0, 0, 8, 7, 0, 0]);
        let bad = Header { vlog: 0, ..h.clone() }.encode();
        assert!(Header::decode(&bad).is_err(), "slots without a log");
        let over = Header { vlog_slots: crate::history::vrecord::MAX_SLOTS + 1, ..h }.encode();
        assert!(Header::decode(&over).is_err(), "slots over the bound");
    }

    /// Pins the layout policy field at 48; an older volume's header (zeros
    /// there) reads as no layout policy.
    #[test]
    fn golden_layout_policy_bytes() {
        let h = Header { next_ino: 2, quota: 0, epoch: 0, policy: 0, keep: 0, vlog: 0, vlog_slots: 0, layout: 0x090a };
        assert_eq!(&h.encode()[48..52], &[0x0a, 9, 0, 0]);
        let old = Header { layout: 0, ..h }.encode();
        assert!(old[48..].iter().take(4).all(|&x| x == 0));
        assert_eq!(Header::decode(&old).unwrap().layout, 0);
    }

    /// Pins the special kinds and the device number at 76
    /// (FS_SPECIAL_FILES); a device number on another kind, or data on a
    /// special file, is damage.
    #[test]
    fn golden_special_file_bytes() {
        let dev = Inode { kind: Kind::CharDev, size: 0, target: Vec::new(), rdev: 0x0103, ..sample() };
        let b = dev.encode();
        assert_eq!((b[5], &b[76..80]), (6, &[3, 1, 0, 0][..]));
        assert_eq!(Inode::decode(&b, 7).unwrap(), Some(dev.clone()));
        let kinds: Vec<u8> = [Kind::Fifo, Kind::Socket, Kind::CharDev, Kind::BlockDev].map(|k| k as u8).to_vec();
        assert_eq!(kinds, [4, 5, 6, 7]);
        assert_eq!(Kind::of_mode(libc::S_IFIFO | 0o644), Some(Kind::Fifo));
        assert_eq!(Kind::of_mode(0o170000), None);
        let bad_dev = Inode { kind: Kind::Fifo, ..dev.clone() }.encode();
        assert!(Inode::decode(&bad_dev, 7).is_err(), "a fifo with a device number");
        let with_data = Inode { size: 5, ..dev }.encode();
        assert!(Inode::decode(&with_data, 7).is_err(), "a device node with a size");
    }

    /// Pins the access control list bits at byte 6 (FS_POSIX_ACLS): a
    /// directory may have both, a symlink none, other kinds the access
    /// list only (fifos, sockets and device nodes with an object for their
    /// set: FS_SPECIAL_SETS); byte 7 stays zero.
    #[test]
    fn golden_acl_byte() {
        let dir = Inode { kind: Kind::Dir, size: 0, target: Vec::new(), acl: HAS_ACCESS | HAS_DEFAULT, ..sample() };
        let b = dir.encode();
        assert_eq!(&b[5..8], &[2, 3, 0]);
        assert_eq!(Inode::decode(&b, 7).unwrap(), Some(dir.clone()));
        let file = Inode { kind: Kind::File, acl: HAS_ACCESS, ..dir.clone() };
        assert_eq!(Inode::decode(&file.encode(), 7).unwrap(), Some(file.clone()));
        let fifo = Inode { kind: Kind::Fifo, acl: HAS_ACCESS, object: 9, ..dir.clone() };
        assert_eq!(&fifo.encode()[56..60], &[9, 0, 0, 0]);
        assert_eq!(Inode::decode(&fifo.encode(), 7).unwrap(), Some(fifo.clone()));
        for bad in [
            Inode { kind: Kind::Fifo, acl: HAS_DEFAULT, ..fifo.clone() },
            Inode { kind: Kind::File, acl: HAS_DEFAULT, ..dir.clone() },
            Inode { kind: Kind::Symlink, acl: HAS_ACCESS, ..dir.clone() },
            Inode { acl: 4, ..dir.clone() },
        ] {
            assert!(Inode::decode(&bad.encode(), 7).is_err(), "{:?} with {:#x}", bad.kind, bad.acl);
        }
        let mut byte7 = file.encode();
        byte7[7] = 1;
        seal(&mut byte7);
        assert!(Inode::decode(&byte7, 7).is_err(), "byte 7 set");
    }

    #[test]
    fn every_flipped_byte_is_an_error_not_a_panic() {
        let good = sample().encode();
        for at in 0..RECORD {
            let mut b = good;
            b[at] ^= 0x40;
            assert!(Inode::decode(&b, 7).is_err(), "byte {at}");
        }
        assert!(Inode::decode(&good, 8).is_err(), "a record at the wrong place");
    }
}
