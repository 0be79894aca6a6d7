//! Serve a sparse in-memory export named "mem" over NBD.
//!
//! ```text
//! memserve --size 64M --listen 127.0.0.1:10809 [--socket PATH] [--read-only]
//!           [--dirty-bitmap NAME] [--workers N] [--max-in-flight N]
//!           [--tls CERT.pem KEY.pem] [-v|-vv]
//! ```
//!
//! `--dirty-bitmap NAME` tracks the ranges written, trimmed or zeroed since
//! start-up and offers them as the metadata context `qemu:dirty-bitmap:NAME`.
//!
//! Runs until SIGTERM or SIGINT, then shuts the server down gracefully.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use tarn_nbd::memory::{MemoryBackend, MemoryExport};
use tarn_nbd::{Server, ServerConfig};

struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            eprintln!("memserve: {} {}", r.level(), r.args());
        }
    }
    fn flush(&self) {}
}

fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        (i, 't' | 'T') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

fn usage() -> ExitCode {
    eprintln!("usage: memserve --size SIZE[K|M|G] [--listen ADDR:PORT] [--socket PATH] [--read-only] [--dirty-bitmap NAME] [--workers N] [--max-in-flight N] [--tls CERT KEY] [-v|-vv]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut size = None;
    let mut listen = None;
    let mut socket: Option<PathBuf> = None;
    let mut read_only = false;
    let mut dirty_bitmap: Option<String> = None;
    let mut config = ServerConfig::default();
    let mut level = log::LevelFilter::Warn;
    let mut tls_files: Vec<PathBuf> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--size" => match args.next().as_deref().and_then(parse_size) {
                Some(s) => size = Some(s),
                None => return usage(),
            },
            "--listen" => listen = args.next(),
            "--socket" => socket = args.next().map(PathBuf::from),
            "--read-only" => read_only = true,
            "--dirty-bitmap" => match args.next() {
                Some(n) if !n.is_empty() => dirty_bitmap = Some(n),
                _ => return usage(),
            },
            "--workers" => match args.next().and_then(|v| v.parse().ok()) {
                Some(n) => config.workers_per_conn = n,
                None => return usage(),
            },
            "--max-in-flight" => match args.next().and_then(|v| v.parse().ok()) {
                Some(n) => config.max_in_flight_per_conn = n,
                None => return usage(),
            },
            "--tls" => match (args.next(), args.next()) {
                (Some(cert), Some(key)) => tls_files = vec![cert.into(), key.into()],
                _ => return usage(),
            },
            "-v" => level = log::LevelFilter::Info,
            "-vv" => level = log::LevelFilter::Debug,
            _ => return usage(),
        }
    }
    let Some(size) = size else { return usage() };
    if listen.is_none() && socket.is_none() {
        return usage();
    }
    if log::set_logger(&StderrLogger).is_ok() {
        log::set_max_level(level);
    }
    if let [cert, key] = tls_files.as_slice() {
        match tarn_nbd::TlsConfig::from_pem_files(cert, key, None, tarn_nbd::TlsMode::Optional) {
            Ok(t) => config.tls = Some(t),
            Err(e) => {
                eprintln!("memserve: {e}");
                return ExitCode::FAILURE;
            }
        }
    }

    // Block SIGTERM/SIGINT in every thread (inherited by those spawned
    // later) and wait for them synchronously below.
    // SAFETY: plain libc signal-mask calls on a local, initialised set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };

    let mut export = if read_only { MemoryExport::new_read_only(size) } else { MemoryExport::new(size) };
    if let Some(name) = &dirty_bitmap {
        export = export.with_dirty_bitmap(name);
    }
    let backend = MemoryBackend::new().with_export("mem", "tarn in-memory test export", Arc::new(export));
    let server = Server::new(Arc::new(backend), config);
    if let Some(addr) = &listen {
        match server.listen_tcp(addr) {
            Ok(a) => eprintln!("memserve: listening on {a}"),
            Err(e) => {
                eprintln!("memserve: cannot listen on {addr}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(path) = &socket {
        if let Err(e) = server.listen_unix(path) {
            eprintln!("memserve: cannot listen on {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("memserve: listening on {}", path.display());
    }

    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is initialised; `sig` is a valid out-pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    eprintln!("memserve: signal {sig}, shutting down");
    server.shutdown();
    ExitCode::SUCCESS
}
