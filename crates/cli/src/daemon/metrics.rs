//! `tarn serve --metrics ADDR`: `/metrics` in the Prometheus text format
//! (0.0.4). Per export: requests, bytes, errors and a latency histogram per
//! command, counted by the NBD bridge (`export.rs`) with atomics and one
//! short per-series histogram lock. Per pool: the engine's atomic counters,
//! read at scrape time, and the figures of `Pool::status()` from a copy a
//! background thread refreshes, because `status()` waits for the commit
//! lock, which a commit holds while it flushes the devices: a scrape never
//! waits for a commit, and never holds anything I/O waits for. Long admin
//! requests (scrub, resilver...) report their progress here too.

use anyhow::{Context, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tarn_engine::pool::DurationHistogram;
use tarn_engine::{Pool, PoolStatus};
use tarn_format::trace::TraceCmd;

/// How often the pool's status is refreshed for scrapes (Prometheus
/// scrapes every 15 s by default: a few seconds old is fresh enough).
const REFRESH_EVERY: Duration = Duration::from_secs(2);
/// A scraper that sends nothing (or dribbles) is dropped once its request
/// head has taken this long: requests are answered one at a time.
const READ_DEADLINE: Duration = if cfg!(test) { Duration::from_millis(300) } else { Duration::from_secs(5) };
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest request head read (the request line and headers).
const MAX_REQUEST: u64 = 8192;
/// Bounded header count: a client cannot keep the thread reading lines.
const MAX_HEADER_LINES: usize = 100;

/// Labels of a per-export series: the export's name and the command.
type OpLabels = [(&'static str, String); 2];

fn op_name(cmd: TraceCmd) -> &'static str {
    match cmd {
        TraceCmd::Read => "read",
        TraceCmd::Write => "write",
        TraceCmd::Flush => "flush",
        TraceCmd::Trim => "trim",
        TraceCmd::WriteZeroes => "write_zeroes",
        TraceCmd::Cache => "cache",
    }
}

/// Latency buckets from 50 us to about 3.3 s, each 4x the previous.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(50e-6, 4.0, 9))
}

/// The per-export families, shared by every connection.
struct ExportFamilies {
    requests: Family<OpLabels, Counter>,
    bytes: Family<OpLabels, Counter>,
    errors: Family<OpLabels, Counter>,
    latency: Family<OpLabels, Histogram, fn() -> Histogram>,
}

/// One command's series of one export, resolved once when the export is
/// opened so that a request touches no family map.
#[derive(Clone)]
struct OpSeries {
    requests: Counter,
    bytes: Counter,
    errors: Counter,
    latency: Histogram,
}

/// The series of one export, indexed by `TraceCmd as usize`.
pub struct ExportMetrics {
    ops: Vec<OpSeries>,
}

impl ExportMetrics {
    /// Count one answered request; `bytes` only when it succeeded.
    pub fn record(&self, cmd: TraceCmd, bytes: u64, took: Duration, failed: bool) {
        let Some(s) = self.ops.get(cmd as usize) else { return };
        s.requests.inc();
        if failed {
            s.errors.inc();
        } else {
            s.bytes.inc_by(bytes);
        }
        s.latency.observe(took.as_secs_f64());
    }
}

/// Progress of long admin requests (scrub, resilver...), by kind.
type OpKind = [(&'static str, &'static str); 1];

#[derive(Default)]
struct Operations {
    running: Family<OpKind, Gauge>,
    done: Family<OpKind, Gauge>,
    total: Family<OpKind, Gauge>,
}

/// One long admin request in progress; its end is counted on drop, so an
/// error or a panic does not leave it running.
pub struct Operation {
    running: Gauge,
    done: Gauge,
    total: Gauge,
}

impl Operation {
    /// (done, total) blocks, as the request reports them.
    pub fn progress(&self, done: u64, total: u64) {
        self.done.set(i64::try_from(done).unwrap_or(i64::MAX));
        self.total.set(i64::try_from(total).unwrap_or(i64::MAX));
    }
}

impl Drop for Operation {
    fn drop(&mut self) {
        self.running.dec();
    }
}

/// The server's metrics: what exports count into and what `/metrics` encodes.
pub struct Metrics {
    registry: Registry,
    exports: Arc<ExportFamilies>,
    operations: Operations,
    /// Alerts raised, by kind (`alerts.rs`).
    alerts: Family<OpKind, Counter>,
}

impl Metrics {
    /// Metrics of `pool`; starts the thread that refreshes its status copy.
    pub fn new(pool: Arc<Pool>) -> Result<Self> {
        let mut m = Metrics::exports_only();
        let snapshot = Arc::new(Mutex::new(None));
        start_refresh(pool.clone(), snapshot.clone())?;
        m.registry.register_collector(Box::new(PoolCollector { pool, snapshot }));
        Ok(m)
    }

    /// The per-export families alone (what `new` adds the pool to).
    fn exports_only() -> Self {
        let exports = Arc::new(ExportFamilies {
            requests: Family::default(),
            bytes: Family::default(),
            errors: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
        });
        let mut registry = Registry::with_prefix("tarn");
        registry.register(
            "export_requests",
            "Requests the export served, by command (NBD FLUSHes queued together are served by one flush)",
            exports.requests.clone(),
        );
        registry.register("export_bytes", "Bytes of successful requests, by export and command", exports.bytes.clone());
        registry.register("export_errors", "NBD requests answered with an error", exports.errors.clone());
        registry.register_with_unit(
            "export_request_duration",
            "Time requests spent in the engine (waiting in the server's queues excluded)",
            prometheus_client::registry::Unit::Seconds,
            exports.latency.clone(),
        );
        let operations = Operations::default();
        registry.register("operations_running", "Long admin requests running, by kind", operations.running.clone());
        registry.register("operation_done_blocks", "Blocks done by the last such request", operations.done.clone());
        registry.register("operation_total_blocks", "Blocks the last such request had to do", operations.total.clone());
        let alerts = Family::default();
        registry.register(
            "alerts",
            "Alerts raised, by kind (usage, expansion, device_error, checksum_failure, degraded)",
            alerts.clone(),
        );
        Metrics { registry, exports, operations, alerts }
    }

    /// Count an alert of `kind`.
    pub fn alert(&self, kind: &'static str) {
        self.alerts.get_or_create(&[("kind", kind)]).inc();
    }

    /// Start tracking a long admin request of kind `op` (its progress
    /// starts at 0 of 0).
    pub fn operation(&self, op: &'static str) -> Operation {
        let kind: OpKind = [("op", op)];
        let o = Operation {
            running: self.operations.running.get_or_create_owned(&kind),
            done: self.operations.done.get_or_create_owned(&kind),
            total: self.operations.total.get_or_create_owned(&kind),
        };
        o.running.inc();
        o.progress(0, 0);
        o
    }

    /// The series an export named `name` counts into.
    pub fn export(&self, name: &str) -> ExportMetrics {
        // CACHE requests never reach an export (the server answers them):
        // no series that would stay 0. `record` ignores commands past the end.
        let ops = TraceCmd::ALL[..TraceCmd::Cache as usize]
            .iter()
            .map(|&cmd| {
                let labels: OpLabels = [("export", name.to_string()), ("op", op_name(cmd).to_string())];
                OpSeries {
                    requests: self.exports.requests.get_or_create_owned(&labels),
                    bytes: self.exports.bytes.get_or_create_owned(&labels),
                    errors: self.exports.errors.get_or_create_owned(&labels),
                    latency: self.exports.latency.get_or_create_owned(&labels),
                }
            })
            .collect();
        ExportMetrics { ops }
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry) {
            log::error!("encoding metrics: {e}");
        }
        out
    }
}

/// The pool's status as last refreshed.
struct Snapshot {
    status: PoolStatus,
    resync_pending: usize,
    taken: Instant,
}

type SharedSnapshot = Arc<Mutex<Option<Snapshot>>>;

fn start_refresh(pool: Arc<Pool>, snapshot: SharedSnapshot) -> Result<()> {
    std::thread::Builder::new()
        .name("metrics-refresh".into())
        .spawn(move || loop {
            // Both calls may wait (for a commit); only this thread does.
            let status = pool.status();
            let resync_pending = pool.resync_pending();
            let fresh = Snapshot { status, resync_pending, taken: Instant::now() };
            *snapshot.lock().unwrap_or_else(|p| p.into_inner()) = Some(fresh);
            std::thread::sleep(REFRESH_EVERY);
        })
        .context("start the metrics refresh thread")?;
    Ok(())
}

struct PoolCollector {
    pool: Arc<Pool>,
    snapshot: SharedSnapshot,
}

impl std::fmt::Debug for PoolCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolCollector").finish_non_exhaustive()
    }
}

impl Collector for PoolCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::result::Result<(), std::fmt::Error> {
        let c = &self.pool.counters;
        let live = [
            ("pool_commits", "Commits written", &c.commits),
            ("pool_checkpoints", "Checkpoints written", &c.checkpoints),
            ("pool_journal_bytes", "Bytes appended to the journal", &c.journal_bytes),
            ("pool_checksum_errors", "Blocks read that matched no copy's checksum", &c.checksum_errors),
            ("pool_read_errors", "Reads that failed on every copy", &c.read_errors),
            ("pool_healed_blocks", "Bad copies rewritten from a good one", &c.healed_blocks),
            (
                "pool_reconstructed_blocks",
                "Parity volume blocks rebuilt from the rest of their row",
                &c.reconstructed_blocks,
            ),
            ("pool_resynced_blocks", "Blocks of regions open at a crash resynced", &c.resynced_blocks),
        ];
        for (name, help, v) in live {
            counter(&mut enc, name, help, v.load(Ordering::Relaxed))?;
        }
        duration_histogram(&mut enc, "pool_commit_duration", "How long commits took", &c.commit_times)?;
        // Held while encoding: the refresh thread waits at most that long
        // to swap its copy in; I/O never takes this lock.
        let snap = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        match snap.as_ref() {
            Some(s) => encode_status(&mut enc, s),
            None => Ok(()),
        }
    }
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::result::Result<(), std::fmt::Error> {
    let m = ConstCounter::new(v);
    m.encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
}

/// A histogram the engine keeps in atomics, as `tarn_NAME_seconds`.
fn duration_histogram(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    h: &DurationHistogram,
) -> std::result::Result<(), std::fmt::Error> {
    let (sum, count, buckets) = h.get();
    enc.encode_descriptor(name, help, Some(&prometheus_client::registry::Unit::Seconds), MetricType::Histogram)?
        .encode_histogram::<prometheus_client::encoding::NoLabelSet>(sum, count, &buckets, None)
}

fn gauge<N>(enc: &mut DescriptorEncoder, name: &str, help: &str, v: N) -> std::result::Result<(), std::fmt::Error>
where
    N: prometheus_client::encoding::EncodeGaugeValue,
{
    let m = ConstGauge::new(v);
    m.encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

fn encode_status(enc: &mut DescriptorEncoder, snap: &Snapshot) -> std::result::Result<(), std::fmt::Error> {
    let s = &snap.status;
    let bytes = [
        ("pool_size_bytes", "Bytes volumes can use in all", s.size),
        ("pool_used_bytes", "Bytes mapped by volumes", s.used),
        ("pool_free_bytes", "Bytes free for new writes (reserve excluded)", s.free),
        ("pool_reserved_bytes", "Bytes held back for metadata", s.reserved),
        ("pool_freeing_bytes", "Bytes released, reusable after the next commit", s.freeing),
        ("pool_metadata_bytes", "Bytes of metadata on the devices", s.metadata),
        ("pool_virtual_size_bytes", "Sum of the volumes' sizes", s.virtual_size),
    ];
    for (name, help, v) in bytes {
        gauge(enc, name, help, v)?;
    }
    gauge(enc, "pool_overcommit_ratio", "Virtual size over pool size", s.overcommit_ratio)?;
    gauge(enc, "pool_volumes", "Volumes in the pool", s.volumes as u64)?;
    gauge(enc, "pool_commit_sequence", "Sequence number of the last commit", s.commit_seq)?;
    gauge(enc, "pool_degraded", "1 when a mirror runs without a leg", u64::from(s.state != "ONLINE"))?;
    gauge(enc, "pool_fenced", "1 when a commit failed and changes are refused", u64::from(s.fenced))?;
    gauge(enc, "pool_resync_pending_regions", "Regions open at a crash not yet resynced", snap.resync_pending as u64)?;
    gauge(
        enc,
        "pool_status_age_seconds",
        "Age of the pool figures in this scrape",
        snap.taken.elapsed().as_secs_f64(),
    )?;
    encode_cache(enc, s)?;
    encode_devices(enc, s)
}

fn encode_cache(enc: &mut DescriptorEncoder, s: &PoolStatus) -> std::result::Result<(), std::fmt::Error> {
    let c = &s.metadata_cache;
    counter(enc, "pool_metadata_cache_hits", "Metadata node reads the cache answered", c.hits)?;
    counter(enc, "pool_metadata_cache_misses", "Metadata node reads from the devices", c.misses)?;
    counter(enc, "pool_metadata_cache_evictions", "Metadata nodes evicted from the cache", c.evictions)?;
    gauge(enc, "pool_metadata_cache_hit_ratio", "Share of node reads the cache answered", s.metadata_cache_hit_rate())?;
    gauge(enc, "pool_metadata_cache_bytes", "Bytes of cached metadata nodes", c.bytes)?;
    gauge(enc, "pool_dirty_nodes", "Metadata nodes changed since the last checkpoint", s.dirty_nodes)
}

/// Device figures, one series per device (mirror legs per leg); a state is
/// a series valued 1 with the state as a label.
fn encode_devices(enc: &mut DescriptorEncoder, s: &PoolStatus) -> std::result::Result<(), std::fmt::Error> {
    let dev_label = |d: &tarn_engine::DeviceStatus| [("device", d.index.to_string()), ("path", d.path.clone())];
    let mut m =
        enc.encode_descriptor("device_state", "Device state (ONLINE, DEGRADED, RESILVERING)", None, MetricType::Gauge)?;
    for d in &s.devices {
        let [a, b] = dev_label(d);
        let labels = [a, b, ("state", d.state.to_string())];
        ConstGauge::new(1u64).encode(m.encode_family(&labels)?)?;
    }
    let mut m = enc.encode_descriptor("device_free_bytes", "Bytes free on the device", None, MetricType::Gauge)?;
    for d in &s.devices {
        ConstGauge::new(d.free_bytes).encode(m.encode_family(&dev_label(d))?)?;
    }
    let legs: Vec<_> = s
        .devices
        .iter()
        .flat_map(|d| d.legs.iter().map(move |l| ([("device", d.index.to_string()), ("leg", l.index.to_string())], l)))
        .collect();
    let mut m = enc.encode_descriptor("mirror_leg_state", "Mirror leg state", None, MetricType::Gauge)?;
    for (labels, l) in &legs {
        let [a, b] = labels.clone();
        ConstGauge::new(1u64).encode(m.encode_family(&[a, b, ("state", l.state.to_string())])?)?;
    }
    let errors = [
        ("mirror_leg_read_errors", "Read errors of a mirror leg"),
        ("mirror_leg_write_errors", "Write errors of a mirror leg"),
    ];
    for (i, (name, help)) in errors.into_iter().enumerate() {
        let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (labels, l) in &legs {
            let v = if i == 0 { l.read_errors } else { l.write_errors };
            ConstCounter::new(v).encode(m.encode_family(labels)?)?;
        }
    }
    Ok(())
}

/// Bind the metrics address (before anything else starts, so a bad or
/// busy address fails `tarn serve` cleanly).
pub fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).with_context(|| format!("listen for metrics on {addr}"))
}

/// Answer scrapes on `listener` on a thread until the process exits.
pub fn serve(listener: TcpListener, metrics: Arc<Metrics>) -> Result<SocketAddr> {
    let local = listener.local_addr().context("metrics listener address")?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            // One scrape at a time: scrapes are rare and cheap; a slow one
            // is cut by the timeouts.
            for conn in listener.incoming().flatten() {
                if let Err(e) = answer(conn, &metrics) {
                    log::debug!("metrics request: {e}");
                }
            }
        })
        .context("start the metrics thread")?;
    Ok(local)
}

/// Reads that all end by one deadline (a per-read timeout alone lets a
/// client sending a byte at a time hold the thread for hours).
struct DeadlineReader {
    conn: TcpStream,
    until: Instant,
}

impl Read for DeadlineReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "request head too slow"));
        }
        self.conn.set_read_timeout(Some(left))?;
        self.conn.read(buf)
    }
}

fn answer(conn: TcpStream, metrics: &Metrics) -> std::io::Result<()> {
    conn.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let mut out = conn.try_clone()?;
    let deadline = DeadlineReader { conn, until: Instant::now() + READ_DEADLINE };
    let mut reader = BufReader::new(deadline).take(MAX_REQUEST);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let target = request_target(&line);
    // Read the headers (up to the blank line) so the client sees a reply,
    // not a reset, when we close.
    for _ in 0..MAX_HEADER_LINES {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
    }
    let (status, ctype, body) = match target {
        Some("/metrics") => ("200 OK", prometheus_client::encoding::prometheus_text::CONTENT_TYPE, metrics.encode()),
        _ => ("404 Not Found", "text/plain; charset=utf-8", "not found: try /metrics\n".to_string()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    out.write_all(head.as_bytes())?;
    out.write_all(body.as_bytes())?;
    out.flush()
}

/// The path of a GET request line (query string dropped); None otherwise.
fn request_target(line: &str) -> Option<&str> {
    let mut parts = line.split_whitespace();
    if parts.next()? != "GET" {
        return None;
    }
    let target = parts.next()?;
    Some(target.split('?').next().unwrap_or(target))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value<'a>(text: &'a str, series: &str) -> Option<&'a str> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
    }

    #[test]
    fn request_lines() {
        assert_eq!(request_target("GET /metrics HTTP/1.1\r\n"), Some("/metrics"));
        assert_eq!(request_target("GET /metrics?x=1 HTTP/1.0\r\n"), Some("/metrics"));
        assert_eq!(request_target("POST /metrics HTTP/1.1\r\n"), None);
        assert_eq!(request_target(""), None);
    }

    #[test]
    fn connections_of_one_export_share_its_series() {
        let m = Metrics::exports_only();
        let (a, b) = (m.export("disk0"), m.export("disk0"));
        a.record(TraceCmd::Write, 4096, Duration::from_micros(100), false);
        b.record(TraceCmd::Write, 8192, Duration::from_millis(2), false);
        b.record(TraceCmd::Read, 512, Duration::from_micros(10), true);
        let text = m.encode();
        assert_eq!(value(&text, r#"tarn_export_requests_total{export="disk0",op="write"}"#), Some("2"));
        assert_eq!(value(&text, r#"tarn_export_bytes_total{export="disk0",op="write"}"#), Some("12288"));
        // A failed request counts as a request and an error, not as bytes.
        assert_eq!(value(&text, r#"tarn_export_requests_total{export="disk0",op="read"}"#), Some("1"));
        assert_eq!(value(&text, r#"tarn_export_errors_total{export="disk0",op="read"}"#), Some("1"));
        assert_eq!(value(&text, r#"tarn_export_bytes_total{export="disk0",op="read"}"#), Some("0"));
        let bucket = r#"tarn_export_request_duration_seconds_bucket{export="disk0",op="write",le="0.0002"}"#;
        assert_eq!(value(&text, bucket), Some("1"), "100 us falls in the 200 us bucket, 2 ms does not");
        assert!(text.contains("# TYPE tarn_export_request_duration_seconds histogram\n"));
    }

    #[test]
    fn commit_durations_as_a_histogram() {
        #[derive(Debug, Default)]
        struct Commits(DurationHistogram);
        impl Collector for Commits {
            fn encode(&self, mut enc: DescriptorEncoder) -> std::result::Result<(), std::fmt::Error> {
                duration_histogram(&mut enc, "pool_commit_duration", "How long commits took", &self.0)
            }
        }
        let c = Commits::default();
        c.0.record(Duration::from_micros(50));
        c.0.record(Duration::from_millis(3));
        c.0.record(Duration::from_secs(10));
        let mut registry = Registry::with_prefix("tarn");
        registry.register_collector(Box::new(c));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(text.contains("# TYPE tarn_pool_commit_duration_seconds histogram\n"), "{text}");
        assert_eq!(value(&text, "tarn_pool_commit_duration_seconds_count"), Some("3"));
        assert_eq!(value(&text, r#"tarn_pool_commit_duration_seconds_bucket{le="0.0001"}"#), Some("1"));
        assert_eq!(value(&text, r#"tarn_pool_commit_duration_seconds_bucket{le="0.0064"}"#), Some("2"), "cumulative");
        assert_eq!(value(&text, r#"tarn_pool_commit_duration_seconds_bucket{le="+Inf"}"#), Some("3"));
        assert_eq!(value(&text, "tarn_pool_commit_duration_seconds_sum"), Some("10.00305"));
    }

    #[test]
    fn an_operation_ends_when_dropped() {
        let m = Metrics::exports_only();
        let op = m.operation("scrub");
        op.progress(3, 10);
        let text = m.encode();
        assert_eq!(value(&text, r#"tarn_operations_running{op="scrub"}"#), Some("1"));
        assert_eq!(value(&text, r#"tarn_operation_done_blocks{op="scrub"}"#), Some("3"));
        drop(op);
        let text = m.encode();
        assert_eq!(value(&text, r#"tarn_operations_running{op="scrub"}"#), Some("0"));
        assert_eq!(value(&text, r#"tarn_operation_total_blocks{op="scrub"}"#), Some("10"), "the last figures stay");
    }

    #[test]
    fn http_answers_metrics_and_404() {
        let m = Arc::new(Metrics::exports_only());
        m.export("v").record(TraceCmd::Flush, 0, Duration::from_micros(5), false);
        let addr = serve(bind("127.0.0.1:0").expect("bind"), m).expect("serve");
        let get = |path: &str| {
            let mut c = TcpStream::connect(addr).expect("connect");
            write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
            let mut reply = String::new();
            c.read_to_string(&mut reply).expect("reply");
            reply
        };
        let ok = get("/metrics");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("Content-Type: text/plain; version=0.0.4"), "{ok}");
        assert!(ok.contains(r#"tarn_export_requests_total{export="v",op="flush"} 1"#), "{ok}");
        assert!(get("/other").starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn a_dribbling_client_is_cut_at_the_deadline() {
        let m = Arc::new(Metrics::exports_only());
        let addr = serve(bind("127.0.0.1:0").expect("bind"), m).expect("serve");
        let mut slow = TcpStream::connect(addr).expect("connect");
        // A byte every 100 ms for 3 s: within any per-read timeout, never
        // a whole line.
        let dribbler = std::thread::spawn(move || {
            for _ in 0..30 {
                if slow.write_all(b"G").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        let start = Instant::now();
        let mut fast = TcpStream::connect(addr).expect("connect");
        write!(fast, "GET /metrics HTTP/1.1\r\n\r\n").expect("send");
        let mut reply = String::new();
        fast.read_to_string(&mut reply).expect("reply");
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(start.elapsed() < Duration::from_millis(1500), "waited {:?}", start.elapsed());
        let _ = dribbler.join();
    }

    #[test]
    fn a_bad_address_is_named() {
        let e = bind("256.0.0.1:1").expect_err("an invalid address");
        assert!(format!("{e:#}").contains("256.0.0.1:1"), "{e:#}");
    }
}
