//! One worker thread: receive a batch from each of its sockets, run the batch through the
//! core (`Worker::process_batch`), queue each packet on the socket of the interface it
//! leaves by, repeat; sleep in `poll()` when there is nothing to do.
//!
//! The loop allocates nothing and takes no lock: descriptor arrays are sized once, the
//! core reads its tables through a snapshot pointer, and counters are single-writer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cheetah_core::lb::Worker;
use cheetah_core::types::{Nanos, ServerId};
use cheetah_core::Verdict;
use xdpilone::xdp::XdpDesc;

use super::egress::ServerEgress;
use super::io_counters::IoCounters;
use super::meta::{NextHop, PacketMeta};
use super::neighbour::NeighbourResolver;
use super::sides::InterfaceSides;
use super::xsk::WorkerPorts;
use crate::clock::Clock;

pub const BATCH: usize = 64;
/// Room per port for one batch plus ICMP copies before a mid-batch flush is needed.
const TX_STAGE: usize = BATCH * 2;
const IDLE_POLL_MS: i32 = 10;
const TICK_EVERY: Nanos = 1_000_000;

pub struct DataPath {
    pub worker: Worker,
    pub ports: WorkerPorts,
    pub io: Arc<IoCounters>,
    pub clock: Clock,
    pub stop: Arc<AtomicBool>,
    pub busy_poll: bool,
    /// Which interfaces face the servers (replies count only from there).
    pub sides: Arc<InterfaceSides>,
}

struct Staging {
    tx: Vec<Vec<XdpDesc>>,
    egress: ServerEgress,
    port_names: Vec<(String, u8)>,
    neighbours: NeighbourResolver,
}

impl DataPath {
    pub fn run(mut self, port_names: Vec<(String, u8)>) {
        let mut rx: Vec<XdpDesc> = Vec::with_capacity(BATCH);
        // One verdict per received packet, and a receive never takes more than `rx` holds:
        // never reallocated.
        let mut verdicts: Vec<Verdict> = Vec::with_capacity(rx.capacity());
        let mut stage = Staging {
            tx: (0..self.ports.ports.len())
                .map(|_| Vec::with_capacity(TX_STAGE))
                .collect(),
            egress: ServerEgress::default(),
            port_names,
            neighbours: NeighbourResolver::new(),
        };
        let mut pollfds: Vec<libc::pollfd> = self
            .ports
            .ports
            .iter()
            .map(|p| libc::pollfd {
                fd: p.fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let mut last_tick = 0;
        while !self.stop.load(Ordering::Relaxed) {
            let now = self.clock.now();
            if now.saturating_sub(last_tick) >= TICK_EVERY {
                self.worker.tick(now);
                last_tick = now;
            }
            let mut received = 0;
            for port in 0..self.ports.ports.len() {
                rx.clear();
                let n = self.ports.receive(port, &mut rx);
                if n == 0 {
                    continue;
                }
                received += n;
                IoCounters::add(&self.io.rx_batches, 1);
                // The core sees the whole burst in one call (one snapshot check, the
                // straight line in one loop), then each packet goes where it was sent.
                verdicts.clear();
                let ports = &self.ports;
                let ingress = self.sides.ingress(ports.ports[port].slot);
                self.worker.process_batch(
                    rx.iter().map(|desc| {
                        // SAFETY: each frame was just received, so this worker owns it
                        // until it is queued for transmission or released; the frames
                        // are distinct and no other reference into them exists while
                        // the batch runs.
                        unsafe { ports.bytes(desc.addr, desc.len) }
                    }),
                    now,
                    ingress,
                    |verdict| verdicts.push(verdict),
                );
                for (desc, verdict) in rx.iter().zip(&verdicts) {
                    self.handle(*desc, *verdict, now, &mut stage);
                }
            }
            for port in 0..self.ports.ports.len() {
                self.send_staged(port, &mut stage);
                self.ports.flush(port);
                self.ports.reap_completions(port);
                if self.ports.refill(port) {
                    IoCounters::add(&self.io.fill_ring_empty, 1);
                    self.ports.wake_rx(port);
                }
            }
            if received == 0 && !self.busy_poll && !self.ports.tx_pending() {
                // SAFETY: pollfds holds this worker's open socket fds.
                unsafe {
                    libc::poll(
                        pollfds.as_mut_ptr(),
                        pollfds.len() as libc::nfds_t,
                        IDLE_POLL_MS,
                    )
                };
                IoCounters::add(&self.io.poll_wakeups, 1);
            }
        }
    }

    fn send_staged(&mut self, port: usize, stage: &mut Staging) {
        let staged = &mut stage.tx[port];
        if staged.is_empty() {
            return;
        }
        let bytes: u64 = staged.iter().map(|d| d.len as u64).sum();
        let dropped = self.ports.transmit(port, staged);
        IoCounters::add(&self.io.tx_packets, (staged.len() - dropped) as u64);
        IoCounters::add(&self.io.tx_bytes, bytes);
        IoCounters::add(&self.io.tx_ring_full, dropped as u64);
        staged.clear();
    }

    fn stage(&mut self, port: usize, desc: XdpDesc, stage: &mut Staging) {
        if stage.tx[port].len() == TX_STAGE {
            self.send_staged(port, stage);
            self.ports.flush(port);
        }
        stage.tx[port].push(desc);
    }

    /// Sends one processed packet where its verdict says.
    fn handle(&mut self, desc: XdpDesc, verdict: Verdict, now: Nanos, stage: &mut Staging) {
        IoCounters::add(&self.io.rx_packets, 1);
        IoCounters::add(&self.io.rx_bytes, desc.len as u64);
        let meta = self.ports.meta(desc.addr).and_then(PacketMeta::parse);
        // SAFETY: the frame was received in this burst, so this worker owns it until it is
        // queued for transmission or released; the core's borrow of it has ended.
        let packet = unsafe { self.ports.bytes(desc.addr, desc.len) };
        match verdict {
            Verdict::ToServer(id) => match self.server_egress(id, now, stage) {
                Some((port, dst_mac)) => {
                    packet[0..6].copy_from_slice(&dst_mac);
                    packet[6..12].copy_from_slice(&self.ports.ports[port].mac);
                    self.stage(port, desc, stage);
                }
                None => self.drop_no_route(desc),
            },
            Verdict::ToClient => match meta.map(|m| m.next_hop) {
                Some(NextHop::Resolved { ifindex, dst, src }) => {
                    match stage.port_for_ifindex(&self.ports, ifindex) {
                        Some(port) => {
                            packet[0..6].copy_from_slice(&dst);
                            packet[6..12].copy_from_slice(&src);
                            self.stage(port, desc, stage);
                        }
                        None => self.drop_no_route(desc),
                    }
                }
                Some(NextHop::NoNeighbour { ifindex, gateway }) => {
                    stage.neighbours.request(ifindex, gateway, now);
                    self.drop_no_route(desc);
                }
                Some(NextHop::Unroutable) => self.drop_no_route(desc),
                None => {
                    IoCounters::add(&self.io.missing_metadata, 1);
                    self.ports.release(desc.addr);
                }
            },
            Verdict::ToAllServers { vip } => {
                for i in 0..self.worker.copy_targets(vip).len() {
                    let server = self.worker.copy_targets(vip)[i];
                    self.copy_to(desc, vip, server, now, stage);
                }
                self.ports.release(desc.addr);
            }
            Verdict::Pass => {
                IoCounters::add(&self.io.passed_unhandled, 1);
                self.ports.release(desc.addr);
            }
            Verdict::Drop(_) => self.ports.release(desc.addr),
        }
    }

    fn copy_to(
        &mut self,
        original: XdpDesc,
        vip: u16,
        server: ServerId,
        now: Nanos,
        stage: &mut Staging,
    ) {
        let Some((port, dst_mac)) = self.server_egress(server, now, stage) else {
            IoCounters::add(&self.io.no_route, 1);
            return;
        };
        let Some(frame) = self.ports.allocate() else {
            IoCounters::add(&self.io.no_free_frame, 1);
            return;
        };
        let addr = frame + WorkerPorts::COPY_HEADROOM;
        // SAFETY: `original` is still owned by this worker; `frame` was just taken from the
        // free list, so the two regions are distinct frames.
        let (from, to) = unsafe {
            (
                self.ports.bytes(original.addr, original.len),
                self.ports.bytes(addr, original.len),
            )
        };
        to.copy_from_slice(from);
        self.worker.prepare_copy(to, vip, server);
        to[0..6].copy_from_slice(&dst_mac);
        to[6..12].copy_from_slice(&self.ports.ports[port].mac);
        IoCounters::add(&self.io.frames_copied, 1);
        self.stage(
            port,
            XdpDesc {
                addr,
                len: original.len,
                options: 0,
            },
            stage,
        );
    }

    fn server_egress(
        &mut self,
        id: ServerId,
        now: Nanos,
        stage: &mut Staging,
    ) -> Option<(usize, [u8; 6])> {
        let snapshot = self.worker.snapshot();
        let slot = snapshot.servers.get(id);
        let mac = slot.has_mac.then_some(slot.mac);
        stage
            .egress
            .lookup(
                snapshot.generation,
                id,
                slot.dip,
                mac,
                &stage.port_names,
                now,
            )
            .map(|e| (e.port as usize, e.dst_mac))
    }

    fn drop_no_route(&mut self, desc: XdpDesc) {
        IoCounters::add(&self.io.no_route, 1);
        self.ports.release(desc.addr);
    }
}

impl Staging {
    fn port_for_ifindex(&self, ports: &WorkerPorts, ifindex: u32) -> Option<usize> {
        ports.ports.iter().position(|p| p.ifindex == ifindex)
    }
}
