//! Server -> client TCP: the cookie goes into TSval, the server's clock is learnt, NAT is undone.

use super::counters::Counter;
use super::handshakes::Handshake;
use super::shared::LbShared;
use super::worker::{Ipv4Layout, Sender, WorkerState};
use crate::config::Mode;
use crate::cookie::tcp_ts;
use crate::hash::FlowKey;
use crate::tables::Snapshot;
use crate::types::Nanos;
use crate::verdict::{DropReason, Verdict};
use crate::wire::tcp::{flags, MIN_HEADER_LEN as TCP_HEADER};
use crate::wire::tcp_options::{SegmentKind, TSVAL};
use crate::wire::{read_u32, TcpSegment};

impl WorkerState {
    #[inline]
    pub(crate) fn server_tcp(
        &mut self,
        snapshot: &Snapshot,
        shared: &LbShared,
        packet: &mut [u8],
        layout: Ipv4Layout,
        sender: Sender,
        now: Nanos,
    ) -> Verdict {
        let Sender {
            server,
            vip: vip_index,
            nat,
        } = sender;
        if !snapshot.servers.get(server).state.forwards() {
            return Verdict::Drop(DropReason::ServerRemoved);
        }
        let segment = match TcpSegment::new_checked(&packet[layout.l4..layout.end]) {
            Ok(segment) => segment,
            Err(reason) => return Verdict::Drop(reason),
        };
        let (src_port, client_port, tcp_flags) =
            (segment.src_port(), segment.dst_port(), segment.flags());
        let client_ip = layout.dst;
        let vip = snapshot.vip(vip_index);
        let vip_ip = vip.ipv4_or_zero();

        if snapshot.mode == Mode::Cheetah {
            let kind = SegmentKind::from_flags(tcp_flags);
            let timestamp = match self.find_timestamp(segment.options(), kind) {
                Ok(lookup) => lookup,
                Err(reason) => return Verdict::Drop(reason),
            };
            let key = FlowKey::tcp(client_ip, client_port, vip_ip, vip.port);
            let closes = tcp_flags & (flags::FIN | flags::RST) != 0;
            // One hash for everything below that files the segment under its connection;
            // none for the plain data reply without a timestamp, which needs it for nothing.
            let hash = (kind == SegmentKind::SynAck || timestamp.offset.is_some() || closes)
                .then(|| shared.hasher.hash(&key));
            if let (SegmentKind::SynAck, Some(hash)) = (kind, hash) {
                // The first answer to a (possibly retransmitted) SYN takes its load count.
                let client_isn = segment.ack().wrapping_sub(1);
                if let Some(from) =
                    shared
                        .handshakes
                        .on_syn_ack(Handshake::new(hash, client_isn), server, now)
                {
                    self.loads.on_connection_moved(from, server);
                    self.counters.inc(Counter::HandshakeCountMoved);
                }
            }
            match (timestamp.offset, hash) {
                (Some(at), Some(hash)) => {
                    let tsval = read_u32(packet, layout.l4 + TCP_HEADER + at + TSVAL);
                    self.learn_server_clock(shared, server, tsval, now);
                    let cookie = shared.layout().encode(server, hash, tcp_ts::extract(tsval));
                    TcpSegment::new_unchecked(&mut packet[layout.l4..layout.end])
                        .rewrite_option_u32(at + TSVAL, tcp_ts::insert(tsval, cookie));
                    self.counters.inc(Counter::CookiesInserted);
                }
                (None, Some(hash)) if kind == SegmentKind::SynAck => {
                    // The client offered no timestamp: its later packets will be routed by
                    // the fallback table, so teach it the server that actually answered.
                    self.remember(shared, hash, server, now);
                    self.counters.inc(Counter::FallbackLearnedFromServer);
                }
                _ => {}
            }
            // Only cheetah mode counts closes: the baselines place no connection by a
            // policy, so they count no close either.
            if let (true, Some(hash)) = (closes, hash) {
                let stamped = timestamp.offset.is_some();
                let segment = &packet[layout.l4..layout.end];
                self.on_server_close(&shared.closes, segment, stamped, server, hash);
            }
        }
        self.reply_leaves_as_vip(nat, snapshot, vip_index, packet, layout, server, src_port);
        Verdict::ToClient
    }
}
