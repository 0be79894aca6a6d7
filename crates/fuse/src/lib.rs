//! tarn file volumes through FUSE: tarn's own FUSE protocol layer
//! (docs/ARCHITECTURE.md *FUSE transport*): `decode.rs` turns a request
//! into a typed op, `tarnfs.rs` serves it, `reply.rs` encodes the
//! answer; the transport is /dev/fuse (`dev.rs`) or, where the kernel
//! offers it, io_uring queues, one per CPU (`uring.rs`). Mounting goes
//! through fusermount3 (`mount.rs`: no libfuse needed).

mod abi;
mod decode;
mod deferred;
mod dev;
mod dispatch;
mod mount;
mod notify;
#[cfg(test)]
mod protocol_tests;
mod reply;
mod slice;
mod tarnfs;
mod uring;

pub use dev::UringMode;

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tarn_fs::{FileVolume, Versioned};
use tarnfs::TarnFs;

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

/// How a mount talks to the kernel.
#[derive(Debug, Clone, Copy)]
pub struct Transport {
    /// The scheduler slice the /dev/fuse session thread asks for
    /// (`slice.rs`; zero: the kernel's default).
    pub session_slice: Duration,
    pub uring: UringMode,
    /// Told the transport chosen at INIT and, at the end, how many
    /// requests each transport served (`tarn mount` prints them).
    pub report: fn(&str),
    /// Every user's requests reach the mount (FUSE's `allow_other`; the
    /// kernel checks each against the mode and access control lists),
    /// not only those of the user who mounted it.
    pub allow_other: bool,
}

/// Refuse a transport this kernel cannot give (`--fuse-uring on` with
/// the ring switched off) before anything is mounted, so a caller can
/// check it before it says "mounted".
pub fn check_transport(transport: &Transport) -> std::io::Result<()> {
    if transport.uring == UringMode::On && !uring::enabled() {
        return Err(uring::unavailable());
    }
    Ok(())
}

/// Mount `fv` on `dir` and serve until it is unmounted; every pending
/// change is committed before this returns. The /dev/fuse session
/// thread is the caller's.
pub fn mount(
    fv: FileVolume,
    name: &str,
    dir: &Path,
    durability: Durability,
    transport: Transport,
) -> std::io::Result<()> {
    check_transport(&transport)?;
    // A volume snapshot mounts read-only (the kernel then answers EROFS too).
    let access = if fv.is_snapshot() { "ro" } else { "rw" };
    let others = if transport.allow_other { ",allow_other" } else { "" };
    let options = format!("fsname=tarn:{name},subtype=tarn,default_permissions,{access}{others}");
    let fd = Arc::new(mount::mount(dir, &options)?);
    let interval = durability.commit_interval;
    let mut fv = Versioned::new(fv);
    fv.commit_at_close = interval.is_zero();
    let fs = TarnFs {
        fv,
        commit_after: None,
        commit_on_close: interval.is_zero(),
        writeback_cache: durability.writeback_cache,
        no_open: false,
        open_refused: false,
        gens: Default::default(),
        notifier: dev::Session::notifier(&fd),
    };
    // The commit thread ends when `stop` is dropped (the session is over).
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let committer = (!interval.is_zero() && !fs.fv.live.is_snapshot()).then(|| {
        let live = fs.fv.live.clone();
        std::thread::Builder::new().name("fs-commit".into()).spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                if let Err(e) = live.sync() {
                    log::error!("periodic commit failed: {e}");
                }
            }
        })
    });
    let served = serve(fd, fs, transport);
    if served.is_err() {
        // The kernel may still hold the mount (an INIT refused): drop it.
        let _ = mount::unmount(dir);
    }
    drop(stop);
    if let Some(Ok(t)) = committer {
        let _ = t.join();
    }
    served
}

/// Serves the mounted session on `fd` until it is unmounted.
fn serve(fd: Arc<OwnedFd>, fs: TarnFs, transport: Transport) -> std::io::Result<()> {
    let session_slice = transport.session_slice;
    if !session_slice.is_zero() {
        if let Err(e) = slice::ask(session_slice) {
            log::warn!("a {session_slice:?} scheduler slice for the session thread: {e}");
        }
    }
    let session = dev::Session::new(fd, Arc::new(Mutex::new(fs)), transport.uring, transport.report);
    session.run()
}
