//! What the LB's in-kernel path needs of the testbed's veths, and the check that it got it.
//!
//! The XDP program sends packets back out (XDP_TX) or out of the LB's other port
//! (`bpf_redirect`). On a veth, such a frame is handed straight to the peer's receive
//! queue, which exists only while the peer runs NAPI: an XDP program on the peer, or GRO
//! turned on there. Without it the veth drops the frame and only counts it, in its
//! `ethtool -S` XDP error counters: connections would stall with nothing in any log. So
//! `up` turns GRO on at every peer of an LB port, and `down` and `status` read those
//! counters on the LB's ports.
//!
//! The same counters also count frames the peer's 256-frame ring had no room for: the
//! ring is the bottleneck queue of a bulk TCP transfer through the LB, which congestion
//! control fills until it drops (measured: 40 parallel 32 MiB downloads through the nat
//! testbed lost 0.5% of the frames redirected toward the router; the smoke test's
//! transfers between 0 and 0.01%). A port without NAPI at its peer loses every frame. So
//! `down` fails when a port lost more than [`MAX_DROP_PERCENT`] of what its XDP program
//! sent that way, and reports smaller losses without failing; `status` shows both.

use super::netns;
use super::plan::{role_of, Endpoint, Role, Topology};
use super::shell::Cmd;

/// `ethtool -S` counters of a veth that count frames its XDP program sent back (XDP_TX) or
/// redirected, and that were lost: per queue, `rx_queue_<n>_xdp_tx_errors` and
/// `tx_queue_<n>_xdp_xmit_errors` (the peer's ring was full), and `rx_queue_<n>_drops`
/// (the frame could not leave at all: a redirect or XDP_TX toward a veth whose peer runs
/// no NAPI fails at once, which is the count that moves when GRO is off at the peer;
/// seen on Linux 6.18). Not `rx_queue_<n>_xdp_drops`: the program's own XDP_DROP.
const DROP_COUNTER_SUFFIXES: [&str; 3] = ["_xdp_tx_errors", "_xdp_xmit_errors", "_drops"];
/// The counters of the frames that got through the same ways.
const SENT_COUNTER_SUFFIXES: [&str; 3] = ["_xdp_tx", "_xdp_xmit", "_xdp_redirect"];

/// More lost than this share of a port's XDP transmits is no congestion: the peer cannot
/// receive them. A peer without NAPI loses all or nearly all (75 of 80 measured);
/// congestion loses a few percent at most: the AF_XDP smoke test's `kill -9` under bulk
/// downloads, every frame redirected to a copy-mode socket whose ring the workers drain,
/// lost 1.01% (52,056 of 5,143,770) in one CI run, which a 1% bound failed.
pub const MAX_DROP_PERCENT: u64 = 10;

/// Turns GRO on at the far end of every LB port (the router's, the switch's and client
/// 0's side), so that frames the LB's XDP program transmits or redirects are received.
pub fn enable_napi_on_lb_peers(topo: &Topology) -> anyhow::Result<()> {
    for peer in lb_peers(topo) {
        Cmd::in_netns(&peer.namespace, "ethtool")
            .args(["-K", &peer.interface, "gro", "on"])
            .run()?;
    }
    Ok(())
}

/// The other end of each veth that has an LB port at one end.
fn lb_peers(topo: &Topology) -> Vec<Endpoint> {
    let lb_namespaces: Vec<&str> = topo.lbs().map(|lb| lb.namespace.as_str()).collect();
    topo.veths()
        .into_iter()
        .filter(|veth| lb_namespaces.contains(&veth.a.namespace.as_str()))
        .map(|veth| veth.b)
        .collect()
}

/// An LB port that lost frames its XDP program transmitted or redirected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpDrops {
    pub namespace: String,
    pub interface: String,
    pub dropped: u64,
    /// Frames that got through the same way.
    pub sent: u64,
}

impl XdpDrops {
    /// More lost than [`MAX_DROP_PERCENT`]: the peer does not receive (no NAPI there),
    /// rather than congestion.
    pub fn is_failure(&self) -> bool {
        self.dropped * 100 > MAX_DROP_PERCENT * (self.dropped + self.sent)
    }
}

impl std::fmt::Display for XdpDrops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {} of {} XDP transmits dropped",
            self.namespace,
            self.interface,
            self.dropped,
            self.dropped + self.sent
        )
    }
}

/// Every veth of testbed `prefix`'s LB namespaces that lost XDP transmits.
pub fn drops(prefix: &str) -> anyhow::Result<Vec<XdpDrops>> {
    let mut found = Vec::new();
    for namespace in netns::list(prefix)? {
        if !matches!(role_of(prefix, &namespace), Some(Role::Lb(_))) {
            continue;
        }
        let links = Cmd::in_netns(&namespace, "ip")
            .args(["-o", "link", "show", "type", "veth"])
            .run()?;
        for interface in veth_names(&links) {
            let stats = Cmd::in_netns(&namespace, "ethtool")
                .args(["-S", &interface])
                .run()?;
            let (dropped, sent) = xdp_transmits(&stats);
            if dropped > 0 {
                found.push(XdpDrops {
                    namespace: namespace.clone(),
                    interface,
                    dropped,
                    sent,
                });
            }
        }
    }
    Ok(found)
}

/// Interface names from `ip -o link show` (`3: lb-c@if2: <...> ...`).
fn veth_names(links: &str) -> Vec<String> {
    links
        .lines()
        .filter_map(|line| line.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .collect()
}

/// (dropped, sent) XDP transmits of an `ethtool -S` listing, summed over queues.
fn xdp_transmits(stats: &str) -> (u64, u64) {
    let sum = |suffixes: &[&str]| -> u64 {
        stats
            .lines()
            .filter_map(|line| {
                let (name, value) = line.trim().split_once(':')?;
                let count: u64 = value.trim().parse().ok()?;
                let counted =
                    suffixes.iter().any(|s| name.ends_with(s)) && !name.ends_with("_xdp_drops");
                counted.then_some(count)
            })
            .sum()
    };
    (sum(&DROP_COUNTER_SUFFIXES), sum(&SENT_COUNTER_SUFFIXES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_and_transmits_are_summed_over_queues() {
        let stats = "NIC statistics:
     peer_ifindex: 2
     rx_queue_0_xdp_packets: 10
     rx_queue_0_xdp_bytes: 1000
     rx_queue_0_drops: 32
     rx_queue_0_xdp_redirect: 3
     rx_queue_0_xdp_drops: 9
     rx_queue_0_xdp_tx: 4
     rx_queue_0_xdp_tx_errors: 3
     rx_queue_1_xdp_tx_errors: 0
     tx_queue_0_xdp_xmit: 7
     tx_queue_1_xdp_xmit_errors: 5
";
        assert_eq!(xdp_transmits(stats), (32 + 3 + 5, 3 + 4 + 7));
    }

    #[test]
    fn losing_more_than_ten_percent_is_a_failure_not_congestion() {
        let port = |dropped, sent| XdpDrops {
            namespace: "t1-lb".into(),
            interface: "lb-c".into(),
            dropped,
            sent,
        };
        assert!(port(222, 3_000_000).to_string().contains("222 of 3000222"));
        assert!(!port(222, 3_000_000).is_failure(), "congestion at the ring");
        assert!(
            !port(52_056, 5_091_714).is_failure(),
            "AF_XDP ring under bulk downloads"
        );
        assert!(!port(10, 90).is_failure());
        assert!(port(11, 89).is_failure());
        assert!(port(75, 5).is_failure(), "GRO off at the peers");
        assert!(
            port(50, 0).is_failure(),
            "no NAPI at the peer: nothing gets through"
        );
    }

    #[test]
    fn veth_names_drop_the_peer_suffix() {
        let links =
            "3: lb-c@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP\n\
                     5: lb-s@if4: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500\n";
        assert_eq!(veth_names(links), ["lb-c", "lb-s"]);
    }

    #[test]
    fn every_lb_port_has_its_peer_listed() {
        let options = super::super::Options {
            prefix: "t1".into(),
            ..Default::default()
        };
        let topo = Topology::plan(&options).unwrap();
        let peers = lb_peers(&topo);
        let lb = &topo.lb;
        assert!(peers.contains(&lb.router_side));
        assert!(peers.contains(&lb.switch_port));
        assert!(peers.iter().all(|p| p.namespace != lb.namespace));
    }
}
