//! What the LB's in-kernel path needs of the testbed's veths, and the check that it got it.
//!
//! The XDP program sends packets back out (XDP_TX) or out of the LB's other port
//! (`bpf_redirect`). On a veth, such a frame is handed straight to the peer's receive
//! queue, which exists only while the peer runs NAPI: an XDP program on the peer, or GRO
//! turned on there. Without it the veth drops the frame and only counts it, in its
//! `ethtool -S` XDP error counters: connections would stall with nothing in any log. So
//! `up` turns GRO on at every peer of an LB port, and `down` and `status` read those
//! counters on the LB's ports and fail (or warn) on any.

use super::netns;
use super::plan::{role_of, Endpoint, Role, Topology};
use super::shell::Cmd;

/// `ethtool -S` counters of a veth that count frames its XDP program sent (XDP_TX) or had
/// redirected through it and the peer dropped: per queue, `rx_queue_<n>_xdp_tx_errors`
/// and `tx_queue_<n>_xdp_xmit_errors`.
const DROP_COUNTER_SUFFIXES: [&str; 2] = ["_xdp_tx_errors", "_xdp_xmit_errors"];

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

/// One nonzero XDP drop counter of an LB port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpDrop {
    pub namespace: String,
    pub interface: String,
    pub counter: String,
    pub count: u64,
}

impl std::fmt::Display for XdpDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {} = {}",
            self.namespace, self.interface, self.counter, self.count
        )
    }
}

/// Every nonzero XDP drop counter on the veths of testbed `prefix`'s LB namespaces.
pub fn drops(prefix: &str) -> anyhow::Result<Vec<XdpDrop>> {
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
            found.extend(drop_counters(&stats).map(|(counter, count)| XdpDrop {
                namespace: namespace.clone(),
                interface: interface.clone(),
                counter,
                count,
            }));
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

/// The nonzero XDP drop counters of an `ethtool -S` listing.
fn drop_counters(stats: &str) -> impl Iterator<Item = (String, u64)> + '_ {
    stats.lines().filter_map(|line| {
        let (name, value) = line.trim().split_once(':')?;
        let count: u64 = value.trim().parse().ok()?;
        (count > 0 && DROP_COUNTER_SUFFIXES.iter().any(|s| name.ends_with(s)))
            .then(|| (name.to_string(), count))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_nonzero_xdp_error_counters_are_drops() {
        let stats = "NIC statistics:
     peer_ifindex: 2
     rx_queue_0_xdp_packets: 10
     rx_queue_0_xdp_tx: 4
     rx_queue_0_xdp_tx_errors: 3
     rx_queue_1_xdp_tx_errors: 0
     tx_queue_0_xdp_xmit: 7
     tx_queue_1_xdp_xmit_errors: 5
";
        let drops: Vec<(String, u64)> = drop_counters(stats).collect();
        assert_eq!(
            drops,
            [
                ("rx_queue_0_xdp_tx_errors".to_string(), 3),
                ("tx_queue_1_xdp_xmit_errors".to_string(), 5)
            ]
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
