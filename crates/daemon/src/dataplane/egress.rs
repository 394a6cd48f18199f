//! Where a packet for a server leaves: which of the LB's interfaces, and to which MAC.
//!
//! Resolved from the kernel's routing and neighbour tables the first time a server is
//! used, then cached per server id until the tables snapshot changes. Lookups read
//! `/proc/net/route` and `/proc/net/arp`: they happen once per server, never per packet.
//! Each table is parsed once per use (`RouteTable`, `Neighbours`), not once per server:
//! the XDP publisher resolves every server every second, and a host with thousands of
//! neighbours made that thousands of times thousands of lines.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use cheetah_core::types::{parse_mac, Mac, Nanos, ServerId, NANOS_PER_SEC};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Egress {
    /// Index into the worker's ports.
    pub port: u8,
    pub dst_mac: Mac,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Unknown,
    Resolved(Egress),
    /// Not resolvable at `since`; retried a second later.
    Failed {
        since: Nanos,
    },
}

pub struct ServerEgress {
    entries: Box<[Entry]>,
    generation: u64,
}

impl Default for ServerEgress {
    fn default() -> Self {
        ServerEgress {
            entries: vec![Entry::Unknown; ServerId::MAX as usize + 1].into_boxed_slice(),
            generation: 0,
        }
    }
}

impl ServerEgress {
    /// Egress for server `id` (`dip`, and its MAC if the config gave one). `ports` maps
    /// interface names to port indices.
    pub fn lookup(
        &mut self,
        generation: u64,
        id: ServerId,
        dip: u32,
        mac: Option<Mac>,
        ports: &[(String, u8)],
        now: Nanos,
    ) -> Option<Egress> {
        if generation != self.generation {
            self.entries.fill(Entry::Unknown);
            self.generation = generation;
        }
        let entry = &mut self.entries[id.0 as usize];
        match *entry {
            Entry::Resolved(egress) => return Some(egress),
            Entry::Failed { since } if now.saturating_sub(since) < NANOS_PER_SEC => return None,
            _ => {}
        }
        let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
        let neighbours = std::fs::read_to_string("/proc/net/arp").unwrap_or_default();
        let (routes, neighbours) = (RouteTable::parse(&routes), Neighbours::parse(&neighbours));
        match resolve(Ipv4Addr::from(dip), mac, &routes, &neighbours, ports) {
            Some(egress) => {
                *entry = Entry::Resolved(egress);
                Some(egress)
            }
            None => {
                tracing::warn!(server = id.0, dip = %Ipv4Addr::from(dip), "no route or neighbour entry toward server on the LB's interfaces");
                *entry = Entry::Failed { since: now };
                None
            }
        }
    }
}

pub(super) fn resolve(
    dip: Ipv4Addr,
    mac: Option<Mac>,
    routes: &RouteTable,
    neighbours: &Neighbours,
    ports: &[(String, u8)],
) -> Option<Egress> {
    let route = routes.best(dip)?;
    let port = ports.iter().find(|(name, _)| *name == route.interface)?.1;
    let dst_mac = match mac {
        Some(mac) => mac,
        None => neighbours.complete(route.gateway.unwrap_or(dip), &route.interface)?,
    };
    Some(Egress { port, dst_mac })
}

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Route {
    pub(super) interface: String,
    gateway: Option<Ipv4Addr>,
}

/// The routes of `/proc/net/route` that are up (addresses are little-endian hex there).
pub(super) struct RouteTable {
    routes: Vec<RouteEntry>,
}

struct RouteEntry {
    net: u32,
    mask: u32,
    interface: String,
    gateway: Option<Ipv4Addr>,
}

impl RouteTable {
    pub(super) fn parse(table: &str) -> Self {
        const RTF_UP: u32 = 0x1;
        let hex = |s: &str| u32::from_str_radix(s, 16).ok().map(u32::from_be);
        let routes = table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 8 {
                    return None;
                }
                let (net, gateway, flags, mask) = (hex(f[1])?, hex(f[2])?, hex(f[3])?, hex(f[7])?);
                (u32::from_be(flags) & RTF_UP != 0).then(|| RouteEntry {
                    net,
                    mask,
                    interface: f[0].to_string(),
                    gateway: (gateway != 0).then(|| Ipv4Addr::from(gateway)),
                })
            })
            .collect();
        RouteTable { routes }
    }

    /// Longest-prefix match (of equally long prefixes, the table's last).
    pub(super) fn best(&self, dst: Ipv4Addr) -> Option<Route> {
        let dst = u32::from(dst);
        self.routes
            .iter()
            .filter(|route| dst & route.mask == route.net)
            .max_by_key(|route| route.mask.count_ones())
            .map(|route| Route {
                interface: route.interface.clone(),
                gateway: route.gateway,
            })
    }
}

/// The complete entries of `/proc/net/arp`, by address and interface (of several for one,
/// the table's first).
pub(super) struct Neighbours {
    complete: HashMap<(Ipv4Addr, String), Mac>,
}

impl Neighbours {
    pub(super) fn parse(table: &str) -> Self {
        const ATF_COM: u32 = 0x2;
        let mut complete = HashMap::new();
        for line in table.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 {
                continue;
            }
            let Ok(flags) = u32::from_str_radix(f[2].trim_start_matches("0x"), 16) else {
                continue;
            };
            let (Ok(addr), Some(mac)) = (f[0].parse::<Ipv4Addr>(), parse_mac(f[3])) else {
                continue;
            };
            if flags & ATF_COM != 0 {
                complete.entry((addr, f[5].to_string())).or_insert(mac);
            }
        }
        Neighbours { complete }
    }

    /// The MAC of a complete entry for `addr` on `interface`.
    fn complete(&self, addr: Ipv4Addr, interface: &str) -> Option<Mac> {
        self.complete.get(&(addr, interface.to_string())).copied()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The testbed LB's route table, as `/proc/net/route` prints it (also read by `sides.rs`).
    pub(in crate::dataplane) const ROUTES: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
lb-c\t00000000\t01010A0A\t0003\t0\t0\t0\t00000000\t0\t0\t0
lb-c\t00010A0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
lb-s\t0000140A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
lb-c\t00000A0A\t01010A0A\t0003\t0\t0\t0\t0000FFFF\t0\t0\t0
";
    const ARP: &str =
        "IP address       HW type     Flags       HW address            Mask     Device
10.20.0.11       0x1         0x2         02:ce:00:00:02:01     *        lb-s
10.20.0.12       0x1         0x0         00:00:00:00:00:00     *        lb-s
10.10.1.1        0x1         0x2         0a:0b:0c:0d:0e:0f     *        lb-c
";

    fn ports() -> Vec<(String, u8)> {
        vec![("lb-c".into(), 0), ("lb-s".into(), 1)]
    }

    /// `resolve` over the tables above.
    fn resolve_in_tables(
        dip: Ipv4Addr,
        mac: Option<Mac>,
        ports: &[(String, u8)],
    ) -> Option<Egress> {
        resolve(
            dip,
            mac,
            &RouteTable::parse(ROUTES),
            &Neighbours::parse(ARP),
            ports,
        )
    }

    #[test]
    fn longest_prefix_wins() {
        let routes = RouteTable::parse(ROUTES);
        let r = routes.best("10.20.0.11".parse().unwrap()).unwrap();
        assert_eq!(r.interface, "lb-s");
        assert_eq!(r.gateway, None);
        let r = routes.best("10.10.12.2".parse().unwrap()).unwrap();
        assert_eq!(r.interface, "lb-c");
        assert_eq!(r.gateway, Some("10.10.1.1".parse().unwrap()));
        let r = routes.best("10.10.1.7".parse().unwrap()).unwrap();
        assert_eq!(r.gateway, None);
    }

    #[test]
    fn configured_mac_needs_only_the_route() {
        let mac = [2, 0xce, 0, 0, 2, 9];
        let egress = resolve_in_tables("10.20.0.19".parse().unwrap(), Some(mac), &ports());
        assert_eq!(
            egress,
            Some(Egress {
                port: 1,
                dst_mac: mac
            })
        );
    }

    #[test]
    fn missing_mac_comes_from_a_complete_neighbour_entry() {
        let egress = resolve_in_tables("10.20.0.11".parse().unwrap(), None, &ports());
        assert_eq!(egress.map(|e| e.dst_mac), Some([2, 0xce, 0, 0, 2, 1]));
        // Incomplete entry: not usable.
        assert_eq!(
            resolve_in_tables("10.20.0.12".parse().unwrap(), None, &ports()),
            None
        );
        // Behind a gateway: the gateway's MAC.
        let egress = resolve_in_tables("10.10.12.2".parse().unwrap(), None, &ports());
        assert_eq!(
            egress.map(|e| e.dst_mac),
            Some([0xa, 0xb, 0xc, 0xd, 0xe, 0xf])
        );
    }

    #[test]
    fn of_several_neighbour_entries_the_first_complete_one_on_the_interface_counts() {
        let arp = "IP address       HW type     Flags       HW address            Mask     Device
10.20.0.11       0x1         0x0         00:00:00:00:00:00     *        lb-s
10.20.0.11
10.20.0.11       0x1         0x2         02:ce:00:00:02:01     *        lb-c
10.20.0.11       0x1         0x2         not-a-mac             *        lb-s
10.20.0.11       0x1         0x2         02:ce:00:00:02:02     *        lb-s
10.20.0.11       0x1         0x2         02:ce:00:00:02:03     *        lb-s
";
        let neighbours = Neighbours::parse(arp);
        let addr = "10.20.0.11".parse().unwrap();
        assert_eq!(
            neighbours.complete(addr, "lb-s"),
            Some([2, 0xce, 0, 0, 2, 2])
        );
        assert_eq!(
            neighbours.complete(addr, "lb-c"),
            Some([2, 0xce, 0, 0, 2, 1])
        );
        assert_eq!(neighbours.complete(addr, "lb-x"), None);
    }

    #[test]
    fn route_through_an_interface_the_lb_does_not_serve_is_no_egress() {
        let only_c = vec![("lb-c".to_string(), 0)];
        let mac = [2, 0xce, 0, 0, 2, 9];
        assert_eq!(
            resolve_in_tables("10.20.0.11".parse().unwrap(), Some(mac), &only_c),
            None
        );
    }
}
