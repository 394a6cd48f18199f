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

use anyhow::ensure;
use cheetah_core::cookie::{tcp_ts, MsbTable};
use cheetah_core::lb::cookie_stage::route_by_cookie;
use cheetah_core::tables::AllServers;
use cheetah_core::wire::checksum;
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

pub struct Element {
    pub set: PacketSet,
    parsed: Vec<Parsed>,
    servers: AllServers,
    lab_shared: std::sync::Arc<cheetah_core::lb::LbShared>,
}

/// The element's work for one packet.
#[inline(always)]
pub fn element_packet(
    servers: &AllServers,
    msb: &MsbTable,
    parsed: &Parsed,
    packet: &mut [u8],
) -> Result<ServerId, DropReason> {
    let (server, restored) = route_by_cookie(servers, msb, parsed.tsecr, parsed.flow_hash)?;
    let (at, c) = (parsed.tsecr_at as usize, parsed.checksum_at as usize);
    if !parsed.odd {
        // Only the cookie half changes; the pipeline's straight line rewrites it the same way.
        checksum::replace_high_half(packet, at, c, tcp_ts::extract(restored));
    } else if restored != parsed.tsecr {
        packet[at..at + 4].copy_from_slice(&restored.to_be_bytes());
        let sum = checksum::update_u32_at(
            u16::from_be_bytes([packet[c], packet[c + 1]]),
            true,
            parsed.tsecr,
            restored,
        );
        packet[c..c + 2].copy_from_slice(&sum.to_be_bytes());
    }
    packet[0..6].copy_from_slice(&servers.get(server).mac);
    Ok(server)
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
        let mut parsed = Vec::with_capacity(selected.len());
        for p in &selected {
            let (_, tsecr_at) =
                testkit::timestamp_offsets(&p.frame).expect("established packets carry TS");
            let l4 = 14 + (p.frame[14] & 0x0f) as usize * 4;
            parsed.push(Parsed {
                tsecr: u32::from_be_bytes(p.frame[tsecr_at..tsecr_at + 4].try_into().unwrap()),
                flow_hash: shared.hasher.hash(&trace.keys[p.flow as usize]),
                tsecr_at: tsecr_at as u32,
                checksum_at: (l4 + 16) as u32,
                odd: (tsecr_at - l4) % 2 == 1,
            });
        }
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
            ensure!(
                routed == Ok(p.server),
                "element sent packet {i} to {routed:?}, not {:?}",
                p.server
            );
            ensure!(
                testkit::checksums_valid(set.work(i)),
                "packet {i}: checksum"
            );
            let mut whole = p.frame.clone();
            worker.process(&mut whole, trace.end);
            let at = parsed[i].tsecr_at as usize;
            let c = parsed[i].checksum_at as usize;
            ensure!(
                whole[..6] == set.work(i)[..6]
                    && whole[at..at + 4] == set.work(i)[at..at + 4]
                    && whole[c..c + 2] == set.work(i)[c..c + 2],
                "packet {i}: the element and the pipeline disagree"
            );
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
