use std::sync::Arc;
use std::time::{Duration, Instant};

use cheetah_core::lb::{Counter, WorkerCounters};
use cheetah_daemon::InterfaceStatus;
use serde_json::{json, Value};

use crate::common::{self, start, VIP};

fn ids(servers: &Value) -> Vec<u64> {
    servers["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_u64().unwrap())
        .collect()
}

fn server(servers: &Value, id: u64) -> Value {
    servers["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no server {id} in {servers}"))
}

fn members(vips: &Value) -> Vec<(u64, u64)> {
    vips["vips"][0]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_u64().unwrap(), m["weight"].as_u64().unwrap()))
        .collect()
}

#[test]
fn status_reports_the_lb_its_interfaces_workers_and_servers() {
    let api = start();
    let counters = Arc::new(WorkerCounters::default());
    counters.add(Counter::ToServer, 5);
    counters.add(Counter::Dropped, 2);
    let io = api.state.register_worker(0, 3, Arc::clone(&counters));
    io.rx_packets
        .store(11, std::sync::atomic::Ordering::Relaxed);
    api.state.set_interfaces(vec![InterfaceStatus {
        name: "eth0".into(),
        ifindex: 2,
        xdp_mode: "native".into(),
        queues: vec![3],
    }]);
    let (code, status) = api.get("/status");
    assert_eq!(code, 200);
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(status["mode"], "cheetah");
    assert_eq!(status["forwarding"], "l2");
    assert_eq!(
        status["secret_fingerprint"],
        common::SECRET.fingerprint(cheetah_core::cookie::CookieLayout::DEFAULT)
    );
    assert_eq!(status["snapshot_generation"], 1);
    assert_eq!(
        status["servers"],
        json!({"active": 2, "draining": 0, "removed": 0})
    );
    assert_eq!(status["vips"], 1);
    assert_eq!(
        status["interfaces"],
        json!([{"name": "eth0", "ifindex": 2, "xdp_mode": "native", "queues": [3]}])
    );
    let worker = &status["workers"][0];
    assert_eq!(worker["queue"], 3);
    assert_eq!(worker["packets"], 7);
    assert_eq!(worker["dropped"], 2);
    assert_eq!(worker["rx_packets"], 11);
    assert!(status["uptime_secs"].is_u64());
}

#[test]
fn server_lifecycle_through_the_api() {
    let api = start();
    let (code, servers) = api.get("/servers");
    assert_eq!(code, 200);
    assert_eq!(ids(&servers), vec![1, 2]);
    let one = server(&servers, 1);
    assert_eq!(one["dip"], "10.1.0.1");
    assert_eq!(one["mac"], "02:00:00:01:00:01");
    assert_eq!(one["state"], "active");
    assert_eq!(one["quarantine_left_secs"], Value::Null);
    assert_eq!(one["active_connections"], 0);
    assert_eq!(one["vips"], json!([VIP]));

    // Add with an explicit id and weight, then without an id (lowest free: 0).
    let (code, added) = api.post(
        "/servers",
        r#"{"id": 7, "dip": "10.1.0.7", "mac": "02:00:00:01:00:07",
            "vips": [{"vip": "10.0.0.100:80", "weight": 3}]}"#,
    );
    assert_eq!((code, added), (201, json!({"id": 7})));
    let (code, added) = api.post(
        "/servers",
        r#"{"dip": "10.1.0.8", "mac": "02:00:00:01:00:08", "vips": [{"vip": "10.0.0.100:80"}]}"#,
    );
    assert_eq!((code, added), (201, json!({"id": 0})));
    assert_eq!(
        members(&api.get("/vips").1),
        vec![(1, 1), (2, 1), (7, 3), (0, 1)]
    );

    let (code, added) = api.post(
        "/servers",
        r#"{"id": 9, "dip": "10.1.0.9", "mac": "02:00:00:01:00:09",
            "vips": [{"vip": "10.0.0.100:80"}], "state": "draining"}"#,
    );
    assert_eq!((code, added), (201, json!({"id": 9})));
    let (_, servers) = api.get("/servers");
    assert_eq!(server(&servers, 9)["state"], "draining");
    assert_eq!(
        api.get("/vips").1["vips"][0]["members"][4]["state"],
        "draining"
    );
    let (code, active) = api.send("POST", "/servers/9/activate", None);
    assert_eq!((code, &active["state"]), (200, &json!("active")));

    let (code, drained) = api.send("POST", "/servers/7/drain", None);
    assert_eq!(code, 200);
    assert_eq!(drained["state"], "draining");
    assert_eq!(
        api.get("/vips").1["vips"][0]["members"][2]["state"],
        "draining"
    );
    let (code, active) = api.send("POST", "/servers/7/activate", None);
    assert_eq!((code, &active["state"]), (200, &json!("active")));

    let (code, removed) = api.send("DELETE", "/servers/7", None);
    assert_eq!(code, 200);
    assert_eq!(removed["state"], "removed");
    assert_eq!(removed["quarantine_left_secs"], 600);
    assert_eq!(
        members(&api.get("/vips").1),
        vec![(1, 1), (2, 1), (0, 1), (9, 1)]
    );
    assert_eq!(api.get("/status").1["servers"]["removed"], 1);
    assert_eq!(api.state.shared.snapshot.generation(), 8);
}

#[test]
fn refused_requests_say_why_and_change_nothing() {
    let api = start();
    api.send("DELETE", "/servers/2", None);
    let before = api.tables();
    let cases: &[(&str, &str, Option<&str>, u16, &str)] = &[
        (
            "POST",
            "/servers/9/drain",
            None,
            404,
            "server 9 does not exist",
        ),
        (
            "POST",
            "/servers/9/activate",
            None,
            404,
            "server 9 does not exist",
        ),
        ("DELETE", "/servers/9", None, 404, "server 9 does not exist"),
        (
            "POST",
            "/servers/9/load",
            Some(r#"{"load": 1}"#),
            404,
            "server 9 does not exist",
        ),
        (
            "PUT",
            "/vips/10.0.0.100:80/weights",
            Some(r#"{"weights": {"1": 0}}"#),
            400,
            "weights.1: weight must be at least 1 (drain the server to stop new connections)",
        ),
        (
            "PUT",
            "/vips/10.0.0.100:80/weights",
            Some(r#"{"weights": {"1": 4, "9": 2}}"#),
            400,
            "weights.9: server 9 is not in the pool of 10.0.0.100:80",
        ),
        (
            "PUT",
            "/vips/10.0.0.100:80/weights",
            Some(r#"{"weights": {}}"#),
            400,
            "weights: give at least one",
        ),
        (
            "POST",
            "/servers",
            Some(
                r#"{"dip": "10.1.0.9", "mac": "02:00:00:01:00:09", "vips": [{"vip": "10.0.0.100:80", "weight": 0}]}"#,
            ),
            400,
            "vips[0].weight: weight must be at least 1",
        ),
        (
            "POST",
            "/servers",
            Some(r#"{"id": 2, "dip": "10.1.0.9", "mac": "02:00:00:01:00:09"}"#),
            409,
            "server id 2 was removed and is quarantined for another 600 s",
        ),
        (
            "POST",
            "/servers",
            Some(r#"{"id": 1, "dip": "10.1.0.9", "mac": "02:00:00:01:00:09"}"#),
            409,
            "server id 1 is already in use",
        ),
        (
            "POST",
            "/servers",
            Some(r#"{"dip": "10.1.0.9", "mac": "02:00:00:01:00:01"}"#),
            409,
            "same MAC",
        ),
        (
            "POST",
            "/servers",
            Some(
                r#"{"dip": "10.1.0.9", "mac": "02:00:00:01:00:09", "vips": [{"vip": "10.0.0.1:80"}]}"#,
            ),
            404,
            "VIP 10.0.0.1:80 does not exist",
        ),
        (
            "POST",
            "/servers",
            Some(r#"{"dip": "10.1.0.9"}"#),
            400,
            "server.mac: l2 forwarding needs",
        ),
        (
            "POST",
            "/servers",
            Some(r#"{"dip": "10.1.0.9", "mac": "nope"}"#),
            400,
            "server.mac: `nope` is not a MAC",
        ),
        (
            "POST",
            "/servers",
            Some(r#"{"dip": "10.0.0.100", "mac": "02:00:00:01:00:09"}"#),
            400,
            "dip: 10.0.0.100 is the address of VIP 10.0.0.100:80; a server needs an address of its own",
        ),
        (
            "POST",
            "/servers",
            Some(r#"{"dip": "10.1.0.9", "mac": "02:00:00:01:00:09", "state": "removed"}"#),
            400,
            "state: unknown variant `removed`, expected `active` or `draining`",
        ),
        (
            "POST",
            "/servers",
            Some(r#"{"id": 40000, "dip": "10.1.0.9", "mac": "02:00:00:01:00:09"}"#),
            400,
            "id: 40000 is above",
        ),
        (
            "POST",
            "/servers",
            Some(r#"{"dip": "10.1.0.9", "#),
            400,
            "Failed to parse the request body as JSON",
        ),
        (
            "POST",
            "/servers",
            Some(r#"{"dip": "10.1.0.9", "colour": "red"}"#),
            400,
            "unknown field `colour`",
        ),
        (
            "POST",
            "/servers",
            Some(r#"{"dip": "not an address"}"#),
            400,
            "dip: invalid IP address syntax",
        ),
        (
            "POST",
            "/servers",
            Some(r#"{"vips": []}"#),
            400,
            "missing field `dip`",
        ),
        (
            "POST",
            "/servers",
            None,
            415,
            "Content-Type: application/json",
        ),
        (
            "POST",
            "/servers/abc/drain",
            None,
            400,
            "id: `abc` is not a valid u16",
        ),
        (
            "POST",
            "/servers/1/load",
            Some(r#"{"load": -1}"#),
            400,
            "load: reported load -1 is not a finite, non-negative number",
        ),
        (
            "POST",
            "/servers/1/load",
            Some("{}"),
            400,
            "load: give `load`, `active_connections` or both",
        ),
        (
            "POST",
            "/servers/1/load",
            Some(r#"{"cpu": 1}"#),
            400,
            "unknown field `cpu`",
        ),
        (
            "PUT",
            "/vips/10.0.0.100:80/policy",
            Some(r#"{"policy": "fastest"}"#),
            400,
            "unknown variant `fastest`",
        ),
        (
            "PUT",
            "/vips/10.0.0.100:80/policy",
            Some(r#"{"policy": "rr", "metric": "vibes"}"#),
            400,
            "unknown variant `vibes`",
        ),
        (
            "PUT",
            "/vips/10.0.0.1:80/policy",
            Some(r#"{"policy": "rr"}"#),
            404,
            "VIP 10.0.0.1:80 does not exist",
        ),
        (
            "PUT",
            "/vips/nonsense/policy",
            Some(r#"{"policy": "rr"}"#),
            400,
            "vip: `nonsense` is not address:port",
        ),
        (
            "POST",
            "/vips/10.0.0.100:80/servers",
            Some(r#"{"id": 1}"#),
            409,
            "server 1 is already in the pool of 10.0.0.100:80",
        ),
        (
            "POST",
            "/vips/10.0.0.100:80/servers",
            Some(r#"{"id": 2}"#),
            409,
            "server 2 is removed",
        ),
        (
            "POST",
            "/vips/10.0.0.100:80/servers",
            Some(r#"{"id": 9}"#),
            404,
            "server 9 does not exist",
        ),
        (
            "DELETE",
            "/vips/10.0.0.100:80/servers/9",
            None,
            404,
            "server 9 does not exist",
        ),
        (
            "DELETE",
            "/vips/10.0.0.100:80/servers/2",
            None,
            404,
            "server 2 is not in the pool of 10.0.0.100:80",
        ),
        (
            "DELETE",
            "/vips/10.0.0.100:80/servers/x",
            None,
            400,
            "id: `x` is not a valid u16",
        ),
        (
            "POST",
            "/servers/2/activate",
            None,
            409,
            "server 2 is removed",
        ),
        ("POST", "/servers/2/drain", None, 409, "server 2 is removed"),
        ("POST", "/nowhere", None, 404, "no such route"),
        ("PUT", "/servers", None, 405, "method not allowed"),
    ];
    for (method, path, body, code, message) in cases {
        let (got, answer) = api.send(method, path, *body);
        let error = answer["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{answer}"));
        assert_eq!(
            (got, answer.as_object().unwrap().len()),
            (*code, 1),
            "{method} {path} {body:?}: {answer}"
        );
        assert!(
            error.contains(message),
            "{method} {path} {body:?}: `{error}` lacks `{message}`"
        );
        assert_eq!(
            api.tables(),
            before,
            "{method} {path} {body:?} changed something"
        );
    }
}

#[test]
fn policies_weights_and_pools() {
    let api = start();
    let (code, vip) = api.put("/vips/10.0.0.100:80/policy", r#"{"policy": "pow2"}"#);
    assert_eq!(code, 200);
    assert_eq!(
        (&vip["policy"], &vip["metric"]),
        (&json!("pow2"), &json!("active-connections"))
    );
    let (_, vip) = api.put(
        "/vips/10.0.0.100:80/policy",
        r#"{"policy": "least-loaded", "metric": "bytes"}"#,
    );
    assert_eq!(
        (&vip["policy"], &vip["metric"]),
        (&json!("least-loaded"), &json!("bytes"))
    );
    let (code, vip) = api.put("/vips/10.0.0.100:80/weights", r#"{"weights": {"2": 5}}"#);
    assert_eq!(code, 200);
    assert_eq!(
        vip["members"],
        json!([
            {"id": 1, "weight": 1, "state": "active"},
            {"id": 2, "weight": 5, "state": "active"}
        ])
    );
    let (code, vip) = api.send("DELETE", "/vips/10.0.0.100:80/servers/1", None);
    assert_eq!(code, 200);
    assert_eq!(vip["departed"], json!([1]));
    assert_eq!(api.get("/servers").1["servers"][0]["vips"], json!([]));
    let (code, vip) = api.post("/vips/10.0.0.100:80/servers", r#"{"id": 1, "weight": 2}"#);
    assert_eq!(code, 201);
    assert_eq!(vip["departed"], json!([]));
    let listed = api.get("/vips").1;
    assert_eq!(listed["vips"][0], vip);
    assert_eq!(listed["vips"][0]["vip"], VIP);
    assert_eq!(listed["vips"][0]["backend_port"], 80);
    assert_eq!(members(&listed), vec![(2, 5), (1, 2)]);
    let snapshot = api.state.shared.snapshot.load();
    assert_eq!(
        snapshot.vips[0].pool.weights,
        vec![5, 2],
        "published to the data path"
    );
}

#[test]
fn load_reports_show_in_servers() {
    let api = start();
    let (code, one) = api.post(
        "/servers/1/load",
        r#"{"load": 0.5, "active_connections": 7}"#,
    );
    assert_eq!(code, 200);
    assert_eq!(
        (&one["reported_load"], &one["active_connections"]),
        (&json!(0.5), &json!(7))
    );
    let (_, one) = api.post("/servers/1/load", r#"{"load": 0.25}"#);
    assert_eq!(
        (&one["reported_load"], &one["active_connections"]),
        (&json!(0.25), &json!(7))
    );
    assert_eq!(
        api.state
            .shared
            .loads
            .server(cheetah_core::ServerId(1))
            .active_connections,
        7
    );
}

#[test]
fn quarantines_end_while_the_api_runs() {
    let mut config = common::config();
    config.quarantine_secs = 1;
    let api = common::start_with(common::state_with(&config, None));
    assert_eq!(api.send("DELETE", "/servers/2", None).0, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ids(&api.get("/servers").1).contains(&2) {
        assert!(Instant::now() < deadline, "quarantine never ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, _) = api.post(
        "/servers",
        r#"{"id": 2, "dip": "10.1.0.20", "mac": "02:00:00:01:00:20"}"#,
    );
    assert_eq!(code, 201, "id free again");
}

#[test]
fn a_used_address_is_an_error_naming_it() {
    let api = start();
    let state = Arc::clone(&api.state);
    let e = cheetah_daemon::api::spawn(state, api.api.local_addr())
        .err()
        .expect("the address is in use");
    assert!(
        format!("{e:#}").contains(&format!("cannot listen on {}", api.addr())),
        "{e:#}"
    );
}

#[test]
fn every_change_is_saved_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let api = common::start_with(common::state_with(&common::config(), Some(dir.path())));
    assert_eq!(api.send("POST", "/servers/2/drain", None).0, 200);
    let file = cheetah_daemon::persist::Persister::new(dir.path(), &common::config())
        .unwrap()
        .load()
        .unwrap()
        .expect("saved");
    assert_eq!(
        file.tables.servers[1].state,
        cheetah_core::tables::SavedServerState::Draining
    );
    // A refused change saves nothing new.
    let saved = std::fs::metadata(dir.path().join("state.json"))
        .unwrap()
        .modified()
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(api.send("POST", "/servers/9/drain", None).0, 404);
    let after = std::fs::metadata(dir.path().join("state.json"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(saved, after);
}

/// Under `cheetah run` the XDP program reads copies of the tables, published by the main
/// thread; a change is answered once they hold it, so that the next packet after a `ctl`
/// sees it. Here the test plays the publisher.
#[test]
fn a_change_is_answered_once_the_data_path_holds_it() {
    let api = start();
    let published = &api.state.published;
    let before = api.state.shared.snapshot.generation();
    published.published(before);
    let (answer, answered) = std::sync::mpsc::channel();
    let url = format!("http://{}/servers/1/drain", api.addr());
    std::thread::spawn(move || answer.send(ureq::post(&url).send_empty().map(|r| r.status())));
    assert!(
        answered.recv_timeout(Duration::from_millis(300)).is_err(),
        "the drain was answered before the data path held it"
    );
    let after = api.state.shared.snapshot.generation();
    assert!(after > before, "the drain made a new snapshot");
    published.published(after);
    let status = answered
        .recv_timeout(Duration::from_secs(5))
        .expect("answered once the data path holds the change")
        .unwrap();
    assert_eq!(status, 200);
    // Reads and refused changes change nothing the data path has to take: answered at
    // once, with the publisher behind.
    published.published(before);
    let started = Instant::now();
    assert_eq!(api.get("/servers").0, 200);
    assert_eq!(api.send("POST", "/servers/99/drain", None).0, 404);
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// A data path that does not take a change (its maps refuse the writes, say) delays the
/// answer by the bound only: the change is made, answered and saved all the same.
#[test]
fn a_change_the_data_path_does_not_take_is_answered_after_the_bound() {
    let api = start();
    api.state
        .published
        .published(api.state.shared.snapshot.generation());
    let started = Instant::now();
    let (status, drained) = api.send("POST", "/servers/1/drain", None);
    let waited = started.elapsed();
    assert_eq!((status, &drained["state"]), (200, &json!("draining")));
    assert!(
        (Duration::from_secs(2)..Duration::from_secs(5)).contains(&waited),
        "answered after {waited:?}"
    );
}
