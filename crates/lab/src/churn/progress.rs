//! `--progress`: what the runner shows while the scenario runs.
//!
//! On a terminal, one line rewritten every second; in a log (CI, a pipe), a line every 10 s.
//! Events are always printed on lines of their own, so the schedule stays readable.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct Progress {
    enabled: bool,
    terminal: bool,
    /// A rewritten line is on screen and must be cleared before anything else is printed.
    line_shown: bool,
    last_plain: Option<Instant>,
    mode: String,
}

/// What one progress line says.
pub struct Status {
    pub elapsed: Duration,
    pub duration: Duration,
    pub live: u64,
    pub broken: u64,
    pub active_servers: usize,
    /// Drained servers not removed yet, with their open connections at the last poll.
    pub draining: Vec<(u16, Option<u64>)>,
    pub last_event: Option<String>,
}

/// Every this often, a progress line in a log that cannot be rewritten.
const PLAIN_EVERY: Duration = Duration::from_secs(10);

impl Progress {
    pub fn new(enabled: bool, mode: &str) -> Self {
        Progress {
            enabled,
            terminal: std::io::stderr().is_terminal(),
            line_shown: false,
            last_plain: None,
            mode: mode.to_string(),
        }
    }

    pub fn line(status: &Status, mode: &str) -> String {
        let last = status
            .last_event
            .as_deref()
            .map(|e| format!("  last: {e}"))
            .unwrap_or_default();
        let draining = if status.draining.is_empty() {
            String::new()
        } else {
            let servers: Vec<String> = status
                .draining
                .iter()
                .map(|(id, open)| match open {
                    Some(open) => format!("s{id} {open} open"),
                    None => format!("s{id}"),
                })
                .collect();
            format!(", draining {}", servers.join(", "))
        };
        format!(
            "[{mode}] {:>4.0}s/{:.0}s  live connections {:>4}  broken {:>5}  servers: {} active{draining}{last}",
            status.elapsed.as_secs_f64(),
            status.duration.as_secs_f64(),
            status.live,
            status.broken,
            status.active_servers,
        )
    }

    pub fn update(&mut self, status: &Status) {
        if !self.enabled {
            return;
        }
        let line = Self::line(status, &self.mode);
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[K{line}");
            let _ = err.flush();
            self.line_shown = true;
        } else if self.last_plain.is_none_or(|t| t.elapsed() >= PLAIN_EVERY) {
            let _ = writeln!(err, "{line}");
            self.last_plain = Some(Instant::now());
        }
    }

    /// A line that stays (an event, a warning).
    pub fn say(&mut self, text: &str) {
        let mut err = std::io::stderr().lock();
        if self.line_shown {
            let _ = write!(err, "\r\x1b[K");
            self.line_shown = false;
        }
        let _ = writeln!(err, "{text}");
    }

    /// Ends the rewritten line, if any.
    pub fn finish(&mut self) {
        if self.line_shown {
            let _ = writeln!(std::io::stderr());
            self.line_shown = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_time_connections_breaks_and_servers() {
        let line = Progress::line(
            &Status {
                elapsed: Duration::from_secs(45),
                duration: Duration::from_secs(150),
                live: 266,
                broken: 0,
                active_servers: 7,
                draining: vec![(2, Some(40)), (7, None)],
                last_event: Some("36s drain s2".into()),
            },
            "cheetah",
        );
        assert!(line.starts_with("[cheetah]   45s/150s"), "{line}");
        for part in [
            "live connections  266",
            "broken     0",
            "7 active, draining s2 40 open, s7",
            "last: 36s drain s2",
        ] {
            assert!(line.contains(part), "{part:?} not in {line:?}");
        }
    }
}
