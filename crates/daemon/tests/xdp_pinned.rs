//! The XDP program's maps pinned (`dataplane/pin.rs`, `[daemon] bpf_pin_dir`), with the
//! real program (loaded, not attached; needs root) over a BPF filesystem of the test's own:
//! what one load leaves in the maps, the next load (a `kill -9` and restart, or an
//! upgrade) finds and keeps using, the kernel and the core alike:
//!
//! * a SYN booked before is a retransmission after, for the kernel and for the core's
//!   `HandshakeTable` over the reused words;
//! * a close counted before is a duplicate after, on both sides;
//! * the `stats` counters go on from where they were; the core's clock continues;
//! * the clocks in the words are kept, and a state file's older one does not move them
//!   back;
//! * the kernel's rr cursors go on (the VIP's policy, pool and weights did not change);
//! * the load fold starts from the pinned `server_traffic` totals, not from 0;
//! * a publisher that starts knowing nothing removes what an earlier run left that is no
//!   longer wanted;
//! * a map whose definition changed (a new fallback table size), or everything under
//!   another key, is replaced and starts fresh, and the program still loads.

use std::path::Path;
use std::sync::Arc;

use cheetah_core::config::{Forwarding, LbConfig, Mode};
use cheetah_core::hash::Secret;
use cheetah_core::lb::{Counter, Ingress, Worker, WorkerConfig};
use cheetah_core::policy::PolicyKind;
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{self, options, TcpFrame};
use cheetah_core::types::{Mac, ServerId, NANOS_PER_SEC};
use cheetah_core::wire::tcp::flags::{ACK, FIN, SYN};
use cheetah_daemon::clock::monotonic_ns;
use cheetah_daemon::dataplane::kernel_loads::KernelLoads;
use cheetah_daemon::dataplane::pin::{PinDir, Pinned};
use cheetah_daemon::dataplane::xdp::SteeringProgram;
use cheetah_daemon::dataplane::xdp_layout::{
    FAST_BUNDLES, STAT_FAST_CLIENT_SYN, STAT_FAST_CLIENT_SYN_RETRANSMITTED,
};
use cheetah_daemon::dataplane::xdp_tables::{wanted, Publication, Publisher};
use libbpf_rs::{MapCore, MapFlags};

#[path = "shared/root.rs"]
mod root;
use root::is_root;
#[path = "shared/ip_command.rs"]
mod ip_command;
#[path = "shared/lb_namespace.rs"]
mod lb_namespace;
use lb_namespace::{enter_lb_namespace, interface, Veth};
#[path = "shared/bpffs.rs"]
mod bpffs;
use bpffs::TempBpffs;

const SERVERS: Veth = Veth {
    name: "xn-srv",
    mac: [0x02, 0x1d, 0x00, 0x00, 0x00, 0x05],
    peer: "xn-srv-p",
};
const CLIENTS: Veth = Veth {
    name: "xn-cli",
    mac: [0x02, 0x1d, 0x00, 0x00, 0x00, 0x0c],
    peer: "xn-cli-p",
};
const GATEWAY_MAC: Mac = [0x02, 0xc9, 0x00, 0x00, 0x02, 0x01];
const XDP_DROP: u32 = 1;
const SECRET: Secret = Secret([7; 16]);
const SERVER: ServerId = ServerId(2);
/// The server's clock: its TSval's MSB, known to the LB, so the kernel takes its replies.
const MSB: u16 = 0x1234;
/// The core's `now` when the first run books its SYN.
const NOW: u64 = 10 * NANOS_PER_SEC;

fn config(fallback_capacity: usize) -> LbConfig {
    let mut config = testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 3);
    config.fallback_table_capacity = fallback_capacity;
    config
}

/// One run of the LB over the pinned maps: the program, the core's pipeline over its
/// words, its maps published, as `cheetah run` does at start.
struct Lb {
    program: SteeringProgram,
    plane: ControlPlane,
    worker: Worker,
    clients_ifindex: u32,
    servers_ifindex: u32,
}

impl Lb {
    /// `pins`: `None` for an unpinned load (fresh maps every time).
    fn start(config: &LbConfig, pins: Option<&PinDir>) -> Self {
        let program = match pins {
            Some(pins) => SteeringProgram::load_pinned(config.fallback_table_capacity, pins),
            None => SteeringProgram::load(config.fallback_table_capacity),
        }
        .expect("the verifier refused bpf/xdp_lb.c");
        // As `cheetah run` does: the earlier run's clock continues, else one starts so
        // that the core's `now` is NOW + whatever the test waits.
        if program.kept_clock_base().unwrap().is_none() {
            program
                .set_clock_base(monotonic_ns().wrapping_sub(NOW))
                .unwrap();
        }
        let words = program.kernel_words().unwrap();
        let kept_clocks = words.kept_clocks();
        let closes = program.close_words().unwrap();
        let mut plane =
            ControlPlane::new_with_tables(config, &SECRET, &|layout, _| words.tables(layout))
                .unwrap();
        assert!(plane.share_closes(closes.filter()).is_ok());
        // The state file's clock, as `cheetah run` imports it: older than the words'.
        plane
            .shared()
            .msb
            .import(&[(SERVER, u32::from(MSB - 1) << 16)], 0);
        plane.shared().msb.import_newer(&kept_clocks, 0);
        let servers = interface(&SERVERS, 0);
        let clients = interface(&CLIENTS, 1);
        program
            .set_interface_slots(&[(servers.ifindex, 0), (clients.ifindex, 1)])
            .unwrap();
        let snapshot = plane.shared().snapshot.load();
        let publication = Publication {
            snapshot: &snapshot,
            layout: plane.layout(),
            interfaces: &[servers.clone(), clients.clone()],
            sides: &[Ingress::ServerSide, Ingress::ClientSide],
            fast_path: true,
            fallback_sets: plane.shared().fallback.sets(),
        };
        // This thread's namespace's tables: /proc/net is the process's first thread's.
        let read = |path: &str| std::fs::read_to_string(Path::new(path)).unwrap();
        let routes = read("/proc/thread-self/net/route");
        let neighbours = read("/proc/thread-self/net/arp");
        // As `cheetah run` publishes: the maps, then the kernel's policy state.
        let mut publisher = Publisher::new();
        publisher
            .write(&program, wanted(&publication, &routes, &neighbours))
            .unwrap();
        publisher.seed_policies(&program, &snapshot).unwrap();
        let worker = Worker::new(
            Arc::clone(plane.shared()),
            WorkerConfig::new(0, 1, plane.config()),
        );
        Lb {
            program,
            plane,
            worker,
            clients_ifindex: clients.ifindex,
            servers_ifindex: servers.ifindex,
        }
    }

    /// The core's `now`, as the kernel reads it.
    fn now(&self) -> u64 {
        monotonic_ns() - self.program.clock_base().unwrap()
    }

    /// Which `STAT_FAST_*` bundle counter `frame` moved in the kernel, if one did.
    fn kernel(&self, frame: &[u8], ifindex: u32) -> Option<u32> {
        let before = self.program.stats().fast;
        let (action, _) = self.program.test_run(frame, ifindex).unwrap();
        let after = self.program.stats().fast;
        let moved = (0..before.len()).find(|&i| after[i] != before[i])?;
        assert_ne!(action, XDP_DROP, "a packet the kernel handled");
        Some(FAST_BUNDLES[moved].0)
    }

    /// (first, duplicate) close counters the kernel moved for `frame`.
    fn kernel_close(&self, frame: &[u8]) -> [u64; 2] {
        let before = self.program.stats().events;
        self.program.test_run(frame, self.servers_ifindex).unwrap();
        let after = self.program.stats().events;
        [after[0] - before[0], after[1] - before[1]]
    }

    /// How much the core's `counter` moved for `frame`.
    fn core(&mut self, frame: &[u8], ingress: Ingress, counter: Counter) -> u64 {
        let counters = Arc::clone(self.worker.counters());
        let before = counters.get(counter);
        let mut packet = frame.to_vec();
        let now = self.now();
        self.worker.process(&mut packet, now, ingress);
        counters.get(counter) - before
    }
}

fn syn(port: u16) -> Vec<u8> {
    TcpFrame {
        seq: 0x5eed_0000 + u32::from(port),
        ..TcpFrame::from_client(
            testkit::client_ip(9),
            port,
            SYN,
            options::linux_syn(0x0101_0101, 0),
        )
    }
    .build()
}

fn fin(port: u16) -> Vec<u8> {
    TcpFrame {
        seq: 7000,
        ..TcpFrame::from_server_l2(
            SERVER.0,
            testkit::client_ip(9),
            port,
            FIN | ACK,
            options::nop_nop_ts(u32::from(MSB) << 16 | 5, 77),
        )
    }
    .build()
}

const FIRST: [u64; 2] = [1, 0];
const DUPLICATE: [u64; 2] = [0, 1];

#[test]
fn a_restart_over_pinned_maps_keeps_the_kernels_state() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program, mounts bpffs) ***\n");
        return;
    }
    enter_lb_namespace(&SERVERS, &CLIENTS, &GATEWAY_MAC);
    let bpffs = TempBpffs::mount();
    let config = config(4096);
    let fingerprint = SECRET.fingerprint(config.cookie_layout().unwrap());
    let pins = PinDir::new(bpffs.join("lb")).unwrap().for_key(&fingerprint);

    let before = Lb::start(&config, Some(&pins));
    assert!(
        before
            .program
            .pins()
            .maps
            .values()
            .all(|p| *p == Pinned::New),
        "a first run pins fresh maps: {:?}",
        before.program.pins()
    );
    assert!(
        !before.program.pins().maps.contains_key("xsks"),
        "the socket map is per process"
    );
    // Its slots are tagged with a publish_seq that a replaced lb_config counts from 0 again.
    assert!(
        !before.program.pins().maps.contains_key("next_hop_cache"),
        "the next-hop cache is per process"
    );
    let clock_base = before.program.clock_base().unwrap();
    // The clock the server shows now: newer than the state file's.
    before
        .plane
        .shared()
        .msb
        .import(&[(SERVER, u32::from(MSB) << 16)], NOW);
    assert_eq!(
        before.kernel(&syn(40_001), before.clients_ifindex),
        Some(STAT_FAST_CLIENT_SYN),
        "the kernel books the SYN"
    );
    assert_eq!(before.kernel_close(&fin(40_100)), FIRST);
    // Where the rr cursors are after the kernel's pick (its CPU's moved).
    let cursors = before.program.policy_state(0).unwrap();
    // Something the next run no longer wants, as an earlier config's VIP would be.
    let vips = before.program.try_map("vips").unwrap();
    let stale_vip = vec![9u8; vips.key_size() as usize];
    let value = vec![0u8; vips.value_size() as usize];
    vips.update(&stale_vip, &value, MapFlags::ANY).unwrap();
    let stats = before.program.stats();
    // kill -9: the process's program, maps and mappings are gone; the pins are not.
    drop(before);

    let mut after = Lb::start(&config, Some(&pins));
    let report = after.program.pins();
    assert!(
        report.kept(&[
            "handshakes",
            "closes",
            "stats",
            "msb_seen",
            "msb_restores",
            "fallback",
            "lb_config",
            "vips"
        ]),
        "the second run reuses the maps: {report:?}"
    );
    assert_eq!(
        after.program.kept_clock_base().unwrap(),
        Some(clock_base),
        "the core's clock continues"
    );
    assert_eq!(
        after.program.stats(),
        stats,
        "the counters go on from where they were"
    );
    // The earlier run's server_traffic was its own to fold: this run's loads start at 0.
    let mut fold = KernelLoads::starting_at(
        &after.program,
        std::sync::Arc::clone(&after.plane.shared().loads),
    )
    .unwrap();
    fold.fold(&after.program, after.plane.shared()).unwrap();
    for id in 1..=3 {
        let load = after.plane.shared().loads.server(ServerId(id));
        assert_eq!(
            (load.active_connections, load.new_connections, load.packets),
            (0, 0, 0),
            "server {id}: the earlier run's traffic folded again"
        );
    }
    assert_eq!(
        after.program.policy_state(0).unwrap(),
        cursors,
        "the VIP's rr cursors go on: its policy, pool and weights are the earlier run's"
    );
    assert_eq!(
        after.plane.shared().msb.get(SERVER),
        Some(MSB),
        "the pinned clock wins over the state file's older one"
    );
    assert!(
        after
            .program
            .try_map("vips")
            .unwrap()
            .lookup(&stale_vip, MapFlags::ANY)
            .unwrap()
            .is_none(),
        "the publisher removes what the earlier run left and no one wants"
    );
    assert_eq!(
        after.kernel(&syn(40_001), after.clients_ifindex),
        Some(STAT_FAST_CLIENT_SYN_RETRANSMITTED),
        "the SYN booked before the restart is a retransmission for the kernel"
    );
    assert_eq!(
        after.core(
            &syn(40_001),
            Ingress::ClientSide,
            Counter::SynRetransmissions
        ),
        1,
        "and for the core's handshake table over the same words"
    );
    assert_eq!(
        after.kernel_close(&fin(40_100)),
        DUPLICATE,
        "a close counted before is a duplicate after"
    );
    assert_eq!(
        after.core(&fin(40_100), Ingress::ServerSide, Counter::DuplicateCloses),
        1
    );
    drop(after);

    // An upgrade whose fallback table is sized otherwise: that map starts fresh, the
    // others are kept, the program loads.
    let resized = Lb::start(&self::config(8192), Some(&pins));
    let report = resized.program.pins();
    match report.maps.get("fallback") {
        Some(Pinned::Replaced(why)) => assert!(why.contains("entries"), "{why}"),
        other => panic!("fallback: {other:?}"),
    }
    assert!(
        report.kept(&["handshakes", "closes", "stats"]),
        "{report:?}"
    );
    drop(resized);

    // Another key: every map the earlier key filled starts fresh.
    let rekeyed = PinDir::new(bpffs.join("lb"))
        .unwrap()
        .for_key("0123456789abcdef");
    let fresh = Lb::start(&config, Some(&rekeyed));
    assert!(
        fresh
            .program
            .pins()
            .maps
            .values()
            .all(|p| matches!(p, Pinned::Replaced(_))),
        "{:?}",
        fresh.program.pins()
    );
    assert_eq!(fresh.program.stats().fast[0], 0);
}

#[test]
fn without_pins_a_restart_starts_fresh() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program) ***\n");
        return;
    }
    enter_lb_namespace(&SERVERS, &CLIENTS, &GATEWAY_MAC);
    let config = config(4096);
    let before = Lb::start(&config, None);
    assert_eq!(
        before.kernel(&syn(40_001), before.clients_ifindex),
        Some(STAT_FAST_CLIENT_SYN)
    );
    drop(before);
    let after = Lb::start(&config, None);
    assert_eq!(
        after.kernel(&syn(40_001), after.clients_ifindex),
        Some(STAT_FAST_CLIENT_SYN),
        "what pinning keeps: without it the SYN is new again"
    );
}

/// Two processes on one pin directory would share, and clear, each other's words: the
/// second is refused before it loads anything, and the directory is free again once the
/// first lets go (a process's end does that, `kill -9` included).
#[test]
fn a_pin_directory_is_held_by_one_lb_at_a_time() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (mounts bpffs) ***\n");
        return;
    }
    let bpffs = TempBpffs::mount();
    let pins = PinDir::new(bpffs.join("lb")).unwrap().for_key("key");
    let first = pins.lock().unwrap();
    let second = pins
        .lock()
        .err()
        .expect("a second lock is refused")
        .to_string();
    assert!(
        second.starts_with("daemon.bpf_pin_dir:") && second.contains("is in use by another"),
        "{second}"
    );
    let other = PinDir::new(bpffs.join("other")).unwrap().for_key("key");
    other.lock().expect("another directory is free");
    drop(first);
    // The lock belongs to the open directory, which a child forked by another test's
    // thread holds too until it execs (microseconds): retried for up to a second.
    let again = (0..100).find_map(|_| {
        let lock = pins.lock().ok();
        if lock.is_none() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        lock
    });
    assert!(again.is_some(), "free again once the first is dropped");
}
