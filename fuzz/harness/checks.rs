//! The invariants every verdict must keep, and the client's echo of each cookie.

use std::sync::Arc;

use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::cookie::CookieLayout;
use cheetah_core::hash::FlowKey;
use cheetah_core::lb::{Counter, Ingress, Worker};
use cheetah_core::tables::{SlotState, Snapshot};
use cheetah_core::testkit;
use cheetah_core::types::{Nanos, ServerId};
use cheetah_core::verdict::{DropReason, Verdict};
use cheetah_core::wire::ethernet::ethertype;
use cheetah_core::wire::tcp_options::{self, SegmentKind, TSECR, TSVAL};
use cheetah_core::wire::{checksum, ip_proto, tcp, EthernetFrame, Ipv4Packet};

use super::clocks::Clocks;

/// Which invariants are enforced.
///
/// A known core bug can be tolerated here while it is open, so the fuzzer keeps looking
/// for other bugs instead of re-finding it; the inputs go to `fuzz/regressions/` and
/// `run_strict` keeps failing on them until the fix. None is tolerated now: the one this
/// was written for (the fallback table routing to removed servers) is fixed in core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checks {
    /// Accept a `ToServer` naming a removed or freed server when the worker's fallback
    /// counters show the fallback table routed the packet.
    pub tolerate_fallback_to_removed: bool,
}

impl Checks {
    /// What the fuzz target and the corpus test enforce: everything but open known bugs.
    pub const FUZZ: Checks = Checks {
        tolerate_fallback_to_removed: false,
    };
    pub const STRICT: Checks = Checks {
        tolerate_fallback_to_removed: false,
    };
}

/// Processes `packet` on `worker` and checks every invariant of the verdict; for
/// [`Verdict::ToAllServers`] also prepares and checks each copy, and for a cookie put into a
/// server's packet also echoes it back as the client would (see [`echo_cookie`]).
pub fn process_and_check(
    worker: &mut Worker,
    packet: &[u8],
    now: Nanos,
    ingress: Ingress,
    checks: Checks,
    clocks: &mut Clocks,
) -> Verdict {
    let (verdict, output) = process_checked(worker, packet, now, ingress, checks, clocks);
    if verdict == Verdict::ToClient {
        echo_cookie(worker, packet, &output, now, checks, clocks);
    }
    verdict
}

/// Processes one packet and checks the invariants; returns the verdict and the output.
pub(super) fn process_checked(
    worker: &mut Worker,
    packet: &[u8],
    now: Nanos,
    ingress: Ingress,
    checks: Checks,
    clocks: &mut Clocks,
) -> (Verdict, Vec<u8>) {
    let fallback_routed = |worker: &Worker| {
        let counters = worker.counters();
        counters.get(Counter::FallbackHits) + counters.get(Counter::IcmpRoutedByFallback)
    };
    let fallback_before = fallback_routed(worker);
    let beyond_before = worker.shared().msb.echoes_beyond_idle_limit();
    let mut buffer = packet.to_vec();
    let verdict = worker.process(&mut buffer, now, ingress);
    let by_fallback = fallback_routed(worker) != fallback_before;
    let echo = Echo {
        clocks,
        now,
        counted_beyond: worker.shared().msb.echoes_beyond_idle_limit() - beyond_before,
    };
    let snapshot = Arc::clone(worker.snapshot());
    check_reply_source(&snapshot, packet, verdict, ingress);
    let tolerate_removed = checks.tolerate_fallback_to_removed && by_fallback;
    check(
        worker,
        &snapshot,
        packet,
        &buffer,
        verdict,
        tolerate_removed,
        Some(echo),
    );
    if let Verdict::ToAllServers { vip } = verdict {
        let targets = worker.copy_targets(vip).to_vec();
        assert!(
            !targets.is_empty(),
            "ToAllServers for a VIP without servers"
        );
        for server in targets {
            let mut copy = packet.to_vec();
            worker.prepare_copy(&mut copy, vip, server);
            check(
                worker,
                &snapshot,
                packet,
                &copy,
                Verdict::ToServer(server),
                false,
                None,
            );
        }
    }
    (verdict, buffer)
}

/// The round trip that is the point of the cookie: a client echoing, in TSecr, the TSval a
/// server's packet left the LB with must be routed to that server (whatever its clock:
/// the LB knows it, having just learnt from it), and [`check_cookie`] holds the restored
/// TSecr to the harness's [`Clocks`]: exactly the TSval sent whenever the model says that
/// MSB is in the layout's window.
pub(super) fn echo_cookie(
    worker: &mut Worker,
    input: &[u8],
    output: &[u8],
    now: Nanos,
    checks: Checks,
    clocks: &mut Clocks,
) {
    let snapshot = Arc::clone(worker.snapshot());
    if snapshot.mode != Mode::Cheetah {
        return;
    }
    let Some(l) = ipv4_layout(output).filter(|l| l.protocol == ip_proto::TCP) else {
        return;
    };
    let Some((tsval_at, _, _)) = timestamp_at(output, l) else {
        return;
    };
    let (src, sport) = (read_u32(input, l.l3 + 12), read_u16(input, l.l4));
    let sender = if snapshot.forwarding == Forwarding::Nat {
        snapshot.nat_backend(src, sport)
    } else {
        let mac: [u8; 6] = input[6..12].try_into().unwrap();
        snapshot
            .server_by_mac(&mac)
            .zip(snapshot.vip_index(src, sport))
    };
    let Some((server, vip)) = sender else {
        return;
    };
    let vip = snapshot.vip(vip);
    let (original, cookie) = (read_u32(input, tsval_at), read_u32(output, tsval_at));
    let exact = clocks.certainly_restores(server, (original >> 16) as u16);
    let echo = testkit::TcpFrame {
        src_mac: testkit::CLIENT_MAC,
        dst_mac: testkit::LB_MAC,
        src_ip: read_u32(output, l.l3 + 16),
        dst_ip: vip.ipv4_or_zero(),
        src_port: read_u16(output, l.l4 + 2),
        dst_port: vip.port,
        seq: read_u32(output, l.l4 + 8),
        ack: read_u32(output, l.l4 + 4).wrapping_add(1),
        flags: tcp::flags::ACK,
        options: testkit::options::nop_nop_ts(0x0102_0304, cookie),
        payload: Vec::new(),
    }
    .build();
    // The client's echo comes from the clients' side, as it would to an LB with two.
    let (verdict, restored) =
        process_checked(worker, &echo, now, Ingress::ClientSide, checks, clocks);
    assert_eq!(
        verdict,
        Verdict::ToServer(server),
        "the client's echo of {server:?}'s cookie {cookie:#010x} must reach {server:?}"
    );
    if exact {
        let (_, tsecr_at) = testkit::timestamp_offsets(&restored).expect("echo has a timestamp");
        assert_eq!(
            read_u32(&restored, tsecr_at),
            original,
            "the echo's TSecr must be restored to the TSval {server:?} sent"
        );
    }
}

/// A TCP segment is taken as a server's reply (sent toward the client) only from the
/// servers' side, and never when it is addressed to a VIP; what only claims to be a reply
/// from the clients' side is dropped as such. (That nothing was learnt from a dropped one
/// the harness's clocks check: they are told only of replies taken.)
fn check_reply_source(snapshot: &Snapshot, input: &[u8], verdict: Verdict, ingress: Ingress) {
    let Some(l) = ipv4_layout(input) else {
        return;
    };
    if l.protocol != ip_proto::TCP {
        return;
    }
    let dst = read_u32(input, l.l3 + 16);
    if verdict == Verdict::ToClient {
        assert_eq!(
            ingress,
            Ingress::ServerSide,
            "a reply taken from the client side"
        );
        assert!(
            !snapshot.is_vip_addr(dst),
            "a segment to the VIP address {dst:#010x} taken as a reply"
        );
    }
    if verdict == Verdict::Drop(DropReason::ReplyFromClientSide) {
        assert_eq!(ingress, Ingress::ClientSide);
        let src = read_u32(input, l.l3 + 12);
        let sport = read_u16(input, l.l4);
        let from_server = if snapshot.forwarding == Forwarding::Nat {
            snapshot.nat_backend(src, sport).is_some()
        } else {
            let mac: [u8; 6] = input[6..12].try_into().unwrap();
            snapshot.server_by_mac(&mac).is_some() && snapshot.vip_index(src, sport).is_some()
        };
        assert!(from_server, "dropped as a reply, but not from a server");
    }
}

/// What [`check_cookie`] needs to hold a restored echo to the harness's model.
pub struct Echo<'a> {
    clocks: &'a mut Clocks,
    now: Nanos,
    /// How much the core's `echoes_beyond_idle_limit` moved while processing the packet.
    counted_beyond: u64,
}

/// A cookie's server id and epoch, from the layout's definition:
/// `| epoch : k | (id XOR (hash >> 32)) : 16 - k |` in the timestamp's 16 MSB.
pub(super) fn decode(layout: CookieLayout, timestamp: u32, hash: u64) -> (ServerId, u16) {
    let id_bits = 16 - layout.epoch_bits();
    let id_mask = (1u32 << id_bits) - 1;
    let cookie = timestamp >> 16;
    let id = (cookie ^ (hash >> 32) as u32) & id_mask;
    (ServerId(id as u16), (cookie >> id_bits) as u16)
}

/// Where the IPv4 header and its payload sit in a frame (mirrors the pipeline's parse).
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    l3: usize,
    l4: usize,
    end: usize,
    protocol: u8,
}

pub(super) fn ipv4_layout(frame: &[u8]) -> Option<Layout> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != ethertype::IPV4 {
        return None;
    }
    let l3 = eth.payload_offset();
    let ip = Ipv4Packet::new_checked(&frame[l3..]).ok()?;
    Some(Layout {
        l3,
        l4: l3 + ip.header_len(),
        end: l3 + ip.total_len(),
        protocol: ip.protocol(),
    })
}

pub(super) fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(super) fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Folded ones'-complement sum of an IPv4 header. A header checksum is valid iff this is
/// 0xffff; an incremental update keeps it exactly equal (a bad checksum stays as bad).
pub(super) fn ipv4_header_sum(frame: &[u8], l: Layout) -> u16 {
    checksum::fold(checksum::sum(&frame[l.l3..l.l4]))
}

/// Folded ones'-complement sum of a TCP segment with its pseudo header: 0xffff iff the
/// checksum is valid, and preserved exactly by every correct rewrite.
pub(super) fn tcp_sum(frame: &[u8], l: Layout) -> u16 {
    let src = read_u32(frame, l.l3 + 12);
    let dst = read_u32(frame, l.l3 + 16);
    checksum::fold(
        tcp::pseudo_header_sum(src, dst, ip_proto::TCP, l.end - l.l4)
            + checksum::sum(&frame[l.l4..l.end]),
    )
}

/// Sums over the parts of an ICMP error that the pipeline may rewrite.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct IcmpSums {
    icmp: u16,
    quoted_ip: Option<u16>,
    /// Partial sum of the quoted TCP bytes with the quoted pseudo header: the bytes the
    /// router did not quote are constant, so a correct update keeps the partial sum too.
    quoted_tcp: Option<u16>,
}

pub(super) fn icmp_sums(frame: &[u8], l: Layout) -> IcmpSums {
    let icmp = checksum::fold(checksum::sum(&frame[l.l4..l.end]));
    let ip = l.l4 + 8;
    let quoted = &frame[ip.min(l.end)..l.end];
    let mut sums = IcmpSums {
        icmp,
        quoted_ip: None,
        quoted_tcp: None,
    };
    if quoted.len() >= 20 && quoted[0] >> 4 == 4 {
        let ihl = usize::from(quoted[0] & 0x0f) * 4;
        if ihl >= 20 && quoted.len() >= ihl {
            sums.quoted_ip = Some(checksum::fold(checksum::sum(&quoted[..ihl])));
            let tcp = &quoted[ihl..];
            if quoted[9] == ip_proto::TCP && tcp.len() >= 18 {
                let len = usize::from(read_u16(quoted, 2)).saturating_sub(ihl);
                sums.quoted_tcp = Some(checksum::fold(
                    tcp::pseudo_header_sum(
                        read_u32(quoted, 12),
                        read_u32(quoted, 16),
                        ip_proto::TCP,
                        len,
                    ) + checksum::sum(tcp),
                ));
            }
        }
    }
    sums
}

/// The timestamp option of a TCP segment as the pipeline finds it, as absolute offsets of
/// (TSval, TSecr), or `None` (no option, or malformed options).
pub(super) fn timestamp_at(frame: &[u8], l: Layout) -> Option<(usize, usize, SegmentKind)> {
    let segment = &frame[l.l4..l.end];
    if segment.len() < 20 {
        return None;
    }
    let header_len = usize::from(segment[12] >> 4) * 4;
    if header_len < 20 || header_len > segment.len() {
        return None;
    }
    let kind = SegmentKind::from_flags(segment[13]);
    let at = tcp_options::find_timestamp(&segment[20..header_len], kind)
        .ok()?
        .offset?;
    let base = l.l4 + 20 + at;
    Some((base + TSVAL, base + TSECR, kind))
}

pub(super) fn flow_hash(
    worker: &Worker,
    client_ip: u32,
    client_port: u16,
    vip_ip: u32,
    vip_port: u16,
) -> u64 {
    worker.shared().hasher.hash(&FlowKey {
        client_ip,
        vip_ip,
        client_port,
        vip_port,
        protocol: ip_proto::TCP,
    })
}

/// The invariants every verdict must satisfy, whatever the input bytes.
pub(super) fn check(
    worker: &Worker,
    snapshot: &Snapshot,
    input: &[u8],
    output: &[u8],
    verdict: Verdict,
    tolerate_removed: bool,
    echo: Option<Echo>,
) {
    assert_eq!(
        input.len(),
        output.len(),
        "the pipeline rewrites in place and never changes the length"
    );
    match verdict {
        // A dropped packet is not sent anywhere, but a passed one goes to the host kernel
        // and a copied one is copied from this buffer: none may have been touched.
        Verdict::Drop(_) | Verdict::Pass | Verdict::ToAllServers { .. } => {
            assert!(
                input == output,
                "{verdict:?} must leave the packet untouched\n in: {input:02x?}\nout: {output:02x?}"
            );
            if let Verdict::ToAllServers { vip } = verdict {
                assert!(usize::from(vip) < snapshot.vips.len(), "{verdict:?}");
            }
            return;
        }
        Verdict::ToServer(server) => {
            let slot = snapshot.servers.get(server);
            assert!(
                matches!(slot.state, SlotState::Active | SlotState::Draining) || tolerate_removed,
                "{verdict:?} names a server that is {:?} in snapshot generation {}",
                slot.state,
                snapshot.generation
            );
            if slot.has_mac {
                assert_eq!(output[0..6], slot.mac, "destination MAC of {verdict:?}");
            }
        }
        Verdict::ToClient => {}
    }
    // Forwarded: only IPv4 is ever forwarded, so both ends must parse the same way.
    let l = ipv4_layout(input).expect("only IPv4 packets are forwarded");
    let lo = ipv4_layout(output).expect("a forwarded packet still parses");
    assert_eq!(
        (l.l3, l.l4, l.end, l.protocol),
        (lo.l3, lo.l4, lo.end, lo.protocol)
    );
    assert_eq!(
        input[6..l.l3],
        output[6..l.l3],
        "source MAC, tags and EtherType are never rewritten"
    );
    assert_eq!(
        input[l.end..],
        output[l.end..],
        "bytes past the IPv4 total length are never rewritten"
    );
    assert_eq!(
        ipv4_header_sum(input, l),
        ipv4_header_sum(output, l),
        "{verdict:?}: the IPv4 header checksum must stay exactly as right or wrong as it was"
    );
    let nat = snapshot.forwarding == Forwarding::Nat;
    let (src_in, dst_in) = (read_u32(input, l.l3 + 12), read_u32(input, l.l3 + 16));
    let (src_out, dst_out) = (read_u32(output, l.l3 + 12), read_u32(output, l.l3 + 16));
    match verdict {
        Verdict::ToServer(server) => {
            assert_eq!(src_in, src_out, "the client address is never rewritten");
            let expected = if nat {
                snapshot.servers.get(server).dip
            } else {
                dst_in
            };
            assert_eq!(dst_out, expected, "destination address of {verdict:?}");
        }
        Verdict::ToClient => {
            assert_eq!(dst_in, dst_out, "the client address is never rewritten");
            assert_eq!(input[0..6], output[0..6], "ToClient keeps the MAC header");
        }
        _ => unreachable!(),
    }
    match l.protocol {
        ip_proto::TCP if l.end - l.l4 >= 20 => {
            assert_eq!(
                tcp_sum(input, l),
                tcp_sum(output, lo),
                "{verdict:?}: the TCP checksum must stay exactly as right or wrong as it was"
            );
            check_ports(snapshot, input, output, l, verdict);
            check_cookie(worker, snapshot, input, output, l, verdict, echo);
        }
        ip_proto::ICMP if l.end - l.l4 >= 8 => {
            assert_eq!(
                icmp_sums(input, l),
                icmp_sums(output, l),
                "{verdict:?}: ICMP, quoted IPv4 and quoted TCP checksums must stay exactly as right or wrong as they were"
            );
        }
        _ => assert!(
            input[l.l3..] == output[l.l3..],
            "{verdict:?}: a non-TCP, non-ICMP packet is forwarded unchanged past L2"
        ),
    }
}

/// Where a forwarded TCP packet goes: a new connection only to a server of the VIP's pool
/// (active, not draining), and in NAT mode the VIP port <-> backend port translation.
pub(super) fn check_ports(
    snapshot: &Snapshot,
    input: &[u8],
    output: &[u8],
    l: Layout,
    verdict: Verdict,
) {
    let nat = snapshot.forwarding == Forwarding::Nat;
    let (src, dst) = (read_u32(input, l.l3 + 12), read_u32(input, l.l3 + 16));
    let (sport, dport) = (read_u16(input, l.l4), read_u16(input, l.l4 + 2));
    let (sport_out, dport_out) = (read_u16(output, l.l4), read_u16(output, l.l4 + 2));
    match verdict {
        Verdict::ToServer(server) => {
            let vip = snapshot
                .vip_index(dst, dport)
                .map(|v| snapshot.vip(v))
                .expect("a client packet forwarded to a server was for a VIP");
            assert_eq!(sport_out, sport, "the client port is never rewritten");
            let expected = if nat { vip.backend_port } else { dport };
            assert_eq!(dport_out, expected, "destination port of {verdict:?}");
            if SegmentKind::from_flags(input[l.l4 + 13]) == SegmentKind::Syn {
                assert!(
                    vip.pool.servers.contains(&server),
                    "a new connection went to {server:?}, outside the pool {:?}",
                    vip.pool.servers
                );
            }
        }
        Verdict::ToClient if nat => {
            let (_, vip) = snapshot
                .nat_backend(src, sport)
                .expect("a NAT reply came from a backend");
            let vip = snapshot.vip(vip);
            assert_eq!(
                read_u32(output, l.l3 + 12),
                vip.ipv4_or_zero(),
                "NAT replies leave from the VIP"
            );
            assert_eq!(sport_out, vip.port, "NAT replies leave from the VIP port");
            assert_eq!(dport_out, dport, "the client port is never rewritten");
        }
        _ => assert_eq!(
            (sport_out, dport_out),
            (sport, dport),
            "{verdict:?}: ports are only rewritten by NAT"
        ),
    }
}

/// Cheetah mode: what the cookie in a forwarded TCP packet says must agree with the verdict.
pub(super) fn check_cookie(
    worker: &Worker,
    snapshot: &Snapshot,
    input: &[u8],
    output: &[u8],
    l: Layout,
    verdict: Verdict,
    echo: Option<Echo>,
) {
    if snapshot.mode != Mode::Cheetah {
        return;
    }
    let Some((tsval_at, tsecr_at, kind)) = timestamp_at(input, l) else {
        return;
    };
    let (src, dst) = (read_u32(input, l.l3 + 12), read_u32(input, l.l3 + 16));
    let (sport, dport) = (read_u16(input, l.l4), read_u16(input, l.l4 + 2));
    match verdict {
        Verdict::ToServer(server) => {
            assert_eq!(
                input[tsval_at..tsval_at + 4],
                output[tsval_at..tsval_at + 4],
                "the client's TSval is never rewritten"
            );
            if kind == SegmentKind::Syn {
                return;
            }
            if input[l.l4 + 13] & tcp::flags::ACK == 0 {
                // Without ACK, TSecr echoes nothing (RFC 7323): routed like a segment
                // without timestamps, and TSecr left as it is.
                assert_eq!(
                    input[tsecr_at..tsecr_at + 4],
                    output[tsecr_at..tsecr_at + 4],
                    "the TSecr of a client segment without ACK is never rewritten"
                );
                return;
            }
            // Routed by the cookie echoed in TSecr: it must decode to the chosen server,
            // and only the 16 MSB of TSecr may change, to what the harness's model of the
            // server's clock says (not what the core's own table says).
            let hash = flow_hash(worker, src, sport, dst, dport);
            let tsecr = read_u32(input, tsecr_at);
            let (id, epoch) = decode(worker.shared().layout(), tsecr, hash);
            assert_eq!(id, server, "cookie-routed {verdict:?}");
            let restored = read_u32(output, tsecr_at);
            assert_eq!(restored & 0xffff, tsecr & 0xffff, "TSecr low bits");
            if let Some(echo) = echo {
                echo.clocks.check_restore(
                    server,
                    epoch,
                    (restored >> 16) as u16,
                    echo.counted_beyond,
                );
            }
        }
        Verdict::ToClient => {
            // From a server: TSval now carries a cookie naming that server.
            let sender = if snapshot.forwarding == Forwarding::Nat {
                snapshot.nat_backend(src, sport)
            } else {
                let mac: [u8; 6] = input[6..12].try_into().unwrap();
                snapshot
                    .server_by_mac(&mac)
                    .zip(snapshot.vip_index(src, sport))
            };
            let Some((server, vip)) = sender else {
                panic!("ToClient for a TCP packet from no known server");
            };
            let vip = snapshot.vip(vip);
            let hash = flow_hash(worker, dst, dport, vip.ipv4_or_zero(), vip.port);
            let tsval = read_u32(input, tsval_at);
            let cookie_tsval = read_u32(output, tsval_at);
            assert_eq!(cookie_tsval & 0xffff, tsval & 0xffff, "TSval low bits");
            let layout = worker.shared().layout();
            let (id, epoch) = decode(layout, cookie_tsval, hash);
            assert_eq!(id, server, "the cookie names the sending server");
            assert_eq!(
                u32::from(epoch),
                (tsval >> 16) & u32::from(layout.epochs() - 1),
                "the cookie's epoch is the displaced MSB modulo 2^k"
            );
            if let Some(echo) = echo {
                echo.clocks.sent(server, tsval, echo.now);
            }
            assert_eq!(
                input[tsecr_at..tsecr_at + 4],
                output[tsecr_at..tsecr_at + 4],
                "the server's TSecr is never rewritten"
            );
        }
        _ => {}
    }
}
