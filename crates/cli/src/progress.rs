//! Progress of a long command on stderr: a bar on a terminal, a line per
//! few seconds otherwise (logs and scripts want lines, not redraws).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};
use tarn_format::BLOCK_SIZE;

/// Least time between two plain progress lines.
const LINE_EVERY: Duration = Duration::from_secs(2);

pub struct Progress {
    label: String,
    /// What is counted: None for blocks (shown as bytes on a bar).
    unit: Option<&'static str>,
    bar: Option<ProgressBar>,
    /// Last plain line: when, and which percentage.
    last_line: Option<(Instant, u64)>,
}

impl Progress {
    /// Progress in blocks.
    pub fn new(label: &str) -> Self {
        Progress::build(label, None)
    }

    /// Progress in `unit`s (say "extents").
    pub fn counting(label: &str, unit: &'static str) -> Self {
        Progress::build(label, Some(unit))
    }

    fn build(label: &str, unit: Option<&'static str>) -> Self {
        let template = match unit {
            None => "{msg} [{bar:40}] {bytes}/{total_bytes} ({eta} left)".to_string(),
            Some(u) => format!("{{msg}} [{{bar:40}}] {{pos}}/{{len}} {u} ({{eta}} left)"),
        };
        let bar = std::io::stderr().is_terminal().then(|| {
            let style = ProgressStyle::with_template(&template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            ProgressBar::new(0).with_style(style).with_message(label.to_string())
        });
        Progress { label: label.to_string(), unit, bar, last_line: None }
    }

    /// `done` of `total` blocks (or units).
    pub fn update(&mut self, done: u64, total: u64) {
        let scale = if self.unit.is_some() { 1 } else { BLOCK_SIZE };
        if let Some(bar) = &self.bar {
            bar.set_length(total * scale);
            bar.set_position(done * scale);
            return;
        }
        let pct = (done * 100).checked_div(total).unwrap_or(100).min(100);
        let due = match self.last_line {
            None => true,
            Some((at, last)) => pct != last && (at.elapsed() >= LINE_EVERY || pct == 100),
        };
        if due {
            eprintln!("{}: {pct}% ({done} of {total} {})", self.label, self.unit.unwrap_or("blocks"));
            self.last_line = Some((Instant::now(), pct));
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
