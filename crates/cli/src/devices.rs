//! Opening a device named on the command line: a file or block device
//! path, or a RADOS device URI `rados://CEPHPOOL/PREFIX` (crates/rados)
//! reached with `--ceph-conf` / `--ceph-client`.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use tarn_engine::{Device, FileDevice};
use tarn_rados::{is_rados_uri, CephConfig, RadosDevice};

/// How to reach a Ceph cluster (global options).
#[derive(clap::Args, Clone, Debug)]
pub struct CephArgs {
    /// Ceph config file for rados:// devices (default /etc/ceph/ceph.conf).
    #[arg(long, global = true, env = "CEPH_CONF", value_name = "PATH")]
    pub ceph_conf: Option<PathBuf>,
    /// Ceph client name for rados:// devices.
    #[arg(long, global = true, env = "TARN_CEPH_CLIENT", default_value = "client.admin", value_name = "NAME")]
    pub ceph_client: String,
    /// Seconds before an unanswered Ceph monitor or OSD operation fails
    /// (an unreachable cluster gives an error, never a hang).
    #[arg(long, global = true, env = "TARN_CEPH_TIMEOUT", default_value_t = 30, value_name = "SECS")]
    pub ceph_timeout: u32,
}

static CEPH: OnceLock<CephArgs> = OnceLock::new();

pub fn set_ceph(args: CephArgs) {
    let _ = CEPH.set(args);
}

pub fn ceph_config() -> CephConfig {
    let args = CEPH.get();
    CephConfig {
        conf: args.and_then(|a| a.ceph_conf.clone()).unwrap_or_else(|| PathBuf::from("/etc/ceph/ceph.conf")),
        client: args.map(|a| a.ceph_client.clone()).unwrap_or_else(|| "client.admin".into()),
        timeout_secs: args.map(|a| a.ceph_timeout.max(1)).unwrap_or(30),
    }
}

pub fn is_rados(p: &Path) -> bool {
    p.to_str().is_some_and(is_rados_uri)
}

fn uri(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// Open a RADOS device; with `create_size`, create it (refused if it exists).
pub fn open_rados(p: &Path, create_size: Option<u64>) -> Result<RadosDevice> {
    RadosDevice::open(uri(p), &ceph_config(), create_size).with_context(|| format!("open {}", p.display()))
}

/// Set once by `tarn mount` before it opens its pool: writable pool files
/// then take large data writes through O_DIRECT (the other commands,
/// `tarn serve` among them, keep buffered writes).
static DIRECT_WRITES: AtomicBool = AtomicBool::new(false);

pub fn use_direct_writes() {
    DIRECT_WRITES.store(true, Ordering::Relaxed);
}

/// Open an existing device, file or RADOS.
pub fn open(p: &Path, writable: bool) -> Result<Arc<dyn Device>> {
    if is_rados(p) {
        return Ok(Arc::new(open_rados(p, None)?));
    }
    let dev = match writable && DIRECT_WRITES.load(Ordering::Relaxed) {
        true => FileDevice::open_direct_writes(p),
        false => FileDevice::open(p, writable),
    };
    Ok(Arc::new(dev.with_context(|| format!("open {}", p.display()))?))
}

/// `pool create`: open `p`, or create it with `size` (a sparse file, or a
/// new RADOS device; an existing RADOS prefix is refused then).
pub fn open_or_create(p: &Path, size: Option<u64>) -> Result<Arc<dyn Device>> {
    if is_rados(p) {
        return Ok(Arc::new(open_rados(p, size)?));
    }
    if p.exists() {
        return open(p, true);
    }
    let Some(size) = size else { bail!("{} does not exist; pass --size to create it as a sparse file", p.display()) };
    Ok(Arc::new(FileDevice::create_file(p, size).with_context(|| format!("create {}", p.display()))?))
}

/// A device a command is about to hand to a pool (`dev add`, `pool
/// replace`): created here when it does not exist yet (a sparse file, or
/// a RADOS device, of `size`), so that a refusal can remove it again and
/// change nothing.
pub struct NewDevice {
    path: PathBuf,
    created: bool,
}

impl NewDevice {
    pub fn ensure(path: &Path, size: Option<u64>) -> Result<NewDevice> {
        let exists = if is_rados(path) { rados_exists(path)? } else { path.exists() };
        if !exists {
            let Some(size) = size else { bail!("{} does not exist; pass --size to create it", path.display()) };
            if is_rados(path) {
                open_rados(path, Some(size))?;
            } else {
                FileDevice::create_file(path, size).with_context(|| format!("create {}", path.display()))?;
            }
        }
        Ok(NewDevice { path: path.to_path_buf(), created: !exists })
    }

    /// The pool refused the device: remove it if this command made it.
    pub fn discard(self) {
        if !self.created {
            return;
        }
        let removed = if is_rados(&self.path) {
            open_rados(&self.path, None).and_then(|d| Ok(d.destroy()?))
        } else {
            std::fs::remove_file(&self.path).map_err(Into::into)
        };
        if let Err(e) = removed {
            log::warn!("{}: the device created for the refused command was not removed: {e:#}", self.path.display());
        }
    }
}

fn rados_exists(path: &Path) -> Result<bool> {
    match open_rados(path, None) {
        Ok(_) => Ok(true),
        Err(e)
            if e.downcast_ref::<tarn_rados::RadosError>()
                .is_some_and(|r| matches!(r, tarn_rados::RadosError::NoDevice { .. })) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}
