//! Server closes booked in the kernel (bpf/lib/closes.h) against the core's bookkeeping,
//! with the real program (loaded, not attached; needs root) in a network namespace of the
//! test thread's own:
//!
//! * the kernel and the core's `CloseFilter` share one filter, the program's mmapped
//!   `closes` words, as in `cheetah run`: a close counted on one side is a duplicate on
//!   the other, whichever side sees it first;
//! * a close the kernel counted reaches `SharedLoads` through the daemon's fold
//!   (`dataplane::kernel_loads::KernelLoads`), as the core's counted close does: one active connection down,
//!   clamped at 0.

use std::path::Path;

use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::hash::Secret;
use cheetah_core::lb::{Counter, Ingress, Worker, WorkerConfig};
use cheetah_core::policy::{PolicyKind, ReportedLoad};
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{self, options, TcpFrame};
use cheetah_core::types::{Mac, ServerId, NANOS_PER_SEC};
use cheetah_core::verdict::Verdict;
use cheetah_core::wire::tcp::flags::{ACK, FIN, RST};
use cheetah_daemon::dataplane::kernel_loads::KernelLoads;
use cheetah_daemon::dataplane::xdp::SteeringProgram;
use cheetah_daemon::dataplane::xdp_tables::{wanted, Publication, Publisher};

#[path = "shared/root.rs"]
mod root;
use root::is_root;
#[path = "shared/ip_command.rs"]
mod ip_command;
#[path = "shared/lb_namespace.rs"]
mod lb_namespace;
use lb_namespace::{enter_lb_namespace, interface, Veth};

const SERVERS: Veth = Veth {
    name: "xc-srv",
    mac: [0x02, 0x1c, 0x00, 0x00, 0x00, 0x05],
    peer: "xc-srv-p",
};
const CLIENTS: Veth = Veth {
    name: "xc-cli",
    mac: [0x02, 0x1c, 0x00, 0x00, 0x00, 0x0c],
    peer: "xc-cli-p",
};
const GATEWAY_MAC: Mac = [0x02, 0xc9, 0x00, 0x00, 0x00, 0x01];
const XDP_REDIRECT: u32 = 4;
const SERVER: ServerId = ServerId(2);
/// The server's clock: its TSval's MSB, known to the LB, so the kernel takes its replies.
const MSB: u16 = 0x1234;
const NOW: u64 = 10 * NANOS_PER_SEC;

/// The program, the core's pipeline over its clock and close words, its maps published.
struct Lb {
    program: SteeringProgram,
    plane: ControlPlane,
    worker: Worker,
    servers_ifindex: u32,
}

impl Lb {
    fn new() -> Self {
        enter_lb_namespace(&SERVERS, &CLIENTS, &GATEWAY_MAC);
        let config = testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 3);
        let program = SteeringProgram::load(config.fallback_table_capacity)
            .expect("the verifier refused bpf/xdp_lb.c");
        let words = program.kernel_words().unwrap();
        let closes = program.close_words().unwrap();
        let mut plane = ControlPlane::new_with_tables(&config, &Secret([7; 16]), &|layout, _| {
            words.tables(layout)
        })
        .unwrap();
        assert!(plane.share_closes(closes.filter()).is_ok());
        plane
            .shared()
            .msb
            .import(&[(SERVER, u32::from(MSB) << 16)], 0);
        let servers = interface(&SERVERS, 0);
        let clients = interface(&CLIENTS, 1);
        program.set_interface_slot(servers.ifindex, 0).unwrap();
        program.set_interface_slot(clients.ifindex, 1).unwrap();
        let snapshot = plane.shared().snapshot.load();
        let publication = Publication {
            snapshot: &snapshot,
            layout: plane.layout(),
            interfaces: &[servers.clone(), clients],
            sides: &[Ingress::ServerSide, Ingress::ClientSide],
            fast_path: true,
            fallback_sets: plane.shared().fallback.sets(),
        };
        // This thread's namespace's tables: /proc/net is the process's first thread's.
        let read = |path: &str| std::fs::read_to_string(Path::new(path)).unwrap();
        let routes = read("/proc/thread-self/net/route");
        let neighbours = read("/proc/thread-self/net/arp");
        Publisher::new()
            .write(&program, wanted(&publication, &routes, &neighbours))
            .unwrap();
        let worker = Worker::new(
            plane.shared().clone(),
            WorkerConfig::new(0, 1, plane.config()),
        );
        Lb {
            program,
            plane,
            worker,
            servers_ifindex: servers.ifindex,
        }
    }

    /// The kernel's run of `frame`, which must handle it: how much each close stat moved
    /// (`FAST_EVENTS` order: first, duplicate).
    fn kernel(&self, frame: &[u8]) -> [u64; 2] {
        let before = self.program.stats().events;
        let (action, _) = self.program.test_run(frame, self.servers_ifindex).unwrap();
        assert_eq!(action, XDP_REDIRECT, "the kernel handles the close");
        let after = self.program.stats().events;
        [after[0] - before[0], after[1] - before[1]]
    }

    /// The core's run of `frame`: its `server_closes` and `duplicate_closes` moves.
    fn core(&mut self, frame: &[u8]) -> [u64; 2] {
        let counters = std::sync::Arc::clone(self.worker.counters());
        let get = || {
            [
                counters.get(Counter::ServerCloses),
                counters.get(Counter::DuplicateCloses),
            ]
        };
        let before = get();
        let mut packet = frame.to_vec();
        assert_eq!(
            self.worker.process(&mut packet, NOW, Ingress::ServerSide),
            Verdict::ToClient
        );
        let after = get();
        [after[0] - before[0], after[1] - before[1]]
    }

    fn closed_in_kernel(&self) -> u64 {
        self.program.server_traffic(&[SERVER]).unwrap()[0].closed
    }
}

/// Server 2's segment with `flags` on the connection of `client_port`, at `seq`.
fn reply(client_port: u16, flags: u8, seq: u32, low: u16) -> Vec<u8> {
    TcpFrame {
        seq,
        ..TcpFrame::from_server_l2(
            SERVER.0,
            testkit::client_ip(9),
            client_port,
            flags,
            options::nop_nop_ts(u32::from(MSB) << 16 | u32::from(low), 77),
        )
    }
    .build()
}

const FIRST: [u64; 2] = [1, 0];
const DUPLICATE: [u64; 2] = [0, 1];

#[test]
fn a_close_counted_on_one_side_is_a_duplicate_on_the_other() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program, makes a namespace) ***\n");
        return;
    }
    let mut lb = Lb::new();

    // The kernel sees the FIN first; the core its retransmission and the RST after it.
    let fin = reply(40_001, FIN | ACK, 5000, 1);
    assert_eq!(lb.kernel(&fin), FIRST);
    assert_eq!(lb.closed_in_kernel(), 1);
    assert_eq!(
        lb.core(&fin),
        DUPLICATE,
        "the kernel's close, seen by the core"
    );
    assert_eq!(lb.core(&reply(40_001, RST | ACK, 5001, 2)), DUPLICATE);

    // The core sees the FIN first; the kernel its retransmission and the RST after it.
    let fin = reply(40_002, FIN | ACK, 9000, 3);
    assert_eq!(lb.core(&fin), FIRST);
    assert_eq!(
        lb.kernel(&fin),
        DUPLICATE,
        "the core's close, seen by the kernel"
    );
    assert_eq!(lb.kernel(&reply(40_002, RST | ACK, 9001, 4)), DUPLICATE);
    assert_eq!(lb.closed_in_kernel(), 1, "the kernel counted no duplicate");

    // A new connection on the same ports closes anew, on either side.
    assert_eq!(lb.kernel(&reply(40_002, FIN | ACK, 123_456, 5)), FIRST);
    assert_eq!(lb.closed_in_kernel(), 2);
}

#[test]
fn a_close_counted_in_the_kernel_lowers_the_servers_active_count_through_the_fold() {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program, makes a namespace) ***\n");
        return;
    }
    let mut lb = Lb::new();
    let loads = std::sync::Arc::clone(&lb.plane.shared().loads);
    let report = |active| ReportedLoad {
        load: None,
        active_connections: Some(active),
    };
    loads.report(SERVER, report(5)).unwrap();
    let mut fold = KernelLoads::new(std::sync::Arc::clone(&loads));

    for (port, seq) in [(40_010, 1), (40_011, 2)] {
        assert_eq!(lb.kernel(&reply(port, FIN | ACK, seq, 0)), FIRST);
    }
    // A duplicate the kernel saw, and one the core counted: neither is folded.
    assert_eq!(lb.kernel(&reply(40_010, FIN | ACK, 1, 0)), DUPLICATE);
    let before = loads.server(SERVER);
    fold.fold(&lb.program, lb.plane.shared()).unwrap();
    let after = loads.server(SERVER);
    assert_eq!(
        after.active_connections, 3,
        "two closes counted in the kernel: 5 - 2"
    );
    assert_eq!(
        after.packets - before.packets,
        3,
        "its packets are folded too"
    );

    // Folded once: the next fold adds only what the counters grew by since.
    fold.fold(&lb.program, lb.plane.shared()).unwrap();
    assert_eq!(loads.server(SERVER).active_connections, 3);

    // Clamped at 0, as a worker's merged closes are.
    loads.report(SERVER, report(0)).unwrap();
    assert_eq!(lb.kernel(&reply(40_012, FIN | ACK, 3, 0)), FIRST);
    fold.fold(&lb.program, lb.plane.shared()).unwrap();
    assert_eq!(loads.server(SERVER).active_connections, 0);
    loads.report(SERVER, report(1)).unwrap();
    assert_eq!(lb.core(&reply(40_013, FIN | ACK, 4, 0)), FIRST);
    assert_eq!(lb.kernel(&reply(40_013, FIN | ACK, 4, 0)), DUPLICATE);
    fold.fold(&lb.program, lb.plane.shared()).unwrap();
    assert_eq!(
        loads.server(SERVER).active_connections,
        1,
        "the core's close is the worker's to merge; the kernel's duplicate is not folded"
    );
}
