//! The file versions of each file and the volume snapshots' numbers, in
//! memory, so that a close prunes its file's oldest close versions and a
//! deleted file drops its own without listing every version of the
//! volume (a listing per close was 13% of a versioned PostMark run).
//! Built from the catalog at first need (one listing), kept by the
//! version changes of this mount, and dropped whole (rebuilt at the next
//! need) by a delete of any other kind.

use crate::error::Result;
use crate::history::snap::{tag_of, FsSnapshot, VersionKind};
use crate::namespace::ns::{FileVolume, Ns};
use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Default)]
pub(crate) struct VersionIndex {
    /// Volume snapshots: they read the tags of the objects they hold.
    volumes: Vec<FsSnapshot>,
    /// File and close versions by the inode they are of, oldest first.
    /// The engine's bound on snapshots per volume bounds them all.
    by_owner: HashMap<u64, Vec<FsSnapshot>>,
    /// The version log's slots that hold a record (`logcompact.rs`).
    pub(crate) slots: BTreeSet<u64>,
    /// Slots below it all hold records (a hint: the first free slot is
    /// at or above it).
    pub(crate) packed: u64,
    /// A compaction of the log is under way (steps go on until the log
    /// is packed, not only while half of it is free).
    pub(crate) compacting: bool,
}

impl VersionIndex {
    /// A version this mount just took (a no-op while not built).
    pub(crate) fn taken(ix: &mut Option<VersionIndex>, s: &FsSnapshot) {
        let Some(ix) = ix.as_mut() else { return };
        ix.add(s.clone());
    }

    fn add(&mut self, s: FsSnapshot) {
        if let Some(slot) = s.slot {
            self.slots.insert(slot);
        }
        match s.kind {
            VersionKind::Volume => self.volumes.push(s),
            _ => self.by_owner.entry(s.owner).or_default().push(s),
        }
    }

    /// The record of version `number` of file `ino` moved to slot `to`.
    pub(crate) fn moved(&mut self, ino: u64, number: u64, from: u64, to: u64) {
        self.slots.remove(&from);
        self.slots.insert(to);
        let mine = self.by_owner.get_mut(&ino).map_or(&mut [][..], |v| v.as_mut_slice());
        if let Some(s) = mine.iter_mut().find(|s| s.number == number) {
            s.slot = Some(to);
        }
    }

    fn freed(&mut self, slots: &[u64]) {
        for s in slots {
            self.slots.remove(s);
            self.packed = self.packed.min(*s);
        }
    }
}

impl FileVolume {
    pub(crate) fn index<'a>(&self, ns: &'a mut Ns) -> Result<&'a mut VersionIndex> {
        if ns.index.is_none() {
            let mut ix = VersionIndex::default();
            for s in self.versions_in(ns)? {
                ix.add(s);
            }
            ns.index = Some(ix);
        }
        Ok(ns.index.get_or_insert_with(VersionIndex::default))
    }

    /// The close versions of `ino`, oldest first.
    pub(crate) fn closes_of(&self, ns: &mut Ns, ino: u64) -> Result<Vec<u64>> {
        let ix = self.index(ns)?;
        let mine = ix.by_owner.get(&ino).map_or(&[][..], |v| v.as_slice());
        Ok(mine.iter().filter(|s| s.kind == VersionKind::Close).map(|s| s.number).collect())
    }

    /// Queue the deletion of versions `gone` (numbers) of file `ino`:
    /// their records or table snapshots and every tag of the file's object that no
    /// remaining reader (a volume snapshot, another version of the file)
    /// reads. The object itself stays (live, or retired by the caller).
    /// `going`: the object the caller deletes with the file (0: none);
    /// when every tag of it is to go, none is queued here and Ok(true)
    /// says so: the caller's VolDelete drops them all in one op (a
    /// SnapDelete each scanned every volume of the pool for clones: the
    /// largest cost of versioning in a profile of PostMark).
    /// Nothing committed: the caller's change carries it.
    pub(crate) fn drop_file_versions(&self, ns: &mut Ns, ino: u64, gone: &[u64], going: u32) -> Result<bool> {
        if gone.is_empty() {
            return Ok(false);
        }
        let id = self.id;
        let ix = self.index(ns)?;
        let volumes = ix.volumes.clone();
        let mine = ix.by_owner.remove(&ino).unwrap_or_default();
        let (dropped, kept): (Vec<FsSnapshot>, Vec<FsSnapshot>) =
            mine.into_iter().partition(|s| gone.contains(&s.number));
        let slots: Vec<u64> = dropped.iter().filter_map(|s| s.slot).collect();
        let mut drop_snaps: Vec<(u32, u64)> =
            dropped.iter().filter(|s| s.slot.is_none()).map(|s| (id, s.engine_epoch)).collect();
        let objects: BTreeSet<u32> = dropped.iter().map(|s| s.object).filter(|&o| o != 0).collect();
        if !kept.is_empty() {
            ix.by_owner.insert(ino, kept.clone());
        }
        ix.freed(&slots);
        let mut whole = false;
        for o in objects {
            // An object already gone has no tag left to drop.
            let Ok(snaps) = self.pool.member_snapshots(o) else { continue };
            let mut tags: Vec<(u64, u64)> =
                snaps.iter().filter_map(|s| tag_of(&s.name).map(|t| (t, s.epoch))).collect();
            tags.sort_unstable();
            let (mut prev, mut unread) = (0, Vec::new());
            for &(t, epoch) in &tags {
                let in_range = |m: u64| m > prev && m <= t;
                let read = kept.iter().any(|s| s.object == o && in_range(s.number))
                    || self.volume_reads(&volumes, ino, o, &in_range)?;
                if !read {
                    unread.push((o, epoch));
                }
                prev = t;
            }
            if o == going && unread.len() == tags.len() {
                whole = true;
            } else {
                drop_snaps.extend(unread);
            }
        }
        self.drop_records(ns, &slots)?;
        self.pool.delete_member_snapshots(&drop_snaps)?;
        Ok(whole)
    }

    /// Whether a volume snapshot numbered in range holds file `ino` with
    /// object `o` (one record read each): a file made after a snapshot
    /// is not read by it, though its tags' ranges take it in.
    fn volume_reads(&self, volumes: &[FsSnapshot], ino: u64, o: u32, in_range: &dyn Fn(u64) -> bool) -> Result<bool> {
        for s in volumes.iter().filter(|s| in_range(s.number)) {
            if self.inode_in(s, ino)?.is_some_and(|r| r.object == o) {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
