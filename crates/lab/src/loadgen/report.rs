//! The end-of-run report: the JSON document (`--report`) and the summary on stdout.
//! docs/loadgen.md describes every field.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::stats::{Class, Live, Stats};

/// Broken connections listed in the stdout summary (the JSON has all of them).
const SUMMARY_BROKEN: usize = 20;

/// Counts by class, plus `total`.
type ByClass = BTreeMap<&'static str, u64>;
/// Counts by break kind.
type ByKind = BTreeMap<String, u64>;

#[derive(Debug, Serialize)]
pub struct Report {
    /// The workload as run (the flags).
    pub settings: serde_json::Value,
    /// When the load started (the clock `t` of broken connections counts from), in ms since
    /// the Unix epoch, so that a caller can put several loadgens on one clock.
    pub started_at_unix_ms: u64,
    /// From the start of the load to the stop (duration, or stop file).
    pub elapsed_s: f64,
    pub requests: ByClass,
    pub bytes_downloaded: ByClass,
    pub connections_opened: ByClass,
    /// Connections the server ended with `Connection: close`: not broken.
    pub connections_retired: u64,
    pub connections_broken: u64,
    pub broken_by_kind: ByKind,
    pub broken_by_class: BTreeMap<&'static str, ByKind>,
    pub requests_by_server: BTreeMap<String, u64>,
    pub live_sessions_at_end: LiveAtEnd,
    pub latency_ms: BTreeMap<&'static str, Latency>,
    /// `[second, {kind: count}]` for every second of the run, broken connections by the
    /// second (since start) they were detected in.
    pub broken_per_second: Vec<(u64, ByKind)>,
    pub broken: Vec<BrokenEntry>,
    /// Sessions still in a request when the grace period after the stop ran out.
    pub unfinished_at_stop: u64,
}

#[derive(Debug, Serialize)]
pub struct LiveAtEnd {
    pub total: u64,
    /// By the server the connection's responses named (`unknown`: none answered yet).
    pub by_server: BTreeMap<String, u64>,
    pub by_class: ByClass,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Latency {
    pub count: u64,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct BrokenEntry {
    pub class: &'static str,
    pub kind: String,
    /// Seconds since the start.
    pub t: f64,
    pub local_port: Option<u16>,
    /// `X-Server` values seen on the connection, first first.
    pub servers: Vec<String>,
    /// Requests answered on the connection before it broke.
    pub requests: u64,
    pub detail: String,
}

/// Builds the report from the final counts and the live connections at the end.
pub fn build(
    settings: serde_json::Value,
    started_at: SystemTime,
    elapsed: Duration,
    stats: &Stats,
    live: &[Option<Live>],
    unfinished: u64,
) -> Report {
    let by_class = |f: &dyn Fn(Class) -> u64| {
        let mut map: ByClass = Class::ALL.iter().map(|&c| (c.as_str(), f(c))).collect();
        map.insert("total", Class::ALL.iter().map(|&c| f(c)).sum());
        map
    };
    let mut broken_by_class: BTreeMap<&'static str, ByKind> = BTreeMap::new();
    let seconds = elapsed.as_secs_f64().ceil().max(1.0) as u64;
    let mut per_second: Vec<(u64, ByKind)> = (0..seconds).map(|s| (s, ByKind::new())).collect();
    for b in &stats.broken {
        let kind = b.kind.as_str().to_owned();
        *broken_by_class
            .entry(b.class.as_str())
            .or_default()
            .entry(kind.clone())
            .or_default() += 1;
        let second = b.t.as_secs();
        if second >= per_second.len() as u64 {
            per_second.extend((per_second.len() as u64..=second).map(|s| (s, ByKind::new())));
        }
        *per_second[second as usize].1.entry(kind).or_default() += 1;
    }
    let mut live_at_end = LiveAtEnd {
        total: 0,
        by_server: BTreeMap::new(),
        by_class: by_class(&|c| live.iter().flatten().filter(|l| l.class == c).count() as u64),
    };
    for l in live.iter().flatten() {
        live_at_end.total += 1;
        let server = l.server.clone().unwrap_or_else(|| "unknown".into());
        *live_at_end.by_server.entry(server).or_default() += 1;
    }
    Report {
        settings,
        started_at_unix_ms: started_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        elapsed_s: elapsed.as_secs_f64(),
        requests: by_class(&|c| stats.class(c).requests),
        bytes_downloaded: by_class(&|c| stats.class(c).body_bytes),
        connections_opened: by_class(&|c| stats.class(c).opened),
        connections_retired: stats.retired,
        connections_broken: stats.broken.len() as u64,
        broken_by_kind: stats.broken_by_kind(),
        broken_by_class,
        requests_by_server: stats.requests_by_server.clone(),
        live_sessions_at_end: live_at_end,
        latency_ms: Class::ALL
            .iter()
            .map(|&c| (c.as_str(), latency(&stats.class(c).latencies_us)))
            .collect(),
        broken_per_second: per_second,
        broken: stats
            .broken
            .iter()
            .map(|b| BrokenEntry {
                class: b.class.as_str(),
                kind: b.kind.as_str().to_owned(),
                // Truncated to the ms, so it falls in the same second as in the series.
                t: b.t.as_millis() as f64 / 1e3,
                local_port: b.local_port,
                servers: b.servers.clone(),
                requests: b.requests,
                detail: b.detail.clone(),
            })
            .collect(),
        unfinished_at_stop: unfinished,
    }
}

/// p50, p99 (nearest rank) and max, in ms.
fn latency(samples_us: &[u64]) -> Latency {
    let mut sorted = samples_us.to_vec();
    sorted.sort_unstable();
    let rank = |p: f64| {
        let n = sorted.len();
        (n > 0).then(|| {
            let i = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
            sorted[i] as f64 / 1e3
        })
    };
    Latency {
        count: sorted.len() as u64,
        p50: rank(0.50),
        p99: rank(0.99),
        max: sorted.last().map(|&us| us as f64 / 1e3),
    }
}

/// The human summary printed on stdout.
pub fn summary(report: &Report, target: &str) -> String {
    let mut out = String::new();
    let classes = |map: &ByClass, unit: &dyn Fn(u64) -> String| {
        Class::ALL
            .iter()
            .map(|c| format!("{} {}", unit(map[c.as_str()]), c.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let plain = |n: u64| n.to_string();
    let _ = writeln!(out, "loadgen: {:.1} s against {target}", report.elapsed_s);
    let _ = writeln!(
        out,
        "requests:    {} total: {}",
        report.requests["total"],
        classes(&report.requests, &plain)
    );
    let _ = writeln!(
        out,
        "downloaded:  {}",
        mib(report.bytes_downloaded["total"])
    );
    let _ = writeln!(
        out,
        "connections: {} opened, {} retired by the server, {} broken",
        report.connections_opened["total"], report.connections_retired, report.connections_broken
    );
    if !report.broken_by_kind.is_empty() {
        let kinds: Vec<String> = report
            .broken_by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let _ = writeln!(out, "broken by kind: {}", kinds.join(", "));
    }
    let live = &report.live_sessions_at_end;
    let _ = writeln!(
        out,
        "live sessions at end: {} ({})",
        live.total,
        classes(&live.by_class, &plain)
    );
    let mut servers: Vec<&String> = report.requests_by_server.keys().collect();
    servers.extend(live.by_server.keys());
    servers.sort();
    servers.dedup();
    for server in servers {
        let _ = writeln!(
            out,
            "  server {server}: {} requests, {} live sessions",
            report.requests_by_server.get(server).unwrap_or(&0),
            live.by_server.get(server).unwrap_or(&0)
        );
    }
    for class in Class::ALL {
        let l = &report.latency_ms[class.as_str()];
        if let (Some(p50), Some(p99), Some(max)) = (l.p50, l.p99, l.max) {
            let _ = writeln!(
                out,
                "latency {:9}: p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms ({} requests)",
                class.as_str(),
                l.count
            );
        }
    }
    if report.unfinished_at_stop > 0 {
        let _ = writeln!(
            out,
            "{} sessions were still in a request when the stop's grace period ran out",
            report.unfinished_at_stop
        );
    }
    for b in report.broken.iter().take(SUMMARY_BROKEN) {
        let port = b.local_port.map_or("-".into(), |p| p.to_string());
        let _ = writeln!(
            out,
            "  broken at {:8.3} s: {:9} {:15} port {port:>5} servers [{}] after {} requests: {}",
            b.t,
            b.class,
            b.kind,
            b.servers.join(","),
            b.requests,
            b.detail
        );
    }
    if report.broken.len() > SUMMARY_BROKEN {
        let _ = writeln!(
            out,
            "  ... and {} more broken connections (see the JSON report)",
            report.broken.len() - SUMMARY_BROKEN
        );
    }
    out
}

fn mib(bytes: u64) -> String {
    format!(
        "{:.1} MiB ({bytes} bytes)",
        bytes as f64 / (1024.0 * 1024.0)
    )
}

#[cfg(test)]
mod tests {
    use super::super::breaks::BreakKind;
    use super::super::stats::{BrokenConn, Recorder};
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<u64> = (1..=100).map(|ms| ms * 1000).collect();
        let l = latency(&samples);
        assert_eq!(
            (l.count, l.p50, l.p99, l.max),
            (100, Some(50.0), Some(99.0), Some(100.0))
        );
        assert_eq!(
            latency(&[]),
            Latency {
                count: 0,
                p50: None,
                p99: None,
                max: None
            }
        );
        assert_eq!(latency(&[7000]).p99, Some(7.0));
    }

    #[test]
    fn broken_connections_land_in_their_second() {
        let rec = Recorder::new(2);
        rec.set_live(
            0,
            Some(Live {
                class: Class::Keepalive,
                server: Some("s1".into()),
            }),
        );
        let mut stats = Stats::default();
        for (t, kind) in [
            (0.2, BreakKind::Reset),
            (2.5, BreakKind::Reset),
            (2.9, BreakKind::Timeout),
        ] {
            stats.broken.push(BrokenConn {
                class: Class::Idle,
                kind,
                t: Duration::from_secs_f64(t),
                local_port: Some(40000),
                servers: vec!["s1".into()],
                requests: 3,
                detail: String::new(),
            });
        }
        let report = build(
            serde_json::Value::Null,
            SystemTime::UNIX_EPOCH,
            Duration::from_secs_f64(3.5),
            &stats,
            &rec.live(),
            0,
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["broken_per_second"],
            serde_json::json!([
                [0, {"reset": 1}],
                [1, {}],
                [2, {"reset": 1, "timeout": 1}],
                [3, {}]
            ])
        );
        assert_eq!(json["broken_by_class"]["idle"]["reset"], 2);
        assert_eq!(json["live_sessions_at_end"]["by_server"]["s1"], 1);
        assert_eq!(json["live_sessions_at_end"]["by_class"]["keepalive"], 1);
        assert_eq!(json["connections_broken"], 3);
    }
}
