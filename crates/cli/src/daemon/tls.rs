//! `tarn serve` options for NBD over TLS and the Unix socket's mode.

use crate::config::ServeOpts;
use anyhow::{Context, Result};
use clap::ValueEnum;
use serde::Deserialize;
use tarn_nbd::{AllowList, TlsConfig, TlsMode};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsArg {
    /// STARTTLS offered; plaintext clients are served too.
    On,
    /// Plaintext clients can only ask for STARTTLS (or abort).
    Require,
}

pub fn parse_mode(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!("{s:?} is not an octal permission mode such as 600 or 660")),
    }
}

/// The server's TLS configuration from the merged options, None when TLS
/// is off. Loads and checks the files now, so that a bad one stops `tarn
/// serve` at once (or is refused by a reload, which keeps the old one).
pub fn config(o: &ServeOpts) -> Result<Option<TlsConfig>> {
    let (Some(cert), Some(key)) = (&o.tls_cert, &o.tls_key) else {
        return Ok(None);
    };
    let mode = match o.tls.unwrap_or(TlsArg::On) {
        TlsArg::On => TlsMode::Optional,
        TlsArg::Require => TlsMode::Require,
    };
    let config = TlsConfig::from_pem_files(cert, key, o.tls_ca.as_deref(), mode).context("TLS")?;
    if o.tls_allow.is_empty() {
        return Ok(Some(config));
    }
    let allow = AllowList::parse(&o.tls_allow).context("--tls-allow")?;
    Ok(Some(config.with_allow_list(allow).context("--tls-allow")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(parse_mode("600"), Ok(0o600));
        assert_eq!(parse_mode("0660"), Ok(0o660));
        assert_eq!(parse_mode("0o666"), Ok(0o666));
        for bad in ["", "800", "1777", "rw", "-1"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }
}
