//! The health prober against real Linux TCP, in a network namespace of the test's own (made
//! by the test's thread with `unshare`, so it and its veth go away with the thread,
//! whatever happens):
//! a listener on loopback answers the SYN probe (up, and its SYN-ACK teaches the clock),
//! the same port closed answers with a RST (refused, down after `fall`), a server behind
//! an interface that drops everything never answers (timeout), every server down fails
//! open, and the listener back puts its server back after `rise`. Needs root.

use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cheetah_core::config::LbConfig;
use cheetah_core::hash::Secret;
use cheetah_core::tables::{ControlPlane, Health};
use cheetah_core::types::ServerId;
use cheetah_daemon::health::prober::Prober;
use cheetah_daemon::{Clock, DaemonState};

#[path = "shared/root.rs"]
mod root;
use root::is_root;
#[path = "shared/ip_command.rs"]
mod ip_command;
use ip_command::ip;

/// This thread, alone, in a new network namespace with `lo` up and `hc0` holding
/// 10.55.0.1/24, one end of a veth whose other end has no address: nobody answers for
/// 10.55.0.2, whatever is sent there is lost (a filtered server).
fn enter_new_namespace() {
    // SAFETY: unshare only changes this thread's namespaces.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "unshare: {}", std::io::Error::last_os_error());
    ip(&["link", "set", "lo", "up"]);
    ip(&["link", "add", "hc0", "type", "veth", "peer", "name", "hc1"]);
    ip(&["addr", "add", "10.55.0.1/24", "dev", "hc0"]);
    ip(&["link", "set", "hc0", "up"]);
    ip(&["link", "set", "hc1", "up"]);
}

fn vip_key() -> (std::net::IpAddr, u16) {
    ("10.99.0.1".parse().unwrap(), 80)
}

fn state(port: u16) -> Arc<DaemonState> {
    let config = LbConfig::from_toml(&format!(
        r#"
        forwarding = "nat"
        [[servers]]
        id = 1
        dip = "127.0.0.1"
        [[servers]]
        id = 2
        dip = "10.55.0.2"
        [[vips]]
        address = "10.99.0.1"
        port = 80
        backend_port = {port}
        servers = [1, 2]
        [vips.health]
        interval_ms = 100
        timeout_ms = 50
        fall = 2
        rise = 2
        "#
    ))
    .unwrap();
    let plane = ControlPlane::new(&config, &Secret([3; 16])).unwrap();
    Arc::new(DaemonState::new(plane, Clock::start(), None))
}

/// Runs the prober until `done` holds (or fails after 5 s).
fn probe_until(prober: &mut Prober, state: &DaemonState, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within 5 s; health: {:#?}",
            state.health.all()
        );
        prober.round(Instant::now());
    }
}

fn health(state: &DaemonState, id: u16) -> (Health, String) {
    state
        .health
        .get(&(vip_key(), ServerId(id)))
        .map_or((Health::Unknown, String::new()), |s| (s.state, s.reason))
}

fn pool(state: &DaemonState) -> Vec<u16> {
    state.shared.snapshot.load().vips[0]
        .pool
        .servers
        .iter()
        .map(|s| s.0)
        .collect()
}

/// Connections the listener's kernel holds half-open (SYN received, no ACK yet).
fn half_open() -> usize {
    let out = Command::new("ss")
        .args(["-Htn", "state", "syn-recv"])
        .output()
        .expect("ss (iproute2)");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn the_prober_decides_health_from_real_tcp_and_learns_the_clock() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (a network namespace, a raw socket) ***\n");
        return;
    }
    enter_new_namespace();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let state = state(port);
    let mut prober = Prober::new(Arc::clone(&state)).expect("the raw socket");
    assert!(!state.readiness().ready);
    assert!(!state.shared.msb.probed(ServerId(1)));

    // Up: the listener answers; its SYN-ACK teaches server 1's clock. Down: 10.55.0.2
    // never answers.
    probe_until(&mut prober, &state, "server 1 up, server 2 down", || {
        health(&state, 1).0 == Health::Up && health(&state, 2).0 == Health::Down
    });
    assert_eq!(health(&state, 1).1, "syn-ack");
    assert_eq!(health(&state, 2).1, "timeout");
    assert!(state.shared.msb.probed(ServerId(1)));
    assert!(state.shared.msb.get(ServerId(1)).is_some());
    assert!(!state.shared.msb.probed(ServerId(2)));
    assert_eq!(pool(&state), vec![1], "the down server left the pool");
    let ready = state.readiness();
    assert!(ready.ready, "{ready:?}");
    // The host's kernel answered every SYN-ACK with a RST: nothing stays half-open.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(half_open(), 0, "probes left half-open connections");
    // The listener never saw a connection: the probes did not complete a handshake.
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err());

    // Refused: nothing listens any more; server 1 goes down after `fall`, and with every
    // server down the VIP fails open.
    drop(listener);
    probe_until(&mut prober, &state, "server 1 refused and down", || {
        health(&state, 1).0 == Health::Down
    });
    assert_eq!(health(&state, 1).1, "refused");
    assert_eq!(state.control().failing_open(), vec![vip_key()]);
    assert_eq!(pool(&state), vec![1, 2], "failing open: every member");
    assert_eq!(state.control().fail_open_events(), 1);

    // Back: the port listens again, server 1 is up after `rise` and back in the pool.
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    probe_until(&mut prober, &state, "server 1 up again", || {
        health(&state, 1).0 == Health::Up
    });
    assert_eq!(pool(&state), vec![1]);
    assert!(state.control().failing_open().is_empty());
    let probes = state.health.get(&(vip_key(), ServerId(1))).unwrap().probes;
    assert!(
        probes[0] >= 4 && probes[1] >= 2,
        "ok and refused probes counted: {probes:?}"
    );
    // A real connection still works beside the probes.
    TcpStream::connect(("127.0.0.1", port)).unwrap();
    assert!(listener.accept().is_ok());
}
