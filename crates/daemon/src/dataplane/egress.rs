//! Where a packet for a server leaves: which of the LB's interfaces, and to which MAC.
//!
//! Resolved from the kernel's routing and neighbour tables the first time a server is
//! used, then cached per server id until the tables snapshot changes. Lookups read
//! `/proc/net/route` and `/proc/net/arp`: they happen once per server, never per packet.

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
    routes: &str,
    neighbours: &str,
    ports: &[(String, u8)],
) -> Option<Egress> {
    let route = best_route(routes, dip)?;
    let port = ports.iter().find(|(name, _)| *name == route.interface)?.1;
    let dst_mac = match mac {
        Some(mac) => mac,
        None => neighbour(neighbours, route.gateway.unwrap_or(dip), &route.interface)?,
    };
    Some(Egress { port, dst_mac })
}

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Route {
    pub(super) interface: String,
    gateway: Option<Ipv4Addr>,
}

/// Longest-prefix match over `/proc/net/route` (addresses are little-endian hex there).
pub(super) fn best_route(table: &str, dst: Ipv4Addr) -> Option<Route> {
    const RTF_UP: u32 = 0x1;
    let dst = u32::from(dst);
    let hex = |s: &str| u32::from_str_radix(s, 16).ok().map(u32::from_be);
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let (net, gateway, flags, mask) = (hex(f[1])?, hex(f[2])?, hex(f[3])?, hex(f[7])?);
            let flags = u32::from_be(flags);
            (flags & RTF_UP != 0 && dst & mask == net).then(|| {
                (
                    mask.count_ones(),
                    Route {
                        interface: f[0].to_string(),
                        gateway: (gateway != 0).then(|| Ipv4Addr::from(gateway)),
                    },
                )
            })
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, route)| route)
}

/// A complete entry for `addr` on `interface` in `/proc/net/arp`.
fn neighbour(table: &str, addr: Ipv4Addr, interface: &str) -> Option<Mac> {
    const ATF_COM: u32 = 0x2;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let flags = u32::from_str_radix(f.get(2)?.trim_start_matches("0x"), 16).ok()?;
        (f.len() >= 6 && f[0] == addr.to_string() && f[5] == interface && flags & ATF_COM != 0)
            .then(|| parse_mac(f[3]))
            .flatten()
    })
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

    #[test]
    fn longest_prefix_wins() {
        let r = best_route(ROUTES, "10.20.0.11".parse().unwrap()).unwrap();
        assert_eq!(r.interface, "lb-s");
        assert_eq!(r.gateway, None);
        let r = best_route(ROUTES, "10.10.12.2".parse().unwrap()).unwrap();
        assert_eq!(r.interface, "lb-c");
        assert_eq!(r.gateway, Some("10.10.1.1".parse().unwrap()));
        let r = best_route(ROUTES, "10.10.1.7".parse().unwrap()).unwrap();
        assert_eq!(r.gateway, None);
    }

    #[test]
    fn configured_mac_needs_only_the_route() {
        let mac = [2, 0xce, 0, 0, 2, 9];
        let egress = resolve(
            "10.20.0.19".parse().unwrap(),
            Some(mac),
            ROUTES,
            ARP,
            &ports(),
        );
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
        let egress = resolve("10.20.0.11".parse().unwrap(), None, ROUTES, ARP, &ports());
        assert_eq!(egress.map(|e| e.dst_mac), Some([2, 0xce, 0, 0, 2, 1]));
        // Incomplete entry: not usable.
        assert_eq!(
            resolve("10.20.0.12".parse().unwrap(), None, ROUTES, ARP, &ports()),
            None
        );
        // Behind a gateway: the gateway's MAC.
        let egress = resolve("10.10.12.2".parse().unwrap(), None, ROUTES, ARP, &ports());
        assert_eq!(
            egress.map(|e| e.dst_mac),
            Some([0xa, 0xb, 0xc, 0xd, 0xe, 0xf])
        );
    }

    #[test]
    fn route_through_an_interface_the_lb_does_not_serve_is_no_egress() {
        let only_c = vec![("lb-c".to_string(), 0)];
        let mac = [2, 0xce, 0, 0, 2, 9];
        assert_eq!(
            resolve(
                "10.20.0.11".parse().unwrap(),
                Some(mac),
                ROUTES,
                ARP,
                &only_c
            ),
            None
        );
    }
}
