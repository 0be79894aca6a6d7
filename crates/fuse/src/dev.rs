//! The /dev/fuse transport: this loop answers INIT, then every request
//! the kernel sends here — all of them without the ring, and with it the
//! ones the kernel keeps on /dev/fuse (FORGET, INTERRUPT, requests sent
//! before every ring queue registered). It starts the ring queues
//! (`uring.rs`) once INIT is answered, and ends them when the kernel
//! ends the session (ENODEV: unmounted).

use crate::abi::{self, init};
use crate::decode::{self, Header, Op};
use crate::deferred::{Committer, Deferrer};
use crate::dispatch::{lock, serve, Shared};
use crate::notify::{write_reply, Notifier};
use crate::reply::{self, Reply};
use crate::tarnfs;
use crate::uring::{self, QueueConfig, Rings};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

/// Which transport `tarn mount --fuse-uring` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UringMode {
    /// The ring when the kernel offers it, /dev/fuse otherwise.
    #[default]
    Auto,
    /// The ring or no mount.
    On,
    /// /dev/fuse only.
    Off,
}

/// A mounted session on /dev/fuse descriptor `fd`.
pub(crate) struct Session {
    fd: Arc<OwnedFd>,
    fs: Shared,
    uring: UringMode,
    report: fn(&str),
    rings: Option<Rings>,
    /// INIT was answered with FUSE_OVER_IO_URING.
    ring_negotiated: bool,
    /// INIT was answered with FUSE_SETXATTR_EXT (`decode::dev_request`).
    setxattr_ext: bool,
    /// Requests read from /dev/fuse.
    dev_requests: u64,
}

impl Session {
    pub fn new(fd: Arc<OwnedFd>, fs: Shared, uring: UringMode, report: fn(&str)) -> Session {
        Session { fd, fs, uring, report, rings: None, ring_negotiated: false, setxattr_ext: false, dev_requests: 0 }
    }

    pub fn notifier(fd: &Arc<OwnedFd>) -> Notifier {
        Notifier::new(fd.clone())
    }

    /// Serves until the kernel ends the session; then stops the ring
    /// queues, waits for the replies that wait for a commit
    /// (`deferred.rs`) and commits everything (`TarnFs::destroy`).
    pub fn run(mut self) -> io::Result<()> {
        let mut committer = Committer::start()?;
        let deferrer = committer.deferrer().ok_or_else(|| io::Error::other("fuse commit thread"))?;
        let served = self.serve_dev(&deferrer);
        let ring_requests = self.rings.take().map_or(0, Rings::stop);
        drop(deferrer);
        committer.stop();
        (self.report)(&format!(
            "fuse requests: {ring_requests} through io_uring, {} through /dev/fuse",
            self.dev_requests
        ));
        lock(&self.fs).destroy();
        served
    }

    fn serve_dev(&mut self, deferrer: &Deferrer) -> io::Result<()> {
        let mut buf = vec![0u8; tarnfs::MAX_WRITE as usize + 4096];
        loop {
            // SAFETY: read into `buf`, within its length.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // ENOENT: the request was interrupted before it was read.
                    Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
                    Some(libc::ENODEV) => return Ok(()),
                    _ => return Err(e),
                }
            }
            self.dev_requests += 1;
            let frame = &buf[..n as usize];
            let Ok(h) = decode::header(frame) else {
                log::warn!("a FUSE request shorter than its header ({n} bytes)");
                continue;
            };
            let op = decode::dev_request(frame, self.setxattr_ext).map(|(_, op)| op);
            let reply = match op {
                Ok(Op::Init { major, minor, max_readahead, flags }) => self.init(major, minor, max_readahead, flags)?,
                op => {
                    let fd = self.fd.clone();
                    match serve(&self.fs, &h, op).reply_or_defer(deferrer, move |r| send(&fd, &h, &r)) {
                        Some(reply) => reply,
                        None => continue,
                    }
                }
            };
            send(&self.fd, &h, &reply);
            if h.opcode == abi::op::INIT && reply.is_ok() {
                self.start_rings(deferrer)?;
            }
        }
    }

    /// INIT: the protocol version, the volume's flags and, unless `off`,
    /// the io_uring transport (refused with `on` when the kernel lacks it).
    fn init(&mut self, major: u32, minor: u32, max_readahead: u32, offered: u64) -> io::Result<Reply> {
        if major != abi::KERNEL_MAJOR || minor < 31 {
            log::error!("FUSE protocol {major}.{minor} of the kernel is too old (7.31 at least)");
            return Ok(Reply::Error(libc::EPROTO));
        }
        let mut wanted = lock(&self.fs).init_flags();
        let ring_offered = offered & init::OVER_IO_URING != 0;
        match (self.uring, ring_offered) {
            (UringMode::Off, _) => {}
            (_, true) => wanted |= init::OVER_IO_URING,
            (UringMode::On, false) => return Err(uring::unavailable()),
            (UringMode::Auto, false) => {}
        }
        let out = tarnfs::init_reply(offered, minor, max_readahead, wanted);
        self.ring_negotiated = out.flags & init::OVER_IO_URING != 0;
        self.setxattr_ext = out.flags & init::SETXATTR_EXT != 0;
        if !self.ring_negotiated {
            (self.report)(if self.uring == UringMode::Auto && uring::switched_off() {
                "fuse transport: /dev/fuse (FUSE over io_uring is off in the fuse module: `echo Y > \
                 /sys/module/fuse/parameters/enable_uring` as root serves each CPU's requests on that CPU)"
            } else {
                "fuse transport: /dev/fuse"
            });
        }
        Ok(Reply::Init(out))
    }

    fn start_rings(&mut self, deferrer: &Deferrer) -> io::Result<()> {
        if !self.ring_negotiated {
            return Ok(());
        }
        let cfg = QueueConfig {
            dev: self.fd.clone(),
            fs: self.fs.clone(),
            payload: tarnfs::MAX_WRITE as usize,
            report: self.report,
            deferrer: deferrer.clone(),
        };
        match Rings::start(cfg) {
            Ok(rings) => {
                (self.report)(&format!("fuse transport: io_uring, {} queues", rings.queues()));
                self.rings = Some(rings);
                Ok(())
            }
            Err(e) if self.uring == UringMode::Auto => {
                (self.report)(&format!("fuse transport: /dev/fuse (the io_uring queues failed: {e})"));
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

/// Write `reply` to request `h` on /dev/fuse (any thread: the commit
/// thread answers deferred replies here too).
fn send(fd: &OwnedFd, h: &Header, reply: &Reply) {
    if *reply == Reply::None {
        return;
    }
    let mut body = Vec::new();
    let error = reply.encode(&mut body);
    let r = write_reply(fd, &reply::out_header(h.unique, error, body.len()), &body);
    // ENOENT: the request was interrupted (or aborted) meanwhile.
    if let Err(e) = r.as_ref().map_err(io::Error::raw_os_error) {
        if e != Some(libc::ENOENT) {
            log::warn!("FUSE reply to request {} (opcode {}): {r:?}", h.unique, h.opcode);
        }
    }
}
