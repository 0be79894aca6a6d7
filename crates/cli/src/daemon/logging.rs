//! Log lines on stderr, one per event, as `key=value` pairs (logfmt):
//! `ts=2026-11-26T14:00:00.123Z level=WARN target=tarn_nbd::server msg="..."`.
//! The message is quoted and escaped, so a message holding a newline is
//! still one line. When stderr is the journal (systemd sets JOURNAL_STREAM
//! to its device and inode), lines start with the syslog priority `<N>`
//! that journald turns into the entry's priority, and carry no time stamp
//! (the journal adds its own).
//!
//! Levels: `--log-level` / `log-level` (error, warn, info, debug, trace),
//! changed by a reload through `log::set_max_level`; RUST_LOG, when set,
//! filters by module as env_logger does, and is the level when none is
//! given. Default: warn.

use clap::ValueEnum;
use log::{Level, LevelFilter};
use serde::Deserialize;
use std::io::Write;
use std::sync::OnceLock;

#[derive(ValueEnum, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    fn filter(self) -> LevelFilter {
        match self {
            LogLevel::Error => LevelFilter::Error,
            LogLevel::Warn => LevelFilter::Warn,
            LogLevel::Info => LevelFilter::Info,
            LogLevel::Debug => LevelFilter::Debug,
            LogLevel::Trace => LevelFilter::Trace,
        }
    }
}

/// Records with this target are notices: shown whatever the level (what
/// the server is listening on, that it stopped cleanly), priority 5.
const NOTICE: &str = "notice";

/// The level when none is given: RUST_LOG's, else warn.
static DEFAULT: OnceLock<LevelFilter> = OnceLock::new();
/// Whether stderr is the journal.
static JOURNAL: OnceLock<bool> = OnceLock::new();

/// Install the logger (once, before anything logs).
pub fn init() {
    let journal = *JOURNAL.get_or_init(stderr_is_journal);
    let mut b = env_logger::Builder::new();
    let from_env = match std::env::var("RUST_LOG") {
        Ok(spec) => {
            b.parse_filters(&spec);
            true
        }
        // The max level (set_level) is then the only filter.
        Err(_) => {
            b.filter_level(LevelFilter::Trace);
            false
        }
    };
    b.format(move |buf, r| {
        let ts = buf.timestamp_millis().to_string();
        let (level, prio) = match r.target() {
            NOTICE => ("NOTICE", 5),
            _ => (r.level().as_str(), priority(r.level())),
        };
        let line = format_line(journal.then_some(prio), (!journal).then_some(ts.as_str()), level, r);
        buf.write_all(line.as_bytes())
    });
    let logger = b.build();
    let default = if from_env { logger.filter() } else { LevelFilter::Warn };
    let _ = DEFAULT.set(default);
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(default);
    }
}

/// Apply a level (None: the default). Takes effect at once, in every thread.
pub fn set_level(level: Option<LogLevel>) {
    let default = DEFAULT.get().copied().unwrap_or(LevelFilter::Warn);
    log::set_max_level(level.map_or(default, LogLevel::filter));
}

/// Log a notice: shown at every level. Sent to the logger directly (the
/// `log!` macros would drop it under the max level); its record level is
/// Error only so that a RUST_LOG filter lets it through.
pub fn notice(msg: &str) {
    log::logger().log(&log::Record::builder().level(Level::Error).target(NOTICE).args(format_args!("{msg}")).build());
}

/// A command's final error for a person (`tarn: error: ...`), with the
/// error priority when stderr is the journal, so that a service that
/// failed to start shows as such in `journalctl -p err`.
pub fn fatal(msg: &str) {
    let prio = if JOURNAL.get().copied().unwrap_or(false) { "<3>" } else { "" };
    eprintln!("{prio}tarn: error: {msg}");
}

fn priority(level: Level) -> u8 {
    match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

fn format_line(prio: Option<u8>, ts: Option<&str>, level: &str, r: &log::Record) -> String {
    let mut line = String::with_capacity(128);
    if let Some(p) = prio {
        line.push_str(&format!("<{p}>"));
    }
    if let Some(ts) = ts {
        line.push_str(&format!("ts={ts} "));
    }
    let target = if r.target() == NOTICE { "tarn" } else { r.target() };
    line.push_str(&format!("level={level} target={target} msg="));
    quote(&mut line, &r.args().to_string());
    line.push('\n');
    line
}

/// `"..."` with `"`, `\` and control characters escaped.
fn quote(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// systemd sets JOURNAL_STREAM=DEV:INO for a service whose stderr is the
/// journal; it is only true while fd 2 is still that stream (a child
/// whose stderr was redirected inherits the variable).
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(v) = std::env::var("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = v.split_once(':') else { return false };
    let Ok(m) = std::fs::metadata("/proc/self/fd/2") else { return false };
    dev.parse() == Ok(m.dev()) && ino.parse() == Ok(m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_quoted() {
        let r = log::Record::builder()
            .level(Level::Warn)
            .target("tarn_nbd::server")
            .args(format_args!("a \"b\"\nc\\d"))
            .build();
        let line = format_line(None, Some("T"), "WARN", &r);
        assert_eq!(line, "ts=T level=WARN target=tarn_nbd::server msg=\"a \\\"b\\\"\\nc\\\\d\"\n");
        assert_eq!(format_line(Some(4), None, "WARN", &r).lines().count(), 1);
        assert!(format_line(Some(4), None, "WARN", &r).starts_with("<4>level=WARN "));
    }
}
