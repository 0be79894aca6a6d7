//! `tarn serve`: every volume and snapshot of the pool as an NBD export, a control
//! socket for admin requests, a background commit every few seconds, and
//! a clean shutdown (drain, commit, checkpoint) on SIGTERM or SIGINT.

use crate::control;
use crate::export::{Clients, PoolBackend};
use crate::poolfile::{control_socket_path, open_pool};
use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tarn_engine::{OpenOptions, Pool};
use tarn_nbd::{Server, ServerConfig};

#[derive(Debug, Clone)]
pub struct ServeArgs {
    pub pool: PathBuf,
    pub members: Vec<PathBuf>,
    pub listen: Option<String>,
    pub socket: Option<PathBuf>,
    pub strict: bool,
    pub commit_interval: Duration,
}

pub fn serve(args: ServeArgs, on_ready: impl FnOnce(Option<std::net::SocketAddr>)) -> Result<()> {
    let opened = open_pool(&args.pool, &args.members, OpenOptions { strict: args.strict, ..Default::default() })?;
    let status = opened.pool.status();
    let pool = Arc::new(opened.pool);
    crate::mirror::spawn_resync(pool.clone());
    let control_path = control_socket_path(&status.uuid);
    let clients = Arc::new(Clients::default());
    control::listen(control_path.clone(), pool.clone(), clients.clone())?;
    let server = Server::new(Arc::new(PoolBackend::new(pool.clone(), clients)), ServerConfig::default());
    let addr = match &args.listen {
        Some(a) => Some(server.listen_tcp(a).with_context(|| format!("listen on {a}"))?),
        None => None,
    };
    if let Some(sock) = &args.socket {
        server.listen_unix(sock).with_context(|| format!("listen on {}", sock.display()))?;
    }
    log::info!("serving pool {} ({} volumes) on {:?} {:?}", status.uuid, status.volumes, addr, args.socket);
    on_ready(addr);
    let stop = Arc::new(AtomicBool::new(false));
    let committer = spawn_committer(pool.clone(), args.commit_interval, stop.clone());
    let mut signals = Signals::new([SIGTERM, SIGINT]).context("install signal handlers")?;
    if let Some(sig) = signals.forever().next() {
        log::info!("signal {sig}: draining connections");
    }
    server.shutdown();
    stop.store(true, Ordering::SeqCst);
    let _ = committer.join();
    let _ = std::fs::remove_file(&control_path);
    if let Some(sock) = &args.socket {
        let _ = std::fs::remove_file(sock);
    }
    pool.close().context("final commit")?;
    eprintln!("tarn: pool committed and closed");
    Ok(())
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
                if waited < interval {
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
