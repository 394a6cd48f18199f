//! Seeds the XDP program's per-CPU policy state (`policy_state`, `policy_rng`), from which
//! the kernel's SYN path (`bpf/lib/fast_path.h` `syn_fast`) runs the VIP policies it holds
//! (`xdp_tables::kernel_policy`) exactly as a core worker runs its instances: each CPU's
//! rr and least-loaded cursors, schedule cursor and wrr credits start where a core
//! worker's instance would (`RoundRobin::new`, `LeastLoaded::new`,
//! `SmoothPicks::for_worker`), and its generator where a worker's
//! `PolicyRng::seed_from_u64` would.
//!
//! A core worker rebuilds a VIP's instance only when the VIP's policy, pool or weights
//! change (`Worker::install`), so cursors and credits carry on across snapshots; the
//! seeder likewise seeds a VIP's state only when those changed at its index, and the
//! generators once; over an earlier run's pinned maps, not even that for the VIPs (and
//! generators) that run left as this one would seed them (`keep_seeded`). A SYN the kernel places while a VIP is being seeded may land its
//! state change on either side of the seeding; either way the pick was one of the pool's.

use cheetah_core::policy::least_loaded::LeastLoaded;
use cheetah_core::policy::random::rng_state;
use cheetah_core::policy::rr::RoundRobin;
use cheetah_core::policy::wrr::SmoothWeights;
use cheetah_core::policy::{PolicyKind, PoolSnapshot};
use cheetah_core::tables::Snapshot;
use cheetah_core::types::ServerId;

use super::xdp::SteeringProgram;
use super::xdp_layout::{PolicyRngState, PolicyState, MAX_HASH_POOL, MAX_VIPS};

/// Which core worker each CPU's policy instances start as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicySeeds {
    /// CPU `c` is worker `c` of the possible CPUs (their cursors start apart, as workers'
    /// do), its generator `PolicyRng::seed_from_u64(rng_seed + c)`.
    PerCpu { rng_seed: u64 },
    /// Every CPU starts as core worker `index` of `workers` with the generator
    /// `PolicyRng::seed_from_u64(rng_seed)`: the kernel then picks what that worker would,
    /// on whichever CPU a packet runs (the parity tests).
    AsWorker {
        index: usize,
        workers: usize,
        rng_seed: u64,
    },
}

impl Default for PolicySeeds {
    fn default() -> Self {
        PolicySeeds::PerCpu { rng_seed: 0 }
    }
}

impl PolicySeeds {
    /// The worker CPU `cpu` of `cpus` stands for, and its generator's seed.
    fn worker(self, cpu: usize, cpus: usize) -> (usize, usize, u64) {
        match self {
            PolicySeeds::PerCpu { rng_seed } => (cpu, cpus, rng_seed.wrapping_add(cpu as u64)),
            PolicySeeds::AsWorker {
                index,
                workers,
                rng_seed,
            } => (index, workers, rng_seed),
        }
    }
}

/// What a VIP's seeded state was made from: a change of any of it reseeds.
#[derive(Clone, PartialEq, Eq)]
struct SeededFrom {
    policy: PolicyKind,
    servers: Vec<ServerId>,
    weights: Vec<u32>,
}

#[derive(Default)]
pub struct PolicySeeder {
    seeds: PolicySeeds,
    /// By VIP index.
    seeded: Vec<Option<SeededFrom>>,
    rng_seeded: bool,
    /// VIP indices whose state an earlier run seeded from what the next call would
    /// (pinned maps, `keep_seeded`): taken as seeded by that call.
    kept: Vec<usize>,
}

/// The state a core worker's instance of `policy` over `pool` starts in (the fields
/// `policy` does not use stay 0).
pub fn initial_state(
    policy: PolicyKind,
    pool: &PoolSnapshot,
    worker: usize,
    workers: usize,
) -> PolicyState {
    let mut state = PolicyState {
        rr_position: 0,
        schedule_cursor: 0,
        wrr_steps: 0,
        wrr_base: [0; MAX_HASH_POOL],
    };
    match policy {
        PolicyKind::RoundRobin => {
            state.rr_position = RoundRobin::new(pool, worker, workers).cursor() as u32;
        }
        // SmoothPicks::for_worker: `worker` entries into the cycle (wrr's when it fits,
        // awrr's always).
        PolicyKind::AutoWeightedRoundRobin => state.schedule_cursor = worker as u32,
        PolicyKind::LeastLoaded => {
            state.rr_position = LeastLoaded::new(worker).cursor() as u32;
        }
        PolicyKind::WeightedRoundRobin => {
            state.schedule_cursor = worker as u32;
            let smooth = SmoothWeights::for_worker(&pool.weights, worker);
            for (base, credit) in state.wrr_base.iter_mut().zip(smooth.credits()) {
                *base = *credit;
            }
        }
        _ => {}
    }
    state
}

impl PolicySeeder {
    pub fn new(seeds: PolicySeeds) -> Self {
        PolicySeeder {
            seeds,
            seeded: Vec::new(),
            rng_seeded: false,
            kept: Vec::new(),
        }
    }

    /// Leaves the state of VIP indices `kept` and, if `generators`, the generators as an
    /// earlier run left them in pinned maps, at the next [`seed`](Self::seed): that run
    /// seeded them from the policy, pool and weights the next call sees.
    pub fn keep_seeded(&mut self, kept: Vec<usize>, generators: bool) {
        self.kept = kept;
        self.rng_seeded |= generators;
    }

    /// Seeds every VIP of `snapshot` whose policy, pool or weights changed at its index
    /// since the last call (all of them the first time), and the generators once.
    pub fn seed(&mut self, program: &SteeringProgram, snapshot: &Snapshot) -> anyhow::Result<()> {
        let cpus = program.possible_cpus()?;
        if !self.rng_seeded {
            let rngs: Vec<PolicyRngState> = (0..cpus)
                .map(|cpu| PolicyRngState {
                    s: rng_state(self.seeds.worker(cpu, cpus).2),
                })
                .collect();
            program.set_policy_rng(&rngs)?;
            self.rng_seeded = true;
        }
        let vips = snapshot.vips.len().min(MAX_VIPS);
        self.seeded.resize(vips, None);
        for (index, vip) in snapshot.vips.iter().take(vips).enumerate() {
            let from = SeededFrom {
                policy: vip.policy,
                servers: vip.pool.servers.clone(),
                weights: vip.pool.weights.clone(),
            };
            if self.seeded[index].as_ref() == Some(&from) {
                continue;
            }
            if self.kept.contains(&index) {
                self.seeded[index] = Some(from);
                continue;
            }
            let states: Vec<PolicyState> = (0..cpus)
                .map(|cpu| {
                    let (worker, workers, _) = self.seeds.worker(cpu, cpus);
                    initial_state(vip.policy, &vip.pool, worker, workers)
                })
                .collect();
            program.set_policy_state(index as u16, &states)?;
            self.seeded[index] = Some(from);
        }
        self.kept.clear();
        Ok(())
    }
}
