//! A server's clock learnt in the kernel (bpf/lib/clock_learn.h) against the core's
//! `MsbTable::learn`, with the real program (loaded, not attached; needs root) in a
//! network namespace of the test thread's own.
//!
//! Each reply goes through the kernel, then (its shared words put back as they were)
//! through the core, over one clock table (the program's mmapped `msb_seen`, `msb_clock`
//! and `msb_restores`), as xdp_parity.rs runs a vector. A reply whose server's MSB moved
//! forward, first or by more than a step, must be handled in the kernel with the core's
//! bytes and counters and leave every shared word as the core leaves it. Of the replies
//! whose clock the core would not learn (backwards, ahead of real time, ticking too fast),
//! the first a CPU sees in a second must go up as `clock` unchanged, having written
//! nothing, for the core to count and warn of; the kernel must take the rest as the core
//! would (bytes, counters, and a clock ticking too fast learnt as the core learns it).

use cheetah_core::config::{Forwarding, LbConfig, Mode};
use cheetah_core::hash::Secret;
use cheetah_core::lb::{Counter, Ingress, Worker};
use cheetah_core::policy::PolicyKind;
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{self, options, TcpFrame};
use cheetah_core::types::{ServerId, NANOS_PER_MS, NANOS_PER_SEC};
use cheetah_core::wire::tcp::flags::{ACK, FIN, SYN};
use cheetah_daemon::clock::monotonic_ns;
use cheetah_daemon::dataplane::xdp_layout::*;

#[path = "shared/root.rs"]
mod root;
use root::is_root;
#[path = "shared/ip_command.rs"]
mod ip_command;
#[path = "shared/lb_namespace.rs"]
mod lb_namespace;
#[path = "shared/lb_topology.rs"]
mod lb_topology;
use lb_topology::{enter_new_namespace, Topology};
#[path = "shared/shared_words.rs"]
mod shared_words;
use shared_words::SharedWords;
#[path = "shared/vectors.rs"]
mod vectors;
use vectors::hex;
#[path = "shared/xdp_kernel.rs"]
mod xdp_kernel;
use xdp_kernel::{Kernel, KernelRun, NextHops};
#[path = "shared/egress.rs"]
mod egress;
use egress::after_egress;
#[path = "shared/this_cpu.rs"]
mod this_cpu;
use this_cpu::pin_to_this_cpu;

/// One MSB period of a millisecond clock, in LB time.
const PERIOD: u64 = 65_536 * NANOS_PER_MS;
const START: u64 = 10 * NANOS_PER_SEC;

struct Lb {
    topology: Topology,
    config: LbConfig,
    kernel: Kernel,
    plane: ControlPlane,
    worker: Worker,
    words: SharedWords,
    ids: Vec<ServerId>,
}

/// What the core did with a reply after the kernel's run.
struct Sent {
    kernel: KernelRun,
    /// The counters the core moved, sorted.
    core_counted: Vec<Counter>,
}

impl Lb {
    fn new() -> Self {
        let topology = enter_new_namespace();
        let config = testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 3);
        let kernel = Kernel::load(&topology, NextHops::Empty, config.fallback_table_capacity);
        let (plane, worker) = kernel.pipeline(
            &topology,
            &config,
            &Secret([7; 16]),
            &[],
            &[],
            monotonic_ns() - START,
        );
        let words = SharedWords::of(&kernel.program);
        let ids = (1..=3).map(ServerId).collect();
        Lb {
            topology,
            config,
            kernel,
            plane,
            worker,
            words,
            ids,
        }
    }

    /// `frame` through the kernel, then the core from the same words; the kernel's bytes,
    /// counts and words must be the core's when it handled the frame, the frame unchanged
    /// and the words untouched when it went up.
    fn send(&mut self, what: &str, frame: &[u8], now: u64) -> Sent {
        self.words.settle();
        let kernel = self
            .kernel
            .run(self.topology.servers, frame, &self.ids, now);
        let kernel_wrote = self.words.changed();
        let after_kernel = self.words.copy();
        self.words.restore_settled();
        let counters = std::sync::Arc::clone(self.worker.counters());
        let read = || -> Vec<u64> { Counter::ALL.iter().map(|c| counters.get(*c)).collect() };
        let before = read();
        let mut core_out = frame.to_vec();
        let verdict = self.worker.process(&mut core_out, now, Ingress::ServerSide);
        let mut core_counted: Vec<Counter> = Counter::ALL
            .iter()
            .zip(read().iter().zip(before))
            .filter(|(c, _)| ![Counter::LoadMerges, Counter::SnapshotReloads].contains(c))
            .flat_map(|(c, (after, before))| std::iter::repeat_n(*c, (after - before) as usize))
            .collect();
        core_counted.sort_by_key(|c| *c as u8);
        if kernel.handled() {
            let (action, expected) = after_egress(
                &self.topology,
                &self.config,
                self.topology.servers,
                verdict,
                &core_out,
            )
            .unwrap_or_else(|| panic!("{what}: handled in the kernel, the core says {verdict:?}"));
            assert_eq!(kernel.action, action, "{what}: the core's action");
            assert_eq!(
                hex(&kernel.frame),
                hex(&expected),
                "{what}: the core's bytes"
            );
            assert_eq!(
                kernel.counted(),
                core_counted,
                "{what}: the core's counters"
            );
            assert_eq!(
                self.words.differences(&after_kernel),
                Vec::<String>::new(),
                "{what}: the kernel left the shared words otherwise than the core"
            );
        } else {
            assert_eq!(kernel.frame, frame, "{what}: went up changed");
            assert_eq!(
                kernel_wrote,
                Vec::<String>::new(),
                "{what}: went up ({}) having written shared words",
                kernel.up_name()
            );
        }
        Sent {
            kernel,
            core_counted,
        }
    }

    /// `send`, which the kernel must handle, counting `stat`.
    fn handled(&mut self, what: &str, frame: &[u8], now: u64, stat: u32) {
        let sent = self.send(what, frame, now);
        assert!(
            sent.kernel.handled(),
            "{what}: went up ({})",
            sent.kernel.up_name()
        );
        assert_eq!(
            sent.kernel.fast_stat(),
            stat,
            "{what}: {}",
            sent.kernel.fast_name()
        );
    }

    /// `send`, which must go up as `clock` and be counted by the core as `counter`.
    fn up(&mut self, what: &str, frame: &[u8], now: u64, counter: Counter) {
        let sent = self.send(what, frame, now);
        assert_eq!(
            (sent.kernel.fast_moved(), &sent.kernel.up[..]),
            (0, &["clock"][..]),
            "{what}: {}",
            sent.kernel.fast_name()
        );
        assert!(
            sent.core_counted.contains(&counter),
            "{what}: the core counted {:?}",
            sent.core_counted
        );
    }

    fn estimate(&self, server: u16) -> Option<u16> {
        self.plane.shared().msb.get(ServerId(server))
    }
}

/// Server `server`'s segment with `flags` to client port `port`, its TSval `tsval`.
fn reply(server: u16, port: u16, flags: u8, tsval: u32) -> Vec<u8> {
    let options = if flags & SYN != 0 {
        options::mss_nop_ws_sackok_ts(tsval, 77)
    } else {
        options::nop_nop_ts(tsval, 77)
    };
    TcpFrame::from_server_l2(server, testkit::client_ip(9), port, flags, options).build()
}

fn skip() -> bool {
    if !is_root() {
        eprintln!("\n*** SKIPPED: needs root (loads a BPF program, makes a namespace) ***\n");
        return true;
    }
    false
}

#[test]
fn a_clock_that_moves_forward_is_learnt_in_the_kernel_as_the_core_learns_it() {
    if skip() {
        return;
    }
    let mut lb = Lb::new();
    let mut now = START;

    // Server 1's first reply, a SYN-ACK: its clock is learnt, every restore entry written.
    lb.handled(
        "first SYN-ACK",
        &reply(1, 40_001, SYN | ACK, 0x1234_0100),
        now,
        STAT_FAST_SERVER_COOKIE_LEARNED,
    );
    assert_eq!(lb.estimate(1), Some(0x1234));
    now += 5 * NANOS_PER_MS;
    lb.handled(
        "the same MSB",
        &reply(1, 40_001, ACK, 0x1234_0105),
        now,
        STAT_FAST_SERVER_COOKIE,
    );

    // Two periods later by the LB's clock and the server's: an advance by two.
    now += 2 * PERIOD;
    lb.handled(
        "MSB + 2",
        &reply(1, 40_001, ACK, 0x1236_0105),
        now,
        STAT_FAST_SERVER_COOKIE_ADVANCED,
    );
    assert_eq!(lb.estimate(1), Some(0x1236));

    // A close that is the server's first reply, then its retransmission a period on.
    lb.handled(
        "first reply a FIN",
        &reply(2, 40_002, FIN | ACK, 0x0100_0000),
        now,
        STAT_FAST_SERVER_CLOSE_LEARNED,
    );
    now += PERIOD;
    lb.handled(
        "its FIN again, MSB + 1",
        &reply(2, 40_002, FIN | ACK, 0x0101_0000),
        now,
        STAT_FAST_SERVER_DUPLICATE_CLOSE_ADVANCED,
    );
    lb.handled(
        "another connection's FIN, MSB + 1 again",
        &reply(2, 40_003, FIN | ACK, 0x0101_0010),
        now,
        STAT_FAST_SERVER_CLOSE,
    );

    // A probe anchors server 1: the bound is the probe's now, which a learnt reply does
    // not move (the core writes no limit for a probed clock; nor must the kernel).
    now += PERIOD;
    lb.plane
        .shared()
        .msb
        .learn_probe(ServerId(1), 0x1237_0105, now);
    now += PERIOD;
    lb.handled(
        "MSB + 1 after a probe",
        &reply(1, 40_001, ACK, 0x1238_0105),
        now,
        STAT_FAST_SERVER_COOKIE_ADVANCED,
    );
    assert_eq!(lb.estimate(1), Some(0x1238));
}

#[test]
fn a_clock_the_core_would_not_learn_goes_up_as_a_sample_and_stays_in_the_kernel_after() {
    if skip() {
        return;
    }
    // The last clock sample's time is per CPU.
    pin_to_this_cpu();
    let mut lb = Lb::new();
    let mut now = START;
    lb.handled(
        "first reply",
        &reply(1, 40_001, ACK, 0x1234_0000),
        now,
        STAT_FAST_SERVER_COOKIE_LEARNED,
    );

    // Back by two periods: two clocks (tcp_timestamps=1), or a reboot. The CPU's first
    // anomaly goes up, for the workers to count and warn of.
    now += NANOS_PER_SEC;
    lb.up(
        "MSB - 2",
        &reply(1, 40_001, ACK, 0x1232_0000),
        now,
        Counter::ServerTsClockUnstable,
    );
    assert_eq!(lb.estimate(1), Some(0x1234), "not learnt");

    // Within the second, the kernel takes the rest, counting them as the core does.
    lb.handled(
        "MSB - 2 again",
        &reply(1, 40_001, ACK, 0x1232_0010),
        now,
        STAT_FAST_SERVER_COOKIE_UNSTABLE,
    );
    // A period ahead one second after the anchor: further than real time allows.
    lb.handled(
        "MSB + 1 a second later",
        &reply(1, 40_001, ACK, 0x1235_0000),
        now,
        STAT_FAST_SERVER_COOKIE_AHEAD,
    );
    lb.handled(
        "a FIN, MSB + 1",
        &reply(1, 40_002, FIN | ACK, 0x1235_0010),
        now,
        STAT_FAST_SERVER_CLOSE_AHEAD,
    );
    lb.handled(
        "the FIN again, MSB - 2",
        &reply(1, 40_002, FIN | ACK, 0x1232_0020),
        now,
        STAT_FAST_SERVER_DUPLICATE_CLOSE_UNSTABLE,
    );
    assert_eq!(lb.estimate(1), Some(0x1234), "not learnt");

    // An imported clock bounds no reply, but a clock ticking faster than 65536 a minute
    // since its anchor is one the LB cannot correct: the core learns it and warns. In the
    // kernel too, with the core's writes, while a sample went up less than a second ago.
    lb.plane
        .shared()
        .msb
        .import(&[(ServerId(2), 0x3000_0000)], now);
    lb.handled(
        "two periods at once",
        &reply(2, 40_003, ACK, 0x3002_0000),
        now,
        STAT_FAST_SERVER_COOKIE_UNSTABLE,
    );
    assert_eq!(lb.estimate(2), Some(0x3002), "learnt as the core learns it");

    // A second on, the next anomaly is a sample again.
    lb.plane
        .shared()
        .msb
        .import(&[(ServerId(3), 0x2000_0000)], now);
    now += 10 * NANOS_PER_SEC;
    lb.up(
        "two periods in 10 s",
        &reply(3, 40_005, ACK, 0x2002_0000),
        now,
        Counter::ServerTsClockUnstable,
    );
    assert_eq!(lb.estimate(3), Some(0x2002), "the core learnt it");
    // Its next reply changes nothing: the kernel's again.
    lb.handled(
        "the next reply",
        &reply(3, 40_005, ACK, 0x2002_0010),
        now,
        STAT_FAST_SERVER_COOKIE,
    );
}
