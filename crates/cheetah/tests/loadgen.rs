//! End-to-end tests of `cheetah loadgen`, through the built binary, against small HTTP
//! servers on 127.0.0.1 started here. Each server misbehaves in one way on one connection,
//! and the test checks the report names exactly that breakage: the detector can fail.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tempfile::TempDir;

/// Body of `/small`, as on the demo's nginx.
const SMALL: usize = 1024;
/// Body of `/large` here (the demo's is 32 MiB; a test wants it quick).
const LARGE: usize = 2 * 1024 * 1024;

/// What a test server does with one request.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// 200 with the full body, naming this server.
    Answer(&'static str),
    /// Any other status, with a body.
    Status(u16),
    /// Close with SO_LINGER 0: a RST.
    Reset,
    /// Never answer (the connection stays open).
    Silent,
    /// Announce the full body, send half, close (FIN).
    Truncate,
    /// Answer in full, then close (FIN) without having said so.
    Hangup,
    /// Answer in full with `Connection: close`, then close: a proper end, not a break.
    Retire,
}

/// Starts a server whose answer to request `request` (from 0) on connection `conn` (from
/// 0, numbered by their first request, so the loadgen's connect-only probe gets no number)
/// is `act(conn, request)`.
fn serve(act: impl Fn(usize, usize) -> Act + Send + Sync + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let act = Arc::new(act);
    let conns = Arc::new(AtomicUsize::new(0));
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let (act, conns) = (act.clone(), conns.clone());
            thread::spawn(move || handle(stream, &*act, &conns));
        }
    });
    addr
}

fn handle(stream: TcpStream, act: &dyn Fn(usize, usize) -> Act, conns: &AtomicUsize) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let mut conn = None;
    for request in 0.. {
        let Some(path) = read_request(&mut reader) else {
            return;
        };
        let conn = *conn.get_or_insert_with(|| conns.fetch_add(1, Ordering::SeqCst));
        let len = if path == "/large" { LARGE } else { SMALL };
        let body = vec![b'x'; len];
        let head_with = |status: u16, server: &str, connection: &str| {
            format!(
                "HTTP/1.1 {status} Whatever\r\nServer: test\r\nContent-Type: text/plain\r\n\
                 Content-Length: {len}\r\nConnection: {connection}\r\nX-Server: {server}\r\n\r\n"
            )
        };
        let head = |status: u16, server: &str| head_with(status, server, "keep-alive");
        let sent = match act(conn, request) {
            Act::Answer(server) => writer
                .write_all(head(200, server).as_bytes())
                .and_then(|()| writer.write_all(&body)),
            Act::Status(status) => writer
                .write_all(head(status, "s1").as_bytes())
                .and_then(|()| writer.write_all(&body)),
            Act::Reset => {
                reset_on_close(&writer);
                return;
            }
            Act::Silent => {
                // Hold the connection until the client gives up on it.
                while read_request(&mut reader).is_some() {}
                return;
            }
            Act::Truncate => {
                let _ = writer.write_all(head(200, "s1").as_bytes());
                let _ = writer.write_all(&body[..len / 2]);
                return;
            }
            Act::Hangup | Act::Retire => {
                let connection = match act(conn, request) {
                    Act::Retire => "close",
                    _ => "keep-alive",
                };
                let _ = writer.write_all(head_with(200, "s1", connection).as_bytes());
                let _ = writer.write_all(&body);
                return;
            }
        };
        if sent.is_err() {
            return;
        }
    }
}

/// Reads one request head; its path, or `None` at EOF or error.
fn read_request(reader: &mut impl BufRead) -> Option<String> {
    let mut line = String::new();
    reader.read_line(&mut line).ok().filter(|&n| n > 0)?;
    let path = line.split_whitespace().nth(1)?.to_owned();
    loop {
        line.clear();
        reader.read_line(&mut line).ok().filter(|&n| n > 0)?;
        if line == "\r\n" {
            return Some(path);
        }
    }
}

/// SO_LINGER {on, 0 s}: closing the socket sends a RST.
fn reset_on_close(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a `linger` of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt(SO_LINGER)");
}

/// Runs `cheetah loadgen --target addr args...` with a JSON report; its output and report.
fn loadgen(addr: SocketAddr, args: &[&str]) -> (Output, Value) {
    let dir = TempDir::new().unwrap();
    let report = dir.path().join("report.json");
    let output = loadgen_raw(addr, &report, args);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "loadgen failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let text = std::fs::read_to_string(&report).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    println!("stdout:\n{stdout}\nstderr:\n{stderr}");
    (output, json)
}

fn loadgen_raw(addr: SocketAddr, report: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cheetah"))
        .arg("loadgen")
        .args(["--target", &addr.to_string(), "--report"])
        .arg(report)
        .args(args)
        .output()
        .unwrap()
}

/// One keep-alive session, a request every 100 ms, nothing else.
const ONE_SESSION: &[&str] = &[
    "--keepalive",
    "1",
    "--keepalive-interval",
    "100ms",
    "--short-rate",
    "0",
];

/// The report's one broken connection, after checking there is exactly one, of `kind`.
fn the_one_broken(report: &Value, kind: &str) -> Value {
    assert_eq!(report["broken_by_kind"], json!({ kind: 1 }), "{report:#}");
    assert_eq!(report["connections_broken"], 1);
    let broken = report["broken"].as_array().unwrap();
    assert_eq!(broken.len(), 1);
    let b = broken[0].clone();
    assert_eq!(b["kind"], kind);
    assert_eq!(b["class"], "keepalive");
    assert!(b["local_port"].as_u64().unwrap() > 0, "{b}");
    // It was counted in its second, and once.
    let second = b["t"].as_f64().unwrap() as usize;
    let series = report["broken_per_second"].as_array().unwrap();
    assert_eq!(series[second], json!([second, { kind: 1 }]));
    let total: u64 = series
        .iter()
        .flat_map(|s| s[1].as_object().unwrap().values())
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(total, 1);
    // The session went on over a new connection, and was live at the end.
    assert_eq!(report["connections_opened"]["keepalive"], 2);
    assert_eq!(report["live_sessions_at_end"]["total"], 1);
    b
}

#[test]
fn a_healthy_server_breaks_nothing_and_every_class_is_counted() {
    // Connections alternate between two server names, as behind an LB.
    let addr = serve(|conn, _| Act::Answer(if conn % 2 == 0 { "s1" } else { "s2" }));
    let dir = TempDir::new().unwrap();
    let stop = dir.path().join("stop");
    let stop_arg = stop.to_str().unwrap().to_owned();
    let started = Instant::now();
    let stopper = thread::spawn(move || {
        thread::sleep(Duration::from_millis(2500));
        std::fs::write(&stop, "").unwrap();
    });
    let (output, report) = loadgen(
        addr,
        &[
            "--duration",
            "60s",
            "--stop-file",
            &stop_arg,
            "--keepalive",
            "4",
            "--keepalive-interval",
            "200ms",
            "--idle-sessions",
            "2",
            "--idle-gap",
            "500ms",
            "--short-rate",
            "20/s",
            "--downloads",
            "1",
            "--progress",
        ],
    );
    stopper.join().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the stop file stops it"
    );

    assert_eq!(report["connections_broken"], 0, "{report:#}");
    assert_eq!(report["broken_by_kind"], json!({}));
    assert_eq!(report["broken"], json!([]));
    let series = report["broken_per_second"].as_array().unwrap();
    assert!(series.len() >= 2);
    for (second, entry) in series.iter().enumerate() {
        assert_eq!(*entry, json!([second, {}]));
    }

    let requests = &report["requests"];
    assert!(requests["keepalive"].as_u64().unwrap() >= 20, "{requests}");
    assert!(requests["idle"].as_u64().unwrap() >= 4, "{requests}");
    assert!(requests["short"].as_u64().unwrap() >= 20, "{requests}");
    assert!(requests["download"].as_u64().unwrap() >= 1, "{requests}");
    let classes = ["keepalive", "idle", "short", "download"];
    let total: u64 = classes.iter().map(|c| requests[c].as_u64().unwrap()).sum();
    assert_eq!(requests["total"], total);
    let by_server = report["requests_by_server"].as_object().unwrap();
    assert_eq!(by_server.len(), 2, "{by_server:?}");
    let served: u64 = by_server.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(served, total);

    let bytes = &report["bytes_downloaded"];
    assert_eq!(
        bytes["download"].as_u64().unwrap(),
        requests["download"].as_u64().unwrap() * LARGE as u64
    );
    assert_eq!(
        bytes["keepalive"].as_u64().unwrap(),
        requests["keepalive"].as_u64().unwrap() * SMALL as u64
    );

    let opened = &report["connections_opened"];
    assert_eq!(opened["keepalive"], 4);
    assert_eq!(opened["idle"], 2);
    assert_eq!(opened["download"], 1);
    assert_eq!(opened["short"], requests["short"]);

    let live = &report["live_sessions_at_end"];
    assert_eq!(live["total"], 7);
    assert_eq!(
        live["by_class"],
        json!({"keepalive": 4, "idle": 2, "download": 1, "short": 0, "total": 7})
    );
    let live_by_server: u64 = live["by_server"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(live_by_server, 7);
    assert!(live["by_server"].get("unknown").is_none());

    for class in classes {
        let latency = &report["latency_ms"][class];
        assert_eq!(latency["count"], requests[class]);
        let (p50, p99, max) = (
            latency["p50"].as_f64().unwrap(),
            latency["p99"].as_f64().unwrap(),
            latency["max"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{class}: {latency}");
    }
    assert_eq!(report["unfinished_at_stop"], 0);

    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains(" 0 broken"), "{stdout}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("req/s"),
        "--progress prints lines: {stderr}"
    );
}

#[test]
fn a_rst_mid_session_is_reset() {
    let addr = serve(|conn, request| {
        if conn == 0 && request == 2 {
            Act::Reset
        } else {
            Act::Answer("s1")
        }
    });
    let (_, report) = loadgen(addr, &[ONE_SESSION, &["--duration", "1500ms"]].concat());
    let b = the_one_broken(&report, "reset");
    assert_eq!(b["servers"], json!(["s1"]));
    assert_eq!(b["requests"], 2);
}

#[test]
fn a_request_left_unanswered_is_a_timeout() {
    let addr = serve(|conn, request| {
        if conn == 0 && request == 2 {
            Act::Silent
        } else {
            Act::Answer("s1")
        }
    });
    let (_, report) = loadgen(
        addr,
        &[
            ONE_SESSION,
            &["--duration", "2500ms", "--request-timeout", "1s"],
        ]
        .concat(),
    );
    let b = the_one_broken(&report, "timeout");
    assert_eq!(b["servers"], json!(["s1"]));
    assert_eq!(b["requests"], 2);
    // Detected one request timeout after the request was sent (at about 0.2 s).
    let t = b["t"].as_f64().unwrap();
    assert!((1.0..2.0).contains(&t), "t = {t}");
}

#[test]
fn an_answer_from_another_server_is_server_changed() {
    let addr = serve(|conn, request| {
        if conn == 0 && request >= 2 {
            Act::Answer("s2")
        } else {
            Act::Answer("s1")
        }
    });
    let (_, report) = loadgen(addr, &[ONE_SESSION, &["--duration", "1500ms"]].concat());
    let b = the_one_broken(&report, "server_changed");
    assert_eq!(b["servers"], json!(["s1", "s2"]));
    assert_eq!(b["requests"], 2);
    assert_eq!(
        report["live_sessions_at_end"]["by_server"],
        json!({"s1": 1})
    );
}

#[test]
fn a_short_body_is_truncated() {
    let addr = serve(|conn, request| {
        if conn == 0 && request == 2 {
            Act::Truncate
        } else {
            Act::Answer("s1")
        }
    });
    let (_, report) = loadgen(addr, &[ONE_SESSION, &["--duration", "1500ms"]].concat());
    let b = the_one_broken(&report, "truncated");
    assert_eq!(b["requests"], 2);
    let detail = b["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("{} of {SMALL}", SMALL / 2)),
        "{detail}"
    );
}

#[test]
fn a_bad_status_is_bad_response() {
    let addr = serve(|conn, request| {
        if conn == 0 && request == 1 {
            Act::Status(503)
        } else {
            Act::Answer("s1")
        }
    });
    let (_, report) = loadgen(addr, &[ONE_SESSION, &["--duration", "1500ms"]].concat());
    let b = the_one_broken(&report, "bad_response");
    assert!(b["detail"].as_str().unwrap().contains("503"), "{b}");
}

#[test]
fn a_close_by_the_server_between_requests_is_closed() {
    let addr = serve(|conn, request| {
        if conn == 0 && request == 1 {
            Act::Hangup
        } else {
            Act::Answer("s1")
        }
    });
    let (_, report) = loadgen(
        addr,
        &[
            "--keepalive",
            "1",
            "--keepalive-interval",
            "300ms",
            "--short-rate",
            "0",
            "--duration",
            "1500ms",
        ],
    );
    let b = the_one_broken(&report, "closed");
    assert_eq!(b["requests"], 2);
    // Seen while the connection idled, when the FIN came, not at the next request.
    assert!(b["detail"].as_str().unwrap().contains("idle"), "{b}");
}

#[test]
fn connection_close_from_the_server_is_not_a_break() {
    let addr = serve(|_, request| {
        if request == 2 {
            Act::Retire
        } else {
            Act::Answer("s1")
        }
    });
    let (_, report) = loadgen(addr, &[ONE_SESSION, &["--duration", "1s"]].concat());
    assert_eq!(report["connections_broken"], 0, "{report:#}");
    let retired = report["connections_retired"].as_u64().unwrap();
    assert!(retired >= 2, "{report:#}");
    assert_eq!(report["connections_opened"]["keepalive"], retired + 1);
    assert_eq!(report["live_sessions_at_end"]["total"], 1);
}

#[test]
fn failed_short_connections_are_counted() {
    // Every request is answered with a RST.
    let addr = serve(|_, _| Act::Reset);
    let (_, report) = loadgen(
        addr,
        &[
            "--keepalive",
            "0",
            "--short-rate",
            "20/s",
            "--duration",
            "1s",
        ],
    );
    let resets = report["broken_by_class"]["short"]["reset"]
        .as_u64()
        .unwrap();
    assert!(resets >= 10, "{report:#}");
    assert_eq!(report["broken_by_kind"], json!({"reset": resets}));
    assert_eq!(report["requests"]["total"], 0);
    assert_eq!(report["connections_opened"]["short"], resets);
}

#[test]
fn without_reconnect_a_broken_session_ends() {
    let addr = serve(|conn, request| {
        if conn == 0 && request == 1 {
            Act::Reset
        } else {
            Act::Answer("s1")
        }
    });
    let (_, report) = loadgen(
        addr,
        &[ONE_SESSION, &["--duration", "1s", "--reconnect", "false"]].concat(),
    );
    assert_eq!(report["broken_by_kind"], json!({"reset": 1}));
    assert_eq!(report["connections_opened"]["keepalive"], 1);
    assert_eq!(report["requests"]["keepalive"], 1);
    assert_eq!(report["live_sessions_at_end"]["total"], 0);
}

#[test]
fn an_unreachable_target_is_an_error() {
    // A port nothing listens on.
    let addr = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dir = TempDir::new().unwrap();
    let report = dir.path().join("report.json");
    let output = loadgen_raw(addr, &report, &["--duration", "1s"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unreachable"), "{stderr}");
    assert!(!report.exists());
}

#[test]
fn usage_errors_fail() {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let dir = TempDir::new().unwrap();
    let report = dir.path().join("report.json");
    for args in [
        &["--duration", "soon"][..],
        &["--short-rate", "lots"],
        &["--duration", "0"],
        &["--path", "small"],
    ] {
        let output = loadgen_raw(addr, &report, args);
        assert!(!output.status.success(), "{args:?}");
    }
}
