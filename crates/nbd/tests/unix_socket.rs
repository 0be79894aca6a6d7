//! Permissions of the Unix socket: 0600 by default whatever the umask,
//! exactly the mode asked for otherwise. Its own test binary because it
//! changes the process umask.

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

use common::Client;
use tarn_nbd::memory::{MemoryBackend, MemoryExport};
use tarn_nbd::protocol::*;
use tarn_nbd::{Server, ServerConfig};

fn server() -> Server {
    let backend = MemoryBackend::new().with_export("mem", "", Arc::new(MemoryExport::new(1 << 20)));
    Server::new(Arc::new(backend), ServerConfig::default())
}

fn mode_of(p: &PathBuf) -> u32 {
    let m = std::fs::symlink_metadata(p).unwrap();
    assert!(m.file_type().is_socket());
    m.permissions().mode() & 0o777
}

#[test]
fn socket_modes() {
    let dir = std::env::temp_dir().join(format!("tarn-nbd-sock-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        // (umask, requested mode or default, expected)
        (0o000, None, 0o600),
        (0o022, None, 0o600),
        (0o000, Some(0o660), 0o660),
        // The umask would cut group write: the requested mode wins.
        (0o077, Some(0o666), 0o666),
    ];
    for (i, (umask, mode, want)) in cases.into_iter().enumerate() {
        let path = dir.join(format!("s{i}.sock"));
        // SAFETY: umask only sets the process mask; this binary has a
        // single test, so nothing else creates files meanwhile.
        let old = unsafe { libc::umask(umask) };
        let s = server();
        match mode {
            None => s.listen_unix(&path).unwrap(),
            Some(m) => s.listen_unix_with_mode(&path, m).unwrap(),
        }
        unsafe { libc::umask(old) };
        assert_eq!(mode_of(&path), want, "case {i}: umask {umask:o} mode {mode:?}");
        // And it serves.
        let mut c = Client { s: UnixStream::connect(&path).unwrap() };
        let mut g = [0u8; 18];
        std::io::Read::read_exact(&mut c.s, &mut g).unwrap();
        std::io::Write::write_all(&mut c.s, &NBD_FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).unwrap();
        c.go("mem", &[]).expect("GO over the unix socket");
        drop(c);
        s.shutdown();
        assert!(!path.exists(), "socket removed at shutdown");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
