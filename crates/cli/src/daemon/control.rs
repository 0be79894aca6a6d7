//! The control socket: one JSON request per line in; zero or more
//! `{"progress":[done,total]}` lines (long requests only) then one JSON
//! answer line out. Mode 0600, so only the pool's owner can manage it.

use crate::admin::{execute, Ctx, Request};
use crate::export::Clients;
use crate::handover;
use crate::metrics::Metrics;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::cell::Cell;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tarn_engine::Pool;

/// Longest request line accepted.
const MAX_LINE: u64 = 64 * 1024;
/// Longest answer line accepted (a diff of a fragmented volume is long).
const MAX_ANSWER: u64 = 1 << 30;
/// Least time between two progress lines, so a fast flatten does not flood the socket.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// Ask the server at `path` to run `req`; `progress` sees the progress lines.
pub fn call(path: &Path, req: &Request, progress: &mut dyn FnMut(u64, u64)) -> Result<Value> {
    let mut s = UnixStream::connect(path).with_context(|| format!("connect to {}", path.display()))?;
    // Per read: a long request keeps the connection alive with progress lines.
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut reader = BufReader::new(s);
    loop {
        let mut answer = String::new();
        if (&mut reader).take(MAX_ANSWER).read_line(&mut answer)? == 0 {
            bail!("the server closed the control connection without answering (see its log)");
        }
        let v: Value = serde_json::from_str(&answer).context("server answered with invalid JSON")?;
        if let Some([done, total]) = v["progress"].as_array().map(Vec::as_slice) {
            progress(done.as_u64().unwrap_or(0), total.as_u64().unwrap_or(0));
            continue;
        }
        return if v["ok"].as_bool() == Some(true) {
            Ok(v["data"].clone())
        } else {
            Err(anyhow!("{}", v["error"].as_str().unwrap_or("server refused the request")))
        };
    }
}

/// Hands the listening sockets over to a successor (`tarn serve --takeover`).
pub type HandOver = Arc<dyn Fn() -> std::io::Result<Vec<OwnedFd>> + Send + Sync>;

/// Serve admin requests on `path` until the process exits; long ones
/// report their progress to `metrics` too. With `hand_over`, a takeover
/// request gets the listening sockets, and this process then stops as on
/// SIGTERM.
pub fn listen(
    path: PathBuf,
    pool: Arc<Pool>,
    clients: Arc<Clients>,
    metrics: Option<Arc<Metrics>>,
    hand_over: Option<HandOver>,
) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).with_context(|| format!("bind control socket {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    std::thread::Builder::new().name("control".into()).spawn(move || {
        for conn in listener.incoming().flatten() {
            let (pool, clients, metrics, hand) = (pool.clone(), clients.clone(), metrics.clone(), hand_over.clone());
            let _ = std::thread::Builder::new()
                .name("control-conn".into())
                .spawn(move || answer(conn, &pool, &clients, metrics.as_deref(), hand.as_ref()));
        }
    })?;
    Ok(())
}

/// The kind of a long request, as its progress is exported.
fn long_request(req: &Request) -> Option<&'static str> {
    Some(match req {
        Request::Scrub { .. } => "scrub",
        Request::PoolReplace { .. } => "resilver",
        Request::VolFlatten { .. } => "flatten",
        Request::Compact { .. } => "compact",
        Request::Check => "check",
        _ => return None,
    })
}

fn answer(conn: UnixStream, pool: &Pool, clients: &Clients, metrics: Option<&Metrics>, hand_over: Option<&HandOver>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    // A client that stops reading must not stall a flatten for long.
    let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut line = String::new();
    if BufReader::new(conn).take(MAX_LINE).read_line(&mut line).is_err() {
        return;
    }
    if line.trim() == handover::REQUEST {
        return take_over(&out, hand_over);
    }
    let reply = match serde_json::from_str::<Request>(&line) {
        Ok(req) => {
            log::info!("control request: {req:?}");
            let gone = Cell::new(false);
            let mut progress = ProgressLines { out: &mut out, last: None, broken: &gone };
            let op = metrics.zip(long_request(&req)).map(|(m, kind)| m.operation(kind));
            let mut report = |done, total| {
                progress.send(done, total);
                if let Some(op) = &op {
                    op.progress(done, total);
                }
            };
            let abandoned = || gone.get();
            let mut ctx = Ctx { progress: &mut report, clients: Some(clients), abandoned: &abandoned };
            match execute(pool, &req, &mut ctx) {
                Ok(data) => json!({ "ok": true, "data": data }),
                Err(e) => json!({ "ok": false, "error": e }),
            }
        }
        Err(e) => json!({ "ok": false, "error": format!("bad request: {e}") }),
    };
    // One write: formatting straight into the socket sent a 1,000-snapshot
    // listing in thousands of small writes (75 ms of a 77 ms `snap list`).
    let _ = out.write_all(format!("{reply}\n").as_bytes());
}

/// A successor asked for the listening sockets: send them, then stop as on
/// SIGTERM (stop accepting, drain, commit, close, exit).
fn take_over(out: &UnixStream, hand_over: Option<&HandOver>) {
    let Some(hand_over) = hand_over else {
        let _ = (&*out)
            .write_all(format!("{}\n", json!({ "ok": false, "error": "this server cannot hand over" })).as_bytes());
        return;
    };
    let sent = hand_over().and_then(|fds| handover::answer(out, &fds).map(|()| fds.len()));
    match sent {
        Ok(n) => {
            crate::logging::notice(&format!("handed {n} listening socket(s) to a successor; stopping"));
            // SAFETY: kill(2) to this process; the signal thread handles it.
            unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
        }
        Err(e) => log::error!("takeover: could not send the listening sockets: {e}"),
    }
}

/// Progress of a long request, as throttled lines to the client.
struct ProgressLines<'a> {
    out: &'a mut UnixStream,
    last: Option<Instant>,
    /// The client went away: most requests still complete, silently;
    /// compaction stops (`Ctx::abandoned`).
    broken: &'a Cell<bool>,
}

impl ProgressLines<'_> {
    fn send(&mut self, done: u64, total: u64) {
        let due = self.last.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) || done >= total;
        if self.broken.get() || !due {
            return;
        }
        self.last = Some(Instant::now());
        if writeln!(self.out, "{}", json!({ "progress": [done, total] })).is_err() {
            self.broken.set(true);
        }
    }
}
