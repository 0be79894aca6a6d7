//! The namespace of one file volume: inodes in the volume's own map,
//! directories and file data in objects. One mutex serializes namespace
//! changes; writes are ordered so that any prefix of an operation is a
//! valid namespace (docs/ARCHITECTURE.md *File volumes*, crash behaviour).

use crate::error::{FsError, Result};
use crate::namespace::acl::{HAS_ACCESS, HAS_DEFAULT};
use crate::namespace::dir::{check_name, Dir};
use crate::namespace::dirblock;
use crate::namespace::inode::{Header, Inode, Kind, INLINE_TARGET, RECORD};
use crate::{MAX_FILE_SIZE, MAX_INODES, OBJECT_SIZE, ROOT};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};
use tarn_engine::{PlacementKind, Pool, View};

/// Inode table size: MAX_INODES records.
const TABLE_BYTES: u64 = MAX_INODES * RECORD as u64;
/// Directories decoded and kept (cleared whole past this).
const DIR_CACHE: usize = 512;
/// Inodes with unsaved data-path changes (size, mtime) kept before saving.
const DIRTY_MAX: usize = 1024;
/// Decoded inodes of the live volume kept (cleared whole past this).
const INODE_CACHE: usize = 8192;
/// Table blocks kept (16 MiB: 65,536 records).
const TABLE_CACHE: usize = 4096;
const TABLE_BLOCK: u64 = 4096;
/// Inode numbers the header reserves at a time.
const INO_BATCH: u64 = 64;
/// Entries one readdir call returns at most.
const READDIR_BATCH: usize = 4096;
/// Depth of the parent walk that refuses a directory moved into itself.
pub(crate) const MAX_DEPTH: usize = 4096;
const MAX_LINKS: u32 = 65_000;
/// Commits in flight a commit of ours waits out without the namespace
/// lock (`commit_then_release`) before it waits with it.
const AWAIT_IN_FLIGHT: usize = 4;

/// What stat shows: the inode as stored and the space its data takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub inode: Inode,
    /// Own space the data object maps, in bytes.
    pub allocated: u64,
}

/// A setattr: each field set only when Some.
#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<i64>,
    pub mtime: Option<i64>,
}

impl SetAttr {
    /// Only atime and/or mtime (ctime follows): no size, mode or owner.
    pub fn times_only(&self) -> bool {
        self.perm.is_none() && self.uid.is_none() && self.gid.is_none() && self.size.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: Kind,
    pub name: Vec<u8>,
    /// The offset to continue a readdir after this entry.
    pub cookie: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFs {
    pub total: u64,
    pub free: u64,
    pub files: u64,
}

/// The namespace lock and the change-gate share taken with it; the lock
/// is released first (fields drop in order).
pub(crate) struct NsGuard<'a> {
    ns: MutexGuard<'a, Ns>,
    _share: tarn_engine::pool::changes::ChangeShare<'a>,
}

impl std::ops::Deref for NsGuard<'_> {
    type Target = Ns;
    fn deref(&self) -> &Ns {
        &self.ns
    }
}

impl std::ops::DerefMut for NsGuard<'_> {
    fn deref_mut(&mut self) -> &mut Ns {
        &mut self.ns
    }
}

pub(crate) struct Ns {
    pub(crate) header: Header,
    dirs: HashMap<u64, Dir>,
    pub(crate) dirty: HashMap<u64, Inode>,
    /// The live volume's inodes as last read or saved (every change of a
    /// record goes through `save` or `free_inode`, which keep it): an
    /// inode read is otherwise an engine read of its 4 KiB block and a
    /// checksum, 4.7% of a versioned PostMark mount's CPU.
    cached: HashMap<u64, Inode>,
    /// The live table's 4 KiB blocks as last read or written here (every
    /// table write goes through `write_table`, under this lock): a record
    /// or header write is then a whole-block engine write from this copy,
    /// not the engine's read-modify-write of the block (that read was
    /// most of a create's header write and of each record save in
    /// PostMark's profile).
    table: HashMap<u64, Vec<u8>>,
    /// The next inode number to give; the header's `next_ino` is the end
    /// of the numbers reserved (`new_ino`).
    next_free_ino: u64,
    /// The latest volume snapshot's number (file versions take numbers
    /// from the same counter, but only volume snapshots make other
    /// objects take tags; see `before_change`).
    pub(crate) last_volume: u64,
    /// An upper bound of the space used, for the quota: the volume's
    /// usage when last counted (O(objects)) plus every byte written since.
    quota_used: Option<u64>,
    /// Open handles per inode (the kernel bounds them).
    open: HashMap<u64, u32>,
    /// The kernel's lookup count per inode, as a FUSE mount reports it
    /// (`looked_up`, `forgot`; the kernel bounds it by the inodes it
    /// caches): while it is above zero the kernel may still send requests
    /// for the inode, an open file among them (a mount that answers OPEN
    /// with ENOSYS never hears of opens).
    looked: HashMap<u64, u64>,
    /// Files whose last name went while they were open or known to the
    /// kernel: freed at the last release or forget, whichever is later
    /// (after a crash or an unmount, at the next open of the volume).
    orphans: HashSet<u64>,
    /// File versions by file and the volume snapshots' numbers (None:
    /// not built yet, or dropped by a delete; `vindex.rs`).
    pub(crate) index: Option<crate::history::vindex::VersionIndex>,
    /// FS_VERSION_RECORDS is known set (checked once per open).
    pub(crate) records_enabled: bool,
    /// Close versions owed, by file (`owed.rs`), and the last release's
    /// sequence number.
    pub(crate) owed: HashMap<u64, Vec<crate::history::owed::Owed>>,
    /// Versions in `owed`, all files together.
    pub(crate) owed_total: usize,
    pub(crate) owed_seq: u64,
}

/// The mode a create asks for: permission bits and the caller's umask.
/// The umask applies unless the directory has a default access control
/// list; then the list narrows the bits instead (POSIX.1e). A bare
/// `u32` is bits with no umask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewMode {
    pub perm: u32,
    pub umask: u32,
}

impl From<u32> for NewMode {
    fn from(perm: u32) -> NewMode {
        NewMode { perm, umask: 0 }
    }
}

/// What a new inode holds besides its attributes.
enum Body<'a> {
    Empty,
    /// A symlink's target.
    Target(&'a [u8]),
    /// A device node's number.
    Device(u32),
}

/// An open file volume.
pub struct FileVolume {
    pub(crate) pool: Arc<Pool>,
    pub(crate) id: u32,
    /// A volume snapshot opened read-only (None: the live volume).
    pub(crate) view: Option<crate::history::snap::SnapView>,
    /// A close version record's view: this file alone, as the record
    /// keeps it (every other inode is ENOENT).
    pinned: Option<Inode>,
    ns: Mutex<Ns>,
    /// Per-file readahead (`readahead.rs`; None: off, or a view).
    pub(crate) readahead: Option<crate::data::readahead::Readahead>,
    /// File data written behind (`writebehind.rs`; None: written at once).
    pub(crate) write_behind: Option<crate::data::writebehind::WriteBehind>,
    /// `Ns::owed.len()`, read without the lock on every request.
    pub(crate) owed_count: AtomicUsize,
    /// Bumped at every batch of versions taken (`owed.rs`).
    pub(crate) versions_gen: AtomicU64,
}

/// `a` and `b` are one record but for size and times (what may wait
/// unsaved: nothing a crash check or another inode depends on).
fn only_size_and_times_differ(a: &Inode, b: &Inode) -> bool {
    let mut a = a.clone();
    (a.size, a.atime, a.mtime, a.ctime) = (b.size, b.atime, b.mtime, b.ctime);
    a == *b
}

pub(crate) fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

impl FileVolume {
    /// Create file volume `name` with an empty root directory; durable
    /// when it returns. `quota` 0: none.
    pub fn format(pool: &Pool, name: &str, quota: u64, uid: u32, gid: u32) -> Result<()> {
        // The volume, its header and root in one commit (no back-pressure
        // commit between them).
        pool.make_room_for(1024)?;
        let info = pool.create_file_volume(name, TABLE_BYTES)?;
        let t = now();
        let root = Inode {
            ino: ROOT,
            kind: Kind::Dir,
            perm: 0o755,
            uid,
            gid,
            nlink: 2,
            size: 0,
            atime: t,
            mtime: t,
            ctime: t,
            object: 0,
            epoch: 0,
            parent: ROOT,
            target: Vec::new(),
            rdev: 0,
            acl: 0,
        };
        pool.write(info.id, RECORD as u64, &root.encode(), false)?;
        pool.write(
            info.id,
            0,
            &Header { next_ino: 2, quota, epoch: 0, policy: 0, keep: 0, vlog: 0, vlog_slots: 0, layout: 0 }.encode(),
            false,
        )?;
        Ok(pool.flush()?)
    }

    /// Open file volume `name`: its header is read and checked.
    pub fn open(pool: Arc<Pool>, name: &str) -> Result<FileVolume> {
        let fv = Self::open_view(pool, name, None)?;
        fv.free_orphans()?;
        Ok(fv)
    }

    /// Open the live volume (`view` None) or one of its snapshots.
    pub(crate) fn open_view(
        pool: Arc<Pool>,
        name: &str,
        view: Option<crate::history::snap::SnapView>,
    ) -> Result<FileVolume> {
        Self::open_pinned(pool, name, view, None)
    }

    /// `open_view`, or with `pinned` (and a view) the view of one close
    /// version record: the live header, that inode alone.
    pub(crate) fn open_pinned(
        pool: Arc<Pool>,
        name: &str,
        view: Option<crate::history::snap::SnapView>,
        pinned: Option<Inode>,
    ) -> Result<FileVolume> {
        let id = pool.file_volume(name).ok_or_else(|| FsError::NoSuchVolume(name.to_string()))?.id;
        let mut b = [0u8; RECORD];
        let table = match view {
            Some(v) if pinned.is_none() => View::Snapshot(v.epoch),
            _ => View::Head,
        };
        pool.read_view(id, table, 0, &mut b)?;
        let header = Header::decode(&b)?;
        let next_ino = header.next_ino;
        let root = pinned.as_ref().map_or(ROOT, |i| i.ino);
        let fv = FileVolume {
            pool,
            id,
            view,
            pinned,
            ns: Mutex::new(Ns {
                header,
                dirs: HashMap::new(),
                dirty: HashMap::new(),
                cached: HashMap::new(),
                table: HashMap::new(),
                next_free_ino: next_ino,
                last_volume: 0,
                quota_used: None,
                open: HashMap::new(),
                looked: HashMap::new(),
                orphans: HashSet::new(),
                index: None,
                records_enabled: false,
                owed: HashMap::new(),
                owed_total: 0,
                owed_seq: 0,
            }),
            readahead: None,
            write_behind: None,
            owed_count: AtomicUsize::new(0),
            versions_gen: AtomicU64::new(0),
        };
        fv.inode(&mut fv.lock(), root)?;
        if view.is_none() {
            fv.lock().last_volume = fv.latest_volume_number()?;
        }
        Ok(fv)
    }

    /// The namespace lock, with a share of the pool's change gate: no
    /// commit from a thread without one (an NBD FLUSH, the service's timed
    /// commit, a block writer's back-pressure under `tarn serve --mount`)
    /// takes the queued ops while it is held, so none falls inside a
    /// namespace change (engine `pool/changes.rs`).
    pub(crate) fn lock(&self) -> NsGuard<'_> {
        let ns = self.ns.lock().unwrap_or_else(|p| p.into_inner());
        NsGuard { ns, _share: self.pool.enter_changes(false) }
    }

    pub(crate) fn inode(&self, ns: &mut Ns, ino: u64) -> Result<Inode> {
        if let Some(p) = &self.pinned {
            return if p.ino == ino { Ok(p.clone()) } else { Err(FsError::NotFound) };
        }
        if let Some(i) = ns.dirty.get(&ino).or_else(|| ns.cached.get(&ino)) {
            return Ok(i.clone());
        }
        if ino == 0 || ino >= ns.header.next_ino {
            return Err(FsError::NotFound);
        }
        let at = ino * RECORD as u64;
        let mut b = [0u8; RECORD];
        match ns.table.get(&(at / TABLE_BLOCK)) {
            Some(t) => b.copy_from_slice(&t[(at % TABLE_BLOCK) as usize..][..RECORD]),
            None => self.pool.read_view(self.id, self.table_view(), at, &mut b)?,
        }
        let i = Inode::decode(&b, ino)?.ok_or(FsError::NotFound)?;
        self.cache_inode(ns, &i);
        Ok(i)
    }

    /// Write `bytes` at `at` of the live table: its block, changed in the
    /// cached copy (read once), written whole. A failed write drops the
    /// copy, so it never holds what the table does not.
    pub(crate) fn write_table(&self, ns: &mut Ns, at: u64, bytes: &[u8]) -> Result<()> {
        let (block, within) = (at / TABLE_BLOCK, (at % TABLE_BLOCK) as usize);
        assert!(within + bytes.len() <= TABLE_BLOCK as usize, "a table write stays inside one block");
        assert!(self.view.is_none(), "only the live table is written");
        let mut b = match ns.table.remove(&block) {
            Some(b) => b,
            None => {
                let mut b = vec![0u8; TABLE_BLOCK as usize];
                self.pool.read(self.id, block * TABLE_BLOCK, &mut b)?;
                b
            }
        };
        b[within..within + bytes.len()].copy_from_slice(bytes);
        self.pool.write(self.id, block * TABLE_BLOCK, &b, false)?;
        if ns.table.len() >= TABLE_CACHE {
            ns.table.clear();
        }
        ns.table.insert(block, b);
        Ok(())
    }

    /// The header (record 0) as `ns` holds it, written.
    pub(crate) fn write_header(&self, ns: &mut Ns) -> Result<()> {
        let h = ns.header.encode();
        self.write_table(ns, 0, &h)
    }

    /// Keep `i` as the live volume's record of its inode (a view of a
    /// snapshot reads its own table and keeps nothing).
    fn cache_inode(&self, ns: &mut Ns, i: &Inode) {
        if self.view.is_some() {
            return;
        }
        if ns.cached.len() >= INODE_CACHE {
            ns.cached.clear();
        }
        ns.cached.insert(i.ino, i.clone());
    }

    pub(crate) fn save(&self, ns: &mut Ns, i: &Inode) -> Result<()> {
        // A durable size never covers data still queued behind (a file
        // with no name left is freed at the next open after a crash: its
        // size says nothing there).
        if i.kind == Kind::File && i.nlink > 0 {
            self.settle(ns, i.object);
        }
        ns.dirty.remove(&i.ino);
        // Not kept until written: a failed write leaves the record as read.
        ns.cached.remove(&i.ino);
        self.write_table(ns, i.ino * RECORD as u64, &i.encode())?;
        self.cache_inode(ns, i);
        Ok(())
    }

    fn attr(&self, i: &Inode) -> Attr {
        let allocated = if i.object == 0 {
            0
        } else {
            // Data queued behind counts as allocated (as ext4 counts its
            // delayed allocations): `du` right after a write sees it.
            let queued = self.write_behind.as_ref().map_or(0, |w| w.queued_bytes(i.object));
            self.pool.object_allocated(i.object).unwrap_or(0) + queued
        };
        Attr { inode: i.clone(), allocated }
    }

    /// Directory `d` to change: taken out of the cache, not copied (a copy
    /// of a 500-entry directory at every create and unlink showed in
    /// PostMark's profile); `write_dir` puts the new one back, and a
    /// change that fails before it leaves the object as the truth.
    pub(crate) fn dir(&self, ns: &mut Ns, d: &Inode) -> Result<Dir> {
        if d.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        match ns.dirs.remove(&d.ino) {
            Some(dir) => Ok(dir),
            None => self.read_dir(d),
        }
    }

    /// Directory `d` to read, cached.
    pub(crate) fn dir_ref<'a>(&self, ns: &'a mut Ns, d: &Inode) -> Result<&'a Dir> {
        if d.kind != Kind::Dir {
            return Err(FsError::NotDir);
        }
        if !ns.dirs.contains_key(&d.ino) {
            let dir = self.read_dir(d)?;
            if ns.dirs.len() >= DIR_CACHE {
                ns.dirs.clear();
            }
            ns.dirs.insert(d.ino, dir);
        }
        ns.dirs.get(&d.ino).ok_or(FsError::NotFound)
    }

    /// The directory's first block says how long it is: the inode's size
    /// is informational, so the two never have to change together.
    fn read_dir(&self, d: &Inode) -> Result<Dir> {
        if d.object == 0 {
            return Ok(Dir::new());
        }
        let mut head = [0u8; dirblock::PROBE];
        self.read_object(d.object, 0, &mut head)?;
        let mut b = vec![0u8; dirblock::stored_len(&head, d.ino)?];
        self.read_object(d.object, 0, &mut b)?;
        Dir::decode(&b, d.ino)
    }

    /// Write directory `d`'s changed blocks from `dir` (block 0 last: it
    /// counts the others) and its inode's size and times. When only those
    /// differ from the record as saved, the inode waits with the pending
    /// changes for the next sync or commit (the directory's first block
    /// says how long it is, so a crash between leaves only an older size
    /// and mtime; a record write per create and unlink saved); a new
    /// object, link count or epoch is saved in the change itself. A write
    /// that fails leaves `dir` out of the cache: the object is the truth.
    pub(crate) fn write_dir(&self, ns: &mut Ns, d: &mut Inode, mut dir: Dir) -> Result<()> {
        self.before_change(ns, d)?;
        if d.object == 0 {
            d.object = self.pool.create_object(self.id, OBJECT_SIZE, Some(PlacementKind::Append))?;
        }
        for (offset, bytes) in dir.take_writes() {
            self.pool.write(d.object, offset, &bytes, false)?;
        }
        let t = now();
        (d.size, d.mtime, d.ctime) = (dir.size(), t, t);
        ns.dirs.insert(d.ino, dir);
        match ns.cached.get(&d.ino) {
            Some(saved) if only_size_and_times_differ(saved, d) => self.defer(ns, d.clone()),
            _ => self.save(ns, d),
        }
    }

    /// Before a namespace change of `small` one-block writes and
    /// directory writes of `dir_bytes` in all: commit the queue now if
    /// the change could push it over its bound, so that no back-pressure
    /// commit falls inside the change and a crash keeps all of it or none
    /// (a change too large for the bound still keeps every prefix valid).
    /// Every such change may write directory blocks, so FS_DIR_BLOCKS is
    /// made durable here first (a commit of its own, the first time).
    pub(crate) fn room(&self, small: usize, dir_bytes: u64) -> Result<()> {
        self.pool.enable_fs_dir_blocks()?;
        // Per 4 KiB written at most: a Map and a Sums op and a freed range.
        const PER_BLOCK: usize = 96;
        const PER_WRITE: usize = 64 + 2 * PER_BLOCK;
        let blocks = (dir_bytes / 4096) as usize + 2;
        let object = 64;
        self.pool.make_room_for((small + 1) * PER_WRITE + blocks * PER_BLOCK + object)?;
        Ok(())
    }

    /// A handle on `ino` was opened (FUSE open or create).
    pub fn opened(&self, ino: u64) {
        *self.lock().open.entry(ino).or_insert(0) += 1;
    }

    /// A handle on `ino` was released: an unlinked file goes with its last.
    pub fn released(&self, ino: u64) -> Result<()> {
        let mut ns = self.lock();
        let left = match ns.open.get_mut(&ino) {
            Some(n) => {
                *n = n.saturating_sub(1);
                *n
            }
            None => return Ok(()),
        };
        if left > 0 {
            return Ok(());
        }
        ns.open.remove(&ino);
        self.free_if_orphan(&mut ns, ino)
    }

    /// The kernel looked `ino` up once more (a FUSE entry reply).
    pub fn looked_up(&self, ino: u64) {
        *self.lock().looked.entry(ino).or_insert(0) += 1;
    }

    /// The kernel forgot `n` lookups of `ino` (FUSE forget): an unlinked
    /// file goes with the last, once no handle is open either.
    pub fn forgot(&self, ino: u64, n: u64) -> Result<()> {
        let mut ns = self.lock();
        let Some(left) = ns.looked.get_mut(&ino) else {
            return Ok(());
        };
        *left = left.saturating_sub(n);
        if *left > 0 {
            return Ok(());
        }
        ns.looked.remove(&ino);
        self.free_if_orphan(&mut ns, ino)
    }

    /// The session ends: the kernel sends no forget at unmount, so the
    /// files it still knew without a name go now (not at the next open).
    pub fn unmounted(&self) -> Result<()> {
        self.stop_readahead();
        let mut ns = self.lock();
        ns.open.clear();
        ns.looked.clear();
        let orphans: Vec<u64> = ns.orphans.iter().copied().collect();
        for ino in orphans {
            self.free_if_orphan(&mut ns, ino)?;
        }
        Ok(())
    }

    /// Whether the kernel may still send requests for `ino`.
    fn held(ns: &Ns, ino: u64) -> bool {
        ns.open.get(&ino).is_some_and(|&n| n > 0) || ns.looked.contains_key(&ino)
    }

    /// Frees orphan `ino` once nothing holds it.
    fn free_if_orphan(&self, ns: &mut Ns, ino: u64) -> Result<()> {
        if Self::held(ns, ino) || !ns.orphans.remove(&ino) {
            return Ok(());
        }
        let i = self.inode(ns, ino)?;
        self.free_inode(ns, &i)
    }

    /// Files left without a name by a crash or an unmount while open.
    fn free_orphans(&self) -> Result<()> {
        let orphans: Vec<Inode> = self.table()?.0.into_values().filter(|i| i.nlink == 0).collect();
        let mut ns = self.lock();
        for i in &orphans {
            self.free_inode(&mut ns, i)?;
        }
        if !orphans.is_empty() {
            drop(ns);
            self.sync()?;
        }
        Ok(())
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let mut ns = self.lock();
        let i = self.inode(&mut ns, ino)?;
        Ok(self.attr(&i))
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        let mut ns = self.lock();
        let p = self.inode(&mut ns, parent)?;
        let e = self.dir_ref(&mut ns, &p)?.find(name).cloned().ok_or(FsError::NotFound)?;
        let i = self.inode(&mut ns, e.ino)?;
        Ok(self.attr(&i))
    }

    /// Create a file, directory or symlink `name` in `parent`: the inode
    /// first, then the entry (a crash between leaves an unreachable inode,
    /// never an entry without one).
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        kind: Kind,
        mode: impl Into<NewMode>,
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        if kind.is_special() {
            return self.mknod(parent, name, kind, mode, 0, (uid, gid));
        }
        self.make(parent, name, kind, mode.into(), (uid, gid), Body::Empty)
    }

    /// mknod(2) of a fifo, socket or device node (`rdev`, devices only):
    /// an inode with no data. The first one of a pool sets
    /// FS_SPECIAL_FILES (a commit of its own) before it is written.
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        kind: Kind,
        mode: impl Into<NewMode>,
        rdev: u32,
        owner: (u32, u32),
    ) -> Result<Attr> {
        if !kind.is_special() {
            return Err(FsError::Invalid("mknod makes fifos, sockets and device nodes"));
        }
        self.writable()?;
        self.pool.enable_fs_special_files()?;
        let body = if kind.is_device() { Body::Device(rdev) } else { Body::Empty };
        self.make(parent, name, kind, mode.into(), owner, body)
    }

    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], uid: u32, gid: u32) -> Result<Attr> {
        if target.is_empty() || target.len() > 4095 {
            return Err(FsError::Invalid("symlink target length"));
        }
        self.make(parent, name, Kind::Symlink, 0o777.into(), (uid, gid), Body::Target(target))
    }

    /// `mode`'s bits for a new inode of `kind` in `p`, and the attribute
    /// set it inherits with byte 6 (a symlink is always 0777).
    fn new_perm(&self, p: &Inode, kind: Kind, mode: NewMode) -> Result<(u32, Option<Vec<u8>>, u8)> {
        let perm = mode.perm & 0o7777;
        match kind {
            Kind::Symlink => Ok((perm, None, 0)),
            _ if p.acl & HAS_DEFAULT != 0 => self.inherit_acl(p, kind, perm),
            _ => Ok((perm & !mode.umask, None, 0)),
        }
    }

    fn make(&self, parent: u64, name: &[u8], kind: Kind, mode: NewMode, owner: (u32, u32), body: Body) -> Result<Attr> {
        let (target, rdev) = match body {
            Body::Empty => (&[][..], 0),
            Body::Target(t) => (t, 0),
            Body::Device(d) => (&[][..], d),
        };
        self.writable()?;
        check_name(name)?;
        let mut ns = self.lock();
        let mut p = self.inode(&mut ns, parent)?;
        let mut dir = self.dir(&mut ns, &p)?;
        if dir.find(name).is_some() {
            return Err(FsError::Exists);
        }
        let (perm, lists, acl) = self.new_perm(&p, kind, mode)?;
        if lists.is_some() {
            self.enable_set_features(kind, acl != 0)?;
        }
        self.room(5, dir.write_bound())?;
        let ino = self.new_ino(&mut ns)?;
        let t = now();
        let mut i = Inode {
            ino,
            kind,
            perm,
            uid: owner.0,
            gid: owner.1,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            size: target.len() as u64,
            atime: t,
            mtime: t,
            ctime: t,
            object: 0,
            epoch: ns.header.epoch,
            parent: if kind == Kind::Dir { parent } else { 0 },
            target: Vec::new(),
            rdev,
            acl,
        };
        if target.len() <= INLINE_TARGET {
            i.target = target.to_vec();
        } else {
            i.object = self.pool.create_object(self.id, OBJECT_SIZE, Some(PlacementKind::Append))?;
            self.pool.write(i.object, 0, target, false)?;
        }
        match lists {
            // Saves the inode too.
            Some(set) => self.write_xattrs(&mut ns, &mut i, None, &set)?,
            None => self.save(&mut ns, &i)?,
        }
        dir.insert(name, ino, kind)?;
        if kind == Kind::Dir {
            p.nlink += 1;
        }
        self.write_dir(&mut ns, &mut p, dir)?;
        Ok(self.attr(&i))
    }

    /// A whiteout's inode (RENAME_WHITEOUT): a character device 0:0,
    /// mode 0, saved; the caller names it in the same change.
    pub(crate) fn make_whiteout(&self, ns: &mut Ns, owner: (u32, u32)) -> Result<u64> {
        let ino = self.new_ino(ns)?;
        let t = now();
        let i = Inode {
            ino,
            kind: Kind::CharDev,
            perm: 0,
            uid: owner.0,
            gid: owner.1,
            nlink: 1,
            size: 0,
            atime: t,
            mtime: t,
            ctime: t,
            object: 0,
            epoch: ns.header.epoch,
            parent: 0,
            target: Vec::new(),
            rdev: 0,
            acl: 0,
        };
        self.save(ns, &i)?;
        Ok(ino)
    }

    /// The next inode number. The header reserves numbers `INO_BATCH` at
    /// a time (its `next_ino` is the reservation's end, written with the
    /// first inode of the batch), so a create writes no header but every
    /// 64th; a crash skips the rest of a reservation, as numbers are
    /// never reused anyway.
    fn new_ino(&self, ns: &mut Ns) -> Result<u64> {
        let ino = ns.next_free_ino;
        if ino >= MAX_INODES {
            return Err(FsError::Engine(tarn_engine::EngineError::NoSpace));
        }
        if ino >= ns.header.next_ino {
            let end = (ino + INO_BATCH).min(MAX_INODES);
            let before = std::mem::replace(&mut ns.header.next_ino, end);
            if let Err(e) = self.write_header(ns) {
                ns.header.next_ino = before;
                return Err(e);
            }
        }
        ns.next_free_ino += 1;
        Ok(ino)
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let mut ns = self.lock();
        let i = self.inode(&mut ns, ino)?;
        if i.kind != Kind::Symlink {
            return Err(FsError::Invalid("not a symlink"));
        }
        if i.object == 0 {
            return Ok(i.target);
        }
        let mut b = vec![0u8; i.size.min(4095) as usize];
        self.read_object(i.object, 0, &mut b)?;
        Ok(b)
    }

    /// A hard link: the inode's count first, then the entry.
    pub fn link(&self, ino: u64, parent: u64, name: &[u8]) -> Result<Attr> {
        self.writable()?;
        check_name(name)?;
        let mut ns = self.lock();
        let mut i = self.inode(&mut ns, ino)?;
        if i.kind == Kind::Dir {
            return Err(FsError::IsDir);
        }
        if i.nlink >= MAX_LINKS {
            return Err(FsError::TooManyLinks);
        }
        let mut p = self.inode(&mut ns, parent)?;
        let mut dir = self.dir(&mut ns, &p)?;
        if dir.find(name).is_some() {
            return Err(FsError::Exists);
        }
        self.room(3, dir.write_bound())?;
        i.nlink += 1;
        i.ctime = now();
        self.save(&mut ns, &i)?;
        dir.insert(name, ino, i.kind)?;
        self.write_dir(&mut ns, &mut p, dir)?;
        Ok(self.attr(&i))
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove(parent, name, true)
    }

    /// The entry goes first, then the inode's count (a crash between
    /// leaks an inode, never leaves an entry to a freed one).
    fn remove(&self, parent: u64, name: &[u8], want_dir: bool) -> Result<()> {
        self.writable()?;
        check_name(name)?;
        let mut ns = self.lock();
        let mut p = self.inode(&mut ns, parent)?;
        let mut dir = self.dir(&mut ns, &p)?;
        let e = dir.find(name).cloned().ok_or(FsError::NotFound)?;
        let i = self.inode(&mut ns, e.ino)?;
        match (want_dir, i.kind == Kind::Dir) {
            (true, false) => return Err(FsError::NotDir),
            (false, true) => return Err(FsError::IsDir),
            (true, true) if !self.dir_ref(&mut ns, &i)?.is_empty() => return Err(FsError::NotEmpty),
            _ => {}
        }
        // The file's close versions go in the same change (free_inode).
        let closes = if i.kind == Kind::File && i.nlink == 1 { self.closes_of(&mut ns, i.ino)?.len() } else { 0 };
        self.room(3 + closes, dir.write_bound())?;
        dir.remove(name);
        if want_dir {
            p.nlink = p.nlink.saturating_sub(1);
        }
        self.write_dir(&mut ns, &mut p, dir)?;
        self.drop_link(&mut ns, i)
    }

    /// One name fewer: the inode and its object go with the last one.
    pub(crate) fn drop_link(&self, ns: &mut Ns, mut i: Inode) -> Result<()> {
        i.nlink = if i.kind == Kind::Dir { 0 } else { i.nlink.saturating_sub(1) };
        let held = Self::held(ns, i.ino);
        if i.nlink > 0 || (held && i.kind == Kind::File) {
            // An open file with no name left stays readable until released
            // and forgotten.
            i.ctime = now();
            if i.nlink == 0 {
                ns.orphans.insert(i.ino);
            }
            return self.save(ns, &i);
        }
        self.free_inode(ns, &i)
    }

    /// The record and the object go (the record first: a crash between
    /// leaks the object, never leaves a record pointing at a freed one).
    fn free_inode(&self, ns: &mut Ns, i: &Inode) -> Result<()> {
        // Data still queued behind for it is never written.
        if let (Some(w), true) = (&self.write_behind, i.object != 0) {
            w.discard(i.object);
        }
        self.forget_owed(ns, i.ino);
        ns.dirty.remove(&i.ino);
        ns.cached.remove(&i.ino);
        ns.dirs.remove(&i.ino);
        self.write_table(ns, i.ino * RECORD as u64, &[0u8; RECORD])?;
        // Close versions go with the file's last name: no name leads to
        // them any more (a volume snapshot's `dir@N` still recovers the
        // file). Named file snapshots stay until deleted by number.
        // An object no volume snapshot saw goes whole once its versions
        // go: its tags with it (one VolDelete, no SnapDelete each).
        let going = if i.object != 0 && i.epoch >= ns.last_volume { i.object } else { 0 };
        let mut whole = false;
        if i.kind == Kind::File {
            let closes = self.closes_of(ns, i.ino)?;
            whole = self.drop_file_versions(ns, i.ino, &closes, going)?;
        }
        if whole || (i.object != 0 && !self.retire(ns, i)?) {
            self.pool.delete_object(i.object)?;
        }
        Ok(())
    }

    pub fn setattr(&self, ino: u64, s: &SetAttr) -> Result<Attr> {
        self.writable()?;
        let mut ns = self.lock();
        let mut i = self.inode(&mut ns, ino)?;
        let t = now();
        if let Some(size) = s.size {
            self.before_change(&mut ns, &mut i)?;
            self.truncate(&mut ns, &mut i, size)?;
            i.mtime = t;
        }
        i.perm = s.perm.map_or(i.perm, |m| m & 0o7777);
        i.uid = s.uid.unwrap_or(i.uid);
        i.gid = s.gid.unwrap_or(i.gid);
        i.atime = s.atime.unwrap_or(i.atime);
        i.mtime = s.mtime.unwrap_or(i.mtime);
        i.ctime = t;
        if s.times_only() {
            // Times are kept with the write's pending size and mtime
            // (saved at the next sync, commit, close version or volume
            // snapshot): the writeback cache sends one such setattr at
            // every close of a written file, a record write each.
            self.defer(&mut ns, i.clone())?;
        } else if s.perm.is_some() && i.acl & HAS_ACCESS != 0 {
            // The list follows the mode; saves the inode with it.
            self.chmod_acl(&mut ns, &mut i)?;
        } else {
            self.save(&mut ns, &i)?;
        }
        Ok(self.attr(&i))
    }

    /// Keep `i`'s change with the pending ones (saved past DIRTY_MAX).
    fn defer(&self, ns: &mut Ns, i: Inode) -> Result<()> {
        ns.dirty.insert(i.ino, i);
        if ns.dirty.len() > DIRTY_MAX {
            self.save_dirty(ns)?;
        }
        Ok(())
    }

    /// Clear set-user-ID, and set-group-ID when group-executable (as
    /// Linux's `should_remove_suid`), of a regular file: the mount asks
    /// the kernel to leave this to it (FUSE_HANDLE_KILLPRIV_V2), for a
    /// write or truncate by an unprivileged caller and any chown.
    /// True when a bit went.
    pub fn kill_suid(&self, ino: u64) -> Result<bool> {
        self.writable()?;
        let mut ns = self.lock();
        let mut i = self.inode(&mut ns, ino)?;
        let sgid = if i.perm & 0o010 != 0 { 0o2000 } else { 0 };
        let kill = i.perm & (0o4000 | sgid);
        if i.kind != Kind::File || kill == 0 {
            return Ok(false);
        }
        i.perm &= !kill;
        i.ctime = now();
        self.save(&mut ns, &i)?;
        Ok(true)
    }

    /// Shrinking zeroes everything past the new end (whole blocks are
    /// unmapped): an older, larger size can never show stale bytes.
    fn truncate(&self, ns: &mut Ns, i: &mut Inode, size: u64) -> Result<()> {
        if i.kind != Kind::File {
            return Err(if i.kind == Kind::Dir { FsError::IsDir } else { FsError::Invalid("truncate of a symlink") });
        }
        if size > MAX_FILE_SIZE {
            return Err(FsError::TooLarge);
        }
        if size < i.size && i.object != 0 {
            self.settle(ns, i.object);
            self.pool.write_zeroes(i.object, size, MAX_FILE_SIZE - size, false, false)?;
        }
        i.size = size;
        Ok(())
    }

    /// Read up to `len` bytes at `offset` (holes are zeros; short at EOF).
    pub fn read(&self, ino: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        let (object, size) = {
            let mut ns = self.lock();
            let i = self.inode(&mut ns, ino)?;
            if i.kind == Kind::Dir {
                return Err(FsError::IsDir);
            }
            self.settle(&mut ns, i.object);
            (i.object, i.size)
        };
        let n = size.saturating_sub(offset).min(u64::from(len)) as usize;
        let mut buf = vec![0u8; n];
        if n > 0 && object != 0 {
            self.read_object(object, offset, &mut buf)?;
            self.read_ahead(object, offset, &buf, size);
        }
        Ok(buf)
    }

    /// Write data at `offset`; the new size and mtime are saved at the
    /// next fsync, close or setattr (or when many inodes wait).
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<u32> {
        self.writable()?;
        let mut ns = self.lock();
        let mut i = self.inode(&mut ns, ino)?;
        if i.kind != Kind::File {
            return Err(FsError::IsDir);
        }
        let end = offset.checked_add(data.len() as u64).filter(|&e| e <= MAX_FILE_SIZE).ok_or(FsError::TooLarge)?;
        self.check_quota(&mut ns, data.len() as u64)?;
        self.before_change(&mut ns, &mut i)?;
        if i.object == 0 {
            i.object = self.pool.create_object(self.id, OBJECT_SIZE, None)?;
            self.save(&mut ns, &i)?;
        }
        // Under a quota a write goes through at once: the quota counts
        // allocated blocks, which queued data has not yet.
        let behind = match &self.write_behind {
            Some(w) if ns.header.quota == 0 => w.push(ino, i.object, offset, data)?,
            _ => false,
        };
        if !behind {
            self.settle(&mut ns, i.object);
            self.write_now(i.object, offset, data)?;
        }
        i.size = i.size.max(end);
        i.mtime = now();
        i.ctime = i.mtime;
        self.defer(&mut ns, i)?;
        Ok(data.len() as u32)
    }

    /// Write file data through at once.
    fn write_now(&self, object: u32, offset: u64, data: &[u8]) -> Result<()> {
        match self.pool.write(object, offset, data, false) {
            // Space freed by deletes comes back at the commit that makes
            // them durable (the periodic commit may not have run yet):
            // commit, then try once more.
            Err(tarn_engine::EngineError::NoSpace) => {
                self.pool.flush()?;
                self.pool.write(object, offset, data, false)?;
            }
            r => r?,
        }
        Ok(())
    }

    /// Wait for `object`'s writes queued behind (0: none); hold the
    /// namespace lock (`ns`), before the change that needs them written.
    pub(crate) fn settle(&self, _ns: &mut Ns, object: u32) {
        if let (Some(w), true) = (&self.write_behind, object != 0) {
            w.settle(Some(object));
        }
    }

    /// Wait for every write queued behind (before pending records are
    /// saved and committed).
    pub(crate) fn settle_all(&self, _ns: &mut Ns) {
        if let Some(w) = &self.write_behind {
            w.settle(None);
        }
    }

    /// Write file data behind from now on, `bound` bytes queued at most
    /// (0: off; a view has none).
    pub fn start_write_behind(&mut self, bound: usize) -> Result<()> {
        if bound > 0 && self.view.is_none() {
            self.write_behind = Some(crate::data::writebehind::WriteBehind::start(self.pool.clone(), bound)?);
        }
        Ok(())
    }

    /// What the write-behind did so far (None: off).
    pub fn write_behind_stats(&self) -> Option<crate::data::writebehind::WriteBehindStats> {
        self.write_behind.as_ref().map(|w| w.stats())
    }

    /// Write out what is queued behind and stop its thread (unmount).
    pub fn stop_write_behind(&self) {
        if let Some(w) = &self.write_behind {
            w.stop();
            let s = w.stats();
            log::info!(
                "write-behind: {} writes queued ({} MiB), {} through at once, {} written again, {} lost, {} dropped (file deleted first)",
                s.queued,
                s.queued_bytes >> 20,
                s.direct,
                s.retried,
                s.lost,
                s.discarded
            );
        }
    }

    /// Refuse a write of `more` bytes past the quota. The bound is only
    /// recounted when it says the write would not fit.
    fn check_quota(&self, ns: &mut Ns, more: u64) -> Result<()> {
        let quota = ns.header.quota;
        if quota == 0 {
            return Ok(());
        }
        let mut used = ns.quota_used.unwrap_or(u64::MAX);
        if used.saturating_add(more) > quota {
            used = self.used();
            if used.saturating_add(more) > quota {
                ns.quota_used = Some(used);
                return Err(FsError::Quota);
            }
        }
        ns.quota_used = Some(used + more);
        Ok(())
    }

    /// Own space the volume's table and objects map (O(objects)).
    fn used(&self) -> u64 {
        self.pool.file_volumes().into_iter().find(|f| f.id == self.id).map_or(0, |f| f.allocated)
    }

    /// What a commit of the mount saves first: the close versions owed
    /// (a commit holds the versions of the files closed before it, their
    /// data with them) and every pending inode change.
    fn save_for_commit(&self, ns: &mut Ns) -> Result<()> {
        if let Err(e) = self.take_owed_locked(ns, None) {
            log::error!("close versions owed before a commit: {e}");
        }
        self.save_dirty(ns)
    }

    fn save_dirty(&self, ns: &mut Ns) -> Result<()> {
        self.settle_all(ns);
        let dirty: Vec<Inode> = ns.dirty.drain().map(|(_, i)| i).collect();
        for i in &dirty {
            self.save(ns, i)?;
        }
        Ok(())
    }

    /// Save every pending inode change and commit: durable when it
    /// returns. From any thread (the mount's periodic commit too): the
    /// commit falls between two namespace changes (`commit_then_release`).
    pub fn sync(&self) -> Result<()> {
        let mut ns = self.lock();
        self.save_for_commit(&mut ns)?;
        self.commit_then_release(ns)
    }

    /// Commit what is queued, the namespace lock `ns` held until the commit
    /// has taken its ops and released for its device flush and journal
    /// write. Every commit this crate makes between changes goes this way
    /// (the few made inside a change, a full pool's retry or an attribute
    /// slot's, are that change's own): another thread's namespace change
    /// (the mount's ring queues serve requests on one thread per CPU) is
    /// then in it whole or not at all, so a crash never keeps half of one
    /// (a rename's new name without the old one gone).
    ///
    /// A commit already in flight holds the engine's commit lock through
    /// its device flush (0.5-1 s under PostMark's writes, the periodic
    /// commit or a back-pressure one): that wait is made without the
    /// namespace lock, so requests go on meanwhile (a few times at most;
    /// then with it held).
    pub(crate) fn commit_then_release<'a>(&'a self, mut ns: NsGuard<'a>) -> Result<()> {
        for _ in 0..AWAIT_IN_FLIGHT {
            if !self.pool.commit_in_flight() {
                break;
            }
            drop(ns);
            self.pool.await_commit_in_flight();
            ns = self.lock();
        }
        Ok(self.pool.flush_then(move || drop(ns))?)
    }

    /// `commit_then_release`, taking the namespace lock first.
    pub(crate) fn commit(&self) -> Result<()> {
        self.commit_then_release(self.lock())
    }

    /// fsync(2) of `ino`: `sync`, then the error of a write of it lost
    /// behind since its last fsync, if any (`writebehind.rs`).
    pub fn fsync(&self, ino: u64) -> Result<()> {
        self.save_pending()?;
        self.commit_saved(Some(ino))
    }

    /// The first half of `sync`: every pending inode change (and owed
    /// close version) queued for the next commit.
    pub fn save_pending(&self) -> Result<()> {
        self.save_for_commit(&mut self.lock())
    }

    /// The second half of `sync` or `fsync`: commit (the namespace lock
    /// held only until the commit has taken its ops: other requests go on
    /// through its device flush), then for `fsync_of` the error of a write
    /// of it lost behind since its last fsync, if any.
    pub fn commit_saved(&self, fsync_of: Option<u64>) -> Result<()> {
        self.commit()?;
        match fsync_of.and_then(|ino| self.write_behind.as_ref()?.take_error(ino)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Entries after readdir offset `offset` (0 starts with `.` and `..`).
    pub fn readdir(&self, ino: u64, offset: u64) -> Result<Vec<DirEntry>> {
        let mut ns = self.lock();
        let d = self.inode(&mut ns, ino)?;
        let dir = self.dir_ref(&mut ns, &d)?;
        let dots = [(1, ino, b".".to_vec()), (2, d.parent, b"..".to_vec())];
        let mut out: Vec<DirEntry> = dots
            .into_iter()
            .filter(|(c, _, _)| *c > offset)
            .map(|(cookie, ino, name)| DirEntry { ino, kind: Kind::Dir, name, cookie })
            .collect();
        let rest = dir.after(offset).take(READDIR_BATCH);
        out.extend(rest.map(|e| DirEntry { ino: e.ino, kind: e.kind, name: e.name.clone(), cookie: e.cookie }));
        Ok(out)
    }

    /// SEEK_DATA (`data`) or SEEK_HOLE from `offset`, from the engine's
    /// block status; None: no such offset before the end (ENXIO).
    pub fn seek(&self, ino: u64, offset: u64, data: bool) -> Result<Option<u64>> {
        let (object, size) = {
            let mut ns = self.lock();
            let i = self.inode(&mut ns, ino)?;
            self.settle(&mut ns, i.object);
            (i.object, i.size)
        };
        if offset >= size {
            return Ok(None);
        }
        if object == 0 {
            return Ok(if data { None } else { Some(size) });
        }
        if self.view.is_some() {
            // A snapshot's blocks are not told apart here: all data.
            return Ok(if data { Some(offset) } else { Some(size) });
        }
        let mut at = offset;
        // Each call answers a bounded number of runs; at most 4096 calls.
        for _ in 0..4096 {
            if at >= size {
                break;
            }
            for run in self.pool.block_status(object, at, size - at)? {
                if run.allocated == data {
                    return Ok(Some(at));
                }
                at += run.length;
            }
        }
        Ok(if data { None } else { Some(size) })
    }

    pub fn statfs(&self) -> StatFs {
        let s = self.pool.status();
        let quota = self.lock().header.quota;
        let (mut total, mut free) = (s.size, s.free);
        if quota > 0 {
            let used = self.used();
            total = quota.min(total);
            free = free.min(quota.saturating_sub(used));
        }
        StatFs { total, free, files: self.lock().next_free_ino - 1 }
    }
}
