//! The XDP program run on `lo` alone, for the root tests that need no namespace of their
//! own (included by path, `#[path]`): its interface, routes that send everything there,
//! and the program's counters.

use cheetah_daemon::dataplane::xdp::SteeringProgram;
use cheetah_daemon::dataplane::Interface;
use libbpf_rs::{MapCore, MapFlags};

/// `enum xdp_action`.
pub const XDP_TX: u32 = 3;
pub const LOOPBACK: u32 = 1;
/// Every address routed through `lo`, as `/proc/net/route` prints a default route.
pub const ROUTES_VIA_LO: &str =
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
lo\t00000000\t00000000\t0001\t0\t0\t0\t00000000\t0\t0\t0
";

/// `lo` as the daemon discovers an interface.
pub fn lo() -> Interface {
    Interface {
        name: "lo".into(),
        ifindex: LOOPBACK,
        mac: [0; 6],
        slot: 0,
        queues: 1,
    }
}

/// The program's `stats` counter `index`, summed over CPUs.
pub fn stat(program: &SteeringProgram, index: u32) -> u64 {
    program
        .try_map("stats")
        .unwrap()
        .lookup_percpu(&index.to_ne_bytes(), MapFlags::ANY)
        .unwrap()
        .unwrap()
        .iter()
        .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap()))
        .sum()
}
