//! tarn file volumes through FUSE (the `fuser` crate, its own mount code
//! through fusermount3: no libfuse needed). A thin adapter: every call
//! goes to `tarn_fs::FileVolume` and its error becomes the errno. One
//! session thread (fuser's loop); permissions are the kernel's
//! (`default_permissions`).

use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tarn_fs::{Attr, FileVolume, FsError, Kind, SetAttr};

/// How long the kernel may cache attributes and names: this process is
/// the only writer.
const TTL: Duration = Duration::from_secs(1);

/// The mounted volume.
pub struct TarnFs {
    fv: FileVolume,
}

/// Mount `fv` on `dir` and serve until it is unmounted; every pending
/// change is committed before this returns.
pub fn mount(fv: FileVolume, name: &str, dir: &Path) -> std::io::Result<()> {
    // A volume snapshot mounts read-only (the kernel then answers EROFS too).
    let access = if fv.is_snapshot() { MountOption::RO } else { MountOption::RW };
    let options = [
        MountOption::FSName(format!("tarn:{name}")),
        MountOption::Subtype("tarn".into()),
        MountOption::DefaultPermissions,
        access,
    ];
    fuser::mount2(TarnFs { fv }, dir, &options)
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

fn entry(reply: ReplyEntry, r: Result<Attr, FsError>) {
    match r {
        Ok(a) => reply.entry(&TTL, &attr(&a), 0),
        Err(e) => reply.error(e.errno()),
    }
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
    fn sync(&self, reply: ReplyEmpty) {
        let r = self.fv.sync();
        if let Err(e) = &r {
            log::error!("commit failed: {e}");
        }
        empty(reply, r)
    }
}

impl Filesystem for TarnFs {
    fn destroy(&mut self) {
        if let Err(e) = self.fv.sync() {
            log::error!("final commit failed: {e}");
        }
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        entry(reply, self.fv.lookup(parent, name.as_bytes()))
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.fv.getattr(ino) {
            Ok(a) => reply.attr(&TTL, &attr(&a)),
            Err(e) => reply.error(e.errno()),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
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
        match self.fv.setattr(ino, &s) {
            Ok(a) => reply.attr(&TTL, &attr(&a)),
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
        entry(reply, self.fv.create(parent, name.as_bytes(), Kind::File, mode & !umask, req.uid(), req.gid()))
    }

    fn mkdir(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        entry(reply, self.fv.create(parent, name.as_bytes(), Kind::Dir, mode & !umask, req.uid(), req.gid()))
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fv.unlink(parent, name.as_bytes()))
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fv.rmdir(parent, name.as_bytes()))
    }

    fn symlink(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, target: &Path, reply: ReplyEntry) {
        entry(reply, self.fv.symlink(parent, name.as_bytes(), target.as_os_str().as_bytes(), req.uid(), req.gid()))
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
        empty(reply, self.fv.rename(parent, name.as_bytes(), newparent, newname.as_bytes()))
    }

    fn link(&mut self, _req: &Request<'_>, ino: u64, newparent: u64, newname: &OsStr, reply: ReplyEntry) {
        entry(reply, self.fv.link(ino, newparent, newname.as_bytes()))
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        self.fv.opened(ino);
        reply.opened(0, 0);
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.fv.released(ino))
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
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        match self.fv.write(ino, offset.max(0) as u64, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e.errno()),
        }
    }

    /// close(2): committed before close returns (docs: *File volumes*).
    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _lock_owner: u64, reply: ReplyEmpty) {
        self.sync(reply)
    }

    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty) {
        self.sync(reply)
    }

    fn fsyncdir(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _datasync: bool, reply: ReplyEmpty) {
        self.sync(reply)
    }

    fn readdir(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, mut reply: ReplyDirectory) {
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

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        let s = self.fv.statfs();
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
        match self.fv.create(parent, name.as_bytes(), Kind::File, mode & !umask, req.uid(), req.gid()) {
            Ok(a) => {
                self.fv.opened(a.inode.ino);
                reply.created(&TTL, &attr(&a), 0, 0, 0)
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
