//! The straight-line path for the packet a load balancer sees most: a client's segment on
//! an established connection, in an untagged IPv4 frame without IP options, whose TCP
//! options start NOP NOP Timestamp (99.95% of non-SYN packets in the paper's Table 1).
//! The baseline modes take the same path with their pick in place of the cookie stage, so
//! benchmarks compare like with like.
//!
//! It checks exactly what the general pipeline would find for such a packet, with a few
//! fixed-offset compares instead of the layered views, and declines (`None`) anything
//! else, which the general pipeline then handles. Both must give the same verdict and the
//! same bytes for every input: `tests/fast_path.rs` and the fuzz harness compare them.
//! This is also the shape the XDP program's hot path takes.

use super::cookie_stage::route_by_cookie;
use super::counters::Counter;
use super::shared::LbShared;
use super::worker::{baseline_pick, Ipv4Layout, Sender, WorkerState};
use crate::config::{Forwarding, Mode};
use crate::hash::FlowKey;
use crate::tables::Snapshot;
use crate::types::{Mac, Nanos};
use crate::verdict::{DropReason, Verdict};
use crate::wire::tcp::flags::SYN;
use crate::wire::{read_u16, read_u32, TcpSegment};

const ETH: usize = 14;
const IP: usize = 20;
/// TCP header with NOP NOP TS: 20 + 12 bytes.
const TCP_WITH_TS: usize = 32;
const NOP_NOP_TS: u32 = 0x0101_080a;
/// TSecr offset from the start of the TCP options (NOP NOP kind len TSval).
const TSECR_IN_OPTIONS: usize = 2 + 6;

/// An untagged IPv4 frame without IP options or fragmentation carrying a TCP segment whose
/// header has room for NOP NOP TS, all within the frame: its layout and TCP flags.
#[inline(always)]
fn plain_ipv4_tcp(packet: &[u8]) -> Option<(Ipv4Layout, u8)> {
    if packet.len() < ETH + IP + TCP_WITH_TS {
        return None;
    }
    let ethertype_ver_ihl = read_u32(packet, 12) >> 8;
    let frag_ttl_proto = read_u32(packet, ETH + 6);
    let total_len = read_u16(packet, ETH + 2) as usize;
    let l4 = ETH + IP;
    let doff_flags = read_u16(packet, l4 + 12);
    let header_len = ((doff_flags >> 12) as usize) * 4;
    if ethertype_ver_ihl != 0x08_00_45
        || frag_ttl_proto & 0x3fff_00ff != 0x0000_0006
        || total_len < IP + TCP_WITH_TS
        || ETH + total_len > packet.len()
        || header_len < TCP_WITH_TS
        || header_len > total_len - IP
    {
        return None;
    }
    let layout = Ipv4Layout {
        l3: ETH,
        l4,
        end: ETH + total_len,
        src: read_u32(packet, ETH + 12),
        dst: read_u32(packet, ETH + 16),
    };
    Some((layout, doff_flags as u8))
}

impl WorkerState {
    /// Established traffic in both directions: a client segment to a VIP port is routed
    /// here; a reply from a server goes straight to the server path with the layout and
    /// sender found here, skipping the general classifier.
    #[inline(always)]
    pub(crate) fn established_fast(
        &mut self,
        snapshot: &Snapshot,
        shared: &LbShared,
        packet: &mut [u8],
        now: Nanos,
    ) -> Option<Verdict> {
        let (layout, flags) = plain_ipv4_tcp(packet)?;
        let l4 = layout.l4;
        let src_port = read_u16(packet, l4);
        let dst_port = read_u16(packet, l4 + 2);
        let Some(vip_index) = snapshot.vip_index(layout.dst, dst_port) else {
            // Not to a VIP: a server's reply, found exactly as the general classifier does.
            let sender = match snapshot.forwarding {
                Forwarding::L2 => {
                    let vip = snapshot.vip_index(layout.src, src_port)?;
                    let mac: Mac = packet[6..12].try_into().unwrap();
                    Sender {
                        server: snapshot.server_by_mac(&mac)?,
                        vip,
                        nat: false,
                    }
                }
                Forwarding::Nat => {
                    let (server, vip) = snapshot.nat_backend(layout.src, src_port)?;
                    Sender {
                        server,
                        vip,
                        nat: true,
                    }
                }
            };
            self.counters.inc(Counter::FastPath);
            return Some(self.server_tcp(snapshot, shared, packet, layout, sender, now));
        };
        let cheetah = snapshot.mode == Mode::Cheetah;
        if cheetah && (flags & SYN != 0 || read_u32(packet, l4 + 20) != NOP_NOP_TS) {
            return None;
        }
        let (client_ip, vip_ip, client_port, vip_port) =
            (layout.src, layout.dst, src_port, dst_port);
        let hash = shared
            .hasher
            .hash(&FlowKey::tcp(client_ip, client_port, vip_ip, vip_port));
        let vip = snapshot.vip(vip_index);
        let end = layout.end;
        self.counters.inc(Counter::FastPath);
        if !cheetah {
            // The baselines: this same path with `pool[h % n]` or Maglev for the cookie stage.
            return Some(match baseline_pick(snapshot.mode, &vip.pool, hash) {
                Some(server) => self.forward_to_server(snapshot, vip, packet, layout, server),
                None => Verdict::Drop(DropReason::NoServerAvailable),
            });
        }
        self.counters.inc(Counter::OptionsFastPath);
        let tsecr = read_u32(packet, l4 + 20 + TSECR_IN_OPTIONS);
        let (server, restored) = match route_by_cookie(&snapshot.servers, &shared.msb, tsecr, hash)
        {
            Ok(routed) => routed,
            Err(reason) => return Some(Verdict::Drop(reason)),
        };
        if self.restore_tsecr {
            TcpSegment::new_unchecked(&mut packet[l4..end])
                .rewrite_option_u32(TSECR_IN_OPTIONS, restored);
        }
        self.counters.inc(Counter::CookieRouted);
        Some(self.forward_to_server(snapshot, vip, packet, layout, server))
    }
}
