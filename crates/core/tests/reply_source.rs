//! A server's reply teaches the LB the server's clock, so the LB believes a segment is one
//! only from where replies come (issue #21, "No single packet moves a server's clock"):
//! never when it is addressed to a VIP, never when it arrives on a client-side port, and
//! never further ahead than real time allows. Each rule in l2 and nat, on the straight
//! line and on the general pipeline.

use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::hash::Secret;
use cheetah_core::lb::{Counter, Ingress, Worker, WorkerConfig};
use cheetah_core::policy::PolicyKind;
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{self, options, TcpFrame, VIP};
use cheetah_core::types::{Nanos, NANOS_PER_MS};
use cheetah_core::wire::tcp::flags::{ACK, SYN};
use cheetah_core::{DropReason, ServerId, Verdict};

const SERVER_TS: u32 = 0x1234_5678;
/// Far ahead of the server's clock: what a spoofer sends to push the estimate.
const SPOOFED_TS: u32 = SERVER_TS.wrapping_add(0x4000_0000);
const CLIENT_PORT: u16 = 40_000;

struct Lb {
    _plane: ControlPlane,
    worker: Worker,
    forwarding: Forwarding,
}

impl Lb {
    fn new(forwarding: Forwarding, fast_path: bool) -> Self {
        let config = testkit::config(Mode::Cheetah, forwarding, PolicyKind::RoundRobin, 2);
        let plane = ControlPlane::new(&config, &Secret([7; 16])).unwrap();
        let mut worker = Worker::new(plane.shared().clone(), WorkerConfig::new(0, 1, &config));
        worker.set_fast_path(fast_path);
        Lb {
            _plane: plane,
            worker,
            forwarding,
        }
    }

    /// A client SYN (from the client side) and the server's SYN-ACK carrying `SERVER_TS`
    /// (from the servers' side, or `synack_from`): the server it went to.
    fn connect(&mut self, synack_from: Ingress) -> (ServerId, Verdict) {
        let client = testkit::client_ip(1);
        let mut syn =
            TcpFrame::from_client(client, CLIENT_PORT, SYN, options::linux_syn(9, 0)).build();
        let Verdict::ToServer(server) = self.worker.process(&mut syn, ms(1), Ingress::ClientSide)
        else {
            panic!("the SYN is placed");
        };
        let mut synack = self.reply(server, SYN | ACK, SERVER_TS);
        let verdict = self.worker.process(&mut synack, ms(2), synack_from);
        (server, verdict)
    }

    fn reply(&self, server: ServerId, flags: u8, tsval: u32) -> Vec<u8> {
        self.server_frame(server, flags, tsval).build()
    }

    fn server_frame(&self, server: ServerId, flags: u8, tsval: u32) -> TcpFrame {
        let client = testkit::client_ip(1);
        let opts = if flags & SYN != 0 {
            options::linux_syn(tsval, 9)
        } else {
            options::nop_nop_ts(tsval, 9)
        };
        match self.forwarding {
            Forwarding::L2 => TcpFrame::from_server_l2(server.0, client, CLIENT_PORT, flags, opts),
            Forwarding::Nat => {
                TcpFrame::from_server_nat(server.0, client, CLIENT_PORT, flags, opts)
            }
        }
    }

    fn clock(&self, server: ServerId) -> Option<u16> {
        self.worker.shared().msb.get(server)
    }

    fn drops(&self, reason: DropReason) -> u64 {
        self.worker.counters().drops(reason)
    }
}

fn ms(t: u64) -> Nanos {
    t * NANOS_PER_MS
}

fn every_path() -> impl Iterator<Item = (Forwarding, bool)> {
    [Forwarding::L2, Forwarding::Nat]
        .into_iter()
        .flat_map(|f| [true, false].map(move |fast| (f, fast)))
}

/// The spoof in nat, `src = DIP:backend_port, dst = VIP:any port` with a large
/// TSval (the XDP program steers every port of a VIP to the workers), and its l2 twin
/// (`src = VIP:port` from a server's MAC, to the VIP). Before: taken as the server's reply,
/// sent on with a cookie, and its TSval learnt. Now: traffic to a VIP port no VIP has.
#[test]
fn a_segment_to_a_vip_address_is_never_a_reply() {
    for (forwarding, fast) in every_path() {
        let mut lb = Lb::new(forwarding, fast);
        let (server, verdict) = lb.connect(Ingress::ServerSide);
        assert_eq!(verdict, Verdict::ToClient);
        let clock = lb.clock(server);
        for dst_port in [9, CLIENT_PORT] {
            let mut spoof = lb.server_frame(server, ACK, SPOOFED_TS);
            spoof.dst_ip = VIP;
            spoof.dst_port = dst_port;
            let verdict = lb
                .worker
                .process(&mut spoof.build(), ms(3), Ingress::ServerSide);
            assert_eq!(
                verdict,
                Verdict::Drop(DropReason::VipPortUnknown),
                "{forwarding:?}, fast path {fast}, to VIP port {dst_port}"
            );
        }
        assert_eq!(lb.clock(server), clock);
        assert_eq!(
            lb.worker.counters().get(Counter::CookiesInserted),
            1,
            "the SYN-ACK's only"
        );
        assert_eq!(
            lb.worker.counters().get(Counter::ServerTsAheadOfRealTime),
            0
        );
    }
}

/// A server's genuine SYN-ACK, on a client-side port: dropped and counted before anything
/// is learnt (the clock stays unknown); the same from the servers' side passes.
#[test]
fn a_reply_on_a_client_side_port_is_dropped_before_anything_is_learnt() {
    for (forwarding, fast) in every_path() {
        let mut lb = Lb::new(forwarding, fast);
        let (server, verdict) = lb.connect(Ingress::ClientSide);
        assert_eq!(
            verdict,
            Verdict::Drop(DropReason::ReplyFromClientSide),
            "{forwarding:?}, fast path {fast}"
        );
        assert_eq!(lb.drops(DropReason::ReplyFromClientSide), 1);
        assert_eq!(lb.clock(server), None, "nothing learnt");
        let mut reply = lb.reply(server, ACK, SERVER_TS + 10);
        assert_eq!(
            lb.worker.process(&mut reply, ms(3), Ingress::ServerSide),
            Verdict::ToClient
        );
        assert_eq!(lb.clock(server), Some((SERVER_TS >> 16) as u16));
    }
}

/// A spoofer on the client side sending a server's MAC (l2) or address and port (nat), with
/// a large TSval, after the clock is known: dropped as a reply from the client side, the
/// clock unmoved; its twin from the servers' side is forwarded but, far ahead of real time,
/// not learnt either.
#[test]
fn a_spoofed_reply_with_a_large_tsval_moves_no_clock() {
    for (forwarding, fast) in every_path() {
        let mut lb = Lb::new(forwarding, fast);
        let (server, _) = lb.connect(Ingress::ServerSide);
        let clock = lb.clock(server);
        assert!(clock.is_some());
        let mut spoof = lb.reply(server, ACK, SPOOFED_TS);
        assert_eq!(
            lb.worker.process(&mut spoof, ms(3), Ingress::ClientSide),
            Verdict::Drop(DropReason::ReplyFromClientSide),
            "{forwarding:?}, fast path {fast}"
        );
        assert_eq!(lb.clock(server), clock);
        let mut ahead = lb.reply(server, ACK, SPOOFED_TS);
        assert_eq!(
            lb.worker.process(&mut ahead, ms(4), Ingress::ServerSide),
            Verdict::ToClient
        );
        assert_eq!(lb.clock(server), clock);
        assert_eq!(
            lb.worker.counters().get(Counter::ServerTsAheadOfRealTime),
            1
        );
        assert_eq!(lb.worker.counters().get(Counter::ServerTsClockUnstable), 0);
    }
}

/// Client packets are the same on either side: a server-side port may carry them too (an
/// LB with one interface).
#[test]
fn client_packets_pass_on_either_side() {
    for (forwarding, fast) in every_path() {
        for ingress in [Ingress::ClientSide, Ingress::ServerSide] {
            let mut lb = Lb::new(forwarding, fast);
            let (server, _) = lb.connect(Ingress::ServerSide);
            let client = testkit::client_ip(1);
            let mut synack = lb.reply(server, SYN | ACK, SERVER_TS);
            lb.worker.process(&mut synack, ms(5), Ingress::ServerSide);
            let echo = testkit::timestamps(&synack).unwrap().0;
            let mut ack =
                TcpFrame::from_client(client, CLIENT_PORT, ACK, options::nop_nop_ts(10, echo))
                    .build();
            assert_eq!(
                lb.worker.process(&mut ack, ms(6), ingress),
                Verdict::ToServer(server),
                "{forwarding:?}, fast path {fast}, {ingress:?}"
            );
            assert_eq!(testkit::timestamps(&ack).unwrap().1, SERVER_TS);
        }
    }
}
