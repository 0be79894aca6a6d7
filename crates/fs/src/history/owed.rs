//! Close versions owed, taken in batches (docs/ARCHITECTURE.md *Close
//! versions in batches*). A close version is owed at its last writer's
//! release: the file as the release saw it (size, mode, owner, times) is
//! kept in memory, and the bytes it holds stay as they are until the
//! version is taken, because anything that would change one of them
//! takes it first (the mount's requests that change a file's data below
//! the version's end, `take_owed_before`; `free_inode`, which drops it
//! with the file's other close versions). A change that spares them (an
//! append, a chmod) leaves it owed, and a file closed again owes a
//! second version beside the first. Owed versions are taken
//! together: before the mount's commits (periodic, fsync, unmount),
//! before a volume snapshot, or once `OWED_BOUND` are owed. A batch is
//! one commit's worth: the tags, one write of the records into the
//! version log, one header write; a file deleted before its version was
//! taken costs nothing. Before, each close wrote the log, the header and
//! often the inode on its own: 76 us a version, most of a versioned
//! PostMark's overhead.

use crate::error::{FsError, Result};
use crate::history::snap::{version_name, FsSnapshot, VersionKind};
use crate::history::vrecord::{VersionRecord, LEN, MAX_SLOTS};
use crate::namespace::inode::{Inode, Kind};
use crate::namespace::ns::{FileVolume, Ns};
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

/// Bytes of a write below an owed version's end compared with what the
/// file holds there before the write may spare the version (a page the
/// kernel writes back is 4 KiB; more is taken as a change).
const SPARE_COMPARE: usize = 64 << 10;

/// What a request may change of a file, as its owed close versions see it.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// Attributes only (mode, owner, times, links): a version keeps the
    /// closed ones.
    Attributes,
    /// A truncate or an extension to this size.
    Size(u64),
    /// `data` written at `offset`.
    Write { offset: u64, data: &'a [u8] },
    /// Anything else: its data may change.
    Data,
}

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
        // A file closed again before its last version was taken (a change
        // since spared it, `take_owed_before`) owes both.
        ns.owed.entry(ino).or_default().push(Owed { seq, inode: i });
        ns.owed_total += 1;
        self.owed_count.store(ns.owed_total, Ordering::Relaxed);
        if ns.owed_total >= OWED_BOUND {
            self.take_owed_locked(&mut ns, None)?;
        }
        Ok(())
    }

    /// Before `change` to `ino`: its owed close versions are taken, unless
    /// the change leaves every byte they hold as it is (their sizes and
    /// times are the closed ones, kept in memory). Returns the versions
    /// taken. An append after a close, the commonest change of a file
    /// just closed, then leaves its version to the next batch.
    pub fn take_owed_before(&self, ino: u64, change: Change<'_>) -> Result<usize> {
        if !self.owes_versions() {
            return Ok(0);
        }
        let mut ns = self.lock();
        let Some(owed) = ns.owed.get(&ino) else {
            return Ok(0);
        };
        // The largest of them holds the most bytes (each later one saw
        // the same bytes below its size: nothing changed them between).
        let (object, size) = owed.iter().map(|o| (o.inode.object, o.inode.size)).max_by_key(|o| o.1).unwrap_or((0, 0));
        if self.spares(&mut ns, object, size, change) {
            return Ok(0);
        }
        self.take_owed_locked(&mut ns, Some(&[ino]))
    }

    /// Whether `change` leaves bytes [0, size) of `object` as they are.
    fn spares(&self, ns: &mut Ns, object: u32, size: u64, change: Change<'_>) -> bool {
        match change {
            Change::Attributes => true,
            Change::Size(n) => n >= size,
            Change::Write { offset, .. } if offset >= size => true,
            Change::Write { offset, data } => {
                // The kernel writes back whole pages: an append rewrites
                // the bytes of its first page below the old end as they are.
                let n = (size - offset).min(data.len() as u64) as usize;
                n <= SPARE_COMPARE && object != 0 && self.holds(ns, object, offset, &data[..n])
            }
            Change::Data => false,
        }
    }

    /// Whether `object` holds `bytes` at `offset` now (what is queued
    /// behind for it written first); a failed read proves nothing.
    fn holds(&self, ns: &mut Ns, object: u32, offset: u64, bytes: &[u8]) -> bool {
        self.settle(ns, object);
        let mut now = vec![0u8; bytes.len()];
        self.read_object(object, offset, &mut now).is_ok() && now == bytes
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
            None => ns.owed.drain().flat_map(|(_, o)| o).collect(),
            Some(list) => list.iter().filter_map(|i| ns.owed.remove(i)).flatten().collect(),
        };
        ns.owed_total -= due.len();
        self.owed_count.store(ns.owed_total, Ordering::Relaxed);
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
        if let Some(gone) = ns.owed.remove(&ino) {
            ns.owed_total -= gone.len();
            self.owed_count.store(ns.owed_total, Ordering::Relaxed);
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
            if let Err(e) = self.pool.write(ns.header.vlog, first_slot * LEN as u64, &log, false) {
                // The index took versions the log did not: rebuilt from
                // the log at its next use.
                ns.index = None;
                return Err(e.into());
            }
            ns.header.vlog_slots += taken.len() as u32;
            self.write_header(ns)?;
            self.versions_gen.fetch_add(1, Ordering::Relaxed);
        }
        failed?;
        for s in &taken {
            self.prune_closes(ns, s.owner)?;
        }
        self.compact_log_step(ns)?;
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
        crate::history::vindex::VersionIndex::taken(&mut ns.index, &s);
        Ok(Some((s, VersionRecord::of(closed, number, created).encode())))
    }

    /// Drop `ino`'s oldest close versions past the volume's bound.
    fn prune_closes(&self, ns: &mut Ns, ino: u64) -> Result<()> {
        let keep = crate::history::fileversions::keep_of(&ns.header) as usize;
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
