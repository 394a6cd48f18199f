//! The element-equivalent figure: the cookie stage as the original FastClick element
//! measures itself.
//!
//! In FastClick, earlier elements have parsed the headers and the NIC (or a previous
//! element) has computed the flow hash, so the Cheetah element's own cost per established
//! client packet is: decode the cookie in TSecr, check the server in AllServers, restore the
//! server's MSB, write the restored TSecr with an incremental checksum update, and set the
//! destination MAC. That is exactly what [`element_packet`] does, on inputs extracted from
//! the packets beforehand (TSecr, keyed hash, offsets), so the figure is comparable with the
//! original implementation's 17 TSC ticks on this machine. The packet is restored from its
//! pristine copy before each use (the restore is subtracted), which also leaves its header
//! in L1 as the parsing elements would.

use std::hint::black_box;

use anyhow::{ensure, Context};
use cheetah_core::cookie::{tcp_ts, MsbTable};
use cheetah_core::hash::FlowKey;
use cheetah_core::lb::cookie_stage::route_to_slot;
use cheetah_core::lb::{Ingress, LbShared};
use cheetah_core::tables::AllServers;
use cheetah_core::wire::{checksum, ethernet, tcp, TcpSegment};
use cheetah_core::{testkit, DropReason, ServerId};

use super::items::Path;
use super::lab::Lab;
use super::packets::PacketSet;
use super::pipeline;
use super::timing::{Pass, Timed};
use super::trace::{Trace, TracePacket};

/// What the parsing elements and the NIC hand the Cheetah element.
#[derive(Clone, Copy, Debug)]
pub struct Parsed {
    pub tsecr: u32,
    pub flow_hash: u64,
    /// Frame offsets of TSecr and of the TCP checksum.
    pub tsecr_at: u32,
    pub checksum_at: u32,
    /// Whether TSecr starts at an odd offset from the TCP header.
    pub odd: bool,
}

impl Parsed {
    /// The element's inputs for an established client frame carrying timestamps.
    fn of(frame: &[u8], shared: &LbShared, key: &FlowKey) -> Parsed {
        let (_, tsecr_at) =
            testkit::timestamp_offsets(frame).expect("established packets carry TS");
        let (_, l4, _) = testkit::tcp_view(frame).expect("trace packets are IPv4 TCP");
        Parsed {
            tsecr: u32::from_be_bytes(frame[tsecr_at..tsecr_at + 4].try_into().unwrap()),
            flow_hash: shared.hasher.hash(key),
            tsecr_at: tsecr_at as u32,
            checksum_at: (l4 + tcp::field::CHECKSUM) as u32,
            odd: (tsecr_at - l4) % 2 == 1,
        }
    }
}

/// Errs unless the element sent the packet to `server`, with valid checksums and the same
/// MAC, TSecr and checksum bytes as the whole pipeline wrote.
fn same_as_pipeline(
    parsed: &Parsed,
    routed: Result<ServerId, DropReason>,
    server: ServerId,
    element_out: &[u8],
    pipeline_out: &[u8],
) -> anyhow::Result<()> {
    ensure!(
        routed == Ok(server),
        "element sent it to {routed:?}, not {server:?}"
    );
    ensure!(
        testkit::checksums_valid(element_out),
        "element left a bad checksum"
    );
    let at = parsed.tsecr_at as usize;
    let c = parsed.checksum_at as usize;
    let mac = ethernet::field::DST;
    ensure!(
        pipeline_out[mac.clone()] == element_out[mac]
            && pipeline_out[at..at + 4] == element_out[at..at + 4]
            && pipeline_out[c..c + 2] == element_out[c..c + 2],
        "the element and the pipeline disagree"
    );
    Ok(())
}

pub struct Element {
    pub set: PacketSet,
    parsed: Vec<Parsed>,
    servers: AllServers,
    lab_shared: std::sync::Arc<LbShared>,
}

/// The element's work for one packet.
#[inline(always)]
pub fn element_packet(
    servers: &AllServers,
    msb: &MsbTable,
    parsed: &Parsed,
    packet: &mut [u8],
) -> Result<ServerId, DropReason> {
    let (server, slot, restored) = route_to_slot(
        servers,
        msb,
        tcp_ts::extract(parsed.tsecr),
        parsed.flow_hash,
    )?;
    packet[ethernet::field::DST].copy_from_slice(&slot.mac);
    let (at, checksum_at) = (parsed.tsecr_at as usize, parsed.checksum_at as usize);
    if !parsed.odd {
        // Only the cookie half changes (the restored MSB is in network byte order); the
        // pipeline's straight line rewrites it the same way.
        checksum::replace_high_half_in_network_order(packet, at, checksum_at, restored);
    } else {
        let tsecr = ((u16::from_be(restored) as u32) << 16) | (parsed.tsecr & 0xffff);
        rewrite_odd_tsecr(packet, parsed, tsecr);
    }
    Ok(server)
}

/// A TSecr at an odd offset straddles checksum words, so the whole word is rewritten; rare,
/// and out of line so that it costs the common case nothing.
#[cold]
#[inline(never)]
fn rewrite_odd_tsecr(packet: &mut [u8], parsed: &Parsed, restored: u32) {
    let l4 = parsed.checksum_at as usize - tcp::field::CHECKSUM;
    let option_offset = parsed.tsecr_at as usize - l4 - tcp::MIN_HEADER_LEN;
    TcpSegment::new_unchecked(&mut packet[l4..]).rewrite_option_u32(option_offset, restored);
}

/// [`element_packet`], never inlined, for callgrind.
#[inline(never)]
pub fn measured_element(
    servers: &AllServers,
    msb: &MsbTable,
    parsed: &Parsed,
    packet: &mut [u8],
) -> Result<ServerId, DropReason> {
    element_packet(servers, msb, parsed, packet)
}

impl Element {
    /// Extracts the element's inputs from the cheetah trace's established client packets
    /// and checks, packet by packet, that the element routes them where the connection is
    /// and leaves MAC and TSecr exactly as the whole pipeline does.
    pub fn prepare(
        lab: &Lab,
        trace: &Trace,
        full_restore: bool,
        ring_frames: usize,
    ) -> anyhow::Result<Self> {
        let shared = lab.plane.shared().clone();
        let selected: Vec<&TracePacket> = trace
            .packets
            .iter()
            .filter(|p| Path::Element.selects(p))
            .collect();
        let parsed: Vec<Parsed> = selected
            .iter()
            .map(|p| Parsed::of(&p.frame, &shared, &trace.keys[p.flow as usize]))
            .collect();
        let servers = lab.plane.shared().snapshot.load().servers.clone();
        let mut set = PacketSet::new(
            selected.iter().map(|p| &p.frame[..]),
            full_restore,
            ring_frames,
        );
        let mut worker = lab.worker();
        pipeline::warm(&mut worker, trace)?;
        for (i, p) in selected.iter().enumerate() {
            let routed = element_packet(&servers, &shared.msb, &parsed[i], set.restored_whole(i));
            let mut whole = p.frame.clone();
            worker.process(&mut whole, trace.end, Ingress::ServerSide);
            same_as_pipeline(&parsed[i], routed, p.server, set.work(i), &whole)
                .with_context(|| format!("trace packet {i}"))?;
        }
        Ok(Element {
            set,
            parsed,
            servers,
            lab_shared: shared,
        })
    }

    pub fn run_for_instructions(&mut self, packets: u64) {
        let n = self.set.len();
        let msb = &self.lab_shared.msb;
        for k in 0..packets as usize {
            let i = k % n;
            let packet = self.set.restored(i);
            let _ = black_box(measured_element(
                &self.servers,
                msb,
                &self.parsed[i],
                packet,
            ));
        }
    }
}

impl Timed for Element {
    fn items(&self) -> usize {
        self.set.len()
    }

    fn pass(&mut self, pass: Pass) {
        let (parsed, servers, msb) = (&self.parsed, &self.servers, &self.lab_shared.msb);
        match pass {
            Pass::Baseline => self.set.restore_pass(),
            Pass::Work => self.set.pass(|i, packet| {
                let _ = black_box(element_packet(servers, msb, &parsed[i], packet));
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::packets::DEFAULT_RING_FRAMES;
    use crate::bench::trace::{generate, TraceConfig};
    use cheetah_core::config::Mode;
    use cheetah_core::policy::PolicyKind;
    use cheetah_core::testkit::{options, TcpFrame};

    fn lab_and_trace() -> (Lab, Trace) {
        let config = TraceConfig {
            flows: 2_000,
            concurrency: 200,
            ..TraceConfig::default()
        };
        let lab = Lab::new(Mode::Cheetah, PolicyKind::RoundRobin, 64).unwrap();
        let trace = generate(&config, &mut lab.worker()).unwrap();
        (lab, trace)
    }

    /// `prepare` itself refuses an element whose bytes differ from the pipeline's.
    #[test]
    fn the_element_rewrites_the_trace_as_the_pipeline_does() {
        let (lab, trace) = lab_and_trace();
        let element = Element::prepare(&lab, &trace, false, DEFAULT_RING_FRAMES).unwrap();
        assert!(element.parsed.iter().all(|p| !p.odd));
    }

    /// The trace's established segments carry TSecr at even offsets only, so the odd branch
    /// gets the same segments with their timestamp moved: NOP TS NOP.
    #[test]
    fn the_element_rewrites_an_odd_offset_tsecr_as_the_pipeline_does() {
        let (lab, trace) = lab_and_trace();
        let shared = lab.plane.shared().clone();
        let servers = shared.snapshot.load().servers.clone();
        let mut worker = lab.worker();
        pipeline::warm(&mut worker, &trace).unwrap();
        let established = trace.packets.iter().filter(|p| Path::Element.selects(p));
        let mut checked = 0;
        for p in established.take(500) {
            let (tsval, tsecr) = testkit::timestamps(&p.frame).unwrap();
            let (client, _, client_port, _) = testkit::addresses(&p.frame).unwrap();
            let (_, l4, end) = testkit::tcp_view(&p.frame).unwrap();
            let segment = TcpSegment::new_checked(&p.frame[l4..end]).unwrap();
            let mut odd = TcpFrame::from_client(
                client,
                client_port,
                segment.flags(),
                options::nop_ts_nop(tsval, tsecr),
            );
            (odd.seq, odd.ack) = (segment.seq(), segment.ack());
            odd.payload = p.frame[l4 + segment.header_len()..end].to_vec();
            let frame = odd.build();
            let parsed = Parsed::of(&frame, &shared, &trace.keys[p.flow as usize]);
            assert!(parsed.odd);
            let mut element_out = frame.clone();
            let routed = element_packet(&servers, &shared.msb, &parsed, &mut element_out);
            let mut pipeline_out = frame;
            worker.process(&mut pipeline_out, trace.end, Ingress::ServerSide);
            same_as_pipeline(&parsed, routed, p.server, &element_out, &pipeline_out).unwrap();
            checked += 1;
        }
        assert_eq!(checked, 500);
    }
}
