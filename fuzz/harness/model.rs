//! The harness's model of the control plane: the tables a config and the input's control
//! actions lead to, published as snapshots far faster than a real `ControlPlane` builds
//! them, and held to one by [`model_matches_control_plane`].

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use cheetah_core::config::{ConfiguredState, Forwarding, LbConfig, Mode};
use cheetah_core::cookie::CookieLayout;
use cheetah_core::hash::FlowHasher;
use cheetah_core::lb::LbShared;
use cheetah_core::policy::{LoadMetric, PolicyKind, PoolSnapshot};
use cheetah_core::tables::{
    AllServers, ControlPlane, ServerSlot, ServerSpec, SlotState, Snapshot, VipEntry,
};
use cheetah_core::testkit;
use cheetah_core::types::{Nanos, ServerId, NANOS_PER_SEC};

use super::input::{Action, Setup};
use super::{MAX_POOLS, REACHABLE_IDS, SECRET};

/// A VIP as the control model keeps it.
#[derive(Clone, Debug)]
pub(super) struct VipModel {
    address: IpAddr,
    port: u16,
    policy: PolicyKind,
    metric: LoadMetric,
    backend_port: u16,
    members: Vec<(ServerId, u32)>,
    /// Servers that left the pool but still serve their connections (NAT replies).
    departed: Vec<ServerId>,
}

/// A small model of the control plane's state, driven by the input's actions.
///
/// Why not a real [`ControlPlane`] per input: every snapshot it publishes builds a
/// 65537-slot Maglev table per VIP, about 10 ms under coverage instrumentation, which
/// held the fuzzer to ~60 executions per second. The model starts from the validated config
/// as `ControlPlane::new` does, and actions change it with the same rules as `ControlPlane` (drain, activate, remove with quarantine, add after
/// expiring, set_policy, leave/join the pool of 10.0.0.100:80, expire), and its snapshots
/// reuse cached pools (and so Maglev tables) keyed by their exact content. Side effects the
/// control plane has on `LbShared` (loads reset on add/remove, M forgotten on add/expire)
/// are applied the same way. [`model_matches_control_plane`] holds the model to a real
/// `ControlPlane`, and the corpus test runs it over many action sequences.
#[derive(Clone, Debug)]
pub(super) struct Model {
    mode: Mode,
    forwarding: Forwarding,
    quarantine: Nanos,
    servers: BTreeMap<ServerId, (ServerSlot, Option<Nanos>)>,
    vips: Vec<VipModel>,
    /// Servers whose clock the last action made the LB forget (an id added or expired):
    /// the harness's [`Clocks`](super::clocks::Clocks) forget them too.
    pub(super) forgotten: Vec<ServerId>,
}

impl Model {
    /// The state a `ControlPlane` starts from for `config` (checked against a real one by
    /// [`model_matches_control_plane`]).
    pub(super) fn from_config(config: &LbConfig) -> Self {
        let (servers, vips) = config.validate().expect("harness configs are valid");
        Model {
            mode: config.mode,
            forwarding: config.forwarding,
            quarantine: config.quarantine_secs * NANOS_PER_SEC,
            servers: servers
                .into_iter()
                .map(|s| {
                    let state = match s.state {
                        ConfiguredState::Active => SlotState::Active,
                        ConfiguredState::Draining => SlotState::Draining,
                    };
                    let slot = ServerSlot {
                        dip: s.dip,
                        mac: s.mac.unwrap_or_default(),
                        state,
                        has_mac: s.mac.is_some(),
                    };
                    (s.id, (slot, None))
                })
                .collect(),
            vips: vips
                .into_iter()
                .map(|v| VipModel {
                    address: v.address,
                    port: v.port,
                    policy: v.policy,
                    metric: v.metric,
                    backend_port: v.backend_port,
                    members: v.members,
                    departed: v.departed,
                })
                .collect(),
            forgotten: Vec::new(),
        }
    }

    pub(super) fn snapshot(
        &self,
        generation: u64,
        pools: &mut PoolCache,
        hasher: &FlowHasher,
    ) -> Snapshot {
        let len = self
            .servers
            .keys()
            .next_back()
            .map_or(0, |id| id.index() + 1);
        let mut slots = vec![ServerSlot::default(); len];
        for (id, (slot, _)) in &self.servers {
            slots[id.index()] = *slot;
        }
        let vips = self
            .vips
            .iter()
            .map(|v| {
                let active: Vec<(ServerId, u32)> = v
                    .members
                    .iter()
                    .copied()
                    .filter(|(id, _)| {
                        self.servers
                            .get(id)
                            .is_some_and(|(s, _)| s.state == SlotState::Active)
                    })
                    .collect();
                VipEntry {
                    address: v.address,
                    port: v.port,
                    policy: v.policy,
                    pool: pools.get(&active, v.metric),
                    members: v.members.clone(),
                    departed: v.departed.clone(),
                    backend_port: v.backend_port,
                }
            })
            .collect();
        Snapshot::new(
            generation,
            self.mode,
            self.forwarding,
            AllServers::from_slots(slots),
            vips,
            hasher,
        )
    }

    pub(super) fn state(&self, id: ServerId) -> Option<SlotState> {
        self.servers.get(&id).map(|(s, _)| s.state)
    }

    /// Applies `action`; returns whether anything changed (the control plane publishes a
    /// snapshot only then) and applies the side effects on `shared`.
    pub(super) fn apply(
        &mut self,
        action: Action,
        server: u16,
        now: Nanos,
        shared: &LbShared,
    ) -> bool {
        let id = ServerId(server);
        match action {
            Action::Drain => match self.state(id) {
                Some(SlotState::Active) => {
                    self.servers.get_mut(&id).unwrap().0.state = SlotState::Draining;
                    true
                }
                _ => false,
            },
            Action::Activate => match self.state(id) {
                Some(SlotState::Active | SlotState::Draining) => {
                    self.servers.get_mut(&id).unwrap().0.state = SlotState::Active;
                    true
                }
                _ => false,
            },
            Action::Remove => match self.state(id) {
                Some(SlotState::Active | SlotState::Draining) => {
                    let entry = self.servers.get_mut(&id).unwrap();
                    entry.0.state = SlotState::Removed;
                    entry.1 = Some(now);
                    for vip in &mut self.vips {
                        vip.members.retain(|(m, _)| *m != id);
                        vip.departed.retain(|m| *m != id);
                    }
                    shared.loads.reset(id);
                    true
                }
                _ => false,
            },
            Action::Add => {
                let expired = self.expire(now, shared);
                if self.servers.contains_key(&id) {
                    return expired;
                }
                let slot = ServerSlot {
                    dip: testkit::server_dip(server),
                    mac: testkit::server_mac(server),
                    state: SlotState::Active,
                    has_mac: true,
                };
                self.servers.insert(id, (slot, None));
                self.vips[0].members.push((id, 1));
                shared.loads.reset(id);
                shared.msb.forget(id);
                self.forgotten.push(id);
                true
            }
            Action::SetPolicy => {
                let policy = PolicyKind::ALL[usize::from(server)];
                self.vips[0].policy = policy;
                self.vips[0].metric = policy.default_metric();
                true
            }
            Action::LeavePool => {
                let before = self.vips[0].members.len();
                self.vips[0].members.retain(|(m, _)| *m != id);
                let left = self.vips[0].members.len() != before;
                if left {
                    self.vips[0].departed.push(id);
                }
                left
            }
            Action::JoinPool => match self.state(id) {
                Some(SlotState::Active | SlotState::Draining)
                    if !self.vips[0].members.iter().any(|(m, _)| *m == id) =>
                {
                    self.vips[0].members.push((id, u32::from(server) + 1));
                    self.vips[0].departed.retain(|m| *m != id);
                    true
                }
                _ => false,
            },
            Action::Expire => self.expire(now, shared),
        }
    }

    pub(super) fn expire(&mut self, now: Nanos, shared: &LbShared) -> bool {
        let quarantine = self.quarantine;
        let expired: Vec<ServerId> = self
            .servers
            .iter()
            .filter(|(_, (_, at))| at.is_some_and(|at| now.saturating_sub(at) >= quarantine))
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            self.servers.remove(id);
            shared.msb.forget(*id);
            self.forgotten.push(*id);
        }
        !expired.is_empty()
    }
}

/// A pool's exact content: active members with weights, and the load metric's index.
pub(super) type PoolKey = (Vec<(ServerId, u32)>, u8);

/// Pools by exact content, so that equal pools share one Maglev table.
#[derive(Default)]
pub(super) struct PoolCache {
    pools: HashMap<PoolKey, Arc<PoolSnapshot>>,
}

impl PoolCache {
    pub(super) fn get(
        &mut self,
        members: &[(ServerId, u32)],
        metric: LoadMetric,
    ) -> Arc<PoolSnapshot> {
        let key = (members.to_vec(), metric_index(metric));
        if let Some(pool) = self.pools.get(&key) {
            return Arc::clone(pool);
        }
        if self.pools.len() >= MAX_POOLS {
            self.pools.clear();
        }
        let pool = Arc::new(PoolSnapshot::new(
            members.iter().map(|m| m.0).collect(),
            members.iter().map(|m| m.1).collect(),
            metric,
            cheetah_core::policy::maglev::DEFAULT_TABLE_SIZE,
        ));
        self.pools.insert(key, Arc::clone(&pool));
        pool
    }
}

pub(super) fn metric_index(metric: LoadMetric) -> u8 {
    match metric {
        LoadMetric::ActiveConnections => 0,
        LoadMetric::Packets => 1,
        LoadMetric::Bytes => 2,
        LoadMetric::Reported => 3,
    }
}

/// Applies the same actions to a real [`ControlPlane`] and to the harness [`Model`], and
/// panics if any published state differs (server slots, VIP policies, members, pools, and
/// the M and load resets). Keeps the fuzzer's fast model honest.
pub fn model_matches_control_plane(setup: Setup, actions: &[(Action, u16, Nanos)]) {
    let config = setup.config();
    let mut plane = ControlPlane::new(&config, &SECRET).expect("harness configs are valid");
    let mut model = Model::from_config(&config);
    let model_shared = LbShared::new(&SECRET, CookieLayout::DEFAULT, Snapshot::empty(), 8);
    let mut pools = PoolCache::default();
    let compare = |plane: &ControlPlane, model: &Model, pools: &mut PoolCache, step: &str| {
        let real = plane.shared().snapshot.load();
        let mine = model.snapshot(real.generation, pools, &model_shared.hasher);
        let slots = |s: &Snapshot| {
            s.servers
                .iter()
                .map(|(id, slot)| (id, *slot))
                .collect::<Vec<_>>()
        };
        assert_eq!(slots(&real), slots(&mine), "{setup:?} servers after {step}");
        assert_eq!(real.vips.len(), mine.vips.len());
        for (a, b) in real.vips.iter().zip(&mine.vips) {
            assert_eq!(
                (
                    a.address,
                    a.port,
                    a.policy,
                    a.backend_port,
                    &a.members,
                    &a.departed
                ),
                (
                    b.address,
                    b.port,
                    b.policy,
                    b.backend_port,
                    &b.members,
                    &b.departed
                ),
                "{setup:?} VIP after {step}"
            );
            assert_eq!(
                (&a.pool.servers, &a.pool.weights, a.pool.metric),
                (&b.pool.servers, &b.pool.weights, b.pool.metric),
                "{setup:?} pool after {step}"
            );
        }
        for id in 0..REACHABLE_IDS {
            let id = ServerId(id);
            assert_eq!(
                plane.shared().msb.get(id),
                model_shared.msb.get(id),
                "{setup:?} M of {id} after {step}"
            );
            assert_eq!(
                plane.shared().loads.server(id),
                model_shared.loads.server(id),
                "{setup:?} loads of {id} after {step}"
            );
        }
    };
    compare(&plane, &model, &mut pools, "start");
    for (i, &(action, server, now)) in actions.iter().enumerate() {
        // Give every reachable id an M and a load, so that forgetting and resets show.
        for id in 0..REACHABLE_IDS {
            let id = ServerId(id);
            let m = [(id, u32::from(7 + id.0) << 16)];
            plane.shared().msb.import(&m, now);
            model_shared.msb.import(&m, now);
            let report = cheetah_core::policy::ReportedLoad {
                load: Some(f64::from(id.0)),
                active_connections: Some(u64::from(id.0)),
            };
            plane.shared().loads.report(id, report).unwrap();
            model_shared.loads.report(id, report).unwrap();
        }
        let vip = format!("{}:{}", Ipv4Addr::from(testkit::VIP), testkit::VIP_PORT);
        let _ = match action {
            Action::Drain => plane.drain_server(server),
            Action::Activate => plane.activate_server(server),
            Action::Remove => plane.remove_server(server, now),
            Action::Add => plane
                .add_server(
                    ServerSpec {
                        id: Some(server),
                        dip: IpAddr::V4(Ipv4Addr::from(testkit::server_dip(server))),
                        mac: Some(cheetah_core::types::format_mac(&testkit::server_mac(
                            server,
                        ))),
                        vips: vec![(vip, 1)],
                        state: ConfiguredState::Active,
                    },
                    now,
                )
                .map(|_| ()),
            Action::SetPolicy => plane.set_policy(&vip, PolicyKind::ALL[usize::from(server)], None),
            Action::LeavePool => plane.leave_pool(&vip, server),
            Action::JoinPool => plane.join_pool(&vip, server, u32::from(server) + 1),
            Action::Expire => {
                plane.expire(now);
                Ok(())
            }
        };
        model.apply(action, server, now, &model_shared);
        compare(
            &plane,
            &model,
            &mut pools,
            &format!("action {i} {action:?}({server}) at {now}"),
        );
    }
}
