//! The XDP program (bpf/xdp_lb.c) as the tests that hold it to the core run it: loaded
//! (not attached: `BPF_PROG_TEST_RUN` needs no attachment), its maps published from a core
//! pipeline's tables by the daemon's publisher, the core's clock table over the program's
//! mmapped clock words, and one packet at a time through `BPF_PROG_TEST_RUN` with what
//! each run moved: the action, the frame, the `STAT_*` counters and `server_traffic`
//! (included by path, `#[path]`, with `lb_topology.rs`, `lb_namespace.rs`, `vectors.rs`).

// Each test binary that includes this file reads the part of a run it checks.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use cheetah_core::config::LbConfig;
use cheetah_core::hash::Secret;
use cheetah_core::lb::{Counter, Worker, WorkerConfig};
use cheetah_core::tables::ControlPlane;
use cheetah_core::types::ServerId;
use cheetah_core::verdict::DropReason;
use cheetah_daemon::clock::monotonic_ns;
use cheetah_daemon::dataplane::meta::META_LEN;
use cheetah_daemon::dataplane::next_hops::NextHopMirror;
use cheetah_daemon::dataplane::xdp::{CloseWords, KernelWords, SteeringProgram};
use cheetah_daemon::dataplane::xdp_layout::*;
use cheetah_daemon::dataplane::xdp_policy::{PolicySeeder, PolicySeeds};
use cheetah_daemon::dataplane::xdp_tables::{wanted, Publication, Publisher};
use libbpf_rs::ProgramInput;

use super::lb_topology::{Port, Topology};
use super::vectors::read;

/// The shortest frame `BPF_PROG_TEST_RUN` takes (`bpf_test_init`).
pub const ETH_HLEN: usize = 14;

/// Where the IP header starts: past the Ethernet header and up to two VLAN tags, as the
/// core's `EthernetFrame` finds it (14 for a frame too short for one).
pub fn l3_offset(frame: &[u8]) -> usize {
    cheetah_core::wire::EthernetFrame::new_checked(frame).map_or(ETH_HLEN, |f| f.payload_offset())
}

/// The IPv4 total length of a frame (options included), untagged or behind tags: the
/// bytes the core's `loads.on_packet` counts for it.
pub fn ip_total_len(frame: &[u8]) -> u64 {
    let l3 = l3_offset(frame);
    u64::from(u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]))
}

/// The LB host's own addresses, as `cheetah run` gives them to steering (`host_addrs`):
/// a backend's segment to one is the answer to a health probe, the host's.
pub const HOST_ADDRS: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 1, 255, 254), Ipv4Addr::new(10, 7, 0, 1)];

/// Whether `frame` is IPv4 to one of the [`HOST_ADDRS`].
pub fn to_the_host(frame: &[u8]) -> bool {
    let l3 = l3_offset(frame);
    frame
        .get(l3 + 16..l3 + 20)
        .is_some_and(|dst| HOST_ADDRS.iter().any(|host| host.octets() == dst))
}
pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

pub fn action_name(action: u32) -> &'static str {
    match action {
        XDP_ABORTED => "XDP_ABORTED",
        XDP_DROP => "XDP_DROP",
        XDP_PASS => "XDP_PASS",
        XDP_TX => "XDP_TX",
        XDP_REDIRECT => "XDP_REDIRECT",
        _ => "unknown action",
    }
}

/// Whether the program's `next_hops` map is filled: results must not depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextHops {
    /// Every reply's next hop from `bpf_fib_lookup`.
    Empty,
    /// Mirrored from the namespace's routes and neighbours, as `cheetah run` does.
    Mirrored,
}

/// What `server_traffic` counted for one server during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrafficMoved {
    pub server: u16,
    pub packets: u64,
    pub bytes: u64,
    /// Connections the kernel placed on the server (a SYN's pick).
    pub opened: u64,
    /// Load counts the kernel released for the server (a retransmitted SYN's earlier pick,
    /// a close, a count a SYN-ACK moved away).
    pub closed: u64,
    /// Load counts a SYN-ACK moved to the server.
    pub moved_in: u64,
}

/// What one packet did in the kernel.
pub struct KernelRun {
    pub action: u32,
    /// The frame after the program, without the metadata it may have put in front.
    pub frame: Vec<u8>,
    /// The `STAT_FAST_*` counters that moved, as `xdp_layout::FAST_BUNDLES` indices.
    pub fast: Vec<u32>,
    /// The other `STAT_FAST_*` counters that moved, as `xdp_layout::FAST_EVENTS` indices.
    pub events: Vec<usize>,
    /// The `STAT_UP_*` reasons that moved (`xdp_layout::UP_REASONS`).
    pub up: Vec<&'static str>,
    /// Steering passed it to the host (not the LB's: ARP, IPv6, ...).
    pub passed: bool,
    /// The steering counters that moved (`passed`, `to_socket`, `no_socket`,
    /// `no_metadata_room`): what steering did with a packet the fast path did not keep.
    pub steered: Vec<&'static str>,
    /// The servers (of the ids asked for) whose `server_traffic` moved, and by how much.
    pub traffic: Vec<TrafficMoved>,
    /// `STAT_NEXT_HOP_MISS` moved: the next hop came from `bpf_fib_lookup`, not the map.
    pub next_hop_miss: bool,
    /// `STAT_REPLY_BY_STEERING` moved: a reply `reply_senders` did not know.
    pub reply_by_steering: bool,
    /// `STAT_OPTIONS_WALKED` moved: the options' walk found the timestamp its
    /// `STAT_FAST_*` entry stands for a compare's find of (`xdp_layout::OPTIONS_WALKED`).
    pub options_walked: bool,
    /// `STAT_OPTIONS_COMPARED` moved: the compare found the timestamp of a segment whose
    /// entry stands for the walk's count (the other way round).
    pub options_compared: bool,
    /// `STAT_GENERAL_PATH` moved: the core's general path took the segment whose entry
    /// stands for a straight line's `fast_path` (`xdp_layout::GENERAL_PATH`).
    pub general_path: bool,
    /// `STAT_ECHO_BEYOND_IDLE_LIMIT` moved: the echo the kernel restored was beyond the
    /// idle limit (the core's `echoes_beyond_idle_limit`).
    pub echo_beyond_idle_limit: bool,
    /// `STAT_ANSWER_MOVED` moved, beside the SYN-ACK's own entry (kept out of `events`):
    /// it moved its retried SYN's load count (the core's `handshake_count_moved`).
    pub answer_moved: bool,
    /// How far past the core's `now` the kernel's clock may have been when the program
    /// read it: the time from setting it to the run's return (an upper bound).
    pub clock_slack_ns: u64,
}

impl KernelRun {
    pub fn fast_name(&self) -> String {
        self.fast
            .iter()
            .map(|&i| format!("{:?}", FAST_BUNDLES[i as usize].1))
            .chain(
                self.events
                    .iter()
                    .map(|&i| format!("{:?}", FAST_EVENTS[i].1)),
            )
            .chain(self.options_walked.then(|| "OptionsWalked".to_string()))
            .chain(self.options_compared.then(|| "OptionsCompared".to_string()))
            .chain(self.general_path.then(|| "GeneralPath".to_string()))
            .chain(self.answer_moved.then(|| "AnswerMoved".to_string()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Handled in the kernel: a `STAT_FAST_*` counter moved.
    pub fn handled(&self) -> bool {
        !self.fast.is_empty() || !self.events.is_empty()
    }

    /// The core's reason for the `STAT_DROP_*` counter that moved, if the kernel dropped
    /// the packet (`xdp_layout::KERNEL_DROPS`).
    pub fn dropped_for(&self) -> Option<DropReason> {
        self.events.iter().find_map(|&i| {
            KERNEL_DROPS
                .iter()
                .find(|(stat, _)| *stat == FAST_EVENTS[i].0)
                .map(|(_, reason)| *reason)
        })
    }

    /// How many `STAT_FAST_*` counters moved (one, when it was handled).
    pub fn fast_moved(&self) -> usize {
        self.fast.len() + self.events.len()
    }

    /// The `STAT_FAST_*` counter that moved (the first, if several did).
    pub fn fast_stat(&self) -> u32 {
        match (self.fast.first(), self.events.first()) {
            (Some(&i), _) => FAST_BUNDLES[i as usize].0,
            (None, Some(&i)) => FAST_EVENTS[i].0,
            (None, None) => panic!("not handled in the kernel"),
        }
    }

    /// The core counters the `STAT_FAST_*` counters that moved stand for, sorted.
    pub fn counted(&self) -> Vec<Counter> {
        let mut counted: Vec<Counter> = self
            .fast
            .iter()
            .flat_map(|&i| FAST_BUNDLES[i as usize].1.counters().iter().copied())
            .chain(
                self.events
                    .iter()
                    .flat_map(|&i| FAST_EVENTS[i].1.iter().copied()),
            )
            .chain(self.answer_moved.then_some(Counter::HandshakeCountMoved))
            .collect();
        let (compare, walk) = OPTIONS_WALKED;
        if self.options_walked {
            // Only an entry that stands for the compare's count can have been walked:
            // otherwise the kernel counted more than the core can.
            match counted.iter().position(|c| *c == compare) {
                Some(at) => counted[at] = walk,
                None => counted.push(compare),
            }
        }
        if self.options_compared {
            // The other way round: only an entry that stands for the walk's count.
            match counted.iter().position(|c| *c == walk) {
                Some(at) => counted[at] = compare,
                None => counted.push(walk),
            }
        }
        if self.general_path {
            // Only an entry that stands for the straight line's count can take it off:
            // otherwise the kernel counted one more than it stands for.
            match counted.iter().position(|c| *c == GENERAL_PATH) {
                Some(at) => {
                    counted.remove(at);
                }
                None => counted.push(GENERAL_PATH),
            }
        }
        counted.sort_by_key(|c| *c as u8);
        counted
    }

    /// Whether the packet placed a new connection (the core's `new_connections` or
    /// `fallback_connections`): `server_traffic.opened` moved by one on its server.
    pub fn opened_a_connection(&self) -> bool {
        let counted = self.counted();
        counted.contains(&Counter::NewConnections)
            || counted.contains(&Counter::FallbackConnections)
    }

    /// Whether the packet was a retransmitted SYN (the core's `syn_retransmissions`), whose
    /// earlier pick's count was released: `server_traffic.closed` moved by one.
    pub fn released_a_syn(&self) -> bool {
        self.counted().contains(&Counter::SynRetransmissions)
    }

    /// Whether the packet was a SYN-ACK that moved its retried SYN's count (the core's
    /// `handshake_count_moved`): `closed` moved by one on the server that held it,
    /// `moved_in` by one on the one that answered.
    pub fn moved_a_count(&self) -> bool {
        self.counted().contains(&Counter::HandshakeCountMoved)
    }

    /// Why it went up, or what steering did with a packet the fast path did not look at
    /// (no socket is bound here, so steering drops what the LB owns).
    pub fn up_name(&self) -> String {
        match (&self.up[..], self.passed) {
            ([], true) => "passed".into(),
            ([], false) => "steered".into(),
            (up, _) => up.join(","),
        }
    }
}

/// The loaded program and its clock, handshake and close filter words, shared with every
/// pipeline made over it.
pub struct Kernel {
    pub program: SteeringProgram,
    pub words: KernelWords,
    pub closes: CloseWords,
}

impl Kernel {
    /// The program with its fallback table sized for `fallback_capacity` flows (the
    /// config's `fallback_table_capacity`, as `cheetah run` sizes it).
    pub fn load(topology: &Topology, next_hops: NextHops, fallback_capacity: usize) -> Self {
        let program =
            SteeringProgram::load(fallback_capacity).expect("the verifier refused bpf/xdp_lb.c");
        if next_hops == NextHops::Mirrored {
            // In this thread, so from this thread's namespace.
            let entries = NextHopMirror::new()
                .and_then(|mut mirror| mirror.refresh(&program))
                .expect("mirror the namespace's next hops");
            assert!(entries > 0, "nothing to mirror in the test's namespace");
        }
        // As `cheetah run` does at start: every interface gets a slot (so steering writes
        // its metadata), and the host's own addresses are known.
        program
            .set_interface_slot(topology.servers.ifindex, 0)
            .unwrap();
        program
            .set_interface_slot(topology.clients.ifindex, 1)
            .unwrap();
        program.set_host_addrs(&HOST_ADDRS).unwrap();
        let words = program
            .kernel_words()
            .expect("mmap the clock and handshake words");
        let closes = program
            .close_words()
            .expect("mmap the close filter's words");
        Kernel {
            program,
            words,
            closes,
        }
    }

    /// The close filter's words as they are now.
    pub fn close_words(&self) -> Vec<u32> {
        self.closes
            .words()
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect()
    }

    /// Puts the close filter's words back to `words`.
    pub fn set_close_words(&self, words: &[u32]) {
        for (word, value) in self.closes.words().iter().zip(words) {
            word.store(*value, Ordering::Relaxed);
        }
    }

    /// A fresh core pipeline for `config`, as crates/core/tests/vectors.rs makes it, over
    /// the kernel's clock and handshake words (which the tables clear): `removed` servers
    /// removed, the clocks of `msb` imported at time 0, and the kernel's maps published
    /// from its tables (the fallback path's clock reading `now` at `clock_base_ns`), every
    /// CPU's policy state that of the core's worker (worker 0 of 1, its generator's seed),
    /// so that a SYN the kernel places must be the core's pick.
    pub fn pipeline(
        &self,
        topology: &Topology,
        config: &LbConfig,
        secret: &Secret,
        removed: &[u16],
        msb: &[(ServerId, u32)],
        clock_base_ns: u64,
    ) -> (ControlPlane, Worker) {
        let words = self.words;
        let mut plane =
            ControlPlane::new_with_tables(config, secret, &|layout, _| words.tables(layout))
                .expect("suite config is valid");
        if plane.share_closes(self.closes.filter()).is_err() {
            panic!("the plane's close filter was shared before the kernel's words took its place");
        }
        for id in removed {
            plane.remove_server(*id, 0).expect("removable server");
        }
        plane.shared().msb.import(msb, 0);
        let snapshot = plane.shared().snapshot.load();
        let worker_config = WorkerConfig::new(0, 1, config);
        let mut publisher = Publisher::with_policy_seeds(PolicySeeds::AsWorker {
            index: worker_config.index,
            workers: worker_config.workers,
            rng_seed: worker_config.seed,
        });
        self.program
            .set_clock_base(clock_base_ns)
            .expect("set the kernel's clock");
        self.publish_with(&mut publisher, topology, &plane);
        publisher
            .seed_policies(&self.program, &snapshot)
            .expect("seed the policies");
        let worker = Worker::new(Arc::clone(plane.shared()), worker_config);
        (plane, worker)
    }

    /// Publishes `plane`'s tables into the kernel's maps again (after a change).
    pub fn publish(&self, topology: &Topology, plane: &ControlPlane) {
        self.publish_with(&mut Publisher::new(), topology, plane);
    }

    fn publish_with(&self, publisher: &mut Publisher, topology: &Topology, plane: &ControlPlane) {
        let snapshot = plane.shared().snapshot.load();
        let (interfaces, sides) = topology.interfaces();
        let publication = Publication {
            snapshot: &snapshot,
            layout: plane.shared().layout(),
            interfaces: &interfaces,
            sides: &sides,
            fast_path: true,
            fallback_sets: plane.shared().fallback.sets(),
        };
        // This thread's namespace's tables: /proc/net is the process's first thread's.
        let routes = read(Path::new("/proc/thread-self/net/route"));
        let neighbours = read(Path::new("/proc/thread-self/net/arp"));
        publisher
            .write(&self.program, wanted(&publication, &routes, &neighbours))
            .expect("publish the tables");
    }

    /// Both sides' policy state back to where `pipeline` left it: every CPU's seeded as the
    /// core's worker 0 of 1 again, and a fresh worker over `plane`. After a SYN that only
    /// one side placed (the kernel handed it up, or a mutated one the core placed where
    /// the kernel would not), only that side's cursor or generator moved, and the next
    /// pick would differ for that reason alone.
    pub fn reset_policies(&self, config: &LbConfig, plane: &ControlPlane) -> Worker {
        let worker_config = WorkerConfig::new(0, 1, config);
        PolicySeeder::new(PolicySeeds::AsWorker {
            index: worker_config.index,
            workers: worker_config.workers,
            rng_seed: worker_config.seed,
        })
        .seed(&self.program, &plane.shared().snapshot.load())
        .expect("seed the policies");
        Worker::new(Arc::clone(plane.shared()), worker_config)
    }

    /// One packet through the program as received on `ingress`, the kernel's clock set to
    /// the core's `now`; `server_traffic` is read for `traffic_ids` only (each id is a
    /// lookup).
    // `ProgramInput` is non-exhaustive: no struct literal outside libbpf-rs.
    #[allow(clippy::field_reassign_with_default)]
    pub fn run(
        &self,
        ingress: Port,
        packet: &[u8],
        traffic_ids: &[ServerId],
        now: u64,
    ) -> KernelRun {
        let stats_before = self.program.stats();
        let traffic_before = self.program.server_traffic(traffic_ids).unwrap();
        let mut context = [0u8; 24];
        // struct xdp_md: data 0, data_end, data_meta 0, ingress_ifindex, rx_queue_index 0,
        // egress_ifindex 0.
        context[4..8].copy_from_slice(&(packet.len() as u32).to_ne_bytes());
        context[12..16].copy_from_slice(&ingress.ifindex.to_ne_bytes());
        let mut data_out = vec![0u8; packet.len() + 256];
        let mut input = ProgramInput::default();
        input.data_in = Some(packet);
        input.data_out = Some(&mut data_out);
        input.context_in = Some(&mut context);
        input.repeat = 1;
        // Last, so that the program reads the core's `now` a few microseconds on, not the
        // milliseconds reading every server's traffic takes (the clock table anchors in
        // ms).
        let clock_set_at = monotonic_ns();
        self.program
            .set_clock_base(clock_set_at.wrapping_sub(now))
            .expect("set the kernel's clock");
        let output = self
            .program
            .object()
            .progs_mut()
            .find(|p| p.name() == "cheetah_lb")
            .expect("program cheetah_lb")
            .test_run(input)
            .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN on {} bytes: {e}", packet.len()));
        let clock_slack_ns = monotonic_ns().saturating_sub(clock_set_at);
        let action = output.return_value;
        let data = output.data.expect("data out").to_vec();
        let stats_after = self.program.stats();
        let fast = (0..FAST_BUNDLES.len() as u32)
            .filter(|&i| stats_after.fast[i as usize] != stats_before.fast[i as usize])
            .collect();
        let moved = |i: usize| stats_after.events[i] != stats_before.events[i];
        let answer_at = FAST_EVENTS
            .iter()
            .position(|(stat, _)| *stat == STAT_ANSWER_MOVED)
            .expect("STAT_ANSWER_MOVED is an event");
        let events = (0..FAST_EVENTS.len())
            .filter(|&i| i != answer_at && moved(i))
            .collect();
        let up = UP_REASONS
            .iter()
            .enumerate()
            .filter(|(i, _)| stats_after.up[*i] != stats_before.up[*i])
            .map(|(_, (_, reason))| *reason)
            .collect();
        let steered = [
            (
                "passed",
                stats_before.passed_to_host,
                stats_after.passed_to_host,
            ),
            ("to_socket", stats_before.to_socket, stats_after.to_socket),
            ("no_socket", stats_before.no_socket, stats_after.no_socket),
            (
                "no_metadata_room",
                stats_before.no_metadata_room,
                stats_after.no_metadata_room,
            ),
        ]
        .into_iter()
        .filter(|(_, before, after)| before != after)
        .map(|(name, _, _)| name)
        .collect::<Vec<_>>();
        // A frame a socket took starts with the metadata steering wrote (steer.h
        // `write_meta`); one no socket took was dropped as it came.
        let frame = if steered.contains(&"to_socket") {
            data[META_LEN.min(data.len())..].to_vec()
        } else {
            data
        };
        let traffic_after = self.program.server_traffic(traffic_ids).unwrap();
        let traffic = traffic_ids
            .iter()
            .zip(traffic_before.iter().zip(&traffic_after))
            .filter(|(_, (before, after))| before != after)
            .map(|(id, (before, after))| TrafficMoved {
                server: id.0,
                packets: after.packets.wrapping_sub(before.packets),
                bytes: after.bytes.wrapping_sub(before.bytes),
                opened: after.opened.wrapping_sub(before.opened),
                closed: after.closed.wrapping_sub(before.closed),
                moved_in: after.moved_in.wrapping_sub(before.moved_in),
            })
            .collect();
        KernelRun {
            action,
            frame,
            fast,
            events,
            up,
            passed: stats_after.passed_to_host != stats_before.passed_to_host,
            steered,
            traffic,
            next_hop_miss: stats_after.next_hop_miss != stats_before.next_hop_miss,
            reply_by_steering: stats_after.reply_by_steering != stats_before.reply_by_steering,
            options_walked: stats_after.options_walked != stats_before.options_walked,
            options_compared: stats_after.options_compared != stats_before.options_compared,
            general_path: stats_after.general_path != stats_before.general_path,
            echo_beyond_idle_limit: stats_after.echo_beyond_idle_limit
                != stats_before.echo_beyond_idle_limit,
            answer_moved: moved(answer_at),
            clock_slack_ns,
        }
    }
}
