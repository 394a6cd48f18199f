//! Packet and config builders for tests, benchmarks, fuzz seeds and test vectors.
//!
//! Everything here builds real wire bytes with correct checksums, so what the pipeline is
//! tested on is what a Linux stack would send.

pub mod churn;

use crate::config::{Forwarding, LbConfig, Mode, ServerConfig, VipConfig};
use crate::policy::PolicyKind;
use crate::tables::{ControlState, SavedServer, SavedServerState};
use crate::types::{format_mac, Mac};
use crate::wire::ethernet::{self, ethertype};
use crate::wire::tcp::{self, TcpHeader};
use crate::wire::tcp_options::{self, kind, SegmentKind, TSECR, TSVAL};
use crate::wire::{icmp, ip_proto, ipv4, Ipv4Packet, TcpSegment};

pub const LB_MAC: Mac = [0x02, 0x00, 0x00, 0x00, 0x00, 0xfe];
pub const CLIENT_MAC: Mac = [0x02, 0x00, 0x00, 0x00, 0x00, 0xc1];
pub const VIP: u32 = 0x0a00_0064; // 10.0.0.100
pub const VIP_PORT: u16 = 80;

/// A saved state holding only server `id`, removed and quarantined for a minute, whose DIP
/// was `dip`: what `ControlPlane::restore_quarantine` keeps across a restart (the one way a
/// removed server's address can be a VIP's: the new config put a VIP there).
pub fn removed_server_state(id: u16, dip: u32) -> ControlState {
    ControlState {
        servers: vec![SavedServer {
            id,
            dip: std::net::Ipv4Addr::from(dip).into(),
            mac: Some(format_mac(&server_mac(id))),
            state: SavedServerState::Removed,
            quarantine_left_secs: Some(60),
        }],
        vips: Vec::new(),
    }
}

/// MAC of test server `id`.
pub fn server_mac(id: u16) -> Mac {
    [0x02, 0x00, 0x00, 0x01, (id >> 8) as u8, id as u8]
}

/// DIP of test server `id` (10.1.x.y).
pub fn server_dip(id: u16) -> u32 {
    0x0a01_0000 | id as u32
}

/// Client `n`'s address (10.2.x.y).
pub fn client_ip(n: u32) -> u32 {
    0x0a02_0000 | (n & 0xffff)
}

/// A config with one VIP (10.0.0.100:80) over servers `1..=servers`.
pub fn config(mode: Mode, forwarding: Forwarding, policy: PolicyKind, servers: u16) -> LbConfig {
    LbConfig {
        mode,
        forwarding,
        cookie_epoch_bits: crate::cookie::CookieLayout::DEFAULT_EPOCH_BITS,
        quarantine_secs: 600,
        fallback_table_capacity: 4096,
        maglev_table_size: crate::policy::maglev::DEFAULT_TABLE_SIZE,
        icmp_copy_rate: 10,
        icmp_copy_burst: 5,
        servers: (1..=servers)
            .map(|id| ServerConfig {
                id,
                dip: std::net::Ipv4Addr::from(server_dip(id)).into(),
                mac: Some(format_mac(&server_mac(id))),
                state: Default::default(),
            })
            .collect(),
        vips: vec![VipConfig {
            address: std::net::Ipv4Addr::from(VIP).into(),
            port: VIP_PORT,
            policy,
            load_metric: None,
            backend_port: None,
            servers: (1..=servers).collect(),
            weights: Default::default(),
            health: Default::default(),
        }],
    }
}

/// TCP option layouts seen in the wild (paper Table 1 and the slow-path rest).
pub mod options {
    use super::*;

    fn ts(tsval: u32, tsecr: u32) -> [u8; 10] {
        let mut o = [kind::TIMESTAMP, 10, 0, 0, 0, 0, 0, 0, 0, 0];
        o[2..6].copy_from_slice(&tsval.to_be_bytes());
        o[6..10].copy_from_slice(&tsecr.to_be_bytes());
        o
    }

    fn pad(mut v: Vec<u8>) -> Vec<u8> {
        while !v.len().is_multiple_of(4) {
            v.push(kind::END);
        }
        v
    }

    /// Linux SYN / SYN-ACK: MSS SAckOK TS NOP WS.
    pub fn linux_syn(tsval: u32, tsecr: u32) -> Vec<u8> {
        pad([
            &[kind::MSS, 4, 0x05, 0xb4, kind::SACK_PERMITTED, 2][..],
            &ts(tsval, tsecr),
            &[kind::NOP, kind::WINDOW_SCALE, 3, 7],
        ]
        .concat())
    }

    /// macOS / iOS SYN: MSS NOP WS NOP NOP TS SAckOK EOL.
    pub fn apple_syn(tsval: u32, tsecr: u32) -> Vec<u8> {
        pad([
            &[
                kind::MSS,
                4,
                0x05,
                0xb4,
                kind::NOP,
                kind::WINDOW_SCALE,
                3,
                6,
                kind::NOP,
                kind::NOP,
            ][..],
            &ts(tsval, tsecr),
            &[kind::SACK_PERMITTED, 2, 0, 0],
        ]
        .concat())
    }

    /// MSS NOP WS SAckOK TS.
    pub fn mss_nop_ws_sackok_ts(tsval: u32, tsecr: u32) -> Vec<u8> {
        pad([
            &[
                kind::MSS,
                4,
                0x05,
                0xb4,
                kind::NOP,
                kind::WINDOW_SCALE,
                3,
                7,
                kind::SACK_PERMITTED,
                2,
            ][..],
            &ts(tsval, tsecr),
        ]
        .concat())
    }

    /// Windows SYN: MSS NOP WS NOP NOP SAckOK, no timestamp.
    pub fn windows_syn() -> Vec<u8> {
        vec![
            kind::MSS,
            4,
            0x05,
            0xb4,
            kind::NOP,
            kind::WINDOW_SCALE,
            3,
            8,
            kind::NOP,
            kind::NOP,
            kind::SACK_PERMITTED,
            2,
        ]
    }

    /// Established: NOP NOP TS.
    pub fn nop_nop_ts(tsval: u32, tsecr: u32) -> Vec<u8> {
        [&[kind::NOP, kind::NOP][..], &ts(tsval, tsecr)].concat()
    }

    /// Established, slow path with TSecr at an odd offset: NOP TS NOP.
    pub fn nop_ts_nop(tsval: u32, tsecr: u32) -> Vec<u8> {
        [&[kind::NOP][..], &ts(tsval, tsecr), &[kind::NOP]].concat()
    }

    /// Established with SACK: NOP NOP TS NOP NOP SACK(1 block).
    pub fn nop_nop_ts_sack(tsval: u32, tsecr: u32) -> Vec<u8> {
        [
            &[kind::NOP, kind::NOP][..],
            &ts(tsval, tsecr),
            &[kind::NOP, kind::NOP, kind::SACK, 10, 0, 0, 0, 1, 0, 0, 0, 2],
        ]
        .concat()
    }

    /// Slow path: TS first, then padding NOPs, with TSval at an even offset but not Table 1.
    pub fn ts_first(tsval: u32, tsecr: u32) -> Vec<u8> {
        pad([&ts(tsval, tsecr)[..], &[kind::NOP, kind::NOP]].concat())
    }

    /// Slow path with the timestamp at an odd offset: MSS WS TS EOL.
    pub fn odd_offset_ts(tsval: u32, tsecr: u32) -> Vec<u8> {
        pad([
            &[kind::MSS, 4, 0x05, 0xb4, kind::WINDOW_SCALE, 3, 7][..],
            &ts(tsval, tsecr),
        ]
        .concat())
    }
}

/// One TCP/IPv4 frame to build.
#[derive(Clone, Debug)]
pub struct TcpFrame {
    pub src_mac: Mac,
    pub dst_mac: Mac,
    pub src_ip: u32,
    pub dst_ip: u32,
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub options: Vec<u8>,
    pub payload: Vec<u8>,
}

impl TcpFrame {
    /// A client -> VIP frame.
    pub fn from_client(client: u32, client_port: u16, flags: u8, options: Vec<u8>) -> Self {
        TcpFrame {
            src_mac: CLIENT_MAC,
            dst_mac: LB_MAC,
            src_ip: client,
            dst_ip: VIP,
            src_port: client_port,
            dst_port: VIP_PORT,
            seq: 1000,
            ack: if flags & tcp::flags::ACK != 0 {
                2000
            } else {
                0
            },
            flags,
            options,
            payload: Vec::new(),
        }
    }

    /// A server -> client frame as an l2 server sends it (source = VIP).
    pub fn from_server_l2(
        server: u16,
        client: u32,
        client_port: u16,
        flags: u8,
        options: Vec<u8>,
    ) -> Self {
        TcpFrame {
            src_mac: server_mac(server),
            dst_mac: LB_MAC,
            src_ip: VIP,
            dst_ip: client,
            src_port: VIP_PORT,
            dst_port: client_port,
            seq: 2000,
            ack: 1001,
            flags,
            options,
            payload: Vec::new(),
        }
    }

    /// A server -> client frame as a NAT server sends it (source = its DIP).
    pub fn from_server_nat(
        server: u16,
        client: u32,
        client_port: u16,
        flags: u8,
        options: Vec<u8>,
    ) -> Self {
        TcpFrame {
            src_ip: server_dip(server),
            ..Self::from_server_l2(server, client, client_port, flags, options)
        }
    }

    pub fn with_payload(mut self, payload: &[u8]) -> Self {
        self.payload = payload.to_vec();
        self
    }

    pub fn build(&self) -> Vec<u8> {
        let header = TcpHeader {
            src_port: self.src_port,
            dst_port: self.dst_port,
            seq: self.seq,
            ack: self.ack,
            flags: self.flags,
            window: 502,
            options: &self.options,
        };
        let l4_len = header.header_len() + self.payload.len();
        let mut frame = vec![0u8; 14 + 20 + l4_len];
        ethernet::write_header(&mut frame, &self.dst_mac, &self.src_mac, ethertype::IPV4);
        ipv4::write_header(
            &mut frame[14..],
            self.src_ip,
            self.dst_ip,
            ip_proto::TCP,
            (20 + l4_len) as u16,
            64,
        );
        header.write(&mut frame[34..], self.src_ip, self.dst_ip, &self.payload);
        frame
    }
}

/// Frame offsets of an IPv4/TCP frame's IP header, TCP header and IP payload end
/// (untagged or tagged).
pub fn tcp_view(frame: &[u8]) -> Option<(usize, usize, usize)> {
    let eth = ethernet::EthernetFrame::new_checked(frame).ok()?;
    let l3 = eth.payload_offset();
    let ip = Ipv4Packet::new_checked(&frame[l3..]).ok()?;
    (ip.protocol() == ip_proto::TCP).then(|| (l3, l3 + ip.header_len(), l3 + ip.total_len()))
}

/// The (TSval, TSecr) of a TCP frame, if it has a timestamp option.
pub fn timestamps(frame: &[u8]) -> Option<(u32, u32)> {
    let (_, l4, end) = tcp_view(frame)?;
    let segment = TcpSegment::new_checked(&frame[l4..end]).ok()?;
    let at =
        tcp_options::find_timestamp(segment.options(), SegmentKind::from_flags(segment.flags()))
            .ok()?
            .offset?;
    Some((
        tcp_options::tsval(segment.options(), at),
        tcp_options::tsecr(segment.options(), at),
    ))
}

/// The offsets of TSval and TSecr from the frame start.
pub fn timestamp_offsets(frame: &[u8]) -> Option<(usize, usize)> {
    let (_, l4, end) = tcp_view(frame)?;
    let segment = TcpSegment::new_checked(&frame[l4..end]).ok()?;
    let at = tcp_options::find_timestamp_slow(segment.options()).ok()??;
    Some((l4 + 20 + at + TSVAL, l4 + 20 + at + TSECR))
}

/// (src ip, dst ip, src port, dst port) of a TCP frame.
pub fn addresses(frame: &[u8]) -> Option<(u32, u32, u16, u16)> {
    let (l3, l4, end) = tcp_view(frame)?;
    let ip = Ipv4Packet::new_checked(&frame[l3..]).ok()?;
    let segment = TcpSegment::new_checked(&frame[l4..end]).ok()?;
    Some((ip.src(), ip.dst(), segment.src_port(), segment.dst_port()))
}

/// Whether the IPv4 header checksum and the TCP checksum of a frame verify.
pub fn checksums_valid(frame: &[u8]) -> bool {
    let Some((l3, l4, end)) = tcp_view(frame) else {
        return false;
    };
    let ip = Ipv4Packet::new_checked(&frame[l3..]).unwrap();
    ip.header_checksum_is_valid() && tcp::checksum_is_valid(&frame[l4..end], ip.src(), ip.dst())
}

/// An ICMP "fragmentation needed" from `router` to the VIP quoting `quoted` (an IPv4 packet
/// the VIP sent, from its IP header on), cut to `quote_len` bytes.
pub fn icmp_frag_needed(router: u32, quoted_frame: &[u8], quote_len: usize) -> Vec<u8> {
    let quoted = &quoted_frame[14..];
    let quote = &quoted[..quote_len.min(quoted.len())];
    let icmp_len = icmp::HEADER_LEN + quote.len();
    let mut frame = vec![0u8; 14 + 20 + icmp_len];
    ethernet::write_header(&mut frame, &LB_MAC, &CLIENT_MAC, ethertype::IPV4);
    ipv4::write_header(
        &mut frame[14..],
        router,
        VIP,
        ip_proto::ICMP,
        (20 + icmp_len) as u16,
        64,
    );
    frame[34] = icmp::message::DESTINATION_UNREACHABLE;
    frame[35] = 4;
    frame[40..42].copy_from_slice(&1400u16.to_be_bytes());
    frame[42..].copy_from_slice(quote);
    icmp::Icmpv4Packet::new_checked(&mut frame[34..])
        .unwrap()
        .fill_checksum();
    frame
}

/// Inserts an 802.1Q tag (VLAN 42) after the MAC addresses.
pub fn vlan_tagged(frame: &[u8]) -> Vec<u8> {
    let mut tagged = frame[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x2a]);
    tagged.extend_from_slice(&frame[12..]);
    tagged
}

/// Inserts an 802.1ad tag (S-VLAN 7) and an 802.1Q tag (VLAN 42) after the MAC addresses:
/// a QinQ trunk's frame.
pub fn qinq_tagged(frame: &[u8]) -> Vec<u8> {
    let mut tagged = frame[..12].to_vec();
    tagged.extend_from_slice(&[0x88, 0xa8, 0x00, 0x07]);
    tagged.extend_from_slice(&vlan_tagged(frame)[12..]);
    tagged
}

/// Inserts IP `options` (a multiple of 4 bytes, at most 40) into an untagged IPv4 frame's
/// header: IHL, total length and header checksum follow.
pub fn with_ip_options(frame: &[u8], options: &[u8]) -> Vec<u8> {
    assert!(
        options.len().is_multiple_of(4) && options.len() <= 40,
        "IP options: 4-byte words, <= 40"
    );
    let header_end = 14 + usize::from(frame[14] & 0x0f) * 4;
    let mut optioned = [&frame[..header_end], options, &frame[header_end..]].concat();
    optioned[14] += (options.len() / 4) as u8;
    let total = u16::from_be_bytes([frame[16], frame[17]]) + options.len() as u16;
    optioned[16..18].copy_from_slice(&total.to_be_bytes());
    refill_ipv4_checksum(&mut optioned, 14);
    optioned
}

/// A broadcast ARP request from the client at `sender_ip` for the VIP (passed to the host).
pub fn arp_request(sender_ip: u32) -> Vec<u8> {
    let mut frame = vec![0xff; 6];
    frame.extend_from_slice(&CLIENT_MAC);
    frame.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    frame.extend_from_slice(&CLIENT_MAC);
    frame.extend_from_slice(&sender_ip.to_be_bytes());
    frame.extend_from_slice(&[0; 6]);
    frame.extend_from_slice(&VIP.to_be_bytes());
    frame
}

/// An IPv6 TCP SYN from 2001:db8::7 (port `client_port`) to `dst` port 80.
pub fn ipv6_syn(client_port: u16, dst: std::net::Ipv6Addr) -> Vec<u8> {
    let mut frame = Vec::new();
    frame.extend_from_slice(&LB_MAC);
    frame.extend_from_slice(&CLIENT_MAC);
    frame.extend_from_slice(&[0x86, 0xdd]);
    frame.extend_from_slice(&[0x60, 0, 0, 0, 0, 20, ip_proto::TCP, 64]);
    frame.extend_from_slice(&std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 7).octets());
    frame.extend_from_slice(&dst.octets());
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&client_port.to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[12] = 0x50;
    tcp[13] = tcp::flags::SYN;
    frame.extend_from_slice(&tcp);
    frame
}

/// Recomputes the IPv4 header checksum of a frame whose header starts at `l3`, trusting
/// its IHL even when other fields were made malformed on purpose.
pub fn refill_ipv4_checksum(frame: &mut [u8], l3: usize) {
    let ihl = usize::from(frame[l3] & 0x0f) * 4;
    frame[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
    let sum = crate::wire::checksum::compute(&frame[l3..l3 + ihl]);
    frame[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
}
