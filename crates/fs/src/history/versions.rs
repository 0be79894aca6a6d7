//! Version directories (Loris; docs/ARCHITECTURE.md *File volumes*,
//! versioning): a mounted volume shows, next to every name `foo`,
//!
//! - `foo@`: a read-only directory listing foo's versions by number;
//! - `foo@N`: foo as volume snapshot number N saw it (a file, or for a
//!   directory the whole subtree scoped to N: `cp -a dir@3 restored`);
//!
//! N is the volume snapshot's number (`tarn fs snap list`), never reused,
//! so names stay stable when other snapshots are deleted. A version is
//! found by inode number, so it follows renames, and a hard link's names
//! share one list. Escape rule: a real entry always wins over a version
//! name (a real file `a@1` is opened by its name); the version it hides
//! stays reachable as `a@/1`. Everything here is read-only (EROFS).
//!
//! Inode numbers the kernel sees: live inodes are below 2^32 (MAX_INODES);
//! bit 62 marks an inode of snapshot N (`N << 32 | ino`); bit 61 marks
//! the `foo@` list of inode `ino`.

use crate::error::{FsError, Result};
use crate::history::snap::{FsSnapshot, VersionKind};
use crate::namespace::inode::{Inode, Kind};
use crate::namespace::ns::{Attr, DirEntry, FileVolume};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const SCOPED: u64 = 1 << 62;
const LIST: u64 = 1 << 61;
const INO_MASK: u64 = (1 << 32) - 1;
/// Snapshot numbers a scoped inode can carry (29 bits).
const MAX_NUMBER: u64 = (1 << 29) - 1;
/// Snapshot views kept open (cleared whole past this).
const VIEWS: usize = 1024;

/// What an inode number the kernel holds stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    Live(u64),
    /// Inode `ino` of volume snapshot number `n`.
    Scoped {
        n: u64,
        ino: u64,
    },
    /// The version list `foo@` of live inode `ino`.
    List(u64),
}

impl Node {
    pub fn decode(x: u64) -> Node {
        if x & SCOPED != 0 {
            Node::Scoped { n: (x & !SCOPED) >> 32, ino: x & INO_MASK }
        } else if x & LIST != 0 {
            Node::List(x & INO_MASK)
        } else {
            Node::Live(x)
        }
    }

    pub fn encode(self) -> u64 {
        match self {
            Node::Live(i) => i,
            Node::Scoped { n, ino } => SCOPED | (n << 32) | ino,
            Node::List(i) => LIST | i,
        }
    }
}

/// A mounted file volume with its version directories.
pub struct Versioned {
    /// Shared with the mount's commit thread (`tarn_fuse::mount`).
    pub live: Arc<FileVolume>,
    views: Mutex<Views>,
    /// Open-close versioning state (`close.rs`).
    pub(crate) close: Mutex<crate::history::close::Sessions>,
    /// Close versions are committed before the close returns (the mount
    /// commits at every close); else at the next commit.
    pub commit_at_close: bool,
}

/// Open snapshot views and the snapshot list they were found in (read
/// once: listing reads one header per snapshot).
#[derive(Default)]
struct Views {
    open: HashMap<u64, Arc<FileVolume>>,
    /// With `FileVolume::versions_gen` when read.
    list: Option<(u64, Arc<Vec<FsSnapshot>>)>,
}

impl Versioned {
    pub fn new(live: FileVolume) -> Versioned {
        Versioned {
            live: Arc::new(live),
            views: Mutex::new(Views::default()),
            close: Mutex::default(),
            commit_at_close: true,
        }
    }

    /// The read-only view of volume snapshot number `n` (ENOENT: none).
    fn view(&self, n: u64) -> Result<Arc<FileVolume>> {
        if let Some(v) = self.views.lock().unwrap_or_else(|p| p.into_inner()).open.get(&n) {
            return Ok(v.clone());
        }
        let list = self.snapshots()?;
        let s = list.iter().find(|s| s.number == n).ok_or(FsError::NotFound)?;
        let v = Arc::new(self.live.open_number(s)?);
        let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        if views.open.len() >= VIEWS {
            views.open.clear();
        }
        views.open.insert(n, v.clone());
        Ok(v)
    }

    fn snapshots(&self) -> Result<Arc<Vec<FsSnapshot>>> {
        // Versions taken since (the mount's commit takes owed ones) make
        // the list stale.
        let gen = self.live.versions_gen();
        if let Some((at, l)) = &self.views.lock().unwrap_or_else(|p| p.into_inner()).list {
            if *at == gen {
                return Ok(l.clone());
            }
        }
        let list = Arc::new(self.live.versions()?);
        self.views.lock().unwrap_or_else(|p| p.into_inner()).list = Some((gen, list.clone()));
        Ok(list)
    }

    /// Forget open views and the snapshot list (a snapshot was taken or
    /// deleted).
    pub fn forget_views(&self) {
        *self.views.lock().unwrap_or_else(|p| p.into_inner()) = Views::default();
    }

    /// Delete version `n` (written as in `foo@`), of any kind; a volume
    /// snapshot goes for every file (ENOENT: none, EINVAL: not a number).
    /// A namespace change like an unlink: made at once, durable with the
    /// next commit (ARCHITECTURE.md *Snapshots from the mount*).
    pub fn delete_version(&self, n: &[u8]) -> Result<()> {
        let n = number(n).ok_or(FsError::Invalid("a version is a number as foo@ lists it"))?;
        self.forget_views();
        self.live.queue_delete_version(n)
    }

    /// `rm foo@/N`: deletes file version N of foo (inode `ino`), durable
    /// with the next commit as any unlink. A volume snapshot is every
    /// file's: EROFS here, deleted by name or setfattr.
    pub fn remove_version(&self, ino: u64, name: &[u8]) -> Result<()> {
        let n = number(name).ok_or(FsError::NotFound)?;
        let s = self.version_for(n, ino)?;
        if s.kind == VersionKind::Volume {
            return Err(FsError::ReadOnly("a volume snapshot (delete it with user.tarn.version.delete)"));
        }
        self.forget_views();
        self.live.queue_delete_version(n)
    }

    /// Version `n` as seen from inode `ino`: a volume snapshot, or a file
    /// version of `ino` itself (another file's version: ENOENT).
    fn version_for(&self, n: u64, ino: u64) -> Result<FsSnapshot> {
        let list = self.snapshots()?;
        let s = list.iter().find(|s| s.number == n).ok_or(FsError::NotFound)?;
        match s.kind {
            VersionKind::Volume => Ok(s.clone()),
            _ if s.owner == ino => Ok(s.clone()),
            _ => Err(FsError::NotFound),
        }
    }

    /// What kind version `x` is (`user.tarn.version.type`): for an inode
    /// of a version, None for a live inode or a list.
    pub fn version_type(&self, x: u64) -> Result<Option<VersionKind>> {
        match Node::decode(x) {
            Node::Scoped { n, .. } => {
                let list = self.snapshots()?;
                Ok(Some(list.iter().find(|s| s.number == n).ok_or(FsError::NotFound)?.kind))
            }
            _ => Ok(None),
        }
    }

    fn scoped(n: u64, mut a: Attr) -> Attr {
        a.inode.ino = Node::Scoped { n, ino: a.inode.ino }.encode();
        a
    }

    /// `foo@` as a directory: foo's owner, r-x for all who may read foo.
    fn list_attr(&self, ino: u64) -> Result<Attr> {
        let mut i: Inode = self.live.getattr(ino)?.inode;
        i.ino = Node::List(ino).encode();
        i.kind = Kind::Dir;
        i.perm = 0o555;
        (i.nlink, i.size) = (2, 0);
        Ok(Attr { inode: i, allocated: 0 })
    }

    pub fn getattr(&self, x: u64) -> Result<Attr> {
        match Node::decode(x) {
            Node::Live(i) => self.live.getattr(i),
            Node::Scoped { n, ino } => Ok(Self::scoped(n, self.view(n)?.getattr(ino)?)),
            Node::List(i) => self.list_attr(i),
        }
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        match Node::decode(parent) {
            Node::Live(p) => self.lookup_live(p, name),
            Node::Scoped { n, ino } => Ok(Self::scoped(n, self.view(n)?.lookup(ino, name)?)),
            Node::List(i) => {
                let n = number(name).ok_or(FsError::NotFound)?;
                self.version_for(n, i)?;
                Ok(Self::scoped(n, self.view(n)?.getattr(i)?))
            }
        }
    }

    /// A real entry first (the escape rule), then `foo@` and `foo@N`.
    fn lookup_live(&self, p: u64, name: &[u8]) -> Result<Attr> {
        match self.live.lookup(p, name) {
            Err(FsError::NotFound) if !self.live.is_snapshot() => {}
            other => return other,
        }
        let (base, rest) = version_base(name).ok_or(FsError::NotFound)?;
        let ino = self.live.lookup(p, base)?.inode.ino;
        if rest.is_empty() {
            return self.list_attr(ino);
        }
        let n = number(rest).ok_or(FsError::NotFound)?;
        self.version_for(n, ino)?;
        Ok(Self::scoped(n, self.view(n)?.getattr(ino)?))
    }

    /// Entries after `offset`; a version list has one entry per snapshot
    /// that saw the inode (cookie: the snapshot number + 2).
    pub fn readdir(&self, x: u64, offset: u64) -> Result<Vec<DirEntry>> {
        match Node::decode(x) {
            Node::Live(i) => self.live.readdir(i, offset),
            Node::Scoped { n, ino } => {
                let mut list = self.view(n)?.readdir(ino, offset)?;
                for e in &mut list {
                    e.ino = Node::Scoped { n, ino: e.ino }.encode();
                }
                Ok(list)
            }
            Node::List(i) => self.list_versions(i, offset),
        }
    }

    fn list_versions(&self, ino: u64, offset: u64) -> Result<Vec<DirEntry>> {
        let me = Node::List(ino).encode();
        let mut out = Vec::new();
        for (cookie, name) in [(1, "."), (2, "..")] {
            if cookie > offset {
                out.push(DirEntry { ino: me, kind: Kind::Dir, name: name.into(), cookie });
            }
        }
        // One record read per volume snapshot (no view opened); a file
        // version is listed by its owner, from the catalog alone.
        for s in self.snapshots()?.iter() {
            if s.number + 2 <= offset || s.number > MAX_NUMBER {
                continue;
            }
            let kind = match s.kind {
                VersionKind::Volume => self.live.inode_in(s, ino)?.map(|i| i.kind),
                _ if s.owner == ino => Some(Kind::File),
                _ => None,
            };
            if let Some(kind) = kind {
                let x = Node::Scoped { n: s.number, ino }.encode();
                let name = s.number.to_string().into_bytes();
                out.push(DirEntry { ino: x, kind, name, cookie: s.number + 2 });
            }
        }
        Ok(out)
    }

    pub fn read(&self, x: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        match Node::decode(x) {
            Node::Live(i) => self.live.read(i, offset, len),
            Node::Scoped { n, ino } => self.view(n)?.read(ino, offset, len),
            Node::List(_) => Err(FsError::IsDir),
        }
    }

    pub fn readlink(&self, x: u64) -> Result<Vec<u8>> {
        match Node::decode(x) {
            Node::Live(i) => self.live.readlink(i),
            Node::Scoped { n, ino } => self.view(n)?.readlink(ino),
            Node::List(_) => Err(FsError::Invalid("not a symlink")),
        }
    }

    pub fn seek(&self, x: u64, offset: u64, data: bool) -> Result<Option<u64>> {
        match Node::decode(x) {
            Node::Live(i) => self.live.seek(i, offset, data),
            Node::Scoped { n, ino } => self.view(n)?.seek(ino, offset, data),
            Node::List(_) => Err(FsError::IsDir),
        }
    }

    /// User extended attribute `name` of `x` (of a version: as the
    /// version keeps it); a version list has none.
    pub fn get_xattr(&self, x: u64, name: &[u8]) -> Result<Vec<u8>> {
        match Node::decode(x) {
            Node::Live(i) => self.live.get_xattr(i, name),
            Node::Scoped { n, ino } => self.view(n)?.get_xattr(ino, name),
            Node::List(_) => Err(FsError::NoData),
        }
    }

    /// The names of `x`'s user extended attributes, NUL-terminated.
    pub fn list_xattrs(&self, x: u64) -> Result<Vec<u8>> {
        match Node::decode(x) {
            Node::Live(i) => self.live.list_xattrs(i),
            Node::Scoped { n, ino } => self.view(n)?.list_xattrs(ino),
            Node::List(_) => Ok(Vec::new()),
        }
    }

    /// The live inode a change names, or EROFS for a version.
    pub fn writable(&self, x: u64) -> Result<u64> {
        match Node::decode(x) {
            Node::Live(i) => Ok(i),
            _ => Err(FsError::ReadOnly("a version directory")),
        }
    }
}

/// `foo@REST` split at its last `@` into `foo` (not empty) and `REST`.
pub(crate) fn version_base(name: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = name.iter().rposition(|&b| b == b'@')?;
    (at > 0).then(|| (&name[..at], &name[at + 1..]))
}

/// A version number: decimal digits only, no leading zero, 1..=MAX_NUMBER.
fn number(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 10 || s[0] == b'0' || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok().filter(|&n| n <= MAX_NUMBER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_numbers_round_trip() {
        for n in [Node::Live(1), Node::Live(u32::MAX as u64), Node::Scoped { n: MAX_NUMBER, ino: 7 }, Node::List(9)] {
            assert_eq!(Node::decode(n.encode()), n);
        }
    }

    #[test]
    fn version_numbers() {
        assert_eq!(number(b"12"), Some(12));
        for bad in [&b""[..], b"0", b"01", b"1a", b"-1", b"99999999999"] {
            assert_eq!(number(bad), None, "{bad:?}");
        }
    }
}
