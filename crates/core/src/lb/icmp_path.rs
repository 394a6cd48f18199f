//! ICMP errors toward a VIP (e.g. "fragmentation needed" from a router on the way to the
//! client): they concern a packet the server sent, which carried a cookie in its TSval.
//!
//! The error goes to the server the embedded cookie names (with the embedded TSval restored
//! to what the server sent). For a no-timestamp connection the fallback table (shared by
//! all workers, so whichever worker the error reaches) knows the server. With neither (the router quoted only 8 bytes of TCP), the error is copied to
//! every active server of the VIP, rate-limited, since one of them needs it for path MTU
//! discovery. In NAT mode the embedded headers are translated back to the server's address.

use super::counters::Counter;
use super::shared::LbShared;
use super::worker::{baseline_pick, Ipv4Layout, WorkerState};
use crate::config::{Forwarding, Mode};
use crate::cookie::tcp_ts;
use crate::hash::FlowKey;
use crate::tables::{SlotState, Snapshot};
use crate::types::{Nanos, ServerId};
use crate::verdict::{DropReason, Verdict};
use crate::wire::icmp::HEADER_LEN as ICMP_HEADER;
use crate::wire::tcp::MIN_HEADER_LEN as TCP_HEADER;
use crate::wire::tcp_options::{self, TSVAL};
use crate::wire::{
    checksum, ethernet, icmp, ip_proto, ipv4, read_u16, read_u32, tcp, Icmpv4Packet, Ipv4Packet,
};

/// Where the quoted packet sits inside an ICMP error.
#[derive(Clone, Copy, Debug)]
struct Embedded {
    /// Absolute offset of the ICMP header (checksum parity is relative to it).
    icmp: usize,
    /// Absolute offset of the quoted IPv4 header.
    ip: usize,
    /// Absolute offset of the quoted TCP header.
    tcp: usize,
    /// End of the ICMP message.
    end: usize,
}

impl Embedded {
    fn parse(packet: &[u8], layout: Ipv4Layout) -> Result<Self, DropReason> {
        let icmp = Icmpv4Packet::new_checked(&packet[layout.l4..layout.end])?;
        if !icmp.is_error() {
            return Err(DropReason::UnsupportedIcmpType);
        }
        let ip = layout.l4 + ICMP_HEADER;
        let quoted = &packet[ip..layout.end];
        if quoted.len() < 20 || quoted[0] >> 4 != 4 {
            return Err(DropReason::TruncatedIcmp);
        }
        let ihl = ((quoted[0] & 0x0f) as usize) * 4;
        // RFC 792: at least the IP header and 8 bytes (the ports) are quoted.
        if ihl < 20 || quoted.len() < ihl + 8 {
            return Err(DropReason::TruncatedIcmp);
        }
        if quoted[9] != ip_proto::TCP {
            return Err(DropReason::UnsupportedIcmpType);
        }
        Ok(Embedded {
            icmp: layout.l4,
            ip,
            tcp: ip + ihl,
            end: layout.end,
        })
    }

    /// Offset of the quoted TSval, if the router quoted the whole TCP header.
    fn tsval_at(&self, packet: &[u8]) -> Option<usize> {
        let tcp = &packet[self.tcp..self.end];
        if tcp.len() < TCP_HEADER {
            return None;
        }
        let header_len = ((tcp[12] >> 4) as usize) * 4;
        if header_len < TCP_HEADER || header_len > tcp.len() {
            return None;
        }
        let at = tcp_options::find_timestamp_slow(&tcp[TCP_HEADER..header_len]).ok()??;
        Some(self.tcp + TCP_HEADER + at + TSVAL)
    }

    /// Writes `new` at absolute offset `at` inside the ICMP message, keeping the ICMP
    /// checksum exactly as right or wrong as it was.
    fn write(&self, packet: &mut [u8], at: usize, new: &[u8]) {
        let mut old = [0u8; 4];
        let old = &mut old[..new.len()];
        old.copy_from_slice(&packet[at..at + new.len()]);
        packet[at..at + new.len()].copy_from_slice(new);
        let sum = checksum::update(
            read_u16(packet, self.icmp + icmp::field::CHECKSUM),
            (at - self.icmp) % 2 == 1,
            old,
            new,
        );
        packet[self.icmp + 2..self.icmp + 4].copy_from_slice(&sum.to_be_bytes());
    }

    /// Whether the quoted TCP checksum field is inside the quote.
    fn has_tcp_checksum(&self) -> bool {
        self.tcp + 18 <= self.end
    }

    /// Updates the quoted TCP checksum for a changed 16-bit-aligned field, and the ICMP
    /// checksum for that change.
    fn update_tcp_checksum(&self, packet: &mut [u8], old: &[u8], new: &[u8], odd: bool) {
        if !self.has_tcp_checksum() {
            return;
        }
        let at = self.tcp + 16;
        let sum = checksum::update(read_u16(packet, at), odd, old, new);
        self.write(packet, at, &sum.to_be_bytes());
    }
}

impl WorkerState {
    pub(crate) fn client_icmp(
        &mut self,
        snapshot: &Snapshot,
        shared: &LbShared,
        packet: &mut [u8],
        layout: Ipv4Layout,
        now: Nanos,
    ) -> Verdict {
        let vip_ip = layout.dst;
        let embedded = match Embedded::parse(packet, layout) {
            Ok(embedded) => embedded,
            Err(reason) => return Verdict::Drop(reason),
        };
        // The quoted packet went VIP -> client.
        let quoted_src = read_u32(packet, embedded.ip + ipv4::field::SRC);
        let client_ip = read_u32(packet, embedded.ip + ipv4::field::DST);
        let vip_port = read_u16(packet, embedded.tcp + tcp::field::SRC_PORT);
        let client_port = read_u16(packet, embedded.tcp + tcp::field::DST_PORT);
        if quoted_src != vip_ip {
            return Verdict::Drop(DropReason::UnsupportedIcmpType);
        }
        let Some(vip_index) = snapshot.vip_index(vip_ip, vip_port) else {
            return Verdict::Drop(DropReason::VipPortUnknown);
        };
        let vip = snapshot.vip(vip_index);
        let key = FlowKey::tcp(client_ip, client_port, vip_ip, vip_port);
        let hash = shared.hasher.hash(&key);
        let server = match snapshot.mode {
            Mode::Hash | Mode::Maglev => baseline_pick(snapshot.mode, &vip.pool, hash),
            Mode::Cheetah => match embedded.tsval_at(packet) {
                Some(tsval_at) => {
                    let tsval = read_u32(packet, tsval_at);
                    let decoded = shared.layout().decode(tcp_ts::extract(tsval), hash);
                    match snapshot.servers.get(decoded.server).state {
                        SlotState::Free => return Verdict::Drop(DropReason::CookieUnknownServer),
                        SlotState::Removed => {
                            return Verdict::Drop(DropReason::CookieServerRemoved)
                        }
                        SlotState::Active | SlotState::Draining => {}
                    }
                    if let Some(msb) = shared.msb.restore(decoded.server, decoded.epoch) {
                        let restored = ((msb as u32) << 16) | (tsval & 0xffff);
                        let old = tsval.to_be_bytes();
                        embedded.write(packet, tsval_at, &restored.to_be_bytes());
                        embedded.update_tcp_checksum(
                            packet,
                            &old,
                            &restored.to_be_bytes(),
                            (tsval_at - embedded.tcp) % 2 == 1,
                        );
                    }
                    self.counters.inc(Counter::IcmpRoutedByCookie);
                    Some(decoded.server)
                }
                None => {
                    let server = shared
                        .fallback
                        .peek(hash)
                        .filter(|s| snapshot.servers.get(*s).state.forwards());
                    if server.is_some() {
                        self.counters.inc(Counter::IcmpRoutedByFallback);
                    }
                    server
                }
            },
        };
        match server {
            Some(server) => {
                rewrite_for_server(snapshot, packet, layout, &embedded, vip_index, server);
                Verdict::ToServer(server)
            }
            None if vip.pool.servers.is_empty() => Verdict::Drop(DropReason::NoServerAvailable),
            None if self.icmp_copies.allow(now) => Verdict::ToAllServers { vip: vip_index },
            None => Verdict::Drop(DropReason::IcmpRateLimited),
        }
    }

    /// Rewrites an untouched copy of a copied-to-all ICMP error for `server`.
    pub(crate) fn prepare_icmp_copy(
        &self,
        snapshot: &Snapshot,
        packet: &mut [u8],
        vip_index: u16,
        server: ServerId,
    ) {
        let Ok(frame) = crate::wire::EthernetFrame::new_checked(&*packet) else {
            return;
        };
        let l3 = frame.payload_offset();
        let Ok(ip) = Ipv4Packet::new_checked(&packet[l3..]) else {
            return;
        };
        let layout = Ipv4Layout::of(l3, &ip);
        if let Ok(embedded) = Embedded::parse(packet, layout) {
            rewrite_for_server(snapshot, packet, layout, &embedded, vip_index, server);
        }
    }
}

/// Destination MAC, and in NAT mode: outer destination VIP -> DIP, quoted source VIP -> DIP
/// and VIP port -> backend port, with the outer IP, quoted IP, quoted TCP and ICMP
/// checksums all updated incrementally.
fn rewrite_for_server(
    snapshot: &Snapshot,
    packet: &mut [u8],
    layout: Ipv4Layout,
    embedded: &Embedded,
    vip_index: u16,
    server: ServerId,
) {
    let slot = snapshot.servers.get(server);
    if slot.has_mac {
        packet[ethernet::field::DST].copy_from_slice(&slot.mac);
    }
    if snapshot.forwarding != Forwarding::Nat {
        return;
    }
    let vip = snapshot.vip(vip_index);
    Ipv4Packet::new_unchecked(&mut packet[layout.l3..layout.end]).set_dst(slot.dip);
    // Quoted source address, and the quoted IP header checksum that covers it.
    let old_src = read_u32(packet, embedded.ip + ipv4::field::SRC);
    embedded.write(
        packet,
        embedded.ip + ipv4::field::SRC,
        &slot.dip.to_be_bytes(),
    );
    let ip_sum = checksum::update_u32(
        read_u16(packet, embedded.ip + ipv4::field::CHECKSUM),
        old_src,
        slot.dip,
    );
    embedded.write(
        packet,
        embedded.ip + ipv4::field::CHECKSUM,
        &ip_sum.to_be_bytes(),
    );
    embedded.update_tcp_checksum(
        packet,
        &old_src.to_be_bytes(),
        &slot.dip.to_be_bytes(),
        false,
    );
    if vip.backend_port != vip.port {
        embedded.write(
            packet,
            embedded.tcp + tcp::field::SRC_PORT,
            &vip.backend_port.to_be_bytes(),
        );
        embedded.update_tcp_checksum(
            packet,
            &vip.port.to_be_bytes(),
            &vip.backend_port.to_be_bytes(),
            false,
        );
    }
}
