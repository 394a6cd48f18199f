//! Crafted client frames for abuse tests: TCP segments with forged cookies, and malformed
//! packets, each with the verdict the LB should reach.
//!
//! `cheetah testbed inject` sends these from a client namespace; the live tests rebuild
//! the same forged segments from the same seed to know, packet by packet, what the LB must
//! do with them. Frame building lives here, in the library, so that both sides share one
//! definition.

use std::net::{Ipv4Addr, SocketAddrV4};

use cheetah_core::testkit::{options, qinq_tagged, refill_ipv4_checksum, vlan_tagged, TcpFrame};
use cheetah_core::types::Mac;
use cheetah_core::verdict::DropReason;
use cheetah_core::wire::tcp::{self, flags};
use cheetah_core::wire::tcp_options::kind;
use cheetah_core::wire::{checksum, icmp, ip_proto, Icmpv4Packet};
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

const ETH: usize = 14;
const IP: usize = 20;
/// Where the TCP header starts in an untagged frame without IP options.
const L4: usize = ETH + IP;

/// Who sends and where to: the client's interface, its next hop, and the VIP.
#[derive(Clone, Copy, Debug)]
pub struct Addressing {
    pub src_mac: Mac,
    /// The next hop's MAC: the client's gateway (a router, or the LB itself).
    pub dst_mac: Mac,
    pub src_ip: Ipv4Addr,
    pub target: SocketAddrV4,
}

impl Addressing {
    /// A well-formed ACK from `client_port` to the target with `options`.
    fn ack(&self, client_port: u16, seq: u32, ack: u32, options: Vec<u8>) -> TcpFrame {
        TcpFrame {
            src_mac: self.src_mac,
            dst_mac: self.dst_mac,
            src_ip: u32::from(self.src_ip),
            dst_ip: u32::from(*self.target.ip()),
            src_port: client_port,
            dst_port: self.target.port(),
            seq,
            ack,
            flags: flags::ACK,
            options,
            payload: Vec::new(),
        }
    }
}

/// One ACK carrying a random cookie: what a client without the key can send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForgedAck {
    pub client_port: u16,
    pub seq: u32,
    pub ack: u32,
    pub tsval: u32,
    /// The echoed timestamp; its 16 MSB are the cookie the LB decodes.
    pub tsecr: u32,
}

impl ForgedAck {
    /// The frame: NOP NOP TS, as a Linux client's established segments carry it.
    pub fn frame(&self, to: &Addressing) -> Vec<u8> {
        to.ack(
            self.client_port,
            self.seq,
            self.ack,
            options::nop_nop_ts(self.tsval, self.tsecr),
        )
        .build()
    }
}

/// The lowest client port a forged segment uses: below are the ports a host's own
/// services would hold.
pub const FORGED_PORT_MIN: u16 = 1024;

/// The forged segments for `seed`, endless; the same seed gives the same sequence.
pub fn forged_acks(seed: u64) -> impl Iterator<Item = ForgedAck> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let ports = u32::from(u16::MAX - FORGED_PORT_MIN) + 1;
    std::iter::repeat_with(move || {
        // Multiply-shift keeps the port uniform without a modulo bias.
        let port_draw = (u64::from(rng.next_u32()) * u64::from(ports)) >> 32;
        ForgedAck {
            client_port: FORGED_PORT_MIN + port_draw as u16,
            seq: rng.next_u32(),
            ack: rng.next_u32(),
            tsval: rng.next_u32(),
            tsecr: rng.next_u32(),
        }
    })
}

/// A segment that claims to be a server's reply: from a server's address and port (a VIP's
/// in l2, a DIP:backend_port in nat) with a TSval of the sender's choosing. Sent from the
/// client side, it must never teach the LB a server clock (docs/timestamps.md, "Who
/// moves a server's clock").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpoofedReply {
    pub from: SocketAddrV4,
    pub tsval: u32,
    /// The n-th of a burst: each takes its own destination port, so the frames are distinct flows.
    pub n: u16,
}

impl SpoofedReply {
    /// An ACK from `from` to the target, NOP NOP TS with a zero TSecr. `to.src_mac` is the
    /// source MAC it claims (a server's, to pass an l2 LB's MAC check).
    pub fn frame(&self, to: &Addressing) -> Vec<u8> {
        TcpFrame {
            src_mac: to.src_mac,
            dst_mac: to.dst_mac,
            src_ip: u32::from(*self.from.ip()),
            dst_ip: u32::from(*to.target.ip()),
            src_port: self.from.port(),
            dst_port: to.target.port().wrapping_add(self.n),
            seq: 0x5eed_0000 | u32::from(self.n),
            ack: 1,
            flags: flags::ACK,
            options: options::nop_nop_ts(self.tsval, 0),
            payload: Vec::new(),
        }
        .build()
    }
}

/// What happens to a malformed frame on its way through the LB's host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The XDP program hands it to the LB, which drops it and counts this reason.
    LbDrop(DropReason),
    /// The XDP program cannot read the IPv4 addresses of a frame this short, so it passes
    /// it to the host kernel, whose IP layer drops it and counts it in `/proc/net/snmp`
    /// under `Ip: InHdrErrors` (in the LB's namespace).
    HostIpHeaderError,
}

macro_rules! malformed_kinds {
    ($($variant:ident => $name:literal, $outcome:expr, $what:literal;)*) => {
        /// A kind of frame addressed to a VIP that the LB must drop: malformed, or of a
        /// protocol or ICMP message it serves nothing for.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Malformed {
            $(#[doc = $what] $variant,)*
        }

        impl Malformed {
            pub const ALL: &'static [Malformed] = &[$(Malformed::$variant,)*];

            /// Stable snake_case name, used in `inject`'s summary.
            pub fn name(self) -> &'static str {
                match self {
                    $(Malformed::$variant => $name,)*
                }
            }

            pub fn outcome(self) -> Outcome {
                match self {
                    $(Malformed::$variant => $outcome,)*
                }
            }

            /// What is wrong with the frame, in a sentence.
            pub fn description(self) -> &'static str {
                match self {
                    $(Malformed::$variant => $what,)*
                }
            }
        }
    };
}

use DropReason as R;
use Outcome::{HostIpHeaderError, LbDrop};

malformed_kinds! {
    TruncatedIpv4Header => "truncated_ipv4_header", HostIpHeaderError,
        "The frame ends 12 bytes into the IPv4 header.";
    Ipv4IhlBelow5 => "ipv4_ihl_below_5", LbDrop(R::BadIpv4HeaderLength),
        "IPv4 IHL 4 (16 bytes), below the 20-byte minimum.";
    Ipv4IhlPastEnd => "ipv4_ihl_past_end", LbDrop(R::BadIpv4HeaderLength),
        "IPv4 IHL 15 (60 bytes) in a 52-byte packet.";
    Ipv4TotalLengthPastFrame => "ipv4_total_length_past_frame", LbDrop(R::BadIpv4TotalLength),
        "IPv4 total length 100 bytes beyond the end of the frame.";
    TruncatedTcpHeader => "truncated_tcp_header", LbDrop(R::TruncatedTcp),
        "A TCP header cut after 12 bytes (ports, sequence and acknowledgement numbers).";
    TcpDataOffsetBelow5 => "tcp_data_offset_below_5", LbDrop(R::BadTcpDataOffset),
        "TCP data offset 4 (16 bytes), below the 20-byte minimum.";
    TcpDataOffsetPastEnd => "tcp_data_offset_past_end", LbDrop(R::BadTcpDataOffset),
        "TCP data offset 15 (60 bytes) in a 32-byte segment.";
    TcpOptionLength0 => "tcp_option_length_0", LbDrop(R::TcpOptionBadLength),
        "NOP NOP, then an MSS option with length 0.";
    TcpOptionLength1 => "tcp_option_length_1", LbDrop(R::TcpOptionBadLength),
        "NOP NOP, then an MSS option with length 1.";
    TcpOptionWithoutLength => "tcp_option_without_length", LbDrop(R::TcpOptionTruncated),
        "Eleven NOPs, then an MSS kind byte in the last byte of the options, with no length.";
    TcpOptionPastHeader => "tcp_option_past_header", LbDrop(R::TcpOptionOverrun),
        "NOP NOP, then a SACK option of 18 bytes in the 10 bytes left of the TCP header.";
    TimestampOptionBadLength => "timestamp_option_bad_length", LbDrop(R::BadTimestampOptionLength),
        "NOP NOP, then a timestamp option of length 8 instead of 10.";
    Ipv4FirstFragment => "ipv4_first_fragment", LbDrop(R::UnsupportedFragment),
        "The first fragment (more-fragments set, offset 0) of a TCP segment to the VIP.";
    Ipv4LaterFragment => "ipv4_later_fragment", LbDrop(R::UnsupportedFragment),
        "A later fragment (offset 1480 bytes, the last one) of a TCP segment to the VIP.";
    IcmpEchoRequest => "icmp_echo_request", LbDrop(R::UnsupportedIcmpType),
        "A ping of the VIP address: ICMP echo request with 56 bytes of data.";
    IcmpTruncated => "icmp_truncated", LbDrop(R::TruncatedIcmp),
        "An ICMP message of 4 bytes, shorter than its header.";
    IcmpQuotingUdp => "icmp_quoting_udp", LbDrop(R::UnsupportedIcmpType),
        "Fragmentation needed quoting a UDP datagram from the VIP address.";
    IcmpQuotingAnotherSource => "icmp_quoting_another_source", LbDrop(R::UnsupportedIcmpType),
        "Fragmentation needed quoting a TCP segment from an address next to the VIP's.";
    IcmpQuotingUnknownPort => "icmp_quoting_unknown_port", LbDrop(R::VipPortUnknown),
        "Fragmentation needed quoting a TCP segment from port 8443 of the VIP address, where the testbed has no VIP.";
    UdpToVip => "udp_to_vip", LbDrop(R::UnsupportedUdp),
        "A UDP datagram to the VIP address, port 53.";
    VlanTaggedFragment => "vlan_tagged_fragment", LbDrop(R::UnsupportedFragment),
        "The first fragment of a TCP segment to the VIP, in an 802.1Q frame (VLAN 42).";
    QinqTaggedEchoRequest => "qinq_tagged_echo_request", LbDrop(R::UnsupportedIcmpType),
        "A ping of the VIP address in a QinQ frame (802.1ad S-VLAN 7, then 802.1Q VLAN 42).";
}

impl Malformed {
    /// The `n`th frame of this kind: a well-formed ACK with NOP NOP TS from client port
    /// `40000 + n % 20000`, with one defect. Everything else, checksums included, stays
    /// valid where the defect leaves a header to checksum, so the defect alone decides.
    pub fn frame(self, to: &Addressing, n: u32) -> Vec<u8> {
        let port = 40_000 + (n % 20_000) as u16;
        let (seq, ack) = (n.wrapping_mul(0x9e37_79b9), 1);
        let with_options = |options: Vec<u8>| to.ack(port, seq, ack, options).build();
        let mut frame = with_options(options::nop_nop_ts(n, 0x1234_5678));
        match self {
            Malformed::TruncatedIpv4Header => frame.truncate(ETH + 12),
            Malformed::Ipv4IhlBelow5 => {
                frame[ETH] = 0x44;
                refill_ipv4_checksum(&mut frame, ETH);
            }
            // The header checksum would run past the frame: it stays as it was.
            Malformed::Ipv4IhlPastEnd => frame[ETH] = 0x4f,
            Malformed::Ipv4TotalLengthPastFrame => {
                let past_end = frame.len() - ETH + 100;
                set_total_len(&mut frame, past_end);
            }
            Malformed::TruncatedTcpHeader => {
                frame.truncate(L4 + 12);
                set_total_len(&mut frame, IP + 12);
            }
            Malformed::TcpDataOffsetBelow5 => {
                frame[L4 + 12] = 4 << 4;
                refill_tcp_checksum(&mut frame);
            }
            Malformed::TcpDataOffsetPastEnd => {
                frame[L4 + 12] = 15 << 4;
                refill_tcp_checksum(&mut frame);
            }
            Malformed::TcpOptionLength0 => frame = with_options(padded(&[1, 1, kind::MSS, 0])),
            Malformed::TcpOptionLength1 => frame = with_options(padded(&[1, 1, kind::MSS, 1])),
            Malformed::TcpOptionWithoutLength => {
                let mut nops = vec![kind::NOP; 11];
                nops.push(kind::MSS);
                frame = with_options(nops);
            }
            Malformed::TcpOptionPastHeader => frame = with_options(padded(&[1, 1, kind::SACK, 18])),
            Malformed::TimestampOptionBadLength => {
                frame = with_options(padded(&[1, 1, kind::TIMESTAMP, 8, 0, 0, 0, 1]))
            }
            Malformed::Ipv4FirstFragment => set_fragment(&mut frame, true, 0),
            Malformed::Ipv4LaterFragment => set_fragment(&mut frame, false, 1480),
            Malformed::IcmpEchoRequest => frame = echo_request(to, n),
            Malformed::IcmpTruncated => {
                frame = ip_datagram(
                    to,
                    ip_proto::ICMP,
                    &[icmp::message::DESTINATION_UNREACHABLE, 4, 0, 0],
                )
            }
            Malformed::IcmpQuotingUdp => {
                let mut quote = quoted_reply(to, port, to.target.port());
                quote[9] = ip_proto::UDP;
                frame = frag_needed(to, &quote);
            }
            Malformed::IcmpQuotingAnotherSource => {
                let mut quote = quoted_reply(to, port, to.target.port());
                quote[15] ^= 0x01;
                frame = frag_needed(to, &quote);
            }
            Malformed::IcmpQuotingUnknownPort => {
                frame = frag_needed(to, &quoted_reply(to, port, 8443))
            }
            Malformed::UdpToVip => {
                const LEN: u16 = 8 + 32;
                let mut datagram = [0u8; LEN as usize];
                datagram[0..2].copy_from_slice(&port.to_be_bytes());
                datagram[2..4].copy_from_slice(&53u16.to_be_bytes());
                datagram[4..6].copy_from_slice(&LEN.to_be_bytes());
                // Checksum 0: none, which IPv4 allows for UDP.
                frame = ip_datagram(to, ip_proto::UDP, &datagram)
            }
            Malformed::VlanTaggedFragment => {
                set_fragment(&mut frame, true, 0);
                frame = vlan_tagged(&frame);
            }
            Malformed::QinqTaggedEchoRequest => frame = qinq_tagged(&echo_request(to, n)),
        }
        frame
    }
}

/// An IPv4 frame from the sender to the target's address carrying `payload` as `protocol`,
/// its header checksum filled.
fn ip_datagram(to: &Addressing, protocol: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = to.ack(0, 0, 0, Vec::new()).build();
    frame.truncate(L4);
    frame.extend_from_slice(payload);
    frame[ETH + 9] = protocol;
    set_total_len(&mut frame, IP + payload.len());
    frame
}

/// An ICMP message (checksum filled) from the sender to the target's address.
fn icmp_message(to: &Addressing, message: Vec<u8>) -> Vec<u8> {
    let mut message = message;
    Icmpv4Packet::new_checked(&mut message[..])
        .expect("an ICMP message holds its header")
        .fill_checksum();
    ip_datagram(to, ip_proto::ICMP, &message)
}

/// The `n`th ping of the target's address, as `ping` sends it: 56 bytes of data.
fn echo_request(to: &Addressing, n: u32) -> Vec<u8> {
    let mut message = vec![icmp::message::ECHO_REQUEST, 0, 0, 0, 0x0c, 0x4e];
    message.extend_from_slice(&(n as u16).to_be_bytes());
    message.extend((0..56).map(|i| i as u8));
    icmp_message(to, message)
}

/// The IPv4 header and first 8 TCP bytes of a segment from the target's address (port
/// `from_port`) to the sender's `client_port`: what an ICMP error about a reply quotes.
fn quoted_reply(to: &Addressing, client_port: u16, from_port: u16) -> Vec<u8> {
    let reply = TcpFrame {
        src_mac: to.dst_mac,
        dst_mac: to.src_mac,
        src_ip: u32::from(*to.target.ip()),
        dst_ip: u32::from(to.src_ip),
        src_port: from_port,
        dst_port: client_port,
        seq: 1,
        ack: 1,
        flags: flags::ACK,
        options: options::nop_nop_ts(1, 1),
        payload: Vec::new(),
    }
    .build();
    reply[ETH..L4 + 8].to_vec()
}

/// "Fragmentation needed" (next-hop MTU 1400) quoting `quote`, as a router on the way to the
/// client would send it to the VIP.
fn frag_needed(to: &Addressing, quote: &[u8]) -> Vec<u8> {
    let mut message = vec![icmp::message::DESTINATION_UNREACHABLE, 4, 0, 0, 0, 0];
    message.extend_from_slice(&1400u16.to_be_bytes());
    message.extend_from_slice(quote);
    icmp_message(to, message)
}

/// 12 option bytes: `start`, then END padding (the walk stops before it reaches them).
fn padded(start: &[u8]) -> Vec<u8> {
    let mut options = start.to_vec();
    options.resize(12, kind::END);
    options
}

fn set_total_len(frame: &mut [u8], total_len: usize) {
    frame[ETH + 2..ETH + 4].copy_from_slice(&(total_len as u16).to_be_bytes());
    refill_ipv4_checksum(frame, ETH);
}

/// Sets the fragment fields (offset in bytes, a multiple of 8); DF is cleared, as a
/// fragmented packet cannot have it.
fn set_fragment(frame: &mut [u8], more_fragments: bool, offset: usize) {
    let field = (u16::from(more_fragments) << 13) | (offset / 8) as u16;
    frame[ETH + 6..ETH + 8].copy_from_slice(&field.to_be_bytes());
    refill_ipv4_checksum(frame, ETH);
}

/// Recomputes the TCP checksum over everything from the TCP header to the frame's end.
fn refill_tcp_checksum(frame: &mut [u8]) {
    let src = u32::from_be_bytes(frame[ETH + 12..ETH + 16].try_into().unwrap());
    let dst = u32::from_be_bytes(frame[ETH + 16..ETH + 20].try_into().unwrap());
    frame[L4 + 16..L4 + 18].fill(0);
    let segment = &frame[L4..];
    let sum =
        tcp::pseudo_header_sum(src, dst, ip_proto::TCP, segment.len()) + checksum::sum(segment);
    frame[L4 + 16..L4 + 18].copy_from_slice(&checksum::finish(sum).to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use cheetah_core::config::{Forwarding, Mode};
    use cheetah_core::lb::{Ingress, Worker, WorkerConfig};
    use cheetah_core::policy::PolicyKind;
    use cheetah_core::tables::ControlPlane;
    use cheetah_core::testkit::{self, checksums_valid, timestamps, CLIENT_MAC, LB_MAC, VIP};
    use cheetah_core::Verdict;
    use std::sync::Arc;

    fn addressing() -> Addressing {
        Addressing {
            src_mac: CLIENT_MAC,
            dst_mac: LB_MAC,
            src_ip: Ipv4Addr::new(10, 2, 0, 7),
            target: SocketAddrV4::new(Ipv4Addr::from(VIP), testkit::VIP_PORT),
        }
    }

    fn worker() -> Worker {
        let config = testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 4);
        let plane = ControlPlane::new(&config, &cheetah_core::hash::Secret([7; 16])).unwrap();
        Worker::new(Arc::clone(plane.shared()), WorkerConfig::new(0, 1, &config))
    }

    #[test]
    fn the_same_seed_forges_the_same_segments() {
        let a: Vec<_> = forged_acks(7).take(100).collect();
        let b: Vec<_> = forged_acks(7).take(100).collect();
        let c: Vec<_> = forged_acks(8).take(100).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|f| f.client_port >= FORGED_PORT_MIN));
    }

    #[test]
    fn forged_frames_are_well_formed_acks_with_their_timestamps() {
        for forged in forged_acks(1).take(50) {
            let frame = forged.frame(&addressing());
            assert!(checksums_valid(&frame));
            assert_eq!(timestamps(&frame), Some((forged.tsval, forged.tsecr)));
            assert_eq!(frame[L4 + 13], flags::ACK);
        }
    }

    /// The reason each kind promises is the one the pipeline gives, through the same
    /// worker the data path runs (the XDP program's part is checked by the live tests).
    #[test]
    fn each_malformed_kind_gets_its_drop_reason() {
        let mut worker = worker();
        for kind in Malformed::ALL {
            for n in 0..3 {
                let mut frame = kind.frame(&addressing(), n);
                let verdict = worker.process(&mut frame, 1_000_000, Ingress::ServerSide);
                match kind.outcome() {
                    Outcome::LbDrop(reason) => {
                        assert_eq!(verdict, Verdict::Drop(reason), "{}", kind.name())
                    }
                    // What the core would say if it ever saw one.
                    Outcome::HostIpHeaderError => {
                        assert_eq!(verdict, Verdict::Drop(DropReason::TruncatedIpv4))
                    }
                }
            }
        }
    }

    #[test]
    fn malformed_frames_keep_valid_checksums_where_a_header_is_left() {
        for kind in [
            Malformed::Ipv4IhlBelow5,
            Malformed::Ipv4TotalLengthPastFrame,
            Malformed::TruncatedTcpHeader,
            Malformed::Ipv4FirstFragment,
            Malformed::Ipv4LaterFragment,
            Malformed::IcmpTruncated,
            Malformed::UdpToVip,
        ] {
            let frame = kind.frame(&addressing(), 0);
            let ihl = usize::from(frame[ETH] & 0x0f) * 4;
            assert_eq!(
                checksum::fold(checksum::sum(&frame[ETH..ETH + ihl])),
                0xffff,
                "{}",
                kind.name()
            );
        }
        for kind in [
            Malformed::TcpDataOffsetBelow5,
            Malformed::TcpOptionLength0,
            Malformed::TimestampOptionBadLength,
        ] {
            assert!(
                checksums_valid(&kind.frame(&addressing(), 0)),
                "{}",
                kind.name()
            );
        }
    }

    /// Only the ICMP type or the quote is wrong: both checksums verify.
    #[test]
    fn icmp_kinds_are_well_formed_messages() {
        for kind in [
            Malformed::IcmpEchoRequest,
            Malformed::IcmpQuotingUdp,
            Malformed::IcmpQuotingAnotherSource,
            Malformed::IcmpQuotingUnknownPort,
        ] {
            let frame = kind.frame(&addressing(), 3);
            let ip = cheetah_core::wire::Ipv4Packet::new_checked(&frame[ETH..]).unwrap();
            assert!(ip.header_checksum_is_valid(), "{}", kind.name());
            assert_eq!(ip.total_len(), frame.len() - ETH, "{}", kind.name());
            assert!(icmp::checksum_is_valid(&frame[L4..]), "{}", kind.name());
        }
    }

    #[test]
    fn malformed_names_are_unique() {
        let mut names: Vec<_> = Malformed::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Malformed::ALL.len());
    }
}
