//! The XDP program's `next_hops` map: the kernel's routes and neighbours mirrored as
//! IPv4 prefix -> (egress interface, MTU, destination MAC, source MAC), so that a server's
//! reply finds its next hop toward the client with one trie lookup and calls
//! `bpf_fib_lookup` only on a miss (bpf/lib/next_hop.h; docs/dataplane.md "Next hops").
//!
//! The map must never answer differently from the FIB. So it holds a positive entry only
//! where the answer is plain, and an "ask the FIB" entry (ifindex 0) at the prefix of every
//! route it does not mirror, so that a less specific positive entry never answers for it:
//!
//! * nothing at all unless the policy rules are the kernel's three defaults (local, main,
//!   default: no rule selects by source, mark or interface) and forwarding is on for `lo`
//!   (without it the FIB refuses every lookup, `BPF_FIB_LKUP_RET_FWD_DISABLED`);
//! * table local is looked up first, whatever its prefix lengths: each of its prefixes,
//!   and each main route inside one, asks the FIB;
//! * a main-table prefix with one unicast route through a gateway whose neighbour entry on
//!   the route's Ethernet interface is valid (REACHABLE, STALE, DELAY, PROBE or PERMANENT,
//!   as the FIB takes it): that neighbour's MAC,
//!   the interface's MAC and MTU. Anything else at a prefix (several routes or metrics,
//!   a TOS, a dead or link-down next hop, multipath, an MTU metric, encapsulation, an
//!   unresolved gateway, a blackhole, ...) asks the FIB;
//! * an on-link route (no gateway) has one MAC per host: its prefix asks the FIB, and each
//!   usable neighbour it covers gets a /32 entry, if that route is the neighbour's longest
//!   match and the neighbour is on the route's interface;
//! * a destination with a route exception (a learnt path MTU, which the FIB's MTU check
//!   uses) asks the FIB; and a packet longer than the entry's MTU takes the FIB path in
//!   the kernel, which answers FRAG_NEEDED as before.
//!
//! The mirror is refreshed on every routing change the kernel announces (links,
//! neighbours, addresses, routes, rules) and once a second whatever happens, which also
//! covers what the kernel does not announce (a sysctl, a route exception, a lost
//! notification: an overflow of the socket counts as a change).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use anyhow::Context;
use libbpf_rs::{MapCore, MapFlags};

use super::publish_window::PublishWindow;
use super::route_netlink::{KernelRoutes, Link, Neighbour, Route, RouteSocket, CHANGE_GROUPS};
use super::xdp::SteeringProgram;
use super::xdp_layout::{
    AddrKey, Encode, NextHop, NextHopKey, MAX_NEXT_HOPS, NEXT_HOP_FIB, NEXT_HOP_KNOWN,
    NEXT_HOP_ON_LINK, PUBLISH_COPIES,
};

const RT_TABLE_MAIN: u32 = 254;
const RT_TABLE_LOCAL: u32 = 255;
const RT_TABLE_DEFAULT: u32 = 253;
const RTN_UNICAST: u8 = 1;
const RTNH_F_DEAD: u32 = 1;
const RTNH_F_LINKDOWN: u32 = 16;
/// The neighbour states the mirror takes a MAC from: the FIB's (`NUD_VALID`) but NOARP,
/// which no Ethernet next hop has. DELAY and PROBE are a STALE entry the kernel is
/// confirming, which it does whenever it sends through one: leaving them out sent about
/// one reply in six to the FIB in the live smoke test, for the same MAC.
const NUD_USABLE: u16 = 0x02 /* REACHABLE */
    | 0x04 /* STALE */
    | 0x08 /* DELAY */
    | 0x10 /* PROBE */
    | 0x80 /* PERMANENT */;

/// "Ask bpf_fib_lookup".
const ASK_FIB: NextHop = NextHop {
    kind: NEXT_HOP_FIB,
    ifindex: 0,
    mtu: 0,
    dmac: [0; 6],
    smac: [0; 6],
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Prefix {
    addr: u32,
    len: u8,
}

impl Prefix {
    fn new(addr: Ipv4Addr, len: u8) -> Self {
        let len = len.min(32);
        Prefix {
            addr: u32::from(addr) & mask(len),
            len,
        }
    }

    fn contains(&self, addr: u32) -> bool {
        addr & mask(self.len) == self.addr
    }

    fn within(&self, outer: &Prefix) -> bool {
        self.len >= outer.len && outer.contains(self.addr)
    }

    fn key(&self) -> NextHopKey {
        NextHopKey {
            prefixlen: u32::from(self.len),
            copy: 0,
            addr: self.addr.to_be_bytes(),
        }
    }
}

fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    }
}

/// What a main-table prefix answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Known(NextHop),
    /// One on-link route through this interface: per-host MACs, from the neighbours.
    OnLink(u32),
    AskFib,
}

/// The wanted contents of the two maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mirror {
    /// `next_hops`: one entry per prefix of table local and of table main. Keyed by the
    /// prefix alone (`prefixlen` its own length, copy 0): [`in_copy`] makes the map's key.
    pub routes: BTreeMap<NextHopKey, NextHop>,
    /// `next_hop_hosts`: the on-link hosts with a usable neighbour entry.
    pub hosts: BTreeMap<[u8; 4], NextHop>,
}

impl Mirror {
    /// What the kernel's XDP program answers for `addr` (as next_hop.h looks it up,
    /// before the MTU check).
    pub fn lookup(&self, addr: Ipv4Addr) -> Option<NextHop> {
        let hop = self
            .routes
            .iter()
            .filter(|(k, _)| {
                Prefix::new(Ipv4Addr::from(k.addr), k.prefixlen as u8).contains(u32::from(addr))
            })
            .max_by_key(|(k, _)| k.prefixlen)
            .map(|(_, v)| *v)?;
        if hop.kind == NEXT_HOP_ON_LINK {
            return self.hosts.get(&addr.octets()).copied();
        }
        Some(hop)
    }
}

/// The `next_hops` key of prefix `prefix` (a [`Mirror`] key) in copy `copy` of the tables
/// (`bpf/lib/publish.h`): the copy's 32 bits come first.
pub fn in_copy(prefix: &NextHopKey, copy: u32) -> NextHopKey {
    NextHopKey {
        prefixlen: prefix.prefixlen + 32,
        copy,
        addr: prefix.addr,
    }
}

/// The copy of the tables a key of `next_hops` or `next_hop_hosts` is in (both keys'
/// second word).
fn copy_of(key: &[u8]) -> u32 {
    u32::from_ne_bytes(key[4..8].try_into().unwrap())
}

/// The maps' wanted contents for this state of the kernel's routing.
pub fn mirror(kernel: &KernelRoutes, loopback_forwards: bool) -> Mirror {
    let mut entries = BTreeMap::new();
    let mut hosts = BTreeMap::new();
    if !loopback_forwards || !default_rules(kernel) {
        return Mirror::default();
    }
    let local: Vec<Prefix> = kernel
        .routes
        .iter()
        .filter(|r| r.table == RT_TABLE_LOCAL)
        .map(|r| Prefix::new(r.dst, r.dst_len))
        .collect();
    let mut main: BTreeMap<Prefix, Vec<&Route>> = BTreeMap::new();
    for route in kernel.routes.iter().filter(|r| r.table == RT_TABLE_MAIN) {
        main.entry(Prefix::new(route.dst, route.dst_len))
            .or_default()
            .push(route);
    }
    let answers: BTreeMap<Prefix, Answer> = main
        .iter()
        .map(|(prefix, routes)| {
            let answer = if local.iter().any(|l| prefix.within(l)) {
                Answer::AskFib
            } else {
                answer(routes, kernel)
            };
            (*prefix, answer)
        })
        .collect();
    for prefix in &local {
        entries.insert(prefix.key(), ASK_FIB);
    }
    for (prefix, answer) in &answers {
        let value = match answer {
            Answer::Known(hop) => *hop,
            Answer::OnLink(_) => NextHop {
                kind: NEXT_HOP_ON_LINK,
                ..ASK_FIB
            },
            Answer::AskFib => ASK_FIB,
        };
        entries.entry(prefix.key()).or_insert(value);
    }
    for neighbour in kernel.neighbours.iter().filter(|n| usable(n)) {
        let addr = u32::from(neighbour.addr);
        if local.iter().any(|l| l.contains(addr)) {
            continue;
        }
        let longest = answers
            .iter()
            .filter(|(prefix, _)| prefix.contains(addr))
            .max_by_key(|(prefix, _)| prefix.len);
        let Some((_, Answer::OnLink(oif))) = longest else {
            continue;
        };
        if *oif != neighbour.ifindex {
            continue;
        }
        if let (Some(link), Some(mac)) = (ethernet(kernel, *oif), neighbour.mac) {
            hosts.insert(neighbour.addr.octets(), known(*oif, link, mac));
        }
    }
    for exception in &kernel.exceptions {
        let host = Prefix::new(exception.dst, exception.dst_len);
        if host.len == 32 {
            hosts.remove(&host.addr.to_be_bytes());
        }
        entries.insert(host.key(), ASK_FIB);
    }
    Mirror {
        routes: entries,
        hosts,
    }
}

/// The kernel's three rules as it makes them: local (0), main (32766), default (32767).
fn default_rules(kernel: &KernelRoutes) -> bool {
    let mut rules: Vec<(u32, u32)> = kernel
        .rules
        .iter()
        .filter(|r| r.plain)
        .map(|r| (r.priority, r.table))
        .collect();
    rules.sort_unstable();
    kernel.rules.len() == 3
        && rules
            == [
                (0, RT_TABLE_LOCAL),
                (32766, RT_TABLE_MAIN),
                (32767, RT_TABLE_DEFAULT),
            ]
}

fn answer(routes: &[&Route], kernel: &KernelRoutes) -> Answer {
    let [route] = routes else {
        return Answer::AskFib;
    };
    let plain = !route.unusual
        && route.tos == 0
        && route.kind == RTN_UNICAST
        && route.flags & (RTNH_F_DEAD | RTNH_F_LINKDOWN) == 0;
    let (true, Some(oif)) = (plain, route.oif) else {
        return Answer::AskFib;
    };
    let Some(link) = ethernet(kernel, oif) else {
        return Answer::AskFib;
    };
    let Some(gateway) = route.gateway else {
        return Answer::OnLink(oif);
    };
    kernel
        .neighbours
        .iter()
        .find(|n| n.ifindex == oif && n.addr == gateway && usable(n))
        .and_then(|n| n.mac)
        .map_or(Answer::AskFib, |mac| Answer::Known(known(oif, link, mac)))
}

fn ethernet(kernel: &KernelRoutes, ifindex: u32) -> Option<&Link> {
    kernel.links.get(&ifindex).filter(|l| l.mac.is_some())
}

fn usable(neighbour: &Neighbour) -> bool {
    neighbour.state & NUD_USABLE != 0 && neighbour.mac.is_some()
}

fn known(ifindex: u32, link: &Link, dmac: [u8; 6]) -> NextHop {
    NextHop {
        kind: NEXT_HOP_KNOWN,
        ifindex,
        mtu: link.mtu,
        dmac,
        smac: link.mac.unwrap_or_default(),
    }
}

/// Keeps the program's `next_hops` and `next_hop_hosts` equal to [`mirror`] of this
/// network namespace.
pub struct NextHopMirror {
    changes: RouteSocket,
    dumps: RouteSocket,
    routes: Published,
    hosts: Published,
}

/// What one map holds, as key and value bytes, per copy of the tables: as written, or,
/// before the first refresh, as found (values that match nothing wanted, so every kept
/// key is rewritten).
struct Published {
    name: &'static str,
    entries: Option<[BTreeMap<Vec<u8>, Vec<u8>>; PUBLISH_COPIES]>,
}

impl Published {
    fn new(name: &'static str) -> Self {
        Published {
            name,
            entries: None,
        }
    }

    /// Makes the copy `window` writes hold `wanted` (its keys that copy's): deletes what
    /// is not wanted, then writes what changed.
    fn sync(
        &mut self,
        program: &SteeringProgram,
        window: &mut PublishWindow,
        wanted: BTreeMap<Vec<u8>, Vec<u8>>,
    ) -> anyhow::Result<()> {
        let map = program.try_map(self.name)?;
        let entries = self.entries.get_or_insert_with(|| {
            let mut found: [BTreeMap<Vec<u8>, Vec<u8>>; PUBLISH_COPIES] = Default::default();
            for key in map.keys() {
                if let Some(copy) = found.get_mut(copy_of(&key) as usize) {
                    copy.insert(key, Vec::new());
                }
            }
            found
        });
        let entries = &mut entries[window.copy() as usize];
        let stale: Vec<Vec<u8>> = entries
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .collect();
        for key in stale {
            window.before_write();
            if let Err(e) = map.delete(&key) {
                if e.kind() != libbpf_rs::ErrorKind::NotFound {
                    return Err(e).with_context(|| format!("cannot delete from {}", self.name));
                }
            }
            entries.remove(&key);
        }
        for (key, value) in wanted {
            if entries.get(&key) != Some(&value) {
                window.before_write();
                map.update(&key, &value, MapFlags::ANY)
                    .with_context(|| format!("cannot update {}", self.name))?;
                entries.insert(key, value);
            }
        }
        Ok(())
    }

    /// Entries of one copy (after a refresh, both hold the same).
    fn len(&self) -> usize {
        self.entries.as_ref().map_or(0, |copies| copies[0].len())
    }
}

impl NextHopMirror {
    /// Subscribes to the kernel's routing changes before the first dump, so that no
    /// change between the two goes unseen. In the calling thread's network namespace.
    pub fn new() -> anyhow::Result<Self> {
        Ok(NextHopMirror {
            changes: RouteSocket::open(CHANGE_GROUPS)
                .context("cannot subscribe to the kernel's routing changes (netlink)")?,
            dumps: RouteSocket::open(0).context("cannot open a netlink socket")?,
            routes: Published::new("next_hops"),
            hosts: Published::new("next_hop_hosts"),
        })
    }

    /// Whether the kernel announced a routing change since the last call.
    pub fn changed(&mut self) -> bool {
        self.changes.drain()
    }

    /// Reads the kernel's routing and writes what changed into the maps: the number of
    /// entries they now hold.
    pub fn refresh(&mut self, program: &SteeringProgram) -> anyhow::Result<usize> {
        // Announcements up to now are covered by this reading.
        self.changes.drain();
        let kernel = self
            .dumps
            .read_all()
            .context("cannot read the kernel's routes and neighbours (netlink)")?;
        let mut wanted = mirror(&kernel, loopback_forwards());
        if wanted.routes.len() > MAX_NEXT_HOPS || wanted.hosts.len() > MAX_NEXT_HOPS {
            // Too many to mirror: the FIB answers for every destination instead.
            tracing::warn!(
                routes = wanted.routes.len(),
                hosts = wanted.hosts.len(),
                limit = MAX_NEXT_HOPS,
                "too many routes or neighbours to mirror in next_hops; bpf_fib_lookup answers every reply"
            );
            wanted = Mirror::default();
        }
        // Either order is safe: a host entry no NEXT_HOP_ON_LINK route points to is never
        // read, and an on-link host without its entry asks the FIB.
        // One window for both maps: a reply reads the trie, then the hosts. The copy
        // packets do not read, then (if anything changed) the other (publish_window.rs).
        let mut window = program.publish_window()?;
        loop {
            let copy = window.copy();
            let hosts: BTreeMap<Vec<u8>, Vec<u8>> = wanted
                .hosts
                .iter()
                .map(|(addr, hop)| (AddrKey { addr: *addr, copy }.to_bytes(), hop.to_bytes()))
                .collect();
            self.hosts.sync(program, &mut window, hosts)?;
            let routes = wanted
                .routes
                .iter()
                .map(|(key, hop)| (in_copy(key, copy).to_bytes(), hop.to_bytes()))
                .collect();
            self.routes.sync(program, &mut window, routes)?;
            if !window.flip() {
                break;
            }
        }
        Ok(self.routes.len() + self.hosts.len())
    }
}

/// `net.ipv4.conf.lo.forwarding` of this thread's network namespace.
fn loopback_forwards() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv4/conf/lo/forwarding")
        .is_ok_and(|text| text.trim() == "1")
}

#[cfg(test)]
mod tests {
    use super::super::route_netlink::Rule;
    use super::*;

    const ETH0: u32 = 2;
    const ETH1: u32 = 3;
    const MAC0: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const MAC1: [u8; 6] = [2, 0, 0, 0, 0, 3];
    const GW: [u8; 6] = [2, 0, 0, 0, 0, 0x99];

    fn route(table: u32, dst: [u8; 4], len: u8, oif: u32, gateway: Option<[u8; 4]>) -> Route {
        Route {
            table,
            dst: Ipv4Addr::from(dst),
            dst_len: len,
            tos: 0,
            kind: if table == RT_TABLE_LOCAL {
                2
            } else {
                RTN_UNICAST
            },
            flags: 0,
            oif: Some(oif),
            gateway: gateway.map(Ipv4Addr::from),
            unusual: false,
        }
    }

    fn neighbour(ifindex: u32, addr: [u8; 4], state: u16, mac: [u8; 6]) -> Neighbour {
        Neighbour {
            ifindex,
            addr: Ipv4Addr::from(addr),
            state,
            mac: Some(mac),
        }
    }

    /// eth0 10.7.0.1/24 with a default route via 10.7.0.2; eth1 10.1.0.1/16 on-link.
    fn kernel() -> KernelRoutes {
        let mut links = BTreeMap::new();
        for (index, mac) in [(ETH0, MAC0), (ETH1, MAC1)] {
            links.insert(
                index,
                Link {
                    mac: Some(mac),
                    mtu: 1500,
                },
            );
        }
        links.insert(
            1,
            Link {
                mac: None,
                mtu: 65536,
            },
        );
        KernelRoutes {
            links,
            routes: vec![
                route(RT_TABLE_LOCAL, [127, 0, 0, 0], 8, 1, None),
                route(RT_TABLE_LOCAL, [10, 7, 0, 1], 32, ETH0, None),
                route(RT_TABLE_LOCAL, [10, 7, 0, 255], 32, ETH0, None),
                route(RT_TABLE_MAIN, [0, 0, 0, 0], 0, ETH0, Some([10, 7, 0, 2])),
                route(RT_TABLE_MAIN, [10, 7, 0, 0], 24, ETH0, None),
                route(RT_TABLE_MAIN, [10, 1, 0, 0], 16, ETH1, None),
            ],
            exceptions: vec![],
            neighbours: vec![
                neighbour(ETH0, [10, 7, 0, 2], 0x02, GW),
                neighbour(ETH1, [10, 1, 0, 5], 0x04, [2, 0, 0, 0, 1, 5]),
                neighbour(ETH1, [10, 1, 0, 6], 0x01 /* INCOMPLETE */, [0; 6]),
                // On eth0, but 10.1/16 routes out of eth1: not its next hop.
                neighbour(ETH0, [10, 1, 0, 7], 0x02, [2, 0, 0, 0, 1, 7]),
            ],
            rules: vec![
                Rule {
                    priority: 0,
                    table: RT_TABLE_LOCAL,
                    plain: true,
                },
                Rule {
                    priority: 32766,
                    table: RT_TABLE_MAIN,
                    plain: true,
                },
                Rule {
                    priority: 32767,
                    table: RT_TABLE_DEFAULT,
                    plain: true,
                },
            ],
        }
    }

    fn key(addr: [u8; 4], len: u32) -> NextHopKey {
        NextHopKey {
            prefixlen: len,
            copy: 0,
            addr,
        }
    }

    /// The kernel's answer from the maps, if they have one (else the FIB answers).
    fn lookup(mirror: &Mirror, addr: [u8; 4]) -> Option<NextHop> {
        mirror
            .lookup(Ipv4Addr::from(addr))
            .filter(|hop| hop.kind == NEXT_HOP_KNOWN)
    }

    #[test]
    fn a_gateway_route_answers_and_on_link_hosts_get_their_own_entries() {
        let entries = mirror(&kernel(), true);
        let via_gateway = NextHop {
            kind: NEXT_HOP_KNOWN,
            ifindex: ETH0,
            mtu: 1500,
            dmac: GW,
            smac: MAC0,
        };
        assert_eq!(entries.routes.get(&key([0; 4], 0)), Some(&via_gateway));
        assert_eq!(lookup(&entries, [198, 51, 100, 7]), Some(via_gateway));
        assert_eq!(
            lookup(&entries, [10, 1, 0, 5]),
            Some(NextHop {
                kind: NEXT_HOP_KNOWN,
                ifindex: ETH1,
                mtu: 1500,
                dmac: [2, 0, 0, 0, 1, 5],
                smac: MAC1
            })
        );
        // An on-link host without a usable neighbour, a neighbour on the wrong interface,
        // and the host's own addresses: the FIB decides.
        for addr in [
            [10, 1, 0, 6],
            [10, 1, 0, 7],
            [10, 1, 0, 9],
            [10, 7, 0, 1],
            [127, 0, 0, 1],
        ] {
            assert_eq!(lookup(&entries, addr), None, "{addr:?}");
        }
    }

    #[test]
    fn a_more_specific_route_the_map_cannot_answer_shadows_the_default() {
        let mut kernel = kernel();
        // Via a gateway with no neighbour entry yet.
        kernel.routes.push(route(
            RT_TABLE_MAIN,
            [198, 51, 100, 0],
            24,
            ETH1,
            Some([10, 1, 0, 6]),
        ));
        // A blackhole.
        let mut blackhole = route(RT_TABLE_MAIN, [203, 0, 113, 0], 24, ETH0, None);
        blackhole.kind = 6;
        blackhole.oif = None;
        kernel.routes.push(blackhole);
        let entries = mirror(&kernel, true);
        assert_eq!(lookup(&entries, [198, 51, 100, 7]), None);
        assert_eq!(lookup(&entries, [203, 0, 113, 7]), None);
        assert!(lookup(&entries, [192, 0, 2, 7]).is_some());
    }

    #[test]
    fn rules_beyond_the_defaults_or_no_forwarding_on_lo_leave_the_map_empty() {
        let mut kernel = kernel();
        assert_eq!(mirror(&kernel, false), Mirror::default());
        kernel.rules.push(Rule {
            priority: 100,
            table: 100,
            plain: false,
        });
        assert_eq!(mirror(&kernel, true), Mirror::default());
    }

    #[test]
    fn a_learnt_path_mtu_and_two_routes_at_one_prefix_ask_the_fib() {
        let mut kernel = kernel();
        kernel.exceptions.push(route(
            RT_TABLE_MAIN,
            [192, 0, 2, 1],
            32,
            ETH0,
            Some([10, 7, 0, 2]),
        ));
        let mut second = route(RT_TABLE_MAIN, [0, 0, 0, 0], 0, ETH1, Some([10, 1, 0, 5]));
        second.unusual = false;
        let entries = mirror(&kernel, true);
        assert_eq!(lookup(&entries, [192, 0, 2, 1]), None);
        kernel.routes.push(second);
        assert_eq!(lookup(&mirror(&kernel, true), [192, 0, 2, 2]), None);
    }
}
