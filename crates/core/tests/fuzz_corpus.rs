//! Replays the committed fuzz corpus on stable, through the very harness the fuzzer runs.
//!
//! The `pipeline` fuzz target needs nightly and libFuzzer, which CI and most developers do
//! not run; this test keeps every input the fuzzer found interesting (and every crash
//! regression added to the corpus) checked by a plain `cargo test`. The harness is included
//! by path, not copied, so the invariants cannot drift apart.

#[path = "../../../fuzz/harness/mod.rs"]
mod harness;
#[path = "../../../fuzz/seeds.rs"]
mod seeds;

use std::path::PathBuf;

use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::lb::Ingress;
use cheetah_core::policy::PolicyKind;
use cheetah_core::types::NANOS_PER_SEC;
use harness::input::{Action, Setup, ACTIONS};

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/pipeline")
}

/// Every corpus file goes through the harness; a missing or empty corpus fails, so the test
/// cannot pass by checking nothing.
#[test]
fn corpus_replays_without_violating_an_invariant() {
    let dir = corpus_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fuzz corpus {} missing: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "fuzz corpus {} is empty; see docs/fuzzing.md",
        dir.display()
    );
    for file in &files {
        let data = std::fs::read(file).unwrap();
        let outcome = std::panic::catch_unwind(|| harness::run(&data));
        if let Err(panic) = outcome {
            panic!(
                "corpus input {} violates an invariant: {}",
                file.display(),
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(non-string panic)")
            );
        }
    }
    let (exact, _) = harness::clocks::echo_stats();
    println!("corpus: {exact} echoes restored to an MSB their server sent");
    assert!(
        exact > 0,
        "no corpus echo was held to the harness's clock model"
    );
}

/// The seeds are real conversations; they must pass too (they are also in the corpus, but
/// this keeps them checked if the corpus is ever re-minimised without them).
#[test]
fn seeds_replay_without_violating_an_invariant() {
    for (name, data) in seeds::seeds() {
        if let Err(panic) = std::panic::catch_unwind(|| harness::run(&data)) {
            std::panic::resume_unwind(Box::new(format!(
                "seed {name}: {}",
                panic.downcast_ref::<String>().cloned().unwrap_or_default()
            )));
        }
    }
    // The harness's clock model must have held echoes to what their servers sent, some
    // after idle gaps past the limit: a model that never found an exact echo checks nothing.
    let (exact, beyond) = harness::clocks::echo_stats();
    println!(
        "seeds: {exact} echoes restored to an MSB the server sent, {beyond} beyond the idle limit"
    );
    assert!(exact >= 20, "only {exact} echoes held to the model");
    assert!(
        beyond >= 2,
        "only {beyond} echoes beyond the idle limit checked"
    );
}

/// The harness's fast control model must publish what a real `ControlPlane` would, for
/// every config variant and a deterministic spread of action sequences.
#[test]
fn harness_model_matches_the_control_plane() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    // A third of the configs (each with another server byte) keeps this a few seconds in
    // debug builds: every published snapshot builds 65537-slot Maglev tables.
    for config in (0..=255u8).step_by(3) {
        {
            let setup = Setup::decode(config, config.rotate_right(3));
            let mut now = NANOS_PER_SEC;
            let actions: Vec<_> = (0..8)
                .map(|_| {
                    let r = next();
                    now += [1, 300, 601][(r % 3) as usize] * NANOS_PER_SEC;
                    (ACTIONS[(r >> 8) as usize % 8], ((r >> 16) % 8) as u16, now)
                })
                .collect();
            harness::model::model_matches_control_plane(setup, &actions);
        }
    }
}

/// Writes the seed inputs to `$CHEETAH_FUZZ_SEEDS` (a directory), for `cargo fuzz run`.
#[test]
#[ignore = "writes files; run by hand, see docs/fuzzing.md"]
fn write_fuzz_seeds() {
    let dir = PathBuf::from(
        std::env::var("CHEETAH_FUZZ_SEEDS").expect("set CHEETAH_FUZZ_SEEDS to a directory"),
    );
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in seeds::seeds() {
        std::fs::write(dir.join(format!("seed-{name}")), data).unwrap();
    }
}

/// Keeps the `Setup` encoding honest: what the seeds encode is what the harness decodes.
#[test]
fn setup_encoding_round_trips() {
    for config in 0..=255u8 {
        for servers in 0..8u8 {
            let setup = Setup::decode(config, servers);
            let [c, s] = setup.encode();
            assert_eq!(Setup::decode(c, s), setup);
        }
    }
    let setup = Setup::new(Mode::Cheetah, Forwarding::Nat);
    assert_eq!(setup.policy, PolicyKind::RoundRobin);
    let _ = Action::Expire;
}

fn regressions_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/pipeline")
}

/// Inputs that reproduced core bugs, run with every invariant enforced (see
/// `harness::checks::Checks`): a bug that comes back fails here by name.
#[test]
fn regressions_replay_strictly() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(regressions_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty());
    for file in files {
        let data = std::fs::read(&file).unwrap();
        if std::panic::catch_unwind(|| harness::run_strict(&data)).is_err() {
            panic!("regression input {} still fails", file.display());
        }
    }
}

/// The bug the regression inputs found, spelled out with the public API: a cheetah-mode
/// client that sends no TCP timestamps is routed by the worker's fallback table, and that
/// table still named a server after the server was removed (cookie-routed packets of the
/// same server are dropped as `cookie_server_removed`). Fixed in core; kept as a guard.
#[test]
fn fallback_table_does_not_route_to_a_removed_server() {
    use cheetah_core::lb::{Worker, WorkerConfig};
    use cheetah_core::tables::ControlPlane;
    use cheetah_core::testkit::{self, options, TcpFrame};
    use cheetah_core::verdict::Verdict;
    use cheetah_core::wire::tcp::flags;
    use cheetah_core::ServerId;

    let config = testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 3);
    let mut plane = ControlPlane::new(&config, &harness::SECRET).unwrap();
    let mut worker = Worker::new(
        std::sync::Arc::clone(plane.shared()),
        WorkerConfig::new(0, 1, &config),
    );
    let client = testkit::client_ip(7);
    let mut syn = TcpFrame::from_client(client, 40_000, flags::SYN, options::windows_syn()).build();
    let Verdict::ToServer(server) = worker.process(&mut syn, NANOS_PER_SEC, Ingress::ServerSide)
    else {
        panic!("SYN not forwarded");
    };
    let ack = TcpFrame::from_client(client, 40_000, flags::ACK, Vec::new()).build();
    assert_eq!(
        worker.process(&mut ack.clone(), 2 * NANOS_PER_SEC, Ingress::ServerSide),
        Verdict::ToServer(server)
    );
    plane.remove_server(server.0, 3 * NANOS_PER_SEC).unwrap();
    let verdict = worker.process(&mut ack.clone(), 4 * NANOS_PER_SEC, Ingress::ServerSide);
    assert!(
        !matches!(verdict, Verdict::ToServer(s) if s == server),
        "{verdict:?}: server {server} was removed, yet the fallback table still routes to it"
    );
    // Same for an ICMP error about the connection that quotes no timestamp.
    let quoted = TcpFrame::from_server_l2(server.0, client, 40_000, flags::ACK, Vec::new()).build();
    let mut icmp = testkit::icmp_frag_needed(0x0a09_0001, &quoted, 48);
    let verdict = worker.process(&mut icmp, 5 * NANOS_PER_SEC, Ingress::ServerSide);
    assert_ne!(
        verdict,
        Verdict::ToServer(server),
        "ICMP error routed to a removed server"
    );
    let _ = ServerId(0);
}

/// Found while writing the harness's invariants: in NAT mode a server's replies are only
/// recognised through `Snapshot::nat_backend`, which was built from the VIPs' *members*. A
/// server that left a VIP's pool (`ControlPlane::leave_pool`, documented as "connections
/// it has keep going") was no member any more, so its replies on existing connections were
/// passed to the host untranslated. Fixed in core (`VipEntry::departed`); kept as a guard.
#[test]
fn nat_replies_keep_flowing_after_the_server_leaves_the_pool() {
    use cheetah_core::lb::{Worker, WorkerConfig};
    use cheetah_core::tables::ControlPlane;
    use cheetah_core::testkit::{self, options, TcpFrame};
    use cheetah_core::verdict::Verdict;
    use cheetah_core::wire::tcp::flags;

    let config = testkit::config(Mode::Cheetah, Forwarding::Nat, PolicyKind::RoundRobin, 3);
    let mut plane = ControlPlane::new(&config, &harness::SECRET).unwrap();
    let mut worker = Worker::new(
        std::sync::Arc::clone(plane.shared()),
        WorkerConfig::new(0, 1, &config),
    );
    let client = testkit::client_ip(7);
    let reply = || {
        TcpFrame::from_server_nat(
            2,
            client,
            40_000,
            flags::ACK,
            options::nop_nop_ts(0x1234_0000, 1),
        )
        .build()
    };
    assert_eq!(
        worker.process(&mut reply(), NANOS_PER_SEC, Ingress::ServerSide),
        Verdict::ToClient
    );
    plane.leave_pool("10.0.0.100:80", 2).unwrap();
    assert_eq!(
        worker.process(&mut reply(), 2 * NANOS_PER_SEC, Ingress::ServerSide),
        Verdict::ToClient,
        "server 2 left the pool; its existing connections must keep working"
    );
}
