//! `tarn serve`: every volume and snapshot of the pool as an NBD export, a control
//! socket for admin requests, a background commit every few seconds, and
//! a clean shutdown (drain, commit, checkpoint) on SIGTERM or SIGINT.

use crate::control;
use crate::export::{Clients, PoolBackend};
use crate::poolfile::{control_alias_path, control_socket_path, open_pool};
use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tarn_engine::{OpenOptions, Pool};
use tarn_nbd::{Server, ServerConfig, TlsConfig};

#[derive(Debug, Clone)]
pub struct ServeArgs {
    pub pool: PathBuf,
    pub members: Vec<PathBuf>,
    pub listen: Option<String>,
    pub socket: Option<PathBuf>,
    pub strict: bool,
    pub commit_interval: Duration,
    /// NBD over TLS; None: STARTTLS is refused.
    pub tls: Option<TlsConfig>,
    /// Permissions of the Unix socket.
    pub socket_mode: u32,
}

pub fn serve(args: ServeArgs, on_ready: impl FnOnce(Option<std::net::SocketAddr>)) -> Result<()> {
    let opened = open_pool(&args.pool, &args.members, OpenOptions { strict: args.strict, ..Default::default() })?;
    let status = opened.pool.status();
    let pool = Arc::new(opened.pool);
    crate::mirror::spawn_resync(pool.clone());
    let control_path = control_socket_path(&status.uuid);
    let clients = Arc::new(Clients::default());
    control::listen(control_path.clone(), pool.clone(), clients.clone())?;
    let alias = control_alias_path(&args.pool);
    let _ = std::fs::remove_file(&alias);
    if let Err(e) = std::os::unix::fs::symlink(&control_path, &alias) {
        log::warn!("control socket alias {}: {e} (admin commands then need a readable pool device)", alias.display());
    }
    if let Some(t) = &args.tls {
        log::info!("NBD over TLS: {:?}", t.mode());
    }
    let config = ServerConfig { tls: args.tls.clone(), ..ServerConfig::default() };
    let server = Server::new(Arc::new(PoolBackend::new(pool.clone(), clients)), config);
    let addr = match &args.listen {
        Some(a) => Some(server.listen_tcp(a).with_context(|| format!("listen on {a}"))?),
        None => None,
    };
    if let Some(sock) = &args.socket {
        server
            .listen_unix_with_mode(sock, args.socket_mode)
            .with_context(|| format!("listen on {}", sock.display()))?;
    }
    log::info!("serving pool {} ({} volumes) on {:?} {:?}", status.uuid, status.volumes, addr, args.socket);
    on_ready(addr);
    let stop = Arc::new(AtomicBool::new(false));
    let committer = spawn_committer(pool.clone(), args.commit_interval, stop.clone());
    spawn_region_resync(pool.clone());
    let mut signals = Signals::new([SIGTERM, SIGINT]).context("install signal handlers")?;
    if let Some(sig) = signals.forever().next() {
        log::info!("signal {sig}: draining connections");
    }
    server.shutdown();
    stop.store(true, Ordering::SeqCst);
    let _ = committer.join();
    let _ = std::fs::remove_file(&control_path);
    let _ = std::fs::remove_file(&alias);
    if let Some(sock) = &args.socket {
        let _ = std::fs::remove_file(sock);
    }
    pool.close().context("final commit")?;
    eprintln!("tarn: pool committed and closed");
    Ok(())
}

/// Resync the overwrite regions a crash left open, while clients already
/// work (reads there resync what they touch first).
fn spawn_region_resync(pool: Arc<Pool>) {
    let pending = pool.resync_pending();
    if pending == 0 {
        return;
    }
    let spawned = std::thread::Builder::new().name("resync".into()).spawn(move || {
        let started = std::time::Instant::now();
        match pool.resync() {
            Ok(n) => log::info!("resync of {pending} regions done in {:.1?}: {n} checksums renewed", started.elapsed()),
            Err(e) => log::error!("resync failed: {e}"),
        }
    });
    if let Err(e) = spawned {
        log::error!("could not start the resync thread ({e}); it runs at the next checkpoint");
    }
}

/// Commit whatever changed every `interval`, so clients that never flush
/// lose at most that much.
fn spawn_committer(pool: Arc<Pool>, interval: Duration, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("committer".into())
        .spawn(move || {
            let tick = Duration::from_millis(100);
            let mut waited = Duration::ZERO;
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(tick);
                waited += tick;
                // Writes waiting for an overwrite region to open are
                // redirected meanwhile: open it within a tick.
                if waited < interval && !pool.wants_commit() {
                    continue;
                }
                waited = Duration::ZERO;
                if pool.is_dirty() && !pool.is_fenced() {
                    if let Err(e) = pool.flush() {
                        log::error!("background commit failed: {e}");
                    }
                }
            }
        })
        .expect("spawn committer thread")
}
