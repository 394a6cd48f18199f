//! Whole packets through `Worker::process`: warm the worker, check every verdict, then time.
//!
//! A path's figure is only worth something if its packets take the path: a client packet
//! the worker drops as `ts_msb_unknown` costs a fraction of one it routes. So before
//! anything is timed, each packet of the path goes through the worker once and its verdict
//! is checked (routed, to the connection's own server where that is determined, payload not
//! written); any drop or misroute fails the benchmark with the counts.

use std::hint::black_box;
use std::time::Instant;

use anyhow::{bail, ensure};
use cheetah_core::lb::{Counter, Ingress, Worker};
use cheetah_core::{DropReason, Nanos, Verdict};

use super::items::Path;
use super::lab::Lab;
use super::packets::{PacketSet, BURST};
use super::timing::{Pass, Timed};
use super::trace::{Trace, TracePacket};

/// A worker ready to process one path's packets.
pub struct Prepared {
    pub worker: Worker,
    pub set: PacketSet,
    /// Option lookups of the checking pass: (fast path, slow path).
    pub options_fast: u64,
    pub options_slow: u64,
    now: Nanos,
    /// Call `Worker::process` per packet instead of `Worker::process_batch` per burst.
    per_packet: bool,
    /// When timing began: `now` moves on with real time, as on a live worker, so load
    /// merges keep their cadence.
    started: Option<Instant>,
}

/// Replays the whole trace through `worker`, as the trace's time went, so it holds what a
/// worker that saw this traffic holds (load counts, fallback entries); fails on any drop.
///
/// The LB's recent SYNs and closes are forgotten first: the trace was played through this
/// LB before (to generate it, or to warm another row's worker), and a SYN seen again would
/// count as a retransmission, sending every SYN-ACK after it down the retried-SYN path; a
/// FIN seen again would not lower its server's count.
pub fn warm(worker: &mut Worker, trace: &Trace) -> anyhow::Result<()> {
    worker.shared().handshakes.clear();
    worker.shared().closes.clear();
    let mut drops: Vec<DropReason> = Vec::new();
    for packet in &trace.packets {
        let mut frame = packet.frame.clone();
        if let Verdict::Drop(reason) = worker.process(&mut frame, packet.at, Ingress::ServerSide) {
            drops.push(reason);
        }
    }
    ensure!(
        drops.is_empty(),
        "warming replay dropped {} packets, first {:?}",
        drops.len(),
        drops.first()
    );
    Ok(())
}

/// A fresh worker of `lab`, warmed on `trace`, with `path`'s packets checked once.
pub fn prepare(
    lab: &Lab,
    trace: &Trace,
    path: Path,
    full_restore: bool,
    per_packet: bool,
    ring_frames: usize,
) -> anyhow::Result<Prepared> {
    let mut worker = lab.worker();
    warm(&mut worker, trace)?;
    let selected: Vec<&TracePacket> = trace.packets.iter().filter(|p| path.selects(p)).collect();
    ensure!(
        !selected.is_empty(),
        "the trace has no {} packets",
        path.name()
    );
    let mut set = PacketSet::new(
        selected.iter().map(|p| &p.frame[..]),
        full_restore,
        ring_frames,
    );
    let now = trace.end;
    let counters = worker.counters().clone();
    let (fast0, slow0) = (
        counters.get(Counter::OptionsFastPath),
        counters.get(Counter::OptionsSlowPath),
    );
    // A SYN's server depends on the policy's state, not on the trace; everything else must
    // go where the connection is.
    let fixed_server = path != Path::Syn;
    let mut drops: Vec<(DropReason, usize)> = Vec::new();
    let mut misrouted = 0usize;
    for (i, packet) in selected.iter().enumerate() {
        let verdict = worker.process(set.restored_whole(i), now, Ingress::ServerSide);
        let ok = match verdict {
            Verdict::ToServer(server) if packet.role.is_client() => {
                !fixed_server || server == packet.server
            }
            Verdict::ToClient => !packet.role.is_client(),
            Verdict::Drop(reason) => {
                match drops.iter_mut().find(|(r, _)| *r == reason) {
                    Some((_, n)) => *n += 1,
                    None => drops.push((reason, 1)),
                }
                true
            }
            _ => false,
        };
        misrouted += usize::from(!ok);
        ensure!(
            set.payload_untouched(i),
            "packet {i} was written past its TCP header; restore the whole frame (--full-restore)"
        );
    }
    if !drops.is_empty() || misrouted > 0 {
        bail!(
            "{} {}: {} of {} packets dropped ({:?}), {} misrouted: refusing to time a drop path",
            path.name(),
            lab.mode.name(),
            drops.iter().map(|(_, n)| n).sum::<usize>(),
            set.len(),
            drops,
            misrouted
        );
    }
    Ok(Prepared {
        options_fast: counters.get(Counter::OptionsFastPath) - fast0,
        options_slow: counters.get(Counter::OptionsSlowPath) - slow0,
        worker,
        set,
        now,
        per_packet,
        started: None,
    })
}

impl Prepared {
    /// Processes `packets` packets (cycling over the path) with no timing, in bursts
    /// through [`measured_packet_burst`] (or one by one through [`measured_packet`] with
    /// `--per-packet`), for `valgrind --toggle-collect`.
    pub fn run_for_instructions(&mut self, packets: u64) {
        let n = self.set.len();
        if self.per_packet {
            for k in 0..packets as usize {
                let packet = self.set.restored(k % n);
                black_box(measured_packet(&mut self.worker, packet, self.now));
            }
            return;
        }
        let (mut left, mut start) = (packets as usize, 0);
        while left > 0 {
            let end = (start + BURST).min(n).min(start + left);
            let burst = self.set.restored_burst(start, end);
            measured_packet_burst(&mut self.worker, burst, self.now);
            left -= end - start;
            start = end % n;
        }
    }
}

impl Timed for Prepared {
    fn items(&self) -> usize {
        self.set.len()
    }

    fn pass(&mut self, pass: Pass) {
        match pass {
            Pass::Baseline => self.set.restore_pass(),
            Pass::Work => {
                let started = *self.started.get_or_insert_with(Instant::now);
                let now = self.now + started.elapsed().as_nanos() as Nanos;
                let worker = &mut self.worker;
                if self.per_packet {
                    self.set.pass(|_, packet| {
                        black_box(worker.process(packet, now, Ingress::ServerSide));
                    });
                } else {
                    self.set.pass_bursts(|burst| {
                        worker.process_batch(burst, now, Ingress::ServerSide, |v| {
                            black_box(v);
                        });
                    });
                }
            }
        }
    }
}

/// One packet through the pipeline, never inlined so callgrind can count exactly it.
#[inline(never)]
pub fn measured_packet(worker: &mut Worker, packet: &mut [u8], now: Nanos) -> Verdict {
    worker.process(packet, now, Ingress::ServerSide)
}

/// One burst through the pipeline as the receive loop runs it, never inlined so callgrind
/// can count exactly it (its name matches the same `--toggle-collect` pattern).
#[inline(never)]
pub fn measured_packet_burst<'p>(
    worker: &mut Worker,
    burst: impl Iterator<Item = &'p mut [u8]>,
    now: Nanos,
) {
    worker.process_batch(burst, now, Ingress::ServerSide, |v| {
        black_box(v);
    });
}
