//! The scenario's results: the loadgen reports of every client merged onto the scenario's
//! clock, the load spread, the schedule as it happened and the LB's metrics. Written as
//! `<out>/<mode>.json`; `churn-report` reads two of them back.

use std::collections::BTreeMap;

use crate::scrape;
use serde::{Deserialize, Serialize};

/// Counts by class or by kind.
pub type Counts = BTreeMap<String, u64>;

/// The part of a `cheetah loadgen --report` the runner uses (docs/loadgen.md).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct LoadgenReport {
    /// Time 0 of the report's `t`s, in ms since the Unix epoch.
    #[serde(default)]
    pub started_at_unix_ms: u64,
    pub requests: Counts,
    pub connections_opened: Counts,
    pub connections_broken: u64,
    pub broken_by_kind: Counts,
    pub broken_by_class: BTreeMap<String, Counts>,
    pub requests_by_server: Counts,
    pub live_sessions_at_end: LiveAtEnd,
    pub broken: Vec<BrokenConnection>,
    pub unfinished_at_stop: u64,
}

impl LoadgenReport {
    /// The report with class `from` counted as `to`: requests, connections and breaks.
    pub fn with_class_renamed(mut self, from: &str, to: &str) -> Self {
        let rename = |counts: &mut Counts| {
            if let Some(n) = counts.remove(from) {
                *counts.entry(to.to_string()).or_default() += n;
            }
        };
        rename(&mut self.requests);
        rename(&mut self.connections_opened);
        if let Some(kinds) = self.broken_by_class.remove(from) {
            self.broken_by_class.insert(to.to_string(), kinds);
        }
        for entry in self.broken.iter_mut().filter(|b| b.class == from) {
            entry.class = to.to_string();
        }
        self
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct LiveAtEnd {
    pub total: u64,
    pub by_server: Counts,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct BrokenConnection {
    pub class: String,
    pub kind: String,
    /// Seconds since that loadgen's start; since the scenario's start once merged.
    pub t: f64,
    #[serde(default)]
    pub servers: Vec<String>,
    #[serde(default)]
    pub detail: String,
}

/// Something that happened to the LB or its servers during the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Seconds since the start of the load.
    pub t: f64,
    /// `add`, `drain`, `remove`, `policy`, `restart`, `ts_msb_change`, `load_stop`...
    pub kind: String,
    /// Short, for tables and the plot (`add s7`).
    pub label: String,
    #[serde(default)]
    pub detail: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadSpread {
    /// Requests answered per server (by `X-Server`), all clients.
    pub requests_per_server: Counts,
    /// Max over mean of `requests_per_server` among the servers that answered any.
    pub requests_max_over_mean: Option<f64>,
    /// Long-lived connections open at the end, by the server that answered them.
    pub live_sessions_per_server: Counts,
    pub live_sessions_max_over_mean: Option<f64>,
    /// Once a second, max over mean of the open connections of the servers taking new
    /// connections (as their agents report them); the average of those samples. Unlike the
    /// totals above, this is fair to servers that joined late or were drained.
    pub active_connections_max_over_mean: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LbMetrics {
    /// Selected counters summed over every LB process of the run (each restart starts its
    /// counters from zero): `ts_msb_advanced`, `new_connections`, drops by reason...
    pub totals: BTreeMap<String, f64>,
    /// The last `/metrics` of the last LB process, as Prometheus text.
    pub final_snapshot: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Workload {
    pub clients: Vec<String>,
    pub keepalive: usize,
    pub idle_sessions: usize,
    pub idle_gap_s: f64,
    /// Results written before the long idle sessions existed have none.
    #[serde(default)]
    pub long_idle_sessions: usize,
    #[serde(default)]
    pub long_idle_gap_s: f64,
    pub downloads: usize,
    pub short_rate: f64,
}

fn one() -> u16 {
    1
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChurnResults {
    pub mode: String,
    /// LB instances behind the router's ECMP route (results from before `--lbs`: one).
    #[serde(default = "one")]
    pub lbs: u16,
    pub forwarding: String,
    pub servers: u16,
    pub initial_pool: Vec<u16>,
    pub duration_s: f64,
    /// How long the load really ran (a Ctrl-C cuts it short).
    pub elapsed_s: f64,
    pub interrupted: bool,
    pub workload: Workload,
    pub requests: Counts,
    pub connections_opened: Counts,
    pub connections_broken: u64,
    pub broken_by_kind: Counts,
    pub broken_by_class: BTreeMap<String, Counts>,
    /// The same counts for the clients without TCP timestamps alone (also in the totals).
    #[serde(default)]
    pub no_timestamps: NoTimestamps,
    /// Long-lived connections (keep-alive, idle, downloads) open when the load stopped.
    pub long_lived_at_end: u64,
    /// Sessions still in a request when the loadgens' grace period after the stop ran out.
    pub unfinished_at_stop: u64,
    pub load_spread: LoadSpread,
    /// `[second, {kind: count}]` for every second of the run, on the scenario's clock.
    pub broken_per_second: Vec<(u64, Counts)>,
    /// Every broken connection, on the scenario's clock.
    pub broken: Vec<BrokenConnection>,
    pub events: Vec<Event>,
    /// Drained servers that still had connections when the run ended, so were not removed.
    pub not_removed: Vec<u16>,
    pub lb_metrics: LbMetrics,
    /// The per-client loadgen reports, relative to the results file.
    pub loadgen_reports: Vec<String>,
}

/// The connections of the clients that send no TCP timestamps (`--clients-without-timestamps`),
/// counted apart: the LB routes them by its fallback table, not by cookies.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NoTimestamps {
    /// The clients (`c3`, ...); none in a run without them.
    pub clients: Vec<String>,
    pub requests: Counts,
    pub connections_opened: Counts,
    pub connections_broken: u64,
    pub broken_by_kind: Counts,
    pub broken_by_class: BTreeMap<String, Counts>,
}

/// The reports of all clients, merged.
#[derive(Debug, Default, PartialEq)]
pub struct Merged {
    pub requests: Counts,
    pub connections_opened: Counts,
    pub connections_broken: u64,
    pub broken_by_kind: Counts,
    pub broken_by_class: BTreeMap<String, Counts>,
    pub requests_per_server: Counts,
    pub live_sessions_per_server: Counts,
    pub long_lived_at_end: u64,
    pub unfinished_at_stop: u64,
}

fn add_counts(into: &mut Counts, from: &Counts) {
    for (key, value) in from {
        *into.entry(key.clone()).or_default() += value;
    }
}

/// Merges the clients' reports, each with the time its loadgen started on the scenario's
/// clock; returns the totals and every broken connection on that clock, in time order.
pub fn merge(reports: &[(f64, LoadgenReport)]) -> (Merged, Vec<BrokenConnection>) {
    let mut merged = Merged::default();
    let mut broken = Vec::new();
    for (offset, report) in reports {
        add_counts(&mut merged.requests, &report.requests);
        add_counts(&mut merged.connections_opened, &report.connections_opened);
        merged.connections_broken += report.connections_broken;
        add_counts(&mut merged.broken_by_kind, &report.broken_by_kind);
        for (class, kinds) in &report.broken_by_class {
            add_counts(
                merged.broken_by_class.entry(class.clone()).or_default(),
                kinds,
            );
        }
        add_counts(&mut merged.requests_per_server, &report.requests_by_server);
        // `unknown`: connections no response had named yet, so no server to charge.
        let named: Counts = report
            .live_sessions_at_end
            .by_server
            .iter()
            .filter(|(server, _)| server.as_str() != "unknown")
            .map(|(s, n)| (s.clone(), *n))
            .collect();
        add_counts(&mut merged.live_sessions_per_server, &named);
        merged.long_lived_at_end += report.live_sessions_at_end.total;
        merged.unfinished_at_stop += report.unfinished_at_stop;
        for entry in &report.broken {
            let mut entry = entry.clone();
            entry.t += offset;
            broken.push(entry);
        }
    }
    broken.sort_by(|a, b| a.t.total_cmp(&b.t));
    (merged, broken)
}

/// `[second, {kind: count}]` for seconds 0..=last, like loadgen's own field.
pub fn per_second(broken: &[BrokenConnection], seconds: u64) -> Vec<(u64, Counts)> {
    let last = broken
        .iter()
        .map(|b| b.t.max(0.0) as u64)
        .max()
        .unwrap_or(0)
        .max(seconds);
    let mut series: Vec<(u64, Counts)> = (0..=last).map(|s| (s, Counts::new())).collect();
    for entry in broken {
        let second = entry.t.max(0.0) as usize;
        *series[second].1.entry(entry.kind.clone()).or_default() += 1;
    }
    series
}

/// Max over mean of the values that are not zero; `None` if there are none.
pub fn max_over_mean<'a>(values: impl IntoIterator<Item = &'a u64>) -> Option<f64> {
    let nonzero: Vec<f64> = values
        .into_iter()
        .filter(|v| **v > 0)
        .map(|v| *v as f64)
        .collect();
    if nonzero.is_empty() {
        return None;
    }
    let mean = nonzero.iter().sum::<f64>() / nonzero.len() as f64;
    let max = nonzero.iter().copied().fold(0.0, f64::max);
    Some(max / mean)
}

/// Max over mean of the open connections of the active servers in one `GET /servers`
/// answer; `None` when they hold none.
pub fn active_spread(servers: &serde_json::Value) -> Option<f64> {
    let open: Vec<u64> = servers["servers"]
        .as_array()?
        .iter()
        .filter(|s| s["state"] == "active")
        .map(|s| s["active_connections"].as_u64().unwrap_or(0))
        .collect();
    if open.is_empty() {
        return None;
    }
    let mean = open.iter().sum::<u64>() as f64 / open.len() as f64;
    if mean == 0.0 {
        return None;
    }
    Some(*open.iter().max()? as f64 / mean)
}

/// The highlight key of a sample worth summing across LB processes (every event counter
/// and drop reason, new connections per server, cookie decode failures, frames the I/O
/// layer dropped, what the XDP program handed up), `None` for the rest.
fn highlight_key(sample: &scrape::Sample<'_>) -> Option<String> {
    match sample.name {
        "cheetah_events_total" => sample.label("event").map(|e| format!("event.{e}")),
        "cheetah_drops_total" => sample.label("reason").map(|r| format!("drop.{r}")),
        "cheetah_cookie_decode_failures_total" => Some("cookie_decode_failures".into()),
        "cheetah_server_new_connections_total" => sample
            .label("server")
            .map(|s| format!("new_connections.s{s}")),
        // Frames the data path lost: TCP recovers, but a lost SYN-ACK makes the client
        // retransmit its SYN, which the policy may place on another server.
        "cheetah_io_tx_ring_full_total" => Some("io.tx_ring_full".into()),
        "cheetah_io_no_route_total" => Some("io.no_route".into()),
        // What the XDP program handed to the workers instead of forwarding it itself,
        // by reason: set against the packets, the share the kernel leaves to userspace.
        "cheetah_xdp_to_userspace_total" => sample
            .label("reason")
            .map(|r| format!("xdp_to_userspace.{r}")),
        _ => None,
    }
}

/// The highlighted counters over a whole run: every LB instance, across its restarts.
///
/// A series (one name and label set of one instance) counts what it grew by between two
/// scrapes. The workers' counters start from zero in every LB process, but the XDP
/// program's (`worker="xdp"`, `cheetah_xdp_to_userspace_total`) live in pinned maps and
/// carry on across a restart: summing each process's last scrape counted those twice. So
/// a series that went down was reset (it counts all it holds now), and one that did not
/// counts only its difference. Scraping right after a restart keeps a reset series from
/// growing past its old value unseen.
#[derive(Debug, Default)]
pub struct CounterTotals {
    /// By instance, the last value of each series (`name{labels}`).
    last: BTreeMap<(usize, String), f64>,
    totals: BTreeMap<String, f64>,
}

impl CounterTotals {
    /// Adds what the highlighted series of instance `instance` grew by since its last
    /// scrape, from that instance's `/metrics` text.
    pub fn observe(&mut self, instance: usize, text: &str) {
        for sample in scrape::samples(text) {
            let Some(key) = highlight_key(&sample) else {
                continue;
            };
            let series = format!("{}{{{}}}", sample.name, sample.labels);
            let before = self
                .last
                .insert((instance, series), sample.value)
                .unwrap_or(0.0);
            let grew = if sample.value < before {
                sample.value
            } else {
                sample.value - before
            };
            if grew != 0.0 {
                *self.totals.entry(key).or_insert(0.0) += grew;
            }
        }
    }

    pub fn totals(&self) -> &BTreeMap<String, f64> {
        &self.totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(json: &str) -> LoadgenReport {
        serde_json::from_str(json).unwrap()
    }

    const C1: &str = r#"{
        "settings": {}, "elapsed_s": 10.0,
        "requests": {"keepalive": 90, "short": 10, "total": 100},
        "bytes_downloaded": {}, "connections_opened": {"keepalive": 5, "total": 5},
        "connections_retired": 0, "connections_broken": 2,
        "broken_by_kind": {"reset": 2}, "broken_by_class": {"keepalive": {"reset": 2}},
        "requests_by_server": {"s1": 60, "s2": 40},
        "live_sessions_at_end": {"total": 5, "by_server": {"s1": 3, "s2": 1, "unknown": 1}, "by_class": {}},
        "latency_ms": {}, "broken_per_second": [],
        "broken": [
            {"class": "keepalive", "kind": "reset", "t": 3.5, "local_port": 1, "servers": ["s1"], "requests": 3, "detail": "x"},
            {"class": "keepalive", "kind": "reset", "t": 1.2, "local_port": 2, "servers": ["s2"], "requests": 1, "detail": "y"}
        ],
        "unfinished_at_stop": 0
    }"#;
    const C2: &str = r#"{
        "elapsed_s": 10.0, "requests": {"keepalive": 50, "total": 50},
        "connections_opened": {"keepalive": 2, "total": 2}, "connections_broken": 1,
        "broken_by_kind": {"server_changed": 1}, "broken_by_class": {"keepalive": {"server_changed": 1}},
        "requests_by_server": {"s2": 50},
        "live_sessions_at_end": {"total": 2, "by_server": {"s2": 2}},
        "broken": [{"class": "keepalive", "kind": "server_changed", "t": 0.9, "servers": ["s1", "s2"], "detail": "z"}],
        "unfinished_at_stop": 0
    }"#;

    #[test]
    fn reports_merge_onto_the_scenario_clock() {
        let (merged, broken) = merge(&[(0.5, report(C1)), (2.0, report(C2))]);
        assert_eq!(merged.requests["total"], 150);
        assert_eq!(merged.connections_broken, 3);
        assert_eq!(merged.broken_by_kind["reset"], 2);
        assert_eq!(merged.broken_by_class["keepalive"]["server_changed"], 1);
        assert_eq!(merged.requests_per_server["s2"], 90);
        assert_eq!(merged.live_sessions_per_server["s2"], 3);
        assert!(!merged.live_sessions_per_server.contains_key("unknown"));
        assert_eq!(merged.long_lived_at_end, 7);
        let times: Vec<f64> = broken.iter().map(|b| b.t).collect();
        assert_eq!(times, [1.7, 2.9, 4.0]);

        let series = per_second(&broken, 5);
        assert_eq!(series.len(), 6);
        assert_eq!(series[1].1["reset"], 1);
        assert_eq!(series[2].1["server_changed"], 1);
        assert_eq!(series[4].1["reset"], 1);
        assert!(series[5].1.is_empty());
    }

    #[test]
    fn a_renamed_class_keeps_its_counts_under_the_new_name() {
        let json = r#"{
            "requests": {"idle": 4, "total": 4},
            "connections_opened": {"idle": 2, "total": 2}, "connections_broken": 1,
            "broken_by_kind": {"timeout": 1}, "broken_by_class": {"idle": {"timeout": 1}},
            "requests_by_server": {"s1": 4},
            "live_sessions_at_end": {"total": 1, "by_server": {"s1": 1}},
            "broken": [{"class": "idle", "kind": "timeout", "t": 101.0}],
            "unfinished_at_stop": 0
        }"#;
        let renamed = report(json).with_class_renamed("idle", "idle_long");
        assert_eq!(renamed.requests["idle_long"], 4);
        assert_eq!(renamed.requests["total"], 4);
        assert!(!renamed.requests.contains_key("idle"));
        assert_eq!(renamed.connections_opened["idle_long"], 2);
        assert_eq!(renamed.broken_by_class["idle_long"]["timeout"], 1);
        assert!(!renamed.broken_by_class.contains_key("idle"));
        assert_eq!(renamed.broken[0].class, "idle_long");
        let (merged, _) = merge(&[(0.0, report(C1)), (0.0, renamed)]);
        assert_eq!(merged.requests["idle_long"], 4);
        assert_eq!(merged.requests["total"], 104);
    }

    #[test]
    fn spread_is_max_over_mean_of_the_servers_that_served() {
        let counts = [10u64, 20, 30, 0];
        assert_eq!(max_over_mean(&counts), Some(1.5));
        assert_eq!(max_over_mean(&[0u64]), None);
        let servers = serde_json::json!({"servers": [
            {"id": 1, "state": "active", "active_connections": 10},
            {"id": 2, "state": "active", "active_connections": 30},
            {"id": 3, "state": "draining", "active_connections": 90}
        ]});
        assert_eq!(active_spread(&servers), Some(1.5));
    }

    #[test]
    fn metric_highlights_keep_nonzero_events_drops_and_new_connections() {
        let text = "# HELP x\n\
cheetah_events_total{worker=\"0\",event=\"ts_msb_advanced\"} 2\n\
cheetah_events_total{worker=\"1\",event=\"ts_msb_advanced\"} 1\n\
cheetah_events_total{worker=\"1\",event=\"passed\"} 0\n\
cheetah_drops_total{worker=\"0\",reason=\"ts_msb_unknown\"} 4\n\
cheetah_drops_total{worker=\"0\",reason=\"truncated_tcp\"} 0\n\
cheetah_cookie_decode_failures_total{worker=\"0\"} 4\n\
cheetah_server_new_connections_total{server=\"7\"} 12\n\
cheetah_io_tx_ring_full_total{worker=\"1\"} 7\n\
cheetah_xdp_to_userspace_total{reason=\"new_connection\"} 9\n\
cheetah_xdp_to_userspace_total{reason=\"clock\"} 0\n\
cheetah_packets_total{worker=\"0\",direction=\"rx\"} 99\n";
        let mut totals = CounterTotals::default();
        totals.observe(0, text);
        let highlights = totals.totals();
        assert_eq!(highlights["event.ts_msb_advanced"], 3.0);
        assert_eq!(highlights["drop.ts_msb_unknown"], 4.0);
        assert_eq!(highlights["cookie_decode_failures"], 4.0);
        assert_eq!(highlights["new_connections.s7"], 12.0);
        assert!(!highlights.contains_key("event.passed"));
        assert!(!highlights.contains_key("drop.truncated_tcp"));
        assert_eq!(highlights["io.tx_ring_full"], 7.0);
        assert_eq!(highlights["xdp_to_userspace.new_connection"], 9.0);
        assert!(!highlights.contains_key("xdp_to_userspace.clock"));
        assert_eq!(highlights.len(), 6);
    }

    #[test]
    fn counter_totals_count_a_carried_series_once_and_a_reset_one_whole() {
        let before = "cheetah_events_total{worker=\"xdp\",event=\"to_server\"} 100\n\
cheetah_events_total{worker=\"0\",event=\"to_server\"} 40\n\
cheetah_xdp_to_userspace_total{reason=\"publishing\"} 5\n";
        // The same instance after a restart: the kernel's series carried on, the worker's
        // started again from zero.
        let after = "cheetah_events_total{worker=\"xdp\",event=\"to_server\"} 130\n\
cheetah_events_total{worker=\"0\",event=\"to_server\"} 3\n\
cheetah_xdp_to_userspace_total{reason=\"publishing\"} 7\n";
        let mut totals = CounterTotals::default();
        totals.observe(0, before);
        totals.observe(0, after);
        // Another instance's series are its own.
        totals.observe(1, before);
        assert_eq!(totals.totals()["event.to_server"], 130.0 + 43.0 + 140.0);
        assert_eq!(totals.totals()["xdp_to_userspace.publishing"], 7.0 + 5.0);
        // Scraping again without change adds nothing.
        totals.observe(0, after);
        assert_eq!(totals.totals()["event.to_server"], 313.0);
    }
}
