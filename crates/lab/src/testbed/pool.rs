//! The router's pool of LB instances: its route to the VIPs' net, with one ECMP next hop per
//! instance in the pool (the router hashes each connection's addresses and ports onto one).
//! The route itself is the record of who is in the pool: nothing else is kept.

use std::net::Ipv4Addr;

use anyhow::Context;
use serde::Deserialize;

use super::netns::ip;
use super::plan::{Lb, Topology, VIP_NET};

/// The parts of `ip -j route show` read here: one next hop is `gateway`, several are
/// `nexthops`.
#[derive(Deserialize)]
struct Route {
    #[serde(default)]
    gateway: Option<Ipv4Addr>,
    #[serde(default)]
    nexthops: Vec<NextHop>,
}

#[derive(Deserialize)]
struct NextHop {
    gateway: Ipv4Addr,
}

fn vip_net() -> String {
    format!("{}/{}", VIP_NET.0, VIP_NET.1)
}

/// The instances in the router's pool, in instance order.
pub fn members(topo: &Topology) -> anyhow::Result<Vec<&Lb>> {
    let out = ip(&topo.router.namespace)
        .args(["-j", "route", "show", "exact", &vip_net()])
        .run()?;
    let routes: Vec<Route> = serde_json::from_str(&out)
        .with_context(|| format!("cannot read the router's route to {}: {out}", vip_net()))?;
    let hops: Vec<Ipv4Addr> = routes
        .iter()
        .flat_map(|r| {
            r.gateway
                .into_iter()
                .chain(r.nexthops.iter().map(|h| h.gateway))
        })
        .collect();
    Ok(topo
        .lbs()
        .filter(|lb| hops.contains(&lb.next_hop()))
        .collect())
}

/// Makes the pool exactly `next_hops` (none: the route goes, and the router answers the
/// VIPs' net unreachable).
pub fn set(topo: &Topology, next_hops: &[Ipv4Addr]) -> anyhow::Result<()> {
    let router = &topo.router.namespace;
    if next_hops.is_empty() {
        if !members(topo)?.is_empty() {
            ip(router).args(["route", "del", &vip_net()]).run()?;
        }
        return Ok(());
    }
    let words: Vec<String> = next_hops.iter().map(Ipv4Addr::to_string).collect();
    ip(router)
        .args(["route", "replace", &vip_net()])
        .args(next_hop_words(&words))
        .run()
        .with_context(|| format!("cannot set the router's pool to {}", words.join(" ")))?;
    Ok(())
}

/// `via A` for one gateway, `nexthop via A nexthop via B ...` for several (ECMP).
pub fn next_hop_words(gateways: &[String]) -> Vec<String> {
    match gateways {
        [one] => vec!["via".into(), one.clone()],
        several => several
            .iter()
            .flat_map(|g| ["nexthop".into(), "via".into(), g.clone()])
            .collect(),
    }
}

/// Adds instance `lb` to the pool (no change if it is in). The next hops stay in instance
/// order, so an instance that leaves and joins again gets the same share of connections.
pub fn join(topo: &Topology, lb: &Lb) -> anyhow::Result<()> {
    let members = members(topo)?;
    let pool: Vec<Ipv4Addr> = topo
        .lbs()
        .filter(|l| l.instance == lb.instance || members.iter().any(|m| m.instance == l.instance))
        .map(Lb::next_hop)
        .collect();
    set(topo, &pool)
}

/// Takes instance `lb` out of the pool (no change if it is not in).
pub fn leave(topo: &Topology, lb: &Lb) -> anyhow::Result<()> {
    let pool: Vec<Ipv4Addr> = members(topo)?
        .into_iter()
        .filter(|l| l.instance != lb.instance)
        .map(Lb::next_hop)
        .collect();
    set(topo, &pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gateway_is_a_plain_route_several_are_ecmp() {
        let one = next_hop_words(&["10.20.0.1".into()]);
        assert_eq!(one, ["via", "10.20.0.1"]);
        let two = next_hop_words(&["10.20.0.1".into(), "10.20.0.2".into()]);
        assert_eq!(
            two,
            ["nexthop", "via", "10.20.0.1", "nexthop", "via", "10.20.0.2"]
        );
    }

    #[test]
    fn reads_both_shapes_of_the_route() {
        let single: Vec<Route> = serde_json::from_str(
            r#"[{"dst":"10.99.0.0/24","gateway":"10.10.1.2","dev":"rt-lb","flags":[]}]"#,
        )
        .unwrap();
        assert_eq!(single[0].gateway, Some(Ipv4Addr::new(10, 10, 1, 2)));
        let ecmp: Vec<Route> = serde_json::from_str(
            r#"[{"dst":"10.99.0.0/24","flags":[],"nexthops":[{"gateway":"10.10.1.2","dev":"rt-lb","weight":1,"flags":[]},{"gateway":"10.10.2.2","dev":"rt-lb2","weight":1,"flags":[]}]}]"#,
        )
        .unwrap();
        let hops: Vec<Ipv4Addr> = ecmp[0].nexthops.iter().map(|h| h.gateway).collect();
        assert_eq!(
            hops,
            [Ipv4Addr::new(10, 10, 1, 2), Ipv4Addr::new(10, 10, 2, 2)]
        );
        let empty: Vec<Route> = serde_json::from_str("[]").unwrap();
        assert!(empty.is_empty());
    }
}
