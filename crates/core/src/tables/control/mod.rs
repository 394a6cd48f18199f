//! The control plane: owns the desired tables, applies operator changes, publishes snapshots.
//!
//! Every change is validated against the whole resulting state before anything is
//! published; a refused change leaves the running tables exactly as they were. The
//! operator's changes are in `changes.rs`; the tables as data that a restart keeps, in
//! `saved.rs`.

mod changes;
#[cfg(test)]
mod fixtures;
mod health;
mod saved;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use super::servers::{AllServers, ServerSlot, SlotState};
use super::snapshot::{Snapshot, VipEntry};
use crate::config::{self, ConfigError, Forwarding, LbConfig, Mode, NatBackends, ValidVip};
use crate::cookie::CookieLayout;
use crate::hash::Secret;
use crate::lb::closes::CloseFilter;
use crate::lb::shared::LbShared;
use crate::lb::SharedTables;
use crate::policy::PoolSnapshot;
use crate::types::{format_mac, Mac, Nanos, ServerId, NANOS_PER_SEC};
pub use changes::ServerSpec;
use health::HealthOverlay;
pub use health::{Health, VipKey};
pub use saved::{
    ControlState, QuarantineRestore, SavedMember, SavedServer, SavedServerState, SavedVip,
};

/// Makes the clock, handshake and fallback tables of a new plane for its cookie layout and
/// `fallback_table_capacity`: `&SharedTables::new`, or tables over words shared with the
/// kernel. Called once per plane built.
pub type TablesMaker<'a> = &'a dyn Fn(CookieLayout, usize) -> SharedTables;

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

pub struct ControlPlane {
    mode: Mode,
    forwarding: Forwarding,
    quarantine: Nanos,
    servers: BTreeMap<ServerId, ServerRecord>,
    vips: Vec<ValidVip>,
    generation: u64,
    shared: Arc<LbShared>,
    config: LbConfig,
    health: HealthOverlay,
}

impl ControlPlane {
    /// Validates `config` and publishes its first snapshot.
    pub fn new(config: &LbConfig, secret: &Secret) -> Result<Self, ConfigError> {
        Self::new_with_tables(config, secret, &SharedTables::new)
    }

    /// [`new`](ControlPlane::new) with the tables `tables` makes for the config's cookie
    /// layout (the daemon's are over the XDP program's words).
    pub fn new_with_tables(
        config: &LbConfig,
        secret: &Secret,
        tables: TablesMaker,
    ) -> Result<Self, ConfigError> {
        let (servers, vips) = config.validate()?;
        let servers = servers
            .into_iter()
            .map(|s| {
                let state = SlotState::from(s.state);
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
        Ok(Self::publish_first(config, secret, servers, vips, tables))
    }

    fn publish_first(
        config: &LbConfig,
        secret: &Secret,
        servers: BTreeMap<ServerId, ServerRecord>,
        vips: Vec<ValidVip>,
        tables: TablesMaker,
    ) -> Self {
        let mut plane = ControlPlane {
            mode: config.mode,
            forwarding: config.forwarding,
            quarantine: config.quarantine_secs.saturating_mul(NANOS_PER_SEC),
            servers,
            vips,
            generation: 0,
            shared: Arc::new(LbShared::with_tables(
                secret,
                tables(
                    config.cookie_layout().expect("validated"),
                    config.fallback_table_capacity,
                ),
                Snapshot::empty(),
            )),
            config: config.clone(),
            health: HealthOverlay::default(),
        };
        plane.republish();
        plane
    }

    pub fn shared(&self) -> &Arc<LbShared> {
        &self.shared
    }

    /// Replaces the close filter with `closes` (the daemon's is over the XDP program's
    /// words, [`CloseFilter::with_words`]), before anything else holds the shared state:
    /// `Err(closes)` once it has been handed out, as a filter swapped under running workers
    /// would split their closes between two filters.
    pub fn share_closes(&mut self, closes: CloseFilter) -> Result<(), CloseFilter> {
        match Arc::get_mut(&mut self.shared) {
            Some(shared) => {
                shared.closes = closes;
                Ok(())
            }
            None => Err(closes),
        }
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
        self.health.retain_members(&self.vips);
        self.republish();
        Ok(())
    }

    /// Publishes the next generation's snapshot of the current tables and health marks.
    fn republish(&mut self) {
        self.generation += 1;
        let (snapshot, failing_open) = self.build(self.generation);
        self.shared.snapshot.publish(snapshot);
        self.health.note_failing_open(failing_open);
    }

    /// The snapshot of the tables, and the VIPs that fail open in it.
    fn build(&self, generation: u64) -> (Snapshot, BTreeSet<VipKey>) {
        let len = self
            .servers
            .keys()
            .next_back()
            .map_or(0, |id| id.index() + 1);
        let mut slots = vec![ServerSlot::default(); len];
        let mut failing_open = BTreeSet::new();
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
                let key = (v.address, v.port);
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
                let healthy: Vec<(ServerId, u32)> = active
                    .iter()
                    .copied()
                    .filter(|(id, _)| !self.health.is_down(key, *id))
                    .collect();
                let pool = if healthy.is_empty() && !active.is_empty() {
                    // Every active member down: fail open (health.rs says why).
                    failing_open.insert(key);
                    active
                } else {
                    healthy
                };
                VipEntry {
                    address: v.address,
                    port: v.port,
                    policy: v.policy,
                    pool: Arc::new(PoolSnapshot::new(
                        pool.iter().map(|m| m.0).collect(),
                        pool.iter().map(|m| m.1).collect(),
                        v.metric,
                        self.config.maglev_table_size,
                    )),
                    members: v.members.clone(),
                    departed: v.departed.clone(),
                    backend_port: v.backend_port,
                }
            })
            .collect();
        let snapshot = Snapshot::new(
            generation,
            self.mode,
            self.forwarding,
            AllServers::from_slots(slots),
            vips,
            &self.shared.hasher,
        );
        (snapshot, failing_open)
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
            if r.state == SlotState::Removed {
                continue;
            }
            if let Some(problem) = config::dip_is_a_vip_address(r.dip, &self.vips) {
                return Err(ControlError::Conflict(format!("server {id}: {problem}")));
            }
            let Some(mac) = r.mac else { continue };
            if let Some(other) = macs.insert(mac, *id) {
                return Err(ControlError::Conflict(format!(
                    "servers {other} and {id} have the same MAC {}; replies could not be told apart",
                    format_mac(&mac)
                )));
            }
        }
        Ok(())
    }
}

/// Parses `10.0.0.1:80` or `[2001:db8::1]:80`.
pub fn parse_vip_key(key: &str) -> Result<(IpAddr, u16), ControlError> {
    key.parse::<std::net::SocketAddr>()
        .map(|s| (s.ip(), s.port()))
        .map_err(|_| ConfigError::new("vip", format!("`{key}` is not address:port")).into())
}
