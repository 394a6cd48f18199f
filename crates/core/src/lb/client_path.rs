//! Client -> VIP TCP: the first packet takes the policy, every later one its cookie; a
//! connection without timestamps, and a segment without ACK (whose TSecr echoes nothing),
//! the shared fallback table or else Maglev.

use super::cookie_stage::route_by_cookie;
use super::counters::Counter;
use super::fallback::Insert;
use super::handshakes::Handshake;
use super::shared::LbShared;
use super::worker::{baseline_pick, Ipv4Layout, WorkerState};
use crate::config::{Forwarding, Mode};
use crate::hash::FlowKey;
use crate::policy::PickContext;
use crate::tables::{ServerSlot, Snapshot, VipEntry};
use crate::types::{Nanos, ServerId};
use crate::verdict::{DropReason, Verdict};
use crate::wire::tcp::flags::ACK;
use crate::wire::tcp::MIN_HEADER_LEN as TCP_HEADER;
use crate::wire::tcp_options::{SegmentKind, TSECR};
use crate::wire::{ethernet, read_u32, Ipv4Packet, TcpSegment};

impl WorkerState {
    #[inline]
    pub(crate) fn client_tcp(
        &mut self,
        snapshot: &Snapshot,
        shared: &LbShared,
        packet: &mut [u8],
        layout: Ipv4Layout,
        vip_index: u16,
        now: Nanos,
    ) -> Verdict {
        let (client_ip, vip_ip) = (layout.src, layout.dst);
        let segment = match TcpSegment::new_checked(&packet[layout.l4..layout.end]) {
            Ok(segment) => segment,
            Err(reason) => return Verdict::Drop(reason),
        };
        let (client_port, vip_port, flags) =
            (segment.src_port(), segment.dst_port(), segment.flags());
        let vip = snapshot.vip(vip_index);
        let key = FlowKey::tcp(client_ip, client_port, vip_ip, vip_port);
        let hash = shared.hasher.hash(&key);
        let server = match snapshot.mode {
            Mode::Hash | Mode::Maglev => baseline_pick(snapshot.mode, &vip.pool, hash),
            Mode::Cheetah => {
                let kind = SegmentKind::from_flags(flags);
                let timestamp = match self.find_timestamp(segment.options(), kind) {
                    Ok(lookup) => lookup,
                    Err(reason) => return Verdict::Drop(reason),
                };
                // TSecr echoes a TSval only when ACK is set (RFC 7323, 3.2; Linux sends 0
                // otherwise): a client segment without ACK other than a SYN (a RST, mostly)
                // carries no cookie, and is routed like one without timestamps.
                let echo = match kind {
                    SegmentKind::Other if flags & ACK == 0 => None,
                    _ => timestamp.offset,
                };
                match (kind, echo) {
                    (SegmentKind::Syn, Some(_)) => {
                        let server = self.pick_new(vip_index, vip, hash, now);
                        if let Some(server) = server {
                            self.count_once_per_handshake(shared, hash, segment.seq(), server, now);
                        }
                        server
                    }
                    (SegmentKind::Syn, None) => {
                        let server = vip.pool.maglev.lookup(hash);
                        if let Some(server) = server {
                            self.remember(shared, hash, server, now);
                            self.counters.inc(Counter::FallbackConnections);
                            self.loads.on_new_connection(server);
                            self.count_once_per_handshake(shared, hash, segment.seq(), server, now);
                        }
                        server
                    }
                    (_, None) => match shared.fallback.lookup(hash, now) {
                        Some(server) if snapshot.servers.get(server).state.forwards() => {
                            self.counters.inc(Counter::FallbackHits);
                            Some(server)
                        }
                        Some(_) => {
                            // Its server was removed: the connection is gone, as it is for
                            // a cookie naming a removed server.
                            shared.fallback.remove(hash);
                            return Verdict::Drop(DropReason::FallbackServerRemoved);
                        }
                        None => {
                            self.counters.inc(Counter::FallbackMisses);
                            vip.pool.maglev.lookup(hash)
                        }
                    },
                    (_, Some(at)) => {
                        let tsecr_at = layout.l4 + TCP_HEADER + at + TSECR;
                        let tsecr = read_u32(packet, tsecr_at);
                        match route_by_cookie(&snapshot.servers, &shared.msb, tsecr, hash) {
                            Ok((server, restored)) => {
                                if self.restore_tsecr {
                                    TcpSegment::new_unchecked(&mut packet[layout.l4..layout.end])
                                        .rewrite_option_u32(at + TSECR, restored);
                                }
                                self.counters.inc(Counter::CookieRouted);
                                return self
                                    .forward_to_server(snapshot, vip, packet, layout, server);
                            }
                            Err(reason) => return Verdict::Drop(reason),
                        }
                    }
                }
            }
        };
        match server {
            Some(server) => self.forward_to_server(snapshot, vip, packet, layout, server),
            None => Verdict::Drop(DropReason::NoServerAvailable),
        }
    }

    /// Runs the VIP's policy for a new connection and counts it toward the server's load.
    #[inline]
    fn pick_new(
        &mut self,
        vip_index: u16,
        vip: &VipEntry,
        hash: u64,
        now: Nanos,
    ) -> Option<ServerId> {
        let policy = &mut self.policies[vip_index as usize];
        let mut ctx = PickContext {
            pool: &vip.pool,
            flow_hash: hash,
            loads: self.loads.view(),
            rng: &mut self.rng,
            now,
        };
        let server = policy.policy.pick(&mut ctx)?;
        self.loads.on_new_connection(server);
        self.counters.inc(Counter::NewConnections);
        Some(server)
    }

    /// Remembers `server` for a connection without a cookie in the shared fallback table.
    #[inline]
    pub(crate) fn remember(&self, shared: &LbShared, hash: u64, server: ServerId, now: Nanos) {
        if shared.fallback.insert(hash, server, now) == Insert::Evicted {
            self.counters.inc(Counter::FallbackEvictions);
        }
    }

    /// A retransmitted SYN was counted again where it was placed now: the count it raised
    /// before goes, so each connection counts once (see `lb/handshakes.rs`).
    #[inline]
    fn count_once_per_handshake(
        &mut self,
        shared: &LbShared,
        hash: u64,
        client_isn: u32,
        server: ServerId,
        now: Nanos,
    ) {
        if let Some(previous) =
            shared
                .handshakes
                .on_syn(Handshake::new(hash, client_isn), server, now)
        {
            self.loads.on_syn_retransmitted(previous);
            self.counters.inc(Counter::SynRetransmissions);
        }
    }

    /// Rewrites the packet toward `server`: its MAC (l2), or its address and port (NAT).
    #[inline]
    pub(crate) fn forward_to_server(
        &mut self,
        snapshot: &Snapshot,
        vip: &VipEntry,
        packet: &mut [u8],
        layout: Ipv4Layout,
        server: ServerId,
    ) -> Verdict {
        let nat = snapshot.forwarding == Forwarding::Nat;
        let slot = snapshot.servers.get(server);
        self.forward_to_server_via(nat, slot, vip, packet, layout, server)
    }

    /// [`forward_to_server`](Self::forward_to_server) with `nat` (`snapshot.forwarding ==
    /// Forwarding::Nat`) and the server's AllServers slot given, for the straight line,
    /// which knows the first at compile time and has just read the second.
    #[inline(always)]
    pub(crate) fn forward_to_server_via(
        &mut self,
        nat: bool,
        slot: &ServerSlot,
        vip: &VipEntry,
        packet: &mut [u8],
        layout: Ipv4Layout,
        server: ServerId,
    ) -> Verdict {
        if slot.has_mac {
            packet[ethernet::field::DST].copy_from_slice(&slot.mac);
        }
        if nat {
            let old =
                Ipv4Packet::new_unchecked(&mut packet[layout.l3..layout.end]).set_dst(slot.dip);
            let mut segment = TcpSegment::new_unchecked(&mut packet[layout.l4..layout.end]);
            segment.update_checksum_for_address(old, slot.dip);
            if vip.backend_port != vip.port {
                segment.set_dst_port(vip.backend_port);
            }
        }
        self.loads.on_packet(server, layout.end - layout.l3);
        Verdict::ToServer(server)
    }
}
