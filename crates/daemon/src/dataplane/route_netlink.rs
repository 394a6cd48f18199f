//! A small NETLINK_ROUTE client for the next-hop mirror (`next_hops.rs`): dumps of this
//! network namespace's IPv4 routes, route exceptions, neighbours, links and rules, and a
//! socket subscribed to their changes. Written on libc like `neighbour.rs`: four dumps
//! and a few attributes do not need a netlink crate.
//!
//! Sockets belong to the network namespace of the thread that opens them.

use std::collections::BTreeMap;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use cheetah_core::types::Mac;

const NLMSG_HDR: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_DUMP_INTR: u16 = 0x10;

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const RTM_NEWRULE: u16 = 32;
const RTM_GETRULE: u16 = 34;

const IFLA_ADDRESS: u16 = 1;
const IFLA_MTU: u16 = 4;
const ARPHRD_ETHER: u16 = 1;

const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PRIORITY: u16 = 6;
const RTA_PREFSRC: u16 = 7;
const RTA_METRICS: u16 = 8;
const RTA_CACHEINFO: u16 = 12;
const RTA_TABLE: u16 = 15;
const RTA_EXPIRES: u16 = 23;
const RTAX_MTU: u16 = 2;
/// `rtm_flags` of a dump request: list the route exceptions (learnt path MTUs) instead.
const RTM_F_CLONED: u32 = 0x200;

const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;

const FRA_PRIORITY: u16 = 6;
const FRA_TABLE: u16 = 15;
const FRA_SUPPRESS_IFGROUP: u16 = 13;
const FRA_SUPPRESS_PREFIXLEN: u16 = 14;
const FRA_PROTOCOL: u16 = 21;
const FR_ACT_TO_TBL: u8 = 1;

/// Multicast groups of the changes that can move a next hop: links (MTU, MAC, up/down),
/// neighbours, IPv4 addresses (their local routes), routes and rules.
pub const CHANGE_GROUPS: u32 = libc::RTMGRP_LINK as u32
    | libc::RTMGRP_NEIGH as u32
    | libc::RTMGRP_IPV4_IFADDR as u32
    | libc::RTMGRP_IPV4_ROUTE as u32
    | libc::RTMGRP_IPV4_RULE as u32;

/// An interface: its MAC (Ethernet interfaces only) and MTU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub mac: Option<Mac>,
    pub mtu: u32,
}

/// An IPv4 route (or route exception) as the kernel lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub table: u32,
    pub dst: Ipv4Addr,
    pub dst_len: u8,
    pub tos: u8,
    /// `rtm_type`: RTN_UNICAST (1), RTN_LOCAL, RTN_BLACKHOLE, ...
    pub kind: u8,
    /// `rtm_flags`: the next hop's RTNH_F_* for a single-path route.
    pub flags: u32,
    pub oif: Option<u32>,
    pub gateway: Option<Ipv4Addr>,
    /// Carries something the mirror does not model (a source or mark selector, several
    /// next hops, a nexthop object, an encapsulation, an MTU metric, ...).
    pub unusual: bool,
}

/// An IPv4 neighbour entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    pub ifindex: u32,
    pub addr: Ipv4Addr,
    /// `ndm_state`: NUD_* bits.
    pub state: u16,
    pub mac: Option<Mac>,
}

/// An IPv4 policy routing rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub priority: u32,
    pub table: u32,
    /// Selects nothing (every packet) and only looks up its table.
    pub plain: bool,
}

/// What the kernel's routing holds, as far as a next hop toward an IPv4 client goes.
#[derive(Clone, Debug, Default)]
pub struct KernelRoutes {
    pub links: BTreeMap<u32, Link>,
    pub routes: Vec<Route>,
    /// Route exceptions (`ip route show cache`): per-destination path MTUs.
    pub exceptions: Vec<Route>,
    pub neighbours: Vec<Neighbour>,
    pub rules: Vec<Rule>,
}

pub struct RouteSocket {
    fd: OwnedFd,
    seq: u32,
}

impl RouteSocket {
    /// A socket for dumps (`groups` 0), or one subscribed to `groups` (non-blocking).
    pub fn open(groups: u32) -> io::Result<Self> {
        let mut kind = libc::SOCK_RAW | libc::SOCK_CLOEXEC;
        if groups != 0 {
            kind |= libc::SOCK_NONBLOCK;
        }
        // SAFETY: plain socket(2); the fd is owned from here on.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, kind, libc::NETLINK_ROUTE) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just returned by socket(2) and is not owned elsewhere.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_nl is plain data; zero is a valid value.
        let mut local: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        local.nl_family = libc::AF_NETLINK as u16;
        local.nl_groups = groups;
        // SAFETY: binding to a fully initialised sockaddr_nl of the right length.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&local as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        if groups != 0 {
            // Room for a burst of changes (a link going down withdraws many routes); an
            // overflow is not lost either: `drain` reports it as a change.
            let size: libc::c_int = 1 << 20;
            // SAFETY: setting an int socket option from a valid int.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    (&size as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as u32,
                )
            };
        }
        Ok(RouteSocket { fd, seq: 0 })
    }

    /// Reads every pending notification of a subscribed socket: whether there was any
    /// (an overflow of the socket's buffer counts: changes were lost).
    pub fn drain(&self) -> bool {
        let mut buffer = vec![0u8; 64 * 1024];
        let mut any = false;
        loop {
            // SAFETY: receiving into a buffer of the length given.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                any = true;
                continue;
            }
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::ENOBUFS) => any = true,
                Some(libc::EINTR) => {}
                _ => return any,
            }
        }
    }

    /// Everything `KernelRoutes` holds, read now.
    pub fn read_all(&mut self) -> io::Result<KernelRoutes> {
        let mut kernel = KernelRoutes::default();
        for body in self.dump(RTM_GETLINK, RTM_NEWLINK, &[0u8; 16])? {
            if let Some((ifindex, link)) = parse_link(&body) {
                kernel.links.insert(ifindex, link);
            }
        }
        let mut request = [0u8; 12];
        request[0] = libc::AF_INET as u8;
        for body in self.dump(RTM_GETROUTE, RTM_NEWROUTE, &request)? {
            kernel.routes.extend(parse_route(&body));
        }
        request[8..12].copy_from_slice(&RTM_F_CLONED.to_ne_bytes());
        for body in self.dump(RTM_GETROUTE, RTM_NEWROUTE, &request)? {
            // The kernel lists the routes too (with exceptions below them): only an
            // exception is marked cloned.
            let route = parse_route(&body);
            kernel
                .exceptions
                .extend(route.filter(|r| r.flags & RTM_F_CLONED != 0));
        }
        let mut request = [0u8; 12];
        request[0] = libc::AF_INET as u8;
        for body in self.dump(RTM_GETNEIGH, RTM_NEWNEIGH, &request)? {
            kernel.neighbours.extend(parse_neighbour(&body));
        }
        for body in self.dump(RTM_GETRULE, RTM_NEWRULE, &request)? {
            kernel.rules.extend(parse_rule(&body));
        }
        Ok(kernel)
    }

    /// The bodies of the `answer` messages of a dump, retried whole when the kernel says
    /// the table changed while it was being dumped.
    fn dump(&mut self, request: u16, answer: u16, body: &[u8]) -> io::Result<Vec<Vec<u8>>> {
        for _ in 0..10 {
            if let Some(bodies) = self.dump_once(request, answer, body)? {
                return Ok(bodies);
            }
        }
        Err(io::Error::other(
            "the kernel's tables kept changing during every dump",
        ))
    }

    fn dump_once(
        &mut self,
        request: u16,
        answer: u16,
        body: &[u8],
    ) -> io::Result<Option<Vec<Vec<u8>>>> {
        self.seq = self.seq.wrapping_add(1);
        let mut message = vec![0u8; NLMSG_HDR + body.len()];
        let len = message.len() as u32;
        message[0..4].copy_from_slice(&len.to_ne_bytes());
        message[4..6].copy_from_slice(&request.to_ne_bytes());
        message[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        message[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        message[NLMSG_HDR..].copy_from_slice(body);
        // SAFETY: sockaddr_nl is plain data; zero is the kernel's address.
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        // SAFETY: sending a fully initialised buffer to the kernel's netlink address.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                message.as_ptr().cast(),
                message.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut bodies = Vec::new();
        let mut interrupted = false;
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: receiving into a buffer of the length given.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    0,
                )
            };
            if n < 0 {
                let error = io::Error::last_os_error();
                if error.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(error);
            }
            let mut at = &buffer[..n as usize];
            while at.len() >= NLMSG_HDR {
                let len = u32::from_ne_bytes(at[0..4].try_into().unwrap()) as usize;
                if len < NLMSG_HDR || len > at.len() {
                    return Err(io::Error::other("malformed netlink message"));
                }
                let kind = u16::from_ne_bytes(at[4..6].try_into().unwrap());
                let flags = u16::from_ne_bytes(at[6..8].try_into().unwrap());
                let seq = u32::from_ne_bytes(at[8..12].try_into().unwrap());
                let payload = &at[NLMSG_HDR..len];
                at = &at[align(len).min(at.len())..];
                if seq != self.seq {
                    continue;
                }
                interrupted |= flags & NLM_F_DUMP_INTR != 0;
                match kind {
                    NLMSG_DONE => return Ok((!interrupted).then_some(bodies)),
                    NLMSG_ERROR => {
                        let code = payload
                            .get(0..4)
                            .map_or(0, |b| i32::from_ne_bytes(b.try_into().unwrap()));
                        if code != 0 {
                            return Err(io::Error::from_raw_os_error(-code));
                        }
                    }
                    kind if kind == answer => bodies.push(payload.to_vec()),
                    _ => {}
                }
            }
        }
    }
}

fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// The attributes after a message's fixed header: (type, value), nesting bits cleared.
fn attributes(mut at: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if at.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([at[0], at[1]]) as usize;
        let kind = u16::from_ne_bytes([at[2], at[3]]) & 0x3fff;
        if len < 4 || len > at.len() {
            return None;
        }
        let value = &at[4..len];
        at = &at[align(len).min(at.len())..];
        Some((kind, value))
    })
}

fn u32_of(value: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(value.get(0..4)?.try_into().ok()?))
}

fn ipv4_of(value: &[u8]) -> Option<Ipv4Addr> {
    let octets: [u8; 4] = value.try_into().ok()?;
    Some(Ipv4Addr::from(octets))
}

fn parse_link(body: &[u8]) -> Option<(u32, Link)> {
    let header = body.get(0..16)?;
    let kind = u16::from_ne_bytes([header[2], header[3]]);
    let ifindex = u32_of(&header[4..8])?;
    let mut link = Link { mac: None, mtu: 0 };
    for (attribute, value) in attributes(&body[16..]) {
        match attribute {
            IFLA_ADDRESS if kind == ARPHRD_ETHER => link.mac = value.try_into().ok(),
            IFLA_MTU => link.mtu = u32_of(value)?,
            _ => {}
        }
    }
    Some((ifindex, link))
}

fn parse_route(body: &[u8]) -> Option<Route> {
    let header = body.get(0..12)?;
    if header[0] != libc::AF_INET as u8 {
        return None;
    }
    let mut route = Route {
        table: u32::from(header[4]),
        dst: Ipv4Addr::UNSPECIFIED,
        dst_len: header[1],
        tos: header[3],
        kind: header[7],
        flags: u32_of(&header[8..12])?,
        oif: None,
        gateway: None,
        // A source prefix selects by source address, which the mirror does not key on.
        unusual: header[2] != 0,
    };
    for (attribute, value) in attributes(&body[12..]) {
        match attribute {
            RTA_DST => route.dst = ipv4_of(value)?,
            RTA_OIF => route.oif = u32_of(value),
            RTA_GATEWAY => route.gateway = ipv4_of(value),
            RTA_TABLE => route.table = u32_of(value)?,
            // The FIB takes the route's MTU when it is set: left to the FIB.
            RTA_METRICS => route.unusual |= attributes(value).any(|(m, _)| m == RTAX_MTU),
            // Neither changes the next hop nor its MTU.
            RTA_PRIORITY | RTA_PREFSRC | RTA_CACHEINFO | RTA_EXPIRES => {}
            // Anything else (RTA_MULTIPATH, RTA_VIA, RTA_ENCAP, RTA_NH_ID, RTA_IIF,
            // RTA_MARK, ...) is a route the mirror leaves to the FIB.
            _ => route.unusual = true,
        }
    }
    Some(route)
}

fn parse_neighbour(body: &[u8]) -> Option<Neighbour> {
    let header = body.get(0..12)?;
    if header[0] != libc::AF_INET as u8 {
        return None;
    }
    let mut neighbour = Neighbour {
        ifindex: u32_of(&header[4..8])?,
        addr: Ipv4Addr::UNSPECIFIED,
        state: u16::from_ne_bytes([header[8], header[9]]),
        mac: None,
    };
    let mut addressed = false;
    for (attribute, value) in attributes(&body[12..]) {
        match attribute {
            NDA_DST => {
                neighbour.addr = ipv4_of(value)?;
                addressed = true;
            }
            NDA_LLADDR => neighbour.mac = value.try_into().ok(),
            _ => {}
        }
    }
    addressed.then_some(neighbour)
}

fn parse_rule(body: &[u8]) -> Option<Rule> {
    let header = body.get(0..12)?;
    if header[0] != libc::AF_INET as u8 {
        return None;
    }
    let mut rule = Rule {
        priority: 0,
        table: u32::from(header[4]),
        plain: header[1] == 0
            && header[2] == 0
            && header[3] == 0
            && header[7] == FR_ACT_TO_TBL
            && u32_of(&header[8..12]) == Some(0),
    };
    for (attribute, value) in attributes(&body[12..]) {
        match attribute {
            FRA_PRIORITY => rule.priority = u32_of(value)?,
            FRA_TABLE => rule.table = u32_of(value)?,
            FRA_PROTOCOL => {}
            // -1 is "no suppressor", as the kernel lists its default rules.
            FRA_SUPPRESS_IFGROUP | FRA_SUPPRESS_PREFIXLEN if u32_of(value) == Some(u32::MAX) => {}
            // A selector (iif, oif, fwmark, uid range, ports, ...) or a suppressor.
            _ => rule.plain = false,
        }
    }
    Some(rule)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_namespace_can_be_read() {
        let kernel = RouteSocket::open(0).unwrap().read_all().unwrap();
        // lo is in every namespace, with its local route 127.0.0.0/8 in table local.
        assert!(kernel.links.contains_key(&1), "{:?}", kernel.links);
        assert!(
            kernel
                .routes
                .iter()
                .any(|r| r.table == 255 && r.dst == Ipv4Addr::new(127, 0, 0, 0) && r.dst_len == 8),
            "{:?}",
            kernel.routes
        );
    }
}
