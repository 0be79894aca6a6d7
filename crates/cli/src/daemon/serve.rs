//! `tarn serve`: every volume and snapshot of the pool as an NBD export, a control
//! socket for admin requests, the engine's background service (a commit
//! every few seconds, resyncs after a crash), and a clean shutdown (drain,
//! stop the service, commit, checkpoint) on SIGTERM or SIGINT. Under
//! systemd (`Type=notify`) it reports READY=1 once it listens,
//! RELOADING=1/READY=1 around a reload (SIGHUP: the config file and TLS
//! files read again, see `reload`) and STOPPING=1 on shutdown.

use crate::config::{Resolved, RELOADABLE};
use crate::control;
use crate::export::{Clients, PoolBackend};
use crate::handover;
use crate::logging::{self, notice};
use crate::metrics::{self, Metrics};
use crate::poolfile::{control_alias_path, control_socket_path, open_pool_waiting, running_server};
use crate::trace::recorder::Tracer;
use anyhow::{bail, Context, Result};
use sd_notify::NotifyState;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tarn_engine::{OpenOptions, Service, ServiceOptions};
use tarn_nbd::{Server, ServerConfig, TlsConfig};

#[derive(Debug, Clone)]
pub struct ServeArgs {
    pub pool: PathBuf,
    pub members: Vec<PathBuf>,
    pub listen: Option<String>,
    pub socket: Option<PathBuf>,
    pub strict: bool,
    /// Bytes of metadata cache (0: the engine's default).
    pub metadata_cache: usize,
    pub placement: tarn_engine::PlacementKind,
    /// Blocks per region of `contiguous` placement (0: the default).
    pub region_blocks: u64,
    /// Search new `contiguous` homes from a random start.
    pub random_region_start: bool,
    /// Grow the pool ahead of the writers (None: never).
    pub expansion: Option<tarn_engine::Expansion>,
    pub commit_interval: Duration,
    /// Idle time before background compaction; None: never.
    pub compact_idle: Option<Duration>,
    pub compact_at: Option<u64>,
    /// NBD over TLS; None: STARTTLS is refused.
    pub tls: Option<TlsConfig>,
    /// Permissions of the Unix socket.
    pub socket_mode: u32,
    /// Record every request answered to this file (`tarn trace`).
    pub trace: Option<PathBuf>,
    /// Serve Prometheus metrics at `http://ADDR/metrics`.
    pub metrics: Option<String>,
    /// The device kept for hinted file-system metadata (index or path).
    pub metadata_device: Option<String>,
    /// Take the listening sockets over from the server running on the pool.
    pub takeover: bool,
    /// How long to wait for another process to release the pool.
    pub lock_wait: Duration,
    /// Usage thresholds and the alert hook.
    pub alerts: crate::alerts::AlertConfig,
    /// A file volume to mount through FUSE, and where.
    pub mount: Option<(String, PathBuf)>,
}

/// The modeled disk the placement benchmarks serve from
/// (`TARN_BENCH_DISK_MODEL=hdd`, bench/slow_disk.sh; unset or empty: none):
/// every device then delays its requests like one spinning disk. Never
/// for real use.
fn bench_disk_model() -> Result<Option<tarn_engine::device::disk_model::DiskModel>> {
    let name = std::env::var_os("TARN_BENCH_DISK_MODEL").unwrap_or_default();
    let name = name.to_string_lossy();
    if name.is_empty() {
        return Ok(None);
    }
    let model = tarn_engine::device::disk_model::DiskModel::parse(&name)
        .with_context(|| format!("TARN_BENCH_DISK_MODEL={name}: the only model is \"hdd\""))?;
    log::warn!("every device is behind a modeled spinning disk ({model:?}): benchmarks only");
    Ok(Some(model))
}

/// Serve until SIGTERM/SIGINT. `reloadable` is what a reload re-reads (None:
/// SIGHUP only logs that there is nothing to reload).
pub fn serve(
    args: ServeArgs,
    mut reloadable: Option<Resolved>,
    on_ready: impl FnOnce(Option<std::net::SocketAddr>),
) -> Result<()> {
    let options = OpenOptions {
        strict: args.strict,
        metadata_cache: args.metadata_cache,
        placement: args.placement,
        region_blocks: args.region_blocks,
        random_region_start: args.random_region_start,
        expansion: args.expansion,
        disk_model: bench_disk_model()?,
        ..Default::default()
    };
    let Inherited { nbd: inherited, metrics: metrics_fd } = inherited_sockets(&args)?;
    // After a takeover the predecessor holds the metrics address until it
    // exits: bind it once the pool is ours (it is exiting then).
    let early_metrics = match (&args.metrics, metrics_fd) {
        (_, Some(fd)) => Some(TcpListener::from(fd)),
        (Some(a), None) if !args.takeover => Some(metrics::bind(a)?),
        _ => None,
    };
    if args.lock_wait > Duration::ZERO {
        log::info!(
            "opening pool {} (waiting up to {} s for it to be free)",
            args.pool.display(),
            args.lock_wait.as_secs()
        );
    }
    // On RADOS, --takeover with no server answering here fences the holder
    // of the lease (on another host, or dead) instead of a socket handover.
    let fence = args.takeover && crate::devices::is_rados(&args.pool) && inherited.is_empty();
    let opened = open_pool_waiting(&args.pool, &args.members, options, args.lock_wait, fence)?;
    let metrics_listener = match (&args.metrics, early_metrics) {
        (_, Some(l)) => Some(l),
        (Some(a), None) => Some(bind_metrics_retrying(a)?),
        (None, None) => None,
    };
    if let Some(spec) = &args.metadata_device {
        let device = crate::hint::device_index(&opened.pool, spec).map_err(anyhow::Error::msg)?;
        opened.pool.set_hint_device(Some(device))?;
    }
    let status = opened.pool.status();
    let pool = Arc::new(opened.pool);
    let service = Service::start(
        pool.clone(),
        ServiceOptions {
            commit_interval: args.commit_interval,
            compact_idle: args.compact_idle,
            compact_at: args.compact_at,
            notice: Some(Arc::new(notice)),
            ..ServiceOptions::default()
        },
    );
    let control_path = control_socket_path(&status.uuid);
    let clients = Arc::new(Clients::default());
    let metrics = start_metrics(metrics_listener, &pool)?;
    crate::alerts::start(pool.clone(), args.alerts.clone(), metrics.clone())?;
    let alias = control_alias_path(&args.pool);
    let _ = std::fs::remove_file(&alias);
    if let Err(e) = std::os::unix::fs::symlink(&control_path, &alias) {
        log::warn!("control socket alias {}: {e} (admin commands then need a readable pool device)", alias.display());
    }
    if let Some(t) = &args.tls {
        log::info!("NBD over TLS: {:?}", t.mode());
    }
    let config = ServerConfig {
        tls: args.tls.clone(),
        workers_per_conn: workers_per_connection(&status),
        ..ServerConfig::default()
    };
    let tracer = match &args.trace {
        Some(path) => Some(Tracer::create(path).with_context(|| format!("create trace {}", path.display()))?),
        None => None,
    };
    let server = Arc::new(Server::new(
        Arc::new(PoolBackend::new(pool.clone(), clients.clone(), tracer.clone(), metrics.clone())),
        config,
    ));
    let mut addr = None;
    let own_sockets = inherited.is_empty();
    if own_sockets {
        if let Some(a) = &args.listen {
            addr = Some(server.listen_tcp(a).with_context(|| format!("listen on {a}"))?);
        }
        if let Some(sock) = &args.socket {
            server
                .listen_unix_with_mode(sock, args.socket_mode)
                .with_context(|| format!("listen on {}", sock.display()))?;
        }
    } else {
        for (fd, kept) in inherited {
            let what = server.listen_fd(fd, kept).context("serve on an inherited socket")?;
            addr = addr.or(what.parse().ok());
        }
        if args.listen.is_some() || args.socket.is_some() {
            log::info!("listen/socket options ignored: serving on the inherited sockets");
        }
    }
    let handed_over = Arc::new(AtomicBool::new(false));
    let hand_over: control::HandOver = {
        let (server, handed_over) = (server.clone(), handed_over.clone());
        Arc::new(move || {
            let fds = server.hand_over()?;
            handed_over.store(true, Ordering::SeqCst);
            Ok(fds)
        })
    };
    control::listen(control_path.clone(), pool.clone(), clients, metrics, Some(hand_over))?;
    let mounted = match &args.mount {
        None => None,
        Some((name, dir)) => match super::fsmount::start(&pool, name, dir) {
            Ok(m) => Some(m),
            Err(e) => {
                server.shutdown();
                service.stop();
                let _ = std::fs::remove_file(&control_path);
                let _ = std::fs::remove_file(&alias);
                pool.close().context("final commit")?;
                return Err(e);
            }
        },
    };
    log::info!("serving pool {} ({} volumes) on {:?} {:?}", status.uuid, status.volumes, addr, args.socket);
    // Before READY=1: a SIGHUP sent once systemd thinks we are up must
    // reload, not kill (its default action).
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP]).context("install signal handlers")?;
    on_ready(addr);
    sd_notify_states(&[NotifyState::Ready, NotifyState::Status(&format!("serving pool {}", status.uuid))]);
    for sig in signals.forever() {
        if sig != SIGHUP {
            log::info!("signal {sig}: draining connections");
            break;
        }
        reload(&mut reloadable, &server);
    }
    sd_notify_states(&[NotifyState::Stopping, NotifyState::Status("draining connections, committing")]);
    server.shutdown();
    let unmounted = mounted.map(super::fsmount::ServedMount::stop).transpose();
    if let Err(e) = &unmounted {
        log::error!("file volume mount: {e:#}");
    }
    let handed_over = handed_over.load(Ordering::SeqCst);
    if let (Some(t), Some(path)) = (&tracer, &args.trace) {
        let (recorded, dropped) = t.finish().with_context(|| format!("write trace {}", path.display()))?;
        notice(&format!("trace {}: {recorded} records, {dropped} dropped (queue full)", path.display()));
    }
    service.stop();
    let _ = std::fs::remove_file(&control_path);
    let _ = std::fs::remove_file(&alias);
    if let (Some(sock), true, false) = (&args.socket, own_sockets, handed_over) {
        let _ = std::fs::remove_file(sock);
    }
    let started = std::time::Instant::now();
    pool.close().context("final commit")?;
    log::info!("final commit and close took {:.3} s", started.elapsed().as_secs_f64());
    notice("pool committed and closed");
    unmounted.map(drop)
}

/// Listening sockets this process starts with.
struct Inherited {
    /// NBD sockets, each with whether it stays its giver's (systemd's).
    nbd: Vec<(OwnedFd, bool)>,
    /// A socket systemd named `metrics`, for the metrics endpoint.
    metrics: Option<OwnedFd>,
}

/// Listening sockets this process starts with: systemd's (`LISTEN_FDS`;
/// kept: they stay systemd's) or, with `--takeover`, the running server's.
fn inherited_sockets(args: &ServeArgs) -> Result<Inherited> {
    let mut nbd = Vec::new();
    let mut metrics_fd = None;
    for a in handover::activated()? {
        if a.name == "metrics" {
            metrics_fd = Some(a.fd);
        } else {
            nbd.push((a.fd, true));
        }
    }
    if !nbd.is_empty() {
        notice(&format!("socket activation: {} listening socket(s) from the service manager", nbd.len()));
    }
    if args.takeover {
        if !nbd.is_empty() {
            bail!("--takeover with sockets from the service manager: restart the service instead (systemctl restart)");
        }
        let control = match running_server(&args.pool) {
            Some(c) => c,
            // No server here: on RADOS the lease holder is fenced instead.
            None if crate::devices::is_rados(&args.pool) => {
                notice("--takeover: no server answers here; fencing the holder of the RADOS lease");
                return Ok(Inherited { nbd, metrics: metrics_fd });
            }
            None => bail!("--takeover: no running server answers for pool {}", args.pool.display()),
        };
        let (fds, pid) = handover::take(&control)?;
        notice(&format!("took over {} listening socket(s) from pid {pid}; it drains and commits", fds.len()));
        nbd.extend(fds.into_iter().map(|fd| (fd, false)));
    }
    Ok(Inherited { nbd, metrics: metrics_fd })
}

/// Bind the metrics address, retrying for a few seconds while it is in
/// use (the predecessor of a takeover has not quite exited yet).
fn bind_metrics_retrying(addr: &str) -> Result<TcpListener> {
    let deadline = std::time::Instant::now() + METRICS_BIND_WAIT;
    // Bounded by the deadline.
    loop {
        match TcpListener::bind(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            r => return r.with_context(|| format!("listen for metrics on {addr}")),
        }
    }
}

/// How long a taken-over server retries binding the metrics address.
const METRICS_BIND_WAIT: Duration = Duration::from_secs(10);

/// Metrics served on `listener` when `--metrics` asked for them.
fn start_metrics(listener: Option<TcpListener>, pool: &Arc<tarn_engine::Pool>) -> Result<Option<Arc<Metrics>>> {
    let Some(listener) = listener else { return Ok(None) };
    let m = Arc::new(Metrics::new(pool.clone())?);
    let local = metrics::serve(listener, m.clone())?;
    notice(&format!("metrics on http://{local}/metrics"));
    Ok(Some(m))
}

/// SIGHUP: read the config file (and the TLS files it names) again and
/// apply what can change while serving: the TLS settings (for connections
/// accepted from now on) and the log level. Anything else changed in the
/// file is logged as needing a restart. A file or TLS file that does not
/// load changes nothing. systemd hears RELOADING=1, then READY=1.
fn reload(config: &mut Option<Resolved>, server: &Server) {
    let now = NotifyState::monotonic_usec_now().ok();
    sd_notify_states(&[NotifyState::Reloading].into_iter().chain(now).collect::<Vec<_>>());
    match config.as_ref().map(Resolved::reload) {
        None => notice("SIGHUP: no configuration to reload (tarn run)"),
        Some(Err(e)) => log::error!("reload refused, configuration unchanged: {e:#}"),
        Some(Ok((new, stale))) => match crate::tls::config(&new.opts) {
            Err(e) => log::error!("reload refused, configuration unchanged: {e:#}"),
            Ok(tls) => {
                server.set_tls(tls);
                logging::set_level(new.opts.log_level);
                for key in &stale {
                    log::warn!("reload: {key} changed; it takes effect at the next restart");
                }
                notice(&format!(
                    "reloaded ({} applied; {} restart-only keys changed)",
                    RELOADABLE.join(", "),
                    stale.len()
                ));
                *config = Some(new);
            }
        },
    }
    sd_notify_states(&[NotifyState::Ready]);
}

/// Tell the service manager (a no-op without NOTIFY_SOCKET).
fn sd_notify_states(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        log::warn!("sd_notify to $NOTIFY_SOCKET: {e}");
    }
}

/// Worker threads per NBD connection. A RADOS write waits a network round
/// trip and the OSD's commit (about a millisecond), so with the local
/// default of 8 a client's queue depth 32 would stop at 8 writes in
/// flight; on a pool with a `rados://` device each connection gets 32, so
/// the whole queue reaches the cluster (and the RADOS write combiner).
fn workers_per_connection(status: &tarn_engine::PoolStatus) -> usize {
    let on_rados = status.devices.iter().any(|d| {
        crate::devices::is_rados(Path::new(&d.path))
            || d.legs.iter().any(|l| crate::devices::is_rados(Path::new(&l.path)))
    });
    if on_rados {
        32
    } else {
        ServerConfig::default().workers_per_conn
    }
}
