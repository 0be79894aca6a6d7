//! The control socket: one JSON request per line in, one JSON answer per
//! line out. Mode 0600, so only the pool's owner can manage it.

use crate::admin::{execute, Request};
use anyhow::{anyhow, Context, Result};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tarn_engine::Pool;

/// Longest request line accepted.
const MAX_LINE: u64 = 64 * 1024;

/// Ask the server at `path` to run `req`.
pub fn call(path: &Path, req: &Request) -> Result<Value> {
    let mut s = UnixStream::connect(path).with_context(|| format!("connect to {}", path.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(600)))?;
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    s.write_all(line.as_bytes())?;
    let mut answer = String::new();
    BufReader::new(s).take(64 << 20).read_line(&mut answer)?;
    let v: Value = serde_json::from_str(&answer).context("server answered with invalid JSON")?;
    if v["ok"].as_bool() == Some(true) {
        Ok(v["data"].clone())
    } else {
        Err(anyhow!("{}", v["error"].as_str().unwrap_or("server refused the request")))
    }
}

/// Serve admin requests on `path` until the process exits.
pub fn listen(path: PathBuf, pool: Arc<Pool>) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).with_context(|| format!("bind control socket {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    std::thread::Builder::new().name("control".into()).spawn(move || {
        for conn in listener.incoming().flatten() {
            let pool = pool.clone();
            let _ = std::thread::Builder::new().name("control-conn".into()).spawn(move || answer(conn, &pool));
        }
    })?;
    Ok(())
}

fn answer(conn: UnixStream, pool: &Pool) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut line = String::new();
    if BufReader::new(conn).take(MAX_LINE).read_line(&mut line).is_err() {
        return;
    }
    let reply = match serde_json::from_str::<Request>(&line) {
        Ok(req) => {
            log::info!("control request: {req:?}");
            match execute(pool, &req) {
                Ok(data) => json!({ "ok": true, "data": data }),
                Err(e) => json!({ "ok": false, "error": e }),
            }
        }
        Err(e) => json!({ "ok": false, "error": format!("bad request: {e}") }),
    };
    let _ = writeln!(out, "{reply}");
}
