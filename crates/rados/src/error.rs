use thiserror::Error;

#[derive(Debug, Error)]
pub enum RadosError {
    #[error("{0}")]
    Load(String),
    #[error("{uri}: not a RADOS device URI (want rados://CEPHPOOL/PREFIX, PREFIX of letters, digits, '.', '_', '-')")]
    BadUri { uri: String },
    #[error("ceph config {path} does not exist (--ceph-conf or CEPH_CONF names it)")]
    NoConf { path: String },
    #[error("{what}: {errno_text}")]
    Call { what: String, errno: i32, errno_text: String },
    #[error("Ceph pool {pool} does not exist on the cluster of {conf}")]
    NoPool { pool: String, conf: String },
    #[error("{uri} does not exist (no {object} object); `tarn pool create {uri} --size N` creates it")]
    NoDevice { uri: String, object: String },
    #[error("{uri} already exists: another device uses prefix {prefix} in Ceph pool {pool}")]
    Exists { uri: String, pool: String, prefix: String },
    #[error("{uri}: bad device header object: {why}")]
    BadHeader { uri: String, why: String },
    #[error("{uri} is held by another tarn server ({holder}); `tarn serve --takeover` fences it and takes over")]
    Held { uri: String, holder: String },
}

impl RadosError {
    /// A failed librados call returning `-errno`.
    pub fn call(what: impl Into<String>, rc: i64) -> RadosError {
        let errno = i32::try_from(-rc).unwrap_or(libc::EIO);
        let errno_text = std::io::Error::from_raw_os_error(errno).to_string();
        RadosError::Call { what: what.into(), errno, errno_text }
    }

    pub fn errno(&self) -> Option<i32> {
        match self {
            RadosError::Call { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

impl From<RadosError> for std::io::Error {
    fn from(e: RadosError) -> std::io::Error {
        match e.errno() {
            Some(errno) => std::io::Error::new(std::io::Error::from_raw_os_error(errno).kind(), e.to_string()),
            None => std::io::Error::other(e.to_string()),
        }
    }
}
