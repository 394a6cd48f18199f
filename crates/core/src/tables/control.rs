//! The control plane: owns the desired tables, applies operator changes, publishes snapshots.
//!
//! Every change is validated against the whole resulting state before anything is
//! published; a refused change leaves the running tables exactly as they were.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::servers::{AllServers, ServerSlot, SlotState};
use super::snapshot::{Snapshot, VipEntry};
use crate::config::{
    self, ConfigError, ConfiguredState, Forwarding, LbConfig, Mode, NatBackends, ServerConfig,
    ValidVip,
};
use crate::cookie::CookieLayout;
use crate::hash::Secret;
use crate::lb::shared::LbShared;
use crate::policy::{LoadMetric, PolicyKind, PoolSnapshot, ReportedLoad};
use crate::types::{format_mac, Mac, Nanos, ServerId, NANOS_PER_SEC};

/// A refused control request. `Invalid` names the field; the daemon maps the kinds to 400,
/// 404 and 409.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlError {
    Invalid(ConfigError),
    NotFound(String),
    Conflict(String),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::Invalid(e) => write!(f, "{e}"),
            ControlError::NotFound(what) | ControlError::Conflict(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for ControlError {}

impl From<ConfigError> for ControlError {
    fn from(e: ConfigError) -> Self {
        ControlError::Invalid(e)
    }
}

/// A server to add at run time.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerSpec {
    /// Requested id; the lowest free id if `None`.
    pub id: Option<u16>,
    pub dip: IpAddr,
    pub mac: Option<String>,
    /// VIPs (`address:port`) to join, with a weight.
    pub vips: Vec<(String, u32)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct ServerRecord {
    dip: u32,
    mac: Option<Mac>,
    state: SlotState,
    /// For a removed server: when its id may be given to another server. A deadline rather
    /// than the removal time, so a quarantine restored after a restart can have begun
    /// before this process's clock started.
    quarantine_until: Option<Nanos>,
}

/// How a server looks from the control API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    pub id: ServerId,
    pub dip: Ipv4Addr,
    pub mac: Option<String>,
    pub state: SlotState,
    /// Seconds of quarantine left for a removed server.
    pub quarantine_left_secs: Option<u64>,
}

/// The control plane's tables as data: what a daemon saves so that runtime changes (servers
/// added, drained or removed, pools, policies, weights) and quarantines survive a restart.
///
/// Produced by [`ControlPlane::export`]; [`ControlPlane::restore`] validates it as a whole
/// before publishing anything, like every other change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlState {
    pub servers: Vec<SavedServer>,
    pub vips: Vec<SavedVip>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedServer {
    pub id: u16,
    pub dip: IpAddr,
    #[serde(default)]
    pub mac: Option<String>,
    pub state: SavedServerState,
    /// For a removed server: seconds of quarantine left when the state was exported,
    /// rounded up. The daemon subtracts the time that passed before the restore.
    #[serde(default)]
    pub quarantine_left_secs: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SavedServerState {
    Active,
    Draining,
    /// Removed and still quarantined.
    Removed,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedVip {
    pub address: IpAddr,
    pub port: u16,
    pub policy: PolicyKind,
    pub metric: LoadMetric,
    pub backend_port: u16,
    /// Pool members in pool order.
    pub members: Vec<SavedMember>,
    /// Servers that left the pool but are not removed.
    #[serde(default)]
    pub departed: Vec<u16>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedMember {
    pub id: u16,
    pub weight: u32,
}

/// What [`ControlPlane::restore_quarantine`] did with the removed servers of a saved state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuarantineRestore {
    /// Ids quarantined again, with the seconds left.
    pub kept: Vec<(u16, u64)>,
    /// Ids that were quarantined but that the config now defines: the config wins.
    pub overridden: Vec<u16>,
}

pub struct ControlPlane {
    mode: Mode,
    forwarding: Forwarding,
    quarantine: Nanos,
    servers: BTreeMap<ServerId, ServerRecord>,
    vips: Vec<ValidVip>,
    generation: u64,
    shared: Arc<LbShared>,
    config: LbConfig,
}

impl ControlPlane {
    /// Validates `config` and publishes its first snapshot.
    pub fn new(config: &LbConfig, secret: &Secret) -> Result<Self, ConfigError> {
        let (servers, vips) = config.validate()?;
        let servers = servers
            .into_iter()
            .map(|s| {
                let state = match s.state {
                    ConfiguredState::Active => SlotState::Active,
                    ConfiguredState::Draining => SlotState::Draining,
                };
                (
                    s.id,
                    ServerRecord {
                        dip: s.dip,
                        mac: s.mac,
                        state,
                        quarantine_until: None,
                    },
                )
            })
            .collect();
        Ok(Self::publish_first(config, secret, servers, vips))
    }

    fn publish_first(
        config: &LbConfig,
        secret: &Secret,
        servers: BTreeMap<ServerId, ServerRecord>,
        vips: Vec<ValidVip>,
    ) -> Self {
        let mut plane = ControlPlane {
            mode: config.mode,
            forwarding: config.forwarding,
            quarantine: config.quarantine_secs.saturating_mul(NANOS_PER_SEC),
            servers,
            vips,
            generation: 0,
            shared: Arc::new(LbShared::new(
                secret,
                config.cookie_layout().expect("validated"),
                Snapshot::empty(),
                config.fallback_table_capacity,
            )),
            config: config.clone(),
        };
        let first = plane.build(1);
        plane.shared.snapshot.publish(first);
        plane.generation = 1;
        plane
    }

    /// The current tables as data, quarantines as seconds left at `now`.
    pub fn export(&self, now: Nanos) -> ControlState {
        let servers = self
            .servers
            .iter()
            .map(|(id, r)| SavedServer {
                id: id.0,
                dip: IpAddr::V4(Ipv4Addr::from(r.dip)),
                mac: r.mac.as_ref().map(format_mac),
                state: match r.state {
                    SlotState::Draining => SavedServerState::Draining,
                    SlotState::Removed => SavedServerState::Removed,
                    SlotState::Active | SlotState::Free => SavedServerState::Active,
                },
                quarantine_left_secs: r
                    .quarantine_until
                    .map(|until| until.saturating_sub(now).div_ceil(NANOS_PER_SEC)),
            })
            .collect();
        let vips = self
            .vips
            .iter()
            .map(|v| SavedVip {
                address: v.address,
                port: v.port,
                policy: v.policy,
                metric: v.metric,
                backend_port: v.backend_port,
                members: v
                    .members
                    .iter()
                    .map(|(id, weight)| SavedMember {
                        id: id.0,
                        weight: *weight,
                    })
                    .collect(),
                departed: v.departed.iter().map(|id| id.0).collect(),
            })
            .collect();
        ControlState { servers, vips }
    }

    /// Builds a control plane whose tables are `saved` (servers, pools, policies, weights,
    /// quarantines) rather than the config's; mode, forwarding, quarantine length and table
    /// sizes still come from `config`. The saved tables are validated as a whole, like any
    /// change (errors name the field, e.g. `vips[0].members[1].weight`); nothing is
    /// published unless all of it is valid.
    ///
    /// A removed server's quarantine resumes with the seconds it had left, capped at the
    /// config's `quarantine_secs`; one with no time left is freed.
    pub fn restore(
        config: &LbConfig,
        secret: &Secret,
        saved: &ControlState,
        now: Nanos,
    ) -> Result<Self, ControlError> {
        // The config's own sections must still be valid (the daemon checks it anyway).
        config.validate()?;
        let layout = config.cookie_layout()?;
        let quarantine = config.quarantine_secs.saturating_mul(NANOS_PER_SEC);
        let mut servers = BTreeMap::new();
        for (i, s) in saved.servers.iter().enumerate() {
            let field = format!("servers[{i}]");
            let (record, id) = match s.state {
                SavedServerState::Removed => {
                    let left = s.quarantine_left_secs.ok_or_else(|| {
                        ConfigError::new(
                            format!("{field}.quarantine_left_secs"),
                            "a removed server needs its quarantine time",
                        )
                    })?;
                    let (id, record) = quarantined_record(s, &field, layout)?;
                    if left == 0 {
                        continue;
                    }
                    let record = ServerRecord {
                        quarantine_until: Some(
                            now.saturating_add(left.saturating_mul(NANOS_PER_SEC).min(quarantine)),
                        ),
                        ..record
                    };
                    (record, id)
                }
                state => {
                    let valid = config::validate_server(
                        &ServerConfig {
                            id: s.id,
                            dip: s.dip,
                            mac: s.mac.clone(),
                            state: ConfiguredState::Active,
                        },
                        &field,
                        config.forwarding,
                        layout,
                    )?;
                    let record = ServerRecord {
                        dip: valid.dip,
                        mac: valid.mac,
                        state: if state == SavedServerState::Draining {
                            SlotState::Draining
                        } else {
                            SlotState::Active
                        },
                        quarantine_until: None,
                    };
                    (record, valid.id)
                }
            };
            if servers.insert(id, record).is_some() {
                return Err(ConfigError::new(
                    format!("{field}.id"),
                    format!("server id {} is saved twice", s.id),
                )
                .into());
            }
        }
        let mut vips: Vec<ValidVip> = Vec::with_capacity(saved.vips.len());
        for (i, v) in saved.vips.iter().enumerate() {
            vips.push(restore_vip(v, &format!("vips[{i}]"), &servers)?);
            if vips[..i]
                .iter()
                .any(|other| other.address == v.address && other.port == v.port)
            {
                return Err(ConfigError::new(
                    format!("vips[{i}].port"),
                    format!("VIP {}:{} is saved twice", v.address, v.port),
                )
                .into());
            }
        }
        let draft = Draft { servers, vips };
        draft.check(config.forwarding)?;
        Ok(Self::publish_first(
            config,
            secret,
            draft.servers,
            draft.vips,
        ))
    }

    /// Quarantines again the removed servers of `saved` that still have time left, for a
    /// plane built from a config that replaced the saved tables: ids removed before the
    /// restart must not be given to new servers early. An id the config now defines is
    /// left to the config (reported in `overridden`). Remaining times are capped at the
    /// config's `quarantine_secs`.
    pub fn restore_quarantine(
        &mut self,
        saved: &ControlState,
        now: Nanos,
    ) -> Result<QuarantineRestore, ControlError> {
        let mut report = QuarantineRestore::default();
        let mut next = self.clone_state();
        for (i, s) in saved.servers.iter().enumerate() {
            let left = match (s.state, s.quarantine_left_secs) {
                (SavedServerState::Removed, Some(left)) if left > 0 => {
                    left.saturating_mul(NANOS_PER_SEC).min(self.quarantine)
                }
                _ => continue,
            };
            let (id, record) = quarantined_record(s, &format!("servers[{i}]"), self.layout())?;
            if next.servers.contains_key(&id) {
                report.overridden.push(id.0);
                continue;
            }
            next.servers.insert(
                id,
                ServerRecord {
                    quarantine_until: Some(now.saturating_add(left)),
                    ..record
                },
            );
            report.kept.push((id.0, left.div_ceil(NANOS_PER_SEC)));
        }
        if !report.kept.is_empty() {
            self.commit(next)?;
        }
        Ok(report)
    }

    pub fn shared(&self) -> &Arc<LbShared> {
        &self.shared
    }

    /// The settings this LB started with (mode, forwarding, table sizes).
    pub fn config(&self) -> &LbConfig {
        &self.config
    }

    /// The cookie layout every snapshot of this plane encodes with.
    pub fn layout(&self) -> CookieLayout {
        self.shared.msb.layout()
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn servers(&self, now: Nanos) -> Vec<ServerInfo> {
        self.servers
            .iter()
            .map(|(id, r)| ServerInfo {
                id: *id,
                dip: Ipv4Addr::from(r.dip),
                mac: r.mac.as_ref().map(format_mac),
                state: r.state,
                quarantine_left_secs: r
                    .quarantine_until
                    .map(|until| until.saturating_sub(now).div_ceil(NANOS_PER_SEC)),
            })
            .collect()
    }

    pub fn vips(&self) -> &[ValidVip] {
        &self.vips
    }

    /// Adds a server (and makes it join the VIPs listed).
    pub fn add_server(&mut self, spec: ServerSpec, now: Nanos) -> Result<ServerId, ControlError> {
        self.expire(now);
        let id = match spec.id {
            Some(id) => {
                let sid = config::server_id(id, self.layout())
                    .map_err(|problem| ConfigError::new("id", problem))?;
                if let Some(record) = self.servers.get(&sid) {
                    return Err(ControlError::Conflict(match record.quarantine_until {
                        Some(until) => format!(
                            "server id {id} was removed and is quarantined for another {} s, so that late packets carrying its cookie cannot reach a new server",
                            until.saturating_sub(now).div_ceil(NANOS_PER_SEC)
                        ),
                        None => format!("server id {id} is already in use"),
                    }));
                }
                sid
            }
            None => (0..=self.layout().max_server_id())
                .map(ServerId)
                .find(|id| !self.servers.contains_key(id))
                .ok_or_else(|| {
                    ControlError::Conflict(format!(
                        "all {} server ids of the cookie layout are in use or quarantined",
                        self.layout().server_ids()
                    ))
                })?,
        };
        let valid = config::validate_server(
            &ServerConfig {
                id: id.0,
                dip: spec.dip,
                mac: spec.mac.clone(),
                state: ConfiguredState::Active,
            },
            "server",
            self.forwarding,
            self.layout(),
        )?;
        let mut next = self.clone_state();
        next.servers.insert(
            id,
            ServerRecord {
                dip: valid.dip,
                mac: valid.mac,
                state: SlotState::Active,
                quarantine_until: None,
            },
        );
        for (i, (vip, weight)) in spec.vips.iter().enumerate() {
            let index = next
                .find_vip(vip)
                .map_err(|e| prefix(e, &format!("vips[{i}]")))?;
            if *weight == 0 {
                return Err(ConfigError::new(
                    format!("vips[{i}].weight"),
                    "weight must be at least 1",
                )
                .into());
            }
            next.vips[index].members.push((id, *weight));
        }
        self.commit(next)?;
        // A reused id must not inherit the previous holder's load or clock.
        self.shared.loads.reset(id);
        self.shared.msb.forget(id);
        Ok(id)
    }

    /// Stops new connections to `id`; its existing connections keep going.
    pub fn drain_server(&mut self, id: u16) -> Result<(), ControlError> {
        let sid = self.existing(id)?;
        let mut next = self.clone_state();
        let record = next.servers.get_mut(&sid).unwrap();
        match record.state {
            SlotState::Active => record.state = SlotState::Draining,
            SlotState::Draining => return Ok(()),
            _ => return Err(ControlError::Conflict(format!("server {id} is removed"))),
        }
        self.commit(next)
    }

    /// Puts a draining server back into service.
    pub fn activate_server(&mut self, id: u16) -> Result<(), ControlError> {
        let sid = self.existing(id)?;
        let mut next = self.clone_state();
        let record = next.servers.get_mut(&sid).unwrap();
        if record.state == SlotState::Removed {
            return Err(ControlError::Conflict(format!(
                "server {id} is removed; add it again after its quarantine"
            )));
        }
        record.state = SlotState::Active;
        self.commit(next)
    }

    /// Retires `id`: packets carrying its cookie are dropped from now on, and the id is
    /// quarantined before it can be given to another server.
    pub fn remove_server(&mut self, id: u16, now: Nanos) -> Result<(), ControlError> {
        let sid = self.existing(id)?;
        let mut next = self.clone_state();
        let record = next.servers.get_mut(&sid).unwrap();
        if record.state == SlotState::Removed {
            return Ok(());
        }
        record.state = SlotState::Removed;
        record.quarantine_until = Some(now.saturating_add(self.quarantine));
        for vip in &mut next.vips {
            vip.members.retain(|(m, _)| *m != sid);
            vip.departed.retain(|m| *m != sid);
        }
        self.commit(next)?;
        self.shared.loads.reset(sid);
        Ok(())
    }

    /// Frees ids whose quarantine is over; returns how many.
    pub fn expire(&mut self, now: Nanos) -> usize {
        let expired: Vec<ServerId> = self
            .servers
            .iter()
            .filter(|(_, r)| r.quarantine_until.is_some_and(|until| now >= until))
            .map(|(id, _)| *id)
            .collect();
        if expired.is_empty() {
            return 0;
        }
        let mut next = self.clone_state();
        for id in &expired {
            next.servers.remove(id);
        }
        self.commit(next)
            .expect("freeing quarantined ids cannot invalidate the tables");
        for id in &expired {
            self.shared.msb.forget(*id);
        }
        expired.len()
    }

    pub fn set_policy(
        &mut self,
        vip: &str,
        policy: PolicyKind,
        metric: Option<LoadMetric>,
    ) -> Result<(), ControlError> {
        let mut next = self.clone_state();
        let index = next.find_vip(vip)?;
        next.vips[index].policy = policy;
        next.vips[index].metric = metric.unwrap_or_else(|| policy.default_metric());
        self.commit(next)
    }

    /// Sets weights of pool members of `vip` (others keep theirs).
    pub fn set_weights(&mut self, vip: &str, weights: &[(u16, u32)]) -> Result<(), ControlError> {
        let mut next = self.clone_state();
        let index = next.find_vip(vip)?;
        for (i, (id, weight)) in weights.iter().enumerate() {
            if *weight == 0 {
                return Err(ConfigError::new(
                    format!("weights[{i}]"),
                    "weight must be at least 1 (drain the server to stop new connections)",
                )
                .into());
            }
            let member = next.vips[index]
                .members
                .iter_mut()
                .find(|(m, _)| m.0 == *id)
                .ok_or_else(|| {
                    ConfigError::new(
                        format!("weights[{i}]"),
                        format!("server {id} is not in the pool of {vip}"),
                    )
                })?;
            member.1 = *weight;
        }
        self.commit(next)
    }

    /// Adds an existing server to a VIP's pool.
    pub fn join_pool(&mut self, vip: &str, id: u16, weight: u32) -> Result<(), ControlError> {
        let sid = self.existing(id)?;
        let mut next = self.clone_state();
        let index = next.find_vip(vip)?;
        if next.servers[&sid].state == SlotState::Removed {
            return Err(ControlError::Conflict(format!("server {id} is removed")));
        }
        if next.vips[index].members.iter().any(|(m, _)| *m == sid) {
            return Err(ControlError::Conflict(format!(
                "server {id} is already in the pool of {vip}"
            )));
        }
        if weight == 0 {
            return Err(ConfigError::new("weight", "weight must be at least 1").into());
        }
        next.vips[index].members.push((sid, weight));
        next.vips[index].departed.retain(|m| *m != sid);
        self.commit(next)
    }

    /// Takes a server out of one VIP's pool; connections it has keep going (cookies name
    /// the server, not the pool).
    pub fn leave_pool(&mut self, vip: &str, id: u16) -> Result<(), ControlError> {
        let sid = self.existing(id)?;
        let mut next = self.clone_state();
        let index = next.find_vip(vip)?;
        let before = next.vips[index].members.len();
        next.vips[index].members.retain(|(m, _)| *m != sid);
        if next.vips[index].members.len() == before {
            return Err(ControlError::NotFound(format!(
                "server {id} is not in the pool of {vip}"
            )));
        }
        next.vips[index].departed.push(sid);
        self.commit(next)
    }

    /// Records a load report for `id` (CPU or the server's own connection count).
    pub fn report_load(&self, id: u16, report: ReportedLoad) -> Result<(), ControlError> {
        let sid = self.existing(id)?;
        self.shared
            .loads
            .report(sid, report)
            .map_err(|e| ControlError::Invalid(ConfigError::new("load", e.to_string())))
    }

    fn existing(&self, id: u16) -> Result<ServerId, ControlError> {
        ServerId::new(id)
            .filter(|sid| self.servers.contains_key(sid))
            .ok_or_else(|| ControlError::NotFound(format!("server {id} does not exist")))
    }

    fn clone_state(&self) -> Draft {
        Draft {
            servers: self.servers.clone(),
            vips: self.vips.clone(),
        }
    }

    fn commit(&mut self, draft: Draft) -> Result<(), ControlError> {
        draft.check(self.forwarding)?;
        self.servers = draft.servers;
        self.vips = draft.vips;
        self.generation += 1;
        let snapshot = self.build(self.generation);
        self.shared.snapshot.publish(snapshot);
        Ok(())
    }

    fn build(&self, generation: u64) -> Snapshot {
        let len = self
            .servers
            .keys()
            .next_back()
            .map_or(0, |id| id.index() + 1);
        let mut slots = vec![ServerSlot::default(); len];
        for (id, r) in &self.servers {
            slots[id.index()] = ServerSlot {
                dip: r.dip,
                mac: r.mac.unwrap_or_default(),
                state: r.state,
                has_mac: r.mac.is_some(),
            };
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
                            .is_some_and(|r| r.state == SlotState::Active)
                    })
                    .collect();
                VipEntry {
                    address: v.address,
                    port: v.port,
                    policy: v.policy,
                    pool: Arc::new(PoolSnapshot::new(
                        active.iter().map(|m| m.0).collect(),
                        active.iter().map(|m| m.1).collect(),
                        v.metric,
                        self.config.maglev_table_size,
                    )),
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
            &self.shared.hasher,
        )
    }
}

/// A candidate state, checked as a whole before it replaces the current one.
struct Draft {
    servers: BTreeMap<ServerId, ServerRecord>,
    vips: Vec<ValidVip>,
}

impl Draft {
    fn find_vip(&self, key: &str) -> Result<usize, ControlError> {
        let (address, port) = parse_vip_key(key)?;
        self.vips
            .iter()
            .position(|v| v.address == address && v.port == port)
            .ok_or_else(|| ControlError::NotFound(format!("VIP {key} does not exist")))
    }

    fn check(&self, forwarding: Forwarding) -> Result<(), ControlError> {
        if forwarding == Forwarding::Nat {
            let mut backends = NatBackends::default();
            for (i, vip) in self.vips.iter().enumerate() {
                for id in vip.members.iter().map(|m| &m.0).chain(&vip.departed) {
                    let dip = self.servers[id].dip;
                    if let Err(other) = backends.claim(dip, vip.backend_port, i) {
                        return Err(ControlError::Conflict(format!(
                            "in nat mode {}:{} would serve both {}:{} and {}:{}",
                            Ipv4Addr::from(dip),
                            vip.backend_port,
                            self.vips[other].address,
                            self.vips[other].port,
                            vip.address,
                            vip.port
                        )));
                    }
                }
            }
        }
        let mut macs = BTreeMap::new();
        for (id, r) in &self.servers {
            if let (Some(mac), false) = (r.mac, r.state == SlotState::Removed) {
                if let Some(other) = macs.insert(mac, *id) {
                    return Err(ControlError::Conflict(format!(
                        "servers {other} and {id} have the same MAC {}; replies could not be told apart",
                        format_mac(&mac)
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A removed server's record from a saved state (its MAC is optional whatever the
/// forwarding: it only serves to recognise late replies).
fn quarantined_record(
    s: &SavedServer,
    field: &str,
    layout: CookieLayout,
) -> Result<(ServerId, ServerRecord), ConfigError> {
    let valid = config::validate_server(
        &ServerConfig {
            id: s.id,
            dip: s.dip,
            mac: s.mac.clone(),
            state: ConfiguredState::Active,
        },
        field,
        Forwarding::Nat,
        layout,
    )?;
    Ok((
        valid.id,
        ServerRecord {
            dip: valid.dip,
            mac: valid.mac,
            state: SlotState::Removed,
            quarantine_until: None,
        },
    ))
}

fn restore_vip(
    v: &SavedVip,
    field: &str,
    servers: &BTreeMap<ServerId, ServerRecord>,
) -> Result<ValidVip, ControlError> {
    for (name, port) in [("port", v.port), ("backend_port", v.backend_port)] {
        if port == 0 {
            return Err(ConfigError::new(
                format!("{field}.{name}"),
                "port 0 is not a service port",
            )
            .into());
        }
    }
    let usable = |id: u16, at: &str| -> Result<ServerId, ControlError> {
        let sid = ServerId(id);
        match servers.get(&sid) {
            Some(r) if r.state != SlotState::Removed => Ok(sid),
            Some(_) => Err(ConfigError::new(at, format!("server {id} is removed")).into()),
            None => Err(ConfigError::new(at, format!("server {id} is not saved")).into()),
        }
    };
    let mut members: Vec<(ServerId, u32)> = Vec::with_capacity(v.members.len());
    for (j, m) in v.members.iter().enumerate() {
        let at = format!("{field}.members[{j}]");
        let sid = usable(m.id, &format!("{at}.id"))?;
        if members.iter().any(|(other, _)| *other == sid) {
            return Err(ConfigError::new(
                format!("{at}.id"),
                format!("server {} is listed twice", m.id),
            )
            .into());
        }
        if m.weight == 0 {
            return Err(
                ConfigError::new(format!("{at}.weight"), "weight must be at least 1").into(),
            );
        }
        members.push((sid, m.weight));
    }
    let mut departed = Vec::with_capacity(v.departed.len());
    for (j, id) in v.departed.iter().enumerate() {
        let at = format!("{field}.departed[{j}]");
        let sid = usable(*id, &at)?;
        if members.iter().any(|(m, _)| *m == sid) || departed.contains(&sid) {
            return Err(ConfigError::new(
                at,
                format!("server {id} is already a member or listed twice"),
            )
            .into());
        }
        departed.push(sid);
    }
    Ok(ValidVip {
        address: v.address,
        port: v.port,
        policy: v.policy,
        metric: v.metric,
        backend_port: v.backend_port,
        members,
        departed,
    })
}

/// Parses `10.0.0.1:80` or `[2001:db8::1]:80`.
pub fn parse_vip_key(key: &str) -> Result<(IpAddr, u16), ControlError> {
    key.parse::<std::net::SocketAddr>()
        .map(|s| (s.ip(), s.port()))
        .map_err(|_| ConfigError::new("vip", format!("`{key}` is not address:port")).into())
}

fn prefix(e: ControlError, field: &str) -> ControlError {
    match e {
        ControlError::Invalid(c) => {
            ControlError::Invalid(ConfigError::new(format!("{field}.{}", c.field), c.problem))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
        quarantine_secs = 60
        [[servers]]
        id = 1
        dip = "10.1.0.1"
        mac = "02:00:00:00:01:01"
        [[servers]]
        id = 2
        dip = "10.1.0.2"
        mac = "02:00:00:00:01:02"
        [[vips]]
        address = "10.0.0.100"
        port = 80
        servers = [1, 2]
    "#;

    fn plane() -> ControlPlane {
        ControlPlane::new(&LbConfig::from_toml(CONFIG).unwrap(), &Secret([7; 16])).unwrap()
    }

    fn spec(id: Option<u16>, last: u8) -> ServerSpec {
        ServerSpec {
            id,
            dip: format!("10.1.0.{last}").parse().unwrap(),
            mac: Some(format!("02:00:00:00:01:{last:02x}")),
            vips: vec![("10.0.0.100:80".into(), 1)],
        }
    }

    fn pool(plane: &ControlPlane) -> Vec<u16> {
        plane.shared().snapshot.load().vips[0]
            .pool
            .servers
            .iter()
            .map(|s| s.0)
            .collect()
    }

    /// The API refuses an id the cookie cannot carry, and gives out ids from the layout's
    /// range only: with k = 8 epoch bits, 256 ids, and the 257th server is refused.
    #[test]
    fn ids_stay_within_the_cookie_layout() {
        let mut p = plane();
        let e = p
            .add_server(spec(Some(4096), 9), 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("id: 4096 is above 4095, the largest server id the cookie carries"),
            "{e}"
        );
        assert_eq!(p.add_server(spec(Some(4095), 9), 0), Ok(ServerId(4095)));

        let narrow = CONFIG.replace(
            "quarantine_secs = 60",
            "quarantine_secs = 60\ncookie_epoch_bits = 8",
        );
        let mut p =
            ControlPlane::new(&LbConfig::from_toml(&narrow).unwrap(), &Secret([7; 16])).unwrap();
        assert_eq!(p.layout().max_server_id(), 255);
        for i in 0..254u16 {
            let mut spec = spec(None, 0);
            spec.dip = std::net::Ipv4Addr::from(0x0a02_0000 + u32::from(i)).into();
            spec.mac = Some(format_mac(&[2, 0, 0, 2, (i >> 8) as u8, i as u8]));
            let id = p.add_server(spec, 0).unwrap();
            assert!(id.0 <= 255, "{id}");
        }
        let e = p.add_server(spec(None, 9), 0).unwrap_err().to_string();
        assert!(
            e.contains("all 256 server ids of the cookie layout are in use"),
            "{e}"
        );
    }

    #[test]
    fn lifecycle_active_draining_removed_then_quarantined_then_free() {
        let mut p = plane();
        assert_eq!(pool(&p), vec![1, 2]);
        p.drain_server(2).unwrap();
        assert_eq!(pool(&p), vec![1]);
        let snap = p.shared().snapshot.load();
        assert_eq!(snap.servers.get(ServerId(2)).state, SlotState::Draining);
        assert_eq!(
            snap.server_by_mac(&[2, 0, 0, 0, 1, 2]),
            Some(ServerId(2)),
            "draining servers' replies are still known"
        );
        p.remove_server(2, 10 * NANOS_PER_SEC).unwrap();
        assert_eq!(
            p.shared().snapshot.load().servers.get(ServerId(2)).state,
            SlotState::Removed
        );
        let e = p
            .add_server(spec(Some(2), 9), 30 * NANOS_PER_SEC)
            .unwrap_err();
        assert!(
            matches!(&e, ControlError::Conflict(m) if m.contains("quarantined for another 40 s")),
            "{e}"
        );
        assert_eq!(
            p.add_server(spec(None, 9), 30 * NANOS_PER_SEC).unwrap(),
            ServerId(0),
            "lowest free id"
        );
        assert_eq!(
            p.add_server(spec(Some(2), 10), 70 * NANOS_PER_SEC).unwrap(),
            ServerId(2)
        );
        assert_eq!(
            p.shared().snapshot.load().servers.get(ServerId(2)).dip,
            u32::from(Ipv4Addr::new(10, 1, 0, 10))
        );
        assert_eq!(pool(&p), vec![1, 0, 2]);
    }

    #[test]
    fn refused_changes_change_nothing() {
        let mut p = plane();
        let before = p.generation();
        assert!(matches!(p.drain_server(7), Err(ControlError::NotFound(_))));
        assert!(matches!(
            p.set_policy("10.0.0.1:80", PolicyKind::PowerOfTwo, None),
            Err(ControlError::NotFound(_))
        ));
        let e = p
            .set_weights("10.0.0.100:80", &[(1, 5), (2, 0)])
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "weights[1]: weight must be at least 1 (drain the server to stop new connections)"
        );
        let e = p.add_server(spec(Some(9), 1), 0).unwrap_err();
        assert!(e.to_string().contains("same MAC"), "{e}");
        let e = p
            .set_policy("nonsense", PolicyKind::Random, None)
            .unwrap_err();
        assert_eq!(e.to_string(), "vip: `nonsense` is not address:port");
        assert_eq!(p.generation(), before);
        assert_eq!(
            p.vips()[0].members,
            vec![(ServerId(1), 1), (ServerId(2), 1)]
        );
    }

    #[test]
    fn policy_and_weights_changes_are_published() {
        let mut p = plane();
        p.set_policy("10.0.0.100:80", PolicyKind::PowerOfTwo, None)
            .unwrap();
        p.set_weights("10.0.0.100:80", &[(2, 4)]).unwrap();
        let snap = p.shared().snapshot.load();
        assert_eq!(snap.vips[0].policy, PolicyKind::PowerOfTwo);
        assert_eq!(snap.vips[0].pool.weights, vec![1, 4]);
        p.leave_pool("10.0.0.100:80", 1).unwrap();
        assert_eq!(pool(&p), vec![2]);
        p.join_pool("10.0.0.100:80", 1, 2).unwrap();
        assert_eq!(pool(&p), vec![2, 1]);
    }

    /// A plane after every kind of runtime change, at t = 100 s.
    fn changed_plane() -> ControlPlane {
        let mut p = plane();
        let t = 100 * NANOS_PER_SEC;
        p.add_server(spec(Some(5), 5), t).unwrap();
        p.drain_server(2).unwrap();
        p.remove_server(1, t - 20 * NANOS_PER_SEC).unwrap();
        p.set_policy(
            "10.0.0.100:80",
            PolicyKind::LeastLoaded,
            Some(LoadMetric::Packets),
        )
        .unwrap();
        p.set_weights("10.0.0.100:80", &[(5, 7)]).unwrap();
        p.add_server(spec(Some(6), 6), t).unwrap();
        p.leave_pool("10.0.0.100:80", 6).unwrap();
        p
    }

    #[test]
    fn export_then_restore_gives_the_same_tables() {
        let p = changed_plane();
        let now = 100 * NANOS_PER_SEC;
        let saved = p.export(now);
        assert_eq!(
            saved.servers[0],
            SavedServer {
                id: 1,
                dip: "10.1.0.1".parse().unwrap(),
                mac: Some("02:00:00:00:01:01".into()),
                state: SavedServerState::Removed,
                quarantine_left_secs: Some(40),
            }
        );
        assert_eq!(saved.vips[0].departed, vec![6]);
        // Restored in a new process whose clock starts at 0.
        let config = LbConfig::from_toml(CONFIG).unwrap();
        let r = ControlPlane::restore(&config, &Secret([7; 16]), &saved, 0).unwrap();
        assert_eq!(r.export(0), saved);
        assert_eq!(r.servers(0), p.servers(now));
        assert_eq!(pool(&r), vec![5]);
        let snap = r.shared().snapshot.load();
        assert_eq!(snap.vips[0].policy, PolicyKind::LeastLoaded);
        assert_eq!(snap.vips[0].pool.metric, LoadMetric::Packets);
        assert_eq!(snap.vips[0].pool.weights, vec![7]);
        assert_eq!(snap.servers.get(ServerId(1)).state, SlotState::Removed);
        // The quarantine goes on from where it was, then ends.
        let mut r = r;
        assert!(matches!(
            r.add_server(spec(Some(1), 9), 39 * NANOS_PER_SEC),
            Err(ControlError::Conflict(_))
        ));
        assert_eq!(r.expire(40 * NANOS_PER_SEC), 1);
        assert!(r.add_server(spec(Some(1), 9), 40 * NANOS_PER_SEC).is_ok());
    }

    #[test]
    fn restore_caps_quarantine_at_the_configured_length_and_frees_expired_ids() {
        let mut saved = changed_plane().export(100 * NANOS_PER_SEC);
        saved.servers[0].quarantine_left_secs = Some(10_000);
        let mut config = LbConfig::from_toml(CONFIG).unwrap();
        config.quarantine_secs = 30;
        let r = ControlPlane::restore(&config, &Secret([7; 16]), &saved, 0).unwrap();
        assert_eq!(r.servers(0)[0].quarantine_left_secs, Some(30));
        saved.servers[0].quarantine_left_secs = Some(0);
        let r = ControlPlane::restore(&config, &Secret([7; 16]), &saved, 0).unwrap();
        assert!(r.servers(0).iter().all(|s| s.id != ServerId(1)), "freed");
    }

    #[test]
    fn an_invalid_saved_state_is_refused_naming_the_field() {
        let config = LbConfig::from_toml(CONFIG).unwrap();
        let good = changed_plane().export(100 * NANOS_PER_SEC);
        let refused = |edit: &dyn Fn(&mut ControlState)| {
            let mut saved = good.clone();
            edit(&mut saved);
            ControlPlane::restore(&config, &Secret([7; 16]), &saved, 0)
                .err()
                .expect("refused")
                .to_string()
        };
        assert_eq!(
            refused(&|s| s.vips[0].members[0].weight = 0),
            "vips[0].members[0].weight: weight must be at least 1"
        );
        assert_eq!(
            refused(&|s| s.vips[0].members.push(SavedMember { id: 1, weight: 1 })),
            "vips[0].members[2].id: server 1 is removed"
        );
        assert_eq!(
            refused(&|s| s.vips[0].departed.push(9)),
            "vips[0].departed[1]: server 9 is not saved"
        );
        assert_eq!(
            refused(&|s| s.servers[1].mac = None),
            "servers[1].mac: l2 forwarding needs each server's MAC address"
        );
        assert!(refused(&|s| s.servers[2].mac = s.servers[1].mac.clone()).contains("same MAC"));
        assert_eq!(
            refused(&|s| s.servers[0].quarantine_left_secs = None),
            "servers[0].quarantine_left_secs: a removed server needs its quarantine time"
        );
        let dup = good.vips[0].clone();
        assert!(refused(&|s| s.vips.push(dup.clone())).contains("saved twice"));
    }

    #[test]
    fn config_wins_but_quarantines_are_kept() {
        let saved = changed_plane().export(100 * NANOS_PER_SEC);
        let mut p = ControlPlane::new(
            &LbConfig::from_toml(
                &CONFIG
                    .replace("id = 1", "id = 3")
                    .replace("[1, 2]", "[3, 2]"),
            )
            .unwrap(),
            &Secret([7; 16]),
        )
        .unwrap();
        let generation = p.generation();
        let report = p.restore_quarantine(&saved, 0).unwrap();
        assert_eq!(report.kept, vec![(1, 40)]);
        assert!(report.overridden.is_empty());
        assert_eq!(p.generation(), generation + 1, "published");
        assert_eq!(
            p.shared().snapshot.load().servers.get(ServerId(1)).state,
            SlotState::Removed
        );
        assert!(matches!(
            p.add_server(spec(Some(1), 9), NANOS_PER_SEC),
            Err(ControlError::Conflict(_))
        ));
        // The config defines id 1 again: it wins.
        let mut p = plane();
        let report = p.restore_quarantine(&saved, 0).unwrap();
        assert_eq!(report.overridden, vec![1]);
        assert!(report.kept.is_empty());
        assert_eq!(pool(&p), vec![1, 2]);
    }

    #[test]
    fn a_refused_load_report_names_the_problem() {
        let p = plane();
        let e = p
            .report_load(
                1,
                ReportedLoad {
                    load: Some(-1.0),
                    active_connections: None,
                },
            )
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "load: reported load -1 is not a finite, non-negative number"
        );
    }
}
