//! The AF_XDP worker's egress step (`worker_loop.rs`) applied to the core's output, so that
//! it compares with what the kernel sends: the core leaves the Ethernet addresses to that
//! step (included by path, `#[path]`, with `lb_topology.rs` and `xdp_kernel.rs`).

use cheetah_core::config::LbConfig;
use cheetah_core::types::parse_mac;
use cheetah_core::verdict::Verdict;

use super::lb_topology::{Port, Topology, GATEWAY_MAC};
use super::xdp_kernel::{XDP_REDIRECT, XDP_TX};

/// The XDP action and frame the worker's send amounts to for the core's `verdict` on a
/// packet that came in on `ingress`: toward a server, its MAC from the servers' interface;
/// toward the client, the FIB's answer (the client gateway's MAC) from the clients'
/// interface. Out of the interface it came in on is `XDP_TX`, out of another
/// `XDP_REDIRECT`. `None`: the verdict sends nothing out (drop, pass, copies to all servers).
pub fn after_egress(
    topology: &Topology,
    config: &LbConfig,
    ingress: Port,
    verdict: Verdict,
    core_out: &[u8],
) -> Option<(u32, Vec<u8>)> {
    let mut frame = core_out.to_vec();
    let (egress, dst) = match verdict {
        Verdict::ToServer(id) => {
            let server = config.servers.iter().find(|s| s.id == id.0)?;
            (topology.servers, parse_mac(server.mac.as_deref()?)?)
        }
        Verdict::ToClient => (topology.clients, GATEWAY_MAC),
        _ => return None,
    };
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&egress.mac);
    let action = if egress.ifindex == ingress.ifindex {
        XDP_TX
    } else {
        XDP_REDIRECT
    };
    Some((action, frame))
}
