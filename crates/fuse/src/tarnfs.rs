//! The handlers of a mounted volume: every request goes to
//! `tarn_fs::Versioned` / `FileVolume` and its error becomes the errno.
//! Permissions are the kernel's (`default_permissions`).

use crate::abi::{self, fattr, init};
use crate::decode::{Header, Op, SetattrIn};
use crate::notify::Notifier;
use crate::reply::{self, Reply};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tarn_fs::{AclKind, Attr, Change, FsError, Kind, NewMode, Node, RenameMode, SetAttr, Versioned, XattrMode};

/// How long the kernel may cache the names and attributes of a version
/// directory (a version's file entries are not cached: `TarnFs::gens`)
/// (they change when a version is taken or deleted from here).
const TTL: Duration = Duration::from_secs(1);
/// ... and of a live file: every change to one comes through the kernel
/// (the pool lock keeps every other writer out), which updates or drops
/// what it cached, but for the set-ID bits (`kill_suid`, notified) and
/// the space used, which changes as data is written back (the kernel
/// drops st_blocks at each close). At 1 s, PostMark asked a LOOKUP and a
/// GETATTR of nearly every file it opened.
const TTL_LIVE: Duration = Duration::from_secs(30);

/// The cache time for inode `ino`.
fn ttl(ino: u64) -> &'static Duration {
    if Node::decode(ino) == Node::Live(ino) {
        &TTL_LIVE
    } else {
        &TTL
    }
}
/// Bound of `TarnFs::gens`.
const GENERATIONS: usize = 1 << 16;
/// The file handle of an open for writing (0: read only): its close may
/// take a close version.
const WRITER: u64 = 1;
/// Every open keeps the kernel's page cache of the file: every change to
/// a live file's data comes through this mount (the pool lock keeps every
/// other writer out), and a version's inode number names data that never
/// changes, so what the kernel caches is never stale. Without it each
/// open dropped the file's cache and every read was a request.
const OPEN_FLAGS: u32 = abi::FOPEN_KEEP_CACHE;
/// The mounted volume.
pub struct TarnFs {
    pub(crate) fv: Versioned,
    /// Set by a handler whose answer waits for a commit: the dispatcher
    /// commits after releasing the session's lock (`CommitAfter`).
    pub(crate) commit_after: Option<CommitAfter>,
    /// Commit at every close (`--commit-interval 0`); otherwise the
    /// commit thread commits every interval and close does not.
    pub(crate) commit_on_close: bool,
    pub(crate) writeback_cache: bool,
    /// OPEN is answered ENOSYS (decided at init: without a close-version
    /// or layout policy no open needs to be seen): the kernel then sends no OPEN
    /// and no RELEASE for opens (4,000 of a PostMark smoke run's 22,500
    /// requests) and keeps every file's page cache (its no-open default).
    pub(crate) no_open: bool,
    /// An OPEN was answered ENOSYS: from then on the kernel sends no
    /// RELEASE for the handle a CREATE opens either (it decides when it
    /// makes the handle, before sending the CREATE; this one session
    /// thread answers in order, so a CREATE answered before the ENOSYS
    /// still gets its RELEASE).
    pub(crate) open_refused: bool,
    /// Generations of version inodes a write was refused to (0 for the
    /// others). With no OPEN a version opens for writing, and the
    /// writeback cache takes the data and the new size before the write
    /// back is refused; the kernel trusts the size it has, so the inode it
    /// holds is spoilt. A new generation makes the next lookup (a
    /// version's file entries are not cached) drop it for a fresh one.
    /// Emptied when it reaches GENERATIONS: a generation going back to 0
    /// still differs from the one the kernel holds.
    pub(crate) gens: std::collections::HashMap<u64, u64>,
    /// Notifications to the kernel (the session's /dev/fuse).
    pub(crate) notifier: Notifier,
}

/// The attributes the kernel gets of `at`.
fn attr(at: &Attr) -> reply::Attr {
    let a = &at.inode;
    reply::Attr {
        ino: a.ino,
        size: a.size,
        blocks: at.allocated.div_ceil(512),
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        mode: a.kind.mode_bits() | (a.perm & 0o7777),
        rdev: a.rdev,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        blksize: 4096,
    }
}

/// The d_type of a kind (a directory entry's type).
fn dirent_type(k: Kind) -> u32 {
    k.mode_bits() >> 12
}

/// Whether the caller holds CAP_FSETID (bit 4 of its effective set in
/// /proc/PID/status), as the kernel asks before a truncate keeps the
/// set-ID bits; root when the status cannot be read (the caller is gone).
fn may_keep_setid(req: &Header) -> bool {
    const CAP_FSETID: u64 = 1 << 4;
    let status = std::fs::read_to_string(format!("/proc/{}/status", req.pid)).unwrap_or_default();
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).map(|v| u64::from_str_radix(v.trim(), 16));
    match eff {
        Some(Ok(caps)) => caps & CAP_FSETID != 0,
        _ => req.uid == 0,
    }
}

/// getxattr/listxattr: size 0 asks for the length; a smaller buffer is
/// ERANGE.
fn xattr_reply(size: u32, v: Vec<u8>) -> Reply {
    if size == 0 {
        Reply::XattrSize(v.len() as u32)
    } else if (size as usize) < v.len() {
        Reply::Error(libc::ERANGE)
    } else {
        Reply::Data(v)
    }
}

/// The attributes of a freed inode: no link, no data.
fn gone(ino: u64) -> reply::Attr {
    reply::Attr { ino, mode: libc::S_IFREG, blksize: 4096, ..Default::default() }
}

/// Whether `ino` is a live inode (not a version's).
fn live(ino: u64) -> bool {
    Node::decode(ino) == Node::Live(ino)
}

fn data(r: Result<Vec<u8>, FsError>) -> Reply {
    match r {
        Ok(d) => Reply::Data(d),
        Err(e) => Reply::Error(e.errno()),
    }
}

fn empty(r: Result<(), FsError>) -> Reply {
    match r {
        Ok(()) => Reply::Empty,
        Err(e) => Reply::Error(e.errno()),
    }
}

fn now_ns() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

/// A time of a setattr: now, the one given, or none.
fn set_time(valid: u32, given: u32, now: u32, (secs, nsecs): (u64, u32)) -> Option<i64> {
    if valid & now != 0 {
        Some(now_ns())
    } else if valid & given != 0 {
        Some((secs as i64).saturating_mul(1_000_000_000).saturating_add(nsecs as i64))
    } else {
        None
    }
}

/// The SetAttr a fuse_setattr_in asks for.
fn set_attr(s: &SetattrIn) -> SetAttr {
    let has = |bit: u32| s.valid & bit != 0;
    SetAttr {
        perm: has(fattr::MODE).then_some(s.mode),
        uid: has(fattr::UID).then_some(s.uid),
        gid: has(fattr::GID).then_some(s.gid),
        size: has(fattr::SIZE).then_some(s.size),
        atime: set_time(s.valid, fattr::ATIME, fattr::ATIME_NOW, s.atime),
        mtime: set_time(s.valid, fattr::MTIME, fattr::MTIME_NOW, s.mtime),
    }
}

/// The INIT reply: the writeback cache (the kernel gathers small writes
/// in its page cache and sends them in large requests: a FUSE round trip
/// per 4 KiB write was most of PostMark's time, written back before
/// every flush and fsync), HANDLE_KILLPRIV_V2 (below), 1 MiB WRITEs, and
/// the io_uring transport when `uring` asks for it.
///
/// FUSE_HANDLE_KILLPRIV_V2: this server clears set-user-ID and
/// set-group-ID itself (`kill_suid`), and in return the kernel marks the
/// superblock SB_NOSEC, so a regular file without those bits stops asking
/// `security.capability` before each write(2): that getxattr round trip
/// was 241,447 of the 266,260 requests of a PostMark smoke run.
pub(crate) fn init_reply(offered: u64, minor: u32, max_readahead: u32, wanted: u64) -> reply::InitOut {
    let mut flags = init::ASYNC_READ
        | init::BIG_WRITES
        | init::MAX_PAGES
        | init::HANDLE_KILLPRIV_V2
        | init::POSIX_ACL
        | init::DONT_MASK
        | init::SETXATTR_EXT
        | wanted;
    for (bit, what) in [
        (init::WRITEBACK_CACHE, "the FUSE writeback cache: every write is a request"),
        (init::HANDLE_KILLPRIV_V2, "FUSE_HANDLE_KILLPRIV_V2: every write asks security.capability"),
    ] {
        if flags & bit != 0 && offered & bit == 0 {
            log::warn!("kernel without {what}");
        }
    }
    if flags >> 32 != 0 {
        flags |= init::INIT_EXT;
    }
    flags &= offered;
    reply::InitOut {
        minor: minor.min(abi::KERNEL_MINOR),
        max_readahead,
        flags,
        max_background: 16,
        congestion_threshold: 12,
        max_write: MAX_WRITE,
        max_pages: (MAX_WRITE / 4096) as u16,
    }
}

/// The largest WRITE asked for (the kernel's default page limit, 256).
pub(crate) const MAX_WRITE: u32 = 1 << 20;

impl TarnFs {
    /// INIT: the capabilities this volume wants besides the transport's.
    pub(crate) fn init_flags(&mut self) -> u64 {
        self.no_open = !self.fv.any_policy();
        if !self.fv.live.is_snapshot() && self.writeback_cache {
            init::WRITEBACK_CACHE
        } else {
            0
        }
    }

    /// The end of the session: every pending change committed.
    pub(crate) fn destroy(&mut self) {
        // The kernel drops the RELEASEs it has not sent at unmount.
        if let Err(e) = self.fv.settle_all() {
            log::error!("close versions owed at unmount: {e}");
        }
        if let Err(e) = self.fv.live.unmounted() {
            log::error!("freeing the files unlinked while the kernel held them: {e}");
        }
        if let Err(e) = self.fv.live.sync() {
            log::error!("final commit failed: {e}");
        }
        self.fv.live.stop_write_behind();
    }

    /// Serves one request (INIT and DESTROY are the session's).
    pub(crate) fn handle(&mut self, h: &Header, op: Op<'_>) -> Reply {
        let ino = h.nodeid;
        self.take_owed_versions(ino, &op);
        match op {
            Op::Lookup { name } => self.lookup(ino, name),
            Op::Forget { nlookup } => self.forget(ino, nlookup),
            Op::BatchForget(list) => {
                for (i, n) in list {
                    self.forget(i, n);
                }
                Reply::None
            }
            Op::Getattr => match self.fv.getattr(ino) {
                Ok(a) => Reply::Attr { attr: attr(&a), ttl: *ttl(a.inode.ino) },
                Err(e) => Reply::Error(e.errno()),
            },
            Op::Setattr(s) => self.setattr(h, &s),
            Op::Readlink => data(self.fv.readlink(ino)),
            Op::Symlink { name, target } => {
                let r = self.fv.writable(ino);
                self.entry(r.and_then(|p| self.fv.live.symlink(p, name, target, h.uid, h.gid)))
            }
            // The umask is this server's to apply (FUSE_DONT_MASK): not
            // under a directory with a default access control list.
            Op::Mknod { mode, rdev, umask, name } => self.mknod(h, NewMode { perm: mode, umask }, rdev, name),
            Op::Mkdir { mode, umask, name } => self.make(h, Kind::Dir, NewMode { perm: mode, umask }, name),
            Op::Unlink { name } => self.unlink(ino, name),
            Op::Rmdir { name } => empty(self.fv.writable(ino).and_then(|p| self.fv.live.rmdir(p, name))),
            Op::Rename { newdir, flags, name, newname } => self.rename(h, ino, name, newdir, newname, flags),
            Op::Link { oldnodeid, newname } => {
                let r = self.fv.writable(oldnodeid).and_then(|i| Ok((i, self.fv.writable(ino)?)));
                self.entry(r.and_then(|(i, np)| self.fv.live.link(i, np, newname)))
            }
            Op::Open { flags } => self.open(ino, flags as i32),
            Op::Release { fh } => self.release(ino, fh),
            Op::Read { offset, size } => data(self.fv.read(ino, offset, size)),
            Op::Write { offset, write_flags, data } => self.write(ino, offset, data, write_flags),
            Op::Flush { fh } => self.flush(ino, fh),
            Op::Fsync => self.sync(Some(ino)),
            Op::Fsyncdir => self.sync(None),
            Op::Opendir => Reply::Open { fh: 0, flags: 0 },
            Op::Releasedir => Reply::Empty,
            Op::Readdir { offset, size } => self.readdir(ino, offset, size),
            Op::Setxattr { flags, setxattr_flags, name, value } => match AclKind::of_name(name) {
                Some(k) => self.set_acl(ino, k, value, setxattr_flags),
                None => self.setxattr(ino, name, value, flags as i32),
            },
            Op::Removexattr { name } => empty(self.fv.writable(ino).and_then(|i| match AclKind::of_name(name) {
                Some(k) => self.fv.live.remove_acl(i, k),
                None => self.fv.live.remove_xattr(i, name),
            })),
            Op::Listxattr { size } => self.listxattr(ino, size),
            Op::Getxattr { size, name } => self.getxattr(ino, name, size),
            Op::Statfs => self.statfs(),
            Op::Create { mode, umask, name } => self.create(h, ino, NewMode { perm: mode, umask }, name),
            Op::Lseek { offset, whence } => self.lseek(ino, offset, whence as i32),
            Op::Interrupt => Reply::None,
            Op::Init { .. } | Op::Destroy | Op::Other(_) => Reply::Error(libc::ENOSYS),
        }
    }

    /// An entry reply: the kernel's lookup count of a live inode goes up
    /// by one (its forget brings it down; an unlinked file stays until then).
    fn entry(&self, r: Result<Attr, FsError>) -> Reply {
        match r {
            Ok(a) => {
                let ino = a.inode.ino;
                if live(ino) {
                    self.fv.live.looked_up(ino);
                }
                let ttl = if !live(ino) && a.inode.kind == Kind::File { Duration::ZERO } else { *ttl(ino) };
                let generation = self.gens.get(&ino).copied().unwrap_or(0);
                Reply::Entry(reply::Entry { attr: attr(&a), generation, entry_ttl: ttl, attr_ttl: ttl })
            }
            Err(e) => Reply::Error(e.errno()),
        }
    }

    /// `setfattr -n user.tarn.snapshot -v NAME FILE`: a per-file snapshot.
    fn snap_file(&self, ino: u64, label: Result<&str, FsError>) -> Result<(), FsError> {
        let i = self.fv.writable(ino)?;
        self.fv.live.snap_file(i, label?)?;
        self.fv.forget_views();
        Ok(())
    }

    /// Close versions owed (`tarn_fs` `owed.rs`) are taken before a
    /// request that may change bytes they hold of the file it names (a
    /// write below their end, a truncate, anything unknown), all of them
    /// before a setxattr (a volume or file snapshot numbers after them).
    /// Requests that change nothing or spare those bytes (an append, a
    /// chmod, a new link) take none: they wait for the next commit's batch.
    fn take_owed_versions(&self, ino: u64, op: &Op<'_>) {
        // Every request passes here: nothing built when nothing is owed.
        if !self.fv.owes_versions() || changes_nothing(op) {
            return;
        }
        let change = match op {
            // A volume or file snapshot numbers after every owed version.
            Op::Setxattr { .. } => return self.report_owed(self.fv.take_owed(&[], true)),
            // A new name changes no data (nor the directory's: not a file).
            Op::Link { .. } => return,
            Op::Setattr(s) if s.valid & fattr::SIZE != 0 => Change::Size(s.size),
            Op::Setattr(_) => Change::Attributes,
            Op::Write { offset, data, .. } => Change::Write { offset: *offset, data },
            // OPEN with O_TRUNC (changes_nothing let the others through).
            Op::Open { .. } => Change::Size(0),
            _ => Change::Data,
        };
        self.report_owed(self.fv.take_owed_before(ino, change));
    }

    fn report_owed(&self, r: Result<(), FsError>) {
        if let Err(e) = r {
            log::error!("close version owed: {e}");
        }
    }

    /// Everything pending saved now; the commit after the session's lock
    /// is released (`CommitAfter`). `fsync_of`: the file an fsync names.
    fn sync(&mut self, fsync_of: Option<u64>) -> Reply {
        if let Err(e) = self.fv.live.save_pending() {
            log::error!("commit failed: {e}");
            return Reply::Error(e.errno());
        }
        self.commit_after(fsync_of)
    }

    /// Answer Empty once the pool committed, outside the session's lock.
    fn commit_after(&mut self, fsync_of: Option<u64>) -> Reply {
        self.commit_after = Some(CommitAfter { live: self.fv.live.clone(), fsync_of });
        Reply::Empty
    }

    fn lookup(&mut self, parent: u64, name: &[u8]) -> Reply {
        if let Err(e) = self.fv.settle_view(parent, Some(name)) {
            log::error!("close version owed before a lookup of versions: {e}");
        }
        let r = self.fv.lookup(parent, name);
        if let (Ok(a), Node::Live(p)) = (&r, Node::decode(parent)) {
            if a.inode.kind == Kind::File && live(a.inode.ino) {
                self.fv.noted(p, name, a.inode.ino);
            }
        }
        self.entry(r)
    }

    fn forget(&mut self, ino: u64, nlookup: u64) -> Reply {
        if live(ino) {
            if let Err(e) = self.fv.live.forgot(ino, nlookup) {
                log::error!("forget of inode {ino}: {e}");
            }
        }
        Reply::None
    }

    fn setattr(&mut self, h: &Header, s: &SetattrIn) -> Reply {
        let ino = h.nodeid;
        let s = set_attr(s);
        // HANDLE_KILLPRIV_V2: a chown, or a truncate by a caller without
        // CAP_FSETID, drops the set-ID bits unless it sets the mode itself.
        let kill = s.perm.is_none() && (s.uid.is_some() || s.gid.is_some() || (s.size.is_some() && !may_keep_setid(h)));
        let killed = |i: u64| if kill { self.fv.live.kill_suid(i).map(|_| i) } else { Ok(i) };
        match self.fv.writable(ino).and_then(killed).and_then(|i| self.fv.live.setattr(i, &s)) {
            Ok(a) => {
                if s.size.is_some() {
                    self.fv.wrote(a.inode.ino);
                }
                Reply::Attr { attr: attr(&a), ttl: *ttl(a.inode.ino) }
            }
            // With the writeback cache the kernel writes a file's times
            // back after its last name went (it may still hold the inode,
            // tarn freed the record at the unlink): a times-only setattr
            // of a freed inode changes nothing anyone can see, and an
            // ENOENT would fail the caller's syncfs.
            Err(FsError::NotFound) if s.times_only() && live(ino) => {
                Reply::Attr { attr: gone(ino), ttl: Duration::ZERO }
            }
            Err(e) => Reply::Error(e.errno()),
        }
    }

    fn make(&mut self, h: &Header, kind: Kind, mode: NewMode, name: &[u8]) -> Reply {
        let r = self.fv.writable(h.nodeid);
        self.entry(r.and_then(|p| self.fv.live.create(p, name, kind, mode, h.uid, h.gid)))
    }

    /// A POSIX access control list the kernel sets (FUSE_POSIX_ACL; it
    /// checked the caller owns the inode): the mode follows it.
    fn set_acl(&mut self, ino: u64, kind: AclKind, value: &[u8], setxattr_flags: u32) -> Reply {
        let kill_sgid = setxattr_flags & abi::SETXATTR_ACL_KILL_SGID != 0;
        empty(self.fv.writable(ino).and_then(|i| self.fv.live.set_acl(i, kind, value, kill_sgid)))
    }

    /// mknod(2): a regular file, fifo, socket or device node (the
    /// kernel checked the caller may make a device).
    fn mknod(&mut self, h: &Header, mode: NewMode, rdev: u32, name: &[u8]) -> Reply {
        match Kind::of_mode(mode.perm) {
            Some(Kind::File) => self.make(h, Kind::File, mode, name),
            Some(kind) if kind.is_special() => {
                let r = self.fv.writable(h.nodeid);
                self.entry(r.and_then(|p| self.fv.live.mknod(p, name, kind, mode, rdev, (h.uid, h.gid))))
            }
            _ => Reply::Error(libc::EINVAL),
        }
    }

    /// `rm foo@/N` deletes file version N of foo; anything else in a
    /// version directory is EROFS.
    fn unlink(&mut self, parent: u64, name: &[u8]) -> Reply {
        if let Node::List(i) = Node::decode(parent) {
            return empty(self.fv.remove_version(i, name));
        }
        empty(self.fv.writable(parent).and_then(|p| self.fv.live.unlink(p, name)))
    }

    fn rename(&mut self, h: &Header, parent: u64, name: &[u8], newparent: u64, newname: &[u8], flags: u32) -> Reply {
        // renameat2's flags (RENAME_WHITEOUT: an overlay file system's
        // upper layer; the whiteout is the caller's, as a mknod's node).
        let whiteout = |no_replace| RenameMode::Whiteout { owner: (h.uid, h.gid), no_replace };
        let mode = match flags {
            0 => RenameMode::Replace,
            libc::RENAME_NOREPLACE => RenameMode::NoReplace,
            libc::RENAME_EXCHANGE => RenameMode::Exchange,
            libc::RENAME_WHITEOUT => whiteout(false),
            f if f == libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE => whiteout(true),
            _ => return Reply::Error(libc::EINVAL),
        };
        let r = self.fv.writable(parent).and_then(|p| Ok((p, self.fv.writable(newparent)?)));
        empty(r.and_then(|(p, np)| self.fv.live.rename_as(p, name, np, newname, mode)))
    }

    fn open(&mut self, ino: u64, flags: i32) -> Reply {
        if self.no_open {
            self.open_refused = true;
            return Reply::Error(libc::ENOSYS);
        }
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        match (Node::decode(ino), writes) {
            (Node::Live(i), _) => self.fv.live.opened(i),
            (_, true) => return Reply::Error(libc::EROFS),
            (_, false) => {}
        }
        if writes {
            if let Err(e) = self.fv.open_write(ino) {
                log::warn!("version or layout policy at open: {e}");
            }
            if flags & libc::O_TRUNC != 0 {
                self.fv.wrote(ino);
            }
            return Reply::Open { fh: WRITER, flags: OPEN_FLAGS };
        }
        Reply::Open { fh: 0, flags: OPEN_FLAGS }
    }

    fn release(&mut self, ino: u64, fh: u64) -> Reply {
        match Node::decode(ino) {
            Node::Live(i) => {
                if fh == WRITER {
                    if let Err(e) = self.fv.release_write(i) {
                        log::error!("close version of inode {i}: {e}");
                    }
                }
                empty(self.fv.live.released(i))
            }
            _ => Reply::Empty,
        }
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8], write_flags: u32) -> Reply {
        // The kernel says when the writer may not keep the set-ID bits
        // (HANDLE_KILLPRIV_V2; it then writes through, not via its cache).
        let kill = write_flags & abi::WRITE_KILL_SUIDGID != 0;
        let killed = |i: u64| {
            // The kernel keeps the mode it has cached after such a write:
            // tell it the mode changed (attributes only: offset -1).
            if kill && self.fv.live.kill_suid(i)? {
                if let Err(e) = self.notifier.inval_inode(ino, -1, 0) {
                    log::warn!("invalidating the attributes of inode {ino}: {e}");
                }
            }
            Ok(i)
        };
        match self.fv.writable(ino).and_then(killed).and_then(|i| self.fv.live.write(i, offset, data)) {
            Ok(n) => {
                self.fv.wrote(ino);
                Reply::Written(n)
            }
            Err(e) => {
                if !live(ino) {
                    if self.gens.len() >= GENERATIONS {
                        self.gens.clear();
                    }
                    *self.gens.entry(ino).or_insert(0) += 1;
                }
                Reply::Error(e.errno())
            }
        }
    }

    /// close(2): with `--commit-interval 0` committed before close
    /// returns, the last writer's close of a modified, versioned file
    /// taking its close version first (docs: *File volumes*).
    fn flush(&mut self, ino: u64, fh: u64) -> Reply {
        // Under a commit interval a flush has nothing to do: the data is
        // the kernel's and ours already (written back before the flush),
        // durable at the next commit, and a close version is taken at the
        // last writer's RELEASE (or by the first look at the file's
        // versions before it: `Versioned::settle`). ENOSYS tells the
        // kernel to send no more (it still writes a file's cached data
        // back at close and reports its errors there): a round trip fewer
        // per close, read-only ones too.
        if !self.commit_on_close {
            return Reply::Error(libc::ENOSYS);
        }
        // A version that cannot be taken (the engine's snapshot bound, a
        // full pool) does not fail the close: the data is committed.
        if fh == WRITER {
            if let Err(e) = self.fv.closed_write(ino) {
                log::error!("close version of inode {ino}: {e}");
            }
        }
        self.sync(None)
    }

    fn readdir(&mut self, ino: u64, offset: u64, size: u32) -> Reply {
        if let Err(e) = self.fv.settle_view(ino, None) {
            log::error!("close version owed before a listing of versions: {e}");
        }
        match self.fv.readdir(ino, offset) {
            Ok(list) => {
                let mut out = Vec::with_capacity(size as usize);
                for e in list {
                    if !reply::add_dirent(&mut out, size as usize, e.ino, e.cookie, dirent_type(e.kind), &e.name) {
                        break;
                    }
                }
                Reply::Data(out)
            }
            Err(e) => Reply::Error(e.errno()),
        }
    }

    /// Volume snapshots from a script on the mount: setting
    /// `user.tarn.snapshot` on the root to NAME takes snapshot NAME,
    /// `user.tarn.snapshot.delete` deletes it, `user.tarn.version.delete`
    /// deletes version N (as `foo@` names it). Other `user.*` names are stored (`xattr.rs`).
    fn setxattr(&mut self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Reply {
        let snap = std::str::from_utf8(value).map_err(|_| FsError::Invalid("snapshot name is not UTF-8"));
        // A volume snapshot, its delete or a version's delete is a
        // namespace change like a mkdir: done at once, durable with the next commit
        // (the timed one, an fsync, `sync MOUNT`), never split from the
        // changes before it. It does not force a commit of its own: a
        // commit's device flush holds up the writes behind
        // (ARCHITECTURE.md *Snapshots from the mount*).
        let r = match (ino, name) {
            (tarn_fs::ROOT, b"user.tarn.snapshot") => {
                self.fv.forget_views();
                snap.and_then(|n| self.fv.live.queue_snap_create(n)).map(drop)
            }
            (tarn_fs::ROOT, b"user.tarn.snapshot.delete") => {
                self.fv.forget_views();
                snap.and_then(|n| self.fv.live.queue_snap_delete(n))
            }
            (tarn_fs::ROOT, b"user.tarn.version.delete") => self.fv.delete_version(value),
            (_, b"user.tarn.snapshot") => self.snap_file(ino, snap),
            // The file's own layout (tarn_fs `layout.rs`): not stored as
            // an attribute, so not listed, like the other control names.
            (_, b"user.tarn.layout") => self.fv.set_layout(ino, value),
            (_, n) if !n.starts_with(tarn_fs::namespace::xattr::CONTROL) => {
                let mode = match flags {
                    0 => XattrMode::Any,
                    libc::XATTR_CREATE => XattrMode::Create,
                    libc::XATTR_REPLACE => XattrMode::Replace,
                    _ => return Reply::Error(libc::EINVAL),
                };
                return empty(self.fv.writable(ino).and_then(|i| self.fv.live.set_xattr(i, n, value, mode)));
            }
            _ => return Reply::Error(libc::ENOTSUP),
        };
        match r {
            Ok(()) => Reply::Empty,
            Err(e) => {
                log::warn!("{} by setxattr: {e}", String::from_utf8_lossy(name));
                Reply::Error(e.errno())
            }
        }
    }

    /// The stored `user.*` names (tarn's own `user.tarn.*` answers are
    /// not stored, so not listed).
    fn listxattr(&mut self, ino: u64, size: u32) -> Reply {
        match self.fv.list_xattrs(ino) {
            Ok(v) => xattr_reply(size, v),
            Err(e) => Reply::Error(e.errno()),
        }
    }

    /// `user.tarn.version.type` of a version (`foo@/N`, `foo@N`):
    /// volume, file or close; `user.tarn.layout` of a live file. Other `user.*` names: as stored (in a
    /// version, as the version keeps them); other namespaces: ENODATA.
    fn getxattr(&mut self, ino: u64, name: &[u8], size: u32) -> Reply {
        let r = if name == b"user.tarn.version.type" {
            match self.fv.version_type(ino) {
                Ok(Some(k)) => Ok(k.as_str().as_bytes().to_vec()),
                Ok(None) => Err(FsError::NoData),
                Err(e) => Err(e),
            }
        } else if name == b"user.tarn.layout" {
            self.fv.layout(ino)
        } else {
            self.fv.get_xattr(ino, name)
        };
        match r {
            Ok(v) => xattr_reply(size, v),
            Err(e) => Reply::Error(e.errno()),
        }
    }

    fn statfs(&mut self) -> Reply {
        let s = self.fv.live.statfs();
        let free = s.free / 4096;
        let max_files = tarn_fs::MAX_INODES;
        Reply::Statfs(reply::Statfs {
            blocks: s.total / 4096,
            bfree: free,
            bavail: free,
            files: s.files,
            ffree: max_files - s.files,
            bsize: 4096,
            namelen: 255,
            frsize: 4096,
        })
    }

    fn create(&mut self, h: &Header, parent: u64, mode: NewMode, name: &[u8]) -> Reply {
        let r = self.fv.writable(parent);
        match r.and_then(|p| self.fv.live.create(p, name, Kind::File, mode, h.uid, h.gid)) {
            Ok(a) => {
                let ino = a.inode.ino;
                self.fv.live.looked_up(ino);
                if !self.open_refused {
                    self.fv.live.opened(ino);
                }
                if let Ok(p) = self.fv.writable(parent) {
                    self.fv.noted(p, name, ino);
                }
                if let Err(e) = self.fv.open_write(ino) {
                    log::warn!("version or layout policy at create: {e}");
                }
                let t = *ttl(ino);
                let entry = reply::Entry { attr: attr(&a), generation: 0, entry_ttl: t, attr_ttl: t };
                Reply::Create { entry, fh: WRITER, flags: OPEN_FLAGS }
            }
            Err(e) => Reply::Error(e.errno()),
        }
    }

    fn lseek(&mut self, ino: u64, offset: u64, whence: i32) -> Reply {
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return Reply::Error(libc::EINVAL),
        };
        match self.fv.seek(ino, offset, data) {
            Ok(Some(at)) => Reply::Lseek(at),
            Ok(None) => Reply::Error(libc::ENXIO),
            Err(e) => Reply::Error(e.errno()),
        }
    }
}

/// A commit a reply waits for, made without the session's lock: the
/// device flush of a commit (70 ms in PostMark) does not hold up other
/// requests meanwhile (the namespace lock was released too).
pub(crate) struct CommitAfter {
    live: std::sync::Arc<tarn_fs::FileVolume>,
    fsync_of: Option<u64>,
}

impl CommitAfter {
    /// `reply` once committed, or the commit's error.
    pub(crate) fn run(self, reply: Reply) -> Reply {
        match self.live.commit_saved(self.fsync_of) {
            Ok(()) => reply,
            Err(e) => {
                log::error!("commit failed: {e}");
                Reply::Error(e.errno())
            }
        }
    }
}

/// Requests that change no file (nor number a version): an owed close
/// version waits through them. OPEN with O_TRUNC truncates.
fn changes_nothing(op: &Op<'_>) -> bool {
    match op {
        Op::Open { flags } => *flags as i32 & libc::O_TRUNC == 0,
        _ => matches!(
            op,
            Op::Lookup { .. }
                | Op::Forget { .. }
                | Op::BatchForget(_)
                | Op::Interrupt
                | Op::Getattr
                | Op::Readlink
                | Op::Opendir
                | Op::Read { .. }
                | Op::Readdir { .. }
                | Op::Statfs
                | Op::Release { .. }
                | Op::Releasedir
                | Op::Flush { .. }
                | Op::Getxattr { .. }
                | Op::Listxattr { .. }
                | Op::Lseek { .. }
        ),
    }
}
