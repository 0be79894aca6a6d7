//! NBD over TLS (NBD_OPT_STARTTLS) with a rustls client: the handshake,
//! data over TLS, require mode, client certificates and the allow-list.
//! Certificates are made at test time with rcgen.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};

use common::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use tarn_nbd::memory::{MemoryBackend, MemoryExport};
use tarn_nbd::protocol::*;
use tarn_nbd::{AllowList, Server, ServerConfig, TlsConfig, TlsMode};

type TlsClient = Client<StreamOwned<ClientConnection, TcpStream>>;

// ------------------------------------------------------------ certificates

/// A CA that signs leaf certificates.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let pem = p.self_signed(&key).unwrap().pem();
        Ca { issuer: Issuer::new(p, key), pem }
    }

    /// (certificate PEM, key PEM) for `cn` with the given DNS/IP SANs.
    fn leaf(&self, cn: &str, sans: &[&str], client: bool) -> (String, String) {
        let mut p = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages =
            vec![if client { ExtendedKeyUsagePurpose::ClientAuth } else { ExtendedKeyUsagePurpose::ServerAuth }];
        let key = KeyPair::generate().unwrap();
        (p.signed_by(&key, &self.issuer).unwrap().pem(), key.serialize_pem())
    }
}

/// Files of a test PKI: a CA, a server certificate, clients signed by the
/// CA (alice, bob) and one signed by another CA (mallory).
struct Pki {
    dir: PathBuf,
    ca_pem: String,
}

impl Pki {
    fn new() -> Pki {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tarn-nbd-tls-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = Ca::new("tarn test CA");
        let other = Ca::new("some other CA");
        let write = |name: &str, (cert, key): (String, String)| {
            std::fs::write(dir.join(format!("{name}-cert.pem")), cert).unwrap();
            std::fs::write(dir.join(format!("{name}-key.pem")), key).unwrap();
        };
        write("server", ca.leaf("tarn server", &["localhost", "127.0.0.1"], false));
        write("alice", ca.leaf("alice", &["alice.example"], true));
        write("bob", ca.leaf("bob", &[], true));
        write("mallory", other.leaf("alice", &["alice.example"], true));
        std::fs::write(dir.join("ca.pem"), &ca.pem).unwrap();
        Pki { dir, ca_pem: ca.pem }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn server_config(&self, mode: TlsMode, client_ca: bool) -> TlsConfig {
        let ca = self.path("ca.pem");
        TlsConfig::from_pem_files(
            &self.path("server-cert.pem"),
            &self.path("server-key.pem"),
            client_ca.then_some(ca.as_path()),
            mode,
        )
        .expect("server TLS config")
    }

    /// A client trusting the CA, presenting `cert` ("alice", ...) if given.
    fn client_config(&self, cert: Option<&str>) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let b = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        Arc::new(match cert {
            None => b.with_no_client_auth(),
            Some(name) => {
                let chain = vec![CertificateDer::from_pem_file(self.path(&format!("{name}-cert.pem"))).unwrap()];
                let key = PrivateKeyDer::from_pem_file(self.path(&format!("{name}-key.pem"))).unwrap();
                b.with_client_auth_cert(chain, key).unwrap()
            }
        })
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ------------------------------------------------------------ log capture

/// Warnings logged by the server, to check that refusals are logged.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            WARNINGS.lock().unwrap().push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

fn capture_logs() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        log::set_logger(&Capture).unwrap();
        log::set_max_level(log::LevelFilter::Warn);
    });
}

/// Wait (bounded) for a warning containing every one of `parts`.
fn warned(parts: &[&str]) -> bool {
    for _ in 0..100 {
        if WARNINGS.lock().unwrap().iter().any(|w| parts.iter().all(|p| w.contains(p))) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

// ------------------------------------------------------------ helpers

/// Reads take 200 µs, so the server answers them on worker threads
/// (encrypting concurrently with the reader).
fn slow_reads() -> SlowExport {
    SlowExport::new(1 << 20, std::time::Duration::from_micros(200), Default::default(), Default::default())
}

fn serve(tls: TlsConfig) -> (Server, SocketAddr) {
    let backend = MemoryBackend::new()
        .with_export("mem", "test export", Arc::new(MemoryExport::new(SIZE)))
        .with_export("slow", "slow reads", Arc::new(slow_reads()))
        .with_export("other", "another export", Arc::new(MemoryExport::new(SIZE)));
    let server = Server::new(Arc::new(backend), ServerConfig { tls: Some(tls), ..ServerConfig::default() });
    let addr = server.listen_tcp("127.0.0.1:0").expect("listen");
    (server, addr)
}

/// NBD_OPT_STARTTLS, then the TLS handshake (driven by the first I/O).
fn starttls(mut c: Client, config: Arc<ClientConfig>) -> TlsClient {
    let r = c.option(NBD_OPT_STARTTLS, &[]);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].rtype, NBD_REP_ACK);
    let conn = ClientConnection::new(config, ServerName::try_from("localhost").unwrap()).unwrap();
    Client { s: StreamOwned::new(conn, c.s) }
}

/// Connect, STARTTLS (presenting `cert` if given) and GO to `export`.
fn session(addr: SocketAddr, pki: &Pki, cert: Option<&str>, export: &str) -> TlsClient {
    let mut c = starttls(Client::connect(addr), pki.client_config(cert));
    c.go(export, &[]).unwrap_or_else(|e| panic!("GO {export} over TLS: error {e:#x}"));
    c
}

/// The TLS handshake must fail or the server must close right after it.
fn refused(mut c: TlsClient) -> bool {
    let mut b = [0u8; 1];
    // In TLS 1.3 the client finishes first; the server's verdict arrives
    // with the first read.
    let _ = c.s.write_all(&[0u8; 16]);
    read_shows_close(&c.s.read(&mut b), "refused")
}

/// The server may send a TLS alert, then must close (bounded read).
fn closes_after_alert(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 4096];
    for _ in 0..16 {
        if read_shows_close(&s.read(&mut b), "closes_after_alert") {
            return true;
        }
    }
    false
}

fn listed<S: Read + Write>(c: &mut Client<S>) -> Vec<String> {
    let r = c.option(NBD_OPT_LIST, &[]);
    assert_eq!(r.last().unwrap().rtype, NBD_REP_ACK, "{r:?}");
    r.iter()
        .filter(|r| r.rtype == NBD_REP_SERVER)
        .map(|r| {
            let n = u32::from_be_bytes(r.data[0..4].try_into().unwrap()) as usize;
            String::from_utf8(r.data[4..4 + n].to_vec()).unwrap()
        })
        .collect()
}

// ------------------------------------------------------------ tests

#[test]
fn data_over_tls_reads_back() {
    let pki = Pki::new();
    let (_server, addr) = serve(pki.server_config(TlsMode::Optional, false));
    let mut c = starttls(Client::connect(addr), pki.client_config(None));
    c.structured();
    c.go("mem", &[]).expect("GO over TLS");
    // Pipelined writes then reads, large enough for several TLS records each.
    let chunk = 200_000usize;
    for i in 0..8u64 {
        c.write(i, i * chunk as u64, &pattern(i as u8, chunk));
    }
    for _ in 0..8u64 {
        let (e, h) = c.simple();
        assert_eq!(e, 0, "write {h}");
    }
    for i in 0..8u64 {
        c.request(0, NBD_CMD_READ, 100 + i, i * chunk as u64, chunk as u32, &[]);
    }
    // Replies may come in any order (slow requests go to workers).
    let mut seen = [false; 8];
    for _ in 0..8u64 {
        let ch = c.chunk();
        assert_eq!(ch.ctype, NBD_REPLY_TYPE_OFFSET_DATA);
        let i = ch.handle - 100;
        assert_eq!(u64::from_be_bytes(ch.payload[..8].try_into().unwrap()), i * chunk as u64);
        assert_eq!(&ch.payload[8..], &pattern(i as u8, chunk)[..], "read {i}");
        seen[i as usize] = true;
    }
    assert!(seen.iter().all(|s| *s));
    c.disc();
    // Optional mode: a plaintext client is served too.
    let (mut p, size, _) = Client::open(addr, false);
    assert_eq!(size, SIZE);
    assert_eq!(p.read_simple(1, 0, 4096), pattern(0, chunk)[..4096]);
}

#[test]
fn worker_replies_over_tls() {
    let pki = Pki::new();
    let (_server, addr) = serve(pki.server_config(TlsMode::Require, false));
    let mut c = session(addr, &pki, None, "slow");
    let len = 64 * 1024;
    for i in 0..16u64 {
        c.write(i, i * len as u64, &pattern(i as u8, len));
    }
    let mut done: Vec<u64> = (0..16).map(|_| c.simple()).inspect(|r| assert_eq!(r.0, 0)).map(|r| r.1).collect();
    done.sort_unstable();
    assert_eq!(done, (0..16).collect::<Vec<_>>());
    // Reads and flushes in flight together, answered by several workers
    // (possibly out of order) while the reader keeps decrypting requests.
    for round in 0..4u64 {
        for i in 0..16u64 {
            c.request(0, NBD_CMD_READ, 1000 + i, i * len as u64, len as u32, &[]);
        }
        c.request(0, NBD_CMD_FLUSH, 2000 + round, 0, 0, &[]);
        let mut seen = 0;
        for _ in 0..17 {
            // A simple reply's data length follows from the request.
            let (r, data) = c.reply(|h| if h >= 2000 { 0 } else { len });
            let Reply::Simple { error: 0, handle } = r else { panic!("round {round}: {r:?}") };
            if handle >= 2000 {
                assert!(data.is_empty());
                continue;
            }
            let i = handle - 1000;
            assert_eq!(data, pattern(i as u8, len), "round {round} read {i}");
            seen += 1;
        }
        assert_eq!(seen, 16);
    }
}

#[test]
fn garbage_records_inside_a_session_close_it() {
    let pki = Pki::new();
    let (_server, addr) = serve(pki.server_config(TlsMode::Optional, false));
    let mut c = session(addr, &pki, None, "mem");
    // An application-data record that does not decrypt, on the raw socket.
    let mut bad = vec![0x17, 0x03, 0x03, 0x00, 0x40];
    bad.extend_from_slice(&[0xa5; 0x40]);
    c.s.sock.write_all(&bad).unwrap();
    assert!(closes_after_alert(&mut c.s.sock));
    let mut again = session(addr, &pki, None, "mem");
    assert_eq!(again.read_simple(1, 0, 512).len(), 512);
}

#[test]
fn starttls_state_and_repeats() {
    let pki = Pki::new();
    let (_server, addr) = serve(pki.server_config(TlsMode::Optional, false));
    let mut c = Client::connect(addr);
    // Structured replies negotiated in plaintext do not survive STARTTLS.
    c.structured();
    let mut c = starttls(c, pki.client_config(None));
    let r = c.set_meta("mem", &["base:allocation"]);
    assert_eq!(r.last().unwrap().rtype, NBD_REP_ERR_INVALID, "structured state was kept");
    // STARTTLS again over TLS: ERR_INVALID (proto.md).
    let r = c.option(NBD_OPT_STARTTLS, &[]);
    assert_eq!(r[0].rtype, NBD_REP_ERR_INVALID);
    let (_, flags, _) = c.go("mem", &[]).unwrap();
    assert_eq!(flags & NBD_FLAG_SEND_DF, 0, "no structured replies after STARTTLS");
}

/// Extended headers negotiated in plaintext do not survive STARTTLS
/// (proto.md: the client MUST renegotiate them): compact requests and
/// simple replies afterwards.
#[test]
fn starttls_resets_extended_headers() {
    let pki = Pki::new();
    let (_server, addr) = serve(pki.server_config(TlsMode::Optional, false));
    let mut c = Client::connect(addr);
    assert_eq!(c.option(NBD_OPT_EXTENDED_HEADERS, &[])[0].rtype, NBD_REP_ACK);
    let mut c = starttls(c, pki.client_config(None));
    let (_, flags, _) = c.go("mem", &[]).unwrap();
    assert_eq!(flags & NBD_FLAG_SEND_DF, 0, "no structured replies after STARTTLS");
    c.write(1, 0, &[7u8; 512]);
    assert_eq!(c.simple(), (0, 1));
    assert_eq!(c.read_simple(2, 0, 512), vec![7u8; 512]);
}

#[test]
fn require_mode_refuses_plaintext() {
    let pki = Pki::new();
    let (_server, addr) = serve(pki.server_config(TlsMode::Require, false));
    let mut c = Client::connect(addr);
    for (opt, data) in [
        (NBD_OPT_LIST, vec![]),
        (NBD_OPT_STRUCTURED_REPLY, vec![]),
        (NBD_OPT_INFO, info_data("mem", &[])),
        (NBD_OPT_GO, info_data("mem", &[])),
        (NBD_OPT_LIST_META_CONTEXT, meta_data("mem", &[])),
        (999, vec![]),
    ] {
        let r = c.option(opt, &data);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].rtype, NBD_REP_ERR_TLS_REQD, "option {opt}");
    }
    // The same connection may still upgrade and then succeed.
    let mut t = starttls(c, pki.client_config(None));
    assert_eq!(listed(&mut t), ["mem", "slow", "other"]);
    t.go("mem", &[]).expect("GO after STARTTLS");
    assert_eq!(t.read_simple(7, 0, 512).len(), 512);
    // NBD_OPT_EXPORT_NAME cannot be refused: the server closes.
    let mut c = Client::connect(addr);
    c.send_option(NBD_OPT_EXPORT_NAME, b"mem");
    assert!(c.closed_by_server());
    // ABORT is still answered.
    let mut c = Client::connect(addr);
    assert_eq!(c.option(NBD_OPT_ABORT, &[])[0].rtype, NBD_REP_ACK);
}

#[test]
fn client_certificates_are_verified() {
    capture_logs();
    let pki = Pki::new();
    let (_server, addr) = serve(pki.server_config(TlsMode::Require, true));
    // Signed by the CA: served.
    let mut ok = session(addr, &pki, Some("alice"), "mem");
    // No certificate, or one from another CA (same names): refused, logged.
    let none = Client::connect(addr);
    let port = none.s.local_addr().unwrap().port();
    assert!(refused(starttls(none, pki.client_config(None))));
    assert!(warned(&["TLS refused", &format!("127.0.0.1:{port}")]), "no warning for {port}");
    let bad = Client::connect(addr);
    let port = bad.s.local_addr().unwrap().port();
    assert!(refused(starttls(bad, pki.client_config(Some("mallory")))));
    let peer = format!("127.0.0.1:{port}");
    assert!(warned(&["TLS refused", &peer, "invalid peer certificate"]), "no warning for {port}");
    // The good session is unaffected.
    assert_eq!(ok.read_simple(1, 0, 4096).len(), 4096);
}

#[test]
fn allow_list_hides_and_refuses_exports() {
    let pki = Pki::new();
    let allow = AllowList::parse(&["alice.example=mem"]).unwrap();
    let tls = pki.server_config(TlsMode::Optional, true).with_allow_list(allow).unwrap();
    let (_server, addr) = serve(tls);
    // alice (matched by her DNS SAN) sees and opens only "mem".
    let mut a = starttls(Client::connect(addr), pki.client_config(Some("alice")));
    assert_eq!(listed(&mut a), ["mem"]);
    assert_eq!(a.option(NBD_OPT_INFO, &info_data("other", &[])).last().unwrap().rtype, NBD_REP_ERR_UNKNOWN);
    assert_eq!(a.go("other", &[]).unwrap_err(), NBD_REP_ERR_UNKNOWN);
    a.structured();
    assert_eq!(a.set_meta("other", &["base:allocation"]).last().unwrap().rtype, NBD_REP_ERR_UNKNOWN);
    a.go("mem", &[]).expect("alice may open mem");
    // bob has a valid certificate but no rule: nothing.
    let mut b = starttls(Client::connect(addr), pki.client_config(Some("bob")));
    assert!(listed(&mut b).is_empty());
    assert_eq!(b.go("mem", &[]).unwrap_err(), NBD_REP_ERR_UNKNOWN);
    b.send_option(NBD_OPT_EXPORT_NAME, b"other");
    assert!(b.closed_by_server(), "EXPORT_NAME of a hidden export closes");
    // A plaintext client has no identity: nothing either, and INFO/GO
    // answer ERR_TLS_REQD (every export is TLS-only, proto.md SELECTIVETLS).
    let mut p = Client::connect(addr);
    assert!(listed(&mut p).is_empty());
    assert_eq!(p.go("mem", &[]).unwrap_err(), NBD_REP_ERR_TLS_REQD);
    assert_eq!(p.go("nosuch", &[]).unwrap_err(), NBD_REP_ERR_TLS_REQD);
    p.structured();
    assert_eq!(p.set_meta("mem", &["base:allocation"]).last().unwrap().rtype, NBD_REP_ERR_UNKNOWN);
}

/// A reload swaps the TLS settings: new connections get the new ones,
/// an established TLS session carries on.
#[test]
fn set_tls_applies_to_new_connections() {
    let pki = Pki::new();
    let (server, addr) = serve(pki.server_config(TlsMode::Optional, false));
    let mut held = session(addr, &pki, None, "mem");
    assert_eq!(listed(&mut Client::connect(addr)), ["mem", "slow", "other"], "optional: plaintext lists");
    server.set_tls(Some(pki.server_config(TlsMode::Require, false)));
    let r = Client::connect(addr).option(NBD_OPT_LIST, &[]);
    assert_eq!(r[0].rtype, NBD_REP_ERR_TLS_REQD, "require after the swap");
    assert_eq!(held.read_simple(1, 0, 4096).len(), 4096);
    server.set_tls(None);
    let r = Client::connect(addr).option(NBD_OPT_STARTTLS, &[]);
    assert_eq!(r[0].rtype, NBD_REP_ERR_POLICY, "no TLS after the second swap");
    assert_eq!(held.read_simple(2, 4096, 4096).len(), 4096);
}

#[test]
fn allow_list_needs_client_certificates() {
    let pki = Pki::new();
    let allow = AllowList::parse(&["alice=mem"]).unwrap();
    assert!(pki.server_config(TlsMode::Optional, false).with_allow_list(allow).is_err());
}

#[test]
fn garbage_after_starttls_closes_only_that_connection() {
    let pki = Pki::new();
    let (server, addr) = serve(pki.server_config(TlsMode::Optional, false));
    let mut good = session(addr, &pki, None, "mem");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..20 {
        let mut c = Client::connect(addr);
        assert_eq!(c.option(NBD_OPT_STARTTLS, &[])[0].rtype, NBD_REP_ACK);
        let len = 1 + round * 97;
        let junk: Vec<u8> = (0..len)
            .map(|i| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Some rounds look like a TLS handshake record header.
                if round % 2 == 0 && i == 0 {
                    0x16
                } else {
                    seed as u8
                }
            })
            .collect();
        let _ = c.s.write_all(&junk);
        let _ = c.s.shutdown(std::net::Shutdown::Write);
        assert!(closes_after_alert(&mut c.s), "round {round}");
    }
    // Still serving: the old session and new ones.
    assert_eq!(good.read_simple(1, 0, 512).len(), 512);
    let again = session(addr, &pki, None, "mem");
    drop(again);
    drop(good);
    server.shutdown();
}

#[test]
fn bad_pem_files_are_typed_errors() {
    let pki = Pki::new();
    let cert = pki.path("server-cert.pem");
    let key = pki.path("server-key.pem");
    let err = |c: &Path, k: &Path, ca: Option<&Path>| {
        TlsConfig::from_pem_files(c, k, ca, TlsMode::Require).map(|_| ()).unwrap_err().to_string()
    };
    assert!(err(&pki.path("missing.pem"), &key, None).contains("cannot read"));
    assert!(err(&key, &key, None).contains("no certificate"));
    assert!(err(&cert, &cert, None).contains("no private key"));
    // Alice's key does not belong to the server certificate.
    assert!(err(&cert, &pki.path("alice-key.pem"), None).contains("not usable together"));
    assert!(err(&cert, &key, Some(&pki.path("server-key.pem"))).contains("no certificate"));
}
