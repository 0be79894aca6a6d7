//! Opening a device named on the command line: a file or block device
//! path, or a RADOS device URI `rados://CEPHPOOL/PREFIX` (crates/rados)
//! reached with `--ceph-conf` / `--ceph-client`.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
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

/// Open an existing device, file or RADOS.
pub fn open(p: &Path, writable: bool) -> Result<Arc<dyn Device>> {
    if is_rados(p) {
        return Ok(Arc::new(open_rados(p, None)?));
    }
    Ok(Arc::new(FileDevice::open(p, writable).with_context(|| format!("open {}", p.display()))?))
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
