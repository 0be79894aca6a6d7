//! Close versions as records (FS_VERSION_RECORDS; docs/FORMAT.md *File
//! volumes*, version records). A close version used to be an engine
//! snapshot of the whole inode table, which pinned a 4 KiB table block
//! and a dead-list node per version; the table snapshot only kept the
//! file's 256-byte record. Now the version is a 64-byte record (number,
//! file, object, size, mode, owner, times) in the volume's *version log*,
//! an object placed `append` (a rewritten block is whole or absent after
//! a crash) named by the header, next to the object's tag `gN` that
//! holds the data as it was. The record, the tag, the header's epoch and
//! slot count and the inode's epoch are queued in one commit.

use crate::error::{FsError, Result};
use crate::namespace::inode::{Inode, Kind};
use crate::namespace::ns::{FileVolume, Ns};
use tarn_engine::View;
use tarn_format::checksum::crc32c;

/// Bytes of one record; a slot of zeros is free.
pub const LEN: usize = 64;
/// Slots a version log may use (4 GiB of log): past it close versions
/// are refused (the close itself still succeeds, logged).
pub const MAX_SLOTS: u32 = 1 << 26;
const VERSION: u8 = 1;
/// The kind byte of a close version (the only kind written today).
const KIND_CLOSE: u8 = 2;
const CRC_AT: usize = LEN - 4;
/// Slots read per engine read when the log is listed (64 KiB).
const CHUNK: u64 = 1024;

/// One close version of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionRecord {
    /// The version's number (the header epoch it took).
    pub number: u64,
    pub ino: u64,
    /// The file's data object (0: none); its tag `g<number>` holds the data.
    pub object: u32,
    pub size: u64,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
    pub ctime: i64,
    /// Unix seconds when the version was taken.
    pub created: u32,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

impl VersionRecord {
    /// The record of file `i` as version `number` keeps it.
    pub fn of(i: &Inode, number: u64, created: u64) -> VersionRecord {
        VersionRecord {
            number,
            ino: i.ino,
            object: i.object,
            size: i.size,
            perm: i.perm,
            uid: i.uid,
            gid: i.gid,
            mtime: i.mtime,
            ctime: i.ctime,
            created: created.min(u32::MAX as u64) as u32,
        }
    }

    /// The inode `foo@N` shows: a regular file with one link, its
    /// access time the modification time (atime is not kept).
    pub fn inode(&self) -> Inode {
        Inode {
            ino: self.ino,
            kind: Kind::File,
            perm: self.perm,
            uid: self.uid,
            gid: self.gid,
            nlink: 1,
            size: self.size,
            atime: self.mtime,
            mtime: self.mtime,
            ctime: self.ctime,
            object: self.object,
            epoch: self.number,
            parent: 0,
            target: Vec::new(),
            rdev: 0,
            // A version record does not say: the version's attribute set
            // (its object's tag) is read to know.
            acl: crate::namespace::acl::HAS_ACCESS,
        }
    }

    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0] = VERSION;
        b[1] = KIND_CLOSE;
        b[2..4].copy_from_slice(&(self.perm as u16).to_le_bytes());
        b[4..8].copy_from_slice(&self.object.to_le_bytes());
        b[8..16].copy_from_slice(&self.number.to_le_bytes());
        b[16..24].copy_from_slice(&self.ino.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..40].copy_from_slice(&self.mtime.to_le_bytes());
        b[40..48].copy_from_slice(&self.ctime.to_le_bytes());
        b[48..52].copy_from_slice(&self.uid.to_le_bytes());
        b[52..56].copy_from_slice(&self.gid.to_le_bytes());
        b[56..60].copy_from_slice(&self.created.to_le_bytes());
        let crc = crc32c(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// None for a free slot (zeros); damage is an error naming the slot.
    pub fn decode(b: &[u8; LEN], slot: u64) -> Result<Option<VersionRecord>> {
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        let bad = |d: String| FsError::corrupt("version record", slot, d);
        if u32_at(b, CRC_AT) != crc32c(&b[..CRC_AT]) {
            return Err(bad("checksum mismatch".into()));
        }
        if b[0] != VERSION || b[1] != KIND_CLOSE {
            return Err(bad(format!("version {} kind {}", b[0], b[1])));
        }
        let perm = u32::from(u16::from_le_bytes([b[2], b[3]]));
        let r = VersionRecord {
            number: u64_at(b, 8),
            ino: u64_at(b, 16),
            object: u32_at(b, 4),
            size: u64_at(b, 24),
            perm,
            uid: u32_at(b, 48),
            gid: u32_at(b, 52),
            mtime: u64_at(b, 32) as i64,
            ctime: u64_at(b, 40) as i64,
            created: u32_at(b, 56),
        };
        let ino_ok = r.ino > crate::ROOT && r.ino < crate::MAX_INODES;
        if perm & !0o7777 != 0 || r.number == 0 || !ino_ok || r.size > crate::MAX_FILE_SIZE {
            return Err(bad(format!("mode {perm:o}, number {}, inode {} or size {}", r.number, r.ino, r.size)));
        }
        Ok(Some(r))
    }
}

impl FileVolume {
    /// Every record of the version log with its slot, in slot order
    /// (which is number order: slots are handed out as numbers are).
    pub(crate) fn records(&self, ns: &Ns) -> Result<Vec<(u64, VersionRecord)>> {
        let (log, slots) = (ns.header.vlog, u64::from(ns.header.vlog_slots));
        let mut out = Vec::new();
        if log == 0 || self.view.is_some() {
            return Ok(out);
        }
        let mut buf = vec![0u8; CHUNK as usize * LEN];
        for first in (0..slots).step_by(CHUNK as usize) {
            let n = CHUNK.min(slots - first) as usize;
            self.pool.read_view(log, View::Head, first * LEN as u64, &mut buf[..n * LEN])?;
            for (k, rec) in buf[..n * LEN].chunks_exact(LEN).enumerate() {
                let mut b = [0u8; LEN];
                b.copy_from_slice(rec);
                if let Some(r) = VersionRecord::decode(&b, first + k as u64)? {
                    out.push((first + k as u64, r));
                }
            }
        }
        Ok(out)
    }

    /// The version log as the checker sees it: every record decodes, and
    /// numbers rise with slots (slot order is number order: a record
    /// twice, or one out of order, is damage) up to the header's epoch.
    pub(crate) fn check_version_log(&self, report: &mut crate::CheckReport) -> Result<()> {
        let ns = self.lock();
        let records = match self.records(&ns) {
            Ok(r) => r,
            Err(e @ FsError::Corrupt { .. }) => {
                report.problem(e.to_string());
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let mut before = 0;
        for (slot, r) in records {
            if r.number <= before || r.number > ns.header.epoch {
                let epoch = ns.header.epoch;
                report.problem(format!("version record {slot}: number {} after {before} (epoch {epoch})", r.number));
            }
            before = r.number;
        }
        Ok(())
    }

    /// The record at `slot` (ENOENT: a free slot or past the log).
    pub(crate) fn record_at(&self, ns: &Ns, slot: u64) -> Result<VersionRecord> {
        if ns.header.vlog == 0 || slot >= u64::from(ns.header.vlog_slots) {
            return Err(FsError::NotFound);
        }
        let mut b = [0u8; LEN];
        self.pool.read_view(ns.header.vlog, View::Head, slot * LEN as u64, &mut b)?;
        VersionRecord::decode(&b, slot)?.ok_or(FsError::NotFound)
    }

    /// The record of version `number`, looked for at `slot` first: a
    /// slot read before the mutex was last released may hold another
    /// record since (a compaction step moves records down,
    /// `logcompact.rs`); then the log is searched (ENOENT: none).
    pub(crate) fn record_numbered(&self, ns: &Ns, slot: u64, number: u64) -> Result<(u64, VersionRecord)> {
        match self.record_at(ns, slot) {
            Ok(r) if r.number == number => return Ok((slot, r)),
            Ok(_) | Err(FsError::NotFound) => {}
            Err(e) => return Err(e),
        }
        self.records(ns)?.into_iter().find(|(_, r)| r.number == number).ok_or(FsError::NotFound)
    }

    /// Queue freeing the records at `slots`: each slot is zeroed; a log
    /// block left all zeros is unmapped, so a log of deleted versions
    /// holds no space.
    pub(crate) fn drop_records(&self, ns: &Ns, slots: &[u64]) -> Result<()> {
        let log = ns.header.vlog;
        if log == 0 {
            return Ok(());
        }
        let per_block = 4096 / LEN as u64;
        let mut blocks: Vec<u64> = slots.iter().map(|s| s / per_block).collect();
        blocks.sort_unstable();
        blocks.dedup();
        for block in blocks {
            let mut b = vec![0u8; 4096];
            self.pool.read_view(log, View::Head, block * 4096, &mut b)?;
            for s in slots.iter().filter(|s| *s / per_block == block) {
                let at = (*s % per_block) as usize * LEN;
                b[at..at + LEN].fill(0);
            }
            if b.iter().all(|&x| x == 0) {
                self.pool.write_zeroes(log, block * 4096, 4096, false, false)?;
            } else {
                self.pool.write(log, block * 4096, &b, false)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> VersionRecord {
        VersionRecord {
            number: 0x0102,
            ino: 7,
            object: 9,
            size: 5000,
            perm: 0o644,
            uid: 1000,
            gid: 100,
            mtime: 2,
            ctime: 3,
            created: 4,
        }
    }

    /// Pins the layout (docs/FORMAT.md *File volumes*, version records).
    #[test]
    fn golden_record() {
        let b = sample().encode();
        assert_eq!(&b[..16], &[1, 2, 0xa4, 1, 9, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[16..32], &[7, 0, 0, 0, 0, 0, 0, 0, 0x88, 0x13, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[32..48], &[2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[48..60], &[0xe8, 3, 0, 0, 100, 0, 0, 0, 4, 0, 0, 0]);
        assert_eq!(u32::from_le_bytes(b[60..].try_into().unwrap()), crc32c(&b[..60]));
        assert_eq!(VersionRecord::decode(&b, 0).unwrap(), Some(sample()));
        assert_eq!(VersionRecord::decode(&[0; LEN], 0).unwrap(), None);
    }

    #[test]
    fn every_flipped_byte_is_an_error_not_a_panic() {
        let good = sample().encode();
        for at in 0..LEN {
            let mut b = good;
            b[at] ^= 0x40;
            assert!(VersionRecord::decode(&b, 3).is_err(), "byte {at}");
        }
        let mut bad = sample();
        bad.ino = 1;
        assert!(VersionRecord::decode(&bad.encode(), 3).is_err(), "the root has no close version");
    }
}
