//! The operator's changes to the tables: servers added, drained, activated, removed and
//! freed; pools, policies and weights; load reports. Each is checked as a whole and
//! published by `ControlPlane::commit`, or changes nothing.

use std::net::IpAddr;

use super::{ControlError, ControlPlane, ServerRecord};
use crate::config::{self, ConfigError, ConfiguredState, ServerConfig};
use crate::policy::{LoadMetric, PolicyKind, ReportedLoad};
use crate::tables::SlotState;
use crate::types::{Nanos, ServerId, NANOS_PER_SEC};

/// A server to add at run time.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerSpec {
    /// Requested id; the lowest free id if `None`.
    pub id: Option<u16>,
    pub dip: IpAddr,
    pub mac: Option<String>,
    /// VIPs (`address:port`) to join, with a weight.
    pub vips: Vec<(String, u32)>,
    /// `Draining` adds it known to the data path (its replies forwarded, its cookies
    /// decoded, its health probed) but taking no new connection until activated: how a
    /// server is added to several instances (docs/operations.md).
    pub state: ConfiguredState,
}

impl ControlPlane {
    /// Adds a server (and makes it join the VIPs listed), active or draining.
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
                state: spec.state,
            },
            "server",
            self.forwarding,
            self.layout(),
        )?;
        if let Some(problem) = config::dip_is_a_vip_address(valid.dip, &self.vips) {
            return Err(ConfigError::new("dip", problem).into());
        }
        let mut next = self.clone_state();
        next.servers.insert(
            id,
            ServerRecord {
                dip: valid.dip,
                mac: valid.mac,
                state: spec.state.into(),
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
    use std::net::Ipv4Addr;

    use super::super::fixtures::{plane, pool, spec, CONFIG};
    use super::*;
    use crate::config::LbConfig;
    use crate::hash::Secret;
    use crate::types::format_mac;

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

    /// How a server joins several instances: added draining, it is known (its replies and
    /// cookies) and a member of its pools, but no new connection goes to it until it is
    /// activated.
    #[test]
    fn a_server_added_draining_is_known_and_takes_new_connections_once_activated() {
        let mut p = plane();
        let draining = ServerSpec {
            state: ConfiguredState::Draining,
            ..spec(Some(7), 7)
        };
        assert_eq!(p.add_server(draining, 0).unwrap(), ServerId(7));
        let snap = p.shared().snapshot.load();
        assert_eq!(snap.servers.get(ServerId(7)).state, SlotState::Draining);
        assert_eq!(snap.server_by_mac(&[2, 0, 0, 0, 1, 7]), Some(ServerId(7)));
        assert!(p.vips()[0].members.iter().any(|(id, _)| *id == ServerId(7)));
        assert_eq!(pool(&p), vec![1, 2]);
        p.activate_server(7).unwrap();
        assert_eq!(pool(&p), vec![1, 2, 7]);
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
        let at_the_vip = ServerSpec {
            dip: "10.0.0.100".parse().unwrap(),
            ..spec(Some(9), 9)
        };
        assert_eq!(
            p.add_server(at_the_vip, 0).unwrap_err().to_string(),
            "dip: 10.0.0.100 is the address of VIP 10.0.0.100:80; a server needs an address of its own"
        );
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
