//! Safe wrappers over a librados cluster handle and an I/O context.

use crate::error::RadosError;
use crate::ffi::{self, Api, Completion};
use std::ffi::{c_char, CString};
use std::path::Path;
use std::ptr;
use std::sync::Arc;

/// Where the cluster is and who we are to it.
#[derive(Debug, Clone)]
pub struct CephConfig {
    /// ceph.conf path.
    pub conf: std::path::PathBuf,
    /// Client name, e.g. `client.admin`.
    pub client: String,
    /// Seconds before a monitor or OSD operation fails instead of waiting
    /// (`rados_mon_op_timeout`, `rados_osd_op_timeout`, `client_mount_timeout`).
    pub timeout_secs: u32,
}

pub struct Cluster {
    api: &'static Api,
    handle: ffi::Rados,
    pub conf: String,
}

// SAFETY: librados cluster handles are thread-safe (documented in librados.h).
unsafe impl Send for Cluster {}
// SAFETY: as above.
unsafe impl Sync for Cluster {}

pub(crate) fn cstr(s: &str) -> Result<CString, RadosError> {
    CString::new(s).map_err(|_| RadosError::Load(format!("{s:?} contains a NUL byte")))
}

fn check(what: &str, rc: i32) -> Result<(), RadosError> {
    if rc < 0 {
        Err(RadosError::call(what, rc.into()))
    } else {
        Ok(())
    }
}

impl Cluster {
    pub fn connect(cfg: &CephConfig) -> Result<Arc<Cluster>, RadosError> {
        let api = ffi::api().map_err(RadosError::Load)?;
        let conf = cfg.conf.display().to_string();
        if !Path::new(&cfg.conf).is_file() {
            return Err(RadosError::NoConf { path: conf });
        }
        let mut handle = ptr::null_mut();
        let (cluster_name, client) = (cstr("ceph")?, cstr(&cfg.client)?);
        // SAFETY: out-pointer to a handle; names NUL-terminated.
        check("rados_create2", unsafe { (api.rados_create2)(&mut handle, cluster_name.as_ptr(), client.as_ptr(), 0) })?;
        let cluster = Cluster { api, handle, conf: conf.clone() };
        let path = cstr(&conf)?;
        // SAFETY: valid handle and path.
        check(&format!("read ceph config {conf}"), unsafe { (api.rados_conf_read_file)(handle, path.as_ptr()) })?;
        let t = cfg.timeout_secs.to_string();
        for key in ["rados_mon_op_timeout", "rados_osd_op_timeout", "client_mount_timeout"] {
            cluster.set(key, &t)?;
        }
        // Keep librados' own logging out of tarn's stderr.
        cluster.set("log_to_stderr", "false")?;
        cluster.set("err_to_stderr", "false")?;
        // SAFETY: valid, configured handle.
        let rc = unsafe { (api.rados_connect)(handle) };
        check(&format!("connect to the Ceph cluster of {conf} as {} (timeout {t} s)", cfg.client), rc)?;
        Ok(Arc::new(cluster))
    }

    fn set(&self, key: &str, value: &str) -> Result<(), RadosError> {
        let (k, v) = (cstr(key)?, cstr(value)?);
        // SAFETY: valid handle, NUL-terminated strings.
        check(&format!("set {key}"), unsafe { (self.api.rados_conf_set)(self.handle, k.as_ptr(), v.as_ptr()) })
    }

    pub fn ioctx(self: &Arc<Cluster>, pool: &str) -> Result<Ioctx, RadosError> {
        let name = cstr(pool)?;
        let mut io = ptr::null_mut();
        // SAFETY: connected handle, out-pointer.
        let rc = unsafe { (self.api.rados_ioctx_create)(self.handle, name.as_ptr(), &mut io) };
        if rc == -libc::ENOENT {
            return Err(RadosError::NoPool { pool: pool.to_string(), conf: self.conf.clone() });
        }
        check(&format!("open Ceph pool {pool}"), rc)?;
        Ok(Ioctx { cluster: self.clone(), io })
    }

    /// This session's addresses (what a fencing peer blocklists).
    pub fn addrs(&self) -> Result<String, RadosError> {
        let mut out: *mut c_char = ptr::null_mut();
        // SAFETY: connected handle; librados allocates `out`, freed below.
        check("rados_getaddrs", unsafe { (self.api.rados_getaddrs)(self.handle, &mut out) })?;
        // SAFETY: librados returned a NUL-terminated string.
        let s = unsafe { std::ffi::CStr::from_ptr(out) }.to_string_lossy().into_owned();
        // SAFETY: allocated by librados for us.
        unsafe { (self.api.rados_buffer_free)(out) };
        Ok(s)
    }

    pub fn instance_id(&self) -> u64 {
        // SAFETY: connected handle.
        unsafe { (self.api.rados_get_instance_id)(self.handle) }
    }

    /// Fence the client at `addr`: the OSDs reject its operations from the
    /// next OSD map on; wait for that map so nothing of it lands after.
    pub fn blocklist(&self, addr: &str) -> Result<(), RadosError> {
        let a = cstr(addr)?;
        let rc = unsafe {
            // SAFETY: connected handle; librados only reads the string.
            (self.api.rados_blocklist_add)(self.handle, a.as_ptr() as *mut c_char, 0)
        };
        check(&format!("blocklist {addr}"), rc)?;
        // SAFETY: connected handle.
        check("wait for the OSD map", unsafe { (self.api.rados_wait_for_latest_osdmap)(self.handle) })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the handle is ours; every Ioctx holds an Arc and is gone.
        unsafe { (self.api.rados_shutdown)(self.handle) }
    }
}

/// An I/O context on one Ceph pool.
pub struct Ioctx {
    pub cluster: Arc<Cluster>,
    io: ffi::Ioctx,
}

// SAFETY: librados I/O contexts may be used from several threads.
unsafe impl Send for Ioctx {}
// SAFETY: as above.
unsafe impl Sync for Ioctx {}

impl Drop for Ioctx {
    fn drop(&mut self) {
        // SAFETY: ours; no operation is in flight (every caller waits).
        unsafe { (self.cluster.api.rados_ioctx_destroy)(self.io) }
    }
}

/// One asynchronous operation: its completion and the name it targets
/// (kept alive until the completion is waited for).
struct Pending {
    c: Completion,
    _oid: CString,
    /// The compound write op of a `WriteMany`, released after completion.
    op: Option<ffi::WriteOp>,
}

/// An in-flight batch of asynchronous operations; dropping it waits for
/// all of them, so buffers handed to librados outlive every operation.
pub struct Batch<'a> {
    io: &'a Ioctx,
    pending: Vec<Pending>,
}

pub enum Op<'b> {
    Read(&'b mut [u8], u64),
    Write(&'b [u8], u64),
    /// Several writes to one object as one RADOS operation (applied in
    /// order, all or none): the write combiner's unit.
    WriteMany(Vec<(&'b [u8], u64)>),
    Remove,
}

impl Ioctx {
    fn api(&self) -> &'static Api {
        self.cluster.api
    }

    pub fn batch(&self) -> Batch<'_> {
        Batch { io: self, pending: Vec::new() }
    }

    /// Synchronous read; `Ok(None)` when the object does not exist.
    pub fn read(&self, oid: &str, buf: &mut [u8], off: u64) -> Result<Option<usize>, RadosError> {
        let o = cstr(oid)?;
        // SAFETY: buffer valid for its length during the call.
        let rc = unsafe { (self.api().rados_read)(self.io, o.as_ptr(), buf.as_mut_ptr().cast(), buf.len(), off) };
        match rc {
            n if n >= 0 => Ok(Some(n as usize)),
            e if e == -libc::ENOENT => Ok(None),
            e => Err(RadosError::call(format!("read {oid}"), e.into())),
        }
    }

    /// Write a whole object: `exclusive` fails with EEXIST if it exists.
    /// One RADOS operation, so it is atomic.
    pub fn write_full(&self, oid: &str, data: &[u8], exclusive: bool) -> Result<(), RadosError> {
        self.write_op(oid, |api, op| {
            if exclusive {
                // SAFETY: a live op; NULL category is allowed.
                unsafe { (api.rados_write_op_create)(op, ffi::CREATE_EXCLUSIVE, ptr::null()) };
            }
            // SAFETY: `data` outlives the synchronous operate below.
            unsafe { (api.rados_write_op_write_full)(op, data.as_ptr().cast(), data.len()) };
        })
    }

    /// Remove an object; one that does not exist is no error.
    pub fn remove(&self, oid: &str) -> Result<(), RadosError> {
        let mut batch = self.batch();
        batch.start(oid, Op::Remove)?;
        match batch.wait().first().copied().unwrap_or(-libc::EIO) {
            rc if rc >= 0 || rc == -libc::ENOENT => Ok(()),
            rc => Err(RadosError::call(format!("remove {oid}"), rc.into())),
        }
    }

    /// Zero `[off, off+len)` inside one object (no-op where it has no data).
    pub fn zero(&self, oid: &str, off: u64, len: u64) -> Result<(), RadosError> {
        // SAFETY: a live op.
        self.write_op(oid, |api, op| unsafe { (api.rados_write_op_zero)(op, off, len) })
    }

    fn write_op(&self, oid: &str, build: impl FnOnce(&Api, ffi::WriteOp)) -> Result<(), RadosError> {
        let api = self.api();
        let o = cstr(oid)?;
        // SAFETY: allocation; released below on every path.
        let op = unsafe { (api.rados_create_write_op)() };
        if op.is_null() {
            return Err(RadosError::call("rados_create_write_op", -(libc::ENOMEM as i64)));
        }
        build(api, op);
        // SAFETY: valid op, ioctx and name; synchronous.
        let rc = unsafe { (api.rados_write_op_operate)(op, self.io, o.as_ptr(), ptr::null_mut(), 0) };
        // SAFETY: ours.
        unsafe { (api.rados_release_write_op)(op) };
        check(&format!("write {oid}"), rc)
    }

    /// Wait for every asynchronous write of this context to be complete.
    pub fn flush(&self) -> Result<(), RadosError> {
        // SAFETY: valid ioctx.
        check("rados_aio_flush", unsafe { (self.api().rados_aio_flush)(self.io) })
    }

    pub(crate) fn raw(&self) -> ffi::Ioctx {
        self.io
    }
}

impl<'a> Batch<'a> {
    /// Start `op` on object `oid`. Its buffer is borrowed for the batch's
    /// lifetime `'a`, and the batch waits for every operation before it
    /// goes (`wait` or Drop), so librados never touches a freed buffer.
    pub fn start(&mut self, oid: &str, op: Op<'a>) -> Result<(), RadosError> {
        let api = self.io.api();
        let o = cstr(oid)?;
        let mut c = ptr::null_mut();
        // SAFETY: out-pointer; no callbacks.
        let rc = unsafe { (api.rados_aio_create_completion2)(ptr::null_mut(), ptr::null_mut(), &mut c) };
        check("rados_aio_create_completion2", rc)?;
        let io = self.io.io;
        let mut write_op = None;
        // SAFETY: the buffers stay valid until `wait` (the caller waits for
        // the batch before its buffers go; Drop waits too).
        let rc = unsafe {
            match op {
                Op::Read(buf, off) => (api.rados_aio_read)(io, o.as_ptr(), c, buf.as_mut_ptr().cast(), buf.len(), off),
                Op::Write(data, off) => (api.rados_aio_write)(io, o.as_ptr(), c, data.as_ptr().cast(), data.len(), off),
                Op::WriteMany(writes) => {
                    let wop = (api.rados_create_write_op)();
                    if wop.is_null() {
                        -libc::ENOMEM
                    } else {
                        for (data, off) in writes {
                            (api.rados_write_op_write)(wop, data.as_ptr().cast(), data.len(), off);
                        }
                        write_op = Some(wop);
                        (api.rados_aio_write_op_operate)(wop, io, c, o.as_ptr(), ptr::null_mut(), 0)
                    }
                }
                Op::Remove => (api.rados_aio_remove)(io, o.as_ptr(), c),
            }
        };
        if rc < 0 {
            // SAFETY: never submitted.
            unsafe {
                (api.rados_aio_release)(c);
                if let Some(wop) = write_op {
                    (api.rados_release_write_op)(wop);
                }
            }
            return Err(RadosError::call(format!("submit to {oid}"), rc.into()));
        }
        self.pending.push(Pending { c, _oid: o, op: write_op });
        Ok(())
    }

    /// Wait for every operation; their return values in start order.
    pub fn wait(mut self) -> Vec<i32> {
        self.wait_all()
    }

    fn wait_all(&mut self) -> Vec<i32> {
        let api = self.io.api();
        self.pending
            .drain(..)
            .map(|p| {
                // SAFETY: a submitted completion, released exactly once here.
                unsafe {
                    (api.rados_aio_wait_for_complete)(p.c);
                    let rc = (api.rados_aio_get_return_value)(p.c);
                    (api.rados_aio_release)(p.c);
                    if let Some(wop) = p.op {
                        (api.rados_release_write_op)(wop);
                    }
                    rc
                }
            })
            .collect()
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.wait_all();
    }
}
