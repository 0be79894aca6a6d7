//! `tarn serve` options from the command line and a TOML file
//! (`--config FILE` or `TARN_CONFIG`): one struct is both the clap
//! arguments and the file's schema, so every flag has a key of the same
//! (kebab-case) name and the two cannot drift apart. The command line wins
//! over the file, the file over the defaults.

use crate::logging::LogLevel;
use crate::size;
use crate::tls::{parse_mode, TlsArg};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{de, Deserialize, Deserializer};
use std::path::{Path, PathBuf};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:10809";
pub const DEFAULT_COMMIT_INTERVAL: u64 = 5;
pub const DEFAULT_COMPACT_IDLE: u64 = 10;

/// Keys a reload (SIGHUP) applies; every other key needs a restart.
pub const RELOADABLE: &[&str] = &["tls", "tls-cert", "tls-key", "tls-ca", "tls-allow", "log-level"];

/// The options of `tarn serve`. Absent (None, empty) means "not given
/// here": the file fills it, then the default.
#[derive(Args, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ServeOpts {
    /// The pool's primary device (file or block device).
    #[arg(short = 'p', long = "pool", env = "TARN_POOL")]
    pub pool: Option<PathBuf>,
    /// Member devices, when they moved from the paths the pool recorded
    /// (repeatable; `device = [...]` in the file).
    #[arg(long = "device", value_name = "PATH")]
    #[serde(rename = "device")]
    pub devices: Vec<PathBuf>,
    /// TCP address to listen on (default 127.0.0.1:10809).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Do not listen on TCP (use --socket); `--no-tcp=false` undoes the file's.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub no_tcp: Option<bool>,
    /// Also listen on this Unix socket (created mode 0600).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Commit before acknowledging any write that allocated;
    /// `--strict=false` undoes the file's.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub strict: Option<bool>,
    /// Seconds between background commits (default 5).
    #[arg(long, value_name = "SECS")]
    pub commit_interval: Option<u64>,
    /// Memory for metadata nodes (e.g. 256M, the default); maps of any
    /// size work, the rest is read from the devices on demand.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub metadata_cache: Option<Size>,
    /// Where new data goes: linear (default: in arrival order, so random
    /// first writes are appended) or contiguous (each 256 KiB of a volume
    /// has a 256 KiB home: sequential data stays sequential whatever the
    /// order it is first written in; random first writes cost more).
    #[arg(long, value_name = "POLICY", value_parser = parse_placement_arg)]
    pub placement: Option<Placement>,
    /// Region size of `contiguous` placement (default 256K): a power of
    /// two from 4K to 64M, no larger than a device. Larger regions keep
    /// longer runs together; smaller ones hold less space partly written.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub region_size: Option<Size>,
    /// Where a `contiguous` region's first home is searched from: cursor
    /// (default: next-fit, so regions first written together lie
    /// together) or random (Virtual Contiguity's start spread uniformly
    /// over the device; measured worse on aged ext4, see ARCHITECTURE.md).
    #[arg(long, value_enum, value_name = "START")]
    pub region_start: Option<RegionStart>,
    /// Seconds without client writes after which scattered data is
    /// re-laid out in the background (like `pool compact`, 8 MiB per
    /// 100 ms at most, paused by the next write); 0: never (default 10).
    #[arg(long, value_name = "SECS")]
    pub compact_idle: Option<u64>,
    /// Also compact while clients write, one 1 MiB window per 100 ms,
    /// whenever the block volumes hold more than this many extents per
    /// GiB they map (e.g. 4096: runs averaging under 256 KiB); default:
    /// only when idle.
    #[arg(long, value_name = "EXTENTS_PER_GIB")]
    pub compact_at: Option<u64>,
    /// Record every request answered (time, export, command, offset,
    /// length, flags) to this file; read it with `tarn trace print`.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// A pool device (index or path) kept for file-system metadata moved
    /// there by `tarn vol hint --metadata-device`: new data avoids it.
    #[arg(long, value_name = "DEVICE")]
    pub metadata_device: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (per export
    /// requests, bytes, errors, latency; pool space, commits, cache,
    /// devices), e.g. 127.0.0.1:9310.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Offer NBD over TLS (default "on" when --tls-cert is given; off without it).
    #[arg(long, value_enum)]
    pub tls: Option<TlsArg>,
    /// Server certificate chain (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// Server private key (PEM: PKCS#8, PKCS#1 or SEC1; RSA 2048 to 8192
    /// bits, ECDSA P-256/P-384/P-521, Ed25519).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM): clients must present a certificate they signed.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// CLIENT=EXPORT[,EXPORT...]: the client whose certificate CN or SAN
    /// is CLIENT (`*`: any) sees only these exports (`*` all, `PREFIX*`);
    /// repeatable; clients without a rule see none. Needs --tls-ca.
    #[arg(long, value_name = "CLIENT=EXPORTS")]
    pub tls_allow: Vec<String>,
    /// Permissions of the --socket file, octal (default 600; in the file
    /// "660" or 0o660).
    #[arg(long, value_name = "OCTAL", value_parser = parse_mode_arg)]
    pub socket_mode: Option<Mode>,
    /// Take the listening sockets over from the server running on this
    /// pool (through its control socket), which then drains, commits and
    /// exits; clients connecting meanwhile wait in the listen backlog.
    /// Restarts and upgrades without systemd's socket unit.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub takeover: Option<bool>,
    /// Seconds to wait for another process (a predecessor still
    /// committing) to release the pool (default 120 with --takeover, else 0).
    #[arg(long, value_name = "SECS")]
    pub lock_wait: Option<u64>,
    /// Grow the pool when this percent (1-99) of its data space is in use,
    /// and when a write finds it full: member --expand-device (a regular
    /// file) is extended by --expand-step up to --expand-max.
    #[arg(long, value_name = "PCT")]
    pub expand_at: Option<u8>,
    /// Bytes added per expansion (default 1G).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub expand_step: Option<Size>,
    /// The expanding member's largest size (required with --expand-at).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
    pub expand_max: Option<Size>,
    /// The member that grows (index, default 0: the primary).
    #[arg(long, value_name = "INDEX")]
    pub expand_device: Option<usize>,
    /// Pool usage percentages that raise an alert, ascending, each 1 to
    /// 99 (default 80,90,95).
    #[arg(long, value_name = "PCT,...")]
    pub alert_at: Option<String>,
    /// Run `sh -c CMD` for every alert (usage, expansion, device errors,
    /// checksum failures, a degraded member) with the event as one JSON
    /// line on its standard input.
    #[arg(long, value_name = "CMD")]
    pub alert_exec: Option<String>,
    /// NAME:DIR: also mount file volume NAME on DIR through FUSE, served
    /// by this process beside the block volumes (as `tarn mount` with its
    /// defaults); unmounted, committed and closed with the pool at stop.
    #[arg(long, value_name = "NAME:DIR")]
    pub mount: Option<String>,
    /// error, warn (default), info, debug or trace; RUST_LOG, when set,
    /// also filters by module.
    #[arg(long, value_enum)]
    pub log_level: Option<LogLevel>,
}

/// A byte count: an integer or a string with a K/M/G/T/P suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

/// Where new `contiguous` homes are searched from.
#[derive(clap::ValueEnum, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum RegionStart {
    #[default]
    Cursor,
    Random,
}

/// A placement policy name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement(pub tarn_engine::PlacementKind);

/// Unix permission bits: "660" (octal digits) or a TOML integer (0o660).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode(pub u32);

fn parse_size_arg(s: &str) -> Result<Size, String> {
    size::parse_size(s).map(Size)
}

fn parse_placement_arg(s: &str) -> Result<Placement, String> {
    crate::parse_placement(s).map(Placement)
}

fn parse_mode_arg(s: &str) -> Result<Mode, String> {
    parse_mode(s).map(Mode)
}

/// A value given as a TOML string (parsed like the flag) or an integer.
#[derive(Deserialize)]
#[serde(untagged)]
enum StrOrInt {
    Str(String),
    Int(i64),
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        match StrOrInt::deserialize(d).map_err(|_| de::Error::custom("expected a size: 268435456 or \"256M\""))? {
            StrOrInt::Str(s) => parse_size_arg(&s).map_err(de::Error::custom),
            StrOrInt::Int(n) => u64::try_from(n).map(Size).map_err(|_| de::Error::custom("a size cannot be negative")),
        }
    }
}

impl<'de> Deserialize<'de> for Placement {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Placement, D::Error> {
        parse_placement_arg(&String::deserialize(d)?).map_err(de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Mode, D::Error> {
        match StrOrInt::deserialize(d).map_err(|_| de::Error::custom("expected a mode: \"660\" or 0o660"))? {
            StrOrInt::Str(s) => parse_mode_arg(&s).map_err(de::Error::custom),
            StrOrInt::Int(n) if (0..=0o777).contains(&n) => Ok(Mode(n as u32)),
            StrOrInt::Int(n) => Err(de::Error::custom(format!("{n} is past 0o777: write 0o660 or \"660\""))),
        }
    }
}

/// A parsed config file: the options and its raw table (to tell which
/// keys a reload changed).
#[derive(Debug, Clone, Default)]
pub struct ConfigFile {
    pub opts: ServeOpts,
    pub table: toml::Table,
}

/// Read and check a config file; errors name the file and the key.
pub fn load(path: &Path) -> Result<ConfigFile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("config file {}", path.display()))?;
    let opts: ServeOpts = toml::from_str(&text).map_err(|e| file_error(path, &text, &e))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| file_error(path, &text, &e))?;
    Ok(ConfigFile { opts, table })
}

/// "config file F, line 3, key commit-interval: invalid type ..."; toml
/// gives the span, the key is the start of that line.
fn file_error(path: &Path, text: &str, e: &toml::de::Error) -> anyhow::Error {
    let Some(span) = e.span() else {
        return anyhow::anyhow!("config file {}: {}", path.display(), e.message());
    };
    let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or("");
    let key = line.split('=').next().unwrap_or("").trim();
    let key = if line.contains('=') && !key.is_empty() { format!(", key {key}") } else { String::new() };
    anyhow::anyhow!("config file {}, line {line_no}{key}: {}", path.display(), e.message().trim())
}

impl ServeOpts {
    /// These options (the command line's) over `file`'s.
    pub fn over(&self, file: &ServeOpts) -> ServeOpts {
        fn vec<T: Clone>(a: &[T], b: &[T]) -> Vec<T> {
            if a.is_empty() {
                b.to_vec()
            } else {
                a.to_vec()
            }
        }
        let f = file.clone();
        ServeOpts {
            pool: self.pool.clone().or(f.pool),
            devices: vec(&self.devices, &f.devices),
            listen: self.listen.clone().or(f.listen),
            no_tcp: self.no_tcp.or(f.no_tcp),
            socket: self.socket.clone().or(f.socket),
            strict: self.strict.or(f.strict),
            commit_interval: self.commit_interval.or(f.commit_interval),
            metadata_cache: self.metadata_cache.or(f.metadata_cache),
            placement: self.placement.or(f.placement),
            region_size: self.region_size.or(f.region_size),
            region_start: self.region_start.or(f.region_start),
            compact_idle: self.compact_idle.or(f.compact_idle),
            compact_at: self.compact_at.or(f.compact_at),
            trace: self.trace.clone().or(f.trace),
            metadata_device: self.metadata_device.clone().or(f.metadata_device),
            metrics: self.metrics.clone().or(f.metrics),
            tls: self.tls.or(f.tls),
            tls_cert: self.tls_cert.clone().or(f.tls_cert),
            tls_key: self.tls_key.clone().or(f.tls_key),
            tls_ca: self.tls_ca.clone().or(f.tls_ca),
            tls_allow: vec(&self.tls_allow, &f.tls_allow),
            socket_mode: self.socket_mode.or(f.socket_mode),
            takeover: self.takeover.or(f.takeover),
            lock_wait: self.lock_wait.or(f.lock_wait),
            log_level: self.log_level.or(f.log_level),
            alert_at: self.alert_at.clone().or(f.alert_at),
            expand_at: self.expand_at.or(f.expand_at),
            expand_step: self.expand_step.or(f.expand_step),
            expand_max: self.expand_max.or(f.expand_max),
            expand_device: self.expand_device.or(f.expand_device),
            alert_exec: self.alert_exec.clone().or(f.alert_exec),
            mount: self.mount.clone().or(f.mount),
        }
    }

    /// Options that depend on others, checked once the file is merged
    /// (so a flag may complete what the file started).
    pub fn check(&self) -> Result<()> {
        let needs = [
            (self.tls_key.is_some(), self.tls_cert.is_some(), "--tls-cert", "--tls-key"),
            (self.tls_cert.is_some(), self.tls_key.is_some(), "--tls-key", "--tls-cert"),
            (self.tls.is_some(), self.tls_cert.is_some(), "--tls-cert", "--tls"),
            (self.tls_ca.is_some(), self.tls_cert.is_some(), "--tls-cert", "--tls-ca"),
            (!self.tls_allow.is_empty(), self.tls_ca.is_some(), "--tls-ca", "--tls-allow"),
            (self.socket_mode.is_some(), self.socket.is_some(), "--socket", "--socket-mode"),
        ];
        for (given, has, needed, by) in needs {
            if given && !has {
                bail!("{needed} is required with {by} (the same key without dashes in a config file)");
            }
        }
        if self.pool.is_none() {
            bail!("no pool: give -p/--pool (or TARN_POOL), or `pool` in the config file");
        }
        if self.no_tcp == Some(true) && self.socket.is_none() {
            bail!("--no-tcp needs --socket");
        }
        if let Some(m) = &self.mount {
            mount_spec(m)?;
        }
        Ok(())
    }
}

/// `--mount NAME:DIR` split at its first colon (a file volume's name has
/// none); NAME@SNAP, a read-only snapshot, is `tarn mount`'s alone.
pub fn mount_spec(spec: &str) -> Result<(String, PathBuf)> {
    let Some((name, dir)) = spec.split_once(':') else {
        bail!("--mount {spec}: NAME:DIR expected (a file volume and the directory to mount it on)");
    };
    if name.is_empty() || dir.is_empty() {
        bail!("--mount {spec}: NAME:DIR expected, with neither empty");
    }
    if name.contains('@') {
        bail!("--mount {spec}: a snapshot is mounted with `tarn mount NAME@SNAP DIR`, not by the server");
    }
    Ok((name.to_string(), PathBuf::from(dir)))
}

/// The command line with the config file it names, merged and checked,
/// and what a reload needs to do it again.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub opts: ServeOpts,
    pub cli: ServeOpts,
    pub path: Option<PathBuf>,
    pub file: ConfigFile,
}

pub fn resolve(cli: ServeOpts, path: Option<PathBuf>) -> Result<Resolved> {
    let file = match &path {
        Some(p) => load(p)?,
        None => ConfigFile::default(),
    };
    let opts = cli.over(&file.opts);
    opts.check()?;
    Ok(Resolved { opts, cli, path, file })
}

impl Resolved {
    /// Read the file again. Returns the new resolution and the keys that
    /// changed in the file but only take effect at a restart (keys the
    /// command line overrides are not counted: they did not change).
    pub fn reload(&self) -> Result<(Resolved, Vec<String>)> {
        let new = resolve(self.cli.clone(), self.path.clone())?;
        let (old, cur) = (&self.file.table, &new.file.table);
        let mut keys: Vec<&String> = old.keys().chain(cur.keys()).collect();
        keys.sort();
        keys.dedup();
        let pinned = |k: &str| new.cli != new.cli.without(k);
        let stale = keys
            .into_iter()
            .filter(|k| old.get(*k) != cur.get(*k) && !RELOADABLE.contains(&k.as_str()) && !pinned(k))
            .cloned()
            .collect();
        Ok((new, stale))
    }
}

impl ServeOpts {
    /// A copy with key `k` cleared: equal to self when the command line
    /// did not give it.
    fn without(&self, k: &str) -> ServeOpts {
        let mut t = self.clone();
        match k {
            "pool" => t.pool = None,
            "device" => t.devices.clear(),
            "listen" => t.listen = None,
            "no-tcp" => t.no_tcp = None,
            "socket" => t.socket = None,
            "strict" => t.strict = None,
            "commit-interval" => t.commit_interval = None,
            "metadata-cache" => t.metadata_cache = None,
            "placement" => t.placement = None,
            "region-size" => t.region_size = None,
            "region-start" => t.region_start = None,
            "compact-idle" => t.compact_idle = None,
            "compact-at" => t.compact_at = None,
            "trace" => t.trace = None,
            "metadata-device" => t.metadata_device = None,
            "metrics" => t.metrics = None,
            "socket-mode" => t.socket_mode = None,
            "takeover" => t.takeover = None,
            "lock-wait" => t.lock_wait = None,
            "alert-at" => t.alert_at = None,
            "expand-at" => t.expand_at = None,
            "expand-step" => t.expand_step = None,
            "expand-max" => t.expand_max = None,
            "expand-device" => t.expand_device = None,
            "alert-exec" => t.alert_exec = None,
            "mount" => t.mount = None,
            _ => {}
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ServeOpts, String> {
        toml::from_str::<ServeOpts>(text).map_err(|e| e.message().to_string())
    }

    #[test]
    fn every_kind_of_value() {
        let o = parse(
            "pool = \"/p\"\ndevice = [\"/a\", \"/b\"]\nstrict = true\nmetadata-cache = \"64M\"\n\
             placement = \"contiguous\"\nsocket-mode = 0o660\ntls-allow = [\"a=b\"]\nlog-level = \"info\"",
        )
        .unwrap();
        assert_eq!(o.devices.len(), 2);
        assert_eq!(o.metadata_cache, Some(Size(64 << 20)));
        assert_eq!(o.socket_mode, Some(Mode(0o660)));
        assert_eq!(o.strict, Some(true));
        assert_eq!(parse("socket-mode = \"640\"").unwrap().socket_mode, Some(Mode(0o640)));
        assert_eq!(parse("metadata-cache = 1048576").unwrap().metadata_cache, Some(Size(1 << 20)));
    }

    #[test]
    fn bad_files() {
        assert!(parse("commit_interval = 5").unwrap_err().contains("unknown field"));
        assert!(parse("commit-interval = \"5\"").is_err());
        assert!(parse("socket-mode = 660").unwrap_err().contains("0o660"));
        assert!(parse("placement = \"diagonal\"").unwrap_err().contains("diagonal"));
        assert!(parse("metadata-cache = -1").is_err());
    }

    #[test]
    fn command_line_wins() {
        let file = parse("listen = \"0.0.0.0:1\"\nstrict = true\ndevice = [\"/a\"]").unwrap();
        let cli = ServeOpts { strict: Some(false), listen: None, ..Default::default() };
        let m = cli.over(&file);
        assert_eq!(m.strict, Some(false));
        assert_eq!(m.listen.as_deref(), Some("0.0.0.0:1"));
        assert_eq!(m.devices, vec![PathBuf::from("/a")]);
    }
}
