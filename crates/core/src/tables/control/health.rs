//! The health overlay: this instance's view of each (VIP, server), as its health probes
//! decided it, laid over the operator's tables.
//!
//! A server down on a VIP leaves that VIP's pool, so it gets no new connections there; it
//! stays in AllServers with its state, so its existing connections keep going (cookies
//! still decode, replies are still recognised): like a drain, but automatic, per VIP and
//! undone when it is up again. A server whose health is not decided yet (`Unknown`) stays
//! in the pool: without probes (replay, simulator, benchmarks) every server is `Unknown`
//! and the tables behave as before.
//!
//! When every active member of a VIP is down, the VIP fails open: its pool is all its
//! active members, as if they were healthy. Probes that all fail at once more often mean
//! the probes are broken (a filter, a routing change on the LB) than every server; and a
//! VIP with an empty pool would refuse every new connection anyway. Counted and listed
//! ([`ControlPlane::failing_open`]); the daemon logs it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::{ControlError, ControlPlane};
use crate::config::ValidVip;
use crate::types::ServerId;

/// One instance's view of a server's health on one VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Health {
    /// Not decided yet (too few probes): still in the pool.
    #[default]
    Unknown,
    Up,
    /// Out of the VIP's pool: no new connections; existing ones keep going.
    Down,
}

impl Health {
    pub const ALL: [Health; 3] = [Health::Unknown, Health::Up, Health::Down];

    pub fn name(self) -> &'static str {
        match self {
            Health::Unknown => "unknown",
            Health::Up => "up",
            Health::Down => "down",
        }
    }
}

/// A VIP's key in the overlay: address and port, so that a mark does not depend on the
/// VIP's place in the list.
pub type VipKey = (IpAddr, u16);

#[derive(Clone, Debug, Default)]
pub(super) struct HealthOverlay {
    /// Marks other than `Unknown`.
    marks: BTreeMap<(VipKey, ServerId), Health>,
    failing_open: BTreeSet<VipKey>,
    fail_open_events: u64,
}

impl HealthOverlay {
    pub(super) fn get(&self, vip: VipKey, server: ServerId) -> Health {
        self.marks.get(&(vip, server)).copied().unwrap_or_default()
    }

    pub(super) fn is_down(&self, vip: VipKey, server: ServerId) -> bool {
        self.get(vip, server) == Health::Down
    }

    /// Forgets the marks of servers that are no longer members of their VIP (removed, left
    /// the pool, VIP gone): one that comes back starts undecided.
    pub(super) fn retain_members(&mut self, vips: &[ValidVip]) {
        self.marks.retain(|((address, port), server), _| {
            vips.iter().any(|v| {
                v.address == *address
                    && v.port == *port
                    && v.members.iter().any(|(m, _)| m == server)
            })
        });
    }

    /// Records which VIPs fail open in the snapshot just published; counts those that began.
    pub(super) fn note_failing_open(&mut self, now: BTreeSet<VipKey>) {
        self.fail_open_events += now.difference(&self.failing_open).count() as u64;
        self.failing_open = now;
    }
}

impl ControlPlane {
    /// Marks `server`'s health on the VIP at `vip`. The VIP's pool is rebuilt and a snapshot
    /// published when the server leaves or rejoins it (or the VIP begins or stops failing
    /// open); returns whether one was. `NotFound` when the VIP does not exist or the server
    /// is not a member of its pool.
    pub fn set_health(
        &mut self,
        vip: VipKey,
        server: ServerId,
        health: Health,
    ) -> Result<bool, ControlError> {
        let member = self
            .vips
            .iter()
            .find(|v| (v.address, v.port) == vip)
            .ok_or_else(|| ControlError::NotFound(format!("VIP {} does not exist", vip_name(vip))))?
            .members
            .iter()
            .any(|(m, _)| *m == server);
        if !member {
            return Err(ControlError::NotFound(format!(
                "server {server} is not in the pool of {}",
                vip_name(vip)
            )));
        }
        let was_down = self.health.is_down(vip, server);
        match health {
            Health::Unknown => self.health.marks.remove(&(vip, server)),
            mark => self.health.marks.insert((vip, server), mark),
        };
        if was_down == (health == Health::Down) {
            return Ok(false);
        }
        self.republish();
        Ok(true)
    }

    /// This instance's view of `server` on `vip` (`Unknown` for anything it has no mark of).
    pub fn health(&self, vip: VipKey, server: ServerId) -> Health {
        self.health.get(vip, server)
    }

    /// VIPs whose every active member is down, which therefore fail open.
    pub fn failing_open(&self) -> Vec<VipKey> {
        self.health.failing_open.iter().copied().collect()
    }

    /// How many times a VIP began failing open since this plane was made.
    pub fn fail_open_events(&self) -> u64 {
        self.health.fail_open_events
    }
}

fn vip_name((address, port): VipKey) -> String {
    std::net::SocketAddr::new(address, port).to_string()
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{plane, pool};
    use super::*;
    use crate::tables::SlotState;

    const VIP: VipKey = (IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 100)), 80);

    #[test]
    fn a_down_server_leaves_the_pool_and_comes_back_when_up() {
        let mut p = plane();
        let before = p.generation();
        assert_eq!(p.health(VIP, ServerId(2)), Health::Unknown);
        assert_eq!(
            p.set_health(VIP, ServerId(2), Health::Up),
            Ok(false),
            "undecided servers are already in the pool"
        );
        assert_eq!(p.generation(), before);
        assert_eq!(p.set_health(VIP, ServerId(2), Health::Down), Ok(true));
        assert_eq!(pool(&p), vec![1]);
        assert_eq!(p.health(VIP, ServerId(2)), Health::Down);
        // Its connections keep going: it is still an active server, its MAC still known.
        let snap = p.shared().snapshot.load();
        assert_eq!(snap.servers.get(ServerId(2)).state, SlotState::Active);
        assert_eq!(snap.server_by_mac(&[2, 0, 0, 0, 1, 2]), Some(ServerId(2)));
        assert_eq!(snap.vips[0].members.len(), 2, "still a member");
        assert_eq!(p.set_health(VIP, ServerId(2), Health::Down), Ok(false));
        assert_eq!(p.set_health(VIP, ServerId(2), Health::Up), Ok(true));
        assert_eq!(pool(&p), vec![1, 2]);
        assert!(p.failing_open().is_empty());
        assert_eq!(p.fail_open_events(), 0);
    }

    #[test]
    fn every_member_down_fails_open_and_is_counted() {
        let mut p = plane();
        p.set_health(VIP, ServerId(1), Health::Down).unwrap();
        assert_eq!(pool(&p), vec![2]);
        p.set_health(VIP, ServerId(2), Health::Down).unwrap();
        assert_eq!(pool(&p), vec![1, 2], "all down: the pool is every member");
        assert_eq!(p.failing_open(), vec![VIP]);
        assert_eq!(p.fail_open_events(), 1);
        p.set_health(VIP, ServerId(1), Health::Up).unwrap();
        assert_eq!(pool(&p), vec![1]);
        assert!(p.failing_open().is_empty());
        // A drain can make it fail open too: the last healthy member stops taking
        // connections while the others are down.
        p.drain_server(1).unwrap();
        assert_eq!(pool(&p), vec![2]);
        assert_eq!(p.failing_open(), vec![VIP]);
        assert_eq!(p.fail_open_events(), 2);
        // A draining server is no pool member to fail open to.
        p.set_health(VIP, ServerId(2), Health::Up).unwrap();
        assert_eq!(pool(&p), vec![2]);
        assert!(p.failing_open().is_empty());
    }

    #[test]
    fn marks_are_for_members_only_and_forgotten_with_membership() {
        let mut p = plane();
        let other: VipKey = (VIP.0, 81);
        assert!(matches!(
            p.set_health(other, ServerId(1), Health::Down),
            Err(ControlError::NotFound(m)) if m == "VIP 10.0.0.100:81 does not exist"
        ));
        assert!(matches!(
            p.set_health(VIP, ServerId(9), Health::Down),
            Err(ControlError::NotFound(m)) if m == "server 9 is not in the pool of 10.0.0.100:80"
        ));
        p.set_health(VIP, ServerId(2), Health::Down).unwrap();
        p.leave_pool("10.0.0.100:80", 2).unwrap();
        p.join_pool("10.0.0.100:80", 2, 1).unwrap();
        assert_eq!(p.health(VIP, ServerId(2)), Health::Unknown);
        assert_eq!(pool(&p), vec![1, 2]);
    }
}
