//! The in-kernel fast path (bpf/xdp_lb.c) held to the core, byte for byte, on every vector
//! of `testdata/vectors` (docs/test-vectors.md). Needs root: it loads the XDP program and
//! makes a network namespace of its own.
//!
//! For each suite: the program is loaded, its maps are published from the core's tables by
//! the daemon's publisher (`dataplane::xdp_tables`), and the core's clock table is built
//! over the program's mmapped `msb_seen`/`msb_restores` arrays, so the kernel and the core
//! see one clock state, as in `cheetah run`. Each vector then runs as the core's own test
//! runs it (crates/core/tests/vectors.rs: a fresh pipeline, `msb_state` imported, prelude
//! first), every packet going first through the kernel (`BPF_PROG_TEST_RUN`) and then
//! through the core, as a packet meets them in `cheetah run`. Per packet:
//!
//! * the kernel handled it (a `STAT_FAST_*` counter moved): its verdict and bytes must be
//!   the core's after the AF_XDP worker's egress step. Toward a server: `XDP_TX` (the
//!   server's interface is the one the packet came in on), destination MAC the server's,
//!   source MAC the interface's. Toward the client: `XDP_REDIRECT`, MACs of the FIB's
//!   answer (the client gateway's and the client interface's). `BPF_PROG_TEST_RUN` does not
//!   perform the redirect, so its target ifindex is not observable here; the source MAC,
//!   which the program copies from the same FIB answer, names the interface. The server
//!   the kernel counted traffic for (`server_traffic`) must be the core's;
//! * it went up (anything else: a `STAT_UP_*` reason, or plain steering): its bytes must be
//!   unchanged (the metadata the program puts in front is not part of the frame).
//!
//! The core's close filter is built over the program's mmapped `closes` words, as in
//! `cheetah run`. A server's FIN or stamped RST the kernel handled must have made the
//! core's decision (a first close or a duplicate: `server_closes` or `duplicate_closes`
//! among the core's counters, which must be exactly those the kernel's `STAT_FAST_*`
//! stands for) and left the filter's words as the core leaves them: the words are put
//! back as they were before the kernel's run before the core sees the packet, so both
//! decide from the same state. A first close must also have moved the server's
//! `server_traffic.closed`. A packet that went up must have left the words alone.
//!
//! A reply whose MSB moved is learnt in the kernel (bpf/lib/clock_learn.h), in the clock
//! words it shares with the core (`msb_seen`, `msb_clock`, `msb_restores`), which must then
//! be the words the core's `learn` leaves. One that goes up as `clock` (an anomaly the
//! core counts and warns of, e.g. a clock ticking too fast, whose words the core then
//! writes) is sent once more after the core handled it, as the next segment of that
//! connection would be: the kernel must then handle it.
//!
//! Every suite runs twice: with the program's `next_hops` map empty (every reply's next hop
//! from `bpf_fib_lookup`) and mirrored from the namespace's routes and neighbours by the
//! daemon's `NextHopMirror`; the bytes must be the core's either way, and each reply the
//! kernel handles must have taken its next hop from where the run says.
//!
//! A client SYN the kernel places by the VIP's policy is held to the core's pick: each CPU's
//! policy state is seeded as the core's worker 0 of 1 starts (`PolicySeeds::AsWorker`, the
//! worker's generator seed), the handshake table is the core's (its words are the program's
//! `handshakes` array) and the kernel's clock is set to the core's `now` before each packet,
//! so the server it picked must be the core's (its `server_traffic` moved, `opened` by one,
//! and the bytes are the core's for that server).
//!
//! The test cannot pass by handing everything up: in each cheetah, hash and maglev suite
//! the established client vectors, the SYNs (with and without timestamps), the segments
//! without timestamps, those whose options the core drops (the kernel drops them: `XDP_DROP`,
//! counted under the core's reason) and the replies listed in `MUST_BE_HANDLED_IN_KERNEL` must have been
//! handled by the kernel the first time they were sent (the replies among them are each
//! their server's first: the kernel learns its clock).
//!
//! Every reply the core forwards is then sent again on the clients' interface, where it can
//! only be forged: the core drops it as `reply_from_client_side`, and for the required
//! replies the kernel must too.
//!
//! The namespace is the test thread's own (`unshare`), so it and its interfaces go away
//! with the thread whatever happens; the publisher is given the routes and neighbours of
//! `/proc/thread-self/net`, since `/proc/net` is the process's first thread's.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cheetah_core::config::{LbConfig, Mode};
use std::sync::Arc;

use cheetah_core::hash::FlowKey;
use cheetah_core::lb::{Counter, Ingress, Worker, WorkerConfig};
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{options, TcpFrame};
use cheetah_core::types::ServerId;
use cheetah_core::verdict::{DropReason, Verdict};
use cheetah_core::wire::tcp::flags;
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
use lb_topology::{enter_new_namespace, Port, Topology};
#[path = "shared/shared_words.rs"]
mod shared_words;
use shared_words::SharedWords;
#[path = "shared/vectors.rs"]
mod vectors;
use vectors::{hex, load_suite, suite_dirs, unhex, verdict_name, Suite};
#[path = "shared/xdp_kernel.rs"]
mod xdp_kernel;
use xdp_kernel::{
    action_name, ip_total_len, Kernel, KernelRun, NextHops, ETH_HLEN, XDP_DROP, XDP_PASS,
};
#[path = "shared/egress.rs"]
mod egress;
use egress::after_egress;

/// Per mode, the vectors the kernel must handle itself wherever a suite has them, on their
/// first sending (a reply whose server's clock was unknown included: the kernel learns it).
const MUST_BE_HANDLED_IN_KERNEL: &[(Mode, &[&[&str]])] = &[
    (
        Mode::Cheetah,
        &[
            EVERY_MODE_HANDLED_IN_KERNEL,
            &[
                "established-cookie-current-period",
                "established-cookie-previous-period",
                "established-bad-tcp-checksum",
                "client-fin",
                "echo-next-period",
                "echo-1-periods-old",
                "echo-wrap-ahead",
                "echo-wrap-behind",
                "echo-after-reply-advanced",
                "echo-id-9000",
                "server-data",
                "server-data-msb-ffff",
                "server-data-id-9000",
                "syn-linux",
                "syn-apple",
                "syn-mss-nop-ws-sackok-ts",
                "syn-mss-nop-nop-ts",
                "syn-skips-removed-server",
                "server-syn-ack",
                "server-syn-ack-apple-layout",
                "server-syn-ack-mss-nop-ws-sackok-ts",
                "server-syn-ack-mss-nop-nop-ts",
                "server-fin",
                "server-rst-timestamped",
                "server-fin-retransmitted",
                "server-rst-after-fin",
                "icmp-frag-needed-cookie",
                "no-timestamps-ack-after-syn",
                "syn-no-timestamps",
                "client-rst-without-timestamps",
                // Without ACK, its timestamp echoes nothing: routed as one without.
                "client-rst-nop-nop-ts",
                // A client's SYN-ACK: the cookie stage, as the core's general path.
                "client-syn-ack-cookie",
                "client-syn-ack-forged-cookie",
                // Timestamps where no wide compare looks: found by the options' walk.
                "established-sack-before-ts",
                "established-ts-odd-offset",
                "established-ts-after-wscale",
                "established-eol-before-ts",
                "server-data-sack-before-ts",
                "server-data-ts-odd-offset",
                "server-fin-ts-odd-offset",
                "syn-ts-first",
                "syn-ts-after-wscale",
                "server-syn-ack-odd-offset",
                "server-syn-ack-ts-after-sackok",
                "established-short-options",
                // A server's segment without a timestamp: no cookie, an RST no close.
                "server-rst",
                "server-rst-ack-sack-without-timestamp",
                "server-ack-sack-without-timestamp",
                "server-data-without-options",
                // A connection without timestamps: its close counted, its SYN-ACK teaching the
                // fallback table, whatever the header's length.
                "server-fin-without-timestamp",
                "server-fin-without-timestamp-retransmitted",
                "server-fin-sack-without-timestamp",
                "server-syn-ack-mss-only",
                "server-syn-ack-mss-nop-ws",
                // A server's SYN without ACK answers no SYN: a cookie with a timestamp,
                // nothing taught without one.
                "server-syn-without-ack",
                "server-syn-without-ack-mss-only",
                // Options the core drops for a reason of the walk's: dropped in the kernel,
                // counted under that reason.
                "tcp-option-truncated",
                "tcp-option-bad-length",
                "tcp-option-overrun",
                "bad-timestamp-option-length",
                "established-option-truncated",
                "established-option-bad-length",
                "established-option-overrun",
                "established-bad-timestamp-length",
                "syn-option-overrun",
                "syn-bad-timestamp-length",
                "server-data-bad-timestamp-length",
                "server-data-option-overrun",
                "server-short-header-option-overrun",
                // A quoted timestamp where no wide compare looks: found by the options' walk.
                "icmp-frag-needed-cookie-sack-before-ts",
                "icmp-frag-needed-cookie-ts-odd-offset",
                // l2 segments from a VIP address that no forwarding server sent: dropped
                // in the kernel under the core's reason.
                "server-removed",
                "server-removed-rst",
                // A cookie that routes nowhere: dropped in the kernel under the core's reason.
                "forged-cookie",
                "msb-unknown",
                "cookie-server-removed",
                "icmp-frag-needed-forged-cookie",
                "icmp-frag-needed-cookie-server-removed",
                // Echoes beyond the idle limit (k = 4, 6), restored and counted in the kernel;
                // a quote of an unknown clock routed unrestored.
                "echo-9-periods-old",
                "echo-14-periods-old",
                "echo-33-periods-old",
                "echo-62-periods-old",
                "icmp-frag-needed-cookie-beyond-idle-limit",
                "icmp-frag-needed-cookie-msb-unknown",
                // A quote without a cookie of a connection the fallback table knows: routed
                // by the table in the kernel (icmp_path.h).
                "icmp-frag-needed-no-timestamps-known-flow",
                "icmp-frag-needed-8-bytes-known-flow",
                // A trunk port's frames: decided untagged (vlan.h), tags put back.
                "vlan-tagged-syn",
                "qinq-tagged-syn",
                "vlan-tagged-established",
                "qinq-tagged-established",
                "vlan-tagged-server-data",
                "qinq-tagged-server-syn-ack",
                // IP options: decided without them (ip_options.h), options put back.
                "syn-with-ip-options",
                "established-with-ip-options",
                "vlan-tagged-established-with-ip-options",
                "server-data-with-ip-options",
                "server-fin-with-ip-options",
                "icmp-frag-needed-cookie-with-ip-options",
                // A quote whose own IP header has options: its TCP header found past them.
                "icmp-frag-needed-cookie-quoting-ip-options",
                // l2: a removed server's garbled segments from a VIP address, dropped under
                // the core's first reason (reply_sender.h garbled_reply_l2).
                "server-removed-garbled-tcp",
                "server-removed-fragment",
                // An empty pool: every new connection dropped (KERNEL_POLICY_EMPTY), the
                // draining servers' connections carried on.
                "empty-pool-syn",
                "empty-pool-syn-walked",
                "empty-pool-syn-without-timestamp",
                "empty-pool-syn-without-options",
                "empty-pool-fallback-miss",
                "empty-pool-reply-of-draining-server",
                "empty-pool-cookie-of-draining-server",
                "empty-pool-icmp-without-cookie",
                "empty-pool-icmp-cookie-of-draining-server",
            ],
        ],
    ),
    (
        Mode::Hash,
        &[EVERY_MODE_HANDLED_IN_KERNEL, BASELINE_HANDLED_IN_KERNEL],
    ),
    (
        Mode::Maglev,
        &[EVERY_MODE_HANDLED_IN_KERNEL, BASELINE_HANDLED_IN_KERNEL],
    ),
];

/// What every mode handles in the kernel alike, wherever a suite has it.
const EVERY_MODE_HANDLED_IN_KERNEL: &[&str] = &[
    // A fragment to a VIP address, what no VIP takes at one, and an l2 segment from a VIP
    // address of a MAC no server has: dropped under the core's reason.
    "unsupported-fragment",
    "unsupported-udp",
    "unsupported-protocol",
    "vip-port-unknown",
    "vip-port-unknown-no-options",
    "unknown-server-source",
    // Garbled IP and TCP headers.
    "bad-ip-version",
    "bad-ipv4-header-length",
    "bad-ipv4-total-length",
    "truncated-tcp",
    "bad-tcp-data-offset",
    // l2: garbled segments from a VIP address, dropped under the core's first reason
    // (reply_sender.h garbled_reply_l2).
    "server-data-bad-tcp-data-offset",
    "server-truncated-tcp",
    "forged-server-garbled-tcp",
    "server-fragment",
    // ICMP at a VIP address that the core's ICMP path refuses before any cookie:
    // a ping, a short message or quote, a quote of no VIP's TCP segment, and a
    // garbled IP header.
    "icmp-echo-request",
    "icmp-truncated",
    "icmp-quote-truncated",
    "icmp-quoting-udp",
    "icmp-quoting-another-source",
    "icmp-quoting-unknown-port",
    "icmp-bad-total-length",
    // l2: what a VIP address sends that is no TCP segment (reply_sender.h
    // not_tcp_from_vip_l2).
    "server-icmp-port-unreachable",
    "forged-not-tcp-from-vip",
    "server-not-tcp-fragment",
];

/// The baselines (`pool[h % n]`, or the VIP's Maglev table in the kernel) place every
/// segment alike.
const BASELINE_HANDLED_IN_KERNEL: &[&str] = &[
    // An empty pool: the pick finds nobody, dropped on either layout.
    "empty-pool-pick",
    "empty-pool-pick-general",
    "empty-pool-icmp",
    "syn-linux",
    "established-ack",
    "established-bad-tcp-checksum",
    "server-syn-ack",
    "server-rst",
    "server-data-without-options",
    "icmp-frag-needed",
    "icmp-frag-needed-port-40001",
    "icmp-frag-needed-port-40002",
    "icmp-frag-needed-port-40003",
    "icmp-frag-needed-whole-quote",
    // A quote whose own IP header has options: its TCP header found past them.
    "icmp-frag-needed-quoting-ip-options",
    // A TCP header too short for the straight line: the general path's pick.
    "options-not-parsed",
    // A trunk port's frames: decided untagged (vlan.h), tags put back.
    "vlan-tagged-syn",
    "vlan-tagged-established-ack",
    "qinq-tagged-server-syn-ack",
    // IP options: decided without them (ip_options.h), options put back.
    "syn-with-ip-options",
    "established-ack-with-ip-options",
    "server-fin-with-ip-options",
    "icmp-frag-needed-with-ip-options",
];

// --- One suite ----------------------------------------------------------------------------

#[derive(Default)]
struct SuiteReport {
    /// Packets the kernel handled, by vector name (a prelude is `name/prelude N`, a second
    /// sending `name (again)`).
    handled: Vec<String>,
    /// Packets that went up, with the reason counter that moved.
    up: Vec<String>,
    /// Frames `BPF_PROG_TEST_RUN` refuses (shorter than an Ethernet header, which no
    /// interface delivers either): the core alone sees them.
    not_runnable: Vec<String>,
    failures: Vec<String>,
}

/// Checks one packet's kernel run against the core's, and files it as handled or up.
#[allow(clippy::too_many_arguments)]
fn judge(
    report: &mut SuiteReport,
    next_hops: NextHops,
    topology: &Topology,
    ingress: Port,
    config: &LbConfig,
    what: &str,
    packet_in: &[u8],
    kernel: &KernelRun,
    words: &WordsRun,
    core: &CoreRun,
) {
    let (verdict, core_out) = (core.verdict, &core.frame[..]);
    let mut fail = |message: String| report.failures.push(format!("{what}: {message}"));
    if kernel.fast_moved() + kernel.up.len() > 1 {
        fail(format!(
            "more than one fast-path counter moved: {} {}",
            kernel.fast_name(),
            kernel.up.join(",")
        ));
        return;
    }
    // Counted beside a forwarded packet's entry only, and exactly when the core counts it.
    let forwarded = kernel.handled() && kernel.dropped_for().is_none();
    if kernel.echo_beyond_idle_limit != (forwarded && core.echo_beyond_idle_limit) {
        fail(format!(
            "the kernel {} an echo beyond the idle limit, the core {}",
            if kernel.echo_beyond_idle_limit {
                "counted"
            } else {
                "did not count"
            },
            if core.echo_beyond_idle_limit {
                "did"
            } else {
                "did not"
            }
        ));
    }
    if !kernel.handled() {
        if !words.kernel_wrote.is_empty() {
            fail(format!(
                "went up ({}) but wrote shared words: {:?}",
                kernel.up_name(),
                words.kernel_wrote
            ));
        }
        if kernel.frame != packet_in {
            fail(format!(
                "went up ({}, {}) with its bytes changed:\n   in  {}\n   out {}",
                kernel.up_name(),
                action_name(kernel.action),
                hex(packet_in),
                hex(&kernel.frame)
            ));
        } else if !matches!(kernel.action, XDP_DROP | XDP_PASS) {
            fail(format!(
                "went up ({}) but returned {} (no socket is bound: XDP_DROP or XDP_PASS)",
                kernel.up_name(),
                action_name(kernel.action)
            ));
        } else if kernel.action == XDP_PASS
            && matches!(
                verdict,
                Verdict::ToServer(_) | Verdict::ToClient | Verdict::ToAllServers { .. }
            )
        {
            // XDP_PASS gives the packet to the host's stack, not to a worker: what the
            // core forwards must reach a worker (steered: XDP_DROP here, no socket bound).
            fail(format!(
                "passed to the host, but the core says {}",
                verdict_name(verdict)
            ));
        } else if kernel.action == XDP_PASS && kernel.reply_by_steering && verdict != Verdict::Pass
        {
            // A NAT backend's segment the kernel judged not a reply: passed only where
            // the core passes it.
            fail(format!(
                "passed a backend's segment to the host, but the core says {}",
                verdict_name(verdict)
            ));
        }
        report.up.push(format!("{what} ({})", kernel.up_name()));
        return;
    }
    // Dropped in the kernel: where, and counted as, the core drops it, the frame as it came.
    if let Some(reason) = kernel.dropped_for() {
        if verdict != Verdict::Drop(reason) || kernel.action != XDP_DROP {
            fail(format!(
                "the kernel {} for {}, the core says {}",
                action_name(kernel.action),
                reason.name(),
                verdict_name(verdict)
            ));
        }
        if kernel.frame != packet_in {
            fail("dropped with its bytes changed".into());
        }
        if kernel.counted() != core.counted {
            fail(format!(
                "the kernel counted {:?}, the core {:?}",
                kernel.counted(),
                core.counted
            ));
        }
        if !kernel.traffic.is_empty() || !words.kernel_wrote.is_empty() {
            fail(format!(
                "dropped, but server_traffic moved ({:?}) or shared words changed ({:?})",
                kernel.traffic, words.kernel_wrote
            ));
        }
        report.handled.push(what.to_string());
        return;
    }
    let Some((action, expected)) = after_egress(topology, config, ingress, verdict, core_out)
    else {
        fail(format!(
            "handled by the kernel ({}, {}), but the core says {}",
            kernel.fast_name(),
            action_name(kernel.action),
            verdict_name(verdict)
        ));
        return;
    };
    let stat = kernel.fast_stat();
    let syn = kernel.opened_a_connection();
    // A reply's entries (cookie, plain, closes, each with a clock learnt or not, and a
    // SYN-ACK that taught the fallback table) all stand for the core's `to_client`.
    let toward_client = kernel.counted().contains(&Counter::ToClient);
    let icmp = ICMP_FORWARDS.contains(&stat);
    let direction_ok = match verdict {
        Verdict::ToServer(_) => {
            [
                STAT_FAST_CLIENT_COOKIE,
                STAT_FAST_CLIENT_COOKIE_WALKED,
                STAT_FAST_CLIENT_PICK,
                STAT_FAST_CLIENT_PICK_GENERAL,
                STAT_FAST_CLIENT_FALLBACK,
                STAT_FAST_FALLBACK_MISS,
            ]
            .contains(&stat)
                || syn
                || icmp
        }
        _ => toward_client,
    };
    if !direction_ok {
        fail(format!(
            "counted as {} for the core's {}",
            kernel.fast_name(),
            verdict_name(verdict)
        ));
    }
    // The core's counts (a close's decision among them), the core's close filter words,
    // and a first close folded into the server's load.
    if kernel.counted() != core.counted {
        fail(format!(
            "the kernel counted {:?}, the core {:?}",
            kernel.counted(),
            core.counted
        ));
    }
    if !words.differ.is_empty() {
        fail(format!(
            "shared words (clock, handshakes, closes) differ from those the core leaves: {:?}",
            words.differ
        ));
    }
    let first_close = u64::from(kernel.counted().contains(&Counter::ServerCloses));
    let closed: u64 = kernel.traffic.iter().map(|moved| moved.closed).sum();
    let released_by_syn = u64::from(kernel.released_a_syn());
    let moved = u64::from(kernel.moved_a_count());
    let moved_in: u64 = kernel.traffic.iter().map(|t| t.moved_in).sum();
    if moved_in != moved {
        fail(format!(
            "server_traffic.moved_in moved by {moved_in} for {}",
            kernel.fast_name()
        ));
    }
    if closed != first_close + released_by_syn + moved {
        fail(format!(
            "server_traffic.closed moved by {closed} for {}",
            kernel.fast_name()
        ));
    }
    // Every client of the vectors is behind the namespace's default route, whose gateway
    // is resolved: the map answers, or, empty, leaves it to the FIB.
    if toward_client && kernel.next_hop_miss != (next_hops == NextHops::Empty) {
        fail(format!(
            "next_hops {next_hops:?}, but the reply's next hop {} the map",
            if kernel.next_hop_miss {
                "missed"
            } else {
                "came from"
            }
        ));
    }
    // Every server of the vectors serves its VIP: its replies' senders are in
    // reply_senders, found in one lookup, not by steering's (which alone takes what is no
    // TCP segment).
    if toward_client && kernel.reply_by_steering && kernel.fast_stat() != STAT_FAST_SERVER_NOT_TCP {
        fail(format!(
            "a reply from a server of the VIP's ({}) was not found in reply_senders",
            kernel.fast_name()
        ));
    }
    if kernel.action != action || kernel.frame != expected {
        fail(format!(
            "kernel {} differs from the core's {} ({} expected):\n   kernel {}\n   core   {}",
            action_name(kernel.action),
            verdict_name(verdict),
            action_name(action),
            hex(&kernel.frame),
            hex(&expected)
        ));
    }
    let server = match verdict {
        Verdict::ToServer(id) => Some(id.0),
        _ => None,
    };
    // A SYN the kernel placed: the policy's pick is the core's, counted as opened there.
    let opened: Vec<(u16, u64)> = kernel
        .traffic
        .iter()
        .filter(|moved| moved.opened != 0)
        .map(|moved| (moved.server, moved.opened))
        .collect();
    let opened_expected: Vec<(u16, u64)> = match (syn, server) {
        (true, Some(id)) => vec![(id, 1)],
        _ => Vec::new(),
    };
    if opened != opened_expected {
        fail(format!(
            "server_traffic.opened moved {opened:?}; expected {opened_expected:?} for the core's {}",
            verdict_name(verdict)
        ));
    }
    // The packet's own traffic (a retransmitted SYN also releases its earlier pick's count,
    // checked above): one packet of its IP length as it came (IP options included), the
    // core's `loads.on_packet`.
    let traffic: Vec<(u16, u64, u64)> = kernel
        .traffic
        .iter()
        .filter(|moved| moved.packets != 0)
        .map(|moved| (moved.server, moved.packets, moved.bytes))
        .collect();
    let ip_len = ip_total_len(packet_in);
    // An ICMP error counts toward no server's load in the core.
    let traffic_ok = if icmp {
        traffic.is_empty()
    } else {
        matches!(traffic[..], [(id, 1, bytes)] if server.is_none_or(|s| s == id) && bytes == ip_len)
    };
    if !traffic_ok {
        fail(format!(
            "server_traffic moved {traffic:?} (server, packets, bytes); the core's verdict is {}, for one packet of {ip_len} bytes",
            verdict_name(verdict)
        ));
    }
    report.handled.push(what.to_string());
}

/// What one packet did in the core.
struct CoreRun {
    verdict: Verdict,
    frame: Vec<u8>,
    /// The counters the worker bumped for it (not its housekeeping ones), sorted.
    counted: Vec<Counter>,
    /// The clock table's `echoes_beyond_idle_limit` moved.
    echo_beyond_idle_limit: bool,
}

impl CoreRun {
    fn of(worker: &mut Worker, packet_in: &[u8], now: u64, ingress: Ingress) -> Self {
        // Per-packet counters only: a worker also counts its merges and reloads.
        let counters: Vec<Counter> = Counter::ALL
            .iter()
            .copied()
            .filter(|c| ![Counter::LoadMerges, Counter::SnapshotReloads].contains(c))
            .collect();
        let read = |worker: &Worker| -> Vec<u64> {
            counters.iter().map(|c| worker.counters().get(*c)).collect()
        };
        let before = read(worker);
        let late = |worker: &Worker| worker.shared().msb.echoes_beyond_idle_limit();
        let late_before = late(worker);
        let mut frame = packet_in.to_vec();
        let verdict = worker.process(&mut frame, now, ingress);
        let echo_beyond_idle_limit = late(worker) != late_before;
        let mut counted: Vec<Counter> = counters
            .iter()
            .zip(read(worker).iter().zip(before))
            .flat_map(|(c, (after, before))| {
                std::iter::repeat_n(*c, after.wrapping_sub(before) as usize)
            })
            .collect();
        counted.sort_by_key(|c| *c as u8);
        CoreRun {
            verdict,
            frame,
            counted,
            echo_beyond_idle_limit,
        }
    }
}

/// What one packet did to the words kernel and core share (every one-entry mmapable map:
/// the clock table, the handshake table, the close filter).
struct WordsRun {
    /// What the kernel's run changed.
    kernel_wrote: Vec<String>,
    /// Where the words the core left differ from those the kernel left, both having
    /// started from the same.
    differ: Vec<String>,
}

fn run_suite(topology: &Topology, suite: &Suite, next_hops: NextHops) -> SuiteReport {
    let mut report = SuiteReport::default();
    let program = Kernel::load(topology, next_hops, suite.config.fallback_table_capacity);
    let mut shared = SharedWords::of(&program.program);
    let every_id: Vec<ServerId> = (0..ServerId::SPACE as u32)
        .map(|id| ServerId(id as u16))
        .collect();
    for vector in &suite.file.vector {
        let (plane, mut worker) = program.pipeline(
            topology,
            &suite.config,
            &suite.secret,
            &suite.file.removed_servers,
            &vector.msb_import(),
            // The fallback path's `now` about the vector's (a few ms later): the same time
            // unit of the fallback table for all but a vector at a unit's end.
            monotonic_ns() - vector.now_ns,
        );
        let mut packets: Vec<(String, u64, &str, &str)> = vector
            .prelude
            .iter()
            .enumerate()
            .map(|(n, p)| {
                (
                    format!("{}/{}/prelude {n}", suite.name, vector.name),
                    p.now_ns,
                    p.packet_in.as_str(),
                    p.verdict.as_str(),
                )
            })
            .collect();
        packets.push((
            format!("{}/{}", suite.name, vector.name),
            vector.now_ns,
            vector.packet_in.as_str(),
            vector.verdict.as_str(),
        ));
        let main = packets.len() - 1;
        for (n, (what, now, packet_in, expected_verdict)) in packets.iter().enumerate() {
            let packet_in = unhex(packet_in);
            let mut send =
                |report: &mut SuiteReport, worker: &mut Worker, what: &str, ingress: Ingress| {
                    // Kernel first, then the core: the order a packet meets them. The core
                    // decides from the shared words as they were before the kernel's run.
                    shared.settle();
                    let kernel = (packet_in.len() >= ETH_HLEN)
                        .then(|| program.run(topology.port(ingress), &packet_in, &every_id, *now));
                    let kernel_wrote = shared.changed();
                    let after_kernel = shared.copy();
                    shared.restore_settled();
                    let core = CoreRun::of(worker, &packet_in, *now, ingress);
                    let words = WordsRun {
                        kernel_wrote,
                        differ: shared.core_differences(&after_kernel),
                    };
                    match &kernel {
                        Some(kernel) => judge(
                            report,
                            next_hops,
                            topology,
                            topology.port(ingress),
                            &suite.config,
                            what,
                            &packet_in,
                            kernel,
                            &words,
                            &core,
                        ),
                        None => report.not_runnable.push(what.to_string()),
                    }
                    (kernel, core.verdict, core.frame)
                };
            let (kernel, verdict, core_out) =
                send(&mut report, &mut worker, what, Ingress::ServerSide);
            // The core is the reference only while it still gives the files' answer.
            if verdict_name(verdict) != *expected_verdict
                || (n == main && hex(&core_out) != vector.packet_out)
            {
                report.failures.push(format!(
                    "{what}: the core no longer gives the vector's output ({} instead of {}); regenerate the vectors first",
                    verdict_name(verdict),
                    expected_verdict
                ));
            }
            if kernel.is_some_and(|k| k.up == [CLOCK]) {
                send(
                    &mut report,
                    &mut worker,
                    &format!("{what} (again)"),
                    Ingress::ServerSide,
                );
            }
            // The same reply again, as if it came from where the clients are: what a
            // forged one is (the core drops it before it learns anything).
            if n == main && verdict == Verdict::ToClient {
                send(
                    &mut report,
                    &mut worker,
                    &format!("{what} {CLIENT_SIDE}"),
                    Ingress::ClientSide,
                );
            }
        }
        drop(worker);
        drop(plane);
    }
    report
}

/// How a reply sent again on the clients' side is named in a report.
const CLIENT_SIDE: &str = "(client side)";

/// The vectors of `MUST_BE_HANDLED_IN_KERNEL` this suite has that the kernel did not handle;
/// the replies among them also as sent on the clients' side (dropped in the kernel).
fn not_handled(suite: &Suite, report: &SuiteReport) -> Option<(Vec<String>, Vec<String>)> {
    let (_, required) = MUST_BE_HANDLED_IN_KERNEL
        .iter()
        .find(|(mode, _)| *mode == suite.config.mode)?;
    let present: Vec<String> = required
        .iter()
        .flat_map(|names| names.iter())
        .filter_map(|name| suite.file.vector.iter().find(|v| v.name == *name))
        .flat_map(|v| {
            let name = format!("{}/{}", suite.name, v.name);
            let client_side = (v.verdict == "to_client").then(|| format!("{name} {CLIENT_SIDE}"));
            std::iter::once(name).chain(client_side)
        })
        .collect();
    let missing = present
        .iter()
        .filter(|name| !report.handled.contains(name))
        .cloned()
        .collect();
    Some((present, missing))
}

#[test]
fn every_vector_gives_the_cores_bytes_in_the_kernel_or_goes_up_unchanged() {
    if !is_root() {
        eprintln!(
            "\n*** SKIPPED xdp_parity: needs root (loads the XDP program, makes a network namespace); run it with sudo ***\n"
        );
        return;
    }
    let topology = enter_new_namespace();
    let dirs = suite_dirs();
    let mut failures = Vec::new();
    let mut unhandled = Vec::new();
    let mut summary = String::new();
    for (dir, next_hops) in dirs
        .iter()
        .flat_map(|dir| [NextHops::Empty, NextHops::Mirrored].map(|n| (dir, n)))
    {
        let mut suite = load_suite(dir);
        suite.name = format!("{} [next_hops {next_hops:?}]", suite.name);
        let report = run_suite(&topology, &suite, next_hops);
        let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
        for up in &report.up {
            let reason = up
                .rsplit_once(" (")
                .map_or("", |(_, r)| r.trim_end_matches(')'));
            *by_reason.entry(reason.to_string()).or_default() += 1;
        }
        let _ = writeln!(
            summary,
            "{:<20} {:>3} packets handled in the kernel, {:>3} went up {:?}{}",
            suite.name,
            report.handled.len(),
            report.up.len(),
            by_reason,
            if report.not_runnable.is_empty() {
                String::new()
            } else {
                format!(", not runnable: {}", report.not_runnable.join(", "))
            }
        );
        if !report.up.is_empty() {
            let _ = writeln!(summary, "{:<20} up: {}", "", report.up.join(", "));
        }
        failures.extend(report.failures.iter().cloned());
        if let Some((present, missing)) = not_handled(&suite, &report) {
            if present.is_empty() {
                let _ = writeln!(
                    summary,
                    "{:<20} (no established or reply vector to require)",
                    ""
                );
            }
            unhandled.extend(missing);
        }
    }
    eprintln!("{summary}");
    assert!(
        failures.is_empty(),
        "{} packet(s) where the kernel and the core disagree:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        unhandled.is_empty(),
        "the kernel handed up established or reply vectors it must handle itself: {}",
        unhandled.join(", ")
    );
    eprintln!(
        "xdp_parity: every vector of {} suites agrees with the core",
        dirs.len()
    );
}

/// `UP_REASONS`' label of `STAT_UP_CLOCK`: the one reason a second sending can change.
const CLOCK: &str = "clock";

// --- The fallback table, one for the kernel and the core ----------------------------------

/// Checks that the kernel handled `what` as `stat` with the core's bytes, counters and
/// server traffic.
fn assert_kernel_is_core(
    topology: &Topology,
    config: &LbConfig,
    what: &str,
    run: &KernelRun,
    core: &CoreRun,
    stat: u32,
) {
    assert_eq!(
        (run.fast_moved(), &run.up[..]),
        (1, &[][..] as &[&str]),
        "{what}: handled in the kernel"
    );
    assert_eq!(run.fast_stat(), stat, "{what}: {}", run.fast_name());
    let (action, expected) = after_egress(
        topology,
        config,
        topology.servers,
        core.verdict,
        &core.frame,
    )
    .unwrap_or_else(|| panic!("{what}: the core says {:?}", core.verdict));
    assert_eq!(run.action, action, "{what}");
    assert_eq!(hex(&run.frame), hex(&expected), "{what}: the core's bytes");
    assert_eq!(run.counted(), core.counted, "{what}: what the core counts");
    let Verdict::ToServer(server) = core.verdict else {
        unreachable!()
    };
    let traffic: Vec<u16> = run
        .traffic
        .iter()
        .filter(|t| t.packets != 0)
        .map(|t| t.server)
        .collect();
    assert_eq!(traffic, [server.0], "{what}: the server's traffic");
}

/// The servers whose load counts a kernel run moved: (server, opened, closed).
fn opened_and_closed(run: &KernelRun) -> Vec<(u16, u64, u64)> {
    run.traffic
        .iter()
        .filter(|t| t.opened != 0 || t.closed != 0)
        .map(|t| (t.server, t.opened, t.closed))
        .collect()
}

/// The fallback table's time unit (2^30 ns, core lb/fallback.rs).
const UNIT_SHIFT: u32 = 30;

/// A client without timestamps, in l2-cheetah's vectors: its SYN must be placed by the
/// kernel with the VIP's Maglev table and remembered in the table it shares with the core,
/// as a core alone places and remembers it (the same bytes, counters and table words; sent
/// again, a retransmission); then its ACK and a RST without ACK, both of the same flow,
/// must be forwarded by the kernel from that table with the bytes and counters the core
/// gives them (and an RST or FIN without ACK that carries a timestamp, which echoes
/// nothing), and the kernel's refresh of the flow's time must be the word the core
/// writes. A flow the table does not know is forwarded by the Maglev table as the core
/// forwards it; a SYN without any options is placed like the first, and one into a full
/// set evicts the flow the core evicts; a server's SYN-ACK without timestamps teaches the
/// table its server. A flow whose server was removed goes up unchanged.
#[test]
fn the_kernel_routes_clients_without_timestamps_by_the_cores_fallback_table() {
    if !is_root() {
        eprintln!("\n*** SKIPPED xdp_parity: needs root ***\n");
        return;
    }
    let topology = enter_new_namespace();
    let dir = suite_dirs()
        .into_iter()
        .find(|d| d.ends_with("l2-cheetah"))
        .expect("the l2-cheetah vectors");
    let suite = load_suite(&dir);
    let vector = |name: &str| {
        suite
            .file
            .vector
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("l2-cheetah has no vector {name}"))
    };
    let after_syn = vector("no-timestamps-ack-after-syn");
    let syn = unhex(&after_syn.prelude[0].packet_in);
    let ack = unhex(&after_syn.packet_in);
    let rst = unhex(&vector("client-rst-without-timestamps").packet_in);
    assert_eq!(ack[26..38], rst[26..38], "the ACK and the RST are one flow");
    // The SYN five units before the segments; the kernel's clock mid-unit, so that a run
    // of the test stays in one unit. `now` must not be ahead of the host's monotonic clock
    // (the kernel's is `monotonic - clock_base_ns`, and the base cannot be negative): on a
    // machine up for less than 1000 units (about 18 minutes, as a fresh CI machine may
    // be) unit 1000 would be.
    let unit = (monotonic_ns() >> UNIT_SHIFT)
        .saturating_sub(1)
        .clamp(5, 1000);
    let syn_at = (unit - 5) << UNIT_SHIFT;
    let now = (unit << UNIT_SHIFT) + (1 << (UNIT_SHIFT - 1));
    let kernel = Kernel::load(
        &topology,
        NextHops::Empty,
        suite.config.fallback_table_capacity,
    );
    let clock_base_ns = monotonic_ns() - now;
    let ids: Vec<ServerId> = suite
        .config
        .servers
        .iter()
        .map(|s| ServerId(s.id))
        .collect();
    // The worker is not run: the reference core decides beside the kernel.
    let (mut plane, _worker) = kernel.pipeline(
        &topology,
        &suite.config,
        &suite.secret,
        &suite.file.removed_servers,
        &after_syn.msb_import(),
        clock_base_ns,
    );
    // The reference: the same packets through a core alone, at the same times.
    let mut reference_plane = ControlPlane::new(&suite.config, &suite.secret).unwrap();
    let mut reference = Worker::new(
        Arc::clone(reference_plane.shared()),
        WorkerConfig::new(0, 1, &suite.config),
    );

    // The SYN (options, none a timestamp): a new connection, placed by the VIP's Maglev
    // table and remembered, in the kernel as in the core.
    let syn_run = kernel.run(topology.servers, &syn, &ids, syn_at);
    let syn_core = CoreRun::of(&mut reference, &syn, syn_at, Ingress::ServerSide);
    let placed = syn_core.verdict;
    assert_kernel_is_core(
        &topology,
        &suite.config,
        "SYN without timestamps",
        &syn_run,
        &syn_core,
        STAT_FAST_FALLBACK_SYN,
    );
    let Verdict::ToServer(server) = placed else {
        panic!("the SYN was placed: {placed:?}")
    };
    assert_eq!(
        opened_and_closed(&syn_run),
        [(server.0, 1, 0)],
        "the pick is counted as a new connection"
    );
    let table = &plane.shared().fallback;
    assert_eq!(table.len(), 1, "the kernel's insert is in the core's table");
    assert_eq!(
        table.export(now),
        reference_plane.shared().fallback.export(now),
        "the kernel's insert is the core's"
    );
    assert_eq!(table.export(now)[0].idle_units, 5);
    // Sent again: the handshake table knows it, the earlier pick's count is released.
    let again = kernel.run(topology.servers, &syn, &ids, syn_at);
    let again_core = CoreRun::of(&mut reference, &syn, syn_at, Ingress::ServerSide);
    assert_kernel_is_core(
        &topology,
        &suite.config,
        "retransmitted SYN without timestamps",
        &again,
        &again_core,
        STAT_FAST_FALLBACK_SYN_RETRANSMITTED,
    );
    assert_eq!(opened_and_closed(&again), [(server.0, 1, 1)]);
    assert_eq!(
        table.export(now),
        reference_plane.shared().fallback.export(now)
    );

    // Its ACK and its RST: forwarded by the kernel from the core's entry. So is a segment
    // without SYN and ACK that carries a timestamp: it echoes nothing in TSecr (RFC 7323),
    // and the core counts how its timestamp was found (the compare's, NOP NOP TS first, or
    // the walk's).
    let flow_field = |at: usize| u32::from_be_bytes(ack[at..at + 4].try_into().unwrap());
    let of_the_flow = |flag: u8, found_by: Vec<u8>| {
        let mut frame = TcpFrame::from_client(
            flow_field(26),
            u16::from_be_bytes([ack[34], ack[35]]),
            flag,
            found_by,
        );
        frame.dst_ip = flow_field(30);
        frame.dst_port = u16::from_be_bytes([ack[36], ack[37]]);
        let mut segment = frame.build();
        segment[..14].copy_from_slice(&ack[..14]);
        segment
    };
    let rst_compared = of_the_flow(flags::RST, options::nop_nop_ts(7, 0));
    let fin_walked = of_the_flow(flags::FIN, options::ts_first(7, 0));
    for (what, segment, compared) in [
        ("ACK", &ack, false),
        ("RST without ACK", &rst, false),
        ("RST with NOP NOP TS", &rst_compared, true),
        ("FIN with its timestamp first", &fin_walked, false),
    ] {
        let run = kernel.run(topology.servers, segment, &ids, now);
        let core = CoreRun::of(&mut reference, segment, now, Ingress::ServerSide);
        assert_eq!(
            core.verdict, placed,
            "{what}: the core routes it by the table"
        );
        assert_kernel_is_core(
            &topology,
            &suite.config,
            what,
            &run,
            &core,
            STAT_FAST_CLIENT_FALLBACK,
        );
        assert_eq!(
            run.options_compared, compared,
            "{what}: the compare's find is counted as the core counts it"
        );
        // The kernel refreshed the flow's time as the core's lookup did (the same word:
        // the same flows with the same idle times, at any instant).
        assert_eq!(
            table.export(now),
            reference_plane.shared().fallback.export(now),
            "{what}: the kernel's refresh is the core's"
        );
        assert_eq!(table.export(now)[0].idle_units, 0, "{what}: refreshed");
    }

    // Another client port: not in the table. The kernel forwards it by the Maglev table,
    // as the core does, and remembers nothing.
    let mut stranger = ack.clone();
    stranger[34..36].copy_from_slice(&0x9c41u16.to_be_bytes());
    let run = kernel.run(topology.servers, &stranger, &ids, now);
    let core = CoreRun::of(&mut reference, &stranger, now, Ingress::ServerSide);
    assert!(core.counted.contains(&Counter::FallbackMisses));
    assert_kernel_is_core(
        &topology,
        &suite.config,
        "fallback miss",
        &run,
        &core,
        STAT_FAST_FALLBACK_MISS,
    );
    assert_eq!(table.len(), 1, "a miss remembers nothing");

    // A SYN without any options, of a third client port: placed and remembered likewise.
    let mut bare_syn = ack.clone();
    bare_syn[34..36].copy_from_slice(&0x9c42u16.to_be_bytes());
    bare_syn[47] = 0x02;
    let run = kernel.run(topology.servers, &bare_syn, &ids, now);
    let core = CoreRun::of(&mut reference, &bare_syn, now, Ingress::ServerSide);
    assert_kernel_is_core(
        &topology,
        &suite.config,
        "SYN without options",
        &run,
        &core,
        STAT_FAST_FALLBACK_SYN,
    );
    assert_eq!(table.len(), 2);
    assert_eq!(
        table.export(now),
        reference_plane.shared().fallback.export(now)
    );

    // A set full of flows: the next SYN of that set takes the way used least recently,
    // in the kernel as in the core (FallbackEvictions).
    let hasher = &plane.shared().hasher;
    let ip = |at: usize| u32::from_be_bytes(ack[at..at + 4].try_into().unwrap());
    let vip_port = u16::from_be_bytes([ack[36], ack[37]]);
    let set_of = |port: u16| {
        hasher.hash(&FlowKey::tcp(ip(26), port, ip(30), vip_port)) as usize & (table.sets() - 1)
    };
    let target = set_of(20_000);
    let same_set: Vec<u16> = (20_000..u16::MAX)
        .filter(|&port| set_of(port) == target)
        .take(FALLBACK_WAYS + 1)
        .collect();
    assert_eq!(same_set.len(), FALLBACK_WAYS + 1);
    assert!(
        table
            .export(now)
            .iter()
            .all(|flow| flow.set as usize != target),
        "the set starts empty"
    );
    for (n, port) in same_set.iter().enumerate() {
        let mut syn = bare_syn.clone();
        syn[34..36].copy_from_slice(&port.to_be_bytes());
        let at = now + n as u64 * (1 << UNIT_SHIFT);
        let run = kernel.run(topology.servers, &syn, &ids, at);
        let core = CoreRun::of(&mut reference, &syn, at, Ingress::ServerSide);
        let (what, stat) = if n < FALLBACK_WAYS {
            (format!("SYN {n} into a set"), STAT_FAST_FALLBACK_SYN)
        } else {
            (
                "SYN into a full set".to_string(),
                STAT_FAST_FALLBACK_SYN_EVICTED,
            )
        };
        assert_kernel_is_core(&topology, &suite.config, &what, &run, &core, stat);
        assert_eq!(
            table.export(at),
            reference_plane.shared().fallback.export(at),
            "{what}: the kernel's insert is the core's"
        );
    }
    assert_eq!(table.len(), 2 + FALLBACK_WAYS);

    // A server's SYN-ACK without timestamps (a client that offered none): toward the
    // client, and its server learnt by the table, in the kernel as in the core.
    let syn_ack = TcpFrame::from_server_l2(
        2,
        ip(26),
        0x9c43,
        flags::SYN | flags::ACK,
        options::windows_syn(),
    )
    .build();
    let run = kernel.run(topology.servers, &syn_ack, &ids, now);
    let core = CoreRun::of(&mut reference, &syn_ack, now, Ingress::ServerSide);
    assert_eq!(
        (run.fast_moved(), &run.up[..]),
        (1, &[][..] as &[&str]),
        "SYN-ACK without timestamps: handled in the kernel"
    );
    assert_eq!(run.fast_stat(), STAT_FAST_SERVER_FALLBACK_LEARNED);
    let (action, expected) = after_egress(
        &topology,
        &suite.config,
        topology.servers,
        core.verdict,
        &core.frame,
    )
    .expect("toward the client");
    assert_eq!((run.action, hex(&run.frame)), (action, hex(&expected)));
    assert_eq!(run.counted(), core.counted, "what the core counts");
    assert_eq!(
        table.export(now),
        reference_plane.shared().fallback.export(now),
        "the kernel learnt what the core learns"
    );
    assert_eq!(table.len(), 3 + FALLBACK_WAYS);

    // Its server removed: the kernel drops the segment and forgets the flow, as the core
    // does, and leaves the set's other flows (the SYNs' above) alone.
    let Verdict::ToServer(server) = placed else {
        panic!("the SYN was placed: {placed:?}")
    };
    plane.remove_server(server.0, now).unwrap();
    reference_plane.remove_server(server.0, now).unwrap();
    kernel.publish(&topology, &plane);
    reference.tick(now);
    let run = kernel.run(topology.servers, &ack, &ids, now);
    let core = CoreRun::of(&mut reference, &ack, now, Ingress::ServerSide);
    assert_eq!(verdict_name(core.verdict), "drop:fallback_server_removed");
    assert_eq!(
        (run.fast_moved(), &run.up[..]),
        (1, &[][..] as &[&str]),
        "a fallback entry naming a removed server: decided in the kernel"
    );
    assert_eq!(run.fast_stat(), STAT_DROP_FALLBACK_SERVER_REMOVED);
    assert_eq!(run.action, XDP_DROP);
    assert_eq!(run.dropped_for(), Some(DropReason::FallbackServerRemoved));
    assert_eq!(run.counted(), core.counted, "what the core counts");
    let table = &plane.shared().fallback;
    assert_eq!(
        table.len(),
        2 + FALLBACK_WAYS,
        "the flow is forgotten, the others stay"
    );
    assert_eq!(
        table.export(now),
        reference_plane.shared().fallback.export(now),
        "the kernel forgot what the core forgets"
    );
    // Forgotten: its next segment is a miss, which the VIP's Maglev table (rebuilt
    // without the server) places elsewhere, in the kernel as in the core.
    let run = kernel.run(topology.servers, &ack, &ids, now);
    let core = CoreRun::of(&mut reference, &ack, now, Ingress::ServerSide);
    assert_ne!(core.verdict, placed);
    assert_kernel_is_core(
        &topology,
        &suite.config,
        "the forgotten flow's next segment",
        &run,
        &core,
        STAT_FAST_FALLBACK_MISS,
    );
}
