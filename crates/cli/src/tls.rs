//! `tarn serve` options for NBD over TLS and the Unix socket's mode.

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use tarn_nbd::{AllowList, TlsConfig, TlsMode};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TlsArg {
    /// STARTTLS offered; plaintext clients are served too.
    On,
    /// Plaintext clients can only ask for STARTTLS (or abort).
    Require,
}

#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// Offer NBD over TLS (default "on" when --tls-cert is given; off without it).
    #[arg(long, value_enum, requires = "tls_cert")]
    pub tls: Option<TlsArg>,
    /// Server certificate chain (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// Server private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM): clients must present a certificate they signed.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// CLIENT=EXPORT[,EXPORT...]: the client whose certificate CN or SAN
    /// is CLIENT (`*`: any) sees only these exports (`*` all, `PREFIX*`);
    /// repeatable; clients without a rule see none. Needs --tls-ca.
    #[arg(long, value_name = "CLIENT=EXPORTS", requires = "tls_ca")]
    pub tls_allow: Vec<String>,
    /// Permissions of the --socket file, octal.
    #[arg(long, value_name = "OCTAL", value_parser = parse_mode, default_value = "600", requires = "socket")]
    pub socket_mode: u32,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!("{s:?} is not an octal permission mode such as 600 or 660")),
    }
}

impl TlsArgs {
    /// The server's TLS configuration, None when TLS is off. Loads and
    /// checks the files now so that a bad one stops `tarn serve` at once.
    pub fn config(&self) -> Result<Option<TlsConfig>> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let mode = match self.tls.unwrap_or(TlsArg::On) {
            TlsArg::On => TlsMode::Optional,
            TlsArg::Require => TlsMode::Require,
        };
        let config = TlsConfig::from_pem_files(cert, key, self.tls_ca.as_deref(), mode).context("TLS")?;
        if self.tls_allow.is_empty() {
            return Ok(Some(config));
        }
        let allow = AllowList::parse(&self.tls_allow).context("--tls-allow")?;
        Ok(Some(config.with_allow_list(allow).context("--tls-allow")?))
    }
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
