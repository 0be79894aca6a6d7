//! Close versions owed, taken in batches (docs/ARCHITECTURE.md *Close
//! versions in batches*). A close version is owed at its last writer's
//! release: the file as the release saw it (size, mode, owner, times) is
//! kept in memory, and its data stays as it is until the version is
//! taken, because anything that would change the file takes it first
//! (the mount's requests that change a file, `free_inode`, which drops
//! it with the file's other close versions). Owed versions are taken
//! together: before the mount's commits (periodic, fsync, unmount),
//! before a volume snapshot, or once `OWED_BOUND` are owed. A batch is
//! one commit's worth: the tags, one write of the records into the
//! version log, one header write; a file deleted before its version was
//! taken costs nothing. Before, each close wrote the log, the header and
//! often the inode on its own: 76 us a version, most of a versioned
//! PostMark's overhead.

use crate::error::{FsError, Result};
use crate::inode::{Inode, Kind};
use crate::ns::{FileVolume, Ns};
use crate::snap::{version_name, FsSnapshot, VersionKind};
use crate::vrecord::{VersionRecord, LEN, MAX_SLOTS};
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};
use tarn_engine::PlacementKind;

/// Owed versions past which the next one taken takes them all.
pub const OWED_BOUND: usize = 4096;
/// Versions taken per batch (one commit's worth, made room for whole).
const BATCH: usize = 64;
/// Ops weight made room for: per version (its tag, its inode, its share
/// of the log; about 200 bytes) and per batch (the log's blocks, the
/// header), as `make_room_for` counts.
const WEIGHT_EACH: usize = 1024;
const WEIGHT_FIXED: usize = 3 * 4096;

/// One owed close version: the file as its last writer's release saw it.
pub(crate) struct Owed {
    /// Order of the releases (versions are numbered in it).
    seq: u64,
    inode: Inode,
}

impl FileVolume {
    /// The last writer of `ino` was released, its data written: its close
    /// version is owed (a file gone or not regular owes none).
    pub fn owe_close_version(&self, ino: u64) -> Result<()> {
        self.writable()?;
        let mut ns = self.lock();
        let i = self.inode(&mut ns, ino)?;
        if i.kind != Kind::File || i.nlink == 0 {
            return Ok(());
        }
        ns.owed_seq += 1;
        let seq = ns.owed_seq;
        ns.owed.insert(ino, Owed { seq, inode: i });
        self.owed_count.store(ns.owed.len(), Ordering::Relaxed);
        if ns.owed.len() >= OWED_BOUND {
            self.take_owed_locked(&mut ns, None)?;
        }
        Ok(())
    }

    /// Whether any close version is owed (no lock taken).
    pub fn owes_versions(&self) -> bool {
        self.owed_count.load(Ordering::Relaxed) > 0
    }

    /// Take the versions owed by `inos` (None: all of them); the number
    /// taken. Every batch is tried; the first error is returned.
    pub fn take_owed(&self, inos: Option<&[u64]>) -> Result<usize> {
        if !self.owes_versions() {
            return Ok(0);
        }
        self.take_owed_locked(&mut self.lock(), inos)
    }

    /// `take_owed` under the namespace lock the caller holds.
    pub(crate) fn take_owed_locked(&self, ns: &mut Ns, inos: Option<&[u64]>) -> Result<usize> {
        let mut due: Vec<Owed> = match inos {
            None => ns.owed.drain().map(|(_, o)| o).collect(),
            Some(list) => list.iter().filter_map(|i| ns.owed.remove(i)).collect(),
        };
        self.owed_count.store(ns.owed.len(), Ordering::Relaxed);
        due.sort_unstable_by_key(|o| o.seq);
        let mut first = Ok(0);
        for chunk in due.chunks(BATCH) {
            match self.record_batch(ns, chunk.iter().map(|o| &o.inode)) {
                Ok(v) => first = first.map(|n| n + v.len()),
                Err(e) => {
                    log::error!("a batch of {} close versions stopped short (the rest lost): {e}", chunk.len());
                    first = first.and(Err(e));
                }
            }
        }
        first
    }

    /// The file's last name went: its owed version goes with its other
    /// close versions.
    pub(crate) fn forget_owed(&self, ns: &mut Ns, ino: u64) {
        if ns.owed.remove(&ino).is_some() {
            self.owed_count.store(ns.owed.len(), Ordering::Relaxed);
        }
    }

    /// Close versions of `files` (as each was closed; its data unchanged
    /// since) queued for one commit: each object's tag `gN`, the records
    /// in one write into the version log, the header (epoch, slot count)
    /// once, each inode's epoch where it says something; then each file's
    /// close versions past the volume's bound are dropped (made room for
    /// apart: a crash between keeps one version more, pruned at its next
    /// close). A file whose last link went, or whose object changed,
    /// has none. Returns the versions taken.
    pub(crate) fn record_batch<'a>(
        &self,
        ns: &mut Ns,
        files: impl Iterator<Item = &'a Inode> + Clone,
    ) -> Result<Vec<FsSnapshot>> {
        // The versions hold every byte written before them.
        for i in files.clone() {
            self.settle(ns, i.object);
        }
        if !ns.records_enabled {
            // Its own commit, the first time only (lock order: namespace,
            // then commit, as the mount's periodic commit takes them).
            self.pool.enable_fs_version_records()?;
            ns.records_enabled = true;
        }
        let count = files.clone().count();
        if u64::from(ns.header.vlog_slots) + count as u64 > u64::from(MAX_SLOTS) {
            return Err(FsError::Invalid("the version log is full (2^26 close versions taken)"));
        }
        // Everything below in one commit: no back-pressure commit inside.
        self.pool.make_room_for(WEIGHT_FIXED + WEIGHT_EACH * count)?;
        if ns.header.vlog == 0 {
            ns.header.vlog = self.pool.create_object(self.id, crate::OBJECT_SIZE, Some(PlacementKind::Append))?;
        }
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let first_slot = u64::from(ns.header.vlog_slots);
        let mut log = Vec::with_capacity(count * LEN);
        let mut taken = Vec::with_capacity(count);
        let mut failed = Ok(());
        for i in files {
            let slot = first_slot + taken.len() as u64;
            match self.record_one(ns, i, slot, created) {
                Ok(Some((s, rec))) => {
                    log.extend_from_slice(&rec);
                    taken.push(s);
                }
                Ok(None) => {}
                Err(e) => {
                    failed = Err(e);
                    break;
                }
            }
        }
        // What was tagged is recorded even when a later one failed.
        if !log.is_empty() {
            self.pool.write(ns.header.vlog, first_slot * LEN as u64, &log, false)?;
            ns.header.vlog_slots += taken.len() as u32;
            self.write_header(&ns.header)?;
            self.versions_gen.fetch_add(1, Ordering::Relaxed);
        }
        failed?;
        for s in &taken {
            self.prune_closes(ns, s.owner)?;
        }
        Ok(taken)
    }

    /// One version of `closed` (the file as closed) numbered next: its
    /// tag and inode queued, its record returned for the log at `slot`.
    fn record_one(
        &self,
        ns: &mut Ns,
        closed: &Inode,
        slot: u64,
        created: u64,
    ) -> Result<Option<(FsSnapshot, [u8; LEN])>> {
        let mut live = match self.inode(ns, closed.ino) {
            Ok(i) => i,
            Err(FsError::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        if live.nlink == 0 || live.kind != Kind::File || live.object != closed.object {
            return Ok(None);
        }
        let number = ns.header.epoch + 1;
        if closed.object != 0 {
            self.tag_object(closed.object, number)?;
        }
        ns.header.epoch = number;
        self.save_epoch(ns, &mut live, number)?;
        let s = FsSnapshot {
            name: version_name(VersionKind::Close, closed.ino, closed.object, number, ""),
            kind: VersionKind::Close,
            owner: closed.ino,
            object: closed.object,
            number,
            created,
            engine_epoch: 0,
            slot: Some(slot),
        };
        crate::vindex::VersionIndex::taken(&mut ns.index, &s);
        Ok(Some((s, VersionRecord::of(closed, number, created).encode())))
    }

    /// Drop `ino`'s oldest close versions past the volume's bound.
    fn prune_closes(&self, ns: &mut Ns, ino: u64) -> Result<()> {
        let keep = crate::fileversions::keep_of(&ns.header) as usize;
        let closes = self.closes_of(ns, ino)?;
        if closes.len() > keep {
            let gone = &closes[..closes.len() - keep];
            self.pool.make_room_for(64 * 2 * gone.len() + 4096)?;
            self.drop_file_versions(ns, ino, gone, 0)?;
        }
        Ok(())
    }

    /// Bumped whenever versions are taken (a cached list of versions
    /// older than it is stale).
    pub fn versions_gen(&self) -> u64 {
        self.versions_gen.load(Ordering::Relaxed)
    }
}
