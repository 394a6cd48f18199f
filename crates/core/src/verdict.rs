//! What the pipeline decided for one packet.

use crate::types::ServerId;

/// The outcome of processing one packet. The packet buffer has already been rewritten
/// for the destination the verdict names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send to this server (destination MAC, and in NAT mode the addresses, rewritten).
    ToServer(ServerId),
    /// Send toward the client; the I/O layer picks the next hop (FIB / neighbour table).
    ToClient,
    /// Copy to every active server of the VIP at index `vip` of the snapshot (an ICMP error
    /// that carries no cookie). The I/O layer calls `Worker::prepare_copy` for each copy.
    ToAllServers {
        vip: u16,
    },
    /// Not load-balanced traffic (ARP, the LB host's own traffic): hand to the host kernel.
    Pass,
    Drop(DropReason),
}

macro_rules! drop_reasons {
    ($($variant:ident => $name:literal, $doc:literal;)*) => {
        /// Why a packet was dropped. Every reason has its own counter.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum DropReason {
            $(#[doc = $doc] $variant,)*
        }

        impl DropReason {
            pub const ALL: &'static [DropReason] = &[$(DropReason::$variant,)*];
            pub const COUNT: usize = Self::ALL.len();

            /// Stable snake_case name, used in metrics and verdict logs.
            pub fn name(self) -> &'static str {
                match self {
                    $(DropReason::$variant => $name,)*
                }
            }

            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|reason| reason.name() == name)
            }

            pub fn description(self) -> &'static str {
                match self {
                    $(DropReason::$variant => $doc,)*
                }
            }
        }
    };
}

drop_reasons! {
    TruncatedEthernet => "truncated_ethernet", "Frame shorter than its Ethernet/802.1Q header.";
    TruncatedIpv4 => "truncated_ipv4", "Shorter than an IPv4 header.";
    BadIpVersion => "bad_ip_version", "IP version field disagrees with the EtherType.";
    BadIpv4HeaderLength => "bad_ipv4_header_length", "IPv4 IHL below 5 or past the packet end.";
    BadIpv4TotalLength => "bad_ipv4_total_length", "IPv4 total length shorter than its header or longer than the frame.";
    TruncatedIpv6 => "truncated_ipv6", "Shorter than an IPv6 header.";
    BadIpv6PayloadLength => "bad_ipv6_payload_length", "IPv6 payload length longer than the frame.";
    BadIpv6ExtensionHeader => "bad_ipv6_extension_header", "IPv6 extension header chain runs past the packet or is too long.";
    TruncatedTcp => "truncated_tcp", "Shorter than a TCP header.";
    BadTcpDataOffset => "bad_tcp_data_offset", "TCP data offset below 5 or past the segment end.";
    TcpOptionTruncated => "tcp_option_truncated", "A TCP option kind without its length byte.";
    TcpOptionBadLength => "tcp_option_bad_length", "A TCP option with length 0 or 1.";
    TcpOptionOverrun => "tcp_option_overrun", "A TCP option running past the TCP header.";
    BadTimestampOptionLength => "bad_timestamp_option_length", "A TCP timestamp option whose length is not 10.";
    TruncatedUdp => "truncated_udp", "Shorter than a UDP header.";
    TruncatedIcmp => "truncated_icmp", "ICMP message too short for its type.";
    UnsupportedFragment => "unsupported_fragment", "IPv4 fragment addressed to a VIP.";
    UnsupportedIpv6 => "unsupported_ipv6", "IPv6 traffic to a VIP (not supported yet).";
    UnsupportedUdp => "unsupported_udp", "UDP traffic to a VIP (not supported yet).";
    UnsupportedProtocol => "unsupported_protocol", "An IP protocol other than TCP, UDP or ICMP to a VIP.";
    UnsupportedIcmpType => "unsupported_icmp_type", "An ICMP message to a VIP that is not an error about a TCP connection.";
    VipPortUnknown => "vip_port_unknown", "TCP to a VIP address on a port no VIP is configured for.";
    NoServerAvailable => "no_server_available", "A new connection for a VIP whose pool has no active server.";
    CookieUnknownServer => "cookie_unknown_server", "The cookie decodes to a server id that is not allocated.";
    CookieServerRemoved => "cookie_server_removed", "The cookie decodes to a removed (retired) server.";
    FallbackServerRemoved => "fallback_server_removed", "A connection without timestamps whose server (remembered in the fallback table) was removed.";
    TsMsbUnknown => "ts_msb_unknown", "The server's timestamp MSB is not known yet, so the echoed timestamp cannot be restored.";
    UnknownServerSource => "unknown_server_source", "A packet from a VIP whose sender is not a known server.";
    ServerRemoved => "server_removed", "A packet from a server that has been removed.";
    IcmpRateLimited => "icmp_rate_limited", "An ICMP error without a cookie beyond the copy-to-all rate limit.";
    ReplyFromClientSide => "reply_from_client_side", "A segment whose source says it is a server's reply, arriving on a client-side interface: forged (replies come from the servers' side), never learnt from.";
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_reason_names_are_unique_and_round_trip() {
        let mut names: Vec<_> = DropReason::ALL.iter().map(|r| r.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DropReason::COUNT);
        for reason in DropReason::ALL {
            assert_eq!(DropReason::from_name(reason.name()), Some(*reason));
            assert_eq!(DropReason::ALL[*reason as usize], *reason);
        }
    }
}
