//! TLS configuration of a [`crate::Server`]: when `NBD_OPT_STARTTLS` is
//! offered or required, the server certificate, optional client
//! certificate verification (mutual TLS) and the per-client export
//! allow-list.
//!
//! TLS itself is rustls (aws-lc-rs provider); this module only loads PEM
//! files, says why a key cannot be used, and decides who may see which
//! export.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;

/// Whether plaintext clients are still served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// STARTTLS is offered; clients may also stay in plaintext
    /// (proto.md's SELECTIVETLS with no TLS-only export).
    Optional,
    /// Every option other than STARTTLS and ABORT before TLS gets
    /// `NBD_REP_ERR_TLS_REQD`, `NBD_OPT_EXPORT_NAME` closes the connection
    /// (proto.md's FORCEDTLS).
    Require,
}

/// Error loading or checking the TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: not valid PEM: {detail}")]
    Pem { path: PathBuf, detail: String },
    #[error("{0}: no certificate found")]
    NoCertificate(PathBuf),
    #[error("{0}: no private key found")]
    NoKey(PathBuf),
    #[error("{path}: unusable CA certificate: {detail}")]
    BadCa { path: PathBuf, detail: String },
    #[error("{path}: unusable key ({key}): TLS takes {USABLE_KEYS} (rustls: {detail})")]
    UnusableKey { path: PathBuf, key: String, detail: String },
    #[error("server certificate and key are not usable together: {0}")]
    CertKey(rustls::Error),
    #[error("client verifier: {0}")]
    Verifier(String),
    #[error("an export allow-list needs client certificates (a client CA)")]
    AllowListWithoutCa,
    #[error("bad allow-list entry {entry:?}: {why}")]
    AllowEntry { entry: String, why: &'static str },
}

/// Who a TLS client is: the common names and subject alternative names
/// (DNS, e-mail, URI) of its verified certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientIdentity {
    pub names: Vec<String>,
}

impl ClientIdentity {
    /// Names of a DER certificate; empty if it cannot be parsed (it was
    /// verified by then, so this does not happen for a well-formed chain).
    pub fn from_der(der: &[u8]) -> ClientIdentity {
        use x509_parser::extensions::GeneralName;
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return ClientIdentity::default();
        };
        let mut names: Vec<String> =
            cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(str::to_owned).collect();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for n in &san.value.general_names {
                match n {
                    GeneralName::DNSName(s) | GeneralName::RFC822Name(s) | GeneralName::URI(s) => {
                        names.push((*s).to_owned())
                    }
                    _ => {}
                }
            }
        }
        ClientIdentity { names }
    }
}

/// One `CLIENT=EXPORT[,EXPORT...]` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AllowRule {
    /// A certificate CN or SAN, or `*` for any verified client.
    client: String,
    /// Export names; `*` alone is every export, `PREFIX*` every export
    /// starting with PREFIX (e.g. `disk0@*`: the snapshots of disk0).
    exports: Vec<String>,
}

/// Which exports each client certificate may list and open. A client that
/// no rule names (or a plaintext client) sees no export at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    rules: Vec<AllowRule>,
}

impl AllowList {
    /// Parse rules of the form `CLIENT=EXPORT[,EXPORT...]` (the client
    /// name is everything before the first `=`).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AllowList, TlsError> {
        let mut rules = Vec::new();
        for e in entries {
            let e = e.as_ref();
            let bad = |why| TlsError::AllowEntry { entry: e.to_owned(), why };
            let (client, exports) = e.split_once('=').ok_or_else(|| bad("expected CLIENT=EXPORT[,EXPORT...]"))?;
            if client.is_empty() {
                return Err(bad("empty client name"));
            }
            let exports: Vec<String> = exports.split(',').map(str::to_owned).collect();
            if exports.iter().any(String::is_empty) {
                return Err(bad("empty export name"));
            }
            rules.push(AllowRule { client: client.to_owned(), exports });
        }
        Ok(AllowList { rules })
    }

    /// Whether `who` may see export `name`.
    pub fn permits(&self, who: Option<&ClientIdentity>, name: &str) -> bool {
        let Some(who) = who else { return false };
        self.rules
            .iter()
            .filter(|r| r.client == "*" || who.names.contains(&r.client))
            .any(|r| r.exports.iter().any(|p| export_matches(p, name)))
    }
}

fn export_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// TLS settings of a server.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    pub(crate) rustls: Arc<rustls::ServerConfig>,
    pub(crate) mode: TlsMode,
    /// Client certificates are requested and verified.
    pub(crate) client_auth: bool,
    pub(crate) allow: Option<AllowList>,
}

/// Equal when they share the same rustls configuration (it has no equality
/// of its own) and the same mode and allow-list.
impl PartialEq for TlsConfig {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.rustls, &other.rustls)
            && self.mode == other.mode
            && self.client_auth == other.client_auth
            && self.allow == other.allow
    }
}

impl Eq for TlsConfig {}

impl TlsConfig {
    /// Load the server certificate chain and key (PEM) and, with
    /// `client_ca`, require client certificates signed by one of the CA
    /// certificates in that PEM file.
    pub fn from_pem_files(
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
        mode: TlsMode,
    ) -> Result<TlsConfig, TlsError> {
        let chain = load_certs(cert)?;
        let key_der = load_key(key)?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        check_key(&provider, key, &key_der)?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::CertKey)?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in load_certs(ca)? {
                    roots.add(c).map_err(|e| TlsError::BadCa { path: ca.to_owned(), detail: e.to_string() })?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| TlsError::Verifier(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        // with_single_cert checks that the key belongs to the certificate.
        let config = builder.with_single_cert(chain, key_der).map_err(TlsError::CertKey)?;
        Ok(TlsConfig { rustls: Arc::new(config), mode, client_auth: client_ca.is_some(), allow: None })
    }

    /// Use an existing rustls configuration; `client_auth` says whether it
    /// verifies client certificates (needed for an allow-list).
    pub fn from_rustls(config: Arc<rustls::ServerConfig>, mode: TlsMode, client_auth: bool) -> TlsConfig {
        TlsConfig { rustls: config, mode, client_auth, allow: None }
    }

    /// Restrict which exports each client certificate may see.
    pub fn with_allow_list(mut self, allow: AllowList) -> Result<TlsConfig, TlsError> {
        if !self.client_auth {
            return Err(TlsError::AllowListWithoutCa);
        }
        self.allow = Some(allow);
        Ok(self)
    }

    pub fn mode(&self) -> TlsMode {
        self.mode
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), source })
}

fn pem_error(path: &Path, e: rustls::pki_types::pem::Error) -> TlsError {
    TlsError::Pem { path: path.to_owned(), detail: e.to_string() }
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_file(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>().map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read_file(path)?;
    match PrivateKeyDer::from_pem_slice(&pem) {
        Ok(k) => Ok(k),
        Err(rustls::pki_types::pem::Error::NoItemsFound) => Err(TlsError::NoKey(path.to_owned())),
        Err(e) => Err(pem_error(path, e)),
    }
}

/// What the aws-lc-rs provider signs with (rustls 0.23).
const USABLE_KEYS: &str = "RSA of 2048 to 8192 bits, ECDSA P-256, P-384 or P-521, Ed25519";

/// Fails with a message naming the key's kind and size when the crypto
/// provider cannot load it: rustls alone only says it could not parse it.
fn check_key(
    provider: &rustls::crypto::CryptoProvider,
    path: &Path,
    key: &PrivateKeyDer<'static>,
) -> Result<(), TlsError> {
    match provider.key_provider.load_private_key(key.clone_key()) {
        Ok(_) => Ok(()),
        Err(e) => Err(TlsError::UnusableKey { path: path.to_owned(), key: describe_key(key), detail: e.to_string() }),
    }
}

/// "RSA 1024 bits", "ECDSA secp256k1", "Ed448"...: read from the key's
/// DER (PKCS#1, SEC1 or PKCS#8), as far as it parses.
fn describe_key(key: &PrivateKeyDer<'_>) -> String {
    let described = match key {
        PrivateKeyDer::Pkcs1(k) => rsa_bits(k.secret_pkcs1_der()).map(|b| format!("RSA {b} bits")),
        PrivateKeyDer::Sec1(k) => Some(format!("ECDSA {}", sec1_curve(k.secret_sec1_der()))),
        PrivateKeyDer::Pkcs8(k) => describe_pkcs8(k.secret_pkcs8_der()),
        _ => None,
    };
    described.unwrap_or_else(|| "a key of a kind not recognised".to_owned())
}

/// PrivateKeyInfo ::= SEQUENCE { version, SEQUENCE { algorithm OID,
/// parameters }, privateKey OCTET STRING, ... } (RFC 5208, 5958).
fn describe_pkcs8(der: &[u8]) -> Option<String> {
    let (_, info) = x509_parser::der_parser::parse_der(der).ok()?;
    let info = info.as_sequence().ok()?;
    let alg = info.get(1)?.as_sequence().ok()?;
    let oid = alg.first()?.as_oid().ok()?.to_id_string();
    let param = || alg.get(1).and_then(|p| p.as_oid().ok()).map(|o| curve_name(&o.to_id_string()));
    Some(match oid.as_str() {
        "1.2.840.113549.1.1.1" => format!("RSA {} bits", rsa_bits(info.get(2)?.as_slice().ok()?)?),
        "1.2.840.113549.1.1.10" => "RSA-PSS".to_owned(),
        "1.2.840.10045.2.1" => format!("ECDSA {}", param().unwrap_or_else(|| "of an unnamed curve".into())),
        "1.3.101.112" => "Ed25519".to_owned(),
        "1.3.101.113" => "Ed448".to_owned(),
        "1.2.840.10040.4.1" => "DSA".to_owned(),
        other => format!("algorithm {other}"),
    })
}

/// RSAPrivateKey ::= SEQUENCE { version, modulus INTEGER, ... }: the
/// modulus' length in bits.
fn rsa_bits(der: &[u8]) -> Option<usize> {
    let (_, key) = x509_parser::der_parser::parse_der(der).ok()?;
    let n = key.as_sequence().ok()?.get(1)?.as_slice().ok()?;
    let n = &n[n.iter().position(|&b| b != 0)?..];
    Some(n.len() * 8 - n[0].leading_zeros() as usize)
}

/// ECPrivateKey ::= SEQUENCE { version, privateKey, [0] parameters (the
/// curve OID) OPTIONAL, ... }.
fn sec1_curve(der: &[u8]) -> String {
    let curve = || -> Option<String> {
        let (_, key) = x509_parser::der_parser::parse_der(der).ok()?;
        let tagged = key.as_sequence().ok()?.get(2)?;
        let (_, oid) = x509_parser::der_parser::parse_der(tagged.as_slice().ok()?).ok()?;
        Some(curve_name(&oid.as_oid().ok()?.to_id_string()))
    };
    curve().unwrap_or_else(|| "of an unnamed curve".to_owned())
}

fn curve_name(oid: &str) -> String {
    match oid {
        "1.2.840.10045.3.1.7" => "P-256".to_owned(),
        "1.3.132.0.34" => "P-384".to_owned(),
        "1.3.132.0.35" => "P-521".to_owned(),
        "1.3.132.0.10" => "secp256k1".to_owned(),
        other => format!("curve {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(names: &[&str]) -> ClientIdentity {
        ClientIdentity { names: names.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn allow_list_rules() {
        let a = AllowList::parse(&["alice=disk0,disk1@*", "bob=*", "*=public"]).unwrap();
        let alice = who(&["alice", "alice.example"]);
        assert!(a.permits(Some(&alice), "disk0"));
        assert!(a.permits(Some(&alice), "disk1@snap"));
        assert!(!a.permits(Some(&alice), "disk1"));
        assert!(!a.permits(Some(&alice), "disk0@snap"));
        assert!(a.permits(Some(&alice), "public"));
        assert!(a.permits(Some(&who(&["bob"])), "anything"));
        assert!(a.permits(Some(&who(&["carol"])), "public"));
        assert!(!a.permits(Some(&who(&["carol"])), "disk0"));
        assert!(!a.permits(None, "public"), "no certificate: nothing");
    }

    #[test]
    fn allow_list_syntax() {
        for bad in ["alice", "=disk0", "alice=", "alice=a,,b"] {
            assert!(AllowList::parse(&[bad]).is_err(), "{bad}");
        }
        let a = AllowList::parse(&["CN with space=x=y"]).unwrap();
        assert!(a.permits(Some(&who(&["CN with space"])), "x=y"));
    }
}
