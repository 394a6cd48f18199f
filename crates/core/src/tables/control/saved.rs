//! The control plane's tables as data: what a daemon saves so that runtime changes and
//! quarantines survive a restart, and how a saved state becomes a control plane again.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};

use super::{ControlError, ControlPlane, Draft, ServerRecord, TablesMaker};
use crate::config::{
    self, ConfigError, ConfiguredState, Forwarding, HealthConfig, LbConfig, ServerConfig, ValidVip,
};
use crate::cookie::CookieLayout;
use crate::hash::Secret;
use crate::lb::SharedTables;
use crate::policy::{LoadMetric, PolicyKind};
use crate::tables::SlotState;
use crate::types::{format_mac, Nanos, ServerId, NANOS_PER_SEC};

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

impl ControlPlane {
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
        Self::restore_with_tables(config, secret, saved, now, &SharedTables::new)
    }

    /// [`restore`](ControlPlane::restore) with the tables `tables` makes
    /// ([`ControlPlane::new_with_tables`]).
    pub fn restore_with_tables(
        config: &LbConfig,
        secret: &Secret,
        saved: &ControlState,
        now: Nanos,
        tables: TablesMaker,
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
            // Health settings are the config's (the state file keeps only the tables): a
            // VIP the config no longer names is probed with the defaults.
            let health = config
                .vips
                .iter()
                .find(|c| c.address == v.address && c.port == v.port)
                .map(|c| c.health.clone())
                .unwrap_or_default();
            vips.push(restore_vip(v, &format!("vips[{i}]"), &servers, health)?);
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
            tables,
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
    health: HealthConfig,
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
        health,
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{plane, pool, spec, CONFIG};
    use super::*;

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
            refused(&|s| s.servers[2].dip = s.vips[0].address),
            format!(
                "server {}: 10.0.0.100 is the address of VIP 10.0.0.100:80; a server needs an address of its own",
                good.servers[2].id
            )
        );
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
}
