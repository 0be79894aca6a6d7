//! `rados://CEPHPOOL/PREFIX`: which Ceph pool and which object names.

use crate::error::RadosError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RadosUri {
    pub pool: String,
    pub prefix: String,
}

pub const SCHEME: &str = "rados://";

/// Does `s` name a RADOS device (rather than a file path)?
pub fn is_rados_uri(s: &str) -> bool {
    s.starts_with(SCHEME)
}

fn name_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= 96 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl RadosUri {
    pub fn parse(s: &str) -> Result<RadosUri, RadosError> {
        let bad = || RadosError::BadUri { uri: s.to_string() };
        let rest = s.strip_prefix(SCHEME).ok_or_else(bad)?;
        let (pool, prefix) = rest.split_once('/').ok_or_else(bad)?;
        if !name_ok(pool) || !name_ok(prefix) {
            return Err(bad());
        }
        Ok(RadosUri { pool: pool.to_string(), prefix: prefix.to_string() })
    }

    /// The object holding bytes `[i * object_size, (i+1) * object_size)`.
    pub fn data_object(&self, index: u64) -> String {
        format!("{}.{index:016x}", self.prefix)
    }

    pub fn header_object(&self) -> String {
        format!("{}.header", self.prefix)
    }

    pub fn lock_object(&self) -> String {
        format!("{}.lock", self.prefix)
    }
}

impl std::fmt::Display for RadosUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.pool, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_names() {
        let u = RadosUri::parse("rados://tarn/pool-1").unwrap();
        assert_eq!((u.pool.as_str(), u.prefix.as_str()), ("tarn", "pool-1"));
        assert_eq!(u.data_object(0x2a), "pool-1.000000000000002a");
        assert_eq!(u.to_string(), "rados://tarn/pool-1");
        for bad in
            ["rados://", "rados://tarn", "rados://tarn/", "rados:///x", "rados://a/b/c", "/tmp/x", "rados://a/b c"]
        {
            assert!(RadosUri::parse(bad).is_err(), "{bad}");
        }
    }
}
