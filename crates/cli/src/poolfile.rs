//! Opening a pool from paths: the primary, its members, an exclusive lock,
//! and the control socket of a server that may already hold it.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tarn_engine::{Device, OpenOptions, Pool};
use tarn_rados::{Lease, LeaseOptions};

/// What keeps a second writer out: an advisory lock on a local primary,
/// or the RADOS lease on a `rados://` primary (crates/rados).
pub enum PoolLock {
    File(#[allow(dead_code)] File),
    Lease(#[allow(dead_code)] Lease),
}

/// An open pool plus the lock that keeps a second writer out.
pub struct OpenPool {
    pub pool: Pool,
    _lock: PoolLock,
}

impl OpenPool {
    /// The pool and the lock that must outlive every use of it.
    pub fn into_parts(self) -> (Pool, PoolLock) {
        (self.pool, self._lock)
    }
}

/// Take an advisory lock on the primary so two processes never both write.
/// While another process holds it, try again for up to `wait` (a server
/// restarting after its predecessor, which still drains and commits).
fn lock(path: &Path, exclusive: bool, wait: Duration) -> Result<File> {
    let f = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mode = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH } | libc::LOCK_NB;
    let deadline = Instant::now() + wait;
    // Bounded by the deadline.
    loop {
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(f.as_raw_fd(), mode) } == 0 {
            return Ok(f);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::WouldBlock {
            return Err(e).with_context(|| format!("lock {}", path.display()));
        }
        if Instant::now() >= deadline {
            break;
        }
        if wait.is_zero() {
            break;
        }
        std::thread::sleep(LOCK_RETRY);
    }
    if wait.is_zero() {
        bail!(
            "pool {} is in use by another tarn process (is `tarn serve` running without its control socket?)",
            path.display()
        );
    }
    bail!(
        "pool {} is still in use by another tarn process after {} s (a previous `tarn serve` still draining or committing? see its log; --lock-wait sets the wait)",
        path.display(),
        wait.as_secs()
    )
}

/// Between two attempts to take a lock that is held.
const LOCK_RETRY: Duration = Duration::from_millis(50);

/// Open the pool whose primary device is `primary`. Member devices come
/// from the primary's superblock unless `members` names them.
pub fn open_pool(primary: &Path, members: &[PathBuf], options: OpenOptions) -> Result<OpenPool> {
    open_pool_waiting(primary, members, options, Duration::ZERO, false)
}

/// [`open_pool`], waiting up to `wait` for another process to let go of
/// it; on RADOS, `fence` fences the holder of the lease and takes it.
pub fn open_pool_waiting(
    primary: &Path,
    members: &[PathBuf],
    options: OpenOptions,
    wait: Duration,
    fence: bool,
) -> Result<OpenPool> {
    let writable = !options.read_only;
    let (first, lock): (Arc<dyn Device>, Option<PoolLock>) = if crate::devices::is_rados(primary) {
        let dev = crate::devices::open_rados(primary, None)?;
        let lease = if writable {
            let opts = LeaseOptions { takeover: fence, wait, on_lost: Box::new(fenced) };
            let lease =
                Lease::acquire(&dev, opts).with_context(|| format!("take the lease of {}", primary.display()))?;
            Some(PoolLock::Lease(lease))
        } else {
            None
        };
        (Arc::new(dev), lease)
    } else {
        if !primary.exists() {
            bail!("pool device {} does not exist", primary.display());
        }
        let lock = lock(primary, writable, wait)?;
        let first = crate::devices::open(primary, writable).context("open pool device")?;
        (first, Some(PoolLock::File(lock)))
    };
    let slots = crate::mirror::open_members(primary, first, members, writable)?;
    let pool = Pool::open_slots(slots, options).with_context(|| format!("open pool {}", primary.display()))?;
    let lock = match lock {
        Some(l) => l,
        None => PoolLock::File(File::open("/dev/null").context("open /dev/null")?),
    };
    Ok(OpenPool { pool, _lock: lock })
}

/// The RADOS lease was lost: another server fenced this one (the cluster
/// refuses its writes from now on). Stop at once, as a crash would: what
/// was committed is on the cluster, the new holder recovers the rest.
fn fenced(why: String) {
    log::error!("{why}");
    eprintln!("tarn: fenced: {why}; stopping (another tarn server took the pool over)");
    std::process::exit(FENCED_EXIT);
}

/// Exit status of a server that was fenced.
pub const FENCED_EXIT: i32 = 75;

/// Where the server holding pool `uuid` listens for admin requests.
pub fn control_socket_path(uuid: &str) -> PathBuf {
    let dir = std::env::var_os("TARN_RUN_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp/tarn-run"));
    dir.join(format!("{uuid}.sock"))
}

/// The control socket for the pool on `primary`, if a server answers there.
/// Found by the pool uuid on the device, or — when the device cannot be read
/// (failing, or a missing mirror leg) — by the alias the server made for
/// the path it was started with.
pub fn running_server(primary: &Path) -> Option<PathBuf> {
    let answers = |path: &PathBuf| std::os::unix::net::UnixStream::connect(path).is_ok();
    let alias = control_alias_path(primary);
    // Reading a RADOS primary's uuid means connecting to the cluster (most
    // of an admin command's time, ~15 ms): a local server's alias first.
    if crate::devices::is_rados(primary) && answers(&alias) {
        return Some(alias);
    }
    let by_uuid = crate::devices::open(primary, false)
        .ok()
        .and_then(|dev| Pool::pool_uuid(dev.as_ref()).ok())
        .map(|uuid| control_socket_path(&uuid));
    [by_uuid, Some(alias)].into_iter().flatten().find(answers)
}

/// A symlink to the control socket named after the pool's primary path
/// (FNV-1a of the canonical path: stable across builds). A RADOS URI
/// names a pool only within its cluster, so its alias also hashes the
/// Ceph config file that reaches the cluster: two clusters on one host
/// with the same Ceph pool and prefix never share an alias.
pub fn control_alias_path(primary: &Path) -> PathBuf {
    let mut key = std::fs::canonicalize(primary).unwrap_or_else(|_| primary.to_path_buf()).into_os_string();
    if crate::devices::is_rados(primary) {
        let conf = crate::devices::ceph_config().conf;
        key.push("\0");
        key.push(std::fs::canonicalize(&conf).unwrap_or(conf));
    }
    let hash = key
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let socket = control_socket_path("x");
    socket.with_file_name(format!("path-{hash:016x}.sock"))
}
