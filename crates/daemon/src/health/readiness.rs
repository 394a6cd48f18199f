//! Readiness: an instance is ready when every active member of every VIP has a decided
//! health state and every one that is up has a clock confirmed by this instance's own
//! probe. Before that, a connection could be sent to a server whose clock this instance
//! does not know, and its packets would be dropped (`ts_msb_unknown`); whatever adds the
//! instance to a router waits for ready (`GET /ready`).

use std::collections::BTreeSet;
use std::net::SocketAddr;

use cheetah_core::cookie::MsbTable;
use cheetah_core::tables::{ControlPlane, Health, SlotState};

use super::book::HealthBook;

/// Whether the instance is ready, and what it waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    pub ready: bool,
    /// One line per thing missing, e.g. `10.99.0.1:80 server 2: health unknown (syn-ack (1
    /// of 2 to go up))` or `server 2: clock not probed yet`.
    pub waiting: Vec<String>,
}

pub fn readiness(control: &ControlPlane, msb: &MsbTable, book: &HealthBook) -> Readiness {
    let active: BTreeSet<_> = control
        .servers(0)
        .into_iter()
        .filter(|s| s.state == SlotState::Active)
        .map(|s| s.id)
        .collect();
    let mut waiting = Vec::new();
    let mut clocks_missing = BTreeSet::new();
    for vip in control.vips() {
        let key = (vip.address, vip.port);
        for (id, _) in vip.members.iter().filter(|(id, _)| active.contains(id)) {
            match control.health(key, *id) {
                Health::Unknown => {
                    let reason = book
                        .get(&(key, *id))
                        .map_or_else(|| "not probed yet".to_string(), |s| s.reason);
                    waiting.push(format!(
                        "{} server {id}: health unknown ({reason})",
                        SocketAddr::new(vip.address, vip.port)
                    ));
                }
                Health::Up if !msb.probed(*id) => {
                    clocks_missing.insert(*id);
                }
                Health::Up | Health::Down => {}
            }
        }
    }
    waiting.extend(
        clocks_missing
            .into_iter()
            .map(|id| format!("server {id}: clock not probed yet")),
    );
    Readiness {
        ready: waiting.is_empty(),
        waiting,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use cheetah_core::config::LbConfig;
    use cheetah_core::hash::Secret;
    use cheetah_core::types::ServerId;

    use super::*;

    #[test]
    fn ready_when_every_active_member_is_decided_and_every_up_one_probed() {
        let config = LbConfig::from_toml(
            r#"
            [[servers]]
            id = 1
            dip = "10.1.0.1"
            mac = "02:00:00:01:00:01"
            [[servers]]
            id = 2
            dip = "10.1.0.2"
            mac = "02:00:00:01:00:02"
            [[servers]]
            id = 3
            dip = "10.1.0.3"
            mac = "02:00:00:01:00:03"
            state = "draining"
            [[vips]]
            address = "10.0.0.100"
            port = 80
            servers = [1, 2, 3]
            "#,
        )
        .unwrap();
        let mut plane = ControlPlane::new(&config, &Secret([1; 16])).unwrap();
        let shared = std::sync::Arc::clone(plane.shared());
        let msb = &shared.msb;
        let book = HealthBook::default();
        let vip = (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 100)), 80);
        let check = |plane: &ControlPlane| readiness(plane, msb, &book);
        assert_eq!(
            check(&plane).waiting,
            [
                "10.0.0.100:80 server 1: health unknown (not probed yet)",
                "10.0.0.100:80 server 2: health unknown (not probed yet)",
            ],
            "a draining server is not waited for"
        );
        plane.set_health(vip, ServerId(1), Health::Up).unwrap();
        plane.set_health(vip, ServerId(2), Health::Down).unwrap();
        assert_eq!(check(&plane).waiting, ["server 1: clock not probed yet"]);
        msb.learn_probe(ServerId(1), 5 << 16, 1);
        assert_eq!(
            check(&plane),
            Readiness {
                ready: true,
                waiting: vec![]
            },
            "a down server needs no clock"
        );
    }
}
