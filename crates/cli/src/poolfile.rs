//! Opening a pool from paths: the primary, its members, an exclusive lock,
//! and the control socket of a server that may already hold it.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use tarn_engine::{FileDevice, OpenOptions, Pool};

/// An open pool plus the lock that keeps a second writer out.
pub struct OpenPool {
    pub pool: Pool,
    _lock: File,
}

/// Take an advisory lock on the primary so two processes never both write.
fn lock(path: &Path, exclusive: bool) -> Result<File> {
    let f = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mode = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH } | libc::LOCK_NB;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), mode) } != 0 {
        bail!(
            "pool {} is in use by another tarn process (is `tarn serve` running without its control socket?)",
            path.display()
        );
    }
    Ok(f)
}

/// Open the pool whose primary device is `primary`. Member devices come
/// from the primary's superblock unless `members` names them.
pub fn open_pool(primary: &Path, members: &[PathBuf], options: OpenOptions) -> Result<OpenPool> {
    let writable = !options.read_only;
    if !primary.exists() {
        bail!("pool device {} does not exist", primary.display());
    }
    let lock = lock(primary, writable)?;
    let first =
        FileDevice::open(primary, writable).with_context(|| format!("open pool device {}", primary.display()))?;
    let slots = crate::mirror::open_members(primary, first, members, writable)?;
    let pool = Pool::open_slots(slots, options).with_context(|| format!("open pool {}", primary.display()))?;
    Ok(OpenPool { pool, _lock: lock })
}

/// Where the server holding pool `uuid` listens for admin requests.
pub fn control_socket_path(uuid: &str) -> PathBuf {
    let dir = std::env::var_os("TARN_RUN_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp/tarn-run"));
    dir.join(format!("{uuid}.sock"))
}

/// The control socket for the pool on `primary`, if a server answers there.
pub fn running_server(primary: &Path) -> Option<PathBuf> {
    let dev = FileDevice::open(primary, false).ok()?;
    let uuid = Pool::pool_uuid(&dev).ok()?;
    let path = control_socket_path(&uuid);
    std::os::unix::net::UnixStream::connect(&path).ok().map(|_| path)
}
