//! The load balancers the simulator compares, one model per file.
//!
//! A model decides where a new connection goes ([`LbModel::place`]) and, whenever
//! something it depends on changes (the server pool, the set of LB instances behind ECMP,
//! its own timers or load checks), which active connections its next packet would send to
//! a server other than the one holding the connection: those are *broken* (the paper's
//! PCC violation). A broken connection is reset by the server it now reaches, so the
//! engine ends it.
//!
//! Models never read the clock or an OS RNG: the engine passes `now` and seeded
//! generators, so a run replays exactly.

pub mod beamer;
pub mod bucket_table;
pub mod cheetah;
pub mod faild;
pub mod ring;
pub mod shell;
pub mod stateful;
pub mod stateless;

use cheetah_core::policy::{LoadView, PickContext, Policy, PolicyKind, PolicyRng, PoolSnapshot};
use cheetah_core::{Nanos, ServerId};
use serde::{Deserialize, Serialize};

use crate::conns::{Conn, ConnTable};

/// What a model may look at: the simulated world at one instant.
pub struct World<'a> {
    pub now: Nanos,
    /// Servers taking new connections (the operator's pool), sorted by id. A server
    /// removed from it keeps serving the connections it has.
    pub pool: &'a [ServerId],
    /// Configured weight of each entry of `pool`.
    pub weights: &'a [u32],
    /// Active connections per server id, pool or not.
    pub active: &'a [u32],
    /// Sum of `active` over the pool.
    pub pool_active: u64,
    /// The same counts as the core's policies read them.
    pub loads: &'a LoadView,
    /// LB instances announced behind the first-tier ECMP routers, sorted.
    pub lb_instances: &'a [u8],
}

impl World<'_> {
    /// Average active connections per pool server (0 for an empty pool).
    pub fn average_active(&self) -> f64 {
        if self.pool.is_empty() {
            0.0
        } else {
            self.pool_active as f64 / self.pool.len() as f64
        }
    }

    #[inline]
    pub fn active_of(&self, server: ServerId) -> u32 {
        self.active[server.index()]
    }
}

/// A simulated load balancer.
pub trait LbModel: Send {
    /// Called once with the initial pool, before any connection.
    fn start(&mut self, world: &World);

    /// Picks the server of a new connection; may record model state in `conn.aux`.
    fn place(&mut self, world: &World, rng: &mut PolicyRng, conn: &mut Conn) -> ServerId;

    /// The operator's pool changed (`world.pool` is the new one). Pushes the slot of every
    /// active connection that this change breaks, each once.
    fn pool_changed(&mut self, world: &World, conns: &mut ConnTable, broken: &mut Vec<u32>);

    /// The set of LB instances behind ECMP changed from `old` to `world.lb_instances`.
    /// Stateless models are unaffected: every instance computes the same mapping.
    fn lb_instances_changed(
        &mut self,
        _world: &World,
        _old: &[u8],
        _conns: &mut ConnTable,
        _broken: &mut Vec<u32>,
    ) {
    }

    /// How often [`LbModel::tick`] runs (load merges, imbalance checks), if at all.
    fn tick_interval(&self) -> Option<Nanos> {
        None
    }

    /// Whether the engine should refresh the reported load (`LoadMetric::Reported`,
    /// the servers' own connection counts) before each tick.
    fn uses_reported_load(&self) -> bool {
        false
    }

    fn tick(&mut self, _world: &World, _conns: &mut ConnTable, _broken: &mut Vec<u32>) {}

    /// When the model next needs [`LbModel::timer`] (e.g. a daisy-chain entry expires).
    fn next_timer(&self) -> Option<Nanos> {
        None
    }

    fn timer(&mut self, _world: &World, _conns: &mut ConnTable, _broken: &mut Vec<u32>) {}
}

/// Which load balancer to simulate, as written in a scenario file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", deny_unknown_fields)]
pub enum LbSpec {
    /// Stateless cheetah: `policy` places connections, the cookie keeps them.
    Cheetah { policy: PolicyKind },
    /// Plain hashing (ECMP to the servers): `pool[hash % n]` on every packet.
    Hash,
    /// Maglev consistent hashing without connection state, on every packet.
    Maglev,
    /// Ring consistent hashing (Karger) with `vnodes` points per server, on every packet.
    Ring {
        #[serde(default = "ring_vnodes")]
        vnodes: u32,
    },
    /// Beamer: bucket table with daisy chaining to one previous DIP per bucket.
    Beamer {
        #[serde(default = "beamer_buckets_per_server")]
        buckets_per_server: u32,
        /// How long a bucket keeps its previous DIP; `None` keeps it until the bucket
        /// changes again.
        #[serde(default = "beamer_timeout_s")]
        timeout_s: Option<f64>,
        #[serde(default = "yes")]
        daisy_chaining: bool,
    },
    /// Beamer whose controller takes overloaded servers out of the bucket table
    /// (figure 2c).
    DynamicBeamer {
        /// Relative excess over the average above which a server leaves the table.
        threshold: f64,
        #[serde(default = "dynamic_check_interval_ms")]
        check_interval_ms: f64,
        #[serde(default = "beamer_buckets_per_server")]
        buckets_per_server: u32,
        #[serde(default = "beamer_timeout_s")]
        timeout_s: Option<f64>,
    },
    /// Faild: ECMP next-hop entries with one failover host each, no recursive draining.
    Faild {
        #[serde(default = "faild_entries_per_server")]
        entries_per_server: u32,
    },
    /// SHELL: consistent-hashing candidates and a history matrix of depth `depth`.
    Shell {
        #[serde(default = "shell_buckets")]
        buckets: u32,
        #[serde(default = "shell_choices")]
        choices: u32,
        #[serde(default = "shell_depth")]
        depth: u32,
    },
    /// Stateful LB instances (Katran / Maglev style) behind ECMP: a connection table per
    /// instance, Maglev for new connections and for packets an instance has no state for.
    Stateful,
}

fn yes() -> bool {
    true
}
/// Places a new connection with one of the core's policies, exactly as a worker does.
pub fn pick_with(
    policy: &mut dyn Policy,
    pool: &PoolSnapshot,
    world: &World,
    rng: &mut PolicyRng,
    flow_hash: u64,
) -> ServerId {
    let mut ctx = PickContext {
        pool,
        flow_hash,
        loads: world.loads,
        rng,
        now: world.now,
    };
    policy.pick(&mut ctx).expect("the pool is never empty")
}

pub fn beamer_buckets_per_server() -> u32 {
    100
}
pub fn beamer_timeout_s() -> Option<f64> {
    Some(240.0)
}
pub fn dynamic_check_interval_ms() -> f64 {
    100.0
}
pub fn ring_vnodes() -> u32 {
    100
}
pub fn faild_entries_per_server() -> u32 {
    8
}
pub fn shell_buckets() -> u32 {
    35_591
}
pub fn shell_choices() -> u32 {
    2
}
pub fn shell_depth() -> u32 {
    2
}

impl LbSpec {
    /// The short name used in CSVs, plots and `--lb`.
    pub fn name(&self) -> String {
        match self {
            LbSpec::Cheetah { policy } => format!("cheetah-{}", policy.name()),
            LbSpec::Hash => "hash".into(),
            LbSpec::Maglev => "maglev".into(),
            LbSpec::Ring { vnodes } => format!("ring-v{vnodes}"),
            LbSpec::Beamer {
                daisy_chaining: false,
                ..
            } => "beamer-no-daisy".into(),
            LbSpec::Beamer {
                timeout_s: None, ..
            } => "beamer-no-timeout".into(),
            LbSpec::Beamer { .. } => "beamer".into(),
            LbSpec::DynamicBeamer { .. } => "dynamic-beamer".into(),
            LbSpec::Faild { .. } => "faild".into(),
            LbSpec::Shell { depth, .. } => format!("shell-h{depth}"),
            LbSpec::Stateful => "stateful-maglev".into(),
        }
    }

    /// Parses a short name (`--lb`), with default parameters.
    pub fn from_name(name: &str) -> Option<LbSpec> {
        if let Some(policy) = name.strip_prefix("cheetah-") {
            return policy.parse().ok().map(|policy| LbSpec::Cheetah { policy });
        }
        let beamer = |timeout_s, daisy_chaining| LbSpec::Beamer {
            buckets_per_server: beamer_buckets_per_server(),
            timeout_s,
            daisy_chaining,
        };
        Some(match name {
            "hash" => LbSpec::Hash,
            "maglev" => LbSpec::Maglev,
            "beamer" => beamer(beamer_timeout_s(), true),
            "beamer-no-timeout" => beamer(None, true),
            "beamer-no-daisy" => beamer(beamer_timeout_s(), false),
            "faild" => LbSpec::Faild {
                entries_per_server: faild_entries_per_server(),
            },
            "stateful-maglev" => LbSpec::Stateful,
            "dynamic-beamer" => LbSpec::DynamicBeamer {
                threshold: 0.1,
                check_interval_ms: dynamic_check_interval_ms(),
                buckets_per_server: beamer_buckets_per_server(),
                timeout_s: beamer_timeout_s(),
            },
            _ if name.starts_with("ring-v") => LbSpec::Ring {
                vnodes: name.strip_prefix("ring-v")?.parse().ok()?,
            },
            _ => {
                let depth = name.strip_prefix("shell-h")?.parse().ok()?;
                LbSpec::Shell {
                    buckets: shell_buckets(),
                    choices: shell_choices(),
                    depth,
                }
            }
        })
    }

    /// Builds the model for a cluster that starts with `servers` servers.
    pub fn build(&self, servers: usize) -> Box<dyn LbModel> {
        let servers = servers.max(1) as u32;
        match *self {
            LbSpec::Cheetah { policy } => Box::new(cheetah::Cheetah::new(policy)),
            LbSpec::Hash => Box::new(stateless::Stateless::new(PolicyKind::Hash)),
            LbSpec::Maglev => Box::new(stateless::Stateless::new(PolicyKind::Maglev)),
            LbSpec::Ring { vnodes } => Box::new(ring::Ring::new(vnodes)),
            LbSpec::Beamer {
                buckets_per_server,
                timeout_s,
                daisy_chaining,
            } => Box::new(beamer::Beamer::new(
                buckets_per_server * servers,
                timeout_s.map(crate::workload::secs),
                daisy_chaining,
            )),
            LbSpec::DynamicBeamer {
                threshold,
                check_interval_ms,
                buckets_per_server,
                timeout_s,
            } => Box::new(beamer::DynamicBeamer::new(
                buckets_per_server * servers,
                timeout_s.map(crate::workload::secs),
                threshold,
                crate::workload::secs(check_interval_ms / 1e3),
            )),
            LbSpec::Faild { entries_per_server } => {
                Box::new(faild::faild(entries_per_server * servers))
            }
            LbSpec::Shell {
                buckets,
                choices,
                depth,
            } => Box::new(shell::Shell::new(buckets, choices, depth)),
            LbSpec::Stateful => Box::new(stateful::StatefulMaglev::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let specs = [
            LbSpec::Cheetah {
                policy: PolicyKind::PowerOfTwo,
            },
            LbSpec::Hash,
            LbSpec::Maglev,
            LbSpec::Ring { vnodes: 100 },
            LbSpec::from_name("beamer").unwrap(),
            LbSpec::from_name("beamer-no-daisy").unwrap(),
            LbSpec::from_name("beamer-no-timeout").unwrap(),
            LbSpec::from_name("faild").unwrap(),
            LbSpec::from_name("shell-h3").unwrap(),
            LbSpec::Stateful,
            LbSpec::from_name("dynamic-beamer").unwrap(),
        ];
        for spec in specs {
            assert_eq!(
                LbSpec::from_name(&spec.name()),
                Some(spec.clone()),
                "{spec:?}"
            );
        }
    }
}
