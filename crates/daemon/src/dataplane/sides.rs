//! Which of the LB's interfaces face the servers: the side each packet arrived on, which
//! the core needs to tell a server's reply from a forged one (`cheetah_core::lb::Ingress`).
//!
//! An interface is server side when the kernel routes the address of at least one server
//! of the tables through it (the same longest-prefix match over `/proc/net/route` that
//! finds a server's egress, `egress.rs`), else client side; or, when the config names
//! `[daemon] server_interfaces`, exactly those. The control thread works it out at start,
//! whenever the tables change and every few seconds (routes change without them); the
//! workers read one flag per interface per batch.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use cheetah_core::lb::Ingress;
use cheetah_core::tables::{SlotState, Snapshot};

use super::egress::RouteTable;

/// One flag per interface slot (its index in `[daemon] interfaces`), shared by the control
/// thread that writes it and the workers that read it.
pub struct InterfaceSides {
    server_side: Box<[AtomicBool]>,
}

impl InterfaceSides {
    pub fn new(sides: &[Ingress]) -> Self {
        InterfaceSides {
            server_side: sides
                .iter()
                .map(|side| AtomicBool::new(*side == Ingress::ServerSide))
                .collect(),
        }
    }

    /// The side of the interface in `slot`; one relaxed load, for every received batch.
    #[inline]
    pub fn ingress(&self, slot: u32) -> Ingress {
        match self.server_side.get(slot as usize) {
            Some(flag) if !flag.load(Relaxed) => Ingress::ClientSide,
            _ => Ingress::ServerSide,
        }
    }

    /// Sets every interface's side; returns whether any changed.
    pub fn set(&self, sides: &[Ingress]) -> bool {
        let mut changed = false;
        for (flag, side) in self.server_side.iter().zip(sides) {
            let server = *side == Ingress::ServerSide;
            changed |= flag.swap(server, Relaxed) != server;
        }
        changed
    }
}

/// Where the sides come from.
pub enum SideSource {
    /// `[daemon] server_interfaces`: fixed.
    Configured(Vec<String>),
    /// The kernel's routes toward the servers of the current tables.
    Routes,
}

impl SideSource {
    /// The side of each of `interfaces` for the servers of `snapshot`.
    pub fn sides(&self, interfaces: &[String], snapshot: &Snapshot) -> Vec<Ingress> {
        match self {
            SideSource::Configured(names) => interfaces
                .iter()
                .map(|name| side(names.contains(name)))
                .collect(),
            SideSource::Routes => {
                let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
                sides_by_route(interfaces, &server_dips(snapshot), &routes)
            }
        }
    }
}

fn side(server_side: bool) -> Ingress {
    if server_side {
        Ingress::ServerSide
    } else {
        Ingress::ClientSide
    }
}

/// The address of every server the tables hold (removed ones too: their late replies
/// arrive on the same side).
fn server_dips(snapshot: &Snapshot) -> Vec<Ipv4Addr> {
    snapshot
        .servers
        .iter()
        .filter(|(_, slot)| slot.state != SlotState::Free)
        .map(|(_, slot)| Ipv4Addr::from(slot.dip))
        .collect()
}

/// The rule: server side if the kernel's best route to some server leaves through it.
fn sides_by_route(interfaces: &[String], dips: &[Ipv4Addr], routes: &str) -> Vec<Ingress> {
    let routes = RouteTable::parse(routes);
    let through: Vec<String> = dips
        .iter()
        .filter_map(|dip| routes.best(*dip))
        .map(|route| route.interface)
        .collect();
    interfaces
        .iter()
        .map(|name| side(through.contains(name)))
        .collect()
}

/// Logs each interface's side (at start, and when one changes).
pub fn log_sides(interfaces: &[String], sides: &[Ingress], source: &SideSource) {
    let from = match source {
        SideSource::Configured(_) => "daemon.server_interfaces",
        SideSource::Routes => "routes to the servers",
    };
    for (name, side) in interfaces.iter().zip(sides) {
        tracing::info!(interface = %name, side = side.name(), from, "interface side");
    }
    if !sides.contains(&Ingress::ServerSide) {
        tracing::warn!(
            "no interface is server side ({from}): every server reply will be dropped as \
             reply_from_client_side; route the servers' addresses through one of \
             daemon.interfaces, or name them in daemon.server_interfaces"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::egress::tests::ROUTES;
    use super::*;

    fn names() -> Vec<String> {
        vec!["lb-c".into(), "lb-s".into()]
    }

    #[test]
    fn the_interface_routing_a_server_is_server_side() {
        let dips = ["10.20.0.11".parse().unwrap(), "10.20.0.12".parse().unwrap()];
        assert_eq!(
            sides_by_route(&names(), &dips, ROUTES),
            [Ingress::ClientSide, Ingress::ServerSide]
        );
        // No servers: no interface carries replies.
        assert_eq!(
            sides_by_route(&names(), &[], ROUTES),
            [Ingress::ClientSide, Ingress::ClientSide]
        );
        // One interface for both (a server reached by the default route): server side.
        let one = vec!["lb-c".to_string()];
        let far = ["192.0.2.7".parse().unwrap()];
        assert_eq!(sides_by_route(&one, &far, ROUTES), [Ingress::ServerSide]);
    }

    #[test]
    fn configured_sides_override_the_routes() {
        let source = SideSource::Configured(vec!["lb-c".into()]);
        assert_eq!(
            source.sides(&names(), &Snapshot::empty()),
            [Ingress::ServerSide, Ingress::ClientSide]
        );
    }

    #[test]
    fn workers_read_what_the_control_thread_set() {
        let sides = InterfaceSides::new(&[Ingress::ServerSide, Ingress::ClientSide]);
        assert_eq!(sides.ingress(1), Ingress::ClientSide);
        assert!(sides.set(&[Ingress::ClientSide, Ingress::ServerSide]));
        assert!(!sides.set(&[Ingress::ClientSide, Ingress::ServerSide]));
        assert_eq!(sides.ingress(0), Ingress::ClientSide);
        assert_eq!(sides.ingress(1), Ingress::ServerSide);
    }
}
