//! tarn file volumes through FUSE (the `fuser` crate, its own mount code
//! through fusermount3: no libfuse needed). A thin adapter: every call
//! goes to `tarn_fs::FileVolume` and its error becomes the errno. One
//! session thread (fuser's loop); permissions are the kernel's
//! (`default_permissions`).

mod slice;

use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tarn_fs::{Attr, FileVolume, FsError, Kind, Node, SetAttr, Versioned, XattrMode};

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
const OPEN_FLAGS: u32 = fuser::consts::FOPEN_KEEP_CACHE;
/// FUSE_HANDLE_KILLPRIV_V2 (protocol 7.33, past fuser 0.15's constants):
/// this server clears set-user-ID and set-group-ID itself (`kill_suid`),
/// and in return the kernel marks the superblock SB_NOSEC, so a regular
/// file without those bits stops asking `security.capability` before
/// each write(2): that getxattr round trip was 241,447 of the 266,260
/// requests of a PostMark smoke run.
const HANDLE_KILLPRIV_V2: u32 = 1 << 28;
/// FUSE_WRITE_KILL_SUIDGID: this write drops the set-ID bits.
const WRITE_KILL_SUIDGID: u32 = 1 << 2;

/// The mounted volume.
pub struct TarnFs {
    fv: Versioned,
    /// Commit at every close (`--commit-interval 0`); otherwise the
    /// commit thread commits every interval and close does not.
    commit_on_close: bool,
    writeback_cache: bool,
    /// OPEN is answered ENOSYS (decided at init: without a close-version
    /// policy no open needs to be seen): the kernel then sends no OPEN
    /// and no RELEASE for opens (4,000 of a PostMark smoke run's 22,500
    /// requests) and keeps every file's page cache (its no-open default).
    no_open: bool,
    /// An OPEN was answered ENOSYS: from then on the kernel sends no
    /// RELEASE for the handle a CREATE opens either (it decides when it
    /// makes the handle, before sending the CREATE; this one session
    /// thread answers in order, so a CREATE answered before the ENOSYS
    /// still gets its RELEASE).
    open_refused: bool,
    /// Generations of version inodes a write was refused to (0 for the
    /// others). With no OPEN a version opens for writing, and the
    /// writeback cache takes the data and the new size before the write
    /// back is refused; the kernel trusts the size it has, so the inode it
    /// holds is spoilt. A new generation makes the next lookup (a
    /// version's file entries are not cached) drop it for a fresh one.
    /// Emptied when it reaches GENERATIONS: a generation going back to 0
    /// still differs from the one the kernel holds.
    gens: std::collections::HashMap<u64, u64>,
    /// Set once the session exists (it owns the channel notices go to).
    notifier: std::sync::Arc<std::sync::OnceLock<fuser::Notifier>>,
}

/// When a mount makes changes durable besides fsync, fdatasync,
/// fsyncdir and unmount.
#[derive(Debug, Clone, Copy)]
pub struct Durability {
    /// Commit pending changes this often (a thread of the mount), as
    /// ext4's journal commit interval (5 s by default there); zero:
    /// commit at every close instead (each close then costs a commit).
    pub commit_interval: Duration,
    /// The kernel's writeback cache (the default): small writes are
    /// gathered into large requests, but a write-back's ENOSPC or EDQUOT
    /// reaches the writer at fsync or close (and the mount's next
    /// syncfs), not at write(2).
    pub writeback_cache: bool,
}

impl Default for Durability {
    fn default() -> Self {
        Durability { commit_interval: Duration::from_secs(5), writeback_cache: true }
    }
}

/// Mount `fv` on `dir` and serve until it is unmounted; every pending
/// change is committed before this returns. The session thread (the
/// caller's) asks for a scheduler slice of `session_slice` (`slice.rs`;
/// zero: the kernel's default).
pub fn mount(
    fv: FileVolume,
    name: &str,
    dir: &Path,
    durability: Durability,
    session_slice: Duration,
) -> std::io::Result<()> {
    // A volume snapshot mounts read-only (the kernel then answers EROFS too).
    let access = if fv.is_snapshot() { MountOption::RO } else { MountOption::RW };
    let options = [
        MountOption::FSName(format!("tarn:{name}")),
        MountOption::Subtype("tarn".into()),
        MountOption::DefaultPermissions,
        access,
    ];
    let interval = durability.commit_interval;
    let mut fv = Versioned::new(fv);
    fv.commit_at_close = interval.is_zero();
    let notifier = std::sync::Arc::new(std::sync::OnceLock::new());
    let fs = TarnFs {
        fv,
        commit_on_close: interval.is_zero(),
        writeback_cache: durability.writeback_cache,
        no_open: false,
        open_refused: false,
        gens: Default::default(),
        notifier: notifier.clone(),
    };
    // The commit thread ends when `stop` is dropped (the session is over).
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let committer = (!interval.is_zero() && !fs.fv.live.is_snapshot()).then(|| {
        let live = fs.fv.live.clone();
        std::thread::Builder::new().name("fs-commit".into()).spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                if let Err(e) = live.sync_between_changes() {
                    log::error!("periodic commit failed: {e}");
                }
            }
        })
    });
    let served = fuser::Session::new(fs, dir, &options).and_then(|mut session| {
        let _ = notifier.set(session.notifier());
        if !session_slice.is_zero() {
            if let Err(e) = slice::ask(session_slice) {
                log::warn!("a {session_slice:?} scheduler slice for the session thread: {e}");
            }
        }
        session.run()
    });
    drop(stop);
    if let Some(Ok(t)) = committer {
        let _ = t.join();
    }
    served
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn nanos(t: TimeOrNow) -> i64 {
    let t = match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    };
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
    }
}

fn attr(at: &Attr) -> FileAttr {
    let a = &at.inode;
    FileAttr {
        ino: a.ino,
        size: a.size,
        blocks: at.allocated.div_ceil(512),
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: file_type(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// Whether the caller holds CAP_FSETID (bit 4 of its effective set in
/// /proc/PID/status), as the kernel asks before a truncate keeps the
/// set-ID bits; root when the status cannot be read (the caller is gone).
fn may_keep_setid(req: &Request<'_>) -> bool {
    const CAP_FSETID: u64 = 1 << 4;
    let status = std::fs::read_to_string(format!("/proc/{}/status", req.pid())).unwrap_or_default();
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).map(|v| u64::from_str_radix(v.trim(), 16));
    match eff {
        Some(Ok(caps)) => caps & CAP_FSETID != 0,
        _ => req.uid() == 0,
    }
}

/// getxattr/listxattr: size 0 asks for the length; a smaller buffer is
/// ERANGE.
fn xattr_reply(reply: ReplyXattr, size: u32, v: &[u8]) {
    if size == 0 {
        reply.size(v.len() as u32)
    } else if (size as usize) < v.len() {
        reply.error(libc::ERANGE)
    } else {
        reply.data(v)
    }
}

fn times_only(s: &SetAttr) -> bool {
    s.perm.is_none() && s.uid.is_none() && s.gid.is_none() && s.size.is_none()
}

/// The attributes of a freed inode: no link, no data.
fn gone(ino: u64) -> FileAttr {
    FileAttr {
        ino,
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// Whether `ino` is a live inode (not a version's).
fn live(ino: u64) -> bool {
    Node::decode(ino) == Node::Live(ino)
}

fn data(reply: ReplyData, r: Result<Vec<u8>, FsError>) {
    match r {
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(e.errno()),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e.errno()),
    }
}

impl TarnFs {
    /// An entry reply: the kernel's lookup count of a live inode goes up
    /// by one (its forget brings it down; an unlinked file stays until then).
    fn entry(&self, reply: ReplyEntry, r: Result<Attr, FsError>) {
        match r {
            Ok(a) => {
                let ino = a.inode.ino;
                if live(ino) {
                    self.fv.live.looked_up(ino);
                }
                let ttl = if !live(ino) && a.inode.kind == Kind::File { &Duration::ZERO } else { ttl(ino) };
                reply.entry(ttl, &attr(&a), self.gens.get(&ino).copied().unwrap_or(0))
            }
            Err(e) => reply.error(e.errno()),
        }
    }

    /// `setfattr -n user.tarn.snapshot -v NAME FILE`: a per-file snapshot.
    fn snap_file(&self, ino: u64, label: Result<&str, FsError>) -> Result<(), FsError> {
        let i = self.fv.writable(ino)?;
        self.fv.live.snap_file(i, label?)?;
        self.fv.forget_views();
        Ok(())
    }

    fn sync(&self, reply: ReplyEmpty) {
        let r = self.fv.live.sync();
        if let Err(e) = &r {
            log::error!("commit failed: {e}");
        }
        empty(reply, r)
    }
}

impl Filesystem for TarnFs {
    /// The writeback cache: the kernel gathers small writes in its page
    /// cache and sends them in large requests (a FUSE round trip per
    /// 4 KiB write was most of PostMark's time), written back before
    /// every flush (close) and fsync.
    fn init(&mut self, _req: &Request<'_>, config: &mut fuser::KernelConfig) -> Result<(), libc::c_int> {
        if !self.fv.live.is_snapshot() && self.writeback_cache {
            if let Err(missing) = config.add_capabilities(fuser::consts::FUSE_WRITEBACK_CACHE) {
                log::warn!("kernel without the FUSE writeback cache ({missing:#x}): every write is a request");
            }
        }
        if let Err(missing) = config.add_capabilities(HANDLE_KILLPRIV_V2) {
            log::warn!("kernel without FUSE_HANDLE_KILLPRIV_V2 ({missing:#x}): every write asks security.capability");
        }
        self.no_open = !self.fv.any_policy();
        Ok(())
    }

    fn destroy(&mut self) {
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
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if let Err(e) = self.fv.settle_view(parent, Some(name.as_bytes())) {
            log::error!("close version owed before a lookup of versions: {e}");
        }
        let r = self.fv.lookup(parent, name.as_bytes());
        if let (Ok(a), Node::Live(p)) = (&r, Node::decode(parent)) {
            if a.inode.kind == Kind::File && Node::decode(a.inode.ino) == Node::Live(a.inode.ino) {
                self.fv.noted(p, name.as_bytes(), a.inode.ino);
            }
        }
        self.entry(reply, r)
    }

    fn forget(&mut self, _req: &Request<'_>, ino: u64, nlookup: u64) {
        if live(ino) {
            if let Err(e) = self.fv.live.forgot(ino, nlookup) {
                log::error!("forget of inode {ino}: {e}");
            }
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.fv.getattr(ino) {
            Ok(a) => reply.attr(ttl(a.inode.ino), &attr(&a)),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn setattr(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let s = SetAttr { perm: mode, uid, gid, size, atime: atime.map(nanos), mtime: mtime.map(nanos) };
        // HANDLE_KILLPRIV_V2: a chown, or a truncate by a caller without
        // CAP_FSETID, drops the set-ID bits unless it sets the mode itself
        // (the kernel's FATTR_KILL_SUIDGID says so, but fuser 0.15 does not
        // pass it on).
        let kill = mode.is_none() && (uid.is_some() || gid.is_some() || (size.is_some() && !may_keep_setid(req)));
        let killed = |i: u64| if kill { self.fv.live.kill_suid(i).map(|_| i) } else { Ok(i) };
        match self.fv.writable(ino).and_then(killed).and_then(|i| self.fv.live.setattr(i, &s)) {
            Ok(a) => {
                if size.is_some() {
                    self.fv.wrote(a.inode.ino);
                }
                reply.attr(ttl(a.inode.ino), &attr(&a))
            }
            // With the writeback cache the kernel writes a file's times
            // back after its last name went (it may still hold the inode,
            // tarn freed the record at the unlink): a times-only setattr
            // of a freed inode changes nothing anyone can see, and an
            // ENOENT would fail the caller's syncfs.
            Err(FsError::NotFound) if times_only(&s) && Node::decode(ino) == Node::Live(ino) => {
                reply.attr(&Duration::ZERO, &gone(ino))
            }
            Err(e) => reply.error(e.errno()),
        }
    }

    fn readlink(&mut self, _req: &Request<'_>, ino: u64, reply: ReplyData) {
        data(reply, self.fv.readlink(ino))
    }

    fn mknod(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            // Devices, fifos and sockets are not kept yet.
            return reply.error(libc::EPERM);
        }
        let r = self.fv.writable(parent);
        self.entry(
            reply,
            r.and_then(|p| self.fv.live.create(p, name.as_bytes(), Kind::File, mode & !umask, req.uid(), req.gid())),
        )
    }

    fn mkdir(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let r = self.fv.writable(parent);
        self.entry(
            reply,
            r.and_then(|p| self.fv.live.create(p, name.as_bytes(), Kind::Dir, mode & !umask, req.uid(), req.gid())),
        )
    }

    /// `rm foo@/N` deletes file version N of foo; anything else in a
    /// version directory is EROFS.
    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        if let Node::List(i) = Node::decode(parent) {
            return empty(reply, self.fv.remove_version(i, name.as_bytes()));
        }
        empty(reply, self.fv.writable(parent).and_then(|p| self.fv.live.unlink(p, name.as_bytes())))
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fv.writable(parent).and_then(|p| self.fv.live.rmdir(p, name.as_bytes())))
    }

    fn symlink(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, target: &Path, reply: ReplyEntry) {
        let target = target.as_os_str().as_bytes();
        let r = self.fv.writable(parent);
        self.entry(reply, r.and_then(|p| self.fv.live.symlink(p, name.as_bytes(), target, req.uid(), req.gid())))
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
        reply: ReplyEmpty,
    ) {
        if flags != 0 {
            // RENAME_NOREPLACE / EXCHANGE / WHITEOUT: not yet.
            return reply.error(libc::EINVAL);
        }
        let r = self.fv.writable(parent).and_then(|p| Ok((p, self.fv.writable(newparent)?)));
        empty(reply, r.and_then(|(p, np)| self.fv.live.rename(p, name.as_bytes(), np, newname.as_bytes())))
    }

    fn link(&mut self, _req: &Request<'_>, ino: u64, newparent: u64, newname: &OsStr, reply: ReplyEntry) {
        let r = self.fv.writable(ino).and_then(|i| Ok((i, self.fv.writable(newparent)?)));
        self.entry(reply, r.and_then(|(i, np)| self.fv.live.link(i, np, newname.as_bytes())))
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        if self.no_open {
            self.open_refused = true;
            return reply.error(libc::ENOSYS);
        }
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        match (Node::decode(ino), writes) {
            (Node::Live(i), _) => self.fv.live.opened(i),
            (_, true) => return reply.error(libc::EROFS),
            (_, false) => {}
        }
        if writes {
            if let Err(e) = self.fv.open_write(ino) {
                log::warn!("version policy at open: {e}");
            }
            if flags & libc::O_TRUNC != 0 {
                self.fv.wrote(ino);
            }
            return reply.opened(WRITER, OPEN_FLAGS);
        }
        reply.opened(0, OPEN_FLAGS);
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        match Node::decode(ino) {
            Node::Live(i) => {
                if fh == WRITER {
                    if let Err(e) = self.fv.release_write(i) {
                        log::error!("close version of inode {i}: {e}");
                    }
                }
                empty(reply, self.fv.live.released(i))
            }
            _ => reply.ok(),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        data(reply, self.fv.read(ino, offset.max(0) as u64, size))
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        // The kernel says when the writer may not keep the set-ID bits
        // (HANDLE_KILLPRIV_V2; it then writes through, not via its cache).
        let kill = write_flags & WRITE_KILL_SUIDGID != 0;
        let killed = |i: u64| {
            // The kernel keeps the mode it has cached after such a write:
            // tell it the mode changed (attributes only: offset -1).
            if kill && self.fv.live.kill_suid(i)? {
                if let Some(Err(e)) = self.notifier.get().map(|n| n.inval_inode(ino, -1, 0)) {
                    log::warn!("invalidating the attributes of inode {ino}: {e}");
                }
            }
            Ok(i)
        };
        match self.fv.writable(ino).and_then(killed).and_then(|i| self.fv.live.write(i, offset.max(0) as u64, data)) {
            Ok(n) => {
                self.fv.wrote(ino);
                reply.written(n)
            }
            Err(e) => {
                if !live(ino) {
                    if self.gens.len() >= GENERATIONS {
                        self.gens.clear();
                    }
                    *self.gens.entry(ino).or_insert(0) += 1;
                }
                reply.error(e.errno())
            }
        }
    }

    /// close(2): with `--commit-interval 0` committed before close
    /// returns, the last writer's close of a modified, versioned file
    /// taking its close version first (docs: *File volumes*).
    fn flush(&mut self, _req: &Request<'_>, ino: u64, fh: u64, _lock_owner: u64, reply: ReplyEmpty) {
        // Under a commit interval a flush has nothing to do: the data is
        // the kernel's and ours already (written back before the flush),
        // durable at the next commit, and a close version is taken at the
        // last writer's RELEASE (or by the first look at the file's
        // versions before it: `Versioned::settle`). ENOSYS tells the
        // kernel to send no more (it still writes a file's cached data
        // back at close and reports its errors there): a round trip fewer
        // per close, read-only ones too.
        if !self.commit_on_close {
            return reply.error(libc::ENOSYS);
        }
        // A version that cannot be taken (the engine's snapshot bound, a
        // full pool) does not fail the close: the data is committed.
        if fh == WRITER {
            if let Err(e) = self.fv.closed_write(ino) {
                log::error!("close version of inode {ino}: {e}");
            }
        }
        self.sync(reply)
    }

    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty) {
        self.sync(reply)
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty) {
        self.sync(reply)
    }

    fn readdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, mut reply: ReplyDirectory) {
        if let Err(e) = self.fv.settle_view(ino, None) {
            log::error!("close version owed before a listing of versions: {e}");
        }
        match self.fv.readdir(ino, offset.max(0) as u64) {
            Ok(list) => {
                for e in list {
                    if reply.add(e.ino, e.cookie as i64, file_type(e.kind), OsStr::from_bytes(&e.name)) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(e.errno()),
        }
    }

    /// Volume snapshots from a script on the mount: setting
    /// `user.tarn.snapshot` on the root to NAME takes snapshot NAME,
    /// `user.tarn.snapshot.delete` deletes it, `user.tarn.version.delete`
    /// deletes version N (as `foo@` names it). Other `user.*` names are stored (`xattr.rs`).
    fn setxattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let snap = std::str::from_utf8(value).map_err(|_| FsError::Invalid("snapshot name is not UTF-8"));
        let r = match (ino, name.as_bytes()) {
            (tarn_fs::ROOT, b"user.tarn.snapshot") => {
                self.fv.forget_views();
                snap.and_then(|n| self.fv.live.snap_create(n).map(drop))
            }
            (tarn_fs::ROOT, b"user.tarn.snapshot.delete") => {
                self.fv.forget_views();
                snap.and_then(|n| self.fv.live.snap_delete(n))
            }
            (tarn_fs::ROOT, b"user.tarn.version.delete") => self.fv.delete_version(value),
            (_, b"user.tarn.snapshot") => self.snap_file(ino, snap),
            (_, n) if !n.starts_with(tarn_fs::xattr::CONTROL) => {
                let mode = match flags {
                    0 => XattrMode::Any,
                    libc::XATTR_CREATE => XattrMode::Create,
                    libc::XATTR_REPLACE => XattrMode::Replace,
                    _ => return reply.error(libc::EINVAL),
                };
                let r = self.fv.writable(ino).and_then(|i| self.fv.live.set_xattr(i, n, value, mode));
                return empty(reply, r);
            }
            _ => return reply.error(libc::ENOTSUP),
        };
        if let Err(e) = &r {
            log::warn!("snapshot by setxattr: {e}");
        }
        empty(reply, r)
    }

    fn removexattr(&mut self, _req: &Request<'_>, ino: u64, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fv.writable(ino).and_then(|i| self.fv.live.remove_xattr(i, name.as_bytes())))
    }

    /// The stored `user.*` names (tarn's own `user.tarn.*` answers are
    /// not stored, so not listed).
    fn listxattr(&mut self, _req: &Request<'_>, ino: u64, size: u32, reply: ReplyXattr) {
        match self.fv.list_xattrs(ino) {
            Ok(v) => xattr_reply(reply, size, &v),
            Err(e) => reply.error(e.errno()),
        }
    }

    /// `user.tarn.version.type` of a version (`foo@/N`, `foo@N`):
    /// volume, file or close. Other `user.*` names: as stored (in a
    /// version, as the version keeps them); other namespaces: ENODATA.
    fn getxattr(&mut self, _req: &Request<'_>, ino: u64, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = if name.as_bytes() == b"user.tarn.version.type" {
            match self.fv.version_type(ino) {
                Ok(Some(k)) => Ok(k.as_str().as_bytes().to_vec()),
                Ok(None) => Err(FsError::NoData),
                Err(e) => Err(e),
            }
        } else {
            self.fv.get_xattr(ino, name.as_bytes())
        };
        match r {
            Ok(v) => xattr_reply(reply, size, &v),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let s = self.fv.live.statfs();
        let blocks = s.total / 4096;
        let free = s.free / 4096;
        let max_files = tarn_fs::MAX_INODES;
        reply.statfs(blocks, free, free, s.files, max_files - s.files, 4096, 255, 4096);
    }

    fn create(
        &mut self,
        req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.fv.writable(parent);
        match r.and_then(|p| self.fv.live.create(p, name.as_bytes(), Kind::File, mode & !umask, req.uid(), req.gid())) {
            Ok(a) => {
                let ino = a.inode.ino;
                self.fv.live.looked_up(ino);
                if !self.open_refused {
                    self.fv.live.opened(ino);
                }
                if let Ok(p) = self.fv.writable(parent) {
                    self.fv.noted(p, name.as_bytes(), ino);
                }
                if let Err(e) = self.fv.open_write(ino) {
                    log::warn!("version policy at create: {e}");
                }
                reply.created(ttl(a.inode.ino), &attr(&a), 0, WRITER, OPEN_FLAGS)
            }
            Err(e) => reply.error(e.errno()),
        }
    }

    fn lseek(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, whence: i32, reply: ReplyLseek) {
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return reply.error(libc::EINVAL),
        };
        match self.fv.seek(ino, offset.max(0) as u64, data) {
            Ok(Some(at)) => reply.offset(at as i64),
            Ok(None) => reply.error(libc::ENXIO),
            Err(e) => reply.error(e.errno()),
        }
    }
}
