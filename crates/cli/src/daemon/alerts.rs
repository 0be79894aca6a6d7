//! Alerts of `tarn serve` (issue 12, item 4): pool usage crossing a
//! threshold (`--alert-at`, default 80,90,95 percent), a device added,
//! device read errors, checksum failures and a degraded member. Each is
//! logged (warn), counted in `tarn_alerts_total{kind}` and, with
//! `--alert-exec CMD`, passed to `sh -c CMD` as one JSON line on its
//! standard input. A thread looks at `Pool::status()` once a second, so
//! an alert never sits on the I/O path.

use crate::metrics::Metrics;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tarn_engine::{Pool, PoolStatus};

/// Usage thresholds when none are given, in percent.
pub const DEFAULT_THRESHOLDS: [u8; 3] = [80, 90, 95];
/// How often the pool is looked at.
const EVERY: Duration = Duration::from_secs(1);
/// A hook that has not ended by then is killed (alerts are not queued
/// behind a hung hook for long).
const HOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// Most thresholds accepted.
const MAX_THRESHOLDS: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertConfig {
    /// Usage percentages (1..=99, ascending) an alert fires at.
    pub thresholds: Vec<u8>,
    /// Shell command given each event as JSON on stdin.
    pub exec: Option<String>,
}

impl Default for AlertConfig {
    fn default() -> Self {
        AlertConfig { thresholds: DEFAULT_THRESHOLDS.to_vec(), exec: None }
    }
}

/// "80,90,95": percentages from 1 to 99, strictly ascending, 1 to 8 of them.
pub fn parse_thresholds(s: &str) -> Result<Vec<u8>, String> {
    let mut out: Vec<u8> = Vec::new();
    for part in s.split(',') {
        let p = part.trim();
        let v: u8 = p.parse().map_err(|_| format!("alert threshold '{p}' is not a percentage (1 to 99)"))?;
        if !(1..=99).contains(&v) {
            return Err(format!("alert threshold {v}% is outside 1 to 99"));
        }
        if out.last().is_some_and(|&l| l >= v) {
            return Err(format!("alert thresholds must ascend: {v} after {}", out[out.len() - 1]));
        }
        out.push(v);
    }
    if out.len() > MAX_THRESHOLDS {
        return Err(format!("at most {MAX_THRESHOLDS} alert thresholds, not {}", out.len()));
    }
    Ok(out)
}

/// What the watcher saw last, to fire on changes only.
#[derive(Debug, Default)]
pub struct Watcher {
    thresholds: Vec<u8>,
    /// How many thresholds usage is at or above (re-armed when it falls).
    crossed: usize,
    devices: Option<usize>,
    /// Growths by the expansion policy seen so far.
    expansions: Option<u64>,
    read_errors: u64,
    checksum_errors: u64,
    degraded: bool,
    /// Blocks of parity volumes rebuilt from their rows so far.
    reconstructed: u64,
}

/// Percent of the pool user data can no longer take (reserve counted as used).
pub fn usage_percent(s: &PoolStatus) -> f64 {
    if s.size == 0 {
        return 0.0;
    }
    (s.size.saturating_sub(s.free)) as f64 * 100.0 / s.size as f64
}

impl Watcher {
    pub fn new(thresholds: Vec<u8>) -> Watcher {
        Watcher { thresholds, ..Watcher::default() }
    }

    /// The events `s` shows since the last look (none the first time but
    /// usage, errors and a degraded state already there).
    pub fn observe(&mut self, s: &PoolStatus) -> Vec<Value> {
        let mut events = Vec::new();
        let usage = usage_percent(s);
        let crossed = self.thresholds.iter().filter(|&&t| usage >= f64::from(t)).count();
        if crossed > self.crossed {
            let t = self.thresholds[crossed - 1];
            events.push(json!({ "kind": "usage", "threshold_percent": t, "usage_percent": round1(usage),
                "size": s.size, "free": s.free }));
        }
        self.crossed = crossed;
        let n = s.devices.len();
        // A spare added is no expansion (taking one counts in `expansions`).
        let added: Vec<String> = match self.devices {
            Some(before) if n > before => s.devices[before..]
                .iter()
                .filter(|d| !matches!(d.state, "SPARE" | "MISSING"))
                .map(|d| d.path.clone())
                .collect(),
            _ => Vec::new(),
        };
        let grown = self.expansions.map_or(0, |before| s.expansions.saturating_sub(before));
        // One event per look: a spare added and taken between two looks
        // is a new member and a growth, but one expansion.
        if !added.is_empty() || grown > 0 {
            let mut e = json!({ "kind": "expansion", "devices": n, "size": s.size, "free": s.free });
            if !added.is_empty() {
                e["added"] = json!(added);
            }
            if grown > 0 {
                e["grown"] = json!(grown);
            }
            events.push(e);
        }
        self.devices = Some(n);
        self.expansions = Some(s.expansions);
        if s.read_errors > self.read_errors {
            events.push(json!({ "kind": "device_error", "read_errors": s.read_errors,
                "new": s.read_errors - self.read_errors }));
        }
        self.read_errors = s.read_errors;
        if s.checksum_errors > self.checksum_errors {
            events.push(json!({ "kind": "checksum_failure", "checksum_errors": s.checksum_errors,
                "new": s.checksum_errors - self.checksum_errors }));
        }
        self.checksum_errors = s.checksum_errors;
        let degraded = s.state != "ONLINE";
        if degraded && !self.degraded {
            let members: Vec<Value> = s
                .devices
                .iter()
                .filter(|d| d.state != "ONLINE")
                .map(|d| json!({ "index": d.index, "path": d.path, "state": d.state }))
                .collect();
            events.push(json!({ "kind": "degraded", "members": members }));
        }
        self.degraded = degraded;
        // A parity volume reading through a failing member is degraded
        // even while every member is ONLINE (one event per look).
        if s.reconstructed_blocks > self.reconstructed {
            events.push(json!({ "kind": "degraded", "reason": "parity_reconstruction",
                "reconstructed_blocks": s.reconstructed_blocks, "new": s.reconstructed_blocks - self.reconstructed }));
        }
        self.reconstructed = s.reconstructed_blocks;
        for e in &mut events {
            e["pool"] = json!(s.uuid);
            e["time"] = json!(std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0));
        }
        events
    }
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// The kind of an event, as a metric label.
fn kind_of(e: &Value) -> &'static str {
    match e["kind"].as_str() {
        Some("usage") => "usage",
        Some("expansion") => "expansion",
        Some("device_error") => "device_error",
        Some("checksum_failure") => "checksum_failure",
        Some("degraded") => "degraded",
        _ => "other",
    }
}

/// Watch `pool` for the life of the process.
pub fn start(pool: Arc<Pool>, cfg: AlertConfig, metrics: Option<Arc<Metrics>>) -> Result<()> {
    let mut w = Watcher::new(cfg.thresholds.clone());
    std::thread::Builder::new()
        .name("alerts".into())
        .spawn(move || loop {
            for e in w.observe(&pool.status()) {
                log::warn!("alert: {e}");
                if let Some(m) = &metrics {
                    m.alert(kind_of(&e));
                }
                if let Some(cmd) = &cfg.exec {
                    run_hook(cmd, &e);
                }
            }
            std::thread::sleep(EVERY);
        })
        .context("start the alerts thread")?;
    Ok(())
}

/// `sh -c CMD` with the event on stdin; waited for at most HOOK_TIMEOUT.
fn run_hook(cmd: &str, event: &Value) {
    let child = Command::new("sh").arg("-c").arg(cmd).stdin(Stdio::piped()).stdout(Stdio::null()).spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return log::error!("--alert-exec {cmd}: {e}"),
    };
    if let Some(mut stdin) = child.stdin.take() {
        if let Err(e) = writeln!(stdin, "{event}") {
            log::error!("--alert-exec {cmd}: writing the event: {e}");
        }
    }
    let deadline = Instant::now() + HOOK_TIMEOUT;
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return,
            Ok(Some(st)) => return log::error!("--alert-exec {cmd}: {st}"),
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return log::error!("--alert-exec {cmd}: {e}"),
        }
    }
    log::error!("--alert-exec {cmd}: still running after {} s, killed", HOOK_TIMEOUT.as_secs());
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_are_validated() {
        assert_eq!(parse_thresholds("80,90,95"), Ok(vec![80, 90, 95]));
        assert_eq!(parse_thresholds(" 50 "), Ok(vec![50]));
        for bad in ["0", "100", "90,80", "80,80", "x", "", "1,2,3,4,5,6,7,8,9"] {
            assert!(parse_thresholds(bad).is_err(), "{bad} accepted");
        }
    }
}
