//! The established-client fast path must be invisible: for any frame, a worker with it and
//! a worker without it give the same verdict and leave the same bytes.

use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::cookie::tcp_ts;
use cheetah_core::hash::{FlowHasher, FlowKey, Secret};
use cheetah_core::lb::{Counter, Worker, WorkerConfig};
use cheetah_core::policy::PolicyKind;
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit::{self, options, TcpFrame, VIP, VIP_PORT};
use cheetah_core::wire::tcp::flags::{ACK, FIN, PSH, RST, SYN};
use cheetah_core::ServerId;
use proptest::prelude::*;

const SECRET: Secret = Secret([9; 16]);

fn worker(mode: Mode, forwarding: Forwarding, fast: bool) -> (ControlPlane, Worker) {
    let config = testkit::config(mode, forwarding, PolicyKind::RoundRobin, 4);
    let plane = ControlPlane::new(&config, &SECRET).unwrap();
    for id in 1..=4 {
        plane
            .shared()
            .msb
            .learn(ServerId(id), 0x0123_0000 + id as u32 * 0x1_0000, 1);
    }
    let mut worker = Worker::new(plane.shared().clone(), WorkerConfig::new(0, 1, &config));
    worker.set_fast_path(fast);
    (plane, worker)
}

/// A client segment echoing a cookie for `server` (or garbage when `server` is 0x7fff).
fn frame(
    client: u32,
    port: u16,
    server: u16,
    version: u16,
    flags: u8,
    sack: bool,
    payload: usize,
) -> Vec<u8> {
    let hash = FlowHasher::new(&SECRET).hash(&FlowKey::tcp(client, port, VIP, VIP_PORT));
    let tsecr = tcp_ts::insert(0x0000_4321, tcp_ts::encode(ServerId(server), hash, version));
    let opts = if sack {
        options::nop_nop_ts_sack(77, tsecr)
    } else {
        options::nop_nop_ts(77, tsecr)
    };
    TcpFrame::from_client(client, port, flags, opts)
        .with_payload(&vec![0x61; payload])
        .build()
}

fn frames() -> impl Strategy<Value = Vec<u8>> {
    (
        0u32..50,
        1u16..6,
        0u16..2,
        prop_oneof![
            Just(ACK),
            Just(ACK | PSH),
            Just(ACK | FIN),
            Just(RST),
            Just(SYN),
            Just(SYN | ACK)
        ],
        any::<bool>(),
        0usize..40,
    )
        .prop_map(|(c, s, v, f, sack, len)| {
            frame(
                testkit::client_ip(c),
                30_000 + c as u16,
                if s == 5 { 0x7fff } else { s },
                v,
                f,
                sack,
                len,
            )
        })
}

fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        frames(),
        proptest::collection::vec((0usize..80, any::<u8>()), 0..3),
        0usize..100,
    )
        .prop_map(|(mut f, edits, cut)| {
            for (at, byte) in edits {
                if at < f.len() {
                    f[at] = byte;
                }
            }
            if cut < f.len() && cut % 3 == 0 {
                f.truncate(cut);
            }
            f
        })
}

/// One pair of workers for all cases (building them is the slow part); both see the same
/// packets in the same order, so their state stays identical.
#[test]
fn fast_path_gives_the_general_pipelines_verdict_and_bytes() {
    use proptest::test_runner::{Config, TestRunner};
    use std::cell::RefCell;
    for (mode, forwarding) in [
        (Mode::Cheetah, Forwarding::L2),
        (Mode::Cheetah, Forwarding::Nat),
        (Mode::Hash, Forwarding::L2),
        (Mode::Maglev, Forwarding::Nat),
    ] {
        let (_a, fast) = worker(mode, forwarding, true);
        let (_b, general) = worker(mode, forwarding, false);
        let pair = RefCell::new((fast, general));
        let mut runner = TestRunner::new(Config {
            cases: 20_000,
            ..Config::default()
        });
        runner
            .run(&mutated(), |packet| {
                let (fast, general) = &mut *pair.borrow_mut();
                let (mut x, mut y) = (packet.clone(), packet);
                let (vx, vy) = (fast.process(&mut x, 5), general.process(&mut y, 5));
                prop_assert_eq!(vx, vy);
                prop_assert_eq!(x, y);
                Ok(())
            })
            .unwrap();
        let (fast, general) = &*pair.borrow();
        let taken = fast.counters().get(Counter::FastPath);
        assert!(
            taken > 2_000,
            "the fast path must actually be exercised ({forwarding:?}): {taken}"
        );
        assert_eq!(general.counters().get(Counter::FastPath), 0);
        for c in Counter::ALL.iter().filter(|c| **c != Counter::FastPath) {
            assert_eq!(
                fast.counters().get(*c),
                general.counters().get(*c),
                "{}",
                c.name()
            );
        }
    }
}

#[test]
fn the_fast_path_is_taken_for_the_common_case() {
    let (_plane, mut w) = worker(Mode::Cheetah, Forwarding::L2, true);
    let mut f = frame(testkit::client_ip(1), 40_000, 2, 1, ACK, false, 10);
    assert_eq!(
        w.process(&mut f, 5),
        cheetah_core::Verdict::ToServer(ServerId(2))
    );
    assert_eq!(
        testkit::timestamps(&f).unwrap().1,
        0x0125_4321,
        "TSecr restored to server 2's MSB"
    );
    assert!(testkit::checksums_valid(&f));
}
