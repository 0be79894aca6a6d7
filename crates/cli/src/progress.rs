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
    bar: Option<ProgressBar>,
    /// Last plain line: when, and which percentage.
    last_line: Option<(Instant, u64)>,
}

impl Progress {
    pub fn new(label: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let style = ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta} left)")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            ProgressBar::new(0).with_style(style).with_message(label.to_string())
        });
        Progress { label: label.to_string(), bar, last_line: None }
    }

    /// `done` of `total` blocks.
    pub fn update(&mut self, done: u64, total: u64) {
        if let Some(bar) = &self.bar {
            bar.set_length(total * BLOCK_SIZE);
            bar.set_position(done * BLOCK_SIZE);
            return;
        }
        let pct = (done * 100).checked_div(total).unwrap_or(100).min(100);
        let due = match self.last_line {
            None => true,
            Some((at, last)) => pct != last && (at.elapsed() >= LINE_EVERY || pct == 100),
        };
        if due {
            eprintln!("{}: {pct}% ({done} of {total} blocks)", self.label);
            self.last_line = Some((Instant::now(), pct));
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
