//! Volume snapshots by epoch (Loris section V; docs/ARCHITECTURE.md *File
//! volumes*, versioning). Taking one copies nothing: the header's epoch
//! (the snapshot number) is bumped and the inode table, which is the file
//! volume's own map, gets an engine snapshot; one commit whatever the
//! number of files. Each object (file data, directory) then takes its own
//! engine snapshot lazily, the first time it is changed in a newer epoch:
//! the inode's epoch says when it last was. That snapshot, tagged `gN`
//! with the volume's epoch N at the time, shows the object as every
//! volume snapshot numbered up to N saw it (back to its previous tag).
//! Reading a volume snapshot numbered n takes each object's oldest tag at
//! least n, or its head when it has none. An object whose last name goes
//! while a snapshot may still see it is retired instead of deleted: its
//! head is shrunk to one zeroed block (the mark) and its tags stay.

use crate::error::{FsError, Result};
use crate::namespace::inode::{Header, Inode, RECORD};
use crate::namespace::ns::{FileVolume, Ns};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use tarn_engine::{EngineError, Pool, View};

/// The head size marking a retired object (live objects are OBJECT_SIZE).
pub const RETIRED_SIZE: u64 = 4096;
/// Snapshots of one file volume at most (the engine's per-volume bound).
const MAX_LIST: usize = 1 << 16;

/// Which volume snapshot a read-only FileVolume shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapView {
    /// The engine epoch of the inode table's snapshot.
    pub epoch: u64,
    /// The volume snapshot's number (its header's epoch).
    pub number: u64,
}

/// What a version is (`getattr -n user.tarn.version.type foo@/N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionKind {
    /// A volume snapshot: every file as it was.
    Volume,
    /// A per-file snapshot of one inode.
    File,
    /// A close version of one inode (open-close versioning policy).
    Close,
}

impl VersionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            VersionKind::Volume => "volume",
            VersionKind::File => "file",
            VersionKind::Close => "close",
        }
    }
}

/// A volume snapshot or file version, numbered from one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsSnapshot {
    /// The name in the engine catalog (`~f...`/`~c...` for file versions).
    pub name: String,
    pub kind: VersionKind,
    /// The inode a file version is of (0: a volume snapshot).
    pub owner: u64,
    /// The object a file version tagged (0: none, or a volume snapshot).
    pub object: u32,
    /// The volume's epoch the snapshot closed (1, 2, ...; never reused).
    pub number: u64,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// The engine epoch of its inode table snapshot (0: a version record).
    pub engine_epoch: u64,
    /// A close version kept as a record: its slot in the version log
    /// (`vrecord.rs`); None: a table snapshot.
    pub slot: Option<u64>,
}

/// A file version's catalog name: `~` + `f` (file) or `c` (close), then
/// `INO.OBJECT.NUMBER`, then `.LABEL` for a named file snapshot. Users
/// cannot take names starting with `~`, so a version's kind, owner and
/// number are known from the catalog in memory (no table read).
pub(crate) fn version_name(kind: VersionKind, ino: u64, object: u32, number: u64, label: &str) -> String {
    let k = if kind == VersionKind::Close { 'c' } else { 'f' };
    let mut n = format!("~{k}{ino}.{object}.{number}");
    if !label.is_empty() {
        n.push('.');
        n.push_str(label);
    }
    n
}

/// (kind, owner, object, number, label) of a file version's name.
pub(crate) fn parse_version(name: &str) -> Option<(VersionKind, u64, u32, u64, &str)> {
    let rest = name.strip_prefix('~')?;
    let kind = match rest.as_bytes().first()? {
        b'f' => VersionKind::File,
        b'c' => VersionKind::Close,
        _ => return None,
    };
    let mut parts = rest[1..].splitn(4, '.');
    let ino = parts.next()?.parse().ok()?;
    let object = parts.next()?.parse().ok()?;
    let number = parts.next()?.parse().ok()?;
    Some((kind, ino, object, number, parts.next().unwrap_or("")))
}

pub(crate) fn tag_name(number: u64) -> String {
    format!("g{number}")
}

/// The volume epoch an object snapshot's name carries (None: not a tag).
pub(crate) fn tag_of(name: &str) -> Option<u64> {
    name.strip_prefix('g').and_then(|n| n.parse().ok())
}

impl FileVolume {
    /// Refuse a change of a snapshot opened read-only.
    pub(crate) fn writable(&self) -> Result<()> {
        match self.view {
            Some(_) => Err(FsError::ReadOnly("a volume snapshot")),
            None => Ok(()),
        }
    }

    /// Whether this is a volume snapshot opened read-only.
    pub fn is_snapshot(&self) -> bool {
        self.view.is_some()
    }

    fn volume_name(&self) -> String {
        self.pool.file_volumes().into_iter().find(|f| f.id == self.id).map_or_else(|| self.id.to_string(), |f| f.name)
    }

    pub(crate) fn table_view(&self) -> View {
        self.view.map_or(View::Head, |v| View::Snapshot(v.epoch))
    }

    /// Read an object as the opened view shows it.
    pub(crate) fn read_object(&self, object: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        let view = match self.view {
            None => View::Head,
            Some(v) => self.object_view(object, v.number)?,
        };
        Ok(self.pool.read_view(object, view, offset, buf)?)
    }

    /// The object's oldest tag numbered `number` or later, else its head.
    pub(crate) fn object_view(&self, object: u32, number: u64) -> Result<View> {
        let snaps = self.pool.member_snapshots(object)?;
        let best = snaps.iter().filter_map(|s| tag_of(&s.name).filter(|t| *t >= number).map(|t| (t, s.epoch))).min();
        Ok(best.map_or(View::Head, |(_, epoch)| View::Snapshot(epoch)))
    }

    /// Before an object changes: its first change since the last volume
    /// snapshot takes the object's tag (what older snapshots will read).
    /// The inode's new epoch is saved with it. File versions of other
    /// files bump the header epoch too, but never read this object: the
    /// comparison is with the latest *volume* snapshot's number, so they
    /// cost no tag here.
    pub(crate) fn before_change(&self, ns: &mut Ns, i: &mut Inode) -> Result<()> {
        if i.epoch >= ns.last_volume {
            return Ok(());
        }
        let current = ns.header.epoch;
        if i.object != 0 {
            self.settle(ns, i.object);
            self.tag_object(i.object, current)?;
        }
        i.epoch = current;
        self.save(ns, i)
    }

    pub(crate) fn tag_object(&self, object: u32, number: u64) -> Result<()> {
        match self.pool.snapshot_member(object, &tag_name(number)) {
            // A crash after the tag's commit but before the inode's.
            Ok(_) | Err(EngineError::SnapshotExists { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The last name of `i` went: keep its object (retired) when a volume
    /// snapshot may still read it; Ok(false) when it can be deleted.
    pub(crate) fn retire(&self, ns: &mut Ns, i: &Inode) -> Result<bool> {
        let tagged = self.pool.member_snapshots(i.object)?.iter().any(|s| tag_of(&s.name).is_some());
        let seen = i.epoch < ns.last_volume;
        if !tagged && !seen {
            return Ok(false);
        }
        if seen {
            self.tag_object(i.object, ns.header.epoch)?;
        }
        self.pool.shrink_object(i.object, RETIRED_SIZE)?;
        self.pool.write_zeroes(i.object, 0, RETIRED_SIZE, false, false)?;
        Ok(true)
    }

    /// Snapshot the whole volume as `name`: durable when it returns.
    pub fn snap_create(&self, name: &str) -> Result<FsSnapshot> {
        let s = self.queue_snap_create(name)?;
        self.commit()?;
        Ok(s)
    }

    /// `snap_create` queued for the next commit (the caller commits,
    /// without holding what other requests wait for).
    pub fn queue_snap_create(&self, name: &str) -> Result<FsSnapshot> {
        self.writable()?;
        if name.starts_with('~') {
            return Err(FsError::Invalid("a snapshot name may not start with '~' (file versions' prefix)"));
        }
        // Names from the catalog in memory: no header read per snapshot.
        if self.pool.member_snapshots(self.id)?.iter().any(|s| s.name == name) {
            return Err(EngineError::SnapshotExists { volume: self.volume_name(), name: name.into() }.into());
        }
        let mut ns = self.lock();
        // Close versions owed come before it (numbered before it), as
        // data written behind belongs in it, and sizes and times not yet
        // saved in its table.
        self.take_owed_locked(&mut ns, None)?;
        self.settle_all(&mut ns);
        let dirty: Vec<Inode> = ns.dirty.drain().map(|(_, i)| i).collect();
        for i in &dirty {
            self.save(&mut ns, i)?;
        }
        self.pool.make_room_for(4096)?;
        let (number, engine_epoch) = self.bump_and_snapshot(&mut ns, name)?;
        ns.last_volume = number;
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let s = FsSnapshot {
            name: name.to_string(),
            kind: VersionKind::Volume,
            owner: 0,
            object: 0,
            number,
            created,
            engine_epoch,
            slot: None,
        };
        crate::history::vindex::VersionIndex::taken(&mut ns.index, &s);
        Ok(s)
    }

    /// The header's bump to the next number and the table's engine
    /// snapshot `name`, queued for one commit (the caller made room and
    /// flushes).
    pub(crate) fn bump_and_snapshot(&self, ns: &mut Ns, name: &str) -> Result<(u64, u64)> {
        ns.header.epoch += 1;
        self.write_header(ns)?;
        match self.pool.snapshot_member(self.id, name) {
            Ok(e) => Ok((ns.header.epoch, e)),
            Err(e) => {
                ns.header.epoch -= 1;
                self.write_header(ns)?;
                Err(e.into())
            }
        }
    }

    /// The volume snapshots (not file versions), oldest first.
    pub fn snap_list(&self) -> Result<Vec<FsSnapshot>> {
        Ok(self.versions()?.into_iter().filter(|s| s.kind == VersionKind::Volume).collect())
    }

    /// Every volume snapshot and file version, oldest first (by number):
    /// one header read per volume snapshot; a table snapshot version's
    /// number is in its name; the version log is read whole.
    pub fn versions(&self) -> Result<Vec<FsSnapshot>> {
        let ns = self.lock();
        self.versions_in(&ns)
    }

    /// `versions` with the namespace mutex held by the caller.
    pub(crate) fn versions_in(&self, ns: &Ns) -> Result<Vec<FsSnapshot>> {
        let snaps = self.pool.member_snapshots(self.id)?;
        let mut out = Vec::with_capacity(snaps.len().min(MAX_LIST));
        for s in snaps.into_iter().take(MAX_LIST) {
            let (kind, owner, object, number) = match parse_version(&s.name) {
                Some((kind, owner, object, number, _)) => (kind, owner, object, number),
                None => (VersionKind::Volume, 0, 0, self.number_of(s.epoch)?),
            };
            out.push(FsSnapshot {
                name: s.name,
                kind,
                owner,
                object,
                number,
                created: s.created,
                engine_epoch: s.epoch,
                slot: None,
            });
        }
        for (slot, r) in self.records(ns)? {
            out.push(FsSnapshot {
                name: version_name(VersionKind::Close, r.ino, r.object, r.number, ""),
                kind: VersionKind::Close,
                owner: r.ino,
                object: r.object,
                number: r.number,
                created: u64::from(r.created),
                engine_epoch: 0,
                slot: Some(slot),
            });
        }
        out.sort_by_key(|s| s.number);
        Ok(out)
    }

    /// The number a table snapshot holds (its header's epoch).
    pub(crate) fn number_of(&self, engine_epoch: u64) -> Result<u64> {
        let mut b = [0u8; RECORD];
        self.pool.read_view(self.id, View::Snapshot(engine_epoch), 0, &mut b)?;
        Ok(Header::decode(&b)?.epoch)
    }

    /// The latest volume snapshot's number (0: none), from the catalog in
    /// memory and one header read.
    pub(crate) fn latest_volume_number(&self) -> Result<u64> {
        let snaps = self.pool.member_snapshots(self.id)?;
        match snaps.iter().rev().find(|s| parse_version(&s.name).is_none()) {
            Some(s) => self.number_of(s.epoch),
            None => Ok(0),
        }
    }

    /// Delete volume snapshot `name` (file versions are deleted by
    /// number): durable when it returns.
    pub fn snap_delete(&self, name: &str) -> Result<()> {
        self.queue_snap_delete(name)?;
        self.commit()
    }

    /// `snap_delete` queued for the next commit (the caller commits).
    pub fn queue_snap_delete(&self, name: &str) -> Result<()> {
        self.writable()?;
        let list = self.versions()?;
        let gone = list
            .iter()
            .find(|s| s.name == name && s.kind == VersionKind::Volume)
            .ok_or_else(|| FsError::NoSuchSnapshot { volume: self.volume_name(), name: name.to_string() })?;
        self.delete_versions(&list, &[gone.number])
    }

    /// Delete the version numbered `number`, of any kind (ENOENT: none):
    /// durable when it returns.
    pub fn delete_version(&self, number: u64) -> Result<()> {
        self.queue_delete_version(number)?;
        self.commit()
    }

    /// `delete_version` queued for the next commit (the caller commits;
    /// from a mount, a namespace change like an unlink).
    pub fn queue_delete_version(&self, number: u64) -> Result<()> {
        self.writable()?;
        let list = self.versions()?;
        if !list.iter().any(|s| s.number == number) {
            return Err(FsError::NotFound);
        }
        self.delete_versions(&list, &[number])
    }

    /// Delete the versions numbered `gone` of `list` (every version of the
    /// volume): their table snapshots, every object tag no remaining
    /// version reads, and retired objects left without tags. What each
    /// alone held is freed (the engine's dead lists). The tags are found
    /// in the catalog in memory (no volume read); the pass is O(objects of
    /// this volume + versions). Queued whole for the next commit.
    pub(crate) fn delete_versions(&self, list: &[FsSnapshot], gone: &[u64]) -> Result<()> {
        let remaining: Vec<&FsSnapshot> = list.iter().filter(|s| !gone.contains(&s.number)).collect();
        let volumes: Vec<u64> = remaining.iter().filter(|s| s.kind == VersionKind::Volume).map(|s| s.number).collect();
        let mut _ns = self.lock();
        // Any version may go here: the index is rebuilt at its next use.
        _ns.index = None;
        let going = list.iter().filter(|s| gone.contains(&s.number));
        // The list was read before the mutex was taken: a record may
        // have moved since (a compaction step).
        let mut slots = Vec::new();
        for s in going.clone() {
            if let Some(slot) = s.slot {
                match self.record_numbered(&_ns, slot, s.number) {
                    Ok((now, _)) => slots.push(now),
                    Err(FsError::NotFound) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let mut drop_snaps: Vec<(u32, u64)> =
            going.filter(|s| s.slot.is_none()).map(|s| (self.id, s.engine_epoch)).collect();
        let mut drop_objects = Vec::new();
        for o in self.pool.objects_with_snapshots(self.id) {
            // An object's tags serve the volume snapshots and its own file versions.
            let mut readers = volumes.clone();
            readers.extend(
                remaining.iter().filter(|s| s.kind != VersionKind::Volume && s.object == o.id).map(|s| s.number),
            );
            let mut tags: Vec<(u64, u64)> =
                o.snapshots.iter().filter_map(|s| tag_of(&s.name).map(|t| (t, s.epoch))).collect();
            tags.sort_unstable();
            let (mut prev, mut kept) = (0, 0);
            for (t, epoch) in tags {
                if readers.iter().any(|&m| m > prev && m <= t) {
                    kept += 1;
                } else {
                    drop_snaps.push((o.id, epoch));
                }
                prev = t;
            }
            if kept == 0 && o.size == RETIRED_SIZE {
                drop_objects.push(o.id);
            }
        }
        self.pool.make_room_for(64 * (drop_snaps.len() + drop_objects.len()) + 128 * slots.len() + 4096)?;
        self.drop_records(&_ns, &slots)?;
        self.pool.delete_member_snapshots(&drop_snaps)?;
        for id in drop_objects {
            self.pool.delete_object(id)?;
        }
        drop(_ns);
        let latest = self.latest_volume_number()?;
        self.lock().last_volume = latest;
        Ok(())
    }

    /// Open version `s` of this volume, read-only: a table snapshot's
    /// view, or for a version record a view of that one file.
    pub(crate) fn open_number(&self, s: &FsSnapshot) -> Result<FileVolume> {
        let view = SnapView { epoch: s.engine_epoch, number: s.number };
        let pinned = match s.slot {
            Some(slot) => Some(self.record_numbered(&self.lock(), slot, s.number)?.1.inode()),
            None => None,
        };
        FileVolume::open_pinned(self.pool.clone(), &self.volume_name(), Some(view), pinned)
    }

    /// Inode `ino` as snapshot `s` holds it (None: free there).
    pub(crate) fn inode_in(&self, s: &FsSnapshot, ino: u64) -> Result<Option<Inode>> {
        if ino == 0 || ino >= crate::MAX_INODES {
            return Ok(None);
        }
        let mut b = [0u8; RECORD];
        self.pool.read_view(self.id, View::Snapshot(s.engine_epoch), ino * RECORD as u64, &mut b)?;
        Inode::decode(&b, ino)
    }

    /// Open snapshot `snap` of file volume `name`, read-only.
    pub fn open_snapshot(pool: Arc<Pool>, name: &str, snap: &str) -> Result<FileVolume> {
        let live = FileVolume::open_view(pool.clone(), name, None)?;
        let s = live
            .snap_list()?
            .into_iter()
            .find(|s| s.name == snap)
            .ok_or_else(|| FsError::NoSuchSnapshot { volume: name.to_string(), name: snap.to_string() })?;
        drop(live);
        FileVolume::open_view(pool, name, Some(SnapView { epoch: s.engine_epoch, number: s.number }))
    }
}
