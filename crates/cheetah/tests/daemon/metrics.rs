use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use cheetah_core::lb::{Counter, WorkerCounters};
use cheetah_core::verdict::DropReason;

use crate::common::start;

/// One sample line: name, labels, value.
pub(crate) type Sample = (String, BTreeMap<String, String>, f64);

/// Parses the exposition strictly: every line is `# HELP`, `# TYPE`, the final `# EOF`,
/// or a sample of the family declared just before it.
pub(crate) fn parse(text: &str) -> (BTreeMap<String, String>, Vec<Sample>) {
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    let mut family: Option<(String, String)> = None;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "ends with # EOF");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP name text");
            assert!(!help.is_empty(), "{line}");
            family = Some((name.to_string(), String::new()));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            let current = family.as_mut().expect("TYPE after HELP");
            assert_eq!(current.0, name, "{line}");
            assert!(["counter", "gauge", "info"].contains(&kind), "{line}");
            current.1 = kind.to_string();
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "family {name} twice"
            );
        } else {
            assert!(!line.starts_with('#'), "unexpected comment: {line}");
            let (name, rest) = match line.find('{') {
                Some(i) => (&line[..i], &line[i..]),
                None => line.split_at(line.find(' ').expect("sample value")),
            };
            assert!(
                !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "bad name in {line}"
            );
            let (family_name, kind) = family.as_ref().expect("sample after TYPE");
            let expected = match kind.as_str() {
                "counter" => format!("{family_name}_total"),
                "info" => format!("{family_name}_info"),
                _ => family_name.clone(),
            };
            assert_eq!(name, expected, "{line}");
            let mut labels = BTreeMap::new();
            let value = if let Some(body) = rest.strip_prefix('{') {
                let (body, value) = body.split_once("} ").expect("closing brace");
                for pair in body.split(',') {
                    let (k, v) = pair.split_once('=').expect("label=value");
                    let v = v
                        .strip_prefix('"')
                        .and_then(|v| v.strip_suffix('"'))
                        .expect("quoted");
                    labels.insert(k.to_string(), v.to_string());
                }
                value
            } else {
                rest.trim_start()
            };
            let value: f64 = value
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line}"));
            samples.push((name.to_string(), labels, value));
        }
    }
    (types, samples)
}

pub(crate) fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let found: Vec<_> = samples
        .iter()
        .filter(|s| s.0 == name && s.1 == want)
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?}");
    found[0].2
}

#[test]
fn metrics_are_valid_exposition_with_every_reason_and_event() {
    let api = start();
    let workers: Vec<_> = (0..2)
        .map(|i| {
            let counters = Arc::new(WorkerCounters::default());
            let io = api
                .state
                .register_worker(i, i as u32, Arc::clone(&counters));
            (counters, io)
        })
        .collect();
    let (counters, io) = &workers[1];
    counters.count_drop(DropReason::TsMsbUnknown);
    counters.count_drop(DropReason::CookieUnknownServer);
    counters.count_drop(DropReason::CookieServerRemoved);
    counters.count_drop(DropReason::CookieServerRemoved);
    counters.count_drop(DropReason::VipPortUnknown);
    counters.add(Counter::FallbackConnections, 4);
    counters.add(Counter::ToServer, 9);
    io.rx_packets.store(21, Relaxed);
    io.tx_packets.store(19, Relaxed);
    io.tx_ring_full.store(2, Relaxed);
    api.post(
        "/servers/1/load",
        r#"{"load": 0.75, "active_connections": 12}"#,
    );

    let (code, kind, text) = api.text("/metrics");
    assert_eq!(code, 200);
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    let (types, samples) = parse(&text);

    for worker in ["0", "1"] {
        let reasons: BTreeSet<_> = samples
            .iter()
            .filter(|s| s.0 == "cheetah_drops_total" && s.1["worker"] == worker)
            .map(|s| s.1["reason"].clone())
            .collect();
        let all: BTreeSet<_> = DropReason::ALL
            .iter()
            .map(|r| r.name().to_string())
            .collect();
        assert_eq!(
            reasons, all,
            "every drop reason of worker {worker}, zeros included"
        );
        let events: BTreeSet<_> = samples
            .iter()
            .filter(|s| s.0 == "cheetah_events_total" && s.1["worker"] == worker)
            .map(|s| s.1["event"].clone())
            .collect();
        assert_eq!(events.len(), Counter::COUNT);
        for (name, _, _) in io.samples() {
            value(
                &samples,
                &format!("cheetah_io_{name}_total"),
                &[("worker", worker)],
            );
        }
        value(
            &samples,
            "cheetah_worker_packets_per_second",
            &[("worker", worker)],
        );
    }
    assert_eq!(
        value(
            &samples,
            "cheetah_drops_total",
            &[("worker", "1"), ("reason", "cookie_server_removed")]
        ),
        2.0
    );
    assert_eq!(
        value(
            &samples,
            "cheetah_drops_total",
            &[("worker", "0"), ("reason", "cookie_server_removed")]
        ),
        0.0
    );
    assert_eq!(
        value(
            &samples,
            "cheetah_cookie_decode_failures_total",
            &[("worker", "1")]
        ),
        4.0
    );
    assert_eq!(
        value(
            &samples,
            "cheetah_fallback_connections_total",
            &[("worker", "1")]
        ),
        4.0
    );
    assert_eq!(
        value(
            &samples,
            "cheetah_events_total",
            &[("worker", "1"), ("event", "to_server")]
        ),
        9.0
    );
    assert_eq!(
        value(
            &samples,
            "cheetah_events_total",
            &[("worker", "1"), ("event", "dropped")]
        ),
        0.0
    );
    assert_eq!(
        value(
            &samples,
            "cheetah_packets_total",
            &[("worker", "1"), ("direction", "rx")]
        ),
        21.0
    );
    assert_eq!(
        value(
            &samples,
            "cheetah_packets_total",
            &[("worker", "1"), ("direction", "tx")]
        ),
        19.0
    );
    assert_eq!(
        value(
            &samples,
            "cheetah_io_tx_ring_full_total",
            &[("worker", "1")]
        ),
        2.0
    );
    assert_eq!(
        value(
            &samples,
            "cheetah_server_active_connections",
            &[("server", "1")]
        ),
        12.0
    );
    assert_eq!(
        value(&samples, "cheetah_server_reported_load", &[("server", "1")]),
        0.75
    );
    assert_eq!(
        value(&samples, "cheetah_server_packets_total", &[("server", "2")]),
        0.0
    );
    assert_eq!(
        value(&samples, "cheetah_server_bytes_total", &[("server", "2")]),
        0.0
    );
    assert_eq!(
        value(&samples, "cheetah_servers", &[("state", "active")]),
        2.0
    );
    assert_eq!(value(&samples, "cheetah_snapshot_generation", &[]), 1.0);
    let info = samples
        .iter()
        .find(|s| s.0 == "cheetah_info")
        .expect("info");
    assert_eq!(info.2, 1.0);
    assert_eq!(info.1["mode"], "cheetah");
    assert_eq!(info.1["forwarding"], "l2");
    assert_eq!(info.1["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        info.1["secret_fingerprint"],
        crate::common::SECRET.fingerprint(cheetah_core::cookie::CookieLayout::DEFAULT)
    );
    assert_eq!(types["cheetah_drops"], "counter");
    assert_eq!(types["cheetah_worker_packets_per_second"], "gauge");
}

#[test]
fn docs_name_every_event_and_drop_reason() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/api.md"))
        .expect("docs/api.md");
    for name in Counter::ALL
        .iter()
        .map(|c| c.name())
        .chain(DropReason::ALL.iter().map(|r| r.name()))
    {
        assert!(
            doc.contains(&format!("`{name}`")),
            "docs/api.md does not describe `{name}`"
        );
    }
}
