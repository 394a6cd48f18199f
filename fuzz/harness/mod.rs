//! The pipeline fuzz harness, shared by the `pipeline` cargo-fuzz target and by the stable
//! `cargo test` that replays the committed corpus (`crates/core/tests/fuzz_corpus.rs`).
//!
//! Both include this module with `#[path = ...] mod harness;` so that a corpus file checked
//! on stable is checked by exactly the logic and invariants the fuzzer ran it under; a copy
//! would drift. It only uses the public API of `cheetah-core`.
//!
//! * `input.rs`: the input format and its decoding into a config, packets and control actions;
//! * `model.rs`: the harness's own model of the control plane, which publishes snapshots
//!   far faster than a real `ControlPlane` (and is held to one by
//!   `model_matches_control_plane`);
//! * `clocks.rs`: the harness's own account of each server's timestamp clock;
//! * `checks.rs`: the invariants every verdict must keep.
//!
//! Every packet is processed with a strictly increasing `now`, and every verdict is checked
//! against the invariants in `checks.rs`. A violation panics, which is what the fuzzer and
//! the corpus test look for.

#![allow(dead_code)]

pub mod checks;
pub mod clocks;
pub mod input;
pub mod model;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use cheetah_core::config::LbConfig;
use cheetah_core::cookie::CookieLayout;
use cheetah_core::hash::Secret;
use cheetah_core::lb::{LbShared, Worker, WorkerConfig};
use cheetah_core::tables::Snapshot;
use cheetah_core::types::{Nanos, ServerId, NANOS_PER_SEC};

use checks::{process_and_check, Checks};
use clocks::Clocks;
use input::{parse, Record, Setup};
use model::{Model, PoolCache};

/// Fixed secret: the harness must be deterministic, and a secret does not change code paths.
pub const SECRET: Secret = Secret([
    0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2, 0xe1, 0xf0,
]);

/// Plans kept at most per process; past that the cache starts over (memory stays small
/// because plans share their pools through [`Cache::pools`]).
const MAX_SETUPS: usize = 4096;
const MAX_POOLS: usize = 4096;

/// Per-process state reused across inputs, because building it per input would cost far
/// more than running the input (see [`Model`]; `LbShared` also holds tables for all
/// 32768 ids).
///
/// Reuse must not make a run depend on earlier inputs, or crashes would not reproduce:
/// the cached models and pools are pure functions of their keys, and `run` resets every id
/// the input can reach in the shared MSB and load tables, clears the handshake and fallback
/// tables and the close filter, then publishes a fresh snapshot under a new generation
/// before creating fresh workers.
struct Cache {
    shared: Arc<LbShared>,
    generation: u64,
    setups: HashMap<[u8; 2], (LbConfig, Model)>,
    pools: PoolCache,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache {
        // Small handshake and fallback tables and close filter, cleared per input in a few stores.
        shared: Arc::new(LbShared::with_table_sizes(&SECRET, CookieLayout::DEFAULT, Snapshot::empty(), 64, FALLBACK_CAPACITY)),
        generation: 0,
        setups: HashMap::new(),
        pools: PoolCache::default(),
    });
}

/// The shared fallback table's size in the harness: a few sets, so that inputs fill them
/// and evict, and clearing it per input costs little.
const FALLBACK_CAPACITY: usize = 64;

/// Server ids an input can reach: configured ones, added ones and imported MSBs use 0..=7.
const REACHABLE_IDS: u16 = 8;

/// Runs one fuzz input. Panics on any invariant violation (and on any panic in the core).
pub fn run(data: &[u8]) {
    run_with(data, Checks::FUZZ)
}

/// [`run`] with every invariant enforced, known open bugs included.
pub fn run_strict(data: &[u8]) {
    run_with(data, Checks::STRICT)
}

pub fn run_with(data: &[u8], checks: Checks) {
    let [config_byte, servers_byte, records @ ..] = data else {
        return;
    };
    let setup = Setup::decode(*config_byte, *servers_byte);
    let (records, actions) = parse(records);
    CACHE.with(|cache| {
        let cache = &mut *cache.borrow_mut();
        let key = [*config_byte, *servers_byte];
        if !cache.setups.contains_key(&key) {
            if cache.setups.len() >= MAX_SETUPS {
                cache.setups.clear();
            }
            let config = setup.config();
            let model = Model::from_config(&config);
            cache.setups.insert(key, (config, model));
        }
        let (config, model) = &cache.setups[&key];
        let (config, mut model) = (config.clone(), model.clone());
        let shared = Arc::clone(&cache.shared);
        for id in 0..REACHABLE_IDS {
            shared.msb.forget(ServerId(id));
            shared.loads.reset(ServerId(id));
        }
        shared.handshakes.clear();
        shared.fallback.clear();
        shared.closes.clear();
        cache.generation += 1;
        shared
            .snapshot
            .publish(model.snapshot(cache.generation, &mut cache.pools, &shared.hasher));
        let worker_count = if setup.two_workers { 2 } else { 1 };
        let mut clocks = Clocks::new(shared.layout());
        let mut refreshed: Nanos = 0;
        let mut workers: Vec<Worker> = (0..worker_count)
            .map(|i| {
                Worker::new(
                    Arc::clone(&shared),
                    WorkerConfig::new(i, worker_count, &config),
                )
            })
            .collect();
        for record in records {
            match record {
                Record::Packet {
                    worker,
                    now,
                    ingress,
                    bytes,
                } => {
                    // As the daemon does every second: carry every M^ forward with LB time.
                    if now - refreshed >= NANOS_PER_SEC {
                        shared.msb.refresh(now);
                        clocks.refresh(now);
                        refreshed = now;
                    }
                    process_and_check(
                        &mut workers[worker % worker_count],
                        bytes,
                        now,
                        ingress,
                        checks,
                        &mut clocks,
                    );
                }
                Record::Control(index) => {
                    let (action, server, now) = actions[index];
                    let changed = model.apply(action, server, now, &shared);
                    for id in model.forgotten.drain(..) {
                        clocks.forget(id);
                    }
                    if changed {
                        cache.generation += 1;
                        shared.snapshot.publish(model.snapshot(
                            cache.generation,
                            &mut cache.pools,
                            &shared.hasher,
                        ));
                    }
                }
                Record::Msb(id, msb, now) => {
                    let tsval = u32::from(msb) << 16;
                    shared.msb.import(&[(id, tsval)], now);
                    clocks.import(id, tsval, now);
                }
                Record::Load(id, report) => {
                    shared
                        .loads
                        .report(id, report)
                        .expect("finite, non-negative load");
                }
            }
        }
    });
}
