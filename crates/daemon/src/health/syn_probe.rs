//! The SYN probe: a TCP SYN with the timestamp option, sent from a raw socket from the
//! LB's own address toward a server; the server's SYN-ACK says it listens and carries its
//! TCP clock (TSval), which is how every instance learns every server's clock whatever
//! path the servers' replies take.
//!
//! The answer reaches this host's kernel (the XDP program hands a packet addressed to one
//! of the host's own addresses to the kernel, never to the reply path), where the raw
//! socket gets a copy. No socket of the kernel owns the probe's port, so the kernel
//! answers the SYN-ACK with a RST, which closes the server's half-open connection at once:
//! a probe leaves nothing behind on the server.
//!
//! Source ports: each comes from a TCP socket the prober binds (port 0, so the kernel picks
//! a free one) and holds, never listening nor connected. While it is held the kernel gives
//! that port to no other socket, so no connection of the host can share a probe's 4-tuple,
//! and a SYN-ACK to it finds no socket and gets the RST. The probes rotate over
//! [`SOURCE_PORTS`] of them, so that two probes of one server in a row use different
//! 4-tuples (a SYN to a 4-tuple the server still held half-open would be answered for the
//! old one).

use std::io;
use std::mem::size_of;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use cheetah_core::wire::tcp::{flags, TcpHeader};
use cheetah_core::wire::{ip_proto, ipv4, tcp_options, Ipv4Packet, TcpSegment};

/// Source ports held for probes.
pub const SOURCE_PORTS: usize = 8;
/// IPv4 header + TCP header with MSS, NOP, NOP, timestamps.
const SYN_LEN: usize = 20 + 20 + 16;
const WINDOW: u16 = 64_240;
const MSS: u16 = 1460;

/// A probe on the wire: where it went from and to, and its initial sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SentSyn {
    pub from: SocketAddrV4,
    pub to: SocketAddrV4,
    pub isn: u32,
}

/// What a server answered to a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynAnswer {
    /// SYN-ACK, with its TSval when it carried the timestamp option.
    SynAck { tsval: Option<u32> },
    /// RST: nothing listens.
    Reset,
}

/// A SYN-ACK or RST the raw socket read: from whom, to whom, and its acknowledgment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub from: SocketAddrV4,
    pub to: SocketAddrV4,
    pub ack: u32,
    pub answer: SynAnswer,
}

impl Segment {
    /// The answer to `probe`, if this is one: from the probed address and port to the
    /// probe's, acknowledging the probe's ISN + 1 (anything else is not the server's
    /// answer to this SYN, and is ignored).
    pub fn answers(&self, probe: &SentSyn) -> Option<SynAnswer> {
        (self.from == probe.to && self.to == probe.from && self.ack == probe.isn.wrapping_add(1))
            .then_some(self.answer)
    }
}

pub struct SynProber {
    socket: OwnedFd,
    ports: Vec<(OwnedFd, u16)>,
    next_port: usize,
}

impl SynProber {
    /// Opens the raw socket (needs CAP_NET_RAW) and binds the source ports.
    pub fn open() -> io::Result<Self> {
        // SAFETY: plain socket calls; every returned descriptor is owned at once.
        let socket = unsafe {
            let fd = libc::socket(
                libc::AF_INET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::IPPROTO_TCP,
            );
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        // The probe's IP header is ours: its source is the address the route chose.
        set_option(&socket, libc::IPPROTO_IP, libc::IP_HDRINCL, 1)?;
        let ports = (0..SOURCE_PORTS)
            .map(|_| hold_port())
            .collect::<io::Result<Vec<_>>>()?;
        Ok(SynProber {
            socket,
            ports,
            next_port: 0,
        })
    }

    pub fn fd(&self) -> i32 {
        self.socket.as_raw_fd()
    }

    /// The ports probes are sent from.
    pub fn source_ports(&self) -> Vec<u16> {
        self.ports.iter().map(|(_, port)| *port).collect()
    }

    /// Sends a SYN to `to` from the address the kernel's route to it uses; `tsval` is the
    /// probe's own timestamp (anything: the server echoes it).
    pub fn send(&mut self, to: SocketAddrV4, tsval: u32) -> io::Result<SentSyn> {
        let source = route_source(to)?;
        let port = self.ports[self.next_port].1;
        self.next_port = (self.next_port + 1) % self.ports.len();
        let probe = SentSyn {
            from: SocketAddrV4::new(source, port),
            to,
            isn: random_u32()?,
        };
        let frame = syn_packet(&probe, tsval);
        let address = sockaddr(to);
        // SAFETY: `frame` and `address` are valid for the lengths given.
        let sent = unsafe {
            libc::sendto(
                self.socket.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&address as *const libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(probe)
    }

    /// Every SYN-ACK and RST waiting on the socket (the raw socket sees every TCP segment
    /// the host receives; the rest is skipped).
    pub fn receive(&self) -> Vec<Segment> {
        let mut segments = Vec::new();
        let mut buf = [0u8; 1500];
        loop {
            // SAFETY: `buf` is valid for its length.
            let n = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                )
            };
            if n <= 0 {
                return segments;
            }
            if let Some(segment) = parse(&buf[..n as usize]) {
                segments.push(segment);
            }
        }
    }
}

/// The SYN as an IPv4 packet.
pub fn syn_packet(probe: &SentSyn, tsval: u32) -> Vec<u8> {
    let mut options = [0u8; 16];
    options[..4].copy_from_slice(&[2, 4, (MSS >> 8) as u8, MSS as u8]);
    options[4] = 1;
    options[5] = 1;
    options[6] = 8;
    options[7] = 10;
    options[8..12].copy_from_slice(&tsval.to_be_bytes());
    let mut packet = vec![0u8; SYN_LEN];
    let (src, dst) = (u32::from(*probe.from.ip()), u32::from(*probe.to.ip()));
    ipv4::write_header(&mut packet, src, dst, ip_proto::TCP, SYN_LEN as u16, 64);
    TcpHeader {
        src_port: probe.from.port(),
        dst_port: probe.to.port(),
        seq: probe.isn,
        ack: 0,
        flags: flags::SYN,
        window: WINDOW,
        options: &options,
    }
    .write(&mut packet[20..], src, dst, &[]);
    packet
}

/// A SYN-ACK or RST in an IPv4 packet as the raw socket delivers it; `None` for anything
/// else, malformed packets included.
pub fn parse(packet: &[u8]) -> Option<Segment> {
    let ip = Ipv4Packet::new_checked(packet).ok()?;
    if ip.protocol() != ip_proto::TCP || ip.is_fragment() {
        return None;
    }
    let tcp = TcpSegment::new_checked(ip.payload()).ok()?;
    let answer = match tcp.flags() & (flags::SYN | flags::ACK | flags::RST) {
        f if f == flags::SYN | flags::ACK => {
            let options = tcp.options();
            let tsval = tcp_options::find_timestamp_slow(options)
                .ok()
                .flatten()
                .map(|at| tcp_options::tsval(options, at));
            SynAnswer::SynAck { tsval }
        }
        f if f & flags::RST != 0 => SynAnswer::Reset,
        _ => return None,
    };
    Some(Segment {
        from: SocketAddrV4::new(ip.src_addr(), tcp.src_port()),
        to: SocketAddrV4::new(ip.dst_addr(), tcp.dst_port()),
        ack: tcp.ack(),
        answer,
    })
}

/// The source address the kernel's route toward `to` uses: the local address of a UDP
/// socket connected there (connecting a UDP socket sends nothing).
pub fn route_source(to: SocketAddrV4) -> io::Result<Ipv4Addr> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    socket.connect(to)?;
    match socket.local_addr()? {
        std::net::SocketAddr::V4(local) => Ok(*local.ip()),
        std::net::SocketAddr::V6(_) => Err(io::Error::other("an IPv6 source for an IPv4 server")),
    }
}

/// A TCP socket bound to a port of the kernel's choice and held: the port is the probes'.
fn hold_port() -> io::Result<(OwnedFd, u16)> {
    // SAFETY: plain socket calls on a descriptor owned at once; `address` and `len` are
    // valid for what the calls write.
    unsafe {
        let fd = libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            libc::IPPROTO_TCP,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let mut address = sockaddr(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
        let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(
            fd.as_raw_fd(),
            (&address as *const libc::sockaddr_in).cast(),
            len,
        ) < 0
        {
            return Err(io::Error::last_os_error());
        }
        if libc::getsockname(
            fd.as_raw_fd(),
            (&mut address as *mut libc::sockaddr_in).cast(),
            &mut len,
        ) < 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok((fd, u16::from_be(address.sin_port)))
    }
}

fn sockaddr(address: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: address.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*address.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn set_option(socket: &OwnedFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: `value` is a valid int for the length given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&value as *const i32).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A random ISN from the kernel's generator: a probe's sequence number must not be
/// guessable, or anyone could answer for a server.
fn random_u32() -> io::Result<u32> {
    let mut bytes = [0u8; 4];
    crate::entropy::fill(&mut bytes)?;
    Ok(u32::from_ne_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use cheetah_core::wire::tcp::checksum_is_valid;

    use super::*;

    fn probe() -> SentSyn {
        SentSyn {
            from: "10.20.0.1:41000".parse().unwrap(),
            to: "10.20.0.11:80".parse().unwrap(),
            isn: 0xffff_ffff,
        }
    }

    #[test]
    fn the_syn_carries_the_timestamp_option_and_valid_checksums() {
        let packet = syn_packet(&probe(), 0x1234_5678);
        let ip = Ipv4Packet::new_checked(&packet[..]).unwrap();
        assert!(ip.header_checksum_is_valid());
        assert_eq!(ip.src_addr(), Ipv4Addr::new(10, 20, 0, 1));
        let tcp = TcpSegment::new_checked(ip.payload()).unwrap();
        assert_eq!(tcp.flags(), flags::SYN);
        assert_eq!(tcp.seq(), 0xffff_ffff);
        assert_eq!((tcp.src_port(), tcp.dst_port()), (41000, 80));
        let at = tcp_options::find_timestamp_slow(tcp.options())
            .unwrap()
            .unwrap();
        assert_eq!(tcp_options::tsval(tcp.options(), at), 0x1234_5678);
        assert!(checksum_is_valid(ip.payload(), ip.src(), ip.dst()));
    }

    /// A server's answer, as the raw socket would read it.
    fn answer(flags: u8, ack: u32, options: &[u8]) -> Vec<u8> {
        let len = 20 + 20 + options.len();
        let mut packet = vec![0u8; len];
        let (src, dst) = (0x0a14_000b, 0x0a14_0001);
        ipv4::write_header(&mut packet, src, dst, ip_proto::TCP, len as u16, 64);
        TcpHeader {
            src_port: 80,
            dst_port: 41000,
            seq: 7,
            ack,
            flags,
            window: 100,
            options,
        }
        .write(&mut packet[20..], src, dst, &[]);
        packet
    }

    #[test]
    fn answers_match_by_addresses_ports_and_the_isn() {
        let timestamps = [1, 1, 8, 10, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0];
        let syn_ack = parse(&answer(flags::SYN | flags::ACK, 0, &timestamps)).unwrap();
        assert_eq!(
            syn_ack.answers(&probe()),
            Some(SynAnswer::SynAck {
                tsval: Some(0xdead_beef)
            }),
            "ISN 0xffffffff + 1 wraps to 0"
        );
        let wrong_isn = SentSyn { isn: 5, ..probe() };
        assert_eq!(syn_ack.answers(&wrong_isn), None);
        let other_port = SentSyn {
            from: "10.20.0.1:41001".parse().unwrap(),
            ..probe()
        };
        assert_eq!(syn_ack.answers(&other_port), None);

        let plain = parse(&answer(flags::SYN | flags::ACK, 0, &[])).unwrap();
        assert_eq!(
            plain.answers(&probe()),
            Some(SynAnswer::SynAck { tsval: None })
        );
        let reset = parse(&answer(flags::RST | flags::ACK, 0, &[])).unwrap();
        assert_eq!(reset.answers(&probe()), Some(SynAnswer::Reset));
    }

    #[test]
    fn other_segments_and_malformed_packets_are_skipped() {
        assert_eq!(parse(&answer(flags::ACK, 0, &[])), None);
        assert_eq!(parse(&answer(flags::SYN, 0, &[])), None);
        assert_eq!(parse(&[0x45, 0, 0]), None);
        let mut truncated = answer(flags::SYN | flags::ACK, 0, &[]);
        truncated.truncate(30);
        assert_eq!(parse(&truncated), None);
    }
}
