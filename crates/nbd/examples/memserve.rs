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

/// The command line.
struct Opts {
    size: u64,
    listen: Option<String>,
    socket: Option<PathBuf>,
    read_only: bool,
    dirty_bitmap: Option<String>,
    config: ServerConfig,
    level: log::LevelFilter,
    /// Certificate and key, or empty.
    tls_files: Vec<PathBuf>,
}

/// The options, or None on a usage error.
fn parse_args(mut args: impl Iterator<Item = String>) -> Option<Opts> {
    let mut o = Opts {
        size: 0,
        listen: None,
        socket: None,
        read_only: false,
        dirty_bitmap: None,
        config: ServerConfig::default(),
        level: log::LevelFilter::Warn,
        tls_files: Vec::new(),
    };
    let mut size = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--size" => size = Some(args.next().as_deref().and_then(parse_size)?),
            "--listen" => o.listen = args.next(),
            "--socket" => o.socket = args.next().map(PathBuf::from),
            "--read-only" => o.read_only = true,
            "--dirty-bitmap" => o.dirty_bitmap = Some(args.next().filter(|n| !n.is_empty())?),
            "--workers" => o.config.workers_per_conn = args.next()?.parse().ok()?,
            "--max-in-flight" => o.config.max_in_flight_per_conn = args.next()?.parse().ok()?,
            "--tls" => o.tls_files = vec![args.next()?.into(), args.next()?.into()],
            "-v" => o.level = log::LevelFilter::Info,
            "-vv" => o.level = log::LevelFilter::Debug,
            _ => return None,
        }
    }
    o.size = size?;
    if o.listen.is_none() && o.socket.is_none() {
        return None;
    }
    Some(o)
}

/// Block SIGTERM/SIGINT in every thread (inherited by those spawned later)
/// so that main can wait for them synchronously.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-mask calls on a local, initialised set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// The server with its "mem" export, listening where the options say.
fn start_server(o: Opts) -> Result<Server, String> {
    let mut export = if o.read_only { MemoryExport::new_read_only(o.size) } else { MemoryExport::new(o.size) };
    if let Some(name) = &o.dirty_bitmap {
        export = export.with_dirty_bitmap(name);
    }
    let backend = MemoryBackend::new().with_export("mem", "tarn in-memory test export", Arc::new(export));
    let server = Server::new(Arc::new(backend), o.config);
    if let Some(addr) = &o.listen {
        let a = server.listen_tcp(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        eprintln!("memserve: listening on {a}");
    }
    if let Some(path) = &o.socket {
        server.listen_unix(path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        eprintln!("memserve: listening on {}", path.display());
    }
    Ok(server)
}

fn main() -> ExitCode {
    let Some(mut opts) = parse_args(std::env::args().skip(1)) else { return usage() };
    if log::set_logger(&StderrLogger).is_ok() {
        log::set_max_level(opts.level);
    }
    if let [cert, key] = opts.tls_files.as_slice() {
        match tarn_nbd::TlsConfig::from_pem_files(cert, key, None, tarn_nbd::TlsMode::Optional) {
            Ok(t) => opts.config.tls = Some(t),
            Err(e) => {
                eprintln!("memserve: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let set = block_stop_signals();
    let server = match start_server(opts) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("memserve: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is initialised; `sig` is a valid out-pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    eprintln!("memserve: signal {sig}, shutting down");
    server.shutdown();
    ExitCode::SUCCESS
}
