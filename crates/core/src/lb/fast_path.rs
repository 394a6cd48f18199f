//! The straight-line path for the packets a load balancer sees most, in an IPv4 frame
//! without IP options (untagged, or behind one or two VLAN tags):
//!
//! * a client's segment with ACK (not SYN) whose TCP options start NOP NOP Timestamp
//!   (99.95% of non-SYN packets in the paper's Table 1): cookie decoded from TSecr, TSecr
//!   restored, toward the server (without ACK, TSecr echoes nothing: such a segment goes to
//!   the general path, which routes it like one without timestamps);
//! * a server's reply whose timestamp sits where the common layouts put it (NOP NOP TS for
//!   non-SYN segments, the four SYN-ACK rows of Table 1): the server's clock learnt, cookie put into TSval,
//!   toward the client. A SYN-ACK answering a recently retried SYN goes to the general
//!   server path, which settles whose load count the connection is.
//!
//! The baseline modes take the same path with their pick in place of the cookie stage (and
//! no cookie on replies), so benchmarks compare like with like.
//!
//! It checks exactly what the general pipeline would find for such a packet, with a few
//! fixed-offset compares instead of the layered views, and declines anything else: a client
//! packet back to the general pipeline (`None`), a server reply, once its sender is known,
//! to the general server path. Both must give the same verdict, the same bytes and the same
//! counters for every input: `tests/fast_path.rs` and the fuzz harness compare them. This
//! is also the shape the XDP program's hot path takes.
//!
//! Every verdict returned here has been counted already (most as one [`Bundle`]).

use super::cookie_stage::route_to_slot;
use super::counters::{Bundle, Counter};
use super::ingress::Ingress;
use super::shared::LbShared;
use super::worker::{baseline_pick, Ipv4Layout, Sender, WorkerState};
use crate::config::{Forwarding, Mode};
use crate::cookie::tcp_ts;
use crate::tables::{Snapshot, VipSlot};
use crate::types::Nanos;
use crate::verdict::{DropReason, Verdict};
use crate::wire::tcp::flags::{ACK, FIN, RST, SYN};
use crate::wire::tcp_options::{find_timestamp_fast, SegmentKind, TSVAL};
use crate::wire::{checksum, ethernet, ipv4, read_u16, read_u32, tcp};

const ETH: usize = ethernet::HEADER_LEN;
const IP: usize = ipv4::MIN_HEADER_LEN;
/// TCP header without options.
const TCP: usize = tcp::MIN_HEADER_LEN;
/// TCP header with NOP NOP TS: 20 + 12 bytes.
const TCP_WITH_TS: usize = 32;
const NOP_NOP_TS: u32 = 0x0101_080a;
/// Offset of the timestamp option within the options when they start NOP NOP TS.
const TS_AFTER_NOP_NOP: usize = 2;
/// TSecr offset from the start of the TCP options (NOP NOP kind len TSval).
const TSECR_IN_OPTIONS: usize = 2 + 6;

/// What the straight line reads of every segment before it knows the direction.
#[derive(Clone, Copy)]
struct PlainSegment {
    layout: Ipv4Layout,
    /// The TCP data offset and flags word.
    doff_flags: u16,
    src_port: u16,
    dst_port: u16,
}

/// An IPv4 frame without fragmentation carrying a TCP segment whose header has room for
/// NOP NOP TS, all within the frame: its layout and the TCP data offset and flags word.
/// Untagged, or behind one or two VLAN tags as `EthernetFrame` reads them (a trunk port's
/// traffic takes the same line, its tags kept); without IP options, or with options (kept,
/// skipped over) off the line.
#[inline(always)]
fn plain_ipv4_tcp(packet: &[u8]) -> Option<(Ipv4Layout, u16)> {
    if packet.len() < ETH + IP + TCP_WITH_TS {
        return None;
    }
    // EtherType, IP version and header length in one compare.
    let (l3, ip_header_len) = if read_u32(packet, ethernet::field::ETHERTYPE) >> 8 == 0x08_00_45 {
        (ETH, IP)
    } else {
        ipv4_off_the_line(packet)?
    };
    let frag_ttl_proto = read_u32(packet, l3 + ipv4::field::FLAGS_FRAG);
    let total_len = read_u16(packet, l3 + ipv4::field::TOTAL_LEN) as usize;
    let l4 = l3 + ip_header_len;
    let doff_flags = read_u16(packet, l4 + tcp::field::DATA_OFFSET);
    let header_len = ((doff_flags >> 12) as usize) * 4;
    // IP header + TCP_WITH_TS <= IP header + header_len <= total_len <= frame: the TCP
    // header with room for NOP NOP TS is within the IP packet, which is within the frame.
    if frag_ttl_proto & 0x3fff_00ff != 0x0000_0006
        || header_len < TCP_WITH_TS
        || ip_header_len + header_len > total_len
        || l3 + total_len > packet.len()
    {
        return None;
    }
    let layout = Ipv4Layout {
        l3,
        l4,
        end: l3 + total_len,
        src: read_u32(packet, l3 + ipv4::field::SRC),
        dst: read_u32(packet, l3 + ipv4::field::DST),
    };
    Some((layout, doff_flags))
}

/// Where the IPv4 header starts and how long it is (version 4, IP options allowed) when
/// the frame is not the commonest one (untagged, no options): behind up to two VLAN tags,
/// with the frame long enough for the straight line's headers after it; `None` for any
/// other frame. Out of line: the commonest frame never calls it.
#[cold]
#[inline(never)]
fn ipv4_off_the_line(packet: &[u8]) -> Option<(usize, usize)> {
    let mut at = ethernet::field::ETHERTYPE;
    for tags in 0..=ethernet::MAX_TAGS {
        let l3 = at + 2;
        if packet.len() < l3 + IP + TCP_WITH_TS {
            return None;
        }
        let ethertype = read_u16(packet, at);
        if ethertype == ethernet::ethertype::IPV4 {
            let version_ihl = packet[l3];
            let ip_header_len = usize::from(version_ihl & 0x0f) * 4;
            if version_ihl >> 4 != 4
                || ip_header_len < IP
                || packet.len() < l3 + ip_header_len + TCP_WITH_TS
            {
                return None;
            }
            return Some((l3, ip_header_len));
        }
        if tags == ethernet::MAX_TAGS || !ethernet::is_tag(ethertype) {
            return None;
        }
        at += ethernet::TAG_LEN;
    }
    None
}

/// Where a server reply's timestamp option starts within its TCP options, if it is where
/// the general path's option search finds it with one wide compare (the same patterns, so
/// the same answer); `None` leaves the reply to the general server path.
#[inline(always)]
fn reply_timestamp_at(packet: &[u8], l4: usize, doff_flags: u16) -> Option<usize> {
    if doff_flags & SYN as u16 == 0 {
        // `plain_ipv4_tcp` made sure the header has room for NOP NOP TS.
        (read_u32(packet, l4 + TCP) == NOP_NOP_TS).then_some(TS_AFTER_NOP_NOP)
    } else {
        // SYN and SYN-ACK share Table 1's patterns.
        let header_len = ((doff_flags >> 12) as usize) * 4;
        find_timestamp_fast(&packet[l4 + TCP..l4 + header_len], SegmentKind::SynAck)
    }
}

impl WorkerState {
    /// A reply whose sender the straight line found but which it leaves to the general
    /// server path; out of line, to keep the straight line's registers for itself.
    /// The layout is found again here rather than passed, so that the straight line need
    /// not keep it in memory for this rare call.
    #[inline(never)]
    fn reply_general(
        &mut self,
        snapshot: &Snapshot,
        shared: &LbShared,
        packet: &mut [u8],
        sender: Sender,
        now: Nanos,
    ) -> Verdict {
        let (layout, _) = plain_ipv4_tcp(packet).expect("the straight line checked the frame");
        self.counters.inc(Counter::FastPath);
        let verdict = self.server_tcp(snapshot, shared, packet, layout, sender, now);
        self.counters.count_verdict(verdict);
        verdict
    }

    /// Established traffic in both directions: a client segment to a VIP port, or a reply
    /// from a server. `None`: the general pipeline decides (and counts).
    ///
    /// Compiled once per (mode, forwarding) pair: `CHEETAH` is `snapshot.mode ==
    /// Mode::Cheetah` and `NAT` is `snapshot.forwarding == Forwarding::Nat`, which the caller
    /// matches once (per burst in `Worker::process_batch`), so the straight line tests
    /// neither.
    #[inline(always)]
    pub(crate) fn established_fast<const CHEETAH: bool, const NAT: bool>(
        &mut self,
        snapshot: &Snapshot,
        shared: &LbShared,
        packet: &mut [u8],
        now: Nanos,
        ingress: Ingress,
    ) -> Option<Verdict> {
        debug_assert_eq!(CHEETAH, snapshot.mode == Mode::Cheetah);
        debug_assert_eq!(NAT, snapshot.forwarding == Forwarding::Nat);
        let (layout, doff_flags) = plain_ipv4_tcp(packet)?;
        let ports = read_u32(packet, layout.l4);
        let segment = PlainSegment {
            layout,
            doff_flags,
            src_port: (ports >> 16) as u16,
            dst_port: ports as u16,
        };
        match snapshot.vip_slot(layout.dst, segment.dst_port) {
            Some(vip) => self.client_fast::<CHEETAH, NAT>(snapshot, shared, packet, segment, vip),
            // Only the servers' side carries replies, and a segment to a VIP's address is
            // never one: the general pipeline drops what only claims to be.
            None if ingress == Ingress::ServerSide && !snapshot.is_vip_addr(layout.dst) => {
                self.reply_fast::<CHEETAH, NAT>(snapshot, shared, packet, segment, now)
            }
            None => None,
        }
    }

    /// A client segment to the VIP in `vip_slot`.
    #[inline(always)]
    fn client_fast<const CHEETAH: bool, const NAT: bool>(
        &mut self,
        snapshot: &Snapshot,
        shared: &LbShared,
        packet: &mut [u8],
        segment: PlainSegment,
        vip_slot: &VipSlot,
    ) -> Option<Verdict> {
        let PlainSegment {
            layout,
            doff_flags,
            src_port: client_port,
            dst_port: _,
        } = segment;
        let l4 = layout.l4;
        // A SYN takes the policy; a segment without ACK carries no echo in TSecr (RFC 7323),
        // so the general path routes it like one without timestamps.
        if CHEETAH
            && (doff_flags & (SYN | ACK) as u16 != ACK as u16
                || read_u32(packet, l4 + TCP) != NOP_NOP_TS)
        {
            return None;
        }
        let vip = snapshot.vip(vip_slot.index);
        // The VIP's side of the id is hashed once per snapshot (the packet's destination
        // is the VIP's address and port: that is how it was found).
        let hash = vip_slot.hash_prefix.finish(layout.src, client_port);
        let counters = &*self.counters;
        if !CHEETAH {
            // The baselines: this same path with `pool[h % n]` or Maglev for the cookie stage.
            return Some(match baseline_pick(snapshot.mode, &vip.pool, hash) {
                Some(server) => {
                    counters.inc_bundle(Bundle::ClientPick);
                    let slot = snapshot.servers.get(server);
                    self.forward_to_server_via(NAT, slot, vip, packet, layout, server)
                }
                None => {
                    counters.inc(Counter::FastPath);
                    let verdict = Verdict::Drop(DropReason::NoServerAvailable);
                    counters.count_verdict(verdict);
                    verdict
                }
            });
        }
        let tsecr_at = TCP + TSECR_IN_OPTIONS;
        // The cookie is TSecr's high half.
        let echoed = read_u16(packet, l4 + tsecr_at);
        match route_to_slot(&snapshot.servers, &shared.msb, echoed, hash) {
            Ok((server, slot, restored)) => {
                // Only the MSB changes: the cookie becomes the server's own MSB, which the
                // table keeps in network byte order. (A worker with the restore fault
                // injected never comes here.)
                debug_assert!(self.restore_tsecr);
                checksum::replace_high_half_in_network_order(
                    packet,
                    l4 + tsecr_at,
                    l4 + tcp::field::CHECKSUM,
                    restored,
                );
                counters.inc_bundle(Bundle::ClientCookie);
                Some(self.forward_to_server_via(NAT, slot, vip, packet, layout, server))
            }
            Err(reason) => {
                counters.inc(Counter::FastPath);
                counters.inc(Counter::OptionsFastPath);
                let verdict = Verdict::Drop(reason);
                counters.count_verdict(verdict);
                Some(verdict)
            }
        }
    }

    /// A segment from the servers' side, not to a VIP: a server's reply if its source says
    /// so (found exactly as the general classifier finds it), else `None`.
    #[inline(always)]
    fn reply_fast<const CHEETAH: bool, const NAT: bool>(
        &mut self,
        snapshot: &Snapshot,
        shared: &LbShared,
        packet: &mut [u8],
        segment: PlainSegment,
        now: Nanos,
    ) -> Option<Verdict> {
        let PlainSegment {
            layout,
            doff_flags,
            src_port,
            dst_port: client_port,
        } = segment;
        let l4 = layout.l4;
        let (sender, hash_prefix, forwards) = if NAT {
            let (server, vip) = snapshot.nat_backend(layout.src, src_port)?;
            let sender = Sender {
                server,
                vip,
                nat: true,
            };
            let forwards = snapshot.servers.get(server).state.forwards();
            (sender, snapshot.vip_hash_prefix(vip), forwards)
        } else {
            let entry = snapshot.mac_entry(&packet[ethernet::field::SRC].try_into().unwrap())?;
            // Most servers serve one VIP, kept in their MAC entry: one lookup, not two.
            let vip = match entry.first_vip_at(layout.src, src_port) {
                Some(vip) => vip,
                None => snapshot.vip_slot(layout.src, src_port)?,
            };
            let sender = Sender {
                server: entry.server,
                vip: vip.index,
                nat: false,
            };
            (sender, &vip.hash_prefix, entry.forwards)
        };
        let server = sender.server;
        let timestamp_at = if CHEETAH {
            reply_timestamp_at(packet, l4, doff_flags)
        } else {
            None
        };
        if !forwards || (CHEETAH && timestamp_at.is_none()) {
            // A removed server, or options the wide compares do not place: the general
            // server path decides.
            return Some(self.reply_general(snapshot, shared, packet, sender, now));
        }
        // The connection's hash: the cookie's, and what a close is filed under.
        let mut flow_hash = None;
        if let Some(at) = timestamp_at {
            let hash = hash_prefix.finish(layout.dst, client_port);
            flow_hash = Some(hash);
            if doff_flags & SYN as u16 != 0 && shared.handshakes.retried_recently(hash, now) {
                // The answer to a retried SYN may have to move its load count
                // (lb/handshakes.rs): the general server path does that bookkeeping.
                return Some(self.reply_general(snapshot, shared, packet, sender, now));
            }
            // Timestamp options at 2, 6 or 10: TSval at an even TCP offset.
            let tsval_at = TCP + at + TSVAL;
            let tsval = read_u32(packet, l4 + tsval_at);
            self.learn_server_clock(shared, server, tsval, now);
            let msb = tcp_ts::extract(tsval);
            // The cookie takes the place of the MSB; the low half stays.
            checksum::replace_high_half(
                packet,
                l4 + tsval_at,
                l4 + tcp::field::CHECKSUM,
                shared.layout().encode(server, hash, msb),
            );
            self.counters.inc_bundle(Bundle::ServerCookie);
        } else {
            self.counters.inc_bundle(Bundle::ServerPlain);
        }
        self.reply_leaves_as_vip(NAT, snapshot, sender.vip, packet, layout, server, src_port);
        // Cheetah mode only (`flow_hash` is `None` in the baselines, which place no
        // connection by a policy and so count no close either).
        if let (Some(hash), true) = (flow_hash, doff_flags & (FIN | RST) as u16 != 0) {
            // The straight line takes a cheetah-mode reply only with its timestamp.
            self.on_server_close(&shared.closes, &packet[l4..layout.end], true, server, hash);
        }
        Some(Verdict::ToClient)
    }
}
