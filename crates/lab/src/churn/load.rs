//! The client load of the churn scenario: one `cheetah loadgen` per client namespace, the
//! workload split evenly between them.
//!
//! Each kind of session is there to catch a different way of breaking connections:
//! keep-alive sessions (a request a second) see a remap within a second; idle sessions
//! (40 s between requests) sit through pool changes and timestamp MSB changes with nothing
//! on the wire (the servers send no TCP keepalive probes); long idle sessions (100 s between
//! requests) do the same across more than one MSB period, where a client's PAWS check
//! judges a TSval the server sent 100 s before; downloads keep data in flight during
//! restarts; short connections exercise the policies on every new connection.
//!
//! loadgen has one idle class, so the long idle sessions run in a second loadgen per
//! client, whose report the runner files under its own class ([`LONG_IDLE_CLASS`]).

use std::path::Path;
use std::time::Duration;

/// The class the long idle sessions' requests and breaks are counted under in the results
/// (loadgen itself calls them `idle`).
pub const LONG_IDLE_CLASS: &str = "idle_long";

/// The whole scenario's load, before it is split between clients.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub keepalive: usize,
    pub idle_sessions: usize,
    pub idle_gap: Duration,
    /// Idle sessions whose gap is longer than one period of the servers' timestamp MSB.
    pub long_idle_sessions: usize,
    pub long_idle_gap: Duration,
    pub downloads: usize,
    /// Short connections per second, all clients together.
    pub short_rate: f64,
}

/// One client's share.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientLoad {
    /// `c0`, `c1`, ...
    pub client: String,
    pub namespace: String,
    pub keepalive: usize,
    pub idle_sessions: usize,
    pub long_idle_sessions: usize,
    pub downloads: usize,
    pub short_rate: f64,
}

/// Splits `workload` between `clients` (name, namespace), spreading remainders over the
/// first ones, so that both the clients behind the router and the one on the LB's own
/// segment carry every kind of session.
pub fn split(workload: &Workload, clients: &[(String, String)]) -> Vec<ClientLoad> {
    let n = clients.len();
    let share = |total: usize, i: usize| total / n + usize::from(i < total % n);
    clients
        .iter()
        .enumerate()
        .map(|(i, (client, namespace))| ClientLoad {
            client: client.clone(),
            namespace: namespace.clone(),
            keepalive: share(workload.keepalive, i),
            idle_sessions: share(workload.idle_sessions, i),
            long_idle_sessions: share(workload.long_idle_sessions, i),
            downloads: share(workload.downloads, i),
            short_rate: workload.short_rate / n as f64,
        })
        .collect()
}

impl ClientLoad {
    /// The `cheetah loadgen` arguments for this client.
    pub fn loadgen_args(
        &self,
        workload: &Workload,
        target: &str,
        duration: Duration,
        report: &Path,
        stop_file: &Path,
    ) -> Vec<String> {
        vec![
            "loadgen".into(),
            "--target".into(),
            target.into(),
            "--duration".into(),
            format!("{}ms", duration.as_millis()),
            "--keepalive".into(),
            self.keepalive.to_string(),
            "--idle-sessions".into(),
            self.idle_sessions.to_string(),
            "--idle-gap".into(),
            format!("{}ms", workload.idle_gap.as_millis()),
            "--downloads".into(),
            self.downloads.to_string(),
            "--short-rate".into(),
            format!("{:.3}/s", self.short_rate),
            // The scenario judges each connection once: a broken one is counted, and the
            // session goes on over a new connection like a real client would.
            "--reconnect".into(),
            "true".into(),
            "--report".into(),
            report.to_string_lossy().into_owned(),
            "--stop-file".into(),
            stop_file.to_string_lossy().into_owned(),
            // The progress lines land in the log, where the runner's own progress reads them.
            "--progress".into(),
        ]
    }

    /// The arguments of this client's second loadgen, which runs only its long idle
    /// sessions; `None` if it has none.
    pub fn long_idle_loadgen_args(
        &self,
        workload: &Workload,
        target: &str,
        duration: Duration,
        report: &Path,
        stop_file: &Path,
    ) -> Option<Vec<String>> {
        if self.long_idle_sessions == 0 {
            return None;
        }
        let only_long_idle = ClientLoad {
            keepalive: 0,
            idle_sessions: self.long_idle_sessions,
            long_idle_sessions: 0,
            downloads: 0,
            short_rate: 0.0,
            ..self.clone()
        };
        let gap = Workload {
            idle_gap: workload.long_idle_gap,
            ..workload.clone()
        };
        Some(only_long_idle.loadgen_args(&gap, target, duration, report, stop_file))
    }
}

/// What a loadgen's `--progress` line says: (live long-lived connections, broken so far).
///
/// The line looks like
/// `loadgen   12.0s     251.3 req/s  live   266  broken 3 (reset=2 timeout=1)`.
pub fn parse_progress(line: &str) -> Option<(u64, u64)> {
    let rest = line.trim_start().strip_prefix("loadgen")?;
    let mut words = rest.split_whitespace();
    let mut live = None;
    let mut broken = None;
    while let Some(word) = words.next() {
        match word {
            "live" => live = words.next()?.parse().ok(),
            "broken" => broken = words.next()?.parse().ok(),
            _ => {}
        }
    }
    Some((live?, broken?))
}

/// The last progress line in a loadgen's log, parsed.
pub fn last_progress(log: &str) -> Option<(u64, u64)> {
    log.lines().rev().find_map(parse_progress)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clients(n: usize) -> Vec<(String, String)> {
        (0..n)
            .map(|i| (format!("c{i}"), format!("t1-c{i}")))
            .collect()
    }

    fn workload() -> Workload {
        Workload {
            keepalive: 242,
            idle_sessions: 24,
            idle_gap: Duration::from_secs(40),
            long_idle_sessions: 16,
            long_idle_gap: Duration::from_secs(100),
            downloads: 2,
            short_rate: 40.0,
        }
    }

    #[test]
    fn the_split_adds_up_to_the_whole_workload() {
        let loads = split(&workload(), &clients(4));
        assert_eq!(loads.iter().map(|l| l.keepalive).sum::<usize>(), 242);
        assert_eq!(loads.iter().map(|l| l.idle_sessions).sum::<usize>(), 24);
        assert_eq!(loads.iter().map(|l| l.downloads).sum::<usize>(), 2);
        let rate: f64 = loads.iter().map(|l| l.short_rate).sum();
        assert!((rate - 40.0).abs() < 1e-9);
        // Remainders go to the first clients, one each.
        assert_eq!(
            loads.iter().map(|l| l.keepalive).collect::<Vec<_>>(),
            [61, 61, 60, 60]
        );
        assert_eq!((loads[0].idle_sessions, loads[0].downloads), (6, 1));
        assert_eq!(
            loads.iter().map(|l| l.long_idle_sessions).sum::<usize>(),
            16
        );
    }

    #[test]
    fn long_idle_sessions_get_a_loadgen_of_their_own() {
        let loads = split(&workload(), &clients(4));
        let args = loads[3]
            .long_idle_loadgen_args(
                &workload(),
                "10.99.0.1:80",
                Duration::from_secs(150),
                Path::new("/tmp/r.json"),
                Path::new("/tmp/stop"),
            )
            .unwrap();
        let text = args.join(" ");
        for expected in [
            "--keepalive 0 ",
            "--idle-sessions 4 ",
            "--idle-gap 100000ms",
            "--downloads 0 ",
            "--short-rate 0.000/s",
            "--duration 150000ms",
            "--stop-file /tmp/stop",
        ] {
            assert!(text.contains(expected), "{expected} missing in {text}");
        }
        let none = Workload {
            long_idle_sessions: 0,
            ..workload()
        };
        let loads = split(&none, &clients(4));
        assert!(loads[0]
            .long_idle_loadgen_args(
                &none,
                "10.99.0.1:80",
                Duration::from_secs(150),
                Path::new("/tmp/r.json"),
                Path::new("/tmp/stop"),
            )
            .is_none());
    }

    #[test]
    fn loadgen_gets_every_knob_and_the_stop_file() {
        let load = &split(&workload(), &clients(2))[1];
        let args = load.loadgen_args(
            &workload(),
            "10.99.0.1:80",
            Duration::from_secs(150),
            Path::new("/tmp/r.json"),
            Path::new("/tmp/stop"),
        );
        let text = args.join(" ");
        for expected in [
            "--target 10.99.0.1:80",
            "--duration 150000ms",
            "--keepalive 121",
            "--idle-sessions 12",
            "--idle-gap 40000ms",
            "--downloads 1",
            "--short-rate 20.000/s",
            "--report /tmp/r.json",
            "--stop-file /tmp/stop",
        ] {
            assert!(text.contains(expected), "{expected} missing in {text}");
        }
    }

    #[test]
    fn progress_lines_give_live_and_broken() {
        let line = "loadgen   12.0s     251.3 req/s  live   266  broken 3 (reset=2 timeout=1)";
        assert_eq!(parse_progress(line), Some((266, 3)));
        assert_eq!(
            parse_progress("loadgen    1.0s       0.0 req/s  live     0  broken 0"),
            Some((0, 0))
        );
        assert_eq!(parse_progress("requests: 12"), None);
        let log = "starting\nloadgen 1.0s 1.0 req/s live 5 broken 0\nloadgen 2.0s 1.0 req/s live 7 broken 1 (reset=1)\nsummary\n";
        assert_eq!(last_progress(log), Some((7, 1)));
    }
}
