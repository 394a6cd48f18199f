//! Building the plan's namespaces, veths, bridge, addresses, routes and sysctls, and
//! checking that packets get through.

use std::path::Path;

use anyhow::Context;
use cheetah_core::config::Forwarding;

use std::net::Ipv4Addr;

use super::netns::{self, ip};
use super::plan::{Endpoint, Topology, Veth, CLIENT_NET};
use super::pool;
use super::shell::Cmd;
use super::veth_xdp;

pub fn build(topo: &Topology) -> anyhow::Result<()> {
    for namespace in topo.namespaces() {
        netns::add(namespace)?;
    }
    // Before any veth exists, so that `default` settings reach every interface.
    set_sysctls(topo)?;
    let veths = topo.veths();
    for veth in &veths {
        create_veth(veth)?;
    }
    build_bridge(topo)?;
    for end in veths.iter().flat_map(|v| [&v.a, &v.b]) {
        configure_end(end)?;
    }
    // After configure_end turned GRO off everywhere: the LB's XDP program transmits and
    // redirects frames, which a veth delivers only to a peer running NAPI (veth_xdp.rs).
    veth_xdp::enable_napi_on_lb_peers(topo)?;
    add_routes(topo)?;
    Ok(())
}

fn set_sysctls(topo: &Topology) -> anyhow::Result<()> {
    // rp_filter off: new namespaces may inherit the host's setting, and in l2 forwarding
    // the LB's stack sees server replies from the VIP, to which it has no route, so
    // reverse-path filtering would drop whatever of them reaches the kernel.
    let mut common = vec![
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.default.rp_filter", "0"),
    ];
    // No IPv6: router solicitations and MLD reports would otherwise reach the LB's ports and
    // show up in its counters and in every capture.
    if Path::new("/proc/sys/net/ipv6").exists() {
        common.push(("net.ipv6.conf.all.disable_ipv6", "1"));
        common.push(("net.ipv6.conf.default.disable_ipv6", "1"));
    }
    // A veth hands a packet to the receive queue its sender's socket hash names, and by
    // default Linux draws a new hash at every retransmission timeout, so a flow would hop
    // to another LB worker with its original still queued on the first (late copies,
    // docs/timestamps.md). A NIC's RSS hashes the 5-tuple and keeps a flow on one queue.
    if Path::new("/proc/sys/net/core/txrehash").exists() {
        common.push(("net.core.txrehash", "0"));
    }
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut all = common.clone();
        all.extend_from_slice(extra);
        all
    };

    // The LB host is not a router: packets for the servers' own addresses must not get
    // through it (`cheetah run` turns forwarding on for lo only, which its XDP program's
    // FIB lookups name). Said explicitly because a new namespace inherits the host's
    // ip_forward, which is 1 on many machines (Docker, libvirt).
    for lb in topo.lbs() {
        netns::sysctl(&lb.namespace, &with(&[("net.ipv4.ip_forward", "0")]))?;
    }
    // ECMP by the L4 hash (addresses and ports), as routers in front of LB instances do:
    // the default hashes addresses alone, which would send every connection of a client
    // through one instance, and every reply of a server through one.
    let l4_hash = ("net.ipv4.fib_multipath_hash_policy", "1");
    netns::sysctl(
        &topo.router.namespace,
        &with(&[("net.ipv4.ip_forward", "1"), l4_hash]),
    )?;

    let mut switch = Vec::new();
    // br_netfilter is loaded on these machines; in each new namespace it defaults to passing
    // bridged frames through iptables, so turn it off here as well as on the bridge.
    if Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists() {
        switch.extend([
            ("net.bridge.bridge-nf-call-iptables", "0"),
            ("net.bridge.bridge-nf-call-ip6tables", "0"),
            ("net.bridge.bridge-nf-call-arptables", "0"),
        ]);
    }
    netns::sysctl(&topo.switch.namespace, &with(&switch))?;

    let mut server = vec![
        // One clock per server rather than per connection: the LB corrects the timestamps
        // it rewrites by a per-server offset.
        ("net.ipv4.tcp_timestamps", "2"),
        l4_hash,
    ];
    if topo.forwarding == Forwarding::L2 {
        // Servers hold the VIP on lo and must not answer ARP for it.
        server.push(("net.ipv4.conf.all.arp_ignore", "1"));
        server.push(("net.ipv4.conf.all.arp_announce", "2"));
    }
    for s in &topo.servers {
        netns::sysctl(&s.namespace, &with(&server))?;
    }
    for c in &topo.clients {
        if c.timestamps {
            netns::sysctl(&c.namespace, &common)?;
        } else {
            // A client without timestamps, as Windows' default: its SYN offers none.
            netns::sysctl(&c.namespace, &with(&[("net.ipv4.tcp_timestamps", "0")]))?;
        }
    }
    Ok(())
}

/// Creates the pair with each end directly in its namespace, so no name ever appears in
/// the root namespace (where it could clash with another testbed's or the host's).
fn create_veth(veth: &Veth) -> anyhow::Result<()> {
    let queues = veth.queues.to_string();
    let end_options = |end: &Endpoint| {
        let mut words = Vec::new();
        if let Some(mac) = &end.mac {
            words.extend(["address".to_string(), mac.clone()]);
        }
        words.extend([
            "numtxqueues".to_string(),
            queues.clone(),
            "numrxqueues".to_string(),
            queues.clone(),
        ]);
        words
    };
    ip(&veth.a.namespace)
        .args(["link", "add", &veth.a.interface])
        .args(end_options(&veth.a))
        .args(["type", "veth", "peer", "name", &veth.b.interface])
        .args(end_options(&veth.b))
        .args(["netns", &veth.b.namespace])
        .run()?;
    Ok(())
}

fn build_bridge(topo: &Topology) -> anyhow::Result<()> {
    let sw = &topo.switch;
    ip(&sw.namespace)
        .args(["link", "add", &sw.bridge, "type", "bridge"])
        .args(["nf_call_iptables", "0", "nf_call_ip6tables", "0"])
        .args(["nf_call_arptables", "0"])
        .run()?;
    let lb_ports = topo.lbs().map(|lb| &lb.switch_port);
    for port in lb_ports.chain(&sw.server_ports) {
        ip(&sw.namespace)
            .args(["link", "set", &port.interface, "master", &sw.bridge])
            .run()?;
    }
    ip(&sw.namespace)
        .args(["link", "set", &sw.bridge, "up"])
        .run()?;
    Ok(())
}

fn configure_end(end: &Endpoint) -> anyhow::Result<()> {
    if let Some(cidr) = end.cidr() {
        ip(&end.namespace)
            .args(["addr", "add", &cidr, "dev", &end.interface])
            .run()?;
    }
    // Without this, the TCP stack hands veths 64 KB GSO frames with partial checksums, which
    // the LB would have to segment and checksum itself. Harmless on the LB's own ports.
    Cmd::in_netns(&end.namespace, "ethtool")
        .args(["-K", &end.interface])
        .args(["tx", "off", "tso", "off", "gso", "off", "gro", "off"])
        .run()?;
    ip(&end.namespace)
        .args(["link", "set", &end.interface, "up"])
        .run()?;
    Ok(())
}

fn add_routes(topo: &Topology) -> anyhow::Result<()> {
    let route = |namespace: &str, net: String, via: String| {
        ip(namespace)
            .args(["route", "add", &net, "via", &via])
            .run()
    };
    for lb in topo.lbs() {
        let router_address = lb.router_side.address.expect("rt-lb has an address");
        route(
            &lb.namespace,
            format!("{}/{}", CLIENT_NET.0, CLIENT_NET.1),
            router_address.to_string(),
        )?;
    }
    // One instance is in the router's pool from the start, as before there were several;
    // several join it one by one when ready (`cheetah testbed lb join`).
    if topo.more_lbs.is_empty() {
        pool::set(topo, &[topo.lb.next_hop()])?;
    }
    for c in &topo.clients {
        route(&c.namespace, "default".into(), c.gateway.to_string())?;
    }
    // Replies leave through any instance, whichever took the client's packets.
    let gateways: Vec<String> = topo
        .lbs()
        .map(|lb| {
            lb.server_side
                .address
                .expect("lb-s has an address")
                .to_string()
        })
        .collect();
    for s in &topo.servers {
        ip(&s.namespace)
            .args(["route", "add", "default"])
            .args(pool::next_hop_words(&gateways))
            .run()?;
        if topo.forwarding == Forwarding::L2 {
            ip(&s.namespace)
                .args(["addr", "add", &format!("{}/32", topo.vip), "dev", "lo"])
                .run()?;
        }
    }
    Ok(())
}

/// Pings every segment once: the router reaches every LB instance, each client reaches the
/// first (clients behind the router through it), and each server reaches every instance's
/// server side on the bridge.
pub fn check_reachability(topo: &Topology) -> anyhow::Result<()> {
    let lb_client_side = topo.lb.next_hop();
    let mut probes: Vec<(&str, Ipv4Addr)> = topo
        .lbs()
        .map(|lb| (topo.router.namespace.as_str(), lb.next_hop()))
        .collect();
    for c in &topo.clients {
        let target = if c.index == 0 {
            c.gateway
        } else {
            lb_client_side
        };
        probes.push((&c.namespace, target));
    }
    for s in &topo.servers {
        for lb in topo.lbs() {
            probes.push((
                &s.namespace,
                lb.server_side.address.expect("lb-s has an address"),
            ));
        }
    }
    for (namespace, target) in probes {
        Cmd::in_netns(namespace, "ping")
            .args(["-c", "1", "-W", "2", "-q", &target.to_string()])
            .run()
            .with_context(|| format!("{namespace} cannot reach {target}"))?;
    }
    Ok(())
}
